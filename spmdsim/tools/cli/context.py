"""`spmdsim context`: how a sequence splits over context-parallel ranks, ring attention's steps, each
method's bytes.

    spmdsim context --cp 4 --seq 4096
    spmdsim context --cp 8 --seq 131072 --split naive --heads 32 --kv-heads 8 --head-dim 128

Pure: the split and the ring's program are worked out, never run (docs/explanation/context-parallel.md).
"""
from __future__ import annotations

import argparse
from typing import Any

from ...base.once_parser import Choices, note_no_ranks
from ...errors import SpmdsimError
from ...models.gpt.flags import MAX_SIZE, size_problem
from ...programs.context import SPLITS
from ...programs.context.picture import render
from ...programs.viz.table import MAX_WIDTH, WIDTH, width_problem, wrap_lines

__all__ = ["register", "run", "MAX_CP"]

#: Most context-parallel ranks the grid draws (cp rows of cp steps).
MAX_CP = 64
_ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp64": 8}
#: numpy's names, which `plan --dtype` and `collective --dtype` take, as this command spells them.
_NUMPY_NAMES = {numpy: f"{numpy!r} is written {short!r} here" for numpy, short in (
    ("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"), ("float64", "fp64"))}
#: What --cp-method, the trainer's and estimate's flag, given to this command, is said to be.
_ONE_METHOD = ("examples/train_gpt.py's and spmdsim estimate's, which run or price one method; context prints "
               "each method's bytes (ring, allgather, alltoall)")
#: A gradient's bytes an element as summed and sent: float32 below it (spmdsim.base.precision.sent_itemsize).
_SUMMED = {name: max(size, 4) for name, size in _ITEMSIZE.items()}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "context",
        help="show how context parallelism splits a sequence and what ring attention sends",
        description=(
            "Split a sequence over context-parallel ranks (balanced for causal masks as Megatron-LM "
            "does: 2 x cp chunks, rank r holding chunks r and 2cp-1-r; or naive), print the ring "
            "attention's steps (whose keys and values each rank attends with, and how much of the "
            "block is work), the causal work per rank, and the bytes one rank sends per attention by "
            "each method (ring, allgather, alltoall) for the given shape."),
    )
    note_no_ranks(parser, "context", "--cp")
    parser.elsewhere.update(dict.fromkeys(("--cp-method", "--method"), _ONE_METHOD))
    parser.add_argument("--cp", type=int, required=True, metavar="N", help=f"context-parallel ranks (1 to {MAX_CP})")
    parser.add_argument("--seq", type=int, required=True, metavar="T",
                        help=f"tokens per sequence (each size, --seq to --head-dim, at most {MAX_SIZE:,})")
    parser.add_argument("--split", choices=SPLITS, default="balanced",
                        help="how the sequence is cut (default balanced)")
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="sequences per rank (default 1)")
    parser.add_argument("--heads", type=int, default=32, help="query heads (default 32)")
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (default: --heads)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim (default 128)")
    parser.add_argument("--dtype", choices=Choices(tuple(_ITEMSIZE), _NUMPY_NAMES), default="bf16",
                        help="activations' dtype (default bf16)")
    parser.add_argument("--width", type=int, default=WIDTH,
                        help=f"terminal columns (default {WIDTH}, 40 to {MAX_WIDTH:,})")
    parser.set_defaults(func=run)


def _checked(args: argparse.Namespace) -> tuple[int, int, int]:
    """(q_bytes, kv_bytes, grad_bytes) of one rank's blocks (grad_bytes: a K or V block's gradients as summed),
    every value refused with its flag when out of range."""
    if not 1 <= args.cp <= MAX_CP:
        raise SpmdsimError(f"--cp {args.cp!r} is out of range; expected 1 to {MAX_CP} (the grid draws cp x cp cells)")
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    for flag, value in (("--seq", args.seq), ("--batch", args.batch), ("--heads", args.heads),
                        ("--kv-heads", kv_heads), ("--head-dim", args.head_dim)):
        if value < 1:
            raise SpmdsimError(f"{flag} {value!r} must be at least 1")
        problem = size_problem(flag, value)
        if problem:
            raise SpmdsimError(problem)
    if args.heads % kv_heads:
        raise SpmdsimError(f"--heads {args.heads} is not a multiple of --kv-heads {kv_heads}")
    problem = width_problem(args.width, 40)
    if problem:
        raise SpmdsimError(problem)
    elements = args.batch * (args.seq // args.cp) * args.head_dim
    rows = elements * _ITEMSIZE[args.dtype]
    return rows * args.heads, rows * kv_heads, elements * _SUMMED[args.dtype] * kv_heads


def run(args: argparse.Namespace) -> int:
    q_bytes, kv_bytes, grad_bytes = _checked(args)
    heads = (args.heads, args.heads if args.kv_heads is None else args.kv_heads)
    lines = render(args.cp, args.seq, args.split == "balanced", kv_bytes, q_bytes, args.width, grad_bytes, heads)
    print("\n".join(wrap_lines(lines, args.width)))
    return 0
