"""Ring attention as a program: per rank, the blocks of keys and values it attends to step by step and the
messages that bring them (spmdsim.programs.plan.messages.Messages), forward and backward.

Pure. Rank r of a context group of cp holds its queries, keys and values (spmdsim.programs.context.split).
At step s it attends with the keys and values of rank j = (r - s) mod cp, while passing them on to
r + 1 and receiving rank j - 1's from r - 1: the `Pass` posted before step s's `Attend` brings step
s + 1's block, so the transfer can hide behind the compute. The online softmax merges each step's
partial result (a running maximum and sum per query row).

Under a causal mask the balanced split makes every step but the first half a block of work:
keys from an earlier rank (j < r) are seen whole by both query chunks but only their first chunk is
before them; from a later rank (j > r) only the second query chunk sees them, both chunks. Split
naively, a later rank's block is masked whole (no work) and the last rank does cp times the first's.

The backward runs the ring again: each block's keys and values travel as in the forward, and the
gradients of a block's keys and values (dK, dV) follow one step behind, each holder adding its part;
after the last step the sums go home. Per rank and step, one block each of K and V is `block_bytes`, one of
their gradients `grad_bytes` (float32's under bfloat16: the sums travel as float32, as a collective's do):

==========  ==============================  ==========================
pass        sends per rank                  receives per rank
==========  ==============================  ==========================
forward     2 (cp - 1) blocks (K, V)        the same
backward    2 (cp - 1) blocks (K, V)        the same
            + 2 cp gradient blocks          + 2 cp gradient blocks
==========  ==============================  ==========================
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Union

from ..plan.messages import Messages
from .split import check_split, chunks

__all__ = ["Attend", "Pass", "RingProgram", "ring_program", "TAGS"]

#: Message tags: the keys, values and their gradients (matched in posting order between two ranks).
TAGS = {"k": 0, "v": 1, "dk": 2, "dv": 3}


@dataclass(frozen=True)
class Attend:
    """Step `step`: this rank's query chunks `queries` against the key chunks `keys` of rank `source`
    (causal: a key chunk at the query's own place is masked within; an earlier one is seen whole)."""

    step: int
    source: int
    queries: tuple[int, ...]
    keys: tuple[int, ...]

    @property
    def causal(self) -> bool:
        """Whether a mask applies inside the block (a query chunk meets its own key chunk)."""
        return bool(set(self.queries) & set(self.keys))

    def pairs(self, chunk: int) -> int:
        """(query, key) pairs the step scores for chunks of `chunk` tokens: its work."""
        whole, diagonal = chunk * chunk, chunk * (chunk + 1) // 2
        return sum(whole if k < q else diagonal if k == q else 0 for q in self.queries for k in self.keys)


@dataclass(frozen=True)
class Pass:
    """Messages posted before step `step`'s compute: the keys and values step `step` + 1 attends with
    (forward and backward), and in the backward the gradients of the block held at `step` - 1."""

    step: int
    messages: Messages


Action = Union[Attend, Pass]


@dataclass(frozen=True)
class RingProgram:
    """Rank `rank`'s ring attention among `cp` ranks: its forward and backward actions, in order."""

    rank: int
    cp: int
    balanced: bool
    forward: tuple[Action, ...]
    backward: tuple[Action, ...]

    def bytes_sent(self, phase: str = "forward") -> int:
        return sum(a.messages.bytes_sent for a in getattr(self, phase) if isinstance(a, Pass))

    def bytes_received(self, phase: str = "forward") -> int:
        return sum(a.messages.bytes_received for a in getattr(self, phase) if isinstance(a, Pass))

    def pairs(self, seq: int) -> int:
        """The (query, key) pairs the forward scores for sequences of `seq` tokens."""
        chunk = seq // (2 * self.cp if self.balanced and self.cp > 1 else self.cp)
        return sum(a.pairs(chunk) for a in self.forward if isinstance(a, Attend))


def _attend(step: int, rank: int, cp: int, balanced: bool) -> Attend:
    """What rank `rank` attends to at `step` under a causal mask (keys of rank (rank - step) mod cp)."""
    source = (rank - step) % cp
    mine, theirs = chunks(rank, cp, balanced), chunks(source, cp, balanced)
    if source == rank:
        return Attend(step, source, mine, theirs)
    if not balanced:
        return Attend(step, source, mine if source < rank else (), theirs)
    if source < rank:  # their first chunk precedes both of mine; their second follows both
        return Attend(step, source, mine, theirs[:1])
    return Attend(step, source, mine[1:], theirs)  # only my second chunk follows theirs


def _messages(axes: tuple, cp: int, rank: int, sent: tuple, got: tuple, sizes: dict) -> Messages:
    nxt, prev = (rank + 1) % cp, (rank - 1) % cp
    return Messages(axes, cp, tuple((nxt, TAGS[t], sizes[t]) for t in sent),
                    tuple((prev, TAGS[t], sizes[t]) for t in got))


@functools.lru_cache(maxsize=512, typed=True)
def ring_program(rank: int, cp: int, block_bytes: int, axes: tuple[str, ...], balanced: bool = True,
                 seq: Optional[int] = None, grad_bytes: Optional[int] = None) -> RingProgram:
    """Rank `rank`'s ring program among `cp` ranks over the mesh axes `axes`, each K or V block of
    `block_bytes` bytes and each of their gradients' `grad_bytes` (default `block_bytes`) (checked against `seq`
    when given: it must divide into the split's chunks). A pure function of its arguments, its records frozen: kept
    by value (ring attention asks for the same few programs at every layer and microbatch of a dry run)."""
    if seq is not None:
        check_split(cp, seq, balanced)
    else:
        check_split(cp, 2 * cp, balanced)
    kv = ("k", "v")
    grad = block_bytes if grad_bytes is None else grad_bytes
    sizes = {"k": block_bytes, "v": block_bytes, "dk": grad, "dv": grad}
    forward: list = []
    for s in range(cp):
        if s < cp - 1:
            forward.append(Pass(s, _messages(axes, cp, rank, kv, kv, sizes)))
        forward.append(_attend(s, rank, cp, balanced))
    backward: list = []
    grads = ("dk", "dv") if cp > 1 else ()  # (a group of one keeps its own)
    for s in range(cp + 1):
        both = (kv if s < cp - 1 else ()) + (grads if s >= 1 else ())
        if both:  # the same tensors each way: what goes to r + 1 comes from r - 1
            backward.append(Pass(s, _messages(axes, cp, rank, both, both, sizes)))
        if s < cp:
            backward.append(_attend(s, rank, cp, balanced))
    return RingProgram(rank, cp, balanced, tuple(forward), tuple(backward))
