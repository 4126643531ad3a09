"""`spmdsim show`: a picture of a layout (ASCII in the terminal, PNG/SVG with --png)."""
from __future__ import annotations

import argparse
from typing import Any

from ..errors import SpmdsimError
from ..viz.ascii import render_layout_ascii
from ..viz.model import layout_picture
from .cases import add_case_arguments, case_from_args

__all__ = ["register", "run", "MIN_WIDTH"]

#: Narrowest --width: a grid cell with its rank label and border needs about this much.
MIN_WIDTH = 20


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show",
        help="draw a layout: tensor blocks with their ranks and the device matrix",
        description=(
            "Draw the global tensor cut into blocks, each labelled by the ranks that hold "
            "it (r0,1 = replicas, r0+1 = partial terms to add) and its shard number (#0, #1, ...), "
            "then the device matrix with each rank's shard. ASCII by default; --png FILE "
            "also writes a matplotlib picture (.png or .svg)."
        ),
    )
    add_case_arguments(parser)
    parser.add_argument("--png", metavar="FILE", help="also write a picture (.png/.svg/.pdf)")
    parser.add_argument("--name", default=None,
                        help="the tensor's name in titles (default x, or the --operand)")
    parser.add_argument("--width", type=int, default=80,
                        help=f"terminal columns (default 80, at least {MIN_WIDTH})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.width < MIN_WIDTH:
        raise SpmdsimError(f"--width {args.width!r} is too narrow; expected at least {MIN_WIDTH} columns")
    case = case_from_args(args)
    if args.png:
        from ..viz.png import check_picture_path, require_matplotlib
        from .paths import check_output_file

        # Fail before printing anything: the ASCII picture comes first.
        check_output_file(check_picture_path(args.png), "--png")
        require_matplotlib()
    name = args.name or getattr(args, "operand", None) or "x"
    picture = layout_picture(case.tensor_layout, case.shape, name)
    print(render_layout_ascii(picture, width=args.width), end="")
    if args.png:
        from ..viz.png import render_layout_png

        path = render_layout_png(picture, args.png)
        print(f"wrote {path}")
    return 0
