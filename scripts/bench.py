#!/usr/bin/env python
"""Benchmark spmdsim against raw mpi4py and single-process numpy, interleaved.

Run under MPI (8 ranks is the reference setup); every mpiexec under a timeout:

    timeout -k 5 120 mpiexec -n 8 python scripts/bench.py --quick
    timeout -k 5 900 mpiexec -n 8 python scripts/bench.py --json bench.json
    timeout -k 5 600 mpiexec -n 8 python scripts/bench.py --suite ops --repeats 9

Suites: ``collectives`` (each runtime collective), ``redistribute`` (plan_exec
redistributions, one per kind of plan step) and ``ops`` (MatMul, column/row
Linear, the fused MLP, vocab-parallel Embedding). Every case runs three
contenders in turn, in a rotating order, after a barrier: spmdsim, raw mpi4py
(the same collectives on preallocated buffers of the same sizes; for ops the
same local numpy work too; its buffers placed in the page as spmdsim places
its own, spmdsim.buffers) and numpy in one process (rank 0 alone, the whole
op). A time is the median over repeats (after warm-up) of the slowest rank.
``comm`` columns are the time inside collectives (spmdsim's trace; the raw
code's own timers); ``model`` is spmdsim.cost's prediction for those calls.
Peak RSS is ru_maxrss, the largest over ranks, so far in the run.

``--aa`` is the A/A control: every case is built twice and the spmdsim slot
runs the second copy's raw code, with its own buffers, against the first's.
Its ratios are what the harness and buffer placement alone make of identical
code: a spmdsim ratio inside that spread is not spmdsim's doing.
"""
from __future__ import annotations

import os

# One BLAS thread per rank: 8 ranks already oversubscribe the cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import numpy as np  # noqa: E402

from spmdsim import Layout, SeededTensor, buffers  # noqa: E402
from spmdsim.cli.calibrate import Waiter, parse_size  # noqa: E402
from spmdsim.cost import CostModel, load_or_default, predict_plan  # noqa: E402
from spmdsim.errors import RuntimeMismatchError, SpmdsimError  # noqa: E402
from spmdsim.runtime.guard import run_guarded  # noqa: E402

# The shared argument types live beside this file (on sys.path when the script runs;
# added for imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import (ArgumentParser, byte_sizes, existing_file, int_at_least,  # noqa: E402
                         output_path)

SUITES = ("collectives", "redistribute", "ops", "overhead")
KEYS = ("name", "bytes_per_rank", "spmdsim_s", "raw_s", "numpy_s", "ratio_vs_raw", "peak_rss_bytes")


@dataclass
class Case:
    """One benchmark: three callables doing the same work. spmdsim/raw return comm seconds."""

    name: str
    bytes_per_rank: int
    spmdsim: Callable[[], Optional[float]]
    raw: Callable[[], Optional[float]]
    numpy: Optional[Callable[[], Any]] = None
    extra: dict = field(default_factory=dict)


def peak_rss() -> int:
    """This process's peak resident set size in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def traced(fn: Callable[[], Any], sink: list) -> Callable[[], tuple]:
    """Run fn; return (seconds in collectives, their spans), keep the first call's entries.

    run_case keeps one trace open around the whole case, so no collector is
    opened per call: opening one right before the collective would time the
    harness, not spmdsim (it moved 1 MiB results by 5-11% at 8 ranks on 2 cores).
    """
    from spmdsim.runtime.trace import OPEN_TRACES

    def call() -> float:
        tr = OPEN_TRACES[-1]
        start = len(tr)
        fn()
        if not sink:
            sink.extend(tr.entries[start:])
        return tr.seconds(start), tr.spans(start)

    return call


class Raw:
    """Raw mpi4py helpers on a communicator with the benchmark's wait mode; times comm.

    Every timed span (a collective, with its packing where spmdsim's trace
    counts packing too) goes through `add`, as (start, end) perf_counter pairs.
    """

    def __init__(self, waiter: Waiter) -> None:
        self.w = waiter
        self.comm_s = 0.0
        self.spans: list[tuple[float, float]] = []

    def add(self, t0: float, t1: float) -> None:
        self.comm_s += t1 - t0
        self.spans.append((t0, t1))

    def __call__(self, blocking: Callable, nonblocking: Callable, *args: Any) -> None:
        t0 = time.perf_counter()
        self.w.call(blocking, nonblocking, *args)
        self.add(t0, time.perf_counter())

    def timed(self, fn: Callable[[], Any]) -> Callable[[], tuple]:
        def call() -> tuple:
            self.comm_s, self.spans = 0.0, []
            fn()
            return self.comm_s, self.spans
        return call


def _run_reps(comm: Any, waiter: Waiter, case: Case, warmup: int, repeats: int, names: list,
              total: np.ndarray, comm_t: np.ndarray, spans: list) -> None:
    """The interleaved repeats of run_case: fills total[contender, repeat], comm_t and spans."""
    rank = comm.Get_rank()
    for rep in range(-warmup, repeats):
        # spmdsim and raw swap places every repeat; numpy (rank 0 alone) comes last, so
        # neither MPI contender always follows it (ranks wake slowly from a polite wait).
        order = (["spmdsim", "raw"] if rep % 2 == 0 else ["raw", "spmdsim"]) + names[2:]
        for name in order:
            i = names.index(name)
            waiter.barrier(comm)
            if name != "numpy":
                waiter.barrier(comm)  # a second, hot barrier: all ranks start together
            t0 = time.perf_counter()
            inner = None
            if name == "numpy":
                if rank == 0:
                    case.numpy()
            else:
                inner = getattr(case, name)()
            elapsed = time.perf_counter() - t0
            if rep >= 0:
                total[i, rep] = elapsed
                if inner is not None:
                    comm_t[i, rep], spans[i][rep] = inner


def run_case(comm: Any, waiter: Waiter, case: Case, warmup: int, repeats: int) -> dict:
    """Interleaved timing of one case; slowest rank per repeat, median over repeats."""
    names = ["spmdsim", "raw"] + (["numpy"] if case.numpy is not None else [])
    repeats += repeats % 2  # an even count: each MPI contender goes first equally often
    total = np.zeros((3, repeats))
    comm_t = np.zeros((2, repeats))
    from spmdsim.runtime import collect_trace

    spans: list = [[[] for _ in range(repeats)] for _ in range(2)]
    with collect_trace():  # read by traced(); raw and numpy record nothing
        _run_reps(comm, waiter, case, warmup, repeats, names, total, comm_t, spans)
    from mpi4py import MPI

    both = np.concatenate([total, comm_t])
    slowest = np.empty_like(both)
    comm.Allreduce(both, slowest, MPI.MAX)
    med = [statistics.median(row) for row in slowest]
    rss = comm.allreduce(peak_rss(), op=MPI.MAX)
    rec = {
        "name": case.name,
        "bytes_per_rank": int(case.bytes_per_rank),
        "spmdsim_s": med[0],
        "raw_s": med[1],
        "numpy_s": med[2] if case.numpy is not None else None,
        "ratio_vs_raw": med[0] / med[1] if med[1] > 0 else None,
        "peak_rss_bytes": int(rss),
        "spmdsim_comm_s": med[3],
        "raw_comm_s": med[4],
        "comm_ratio_vs_raw": med[3] / med[4] if med[4] > 0 else None,
    }
    for who, contender in ((0, "spmdsim"), (1, "raw")):
        rec[f"{contender}_comm_after_arrival_s"] = after_arrival_s(comm, spans[who])
    rec.update(case.extra)
    return rec


def after_arrival_s(comm: Any, spans: list) -> Optional[float]:
    """Median over repeats of the time collectives took after their last rank arrived.

    `spans[rep]` holds this rank's (start, end) per collective call of one
    repeat. A call cannot finish before its last member starts it, so
    ``end - max over ranks of start`` is its time without the wait for late
    ranks (load imbalance, scheduling); summed over the calls, the slowest
    rank per repeat, median. None when the ranks made different numbers of
    calls (the spans would not line up). perf_counter is CLOCK_MONOTONIC,
    one clock for every rank on a machine.
    """
    from mpi4py import MPI

    counts = {len(s) for s in spans}
    k = counts.pop() if len(counts) == 1 else -1
    if comm.allreduce(k, op=MPI.MIN) != comm.allreduce(k, op=MPI.MAX) or k <= 0:
        return None
    pairs = np.asarray(spans, dtype=np.float64)  # (repeats, k, 2)
    starts = np.ascontiguousarray(pairs[:, :, 0])
    last = np.empty_like(starts)
    comm.Allreduce(starts, last, MPI.MAX)
    mine = np.clip(pairs[:, :, 1] - last, 0.0, None).sum(axis=1)
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, MPI.MAX)
    return float(np.median(slowest))


# -- collectives --------------------------------------------------------------------------
def collective_cases(comm: Any, waiter: Waiter, wait: str, sizes: list[int],
                     alloc: bool = False) -> list[Case]:
    from spmdsim.runtime import Mesh

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
    full, part = _placed((rows, cols), 1), _placed((rows // g, cols), 1)
    kept_full, kept_part = _placed(full.shape), _placed(part.shape)

    def fresh(kept: np.ndarray) -> np.ndarray:
        return _placed(kept.shape) if alloc else kept
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
        sbuf = _placed(block.size * (g - 1), 1)
        rbuf = _placed(sbuf.shape)
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
        cases.append(Case(f"{op} g{g} {_size(full.nbytes)}", full.nbytes, traced(fn_s, entries),
                          raw.timed(fn_r), fn_n, {"_trace": entries}))
    return cases


def _placed(shape: Any, fill: Optional[float] = None) -> np.ndarray:
    """A float32 buffer for the raw code, placed in the page as spmdsim places its own.

    Both sides then start from the same placement (spmdsim.buffers): a ratio
    measures spmdsim's work, not which side the heap happened to favour.
    """
    return buffers.empty(shape, np.float32) if fill is None else buffers.full(shape, fill, np.float32)


def _size(n: float) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"


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
    from mpi4py import MPI

    from spmdsim.plan.kernels import box_in, local_slice, local_zero
    from spmdsim.plan.volume import intersect, rank_boxes

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
        sub = subs[key]
        g = sub.Get_size()
        out = _placed(out_shape)
        if op == "allgather":
            d = step.tensor_dim
            outer = int(np.prod(in_shape[:d]))
            recv = out if outer == 1 else _placed((g,) + in_shape)

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
            recv = out if c_outer == 1 else _placed((g,) + block)

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
        steps.append(_timed_span(raw, run))

    def run_all(x: np.ndarray) -> np.ndarray:
        for fn in steps:
            x = fn(x)
        return x
    return run_all


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
    for src, dst, box in step.transfers:
        n = int(np.prod([b - a for a, b in box]))
        if src == rank:
            sends.append((dst, box_in(box, before), n))
            scount[dst] += n
        if dst == rank:
            recvs.append((src, box_in(box, after), tuple(b - a for a, b in box), n))
            rcount[src] += n
    sd = [int(v) for v in np.cumsum([0] + scount[:-1])]
    rd = [int(v) for v in np.cumsum([0] + rcount[:-1])]
    sbuf, rbuf = _placed(sum(scount)), _placed(sum(rcount))
    out = _placed(out_shape)
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

    def run(x: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        for where, at, n in packs:
            piece = x[where]
            sbuf[at:at + n].reshape(piece.shape)[...] = piece
        raw.w.call(comm.Alltoallv, comm.Ialltoallv, [sbuf, (scount, sd)], [rbuf, (rcount, rd)])
        raw.add(t0, time.perf_counter())
        if own is not None:
            out[own[0]] = x[own[1]]
        for where, at, n, box_shape in unpacks:
            out[where] = rbuf[at:at + n].reshape(box_shape)
        return out
    return run


def redistribute_cases(comm: Any, waiter: Waiter, wait: str, shape: tuple[int, int]) -> list[Case]:
    from spmdsim.plan import plan_redistribution
    from spmdsim.plan_exec import redistribute
    from spmdsim.runtime import DTensor, Mesh

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

        cases.append(Case(f"redist {name} {_size(local_bytes)}", local_bytes,
                          traced(lambda x=x, dst=dst: redistribute(x, dst), entries),
                          raw.timed(raw_fn), numpy_fn, {"_trace": entries, "plan": kinds}))
    return cases


# -- operators ------------------------------------------------------------------------------
def op_cases(comm: Any, waiter: Waiter, wait: str, sz: dict) -> list[Case]:
    from mpi4py import MPI
    from spmdsim.ops import (ColumnParallelLinear, ParallelMLP, RowParallelLinear,
                             VocabParallelEmbedding, matmul)
    from spmdsim.reference import gelu
    from spmdsim.runtime import DTensor, Mesh

    world, rank = comm.Get_size(), comm.Get_rank()
    layout = Layout((world,), ("x",))
    mesh = Mesh(layout, comm, wait=wait)
    SUM = MPI.SUM
    root = rank == 0
    cases = []

    def add(name: str, nbytes: int, fn_s, fn_r, raw: Raw, fn_n) -> None:
        # The raw code must compute what spmdsim computes: compare once (also a warm-up).
        got, want = fn_r(), fn_s().local
        if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"bench: raw version of {name!r} differs from spmdsim on rank {rank}")
        entries: list = []
        cases.append(Case(name, nbytes, traced(fn_s, entries), raw.timed(fn_r), fn_n,
                          {"_trace": entries}))

    # MatMul: X (m, m) split on K (columns), W (m, m) split on K (rows): Allreduce of (m, m).
    m = sz["matmul"]
    xs, ws = SeededTensor((m, m), seed=1), SeededTensor((m, m), seed=2)
    X = DTensor.from_seeded(mesh, layout(None, "x"), xs)
    W = DTensor.from_seeded(mesh, layout("x", None), ws)
    raw = Raw(waiter)
    part, out = _placed((m, m)), _placed((m, m))
    xf, wf = (xs.full(), ws.full()) if root else (None, None)

    def raw_matmul(xl=X.local, wl=W.local, raw=raw):
        np.matmul(xl, wl, out=part)
        raw(comm.Allreduce, comm.Iallreduce, part, out, SUM)
        return out
    add(f"matmul {m}x{m} K-split", part.nbytes, lambda: matmul(X, W), raw_matmul, raw,
        lambda xf=xf, wf=wf: xf @ wf)

    # Column-parallel Linear in -> out, batch b; gathered output (Allgather on columns).
    b, d_in, d_out = sz["batch"], sz["hidden"], sz["ffn"]
    xsrc = SeededTensor((b, d_in), seed=3)
    xin = DTensor.from_seeded(mesh, layout(None, None), xsrc)
    xin_f = xsrc.full()
    for gather in (False, True):
        col = ColumnParallelLinear(mesh, d_in, d_out, gather_output=gather, seed=10)
        wl, bl = col.weight.local, col.bias.local
        wf, bf = (col.weight_source.full(), col.bias_source.full()) if root else (None, None)
        raw = Raw(waiter)
        blocks = _placed((world, b, d_out // world))
        y = _placed((b, wl.shape[1]))

        def raw_col(wl=wl, bl=bl, gather=gather, y=y, blocks=blocks, raw=raw):
            np.matmul(xin.local, wl, out=y)
            y += bl
            if gather:  # the unpack is timed with the Allgather, as spmdsim's trace times it
                t0 = time.perf_counter()
                raw.w.call(comm.Allgather, comm.Iallgather, y, blocks)
                full = np.ascontiguousarray(blocks.transpose(1, 0, 2)).reshape(b, d_out)
                raw.add(t0, time.perf_counter())
                return full
            return y
        tag = "gather" if gather else "split"
        add(f"column_linear {d_in}->{d_out} b{b} {tag}", b * d_out * 4 if gather else 0,
            lambda col=col: col(xin), raw_col, raw, lambda wf=wf, bf=bf: xin_f @ wf + bf)

    # Row-parallel Linear out -> in, input already split on its last dim: Allreduce of (b, in).
    row = RowParallelLinear(mesh, d_out, d_in, input_is_parallel=True, seed=20)
    hsrc = SeededTensor((b, d_out), seed=4)
    h = DTensor.from_seeded(mesh, layout(None, "x"), hsrc)
    hf = hsrc.full() if root else None
    rwf, rbf = (row.weight_source.full(), row.bias_source.full()) if root else (None, None)
    raw = Raw(waiter)
    rpart, rout = _placed((b, d_in)), _placed((b, d_in))

    def raw_row(wl=row.weight.local, bl=row.bias.local, raw=raw):
        np.matmul(h.local, wl, out=rpart)
        raw(comm.Allreduce, comm.Iallreduce, rpart, rout, SUM)
        np.add(rout, bl, out=rout)
        return rout
    add(f"row_linear {d_out}->{d_in} b{b}", rpart.nbytes, lambda: row(h), raw_row, raw,
        lambda: hf @ rwf + rbf)

    # Fused MLP: column (no gather) -> gelu -> row, one Allreduce.
    mlp = ParallelMLP(mesh, d_in, d_out, seed=30)
    f1, f2 = mlp.linear_fc1, mlp.linear_fc2
    full_w = ([s.full() for s in (f1.weight_source, f1.bias_source, f2.weight_source,
                                  f2.bias_source)] if root else None)
    raw = Raw(waiter)
    mpart, mout = _placed((b, d_in)), _placed((b, d_in))

    def raw_mlp(raw=raw):
        hid = gelu(xin.local @ f1.weight.local + f1.bias.local)
        np.matmul(hid, f2.weight.local, out=mpart)
        raw(comm.Allreduce, comm.Iallreduce, mpart, mout, SUM)
        np.add(mout, f2.bias.local, out=mout)
        return mout

    def numpy_mlp():
        w1, b1, w2, b2 = full_w
        return gelu(xin_f @ w1 + b1) @ w2 + b2
    add(f"mlp {d_in}->{d_out}->{d_in} b{b}", mpart.nbytes, lambda: mlp(xin), raw_mlp, raw,
        numpy_mlp)

    # Vocab-parallel Embedding (N, M): masked local lookup, Allreduce of (tokens, M).
    vocab, dim, tokens = sz["vocab"], sz["emb_dim"], sz["tokens"]
    emb = VocabParallelEmbedding(mesh, vocab, dim, seed=40)
    idsrc = SeededTensor((tokens,), "int64", seed=5, low=0, high=vocab)
    ids = DTensor.from_seeded(mesh, layout(None), idsrc)
    table_f = emb.weight_source.full() if root else None
    ids_f = idsrc.full()
    raw = Raw(waiter)
    eout, looked = _placed((tokens, dim)), _placed((tokens, dim))
    padded, start, stop = emb.padded_weight, emb.vocab_start_index, emb.vocab_end_index

    def raw_emb(raw=raw):
        owned = (ids.local >= start) & (ids.local < stop)
        np.take(padded, np.where(owned, ids.local - start, stop - start), axis=0, out=looked,
                mode="clip")
        raw(comm.Allreduce, comm.Iallreduce, looked, eout, SUM)
        return eout
    add(f"vocab_embedding {vocab}x{dim} t{tokens}", eout.nbytes, lambda: emb(ids), raw_emb, raw,
        lambda: table_f[ids_f])
    return cases


# -- Python overhead of the hot paths ------------------------------------------------------------
def _per_call(fn: Callable[[], Any], loops: int, rounds: int = 5) -> float:
    """Best-of-rounds seconds per call (the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
    return best


def overhead_records(comm: Any, wait: str, loops: int, profile: bool) -> list[dict]:
    """Per-call cost of spmdsim's hot paths on tiny messages, against the raw call.

    Pieces that do not communicate are timed on each rank alone (best of 5);
    the tiny collectives run `loops` times in a row on all ranks (slowest rank).
    Run with few ranks (2) so that MPI latency, not scheduling, is the floor.
    """
    from mpi4py import MPI
    from spmdsim.ops import matmul
    from spmdsim.plan import plan_redistribution
    from spmdsim.plan_exec import redistribute
    from spmdsim.runtime import DTensor, Mesh, collect_trace
    from spmdsim.runtime import collectives as C
    from spmdsim.runtime.trace import record

    world = comm.Get_size()
    layout = Layout((world,), ("x",))
    mesh = Mesh(layout, comm, wait=wait)
    sub, g, _ = mesh.group_info(("x",))
    tiny = np.ones(world, np.float32)
    out = np.empty_like(tiny)
    src, dst = layout("x", None), layout(None, None)
    x = DTensor.from_seeded(mesh, src, SeededTensor((world, 4), seed=1))
    plan = plan_redistribution(src, dst, (world, 4), "float32")
    gathered = np.empty((world, 4), np.float32)
    X = DTensor.from_seeded(mesh, layout(None, "x"), SeededTensor((4, world), seed=2))
    W = DTensor.from_seeded(mesh, layout("x", None), SeededTensor((world, 4), seed=3))
    part, res = np.empty((4, 4), np.float32), np.empty((4, 4), np.float32)
    SUM = MPI.SUM
    waiter = Waiter(comm, wait)
    w = waiter.call

    local = [  # (name, spmdsim piece, the raw equivalent or None)
        ("mesh.group_info (sub-communicator lookup)", lambda: mesh.group_info(("x",)), None),
        ("mesh.group_info('x') (str axes)", lambda: mesh.group_info("x"), None),
        ("plan_redistribution (cached plan lookup)",
         lambda: plan_redistribution(src, dst, (world, 4), "float32"), None),
        ("TensorLayout hash (cache key)", lambda: hash(src), None),
        ("DTensor(...) construction + validation",
         lambda: DTensor(mesh, x.local, src, (world, 4)), None),
        ("_contig + np.empty_like (buffer prep)",
         lambda: np.empty_like(C._contig(tiny)), lambda: np.empty_like(tiny)),
        ("trace.record, no trace open",
         lambda: record("allreduce", ("x",), g, 4, 4, 0.0, None), None),
    ]

    def record_in_trace():
        with collect_trace():
            record("allreduce", ("x",), g, 4, 4, 0.0, None)
    local.append(("collect_trace() + record", record_in_trace, None))

    def lazy_import():
        from spmdsim.runtime import DTensor as _  # noqa: F401  (as ops do on every call)
    from spmdsim.ops._common import make_dtensor
    from spmdsim.ops.matmul import plan_matmul
    from spmdsim.plan import planner as _planner
    from spmdsim.plan.steps import step_label
    step = plan.steps[0]
    local += [
        ("function-level 'from ..runtime import DTensor'", lazy_import, None),
        ("plan_matmul (cached on layouts and shapes)", lambda: plan_matmul(X, W), None),
        ("make_dtensor (result wrapping)", lambda: make_dtensor(mesh, part, dst, (4, 4)), None),
        ("step_label (trace label string)", lambda: step_label(step, 1), None),
        ("  of which: planner._plan lru_cache hit",
         lambda: _planner._plan(src, dst, (world, 4), "float32"), None),
        ("  of which: TensorLayout.check_shape", lambda: src.check_shape((world, 4)), None),
        ("  of which: TensorLayout.local_shape", lambda: src.local_shape((world, 4)), None),
        ("  of which: np.dtype('float32').name", lambda: np.dtype("float32").name, None),
    ]

    def raw_matmul():
        np.matmul(X.local, W.local, out=part)
        w(sub.Allreduce, sub.Iallreduce, part, res, SUM)

    collective = [
        ("allreduce 4 floats", lambda: C.allreduce(mesh, tiny, ("x",)),
         lambda: w(sub.Allreduce, sub.Iallreduce, tiny, out, SUM)),
        ("allgather 1 float", lambda: C.allgather(mesh, tiny[:1], ("x",), 0),
         lambda: w(sub.Allgather, sub.Iallgather, tiny[:1], out)),
        ("redistribute S(0)->B (plan cached)", lambda: redistribute(x, dst),
         lambda: w(sub.Allgather, sub.Iallgather, x.local, gathered)),
        ("redistribute with a given plan", lambda: redistribute(x, dst, plan),
         lambda: w(sub.Allgather, sub.Iallgather, x.local, gathered)),
        ("matmul 4x4 K-split", lambda: matmul(X, W), raw_matmul),
    ]
    records = []
    for name, fn, raw in local:
        t_s = _per_call(fn, loops)
        t_r = _per_call(raw, loops) if raw else None
        records.append(_overhead_rec(comm, name, t_s, t_r, local=True))
    for name, fn, raw in collective:
        times = []
        for f in (fn, raw):
            for _ in range(20):
                f()
            waiter.barrier(comm)
            times.append(_per_call(f, loops))
        records.append(_overhead_rec(comm, name, *times))
    if profile and comm.Get_rank() == 0:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    for _ in range(loops):
        redistribute(x, dst)
        matmul(X, W)
        C.allreduce(mesh, tiny, ("x",))
    if profile and comm.Get_rank() == 0:
        prof.disable()
        print(f"cProfile of {loops} x (redistribute + matmul + allreduce), rank 0:")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(18)
    return records


def _overhead_rec(comm: Any, name: str, t_s: float, t_r: Optional[float],
                  local: bool = False) -> dict:
    """A record; local pieces take the least disturbed rank, collectives the slowest."""
    from mpi4py import MPI

    op = MPI.MIN if local else MPI.MAX
    t_s = comm.allreduce(t_s, op=op)
    t_r = None if t_r is None else comm.allreduce(t_r, op=op)
    return {"name": name, "bytes_per_rank": 0, "spmdsim_s": t_s, "raw_s": t_r, "numpy_s": None,
            "ratio_vs_raw": None if not t_r else t_s / t_r, "peak_rss_bytes":
            comm.allreduce(peak_rss(), op=MPI.MAX),
            "overhead_us": None if t_r is None else (t_s - t_r) * 1e6, "suite": "overhead"}


def overhead_table(records: list[dict]) -> str:
    lines = [f"{'hot path (per call)':<46}{'spmdsim us':>11}{'raw us':>9}"
             f"{'extra us':>10}{'ratio':>7}", "-" * 83]
    for r in records:
        raw = "-" if r["raw_s"] is None else f"{r['raw_s'] * 1e6:.2f}"
        extra = "-" if r["overhead_us"] is None else f"{r['overhead_us']:.2f}"
        ratio = "-" if r["ratio_vs_raw"] is None else f"{r['ratio_vs_raw']:.2f}"
        lines.append(f"{r['name']:<46}{r['spmdsim_s'] * 1e6:>11.2f}{raw:>9}{extra:>10}{ratio:>7}")
    return "\n".join(lines)


# -- driver ---------------------------------------------------------------------------------
FULL = dict(coll_sizes="64K,1M,8M", redist_shape=(4096, 1024), matmul=2048, batch=64,
            hidden=1024, ffn=4096, vocab=32000, emb_dim=1024, tokens=2048, repeats=7, warmup=2)
QUICK = dict(coll_sizes="16K", redist_shape=(256, 64), matmul=256, batch=8, hidden=128, ffn=512,
             vocab=1000, emb_dim=64, tokens=64, repeats=2, warmup=1)


def predicted_s(entries: list, model: CostModel) -> float:
    return sum(p.seconds for p in predict_plan(entries, model)) if entries else 0.0


def table(records: list[dict]) -> str:
    head = (f"{'case':<44}{'bytes/rk':>9}{'spmdsim':>9}{'raw':>9}{'numpy':>9}{'ratio':>7}"
            f"{'comm':>9}{'rawcomm':>9}{'cratio':>7}{'rawarr':>9}{'model':>9}{'RSS MiB':>8}")
    lines = [head, "-" * len(head)]
    ms = lambda v: "-" if v is None else f"{v * 1e3:.2f}"  # noqa: E731
    rt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in records:
        lines.append(
            f"{r['name'][:43]:<44}{_size(r['bytes_per_rank']):>9}{ms(r['spmdsim_s']):>9}"
            f"{ms(r['raw_s']):>9}{ms(r['numpy_s']):>9}{rt(r['ratio_vs_raw']):>7}"
            f"{ms(r['spmdsim_comm_s']):>9}{ms(r['raw_comm_s']):>9}{rt(r['comm_ratio_vs_raw']):>7}"
            f"{ms(r.get('raw_comm_after_arrival_s')):>9}"
            f"{ms(r['predicted_comm_s']):>9}{r['peak_rss_bytes'] / 2**20:>8.0f}")
    lines.append("times in ms: median over repeats of the slowest rank; comm = time inside "
                 "collectives; rawarr = raw comm after the last rank arrived (no load-imbalance "
                 "wait); model = spmdsim.cost prediction of those collectives")
    return "\n".join(lines)


def suite_cases(suite: str, comm: Any, waiter: Waiter, cfg: dict, args: argparse.Namespace) -> list[Case]:
    """The cases of one timed suite, built now (buffers, meshes, seeded tensors)."""
    if suite == "collectives":
        sizes = args.sizes or [parse_size(s) for s in cfg["coll_sizes"].split(",")]
        return collective_cases(comm, waiter, waiter.mode, sizes, args.alloc)
    if suite == "redistribute":
        return redistribute_cases(comm, waiter, waiter.mode, cfg["redist_shape"])
    return op_cases(comm, waiter, waiter.mode, cfg)


def aa_case(first: Case, twin: Case) -> Case:
    """`first` with the spmdsim slot running `twin`'s raw code (the A/A control)."""
    if twin.name != first.name:
        raise SystemExit(f"bench: --aa built {twin.name!r} where {first.name!r} was expected")
    return Case(first.name, first.bytes_per_rank, twin.raw, first.raw, first.numpy,
                {**first.extra, "_trace": [], "aa": True})


def split_dims(suite: str, cfg: dict) -> tuple[int, ...]:
    """The sizes the suite's cases split over all ranks (the rank count must divide each)."""
    return {"redistribute": tuple(cfg["redist_shape"]),
            "ops": (cfg["matmul"], cfg["ffn"], cfg["vocab"])}.get(suite, ())


def check_world(suites: list[str], cfg: dict, world: int) -> None:
    """Refuse a rank count some suite cannot use, before any suite runs (not halfway through)."""
    for suite in suites:
        dims = split_dims(suite, cfg)
        if any(d % world for d in dims):
            raise RuntimeMismatchError(
                f"the {suite} suite cannot run on {world} ranks: it splits sizes {dims} "
                f"over all ranks; expected a rank count that divides {math.gcd(*dims)} "
                "(or leave the suite out with --suite)")


def _suite_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SUITES]
    if bad or not names:
        what = f"unknown suite {bad[0]!r}" if bad else f"{text!r} names no suite"
        raise argparse.ArgumentTypeError(f"{what}; expected a comma list of {', '.join(SUITES)}")
    return names


def _json_target(text: str) -> str:
    return text if text == "-" else output_path(text)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(
        description=__doc__,
        epilog="run under MPI with a timeout, e.g.: timeout -k 5 120 mpiexec -n 8 python "
               "scripts/bench.py --quick   |   timeout -k 5 900 mpiexec -n 8 python "
               "scripts/bench.py --json bench.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (smoke test)")
    p.add_argument("--suite", type=_suite_list, default=",".join(SUITES[:3]),
                   help=f"comma list of {SUITES} (default: the first three)")
    p.add_argument("--loops", type=int_at_least(1), default=2000,
                   help="calls per timing in the overhead suite (default 2000)")
    p.add_argument("--profile", action="store_true",
                   help="overhead suite: also print a cProfile of the tiny-message loop")
    p.add_argument("--sizes", type=byte_sizes(1), default=None,
                   help="collective buffer sizes, e.g. 64K,1M,8M")
    p.add_argument("--repeats", type=int_at_least(1), default=None)
    p.add_argument("--warmup", type=int_at_least(0), default=None)
    p.add_argument("--wait", choices=("busy", "polite", "auto"), default=None,
                   help="wait mode of spmdsim's mesh and the raw code (default $SPMDSIM_WAIT/auto)")
    p.add_argument("--cost-file", type=existing_file, default=None,
                   help="cost model JSON (default: the saved calibration, else the built-in model)")
    p.add_argument("--alloc", action="store_true",
                   help="collectives suite: both sides allocate a fresh result per call "
                        "(default: both receive into the same preallocated buffers)")
    p.add_argument("--aa", action="store_true",
                   help="A/A control: the spmdsim slot runs a separately built copy of the raw code")
    p.add_argument("--json", type=_json_target, default=None,
                   help="write the records to this file ('-' = stdout)")
    p.add_argument("--filter", default=None,
                   help="only cases whose name contains this text (timed suites)")
    args = p.parse_args(argv)
    if args.filter and set(args.suite) == {"overhead"}:
        p.error(f"--filter {args.filter!r} selects cases of the timed suites; "
                "the overhead suite has none to select")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    return run_guarded(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """The benchmark for parsed `args` (collective: every rank calls it)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    cfg = dict(QUICK if args.quick else FULL)
    repeats = args.repeats or cfg["repeats"]
    warmup = cfg["warmup"] if args.warmup is None else args.warmup
    suites = args.suite
    check_world(suites, cfg, comm.Get_size())
    # A named file must load (a missing one is an error, not the built-in model).
    model = CostModel.load(args.cost_file) if args.cost_file else load_or_default()
    waiter = Waiter(comm, args.wait)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if rank == 0 else (lambda m: None)
    say(f"bench: {comm.Get_size()} ranks, wait={waiter.mode}, repeats={repeats}, "
        f"warmup={warmup}, model {model}")
    if args.aa:
        say("bench: A/A control: the spmdsim columns time a second, separately built copy of the raw code")
    baseline = comm.allreduce(peak_rss(), op=MPI.MAX)
    records = []
    matched = 0  # timed cases that pass --filter (the same count on every rank)
    for suite in suites:
        say(f"bench: building {suite} cases")
        if suite == "overhead":
            recs = overhead_records(comm, waiter.mode, args.loops, args.profile)
            if rank == 0:
                print(overhead_table(recs))
            records.extend(recs)
            continue
        cases = suite_cases(suite, comm, waiter, cfg, args)
        if args.aa:
            # A second build of every case has its own buffers (and meshes); its
            # raw code takes the spmdsim slot.
            cases = [aa_case(first, twin) for first, twin in
                     zip(cases, suite_cases(suite, comm, waiter, cfg, args))]
        if args.filter:
            cases = [c for c in cases if args.filter in c.name]
            if not cases:
                say(f"bench: no {suite} case matches --filter {args.filter!r}")
        matched += len(cases)
        for i, case in enumerate(cases, 1):
            t0 = time.perf_counter()
            rec = run_case(comm, waiter, case, warmup, repeats)
            trace = rec.pop("_trace", [])
            # Ranks move different amounts (e.g. an exchange): the busiest rank counts.
            rec["predicted_comm_s"] = (None if args.aa else
                                       comm.allreduce(predicted_s(trace, model), op=MPI.MAX))
            rec["collectives"] = (None if args.aa else
                                  "+".join(e.op for e in trace if e.group_size > 1) or "none")
            rec["suite"] = suite
            records.append(rec)
            say(f"bench: [{suite} {i}/{len(cases)}] {case.name}: spmdsim "
                f"{rec['spmdsim_s'] * 1e3:.2f} ms, raw {rec['raw_s'] * 1e3:.2f} ms "
                f"({time.perf_counter() - t0:.1f} s)")
    if args.filter and not matched:
        timed_suites = [s for s in suites if s != "overhead"]
        raise SpmdsimError(f"no case matches --filter {args.filter!r} in the suites "
                           f"{', '.join(timed_suites)}; expected part of a case name")
    timed = [r for r in records if r.get("suite") != "overhead"]
    if rank == 0 and timed:
        print(table(timed))
        if args.aa:
            print("A/A control: the spmdsim columns are a second copy of the raw code")
        print(f"interpreter baseline peak RSS {baseline / 2**20:.0f} MiB (max over ranks, at start)")
    if rank == 0 and args.json:  # the overhead suite's records too
        text = json.dumps(records, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
