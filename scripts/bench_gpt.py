"""A GPT training step in one numpy process, on simulated ranks, on MPI ranks and by hand on mpi4py, side by side.

    python scripts/bench_gpt.py                          # 3 launches of each, 3 timed steps each
    python scripts/bench_gpt.py --launches 5 --steps 5 --layers 2
    python scripts/bench_gpt.py --pipeline               # pp 4, 1F1B, 8 microbatches: spmdsim and by hand
    python scripts/bench_gpt.py --pipeline --replay      # spmdsim's steps 1.. replayed from step 0's capture
    python scripts/bench_gpt.py --pipeline --replay --simulated   # also on 4 simulated ranks
    python scripts/bench_gpt.py --moe --simulated        # the MoE step, eager and replayed, and by hand
    python scripts/bench_gpt.py --context                # ring attention's messages (cp 4) against raw mpi4py

Each worker is its own launch (the rows interleave, launch by launch), runs one
warm-up step, then times --steps steps (each after a barrier, the slowest
rank's wall time); a row is the median over launches of each launch's median
step. Rows:

- one numpy process: spmdsim.models.gpt.reference's step (loss, hand-written
  backward, AdamW) on one BLAS thread, twice: the second is the A/A control,
  the spread between two equal runs on this machine now;
- 1 simulated rank on a 1 x 1 mesh: the same step through spmdsim with
  nothing to communicate, so its excess over one process is what spmdsim's
  per-operator Python costs one rank (8 ranks pay it 8 times on the cores);
- 8 simulated ranks (dp 2 x tp 4, sequence parallel): forward, backward, AdamW;
- numpy + mpi4py by hand on 8 simulated ranks: the hand-written peer below,
  unmodified, under `spmdsim mpirun -n 8` (its ranks are threads of one process
  meeting in spmdsim's rendezvous, blocking calls): what 8 ranks of plain numpy
  cost in one interpreter, so the simulated row's excess over it is spmdsim's
  per-operator Python and its excess over one process is the simulation's;
  launched again after spmdsim's simulated launches, the A/A control of 8
  simulated ranks;
- 8 simulated ranks, replayed: the warm-up step captured (spmdsim.runtime.replay)
  and each timed step a replay of it: the same numpy calls and collectives,
  none of the Python that chose them (examples/train_gpt.py --replay checks
  such steps against one process);
- 8 MPI ranks (mpiexec): the same step, the time its collectives take inside
  spmdsim (the trace's seconds, the slowest rank), split in two: the time a
  rank waited in them for a later member of the call's group to arrive, and
  the time after each call's last group member arrived (a call cannot end
  before that: its own cost), each summed over a rank's calls, the slowest
  rank's; and the CPU time of the 8 ranks together (on 2 cores, a rank waits
  in a collective while the others compute: the step follows the CPU all
  ranks need, and a rank that computes less waits longer for ranks the
  scheduler has not run yet);
- 8 MPI ranks, replayed: as the simulated replay, with the same figures as
  the row above;
- numpy + mpi4py by hand (scripts/peer_mpi4py_gpt.py, 8 ranks under mpiexec):
  the same step written directly on mpi4py buffer calls (Allgather,
  Reduce_scatter_block, Allreduce on Split sub-communicators), Megatron's
  sequence-parallel step with spmdsim's 41 collectives, from spmdsim.models.gpt's
  initial parameters, with its own numpy dropout masks; its collectives (the
  time inside its MPI calls, the slowest rank), the waits for later members in
  them, their time after each call's last member arrived and the CPU time of its
  ranks are measured as spmdsim's. It runs with spmdsim's wait (polite: the
  nonblocking call, Test() with sched_yield, then short sleeps; spmdsim waits
  so when ranks outnumber cores, and its 8-rank launches here are told to on
  any machine, SPMDSIM_WAIT=polite, so that on free cores too both sides wait
  alike), twice (the second, launched
  after spmdsim's, is the A/A control of 8-rank launches), and with the
  blocking calls a plain mpi4py program makes.
  Its first launch also runs step 0 with spmdsim's dropout masks and prints its
  loss beside the one-process reference's, and how far its gradients and updated
  parameters are from the reference's;
- PyTorch DTensor (gloo, 8 ranks under mpiexec): the same GPT in torch float64,
  from spmdsim.models.gpt's initial parameters, with PyTorch's tensor-parallel plan on
  the same dp 2 x tp 4 mesh, sequence parallel (scripts/peer_dtensor_gpt.py);
  the first launch also runs step 0 with spmdsim's dropout masks and prints its
  loss beside the one-process reference's. Needs torch (the `bench` extra);
  without it, one line.

Ratios compare like with like: two runs on the same engine, with the same
number of ranks on the same cores (one process; 8 threads of one process; 8
MPI processes): the simulated A/A control, spmdsim's replayed step / the
hand-written step on simulated ranks, spmdsim's eager step / its replayed
step; on MPI ranks the same for the step, its collectives, collectives after
arrival and CPU time (the peer on the same work: the same model, mesh, splits
and collectives); the blocking peer / the polite one; spmdsim's MPI steps /
DTensor's. A ratio is the median over launches of each launch's ratio (a
launch of a row against the same round's launch of its base), printed with
its min-max over launches; the load average (1, 5, 15 min) is printed at the
start and at the end: on a shared machine compare within one run only.
Every launch (spmdsim's, the peers', the one process's) runs with the glibc
heap thresholds that spmdsim's MPI ranks set for themselves (tune_mpi_process),
given as `spmdsim launch` gives them (spmdsim.base.malloc.glibc_env), unless the
environment sets glibc's variables already: under glibc's defaults a step that
allocates its results afresh (an eager step, the peers') gives its freed heap
top back to the OS and faults it in again the next step (docs/explanation/performance.md),
so every row runs on the same heap.

``--pipeline``, ``--moe``, ``--fsdp`` and ``--context`` time other steps instead, each described in its
own module beside this file: scripts/_bench_gpt_pipeline.py, _bench_gpt_moe.py, _bench_gpt_fsdp.py and
_bench_gpt_context.py.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
MESH = ((2, 4), ("dp", "tp"))  # the dense step's mesh: its shape and axes

sys.path.insert(0, str(HERE.parent))  # the peer and the cases beside this file, also when imported by path
from peer_dtensor_gpt import missing  # noqa: E402
from _bench_gpt_shared import (FIGURES, _config, _line, _load, _mpi_rows, _mpiexec, _ratio, _result,  # noqa: E402
                               gpt_steps, reference_step)
from _bench_gpt_moe import MOE, MOE_MESH, moe_case, moe_command, moe_config  # noqa: E402
from _bench_gpt_pipeline import PIPE, PP, SIMULATED, message_replay, pipeline_case, pipeline_steps  # noqa: E402

from spmdsim.base.malloc import glibc_env  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402


def _worker(args) -> None:
    """A launch's own work (`--worker`): its figures as one RESULT line, printed by rank 0."""
    if args.worker in ("ref", "sim", "simreplay", "one", "msim", "psim"):
        result = _simulated(args)
    else:
        from mpi4py import MPI

        from spmdsim.runtime.process import tune_mpi_process

        tune_mpi_process()  # as the guard does for spmdsim's commands: BLAS threads, heap, memory watch
        comm, worker = MPI.COMM_WORLD, args.worker
        if worker == "pmsg":
            result = message_replay(args, comm)
        elif worker in ("pipe", "pipereplay"):
            result = pipeline_steps(args, comm, replay=worker == "pipereplay")
        elif worker in ("moe", "moereplay"):
            result = gpt_steps(args, comm, True, moe_config(args), (MOE_MESH, ("dp", "ep", "tp")),
                               replay=worker == "moereplay")
        else:
            result = gpt_steps(args, comm, True, _config(args), MESH, replay=worker == "mpireplay")
        if comm.rank != 0:
            return
    print("RESULT " + json.dumps(result))


def _simulated(args) -> dict:
    """The one process's step, or the step on simulated ranks (threads of this process): `args.worker`'s."""
    import spmdsim
    from spmdsim.base.threads import blas_threads

    worker, on = args.worker, lambda n, body: spmdsim.simulate(n, lambda: body(spmdsim.world()))[0]
    if worker == "ref":
        return reference_step(args)
    if worker in ("sim", "simreplay"):
        return on(8, lambda comm: gpt_steps(args, comm, False, _config(args), MESH, replay=worker == "simreplay"))
    if worker == "one":
        # One BLAS thread, as the one-process row: simulate() caps BLAS from 2 ranks only, and a
        # multithreaded OpenBLAS on a loaded machine took 15 ms for a (128, 32) @ (32, 128) product
        # with a transposed operand (20 us on one thread).
        with blas_threads(1):
            return on(1, lambda comm: gpt_steps(args, comm, False, _config(args), ((1, 1), ("dp", "tp"))))
    if worker == "msim":  # --moe --simulated: the replayed MoE step on 8 simulated ranks
        return on(8, lambda comm: gpt_steps(args, comm, False, moe_config(args), (MOE_MESH, ("dp", "ep", "tp")),
                                            replay=True))
    # --pipeline --simulated: the replayed step on PP simulated ranks
    return on(PP, lambda comm: pipeline_steps(args, comm, True, time.thread_time))


#: The hand-written peer's launches: worker -> its wait ("hand2" is "hand" again, the A/A control).
HAND = {"hand": "polite", "hand2": "polite", "busy": "busy"}


def _launch(args, worker: str, check: int = 0) -> dict | None:
    """`worker`'s launch (_command) run to its end: the result its RESULT line printed, else None (one line)."""
    cmd, env = _command(args, worker, check)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=960)
    return _result(worker, done.returncode, done.stdout, done.stderr)


def _command(args, worker: str, check: int = 0) -> tuple[list, dict]:
    """`worker`'s launch: its command line and its environment."""
    common = ["--steps", str(args.steps), "--layers", str(args.layers), "--d-model", str(args.d_model),
              "--seq", str(args.seq), "--worker", worker]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]))
    if worker in ("mpi", "mpireplay", "moe", "moereplay"):  # as the polite peer waits, also on free cores
        env["SPMDSIM_WAIT"] = "polite"
    env = glibc_env(env)  # every launch on the heap spmdsim's MPI ranks keep (tune_mpi_process), as `spmdsim launch`
    cmd = [sys.executable, str(HERE)] + common
    if worker == "dtensor":
        cmd = [sys.executable, str(HERE.parent / "peer_dtensor_gpt.py")] + common[:-2] + ["--check", str(check)]
    if worker in HAND:
        cmd = [sys.executable, str(HERE.parent / "peer_mpi4py_gpt.py")] + common[:-2] + [
            "--check", str(check), "--wait", HAND[worker]]
    if worker == "handsim":  # the peer, unmodified, on 8 simulated ranks: blocking calls, as threads meet
        spmdsim_cli = [sys.executable, "-m", "spmdsim", "mpirun", "-n", "8"]
        cmd = ["timeout", "-k", "5", "900"] + spmdsim_cli + [
            sys.executable, str(HERE.parent / "peer_mpi4py_gpt.py")] + common[:-2] + ["--check", "0", "--wait", "busy"]
    ranks = "8"
    if worker in PIPE:  # --pipeline: pp 4, one rank a stage
        ranks = str(PP)
        common = common[:-2] + ["--microbatches", str(args.microbatches)]
        cmd = [sys.executable, str(HERE)] + common + ["--pipeline", "--worker", worker]
        if worker not in ("pipe", "pipereplay", "psim", "pmsg"):
            cmd = [sys.executable, str(HERE.parent / "peer_mpi4py_pipeline.py")] + common
        if worker in ("psimhand", "psimhand2"):  # the peer, unmodified, on simulated ranks (threads meet)
            cmd = ["timeout", "-k", "5", "900", sys.executable, "-m", "spmdsim", "mpirun", "-n", ranks] + cmd + [
                "--wait", "busy"]
        if worker == "psim":
            cmd = ["timeout", "-k", "5", "900"] + cmd
    if worker in ("mpi", "mpireplay", "dtensor") + PIPE and worker not in SIMULATED or worker in HAND:
        cmd = ["timeout", "-k", "5", "900", _mpiexec() or "mpiexec", "-n", ranks] + cmd
    if worker in MOE:
        cmd = moe_command(worker, common, check, _mpiexec)
    return cmd, env


def _moe(args) -> int:
    """--moe (scripts/_bench_gpt_moe.py), its launches by this file's `_launch`."""
    return moe_case(args, _launch, _mpiexec)


def _pipeline(args) -> int:
    """--pipeline (scripts/_bench_gpt_pipeline.py), its launches by this file's `_launch`."""
    return pipeline_case(args, _launch, _mpiexec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--pipeline", action="store_true",
                    help=f"time the pipelined step (pp {PP}, 1F1B) against the same schedule by hand on mpi4py")
    ap.add_argument("--microbatches", type=int, default=None, help="with --pipeline: microbatches a step (8)")
    ap.add_argument("--replay", action="store_true",
                    help="with --pipeline: spmdsim also launched with step 0 captured and replayed for the timed steps")
    ap.add_argument("--moe", action="store_true",
                    help=f"time the MoE GPT's step (dp {MOE_MESH[0]} x ep {MOE_MESH[1]} x tp {MOE_MESH[2]}), eager and "
                    "replayed, against the same step by hand on mpi4py")
    ap.add_argument("--fsdp", action="store_true", help="time the fully sharded step (ZeRO-3, dp 8), eager and "
                    "replayed, against the same step by hand on mpi4py (scripts/_bench_gpt_fsdp.py)")
    ap.add_argument("--context", action="store_true",
                    help="time ring attention's messages (cp 4) against raw mpi4py (scripts/_bench_gpt_context.py)")
    ap.add_argument("--simulated", action="store_true",
                    help="with --pipeline or --moe: also the replayed step and the peer on simulated ranks (threads)")
    ap.add_argument("--worker", choices=("ref", "one", "sim", "simreplay", "mpi", "mpireplay", "pipe", "pipereplay",
                                         "psim", "pmsg", "moe", "moereplay", "msim"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("launches", "steps", "layers", "d_model", "seq", "microbatches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1")
    if args.microbatches is not None and not args.pipeline:
        ap.error(f"--microbatches {args.microbatches} applies to --pipeline only")
    if args.replay and not args.pipeline:
        ap.error("--replay applies to --pipeline only")
    if args.simulated and not (args.pipeline or args.moe):
        ap.error("--simulated applies to --pipeline and --moe only")
    if args.moe and args.pipeline:
        ap.error("--moe and --pipeline are separate cases: give one")
    if args.pipeline:
        from peer_mpi4py_pipeline import pipeline_args_problem

        args.microbatches = args.microbatches or 8
        problem = pipeline_args_problem(args.layers, PP, args.microbatches)
        if problem:
            ap.error(problem)
    if args.context:  # its own module: the case, its workers and its rows
        from _bench_gpt_context import context_case
        return context_case(args)
    if args.worker:
        _worker(args)
        return 0
    if args.fsdp:
        from _bench_gpt_fsdp import fsdp_case

        return fsdp_case(args)
    if args.pipeline:
        return _pipeline(args)
    if args.moe:
        return _moe(args)
    start = _load()
    peer = missing()
    # Each A/A pair brackets spmdsim's launches of its kind, so a drift of the machine's load shows in the pair.
    rows = {worker: [] for worker in LAUNCHES}
    rows |= {} if peer else {"dtensor": []}
    for launch in range(args.launches):
        for worker in rows:
            check = int(launch == 0 and worker in ("hand", "dtensor"))
            rows[worker].append(_launch(args, AGAIN.get(worker, worker), check=check))
    if not all(any(r) for r in rows.values()):
        return 1
    _report(args, rows, start, peer)
    return 0


#: The launches of a round, in their order (bench_gpt's rows): "ref2", "handsim2" and "hand2" launch "ref",
#: "handsim" and "hand" again, the A/A controls, after the spmdsim launches they are compared with.
LAUNCHES = ("ref", "ref2", "one", "handsim", "simreplay", "sim", "handsim2", "hand", "mpireplay", "mpi", "hand2",
            "busy")
AGAIN = {"ref2": "ref", "handsim2": "handsim", "hand2": "hand"}


def _report(args, rows: dict, start: str, peer: str | None) -> None:
    """bench_gpt's table: each ratio compares two runs on the same engine, the same ranks and the same cores (one
    process; 8 threads of one process; 8 MPI processes), launch by launch: the median over launches of each
    launch's ratio and its min-max."""
    n = args.launches
    print(f"GPT {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch 8; mesh dp 2 x tp 4 "
          f"(sequence parallel); {len(os.sched_getaffinity(0))} cores")
    print(f"load average at the start {start} (1, 5, 15 min); {n} launch{'es' if n > 1 else ''} of each run, "
          f"interleaved")
    print(f"{'run':44} {'s/step':>8}  ratio: median of the launches' (min-max)")
    print(_line("one numpy process", rows["ref"], "step"))
    print(_line("  again (A/A control)", rows["ref2"], "step", rows["ref"], "the first"))
    print(_line("1 simulated rank on a 1 x 1 mesh", rows["one"], "step", rows["ref"], "one process"))
    print("8 simulated ranks (threads of one process):")
    for worker, title, base, versus in (("handsim", "  numpy + mpi4py by hand", "ref", "one process"),
                                        ("handsim2", "  the same again (A/A control)", "handsim", "by hand"),
                                        ("simreplay", "  spmdsim, replayed", "handsim", "by hand"),
                                        ("sim", "  spmdsim", "simreplay", "replayed")):
        print(_line(title, rows[worker], "step", rows[base], versus))
        cpu = "    CPU time of its 8 ranks"  # the threads' own, summed: steadier than the wall on a loaded machine
        print(_line(cpu, rows[worker], "cpu", rows[base] if base != "ref" else None, versus))
    _mpi_rows(rows, "hand", "hand2", "mpireplay", "mpi")
    print("8 MPI ranks, blocking calls:")
    print(_line("  numpy + mpi4py by hand", rows["busy"], "step", rows["hand"], "polite"))
    for key, label in FIGURES:
        print(_line("    " + label, rows["busy"], key, rows["hand"], "polite"))
    checked = rows["hand"][0]
    for k, (loss, ref) in enumerate(zip(checked["losses"], checked["reference"]) if checked else ()):
        print(f"by hand, step {k} loss {loss:.12f}, one process {ref:.12f} (same masks), |diff| {abs(loss - ref):.1e}")
    if checked:
        print(f"by hand, after step 0: gradients within {checked['grad_error']:.1e}, parameters within "
              f"{checked['param_error']:.1e} of the one process's")
    if peer:
        print(peer)
    else:
        print(_line("PyTorch DTensor (gloo, 8 MPI ranks)", rows["dtensor"], "step"))
        print(f"{'  spmdsim on 8 MPI ranks / DTensor':44} {'':8}  {_ratio(rows['mpi'], rows['dtensor'], 'step', '')}")
        print(f"{'  the same, replayed / DTensor':44} {'':8}  "
              f"{_ratio(rows['mpireplay'], rows['dtensor'], 'step', '')}")
        first = rows["dtensor"][0]
        for k, (loss, ref) in enumerate(zip(first["losses"], first["reference"]) if first else ()):
            print(f"DTensor step {k} loss {loss:.12f}, one process {ref:.12f} (same masks), "
                  f"|diff| {abs(loss - ref):.1e}")
    print(f"load average at the end {_load()}")


if __name__ == "__main__":
    sys.exit(run_script(main))
