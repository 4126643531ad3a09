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
import importlib
import math
import re
from typing import Any, Callable, Sequence

from ...layouts.dialects.strategy import parse_strategy
from ...errors import SpmdsimError
from ...layouts.layout import Layout, TensorLayout
from ...base.validate import counted
from .cases import check_device_count, checked_axis_names, parse_int_list, parse_name_list, parse_tensor_map
from ...runtime.engines import engine_of

__all__ = ["register", "run", "add_common_arguments", "on_world", "guarded", "report"]


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--dtype, --seed, --ranks and the debug flags (--check, --watchdog), shared with `spmdsim demo`."""
    from ...runtime.debug import add_cli_arguments  # pure until a collective runs
    from ...runtime.sim.launch import ranks_argument

    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="element type of the generated tensors (default float32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data")
    add_cli_arguments(parser)
    ranks_argument(parser)


def on_world(args: argparse.Namespace, fn: Callable[[Any], int],
             check: Callable[[int], None] | None = None) -> int:
    """`fn(comm)` on the MPI world, or with ``--ranks N`` on N simulated ranks in this process.

    `check(N)`: with --ranks, the arguments' own checks (raising SpmdsimError) before the banner, so that a bad
    value is the one line printed, as under mpiexec (where `fn` repeats them on every rank inside its guard).
    """
    n = getattr(args, "ranks", None)
    if n is None:
        if getattr(args, "dry_run", False):
            from ...runtime.sim.launch import DRY_RUN_NEEDS_RANKS

            raise SpmdsimError(DRY_RUN_NEEDS_RANKS)
        from ...runtime.mpi_library import load_mpi

        return fn(load_mpi().COMM_WORLD)
    from ...runtime.sim.launch import ranks_problem, run_on_ranks
    from ...runtime.engines import world

    problem = ranks_problem(n, bool(getattr(args, "dry_run", False)))
    if problem:
        raise SpmdsimError(problem)
    if getattr(args, "dry_run", False) and getattr(args, "explain", False):
        raise SpmdsimError(DRY_RUN_EXPLAINS_NOTHING)
    from ...base.threads import launcher_size

    if check is not None and launcher_size() == 1:  # under mpiexec, run_on_ranks refuses --ranks itself first
        check(n)
    return run_on_ranks(n, lambda: fn(world()), dry_run=args.dry_run, as_json=getattr(args, "json", False))


#: --explain beside --dry-run: a dry run prints its bytes table in place of the program's output, so the per-rank
#: explanation was built and thrown away, each rank's line naming every member of its group: O(ranks^2) text,
#: 317 s and 16.7 GB at 32,768 ranks for the table the dry run prints alone in 1.8 s.
DRY_RUN_EXPLAINS_NOTHING = ("--explain shows what each rank holds and which collectives it runs, from a run with "
                            "data; a dry run prints its table of bytes instead: leave out --explain (or --dry-run)")


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
    mm.add_argument("--placement", help="OneFlow placement shape for the SBP flags, e.g. 2,2")
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


def add_trace_out(parser: argparse.ArgumentParser) -> None:
    """--trace-out FILE (run, run redistribute, demo)."""
    parser.add_argument("--trace-out", metavar="FILE",
                        help="write a Chrome trace-event JSON file (one track per rank: local compute "
                             "and each collective with its bytes) to open in ui.perfetto.dev")


def check_trace_out(args: argparse.Namespace) -> None:
    """Refuse an unwritable --trace-out before any work (the same error on every rank)."""
    if getattr(args, "trace_out", None) is not None:
        from .paths import check_output_file

        check_output_file(args.trace_out, "--trace-out")


def _add_redistribute(ops: Any) -> None:
    # The planner's CLI owns the flags and the execution; loaded with the `run` parser only.
    plan = importlib.import_module(f"{__package__}.plan")
    sub = ops.add_parser("redistribute", help="move a generated tensor between two layouts",
                         description="Plan, execute and check a redistribution (see spmdsim plan).")
    plan.add_redistribute_arguments(sub)
    from ...runtime.sim.launch import ranks_argument

    ranks_argument(sub)
    sub.set_defaults(op_func=plan.run_redistribute)


def guarded(fn: Callable[[], int], comm: Any, args: argparse.Namespace | None = None) -> int:
    """Run `fn` so that an error on some ranks only ends the job instead of hanging it.

    With `args`, their --check/--watchdog are applied first, inside the guard, so
    a bad value raises the same one-line error on every rank.
    """
    from ...runtime.debug import configure_from_args
    from ...runtime.guard import run_guarded

    def body() -> int:
        if args is not None:
            configure_from_args(args)
        return fn()

    return run_guarded(body, comm)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "op_func", None):
        from .plan import check_redistribute

        return on_world(args, lambda comm: int(args.op_func(args) or 0), lambda n: check_redistribute(args, n))
    if not args.op:
        args._parser.print_help()
        return 2
    return on_world(args, lambda comm: guarded(lambda: _run_op(args, comm), comm, args),
                    lambda n: _check_op(args, n))


def _check_op(args: argparse.Namespace, ranks: int) -> None:
    """With --ranks `ranks`: every check of the command line that needs no communicator, before the banner."""
    check_watchdog(args)
    check_trace_out(args)
    _job_maker(args, ranks)


def check_watchdog(args: argparse.Namespace) -> None:
    """Refuse a bad --watchdog before the banner (configure_from_args repeats it on every rank)."""
    if getattr(args, "watchdog", None) is not None:
        from ...runtime.debug import watchdog_setting

        watchdog_setting(args.watchdog, "--watchdog")


#: Largest --seed + 1: each generated tensor takes a seed of its own above --seed (seed + 1, seed + 2, ...), and
#: every one must stay below 2**63 (SeededTensor's range); a --seed near 2**63 was refused naming a seed the user
#: never typed ("seed 9223372036854775808 must be ...").
SEED_LIMIT = 2 ** 62


def check_seed(args: argparse.Namespace) -> None:
    """Refuse a --seed outside [0, SEED_LIMIT), naming the flag (before any tensor is made)."""
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise SpmdsimError(f"--seed {seed} must be an integer in [0, 2**62)")


def check_ranks(layout: Layout, what: str, ranks: int | None) -> None:
    """Refuse a device matrix (`what`: its flag and value) of another device count than --ranks `ranks`."""
    if ranks is not None and layout.num_devices != ranks:
        raise SpmdsimError(f"{what} has {counted(layout.num_devices, 'device')} but --ranks is {ranks}; "
                           f"expected --ranks {layout.num_devices}")


def _shape(args: argparse.Namespace) -> tuple[int, ...]:
    """--shape as integers, each >= 0, in the form the operator takes."""
    dims = parse_int_list(args.shape, "--shape")
    form = {"matmul": "M,K,N (or B,...,M,K,N)", "linear": "M,K,N", "mlp": "M,H,F",
            "embedding": "ID_DIMS...,VOCAB,DIM"}[args.op]
    if len(dims) < 3 or (args.op in ("linear", "mlp") and len(dims) != 3):
        raise SpmdsimError(f"--shape {args.shape!r} has {counted(len(dims), 'size')}; expected {form}")
    if any(d < 0 for d in dims):
        raise SpmdsimError(f"--shape {args.shape!r} has a negative size; expected {form} >= 0")
    if args.op == "embedding" and dims[-2] < 1:
        # The ids are drawn from [0, VOCAB): an empty vocabulary has none to draw.
        raise SpmdsimError(f"--shape {args.shape!r} gives a vocabulary of {dims[-2]} rows; "
                           "expected VOCAB >= 1")
    # The layers refuse an empty weight in their own words ("ColumnParallelLinear output_size 0 must be ..."),
    # which name no flag: refused here, naming --shape.
    weight = {"linear": ("K", "N"), "mlp": ("H", "F"), "embedding": ("DIM",)}.get(args.op, ())
    for letter, size in zip(weight, dims[len(dims) - len(weight):]):
        if size < 1:
            raise SpmdsimError(f"--shape {args.shape!r} gives {letter} = {size}; expected {form} with "
                               f"{' and '.join(weight)} >= 1 (the layer's weights have no empty dim)")
    return dims


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flag combinations that contradict each other or that the operator would ignore."""
    if args.op == "linear":
        _gather_out(args)
    if args.op == "embedding" and args.mode == "dim" and args.front == "paddle":
        raise SpmdsimError("--front paddle has no --mode dim: Paddle's split() embedding is "
                           "vocab-parallel only; use --front megatron (ParallelEmbedding) for dim")
    if args.op != "matmul":
        return
    map_flags = [flag for flag, value in (
        ("--device-matrix", args.device_matrix), ("--alias-name", args.alias_name),
        ("--x-map", args.x_map), ("--w-map", args.w_map), ("--out-map", args.out_map)) if value]
    sbp_flags = [flag for flag, value in (
        ("--placement", args.placement), ("--x-sbp", args.x_sbp), ("--w-sbp", args.w_sbp),
        ("--out-sbp", args.out_sbp)) if value]
    forms = [flags for flags in ((["--strategy"] if args.strategy else []), map_flags, sbp_flags) if flags]
    if len(forms) > 1:
        raise SpmdsimError(f"{' and '.join('/'.join(f) for f in forms)} both give the layouts; expected "
                           "--strategy [--out-strategy], the Layout flags, or the SBP flags alone")
    if args.out_strategy and not args.strategy:
        raise SpmdsimError("--out-strategy goes with --strategy; with --device-matrix and the "
                           "maps give the wanted output layout as --out-map")


def _gather_out(args: argparse.Namespace) -> bool:
    """Whether `run linear` gathers the column output: the flags, else the front's default.

    Paddle's split() gathers by default (gather_out=True), Megatron's
    ColumnParallelLinear does not (gather_output=False).
    """
    if args.gather_out and args.no_gather_out:
        raise SpmdsimError("--gather-out and --no-gather-out contradict each other; "
                           "expected at most one of them")
    for flag, given in (("--gather-out", args.gather_out), ("--no-gather-out", args.no_gather_out)):
        if given and args.parallel == "row":
            raise SpmdsimError(f"{flag} applies to --parallel column only: a row-parallel "
                               "output is already whole on every rank")
    if args.parallel == "row":
        return False
    if args.gather_out or args.no_gather_out:
        return bool(args.gather_out)
    return args.front == "paddle"


def _out_strategy(text: str) -> tuple[int, ...]:
    parsed = parse_strategy(text)
    if len(parsed) != 1:
        raise SpmdsimError(f"--out-strategy {text!r} gives {len(parsed)} tensors; expected the "
                           "output's only, e.g. \"((8,1),)\"")
    return parsed[0]


def _build(args: argparse.Namespace, comm: Any) -> Any:
    """The job of `args` on `comm` (every check of the command line first: _job_maker)."""
    return _job_maker(args)(comm)


def _job_maker(args: argparse.Namespace, ranks: int | None = None) -> Callable[[Any], Any]:
    """Check the command line (and with --ranks, its device count against `ranks`) without a communicator,
    then the job's maker: the same errors before the --ranks banner as inside the guard on every MPI rank."""
    from ..demo import jobs

    common = {"dtype": args.dtype, "seed": args.seed}
    check_seed(args)
    _check_flags(args)
    dims = _shape(args)
    if ranks is not None and args.op != "matmul":  # matmul's layouts are checked below, as each form makes them
        _check_mp_shapes(args, dims, ranks)
    if args.op == "linear":
        gather_out = _gather_out(args)
        return lambda comm: jobs.linear_job(comm, args.parallel, dims, **common, gather_out=gather_out,
                                            bias=not args.no_bias, front=args.front)
    if args.op == "embedding":
        return lambda comm: jobs.embedding_job(comm, args.mode, dims, **common, front=args.front)
    if args.op == "mlp":
        return lambda comm: jobs.mlp_job(comm, dims, **common, activation=args.activation)
    flags = {"transpose_a": args.transpose_a, "transpose_b": args.transpose_b}
    if args.strategy:
        out = _out_strategy(args.out_strategy) if args.out_strategy else None
        if ranks is not None:  # "needs 8 devices but the world size is 4", as the job says on the ranks
            from ...layouts.dialects.strategy import matmul_layouts
            from ...programs.infer import out_layout_from_strategy

            m = matmul_layouts(args.strategy, ranks, args.transpose_a, args.transpose_b)
            jobs.check_batch_dims(dims, m.strategy, m.x.ndim)  # strategy_matmul_job's refusal
            x_shape, w_shape = _operand_shapes(dims, args.transpose_a, args.transpose_b, m.w.ndim)
            _check_matmul_shapes(args, m.x, m.w, x_shape, w_shape,
                                 None if out is None else out_layout_from_strategy(m.out, out))
        return lambda comm: jobs.strategy_matmul_job(comm, args.strategy, dims, **common, **flags,
                                                     out_strategy=out)
    if args.placement or args.x_sbp or args.w_sbp or args.out_sbp:
        return _sbp_matmul_maker(args, dims, common, flags, ranks)
    if None in (args.device_matrix, args.alias_name, args.x_map, args.w_map):  # given empty: checked below
        raise SpmdsimError("matmul needs --strategy, or --device-matrix, --alias-name, "
                           "--x-map and --w-map, or --placement, --x-sbp and --w-sbp")
    matrix = parse_int_list(args.device_matrix, "--device-matrix")
    if not matrix:
        raise SpmdsimError(f"--device-matrix {args.device_matrix!r} gives no axis; expected at least one size, "
                           "such as 2,4")
    check_device_count(math.prod(matrix), f"--device-matrix {args.device_matrix!r}")
    names = checked_axis_names(parse_name_list(args.alias_name, "--alias-name"), f"--alias-name {args.alias_name!r}",
                               f"--device-matrix {args.device_matrix!r}", len(matrix))
    layout = Layout(matrix, names)
    x_map, w_map = parse_tensor_map(args.x_map), parse_tensor_map(args.w_map)
    x_shape, w_shape = _operand_shapes(dims, args.transpose_a, args.transpose_b, len(w_map))
    out = None
    if args.out_map:
        out_map = parse_tensor_map(args.out_map)
        # Checked here: the operator would report a wrong length as a needed redistribution.
        if len(out_map) != len(dims) - 1:
            raise SpmdsimError(f"--out-map {args.out_map!r} gives {counted(len(out_map), 'dim')} but the "
                               f"output of --shape {args.shape!r} has {len(dims) - 1}; "
                               f"expected {len(dims) - 1} entries")
        out = layout(*out_map)
    x, w = layout(*x_map), layout(*w_map)
    check_ranks(layout, f"--device-matrix {args.device_matrix!r}", ranks)
    if ranks is not None:
        _check_matmul_shapes(args, x, w, x_shape, w_shape, out)
    return lambda comm: jobs.matmul_job(comm, x, w, x_shape, w_shape, **common, **flags, out_layout=out)


def _check_matmul_shapes(args: argparse.Namespace, x: TensorLayout, w: TensorLayout, x_shape: tuple, w_shape: tuple,
                         out: TensorLayout | None) -> None:
    """With --ranks: what matmul_job refuses on every rank once the banner is out (a dim its layout cannot cut,
    an output layout that does not follow), here before it, in the job's own words (DTensor, plan_matmul)."""
    from ...programs.infer import infer_matmul, matmul_shape

    x.check_shape(x_shape)
    w.check_shape(w_shape)
    plan = infer_matmul(x, w, transpose_a=args.transpose_a, transpose_b=args.transpose_b, out=out)
    shape = matmul_shape(x_shape, w_shape, args.transpose_a, args.transpose_b)
    plan.local.check_shape(shape, "matmul output Y")
    plan.out.check_shape(shape, "matmul output Y")


def _check_mp_shapes(args: argparse.Namespace, dims: Sequence[int], ranks: int) -> None:
    """With --ranks: the sizes `run linear/embedding/mlp` cut over its one axis "mp" of `ranks` ranks, refused
    as the job refuses them on every rank (its layers' and Paddle split()'s words), before the banner."""
    from ..demo.jobs import mp_layout
    from ...layouts.dialects.paddle import split_layouts

    mp = mp_layout(ranks)
    if args.op == "mlp":  # ParallelMLP: fc1 column-parallel (H, F), fc2 row-parallel (F, H)
        _, h, f = dims
        mp(None, "mp").check_shape((h, f), "ColumnParallelLinear weight W")
        mp("mp", None).check_shape((f, h), "RowParallelLinear weight W")
    elif args.op == "embedding":
        ids, (vocab, dim) = len(dims) - 2, dims[-2:]
        if args.front == "paddle":
            split_layouts((vocab, dim), "embedding", 0, ranks, True, ids)
        elif args.mode == "vocab":
            mp("mp", None).check_shape((vocab, dim), "VocabParallelEmbedding table")
        else:
            mp(None, "mp").check_shape((vocab, dim), "ParallelEmbedding table")
    elif args.op == "linear":
        m, k, n = dims
        row = args.parallel == "row"
        if row:  # X arrives split on K, as a column-parallel layer leaves it
            mp(None, "mp").check_shape((m, k))
        if args.front == "paddle":
            split_layouts((k, n), "linear", 0 if row else 1, ranks, _gather_out(args))
        elif row:
            mp("mp", None).check_shape((k, n), "RowParallelLinear weight W")
        else:
            mp(None, "mp").check_shape((k, n), "ColumnParallelLinear weight W")
            if not args.no_bias:
                mp("mp").check_shape((n,), "ColumnParallelLinear bias b")


def _operand_shapes(dims: Sequence[int], transpose_a: bool, transpose_b: bool,
                    w_ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """X's and W's stored shapes for --shape B...,M,K,N (W keeps its last `w_ndim` dims)."""
    *batch, m, k, n = dims
    x_shape = tuple(batch) + ((k, m) if transpose_a else (m, k))
    w_shape = tuple(batch)[len(batch) + 2 - w_ndim:] + ((n, k) if transpose_b else (k, n))
    return x_shape, w_shape


def _sbp_matmul_maker(args: argparse.Namespace, dims: Sequence[int], common: dict, flags: dict,
                      ranks: int | None) -> Callable[[Any], Any]:
    """MatMul with OneFlow nD SBPs over a placement: axes axis_0, axis_1, ... (sbp_to_layout's names)."""
    from ..demo import jobs
    from ...layouts.dialects.sbp import sbp_to_layout

    if not (args.placement and args.x_sbp and args.w_sbp):
        raise SpmdsimError("the SBP form of matmul needs --placement, --x-sbp and --w-sbp "
                           "(and optionally --out-sbp)")
    placement = parse_int_list(args.placement, "--placement")
    check_device_count(math.prod(placement), f"--placement {args.placement!r}")
    x_shape, w_shape = _operand_shapes(dims, args.transpose_a, args.transpose_b, 2)
    x = sbp_to_layout(args.x_sbp, placement, len(x_shape))
    w = sbp_to_layout(args.w_sbp, placement, len(w_shape))
    out = sbp_to_layout(args.out_sbp, placement, len(dims) - 1) if args.out_sbp else None
    check_ranks(x.layout, f"--placement {args.placement!r}", ranks)
    if ranks is not None:
        _check_matmul_shapes(args, x, w, x_shape, w_shape, out)
    return lambda comm: jobs.matmul_job(comm, x, w, x_shape, w_shape, **common, **flags, out_layout=out,
                                        op=f"MatMul sbp x ({args.x_sbp}) w ({args.w_sbp})")


def _run_op(args: argparse.Namespace, comm: Any) -> int:
    from ..demo.registry import explain_lines, rank_line, run_job
    from ...runtime.ranked import gather_ranked, trace_lines

    check_trace_out(args)
    try:
        job = _build(args, comm)
    except SpmdsimError as exc:
        raise _with_ways_out(exc, comm) from None
    explained = explain_lines(job) if args.explain else []
    result = run_job(job, comm)
    lines = engine_of(comm).gather_object(comm, [rank_line(job, result.out)] + explained, 0)
    calls = gather_ranked(comm, trace_lines(result.entries))
    if args.trace_out:
        from ...runtime.trace_export import write_chrome_trace

        write_chrome_trace(comm, result.entries, args.trace_out, *result.span)
    if comm.Get_rank() == 0:
        print(report(job, result, lines, args.json, calls, explain=args.explain))
    return 0 if result.verdict.passed else 1


def _with_ways_out(exc: SpmdsimError, comm: Any) -> SpmdsimError:
    """In one process, an error about too few ranks also says how to get them (mpiexec or --ranks)."""
    found = re.search(r"needs (\d+) (?:devices|ranks)", str(exc))
    if comm.Get_size() != 1 or found is None or "--ranks" in str(exc):
        return exc
    from ...runtime.sim.launch import ways_out

    return type(exc)(f"{exc}{ways_out(int(found.group(1)))}")


#: Ranks whose lines a run past FOLD_RANKS ranks prints (then "...", the last rank, and the rule that
#: gives every rank's blocks), as `spmdsim plan --explain` does.
SHOWN_RANKS = 4
_RANK_PREFIX = re.compile(r"rank \d+ \([^)]*\): ")


def fold_rank_lines(job: Any, out: Any, rank_lines: Sequence[Sequence[str]]) -> list[str]:
    """Every rank's lines (its blocks, with --explain its collectives), in rank order.

    Up to FOLD_RANKS ranks, each rank's lines as they are. Past that (one line per rank is 4,096
    lines at 4,096 ranks), ranks whose lines are equal apart from their rank share one entry
    (``ranks 0-3 (4 ranks): holds ...``), and when more than SHOWN_RANKS + 1 entries remain only
    the first SHOWN_RANKS and the last are printed, then the rule that gives every rank's block
    of each tensor and each collective's groups.
    """
    from ..demo.registry import group_text
    from ...layouts.holdings import _layout_and_shape
    from ...programs.plan.summary import FOLD_RANKS, block_rule

    n = len(rank_lines)
    if n <= FOLD_RANKS:
        return [line for lines in rank_lines for line in lines]
    entries: dict[tuple[str, ...], list[int]] = {}
    for rank, lines in enumerate(rank_lines):
        head = _RANK_PREFIX.sub("", lines[0], count=1) if lines else ""
        entries.setdefault((head, *lines[1:]), []).append(rank)
    kinds = sorted(entries.items(), key=lambda item: item[1][0])
    text = []
    shown = kinds if len(kinds) <= SHOWN_RANKS + 1 else kinds[:SHOWN_RANKS] + kinds[-1:]
    for i, (key, ranks) in enumerate(shown):
        if len(ranks) == 1:
            text.extend(rank_lines[ranks[0]])
        else:
            text.append(f"ranks {group_text(ranks, braces=False)}: {key[0]}")
            text.extend(key[1:])
        if len(shown) < len(kinds) and i == SHOWN_RANKS - 1:
            text.append(f"... ({sum(len(r) for _, r in kinds[SHOWN_RANKS:-1]):,} ranks more)")
    if len(shown) == len(kinds):
        return text
    mesh = job.mesh
    text.append(f"each rank's block ({n:,} ranks; the rule gives every rank's, by its coordinates "
                f"on {mesh.layout}):")
    for name, tensor in job.inputs.items():
        layout, shape, _ = _layout_and_shape(name, tensor)
        text.append(f"  {name}: {block_rule(layout, shape)}")
    text.append(f"  output: {block_rule(out.layout, out.global_shape)}")
    for step, _ in job.steps:
        size = len(mesh.group_ranks(step.axes))
        text.append(f"  {step.via} over each rank's group along {', '.join(step.axes)}: "
                    f"{n // size:,} {'group' if n == size else 'groups'} of {size:,} ranks")
    return text


def report(job: Any, result: Any, rank_lines: list, as_json: bool = False,
           calls: Sequence[str] | None = None, explain: bool = False) -> str:
    """The text (or JSON) rank 0 prints for one run (`calls`: every rank's, folded; else rank 0's)."""
    import json

    from ..demo.registry import explain_notes
    from ...runtime.ranked import fold_ranked, trace_lines
    from ...programs.viz.table import nbytes, wrap_lines

    v, stats = result.verdict, result.stats
    if as_json:
        return json.dumps({
            "op": job.op, "layouts": job.layouts, "passed": bool(v.passed),
            "max_abs_error": float(v.max_abs_error), "collectives": stats["counts"],
            "bytes_sent_per_rank": stats["bytes_sent_max"],
        })
    text = [f"{job.op}: {job.layouts} on {job.mesh.layout}"]
    text.extend(fold_rank_lines(job, result.out, rank_lines))
    if explain:
        text.extend(explain_notes(job))
    text.append("collectives:")
    if calls is None:  # only this rank's trace at hand
        calls = fold_ranked([trace_lines(result.entries)])
    text.extend("  " + line for line in calls)
    text.append(f"sent per rank (max): {nbytes(stats['bytes_sent_max'])}")
    text.append(f"max abs error: {float(v.max_abs_error):.3e}  {'PASS' if v.passed else 'FAIL'}")
    return "\n".join(wrap_lines(text))
