"""A pipeline's command-line options, shared by the examples that train over one (pure: argparse only).

``pipeline_arguments(parser)`` adds ``--pp``, ``--microbatches``, ``--schedule`` and
``--virtual-stages``, and the layers' split (`split_arguments`); `pipelined`, `microbatches` and
`virtual_stages` read the parsed arguments with their defaults (2 x pp microbatches with a pipeline,
2 chunks per stage with the interleaved schedule); `default_microbatches_problem` says why that
default cannot split a batch, and `default_virtual_problem` why the interleaved schedule's default chunks
need a pipeline, naming the flags.

The layers' split (`split_arguments`, `layer_split`; `spmdsim estimate gpt` takes the same flags):
by default the chunks are balanced (spmdsim.models.gpt.stages: the first take one more where they do not
divide). ``--first-stage-layers N`` and ``--last-stage-layers N`` are Megatron's
``--decoder-first-pipeline-num-layers`` and ``--decoder-last-pipeline-num-layers``: the first (last)
stage takes N layers and the other stages share the rest evenly (refused where they cannot, as
Megatron asserts); with V virtual stages a stage's count is spread evenly over its V chunks and must
be a multiple of V (Megatron-core's rule). ``--stage-layers 7,8,...,7`` gives every chunk's count, in
pipeline order (chunk k on stage k mod pp: pp x V counts; NxK for K counts of N: 7,8x14,7); only the first
and the last may be 0.
"""
from __future__ import annotations

from typing import Any, Optional

from ...base.typed_numbers import add_noted
from .schedule import SCHEDULES

__all__ = ["schedule_choice", "pipeline_arguments", "pipelined", "microbatches", "virtual_stages",
           "default_microbatches_problem", "default_virtual_problem", "split_arguments", "layer_split", "split_words"]


def schedule_choice(text: str) -> str:
    """argparse type of every --schedule flag (the examples', ``spmdsim pipeline``'s, ``spmdsim estimate``'s): a
    schedule's name in any case, as the docs and papers write it (GPipe, 1F1B, Interleaved), as its SCHEDULES
    name; anything else as typed, for argparse's "invalid choice" line (choices=SCHEDULES)."""
    name = text.strip().lower()
    return name if name in SCHEDULES else text


def pipeline_arguments(parser: Any) -> None:
    """Add ``--pp``, ``--microbatches``, ``--schedule`` and ``--virtual-stages`` to an argparse parser."""
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (docs/howto/pipelines.md)")
    parser.add_argument("--microbatches", type=int, default=None,
                        help="microbatches per step (default: 1, or 2 x pp with --pp); gradients accumulate over "
                             "them")
    add_noted(parser, "--schedule", type=schedule_choice, choices=SCHEDULES, default="1f1b",  # typed: refused alone
              help="the pipeline's schedule (with --pp or --microbatches; any case: 1F1B, GPipe)")
    parser.add_argument("--virtual-stages", type=int, default=None,
                        help="model chunks per stage with --schedule interleaved (default 2)")
    split_arguments(parser)


def split_arguments(parser: Any) -> None:
    """Add ``--first-stage-layers``, ``--last-stage-layers`` and ``--stage-layers`` (module docstring)."""
    parser.add_argument("--first-stage-layers", type=int, default=None, metavar="N",
                        help="the first pipeline stage's layers, the other stages sharing the rest evenly "
                             "(Megatron's --decoder-first-pipeline-num-layers; default: balanced)")
    parser.add_argument("--last-stage-layers", type=int, default=None, metavar="N",
                        help="the last pipeline stage's layers (Megatron's --decoder-last-pipeline-num-layers)")
    parser.add_argument("--stage-layers", default=None, metavar="N,N,...",
                        help="every pipeline chunk's layers in pipeline order, one count per stage (per chunk with "
                             "virtual stages: chunk k on stage k mod pp); NxK: K chunks of N, e.g. 7,8x14,7")


def _runs(counts: Any) -> str:
    """Layer counts in pipeline order, a run of equal ones as "8 x 14": "7, 8 x 14, 7"."""
    out: list = []
    for n in counts:
        if out and out[-1][0] == n:
            out[-1][1] += 1
        else:
            out.append([n, 1])
    return ", ".join(f"{n} x {k}" if k > 2 else ", ".join([str(n)] * k) for n, k in out)


def split_words(counts: Any) -> str:
    """How a split reads in a run's header lines: the counts in pipeline order, runs shortened ("7, 8 x 14, 7")."""
    return _runs(counts)


def layer_split(args: Any, layers: int, pp: int, virtual: int) -> tuple[Optional[tuple], Optional[str]]:
    """(layers per chunk in pipeline order, None) from `split_arguments`' flags for a model of `layers` blocks on
    `pp` stages of `virtual` chunks each, (None, None) where none is given (the balanced default), or (None,
    the one line that refuses them, naming the flag and the value). Pure: every rank alike."""
    first, last, given = args.first_stage_layers, args.last_stage_layers, args.stage_layers
    flags = [f"--{name} {value}" for name, value in (("first-stage-layers", first), ("last-stage-layers", last),
                                                     ("stage-layers", given)) if value is not None]
    chunks = pp * virtual
    where = f"--pp {pp} x --virtual-stages {virtual} = {chunks} chunks" if virtual > 1 else f"--pp {pp} stages"
    if not flags:  # the balanced default: a layer at least in every chunk (a schedule of one chunk a stage given
        # --virtual-stages is refused by the schedule's check, which names what is wrong)
        chunked = virtual == 1 or getattr(args, "schedule", None) in (None, "interleaved")
        return None, (f"--layers {layers} cannot fill {where}: each {'chunk' if virtual > 1 else 'stage'} needs a "
                      "layer at least" if 1 < pp and layers < chunks and chunked else None)
    if pp < 2:
        return None, f"{flags[0]} splits the layers over pipeline stages: give --pp 2 or more (got --pp {pp})"
    if given is not None:
        if len(flags) > 1:
            return None, (f"{flags[-1]} gives every chunk's layers: leave out {flags[0]} (or give "
                          "--first-stage-layers and --last-stage-layers alone)")
        words = [w.strip().split("x") for w in str(given).split(",")]
        if not all(all(p.isdigit() for p in w) and len(w) <= 2 and int(w[-1]) * len(w) > 0 or w == ["0"]
                   for w in words):
            return None, (f"--stage-layers {given!r} must be layer counts (integers >= 0) separated by commas, a "
                          "run of K equal counts N as NxK (K >= 1), e.g. 7,8x14,7")
        counts = tuple(int(w[0]) for w in words for _ in range(int(w[1]) if len(w) == 2 else 1))
        if len(counts) != chunks:
            return None, (f"--stage-layers {given} gives {len(counts)} counts: expected {chunks}, one for "
                          f"each of {where}")
        if sum(counts) != layers:
            return None, f"--stage-layers {given} covers {sum(counts)} layers: expected the model's {layers}"
        empty = [c for c in range(1, chunks - 1) if counts[c] == 0]
        if empty:
            return None, (f"--stage-layers {given} leaves chunk {empty[0]} without a layer: only the first and "
                          "the last chunk, which hold the embedding and the head, may have none")
        return counts, None
    for flag, value in (("first", first), ("last", last)):
        if value is not None and value < 0:
            return None, f"--{flag}-stage-layers {value} must be >= 0"
    ends = [n for n in (first, last) if n is not None]
    rest, others = layers - sum(ends), pp - len(ends)
    both = " and ".join(flags)
    if rest < 0:
        return None, f"{both} {'take' if len(ends) > 1 else 'takes'} {sum(ends)} layers: more than the model's {layers}"
    if others == 0 and rest:
        return None, (f"{both} take {sum(ends)} of the model's {layers} layers and --pp {pp} has no other stage for "
                      f"the {rest} left: expected them to add up to {layers}")
    share, odd = divmod(rest, others) if others else (0, 0)
    if odd or (share == 0 and pp > 2):
        return None, (f"{both} {'leave' if len(ends) > 1 else 'leaves'} {rest} layers for the other {others} "
                      "stages, which must share them evenly, a layer at least each (as Megatron's flags do); "
                      "give --stage-layers for any other split")
    counts = [share] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    for s, n in enumerate(counts):
        if n % virtual:
            which = {0: "first", pp - 1: "last"}.get(s)
            what = f"--{which}-stage-layers {n}" if which and (first if s == 0 else last) is not None else \
                f"{n} layers a stage"
            return None, (f"{what} cannot be spread evenly over --virtual-stages {virtual} chunks: expected a "
                          f"multiple of {virtual} (Megatron's rule), or give each chunk's with --stage-layers")
    per_chunk = [counts[s] // virtual for s in range(pp)]
    if virtual > 1 and 0 in per_chunk:
        s = per_chunk.index(0)
        return None, (f"{flags[0]} leaves every chunk of stage {s} without a layer; with --virtual-stages "
                      f"{virtual} only the first and the last chunk may have none: give them with --stage-layers")
    return tuple(per_chunk[c % pp] for c in range(chunks)), None


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


def default_virtual_problem(args: Any) -> Optional[str]:
    """Why ``--schedule interleaved`` without ``--virtual-stages`` (2 chunks a stage by default) cannot run for want
    of a pipeline, naming the default and the flags (the user never wrote a chunk count), or None."""
    if args.virtual_stages is not None or args.schedule != "interleaved" or args.pp > 1:
        return None
    return (f"--schedule interleaved interleaves 2 model chunks a stage (the default --virtual-stages) over the "
            f"pipeline's stages: expected --pp 2 or more, got --pp {args.pp}")
