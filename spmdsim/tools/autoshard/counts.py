"""Slice counts: how many pieces each dim of an operator can be cut into on a number of devices.

The candidates' enumeration (candidates.py) and the operator rules (rules.py) both count with these.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterator, Optional, Sequence

__all__ = ["slice_counts", "fitting"]


def slice_counts(sizes: Sequence[int], devices: int, whole: Sequence[int] = ()) -> Iterator[tuple[int, ...]]:
    """Every tuple of slice counts, one per size, each dividing its size, product dividing devices.

    Dims listed in `whole` are never split.
    """
    options = []
    for d, size in enumerate(sizes):
        options.append([1] if d in whole else
                       [c for c in range(1, devices + 1) if devices % c == 0 and size % c == 0])
    for combo in itertools.product(*options):
        if devices % math.prod(combo) == 0:
            yield combo


def fitting(sizes: Sequence[int], devices: int, whole: Sequence[int] = (),
            full: bool = False, use: Optional[int] = None) -> list[tuple[int, ...]]:
    """`slice_counts`; with `full`, only those using `use` devices (default: every device) when any does
    (MindSpore's fully_use_devices)."""
    combos = list(slice_counts(sizes, devices, whole))
    target = devices if use is None else use
    if full and any(math.prod(c) == target for c in combos):
        combos = [c for c in combos if math.prod(c) == target]
    return combos
