"""Reading mpi4py-style buffer arguments and MPI constants without importing mpi4py."""
from __future__ import annotations

import operator
import sys
from typing import Any, Optional

import numpy as np

from ..errors import ShapeError


class _InPlace:
    """spmdsim.sim.IN_PLACE: MPI.IN_PLACE for code that does not import mpi4py."""

    def __repr__(self) -> str:
        return "IN_PLACE"


IN_PLACE = _InPlace()

# MPICH's values, used when mpi4py is not loaded (a program that passes MPI's
# constants has loaded it, and then its own values are read).
_DEFAULTS = {"ANY_SOURCE": -2, "ANY_TAG": -1, "PROC_NULL": -1, "UNDEFINED": -32766}

_REDUCTIONS = {
    "sum": (np.add, operator.add),
    "max": (np.maximum, max),
    "min": (np.minimum, min),
    "prod": (np.multiply, operator.mul),
}


def _mpi() -> Any:
    return sys.modules.get("mpi4py.MPI")


def special(name: str) -> int:
    """MPI.ANY_SOURCE / ANY_TAG / PROC_NULL / UNDEFINED as this process's MPI defines them."""
    mpi = _mpi()
    return int(getattr(mpi, name)) if mpi is not None else _DEFAULTS[name]


def in_place(buf: Any) -> bool:
    if buf is IN_PLACE:
        return True
    mpi = _mpi()
    return mpi is not None and buf is mpi.IN_PLACE


def reduction(op: Any) -> tuple[str, Any, Any]:
    """(name, numpy ufunc, Python function) of MPI.SUM/MAX/MIN/PROD, or the names "sum", ...."""
    if isinstance(op, str) and op.lower() in _REDUCTIONS:
        return (op.lower(), *_REDUCTIONS[op.lower()])
    mpi = _mpi()
    if mpi is not None:
        for name in _REDUCTIONS:
            if op is getattr(mpi, name.upper()):
                return (name, *_REDUCTIONS[name])
    raise ShapeError(f"reduction {op!r} is not simulated; expected MPI.SUM, MPI.MAX, MPI.MIN or MPI.PROD")


def _array(buf: Any, what: str) -> np.ndarray:
    a = buf if type(buf) is np.ndarray else np.asarray(buf)
    if not a.flags.c_contiguous:
        raise ShapeError(f"{what}: buffer of shape {a.shape!r} is not C-contiguous; MPI needs one block")
    return a.reshape(-1)


def flat(spec: Any, what: str) -> np.ndarray:
    """The buffer of `spec` (an array, or [array, datatype] / [array, count, datatype]) as a flat view."""
    count: Optional[int] = None
    if isinstance(spec, (list, tuple)):
        if len(spec) >= 2 and isinstance(spec[1], (int, np.integer)):
            count = int(spec[1])
        spec = spec[0]
    a = _array(spec, what)
    return a if count is None else a[:count]


def vector(spec: Any, what: str) -> tuple[np.ndarray, list[int], list[int]]:
    """(flat buffer, counts, displacements) of a v-collective buffer spec, in elements.

    Accepts [array, (counts, displs)], [array, (counts, displs), datatype],
    [array, counts, displs, datatype] and [array, counts] (packed displacements).
    """
    if not isinstance(spec, (list, tuple)) or len(spec) < 2:
        raise ShapeError(f"{what}: expected [buffer, (counts, displacements)], got {type(spec).__name__}")
    a = _array(spec[0], what)
    if isinstance(spec[1], tuple) and len(spec[1]) == 2 and not isinstance(spec[1][0], (int, np.integer)):
        counts, displs = spec[1]
    elif len(spec) >= 3 and not _is_datatype(spec[2]):
        counts, displs = spec[1], spec[2]
    else:
        counts, displs = spec[1], None
    counts = [int(c) for c in counts]
    if displs is None:
        displs, at = [], 0
        for c in counts:
            displs.append(at)
            at += c
    return a, counts, [int(d) for d in displs]


def _is_datatype(value: Any) -> bool:
    return not isinstance(value, (list, tuple, np.ndarray))
