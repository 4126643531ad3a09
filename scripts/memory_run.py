#!/usr/bin/env python
"""Memory run: a 12 GiB logical float32 tensor over 8 ranks, never held whole by any rank.

X of shape (49152, 65536) float32 (12 GiB) is split on its columns (the
contraction dim K) over all ranks: 1.5 GiB per rank at 8 ranks, made shard by
shard from the counter-based SeededTensor (in ~1M-element chunks). A
distributed MatMul Y = X @ W with W (65536, 64) split on K gives partial sums
(49152, 64) that a Reduce_scatter finishes, leaving Y split on rows. Each rank
reports its peak RSS (VmHWM) against its shard bytes and the interpreter
baseline measured in the same process before any allocation; the run fails
(exit 1) when some rank's peak exceeds 2 x shard bytes + baseline.

    timeout -k 5 120 mpiexec -n 8 python scripts/memory_run.py --scale 0.01   # small first
    timeout -k 5 900 mpiexec -n 8 python scripts/memory_run.py                # full 12 GiB

Run the full size only on an otherwise quiet machine with >= 14 GiB free.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from spmdsim.runtime.guard import run_guarded  # noqa: E402

# The shared argument types live beside this file (on sys.path when the script runs;
# added for imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, int_at_least, positive_float  # noqa: E402


_ENFORCE_FROM = 256 << 20


from spmdsim.programs.memory import peak_rss  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402


def current_rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0],
                       epilog="e.g. timeout -k 5 120 mpiexec -n 8 python "
                              "scripts/memory_run.py --scale 0.01")
    p.add_argument("--rows", type=int_at_least(1), default=49152, help="global rows M (default 49152)")
    p.add_argument("--cols", type=int_at_least(1), default=65536, help="global cols K (default 65536)")
    p.add_argument("--out", type=int_at_least(1), default=64, help="W's columns N (default 64)")
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="scale the rows (0.01 = a 1%% run); rows stay divisible by the ranks")
    p.add_argument("--check-rows", type=int_at_least(1), default=4, help="rows of Y checked per rank")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    return run_guarded(lambda: run(args))


def _refuse(args: argparse.Namespace, world: int) -> None:
    """Refuse, on every rank alike before any collective, a shard larger than the machine (in floats: --scale
    1e300 must not overflow) and sizes that leave no row or column per rank once cut to multiples of the rank
    count (they were padded up silently): SpmdsimError, one line."""
    from spmdsim.errors import SpmdsimError

    per_rank = args.rows * args.scale * args.cols * 4 / world
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if per_rank > memory:
        raise SpmdsimError(f"--rows {args.rows} x --scale {args.scale:g} x --cols {args.cols} float32 "
                           f"is {per_rank / 2**30:.3g} GiB per rank on {world} ranks; expected at "
                           f"most this machine's {memory / 2**30:.0f} GiB")
    scaled = int(args.rows * args.scale)
    if scaled < world:
        raise SpmdsimError(f"--rows {args.rows} x --scale {args.scale:g} gives {scaled} rows; "
                           f"expected at least one per rank ({world})")
    if args.cols < world:
        raise SpmdsimError(f"--cols {args.cols}: expected at least one column per rank ({world})")


def run(args: argparse.Namespace) -> int:
    """The MatMul on this job's ranks, each holding its shards only; rank 0 prints the table and the verdict."""
    from mpi4py import MPI

    from spmdsim import Layout, SeededTensor
    from spmdsim.nn.ops import matmul
    from spmdsim import DTensor, Mesh

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    _refuse(args, world)
    scaled = int(args.rows * args.scale)
    rows = scaled // world * world
    cols = args.cols // world * world
    shape = (rows, cols)
    layout = Layout((world,), ("x",))
    mesh = Mesh(layout, comm)
    # Baseline: the interpreter with numpy, mpi4py and spmdsim loaded, before any tensor.
    comm.Barrier()
    baseline = peak_rss()
    t0 = time.perf_counter()
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if rank == 0 else (lambda m: None)
    itemsize = 4
    say(f"memory_run: X {shape} float32 = {rows * cols * itemsize / 2**30:.2f} GiB logical, "
        f"{rows * cols * itemsize / world / 2**30:.3f} GiB per rank on {world} ranks")

    xsrc = SeededTensor(shape, "float32", seed=11)
    wsrc = SeededTensor((cols, args.out), "float32", seed=12)
    x = DTensor.from_seeded(mesh, layout(None, "x"), xsrc)
    w = DTensor.from_seeded(mesh, layout("x", None), wsrc)
    shard_bytes = x.local.nbytes
    comm.Barrier()
    say(f"memory_run: shards made in {time.perf_counter() - t0:.1f} s; running the MatMul")
    t1 = time.perf_counter()
    y = matmul(x, w, out_layout=layout("x", None))
    comm.Barrier()
    t_mm = time.perf_counter() - t1
    peak = peak_rss()  # before the check below, which builds a little reference data

    # Check a few rows of this rank's Y block against a reference made from the same seeds.
    (r0, _), _ = y.layout.bounds(rank, y.global_shape)
    k = min(args.check_rows, y.local.shape[0])
    ref = xsrc.region([(r0, r0 + k), (0, cols)]).astype(np.float64) @ wsrc.full().astype(np.float64)
    ok = bool(np.allclose(y.local[:k], ref, rtol=1e-3, atol=1e-2 * np.sqrt(cols)))
    del ref

    limit = 2 * shard_bytes + baseline
    mine = (rank, baseline, shard_bytes, peak, current_rss(), ok)
    everyone = comm.gather(mine, root=0)
    # Below ~256 MiB shards the fixed ~30 MiB of chunked generation buffers dominate.
    enforce = shard_bytes >= _ENFORCE_FROM
    all_ok = comm.allreduce(ok and (peak <= limit or not enforce), op=MPI.LAND)
    within = comm.allreduce(peak <= limit, op=MPI.LAND)
    if rank == 0:
        _report(shape, wsrc.shape, y.global_shape, t_mm, time.perf_counter() - t0, everyone, within, enforce,
                all_ok)
    return 0 if all_ok else 1


def _report(shape: tuple, w_shape: tuple, y_shape: tuple, t_mm: float, total: float, everyone: list, within: bool,
            enforce: bool, all_ok: bool) -> None:
    """Rank 0's table: each rank's baseline, shard and peak RSS against its limit, then the verdict."""
    rows, cols = shape
    itemsize = 4
    print(f"global X {shape} float32: {rows * cols * itemsize / 2**30:.2f} GiB; "
          f"W {w_shape}; Y {y_shape} split on rows; matmul {t_mm:.2f} s; "
          f"total {total:.1f} s")
    print(f"{'rank':>4}{'baseline MiB':>14}{'shard MiB':>11}{'peak MiB':>10}"
          f"{'(peak-base)/shard':>19}{'limit MiB':>11}{'check':>7}")
    for r, base, shard, pk, _cur, good in everyone:
        print(f"{r:>4}{base / 2**20:>14.1f}{shard / 2**20:>11.1f}{pk / 2**20:>10.1f}"
              f"{(pk - base) / shard:>19.3f}{(2 * shard + base) / 2**20:>11.1f}"
              f"{'ok' if good else 'FAIL':>7}")
    top = max(e[3] for e in everyone)
    print(f"largest peak RSS {top / 2**30:.3f} GiB vs global tensor "
          f"{rows * cols * itemsize / 2**30:.2f} GiB: "
          f"{'no rank held the global tensor' if top < rows * cols * itemsize else 'CHECK'}")
    verdict = ("peak RSS <= 2 x shard + baseline on every rank" if within else
               "some rank's peak RSS exceeded 2 x shard + baseline")
    if not enforce:
        verdict += f" (not enforced: shards under {_ENFORCE_FROM >> 20} MiB)"
    print(("PASS: " if all_ok else "FAIL: ") + verdict +
          ("; values checked" if all(e[5] for e in everyone) else "; VALUE CHECK FAILED"))


if __name__ == "__main__":
    sys.exit(run_script(main))
