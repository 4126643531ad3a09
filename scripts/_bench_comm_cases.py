"""bench.py's communication cases: each collective, and one redistribution per kind of plan step."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from spmdsim import Layout, SeededTensor
from spmdsim.tools.cli.collective_timing import Waiter

from _bench_harness import Case, Raw, placed, size_text, traced

__all__ = ["collective_cases", "redistribute_cases"]


# -- collectives --------------------------------------------------------------------------
def collective_cases(comm: Any, waiter: Waiter, wait: str, sizes: list[int],
                     alloc: bool = False) -> list[Case]:
    from spmdsim import Mesh

    world = comm.Get_size()
    meshes = [(Mesh(Layout((world,), ("x",)), comm, wait=wait), ("x",))]
    if world >= 4 and world % 2 == 0:
        meshes.append((Mesh(Layout((2, world // 2), ("dp", "mp")), comm, wait=wait), ("mp",)))
    cases = []
    for mesh, axes in meshes:
        for n in sizes:
            cases.extend(_collective_group_cases(mesh, axes, n, waiter, alloc))
    return cases


def _collective_group_cases(mesh: Any, axes: tuple, n: int, waiter: Waiter,
                            alloc: bool = False) -> list[Case]:
    """The collectives on one group of `mesh` with per-rank buffer n (own scope for closures).

    Both sides receive into the same preallocated buffers (spmdsim with ``out=``);
    with `alloc` both allocate a fresh result on every call instead.
    """
    from mpi4py import MPI
    from spmdsim.runtime import collectives as C

    sub, g, me = mesh.group_info(axes)
    cols = 256
    rows = max(g, n // 4 // cols // g * g)  # n = rows*cols*4, rows divisible by g
    full, part = placed((rows, cols), 1), placed((rows // g, cols), 1)
    kept_full, kept_part = placed(full.shape), placed(part.shape)

    def fresh(kept: np.ndarray) -> np.ndarray:
        return placed(kept.shape) if alloc else kept
    out_full, out_part = (None, None) if alloc else (kept_full, kept_part)
    # numpy (rank 0 only): every member's buffer at once.
    stacked = np.ones((g,) + full.shape if mesh.rank == 0 else (g, g, 1), np.float32)
    raw = Raw(waiter)
    SUM = MPI.SUM
    specs = [
        ("allgather", lambda: C.allgather(mesh, part, axes, 0, out=out_full),
         lambda: raw(sub.Allgather, sub.Iallgather, part, fresh(kept_full)),
         lambda: np.concatenate([stacked[j][: rows // g] for j in range(g)])),
        ("allreduce", lambda: C.allreduce(mesh, full, axes, out=out_full),
         lambda: raw(sub.Allreduce, sub.Iallreduce, full, fresh(kept_full), SUM),
         lambda: stacked.sum(axis=0)),
        ("reduce_scatter", lambda: C.reduce_scatter(mesh, full, axes, 0, out=out_part),
         lambda: raw(sub.Reduce_scatter_block, sub.Ireduce_scatter_block, full, fresh(kept_part),
                     SUM),
         lambda: stacked.sum(axis=0)),
        ("alltoall", lambda: C.alltoall(mesh, full, axes, 0, 0, out=out_full),
         lambda: raw(sub.Alltoall, sub.Ialltoall, full, fresh(kept_full)),
         lambda: np.ascontiguousarray(stacked.reshape(g, g, -1).swapaxes(0, 1))),
        ("bcast", lambda: C.bcast(mesh, full, axes, 0),
         lambda: raw(sub.Bcast, sub.Ibcast, full),
         lambda: [np.copyto(stacked[j], stacked[0]) for j in range(1, g)]),
    ]
    if axes == tuple(mesh.layout.alias_name):  # alltoallv runs over the whole mesh
        block = part.reshape(-1)
        sends = {r: block for r in range(g)}
        shapes = {r: block.shape for r in range(g)}
        counts = [0 if r == me else block.size for r in range(g)]
        displs = [int(v) for v in np.cumsum([0] + counts[:-1])]
        sbuf = placed(block.size * (g - 1), 1)
        rbuf = placed(sbuf.shape)
        out_v = None if alloc else rbuf  # as the other cases: both sides receive into rbuf
        packs = [(block, displs[r], displs[r] + counts[r]) for r in range(g) if r != me]

        def raw_alltoallv():
            # By hand from the same per-peer blocks: pack them into one buffer, as spmdsim must.
            t0 = time.perf_counter()
            for piece, lo, hi in packs:
                sbuf[lo:hi] = piece
            raw.w.call(sub.Alltoallv, sub.Ialltoallv, [sbuf, (counts, displs)],
                       [fresh(rbuf), (counts, displs)])
            raw.add(t0, time.perf_counter())
        specs.append((
            "alltoallv", lambda: C.alltoallv(mesh, sends, shapes, np.float32, out=out_v), raw_alltoallv,
            lambda: np.ascontiguousarray(stacked.reshape(g, g, -1).swapaxes(0, 1)),
        ))
    cases = []
    for op, fn_s, fn_r, fn_n in specs:
        entries: list = []
        cases.append(Case(f"{op} g{g} {size_text(full.nbytes)}", full.nbytes, traced(fn_s, entries),
                          raw.timed(fn_r), fn_n, {"_trace": entries}))
    return cases


# -- redistributions ------------------------------------------------------------------------
def _raw_plan(comm: Any, plan: Any, raw: Raw) -> Callable[[np.ndarray], np.ndarray]:
    """The plan written by hand in mpi4py + numpy: the same collectives and the same local copies.

    What a careful hand-written program does: every receive buffer and
    sub-communicator made once up front, blocks packed with one numpy copy
    where the tensor dim is not the leading one (as spmdsim does), boxes of a
    general exchange packed straight into one Alltoallv buffer and unpacked
    into the new block. `raw` times the same span as spmdsim's trace: packing,
    the MPI call and unpacking for the collectives; the exchange's packing and
    Alltoallv. Returns a function from this rank's source block to its target block.
    """
    from spmdsim.programs.plan.kernels import box_in, local_slice, local_zero
    from spmdsim.programs.plan.volume import intersect, rank_boxes

    rank, shape = comm.Get_rank(), plan.shape
    subs: dict = {}
    steps = []
    for step in plan.steps:
        op = step.op
        if op in ("local_slice", "local_zero"):
            kernel = local_slice if op == "local_slice" else local_zero
            steps.append(lambda x, st=step, k=kernel: k(st, rank, x, shape))
            continue
        before = rank_boxes(step.before, shape)[rank]
        after = rank_boxes(step.after, shape)[rank]
        in_shape = tuple(b - a for a, b in before)
        out_shape = tuple(b - a for a, b in after)
        if op == "exchange":
            steps.append(_raw_exchange(comm, step, rank, in_shape, out_shape, before, after, raw,
                                       box_in, intersect))
            continue
        key = (step.before.layout, step.axes)
        if key not in subs:
            subs[key] = comm.Split(*step.before.layout.split_color_key(rank, step.axes))
        steps.append(_timed_span(raw, _raw_collective(step, subs[key], in_shape, out_shape, raw)))

    def run_all(x: np.ndarray) -> np.ndarray:
        for fn in steps:
            x = fn(x)
        return x
    return run_all


def _raw_collective(step: Any, sub: Any, in_shape: tuple, out_shape: tuple,
                    raw: Raw) -> Callable[[np.ndarray], np.ndarray]:
    """One collective step of a plan by hand on `sub` (its group's communicator): the MPI call on this rank's
    block of `in_shape`, packed before and unpacked after where the tensor dim is not the leading one."""
    from mpi4py import MPI

    op = step.op
    g = sub.Get_size()
    out = placed(out_shape)
    if op == "allgather":
        d = step.tensor_dim
        outer = int(np.prod(in_shape[:d]))
        recv = out if outer == 1 else placed((g,) + in_shape)

        def run(x, sub=sub, out=out, recv=recv, outer=outer, g=g, d=d):
            raw.w.call(sub.Allgather, sub.Iallgather, x, recv)
            if recv is not out:  # blocks side by side -> along tensor dim d
                out.reshape(outer, g, -1)[...] = recv.reshape(g, outer, -1).swapaxes(0, 1)
            return out
    elif op == "alltoall":
        s_, c = step.split_dim, step.concat_dim
        s_outer = int(np.prod(in_shape[:s_]))
        block = in_shape[:s_] + (in_shape[s_] // g,) + in_shape[s_ + 1:]
        c_outer = int(np.prod(block[:c]))
        recv = out if c_outer == 1 else placed((g,) + block)

        def run(x, sub=sub, out=out, recv=recv, s_outer=s_outer, c_outer=c_outer, g=g):
            send = x if s_outer == 1 else np.ascontiguousarray(
                x.reshape(s_outer, g, -1).swapaxes(0, 1))
            raw.w.call(sub.Alltoall, sub.Ialltoall, send, recv)
            if recv is not out:
                out.reshape(c_outer, g, -1)[...] = recv.reshape(g, c_outer, -1).swapaxes(0, 1)
            return out
    elif op == "allreduce":
        def run(x, sub=sub, out=out):
            raw.w.call(sub.Allreduce, sub.Iallreduce, x, out, MPI.SUM)
            return out
    elif op == "reduce_scatter":
        d = step.tensor_dim
        outer = int(np.prod(in_shape[:d]))

        def run(x, sub=sub, out=out, outer=outer, g=g):
            send = x if outer == 1 else np.ascontiguousarray(x.reshape(outer, g, -1).swapaxes(0, 1))
            raw.w.call(sub.Reduce_scatter_block, sub.Ireduce_scatter_block, send, out, MPI.SUM)
            return out
    else:
        raise SystemExit(f"bench: no raw version of plan step {op!r}")
    return run


def _timed_span(raw: Raw, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """`fn` with its whole span (packing, MPI, unpacking) counted as communication, like the trace."""
    def call(x: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        y = fn(x)
        raw.add(t0, time.perf_counter())
        return y
    return call


def _raw_exchange(comm: Any, step: Any, rank: int, in_shape: tuple, out_shape: tuple,
                  before: tuple, after: tuple, raw: Raw, box_in: Any, intersect: Any) -> Callable:
    """A general exchange by hand: pack every outgoing box into one buffer, Alltoallv, unpack."""
    size = comm.Get_size()
    scount, rcount = [0] * size, [0] * size
    sends, recvs = [], []
    for src, dst, box, _, _ in step.transfers:
        n = int(np.prod([b - a for a, b in box]))
        if src == rank:
            sends.append((dst, box_in(box, before), n))
            scount[dst] += n
        if dst == rank:
            recvs.append((src, box_in(box, after), tuple(b - a for a, b in box), n))
            rcount[src] += n
    sd = [int(v) for v in np.cumsum([0] + scount[:-1])]
    rd = [int(v) for v in np.cumsum([0] + rcount[:-1])]
    sbuf, rbuf = placed(sum(scount)), placed(sum(rcount))
    out = placed(out_shape)
    common = intersect(before, after)
    own = None if common is None else (box_in(common, after), box_in(common, before))
    offset = {dst: sd[dst] for dst in range(size)}
    packs = []
    for dst, where, n in sends:
        packs.append((where, offset[dst], n))
        offset[dst] += n
    offset = {src: rd[src] for src in range(size)}
    unpacks = []
    for src, where, box_shape, n in recvs:
        unpacks.append((where, offset[src], n, box_shape))
        offset[src] += n

    # As spmdsim: a block that goes whole to one peer is sent as it lies, and a new block that
    # arrives whole from one peer is received in place (no packing or unpacking copy).
    send_whole = len(packs) == 1 and packs[0][2] == int(np.prod(in_shape))
    recv_whole = own is None and len(unpacks) == 1 and unpacks[0][3] == tuple(out_shape)

    def run(x: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        if send_whole:
            send = x.reshape(-1)
        else:
            send = sbuf
            for where, at, n in packs:
                piece = x[where]
                sbuf[at:at + n].reshape(piece.shape)[...] = piece
        recv = out.reshape(-1) if recv_whole else rbuf
        raw.w.call(comm.Alltoallv, comm.Ialltoallv, [send, (scount, sd)], [recv, (rcount, rd)])
        raw.add(t0, time.perf_counter())
        if recv_whole:
            return out
        if own is not None:
            out[own[0]] = x[own[1]]
        for where, at, n, box_shape in unpacks:
            out[where] = rbuf[at:at + n].reshape(box_shape)
        return out
    return run


def redistribute_cases(comm: Any, waiter: Waiter, wait: str, shape: tuple[int, int]) -> list[Case]:
    from spmdsim.programs.plan import plan_redistribution
    from spmdsim.runtime.executor import redistribute
    from spmdsim import DTensor, Mesh

    world = comm.Get_size()
    one = Layout((world,), ("x",))
    specs = [
        ("S(0)->B", one, ("x", None), (), (None, None), ()),
        ("S(0)->S(1)", one, ("x", None), (), (None, "x"), ()),
        ("P->B", one, (None, None), ("x",), (None, None), ()),
        ("P->S(0)", one, (None, None), ("x",), ("x", None), ()),
        ("B->S(0)", one, (None, None), (), ("x", None), ()),
    ]
    if world >= 4 and world % 2 == 0:
        two = Layout((2, world // 2), ("dp", "mp"))
        specs += [
            ("2d S(0)[dp,mp]->S(0)[mp,dp]", two, (("dp", "mp"), None), (),
             (("mp", "dp"), None), ()),
            ("2d S(0)[dp]S(1)[mp]->S(1)[dp]S(0)[mp]", two, ("dp", "mp"), (), ("mp", "dp"), ()),
        ]
    source = SeededTensor(shape, "float32", seed=7)
    full = source.full() if comm.Get_rank() == 0 else None
    cases = []
    meshes: dict = {}
    for name, layout, src_map, src_partial, dst_map, dst_partial in specs:
        if layout not in meshes:
            meshes[layout] = Mesh(layout, comm, wait=wait)
        mesh = meshes[layout]
        src = layout(*src_map, partial=src_partial)
        dst = layout(*dst_map, partial=dst_partial)
        if src_partial:  # a pending sum: every rank holds a full-size addend
            x = DTensor(mesh, source.region(src.slices(mesh.rank, shape)), src, shape)
        else:
            x = DTensor.from_seeded(mesh, src, source)
        plan = plan_redistribution(src, dst, shape, "float32")
        raw = Raw(waiter)
        raw_plan = _raw_plan(comm, plan, raw)
        # The hand-written version must compute what spmdsim computes, or the race is void.
        if not np.array_equal(raw_plan(x.local), redistribute(x, dst).local):
            raise SystemExit(f"bench: the raw version of {name} computes another result")
        raw_fn = (lambda raw_plan=raw_plan, x=x: raw_plan(x.local))
        entries: list = []
        kinds = "+".join(s.op for s in plan.steps) or "none"
        local_bytes = x.local.nbytes

        def numpy_fn(full=full, dst=dst, layout=layout, partial=bool(src_partial)):
            # The same data movement in one process: every target shard cut from the source.
            total = full * layout.num_devices if partial else full
            return [np.ascontiguousarray(total[dst.slices(r, shape)])
                    for r in range(layout.num_devices)]

        cases.append(Case(f"redist {name} {size_text(local_bytes)}", local_bytes,
                          traced(lambda x=x, dst=dst: redistribute(x, dst), entries),
                          raw.timed(raw_fn), numpy_fn, {"_trace": entries, "plan": kinds}))
    return cases
