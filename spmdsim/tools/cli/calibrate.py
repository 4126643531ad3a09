"""`spmdsim calibrate`: time raw mpi4py collectives, fit the cost model, save it.

Run it under MPI, e.g.
``timeout -k 5 300 mpiexec -n 8 spmdsim calibrate``. Every group size g
divides the world into groups of g consecutive ranks that run at the same
time (as the groups of one mesh axis do). Each timing is the median over
repeats of the slowest rank's time. The timing itself: spmdsim.tools.cli.collective_timing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ...programs.cost import CostModel, Measurement, default_path, normalize_op
from ...base.typed_numbers import byte_count  # calibrate's sizes read as collective's and mpirun's
from ...errors import SpmdsimError
from ...runtime.engines import engine_of
from ..estimate.machine import machine_to_dict, save_machine
from ..estimate.machine_units import check_units
from ..estimate.machine_records import GemmEfficiency, Link, Machine
from ...programs.viz.table import wrap_lines
from .collective_timing import Waiter, measure, measure_copy
from .paths import check_output_file
from .common import guarded
from ..autoshard.cost import measure_flops_rate
from ...runtime.engines.wait import local_ranks

__all__ = ["register", "run", "parse_size", "byte_count", "measure_memory_bandwidth",
           "calibrated_machine", "implausible"]

_DEFAULT_SIZES = "64K,1M,4M,16M"
_DEFAULT_OPS = "allgather,allreduce,reduce_scatter,alltoall,alltoallv,bcast"
#: The most collectives a run times, warmup included: each is two barriers and the collective, about 100 us at 8
#: ranks on 2 cores, so minutes at most. The defaults on 8 ranks time 729 (9 runs of 72 cases and 9 copy cases).
MAX_CALIBRATION_CALLS = 100_000


def parse_size(text: str) -> int:
    """'64K' -> 65536, '4M' -> 4194304, '100' -> 100 (binary units)."""
    value = byte_count(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"size {text!r} must be >= 0")
    return value


def _group_size_list(text: str) -> list[int]:
    """--group-sizes as integers, before the world size is known (`_group_sizes` checks them against it)."""
    try:
        sizes = [int(v) for v in text.split(",")]
    except ValueError:
        raise SpmdsimError(f"--group-sizes {text!r} must be comma-separated integers "
                           "such as 2,4") from None
    small = [g for g in sizes if g < 2]
    if small:  # refused before MPI starts, whatever the world size (1 process outside mpiexec: not only that said)
        raise SpmdsimError(f"--group-sizes {text!r}: group size {small[0]} must be >= 2 (the ranks of one "
                           "collective) and divide the world size")
    return sizes


def _group_sizes(text: str | None, world: int) -> list[int]:
    if text is not None:
        sizes = _group_size_list(text)
    else:
        sizes = [g for g in (2, 4, 8, 16, 32, 64) if g < world and world % g == 0] + [world]
    for g in sizes:
        if g < 2 or world % g:
            raise SpmdsimError(
                f"--group-sizes {text!r}: group size {g!r} must be >= 2 and divide the world size {world}")
    return sorted(set(sizes))


#: Largest --sizes entry. Each rank holds about three buffers of the size, so 1 GiB
#: already needs 24 GiB for 8 ranks on one machine, and the fit gains nothing
#: beyond tens of MiB, where the bandwidth term dominates.
MAX_CALIBRATION_BYTES = 1 << 30


def _sizes(text: str) -> list[int]:
    """--sizes as byte counts; an SpmdsimError (raised on every rank alike) names the bad one."""
    try:
        sizes = [parse_size(s) for s in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise SpmdsimError(f"--sizes {text!r}: {exc}") from None
    too_big = [n for n in sizes if n > MAX_CALIBRATION_BYTES]
    if too_big:
        raise SpmdsimError(f"--sizes {text!r}: {too_big[0]:,} bytes per rank is above the "
                           f"{MAX_CALIBRATION_BYTES:,}-byte (1G) limit; expected sizes up to 1G "
                           "(each rank allocates about three buffers of each size)")
    return sizes


def _check_counts(args: argparse.Namespace) -> None:
    if args.repeats < 1:
        raise SpmdsimError(f"--repeats {args.repeats!r} must be at least 1 "
                           "(each timing is a median over the repeats)")
    if args.warmup < 0:
        raise SpmdsimError(f"--warmup {args.warmup!r} must be at least 0")
    if args.dry_run and args.output is not None:
        raise SpmdsimError(f"--output {args.output!r} has no effect with --dry-run "
                           "(which saves nothing); give one of them")
    if args.dry_run and args.machine_out is not None:
        raise SpmdsimError(f"--machine-out {args.machine_out!r} has no effect with --dry-run "
                           "(which saves nothing); give one of them")


def _output_problem(args: argparse.Namespace) -> str | None:
    """Why --output or --measurements cannot be written (rank 0 writes them), or None."""
    try:
        if args.measurements is not None:
            check_output_file(args.measurements, "--measurements")
        if args.machine_out is not None and not args.dry_run:
            check_output_file(args.machine_out, "--machine-out")
        if not args.dry_run:
            if args.output is not None:
                check_output_file(args.output, "--output")
            else:  # the default's folder (~/.cache/spmdsim) is made on first use
                check_output_file(default_path(), "the cost file (--output's default)", make_parents=True)
    except SpmdsimError as exc:
        return str(exc)
    return None


def _check_points(args: argparse.Namespace, ops: list, group_sizes: list, sizes: list) -> None:
    """Refuse, before any timing, a run with fewer distinct measurements than the fit needs (CostModel.fit: 2)."""
    points = len(set(ops)) * len(group_sizes) * len(set(sizes))
    if points < 2:
        raise SpmdsimError(f"calibrate fits a line through its measurements and needs at least 2: --ops {args.ops!r}, "
                           f"group sizes {group_sizes} and --sizes {args.sizes!r} give {points}; expected more "
                           "--sizes (e.g. --sizes 1K,1M) or --ops")


def _check_work(args: argparse.Namespace, ops: list, group_sizes: list, sizes: list) -> None:
    """Refuse, before any timing, a run of more than MAX_CALIBRATION_CALLS collectives: --warmup plus --repeats
    runs of each (op, group size, size) case and of measure_copy's three calls per size it times."""
    copies = 3 * (len([n for n in sizes if n >= 1 << 20]) or len(sizes))
    cases = len(ops) * len(group_sizes) * len(sizes) + copies
    calls = (args.warmup + args.repeats) * cases
    if calls > MAX_CALIBRATION_CALLS:
        raise SpmdsimError(f"--warmup {args.warmup} and --repeats {args.repeats} time {calls:,} collectives "
                           f"({args.warmup + args.repeats:,} runs of {cases} cases: --ops x group sizes "
                           f"{group_sizes} x --sizes, and {copies} of the copy); expected at most "
                           f"{MAX_CALIBRATION_CALLS:,} (each is two barriers and the collective, tens of "
                           "microseconds or more): fewer --repeats or --warmup")


def _check_arguments(args: argparse.Namespace) -> None:
    """Every check of the command line that needs no communicator: before MPI starts, on every rank alike (so a
    bad flag is the one line, under mpiexec or not; _calibrate checks the group sizes against the world)."""
    _check_counts(args)
    try:
        ops = [normalize_op(op) for op in args.ops.split(",")]
    except SpmdsimError as exc:
        raise SpmdsimError(f"--ops {args.ops!r}: {exc}") from None
    twice = sorted({op for op in ops if ops.count(op) > 1})
    if twice:
        raise SpmdsimError(f"--ops {args.ops!r} names {twice[0]} twice; expected each collective once")
    _sizes(args.sizes)
    if args.group_sizes is not None:  # "" too: given, and no group size (it timed the default ones)
        _group_size_list(args.group_sizes)


def run(args: argparse.Namespace) -> int:
    _check_arguments(args)
    from ...runtime.mpi_library import load_mpi
    comm = load_mpi(why="calibrate times an MPI library's collectives").COMM_WORLD
    if comm.Get_size() < 2:  # every process of the job alike, before any collective: main() says it once
        problem = _output_problem(args)  # this process is rank 0, whose verdict on the paths counts: said first
        if problem:
            raise SpmdsimError(problem)
        raise SpmdsimError(f"calibrate needs at least 2 ranks (it times collectives between them), got "
                           f"{comm.Get_size()}: run it under MPI, e.g. timeout -k 5 300 mpiexec -n 8 spmdsim calibrate")
    # Guarded: an error on some ranks only (a file rank 0 cannot write) ends the
    # job instead of leaving the others in a collective.
    return guarded(lambda: _calibrate(args, comm), comm)


def _calibrate(args: argparse.Namespace, comm: Any) -> int:
    from mpi4py import MPI

    rank = comm.Get_rank()
    # Every argument is checked before the first timing, on every rank alike.
    _check_counts(args)
    ops = [normalize_op(o) for o in args.ops.split(",")]
    sizes = _sizes(args.sizes)
    group_sizes = _group_sizes(args.group_sizes, comm.Get_size())
    _check_points(args, ops, group_sizes, sizes)
    _check_work(args, ops, group_sizes, sizes)
    # Rank 0 writes the files, so its verdict on the paths is everybody's.
    problem = engine_of(comm).broadcast_object(comm, _output_problem(args) if rank == 0 else None, 0)
    if problem:
        raise SpmdsimError(problem)
    waiter = Waiter(comm, args.wait)
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if rank == 0 else None
    data = measure(comm, ops, group_sizes, sizes, waiter,
                   warmup=args.warmup, repeats=args.repeats, progress=say)
    model = CostModel.fit(data, source=f"spmdsim calibrate: {comm.Get_size()} ranks, "
                          f"wait={waiter.mode}, {MPI.Get_library_version().splitlines()[0]}")
    copy = measure_copy(comm, sizes, waiter, warmup=args.warmup, repeats=args.repeats)
    model = dataclasses.replace(model, copy_s_per_byte=copy)
    if not args.dry_run:  # rank 0's verdict, for every rank alike
        problem = engine_of(comm).broadcast_object(comm, _fit_problem(args, model) if rank == 0 else None, 0)
        if problem:
            raise SpmdsimError(problem)
    machine = None
    if args.machine_out is not None and not args.dry_run:
        # Rank 0's fit decides, for every rank alike: one line, not an error on rank 0 alone.
        problem = engine_of(comm).broadcast_object(comm, _bandwidth_problem(model) if rank == 0 else None, 0)
        if problem:
            raise SpmdsimError(problem)
        machine = _measure_machine(comm, model, waiter)
    failure = None
    if rank == 0:
        print(f"{'op':<15}{'g':>3}{'bytes':>11}{'measured ms':>13}{'model ms':>11}{'ratio':>7}")
        for m in data:
            pred = model.predict(m.op, m.group_size, m.bytes_per_rank)
            print(f"{m.op:<15}{m.group_size:>3}{m.bytes_per_rank:>11}{m.seconds * 1e3:>13.4f}"
                  f"{pred * 1e3:>11.4f}{pred / m.seconds:>7.2f}")
        print("\n".join(wrap_lines([str(model)])))  # within 100 columns: its fields fold onto a second line
        failure = _save(args, model, data, machine)
    # Rank 0's outcome reaches every rank: a failed write is one error, not a hang.
    failure = engine_of(comm).broadcast_object(comm, failure, 0)
    if failure:
        raise SpmdsimError(failure)
    return 0


def measure_memory_bandwidth(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes/s of a contiguous copy of `nbytes` on this process (read + write, best of `repeats`)."""
    src = np.ones(max(nbytes // 8, 1))
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / max(best, 1e-9)


#: Dtypes numpy cannot multiply in, each with the measured dtype its peak is taken from: spmdsim multiplies
#: bf16 and fp16 operands in float32 (spmdsim.base.precision.product), as the estimate's mixed precisions do.
TAKEN_FROM = {"bf16": "fp32", "fp16": "fp32"}


def calibrated_machine(model: CostModel, flops_rates: Mapping[str, float], memory_bandwidth: float,
                       ranks_per_node: int, memory_bytes: int, host: str) -> Machine:
    """This machine as a spmdsim.tools.estimate machine: one rank is one "GPU", both levels the measured link.

    Pure. links.*.latency is the fit's shared alpha, links.*.bandwidth 1 / its shared beta (the per-op
    overrides are not carried), reduction_rate 1 / gamma (none where gamma is 0); peak_flops.fp32 and fp64
    are `flops_rates`, the measured GEMM rates, so the efficiency cap is 1 (the roofline still slows small
    products); bf16 and fp16, which every precision but fp64 computes in, are fp32's (`TAKEN_FROM`), as the
    sources say.
    """
    problem = _bandwidth_problem(model)
    if problem:
        raise SpmdsimError(problem)
    link = Link(bandwidth=1.0 / model.beta_s_per_byte, latency=model.alpha_s)
    peaks = {**{d: float(flops_rates[d]) for d in ("fp64", "fp32")},
             **{low: float(flops_rates[src]) for low, src in TAKEN_FROM.items()}}
    sources = (f"spmdsim calibrate on {host}: links.node and links.cluster are the fitted shared alpha (latency) "
               f"and 1/beta (bandwidth), reduction_rate 1/gamma, algorithm the fit's; {model.source}",
               "peak_flops.fp64 and fp32: spmdsim.tools.autoshard.cost.measure_flops_rate (192x192 float64 and float32 "
               "matmul, best of 5), median over the ranks, measured together",
               "peak_flops.bf16 and fp16: fp32's, not measured (numpy has no bf16 and no BLAS fp16 product; "
               "spmdsim multiplies both in float32)",
               "hbm_bandwidth: a contiguous 64 MiB copy (2 bytes moved per byte copied, best of 5), median over "
               "the ranks, measured together",
               f"gpus_per_node: the ranks on this node ({ranks_per_node}); memory_bytes: physical memory / ranks")
    efficiency = GemmEfficiency(1.0, "roofline at the measured rate: peak_flops are achieved, not datasheet "
                                     "peaks, so the cap is 1")
    gamma = model.gamma_s_per_byte
    return Machine(name=f"calibrated-{host}", description=f"{host} as measured by spmdsim calibrate "
                   f"({ranks_per_node} ranks on the node)", sources=sources, gpus_per_node=ranks_per_node,
                   memory_bytes=max(memory_bytes, 1), peak_flops=tuple(peaks.items()),
                   hbm_bandwidth=float(memory_bandwidth), gemm_efficiency=efficiency, node=link, cluster=link,
                   algorithm=model.algorithm, reduction_rate=1.0 / gamma if gamma > 0 else None)


def peaks_line(machine: Machine) -> str:
    """What a calibrated machine file's peak FLOP/s are, and which were measured (`TAKEN_FROM`)."""
    peaks = dict(machine.peak_flops)
    measured = ", ".join(f"{d} {v:.3g}" for d, v in peaks.items() if d not in TAKEN_FROM)
    taken = ", ".join(f"{d} {peaks[d]:.3g} (={src}'s)" for d, src in TAKEN_FROM.items() if d in peaks)
    return (f"peak FLOP/s: {measured} measured; {taken}, not measured: numpy has no bf16 and no BLAS fp16 "
            "product, spmdsim multiplies both in float32")


def _fit_problem(args: argparse.Namespace, model: CostModel) -> str | None:
    """Why the fit must not be saved, or None: a beta (shared, or a collective's own) of 0 s/byte, which `spmdsim
    plan` would take as infinite bandwidth (the fit's answer where the times do not grow with the size)."""
    zero = [("the fit's beta", model.beta_s_per_byte)] if model.beta_s_per_byte <= 0 else []
    zero += [(f"the fit's beta of {p.op}" + (f" on {p.group_size} ranks" if p.group_size else ""), p.beta_s_per_byte)
             for p in model.per_op if p.beta_s_per_byte <= 0]
    if not zero:
        return None
    what, value = zero[0]
    return (f"{what} is {value!r} s/byte (infinite bandwidth): the measured times do not grow with the size, too "
            f"few sizes or repeats to fit (--sizes {args.sizes!r}, --repeats {args.repeats}); not saved. Expected "
            f"sizes further apart and more repeats, such as --sizes 64K,1M,4M --repeats {max(7, 2 * args.repeats)}")


def implausible(machine: Machine) -> str | None:
    """Why a measured machine's figure lies outside what any device gives (load_machine would refuse the file,
    spmdsim.tools.estimate.machine_units), or None."""
    try:
        check_units("--machine-out", machine_to_dict(machine))
    except SpmdsimError as exc:
        return f"{exc}: the measurement is off; measure again (larger --sizes, a quieter machine)"
    return None


def _bandwidth_problem(model: CostModel) -> str | None:
    """Why the fit cannot make a machine file (no bandwidth term), or None."""
    if model.beta_s_per_byte > 0:
        return None
    return (f"the fit's beta {model.beta_s_per_byte!r} s/byte gives no bandwidth for --machine-out; expected a "
            "fit with a bandwidth term (add larger --sizes, or run on a quieter machine)")


def _measure_machine(comm: Any, model: CostModel, waiter: Waiter) -> Machine | None:
    """Every rank measures its GEMM rate and copy bandwidth together; rank 0 gets the machine, others None."""
    import os
    import platform

    ranks = local_ranks(comm)
    waiter.barrier(comm)
    mine = (measure_flops_rate(dtype=np.float32), measure_flops_rate(dtype=np.float64), measure_memory_bandwidth())
    rates = engine_of(comm).gather_object(comm, mine, 0)
    if comm.Get_rank() != 0:
        return None
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    flops = {"fp32": statistics.median(r[0] for r in rates), "fp64": statistics.median(r[1] for r in rates)}
    return calibrated_machine(model, flops, statistics.median(r[2] for r in rates), ranks, physical // ranks,
                              platform.node() or "localhost")


def _save(args: argparse.Namespace, model: CostModel, data: Sequence[Measurement],
          machine: Machine | None = None) -> str | None:
    """Write the measurements, the model and the machine file (rank 0); why that failed, or None."""
    where = args.measurements
    try:
        if args.measurements:
            with open(args.measurements, "w") as fh:
                json.dump([dataclasses.astuple(m) for m in data], fh)
        if not args.dry_run:
            where = args.output or str(default_path())
            path = model.save(args.output)
            print(f"saved to {path}")
        if machine is not None:
            where = args.machine_out
            problem = implausible(machine)  # the file would be refused when read
            if problem:
                return problem
            print(f"machine file saved to {save_machine(machine, args.machine_out)}")
            print("\n".join(wrap_lines([peaks_line(machine)])))
    except OSError as exc:
        # Checked before measuring; this is the disk filling up or the path changing meanwhile.
        return f"cannot write {where!r}: {exc.strerror or exc}"
    return None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="time raw MPI collectives and fit the alpha-beta cost model (run under mpiexec)",
        description="Time raw mpi4py collectives over a few sizes and group sizes, fit the "
                    "alpha-beta cost model (spmdsim.programs.cost) and save it. Run under MPI, e.g. "
                    "timeout -k 5 300 mpiexec -n 8 spmdsim calibrate",
    )
    parser.add_argument("--sizes", default=_DEFAULT_SIZES,
                        help=f"per-rank buffer sizes (default {_DEFAULT_SIZES})")
    parser.add_argument("--group-sizes", default=None,
                        help="comma-separated group sizes (default 2, 4, ... and the world size)")
    parser.add_argument("--ops", default=_DEFAULT_OPS, help=f"collectives (default {_DEFAULT_OPS})")
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed runs of each case, the median of the slowest rank's times kept (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs before them (default 2)")
    parser.add_argument("--wait", choices=("busy", "polite", "auto"), default=None,
                        help="how ranks wait in a collective (default $SPMDSIM_WAIT or auto)")
    parser.add_argument("--output", default=None,
                        help="where to save (default $SPMDSIM_COST_FILE, else ~/.cache/spmdsim/cost.json; "
                             "$XDG_CACHE_HOME in place of ~/.cache when set)")
    parser.add_argument("--measurements", default=None,
                        help="also write the raw (op, g, bytes, seconds) list to this JSON file")
    parser.add_argument("--machine-out", default=None, metavar="PATH",
                        help="also write this machine's machine file (spmdsim.tools.estimate): the fitted link, "
                             "the measured GEMM rate and copy bandwidth, the ranks on this node")
    parser.add_argument("--dry-run", action="store_true", help="fit and print, do not save")
    parser.set_defaults(func=run)
