"""spmdsim.models.gpt's GPT training step written by hand in numpy and mpi4py: bench_gpt's peer on the same work.

    timeout -k 5 600 mpiexec -n 8 python scripts/peer_mpi4py_gpt.py                # dp 2 x tp 4
    timeout -k 5 600 mpiexec -n 8 python scripts/peer_mpi4py_gpt.py --wait busy --check 2

The step (scripts/_peer_mpi4py_step.py: numpy and mpi4py only) is spmdsim.models.gpt's
model on the same mesh with Megatron's sequence-parallel splits and spmdsim's
41 collectives a step, started here from spmdsim.models.gpt's initial parameters.
Waiting: ``--wait busy`` makes the blocking calls; ``polite`` posts the
nonblocking one and polls it as spmdsim.runtime.engines.wait does; ``auto`` (the
default) decides as spmdsim does: polite when this node runs more ranks than it
has cores. Its collectives' time is the time inside those calls (post and
wait), summed per step on each rank; its CPU time is the step's process time
summed over the ranks.

The first --check steps use spmdsim's dropout masks (spmdsim.models.gpt.params, read
at this rank's block, as spmdsim's dropout reads them); then rank 0 compares
the losses, the last check step's gradients and the parameters after it with
spmdsim.models.gpt.reference (one numpy process). The timed steps (one warm-up, then
--steps) draw their masks from numpy's own generator, seeded by (seed, step,
rank), at the same rate. Rank 0 prints the figures and a ``RESULT {json}`` line
(scripts/bench_gpt.py reads it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

HERE = Path(__file__).resolve()
for _folder in (HERE.parent, HERE.parents[1]):  # the step beside this file, spmdsim above it: from anywhere
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from _gpt_peer_args import add_model_arguments, add_run_arguments, mesh_problem, refuse_small  # noqa: E402
from _peer_mpi4py_step import Comms, Dropout, Replica  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

__all__ = ["run", "stopped", "print_result", "main"]


def _spmdsim_masks(cfg: Any, step: int, d: int, t: int) -> Callable[[str, tuple], np.ndarray]:
    """spmdsim.models.gpt's mask numbers of step `step` at this rank's block (its samples, its sequence rows or
    heads)."""
    from spmdsim.models.gpt import dropout_tensor

    def draw(site: str, shape: tuple) -> np.ndarray:
        region = tuple(slice(i * n, (i + 1) * n) for i, n in zip((d, t), shape[:2])) + (slice(None),) * 2
        return dropout_tensor(cfg, step, site).region(region[:len(shape)])

    return draw


def _own_masks(cfg: Any, step: int, rank: int) -> Callable[[str, tuple], np.ndarray]:
    """numpy's generator, seeded by (seed, step, rank): every rank its own masks, as a plain program draws."""
    rng = np.random.default_rng((cfg.seed, step, rank))
    return lambda site, shape: rng.random(shape)


def arrivals(spans: Any) -> tuple[float, float]:
    """Seconds this rank spent in its calls before each call's last member had arrived, and after it
    (collective: `spans` are (comm, start, end) per call, alike on every member; scripts/bench_gpt.py measures
    spmdsim's calls with it too).

    A call cannot end before its last member starts it; perf_counter is one clock on one machine.
    """
    from mpi4py import MPI

    before = after = 0.0
    for comm, start, end in spans:
        last = comm.allreduce(start, op=MPI.MAX)
        before += min(end, max(start, last)) - start
        after += max(0.0, end - last)
    return before, after


def _check(cfg: Any, world: Any, model: Replica, losses: list) -> dict:
    """Rank 0: the check steps' losses against spmdsim.models.gpt.reference's, and the last step's gradients and the
    parameters after it (the largest difference relative to the tensor's largest entry, over all ranks)."""
    held = getattr(model, "held", None)  # the FSDP peer keeps shards: its (gradients, parameters)
    grads, values = held() if held else (model.g, model.p)
    mine = (model.where, {n: grads[n].copy() for n in grads}, {n: values[n].copy() for n in values})
    everyone = world.gather(mine, root=0)
    if world.rank != 0:
        return {}
    from spmdsim.base.threads import blas_threads
    from spmdsim.models.gpt import encode, load_text
    from spmdsim.models.gpt.reference import Trainer

    with blas_threads(1):
        trainer = Trainer(cfg, encode(load_text()))
        reference = [trainer.step() for _ in losses]
    grads, params = reference[-1][1], trainer.params
    floor = max(float(np.max(np.abs(a))) for a in grads.values())  # a gradient zero but for rounding
    worst = [0.0, 0.0]
    for where, got_grads, got_params in everyone:
        for i, (got, want, least) in enumerate(((got_grads, grads, floor), (got_params, params, 0.0))):
            for name, value in got.items():
                scale = max(float(np.max(np.abs(want[name]))), least) or 1.0
                block = type(model).block(where, name, want[name])
                worst[i] = max(worst[i], float(np.max(np.abs(value - block))) / scale)
    return {"losses": losses, "reference": [loss for loss, _ in reference], "grad_error": worst[0],
            "param_error": worst[1]}


def run(args: argparse.Namespace, cfg: Any, polite: bool, batch_ranks: int = 0, make: Callable = Replica) -> dict:
    """Check and time the step on this rank; rank 0's figures (others: {}). `batch_ranks`: the ranks the batch
    is split over (default args.dp); `make`: the replica, called as Replica is (scripts/peer_mpi4py_moe.py's)."""
    from mpi4py import MPI

    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim.models.gpt.reference import init_params

    world = MPI.COMM_WORLD
    dp = batch_ranks or args.dp
    comms = Comms(world, dp, args.tp, polite)
    d = world.rank // args.tp  # this rank's share of the batch
    model = make(cfg, comms, dp, args.tp, init_params(cfg))
    ids, rows = encode(load_text()), slice(d * model.B, (d + 1) * model.B)
    losses = []
    for k in range(args.check):
        x, y = (a[rows] for a in batch(ids, cfg, k))
        losses.append(model.step(x, y, Dropout(cfg.dropout, _spmdsim_masks(cfg, k, d, model.t))))
    result = _check(cfg, world, model, losses) if args.check else {}
    walls, inside, waited, arrived, cpus = [], [], [], [], []
    for k in range(args.check, args.check + args.steps + 1):
        x, y = (a[rows] for a in batch(ids, cfg, k))  # made before the clock, as bench_gpt makes spmdsim's
        drop = Dropout(cfg.dropout, _own_masks(cfg, k, world.rank))
        comms.seconds, comms.spans = 0.0, []
        world.Barrier()
        # The rank's CPU is its thread's: the process's in an MPI rank (one thread), one rank's of the
        # process when simulated ranks run this (spmdsim mpirun: a thread per rank).
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = model.step(x, y, drop)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        walls.append(world.allreduce(wall, op=MPI.MAX))
        inside.append(world.allreduce(comms.seconds, op=MPI.MAX))
        before, after = arrivals(comms.spans)
        waited.append(world.allreduce(before, op=MPI.MAX))
        arrived.append(world.allreduce(after, op=MPI.MAX))
        cpus.append(world.allreduce(cpu))
    if world.rank != 0:
        return {}
    medians = {key: statistics.median(values[1:]) for key, values in
               (("step", walls), ("collectives", inside), ("waited", waited), ("arrived", arrived),
                ("cpu", cpus))}
    return dict(result, **medians, calls=len(comms.spans), last_loss=loss, wait="polite" if polite else "busy")


def main(argv: Optional[list[str]] = None) -> int:
    """Parse, check the mesh (one line when it cannot run), then run; rank 0 prints the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap, 1, "first steps run with spmdsim's dropout masks, checked against the reference")
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    refuse_small(ap, args)
    from mpi4py import MPI

    from spmdsim.models.gpt import GPTConfig
    from spmdsim.runtime.engines.wait import resolve_wait_mode

    world = MPI.COMM_WORLD
    if stopped(world, "peer_mpi4py_gpt", mesh_problem(args, world.size, args.dropout)):
        return 2
    cfg = GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, dropout=args.dropout)
    polite = resolve_wait_mode(args.wait, world) == "polite"
    result = run(args, cfg, polite)
    if result:
        print_result(args, result, f"numpy + mpi4py, {world.size} ranks (dp {args.dp} x tp {args.tp}, sequence "
                     f"parallel), float64, {result['wait']} wait")
    return 0


def stopped(world: Any, script: str, problem: Optional[str]) -> bool:
    """Whether `problem` (one line, or None) stops the run: every rank sees the same arguments, so all stop
    alike; rank 0 prints it after `script`'s name."""
    if problem and world.rank == 0:
        print(f"{script}: {problem}", file=sys.stderr)
    return bool(problem)


def print_result(args: argparse.Namespace, result: dict, heading: str) -> None:
    """Rank 0's lines: `heading`, the checked steps' losses and errors, the timed step, the RESULT line."""
    if result:
        print(heading)
        for k, (a, b) in enumerate(zip(result.get("losses", ()), result.get("reference", ()))):
            print(f"step {k} loss {a:.12f}, one numpy process {b:.12f} (same dropout masks), |diff| {abs(a - b):.1e}")
        if args.check:
            print(f"after step {args.check - 1}: gradients within {result['grad_error']:.1e}, parameters within "
                  f"{result['param_error']:.1e} of the one process's (relative to each tensor's largest entry)")
        print(f"training step {result['step']:.3f} s, {result['calls']} collectives {result['collectives']:.3f} s "
              f"(median of {args.steps} after a warm-up, slowest rank, numpy's own dropout masks)")
        print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    sys.exit(run_script(main))
