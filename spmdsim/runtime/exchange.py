"""General exchanges over the whole mesh with one Alltoallv: any block to any rank.

`alltoallv` takes per-destination blocks and per-source shapes and checks them
on every call; `exchange` runs a prebuilt `ExchangeSpec` (runtime.exchange_spec),
whose counts and boxes were checked once, and is what the executor's Exchange
steps call in loops. Both pack the outgoing blocks into the mesh's kept send
buffer (a dry run's, spmdsim.runtime.sim.dry, stays unwritten: nothing reads it), receive
into one flat buffer, and record one trace entry.
"""
from __future__ import annotations

import math
from functools import lru_cache
from itertools import accumulate
from time import perf_counter
from typing import Any, Mapping, Sequence

import numpy as np

from ..base import buffers
from .engines.base import DRY_VALUES_BYTES
from ..errors import DTypeError, RankError, ShapeError
from ..base.validate import as_int
from .arguments import _empty, _result, _take
from .door import _alone, issue
from .exchange_spec import ExchangeSpec
from .mesh import Mesh

__all__ = ["alltoallv", "group_alltoallv", "exchange", "shifted", "shifted_many"]

_ndarray = np.ndarray


def alltoallv(mesh: Mesh, sends: Mapping[int, Any], recv_shapes: Mapping[int, tuple],
              dtype: Any, label: str | None = None, out: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """General exchange over the whole mesh: `sends[r]` goes to mesh rank r; returns {source: array}.

    `recv_shapes[r]` is the shape of the block expected from rank r. A block to
    itself is not sent: it comes back reshaped (a view where numpy can). The
    others are views of one flat receive buffer, sources in rank order: a new
    array, or `out` (C-contiguous, of that many items and `dtype`).
    """
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    size, me = mesh.size, mesh.rank
    # Counts and offsets as Python ints: a handful per rank, where numpy's
    # per-call overhead would cost more than the arithmetic (docs/explanation/performance.md).
    scounts = [0] * size
    arrays = {}
    # Checked on cold caches between this rank's arrival and the MPI call: plain ints
    # and arrays of the right dtype pass on `type`/`is` tests, the rest is converted.
    for r, a in sends.items():
        if type(r) is not int or not 0 <= r < size:
            r = _mesh_rank(r, size, "sends")
        if type(a) is not _ndarray:
            a = np.asarray(a)
        if a.dtype is not dtype and a.dtype != dtype:
            raise DTypeError(f"alltoallv block for rank {r} has dtype {a.dtype.name!r}, expected {dtype.name!r}")
        arrays[r] = a
        scounts[r] = a.size
    rcounts = [0] * size
    wanted = []  # (source, shape) with plain int sources, for the views after the call
    for r, shape in recv_shapes.items():
        if type(r) is not int or not 0 <= r < size:
            r = _mesh_rank(r, size, "recv_shapes")
        rcounts[r] = math.prod(shape)
        wanted.append((r, shape))
    if me in recv_shapes:
        mine = arrays.get(me)
        if mine is None or mine.size != rcounts[me]:
            raise ShapeError(f"alltoallv: rank {me} expects {tuple(recv_shapes[me])!r} from itself "
                             f"but sends {None if mine is None else mine.shape!r}")
    scounts[me] = rcounts[me] = 0
    _take("alltoallv", dtype)  # before a kept buffer is viewed as it (an object array's cannot be)
    t0 = perf_counter()
    sdispls = [0, *accumulate(scounts[:-1])]
    rdispls = [0, *accumulate(rcounts[:-1])]
    send = mesh.scratch("send", (sdispls[-1] + scounts[-1],), dtype)
    packed = () if mesh.engine.dry else arrays.items()  # a dry run's send buffer is unread: no page written
    for r, a in packed:
        if r != me:  # one copy from a strided view straight into the send buffer
            lo = sdispls[r]
            if a.ndim == 1:
                send[lo:lo + scounts[r]] = a
            else:
                send[lo:lo + scounts[r]].reshape(a.shape)[...] = a
    recv = _result(out, (rdispls[-1] + rcounts[-1],), dtype, "alltoallv")

    def views() -> dict[int, np.ndarray]:
        blocks: dict[int, np.ndarray] = {}
        for r, shape in wanted:
            if r == me:  # reshaped after the MPI call: nothing here needs it before
                blocks[r] = arrays[me].reshape(shape)
            else:
                lo = rdispls[r]
                block = recv[lo:lo + rcounts[r]]
                blocks[r] = block if len(shape) == 1 else block.reshape(shape)
        return blocks
    if size == 1:
        _alone("alltoallv", mesh.layout.alias_name, label, dtype)
        return views()
    comm = mesh.comm
    # Every block sent is packed into `send` (the trace's bytes_copied).
    return issue(mesh, comm, size, "alltoallv", mesh.layout.alias_name, label, mesh.engine.all_to_allv,
                 (send, scounts, sdispls, recv, rcounts, rdispls), None, dtype, (), (send.nbytes, recv.nbytes),
                 send.nbytes, t0, views, (scounts, rcounts))


def group_alltoallv(mesh: Mesh, local: Any, send_rows: Sequence[int], recv_rows: Sequence[int], axes: Any,
                    label: str | None = None) -> np.ndarray:
    """Rows of `local` (rows, ...) to the members of this rank's group over `axes`, in one Alltoallv.

    `send_rows[j]` consecutive rows go to member j (members in group order), `recv_rows[j]` rows come from
    member j; returns them (sum(recv_rows), ...), sources in group order. The counts must agree across the
    group (member i's send_rows[j] is member j's recv_rows[i]): the caller exchanged them first, as a
    dropless MoE layer's Alltoall of counts does (spmdsim.models.moe.layer). A member's rows to itself are copied
    by MPI within the rank: the trace counts the bytes sent to and received from the others.
    """
    comm, g, me = mesh.group_info(axes)
    x = local if type(local) is _ndarray and local.flags.c_contiguous else np.ascontiguousarray(local)
    if x.ndim < 1 or len(send_rows) != g or len(recv_rows) != g:
        raise ShapeError(f"group_alltoallv: {len(send_rows)} send and {len(recv_rows)} receive counts for a "
                         f"group of {g} over {axes!r}; expected one each per member, and rows to send")
    if sum(send_rows) != x.shape[0] or min(list(send_rows) + list(recv_rows), default=0) < 0:
        raise ShapeError(f"group_alltoallv: send counts {list(send_rows)!r} must be >= 0 and add up to the "
                         f"{x.shape[0]} rows of the local array")
    row = math.prod(x.shape[1:])
    scounts = [int(n) * row for n in send_rows]
    rcounts = [int(n) * row for n in recv_rows]
    recv = _empty((sum(int(n) for n in recv_rows),) + x.shape[1:], x.dtype)
    if g == 1:
        _alone("alltoallv", axes, label, x.dtype)
        recv[...] = x
        return recv
    sdispls = [0, *accumulate(scounts[:-1])]
    rdispls = [0, *accumulate(rcounts[:-1])]
    own = x.itemsize * scounts[me]  # (as many rows come from itself as go to it)
    return issue(mesh, comm, g, "alltoallv", axes, label, mesh.engine.all_to_allv,
                 (x, scounts, sdispls, recv, rcounts, rdispls), recv, x.dtype, (), (x.nbytes - own, recv.nbytes - own),
                 0, None, None, (tuple(scounts), tuple(rcounts)))


def _checked_spec(mesh: Mesh, local: Any, spec: ExchangeSpec) -> int:
    """The mesh's size, once `spec` is this rank's and `local` an array of its shape (ShapeError otherwise)."""
    size = mesh.size
    if spec.size != size or spec.rank != mesh.rank:
        raise ShapeError(f"exchange spec for rank {spec.rank} of {spec.size} used on rank {mesh.rank} of {size}")
    if type(local) is not np.ndarray or local.shape != spec.local_shape:
        raise ShapeError(f"exchange: local block {getattr(local, 'shape', local)!r} is not an array of "
                         f"shape {spec.local_shape!r}")
    return size


def exchange(mesh: Mesh, local: np.ndarray, spec: ExchangeSpec, label: str | None = None,
             out: np.ndarray | None = None) -> np.ndarray:
    """Alltoallv over the whole mesh by a prebuilt `spec`: its boxes of `local` go out, one flat buffer comes back.

    The repeated form of `alltoallv` (the executor's Exchange steps): the spec
    was checked when built, so a call checks only that it is this rank's and
    `local` has its shape. A box from a source is ``recv[start:stop]`` of its
    slot in ``spec.recv_slots``. A block that goes whole to one peer is sent
    from `local` itself, with no packing copy. `out`: the receive buffer to fill.
    """
    size = _checked_spec(mesh, local, spec)
    dtype = local.dtype
    axes = mesh.layout.alias_name
    t0 = perf_counter()
    packs = spec.packs
    if len(packs) == 1 and packs[0][2] - packs[0][1] == local.size and local.flags.c_contiguous:
        send, copied = local.reshape(-1), 0  # the whole block to one peer: sent as it lies
    else:
        send = mesh.scratch("send", (spec.send_total,), dtype)
        if not mesh.engine.dry:  # (a dry run's: unread, its pages never written)
            for index, lo, hi, shape in packs:  # one copy from each box's view into the send buffer
                send[lo:hi].reshape(shape)[...] = local[index]
        copied = send.nbytes
    recv = _empty(spec.recv_total, dtype) if out is None else _result(out, (spec.recv_total,), dtype, "exchange")
    if size == 1:
        _alone("alltoallv", axes, label, dtype)
        return recv
    comm = mesh.comm
    return issue(mesh, comm, size, "alltoallv", axes, label, mesh.engine.all_to_allv,
                 (send, spec.scounts, spec.sdispls, recv, spec.rcounts, spec.rdispls), recv, dtype, (),
                 (spec.send_total * dtype.itemsize, recv.nbytes), copied, t0, None, (spec.scounts, spec.rcounts))


def exchange_boxes(mesh: Mesh, local: np.ndarray, spec: ExchangeSpec, program: Any, label: str | None = None,
                   out: np.ndarray | None = None) -> np.ndarray:
    """`exchange` and its unpacking on an engine whose ranks share memory (Engine.moves_boxes): this rank's new
    block (`out`, else made here) with each box of `program` (`spec`'s spmdsim.programs.plan.kernels.
    ExchangeProgram) copied once, from the sender's view of its block into its place, and the overlap
    this rank keeps copied from `local`; no send or receive buffer. Traced as `exchange`'s Alltoallv."""
    size = _checked_spec(mesh, local, spec)
    dtype = local.dtype
    out = buffers.empty(program.out_shape, dtype) if out is None else _result(out, program.out_shape, dtype,
                                                                               "exchange")
    t0 = perf_counter()
    own = program.own
    if own is not None:
        out[own[0]] = local[own[1]]
    if size == 1:
        _alone("alltoallv", mesh.layout.alias_name, label, dtype)
        return out
    sends = {dst: local[index] for dst, index, _ in program.sends}
    receives = {src: out[index] for src, index, _ in program.places}
    return issue(mesh, mesh.comm, size, "alltoallv", mesh.layout.alias_name, label, mesh.engine.all_to_all_boxes,
                 (sends, receives, dtype), out, dtype, (),
                 (spec.send_total * dtype.itemsize, spec.recv_total * dtype.itemsize),
                 0, t0, None, (spec.scounts, spec.rcounts))  # nothing packed: each box is copied as it moves


def shifted(mesh: Mesh, local: np.ndarray, shift: Any, label: str | None = None,
            out: np.ndarray | None = None) -> np.ndarray:
    """This rank's block of `shift`'s result (a spmdsim.programs.plan.shift.Shift of `local`'s tensor): the rows it
    keeps copied, the others received in one Alltoallv over the mesh (none when no rank lacks rows); rows
    no rank holds are zeros, or left as they are in `out` (the block to write into). Collective: every
    rank calls it with the same shift."""
    if out is None:  # (a dry run's: the engine's zeros, lazily mapped, which shifted_many writes no row of)
        shape = shift.moves(mesh.rank).out_shape
        out = buffers.fresh(mesh.engine.local(np.zeros, buffers.broadcast_zero(shape, local.dtype), shape,
                                              local.dtype), 0)
    shifted_many(mesh, [(local, shift, out)], label)
    return out


def shifted_many(mesh: Mesh, moves: Sequence[tuple[np.ndarray, Any, np.ndarray]], label: str | None = None) -> None:
    """Several shifts at once, each (local block, Shift, block to write its result into), their rows in one
    Alltoallv (a join's operands, or its gradient's pieces): the same bytes as one call each, one latency.
    Collective: every rank calls it with the same shifts.

    A dry run (one rank for all, spmdsim.runtime.sim.dry) writes no row into a block of DRY_VALUES_BYTES or more (the
    engine's zeros: its values are not results, and a row written would cost its pages) and sends the shifts'
    rows as zeros of their sizes; the Alltoallv and its bytes are the real run's."""
    rank = mesh.rank
    engine = mesh.engine
    dry = engine.dry
    moving = []
    for local, shift, out in moves:
        own = shift.moves(rank).own
        if own is not None and not (dry and out.nbytes >= DRY_VALUES_BYTES):
            out[own[0]] = local[own[1]]
        if not shift.moves_nothing:
            moving.append((local, shift, out))
    if not moving:
        return
    if dry:  # one rank runs for all: the dry report takes every rank's bytes from the shifts
        counts = [shift.bytes_per_rank(out.dtype.itemsize) for _, shift, out in moving]
        engine.ran(_ShiftBytes(*(tuple(map(sum, zip(*side))) for side in zip(*counts))))
    if len(moving) == 1:  # one shift: its Alltoallv by a spec worked out once (the repeated path)
        local, shift, out = moving[0]
        spec = _shift_spec(shift, mesh.size, rank, local.shape)
        recv = exchange(mesh, buffers.contiguous(local), spec, label)
        if not (dry and out.nbytes >= DRY_VALUES_BYTES):
            for (_, index, shape), (_, lo, hi) in zip(shift.moves(rank).places, spec.recv_slots):
                out[index] = recv[lo:hi].reshape(shape)
        return
    dtype = moving[0][2].dtype
    sends: dict = {}
    counts: dict = {}
    for local, shift, _ in moving:  # per peer, the shifts' boxes in order (at most one each)
        m = shift.moves(rank)
        for dst, index, _ in m.sends:  # (a dry run's: the box's view, for its size)
            box = local[index]
            sends.setdefault(dst, []).append(box if dry else box.astype(dtype, copy=False).reshape(-1))
        for src, _, shape in m.places:
            counts[src] = counts.get(src, 0) + math.prod(shape)
    if dry:  # each peer's rows as zeros of their size (no joined copy of them made)
        joined = {dst: buffers.broadcast_zero((sum(p.size for p in parts),), dtype) for dst, parts in sends.items()}
    else:
        joined = {dst: np.concatenate(parts) for dst, parts in sends.items()}
    got = alltoallv(mesh, joined, {src: (n,) for src, n in counts.items()}, dtype, label)
    at: dict = {}
    for _, shift, out in moving:
        write = not (dry and out.nbytes >= DRY_VALUES_BYTES)
        for src, index, shape in shift.moves(rank).places:
            lo = at.get(src, 0)
            at[src] = lo + math.prod(shape)
            if write:
                out[index] = got[src][lo:at[src]].reshape(shape)


# One recorded call each when a rank captures a step (spmdsim.runtime.replay).
from .replay import kernel as _kernel  # noqa: E402

alltoallv, exchange, exchange_boxes = _kernel(alltoallv), _kernel(exchange), _kernel(exchange_boxes)


class _ShiftBytes:
    """What the dry engine reads of a step: the bytes each rank sends and receives."""

    def __init__(self, sent: tuple, received: tuple) -> None:
        self.bytes_sent, self.bytes_received = sent, received


@lru_cache(maxsize=1024)
def _shift_spec(shift: Any, size: int, rank: int, local_shape: tuple) -> ExchangeSpec:
    moves = shift.moves(rank)
    return ExchangeSpec.build(size, rank, local_shape, moves.sends,
                              [(src, math.prod(shape)) for src, _, shape in moves.places])


def _mesh_rank(r: Any, size: int, what: str) -> int:
    """`r` as an int mesh rank, or a ShapeError naming the alltoallv argument it came from."""
    index = as_int(r)  # 1.5 must not pass as rank 1
    if index is None or not 0 <= index < size:
        raise RankError(f"alltoallv {what} key {r!r} is not a mesh rank (an integer with 0 <= r < {size})")
    return index
