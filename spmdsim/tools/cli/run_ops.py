"""`spmdsim run OP`'s jobs from the command line: the flags checked, the operator's layouts and shapes
(strategy, SBP, Megatron or Paddle forms), and the job run on the ranks and reported (run_report.py).
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Sequence

from ...base.suggest import word_list
from ...base.validate import counted
from ...errors import RankCountError, SpmdsimError
from ...layouts.dialects._common import parse_name_list, parse_tensor_map
from ...layouts.dialects.paddle import split_layouts
from ...layouts.dialects.sbp import sbp_to_layout
from ...layouts.dialects.strategy import parse_strategy
from ...layouts.layout import Layout, TensorLayout
from ...programs.infer import infer_matmul, matmul_shape, out_layout_from_strategy
from ...runtime.engines import engine_of, launcher, ways_out
from ...runtime.ranked import gather_ranked, trace_lines
from ...runtime.trace_export import write_chrome_trace
from ..demo import jobs
from ..demo.jobs import mp_layout
from ..demo.registry import explain_lines, rank_line, run_job
from .case_checks import check_device_count, checked_axis_names, mesh_sizes, parse_int_list
from .common import check_ranks, check_seed, check_trace_out, check_watchdog, with_expected_ranks
from .run_report import report

__all__ = ["check_op", "run_op"]


def check_op(args: argparse.Namespace, ranks: int) -> None:
    """With --ranks `ranks`: every check of the command line that needs no communicator, before the banner."""
    check_watchdog(args)
    check_trace_out(args)
    try:
        _job_maker(args, ranks)
    except RankCountError as exc:  # a strategy's device count: the --ranks it fits, from its numbers
        raise (exc if exc.ways else with_expected_ranks(exc)) from None


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
    # A flag given empty is given (so "--x-map ''" beside --strategy counts, not dropped unsaid): `is not None`.
    map_flags = [flag for flag, value in (
        ("--device-matrix", args.device_matrix), ("--alias-name", args.alias_name),
        ("--x-map", args.x_map), ("--w-map", args.w_map), ("--out-map", args.out_map)) if value is not None]
    sbp_flags = [flag for flag, value in (
        ("--placement", args.placement), ("--x-sbp", args.x_sbp), ("--w-sbp", args.w_sbp),
        ("--out-sbp", args.out_sbp)) if value is not None]
    forms = [flags for flags in ((["--strategy"] if args.strategy is not None else []), map_flags, sbp_flags)
             if flags]
    if len(forms) > 1:
        raise SpmdsimError(f"{' and '.join('/'.join(f) for f in forms)} both give the layouts; expected "
                           "--strategy [--out-strategy], the Layout flags, or the SBP flags alone")
    if args.out_strategy is not None and args.strategy is None:
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
    try:
        parsed = parse_strategy(text)
    except SpmdsimError as exc:  # "strategy 'x' is not a tuple ...", as --strategy's: this flag named first
        raise SpmdsimError(f"--out-strategy {text!r}: {exc}") from None
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
    if args.strategy is not None:
        out = _out_strategy(args.out_strategy) if args.out_strategy is not None else None
        if ranks is not None:  # "needs 8 devices but the world size is 4", as the job says on the ranks
            m = jobs.strategy_matmul_layouts(args.strategy, ranks, dims, args.transpose_a, args.transpose_b)
            x_shape, w_shape = _operand_shapes(dims, args.transpose_a, args.transpose_b, m.w.ndim)
            _check_matmul_shapes(args, m.x, m.w, x_shape, w_shape,
                                 None if out is None else out_layout_from_strategy(m.out, out))
        return lambda comm: jobs.strategy_matmul_job(comm, args.strategy, dims, **common, **flags,
                                                     out_strategy=out)
    if any(flag is not None for flag in (args.placement, args.x_sbp, args.w_sbp, args.out_sbp)):
        return _sbp_matmul_maker(args, dims, common, flags, ranks)
    _check_form_whole(args, "Layout", (("--device-matrix", args.device_matrix), ("--alias-name", args.alias_name),
                                       ("--x-map", args.x_map), ("--w-map", args.w_map)), ("--out-map", args.out_map))
    matrix = parse_int_list(args.device_matrix, "--device-matrix")
    if not matrix:
        raise SpmdsimError(f"--device-matrix {args.device_matrix!r} gives no axis; expected at least one size, "
                           "such as 2,4")
    check_device_count(math.prod(matrix), f"--device-matrix {args.device_matrix!r}")
    names = checked_axis_names(parse_name_list(args.alias_name, "--alias-name"), f"--alias-name {args.alias_name!r}",
                               f"--device-matrix {args.device_matrix!r}", len(matrix))
    layout = Layout(matrix, names)
    x_map, w_map = (parse_tensor_map(text, takes={"sbp": f"--{name}-sbp (over --placement)"})
                    for name, text in (("x", args.x_map), ("w", args.w_map)))
    x_shape, w_shape = _operand_shapes(dims, args.transpose_a, args.transpose_b, len(w_map))
    out = None
    if args.out_map is not None:
        out_map = parse_tensor_map(args.out_map, takes={"sbp": "--out-sbp (over --placement)"})
        # Checked here: the operator would report a wrong length as a needed redistribution.
        if len(out_map) != len(dims) - 1:
            raise SpmdsimError(f"--out-map {args.out_map!r} gives {counted(len(out_map), 'dim')} but the "
                               f"output of --shape {args.shape!r} has {len(dims) - 1}; "
                               f"expected {len(dims) - 1} entries")
        out = _of_flag("--out-map", args.out_map, lambda _: layout(*out_map))
    x = _of_flag("--x-map", args.x_map, lambda _: layout(*x_map))
    w = _of_flag("--w-map", args.w_map, lambda _: layout(*w_map))
    check_ranks(layout, f"--device-matrix {args.device_matrix!r}", ranks)
    if ranks is not None:
        _check_matmul_shapes(args, x, w, x_shape, w_shape, out)
    return lambda comm: jobs.matmul_job(comm, x, w, x_shape, w_shape, **common, **flags, out_layout=out)


def _check_matmul_shapes(args: argparse.Namespace, x: TensorLayout, w: TensorLayout, x_shape: tuple, w_shape: tuple,
                         out: TensorLayout | None) -> None:
    """With --ranks: what matmul_job refuses on every rank once the banner is out (a dim its layout cannot cut,
    an output layout that does not follow), here before it, in the job's own words (DTensor, plan_matmul)."""
    x.check_shape(x_shape)
    w.check_shape(w_shape)
    plan = infer_matmul(x, w, transpose_a=args.transpose_a, transpose_b=args.transpose_b, out=out)
    shape = matmul_shape(x_shape, w_shape, args.transpose_a, args.transpose_b)
    plan.local.check_shape(shape, "matmul output Y")
    plan.out.check_shape(shape, "matmul output Y")


def _check_mp_shapes(args: argparse.Namespace, dims: Sequence[int], ranks: int) -> None:
    """With --ranks: the sizes `run linear/embedding/mlp` cut over its one axis "mp" of `ranks` ranks, refused
    as the job refuses them on every rank (its layers' and Paddle split()'s words), before the banner."""
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


def _check_form_whole(args: argparse.Namespace, form: str, needed: tuple, optional: tuple) -> None:
    """Refuse a matmul form given in part, naming the flags it lacks ("--w-map is missing: ..."); none of its
    flags given (nor --strategy): the forms matmul takes. A flag given empty is refused by its own check."""
    missing = [flag for flag, value in needed if value is None]
    if not missing:
        return
    if len(missing) == len(needed) and optional[1] is None:
        raise SpmdsimError("matmul needs --strategy, or --device-matrix, --alias-name, "
                           "--x-map and --w-map, or --placement, --x-sbp and --w-sbp")
    flags = [flag for flag, _ in needed]
    raise SpmdsimError(f"{word_list(missing, 'and')} {'is' if len(missing) == 1 else 'are'} missing: the {form} "
                       f"form of matmul needs {word_list(flags, 'and')} (and optionally {optional[0]})")


def _sbp_matmul_maker(args: argparse.Namespace, dims: Sequence[int], common: dict, flags: dict,
                      ranks: int | None) -> Callable[[Any], Any]:
    """MatMul with OneFlow nD SBPs over a placement: axes axis_0, axis_1, ... (sbp_to_layout's names)."""
    _check_form_whole(args, "SBP", (("--placement", args.placement), ("--x-sbp", args.x_sbp),
                                    ("--w-sbp", args.w_sbp)), ("--out-sbp", args.out_sbp))
    placement = mesh_sizes(args.placement, "--placement")
    check_device_count(math.prod(placement), f"--placement {args.placement!r}")
    x_shape, w_shape = _operand_shapes(dims, args.transpose_a, args.transpose_b, 2)
    x = _of_flag("--x-sbp", args.x_sbp, lambda sbp: sbp_to_layout(sbp, placement, len(x_shape)))
    w = _of_flag("--w-sbp", args.w_sbp, lambda sbp: sbp_to_layout(sbp, placement, len(w_shape)))
    out = _of_flag("--out-sbp", args.out_sbp, lambda sbp: sbp_to_layout(sbp, placement, len(dims) - 1)) \
        if args.out_sbp is not None else None
    if out is not None and out.partial:  # OneFlow leaves a P output unsummed; the check here sums it first
        axes = [i for i, name in enumerate(out.layout.alias_name) if name in out.partial]
        raise SpmdsimError(f"--out-sbp {args.out_sbp!r} keeps P (a pending sum) on placement "
                           f"{'axis' if len(axes) == 1 else 'axes'} {word_list([str(a) for a in axes], 'and')}; "
                           "run matmul checks the summed output: expected B (Allreduce) or S(d) (Reduce_scatter) "
                           "there, or no --out-sbp")
    check_ranks(x.layout, f"--placement {args.placement!r}", ranks)
    if ranks is not None:
        _check_matmul_shapes(args, x, w, x_shape, w_shape, out)
    return lambda comm: jobs.matmul_job(comm, x, w, x_shape, w_shape, **common, **flags, out_layout=out,
                                        op=f"MatMul sbp x ({args.x_sbp}) w ({args.w_sbp})")


def _of_flag(flag: str, text: str, read: Callable[[str], TensorLayout]) -> TensorLayout:
    """``read(text)``, its refusal led by the flag that gave `text` (``--w-sbp 'B,S(3)': ...``): matmul takes a
    layout per operand, and a bare "sbp 'Q' is not valid" does not say whose."""
    try:
        return read(text)
    except SpmdsimError as exc:
        said = str(exc).replace(f" in {text!r}", "", 1).replace(_ELSEWHERE, _HERE if flag.endswith("-sbp") else "")
        raise type(exc)(f"{flag} {text!r}: {said}") from None


#: The reader the SBP parser names for a DTensor placement, which `run matmul` has no flag for; its SBP spelling.
_ELSEWHERE = " (--placements on the command line)"
_HERE = " (not on run matmul, whose --x-sbp and --w-sbp take an SBP: S(0) for Shard(0), B for Replicate())"


def run_op(args: argparse.Namespace, comm: Any) -> int:
    check_trace_out(args)
    try:
        job = _build(args, comm)
    except RankCountError as exc:  # a strategy's device count (too many, or not a divisor): how to get them
        size = comm.Get_size()
        raise (exc if exc.ways else exc.with_ways(ways_out(exc.needed, size, launcher(size)))) from None
    explained = explain_lines(job) if args.explain else []
    result = run_job(job, comm)
    lines = engine_of(comm).gather_object(comm, [rank_line(job, result.out)] + explained, 0)
    calls = gather_ranked(comm, trace_lines(result.entries))
    if args.trace_out:
        write_chrome_trace(comm, result.entries, args.trace_out, *result.span)
    if comm.Get_rank() == 0:
        print(report(job, result, lines, args.json, calls, explain=args.explain))
    return 0 if result.verdict.passed else 1
