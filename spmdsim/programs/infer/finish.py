"""Finishing a result: the step records that turn a local result into the wanted layout (pure).

Collective choice (docs/explanation/semantics.md, the collective of each move):
| local result -> wanted            | collective      |
| --------------------------------- | --------------- |
| partial over P -> not partial     | Allreduce(P)    |
| partial over P -> dim d also on P | Reduce_scatter  |
| split dim over A -> gathered      | Allgather(A)    |
"""
from __future__ import annotations

from typing import Optional, Sequence

from ...errors import OperatorError
from ...layouts.layout import TensorLayout
from ...layouts.notation import format_entry
from ..plan.steps import Allgather, Allreduce, ReduceScatter, Step
from ...base.validate import as_int, counted

__all__ = ["resolve_partial", "gather_dim", "out_layout_from_strategy", "fmt"]


def fmt(layout: TensorLayout) -> str:
    """A layout as error messages show it."""
    return str(layout)


def _cuts(t: TensorLayout) -> TensorLayout:
    """`t` without its mesh axes of size 1, which cut nothing: layouts equal here hold the same blocks."""
    size = t.layout.axis_size
    return TensorLayout(t.layout, tuple(tuple(a for a in e if size(a) > 1) for e in t.tensor_map),
                        t.addend_axes)


def resolve_partial(
    local: TensorLayout, out: Optional[TensorLayout] = None, reduce: bool = True
) -> tuple[TensorLayout, tuple[Step, ...]]:
    """Final layout and the steps (none or one collective) for a local result with pending sums.

    Args:
        local: the local result's layout (partial axes = pending sums).
        out: wanted layout; None = Allreduce to a full sum. A dim whose entry is
            the local entry followed by the partial axes asks for Reduce_scatter.
        reduce: False keeps the pending sum (no collective).
    """
    pending = local.partial
    if out is not None and out.layout != local.layout:
        raise OperatorError(f"output layout is on {out.layout} but the inputs are on {local.layout}")
    if not pending or not reduce:
        if out is not None and out != local and _cuts(out) != _cuts(local):
            raise OperatorError(f"the result has layout {fmt(local)}; requested output {fmt(out)} "
                                "needs a redistribution, which this operator does not do")
        return (local if out is None else out), ()
    full = local.with_partial(())
    if out is None or out == full:
        return full, (Allreduce(local, full, pending),)
    if out.partial or out.ndim != local.ndim:
        raise OperatorError(f"requested output {fmt(out)} must be a non-partial layout with {local.ndim} dims")
    changed = [d for d in range(local.ndim) if out.tensor_map[d] != local.tensor_map[d]]
    if len(changed) == 1:
        d = changed[0]
        base, want = local.tensor_map[d], out.tensor_map[d]
        suffix = want[len(base):]
        if want[: len(base)] == base and sorted(suffix) == sorted(pending):
            return out, (ReduceScatter(local, out, suffix, tensor_dim=d),)
    example = list(local.tensor_map)
    example[0] = example[0] + pending
    shown = "(" + ", ".join(format_entry(e) for e in example) + ")"
    raise OperatorError(f"requested output {fmt(out)} cannot be reached from the pending sum {fmt(local)} with one "
                        f"collective; expected {fmt(full)} (Allreduce over {pending!r}) or one dim extended by the "
                        f"partial axes {pending!r}, e.g. {shown} (Reduce_scatter)")


def gather_dim(out: TensorLayout, enabled: bool = True) -> tuple[TensorLayout, tuple[Step, ...]]:
    """The output gathered along its last dim (column-parallel ``gather_output``): layout and steps.

    No step when `enabled` is False or the last dim is whole.
    """
    axes = out.tensor_map[-1]
    if not enabled or not axes:
        return out, ()
    whole = out.with_map(*out.tensor_map[:-1], None)
    return whole, (Allgather(out, whole, axes, tensor_dim=out.ndim - 1),)


def out_layout_from_strategy(local: TensorLayout, counts: Sequence[int]) -> TensorLayout:
    """MindSpore ``out_strategy`` as a layout: the one dim cut more times takes the partial axes.

    E.g. MatMul ((2, 4), (4, 1)) with out_strategy ((8, 1),): the pending sum over
    "k" is reduce-scattered along dim 0, giving ``(("m", "k"), "n")``.
    """
    items = None if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__") else tuple(counts)
    if items is None or any(as_int(c) is None for c in items):
        raise OperatorError(f"out_strategy {counts!r} must be a sequence of integer slice counts")
    counts = tuple(as_int(c) for c in items)
    if len(counts) != local.ndim:
        raise OperatorError(f"out_strategy {counts!r} has {counted(len(counts), 'dim')} "
                            f"but the output has {local.ndim}")
    now = local.shards_per_dim
    extra = local.layout.group_size(local.partial)
    grown = [d for d in range(local.ndim) if counts[d] != now[d]]
    if counts == now:
        return local.with_partial(())
    if len(grown) == 1 and local.partial and counts[grown[0]] == now[grown[0]] * extra:
        d = grown[0]
        entries = list(local.tensor_map)
        entries[d] = entries[d] + local.partial
        return TensorLayout(local.layout, tuple(entries))
    head = f"out_strategy {counts!r} does not follow from the output {fmt(local)} (cut {now!r}); expected {now!r}"
    if not local.partial:  # no finer cut to offer: the line below would say "one dim cut 1 times more"
        raise OperatorError(f"{head}: the contraction is not split, so no pending sum is left to reduce-scatter "
                            "into a finer cut")
    finer = " or ".join(repr(now[:d] + (now[d] * extra,) + now[d + 1:]) for d in range(local.ndim))
    axes = ", ".join(repr(a) for a in local.partial)
    raise OperatorError(f"{head}, or one dim cut {extra} times more ({finer}) by reduce-scattering the sum pending "
                        f"over the contraction's {'axis' if len(local.partial) == 1 else 'axes'} {axes}")
