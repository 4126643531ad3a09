"""The dry engine: one rank runs the program for all, with shapes and dtypes but no data.

Every rank of an SPMD program runs the same steps on blocks of the same
shapes (spmdsim's splits are even), so a dry run runs the program once, as
rank 0 of `n` (``simulate(n, fn, dry_run=True)``, ``--ranks N --dry-run``):
a group of the mesh is a `DryComm` of the group's size, whose collectives
meet nobody, copy this rank's own buffer where the result needs values (the
mirror of a program whose ranks all sent the same) and write zeros into large
results; a SeededTensor block is zeros (`zeros`: pages the kernel maps on first
write, so nothing is generated or written); local products and elementwise
kernels (`DryEngine.matmul`, `DryEngine.local`) are zeros made without
computing. Every collective is traced with its bytes, the step kinds'
formulas. The run's `Meter` counts the bytes the rank holds: the blocks made
from seeds and every buffer a collective sends or receives, for as long as
the array lives, and what an optimizer's states would hold, for as long as the
optimizer lives (spmdsim.nn.optim counts them with `Meter.count`, allocating
none); its peak is the "peak bytes held". Local temporaries that never reach a
collective are not counted.

The report gives every rank the representative's collectives, bytes and peak,
except where a step record says ranks differ: an exchange's per-rank bytes
(spmdsim.programs.plan.steps.Exchange) are each rank's own. Results of a dry run are
not values: checks are not made, and the report replaces the program's output.
A program whose ranks do different work (a pipeline's stages) says so with
`differ`; the dry run then runs one representative per kind of rank, each in
its own context, and gives each rank its representative's line. Point-to-point
messages of the runtime (checked before they run: a pipeline's schedule) are
counted and complete at once; an mpi4py program's own point-to-point calls and
``comm.Split`` need every rank's part and are refused in one line. Ctrl-C in the
caller stops the run at its next collective or local step (dry_meter.Meter.go_on).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...base import buffers
from ...base.context import current
from ..engines import Engine
from ..engines.base import DONE, DRY_VALUES_BYTES, SimulationError
from ...base.precision import _PRODUCT_DTYPES, product_dtype

__all__ = ["DryComm", "DryEngine", "DRY", "zeros", "dry_run_active", "differ", "note"]


def differ(mesh: Any, axes: tuple[str, ...]) -> None:
    """In a dry run: ranks of `mesh` (over the whole world) do different work along `axes` (a pipeline's
    stages), so the dry run runs one representative per coordinate there (the lowest rank of each), each
    standing for the ranks that share its coordinates; the first call decides. Nothing outside a dry run."""
    context = current()
    if not context.dry_run or context.meter.stands_for is not None:
        return
    layout = mesh.layout
    if layout.num_devices != context.size:
        raise SimulationError(f"differ: the mesh has {layout.num_devices} ranks but the dry run {context.size}")
    context.meter.stands_for = _representatives(layout, axes)


def _representatives(layout: Any, axes: tuple[str, ...]) -> np.ndarray:
    """Per rank of `layout`, the lowest rank with its coordinates along `axes` (numpy over the ranks: a
    search's dry runs ask at 3,072 ranks, ~5 us a rank in Python)."""
    ranks = np.arange(layout.num_devices, dtype=np.int64)
    key = np.zeros_like(ranks)  # the coordinates along `axes` as one number
    for alias, stride, n in zip(layout.alias_name, layout.strides, layout.device_matrix):
        if alias in axes:
            key = key * n + (ranks // stride) % n
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)  # first: lowest rank of each
    return first[inverse.reshape(-1)].astype(np.int64)


def note(*lines: str) -> None:
    """In a dry run: lines the program adds below the report (its own output is not shown: a dry run's
    values are not results), for figures the table has no column for (an MoE layer's expert bytes,
    spmdsim.models.moe.ledger); each at most 100 columns. Nothing outside a dry run."""
    context = current()
    if context.dry_run:
        context.meter.notes.extend(lines)


def dry_run_active() -> bool:
    """Whether this code runs in a dry run (shapes, no values): skip work only values need."""
    return current().dry_run


#: From this size up a dry run's zeros are their own anonymous mapping (spmdsim.base.buffers.lazy_zeros): the
#: results its collectives fill with values are no larger (DRY_COPY_BYTES, below). As numpy's zeros below
#: 1 MiB (calloc, which writes every page of memory its heap used before), a narrow model's many activations
#: kept for the backward cost this machine their bytes: 2.4 GB for a 1,000-layer GPT of width 256.
LAZY_BYTES = DRY_VALUES_BYTES


def zeros(shape: tuple, dtype: Any) -> np.ndarray:
    """Zeros whose pages cost no memory until written: a dry run's stand-in for any value
    (spmdsim.base.buffers.lazy_zeros; the buffers a dry run's collectives are given are these too)."""
    return buffers.lazy_zeros(shape, dtype, LAZY_BYTES)


class DryEngine(Engine):
    """One rank for all: sized groups, no data moved, local work as zeros of the result's shape."""

    name = "dry"
    simulated = True
    dry = True

    def group(self, mesh: Any, axes: tuple[str, ...]) -> tuple[Any, int, int]:
        layout = mesh.layout
        size = layout.group_size(axes)
        me = layout.group_index(mesh.rank, axes)
        return DryComm(size, me, f"axes {','.join(axes)}"), size, me

    def local(self, fn: Any, like: Any, *args: Any) -> np.ndarray:
        """Zeros shaped and typed like `like`, `fn` not called: a dry run's values are not results
        (attention's scores and their softmax would touch every page of their temporaries)."""
        current().meter.go_on()
        return zeros(like.shape, like.dtype)

    def matmul(self, a: Any, b: Any) -> np.ndarray:
        """Zeros of ``np.matmul(a, b)``'s shape and the real product's dtype (precision.product_dtype: float32
        for bfloat16 beside bfloat16 or float32, float64 beside an int32 or float64), not multiplied."""
        current().meter.go_on()
        lead, other = a.shape[:-2], b.shape[:-2]
        if lead != other:  # (the same batch dims, or one operand's alone: their broadcast, without numpy's ~5 us)
            lead = other if not lead else lead if not other else np.broadcast_shapes(lead, other)
        da, db = a.dtype, b.dtype
        dtype = _PRODUCT_DTYPES.get((da, db)) or product_dtype(da, db)
        return zeros(lead + (a.shape[-2], b.shape[-1]), dtype)

    def blank(self, shape: tuple, dtype: Any, placed: bool = False) -> np.ndarray:
        """A generated block's stand-in: zeros, counted as held. `placed`: a block the real run takes from
        spmdsim.base.buffers.empty, which a dry run's buffers.empty sizes and places alike (lazy zeros a page
        longer from MIN_BYTES up), so that what keeps it counts the real run's bytes."""
        dtype = np.dtype(dtype)
        big = placed and math.prod(shape) * dtype.itemsize >= buffers.MIN_BYTES
        out = buffers.empty(shape, dtype) if big else zeros(shape, dtype)
        current().meter.hold(out)
        return out

    def ran(self, step: Any) -> None:
        """Keep the step record's bytes per rank: the report gives each rank its own."""
        current().meter.varied.append((step.bytes_sent, step.bytes_received))

    # -- transfers: the buffers counted as held, the result filled as if every member sent this rank's

    def split(self, comm: Any, color: int, key: int) -> Any:
        raise SimulationError("comm.Split in a dry run: one rank runs for all, so it cannot take the other "
                              "ranks' part; use the runtime's collectives on a Mesh, or run without --dry-run")

    def all_reduce(self, comm: Any, send: Any, recv: Any, op: str, wait: Any) -> None:
        _fill(send, recv, _same)

    def all_gather(self, comm: Any, send: Any, recv: Any, wait: Any) -> None:
        _fill(send, recv, _tiled)

    def reduce_scatter(self, comm: Any, send: Any, recv: Any, op: str, wait: Any) -> None:
        _fill(send, recv, _first)

    def all_to_all(self, comm: Any, send: Any, recv: Any, wait: Any) -> None:
        _fill(send, recv, _same)

    def all_to_allv(self, comm: Any, send: Any, scounts: Any, sdispls: Any, recv: Any, rcounts: Any,
                    rdispls: Any, wait: Any) -> None:
        current().meter.hold(send, recv)
        if not buffers.is_lazy(recv):  # a lazy buffer is zeros already: filling it would cost its pages
            recv.fill(0)

    def broadcast(self, comm: Any, buf: Any, root: int, wait: Any) -> None:
        current().meter.hold(buf)

    def gather_to(self, comm: Any, send: Any, recv: Any, root: int, wait: Any) -> None:
        if comm.Get_rank() == root:
            _fill(send, recv, _tiled)

    def barrier(self, comm: Any, wait: Any) -> None:
        current().meter.go_on()

    def isend(self, comm: Any, buf: Any, dest: int, tag: int) -> Any:
        """Counted as held; complete at once (the runtime's messages are checked before they run: a
        pipeline's schedule, spmdsim.programs.pipeline)."""
        current().meter.hold(buf)
        return DONE

    def irecv(self, comm: Any, buf: Any, source: int, tag: int) -> Any:
        """Counted as held, left as it is (a dry run's values are not results); complete at once."""
        current().meter.hold(buf)
        return DONE

    def post(self, comm: Any, receives: list, sends: list) -> list:
        """Every buffer counted as held at once (what `irecv` and `isend` do one by one); complete."""
        current().meter.hold(*[buf for buf, _, _ in receives], *[buf for buf, _, _ in sends])
        return [DONE] * (len(receives) + len(sends))

    def wait_all(self, requests: list, wait: Any) -> None:
        pass

    def node_size(self, comm: Any) -> int:
        """One: the rank that runs for all (the memory check gives it the machine; the others hold nothing)."""
        return 1

    def all_gather_object(self, comm: Any, obj: Any) -> list:
        current().meter.go_on()
        return [obj] * comm.Get_size()

    def gather_object(self, comm: Any, obj: Any, root: int) -> Any:
        current().meter.go_on()
        return [obj] * comm.Get_size() if comm.Get_rank() == root else None

    def broadcast_object(self, comm: Any, obj: Any, root: int) -> Any:
        current().meter.go_on()
        return obj

    def all_reduce_object(self, comm: Any, obj: Any, op: str) -> Any:
        current().meter.go_on()
        return obj


def _fill(send: Any, recv: Any, how: Any) -> None:
    """Count both buffers as held; fill `recv` as if every member sent `send` (small results: the
    values a program decides by), or with zeros (large ones, or a send of another dtype)."""
    current().meter.hold(send, recv)
    if recv is None or send is None or send is recv:  # in place: the buffer holds this rank's part
        return
    if recv.nbytes > DRY_COPY_BYTES or recv.dtype != send.dtype:
        if not buffers.is_lazy(recv):  # a lazy buffer is zeros already: filling it would cost its pages
            recv.fill(0)
    else:
        how(send.reshape(-1), recv.reshape(-1))


DRY = DryEngine()

#: Results up to this size get this rank's own values (what a program decides by: fingerprints, check
#: tables, counts); larger ones get zeros, written once.
DRY_COPY_BYTES = DRY_VALUES_BYTES


def _array(spec: Any) -> Any:
    """The array of a buffer argument (`array`, or ``[array, ...]`` as mpi4py takes it), or None."""
    if isinstance(spec, (list, tuple)) and spec:
        spec = spec[0]
    return spec if isinstance(spec, np.ndarray) else None


class _Done:
    """A nonblocking call's request, complete when made."""

    def Wait(self, status: Any = None) -> None:
        return None

    def Test(self, status: Any = None) -> bool:
        return True

    wait, test = Wait, lambda self, status=None: (True, None)


class DryComm:
    """A dry run's communicator: this rank's place in a group of `size`; collectives move nothing.

    It speaks the buffer and object collectives the runtime calls (``Allreduce``,
    ``Allgather``, ``Alltoall(v)``, ``Reduce_scatter_block``, ``Bcast``,
    ``Gather``, their ``I`` forms, ``allreduce``, ``allgather``, ``gather``,
    ``bcast``, ``reduce``, ``scatter``, ``alltoall``, ``Barrier``): each counts
    its buffers as held and fills the result as if every member had sent what
    this rank sent.
    """

    spmdsim_engine = DRY

    def __init__(self, size: int, rank: int = 0, name: str = "MPI_COMM_WORLD") -> None:
        self.size, self.rank, self._name = size, rank, name

    def Get_size(self) -> int:
        return self.size

    def Get_rank(self) -> int:
        return self.rank

    def Get_name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<DryComm rank {self.rank} of {self.size} ({self._name})>"

    def Dup(self) -> "DryComm":
        return DryComm(self.size, self.rank, self._name)

    def Split_type(self, *args: Any, **kwargs: Any) -> "DryComm":
        """The ranks sharing this node's memory: one, the rank that runs for all (the memory check
        gives it the machine; the others hold nothing)."""
        return DryComm(1, 0, "MPI_COMM_TYPE_SHARED")

    def Free(self) -> None:
        pass

    def Abort(self, code: int = 1) -> None:
        raise SystemExit(code)

    # -- buffer collectives ---------------------------------------------------------------

    def _fill(self, src: Any, dst: Any, how: Any) -> None:
        _fill(_array(src), _array(dst), how)

    def Allreduce(self, src: Any, dst: Any, op: Any = None) -> None:
        self._fill(src, dst, _same)

    def Allgather(self, src: Any, dst: Any) -> None:
        self._fill(src, dst, _tiled)

    def Alltoall(self, src: Any, dst: Any) -> None:
        self._fill(src, dst, _same)

    def Reduce_scatter_block(self, src: Any, dst: Any, op: Any = None) -> None:
        self._fill(src, dst, _first)

    def Alltoallv(self, src: Any, dst: Any) -> None:
        recv = _array(dst)
        current().meter.hold(_array(src), recv)
        if recv is not None:
            recv.fill(0)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        current().meter.hold(_array(buf))

    def Gather(self, src: Any, dst: Any, root: int = 0) -> None:
        if self.rank == root:
            self._fill(src, dst, _tiled)

    def Barrier(self) -> None:
        DRY.barrier(self, None)

    def Ibarrier(self) -> _Done:
        DRY.barrier(self, None)
        return _Done()

    # -- object collectives ---------------------------------------------------------------

    def allreduce(self, obj: Any, op: Any = None) -> Any:
        return DRY.all_reduce_object(self, obj, op)

    def allgather(self, obj: Any) -> list:
        return DRY.all_gather_object(self, obj)

    def gather(self, obj: Any, root: int = 0) -> Any:
        return DRY.gather_object(self, obj, root)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return DRY.broadcast_object(self, obj, root)

    def reduce(self, obj: Any, op: Any = None, root: int = 0) -> Any:
        reduced = DRY.all_reduce_object(self, obj, op)
        return reduced if self.rank == root else None

    def scatter(self, objs: Any, root: int = 0) -> Any:
        """This rank's item of the root's list (every member's list is taken to be this rank's)."""
        DRY.barrier(self, None)
        return None if objs is None else list(objs)[self.rank]

    def alltoall(self, objs: Any) -> list:
        """Item `rank` of every member's list, each member's list taken to be this rank's."""
        DRY.barrier(self, None)
        return [list(objs)[self.rank]] * self.size

    def barrier(self) -> None:
        DRY.barrier(self, None)

    def __getattr__(self, name: str) -> Any:
        if name[:1].isupper() or name in ("send", "recv", "isend", "irecv", "sendrecv", "ssend", "bsend"):
            raise SimulationError(
                f"comm.{name} in a dry run: one rank runs for all, so it cannot take the other ranks' part; "
                "use the runtime's collectives on a Mesh, or run without --dry-run")
        raise AttributeError(name)


def _nonblocking(blocking: Any) -> Any:
    def call(self: DryComm, *args: Any, **kwargs: Any) -> _Done:
        blocking(self, *args, **kwargs)
        return _Done()
    return call


for _name in ("Allreduce", "Allgather", "Alltoall", "Reduce_scatter_block", "Alltoallv", "Bcast", "Gather"):
    setattr(DryComm, "I" + _name[0].lower() + _name[1:], _nonblocking(getattr(DryComm, _name)))


def _same(src: np.ndarray, dst: np.ndarray) -> None:
    dst[:src.size] = src[:dst.size]


def _tiled(src: np.ndarray, dst: np.ndarray) -> None:
    if src.size:  # an empty block (a dim of size 0) tiles nothing: numpy cannot reshape to (-1, 0)
        dst.reshape(-1, src.size)[...] = src


def _first(src: np.ndarray, dst: np.ndarray) -> None:
    dst[...] = src[:dst.size]
