"""The simulated ranks' transfers, one body per kind (spmdsim.runtime.sim.thread_engine): each deposits
this member's buffers in its group's rendezvous for the call's number, and the last member to arrive
runs every member's reads and writes (spmdsim.runtime.sim.groups.Group.enter_all). The thread engine
and the mpi4py emulator call these same bodies."""
from __future__ import annotations

import pickle
from typing import Any, Callable, Optional, Protocol

from ...errors import DTypeError, ShapeError, exception_text
from ...base.validate import dtype_name
from ._datatypes import copy_into
from ._mpi import mpi_module
from ._reductions import Reduction, fold, reduction
from ...base.validate import _NAMES  # dtype -> its name, filled by dtype_name: read first (no call once known)
from ..engines.base import SimulationError
from .groups import Group
from .orders import evaluate, reduce_scatter_order, reduce_tree
from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "all_to_allv", "broadcast", "gather_to",
           "barrier", "split", "all_gather_object", "gather_object", "broadcast_object", "all_reduce_object",
           "dumps", "op_of", "checked_same", "mpich_parts"]

_PICKLE = pickle.HIGHEST_PROTOCOL


class MemberLike(Protocol):
    """What a body uses of the calling rank's communicator: its group, its place in it and the group's
    rendezvous (spmdsim.runtime.sim.thread_engine.Member, whose engine calls these bodies, and the emulator's
    SimComm, a Member)."""

    _group: Group
    _me: int

    @property
    def world_rank(self) -> int: ...

    def _enter(self, op: str, signature: tuple, data: Any = None, complete: Any = None) -> Any: ...

    def _enter_all(self, op: str, signature: tuple, data: Any, finish: tuple, complete: Any = None) -> Any: ...


# -- buffers -------------------------------------------------------------------------------------

def all_reduce(m: MemberLike, src: np.ndarray, dst: np.ndarray, red: Reduction, datatype: Any = None,
               tree: Any = None) -> None:
    """dst = red over the members of `src` (flat, n items each; `src` may be `dst`: in place), in member order
    or, with `tree`, in that association (spmdsim.runtime.sim.orders)."""
    n = dst.size
    signature = ("allreduce", _NAMES.get(src.dtype) or dtype_name(src.dtype), n, red.name)

    def fold_all(slot: Any) -> None:
        # The first member's phase folds all n items once, before any member writes: g folds of n/g items
        # each cost g times the calls (8 ranks of 8 floats: 147 us against 12). What it raises, every
        # member raises.
        done = slot.shared
        if done is None:
            out = np.empty(n, src.dtype)
            try:
                fold(red, [c.data for c in slot.calls], out, datatype, tree)
            except Exception as exc:
                slot.shared = exc
                raise
            slot.shared = out
        elif isinstance(done, BaseException):
            raise _alike(done)

    def write(slot: Any) -> None:
        dst[...] = slot.shared  # n items: half the time of dst[:n] = ..., once per member

    m._enter_all("allreduce", signature, src, (fold_all, write))


def reduce_scatter(m: MemberLike, src: np.ndarray, dst: np.ndarray, b: int, red: Reduction,
                   datatype: Any = None, nbytes: Optional[int] = None) -> None:
    """dst[:b] = red over the members of block `_me` (b items) of `src` (flat, g blocks; may be `dst`); floats
    associated as MPICH does a call of `nbytes` in all (`mpich_parts`), or with None in member order."""
    me = m._me
    inplace = src is dst
    signature = ("reduce_scatter", _NAMES.get(src.dtype) or dtype_name(src.dtype), b, red.name)
    out = np.empty(b, src.dtype) if inplace else dst[:b]

    def fold_mine(slot: Any) -> None:
        parts, tree = mpich_parts([c.data[me * b:(me + 1) * b] for c in slot.calls], me, red, out, nbytes)
        fold(red, parts, out, datatype, tree)

    def write(slot: Any) -> None:  # in place: after every member read this buffer's blocks
        if inplace:
            dst[:b] = out

    m._enter_all("reduce_scatter", signature, src, (fold_mine, write))


def mpich_parts(parts: list, me: int, red: Reduction, out: np.ndarray, nbytes: Optional[int]) -> tuple:
    """(parts, tree) for `fold`: a floating-point predefined op's parts of member `me`'s block of a Reduce_scatter
    of `nbytes` in all as MPICH folds them (spmdsim.runtime.sim.orders.reduce_scatter_order); else, or with
    `nbytes` None, `parts` in member order."""
    if nbytes is None or red.ufunc is None or out.dtype.kind not in "fc":
        return parts, None
    order, tree = reduce_scatter_order(len(parts), me, nbytes)
    return [parts[i] for i in order], tree


def all_gather(m: MemberLike, src: np.ndarray, dst: np.ndarray, n: int, inplace: bool = False) -> None:
    """Block j (n items) of `dst` = member j's `src`, in group order (`inplace`: `src` is this member's
    block of `dst` already)."""
    g, me = m._group.size, m._me
    signature = ("allgather", _NAMES.get(src.dtype) or dtype_name(src.dtype), src.size)

    def gather_mine(slot: Any) -> None:  # writes only this member's blocks no other member reads
        if not inplace and src.dtype == dst.dtype:
            np.concatenate([c.data for c in slot.calls], out=dst[:n * g])
        else:
            for j, call in enumerate(slot.calls):
                if j != me or not inplace:
                    copy_into(dst[j * n:(j + 1) * n], call.data)

    m._enter_all("allgather", signature, src, (gather_mine,))


def all_to_all(m: MemberLike, src: np.ndarray, b: int, dst: np.ndarray, n: int) -> None:
    """Block j of `dst` (n items) = block `_me` (b items) of member j's `src`."""
    g, me = m._group.size, m._me

    def gather_mine(slot: Any) -> None:  # writes only this member's `dst`, which no member reads
        for j, call in enumerate(slot.calls):
            theirs, tb = call.data
            if theirs.dtype is dst.dtype:
                dst[j * n:(j + 1) * n] = theirs[me * tb:(me + 1) * tb]
            else:
                copy_into(dst[j * n:(j + 1) * n], theirs[me * tb:(me + 1) * tb])

    m._enter_all("alltoall", ("alltoall", _NAMES.get(src.dtype) or dtype_name(src.dtype), b * g), (src, b),
                 (gather_mine,))


def all_to_allv(m: MemberLike, src: np.ndarray, scounts: Any, sdispls: Any, dst: np.ndarray, rcounts: Any,
                rdispls: Any, what: str = "Alltoallv", unit: str = "items") -> None:
    """What member j sends this one (its `scounts[_me]` items from `sdispls[_me]`) lands at `rdispls[j]`.
    `what`, `unit`: the call and what its counts count, as a mismatch names them (Alltoallw: bytes)."""
    me = m._me
    size = dst.itemsize

    def gather_mine(slot: Any) -> None:  # writes only this member's `dst`, which no member reads
        for j, call in enumerate(slot.calls):
            theirs, counts, displs = call.data
            c, at, n = counts[me], displs[me], rcounts[j]
            if c != n and c * theirs.itemsize != n * size:
                raise ShapeError(f"{what} counts disagree: rank {m._group.members[j]} sends "
                                 f"{c} {unit} to rank {m.world_rank}, which expects {n}")
            if n:
                if theirs.dtype is dst.dtype or theirs.dtype == dst.dtype:
                    dst[rdispls[j]:rdispls[j] + n] = theirs[at:at + c]
                else:
                    copy_into(dst[rdispls[j]:rdispls[j] + n], theirs[at:at + c])

    m._enter_all("alltoallv", ("alltoallv", dtype_name(src.dtype)), (src, scounts, sdispls), (gather_mine,))


def all_to_all_boxes(m: MemberLike, sends: dict, receives: dict, dtype: Any) -> None:
    """Member j's ``sends[_me]`` (a view of its block) into this member's ``receives[j]`` (a view of its new
    block), each piece copied once, by the last member to arrive (Group.enter_all: the senders' blocks are
    read before any member goes on)."""
    me = m._me

    def gather_mine(slot: Any) -> None:  # writes only this member's new block, which no member reads
        for j, place in receives.items():
            piece = slot.calls[j].data.get(me)
            if piece is None or piece.shape != place.shape:
                raise ShapeError(f"exchange: rank {m._group.members[j]} sends rank {m.world_rank} "
                                 f"{'nothing' if piece is None else f'a box of shape {piece.shape}'}; "
                                 f"expected a box of shape {place.shape}")
            place[...] = piece

    m._enter_all("alltoallv", ("alltoallv boxes", _NAMES.get(dtype) or dtype_name(dtype)), sends, (gather_mine,))


def broadcast(m: MemberLike, data: np.ndarray, root: int,
              mismatch: Optional[Callable[[Any, int, int, np.ndarray, np.ndarray], BaseException]] = None) -> None:
    """Every member's `data` (flat) = the root's. A receiver whose count is not the root's raises
    `mismatch(group, root, me, sent, data)` (the root's call completes, as under MPI)."""
    me = m._me

    def copy_mine(slot: Any) -> None:
        # The count is the root's to send, each receiver's to check (MPI: a truncation error there).
        sent = slot.calls[root].data
        if sent.size != data.size:
            raise (mismatch or _bcast_count)(m._group, root, me, sent, data)
        copy_into(data, sent)

    # The root's phase does nothing: its buffer is only read.
    m._enter_all("bcast", ("bcast", dtype_name(data.dtype), f"root {root}"), data,
                 (_nothing if me == root else copy_mine,))


def _nothing(slot: Any) -> None:
    """The phase of a member that writes nothing (a root that only sends)."""


def _bcast_count(group: Group, root: int, me: int, sent: np.ndarray, data: np.ndarray) -> BaseException:
    return ShapeError(f"broadcast: the root (group rank {root}) sends {sent.size} items but group rank {me} "
                      f"expects {data.size}")


def gather_to(m: MemberLike, src: Optional[np.ndarray], root: int, dst: Optional[np.ndarray], counts: Any = None,
              displs: Any = None, call: str = "Gather") -> None:
    """Member j's `src` into the root's `dst` at `displs[j]` (`counts[j]` items; default: blocks of equal
    size, side by side). `src` None: the root's block is in place already."""
    me = m._me
    op = call.lower()
    if me == root and counts is None:
        g = m._group.size
        n = dst.size // g
        counts, displs = [n] * g, [n * j for j in range(g)]

    def gather_all(slot: Any) -> None:  # the root's phase: every member's block into its `dst`
        for j, c in enumerate(slot.calls):
            if c.data is not None:
                part = dst[displs[j]:displs[j] + counts[j]]
                if c.data.nbytes != part.nbytes:
                    raise ShapeError(f"{call}: a block of {c.data.size} x {c.data.dtype.name} is sent where "
                                     f"{part.size} x {part.dtype.name} are received")
                copy_into(part, c.data)

    m._enter_all(op, (op, f"root {root}"), src, (gather_all if me == root else _nothing,))


def barrier(m: MemberLike) -> None:
    m._enter("barrier", ("barrier",))


def split(m: MemberLike, color: int, key: int, undefined: int, op: str = "split") -> Optional[Group]:
    """The group of the members of `m`'s with this `color`, ordered by (key, rank in `m`): (group, this
    member's index in it), or None for the color `undefined` (collective). `op`: the call's name in a
    report (the signature members compare stays "split")."""
    group = m._group

    def complete(slot: Any) -> None:
        by_color: dict[int, list] = {}
        for i, call in enumerate(slot.calls):
            c, k = call.data
            if c != undefined:
                by_color.setdefault(c, []).append((k, i))
        slot.shared = {c: Group(group.world, tuple(group.members[i] for _, i in sorted(items)))
                       for c, items in by_color.items()}

    slot = m._enter(op, ("split",), (int(color), int(key)), complete)
    new = slot.shared.get(int(color))
    if new is None or int(color) == undefined:
        return None
    return new


def checked_same(op: str, a: np.ndarray, b: np.ndarray) -> None:
    """A reduction's send and receive buffers must have one dtype (MPI never converts)."""
    if a.dtype != b.dtype:
        raise DTypeError(f"{op}: send dtype {a.dtype.name!r} and receive dtype {b.dtype.name!r} differ")


# -- objects (pickled, as mpi4py pickles them) -------------------------------------------------------

def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, _PICKLE)


def _alike(exc: BaseException) -> BaseException:
    """A fresh copy of `exc` for one more rank (each raises its own), or a SimulationError saying it."""
    try:
        return type(exc)(*exc.args)
    except Exception:  # noqa: BLE001 - a type that cannot be rebuilt from its args
        return SimulationError(f"{type(exc).__name__}: {exception_text(exc)}")


def op_of(op: Any) -> tuple[str, Any]:
    """(name, function of two objects) of an op: MPI's ops are callable on objects, and so is
    a plain Python function of two objects (mpi4py takes one: ``allreduce(x, op=lambda a, b: ...)``)."""
    mpi = mpi_module()
    if callable(op) and not isinstance(op, str) and (mpi is None or not isinstance(op, mpi.Op)):
        return "python function", op
    red = reduction("sum" if op is None else op)
    return red.name, (red.op if red.op is not None else red.fn)


def _shared_fold(fn: Any) -> Any:
    """A rendezvous hook that reduces every member's object once (by the last to arrive), in mpi4py's
    binomial tree to member 0."""
    def complete(slot: Any) -> None:
        try:
            items = [pickle.loads(c.data) for c in slot.calls]
            slot.shared = (True, dumps(evaluate(fn, items, reduce_tree(len(items)))))
        except Exception as exc:  # noqa: BLE001 - raised alike on every member
            slot.shared = (False, exc)
    return complete


def all_gather_object(m: MemberLike, obj: Any) -> list:
    slot = m._enter("allgather(obj)", ("allgather(obj)",), dumps(obj))
    return [pickle.loads(c.data) for c in slot.calls]


def all_reduce_object(m: MemberLike, obj: Any, op: Any) -> Any:
    name, fn = op_of(op)
    # Reduced once, by the last member to arrive: each member then unpickles its own copy,
    # so p ranks cost O(p), not p reductions of p objects.
    slot = m._enter("allreduce(obj)", ("allreduce(obj)", name), dumps(obj), _shared_fold(fn))
    ok, value = slot.shared
    if not ok:
        raise _alike(value)
    return pickle.loads(value)


def broadcast_object(m: MemberLike, obj: Any, root: int) -> Any:
    mine = dumps(obj) if m._me == root else None
    slot = m._enter("bcast(obj)", ("bcast(obj)", f"root {root}"), mine)
    return pickle.loads(slot.calls[root].data)


def gather_object(m: MemberLike, obj: Any, root: int) -> Optional[list]:
    slot = m._enter("gather(obj)", ("gather(obj)", f"root {root}"), dumps(obj))
    return [pickle.loads(c.data) for c in slot.calls] if m._me == root else None
