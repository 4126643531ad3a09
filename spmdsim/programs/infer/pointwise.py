"""Elementwise ops with numpy broadcasting, and reductions over dims, by sharding rules (pure).

Elementwise: the output takes numpy's broadcast shape; each output dim keeps
the split its operands agree on (operands that disagree are redistributed by
the least-bytes choice, spmdsim.programs.infer.assign; a broadcast dim of size 1 is
never split). Pending sums (partial layouts):

- add, sub, neg, where's two branches: stays pending; a non-pending operand becomes an addend on one replica (B -> P, no
  communication)
- mul: stays pending when the other operand is not (a * sum = sum of a * addend); two pending: the smaller is resolved
- div: a pending numerator stays pending; a pending denominator is resolved
- exp, log, sqrt, tanh, pow, maximum, minimum, relu, gelu, where's condition: resolved first: f(a + b) != f(a) + f(b)
- sigmoid, silu, sin, cos, square, rsqrt, clip, erf, exact gelu: resolved first, likewise

Reductions: ``sum``/``mean`` over a split dim leave a pending sum over its
axes (no communication) and keep an input's pending sum; ``max``/``min``
over a split dim finish with one Allreduce(MAX/MIN) over its axes, after
resolving a pending input.
"""
from __future__ import annotations

import math
import string
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

from ...errors import OperatorError, ShapeError
from ...layouts.layout import TensorLayout
from ...layouts.notation import format_entry
from ..plan.steps import Allreduce, Step
from ...base.validate import as_int, dims_expected
from .assign import Choice, choose_splits, redistribution_bytes

__all__ = ["PointwisePlan", "ReducePlan", "infer_pointwise", "infer_reduce", "LINEARITY", "broadcast_shape",
           "operand_letters"]

#: Per op, the operands in which it is linear, jointly: a pending sum there may stay pending.
#: "one" means bilinear (at most one pending operand among them); "numerator" is div's first operand.
LINEARITY = {
    "add": "joint", "sub": "joint", "neg": "joint", "where": "branches",
    "mul": "one", "div": "numerator", "floordiv": None, "mod": None, "round": None, "rint": None, "floor": None,
    "ceil": None, "sign": None, "log1p": None, "expm1": None, "and": None, "or": None, "xor": None, "invert": None,
    "logical_and": None, "logical_or": None, "logical_xor": None, "logical_not": None, "isnan": None, "isinf": None,
    "isfinite": None,
    "exp": None, "log": None, "sqrt": None, "tanh": None, "pow": None, "maximum": None, "minimum": None,
    "relu": None, "gelu": None, "abs": None, "eq": None, "lt": None, "gt": None, "le": None, "ge": None, "ne": None,
    "sigmoid": None, "silu": None, "sin": None, "cos": None, "square": None, "rsqrt": None, "clip": None,
    "erf": None, "gelu_erf": None,
}


def broadcast_shape(shapes: Sequence[tuple[int, ...]], what: str) -> tuple[int, ...]:
    """numpy's broadcast shape, or a ShapeError naming the shapes."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        sizes = {s[d - ndim + len(s)] for s in shapes if d - ndim + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ShapeError(f"{what}: shapes {', '.join(repr(tuple(s)) for s in shapes)} do not broadcast "
                             f"(output dim {d} would need sizes {sorted(sizes)!r} to agree)")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


@dataclass(frozen=True)
class PointwisePlan:
    """Each operand's layout before the kernel, and the output's."""

    op: str
    shape: tuple[int, ...]
    sources: tuple[TensorLayout, ...]
    choice: Choice
    out: TensorLayout
    resolved: tuple[int, ...]  # operands whose pending sums are resolved first

    @property
    def targets(self) -> tuple[TensorLayout, ...]:
        return self.choice.targets

    def why(self) -> str:
        """What moved and why, in a few clauses."""
        parts = []
        for k in self.resolved:
            parts.append(f"operand {k} (pending over {self.sources[k].partial!r}) is resolved first: "
                         f"{_reason(self.op, k)}")
        parts += self.choice.moves(self.sources, self.resolved)
        if self.out.partial:
            parts.append(f"the result stays pending over {self.out.partial!r} ({self.op} is linear there)")
        return "; ".join(parts) if parts else "the operands' splits agree: no communication"


def _reason(op: str, k: int) -> str:
    kind = LINEARITY.get(op)
    if kind == "one":
        return "a product of two pending sums is not the sum of the products"
    if kind == "numerator":
        return "dividing by a sum is not the sum of divisions"
    if kind in ("joint", "branches"):
        return ("resolving it now moves fewer bytes than keeping the result pending "
                "(or where's condition is a pending sum)")
    return f"{op}(a + b) != {op}(a) + {op}(b)"


def operand_letters(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[str, frozenset]:
    """An operand's dims as output-dim letters (the output's dims are ``a, b, ...``), and those that decide
    a split: not broadcast (a dim of size 1 stretched to a larger output dim is never split)."""
    offset = len(out) - len(shape)
    word = string.ascii_letters[offset:offset + len(shape)]
    deciding = frozenset(ch for ch, size, d in zip(word, shape, range(offset, len(out))) if size == out[d])
    return word, deciding


@lru_cache(maxsize=2048)
def infer_pointwise(op: str, layouts: tuple[TensorLayout, ...], shapes: tuple[tuple[int, ...], ...],
                    dtype: str) -> PointwisePlan:
    """Plan an elementwise `op` with broadcasting over operands of these layouts and shapes (pure, cached)."""
    if op not in LINEARITY:
        raise OperatorError(f"elementwise op {op!r} is not known; expected one of {sorted(LINEARITY)!r}")
    mesh = layouts[0].layout
    for k, layout in enumerate(layouts):
        if layout.layout != mesh:
            raise OperatorError(f"{op}: operand {k} is on {layout.layout} but operand 0 is on {mesh}; "
                                "operands must share one device matrix")
    shape = broadcast_shape(shapes, op)
    if len(shape) > len(string.ascii_letters):
        raise ShapeError(f"{op}: {len(shape)} dims are more than spmdsim's elementwise ops take (52)")
    words, deciding = zip(*(operand_letters(s, shape) for s in shapes))
    for k, (layout, s) in enumerate(zip(layouts, shapes)):
        offset = len(shape) - len(s)
        for d, size in enumerate(s):
            # A dim of size 1 stretched to a larger output dim cannot stay split (its one row is every row). One
            # the output keeps at size 1 (no operand broadcasts it) can: an uneven cut's (one rank holds it).
            if size == 1 and shape[offset + d] != 1 and layout.tensor_map[d] \
                    and any(mesh.axis_size(a) > 1 for a in layout.tensor_map[d]):
                raise OperatorError(f"{op}: operand {k} dim {d} has size 1 but is split over "
                                    f"{format_entry(layout.tensor_map[d])}")
    pending = [k for k, t in enumerate(layouts) if t.addend_axes]
    kind = LINEARITY[op]
    keepable = _keepable(kind, pending, shapes)
    options = []
    if keepable:
        axes = {a for k in keepable for a in layouts[k].partial}
        union = tuple(a for a in mesh.alias_name if a in axes)
        linear = set(keepable) if kind != "joint" and kind != "branches" else _joint(kind, len(layouts))
        partials = [union if k in linear else () for k in range(len(layouts))]
        options.append((partials, union))
    options.append(([()] * len(layouts), ()))
    best = None
    for partials, reserved in options:
        choice = choose_splits(words, layouts, shapes, dtype, partials, reserved, deciding)
        out = TensorLayout(mesh, tuple(choice.axes(ch) for ch in string.ascii_letters[:len(shape)]), reserved)
        out.check_shape(shape)
        # A sum kept pending is resolved later at the output's size: priced now, so that a small pending
        # operand (a mean) is resolved at its own size instead of making a large output pending.
        cost = sum(choice.moved) + (redistribution_bytes(out, out.with_partial(()), shape, dtype) if reserved else 0)
        if best is None or cost < best[0]:
            best = (cost, choice, out)
    _, choice, out = best
    resolved = tuple(k for k in pending if not choice.targets[k].partial)
    return PointwisePlan(op, shape, tuple(layouts), choice, out, resolved)


def _joint(kind: str, n: int) -> set:
    """The operands that join a kept pending sum: all (add, sub, neg) or where's two branches."""
    return set(range(n)) if kind == "joint" else {1, 2}


def _keepable(kind: Optional[str], pending: list, shapes: Sequence[tuple[int, ...]]) -> list:
    """The pending operands whose sums may stay pending under this op's linearity."""
    if kind is None or not pending:
        return []
    if kind == "joint":
        return pending
    if kind == "branches":
        return [k for k in pending if k in (1, 2)] if 0 not in pending else []
    if kind == "numerator":
        return [0] if pending == [0] else []
    # "one": keep the largest pending operand; the other is resolved.
    return [max(pending, key=lambda k: (math.prod(shapes[k]), -k))]


@dataclass(frozen=True)
class ReducePlan:
    """A reduction: the input's layout before it, the reduced dims, the output, and its finishing steps."""

    kind: str
    source: TensorLayout
    target: TensorLayout  # the input after any resolution (max/min of a pending sum)
    dims: tuple[int, ...]
    keepdims: bool
    local: TensorLayout  # the local reduction's layout (sum/mean: pending over the reduced dims' axes)
    out: TensorLayout
    steps: tuple[Step, ...]  # max/min: Allreduce(MAX/MIN) over the reduced dims' axes

    def why(self) -> str:
        axes = tuple(a for d in self.dims for a in self.target.tensor_map[d]
                     if self.target.layout.axis_size(a) > 1)
        parts = []
        if self.target != self.source:
            parts.append(f"the input (pending over {self.source.partial!r}) is resolved first: "
                         f"{self.kind} of a sum is not the sum of {self.kind}s")
        if axes and self.steps:
            parts.append(f"reduced dims split over {format_entry(axes)}: Allreduce({self.kind.upper()}) "
                         "over them")
        elif axes:
            parts.append(f"reduced dims split over {format_entry(axes)}: the result is a pending sum over them")
        return "; ".join(parts) if parts else "reduced dims are whole on every rank: no communication"


def reduce_dims(dims: object, ndim: int, kind: str) -> tuple[int, ...]:
    """`dims` (None, an int or a sequence) as sorted non-negative dims, or the error naming them."""
    if dims is None:
        return tuple(range(ndim))
    items = [dims] if not isinstance(dims, (tuple, list)) else list(dims)
    out = []
    for item in items:
        d = as_int(item)
        if d is None or not -ndim <= d < ndim:
            raise OperatorError(f"{kind}: dim {item!r} is out of range for a tensor of {ndim} dims "
                                + dims_expected(ndim))
        d %= ndim
        if d in out:
            raise OperatorError(f"{kind}: dim {item!r} is given twice in {dims!r}")
        out.append(d)
    return tuple(sorted(out))


@lru_cache(maxsize=1024)
def infer_reduce(kind: str, layout: TensorLayout, dims: tuple[int, ...], keepdims: bool) -> ReducePlan:
    """Plan a reduction `kind` ("sum", "mean", "max", "min") over normalized `dims` (pure, cached)."""
    if kind not in ("sum", "mean", "max", "min"):
        raise OperatorError(f"reduction {kind!r} is not known; expected 'sum', 'mean', 'max' or 'min'")
    mesh = layout.layout
    linear = kind in ("sum", "mean")
    target = layout if linear or not layout.addend_axes else layout.with_partial(())
    axes = tuple(a for d in dims for a in target.tensor_map[d])
    split = tuple(a for a in axes if mesh.axis_size(a) > 1)
    kept = [() if d in dims else target.tensor_map[d] for d in range(layout.ndim)]
    out_map = tuple(kept) if keepdims else tuple(e for d, e in enumerate(kept) if d not in dims)
    if linear:
        pend = set(target.partial) | set(split)
        local = TensorLayout(mesh, out_map, tuple(a for a in mesh.alias_name if a in pend))
        return ReducePlan(kind, layout, target, dims, keepdims, local, local, ())
    out = TensorLayout(mesh, out_map, target.partial)
    if not split:
        return ReducePlan(kind, layout, target, dims, keepdims, out, out, ())
    local = out.with_partial(tuple(a for a in mesh.alias_name if a in split))
    return ReducePlan(kind, layout, target, dims, keepdims, local, out,
                      (Allreduce(local, out, split, reduction=kind),))
