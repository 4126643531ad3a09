"""The three schedule builders (GPipe, 1F1B, interleaved 1F1B) and `build`, which checks what they make.

The records they make, and the numbering of stages, microbatches and chunks: spmdsim.programs.pipeline.records.
The builders post messages the way Megatron's schedules do (megatron/core/pipeline_parallel/schedules.py), so
the deadlock check (spmdsim.programs.pipeline.check) passes under rendezvous semantics.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator, Optional, Union

from ...errors import PipelineError
from .check import check
from .records import Compute, Post, Recv, Schedule, Send, check_sizes

__all__ = ["SCHEDULES", "unknown_schedule", "most_in_flight", "build", "gpipe", "one_f_one_b",
           "interleaved", "schedule_problem"]

#: The schedules `build` knows, by name.
SCHEDULES = ("gpipe", "1f1b", "interleaved")


_new = object.__new__


def _compute(kind: str, mb: int, c: int) -> Compute:
    """Compute(kind, mb, c) as a builder makes it: without the checks of `__post_init__` (its values are the
    builder's own ints and kinds, and `check` reads the whole schedule after), a third of the time (a 64 x 512
    1F1B makes ~134,000 records)."""
    record = _new(Compute)
    fields = record.__dict__
    fields["kind"], fields["microbatch"], fields["chunk"] = kind, mb, c
    return record


def _message(cls: type, what: str, mb: int, c: int, peer: int) -> Union[Send, Recv]:
    """A Send or Recv as a builder makes it (see `_compute`)."""
    record = _new(cls)
    fields = record.__dict__
    fields["what"], fields["microbatch"], fields["chunk"], fields["peer"] = what, mb, c, peer
    return record


class _Links:
    """The messages around each chunk; None where there is none (first/last chunk, or a same-stage chunk)."""

    def __init__(self, stages: int, virtual: int) -> None:
        self.p, self.last = stages, stages * virtual - 1

    def send_act(self, mb: int, c: int) -> Optional[Send]:
        return _message(Send, "act", mb, c, (c + 1) % self.p) if c < self.last and self.p > 1 else None

    def recv_act(self, mb: int, c: int) -> Optional[Recv]:
        return _message(Recv, "act", mb, c, (c - 1) % self.p) if c > 0 and self.p > 1 else None

    def send_grad(self, mb: int, c: int) -> Optional[Send]:
        return _message(Send, "grad", mb, c, (c - 1) % self.p) if c > 0 and self.p > 1 else None

    def recv_grad(self, mb: int, c: int) -> Optional[Recv]:
        return _message(Recv, "grad", mb, c, (c + 1) % self.p) if c < self.last and self.p > 1 else None


def _post(program: list, *ops: Optional[Union[Send, Recv]]) -> None:
    """Append the ops that exist: a lone one as a blocking call, several as one Post."""
    present = [op for op in ops if op is not None]
    if len(present) == 1:
        program.append(present[0])
    elif present:
        post = _new(Post)  # a builder's: different messages, each a Send or Recv (see `_compute`)
        post.__dict__["ops"] = tuple(present)
        program.append(post)


def _checked(schedule: Schedule) -> Schedule:
    check(schedule)
    return schedule


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe (Huang et al. 2019): every forward, then every backward in reverse microbatch order.

    Blocking sends and receives; the backward order is GPipe's Figure 2(c) (B3 B2 B1 B0).
    """
    check_sizes(stages, microbatches)
    links, programs = _Links(stages, 1), []
    for s in range(stages):
        program: list = []
        for mb in range(microbatches):
            _post(program, links.recv_act(mb, s))
            program.append(_compute("F", mb, s))
            _post(program, links.send_act(mb, s))
        for mb in reversed(range(microbatches)):
            _post(program, links.recv_grad(mb, s))
            program.append(_compute("B", mb, s))
            _post(program, links.send_grad(mb, s))
        programs.append(program)
    return _checked(Schedule("gpipe", stages, microbatches, 1, programs))


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """Megatron's non-interleaved 1F1B, flushed: p-s-1 warmup forwards, steady one-forward-one-backward,
    cooldown backwards; its combined send_forward_recv_backward and send_backward_recv_forward are Posts."""
    check_sizes(stages, microbatches)
    links, m, programs = _Links(stages, 1), microbatches, []
    for s in range(stages):
        warmup = _warmup("1f1b", stages, m, 1, s)
        remaining = m - warmup
        program: list = []
        for mb in range(warmup):
            _post(program, links.recv_act(mb, s))
            program.append(_compute("F", mb, s))
            _post(program, links.send_act(mb, s))
        if remaining:
            _post(program, links.recv_act(warmup, s))
        for i in range(remaining):
            program.append(_compute("F", warmup + i, s))
            _post(program, links.send_act(warmup + i, s), links.recv_grad(i, s))
            program.append(_compute("B", i, s))
            if i == remaining - 1:
                _post(program, links.send_grad(i, s))
            else:
                _post(program, links.send_grad(i, s), links.recv_act(warmup + i + 1, s))
        for mb in range(remaining, m):
            _post(program, links.recv_grad(mb, s))
            program.append(_compute("B", mb, s))
            _post(program, links.send_grad(mb, s))
        programs.append(program)
    return _checked(Schedule("1f1b", stages, microbatches, 1, programs))


def _warmup(name: str, stages: int, microbatches: int, virtual: int, stage: int) -> int:
    """The forwards `stage` runs before its first backward under schedule `name` (gpipe: every one)."""
    total = microbatches * virtual
    if name == "1f1b":
        return min(stages - stage - 1, total)
    if name == "interleaved":
        return min(2 * (stages - stage - 1) + (virtual - 1) * stages, total)
    return total


def most_in_flight(name: str, stages: int, microbatches: int, virtual: int = 1) -> int:
    """The most (microbatch, chunk) pairs any stage holds at once (forwards run, their backwards not yet)
    under schedule `name`: its warmup forwards and the steady phase's next forward (stage 0's, the most).
    From the sizes, without building the schedule; spmdsim.programs.pipeline.in_flight counts them per stage in a
    built one (another answer, so another name)."""
    return _held(name, stages, microbatches, virtual, 0)


def in_flight_by_stage(name: str, stages: int, microbatches: int, virtual: int = 1) -> tuple[int, ...]:
    """Per stage, the most (microbatch, chunk) pairs it holds at once under schedule `name` (`most_in_flight`'s
    count for every stage; spmdsim.programs.pipeline.in_flight counts them in a built schedule)."""
    return tuple(_held(name, stages, microbatches, virtual, stage) for stage in range(stages))


def _held(name: str, stages: int, microbatches: int, virtual: int, stage: int) -> int:
    return min(_warmup(name, stages, microbatches, virtual, stage) + 1, microbatches * virtual)


def _chunk_table(microbatches: int, virtual: int, group: int) -> list[tuple[int, int]]:
    """Megatron's get_schedule_table: (microbatch, local chunk) in order, `group` microbatches per chunk."""
    table = []
    for first in range(0, microbatches, group):
        mbs = range(first, min(first + group, microbatches))
        table.extend((mb, j) for j in range(virtual) for mb in mbs)
    return table


def interleaved(stages: int, microbatches: int, virtual: int) -> Schedule:
    """Megatron's interleaved 1F1B (forward_backward_pipelining_with_interleaving), without p2p overlap.

    Stage s runs its (microbatch, chunk) pairs in groups of p microbatches per chunk; warmup
    2(p-s-1) + (v-1)p forwards, then one forward and one backward per step, then cooldown. After
    each compute step one Post sends what it produced and receives the next step's inputs.
    Megatron requires m % p == 0 (microbatch groups of p).
    """
    problem = schedule_problem("interleaved", stages, microbatches, virtual)
    if problem:
        raise PipelineError(problem)
    p, v, links, programs = stages, virtual, _Links(stages, virtual), []
    table = _chunk_table(microbatches, v, p)
    total = len(table)
    for s in range(p):
        forward = [(mb, j * p + s) for mb, j in table]
        backward = [(mb, (v - 1 - j) * p + s) for mb, j in table]
        warmup = _warmup("interleaved", p, microbatches, v, s)
        remaining = total - warmup
        program: list = []

        def recv_f(k: int) -> Optional[Recv]:
            return links.recv_act(*forward[k]) if k < total else None

        def recv_b(k: int) -> Optional[Recv]:
            return links.recv_grad(*backward[k]) if k < total else None

        _post(program, recv_f(0))
        for k in range(warmup):
            program.append(_compute("F", *forward[k]))
            first_b = recv_b(0) if k == warmup - 1 and remaining else None
            _post(program, links.send_act(*forward[k]), recv_f(k + 1), first_b)
        if not remaining:
            _post(program, recv_b(0))
        for k in range(remaining):
            program.append(_compute("F", *forward[warmup + k]))
            program.append(_compute("B", *backward[k]))
            next_f = recv_f(warmup + k + 1) if k < remaining - 1 else None
            _post(program, links.send_act(*forward[warmup + k]), links.send_grad(*backward[k]),
                  next_f, recv_b(k + 1))
        for k in range(remaining, total):
            program.append(_compute("B", *backward[k]))
            _post(program, links.send_grad(*backward[k]), recv_b(k + 1))
        programs.append(program)
    return _checked(Schedule("interleaved", stages, microbatches, virtual, programs))


@lru_cache(maxsize=64, typed=True)  # typed: build(..., True) is refused, not build(..., 1)
def build(name: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The schedule `name` ("gpipe", "1f1b" or "interleaved"), checked.

    Args:
        name: one of SCHEDULES.
        stages, microbatches: p and m, ints >= 1.
        virtual: chunks per stage: 1 for gpipe and 1f1b, >= 2 for interleaved.
    """
    problem = schedule_problem(name, stages, microbatches, virtual)
    if problem:
        raise PipelineError(problem)
    with _collector_paused():
        if name == "interleaved":
            return interleaved(stages, microbatches, virtual)
        return gpipe(stages, microbatches) if name == "gpipe" else one_f_one_b(stages, microbatches)


def unknown_schedule(name: object, what: str = "unknown schedule") -> str:
    """The one line refusing schedule `name`: SCHEDULES' names are lower-case, so a name the docs and papers
    spell otherwise ("1F1B", "GPipe") is told its spelling here (the CLI's --schedule takes any case)."""
    line = f"{what} {name!r}; expected one of {SCHEDULES!r}"
    if isinstance(name, str) and name.lower() in SCHEDULES:
        line += f" (lower-case: {name.lower()!r})"
    return line


def schedule_problem(name: object, stages: object, microbatches: object, virtual: object = 1) -> Optional[str]:
    """Why `build(name, stages, microbatches, virtual)` refuses these sizes (its one line), or None: for a
    trainer to refuse them alike on every rank before it prints or runs anything."""
    if name not in SCHEDULES:
        return unknown_schedule(name)
    try:
        check_sizes(stages, microbatches, virtual)
    except PipelineError as exc:
        return str(exc)
    if name != "interleaved":
        if virtual != 1:
            return (f"the {name} schedule holds one chunk per stage, got virtual stages {virtual!r}; several "
                    f"chunks per stage is --schedule interleaved")
        return None
    if virtual < 2:
        return (f"the interleaved schedule needs virtual stages >= 2, got {virtual!r}; one chunk per stage is "
                f"--schedule 1f1b")
    if microbatches % stages:
        return (f"the interleaved schedule needs microbatches divisible by stages (as Megatron), got "
                f"{microbatches!r} microbatches for {stages!r} stages")
    return None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a schedule is built and checked: its records are new objects
    that all live on (no cycles among them), and the collections their numbers set off walk them again and
    again: 0.50 of 0.71 CPU-s building a 64 x 512 1F1B, 0.21 without. On again after, if it was on (another
    thread that paused it meanwhile leaves it on when it ends: at worst a collection comes late)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
