"""A pipeline's command-line options, shared by the examples that train over one (pure: argparse only).

``pipeline_arguments(parser)`` adds ``--pp``, ``--microbatches``, ``--schedule`` and
``--virtual-stages``; `pipelined`, `microbatches` and `virtual_stages` read the parsed
arguments with their defaults (2 x pp microbatches with a pipeline, 2 chunks per stage
with the interleaved schedule); `default_microbatches_problem` says why that default
cannot split a batch, naming the flags.
"""
from __future__ import annotations

from typing import Any, Optional

from .schedule import SCHEDULES

__all__ = ["pipeline_arguments", "pipelined", "microbatches", "virtual_stages", "default_microbatches_problem"]


def pipeline_arguments(parser: Any) -> None:
    """Add ``--pp``, ``--microbatches``, ``--schedule`` and ``--virtual-stages`` to an argparse parser."""
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (docs/pipeline.md)")
    parser.add_argument("--microbatches", type=int, default=None,
                        help="microbatches per step (default: 1, or 2 x pp with --pp); gradients accumulate over "
                             "them")
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                        help="the pipeline's schedule (with --pp or --microbatches)")
    parser.add_argument("--virtual-stages", type=int, default=None,
                        help="model chunks per stage with --schedule interleaved (default 2)")


def pipelined(args: Any) -> bool:
    """Whether the step runs as a pipeline's schedule (stages, microbatches to accumulate over, or chunks: the
    pipeline's checks then refuse virtual stages without stages, where a plain step would ignore them)."""
    return args.pp > 1 or (args.microbatches or 1) > 1 or args.schedule != "1f1b" or (args.virtual_stages or 1) > 1


def microbatches(args: Any) -> int:
    """The microbatches per step: ``--microbatches``, else 2 x pp with a pipeline, else 1."""
    return args.microbatches if args.microbatches is not None else (2 * args.pp if args.pp > 1 else 1)


def virtual_stages(args: Any) -> int:
    """Model chunks per stage: ``--virtual-stages``, else 2 with the interleaved schedule, else 1."""
    if args.virtual_stages is not None:
        return args.virtual_stages
    return 2 if args.schedule == "interleaved" else 1


def default_microbatches_problem(args: Any, batch: int) -> Optional[str]:
    """Why the default microbatches (2 x pp, ``--microbatches`` not given) cannot split `batch`, naming the
    default and the flags (a user who never wrote a microbatch count reads where it came from), or None."""
    if args.microbatches is not None or args.pp <= 1:
        return None
    m = microbatches(args)
    if batch % m == 0:
        return None
    return (f"batch {batch} is not divisible by {m} microbatches (the default at --pp {args.pp}: 2 x pp); "
            f"expected --microbatches dividing the batch, or a --batch that {m} divides")
