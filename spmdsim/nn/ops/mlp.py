"""The fused tensor-parallel MLP: ColumnParallelLinear -> activation -> RowParallelLinear.

The first layer leaves its output split on the hidden dim (no gather), the
activation works shard by shard on that split, and the second layer's weight
is split on the same hidden dim, so its input is already in place: the only
communication is one Allreduce of the second layer's partial sums (Megatron's
MLP; Paddle's "column then row saves the AllGather").

When nothing moves before that reduction (no sequence parallelism, x not a
pending sum, floating operands), the three steps run as one operator and one
node of the backward graph (`autograd.rules.matmul.record_mlp`): the same local math,
collectives and trace labels as the layers one by one, with about a quarter
less Python per training step, which ranks sharing cores pay several times
over (docs/explanation/performance.md). Anything else goes through the two layers.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ...references import activations
from ..autograd import graph
from ..autograd.rules.grads import axes_of
from ..autograd.rules.matmul import record_mlp
from ...errors import OperatorError
from ...references.forward import ACTIVATIONS, RegionFn, Source, mlp_region, mlp_rounding
from ...runtime import debug
from ...runtime.executor import execute
from ...runtime.engines import local as engine_local
from ...base.tables import put
from ...base.validate import int_arg
from ._common import add_bias, default_axes, local_matmul, make_dtensor
from ._operands import flag
from .elementwise import activation
from .linear import ColumnParallelLinear, RowParallelLinear, _plan_linear, bias_once

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
            raise OperatorError(f"activation {activation!r} is not supported; expected one of {tuple(ACTIVATIONS)!r}")
        hidden_size = int_arg(hidden_size, "ParallelMLP hidden_size", low=1)
        ffn_hidden_size = int_arg(ffn_hidden_size, "ParallelMLP ffn_hidden_size", low=1)
        seed = int_arg(seed, "ParallelMLP seed", low=0)
        bias = flag("ParallelMLP", "bias", bias)  # (bool("false") is True)
        sequence_parallel = flag("ParallelMLP", "sequence_parallel", sequence_parallel)
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
        self._fused: dict = {}  # operand layouts, shapes and dtypes -> the fused plans, or None

    def __call__(self, x: Any) -> Any:
        fused = self._fusion(x)
        if fused is not None:
            return self._fused_call(x, *fused)
        hidden = self.linear_fc1(x, label="mlp.fc1")
        return self.linear_fc2(activation(hidden, self.activation), label="mlp.fc2")

    def _fusion(self, x: Any) -> Optional[tuple]:
        """(fc1's plan, fc2's plan, output shape) when the fused way applies to `x`, else None."""
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        b1, b2 = fc1.bias, fc2.bias
        try:
            key = (x.layout, x.global_shape, x.local.dtype, x.mesh, fc1.weight.layout,
                   fc1.weight.local.dtype, fc2.weight.layout, fc2.weight.local.dtype,
                   None if b1 is None else b1.layout, None if b2 is None else b2.layout)
        except AttributeError:  # not a DTensor: the layers say so
            return None
        try:
            found = self._fused[key]
        except KeyError:
            found = put(self._fused, key, self._fusable(x), 64)
        # SPMDSIM_CHECK compares every operator's operands across ranks: the layers do it.
        return found if found is not None and debug.quiet() else None

    def _fusable(self, x: Any) -> Optional[tuple]:
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        w1, b1, w2, b2 = fc1.weight, fc1.bias, fc2.weight, fc2.bias
        mesh, floats = x.mesh, (x.local.dtype, w1.local.dtype, w2.local.dtype)
        if (fc1.sequence_parallel or fc1.gather_output or not fc2.input_is_parallel
                or any(t is not None and t.mesh is not mesh for t in (w1, b1, w2, b2))
                or any(d.kind != "f" for d in floats) or len(set(floats)) != 1
                or x.layout.partial or w1.layout.partial or w2.layout.partial
                or x.layout.ndim < 2 or x.global_shape[-1] != fc1.input_size):
            return None
        try:
            p1, s1 = _plan_linear(x.layout, w1.layout, None if b1 is None else b1.layout, x.global_shape,
                                  w1.global_shape, None if b1 is None else b1.global_shape, False, True)
            p2, s2 = _plan_linear(p1.out, w2.layout, None if b2 is None else b2.layout, s1,
                                  w2.global_shape, None if b2 is None else b2.global_shape, False, True)
        except Exception:  # the layers raise it, in their own terms
            return None
        l2 = p2.matmul.local
        if p1.steps or p1.out.partial or p2.gather or axes_of(l2, l2.tensor_map[-1:]):
            return None
        return p1, p2, s2

    def _fused_call(self, x: Any, p1: Any, p2: Any, shape: tuple) -> Any:
        """fc2(act(fc1(x))) as one operator: fc1 and the activation locally, then fc2's steps."""
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        w1, b1, w2, b2 = fc1.weight, fc1.bias, fc2.weight, fc2.bias
        mesh = x.mesh
        a = local_matmul(x.local, w1.local, False)
        if b1 is not None:
            a = add_bias(a, b1.local)
        h = engine_local(activations.forward(self.activation), a, a)
        steps = p2.matmul.steps
        y = execute(mesh, local_matmul(h, w2.local, bool(steps)), steps, shape, "mlp.fc2", owned=True)
        if b2 is not None:
            y = bias_once(mesh, y, b2, p2)
        out = make_dtensor(mesh, y, p2.out, shape)
        if graph.is_grad_enabled() and any(t is not None and t._ag is not None for t in (x, w1, b1, w2, b2)):
            kind = self.activation

            def name() -> str:
                return (f"ParallelMLP: fc1 linear: {p1.matmul.why()}; {kind}; "
                        f"fc2 linear: {p2.matmul.why()}")
            record_mlp(out, x, (w1, b1), (w2, b2), (p1, p2), a, h, kind, name)
        return out

    def reference(self, x: Source) -> RegionFn:
        """Region reference of the MLP applied to the global input `x`."""
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        return mlp_region(x, fc1.weight_source, fc1.bias_source, fc2.weight_source, fc2.bias_source, self.activation)

    def rounding(self, x: Source) -> tuple[float, RegionFn]:
        """(rtol, scale) for checking this MLP's output on the global input `x` against `reference(x)`: the
        rounding two computations summing in different orders can have (spmdsim.references.forward.mlp_rounding),
        ``y.check(mlp.reference(x), rtol=rtol, scale=scale)``."""
        fc1, fc2 = self.linear_fc1, self.linear_fc2
        return mlp_rounding(x, fc1.weight_source, fc1.bias_source, fc2.weight_source, fc2.bias_source,
                            self.activation)
