"""Mesh axes as callers spell them: one name or several."""
from __future__ import annotations

from typing import Iterable

from ..errors import LayoutError

__all__ = ["normalize_axes"]


def normalize_axes(axes: str | Iterable[str]) -> tuple[str, ...]:
    """Accept "mp" or ("dp", "mp") and return a tuple of axis names; anything else (mesh.group(0), None) is
    refused in one line, not Python's "'int' object is not iterable"."""
    if isinstance(axes, str):
        return (axes,)
    out = tuple(axes) if hasattr(axes, "__iter__") and not isinstance(axes, bytes) else None
    if out is None or not all(isinstance(a, str) for a in out):
        raise LayoutError(f"axes {axes!r} must be a mesh axis name or a tuple of them, e.g. 'tp' or ('dp', 'tp')")
    return out
