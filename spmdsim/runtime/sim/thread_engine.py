"""The thread engine: simulated ranks' transfers, one body per kind, on plain arrays and shared memory.

`ThreadEngine` (`THREADS`) is the engine of simulated ranks (spmdsim.runtime.engines.base). A `Member` is one simulated
rank's place in one group (engine.Group) with the group's call counter: what `ThreadEngine` hands a mesh as a group's
communicator. Each transfer deposits this member's buffers in the group's
rendezvous for call number `seq`; in every buffer transfer the last member to
arrive runs every member's reads and writes, in member order (a phase of reads
before a phase of writes where a member may reduce in place), and the members go
on without a second wait (engine.Group.enter_all): nobody reads a buffer once
they are released, so that a sender may reuse its buffer as soon as its call
returns, as under MPI. A phase runs in the last member's thread; what it raises
is raised in its member. Reductions add in group order (member 0 +
member 1 + ...), so every rank gets the same bytes on every run.

The mpi4py emulator (SimComm, spmdsim.emulator.comm) reads mpi4py's buffer
specifications and calls these same bodies: one body per transfer, whichever
door it came in by. A `signature` is what every member's call must agree on
(compared on arrival; a mismatch raises on every member).
"""
from __future__ import annotations

from typing import Any

from ...errors import ShapeError
from ...base.validate import counted
from ._mpi import c_int, mpi_error, mpi_module, special
from ._reductions import reduction
from ..engines import DONE, Engine
from ..engines.base import SimulationError
from .bodies import (all_gather, all_gather_object, all_reduce, all_reduce_object, all_to_all, all_to_all_boxes,
                     all_to_allv, barrier, broadcast, broadcast_object, checked_same, gather_object, gather_to,
                     reduce_scatter, split)
from .groups import Call, Group
from .p2p import post_recv, post_send
from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["ThreadEngine", "THREADS", "Member"]


class ThreadEngine(Engine):
    """Simulated ranks as threads of this process; a group is a `Member` whose calls meet in a rendezvous.

    Transfers complete when made (every member meets in the rendezvous): a `wait` given is handed a
    completed request. Simulated ranks wait busily, and the watchdog times the rendezvous itself
    (spmdsim.runtime.sim.engine.World.wait; debug_calls.waiter gives no wait of its own on a simulated rank).
    """

    name = "threads"
    simulated = True

    def group(self, mesh: Any, axes: tuple[str, ...]) -> tuple[Any, int, int]:
        """The base engine's group, its split named for a report: a rank that makes a mesh group while the
        others call something else reads 'split (the mesh's group over ('tp',), ...)', not a bare split
        the program never wrote."""
        color, key = mesh.layout.split_color_key(mesh.rank, axes)
        comm = mesh.comm
        group = split(comm, color, key, special("UNDEFINED"),
                      f"split (the mesh's group over {axes!r}, made at its first use)")
        _named(group, comm, f"the mesh's group over {axes!r} of")
        sub = Member(group, group.members.index(comm.world_rank))
        return sub, sub.Get_size(), sub.Get_rank()

    def split(self, comm: Any, color: int, key: int) -> Any:
        group = split(comm, color, key, special("UNDEFINED"))
        if group is None:
            return None
        _named(group, comm, "a split of")
        return Member(group, group.members.index(comm.world_rank))

    def free(self, comm: Any) -> None:
        comm._h.freed = True

    def all_reduce(self, comm: Any, send: Any, recv: Any, op: str, wait: Any) -> None:
        dst = recv.reshape(-1)
        all_reduce(comm, dst if send is recv else matching("Allreduce", send.reshape(-1), dst), dst, reduction(op))
        if wait is not None:
            wait(DONE)

    def all_gather(self, comm: Any, send: Any, recv: Any, wait: Any) -> None:
        src = send.reshape(-1)
        all_gather(comm, src, recv.reshape(-1), src.size)
        if wait is not None:
            wait(DONE)

    def reduce_scatter(self, comm: Any, send: Any, recv: Any, op: str, wait: Any) -> None:
        src, dst = send.reshape(-1), recv.reshape(-1)
        if src.dtype is not dst.dtype:
            checked_same("Reduce_scatter_block", src, dst)
        reduce_scatter(comm, src, dst, src.size // comm._group.size, reduction(op))
        if wait is not None:
            wait(DONE)

    def all_to_all(self, comm: Any, send: Any, recv: Any, wait: Any) -> None:
        g = comm._group.size
        src, dst = send.reshape(-1), recv.reshape(-1)
        all_to_all(comm, src, src.size // g, dst, dst.size // g)
        if wait is not None:
            wait(DONE)

    def all_to_allv(self, comm: Any, send: Any, scounts: Any, sdispls: Any, recv: Any, rcounts: Any,
                    rdispls: Any, wait: Any) -> None:
        all_to_allv(comm, send.reshape(-1), scounts, sdispls, recv.reshape(-1), rcounts, rdispls)
        if wait is not None:
            wait(DONE)

    moves_boxes = True

    def all_to_all_boxes(self, comm: Any, sends: dict, receives: dict, dtype: Any, wait: Any) -> None:
        all_to_all_boxes(comm, sends, receives, dtype)
        if wait is not None:
            wait(DONE)

    def broadcast(self, comm: Any, buf: Any, root: int, wait: Any) -> None:
        broadcast(comm, buf.reshape(-1), root)
        if wait is not None:
            wait(DONE)

    def gather_to(self, comm: Any, send: Any, recv: Any, root: int, wait: Any) -> None:
        gather_to(comm, send.reshape(-1), root, None if recv is None else recv.reshape(-1))
        if wait is not None:
            wait(DONE)

    def barrier(self, comm: Any, wait: Any) -> None:
        barrier(comm)
        if wait is not None:
            wait(DONE)

    def isend(self, comm: Any, buf: Any, dest: int, tag: int) -> Any:
        return post_send(comm._group, comm._me, dest, tag, buf)

    def irecv(self, comm: Any, buf: Any, source: int, tag: int) -> Any:
        return post_recv(comm._group, comm._me, source, tag, buf)

    def wait_all(self, requests: list, wait: Any) -> None:
        if wait is None and requests:
            type(requests[0]).Waitall(requests)  # one wait for all: no order among them
        else:
            super().wait_all(requests, wait)

    def all_gather_object(self, comm: Any, obj: Any) -> list:
        return all_gather_object(comm, obj)

    def gather_object(self, comm: Any, obj: Any, root: int) -> Any:
        return gather_object(comm, obj, comm._root(root, "gather"))

    def broadcast_object(self, comm: Any, obj: Any, root: int) -> Any:
        return broadcast_object(comm, obj, comm._root(root, "bcast"))

    def all_reduce_object(self, comm: Any, obj: Any, op: str) -> Any:
        return all_reduce_object(comm, obj, op)


THREADS = ThreadEngine()


def matching(op: str, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The send data `src` of a reduction into `dst` (both flat), checked: of its dtype and count, as
    mpi4py requires ("mismatch in send and receive MPI datatypes"), never converted."""
    checked_same(op, src, dst)
    if src.size != dst.size:
        raise ShapeError(f"{op}: {src.size} items are sent but the receive buffer takes {dst.size}")
    return src


def _named(group: Group, comm: Any, made: str) -> None:
    """Name a `group` split from `comm` that keeps every rank of the world in its order for what made it ('a split
    of the world', "the mesh's group over ('dp',) of the world"), as the emulator names its Split's (SimComm._split):
    as 'the world' its reports would name the world, whose messages it does not match. Other groups: their ranks."""
    if group.made is None and group.members == tuple(range(group.world.size)):
        group.made = f"{made} {comm._group.label()}"


class Count:
    """What copies of one communicator share: the collective call counter and whether it was freed."""

    __slots__ = ("seq", "freed")

    def __init__(self) -> None:
        self.seq = 0  # collective calls on this communicator: the rendezvous number
        self.freed = False


class Member:
    """One simulated rank's place (`_me`) in one group (`_group`): a group's communicator for the
    thread engine. The emulator's SimComm is one, with mpi4py's methods on top."""

    spmdsim_engine = THREADS  # what a Mesh over it runs on (spmdsim.runtime.engines.engine_of)

    def __init__(self, group: Group, me: int) -> None:
        self._group, self._me, self._h = group, me, Count()

    def Get_rank(self) -> int:  # noqa: N802 - the name every engine's communicator answers to
        return self._me

    def Get_size(self) -> int:  # noqa: N802
        return self._group.size

    @property
    def world_rank(self) -> int:
        """This rank's number in the simulated world."""
        return self._group.members[self._me]

    def __repr__(self) -> str:
        return f"<simulated group member {self._me} of {self._group.size} ({self._group.label()})>"

    def _enter(self, op: str, signature: tuple, data: Any = None, complete: Any = None) -> Any:
        h = self._h
        if h is None or h.freed:
            raise _freed(self, op)
        h.seq += 1
        return self._group.enter(self._me, h.seq, Call(op, signature, data, complete))

    def _enter_all(self, op: str, signature: tuple, data: Any, finish: tuple, complete: Any = None) -> Any:
        """`_enter` where the last member to arrive runs every member's `finish` phases (Group.enter_all)."""
        h = self._h
        if h is None or h.freed:
            raise _freed(self, op)
        h.seq += 1
        return self._group.enter_all(self._me, h.seq, Call(op, signature, data, complete, finish))

    def _root(self, root: Any, call: str) -> int:
        """`root` as mpi4py takes it (a float truncated, a str its TypeError: `c_int`), in the group."""
        g = self._group.size
        if type(root) is int and 0 <= root < g:
            return root
        root = c_int(root, f"{call} root")
        if 0 <= root < g:
            return root
        raise bad_root(root, g, call)


def _freed(m: Member, op: str) -> BaseException:
    """A collective on a freed or null communicator: MPI's ERR_COMM under mpi4py, else SimulationError."""
    text = f"{op} on a freed communicator" + ("" if m._h is None else f" (rank {m.world_rank})")
    mpi = mpi_module()
    return mpi_error(mpi, mpi.ERR_COMM, text) if mpi is not None else SimulationError(text)


def bad_root(root: Any, size: int, call: str) -> BaseException:
    """MPI's error for a root outside the communicator (MPI.Exception ERR_ROOT under mpi4py)."""
    mpi = mpi_module()
    text = f"{call}: root {root!r} is outside the communicator of {counted(size, 'rank')}"
    if mpi is not None:
        return mpi_error(mpi, mpi.ERR_ROOT, text)
    return ShapeError(text)
