"""`spmdsim show`: a picture of a layout (ASCII in the terminal, PNG/SVG with --png)."""
from __future__ import annotations

import argparse
import math
from typing import Any

from ...base.validate import counted
from ...errors import SpmdsimError
from ...programs.viz.ascii import render_layout_ascii
from ...programs.viz.model import layout_picture
from ...programs.viz.png import check_picture_path, check_picture_ranks, render_layout_png, require_matplotlib
from ...programs.viz.table import MAX_WIDTH, width_problem
from .cases import add_case_arguments, case_from_args
from ...layouts.dialects.strategy import matmul_layouts, parse_strategy
from .case_checks import parse_int_list
from .paths import check_output_file
from ...programs.viz.matmul import matmul_ascii, render_matmul_png

__all__ = ["register", "run", "MIN_WIDTH", "short_name"]

#: Narrowest --width: a grid cell with its rank label and border needs about this much.
MIN_WIDTH = 20


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show",
        help="draw a layout: tensor blocks with their ranks and the device matrix",
        description=(
            "Draw the global tensor cut into blocks, each labelled by the ranks that hold "
            "it (r0,1 = replicas, r0+1 = partial terms to add) and its shard number (`#0`, `#1`, ...), "
            "then the device matrix with each rank's shard. ASCII by default; --png FILE "
            "also writes a matplotlib picture (.png or .svg)."
        ),
    )
    add_case_arguments(parser)
    parser.add_argument("--png", metavar="FILE", help="also write a picture (.png/.svg/.pdf; up to 256 ranks)")
    parser.add_argument("--name", default=None,
                        help="the tensor's name in titles (default x, or the --operand's name); a name longer "
                             "than half the --width is cut to its start and ...")
    parser.add_argument("--matmul", action="store_true",
                        help='with a MatMul --strategy such as "((1,2),(2,1))" and --shape M,K,N: draw '
                             "x, w and out side by side and each rank's partial sum with numbers")
    parser.add_argument("--width", type=int, default=80,
                        help=f"terminal columns (default 80, {MIN_WIDTH} to {MAX_WIDTH:,})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    problem = width_problem(args.width, MIN_WIDTH)
    if problem:
        raise SpmdsimError(problem)
    if args.matmul:
        return _matmul(args)
    case = case_from_args(args)
    if args.png is not None:
        # Fail before printing anything: the ASCII picture comes first.
        check_output_file(check_picture_path(args.png, "--png"), "--png")
        check_picture_ranks(case.tensor_layout.layout.num_devices, "--png", "the ASCII picture shows every rank")
        require_matplotlib()
    name = short_name(args.name or getattr(args, "operand", None) or "x", args.width)
    picture = layout_picture(case.tensor_layout, case.shape, name)
    print(render_layout_ascii(picture, width=args.width), end="")
    if args.png is not None:
        path = render_layout_png(picture, args.png)
        print(f"wrote {path}")
    return 0


def short_name(name: str, width: int) -> str:
    """`name` for the pictures' titles: past half the --width, its head and "..." (a 5,000-character --name
    printed a 5,006-column title; the heading wrapped it over 63 lines)."""
    most = max(8, width // 2)
    return name if len(name) <= most else name[:most - 3] + "..."


def _matmul(args: argparse.Namespace) -> int:
    """`show --matmul`: the three tensors of a MatMul strategy and its partial sums."""
    if args.operand is not None:  # else dropped: --matmul draws all three
        raise SpmdsimError(f"--operand {args.operand} picks one tensor of the MatMul to draw; --matmul draws x, w "
                           "and out: give one of them")
    if not args.strategy or len(parse_strategy(args.strategy)) != 2:
        raise SpmdsimError("--matmul needs a MatMul --strategy of two tensors such as \"((1,2),(2,1))\", "
                           + (f"got {args.strategy!r}" if args.strategy else "and none was given"))
    mkn = parse_int_list(args.shape or "", "--shape")
    if len(mkn) != 3:
        raise SpmdsimError(f"--matmul takes --shape M,K,N, got {args.shape!r}")
    strategy = parse_strategy(args.strategy)
    for name, counts in zip("xw", strategy):  # a count too many would read as a batch dim, then as a mismatch
        if len(counts) != 2:
            raise SpmdsimError(f"--matmul draws 2-D x and w (--shape M,K,N), but --strategy {args.strategy!r} gives "
                               f"{name} {counted(len(counts), 'slice count')}; expected 2 per tensor")
    world = args.world_size or math.prod(strategy[0]) * strategy[1][-1]
    layouts = matmul_layouts(strategy, world)
    for tl, shape in ((layouts.x, mkn[:2]), (layouts.w, mkn[1:]), (layouts.out, (mkn[0], mkn[2]))):
        tl.check_shape(shape)
    if args.png is not None:
        check_output_file(check_picture_path(args.png, "--png"), "--png")
        check_picture_ranks(layouts.layout.num_devices, "--png", "the ASCII picture shows every rank")
        require_matplotlib()
    print(matmul_ascii(layouts, mkn, args.width), end="")
    if args.png is not None:
        print(f"wrote {render_matmul_png(layouts, mkn, args.png)}")
    return 0
