"""Mesh axes as callers spell them: one name or several."""
from __future__ import annotations

from typing import Iterable

__all__ = ["normalize_axes"]


def normalize_axes(axes: str | Iterable[str]) -> tuple[str, ...]:
    """Accept "mp" or ("dp", "mp") and return a tuple of axis names."""
    return (axes,) if isinstance(axes, str) else tuple(axes)
