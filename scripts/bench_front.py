#!/usr/bin/env python
"""What each microsecond of Python before a collective's MPI call costs the group, when ranks share cores.

Run under MPI (every mpiexec under a timeout):

    timeout -k 5 300 mpiexec -n 8 python scripts/bench_front.py
    timeout -k 5 300 mpiexec -n 8 python scripts/bench_front.py --size 8M --spins 2,10

One Alltoall of `--size` bytes per rank over all ranks (blocks along dim 0:
nothing to pack), timed six ways, interleaved in one launch with the order
turned every repeat: raw mpi4py, raw again (the A/A control), raw after a busy
wait of each `--spins` microseconds, `runtime.door.issue` called directly
(spmdsim's one body, no argument checks) and `collectives.alltoall` (the
checks, then that body). A time is the median over repeats of the slowest
rank, after two barriers; `ratio` is against raw in the same run, and
`us/us` is the group's extra time per microsecond of the spin. With more
ranks than cores a rank's work before its call runs in turn with the others'
on its core, so the group pays a multiple of it (docs/explanation/performance.md, "Collectives against raw mpi4py").
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from spmdsim.runtime.guard import run_guarded  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, byte_size, int_at_least  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402


def _spins(text: str) -> list[int]:
    """An argparse type: distinct whole microseconds, each from 1 to 10000."""
    try:
        spins = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of whole microseconds like 1,5,20") from None
    for s in spins:
        if not 1 <= s <= 10_000:
            raise argparse.ArgumentTypeError(f"spin {s} us is out of range; expected 1 <= spin <= 10000")
    if len(set(spins)) != len(spins):
        raise argparse.ArgumentTypeError(f"{text!r} names a spin twice; expected distinct spins")
    return spins


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=byte_size, default="1M", help="bytes per rank (K/M suffixes; default 1M)")
    p.add_argument("--repeats", type=int_at_least(1), default=300, help="timed repeats (default 300)")
    p.add_argument("--spins", type=_spins, default="1,5,20",
                   help="busy waits before the raw call, microseconds, comma-separated (default 1,5,20)")
    return p.parse_args(argv)


def _busy(us: int, call):
    def spun():
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass
        call()
    return spun


def bench(size: int, repeats: int, spins: list[int]) -> tuple[list[tuple[str, float, int | None]], str]:
    """((case, median seconds of the slowest rank, spin us or None) per case, what ran).

    The list is rank 0's; [] elsewhere. `size` is cut to whole rows of 256 float32.
    """
    from mpi4py import MPI

    from spmdsim import Layout
    from spmdsim.base import buffers
    from spmdsim import Mesh
    from spmdsim.runtime import collectives as C
    from spmdsim.runtime.door import issue
    from spmdsim.runtime.engines.wait import polite_wait

    comm = MPI.COMM_WORLD
    world = comm.Get_size()
    mesh = Mesh(Layout((world,), ("x",)), comm)
    sub, g, _ = mesh.group_info(("x",))
    rows = max(g, size // 4 // 256 // g * g)  # whole float32 rows of 256, divisible by the ranks
    full, out = buffers.full((rows, 256), 1, np.float32), buffers.empty((rows, 256), np.float32)
    if mesh.polite:
        def raw() -> None:
            polite_wait(sub.Ialltoall(full, out))
    else:
        def raw() -> None:
            sub.Alltoall(full, out)
    cases = [("raw mpi4py", raw, None), ("raw again (A/A)", raw, None)]
    cases += [(f"raw after {us} us of spin", _busy(us, raw), us) for us in spins]
    cases += [("spmdsim's body (door.issue)",
               lambda: issue(mesh, sub, g, "alltoall", ("x",), None, mesh.engine.all_to_all, (full, out),
                             out, full, (0, 0), full.nbytes), None),
              ("collectives.alltoall", lambda: C.alltoall(mesh, full, ("x",), 0, 0, out=out), None)]

    def barrier() -> None:
        if mesh.polite:
            polite_wait(comm.Ibarrier())
        else:
            comm.Barrier()
    k = len(cases)
    seconds = np.zeros((k, repeats))
    for rep in range(-3, repeats):
        for j in range(k):
            i = (rep + j) % k  # each case in each slot of the order equally often
            barrier()
            barrier()  # a second, hot barrier: all ranks start together
            t0 = time.perf_counter()
            cases[i][1]()
            if rep >= 0:
                seconds[i, rep] = time.perf_counter() - t0
    slowest = np.empty_like(seconds)
    comm.Allreduce(seconds, slowest, MPI.MAX)
    if comm.Get_rank() != 0:
        return [], ""
    what = (f"Alltoall of {full.nbytes} B per rank over {world} ranks on {os.cpu_count()} cores, "
            f"{mesh.wait_mode} wait; median of the slowest rank")
    return [(name, statistics.median(slowest[i]), us) for i, (name, _, us) in enumerate(cases)], what


def table(records: list[tuple[str, float, int | None]], what: str) -> str:
    base = records[0][1]
    lines = [what, f"{'case':<32}{'ms':>8}{'ratio':>8}{'us/us':>8}"]
    for name, s, us in records:
        per = f"{(s - base) * 1e6 / us:8.1f}" if us else f"{'':8}"
        lines.append(f"{name:<32}{s * 1e3:8.3f}{s / base:8.2f}{per}")
    lines.append("ratio: against raw mpi4py in this run; us/us: the group's extra time per microsecond of spin")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    records, what = bench(args.size, args.repeats, args.spins)
    if records:
        print(table(records, what), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    return run_guarded(lambda: run(args))


if __name__ == "__main__":
    sys.exit(run_script(main))
