"""Collectives over mesh axes with mpi4py's buffer methods on contiguous numpy arrays (docs/explanation/runtime.md).

Each function takes the mesh, this rank's array and the mesh axes of the group (one sub-communicator, ranks in
mixed-radix order of the axes, first major) and returns a new array, or fills ``out=``; a group of one rank
returns the input itself. Each checks its arguments and lays out the buffers (packing blocks along a dim with
data before it), then hands the engine's transfer to runtime.door.issue. The common case (C-contiguous arrays,
blocks along dim 0) makes no helper call but the result check before MPI: with 8 ranks sharing 2 cores, each
rank runs its pre-MPI Python on cold caches, in turn, while the group waits. A call the mesh made before with
the same group (`axes` as spelled), shape, dtype and dims, which packed and unpacked nothing, is repeated from
what that call worked out (kept per mesh, door.keep): no check it passed runs again (door.repeat).
"""
from __future__ import annotations

import math
from inspect import signature
from time import perf_counter
from typing import Any, Iterable

import numpy as np
from ..errors import OperatorError, RankError
from ..base.buffers import assign, broadcast_zero, converted, is_lazy
from ..base.context import _THREAD
from ..base.precision import is_low
from ..base.validate import as_int
from ..programs.plan.steps import moved_bytes  # each step kind owns its byte formula
from .arguments import _contig, _copy_into, _dim, _divisible, _empty, _result, _take, _take_order
from .door import _alone, issue, keep, repeat
from .engines.base import DRY_VALUES_BYTES
from .replay import CAPTURES, capturing
from .exchange import alltoallv, exchange  # the whole-mesh exchanges, importable from here as before
from .axes import normalize_axes
from .mesh import Mesh

__all__ = ["allgather", "alltoall", "allreduce", "reduce_scatter", "bcast", "alltoallv", "exchange", "moved_bytes"]

_REDUCTIONS = ("sum", "max", "min")
_ndarray = np.ndarray
_np_empty = np.empty  # results numpy fills (unpacking), not MPI


def _blocks(x: np.ndarray, tensor_dim: int, g: int) -> np.ndarray:
    """View x as (outer, g, rest) so that block j along tensor_dim is [:, j]."""
    outer = math.prod(x.shape[:tensor_dim])  # (`rest` spelled out: no -1 size from a zero-size array)
    return x.reshape(outer, g, math.prod(x.shape[tensor_dim:]) // g)


def _send_blocks(mesh: Mesh, x: np.ndarray, tensor_dim: int, g: int) -> np.ndarray:
    """`x` laid out so block j along `tensor_dim` is the j-th contiguous 1/g of the buffer
    (as it is when nothing precedes that dim; else one copy into the mesh's kept send buffer)."""
    if tensor_dim == 0 or math.prod(x.shape[:tensor_dim]) == 1:
        return x
    blocks = _blocks(x, tensor_dim, g).swapaxes(0, 1)
    send = mesh.scratch("send", blocks.shape, x.dtype)
    assign(send, blocks)
    return send


def _unpacker(mesh: Mesh, out: np.ndarray | None, shape: tuple, block_shape: tuple, dtype: np.dtype,
              tensor_dim: int, g: int) -> tuple[np.ndarray, Any]:
    """(receive buffer, unpack) for g blocks of `block_shape` arriving side by side.

    unpack() copies them into place along `tensor_dim` of the result (`out`, or a new array made
    after the MPI call: work before it delays the whole group) and returns it. The new array is
    numpy's own: numpy fills it, not MPI, and a page-placed one took 1.1x as long (docs/explanation/performance.md).
    """
    recv = mesh.scratch("recv", (g,) + block_shape, dtype)
    outer = math.prod(block_shape[:tensor_dim])

    def unpack() -> np.ndarray:
        dst = (_empty if is_lazy(recv) else _np_empty)(shape, dtype) if out is None else out  # (a dry run's: lazy)
        assign(_blocks(dst, tensor_dim, g), recv.reshape(g, outer, math.prod(block_shape[tensor_dim:])).swapaxes(0, 1))
        return dst
    return recv, unpack


def allgather(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
              label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Concatenate every member's `local` along `tensor_dim`, in group order (into `out` if given)."""
    if CAPTURES[0] and capturing():  # one recorded call (`_RECORDED`, at the end)
        return _RECORDED["allgather"](mesh, local, axes, tensor_dim, label=label, out=out)
    x = local if type(local) is _ndarray and local.flags.c_contiguous else _contig(local)
    key = None
    if type(tensor_dim) is int:  # a call this mesh made before with this group, shape, dtype and dim: its plan
        try:
            plan = mesh._plans.get(key := ("allgather", axes, x.shape, x.dtype, tensor_dim))
        except TypeError:  # axes as a list: worked out each time
            plan = key = None
        if plan is not None:
            dst = _empty(plan.out_shape, x.dtype) if out is None else out if (
                type(out) is _ndarray and out.shape == plan.out_shape and out.dtype is x.dtype and out.flags.carray
            ) else _result(out, plan.out_shape, x.dtype, "allgather")
            return repeat(mesh, plan, axes, label, (x, dst), dst, x)
    comm, g, _ = mesh.group_info(axes)
    shape = x.shape
    d = tensor_dim if type(tensor_dim) is int and 0 <= tensor_dim < len(shape) else _dim(
        tensor_dim, len(shape), "tensor_dim")
    if g == 1:
        _alone("allgather", axes, label, x.dtype)
        return _alone_into(mesh, out, x, "allgather")
    if d == 0:
        out_shape = (shape[0] * g,) + shape[1:]
    else:
        out_shape = shape[:d] + (shape[d] * g,) + shape[d + 1:]
        if math.prod(shape[:d]) != 1 and mesh.engine.dry and x.nbytes * g > DRY_VALUES_BYTES:
            dst = _result(out, out_shape, x.dtype, "allgather")  # a dry run's zeros in any order: no copy, same row
            return issue(mesh, comm, g, "allgather", axes, label, mesh.engine.all_gather, (x, dst), dst, x, (d,),
                         x.nbytes, x.nbytes * g)
        if math.prod(shape[:d]) != 1:  # received side by side, then one copy along tensor_dim
            _take("allgather", x.dtype)  # before a kept buffer is viewed as it (an object array's cannot be)
            t0 = perf_counter()
            dst = None if out is None else _result(out, out_shape, x.dtype, "allgather")
            recv, unpack = _unpacker(mesh, dst, out_shape, shape, x.dtype, d, g)
            return issue(mesh, comm, g, "allgather", axes, label, mesh.engine.all_gather,
                         (x, recv), None, x, (d,), x.nbytes, x.nbytes * g, t0, unpack)
    dst = _result(out, out_shape, x.dtype, "allgather")
    result = issue(mesh, comm, g, "allgather", axes, label, mesh.engine.all_gather, (x, dst), dst, x, (d,), x.nbytes)
    if key is not None:
        keep(mesh, key, comm, g, out_shape, "allgather", mesh.engine.all_gather, (d,), x.nbytes)
    return result


def alltoall(mesh: Mesh, local: Any, axes: str | Iterable[str], split_dim: int, concat_dim: int,
             label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Split `local` along split_dim into g blocks, send block j to member j, concat along concat_dim."""
    if CAPTURES[0] and capturing():  # one recorded call (`_RECORDED`, at the end)
        return _RECORDED["alltoall"](mesh, local, axes, split_dim, concat_dim, label=label, out=out)
    x = local if type(local) is _ndarray and local.flags.c_contiguous else _contig(local)
    key = None
    if type(split_dim) is int and type(concat_dim) is int:  # as allgather's plan
        try:
            plan = mesh._plans.get(key := ("alltoall", axes, x.shape, x.dtype, (split_dim, concat_dim)))
        except TypeError:
            plan = key = None
        if plan is not None:
            dst = _empty(plan.out_shape, x.dtype) if out is None else out if (
                type(out) is _ndarray and out.shape == plan.out_shape and out.dtype is x.dtype and out.flags.carray
            ) else _result(out, plan.out_shape, x.dtype, "alltoall")
            return repeat(mesh, plan, axes, label, (x, dst), dst, x)
    comm, g, _ = mesh.group_info(axes)
    shape = x.shape
    ndim = len(shape)
    s = split_dim if type(split_dim) is int and 0 <= split_dim < ndim else _dim(split_dim, ndim, "split_dim")
    c = concat_dim if type(concat_dim) is int and 0 <= concat_dim < ndim else _dim(
        concat_dim, ndim, "concat_dim")
    if shape[s] % g:
        _divisible(shape, s, g, "alltoall")
    if g == 1:
        _alone("alltoall", axes, label, x.dtype)
        return _alone_into(mesh, out, x, "alltoall")
    if s == c == 0:  # blocks are contiguous 1/g of the buffer both ways
        dst = _result(out, shape, x.dtype, "alltoall")
        result = issue(mesh, comm, g, "alltoall", axes, label, mesh.engine.all_to_all, (x, dst), dst, x, (s, c),
                       x.nbytes)
        if key is not None:
            keep(mesh, key, comm, g, shape, "alltoall", mesh.engine.all_to_all, (s, c), x.nbytes)
        return result
    _take("alltoall", x.dtype)  # before a kept buffer is viewed as it (an object array's cannot be)
    t0 = perf_counter()
    block_shape = shape[:s] + (shape[s] // g,) + shape[s + 1:]
    send = _send_blocks(mesh, x, s, g)
    out_shape = block_shape[:c] + (block_shape[c] * g,) + block_shape[c + 1:]
    copied = 0 if send is x else x.nbytes
    if c == 0 or math.prod(block_shape[:c]) == 1:
        dst = _result(out, out_shape, x.dtype, "alltoall")
        result = issue(mesh, comm, g, "alltoall", axes, label, mesh.engine.all_to_all, (send, dst),
                       dst, x, (s, c), x.nbytes, copied, t0)
        if key is not None and send is x:  # nothing packed: the transfer alone
            keep(mesh, key, comm, g, out_shape, "alltoall", mesh.engine.all_to_all, (s, c), x.nbytes)
        return result
    dst = None if out is None else _result(out, out_shape, x.dtype, "alltoall")
    recv, unpack = _unpacker(mesh, dst, out_shape, block_shape, x.dtype, c, g)
    return issue(mesh, comm, g, "alltoall", axes, label, mesh.engine.all_to_all, (send, recv),
                 None, x, (s, c), x.nbytes, copied + x.nbytes, t0, unpack)


def allreduce(mesh: Mesh, local: Any, axes: str | Iterable[str], label: str | None = None,
              out: np.ndarray | None = None, op: str = "sum") -> np.ndarray:
    """Elementwise sum (or, with ``op="max"``/``"min"``, maximum/minimum) of every member's `local`, on every member.

    ``out=local`` reduces in place (MPI.IN_PLACE), sparing the page faults of a fresh result.
    A maximum is exact in any order (vocab-parallel cross-entropy's shift per row, as in Megatron).
    """
    if CAPTURES[0] and capturing():  # one recorded call (`_RECORDED`, at the end)
        return _RECORDED["allreduce"](mesh, local, axes, label=label, out=out, op=op)
    if op not in _REDUCTIONS:
        _reduction(op)
    x = local if type(local) is _ndarray and local.flags.c_contiguous else _contig(local)
    try:  # as allgather's plan
        plan = mesh._plans.get(key := ("allreduce", axes, x.shape, x.dtype, op))
    except TypeError:
        plan = key = None
    if plan is not None:
        dst = x if out is x and x.flags.writeable else (
            _empty(x.shape, x.dtype) if out is None else _result(out, x.shape, x.dtype, "allreduce"))
        return repeat(mesh, plan, axes, label, (x, dst, op), dst, x)
    comm, g, _ = mesh.group_info(axes)
    if op != "sum":  # MPI orders integers and real floats only: the same DTypeError on every engine
        _take_order("allreduce", op, x.dtype)
    if is_low(x.dtype):  # no bfloat16 sum in MPI: summed in float32, rounded once
        return _narrowed(mesh, allreduce(mesh, _wide32(mesh, x), axes, label, op=op), x.dtype, out, "allreduce")
    if g == 1:
        _alone("allreduce", axes, label, x.dtype)
        return x if out is x else _alone_into(mesh, out, x, "allreduce")
    dst = x if out is x and x.flags.writeable else _result(out, x.shape, x.dtype, "allreduce")
    result = issue(mesh, comm, g, "allreduce", axes, label, mesh.engine.all_reduce, (x, dst, op), dst, x, (), x.nbytes)
    if key is not None:
        keep(mesh, key, comm, g, x.shape, "allreduce", mesh.engine.all_reduce, (), x.nbytes)
    return result


def _alone_into(mesh: Mesh, out: np.ndarray | None, x: np.ndarray, op: str) -> np.ndarray:
    """A group of one's result: `x` itself, or `x` copied into `out` (a dry run's `out` holds its zeros
    already: checked, nothing written, as `_narrowed`)."""
    if out is None:
        return x
    if mesh.engine.dry:
        return _result(out, x.shape, x.dtype, op)
    return _copy_into(out, x, op)


def _wide32(mesh: Mesh, x: np.ndarray) -> np.ndarray:
    """A bfloat16 block as float32, for a sum, converted by the engine (a dry run's: zeros, no page written)."""
    return mesh.engine.local(converted, broadcast_zero(x.shape, _F32), x, _F32)


def _narrowed(mesh: Mesh, total: np.ndarray, dtype: np.dtype, out: np.ndarray | None, op: str) -> np.ndarray:
    """A float32 sum of bfloat16 blocks rounded once to bfloat16 by the engine (into `out` when given; a dry
    run's `out` holds its zeros already: nothing written)."""
    if out is not None and mesh.engine.dry:
        return out
    narrowed = mesh.engine.local(converted, broadcast_zero(total.shape, dtype), total, dtype)
    return narrowed if out is None else _copy_into(out, narrowed, op)


_F32 = np.dtype(np.float32)


def _reduction(op: Any) -> None:
    """The OperatorError every member raises alike for an `op` that allreduce does not know."""
    raise OperatorError(f"allreduce op {op!r} is not supported; expected 'sum', 'max' or 'min'")


def reduce_scatter(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                   label: str | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Sum over the group, keeping this member's block (group order) along `tensor_dim`."""
    if CAPTURES[0] and capturing():  # one recorded call (`_RECORDED`, at the end)
        return _RECORDED["reduce_scatter"](mesh, local, axes, tensor_dim, label=label, out=out)
    x = local if type(local) is _ndarray and local.flags.c_contiguous else _contig(local)
    key = None
    if type(tensor_dim) is int:  # as allgather's plan
        try:
            plan = mesh._plans.get(key := ("reduce_scatter", axes, x.shape, x.dtype, tensor_dim))
        except TypeError:
            plan = key = None
        if plan is not None:
            dst = _empty(plan.out_shape, x.dtype) if out is None else out if (
                type(out) is _ndarray and out.shape == plan.out_shape and out.dtype is x.dtype and out.flags.carray
            ) else _result(out, plan.out_shape, x.dtype, "reduce_scatter")
            return repeat(mesh, plan, axes, label, (x, dst, "sum"), dst, x)
    shape = x.shape
    d = tensor_dim if type(tensor_dim) is int and 0 <= tensor_dim < len(shape) else _dim(
        tensor_dim, len(shape), "tensor_dim")
    comm, g, _ = mesh.group_info(axes)
    if shape[d] % g:
        _divisible(shape, d, g, "reduce_scatter")
    if is_low(x.dtype):  # no bfloat16 sum in MPI: summed in float32, rounded once
        return _narrowed(mesh, reduce_scatter(mesh, _wide32(mesh, x), axes, d, label), x.dtype, out, "reduce_scatter")
    if g == 1:
        _alone("reduce_scatter", axes, label, x.dtype)
        return _alone_into(mesh, out, x, "reduce_scatter")
    if d == 0:
        send, t0, copied = x, None, 0
        out_shape = (shape[0] // g,) + shape[1:]
    else:
        _take("reduce_scatter", x.dtype)  # before a kept buffer is viewed as it (an object array's cannot be)
        t0 = perf_counter()
        send = _send_blocks(mesh, x, d, g)
        copied = 0 if send is x else x.nbytes
        out_shape = shape[:d] + (shape[d] // g,) + shape[d + 1:]
    dst = _result(out, out_shape, x.dtype, "reduce_scatter")
    result = issue(mesh, comm, g, "reduce_scatter", axes, label, mesh.engine.reduce_scatter, (send, dst, "sum"),
                   dst, x, (d,), x.nbytes, copied, t0)
    if key is not None and send is x:  # nothing packed: the transfer alone
        keep(mesh, key, comm, g, out_shape, "reduce_scatter", mesh.engine.reduce_scatter, (d,), x.nbytes)
    return result


def bcast(mesh: Mesh, local: Any, axes: str | Iterable[str], root: int = 0,
          label: str | None = None) -> np.ndarray:
    """Member `root` (group rank) sends `local`; the others receive into `local` (in place) and return it.

    Non-root members pass an array of the same shape and dtype (not contiguous and writeable: a copy is filled).
    """
    if CAPTURES[0] and capturing():  # one recorded call (`_RECORDED`, at the end)
        return _RECORDED["bcast"](mesh, local, axes, root, label=label)
    key = None
    if type(local) is _ndarray and (flags := local.flags).c_contiguous and flags.writeable:
        try:  # as allgather's plan: received in place, so `local` is the buffer
            plan = mesh._plans.get(key := ("bcast", axes, local.shape, local.dtype, root))
        except TypeError:
            plan = key = None
        if plan is not None:
            return repeat(mesh, plan, axes, label, (local, root), local, local)
    comm, g, me = mesh.group_info(axes)
    if type(root) is not int or not 0 <= root < g:
        root = _group_root(root, g, axes)
    if g == 1:
        _alone("bcast", axes, label, local.dtype if type(local) is _ndarray else None)
        return _contig(local)
    buf = local
    if not (type(buf) is _ndarray and (flags := buf.flags).c_contiguous and flags.writeable):
        buf = np.array(local, order="C")
    n = buf.nbytes
    moved = (n, 0) if me == root else (0, n)
    result = issue(mesh, comm, g, "bcast", axes, label, mesh.engine.broadcast, (buf, root), buf, buf, (root,), moved)
    if key is not None and buf is local:
        keep(mesh, key, comm, g, buf.shape, "bcast", mesh.engine.broadcast, (root,), moved)
    return result


def _group_root(root: Any, g: int, axes: Any) -> int:
    """`root` as an int group rank, or the ShapeError every member raises alike."""
    index = as_int(root)
    if index is None:
        raise RankError(f"bcast root {root!r} must be an integer group rank (0 <= root < {g})")
    if not 0 <= index < g:
        raise RankError(f"bcast root {root!r} is outside the group of {g} ranks over {normalize_axes(axes)!r}")
    return index


def _bind(func: Any, args: tuple, kwargs: dict) -> Any:
    """A captured step's call of collective `func` as its replay makes it (spmdsim.runtime.replay.kernel's
    `bind`), or None: the call as `func`'s kept plan repeats it, its key and arrays worked out and checked
    once. Each replay looks the plan up again (a mesh closed or its plans cleared: `func` itself, which
    checks everything and keeps the plan again), and with a debug hook on, an algorithm or a trace open
    calls `func` itself; else the engine's transfer alone, as `door.repeat` makes it."""
    name = func.__name__
    call = signature(func).bind(*args, **kwargs)
    call.apply_defaults()
    given = call.arguments
    mesh, x, out = given["mesh"], given["local"], given["out"]
    if not (type(x) is _ndarray and x.flags.c_contiguous and type(out) is _ndarray and out.flags.carray
            and out.dtype is x.dtype) or type(mesh) is not Mesh or name not in _KEPT:
        return None
    dims = _KEPT[name](given)
    if dims is None:
        return None
    key = (name, given["axes"], x.shape, x.dtype, dims)
    try:
        plan = mesh._plans.get(key)
    except TypeError:  # axes as a list: never kept
        return None
    if name == "allreduce":
        if plan is None or out.shape != x.shape:
            return None
        send = (x, out, dims)
    elif plan is None or out.shape != plan.out_shape:
        return None
    else:
        send = (x, out, "sum") if name == "reduce_scatter" else (x, out)
    return _repeated(mesh, key, send, func, args, kwargs)


def _repeated(mesh: Mesh, key: tuple, send: tuple, func: Any, args: tuple, kwargs: dict) -> Any:
    """`_bind`'s call (its names the closure's cells)."""
    def replayed() -> None:
        plan = mesh._plans.get(key)
        context = _THREAD.context
        if plan is not None and context.hooks.quiet and mesh.algorithms is None and not context.traces:
            plan.direct(*send)
            context.seq += 1
        else:
            func(*args, **kwargs)
    return replayed


#: A kept collective's dims in its plan's key, from its call's arguments (None: never kept).
_KEPT = {
    "allgather": lambda given: given["tensor_dim"] if type(given["tensor_dim"]) is int else None,
    "reduce_scatter": lambda given: given["tensor_dim"] if type(given["tensor_dim"]) is int else None,
    "alltoall": lambda given: (given["split_dim"], given["concat_dim"])
    if type(given["split_dim"]) is int and type(given["concat_dim"]) is int else None,
    "allreduce": lambda given: given["op"] if given["op"] in _REDUCTIONS else None,
}


# Each collective is one recorded call when a rank captures a step (spmdsim.runtime.replay): a replay
# meets the other ranks again, with none of the packing checks' Python recorded apart, and a call its
# mesh kept a plan of repeats it (_bind). Each function asks `capturing()` itself and calls its recorded
# form only then: a rank that does not capture calls the function alone, without the kernel's wrapper
# (a frame and its arguments packed again, a few microseconds on cold caches before the MPI call).
from .replay import kernel as _kernel  # noqa: E402
from .replay import kernels as _kernels  # noqa: E402

_RECORDED = {f.__name__: _kernel(f, bind=None if f is bcast else _bind)
             for f in (allgather, alltoall, allreduce, reduce_scatter, bcast)}
#: The four for hot paths (the executor's runners): ``KERNELS.allgather(...)`` is the collective
#: itself in a thread that does not capture, its recorded call in one that does (spmdsim.runtime.replay.kernels).
KERNELS = _kernels(*(_RECORDED[name] for name in ("allgather", "alltoall", "allreduce", "reduce_scatter")))
