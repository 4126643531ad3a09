"""Choosing one split per index letter for operands that disagree (pure), by the fewest bytes moved.

Einsum and broadcasting elementwise ops share this rule. Each operand names
its dims by letters (einsum's subscripts; an elementwise op's output dims);
the local kernel is right on every rank only when every letter is split the
same way in every operand that has it, and no mesh axis splits two letters.
When the operands disagree, each operand in turn leads: its splits are kept,
the others' are taken where they fit, and every operand is redistributed to
the result. The candidate whose moves receive the fewest bytes per rank
(the planner's figures) wins; ties go to the earlier leader, so operand 0's
layout is kept when nothing is cheaper.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ...layouts.layout import TensorLayout
from ..plan import plan_redistribution
from ..plan.candidates import laid_out

__all__ = ["Choice", "choose_splits", "redistribution_bytes", "moved_text"]


@dataclass(frozen=True)
class Choice:
    """The chosen split of every letter and each operand's layout before the local kernel."""

    splits: tuple[tuple[str, tuple[str, ...]], ...]  # (letter, mesh axes), letters in first-seen order
    targets: tuple[TensorLayout, ...]
    moved: tuple[int, ...]  # per operand: the most bytes any rank receives to get there
    candidates: int  # how many distinct candidates were priced

    def moves(self, sources: Sequence[TensorLayout], skip: Sequence[int] = ()) -> list[str]:
        """A clause per operand that moves (`skip`: those explained elsewhere), for the plans' ``why()``."""
        out = []
        for k, (s, t, b) in enumerate(zip(sources, self.targets, self.moved)):
            if s == t or k in skip:
                continue
            if s.tensor_map == t.tensor_map and set(t.partial) > set(s.partial):
                out.append(f"operand {k} becomes an addend of the pending sum on one replica (B -> P, "
                           "no communication)")
            else:
                out.append(f"operand {k} {s} -> {t} ({moved_text(b, self.candidates)})")
        return out

    def axes(self, letter: str) -> tuple[str, ...]:
        """The mesh axes `letter` is split over (() when whole)."""
        for name, axes in self.splits:
            if name == letter:
                return axes
        return ()


def redistribution_bytes(source: TensorLayout, target: TensorLayout, shape: tuple[int, ...], dtype: str) -> int:
    """The most bytes a rank receives moving `source` to `target` (0 when they are equal)."""
    if source == target:
        return 0
    return plan_redistribution(source, target, shape, dtype).max_bytes_received


def moved_text(nbytes: int, candidates: int) -> str:
    """"4,096 B/rank, the least of 2 choices" (or "a local slice" when nothing moves)."""
    if nbytes == 0:
        return "a local slice, no communication"
    return f"{nbytes:,} B/rank" + (f", the least of {candidates} choices" if candidates > 1 else "")


def _greedy(order: Sequence[int], letters: Sequence[str], layouts: Sequence[TensorLayout],
            reserved: frozenset, splittable: Sequence[frozenset]) -> dict:
    """letter -> axes: each operand in `order` contributes the splits that fit what is taken."""
    taken: dict[str, tuple[str, ...]] = {}
    used = set(reserved)
    for k in order:
        for d, letter in enumerate(letters[k]):
            axes = layouts[k].tensor_map[d]
            if not axes or letter in taken or letter not in splittable[k] or used.intersection(axes):
                continue
            taken[letter] = axes
            used.update(axes)
    return taken


def choose_splits(letters: Sequence[str], layouts: Sequence[TensorLayout], shapes: Sequence[tuple[int, ...]],
                  dtype: str, partials: Sequence[tuple[str, ...]], reserved: Sequence[str] = (),
                  splittable: Sequence[frozenset] | None = None,
                  later: Callable[[dict], int] | None = None) -> Choice:
    """The least-bytes consistent split of every letter, and each operand's target layout.

    Args:
        letters: per operand, one letter per dim.
        layouts, shapes: the operands' layouts and global shapes.
        dtype: the element type (numpy name), for the byte figures.
        partials: per operand, the pending axes its target keeps (() resolves the pending sum).
        reserved: mesh axes no letter may be split over (those of pending sums kept).
        splittable: per operand, the letters its splits may decide (default: all); a broadcast dim of
            size 1 decides nothing.
        later: the bytes a candidate's result will cost later (letter -> axes given): einsum prices
            resolving the pending sum a split contraction leaves, so a small move now that spares a
            large Allreduce later wins.
    """
    n = len(layouts)
    if splittable is None:
        splittable = [frozenset(word) for word in letters]
    seen: dict = {}
    order_letters = list(dict.fromkeys(ch for word in letters for ch in word))
    best = None
    options: dict = {}
    for lead in range(n):
        order = [lead] + [k for k in range(n) if k != lead]
        taken = _greedy(order, letters, layouts, frozenset(reserved), splittable)
        options.setdefault(tuple(sorted(taken.items())), (lead, taken))
    if len(options) == 1:  # one consistent split: nothing to compare, so nothing later to price
        later = None
    for key, (lead, taken) in options.items():
        targets = tuple(laid_out(layouts[k].layout, tuple(taken.get(ch, ()) if ch in splittable[k] else ()
                                                          for ch in letters[k]), partials[k])
                        for k in range(n))
        moved = tuple(redistribution_bytes(layouts[k], targets[k], shapes[k], dtype) for k in range(n))
        seen[key] = (sum(moved) + (later(taken) if later else 0), lead, taken, targets, moved)
        if best is None or seen[key][:2] < best[:2]:
            best = seen[key]
    _, _, taken, targets, moved = best
    splits = tuple((ch, taken[ch]) for ch in order_letters if ch in taken)
    return Choice(splits, targets, moved, len(seen))
