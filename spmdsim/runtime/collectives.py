"""Collectives over mesh axes with mpi4py's buffer methods on contiguous numpy arrays.

Each function takes the mesh, this rank's array and the mesh axes of the group
(one sub-communicator, ranks in mixed-radix order of the axes, first major),
and returns a new array (a group of one rank returns the input itself and
communicates nothing). ``out=`` (allgather, alltoall, allreduce,
reduce_scatter) receives into a caller's C-contiguous array instead, which
spares hot loops the page faults of a fresh multi-MiB result. Every call is recorded in the open traces (runtime.trace)
with the per-rank byte figures documented in docs/runtime.md. The wait inside
the collective is the mesh's ``wait_mode`` (runtime.wait). Every call takes a
sequence number; runtime.debug's divergence guard (SPMDSIM_CHECK) and
watchdog (SPMDSIM_WATCHDOG) hook in here when switched on.

Each call first tries a lean path for the common case (C-contiguous arrays,
blocks along dim 0, no debug hook on) and otherwise takes the generic path,
which handles every dim, checks everything and raises. Why two paths: with 8
ranks sharing 2 cores, each rank runs its pre-MPI Python with cold caches, in
turn, while the group waits; the generic path's helper calls cost 5-12% of a
1 MiB collective there, the lean path 1-2% (docs/runtime.md).
"""
from __future__ import annotations

import math
from itertools import accumulate
from time import perf_counter
from typing import Any, Iterable, Mapping

import numpy as np
from mpi4py import MPI

from .. import buffers
from ..errors import ShapeError
from . import debug
from .exchange_spec import ExchangeSpec, count_peers
from .mesh import Mesh
from .trace import OPEN_TRACES as _TRACES
from .trace import record
from .wait import polite_wait

__all__ = ["allgather", "alltoall", "allreduce", "reduce_scatter", "bcast", "alltoallv", "exchange",
           "moved_bytes"]

_SUM = MPI.SUM
_IN_PLACE = MPI.IN_PLACE
_ndarray = np.ndarray
_empty = buffers.empty  # placed in the page for MPI's copies (spmdsim.buffers)
# The lean path reads these directly, without a call: debug's settings and call
# counter (what debug.quiet() and debug.next_seq() read and advance), and the open traces.
_DEBUG = debug._State


def _contig(local: Any) -> np.ndarray:
    # Copy only when MPI could not read the buffer as is.
    if type(local) is np.ndarray and local.flags.c_contiguous:
        return local
    return np.ascontiguousarray(local)


def _dim(tensor_dim: int, ndim: int, what: str) -> int:
    if isinstance(tensor_dim, bool) or not isinstance(tensor_dim, (int, np.integer)):
        raise ShapeError(f"{what} {tensor_dim!r} must be an integer tensor dim (0 <= dim < {ndim})")
    if not -ndim <= tensor_dim < ndim:
        raise ShapeError(f"{what} {tensor_dim!r} is out of range for an array with {ndim} dims")
    return tensor_dim % ndim


def _divisible(shape: tuple[int, ...], tensor_dim: int, g: int, op: str) -> None:
    if shape[tensor_dim] % g:
        raise ShapeError(
            f"{op}: dim {tensor_dim} of local shape {shape!r} is not divisible by group size {g}"
        )


def _blocks(x: np.ndarray, tensor_dim: int, g: int) -> np.ndarray:
    """View x as (outer, g, rest) so that block j along tensor_dim is [:, j]."""
    outer = math.prod(x.shape[:tensor_dim])
    return x.reshape(outer, g, -1)


def moved_bytes(op: str, group_size: int, local_nbytes: int) -> int:
    """Bytes one member sends (and receives) in `op` over a group, as the trace records them.

    Ring-algorithm figures (docs/runtime.md): allgather (g-1)*n of an n-byte
    input; alltoall and reduce_scatter (g-1)/g of the input; allreduce twice that.
    """
    g, n = group_size, local_nbytes
    if op == "allgather":
        return (g - 1) * n
    if op in ("alltoall", "reduce_scatter"):
        return (g - 1) * n // g
    if op == "allreduce":
        return 2 * (g - 1) * n // g
    raise ValueError(f"no byte formula for {op!r}")


def _send_blocks(mesh: Mesh, x: np.ndarray, tensor_dim: int, g: int) -> np.ndarray:
    """`x` laid out so block j along `tensor_dim` is the j-th contiguous 1/g of the buffer.

    Already so when nothing precedes that dim (no copy); otherwise one packing
    copy into the mesh's kept send buffer.
    """
    if tensor_dim == 0 or math.prod(x.shape[:tensor_dim]) == 1:
        return x
    blocks = _blocks(x, tensor_dim, g).swapaxes(0, 1)
    send = mesh.scratch("send", blocks.shape, x.dtype)
    send[...] = blocks
    return send


def allgather(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
              label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Concatenate every member's `local` along `tensor_dim`, in group order (into `out` if given)."""
    comm, g, _ = mesh.group_info(axes)
    if type(local) is _ndarray and tensor_dim == 0 and g > 1 and (_DEBUG.quiet or debug.quiet()):
        shape = local.shape
        dst = (_lean_result(out, (shape[0] * g,) + shape[1:], local.dtype)
               if shape and local.flags.carray else None)
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            if mesh.polite:
                polite_wait(comm.Iallgather(local, dst))
            else:
                comm.Allgather(local, dst)
            _DEBUG.seq += 1
            if _TRACES:
                _record_lean("allgather", axes, g, local.nbytes, t0, label)
            return dst
    x = _contig(local)
    d = _dim(tensor_dim, x.ndim, "tensor_dim")
    seq = _begin(mesh, comm, g, "allgather", axes, x, (d,))
    if g == 1:
        record("allgather", comm_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None else _copy_into(out, x, "allgather")
    t0 = perf_counter()
    shape = x.shape
    out_shape = shape[:d] + (shape[d] * g,) + shape[d + 1:]
    copied = 0
    if d == 0 or math.prod(shape[:d]) == 1:
        out = _result(out, out_shape, x.dtype, "allgather")
        _run(mesh, seq, "allgather", axes, comm.Allgather, comm.Iallgather, x, out)
    else:
        # Receive blocks side by side, then one copy puts them along tensor_dim.
        # A new result is made after the MPI call: work before it delays the
        # whole group (docs/performance.md, "The fixed per-call cost"); a
        # caller's `out` is still checked before.
        out = None if out is None else _result(out, out_shape, x.dtype, "allgather")
        recv = mesh.scratch("recv", (g,) + shape, x.dtype)
        _run(mesh, seq, "allgather", axes, comm.Allgather, comm.Iallgather, x, recv)
        if out is None:
            out = _empty(out_shape, x.dtype)
        _blocks(out, d, g)[...] = recv.reshape(g, math.prod(shape[:d]), -1).swapaxes(0, 1)
        copied = out.nbytes
    moved = moved_bytes("allgather", g, x.nbytes)
    record("allgather", comm_axes(axes), g, moved, moved, perf_counter() - t0, label, copied)
    return out


def alltoall(mesh: Mesh, local: Any, axes: str | Iterable[str], split_dim: int, concat_dim: int,
             label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Split `local` along split_dim into g blocks, send block j to member j, concat along concat_dim."""
    comm, g, _ = mesh.group_info(axes)
    if (type(local) is _ndarray and split_dim == 0 and concat_dim == 0 and g > 1
            and (_DEBUG.quiet or debug.quiet())):
        shape = local.shape
        dst = (_lean_result(out, shape, local.dtype)
               if shape and not shape[0] % g and local.flags.carray else None)
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            if mesh.polite:
                polite_wait(comm.Ialltoall(local, dst))
            else:
                comm.Alltoall(local, dst)
            _DEBUG.seq += 1
            if _TRACES:
                _record_lean("alltoall", axes, g, local.nbytes, t0, label)
            return dst
    x = _contig(local)
    s = _dim(split_dim, x.ndim, "split_dim")
    c = _dim(concat_dim, x.ndim, "concat_dim")
    _divisible(x.shape, s, g, "alltoall")
    seq = _begin(mesh, comm, g, "alltoall", axes, x, (s, c))
    if g == 1:
        record("alltoall", comm_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None else _copy_into(out, x, "alltoall")
    t0 = perf_counter()
    block_shape = x.shape[:s] + (x.shape[s] // g,) + x.shape[s + 1:]
    send = _send_blocks(mesh, x, s, g)
    out_shape = block_shape[:c] + (block_shape[c] * g,) + block_shape[c + 1:]
    direct = c == 0 or math.prod(block_shape[:c]) == 1
    if direct:
        out = _result(out, out_shape, x.dtype, "alltoall")
        _run(mesh, seq, "alltoall", axes, comm.Alltoall, comm.Ialltoall, send, out)
    else:
        out = None if out is None else _result(out, out_shape, x.dtype, "alltoall")
        recv = mesh.scratch("recv", (g,) + block_shape, x.dtype)
        _run(mesh, seq, "alltoall", axes, comm.Alltoall, comm.Ialltoall, send, recv)
        if out is None:  # made after the MPI call, as in allgather
            out = _empty(out_shape, x.dtype)
        outer = math.prod(block_shape[:c])
        _blocks(out, c, g)[...] = recv.reshape(g, outer, -1).swapaxes(0, 1)
    copied = (0 if send is x else x.nbytes) + (0 if direct else out.nbytes)
    moved = moved_bytes("alltoall", g, x.nbytes)
    record("alltoall", comm_axes(axes), g, moved, moved, perf_counter() - t0, label, copied)
    return out


def allreduce(mesh: Mesh, local: Any, axes: str | Iterable[str], label: str | None = None,
              out: np.ndarray | None = None) -> np.ndarray:
    """Elementwise sum of every member's `local`, on every member (into `out` if given).

    ``out=local`` sums in place (MPI.IN_PLACE): no result buffer is allocated,
    which spares the page faults of fresh memory on every call.
    """
    comm, g, _ = mesh.group_info(axes)
    if g > 1 and type(local) is _ndarray and local.flags.c_contiguous and (_DEBUG.quiet or debug.quiet()):
        if out is local:
            dst, send = (local, _IN_PLACE) if local.flags.writeable else (None, None)
        else:
            dst, send = _lean_result(out, local.shape, local.dtype), local
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            if mesh.polite:
                polite_wait(comm.Iallreduce(send, dst, _SUM))
            else:
                comm.Allreduce(send, dst, _SUM)
            _DEBUG.seq += 1
            if _TRACES:
                _record_lean("allreduce", axes, g, local.nbytes, t0, label)
            return dst
    x = _contig(local)
    seq = _begin(mesh, comm, g, "allreduce", axes, x, ())
    if g == 1:
        record("allreduce", comm_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None or out is x else _copy_into(out, x, "allreduce")
    t0 = perf_counter()
    in_place = out is x
    out = _result(out, x.shape, x.dtype, "allreduce")
    send = _IN_PLACE if in_place else x
    _run(mesh, seq, "allreduce", axes, comm.Allreduce, comm.Iallreduce, send, out, _SUM)
    moved = moved_bytes("allreduce", g, x.nbytes)
    record("allreduce", comm_axes(axes), g, moved, moved, perf_counter() - t0, label)
    return out


def reduce_scatter(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                   label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Sum over the group, keeping this member's block (group order) along `tensor_dim`."""
    comm, g, _ = mesh.group_info(axes)
    if type(local) is _ndarray and tensor_dim == 0 and g > 1 and (_DEBUG.quiet or debug.quiet()):
        shape = local.shape
        dst = (_lean_result(out, (shape[0] // g,) + shape[1:], local.dtype)
               if shape and not shape[0] % g and local.flags.carray else None)
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            if mesh.polite:
                polite_wait(comm.Ireduce_scatter_block(local, dst, _SUM))
            else:
                comm.Reduce_scatter_block(local, dst, _SUM)
            _DEBUG.seq += 1
            if _TRACES:
                _record_lean("reduce_scatter", axes, g, local.nbytes, t0, label)
            return dst
    x = _contig(local)
    d = _dim(tensor_dim, x.ndim, "tensor_dim")
    _divisible(x.shape, d, g, "reduce_scatter")
    seq = _begin(mesh, comm, g, "reduce_scatter", axes, x, (d,))
    if g == 1:
        record("reduce_scatter", comm_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None else _copy_into(out, x, "reduce_scatter")
    t0 = perf_counter()
    out_shape = x.shape[:d] + (x.shape[d] // g,) + x.shape[d + 1:]
    send = _send_blocks(mesh, x, d, g)
    out = _result(out, out_shape, x.dtype, "reduce_scatter")
    _run(mesh, seq, "reduce_scatter", axes, comm.Reduce_scatter_block, comm.Ireduce_scatter_block, send, out, _SUM)
    moved = moved_bytes("reduce_scatter", g, x.nbytes)
    record("reduce_scatter", comm_axes(axes), g, moved, moved, perf_counter() - t0, label,
           0 if send is x else x.nbytes)
    return out


def bcast(mesh: Mesh, local: Any, axes: str | Iterable[str], root: int = 0,
          label: str | None = None) -> np.ndarray:
    """Member `root` (group rank) sends `local`; the others receive into `local` (in place) and return it.

    Non-root members must pass an array of the same shape and dtype; it is
    filled in place when contiguous and writeable, else a filled copy is returned.
    """
    comm, g, me = mesh.group_info(axes)
    if not 0 <= root < g:
        raise ShapeError(f"bcast root {root!r} is outside the group of {g} ranks over {comm_axes(axes)!r}")
    if g > 1 and type(local) is _ndarray and local.flags.carray and (_DEBUG.quiet or debug.quiet()):
        t0 = perf_counter() if _TRACES else 0.0
        if mesh.polite:
            polite_wait(comm.Ibcast(local, root))
        else:
            comm.Bcast(local, root)
        _DEBUG.seq += 1
        if _TRACES:
            n = local.nbytes
            record("bcast", comm_axes(axes), g, n if me == root else 0, 0 if me == root else n,
                   perf_counter() - t0, label)
        return local
    seq = _begin(mesh, comm, g, "bcast", axes, local, (root,))
    if g == 1:
        record("bcast", comm_axes(axes), 1, 0, 0, 0.0, label)
        return _contig(local)
    t0 = perf_counter()
    buf = local
    if not (type(buf) is np.ndarray and buf.flags.c_contiguous and buf.flags.writeable):
        buf = np.array(local, order="C")
    _run(mesh, seq, "bcast", axes, comm.Bcast, comm.Ibcast, buf, root)
    n = buf.nbytes
    record("bcast", comm_axes(axes), g, n if me == root else 0, 0 if me == root else n,
           perf_counter() - t0, label)
    return buf


def alltoallv(mesh: Mesh, sends: Mapping[int, Any], recv_shapes: Mapping[int, tuple],
              dtype: Any, label: str | None = None, out: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """General exchange over the whole mesh: `sends[r]` goes to mesh rank r; returns {source: array}.

    `recv_shapes[r]` is the shape of the block expected from rank r. A block
    this rank sends to itself is not sent: it comes back reshaped, a view of
    the caller's array where numpy can reshape without a copy (as a group of
    one rank returns its input). The other blocks are views of one flat receive
    buffer, sources in rank order: a new array, or `out` (C-contiguous, of
    that many items and `dtype`) for loops that repeat the same exchange.
    """
    dtype = np.dtype(dtype)
    size, me = mesh.size, mesh.rank
    seq = _begin(mesh, mesh.comm, size, "alltoallv", mesh.layout.alias_name, None, (), dtype)
    # Counts and offsets as Python ints: a handful per rank, where numpy's
    # per-call overhead would cost more than the arithmetic (docs/performance.md).
    scounts = [0] * size
    arrays = {}
    # The checks run between this rank's arrival and the MPI call, on cold
    # caches when ranks share cores: plain ints and arrays of the right dtype
    # pass on `type`/`is` tests; anything else takes the converting calls.
    for r, a in sends.items():
        if type(r) is not int or not 0 <= r < size:
            r = _mesh_rank(r, size, "sends")
        if type(a) is not _ndarray:
            a = np.asarray(a)
        if a.dtype is not dtype and a.dtype != dtype:
            raise ShapeError(f"alltoallv block for rank {r} has dtype {a.dtype.name!r}, expected {dtype.name!r}")
        arrays[r] = a
        scounts[r] = a.size
    rcounts = [0] * size
    for r, shape in recv_shapes.items():
        if type(r) is not int or not 0 <= r < size:
            r = _mesh_rank(r, size, "recv_shapes")
        rcounts[r] = math.prod(shape)
    if me in recv_shapes:
        mine = arrays.get(me)
        if mine is None or mine.size != rcounts[me]:
            raise ShapeError(f"alltoallv: rank {me} expects {tuple(recv_shapes[me])!r} from itself "
                             f"but sends {None if mine is None else mine.shape!r}")
    scounts[me] = rcounts[me] = 0
    if size > 1 and not _DEBUG.quiet and debug.check_enabled():
        debug.verify_counts(mesh.comm, scounts, rcounts, seq, mesh.polite)
    t0 = perf_counter()
    sdispls = [0, *accumulate(scounts[:-1])]
    rdispls = [0, *accumulate(rcounts[:-1])]
    send = mesh.scratch("send", (sum(scounts),), dtype)
    for r, a in arrays.items():
        if r != me:  # one copy from a strided view straight into the send buffer
            lo = sdispls[r]
            if a.ndim == 1:
                send[lo:lo + scounts[r]] = a
            else:
                send[lo:lo + scounts[r]].reshape(a.shape)[...] = a
    recv = _result(out, (sum(rcounts),), dtype, "alltoallv")
    if size > 1:
        _run(mesh, seq, "alltoallv", mesh.layout.alias_name, mesh.comm.Alltoallv, mesh.comm.Ialltoallv,
             [send, (scounts, sdispls)], [recv, (rcounts, rdispls)])
    blocks: dict[int, np.ndarray] = {}
    for r, shape in recv_shapes.items():
        r = int(r)
        if r == me:  # reshaped after the MPI call: nothing here needs it before
            blocks[r] = arrays[me].reshape(shape)
        else:
            blocks[r] = recv[rdispls[r]:rdispls[r] + rcounts[r]].reshape(shape)
    if _TRACES:
        record("alltoallv", mesh.layout.alias_name, size, send.nbytes, recv.nbytes, perf_counter() - t0,
               label, send.nbytes,  # every block sent is packed into `send`
               count_peers(scounts, rcounts))
    return blocks


def exchange(mesh: Mesh, local: np.ndarray, spec: ExchangeSpec, label: str | None = None) -> np.ndarray:
    """Alltoallv over the whole mesh by a prebuilt `spec`: its boxes of `local` go out, one flat buffer comes back.

    The repeated form of `alltoallv` (plan_exec's Exchange steps): counts,
    offsets and box indices were checked when the spec was built, so a call
    checks only that the spec is this rank's and `local` has its shape. Box i
    from a source is ``recv[start:stop]`` for its slot in ``spec.recv_slots``.
    """
    size = mesh.size
    if spec.size != size or spec.rank != mesh.rank:
        raise ShapeError(f"exchange spec for rank {spec.rank} of {spec.size} used on rank {mesh.rank} of {size}")
    if type(local) is not np.ndarray or local.shape != spec.local_shape:
        raise ShapeError(f"exchange: local block {getattr(local, 'shape', local)!r} is not an array of "
                         f"shape {spec.local_shape!r}")
    dtype = local.dtype
    axes = mesh.layout.alias_name
    seq = _begin(mesh, mesh.comm, size, "alltoallv", axes, None, (), dtype)
    if size > 1 and not _DEBUG.quiet and debug.check_enabled():
        debug.verify_counts(mesh.comm, list(spec.scounts), list(spec.rcounts), seq, mesh.polite)
    t0 = perf_counter()
    send = mesh.scratch("send", (spec.send_total,), dtype)
    for index, lo, hi, shape in spec.packs:  # one copy from each box's view into the send buffer
        send[lo:hi].reshape(shape)[...] = local[index]
    recv = _empty(spec.recv_total, dtype)
    if size > 1:
        _run(mesh, seq, "alltoallv", axes, mesh.comm.Alltoallv, mesh.comm.Ialltoallv,
             [send, (spec.scounts, spec.sdispls)], [recv, (spec.rcounts, spec.rdispls)])
    record("alltoallv", axes, size, send.nbytes, recv.nbytes, perf_counter() - t0, label, send.nbytes,
           spec.peers)
    return recv


def _mesh_rank(r: Any, size: int, what: str) -> int:
    """`r` as an int mesh rank, or a ShapeError naming the alltoallv argument it came from."""
    if not 0 <= int(r) < size:
        raise ShapeError(f"alltoallv {what} key {r!r} is not a mesh rank (0 <= r < {size})")
    return int(r)


def _result(out: np.ndarray | None, shape: tuple, dtype: np.dtype, op: str) -> np.ndarray:
    """A new result array, or the caller's `out` after checking it can take the result."""
    if out is None:
        return _empty(shape, dtype)
    if not (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable):
        got = (getattr(out, "shape", None), getattr(getattr(out, "dtype", None), "name", None))
        raise ShapeError(f"{op}: out {got!r} must be a writeable C-contiguous array of "
                         f"{(shape, np.dtype(dtype).name)!r}")
    return out


def _lean_result(out: np.ndarray | None, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    """The lean path's result array: a new one, the caller's `out` when it fits, else None."""
    if out is None:
        return _empty(shape, dtype)
    # `is`: numpy shares one dtype object per builtin type; an equal but distinct
    # dtype takes the generic path, which compares with == and goes on.
    if type(out) is _ndarray and out.dtype is dtype and out.shape == shape and out.flags.carray:
        return out
    return None  # the generic path checks `out` again and says what is wrong


def _record_lean(op: str, axes: Any, g: int, local_nbytes: int, t0: float, label: str | None) -> None:
    moved = moved_bytes(op, g, local_nbytes)
    record(op, comm_axes(axes), g, moved, moved, perf_counter() - t0, label)


def _copy_into(out: np.ndarray, x: np.ndarray, op: str) -> np.ndarray:
    _result(out, x.shape, x.dtype, op)[...] = x
    return out


def comm_axes(axes: str | Iterable[str]) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _begin(mesh: Mesh, comm: Any, g: int, op: str, axes: Any, x: Any, extra: tuple,
           dtype: Any = None) -> int:
    """Number this call; with SPMDSIM_CHECK, compare it with the group's before communicating."""
    _DEBUG.seq += 1  # what debug.next_seq() does, without the call (see the lean paths)
    seq = _DEBUG.seq
    if _DEBUG.quiet:
        return seq
    if g > 1 and debug.check_enabled():
        shape = None if x is None else np.shape(x)
        debug.verify(comm, op, comm_axes(axes), dtype if x is None else np.asarray(x).dtype,
                     shape, extra, seq, mesh.polite)
    return seq


def _run(mesh: Mesh, seq: int, op: str, axes: Any, blocking: Any, nonblocking: Any, *args: Any) -> None:
    """Run one collective with the mesh's wait mode (and the watchdog when it is on)."""
    if not _DEBUG.quiet and debug.watchdog_seconds() is not None:
        debug.wait(nonblocking(*args), op, comm_axes(axes), seq, mesh.polite)
    elif mesh.polite:
        polite_wait(nonblocking(*args))
    else:
        blocking(*args)
