"""An MoE layer's dispatch and combine on 8 MPI ranks: spmdsim's exchange beside raw mpi4py, same counts and buffers.

    python scripts/bench_moe.py                     # 3 launches, 40 rounds each, dropless and capacity
    python scripts/bench_moe.py --launches 1 --rounds 4 --tokens 8 --d-model 8     # tiny (the test's)

Each launch (``timeout -k 5 600 mpiexec -n 8``) makes a mesh of ep 8 (dp 1,
tp 1), routes each rank's own tokens (--sequences of --tokens, router
probabilities from a seeded softmax, top-2 over --experts) with
spmdsim.models.moe.routing, and builds the MoE layer's exchange (the
``_Exchange`` of spmdsim.models.moe.exchange, as the layer builds it, the counts
exchanged once). Then, --rounds times, each of three ways moves the same send
buffer to the experts' ranks and back:

- raw: raw mpi4py on the same communicator: dropless, Ialltoallv with the
  same counts and displacements, then the same reorder (the rows by local
  expert, and back) into buffers placed as spmdsim places its own; with a
  capacity, Ialltoall of the (S, E, C, D) slots packed and unpacked as the
  layer packs them. Completed by spmdsim's own wait
  (spmdsim.runtime.engines.wait.polite_wait) when the mesh waits politely (ranks
  outnumber cores, as here), else by the blocking call;
- raw again: the same code a second time, the A/A control (the spread between
  two equal ways on this machine now);
- spmdsim: the layer's ``dispatch`` then ``combine`` (runtime.exchange's
  group_alltoallv or runtime.collectives' alltoall, through runtime/door.py to
  the MPI engine), with a trace open as the trainer keeps one.

The three take turns going first from round to round; a way's time in a
round is the slowest rank's, from a barrier, and its CPU time the ranks'
summed (from the barrier to the way's end). A launch's ratio is the median
over its rounds of (way / raw); its CPU ratio the median CPU of a way over
its rounds / raw's; a row's is the median over launches, beside their spread.
Before timing, each launch checks that spmdsim's rows after the
dispatch and after the combine equal the raw ways' (bit for bit) and that the
trace's bytes are the buffers'; the script exits 1 otherwise. The load average
is printed at the start and at the end: on a shared machine compare within
one run only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from spmdsim.tools.cli.main import run_script

HERE = Path(__file__).resolve()
RANKS = 8
MODES = ("dropless", "capacity")
WAYS = ("raw", "spmdsim", "raw2")  # raw2: the A/A control


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _mpiexec() -> str:
    """The venv's mpiexec (the pip `mpich` wheel), else the one on PATH, else ""."""
    beside = str(Path(sys.executable).parent / "mpiexec")
    return beside if os.access(beside, os.X_OK) else (shutil.which("mpiexec") or "")


def _probs(args, rank: int):
    import numpy as np

    rng = np.random.default_rng(args.seed + rank)  # each rank routes its own tokens
    z = rng.standard_normal((args.sequences, args.tokens, args.experts)) * 2.0
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def _raw_ways(comm, move, polite: bool, D: int):
    """(dispatch, combine) by raw mpi4py doing the layer's work on `move`'s counts (an _Exchange)."""
    import numpy as np
    from mpi4py import MPI

    from spmdsim.base import buffers
    from spmdsim.runtime.engines.wait import polite_wait

    def done(request) -> None:
        polite_wait(request) if polite else request.Wait()

    if move.dropless:
        sc = [n * D for n in move.send_rows]
        rc = [n * D for n in move.recv_rows]
        sd, rd = np.cumsum([0] + sc[:-1]).tolist(), np.cumsum([0] + rc[:-1]).tolist()
        order = move.order

        def alltoallv(send, scounts, sdispls, rcounts, rdispls):
            recv = buffers.empty((sum(rcounts) // D, D), np.float64)
            request = comm.Ialltoallv([send, (scounts, sdispls), MPI.DOUBLE], [recv, (rcounts, rdispls), MPI.DOUBLE])
            done(request)
            return recv

        def dispatch(send):
            return alltoallv(send, sc, sd, rc, rd)[order]

        def combine(rows):
            by_source = np.empty_like(rows)
            by_source[order] = rows
            return alltoallv(by_source, rc, rd, sc, sd)

        return dispatch, combine
    ep, S, El, C = move.ep, move.bl, move.El, move.C

    def alltoall(blocks):
        recv = buffers.empty(blocks.shape, np.float64)
        done(comm.Ialltoall(blocks, recv))
        return recv

    def dispatch(send):
        # the send buffer is (ep, S, El, C, D), destination-major: it leaves as it is; what arrives, by expert
        got = alltoall(send).reshape(ep, S, El, C, D)
        return np.ascontiguousarray(got.transpose(2, 0, 1, 3, 4)).reshape(-1, D)

    def combine(rows):
        blocks = np.ascontiguousarray(rows.reshape(El, ep, S, C, D).transpose(1, 2, 0, 3, 4))
        return alltoall(blocks).reshape(-1, D)

    return dispatch, combine


def _worker(args) -> dict:
    """One launch: for each mode, the check, then the rounds; rank 0's result (every rank's maxima)."""
    import numpy as np
    from mpi4py import MPI

    from spmdsim import Layout, Mesh, collect_trace
    from spmdsim.models.moe import MoEConfig, dispatch_rows, route
    from spmdsim.models.moe.exchange import _Exchange
    from spmdsim.programs.plan.steps import moved_bytes
    from spmdsim.runtime.process import tune_mpi_process

    tune_mpi_process()  # as the guard does for spmdsim's commands: BLAS threads, heap, memory watch
    comm = MPI.COMM_WORLD
    mesh = Mesh(Layout((1, comm.size, 1), ("dp", "ep", "tp")), comm)
    D = args.d_model
    probs = _probs(args, comm.rank)
    out: dict = {"polite": bool(mesh.polite)}
    for mode in MODES:
        moe = MoEConfig(experts=args.experts, top_k=2, dropless=mode == "dropless",
                        capacity_factor=args.capacity_factor)
        routing = route(probs, moe.top_k, moe.capacity(args.tokens))
        _, nrows, per_expert = dispatch_rows(routing, moe.dropless, comm.size)
        send = np.random.default_rng(comm.rank).standard_normal((nrows, D))
        move = _Exchange(mesh, moe, routing.capacity, args.sequences, args.experts // comm.size, per_expert,
                         f"{mode} dispatch", f"{mode} combine")
        raw_dispatch, raw_combine = _raw_ways(mesh.group_info("ep")[0], move, mesh.polite, D)
        with collect_trace() as trace:
            ours = move.dispatch(send)
            back = move.combine(ours)
        theirs = raw_dispatch(send)
        same = bool(np.array_equal(ours, theirs) and np.array_equal(back, raw_combine(theirs))
                    and np.array_equal(back, send))  # the combine brings every row home
        traced = sum(e.bytes_sent for e in trace.entries)
        # what the trace should count: the part of the send buffer that leaves the rank, an Alltoallv's all but
        # its rows to itself (as many come back in the combine), an Alltoall's (g - 1) / g of it
        # (spmdsim.programs.plan.steps.moved_bytes)
        own = move.send_rows[mesh.group_info("ep")[2]] * D * send.itemsize
        expect = 2 * (send.nbytes - own) if moe.dropless else 2 * moved_bytes("alltoall", comm.size, send.nbytes)
        ways = {"raw": lambda: raw_combine(raw_dispatch(send)), "raw2": lambda: raw_combine(raw_dispatch(send)),
                "spmdsim": lambda: move.combine(move.dispatch(send))}
        times: dict = {way: [] for way in WAYS}
        cpus: dict = {way: [] for way in WAYS}
        with collect_trace():  # the trainer keeps one open: spmdsim's rows record as they would there
            for r in range(-1, args.rounds):  # round -1: each way once, untimed
                for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:
                    comm.Barrier()
                    t0, c0 = time.perf_counter(), time.process_time()
                    ways[way]()
                    c1, t1 = time.process_time(), time.perf_counter()
                    spent = comm.allreduce(t1 - t0, op=MPI.MAX)
                    cpu = comm.allreduce(c1 - c0)  # the ranks' CPU, summed
                    if r >= 0:
                        times[way].append(spent)
                        cpus[way].append(cpu)
        rows = comm.allgather(sum(move.recv_rows))
        out[mode] = {
            "same": comm.allreduce(int(not same), op=MPI.SUM) == 0,
            "traced_bytes": comm.allreduce(traced), "expected_bytes": comm.allreduce(expect),
            "buffer_bytes": comm.allreduce(send.nbytes),
            "rows_min": min(rows), "rows_max": max(rows), "raw_s": statistics.median(times["raw"]),
            "raw_cpu_s": statistics.median(cpus["raw"]),
            **{f"{way}_ratio": statistics.median(t / b for t, b in zip(times[way], times["raw"]))
               for way in ("spmdsim", "raw2")},
            # a round's CPU is a few ms over 8 ranks: the ratio of the medians, not the median of the ratios
            **{f"{way}_cpu_ratio": statistics.median(cpus[way]) / statistics.median(cpus["raw"])
               for way in ("spmdsim", "raw2")}}
    mesh.close()
    return out


def _launch(args) -> dict | None:
    mpiexec = _mpiexec()
    cmd = ["timeout", "-k", "5", "600", mpiexec, "-n", str(RANKS), sys.executable, str(HERE), "--worker",
           "--rounds", str(args.rounds), "--tokens", str(args.tokens), "--sequences", str(args.sequences),
           "--d-model", str(args.d_model), "--experts", str(args.experts),
           "--capacity-factor", str(args.capacity_factor), "--seed", str(args.seed)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=660)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"bench_moe: a launch failed (exit {done.returncode}): "
          f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
    return None


def _spread(values: list) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=3, help="mpiexec launches (default 3)")
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds of each way a launch (default 40)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sequence (default 64)")
    parser.add_argument("--sequences", type=int, default=4, help="sequences per rank (default 4)")
    parser.add_argument("--d-model", type=int, default=256, help="features per token (default 256)")
    parser.add_argument("--experts", type=int, default=8, help="experts, a multiple of 8 (default 8)")
    parser.add_argument("--capacity-factor", type=float, default=1.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("launches", "rounds", "tokens", "sequences", "d_model", "experts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1")
    if args.experts % RANKS:
        parser.error(f"--experts {args.experts} must be a multiple of the {RANKS} ep ranks")
    if not (math.isfinite(args.capacity_factor) and args.capacity_factor > 0):
        parser.error(f"--capacity-factor {args.capacity_factor} must be a finite number > 0")
    if args.seed < 0:  # numpy refuses it on the rank that seeds with it alone; the others would wait
        parser.error(f"--seed {args.seed} must be at least 0")
    if args.worker:
        result = _worker(args)
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:
            print("RESULT " + json.dumps(result))
        return 0
    if not _mpiexec():
        print("bench_moe: no mpiexec beside python or on PATH (pip install mpich); the bench runs on 8 MPI ranks",
              file=sys.stderr)
        return 1
    print(f"MoE dispatch + combine on {RANKS} MPI ranks (ep {RANKS}): {args.experts} experts, top-2, "
          f"{args.sequences} x {args.tokens} tokens a rank, d_model {args.d_model}")
    print(f"load average at the start {_load()} (1, 5, 15 min; {os.cpu_count()} cores)")
    results = [_launch(args) for _ in range(args.launches)]
    if not all(results):
        return 1
    n = args.launches
    print(f"{n} launch{'es' if n > 1 else ''} x {args.rounds} rounds, ways in turn, the slowest rank; "
          f"{'polite' if results[0]['polite'] else 'blocking'} waits")
    ok = True
    for mode in MODES:
        rs = [r[mode] for r in results]
        first = rs[0]
        same = all(r["same"] for r in rs)
        counted = all(r["traced_bytes"] == r["expected_bytes"] for r in rs)
        ok = ok and same and counted
        kind = "Alltoallv" if mode == "dropless" else "Alltoall"
        print(f"{mode} ({kind}): rows received a rank {first['rows_min']}-{first['rows_max']}, send buffers "
              f"{first['buffer_bytes']:,} B all ranks")
        expected = "as expected" if counted else f"NOT the {first['expected_bytes']:,} expected"
        print(f"  rows after dispatch and combine {'equal to' if same else 'DIFFERENT from'} raw's; traced bytes "
              f"{first['traced_bytes']:,} ({expected})")
        raw = statistics.median(r["raw_s"] for r in rs)
        print(f"  raw mpi4py                 {raw * 1e3:9.3f} ms")
        for way, label in (("raw2", "raw again (A/A control)"), ("spmdsim", "spmdsim dispatch + combine")):
            ratios = [r[f"{way}_ratio"] for r in rs]
            print(f"  {label:26} {statistics.median(ratios):9.3f}x raw ({_spread(ratios)})")
        cpu = statistics.median(r["raw_cpu_s"] for r in rs)
        print(f"  CPU of the {RANKS} ranks, raw   {cpu * 1e3:9.3f} ms")
        for way, label in (("raw2", "raw again (A/A control)"), ("spmdsim", "spmdsim dispatch + combine")):
            ratios = [r[f"{way}_cpu_ratio"] for r in rs]
            print(f"  {label:26} {statistics.median(ratios):9.3f}x raw's CPU ({_spread(ratios)})")
    print(f"load average at the end {_load()}")
    if not ok:
        print("bench_moe: spmdsim's rows or bytes differ from raw mpi4py's", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_script(main))
