"""`spmdsim run redistribute`: a generated tensor moved between two layouts on the ranks by the plan that
`spmdsim plan` prints, its collectives listed and the result checked bit-exactly.
"""
from __future__ import annotations

import argparse
import json
from time import perf_counter
from typing import Any

from ...layouts.datagen import SeededTensor
from ...programs.memory import redistribute_need, shard_multiples
from ...programs.plan import plan_redistribution
from ...runtime.budget import check_memory
from ...runtime.dtensor import DTensor
from ...runtime.engines import engine_of, world
from ...runtime.executor import redistribute
from ...runtime.mesh import Mesh
from ...runtime.ranked import gather_ranked
from ...runtime.trace import collect_trace
from ...runtime.trace_export import write_chrome_trace
from .common import check_ranks, check_seed, check_trace_out, check_watchdog, guarded
from .plan import layouts_from_args
from .plan_explain import plan_record, plan_text

__all__ = ["check_redistribute", "run_redistribute"]


def check_redistribute(args: argparse.Namespace, ranks: int) -> None:
    """With --ranks `ranks`: the command line's checks before the banner (_execute repeats them on every rank)."""
    check_watchdog(args)
    check_trace_out(args)
    check_seed(args)
    source, _, _, _ = layouts_from_args(args)
    if args.device_matrix is None:  # the count two .shard strategies (or --to-device-matrix) give
        what = (f"--to-device-matrix {args.to_device_matrix!r}" if args.to_device_matrix is not None else
                f"--from-strategy {args.from_strategy!r} with --to-strategy {args.to_strategy!r}")
    else:
        flag = (getattr(args, "device_matrix_given", None) or [("--device-matrix", None)])[0][0]  # or --placement
        what = f"{flag} {args.device_matrix!r}"
    check_ranks(source.layout, what, ranks)


def run_redistribute(args: argparse.Namespace) -> int:
    """`spmdsim run redistribute`: execute the plan under MPI and check it bit-exactly."""
    comm = world()  # MPI's COMM_WORLD, or the simulated rank's under --ranks N
    return guarded(lambda: _execute(args, comm), comm, args)


def _execute(args: argparse.Namespace, comm: Any) -> int:
    check_trace_out(args)
    check_seed(args)
    source, target, shape, dtype = layouts_from_args(args)
    plan = plan_redistribution(source, target, shape, dtype)
    check_memory(comm, f"redistribute {source} -> {target}",
                 lambda s: redistribute_need(source, target, s, dtype), shape,
                 shard_multiples(source, target), "--shape")
    mesh = Mesh(source.layout, comm)
    seeded = SeededTensor(shape, dtype, seed=args.seed)
    x = DTensor.from_seeded(mesh, source, seeded)
    with collect_trace() as trace:
        began = perf_counter()
        y = redistribute(x, target, plan)
        ended = perf_counter()
    verdict = y.check(seeded, rtol=0.0, atol=0.0)
    if args.trace_out:
        write_chrome_trace(comm, trace, args.trace_out, began, ended)
    received = engine_of(comm).all_reduce_object(comm, sum(e.bytes_received for e in trace.entries), "max")
    # Every rank's collectives, ranks with the same lines folded ("ranks 0-7: ...").
    calls = gather_ranked(comm, [f"{(e.label or e.op).replace('redistribute', 'step', 1)}: sent "
                                 f"{e.bytes_sent:,} B, received {e.bytes_received:,} B"
                                 for e in trace.entries] or ["none"])
    if comm.Get_rank() == 0:
        if args.json:
            record = plan_record(plan, args)
            record.update(passed=bool(verdict.passed), max_abs_error=float(verdict.max_abs_error),
                          measured_bytes_received_per_rank=int(received))
            print(json.dumps(record))
        else:
            print(plan_text(plan, args))
            print("collectives:")
            print("\n".join("  " + line for line in calls))
            print(f"measured bytes received per rank (max): {received:,} B")
            print(f"{verdict}  {'PASS' if verdict.passed else 'FAIL'}")
    return 0 if verdict.passed else 1
