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

The checks, numbering and wait every call shares live in runtime._calls; the
whole-mesh exchanges (`alltoallv`, `exchange`) in runtime.exchange.
"""
from __future__ import annotations

import math
from time import perf_counter
from typing import Any, Iterable

import numpy as np
from mpi4py import MPI

from ..errors import RankError, ShapeError
from ..validate import as_int
from . import debug
from ._calls import (_DEBUG, _begin, _check_dtype, _contig, _copy_into, _dim, _divisible, _empty, _result, _run,
                     normalize_axes, moved_bytes)
from .exchange import alltoallv, exchange  # the whole-mesh exchanges, importable from here as before
from .mesh import Mesh
from .trace import OPEN_TRACES as _TRACES
from .trace import record
from .wait import polite_wait

__all__ = ["allgather", "alltoall", "allreduce", "reduce_scatter", "bcast", "alltoallv", "exchange",
           "moved_bytes"]

_SUM = MPI.SUM
_IN_PLACE = MPI.IN_PLACE
_ndarray = np.ndarray


def _blocks(x: np.ndarray, tensor_dim: int, g: int) -> np.ndarray:
    """View x as (outer, g, rest) so that block j along tensor_dim is [:, j]."""
    outer = math.prod(x.shape[:tensor_dim])
    # `rest` spelled out: numpy cannot infer a -1 size from a zero-size array.
    return x.reshape(outer, g, math.prod(x.shape[tensor_dim:]) // g)


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
    if (type(local) is _ndarray and tensor_dim == 0 and g > 1 and (_DEBUG.quiet or debug.quiet())
            and mesh.algorithms is None):
        shape = local.shape
        dst = (_lean_result(out, (shape[0] * g,) + shape[1:], local.dtype)
               if shape and local.flags.carray else None)
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            try:  # costs nothing until mpi4py refuses the buffers
                if mesh.polite:
                    polite_wait(comm.Iallgather(local, dst))
                else:
                    comm.Allgather(local, dst)
            except Exception:
                _check_dtype("allgather", local.dtype)  # a clear error when the dtype is why
                raise
            _DEBUG.seq += 1
            if _TRACES:
                _record_lean("allgather", axes, g, local.nbytes, t0, label)
            return dst
    x = _contig(local)
    d = _dim(tensor_dim, x.ndim, "tensor_dim")
    seq = _begin(mesh, comm, g, "allgather", axes, x, (d,))
    if g == 1:
        record("allgather", normalize_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None else _copy_into(out, x, "allgather")
    t0 = perf_counter()
    shape = x.shape
    out_shape = shape[:d] + (shape[d] * g,) + shape[d + 1:]
    copied = 0
    if d == 0 or math.prod(shape[:d]) == 1:
        out = _result(out, out_shape, x.dtype, "allgather")
        how = _exec(mesh, seq, "allgather", axes, comm.Allgather, comm.Iallgather, x, out)
    else:
        # Receive blocks side by side, then one copy puts them along tensor_dim.
        # A new result is made after the MPI call: work before it delays the
        # whole group (docs/performance.md, "The fixed per-call cost"); a
        # caller's `out` is still checked before.
        out = None if out is None else _result(out, out_shape, x.dtype, "allgather")
        recv = mesh.scratch("recv", (g,) + shape, x.dtype)
        how = _exec(mesh, seq, "allgather", axes, comm.Allgather, comm.Iallgather, x, recv)
        if out is None:
            out = _empty(out_shape, x.dtype)
        _blocks(out, d, g)[...] = recv.reshape(g, math.prod(shape[:d]), math.prod(shape[d:])).swapaxes(0, 1)
        copied = out.nbytes
    moved = moved_bytes("allgather", g, x.nbytes)
    op, sent, received = how or ("allgather", moved, moved)
    record(op, normalize_axes(axes), g, sent, received, perf_counter() - t0, label, copied)
    return out


def alltoall(mesh: Mesh, local: Any, axes: str | Iterable[str], split_dim: int, concat_dim: int,
             label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Split `local` along split_dim into g blocks, send block j to member j, concat along concat_dim."""
    comm, g, _ = mesh.group_info(axes)
    if (type(local) is _ndarray and split_dim == 0 and concat_dim == 0 and g > 1
            and (_DEBUG.quiet or debug.quiet()) and mesh.algorithms is None):
        shape = local.shape
        dst = (_lean_result(out, shape, local.dtype)
               if shape and not shape[0] % g and local.flags.carray else None)
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            try:  # costs nothing until mpi4py refuses the buffers
                if mesh.polite:
                    polite_wait(comm.Ialltoall(local, dst))
                else:
                    comm.Alltoall(local, dst)
            except Exception:
                _check_dtype("alltoall", local.dtype)  # a clear error when the dtype is why
                raise
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
        record("alltoall", normalize_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None else _copy_into(out, x, "alltoall")
    t0 = perf_counter()
    block_shape = x.shape[:s] + (x.shape[s] // g,) + x.shape[s + 1:]
    send = _send_blocks(mesh, x, s, g)
    out_shape = block_shape[:c] + (block_shape[c] * g,) + block_shape[c + 1:]
    direct = c == 0 or math.prod(block_shape[:c]) == 1
    if direct:
        out = _result(out, out_shape, x.dtype, "alltoall")
        how = _exec(mesh, seq, "alltoall", axes, comm.Alltoall, comm.Ialltoall, send, out)
    else:
        out = None if out is None else _result(out, out_shape, x.dtype, "alltoall")
        recv = mesh.scratch("recv", (g,) + block_shape, x.dtype)
        how = _exec(mesh, seq, "alltoall", axes, comm.Alltoall, comm.Ialltoall, send, recv)
        if out is None:  # made after the MPI call, as in allgather
            out = _empty(out_shape, x.dtype)
        outer = math.prod(block_shape[:c])
        _blocks(out, c, g)[...] = recv.reshape(g, outer, math.prod(block_shape[c:])).swapaxes(0, 1)
    copied = (0 if send is x else x.nbytes) + (0 if direct else out.nbytes)
    moved = moved_bytes("alltoall", g, x.nbytes)
    op, sent, received = how or ("alltoall", moved, moved)
    record(op, normalize_axes(axes), g, sent, received, perf_counter() - t0, label, copied)
    return out


def allreduce(mesh: Mesh, local: Any, axes: str | Iterable[str], label: str | None = None,
              out: np.ndarray | None = None) -> np.ndarray:
    """Elementwise sum of every member's `local`, on every member (into `out` if given).

    ``out=local`` sums in place (MPI.IN_PLACE): no result buffer is allocated,
    which spares the page faults of fresh memory on every call.
    """
    comm, g, _ = mesh.group_info(axes)
    if (g > 1 and type(local) is _ndarray and local.flags.c_contiguous and (_DEBUG.quiet or debug.quiet())
            and mesh.algorithms is None):
        if out is local:
            dst, send = (local, _IN_PLACE) if local.flags.writeable else (None, None)
        else:
            dst, send = _lean_result(out, local.shape, local.dtype), local
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            try:  # costs nothing until mpi4py refuses the buffers
                if mesh.polite:
                    polite_wait(comm.Iallreduce(send, dst, _SUM))
                else:
                    comm.Allreduce(send, dst, _SUM)
            except Exception:
                _check_dtype("allreduce", local.dtype)  # a clear error when the dtype is why
                raise
            _DEBUG.seq += 1
            if _TRACES:
                _record_lean("allreduce", axes, g, local.nbytes, t0, label)
            return dst
    x = _contig(local)
    seq = _begin(mesh, comm, g, "allreduce", axes, x, ())
    if g == 1:
        record("allreduce", normalize_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None or out is x else _copy_into(out, x, "allreduce")
    t0 = perf_counter()
    in_place = out is x
    out = _result(out, x.shape, x.dtype, "allreduce")
    send = _IN_PLACE if in_place else x
    how = _exec(mesh, seq, "allreduce", axes, comm.Allreduce, comm.Iallreduce, send, out, _SUM)
    moved = moved_bytes("allreduce", g, x.nbytes)
    op, sent, received = how or ("allreduce", moved, moved)
    record(op, normalize_axes(axes), g, sent, received, perf_counter() - t0, label)
    return out


def reduce_scatter(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                   label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Sum over the group, keeping this member's block (group order) along `tensor_dim`."""
    comm, g, _ = mesh.group_info(axes)
    if (type(local) is _ndarray and tensor_dim == 0 and g > 1 and (_DEBUG.quiet or debug.quiet())
            and mesh.algorithms is None):
        shape = local.shape
        dst = (_lean_result(out, (shape[0] // g,) + shape[1:], local.dtype)
               if shape and not shape[0] % g and local.flags.carray else None)
        if dst is not None:
            t0 = perf_counter() if _TRACES else 0.0
            try:  # costs nothing until mpi4py refuses the buffers
                if mesh.polite:
                    polite_wait(comm.Ireduce_scatter_block(local, dst, _SUM))
                else:
                    comm.Reduce_scatter_block(local, dst, _SUM)
            except Exception:
                _check_dtype("reduce_scatter", local.dtype)  # a clear error when the dtype is why
                raise
            _DEBUG.seq += 1
            if _TRACES:
                _record_lean("reduce_scatter", axes, g, local.nbytes, t0, label)
            return dst
    x = _contig(local)
    d = _dim(tensor_dim, x.ndim, "tensor_dim")
    _divisible(x.shape, d, g, "reduce_scatter")
    seq = _begin(mesh, comm, g, "reduce_scatter", axes, x, (d,))
    if g == 1:
        record("reduce_scatter", normalize_axes(axes), 1, 0, 0, 0.0, label)
        return x if out is None else _copy_into(out, x, "reduce_scatter")
    t0 = perf_counter()
    out_shape = x.shape[:d] + (x.shape[d] // g,) + x.shape[d + 1:]
    send = _send_blocks(mesh, x, d, g)
    out = _result(out, out_shape, x.dtype, "reduce_scatter")
    how = _exec(mesh, seq, "reduce_scatter", axes, comm.Reduce_scatter_block, comm.Ireduce_scatter_block,
                send, out, _SUM)
    moved = moved_bytes("reduce_scatter", g, x.nbytes)
    op, sent, received = how or ("reduce_scatter", moved, moved)
    record(op, normalize_axes(axes), g, sent, received, perf_counter() - t0, label, 0 if send is x else x.nbytes)
    return out


def bcast(mesh: Mesh, local: Any, axes: str | Iterable[str], root: int = 0,
          label: str | None = None) -> np.ndarray:
    """Member `root` (group rank) sends `local`; the others receive into `local` (in place) and return it.

    Non-root members must pass an array of the same shape and dtype; it is
    filled in place when contiguous and writeable, else a filled copy is returned.
    """
    comm, g, me = mesh.group_info(axes)
    if type(root) is not int or not 0 <= root < g:
        root = _group_root(root, g, axes)
    if (g > 1 and type(local) is _ndarray and local.flags.carray and (_DEBUG.quiet or debug.quiet())
            and mesh.algorithms is None):
        t0 = perf_counter() if _TRACES else 0.0
        try:  # costs nothing until mpi4py refuses the buffer
            if mesh.polite:
                polite_wait(comm.Ibcast(local, root))
            else:
                comm.Bcast(local, root)
        except Exception:
            _check_dtype("bcast", local.dtype)  # a clear error when the dtype is why
            raise
        _DEBUG.seq += 1
        if _TRACES:
            n = local.nbytes
            record("bcast", normalize_axes(axes), g, n if me == root else 0, 0 if me == root else n,
                   perf_counter() - t0, label)
        return local
    seq = _begin(mesh, comm, g, "bcast", axes, local, (root,))
    if g == 1:
        record("bcast", normalize_axes(axes), 1, 0, 0, 0.0, label)
        return _contig(local)
    t0 = perf_counter()
    buf = local
    if not (type(buf) is np.ndarray and buf.flags.c_contiguous and buf.flags.writeable):
        buf = np.array(local, order="C")
    how = _exec(mesh, seq, "bcast", axes, comm.Bcast, comm.Ibcast, buf, root)
    n = buf.nbytes
    op, sent, received = how or ("bcast", n if me == root else 0, 0 if me == root else n)
    record(op, normalize_axes(axes), g, sent, received, perf_counter() - t0, label)
    return buf


def _exec(mesh: Mesh, seq: int, op: str, axes: Any, blocking: Any, nonblocking: Any,
          *args: Any) -> tuple[str, int, int] | None:
    """MPI's collective (None), or the algorithm `mesh.algorithms` names for `op`: its trace
    name ("allreduce[ring]") and this rank's real bytes sent and received."""
    algorithm = mesh.algorithms and mesh.algorithms.get(op)
    if not algorithm:
        _run(mesh, seq, op, axes, blocking, nonblocking, *args)
        return None
    from .algorithms import emulate

    return emulate(mesh, op, algorithm, blocking.__self__, *args, label="axes " + ",".join(normalize_axes(axes)))


def _group_root(root: Any, g: int, axes: Any) -> int:
    """`root` as an int group rank, or the ShapeError every member raises alike."""
    index = as_int(root)
    if index is None:
        raise RankError(f"bcast root {root!r} must be an integer group rank (0 <= root < {g})")
    if not 0 <= index < g:
        raise RankError(f"bcast root {root!r} is outside the group of {g} ranks over {normalize_axes(axes)!r}")
    return index


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
    record(op, normalize_axes(axes), g, moved, moved, perf_counter() - t0, label)
