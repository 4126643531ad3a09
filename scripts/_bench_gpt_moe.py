"""`python scripts/bench_gpt.py --moe`: spmdsim's MoE GPT step, eager and replayed, beside the same step by hand.

    python scripts/bench_gpt.py --moe                    # 3 launches of each, 3 timed steps each
    python scripts/bench_gpt.py --moe --simulated        # also the replayed step and the peer on simulated ranks

It times the MoE GPT's step (bench_gpt's sizes, every second
block's MLP 4 experts behind a top-2 router, capacity factor 1) on 8 MPI ranks,
dp 2 x ep 2 x tp 2, sequence parallel: each round the hand-written peer
(scripts/peer_mpi4py_moe.py: the dense peer's step with its MoE layers on
mpi4py, Alltoall over ep, the same collectives a step as spmdsim's; polite
wait), spmdsim's step replayed (step 0 captured, the timed steps replaying it),
spmdsim's step eager, and the peer again (the A/A control), with the step, its
collectives, the waits for later members in them, their time after the last
member arrived and the 8 ranks' CPU, as the dense rows. ``--simulated`` adds
each round the peer on 8 simulated ranks (``spmdsim mpirun -n 8``, blocking
calls), spmdsim's replayed step on 8 simulated ranks and the peer there again. Step 0 runs with spmdsim's dropout
masks on both sides: the peer's loss is printed beside spmdsim's (eager and
replayed) and the one process's, and the script exits 1 when the losses or
the collectives a step differ.

bench_gpt.py dispatches to `moe_case`, builds its launches with `moe_command`, and runs its spmdsim workers:
``mpiexec -n 8 python scripts/bench_gpt.py --moe --worker moe``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve()
BENCH = HERE.parent / "bench_gpt.py"  # the script whose workers the spmdsim launches run
for _folder in (HERE.parent, HERE.parents[1]):  # bench_gpt's parts beside this file, spmdsim above it
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from _bench_gpt_shared import _line, _load, _mpi_rows, agreement  # noqa: E402

__all__ = ["MOE_MESH", "MOE_EXPERTS", "MOE", "MOE_SIMULATED", "moe_config", "moe_command", "moe_case"]

MOE_MESH = (2, 2, 2)  # --moe's (dp, ep, tp) on 8 MPI ranks
MOE_EXPERTS = 4  # --moe: experts per MoE layer (every second block), top-2, capacity factor 1
#: --moe's launches, in their order: the peer, spmdsim replayed, then eager, the peer again (A/A); with --simulated
#: the peer on 8 simulated ranks, spmdsim replayed on them, the peer there again (A/A).
MOE = ("mhand", "moereplay", "moe", "mhand2", "msimhand", "msim", "msimhand2")
MOE_SIMULATED = ("msimhand", "msim", "msimhand2")


def moe_config(args):
    """--moe's model: the dense one's sizes, every second block's MLP MOE_EXPERTS experts (the peer's too)."""
    from peer_mpi4py_moe import moe_config as peers

    return peers(argparse.Namespace(layers=args.layers, d_model=args.d_model, seq=args.seq, dropout=0.1,
                                    experts=MOE_EXPERTS, capacity_factor=1.0))


def moe_command(worker: str, common: list, check: int, mpiexec: Callable[[], str]) -> list:
    """--moe's launch of `worker`: spmdsim's MoE step (eager or replayed) on 8 MPI ranks, or replayed on 8
    simulated ones; the hand-written peer on 8 MPI ranks (polite wait) or on 8 simulated ones (blocking);
    `mpiexec()`: bench_gpt's."""
    stop = ["timeout", "-k", "5", "900"]
    if worker in ("moe", "moereplay", "msim"):
        cmd = [sys.executable, str(BENCH)] + common + ["--moe"]
        return stop + cmd if worker == "msim" else stop + [mpiexec() or "mpiexec", "-n", "8"] + cmd
    dp, ep, tp = MOE_MESH
    cmd = [sys.executable, str(HERE.parent / "peer_mpi4py_moe.py")] + common[:-2] + [
        "--dp", str(dp), "--ep", str(ep), "--tp", str(tp), "--experts", str(MOE_EXPERTS), "--check", str(check)]
    if worker in MOE_SIMULATED:
        return stop + [sys.executable, "-m", "spmdsim", "mpirun", "-n", "8"] + cmd + ["--wait", "busy"]
    return stop + [mpiexec() or "mpiexec", "-n", "8"] + cmd + ["--wait", "polite"]


def moe_case(args, launch: Callable, mpiexec: Callable[[], str]) -> int:
    """--moe: spmdsim's MoE step, eager and replayed, beside the hand-written one, launch by launch
    (`launch(args, worker, check)`, bench_gpt's); 1 if their collectives a step or step 0's losses differ, or
    without an mpiexec (`mpiexec()` empty)."""
    if not mpiexec():
        print("bench_gpt --moe: no mpiexec beside python or on PATH (pip install mpich); the MoE case runs on 8 MPI "
              "ranks", file=sys.stderr)
        return 1
    start = _load()
    rows: dict = {worker: [] for worker in MOE if args.simulated or worker not in MOE_SIMULATED}
    for i in range(args.launches):
        for worker in rows:
            rows[worker].append(launch(args, worker, check=int(i == 0 and worker == "mhand")))
    if not all(all(r) for r in rows.values()):
        return 1
    cfg, n = moe_config(args), args.launches
    dp, ep, tp = MOE_MESH
    print(f"MoE GPT {args.layers} layers ({sum(map(cfg.is_moe, range(cfg.layers)))} MoE), d_model {args.d_model}, "
          f"seq {args.seq}, batch 8; {cfg.moe.experts} experts, top-{cfg.moe.top_k}, capacity factor "
          f"{cfg.moe.capacity_factor:g}")
    print(f"mesh dp {dp} x ep {ep} x tp {tp} (sequence parallel); {len(os.sched_getaffinity(0))} cores")
    print(f"load average at the start {start} (1, 5, 15 min); {n} launch{'es' if n > 1 else ''} of each run, "
          f"interleaved")
    print(f"{'run':44} {'s/step':>8}  ratio: median of the launches' (min-max)")
    _mpi_rows(rows, "mhand", "mhand2", "moereplay", "moe")
    if args.simulated:
        print("8 simulated ranks (threads of one process; the peer under spmdsim mpirun, blocking calls):")
        for worker, title, base, versus in (("msimhand", "  numpy + mpi4py by hand", None, ""),
                                            ("msimhand2", "  the same again (A/A control)", "msimhand", "by hand"),
                                            ("msim", "  spmdsim, replayed", "msimhand", "by hand")):
            against = rows[base] if base else None
            print(_line(title, rows[worker], "step", against, versus))
            print(_line("    CPU time of its 8 ranks", rows[worker], "cpu", against, versus))
    ours, theirs = rows["moe"][0], rows["mhand"][0]
    same_calls = all(r["calls"] == theirs["calls"] for w in rows for r in rows[w])
    print(f"collectives a step, each rank: spmdsim {ours['calls']} (replayed {rows['moereplay'][0]['calls']}), "
          f"by hand {theirs['calls']} ({'equal' if same_calls else 'DIFFERENT'})")
    return agreement("--moe", ours, rows["moereplay"][0], theirs, same_calls, "parameters")
