"""The divergence check's fingerprints (spmdsim.runtime.debug_calls, ``SPMDSIM_CHECK=1``): the int64 row each
rank contributes for a call it is about to make (`fingerprint`), and the words a report gives it
(`describe`)."""
from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any, Optional, Sequence

from . import _roster
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["fingerprint", "describe", "FINGERPRINT_FIELDS"]

FINGERPRINT_FIELDS = 16
_MAX_DIMS = 8  # shape dims stored one per field; further dims are folded into the last
_MAGIC = 0x5350_4D44  # "SPMD": a row of garbage or zeros never matches a real one


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


def fingerprint(seq: int, op: str, axes: Sequence[str], dtype: Any,
                shape: Optional[Sequence[int]], extra: Sequence[Any] = (),
                group_size: int = 0) -> np.ndarray:
    """The int64 row one rank contributes: what it is about to call, in fixed fields (`shape` None: left out)."""
    row = np.full(FINGERPRINT_FIELDS, -1, np.int64)  # magic, seq, op, axes, dtype, group size, extra, shape
    row[:7] = (_MAGIC, seq, _code(op), _code(repr(tuple(axes))), _code(np.dtype(dtype).str), group_size,
               _code(repr(tuple(extra))))
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        row[7] = len(shape)
        head = shape[: _MAX_DIMS - 1]
        row[8:8 + len(head)] = head
        if len(shape) >= _MAX_DIMS:
            row[8 + _MAX_DIMS - 1] = _code(repr(shape[_MAX_DIMS - 1:]))
    return row


@lru_cache(maxsize=1024)
def _cached_row(op: str, axes: tuple, dtype: str, shape: Optional[tuple], extra: tuple,
                g: int) -> np.ndarray:
    # A program repeats few distinct calls: reuse their rows, only the sequence number changes.
    return fingerprint(0, op, axes, dtype, shape, extra, g)


def describe(seq: int, op: str, axes: Sequence[str], dtype: Any,
             shape: Optional[Sequence[int]], extra: Sequence[Any] = ()) -> str:
    """Human text of one call: ``allreduce on ('mp',) float32 (4, 8) (seq 12)``."""
    text = f"{op} {_roster.on_axes(axes)} {np.dtype(dtype).name}"
    if shape is not None:
        text += f" {tuple(int(s) for s in shape)!r}"
    if extra:
        text += f" {tuple(extra)!r}"
    return f"{text} (seq {seq})"
