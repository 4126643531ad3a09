"""bench_gpt --fsdp: spmdsim's fully sharded GPT step (ZeRO-3), replayed and eager, beside the same step by hand.

    python scripts/bench_gpt.py --fsdp                   # 3 launches of each, 3 timed steps each
    python scripts/bench_gpt.py --fsdp --launches 5 --steps 5

The GPT of bench_gpt's sizes on 8 MPI ranks, dp 8 (tp 1), every parameter
sharded over dp (spmdsim.nn.fsdp.fully_shard, as examples/train_gpt.py --zero 3
shards it; resharded after forward, FSDP's default): per layer one Allgather of
its packed shards before its forward and again before its backward, one
Reduce_scatter of its packed gradients after it (spmdsim.nn.fsdp_flat, FSDP2's
flat collectives), the root's (embedding, final LayerNorm, tied head) gathered
once a step; AdamW on the shards. Each round launches the hand-written
peer (scripts/peer_mpi4py_fsdp.py: the same calls on raw mpi4py buffers, polite
wait), spmdsim's step replayed (step 0 captured with spmdsim.runtime.replay,
the timed steps replaying it), spmdsim's step eager, and the peer again (the
A/A control), each with the step, its collectives (the time inside them, the
slowest rank), the waits for later members in them, their time after the
last member arrived and the 8 ranks' CPU, as bench_gpt's dense rows. The line
that sums it up: spmdsim's replayed collectives over the peer's, beside the
A/A control's, the median over launches of each launch's ratio. Step 0 runs
with spmdsim's dropout masks on both sides: the peer's loss is printed beside
spmdsim's (eager and replayed) and the one process's, its gradients and updated
shards against the one process's; the script exits 1 when the losses or the
collectives a step differ.

The spmdsim launches run this file: ``mpiexec -n 8 python scripts/_bench_gpt_fsdp.py --worker fsdp``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
for _folder in (HERE.parent, HERE.parents[1]):  # bench_gpt's parts beside this file, spmdsim above it
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import _bench_gpt_shared as bench  # noqa: E402
from spmdsim.base.malloc import glibc_env  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

__all__ = ["fsdp_case", "fsdp_steps", "main"]

DP = 8  # --fsdp's data-parallel ranks, the parameters sharded over all of them
#: --fsdp's launches, in their order: the peer, spmdsim replayed, then eager, the peer again (A/A).
FSDP = ("fhand", "fsdpreplay", "fsdp", "fhand2")
#: The ratio the case is after: spmdsim's replayed collectives within this much of the peer's.
WITHIN = 1.05


def fsdp_steps(args, comm, replay: bool) -> dict:
    """Time spmdsim's fully sharded steps on this rank's comm (a process per rank): the step, its collectives,
    the waits in them before and after their last member arrived, the ranks' CPU; `replay`: step 0 captured,
    each timed step replaying it."""
    from spmdsim import DTensor
    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim.models.gpt.mesh import model_mesh
    from spmdsim.nn import ops

    cfg, ids = bench._config(args), encode(load_text())
    mesh = model_mesh(cfg, comm, DP, 1)
    model, params, train_step = bench.gpt_step(cfg, mesh, fsdp=True)  # resharded after forward, no prefetch
    figures: dict = {key: [] for key in ("step", "collectives", "waited", "arrived", "cpu")}
    graph = None
    for step in range(args.steps + 1):
        x, y = batch(ids, cfg, step)
        xd, yd = (DTensor.from_global(mesh, a, model.ids) for a in (x, y))
        comm.Barrier()
        loss, graph, wall, cpu, trace = bench.timed_step(train_step, (xd, yd, step), params, graph, replay,
                                                          time.process_time)
        if step == 0:  # spmdsim's dropout masks: the peer's checked step 0 draws the same
            loss0 = float(ops.resolved(loss).local)
        before, after = bench._arrivals(mesh, trace.entries)
        for key, value, op in (("step", wall, bench._max()), ("collectives", sum(e.seconds for e in trace.entries),
                               bench._max()), ("waited", before, bench._max()), ("arrived", after, bench._max()),
                               ("cpu", cpu, None)):
            figures[key].append(comm.allreduce(value) if op is None else comm.allreduce(value, op=op))
    kinds = {op: sum(e.op == op for e in trace.entries) for op in ("allgather", "reduce_scatter")}
    mesh.close()
    return dict({key: statistics.median(values[1:]) for key, values in figures.items()}, loss0=loss0,
                calls=len(trace.entries), kinds=kinds)


def _command(args, worker: str, check: int = 0) -> tuple[list, dict]:
    """`worker`'s launch: its command line (8 MPI ranks) and its environment (bench_gpt's: one BLAS thread,
    glibc's heap as spmdsim's ranks keep it, spmdsim's polite wait)."""
    common = ["--steps", str(args.steps), "--layers", str(args.layers), "--d-model", str(args.d_model),
              "--seq", str(args.seq)]
    env = glibc_env(dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]), SPMDSIM_WAIT="polite"))
    if worker in ("fsdp", "fsdpreplay"):
        cmd = [sys.executable, str(HERE)] + common + ["--worker", worker]
    else:
        cmd = [sys.executable, str(HERE.parent / "peer_mpi4py_fsdp.py")] + common + [
            "--dp", str(DP), "--tp", "1", "--check", str(check), "--wait", "polite"]
    return ["timeout", "-k", "5", "900", bench._mpiexec() or "mpiexec", "-n", str(DP)] + cmd, env


def _result(worker: str, code: int, out: str, err: str) -> dict | None:
    """bench_gpt's parse of a launch's RESULT line (tests/testkit.bench_launches reads it here too)."""
    return bench._result(worker, code, out, err, " --fsdp")


def _launch(args, worker: str, check: int = 0) -> dict | None:
    """`worker`'s launch run to its end: the result its RESULT line printed, else None (one line)."""
    cmd, env = _command(args, worker, check)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=960)
    return _result(worker, done.returncode, done.stdout, done.stderr)


def fsdp_case(args) -> int:
    """--fsdp: spmdsim's fully sharded step, replayed and eager, beside the hand-written one, launch by launch;
    1 if their collectives a step or step 0's losses differ, 2 for a case it cannot run."""
    if args.moe or args.pipeline:
        print("bench_gpt: --fsdp, --moe and --pipeline are separate cases: give one", file=sys.stderr)
        return 2
    if not bench._mpiexec():
        print("bench_gpt --fsdp: no mpiexec beside python or on PATH (pip install mpich); the FSDP case runs on 8 "
              "MPI ranks", file=sys.stderr)
        return 1
    start = bench._load()
    rows: dict = {worker: [] for worker in FSDP}
    for launch in range(args.launches):
        for worker in rows:
            rows[worker].append(_launch(args, worker, check=int(launch == 0 and worker == "fhand")))
    if not all(all(r) for r in rows.values()):
        return 1
    return _report(args, rows, start)


def _report(args, rows: dict, start: str) -> int:
    n = args.launches
    print(f"GPT {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch 8; fully sharded over dp {DP} "
          f"(tp 1), resharded after forward; {len(os.sched_getaffinity(0))} cores")
    print(f"load average at the start {start} (1, 5, 15 min); {n} launch{'es' if n > 1 else ''} of each run, "
          f"interleaved")
    print(f"{'run':44} {'s/step':>8}  ratio: median of the launches' (min-max)")
    bench._mpi_rows(rows, "fhand", "fhand2", "fsdpreplay", "fsdp")
    ratios = [r["collectives"] / b["collectives"] for r, b in zip(rows["fsdpreplay"], rows["fhand"])]
    control = [r["collectives"] / b["collectives"] for r, b in zip(rows["fhand2"], rows["fhand"])]
    ratio = statistics.median(ratios)
    print(f"collectives, spmdsim replayed / by hand: {ratio:.2f}x ({bench._spread(ratios)}), A/A control "
          f"{statistics.median(control):.2f}x ({bench._spread(control)}); {'within' if ratio <= WITHIN else 'OVER'} "
          f"{WITHIN:.2f}x")
    ours, theirs = rows["fsdp"][0], rows["fhand"][0]
    same_calls = all(r["calls"] == theirs["calls"] for w in rows for r in rows[w])
    kinds = ours["kinds"]
    print(f"collectives a step, each rank: spmdsim {ours['calls']} ({kinds['allgather']} Allgather, "
          f"{kinds['reduce_scatter']} Reduce_scatter; replayed {rows['fsdpreplay'][0]['calls']}), by hand "
          f"{theirs['calls']} ({'equal' if same_calls else 'DIFFERENT'})")
    return bench.agreement("--fsdp", ours, rows["fsdpreplay"][0], theirs, same_calls, "shards")


def main() -> int:
    """A spmdsim launch of the case (bench_gpt --fsdp starts it): rank 0 prints its RESULT line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("--steps", 3), ("--layers", 4), ("--d-model", 128), ("--seq", 64)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--worker", choices=("fsdp", "fsdpreplay"), required=True)
    args = ap.parse_args()
    from mpi4py import MPI

    from spmdsim.runtime.process import tune_mpi_process

    tune_mpi_process()  # as the guard does for spmdsim's commands: BLAS threads, heap, memory watch
    result = fsdp_steps(args, MPI.COMM_WORLD, replay=args.worker == "fsdpreplay")
    if MPI.COMM_WORLD.rank == 0:
        print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
