"""`spmdsim run OP ...`: one operator on generated data under MPI, checked against its reference.

    mpiexec -n 8 spmdsim run matmul --strategy "((2,1),(1,4))" --shape 256,128,192
    mpiexec -n 8 spmdsim run linear --parallel row --shape 64,200,72 --explain
    mpiexec -n 8 spmdsim run linear --front paddle --shape 64,200,72 --no-gather-out
    mpiexec -n 8 spmdsim run embedding --mode vocab --shape 10,4,1000,48
    mpiexec -n 8 spmdsim run mlp --shape 24,96,360 --activation relu
    spmdsim run mlp --shape 24,96,360 --ranks 8        # 8 simulated ranks, no mpiexec

Prints each rank's layout (gathered to rank 0), the collectives with bytes,
the max error and PASS/FAIL; exits 1 on FAIL. ``--explain`` adds, per rank,
the local input shapes and which collective runs over which ranks and why.
``spmdsim run redistribute`` is served by `spmdsim.tools.cli.plan`.
"""
from __future__ import annotations

import argparse
from typing import Any

from ...errors import SpmdsimError
from ...runtime.sim.launch import ranks_argument
from .common import add_common_arguments, add_trace_out, guarded, on_world
from .plan import add_redistribute_arguments

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run", help="run one distributed operator on MPI or simulated ranks and check it",
        description="Run one operator on generated data (each rank makes only its shards), "
                    "print the per-rank layout, the collectives and bytes, the max error and "
                    "PASS/FAIL. Launch with mpiexec -n N.",
    )
    ops = parser.add_subparsers(dest="op", metavar="OP")
    mm = _op(ops, "matmul", "Y = X @ W with a MindSpore strategy or explicit Layout maps")
    mm.add_argument("--shape", required=True, help="M,K,N (or B,...,M,K,N for batched)")
    mm.add_argument("--strategy", help='MindSpore strategy, e.g. "((2,1),(1,4))"')
    mm.add_argument("--out-strategy", help='MindSpore out_strategy, e.g. "((8,1),)": Reduce_scatter')
    mm.add_argument("--device-matrix", help="Layout device matrix, e.g. 2,2,2")
    mm.add_argument("--alias-name", "--alias", dest="alias_name",
                    help="Layout axis names, e.g. dp,sp,mp")
    mm.add_argument("--x-map", help='tensor map of X, e.g. "mp,(sp,dp)"')
    mm.add_argument("--w-map", help='tensor map of W, e.g. "(sp,dp),None"')
    mm.add_argument("--out-map", help="wanted output map (Reduce_scatter when it extends a dim)")
    mm.add_argument("--placement", help="OneFlow placement shape for the SBP flags, e.g. 2,2, or its ranks, "
                    "e.g. [[0,1],[2,3]]")
    mm.add_argument("--x-sbp", help='nD SBP of X over --placement, e.g. "B,S(0)" (P: a pending sum)')
    mm.add_argument("--w-sbp", help='nD SBP of W over --placement, e.g. "S(1),B"')
    mm.add_argument("--out-sbp", help="wanted output SBP (Reduce_scatter when it splits a dim)")
    mm.add_argument("--transpose-a", action="store_true", help="X is stored (K, M)")
    mm.add_argument("--transpose-b", action="store_true", help="W is stored (N, K)")
    lin = _op(ops, "linear", "column- or row-parallel Linear with bias over every rank")
    lin.add_argument("--shape", required=True, help="M,K,N: X (M, K), W (K, N)")
    lin.add_argument("--parallel", choices=("column", "row"), default="column",
                     help="split W's output columns or its input rows (default column)")
    lin.add_argument("--gather-out", action="store_true",
                     help="Allgather the column output into whole rows (the default with "
                          "--front paddle, as Paddle's split() gather_out=True)")
    lin.add_argument("--no-gather-out", action="store_true",
                     help="keep the column output split, no communication (the default with "
                          "--front megatron, as ColumnParallelLinear gather_output=False)")
    lin.add_argument("--no-bias", action="store_true", help="a Linear without bias")
    lin.add_argument("--front", choices=("megatron", "paddle"), default="megatron",
                     help="megatron: ColumnParallelLinear / RowParallelLinear (column output "
                          "stays split by default); paddle: distributed.split(x, (K, N), "
                          "\"linear\", axis=1 / 0) (column output gathered by default). "
                          "Same implementation underneath")
    emb = _op(ops, "embedding", "vocab-parallel (Allreduce) or dim-parallel (Allgather) Embedding")
    emb.add_argument("--shape", required=True, help="ID_DIMS...,VOCAB,DIM, e.g. 10,4,1000,48")
    emb.add_argument("--mode", choices=("vocab", "dim"), default="vocab",
                     help="split the table's vocabulary rows or its embedding columns (default vocab)")
    emb.add_argument("--front", choices=("megatron", "paddle"), default="megatron",
                     help="megatron: VocabParallelEmbedding / ParallelEmbedding; paddle: "
                          "distributed.split(ids, (VOCAB, DIM), \"embedding\"), each rank's "
                          "table rows plus a zero padding row (vocab only)")
    mlp = _op(ops, "mlp", "ColumnParallelLinear -> activation -> RowParallelLinear")
    mlp.add_argument("--shape", required=True, help="M,H,F: X (M, H), inner width F")
    mlp.add_argument("--activation", choices=("gelu", "relu"), default="gelu",
                     help="the activation between the two layers (default gelu)")
    _add_redistribute(ops)
    parser.set_defaults(func=run, _parser=parser)


def _op(ops: Any, name: str, text: str) -> argparse.ArgumentParser:
    sub = ops.add_parser(name, help=text, description=text)
    add_common_arguments(sub)
    sub.add_argument("--explain", action="store_true",
                     help="print per rank the block of each tensor it holds and which collective runs and why")
    sub.add_argument("--json", action="store_true", help="print one JSON record instead")
    add_trace_out(sub)
    return sub


def _add_redistribute(ops: Any) -> None:
    # The planner's CLI owns the flags and the execution (spmdsim.tools.cli.plan).
    sub = ops.add_parser("redistribute", help="move a generated tensor between two layouts",
                         description="Plan, execute and check a redistribution (see spmdsim plan).")
    add_redistribute_arguments(sub)
    ranks_argument(sub)
    sub.set_defaults(redistribute=True)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "redistribute", False):
        from .redistribute import check_redistribute, run_redistribute  # the runtime: loaded to run, not for --help

        return on_world(args, lambda comm: int(run_redistribute(args) or 0), lambda n: check_redistribute(args, n))
    if not args.op:
        args._parser.print_help()
        return 2
    if args.json and args.explain:  # given both, the record would print and --explain be dropped
        raise SpmdsimError("--explain adds each rank's blocks and collectives to the text report, which --json "
                           "replaces (its record has neither): give one of them")
    from .run_ops import check_op, run_op  # the jobs and the runtime they run on: loaded to run one, not for --help

    return on_world(args, lambda comm: guarded(lambda: run_op(args, comm), comm, args),
                    lambda n: check_op(args, n))
