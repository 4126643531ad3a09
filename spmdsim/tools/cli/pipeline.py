"""`spmdsim pipeline`: a pipeline schedule's stage x time grid, its bubble and in-flight counts.

    spmdsim pipeline --schedule 1f1b --stages 4 --microbatches 8
    spmdsim pipeline --schedule interleaved --stages 4 --microbatches 8 --virtual-stages 2
    spmdsim pipeline --file my_schedule.txt

Pure: the schedules are built (or read) and checked, never run (docs/howto/pipelines.md).
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from ...base.once_parser import note_no_ranks
from ...base.validate import read_bounded
from ...errors import SpmdsimError
from ...programs.pipeline.parse import MAX_TEXT, TOKENS, parse, sizes
from ...programs.pipeline.picture import plot, render
from ...programs.pipeline.records import MAX_PAIRS
from ...programs.pipeline.schedule import SCHEDULES, build
from ...programs.viz.png import check_picture_path, require_matplotlib
from ...programs.viz.table import MAX_WIDTH, WIDTH, width_problem, wrap_lines
from ...programs.pipeline.options import schedule_choice
from .paths import check_output_file

__all__ = ["register", "run", "MIN_WIDTH"]

#: Narrowest --width: the stage label and a few cells.
MIN_WIDTH = 40

_CHECKED = "checked: each F and B once, inputs before use, every send meets one receive, no deadlock"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pipeline",
        help="draw a pipeline schedule (gpipe, 1f1b, interleaved or a file) with its bubble",
        description=(
            "Build a pipeline-parallel schedule (or read a hand-written one with --file), check it "
            "(every message meets its peer, no deadlock when sends wait for their receives) and "
            "print its stage x time grid at one unit per forward or backward, the bubble beside the "
            f"paper's formula and the microbatches in flight per stage. File tokens: {TOKENS}."
        ),
    )
    note_no_ranks(parser, "pipeline", "--stages")
    parser.add_argument("--schedule", type=schedule_choice, choices=SCHEDULES, default=None,
                        help="which schedule to build (default 1f1b; any case: 1F1B, GPipe; not with --file)")
    parser.add_argument("--stages", type=int, metavar="P",
                        help="pipeline stages (ranks); with --file, the file's unless given")
    parser.add_argument("--microbatches", type=int, metavar="M",
                        help="microbatches per step; with --file, the file's unless given")
    parser.add_argument("--virtual-stages", type=int, default=None, metavar="V",
                        help="model chunks per stage (interleaved: default 2; with --file, the file's; otherwise 1)")
    parser.add_argument("--file", metavar="FILE",
                        help="read a hand-written schedule: one 'stage N: F0 send-act0 ...' line per stage")
    parser.add_argument("--png", metavar="FILE", help="also draw the grid (.png/.svg/.pdf)")
    parser.add_argument("--width", type=int, default=WIDTH,
                        help=f"terminal columns (default {WIDTH}, {MIN_WIDTH} to {MAX_WIDTH:,})")
    parser.set_defaults(func=run)


def _sizes(args: argparse.Namespace) -> tuple[int, int, int]:
    """(stages, microbatches, virtual stages), each refused with its flag's name when out of range."""
    if args.stages is None and args.microbatches is None:
        raise SpmdsimError("no schedule to draw; expected --stages P and --microbatches M to build one, or "
                           "--file FILE to read a hand-written one")
    if args.stages is None or args.microbatches is None:
        given, other = (("--stages", args.stages), "--microbatches M") if args.microbatches is None else (
            ("--microbatches", args.microbatches), "--stages P")
        raise SpmdsimError(f"{given[0]} {given[1]!r} without {other}; expected both to build a schedule, or "
                           f"--file FILE to read a hand-written one")
    interleaved = args.schedule == "interleaved"
    virtual = args.virtual_stages if args.virtual_stages is not None else (2 if interleaved else 1)
    for flag, value in (("--stages", args.stages), ("--microbatches", args.microbatches),
                        ("--virtual-stages", virtual)):
        if value < 1:
            raise SpmdsimError(f"{flag} {value!r} must be at least 1")
    problem = width_problem(args.width, MIN_WIDTH)
    if problem:
        raise SpmdsimError(problem)
    pairs = args.stages * args.microbatches * virtual
    if pairs > MAX_PAIRS:
        raise SpmdsimError(f"--stages {args.stages} x --microbatches {args.microbatches} x "
                           f"--virtual-stages {virtual} = {pairs:,} (microbatch, chunk) pairs is too many "
                           f"to draw; expected at most {MAX_PAIRS:,}")
    # as training refuses it (spmdsim.models.gpt.pipeline_problems.pipeline_layout_problem)
    if interleaved and args.stages < 2:
        raise SpmdsimError(f"--stages {args.stages!r} gives the interleaved schedule one stage; it puts chunk k on "
                           f"stage k mod p, so it needs --stages 2 or more, as training does (one stage is "
                           f"--schedule 1f1b)")
    if interleaved and virtual < 2:
        raise SpmdsimError(f"--virtual-stages {virtual!r} gives one chunk per stage; the interleaved "
                           f"schedule needs at least 2 (one chunk per stage is --schedule 1f1b)")
    if args.file is None and not interleaved and virtual != 1:
        raise SpmdsimError(f"--virtual-stages {virtual!r} is for --schedule interleaved (or --file); "
                           f"--schedule {args.schedule or '1f1b'} holds one chunk per stage")
    if interleaved and args.microbatches % args.stages:
        raise SpmdsimError(f"--microbatches {args.microbatches!r} is not a multiple of --stages "
                           f"{args.stages!r}; the interleaved schedule needs one (as Megatron)")
    return args.stages, args.microbatches, virtual


def _read(path: str) -> str:
    """The text of --file, or one SpmdsimError line naming it."""
    try:
        return read_bounded(path, MAX_TEXT, f"--file {path!r}", "a schedule of one line per stage")
    except UnicodeDecodeError:
        raise SpmdsimError(f"--file {path!r} is not UTF-8 text; expected a schedule file") from None
    except OSError as exc:
        raise SpmdsimError(f"--file {path!r} cannot be read: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    if args.file is not None and args.schedule is not None:
        raise SpmdsimError(f"--file {args.file!r} holds its own schedule, and --schedule {args.schedule!r} "
                           f"names a built one; expected one of them")
    text = None
    if args.file is not None:
        text = _read(args.file)
        if None in (args.stages, args.microbatches, args.virtual_stages):  # the file's own sizes
            given = (args.stages, args.microbatches, args.virtual_stages)
            args.stages, args.microbatches, args.virtual_stages = (
                own if mine is None else mine for mine, own in zip(given, sizes(text, os.path.basename(args.file))))
    stages, microbatches, virtual = _sizes(args)
    if args.png is not None:
        # Fail before printing anything: the text grid comes first.
        check_output_file(check_picture_path(args.png, "--png"), "--png")
        require_matplotlib()
    if args.file is not None:
        schedule = parse(text, stages, microbatches, virtual, name=os.path.basename(args.file))
    else:
        schedule = build(args.schedule or "1f1b", stages, microbatches, virtual)
    print(render(schedule, width=args.width), end="")
    print("\n".join(wrap_lines([_CHECKED], args.width)))
    if args.png is not None:
        print(f"wrote {plot(schedule, args.png)}")
    return 0
