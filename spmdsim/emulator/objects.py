"""The object collectives of SimComm (mpi4py's lowercase methods): pickled, as mpi4py pickles them.

No rank ever holds another's Python object: each result is unpickled by the
rank that returns it (the root of bcast included, as mpi4py does). Reductions
apply the op in mpi4py's association (spmdsim.runtime.sim.orders): a binomial tree
to member 0 for reduce and allreduce, recursive doubling for scan and exscan.
"""
from __future__ import annotations

import pickle
from typing import Any, Optional

from ..errors import ShapeError
from ..runtime.sim import bodies
from ..runtime.sim.orders import evaluate, reduce_tree, scan_trees

__all__ = ["ObjectCollectives"]

_PICKLE = pickle.HIGHEST_PROTOCOL


_dumps, _op = bodies.dumps, bodies.op_of


class ObjectCollectives:
    """Object collectives on `self._group` (a mixin of SimComm)."""

    def barrier(self) -> None:
        self.Barrier()

    def allgather(self, sendobj: Any) -> list:
        return bodies.all_gather_object(self, sendobj)

    def allreduce(self, sendobj: Any, op: Any = None) -> Any:
        return bodies.all_reduce_object(self, sendobj, op)

    def reduce(self, sendobj: Any, op: Any = None, root: int = 0) -> Any:
        name, fn = _op(op)
        root = self._root(root, "reduce")
        slot = self._enter("reduce(obj)", ("reduce(obj)", name, f"root {root}"), _dumps(sendobj))
        if self._me != root:
            return None
        return evaluate(fn, [pickle.loads(c.data) for c in slot.calls], reduce_tree(len(slot.calls)))

    def _scan_obj(self, call: str, sendobj: Any, op: Any, exclusive: bool) -> Any:
        name, fn = _op(op)
        slot = self._enter(f"{call}(obj)", (f"{call}(obj)", name), _dumps(sendobj))
        tree = scan_trees(len(slot.calls), exclusive)[self._me]
        if tree is None:
            return None
        upto = self._me if exclusive else self._me + 1
        return evaluate(fn, [pickle.loads(c.data) for c in slot.calls[:upto]], tree)

    def scan(self, sendobj: Any, op: Any = None) -> Any:
        return self._scan_obj("scan", sendobj, op, False)

    def exscan(self, sendobj: Any, op: Any = None) -> Any:
        return self._scan_obj("exscan", sendobj, op, True)

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        return bodies.broadcast_object(self, obj, self._root(root, "bcast"))

    def gather(self, sendobj: Any, root: int = 0) -> Optional[list]:
        return bodies.gather_object(self, sendobj, self._root(root, "gather"))

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
