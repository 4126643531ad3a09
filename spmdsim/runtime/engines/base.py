"""The engine interface: one method per kind of transfer, each taking buffers.

An engine is what a mesh runs on. It answers how a group of the mesh is made
(`group`: a communicator of the engine's own kind, its size and this rank's
place in it) and how each kind of transfer runs on such a group:

- ``all_reduce(comm, send, recv, op, wait)``: the elementwise sum (max, min) of every member's `send`, into `recv`
  (``send is recv``: in place)
- ``all_gather(comm, send, recv, wait)``: every member's `send` side by side, in group order
- ``reduce_scatter(comm, send, recv, op, wait)``: block j (1/g of `send`) summed over the members, to member j
- ``all_to_all(comm, send, recv, wait)``: block j of `send` to member j, received side by side
- ``all_to_allv(comm, send, scounts, sdispls, recv, rcounts, rdispls, wait)``: the same with counts and offsets per peer
- ``all_to_all_boxes(comm, sends, receives, dtype, wait)``: per peer a view of the block (any strides), copied once into
  the peer's view of its new block (where ``moves_boxes``: ranks that share memory)
- ``broadcast(comm, buf, root, wait)``: the root's `buf` into every member's
- ``gather_to(comm, send, recv, root, wait)``: every member's `send` side by side into the root's `recv`
- ``barrier(comm, wait)``: nothing: every member has arrived
- ``isend(comm, buf, dest, tag)``, ``irecv(comm, buf, source, tag)``: one message; a request with ``Test()``/``Wait()``
- ``post(comm, receives, sends)``: a group's messages: every receive posted, then every send; their requests
- ``bind(comm, receives, sends)``, ``start(bound)``: the same messages bound to their buffers once (persistent
  requests), then posted again
- ``all_gather_object``, ``gather_object``, ``broadcast_object``, ``all_reduce_object``: picklable objects (control
  traffic)

`wait` says how the caller waits: None for the blocking call; else a function
that completes a posted request (the polite wait, engines/wait.py, or the
watchdog's, runtime/debug_calls.py): the engine posts the nonblocking form and hands
its request over. Buffers are C-contiguous numpy arrays; counts and
displacements are in items. `op` is "sum", "max" or "min".

Three engines answer it: `spmdsim.runtime.engines.mpi.MpiEngine` (mpi4py on MPI
communicators: the only module of the runtime's path that calls a
communicator's methods), the thread engine of spmdsim.runtime.sim (simulated ranks on
shared memory) and the dry engine of spmdsim.runtime.sim.dry (counts, no data). The
runtime hands every buffer to an engine in one module, spmdsim.runtime.door;
the divergence check, trace, watchdog and emulated algorithms are layers
around these methods there (spmdsim.runtime.layers).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

from ...errors import SpmdsimError
from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["Engine", "SimulationError", "DONE", "DRY_VALUES_BYTES"]


class SimulationError(SpmdsimError):
    """A failure of the simulation itself (a rank called Abort, a bad use of simulate)."""


class _Done:
    """The request of a transfer that completed when it was made."""

    __slots__ = ()

    def Test(self, status: Any = None) -> bool:  # noqa: N802 - the request protocol's name (mpi4py's)
        return True

    def Wait(self, status: Any = None) -> None:  # noqa: N802
        return None

    def Free(self) -> None:  # noqa: N802
        return None


#: In a dry run, results up to about this size carry this rank's own values (what a program decides by: a count,
#: a mask, a check table); larger ones are zeros: the dry engine's collectives and the operators' elementwise
#: kernels (spmdsim.runtime.sim.dry, spmdsim.nn.ops._common.dry_zeros) draw the line here.
DRY_VALUES_BYTES = 64 << 10

#: A request already complete: what an engine whose transfers finish when posted hands to a `wait`.
DONE = _Done()

Wait = Callable[[Any], None] | None


class Engine:
    """What a mesh runs on. Subclasses: MpiEngine; spmdsim.runtime.sim's ThreadEngine and DryEngine."""

    name = "engine"
    simulated = False  # ranks are threads of this process, not MPI processes
    dry = False  # shapes only: no values are computed or moved

    # -- groups ------------------------------------------------------------------------------

    def group(self, mesh: Any, axes: tuple[str, ...]) -> tuple[Any, int, int]:
        """(communicator, size, this rank's index) of `mesh`'s group over `axes` (collective)."""
        color, key = mesh.layout.split_color_key(mesh.rank, axes)
        sub = self.split(mesh.comm, color, key)
        return sub, sub.Get_size(), sub.Get_rank()

    def split(self, comm: Any, color: int, key: int) -> Any:
        """The members of `comm` with this `color`, ordered by `key` (collective)."""
        raise NotImplementedError(f"{self.name} engine: split")

    def free(self, comm: Any) -> None:
        """Release a group made by `split` (collective)."""

    # -- transfers (see the module docstring) ----------------------------------------------------

    def all_reduce(self, comm: Any, send: np.ndarray, recv: np.ndarray, op: str, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: all_reduce")

    def all_gather(self, comm: Any, send: np.ndarray, recv: np.ndarray, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: all_gather")

    def reduce_scatter(self, comm: Any, send: np.ndarray, recv: np.ndarray, op: str, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: reduce_scatter")

    def all_to_all(self, comm: Any, send: np.ndarray, recv: np.ndarray, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: all_to_all")

    def all_to_allv(self, comm: Any, send: np.ndarray, scounts: Any, sdispls: Any, recv: np.ndarray,
                    rcounts: Any, rdispls: Any, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: all_to_allv")

    #: Whether `all_to_all_boxes` runs here: ranks that share memory copy a piece from its view straight into
    #: its place (the thread engine); an engine of contiguous buffers (MPI) packs them around `all_to_allv`.
    moves_boxes = False

    def all_to_all_boxes(self, comm: Any, sends: dict, receives: dict, dtype: Any, wait: Wait) -> None:
        """Each member's ``sends[j]`` (a view of its block, of any strides) copied once into member j's
        ``receives[i]`` (a view of j's new block, of the same shape), `i` the sender's group rank; views of
        `dtype` (only where `moves_boxes`)."""
        raise NotImplementedError(f"{self.name} engine: all_to_all_boxes")

    def direct(self, transfer: Callable[..., None], comm: Any, wait: Wait, dtype: Any) -> Callable[..., None]:
        """`transfer` (this engine's ``all_gather``, ``all_to_all``, ``all_reduce`` or ``reduce_scatter``) on
        `comm`, waited with `wait`, as a function of the rest of its arguments (``(send, recv)``, or ``(send,
        recv, op)`` for the sums) on buffers of `dtype`: what a kept collective's repeats call
        (spmdsim.runtime.door.keep). An engine may hand back fewer frames than the method's; this one, the
        method itself with `comm` and `wait` bound (a partial: no frame of its own)."""
        return partial(transfer, comm, wait=wait)

    def broadcast(self, comm: Any, buf: np.ndarray, root: int, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: broadcast")

    def gather_to(self, comm: Any, send: np.ndarray, recv: np.ndarray | None, root: int, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: gather_to")

    def barrier(self, comm: Any, wait: Wait) -> None:
        raise NotImplementedError(f"{self.name} engine: barrier")

    def isend(self, comm: Any, buf: np.ndarray, dest: int, tag: int) -> Any:
        raise NotImplementedError(f"{self.name} engine: isend")

    def irecv(self, comm: Any, buf: np.ndarray, source: int, tag: int) -> Any:
        raise NotImplementedError(f"{self.name} engine: irecv")

    def post(self, comm: Any, receives: list, sends: list) -> list:
        """Post `receives` ((buffer, source, tag) each), then `sends` ((buffer, dest, tag) each); their
        requests, receives first (every receive posted before any send: no order of arrival can deadlock)."""
        requests = [self.irecv(comm, buf, source, tag) for buf, source, tag in receives]
        requests += [self.isend(comm, buf, dest, tag) for buf, dest, tag in sends]
        return requests

    def wait_all(self, requests: list, wait: Wait) -> None:
        """Complete every request of `isend`/`irecv` (each by `wait`, when given)."""
        for request in requests:
            if wait is None:
                request.Wait()
            else:
                wait(request)

    def bind(self, comm: Any, receives: list, sends: list) -> Any:
        """`post`'s messages bound to their buffers once, not posted: the engine's holder of persistent requests
        (receives first) that `start` posts again (its requests, for `wait_all`) and dropping it releases; None
        where the engine has none (the caller posts each time). A captured step's groups (spmdsim.runtime.replay)."""
        return None

    def start(self, bound: Any) -> list:
        """Post `bind`'s messages again (all at once); their requests, for `wait_all`."""
        raise NotImplementedError(f"{self.name} engine: start")

    def persistent(self, transfer: Callable[..., None], comm: Any, args: tuple) -> Any:
        """A persistent request for `transfer` (this engine's method, ``self.all_reduce``) on fixed
        buffers (``Start``, then a wait), or None where the engine has none (the caller makes the
        blocking call each time)."""
        return None

    # -- objects (control traffic: verdicts, reports, settings) ------------------------------------

    def all_gather_object(self, comm: Any, obj: Any) -> list:
        raise NotImplementedError(f"{self.name} engine: all_gather_object")

    def gather_object(self, comm: Any, obj: Any, root: int) -> list | None:
        raise NotImplementedError(f"{self.name} engine: gather_object")

    def broadcast_object(self, comm: Any, obj: Any, root: int) -> Any:
        raise NotImplementedError(f"{self.name} engine: broadcast_object")

    def all_reduce_object(self, comm: Any, obj: Any, op: str) -> Any:
        raise NotImplementedError(f"{self.name} engine: all_reduce_object")

    # -- the job: the guard, the watchdog's side channel, the memory budget --------------------------------

    def dup(self, comm: Any) -> Any:
        """A communicator of the same members whose messages never meet `comm`'s (collective)."""
        raise NotImplementedError(f"{self.name} engine: dup")

    def ibarrier(self, comm: Any) -> Any:
        """A barrier posted: a request with ``Test()`` (a caller that must not wait forever polls it)."""
        raise NotImplementedError(f"{self.name} engine: ibarrier")

    def abort(self, comm: Any, code: int) -> None:
        """End the whole job with exit `code` (does not return)."""
        raise NotImplementedError(f"{self.name} engine: abort")

    def node_size(self, comm: Any) -> int:
        """How many members of `comm` share this rank's node (its memory); collective."""
        return comm.Get_size()

    def world_ranks(self, comm: Any) -> list[int]:
        """The world rank of each member of `comm`, in group order."""
        raise NotImplementedError(f"{self.name} engine: world_ranks")

    def post_object(self, comm: Any, obj: Any, dest: int, tag: int) -> Any:
        """Send picklable `obj` to `dest` without waiting: a request with ``Test()``."""
        raise NotImplementedError(f"{self.name} engine: post_object")

    def take_object(self, comm: Any, tag: int) -> Any:
        """A message with `tag` from any member, if one has arrived: (source, object), else None."""
        raise NotImplementedError(f"{self.name} engine: take_object")

    # -- local work --------------------------------------------------------------------------

    def local(self, fn: Callable[..., Any], like: Any, *args: Any) -> Any:
        """``fn(*args)``: a local kernel whose result is shaped and typed like `like`. Only a dry engine
        (``dry = True``) has its own: spmdsim.runtime.engines.local calls `fn` itself on the others."""
        return fn(*args)

    def matmul(self, a: Any, b: Any) -> Any:
        """``np.matmul(a, b)``; bfloat16 blocks widened to float32 first, a float32 product
        (spmdsim.base.precision.product: as a GPU accumulates them)."""
        return (_PRODUCT[0] or _bind_product())(a, b)

    def ran(self, step: Any) -> None:
        """A step whose bytes differ by rank (an Exchange) ran here: the dry engine counts each rank's."""

    def __repr__(self) -> str:
        return f"<spmdsim engine {self.name!r}>"


#: spmdsim.base.precision.product, bound by the first Engine.matmul (not at the top: spmdsim mpirun's start loads no
#: dataclasses; not per call: an import statement inside a function runs importlib's Python each time).
_PRODUCT: list = [None]


def _bind_product() -> Callable[[Any, Any], Any]:
    from ...base.precision import product

    _PRODUCT[0] = product
    return product
