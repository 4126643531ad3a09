"""Reduction ops of the simulated MPI: MPI.SUM, MAX, ... (or their names) as numpy ufuncs, and the fold.

A predefined op a numpy ufunc computes takes the fast path; the others (MAXLOC, MINLOC, REPLACE, NO_OP, a user
MPI.Op) go through MPI.Op.Reduce_local. `fold` reduces the parts in a fixed order, or in the association of a
tree (spmdsim.runtime.sim.orders).
"""
from __future__ import annotations

import operator
from typing import Any

from ...errors import ShapeError
from ..._lazy import numpy_on_first_use
from ._datatypes import mpi_datatype
from ._mpi import mpi_module
from .orders import evaluate

np = numpy_on_first_use(globals())  # a program without numpy does not load it


# Ops a numpy ufunc computes (the fast path; named, as numpy loads on first use); the others go through
# MPI.Op.Reduce_local.
_REDUCTIONS = {
    "sum": ("add", operator.add),
    "max": ("maximum", max),
    "min": ("minimum", min),
    "prod": ("multiply", operator.mul),
    "land": ("logical_and", lambda a, b: a and b),
    "lor": ("logical_or", lambda a, b: a or b),
    "lxor": ("logical_xor", lambda a, b: bool(a) != bool(b)),
    "band": ("bitwise_and", operator.and_),
    "bor": ("bitwise_or", operator.or_),
    "bxor": ("bitwise_xor", operator.xor),
}
_OTHER_OPS = ("maxloc", "minloc", "replace", "no_op")


class Reduction:
    """One reduction op: its name, numpy ufunc (None: MPI computes it), Python function for objects."""

    __slots__ = ("name", "_ufunc", "fn", "op")

    def __init__(self, name: str, ufunc: Any, fn: Any, op: Any) -> None:
        self.name, self._ufunc, self.fn, self.op = name, ufunc, fn, op

    @property
    def ufunc(self) -> Any:
        found = self._ufunc
        if type(found) is str:  # numpy's name for it: a reduction of objects alone does not load numpy
            found = self._ufunc = getattr(np, found)
        return found

    def __getitem__(self, i: int) -> Any:
        """(name, ufunc, fn)[i], as runtime.algorithms reads a reduction."""
        return (self.name, self.ufunc, self.fn)[i]


_BY_NAME: dict = {}
_BY_OP: dict = {}  # id(MPI.SUM) -> its Reduction, for the predefined ops


def reduction(op: Any) -> Reduction:
    """The Reduction of MPI.SUM/MAX/..., a user MPI.Op, or the names "sum", "max", "min", "prod"."""
    if isinstance(op, str):
        found = _BY_NAME.get(op.lower())
        if found is None and op.lower() in _REDUCTIONS:
            ufunc, fn = _REDUCTIONS[op.lower()]
            found = _BY_NAME[op.lower()] = Reduction(op.lower(), ufunc, fn, None)
        if found is not None:
            return found
    found = _BY_OP.get(id(op))
    if found is not None and found.op is op:  # MPI.SUM, ...: the object itself, kept by the cache
        return found
    mpi = mpi_module()
    if mpi is not None and isinstance(op, mpi.Op):
        for name in (*_REDUCTIONS, *_OTHER_OPS):
            if op == getattr(mpi, name.upper()):
                ufunc, fn = _REDUCTIONS.get(name, (None, op))
                found = Reduction(name, ufunc, fn, op)
                if op is getattr(mpi, name.upper()):
                    _BY_OP[id(op)] = found
                return found
        if op != mpi.OP_NULL:
            # Not named by its handle: each simulated rank runs the script's MPI.Op.Create itself,
            # so one op has a handle per rank, where MPI's processes agree.
            return Reduction("user op", None, op, op)
    raise ShapeError(f"reduction {op!r} is not simulated; expected an MPI.Op (MPI.SUM, MPI.MAX, ...) "
                     f"or one of 'sum', 'max', 'min', 'prod'")


def fold(red: Reduction, parts: list, out: np.ndarray, datatype: Any = None, tree: Any = None) -> None:
    """out = parts[0] op parts[1] op ... in that order (the fixed order every run repeats); with `tree` (nested
    pairs of indices of `parts`, or a function of their count giving them: spmdsim.runtime.sim.orders) a floating-point
    sum, product, max or min in that association instead."""
    if tree is not None and len(parts) > 2 and red.ufunc is not None and out.dtype.kind in "fc":
        if callable(tree):
            tree = tree(len(parts))
        red.ufunc(evaluate(red.ufunc, parts, tree[0]), evaluate(red.ufunc, parts, tree[1]), out=out)
        return
    if len(parts) == 1:
        np.copyto(out, parts[0])
        return
    if red.ufunc is not None and out.dtype.fields is None:
        red.ufunc(parts[0], parts[1], out=out)
        for part in parts[2:]:
            red.ufunc(out, part, out=out)
        return
    mpitype = datatype if datatype is not None else mpi_datatype(out.dtype)
    acc = np.array(parts[0])
    for part in parts[1:]:
        nxt = np.array(part)
        red.op.Reduce_local([acc, mpitype], [nxt, mpitype])  # nxt = acc op nxt
        acc = nxt
    np.copyto(out, acc)
