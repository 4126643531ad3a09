"""Einsum by sharding rules (pure): which split each subscript keeps, and the pending sums it leaves.

- in the output, split over A: the output dim stays split over A
- contracted (not in the output), split over A: the local product is a pending sum over A
- split differently in two operands: the operands are redistributed first, by the least-bytes choice
  (spmdsim.programs.infer.assign), counting the bytes a pending result will need to be resolved
- an operand pending over P: einsum is linear in each operand: the result stays pending over P (the others may not be
  split over P)
- two operands pending: all but the largest are resolved first (a product of sums is not a sum of products)

Matmul is ``einsum("...mk,kn->...mn")``; attention's scores ``einsum("bqhd,bkhd->bhqk")``.
"""
from __future__ import annotations

import math
import string
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from ...errors import OperatorError, ShapeError
from ...base.validate import describe
from ...layouts.layout import TensorLayout
from ...layouts.notation import format_entry
from .assign import Choice, choose_splits, redistribution_bytes

__all__ = ["EinsumSpec", "EinsumPlan", "parse_einsum", "infer_einsum"]


@dataclass(frozen=True)
class EinsumSpec:
    """Subscripts with any ellipsis spelled out as letters: inputs and output."""

    inputs: tuple[str, ...]
    output: str

    def __str__(self) -> str:
        return ",".join(self.inputs) + "->" + self.output


def _split_ellipsis(term: str, ndim: int, fresh: str, spec: str) -> str:
    """`term` with its "..." replaced by the last (ndim - letters) of `fresh`."""
    if "..." not in term:
        return term
    head, _, tail = term.partition("...")
    if "..." in tail or "." in head + tail:
        raise OperatorError(f"einsum spec {spec!r}: {term!r} has a stray '.'; only one '...' per operand")
    count = ndim - len(head) - len(tail)
    if count < 0:
        raise OperatorError(f"einsum spec {spec!r}: operand {term!r} names more dims than its {ndim}")
    return head + fresh[len(fresh) - count:] + tail


def parse_einsum(spec: str, ndims: tuple[int, ...]) -> EinsumSpec:
    """`spec` for operands of `ndims` dims; OperatorError naming what is wrong."""
    if not isinstance(spec, str):  # before the cache, which hashes it: an ndarray's "unhashable type", a traceback
        raise OperatorError(f"einsum spec {describe(spec)} must be a string like 'ij,jk->ik', given first: "
                            "einsum(spec, *operands)")
    return _parse_einsum(spec, ndims)


@lru_cache(maxsize=512)
def _parse_einsum(spec: str, ndims: tuple[int, ...]) -> EinsumSpec:
    text = spec.replace(" ", "")
    arrows = text.count("->")
    if arrows > 1:
        raise OperatorError(f"einsum spec {spec!r} has {arrows} '->'; expected at most one, between the operands "
                            "and the output, e.g. 'ij,jk->ik'")
    stray = next((ch for ch in text.replace("->", "") if ch in "->"), None)
    if stray is not None:
        raise OperatorError(f"einsum spec {spec!r}: {stray!r} is not part of a '->'; expected letters, ',', "
                            "one '->' and '...'")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise OperatorError(f"einsum spec {spec!r} names {len(terms)} operands but {len(ndims)} were given")
    for ch in text:
        if ch not in string.ascii_letters + ".,->":
            raise OperatorError(f"einsum spec {spec!r}: character {ch!r} is not a letter, ',', '->' or '...'")
    named = [t.replace("...", "") for t in terms]
    fresh_pool = [ch for ch in string.ascii_uppercase + string.ascii_lowercase if ch not in text]
    widest = max([nd - len(w) for t, w, nd in zip(terms, named, ndims) if "..." in t], default=0)
    fresh = "".join(fresh_pool[:widest])
    inputs = tuple(_split_ellipsis(t, nd, fresh, spec) for t, nd in zip(terms, ndims))
    for k, (term, nd) in enumerate(zip(inputs, ndims)):
        if len(term) != nd:
            raise OperatorError(f"einsum spec {spec!r}: operand {k} has {nd} dims but subscripts {terms[k]!r}")
        for ch in term:
            if term.count(ch) > 1:
                raise OperatorError(f"einsum spec {spec!r}: letter {ch!r} repeats in operand {k} ({terms[k]!r}); "
                                    "a diagonal is not supported, take it with a mask instead")
    if arrow:
        output = _split_ellipsis(rhs, len(rhs.replace("...", "")) + len(fresh), fresh, spec)
    else:  # numpy's implicit output: the ellipsis, then the letters used once, sorted
        counts = {ch: sum(t.count(ch) for t in named) for ch in "".join(named)}
        output = fresh + "".join(sorted(ch for ch, c in counts.items() if c == 1))
    everything = "".join(inputs)
    for ch in output:
        if ch not in everything:
            raise OperatorError(f"einsum spec {spec!r}: output letter {ch!r} is in no operand")
        if output.count(ch) > 1:
            raise OperatorError(f"einsum spec {spec!r}: output letter {ch!r} repeats")
    return EinsumSpec(inputs, output)


@dataclass(frozen=True)
class EinsumPlan:
    """How an einsum runs: each operand's layout before the local product, and the product's layout."""

    spec: EinsumSpec
    sources: tuple[TensorLayout, ...]
    choice: Choice
    local: TensorLayout  # the local product: output map, pending over the split contracted letters
    shape: tuple[int, ...]
    resolved: tuple[int, ...]  # operands whose pending sums are resolved first

    @property
    def targets(self) -> tuple[TensorLayout, ...]:
        return self.choice.targets

    def why(self) -> str:
        """What moved and why, and where the pending sums come from, in a few clauses."""
        parts = []
        for k in self.resolved:
            parts.append(f"operand {k} is resolved first (two pending operands: a product of sums "
                         "is not the sum of the products)")
        parts += self.choice.moves(self.sources, self.resolved)
        contracted = [(ch, axes) for ch, axes in self.choice.splits
                      if ch not in self.spec.output and any(self.local.layout.axis_size(a) > 1 for a in axes)]
        for ch, axes in contracted:
            parts.append(f"contracted letter {ch!r} is split over {format_entry(axes)}, so each rank holds "
                         "a partial sum")
        if self.local.partial:
            parts.append(f"the result is pending over {self.local.partial!r}")
        return "; ".join(parts) if parts else "every operand's splits agree: no communication"


def _sizes(spec: EinsumSpec, shapes: Sequence[tuple[int, ...]], text: str) -> dict:
    sizes: dict[str, tuple[int, int]] = {}
    for k, (term, shape) in enumerate(zip(spec.inputs, shapes)):
        for ch, size in zip(term, shape):
            if ch in sizes and sizes[ch][0] != size:
                first, at = sizes[ch]
                raise ShapeError(f"einsum {text!r}: letter {ch!r} has size {first} in operand {at} but {size} "
                                 f"in operand {k}")
            sizes.setdefault(ch, (size, k))
    return {ch: s for ch, (s, _) in sizes.items()}


@lru_cache(maxsize=1024)
def infer_einsum(spec: str, layouts: tuple[TensorLayout, ...], shapes: tuple[tuple[int, ...], ...],
                 dtype: str) -> EinsumPlan:
    """Plan ``einsum(spec, *operands)`` on operands of these layouts, global shapes and dtype (pure, cached)."""
    if not layouts:
        raise OperatorError("einsum needs at least one operand")
    mesh = layouts[0].layout
    for k, layout in enumerate(layouts):
        if layout.layout != mesh:
            raise OperatorError(f"einsum operand {k} is on {layout.layout} but operand 0 is on {mesh}; "
                                "operands must share one device matrix")
    parsed = parse_einsum(spec, tuple(len(s) for s in shapes))
    sizes = _sizes(parsed, shapes, spec)
    addends = [tuple(a for a in t.partial) for t in layouts]
    pending = [k for k, p in enumerate(addends) if any(mesh.axis_size(a) > 1 for a in p)]
    keep = max(pending, key=lambda k: (math.prod(shapes[k]), -k)) if pending else None
    partials = [addends[k] if k == keep else () for k in range(len(layouts))]
    reserved = partials[keep] if keep is not None else ()
    shape = tuple(sizes[ch] for ch in parsed.output)

    def product(taken: dict) -> TensorLayout:
        contracted = {a for ch, axes in taken.items() if ch not in parsed.output for a in axes
                      if mesh.axis_size(a) > 1}
        partial = tuple(a for a in mesh.alias_name if a in contracted or a in reserved)
        return TensorLayout(mesh, tuple(taken.get(ch, ()) for ch in parsed.output), partial)

    def later(taken: dict) -> int:  # the Allreduce (or Reduce_scatter) the pending result will need
        local = product(taken)
        return redistribution_bytes(local, local.with_partial(()), shape, dtype) if local.partial else 0

    choice = choose_splits(parsed.inputs, layouts, shapes, dtype, partials, reserved, later=later)
    local = product(dict(choice.splits))
    local.check_shape(shape)
    resolved = tuple(k for k in pending if k != keep)
    return EinsumPlan(parsed, tuple(layouts), choice, local, shape, resolved)
