"""Linear Y = X @ W + b in both tensor-parallel forms; Megatron-named layers over one function.

* column-parallel: W (in, out) split on `out` over the tensor-parallel axes;
  every rank computes its own output columns (and adds its bias slice); the
  output stays split, or is Allgathered when `gather_output`;
* row-parallel: W split on `in`, X split the same way on its last dim; each
  rank's product is a partial sum, Allreduced, and the (replicated) bias is
  added once, after the reduction.

With ``sequence_parallel`` (Megatron's sequence parallelism, activations
[s, b, h] split on the sequence dim 0 between the layers) the column layer
Allgathers x along dim 0 first, and the row layer finishes its partial sums
with a Reduce_scatter onto dim 0 instead of the Allreduce (then adds the bias
to its own rows): the same bytes as the Allreduce, in two halves around the MLP.

Weights are stored (in_features, out_features) as in Paddle and MindSpore
(Megatron stores the transpose); both are generated from SeededTensors.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Optional

from ..autograd.rules.matmul import record_linear
from ...layouts.datagen import SeededTensor
from ...errors import DTypeError, OperatorError, ShapeError
from ...programs.infer import LinearPlan, infer_linear, matmul_shape
from ...layouts.layout import TensorLayout
from ...references.forward import RegionFn, Source, linear_region
from ...runtime.executor import execute, redistribute
from ...base.validate import int_arg
from ._common import add_bias, default_axes, local_matmul, make_dtensor, no_bias_sum, scatter_local, seeded_dtensor
from ._operands import flag, operands_mesh, raise_if_not_dtensors, refuse_bool_sum, result_dtype
from .elementwise import bias_add
from .matmul import matmul

__all__ = ["linear", "plan_linear", "ColumnParallelLinear", "RowParallelLinear"]


def plan_linear(x: Any, weight: Any, bias: Any = None, *, gather_out: bool = False,
                reduce: bool = True) -> tuple[LinearPlan, tuple[int, ...]]:
    """The plan and global output shape, validated on every rank before any collective."""
    try:
        args = (x.layout, weight.layout, None if bias is None else bias.layout, x.global_shape,
                weight.global_shape, None if bias is None else bias.global_shape)
    except AttributeError:
        given = (x, weight) if bias is None else (x, weight, bias)
        raise_if_not_dtensors("linear", ("x", "weight", "bias"), *given)
        raise
    return _plan_linear(*args, flag("linear", "gather_out", gather_out), flag("linear", "reduce", reduce))


@lru_cache(maxsize=256)
def _plan_linear(x_layout: Any, w_layout: Any, b_layout: Any, x_shape: tuple, w_shape: tuple,
                 b_shape: Optional[tuple], gather_out: bool, reduce: bool) -> tuple[LinearPlan, tuple[int, ...]]:
    # Cached on the (hashable) layouts and shapes: a layer called in a loop plans
    # once (inference cost ~4 us a call); a failed check raises and is not cached.
    plan = infer_linear(x_layout, w_layout, b_layout, gather_out=gather_out, reduce=reduce)
    shape = matmul_shape(x_shape, w_shape)
    if b_shape is not None and tuple(b_shape) != shape[-1:]:
        raise ShapeError(f"bias of shape {tuple(b_shape)!r} does not match out_features {shape[-1]!r}")
    for layout in (plan.matmul.local, plan.matmul.out, plan.out):
        layout.check_shape(shape, "linear output Y")
    return plan, shape


def linear(x: Any, weight: Any, bias: Any = None, *, gather_out: bool = False, reduce: bool = True,
           label: Optional[str] = "linear") -> Any:
    """x @ weight + bias on DTensors; the weight's layout picks column or row parallel.

    With ``reduce=False`` a row-parallel result stays a pending sum and the bias
    is added on the first rank of each reduction group only, so the sum is right.
    """
    given = (x, weight) if bias is None else (x, weight, bias)
    mesh = operands_mesh("linear", ("x", "weight", "bias"), *given)
    plan, shape = plan_linear(x, weight, bias, gather_out=gather_out, reduce=reduce)
    local = local_matmul(x.local, weight.local, bool(plan.matmul.steps or plan.gather))
    refuse_bool_sum("linear", local, "a product sums over in_features")
    local = execute(mesh, local, plan.matmul.steps, shape, label, owned=True)
    if bias is not None:
        local = bias_once(mesh, local, bias, plan)
    gather_label = None if label is None else f"{label}.gather"
    local = execute(mesh, local, plan.gather, shape, gather_label, owned=True)
    out = make_dtensor(mesh, local, plan.out, shape)
    if x._ag is not None or weight._ag is not None or (bias is not None and bias._ag is not None):
        record_linear(out, x, weight, bias, plan, label)
    return out


def bias_once(mesh: Any, local: Any, bias: Any, plan: LinearPlan) -> Any:
    """`local` (the product after its steps) plus the bias, counted once in the sum.

    Where the result is still a pending sum, only the first rank of each
    reduction group adds it; the others refuse the dtypes it refuses and take the dtype its sum has (a
    float32 product beside a float64 bias: float64), so that every rank's part of the sum is of one dtype.
    """
    pending = plan.matmul.out.partial
    if not pending or mesh.layout.group_index(mesh.rank, pending) == 0:
        return add_bias(local, bias.local)
    try:  # the adding rank's refusal of dtypes numpy has no common one of, here too (no rank runs on alone)
        dtype = result_dtype(local.dtype, bias.local.dtype)
    except DTypeError:
        raise no_bias_sum("linear", local.dtype, bias.local.dtype) from None
    return local if dtype == local.dtype else local.astype(dtype)


class _ParallelLinear:
    """Weight (and bias) generated from seeds, sharded over the tensor-parallel axes."""

    def __init__(self, mesh: Any, input_size: int, output_size: int, *, bias: bool, axes: Any, dtype: str,
                 seed: int, column: bool) -> None:
        name = type(self).__name__
        bias = flag(name, "bias", bias)  # a truthy string ("no") is no flag
        self.mesh = mesh
        self.axes = default_axes(mesh, axes)
        # Column-parallel: W and b split on out_features; row-parallel: W split on in_features, b whole.
        weight_map, bias_map = ((None, self.axes), (self.axes,)) if column else ((self.axes, None), (None,))
        self.input_size = int_arg(input_size, f"{name} input_size", low=1)
        self.output_size = int_arg(output_size, f"{name} output_size", low=1)
        seed = int_arg(seed, f"{name} seed", low=0)
        self.weight_source = SeededTensor((self.input_size, self.output_size), dtype, seed)
        self.bias_source = SeededTensor((self.output_size,), dtype, seed + 1) if bias else None
        layout = mesh.layout
        # Checked here, where the message can say which tensor does not split.
        weight_layout = layout(*weight_map)
        weight_layout.check_shape(self.weight_source.shape, f"{name} weight W")
        # Parameters: they get .grad from loss.backward() (spmdsim.nn.autograd).
        self.weight = seeded_dtensor(mesh, weight_layout, self.weight_source).requires_grad_()
        self.bias = None
        if bias:
            bias_layout = layout(*bias_map)
            bias_layout.check_shape(self.bias_source.shape, f"{name} bias b")
            self.bias = seeded_dtensor(mesh, bias_layout, self.bias_source).requires_grad_()

    def _check_features(self, x: Any) -> None:
        """x's last dim against input_size, in the layer's terms (before the operator's K message)."""
        shape = getattr(x, "global_shape", None)
        if shape and shape[-1] != self.input_size:
            raise ShapeError(f"{type(self).__name__} has input_size {self.input_size} but x of shape "
                             f"{tuple(shape)!r} has {shape[-1]} features in its last dim")

    def reference(self, x: Source) -> RegionFn:
        """Region reference of this layer applied to the global input `x`."""
        return linear_region(x, self.weight_source, self.bias_source)


class ColumnParallelLinear(_ParallelLinear):
    """Megatron's ColumnParallelLinear: W split on out_features; output split or gathered.

    Args:
        mesh: the runtime Mesh.
        input_size, output_size: in_features and out_features.
        bias: add a bias (split like the output columns).
        gather_output: Allgather the output columns (else they stay split).
        sequence_parallel: x comes split on dim 0 (the sequence, [s, b, h])
            over `axes`, as a sequence-parallel RowParallelLinear leaves it;
            it is Allgathered along dim 0 first.
        axes: tensor-parallel mesh axes (default: every mesh axis).
        dtype, seed: how the weight (seed) and bias (seed + 1) are generated.
    """

    def __init__(
        self, mesh: Any, input_size: int, output_size: int, *, bias: bool = True,
        gather_output: bool = False, sequence_parallel: bool = False,
        axes: Optional[Iterable[str] | str] = None, dtype: str = "float32", seed: int = 0,
    ) -> None:
        name = type(self).__name__
        gather_output = flag(name, "gather_output", gather_output)  # (bool("false") is True)
        sequence_parallel = flag(name, "sequence_parallel", sequence_parallel)
        super().__init__(mesh, input_size, output_size, bias=bias, axes=axes, dtype=dtype, seed=seed, column=True)
        self.gather_output, self.sequence_parallel = gather_output, sequence_parallel

    def __call__(self, x: Any, label: Optional[str] = "column_linear") -> Any:
        self._check_features(x)
        if self.sequence_parallel:
            x = _gather_sequence(self, x)
        try:
            return linear(x, self.weight, self.bias, gather_out=self.gather_output, label=label)
        except OperatorError as exc:
            raise _layer_error(self, x, False, exc) from None


class RowParallelLinear(_ParallelLinear):
    """Megatron's RowParallelLinear: W split on in_features; Allreduce, then the bias once.

    Args:
        input_is_parallel: x already split on its last dim over `axes` (as a
            ColumnParallelLinear leaves it); otherwise each rank keeps its own
            piece of a replicated x first (no communication).
        sequence_parallel: Reduce_scatter the output onto dim 0 (the sequence)
            over `axes` instead of the Allreduce; needs input_is_parallel, as in
            Megatron.
        Others as in ColumnParallelLinear (bias is replicated).
    """

    def __init__(
        self, mesh: Any, input_size: int, output_size: int, *, bias: bool = True,
        input_is_parallel: bool = False, sequence_parallel: bool = False,
        axes: Optional[Iterable[str] | str] = None, dtype: str = "float32", seed: int = 0,
    ) -> None:
        name = type(self).__name__
        input_is_parallel = flag(name, "input_is_parallel", input_is_parallel)  # (bool("false") is True)
        sequence_parallel = flag(name, "sequence_parallel", sequence_parallel)
        if sequence_parallel and not input_is_parallel:
            raise OperatorError("RowParallelLinear(sequence_parallel=True) needs input_is_parallel=True "
                                "(x split on its last dim, as a ColumnParallelLinear leaves it), as in Megatron")
        super().__init__(mesh, input_size, output_size, bias=bias, axes=axes, dtype=dtype, seed=seed, column=False)
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel

    def __call__(self, x: Any, label: Optional[str] = "row_linear") -> Any:
        given = x
        self._check_features(x)
        try:
            if not self.input_is_parallel:
                x = scatter_local(x, x.layout.ndim - 1, self.axes)
            if self.sequence_parallel:
                return _scatter_sequence(self, x, label)
            return linear(x, self.weight, self.bias, label=label)
        except OperatorError as exc:
            raise _layer_error(self, given, self.input_is_parallel, exc) from None


def _sequence_split(layer: _ParallelLinear, x: Any, x_split: bool) -> TensorLayout:
    """The layout after the sequence step: the column layer's gathered x, or the row layer's output.

    Column (`x_split`): x must have dim 0 split over exactly the layer's axes;
    the result has it whole. Row: x must have dim 0 whole; the output has it
    split over the axes and the last dim (out_features) whole. Checked in the
    layer's terms, with no pending sum allowed.
    """
    raise_if_not_dtensors(type(layer).__name__, ("x",), x)
    layout, name, axes = x.layout, type(layer).__name__, layer.axes
    have = layout.tensor_map[0] if layout.ndim >= 2 else None
    expected = axes if x_split else ()
    if have != expected or layout.partial:
        shown = f"split over {axes!r}" if x_split else "whole"
        source = ("as a RowParallelLinear(sequence_parallel=True) leaves it" if x_split
                  else "as a ColumnParallelLinear(sequence_parallel=True) leaves it: the sequence "
                       "is gathered there")
        raise OperatorError(
            f"{name}(sequence_parallel=True) expects x with at least 2 dims, dim 0 (the sequence, "
            f"[s, b, h]) {shown} ({source}) and no pending sum, but x is {layout}")
    new_map = list(layout.tensor_map)
    new_map[0] = () if x_split else axes
    if not x_split:
        new_map[-1] = ()  # the weight's out_features, whole on every rank
    return TensorLayout(layout.layout, tuple(new_map))


def _gather_sequence(layer: _ParallelLinear, x: Any) -> Any:
    """Megatron's gather_from_sequence_parallel_region: Allgather x along dim 0 over the layer's axes."""
    return redistribute(x, _sequence_split(layer, x, x_split=True))


def _scatter_sequence(layer: "RowParallelLinear", x: Any, label: Optional[str]) -> Any:
    """x @ W with the partial sums Reduce_scattered onto dim 0, then the bias on each rank's rows."""
    y = matmul(x, layer.weight, out_layout=_sequence_split(layer, x, x_split=False), label=label)
    return y if layer.bias is None else bias_add(y, layer.bias)


def _layer_error(layer: _ParallelLinear, x: Any, input_split: bool, exc: OperatorError) -> OperatorError:
    """The operator's error with the fix in the layer's own terms first, when one applies.

    The operator suggests other weight layouts, which a layer user cannot
    pick: the input, `axes=` and the layer's flags are what they can change.
    """
    name, axes = type(layer).__name__, layer.axes
    layout = getattr(x, "layout", None)
    fix = ""
    if layout is not None and layout.ndim:
        last = set(layout.tensor_map[-1])
        others = sorted({a for entry in layout.tensor_map[:-1] for a in entry} & set(axes))
        if others:
            fix = (f"{name} splits its weight over axes={axes!r} (the default is every mesh axis), "
                   f"but x splits another dim over {tuple(others)!r}: pass axes= with the "
                   "tensor-parallel axes only")
        elif input_split and last != set(axes):
            fix = (f"{name}(input_is_parallel=True) expects x split on its last dim over {axes!r}, "
                   f"as a ColumnParallelLinear leaves it, but x is {layout}: pass "
                   "input_is_parallel=False to let each rank take its piece of a replicated x")
        elif not input_split and last & set(axes):
            fix = (f"{name} expects x whole on its last dim, but x is {layout} (as a "
                   "ColumnParallelLinear with gather_output=False leaves it): follow that layer "
                   "with a RowParallelLinear(input_is_parallel=True), or give it gather_output=True")
    return OperatorError(f"{fix} (linear: {exc})" if fix else str(exc))
