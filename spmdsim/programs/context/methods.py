"""The three ways attention meets a sequence split over the context axis, and the bytes each moves.

Pure. ``ring``: keys and values travel round the ring over point-to-point messages
(spmdsim.programs.context.ring), partial results merged by the online softmax. ``allgather``: keys and
values gathered whole before attention (Llama 3's method), their gradients reduce-scattered back.
``alltoall``: queries, keys and values exchanged from a sequence split to a head split (DeepSpeed-Ulysses),
attention on whole sequences of cp times fewer heads, the output exchanged back; heads must divide.

Bytes per rank for one attention, forward and backward, with `q_bytes` this rank's query (and output)
block, `kv_bytes` its key (and value) block and `g` a K or V block's gradients as summed (`grad_bytes`:
float32's under bfloat16, spmdsim.base.precision.sent_itemsize), each on the sequence split (MOVED: the
collectives' bandwidth-optimal counts, spmdsim.programs.transfer):

==========  ===================================  ===================================
method      forward                              backward
==========  ===================================  ===================================
ring        2 (cp-1) kv                          2 (cp-1) kv + 2 cp g
allgather   2 Allgather(kv) = 2 (cp-1) kv        2 Reduce_scatter(cp g) = 2 (cp-1) g
alltoall    Alltoall of q, k, v, out             the same four, conjugate
==========  ===================================  ===================================
"""
from __future__ import annotations

from typing import Optional

from ...errors import ShapeError
from ..transfer import MOVED
from .ring import ring_program

__all__ = ["METHODS", "traffic", "check_heads", "undivided_heads"]

METHODS = ("ring", "allgather", "alltoall")


def check_heads(method: str, cp: int, heads: int, kv_heads: int, tp: int = 1) -> None:
    """Refuse, in one line, a method the heads cannot take: the all-to-all splits the heads (and K/V
    heads) of each tensor-parallel rank over cp."""
    if method not in METHODS:
        raise ShapeError(f"context-parallel method {method!r} is not one of {', '.join(METHODS)}")
    undivided = undivided_heads(method, cp, heads, kv_heads, tp)
    if undivided:
        what, n = undivided
        raise ShapeError(f"the all-to-all method splits {what} over tp x cp = {tp * cp}: {n} {what} "
                         f"do not divide; expected a multiple of {tp * cp} (or --cp-method ring)")


def undivided_heads(method: str, cp: int, heads: int, kv_heads: int, tp: int = 1) -> Optional[tuple]:
    """("heads" or "K/V heads", their count) of the first that `method` cannot split over tp x cp (the
    all-to-all gives each rank whole sequences of tp x cp times fewer heads), or None."""
    if method == "alltoall":
        for what, n in (("heads", heads), ("K/V heads", kv_heads)):
            if n % (tp * cp):
                return what, n
    return None


def traffic(method: str, cp: int, q_bytes: int, kv_bytes: int, grad_bytes: Optional[int] = None) -> tuple[int, int]:
    """(forward, backward) bytes one rank sends for one attention by `method` among `cp` ranks (`grad_bytes`: a
    K or V block's gradients as summed, default `kv_bytes`)."""
    grad = kv_bytes if grad_bytes is None else grad_bytes
    if method not in METHODS:
        raise ShapeError(f"context-parallel method {method!r} is not one of {', '.join(METHODS)}")
    if cp == 1:
        return 0, 0
    if method == "ring":
        program = ring_program(0, cp, kv_bytes, ("context",), grad_bytes=grad)
        return program.bytes_sent("forward"), program.bytes_sent("backward")
    if method == "allgather":
        gathered = 2 * MOVED["allgather"](cp, kv_bytes)
        return gathered, 2 * MOVED["reduce_scatter"](cp, cp * grad)
    moved = 2 * MOVED["alltoall"](cp, q_bytes) + 2 * MOVED["alltoall"](cp, kv_bytes)
    return moved, moved
