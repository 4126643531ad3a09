"""The fused tensor-parallel MLP: ColumnParallelLinear -> activation -> RowParallelLinear.

The first layer leaves its output split on the hidden dim (no gather), the
activation works shard by shard on that split, and the second layer's weight
is split on the same hidden dim, so its input is already in place: the only
communication is one Allreduce of the second layer's partial sums (Megatron's
MLP; Paddle's "column then row saves the AllGather").
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ..errors import OperatorError
from ..reference import ACTIVATIONS, RegionFn, Source, mlp_region
from ..validate import int_arg
from ._common import default_axes
from .elementwise import activation
from .linear import ColumnParallelLinear, RowParallelLinear

__all__ = ["ParallelMLP"]


class ParallelMLP:
    """hidden -> ffn_hidden (column-parallel) -> act -> hidden (row-parallel), one Allreduce.

    Args:
        mesh: the runtime Mesh.
        hidden_size, ffn_hidden_size: model width and the MLP's inner width.
        activation: "gelu" (default) or "relu".
        bias: both layers have a bias.
        sequence_parallel: x comes and goes split on dim 0 (the sequence) over
            `axes`: an Allgather before fc1 and a Reduce_scatter after fc2
            replace the Allreduce (Megatron's sequence parallelism).
        axes: tensor-parallel mesh axes (default: every mesh axis).
        dtype, seed: fc1 uses seed, seed + 1; fc2 uses seed + 2, seed + 3.
    """

    def __init__(
        self, mesh: Any, hidden_size: int, ffn_hidden_size: int, *,
        activation: str = "gelu", bias: bool = True, sequence_parallel: bool = False,
        axes: Optional[Iterable[str] | str] = None, dtype: str = "float32", seed: int = 0,
    ) -> None:
        if not isinstance(activation, str) or activation not in ACTIVATIONS:
            raise OperatorError(
                f"activation {activation!r} is not supported; expected one of {tuple(ACTIVATIONS)!r}"
            )
        hidden_size = int_arg(hidden_size, "ParallelMLP hidden_size", low=1)
        ffn_hidden_size = int_arg(ffn_hidden_size, "ParallelMLP ffn_hidden_size", low=1)
        seed = int_arg(seed, "ParallelMLP seed", low=0)
        self.axes = default_axes(mesh, axes)
        self.activation = activation
        self.linear_fc1 = ColumnParallelLinear(
            mesh, hidden_size, ffn_hidden_size, bias=bias, gather_output=False,
            sequence_parallel=sequence_parallel, axes=self.axes, dtype=dtype, seed=seed,
        )
        self.linear_fc2 = RowParallelLinear(
            mesh, ffn_hidden_size, hidden_size, bias=bias, input_is_parallel=True,
            sequence_parallel=sequence_parallel, axes=self.axes, dtype=dtype, seed=seed + 2,
        )

    def __call__(self, x: Any) -> Any:
        hidden = self.linear_fc1(x, label="mlp.fc1")
        return self.linear_fc2(activation(hidden, self.activation), label="mlp.fc2")

    def reference(self, x: Source) -> RegionFn:
        """Region reference of the MLP applied to the global input `x`."""
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        return mlp_region(
            x, fc1.weight_source, fc1.bias_source, fc2.weight_source, fc2.bias_source,
            self.activation,
        )
