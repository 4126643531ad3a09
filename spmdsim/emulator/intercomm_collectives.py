"""The collectives of a simulated intercommunicator (mpi4py's Intercomm methods), built as MPICH builds them.

A rooted collective names the root in the root's group with MPI.ROOT (MPI.PROC_NULL on the other members
of that group) and in the other group with its remote rank: the root's group hands its data to the other
group's leader (local rank 0), which spreads it over its own group (Bcast, Scatter), or the other group
gathers or reduces to its leader, which sends the result to the root (Gather, Reduce). Allreduce and
Allgather give each group the reduction or the gathering of the other group's data: each group reduces or
gathers to its leader, the leaders swap, each leader broadcasts over its own group. Barrier is one of
both groups. The messages travel on a private communicator of both groups (`_union`), the local steps on a
private copy of the local group (`_local`), so no message of the program's can take them, and a rank that
skips its part leaves the others waiting in the engine, which reports it (as for intracommunicators).
"""
from __future__ import annotations

from typing import Any

from .._lazy import numpy_on_first_use
from ..runtime.sim._mpi import c_int, mpi_error, mpi_module, special
from ..runtime.sim.engine import SimulationError
from .nonblocking import _SUM
from .derived import wmessage
from .typemap import message, vector

np = numpy_on_first_use(globals())

__all__ = ["IntercommCollectives"]

_TAG = 0  # the collectives' messages on the private communicator of both groups, in the order they are called


class IntercommCollectives:
    """The collectives of SimIntercomm (a mixin; `_local`, `_union`, `_low`, `_remote` are the intercomm's)."""

    # -- where things are -------------------------------------------------------------------

    def _lead(self) -> bool:
        return self._local._me == 0

    def _peer_leader(self) -> int:
        """The remote group's leader (its rank 0) in the communicator of both groups (the low group first)."""
        return self._local._group.size if self._low else 0

    def _at(self, remote: int) -> int:
        """The remote group's rank `remote` in the communicator of both groups."""
        return remote + (self._local._group.size if self._low else 0)

    def _role(self, root: Any, call: str) -> Any:
        """"root" (MPI.ROOT), None (MPI.PROC_NULL), or the remote root's rank, as `root` names it."""
        self._live_handle()
        root = c_int(root, f"{call} root")
        if root == special("ROOT"):
            return "root"
        if root == special("PROC_NULL"):
            return None
        if 0 <= root < len(self._remote):
            return root
        text = (f"{call}: root {root} is not MPI.ROOT, MPI.PROC_NULL or a rank of the remote group "
                f"(0 to {len(self._remote) - 1})")
        mpi = mpi_module()
        raise mpi_error(mpi, mpi.ERR_ROOT, text) if mpi is not None else SimulationError(text)

    def _swapped(self, obj: Any) -> Any:
        """The leaders' exchange of `obj` (the other leader's); None elsewhere."""
        if not self._lead():
            return None
        peer = self._peer_leader()
        return self._union.sendrecv(obj, peer, _TAG, None, peer, _TAG)

    # -- buffers ------------------------------------------------------------------------------

    def Barrier(self) -> None:
        self._live_handle()
        self._union.Barrier()

    def barrier(self) -> None:
        self._live_handle()
        self._union.barrier()

    def Ibarrier(self) -> Any:
        self._live_handle()
        return self._union.Ibarrier()

    def Bcast(self, buf: Any, root: int = 0) -> None:
        role = self._role(root, "Bcast")
        if role == "root":
            self._union.Send(buf, self._peer_leader(), _TAG)
        elif role is not None:
            if self._lead():
                self._union.Recv(buf, self._at(role), _TAG)
            self._local.Bcast(buf, 0)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        role = self._role(root, "Gather")
        if role == "root":
            self._union.Recv(recvbuf, self._peer_leader(), _TAG)
        elif role is not None:
            src, n, _ = message(sendbuf, "Gather sendbuf")
            tmp = np.empty(self._local._group.size * n, src.dtype) if self._lead() else None
            self._local.Gather(src[:n], tmp, 0)
            if tmp is not None:
                self._union.Send(tmp, self._at(role), _TAG)

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        role = self._role(root, "Scatter")
        if role == "root":
            self._union.Send(sendbuf, self._peer_leader(), _TAG)
        elif role is not None:
            dst, n, _ = message(recvbuf, "Scatter recvbuf", readonly=False)
            tmp = np.empty(self._local._group.size * n, dst.dtype) if self._lead() else None
            if tmp is not None:
                self._union.Recv(tmp, self._at(role), _TAG)
            self._local.Scatter(tmp, dst[:n], 0)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, root: int = 0) -> None:
        role = self._role(root, "Reduce")
        if role == "root":
            self._union.Recv(recvbuf, self._peer_leader(), _TAG)
        elif role is not None:
            src, n, _ = message(sendbuf, "Reduce sendbuf")
            tmp = np.empty(n, src.dtype) if self._lead() else None
            self._local.Reduce(src[:n], tmp, op, 0)
            if tmp is not None:
                self._union.Send(tmp, self._at(role), _TAG)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> None:
        self._live_handle()
        src, n, _ = message(sendbuf, "Allreduce sendbuf")
        dst, _, _ = message(recvbuf, "Allreduce recvbuf", readonly=False)
        tmp = np.empty(n, src.dtype) if self._lead() else None
        self._local.Reduce(src[:n], tmp, op, 0)
        if tmp is not None:
            peer = self._peer_leader()
            self._union.Sendrecv(tmp, peer, _TAG, dst[:n], peer, _TAG)
        self._local.Bcast(dst[:n], 0)

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        self._live_handle()
        src, n, _ = message(sendbuf, "Allgather sendbuf")
        rsize = len(self._remote)
        dst, m, _ = message(recvbuf, "Allgather recvbuf", blocks=rsize, readonly=False)
        tmp = np.empty(self._local._group.size * n, src.dtype) if self._lead() else None
        self._local.Gather(src[:n], tmp, 0)
        if tmp is not None:
            peer = self._peer_leader()
            self._union.Sendrecv(tmp, peer, _TAG, dst[:rsize * m], peer, _TAG)
        self._local.Bcast(dst[:rsize * m], 0)

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        self._live_handle()
        rsize = len(self._remote)
        src, b, _ = message(sendbuf, "Alltoall sendbuf", blocks=rsize)
        dst, n, _ = message(recvbuf, "Alltoall recvbuf", blocks=rsize, readonly=False)
        self._exchange([(src[j * b:(j + 1) * b], j) for j in range(rsize)],
                       [(dst[j * n:(j + 1) * n], j) for j in range(rsize)])

    # -- vectors: a message between each pair that moves data -----------------------------------

    def _exchange(self, sends: list, receives: list) -> None:
        """Send each (data, remote rank) of `sends` and receive each (buffer, remote rank) of `receives`."""
        union = self._union
        reqs = [union.Isend(data, self._at(j), _TAG) for data, j in sends]
        reqs += [union.Irecv(buf, self._at(j), _TAG) for buf, j in receives]
        for req in reqs:
            req.Wait()

    def _blocks(self, buf: Any, what: str, readonly: bool) -> list:
        """The remote group's blocks of a vector message `buf` (buffer, counts, displacements)."""
        data, counts, displs, _ = vector(buf, what, len(self._remote), readonly=readonly)
        return [data[d:d + c] for c, d in zip(counts, displs)]

    def _mine(self, buf: Any, what: str, readonly: bool) -> Any:
        data, n, _ = message(buf, what, readonly=readonly)
        return data[:n]

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        role = self._role(root, "Gatherv")
        if role == "root":
            self._exchange([], [(b, j) for j, b in enumerate(self._blocks(recvbuf, "Gatherv recvbuf", False))])
        elif role is not None:
            self._exchange([(self._mine(sendbuf, "Gatherv sendbuf", True), role)], [])

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        role = self._role(root, "Scatterv")
        if role == "root":
            self._exchange([(b, j) for j, b in enumerate(self._blocks(sendbuf, "Scatterv sendbuf", True))], [])
        elif role is not None:
            self._exchange([], [(self._mine(recvbuf, "Scatterv recvbuf", False), role)])

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        self._live_handle()
        mine = self._mine(sendbuf, "Allgatherv sendbuf", True)
        blocks = self._blocks(recvbuf, "Allgatherv recvbuf", False)
        self._exchange([(mine, j) for j in range(len(blocks))], [(b, j) for j, b in enumerate(blocks)])

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        self._live_handle()
        sends = self._blocks(sendbuf, "Alltoallv sendbuf", True)
        receives = self._blocks(recvbuf, "Alltoallv recvbuf", False)
        self._exchange(list(zip(sends, range(len(sends)))), list(zip(receives, range(len(receives)))))

    def Alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:
        """Alltoallv with a datatype per block and displacements in bytes: the blocks' bytes move."""
        self._live_handle()
        rsize = len(self._remote)
        dst, rsizes, rdispls, unpack = wmessage(recvbuf, "Alltoallw recvbuf", rsize, writable=True)
        src, ssizes, sdispls = wmessage(sendbuf, "Alltoallw sendbuf", rsize, writable=False)[:3]
        self._exchange([(src[d:d + c], j) for j, (c, d) in enumerate(zip(ssizes, sdispls))],
                       [(dst[d:d + c], j) for j, (c, d) in enumerate(zip(rsizes, rdispls))])
        if unpack is not None:
            unpack()

    # -- objects ------------------------------------------------------------------------------

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        role = self._role(root, "bcast")
        if role == "root":
            self._union.send(obj, self._peer_leader(), _TAG)
        elif role is not None:
            got = self._union.recv(None, self._at(role), _TAG) if self._lead() else None
            return self._local.bcast(got, 0)
        return None

    def gather(self, sendobj: Any, root: int = 0) -> Any:
        role = self._role(root, "gather")
        if role == "root":
            return self._union.recv(None, self._peer_leader(), _TAG)
        if role is not None:
            got = self._local.gather(sendobj, 0)
            if self._lead():
                self._union.send(got, self._at(role), _TAG)
        return None

    def scatter(self, sendobj: Any = None, root: int = 0) -> Any:
        role = self._role(root, "scatter")
        if role == "root":
            self._union.send(list(sendobj), self._peer_leader(), _TAG)
        elif role is not None:
            got = self._union.recv(None, self._at(role), _TAG) if self._lead() else None
            return self._local.scatter(got, 0)
        return None

    def reduce(self, sendobj: Any, op: Any = None, root: int = 0) -> Any:
        role = self._role(root, "reduce")
        if role == "root":
            return self._union.recv(None, self._peer_leader(), _TAG)
        if role is not None:
            got = self._local.reduce(sendobj, op, 0)
            if self._lead():
                self._union.send(got, self._at(role), _TAG)
        return None

    def allreduce(self, sendobj: Any, op: Any = None) -> Any:
        self._live_handle()
        got = self._local.reduce(sendobj, op, 0)
        return self._local.bcast(self._swapped(got), 0)

    def allgather(self, sendobj: Any) -> list:
        self._live_handle()
        return self._local.bcast(self._swapped(self._local.gather(sendobj, 0)), 0)

    def alltoall(self, sendobj: Any) -> list:
        self._live_handle()
        rsize = len(self._remote)
        sendobj = [None] * rsize if sendobj is None else list(sendobj)
        if len(sendobj) != rsize:
            raise ValueError(f"alltoall: {len(sendobj)} objects for a remote group of {rsize} ranks")
        reqs = [self._union.isend(sendobj[j], self._at(j), _TAG) for j in range(rsize)]
        got = [self._union.recv(None, self._at(j), _TAG) for j in range(rsize)]
        for req in reqs:
            req.wait()
        return got
