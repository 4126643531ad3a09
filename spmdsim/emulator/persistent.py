"""Persistent requests on simulated ranks (mpi4py's ``Send_init``, ``Recv_init``, ``Allreduce_init``, ...,
``Prequest.Start``/``Startall``): a request made once and started many times.

A persistent request is inactive when made: truthy, unequal to MPI.REQUEST_NULL, and a Wait or Test
on it returns at once with an empty status, as MPI's. ``Start`` posts its operation (the nonblocking
call of the same name, with the arguments given at ``..._init``: the buffer's contents when started are
sent, as MPI's); Wait, Test and the class methods (``MPI.Prequest.Waitall``) complete it, and it is
inactive again. ``Free`` makes it null. A collective's persistent form starts its nonblocking form:
``Start`` returns at once, and the completion, once every member started it, runs the rank's part and
lands its result, as the emulator's nonblocking collectives do (spmdsim.emulator.nonblocking).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from ..runtime.sim._mpi import c_int, mpi_error, mpi_module, special
from ..runtime.sim.p2p import _check_peer, _check_tag
from ..runtime.sim.requests import Request, noted
from .wildcards import ANY_SOURCE, ANY_TAG, _any
from .typemap import mapped

__all__ = ["Prequest", "PersistentCalls"]


class Prequest(Request):
    """mpi4py's MPI.Prequest on a simulated rank (see the module docstring)."""

    __slots__ = ("post", "call")

    def __init__(self, post: Optional[Callable[[], Request]] = None, call: str = "persistent request") -> None:
        if post is not None and not callable(post):  # MPI.Prequest(request): a copy of the handle
            Request.__init__(self, post)
            self.post, self.call = getattr(post, "post", None), getattr(post, "call", call)
            return
        Request.__init__(self)
        self.post, self.call = post, call  # call: what made it (Send_init, ...), which a warning names
        if post is not None:
            self.null, self.kind = False, "persistent"

    @property
    def active(self) -> bool:
        return not self.null and bool(self.parts)

    def Start(self) -> None:
        """Post the operation (MPI's error on a null request or one started and not completed)."""
        mpi = mpi_module()
        if self.null or self.post is None:
            raise mpi_error(mpi, mpi.ERR_REQUEST, "Start: the request is MPI.REQUEST_NULL")
        if self.parts:
            raise mpi_error(mpi, mpi.ERR_REQUEST, "Start: the persistent request is active (started and not "
                                                  "completed by a Wait or Test)")
        part = self.post()
        self.parts, where = (part,), ()
        if part.noted is not None:  # a collective's nonblocking call noted its request: this one stands for it
            where = part.noted.pop(id(part))[4:]  # its communicator and rank
            part.noted = None
        noted(self, f"{self.call} (started)", *where)  # until a Wait or Test completes it (a warning if never)

    start = Start

    @classmethod
    def Startall(cls, requests: Sequence[Any]) -> None:
        for request in requests:
            request.Start()

    startall = Startall

    def _finish(self, status: Any) -> Any:
        """Complete the started operation; the request stays, inactive (a freed one stays null)."""
        if self.null:
            return Request._finish(self, status)
        try:
            return Request._finish(self, status)
        finally:
            self.null, self.parts = False, ()

    def Free(self) -> None:
        Request.Free(self)
        self.post = None

    def __repr__(self) -> str:
        state = "null" if self.null else "active" if self.parts else "inactive"
        return f"<simulated Prequest {state}>"


def _persistent_send(call: str, mode: str) -> Callable:
    """A persistent send (`call`'s, in send mode `mode`): its rank and tag checked when made, as MPICH's
    MPI_Send_init checks them (an invalid rank is MPI's error there, not at Start)."""

    name = f"{call[1].upper()}{call[2:]}_init"  # Isend: Send_init

    def init(self: Any, buf: Any, dest: int, tag: int = 0) -> Prequest:
        dest, tag = c_int(dest, "dest"), c_int(tag, "send tag")
        group, _, peer = self._to(dest)  # an intercommunicator's: its remote group's rank
        _check_peer(group, peer, "dest")
        _check_tag(tag, "send tag")
        if dest != special("PROC_NULL"):
            mapped(buf, f"{name} buffer")  # read when made, as mpi4py reads it
        return Prequest(lambda: self._isend(buf, dest, tag, mode, True), name)

    init.__doc__ = f"A persistent request whose Start calls {call} with these arguments (checked now)."
    return _named(init, name)


def _persistent(call: str) -> Callable:
    def init(self: Any, *args: Any, **kwargs: Any) -> Prequest:
        start = getattr(self, call)
        return Prequest(lambda: start(*args, **kwargs), f"{call[1:2].upper()}{call[2:]}_init")

    init.__doc__ = f"A persistent request whose Start calls {call} with these arguments."
    return _named(init, f"{call[1].upper()}{call[2:]}_init")  # Iallreduce: Allreduce_init


def _named(init: Callable, name: str) -> Callable:
    """`init` named `name` to the end of its code object too, as a method defined under that name is: what
    watches the calls a program makes (spmdsim.tools.lab.calls) reads the name from the frame."""
    init.__name__ = init.__qualname__ = name
    init.__code__ = init.__code__.replace(co_name=name)
    return init


class PersistentCalls:
    """SimComm's ``..._init`` methods (a mixin over its nonblocking calls)."""

    Send_init = _persistent_send("Isend", "standard")
    Bsend_init = _persistent_send("Ibsend", "buffered")
    Ssend_init = _persistent_send("Issend", "synchronous")
    Rsend_init = _persistent_send("Irsend", "standard")

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Prequest:
        """A persistent receive; its source and tag are read and checked now, as mpi4py and MPICH do (None:
        mpi4py's TypeError; a rank outside the communicator MPI's invalid rank)."""
        source, tag = _any(source, "source"), _any(tag, "tag")
        if source != special("ANY_SOURCE"):
            group, _, peer = self._from(source)
            _check_peer(group, peer, "source")
        _check_tag(tag, "receive tag", any_tag=True)
        if source != special("PROC_NULL"):
            mapped(buf, "Recv_init buffer")  # read when made, as mpi4py reads it
        return Prequest(lambda: self._irecv(buf, source, tag, True), "Recv_init")

    Barrier_init = _persistent("Ibarrier")
    Bcast_init = _persistent("Ibcast")
    Gather_init = _persistent("Igather")
    Gatherv_init = _persistent("Igatherv")
    Scatter_init = _persistent("Iscatter")
    Scatterv_init = _persistent("Iscatterv")
    Allgather_init = _persistent("Iallgather")
    Allgatherv_init = _persistent("Iallgatherv")
    Alltoall_init = _persistent("Ialltoall")
    Alltoallv_init = _persistent("Ialltoallv")
    Alltoallw_init = _persistent("Ialltoallw")
    Reduce_init = _persistent("Ireduce")
    Allreduce_init = _persistent("Iallreduce")
    Reduce_scatter_block_init = _persistent("Ireduce_scatter_block")
    Reduce_scatter_init = _persistent("Ireduce_scatter")
    Scan_init = _persistent("Iscan")
    Exscan_init = _persistent("Iexscan")
