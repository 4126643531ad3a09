"""The object collectives of SimComm (mpi4py's lowercase methods): pickled, as mpi4py pickles them.

No rank ever holds another's Python object: each result is unpickled by the
rank that returns it (the root of bcast included, as mpi4py does). Reductions
apply the op left to right in group order (member 0 op member 1 op ...).
"""
from __future__ import annotations

import functools
import pickle
from typing import Any, Optional

from ..errors import ShapeError
from ._buffers import mpi_module, reduction
from .engine import SimulationError

__all__ = ["ObjectCollectives"]

_PICKLE = pickle.HIGHEST_PROTOCOL


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, _PICKLE)


def _alike(exc: BaseException) -> BaseException:
    """A fresh copy of `exc` for one more rank (each raises its own), or a SimulationError saying it."""
    try:
        return type(exc)(*exc.args)
    except Exception:  # noqa: BLE001 - a type that cannot be rebuilt from its args
        return SimulationError(f"{type(exc).__name__}: {exc}")


def _op(op: Any) -> tuple[str, Any]:
    """(name, function of two objects) of an op: MPI's ops are callable on objects, and so is
    a plain Python function of two objects (mpi4py takes one: ``allreduce(x, op=lambda a, b: ...)``)."""
    mpi = mpi_module()
    if callable(op) and not isinstance(op, str) and (mpi is None or not isinstance(op, mpi.Op)):
        return "python function", op
    red = reduction("sum" if op is None else op)
    return red.name, (red.op if red.op is not None else red.fn)


def _shared_fold(fn: Any) -> Any:
    """A rendezvous hook that reduces every member's object once (by the last to arrive)."""
    def complete(slot: Any) -> None:
        try:
            items = [pickle.loads(c.data) for c in slot.calls]
            slot.shared = (True, _dumps(functools.reduce(fn, items)))
        except Exception as exc:  # noqa: BLE001 - raised alike on every member
            slot.shared = (False, exc)
    return complete


class ObjectCollectives:
    """Object collectives on `self._group` (a mixin of SimComm)."""

    def barrier(self) -> None:
        self.Barrier()

    def allgather(self, sendobj: Any) -> list:
        slot = self._enter("allgather(obj)", ("allgather(obj)",), _dumps(sendobj))
        return [pickle.loads(c.data) for c in slot.calls]

    def allreduce(self, sendobj: Any, op: Any = None) -> Any:
        name, fn = _op(op)
        # Reduced once, by the last member to arrive: each member then unpickles its own copy,
        # so p ranks cost O(p), not p reductions of p objects.
        slot = self._enter("allreduce(obj)", ("allreduce(obj)", name), _dumps(sendobj), _shared_fold(fn))
        ok, value = slot.shared
        if not ok:
            raise _alike(value)
        return pickle.loads(value)

    def reduce(self, sendobj: Any, op: Any = None, root: int = 0) -> Any:
        name, fn = _op(op)
        root = self._root(root, "reduce")
        slot = self._enter("reduce(obj)", ("reduce(obj)", name, f"root {root}"), _dumps(sendobj))
        if self._me != root:
            return None
        return functools.reduce(fn, [pickle.loads(c.data) for c in slot.calls])

    def _scan_obj(self, call: str, sendobj: Any, op: Any, exclusive: bool) -> Any:
        name, fn = _op(op)
        slot = self._enter(f"{call}(obj)", (f"{call}(obj)", name), _dumps(sendobj))
        upto = self._me if exclusive else self._me + 1
        if not upto:
            return None
        return functools.reduce(fn, [pickle.loads(c.data) for c in slot.calls[:upto]])

    def scan(self, sendobj: Any, op: Any = None) -> Any:
        return self._scan_obj("scan", sendobj, op, False)

    def exscan(self, sendobj: Any, op: Any = None) -> Any:
        return self._scan_obj("exscan", sendobj, op, True)

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        root = self._root(root, "bcast")
        mine = _dumps(obj) if self._me == root else None
        slot = self._enter("bcast(obj)", ("bcast(obj)", f"root {root}"), mine)
        return pickle.loads(slot.calls[root].data)

    def gather(self, sendobj: Any, root: int = 0) -> Optional[list]:
        root = self._root(root, "gather")
        slot = self._enter("gather(obj)", ("gather(obj)", f"root {root}"), _dumps(sendobj))
        return [pickle.loads(c.data) for c in slot.calls] if self._me == root else None

    def scatter(self, sendobj: Any = None, root: int = 0) -> Any:
        root = self._root(root, "scatter")
        mine = None
        if self._me == root:
            g = self._group.size
            items = [None] * g if sendobj is None else list(sendobj)
            if len(items) != g:
                raise ShapeError(f"scatter: root needs a sequence of {g} objects, got {len(items)}")
            mine = [_dumps(o) for o in items]
        slot = self._enter("scatter(obj)", ("scatter(obj)", f"root {root}"), mine)
        return pickle.loads(slot.calls[root].data[self._me])

    def alltoall(self, sendobj: Any) -> list:
        g = self._group.size
        items = [None] * g if sendobj is None else list(sendobj)
        if len(items) != g:
            raise ShapeError(f"alltoall: expected a sequence of {g} objects, got {len(items)}")
        slot = self._enter("alltoall(obj)", ("alltoall(obj)",), [_dumps(o) for o in items])
        return [pickle.loads(c.data[self._me]) for c in slot.calls]
