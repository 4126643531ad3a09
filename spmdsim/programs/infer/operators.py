"""Pure layout inference for the operators: each operator's program.

Never imports mpi4py or spmdsim.runtime. Given the inputs' TensorLayouts, each
`infer_*` returns a frozen plan: the layout of the local result (possibly
partial: pending sums over the axes that split a contraction), the final
layout, and the step records (`spmdsim.programs.plan.steps`: Allreduce, ReduceScatter,
Allgather, the same records the redistribution planner emits) that turn one
into the other; `spmdsim.runtime.executor` runs them. Inconsistent inputs
raise OperatorError saying what would have to change.

How a pending sum is finished lives in `spmdsim.programs.infer.finish`.
"""
from __future__ import annotations

from functools import lru_cache
from dataclasses import dataclass
from typing import Optional, Sequence

from ...errors import OperatorError, ShapeError
from ...base.validate import as_int, counted
from ...layouts.layout import TensorLayout
from ...layouts.notation import format_entry
from .reshape import infer_reshape
from ..plan.steps import Allreduce, Step
from .finish import fmt as _fmt
from .finish import gather_dim, out_layout_from_strategy, resolve_partial

__all__ = ["MatMulPlan", "LinearPlan", "EmbeddingPlan", "infer_matmul", "infer_linear", "infer_embedding",
           "infer_elementwise", "infer_bias_add", "infer_transpose", "infer_softmax", "infer_reshape",
           "matmul_shape", "resolve_partial", "out_layout_from_strategy"]


def _check_same_mesh(**layouts: TensorLayout) -> None:
    items = list(layouts.items())
    for name, layout in items:
        if not isinstance(layout, TensorLayout):
            raise OperatorError(f"{name} layout {layout!r} must be a TensorLayout")
    first_name, first = items[0]
    for name, layout in items[1:]:
        if layout.layout != first.layout:
            raise OperatorError(f"{first_name} is on {first.layout} but {name} is on {layout.layout}; "
                                "operands must share one device matrix")


def _check_no_reuse(out_map: Sequence[tuple[str, ...]], names: Sequence[str], what: str) -> None:
    seen: dict[str, str] = {}
    for axes, name in zip(out_map, names):
        for alias in axes:
            if alias in seen:
                raise OperatorError(f"axis {alias!r} splits both {seen[alias]} and {name}; the {what} would be "
                                    f"split twice over it: map one of them to another axis or to None (in a "
                                    "program, ops.einsum moves the cheaper operand instead)")
            seen[alias] = name


@dataclass(frozen=True)
class MatMulPlan:
    """How Y = X @ W runs: local product layout, final layout, the steps from one to the other."""

    x: TensorLayout
    w: TensorLayout
    local: TensorLayout
    out: TensorLayout
    steps: tuple[Step, ...]
    contraction_axes: tuple[str, ...]
    transpose_a: bool = False
    transpose_b: bool = False

    @property
    def collective(self) -> Optional[str]:
        """The finishing collective's name ("allreduce", "reduce_scatter"), or None."""
        return self.steps[0].op if self.steps else None

    def why(self) -> str:
        """One sentence a teacher would say about the communication."""
        if not self.steps:
            if self.local.partial:
                return f"the result stays a pending sum over {self.local.partial!r}"
            return "the contraction dim K is not split, so each rank's product is final"
        if self.contraction_axes:
            source = (f"contraction dim K is split over {format_entry(self.contraction_axes)}, so each rank "
                      "holds a partial sum")
        else:
            source = f"the input is a pending sum over {self.local.partial!r}"
        step = self.steps[0]
        if isinstance(step, Allreduce):
            return f"{source}; Allreduce over {format_entry(step.axes)} adds the partial sums"
        return (f"{source}; Reduce_scatter over {format_entry(step.axes)} adds them and leaves each rank "
                f"one piece of dim {step.tensor_dim}")


def _stored_k(transpose_a: bool, transpose_b: bool) -> str:
    """Where K is stored when a transpose flag moved it, for the contraction messages."""
    notes = (["x is stored (..., K, M) with transpose_a=True: K is its dim -2"] if transpose_a else []) + \
        (["w is stored (..., N, K) with transpose_b=True: K is its last dim"] if transpose_b else [])
    return f" ({'; '.join(notes)})" if notes else ""


def _out_in(ws: tuple, k: int, transpose_b: bool) -> str:
    """A hint where w's last dim is x's K: w stored (out, in), as PyTorch's nn.Linear weight is."""
    if transpose_b or ws[-1] != k:
        return ""
    return (f"; w looks stored (out, in) = {ws[-2:]!r}, as nn.Linear's weight is: spmdsim's is (in, out), "
            "x @ w: pass w.T (or ops.matmul(x, w, transpose_b=True))")


def _matmul_dims(ndim: int, transpose: bool) -> tuple[int, int]:
    """(row-ish dim, contraction-or-col dim) positions for the last two dims."""
    return (ndim - 1, ndim - 2) if transpose else (ndim - 2, ndim - 1)


# Pure function of frozen layouts and flags: cached, as ops call it on every forward.
@lru_cache(maxsize=1024)
def infer_matmul(x: TensorLayout, w: TensorLayout, *, transpose_a: bool = False, transpose_b: bool = False,
                 out: Optional[TensorLayout] = None, reduce: bool = True) -> MatMulPlan:
    """Plan Y = op(X) @ op(W) for layouts whose contraction dims use the same axes.

    X is (..., M, K) ((..., K, M) with transpose_a); W is (K, N) or (..., K, N)
    ((..., N, K) with transpose_b). Y maps (batch of X, M of X, N of W) and is
    partial over the axes splitting K until reduced.
    """
    _check_same_mesh(x=x, w=w)
    if x.ndim < 2 or w.ndim < 2:
        raise OperatorError(f"matmul needs operands with at least 2 dims, got x {_fmt(x)} and w {_fmt(w)}")
    if w.ndim != 2 and w.ndim != x.ndim:
        raise OperatorError(f"w {_fmt(w)} must have 2 dims or the same {x.ndim} dims as x {_fmt(x)}")
    x_m, x_k = _matmul_dims(x.ndim, transpose_a)
    w_n, w_k = _matmul_dims(w.ndim, not transpose_b)
    k_x, k_w = x.tensor_map[x_k], w.tensor_map[w_k]
    # An axis of size 1 cuts nothing: K "split" over one on a side only (the same axes otherwise) holds the
    # same blocks as K unsplit, as when tp = 1 leaves a row-parallel weight on L("tp", None).
    cuts = lambda axes: tuple(a for a in axes if x.layout.axis_size(a) > 1)  # noqa: E731
    if cuts(k_x) != cuts(k_w):
        # Suggest a valid map: K's axes move to w's K dim and leave w's other dims, which also give up the
        # axes of x's M and batch dims and of its pending sums (the output would be split twice over them);
        # w's batch dims are x's.
        taken = set(a for e in x.tensor_map for a in e) | set(x.partial)
        fixed = [tuple(a for a in e if a not in taken) for e in w.tensor_map]
        if w.ndim > 2:
            fixed[:-2] = x.tensor_map[:-2]
        fixed[w_k] = k_x
        raise OperatorError(
            f"contraction dim K is split over {format_entry(k_x)} in x {_fmt(x)} but over "
            f"{format_entry(k_w)} in w {_fmt(w)}; both must use the same axes in the same "
            f"order, e.g. w mapped ({', '.join(format_entry(e) for e in fixed)})"
            + _stored_k(transpose_a, transpose_b)
        )
    batch = x.tensor_map[:-2]
    if w.ndim > 2 and w.tensor_map[:-2] != batch:
        raise OperatorError(f"batch dims of x {_fmt(x)} and w {_fmt(w)} must be split the same way")
    if x.partial and w.partial:
        raise OperatorError(f"x {_fmt(x)} and w {_fmt(w)} are both pending sums; resolve one first")
    for a, b, a_name, b_name in ((x, w, "x", "w"), (w, x, "w", "x")):
        clash = [p for p in a.partial if p in b.split_axes]
        if clash:
            raise OperatorError(f"{a_name} {_fmt(a)} is a pending sum over {tuple(clash)!r} but {b_name} "
                                f"{_fmt(b)} is split over them; resolve {a_name} (Allreduce) first")
    out_map = tuple(batch) + (x.tensor_map[x_m], w.tensor_map[w_n])
    names = [f"batch dim {i} of x" for i in range(len(batch))] + ["dim M of x", "dim N of w"]
    # N may not reuse an axis of x's batch or M dims (x's own dims never share one).
    _check_no_reuse(out_map, names, "output")
    # An axis of size 1 cuts nothing: no pending sum over it, no collective.
    split_k = tuple(a for a in k_x if x.layout.axis_size(a) > 1)
    pending = split_k + x.partial + w.partial
    local = TensorLayout(x.layout, out_map, pending)
    final, steps = resolve_partial(local, out, reduce)
    return MatMulPlan(x, w, local, final, steps, split_k, transpose_a, transpose_b)


def matmul_shape(x_shape: Sequence[int], w_shape: Sequence[int], transpose_a: bool = False,
                 transpose_b: bool = False) -> tuple[int, ...]:
    """Global output shape of op(X) @ op(W); ShapeError when the sizes disagree."""
    xs, ws = tuple(x_shape), tuple(w_shape)
    if len(xs) < 2 or len(ws) < 2:
        raise ShapeError(f"matmul needs shapes with at least 2 dims, got {xs!r} and {ws!r}")
    m, k = (xs[-1], xs[-2]) if transpose_a else (xs[-2], xs[-1])
    n, k_w = (ws[-2], ws[-1]) if transpose_b else (ws[-1], ws[-2])
    if k != k_w:
        raise ShapeError(f"contraction sizes differ: x of shape {xs!r} gives K={k!r}, w of shape {ws!r} "
                         f"gives K={k_w!r}" + (_stored_k(transpose_a, transpose_b) or _out_in(ws, k, transpose_b)))
    if len(ws) > 2 and ws[:-2] != xs[:-2]:
        raise ShapeError(f"batch dims of x {xs[:-2]!r} and w {ws[:-2]!r} differ")
    return xs[:-2] + (m, n)


@dataclass(frozen=True)
class LinearPlan:
    """Y = X @ W + b: the matmul plan, where the bias goes and the optional Allgather."""

    matmul: MatMulPlan
    kind: str  # "column", "row", "replicated" or "2d"
    bias: Optional[TensorLayout]
    bias_on_pending: bool
    gather: tuple[Step, ...]  # () or the output's Allgather, after the bias
    out: TensorLayout

    @property
    def steps(self) -> tuple[Step, ...]:
        """Every step of the layer in order: the matmul's, then the gather."""
        return self.matmul.steps + self.gather


# Pure function of frozen layouts and flags: cached, as ops call it on every forward.
@lru_cache(maxsize=1024)
def infer_linear(x: TensorLayout, weight: TensorLayout, bias: Optional[TensorLayout] = None, *,
                 gather_out: bool = False, reduce: bool = True) -> LinearPlan:
    """Plan a Linear layer with weight (in_features, out_features).

    Column-parallel (weight split on out_features): output split on its last
    dim, or Allgather when `gather_out`. Row-parallel (weight split on
    in_features, x split the same way on its last dim): Allreduce, and the bias
    is added once, after the reduction. With `reduce=False` the bias is folded
    into the pending sum on one rank of the group instead.
    """
    if weight.ndim != 2:
        raise OperatorError(f"linear weight {_fmt(weight)} must have 2 dims (in, out)")
    mm = infer_matmul(x, weight, reduce=reduce)
    k_axes, n_axes = weight.tensor_map
    kind = {(False, False): "replicated", (False, True): "column",
            (True, False): "row"}.get((bool(k_axes), bool(n_axes)), "2d")
    out = mm.out
    if bias is not None:
        _check_same_mesh(weight=weight, bias=bias)
        if bias.ndim != 1 or bias.partial:
            raise OperatorError(f"bias layout {_fmt(bias)} must be 1-d and not partial")
        if bias.tensor_map[0] != out.tensor_map[-1]:
            raise OperatorError(f"bias {_fmt(bias)} must be split like the output's last dim "
                                f"({format_entry(out.tensor_map[-1])}) of {_fmt(out)}")
    if gather_out and out.tensor_map[-1] and out.partial:
        raise OperatorError("gather_out needs a reduced result; got a pending sum")
    out, gather = gather_dim(out, gather_out)
    return LinearPlan(mm, kind, bias, bool(mm.out.partial), gather, out)


@dataclass(frozen=True)
class EmbeddingPlan:
    """table[ids]: vocab-parallel (rows split: pending sum) and/or dim-parallel (cols split)."""

    ids: TensorLayout
    table: TensorLayout
    local: TensorLayout
    out: TensorLayout
    vocab_axes: tuple[str, ...]
    dim_axes: tuple[str, ...]
    reduce: tuple[Step, ...]  # () or the vocabulary's Allreduce
    gather: tuple[Step, ...]  # () or the embedding dim's Allgather

    @property
    def steps(self) -> tuple[Step, ...]:
        """Every step of the lookup in order: the reduction, then the gather."""
        return self.reduce + self.gather


# Pure function of frozen layouts and flags: cached, as ops call it on every forward.
@lru_cache(maxsize=1024)
def infer_embedding(ids: TensorLayout, table: TensorLayout, *, gather_out: bool = True,
                    reduce: bool = True, out: Optional[TensorLayout] = None) -> EmbeddingPlan:
    """Plan an Embedding lookup; the table is (num_embeddings, embedding_dim).

    A split vocabulary leaves a pending sum: Allreduce, or with `out` one dim extended by the
    vocabulary's axes, Reduce_scatter onto it (Megatron's sequence parallelism); see `resolve_partial`.
    """
    _check_same_mesh(ids=ids, table=table)
    if table.ndim != 2:
        raise OperatorError(f"embedding table {_fmt(table)} must have 2 dims")
    if ids.partial or table.partial:
        raise OperatorError(f"embedding inputs must not be pending sums: {_fmt(ids)}, {_fmt(table)}")
    vocab, dim = table.tensor_map
    for axes, what in ((vocab, "vocabulary (rows)"), (dim, "embedding dim (columns)")):
        clash = [a for a in axes if a in ids.split_axes]
        if clash:
            raise OperatorError(f"the table's {what} is split over {tuple(clash)!r}, which also splits the "
                                f"ids {_fmt(ids)}; ids must be replicated over the table's axes")
    pending = tuple(a for a in vocab if table.layout.axis_size(a) > 1)
    local = TensorLayout(ids.layout, ids.tensor_map + (dim,), pending)
    out, red = resolve_partial(local, out, reduce)
    out, gather = gather_dim(out, gather_out and not out.partial)
    return EmbeddingPlan(ids, table, local, out, tuple(vocab), tuple(dim), red, gather)


def infer_elementwise(x: TensorLayout, op: str = "relu") -> TensorLayout:
    """Layout of a nonlinear elementwise op (ReLU, GELU): the input's, never partial."""
    if x.partial:
        raise OperatorError(f"{op} of a pending sum over {x.partial!r} is wrong ({op}(a) + {op}(b) != "
                            f"{op}(a + b)); Allreduce or Reduce_scatter the input first")
    return x


def infer_transpose(x: TensorLayout, perm: Optional[Sequence[int]] = None) -> tuple[TensorLayout, tuple[int, ...]]:
    """(layout, perm) of x with its dims permuted: the tensor map follows the dims, no communication.

    `perm` None reverses the dims (numpy's rule). Pending sums stay pending
    (a transpose is linear).
    """
    n = x.ndim
    if perm is None:
        perm = tuple(range(n - 1, -1, -1))
    items = tuple(perm) if isinstance(perm, (tuple, list)) else None
    dims = None if items is None else tuple(as_int(p) for p in items)
    if dims is None or None in dims or sorted(dims) != list(range(n)):
        swap = (" (PyTorch's transpose(a, b), two dims swapped, is x.swapaxes(a, b))"
                if dims is not None and len(dims) == 2 and n > 2 else "")
        raise OperatorError(f"transpose perm {perm!r} must be a permutation of 0..{n - 1} "
                            f"(one entry per dim of {_fmt(x)}){swap}")
    return x.layout(*(x.tensor_map[d] or None for d in dims)).with_partial(x.partial), dims


def infer_softmax(x: TensorLayout, dim: int = -1) -> tuple[TensorLayout, int]:
    """(layout, dim) of softmax along `dim`: local when that dim is whole on every rank.

    Each rank needs the whole row to normalise it, so a split `dim` is refused
    (redistribute x so that dim is whole first); so is a pending sum, whose
    exponential is not the sum of the addends' exponentials.
    """
    d = as_int(dim)
    if d is None or not -x.ndim <= d < x.ndim:
        raise OperatorError(f"softmax dim {dim!r} is out of range for {_fmt(x)} ({counted(x.ndim, 'dim')})")
    d %= x.ndim
    infer_elementwise(x, "softmax")  # nonlinear: a pending sum is refused as for ReLU
    if x.tensor_map[d]:
        raise OperatorError(
            f"softmax along dim {d} of {_fmt(x)}: that dim is split over {format_entry(x.tensor_map[d])}, "
            "so no rank holds a whole row to normalise; redistribute x so dim "
            f"{d} is whole (e.g. to the map with None there) first")
    return x, d


def infer_bias_add(x: TensorLayout, bias: TensorLayout) -> TensorLayout:
    """Layout of x + bias (bias along the last dim): bias split like x's last dim."""
    _check_same_mesh(x=x, bias=bias)
    if x.partial:
        raise OperatorError(f"bias add on a pending sum over {x.partial!r} would add the bias once per rank; "
                            "Allreduce first")
    if bias.ndim != 1 or bias.partial or bias.tensor_map[0] != x.tensor_map[-1]:
        raise OperatorError(f"bias {_fmt(bias)} must be 1-d, not partial, and split like the last dim "
                            f"({format_entry(x.tensor_map[-1])}) of {_fmt(x)}")
    return x
