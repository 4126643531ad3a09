"""A common device matrix for two device matrices of the same device count.

Row-major numbering makes every mesh axis a digit range of the rank written
in mixed radix. Two device matrices have a common refinement when the union
of their digit boundaries is a divisor chain (e.g. (2, 4) and (4, 2) refine
to (2, 2, 2); (2, 3) and (3, 2) have none). On the refined mesh each original
axis is a tuple of refined axes, first major, so both layouts translate
exactly and the planner works on one mesh. Layouts that cut dims by different
rules (Layout.cut) have none: the same shard count cuts a dim differently.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

from ...layouts.layout import Layout, TensorLayout
from .candidates import laid_out

__all__ = ["Refinement", "common_refinement", "translate"]

#: (refined mesh, source axis -> refined axes, target axis -> refined axes)
Refinement = tuple[Layout, dict, dict]


def _spans(layout: Layout) -> dict[str, tuple[int, int]]:
    """Each axis's (stride, stride * size): the rank-digit range it covers."""
    return {
        name: (stride, stride * size)
        for name, stride, size in zip(layout.alias_name, layout.strides, layout.device_matrix)
    }


@lru_cache(maxsize=256)
def common_refinement(first: Layout, second: Layout) -> Optional[Refinement]:
    """The coarsest device matrix refining both, or None when none exists."""
    if first == second:
        same = {a: (a,) for a in first.alias_name}
        return first, same, same
    if first.num_devices != second.num_devices or first.cut != second.cut:
        return None
    if first.num_devices == 1:
        # One device: a single axis of size 1 stands for both; every axis maps to none.
        mesh = Layout((1,), (first.alias_name[0],), first.cut)
        return mesh, {a: () for a in first.alias_name}, {a: () for a in second.alias_name}
    spans1, spans2 = _spans(first), _spans(second)
    cuts = sorted({p for span in (*spans1.values(), *spans2.values()) for p in span})
    if any(hi % lo for lo, hi in zip(cuts, cuts[1:])):
        return None
    pieces = list(zip(cuts, cuts[1:]))[::-1]  # major first
    by_span1 = {span: name for name, span in spans1.items()}
    by_span2 = {span: name for name, span in spans2.items()}
    names: list[str] = []
    for lo, hi in pieces:
        name = by_span1.get((lo, hi))
        if name is None and by_span2.get((lo, hi)) not in (None, *first.alias_name):
            name = by_span2[(lo, hi)]
        if name is None:
            owner = next(a for a, (l1, h1) in spans1.items() if l1 <= lo and hi <= h1)
            inside = [p for p in pieces if spans1[owner][0] <= p[0] and p[1] <= spans1[owner][1]]
            name = f"{owner}.{inside.index((lo, hi))}"
        while name in names:
            name += "'"
        names.append(name)
    # The even and balanced rules cut by the shard count, so an axis and its refinement into several cut
    # alike; the chunk rule cuts axis by axis, so the planner keeps a refinement only where it cuts alike.
    refined = Layout(tuple(hi // lo for lo, hi in pieces), tuple(names), first.cut)

    def members(spans: dict) -> dict:
        return {
            axis: tuple(n for n, (lo, hi) in zip(names, pieces) if l0 <= lo and hi <= h0)
            for axis, (l0, h0) in spans.items()
        }

    return refined, members(spans1), members(spans2)


def translate(tl: TensorLayout, mesh: Layout, members: dict) -> TensorLayout:
    """The same sharding written on the refined mesh."""
    tensor_map = tuple(tuple(r for a in axes for r in members[a]) for axes in tl.tensor_map)
    partial = tuple(r for a in tl.partial for r in members[a])
    return laid_out(mesh, tensor_map, partial)
