"""A pipeline stage's program (spmdsim.programs.pipeline's actions) as the plain tuples its step runs
(spmdsim.models.gpt.stage_program), worked out once per program, and its messages' tags."""
from __future__ import annotations

from typing import Any, Sequence

from ...programs.pipeline.records import Compute, Post, Send
from ...base.tables import put

__all__ = ["compiled", "compiled_once", "message_tag", "op_tag"]


def message_tag(what: str, chunk: int) -> int:
    """A message's tag: its kind and the chunk that sent it. Messages between two ranks with one tag match
    in the order posted, and every checked schedule posts each kind's receives in the order the peer
    sends (GPipe's gradients go in reverse microbatch order on both sides; spmdsim.programs.pipeline.check)."""
    return 2 * chunk + (what == "grad")


def op_tag(op: Any) -> int:
    """The tag of a Send or Recv `op`: a send's its own chunk's, a receive's the sender's (an activation from the
    chunk before, a gradient from the chunk after)."""
    sender = op.chunk if isinstance(op, Send) else op.chunk - 1 if op.what == "act" else op.chunk + 1
    return message_tag(op.what, sender)


#: Each program's `compiled` tuples by its id, the program held beside them (its id not reused meanwhile): a
#: search's dry runs run the same stage programs (schedule.build's, cached) again and again.
_COMPILED: dict = {}


def compiled_once(program: Sequence) -> tuple:
    """`compiled(program)`, worked out once per program object."""
    hit = _COMPILED.get(id(program))
    if hit is None or hit[0] is not program:
        hit = put(_COMPILED, id(program), (program, compiled(program)), 256)
    return hit[1]


def compiled(program: Sequence) -> tuple:
    """A stage's `program` as `_run_program` runs it: a cell as (0 forward or 1 backward, microbatch, chunk, its
    Compute), a message group as (2, its sends in order as (an activation?, (microbatch, chunk), peer, tag), its
    receives in order as (an activation?, (microbatch, chunk)), their peers, their tags, and what it posts:
    ((peer, tag) of each send, the receives' peers, their tags))."""
    steps: list = []
    for action in program:
        if isinstance(action, Compute):
            steps.append((0 if action.kind == "F" else 1, action.microbatch, action.chunk, action))
            continue
        sends, gets, peers, tags, posts = [], [], [], [], []
        for op in (action.ops if isinstance(action, Post) else (action,)):
            send, act, tag = isinstance(op, Send), op.what == "act", op_tag(op)
            if send:
                sends.append((act, (op.microbatch, op.chunk), op.peer, tag))
                posts.append((op.peer, tag))
            else:
                gets.append((act, (op.microbatch, op.chunk)))
                peers.append(op.peer)
                tags.append(tag)
        peers, tags = tuple(peers), tuple(tags)
        steps.append((2, tuple(sends), tuple(gets), peers, tags, (tuple(posts), peers, tags)))
    return tuple(steps)
