#!/usr/bin/env python
"""One redistribution on 8 simulated ranks against the same move in JAX on 8 fake CPU devices, in one run.

    python scripts/bench_move_jax.py
    python scripts/bench_move_jax.py --launches 5 --repeat 40 --shape 2048x2048

The move: a float32 tensor (1024 x 1024 by default) laid out (S(0), S(1)) on a 2 x 4 mesh re-laid
out as (S(1), S(0)). Each launch times, in a turning order, in this one process:

- **spmdsim**: the move on 8 simulated ranks (spmdsim.simulate), each call after a barrier; a time
  is the median over `--repeat` calls of the slowest rank;
- **spmdsim again**: the same, a second time (the A/A control: what the order and the machine alone
  make of identical work);
- **JAX**: ``jax.jit(lambda a: a, out_shardings=...)`` on 8 fake CPU devices
  (``XLA_FLAGS=--xla_force_host_platform_device_count=8``), median over `--repeat` calls;
- **numpy, one copy**: every rank's new block made from the old blocks with each piece copied once,
  in one thread: the memory-copy floor of the move.

Each line gives a launch's times and ratios to spmdsim's; the last, their medians over launches. With JAX
not installed (``pip install -e ".[bench]"``) one line says so and the rest is timed. The load
average is printed beside each launch: on a shared machine compare within one run.
"""
from __future__ import annotations

import os

# JAX reads its device count when it is imported; one BLAS thread per simulated rank
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

import spmdsim  # noqa: E402
from spmdsim import DTensor, Layout, Mesh  # noqa: E402
from spmdsim.errors import SpmdsimError  # noqa: E402
from spmdsim.runtime.executor import redistribute  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, int_at_least  # noqa: E402

GRID = Layout((2, 4), ("a", "b"))
SOURCE, TARGET = GRID("a", "b"), GRID("b", "a")


def _shape(text: str) -> tuple[int, int]:
    """An argparse type: 'ROWSxCOLS', each a positive multiple of 8 (the move splits both over 8 ranks)."""
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not ROWSxCOLS like 1024x1024") from None
    if rows <= 0 or cols <= 0 or rows % 8 or cols % 8:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected positive multiples of 8 like 1024x1024")
    return rows, cols


def simulated(whole: np.ndarray, repeat: int) -> float:
    """Median over `repeat` moves of the slowest simulated rank's seconds (after 3 untimed moves, the first
    checked against numpy: a move that gives other blocks stops the run)."""
    def body() -> list[float]:
        mesh = Mesh(GRID)
        x = DTensor.from_global(mesh, whole, SOURCE)
        world = spmdsim.world()
        if not np.array_equal(redistribute(x, TARGET).local, whole[TARGET.slices(mesh.rank, whole.shape)]):
            raise SpmdsimError(f"rank {mesh.rank}'s moved block differs from numpy's")
        for _ in range(2):
            redistribute(x, TARGET)
        times = []
        for _ in range(repeat):
            world.Barrier()
            t0 = time.perf_counter()
            redistribute(x, TARGET)
            times.append(time.perf_counter() - t0)
        return times
    return float(np.median(np.max(spmdsim.simulate(8, body), axis=0)))


def one_copy(whole: np.ndarray) -> Callable[[], None]:
    """Every rank's new block made from the old blocks, each piece copied once (numpy, one thread)."""
    blocks = [np.ascontiguousarray(whole[SOURCE.slices(r, whole.shape)]) for r in range(8)]
    bounds = [SOURCE.bounds(r, whole.shape) for r in range(8)]
    pieces = []
    for r in range(8):
        (r0, r1), (c0, c1) = TARGET.bounds(r, whole.shape)
        new = np.empty((r1 - r0, c1 - c0), whole.dtype)
        for block, ((s0, s1), (t0, t1)) in zip(blocks, bounds):
            lo, hi, left, right = max(r0, s0), min(r1, s1), max(c0, t0), min(c1, t1)
            if lo < hi and left < right:
                pieces.append((new[lo - r0:hi - r0, left - c0:right - c0],
                               block[lo - s0:hi - s0, left - t0:right - t0]))

    def run() -> None:
        for place, piece in pieces:
            place[...] = piece
    return run


def jax_move(whole: np.ndarray) -> Callable[[], Any] | str:
    """The move in JAX on 8 fake CPU devices, or why it cannot run here."""
    try:
        import jax
        from jax.sharding import Mesh as JaxMesh, NamedSharding, PartitionSpec
    except ImportError:
        return "JAX is not installed (pip install -e '.[bench]'): only spmdsim and numpy are timed"
    devices = jax.devices()
    if len(devices) < 8:
        return f"JAX sees {len(devices)} devices, not 8 (XLA_FLAGS was set before this script ran)"
    mesh = JaxMesh(np.array(devices[:8]).reshape(2, 4), ("a", "b"))
    x = jax.device_put(whole, NamedSharding(mesh, PartitionSpec("a", "b")))
    move = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, PartitionSpec("b", "a")))
    if not np.array_equal(np.asarray(move(x)), whole):
        return "JAX's moved tensor differs from numpy's: not timed"
    return lambda: move(x).block_until_ready()


def timed(run: Callable[[], Any], repeat: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int_at_least(1), default=3, help="rounds of all contenders (default 3)")
    p.add_argument("--repeat", type=int_at_least(1), default=40, help="timed moves per contender (default 40)")
    p.add_argument("--shape", type=_shape, default=(1024, 1024), help="ROWSxCOLS (default 1024x1024)")
    args = p.parse_args(argv)
    whole = np.random.default_rng(0).random(args.shape, np.float32)
    peer = jax_move(whole)
    names = ["spmdsim", "spmdsim again (A/A)", "numpy, one copy"] + (["JAX"] if callable(peer) else [])
    runs = {"spmdsim": lambda: simulated(whole, args.repeat),
            "spmdsim again (A/A)": lambda: simulated(whole, args.repeat),
            "numpy, one copy": (lambda copy: lambda: timed(copy, args.repeat))(one_copy(whole))}
    if callable(peer):
        runs["JAX"] = lambda: timed(peer, args.repeat)
    else:
        print(peer)
    print(f"move (S(0),S(1)) -> (S(1),S(0)) of a {args.shape[0]}x{args.shape[1]} float32 on a 2x4 mesh")
    print(f"ms a move (median of {args.repeat} moves), and (contender / spmdsim) in the same launch")
    print(f"{'launch':<6}{'load':>5}" + "".join(f"{n:>22}" for n in names))
    ratios: dict = {n: [] for n in names}
    for launch in range(args.launches):
        order = names[launch % len(names):] + names[:launch % len(names)]  # each first in turn
        load = os.getloadavg()[0]
        seconds = {}
        for n in order:
            seconds[n] = runs[n]()
            time.sleep(0.2)  # XLA's worker threads spin a while after their work: not into the next contender
        cells = []
        for n in names:
            ratios[n].append(seconds[n] / seconds["spmdsim"])
            cells.append(f"{seconds[n] * 1e3:8.3f} ({ratios[n][-1]:5.2f}x)")
        print(f"{launch + 1:<6}{load:>5.1f}" + "".join(f"{c:>22}" for c in cells))
    print(f"{'median':<11}" + "".join(f"{statistics.median(ratios[n]):>21.2f}x" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
