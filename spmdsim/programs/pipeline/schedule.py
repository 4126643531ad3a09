"""Pipeline schedules as data: one program of small records per stage, and the three builders.

Stages are pipeline ranks 0..p-1; microbatches 0..m-1; model chunks are numbered
globally 0..p*v-1, and chunk c lives on stage c % p (Megatron's interleaving: stage
s holds chunks s, s+p, s+2p, ...). Chunk 0 takes the data, chunk p*v-1 ends in the
loss. The activation of chunk c goes to chunk c+1; its gradient comes back.

A program is a tuple of records, run in order:

    Compute("F", mb, c)   forward of microbatch mb through chunk c (B: its backward)
    Send("act", mb, c, peer)   chunk c's output, to the stage holding c+1
    Send("grad", mb, c, peer)  the gradient of chunk c's input, to the stage holding c-1
    Recv("act", mb, c, peer)   chunk c's input; Recv("grad", mb, c, peer): its output's gradient
    Post((op, op, ...))        messages posted together (Isend/Irecv), then all waited for

A lone Send or Recv is a blocking call. The builders post messages the way Megatron's
schedules do (megatron/core/pipeline_parallel/schedules.py), so the deadlock check
(spmdsim.programs.pipeline.check) passes under rendezvous semantics.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Optional, Union

from ...errors import PipelineError

__all__ = ["Compute", "Send", "Recv", "Post", "Schedule", "Action", "SCHEDULES", "unknown_schedule", "most_in_flight",
           "MAX_PAIRS", "build", "gpipe", "one_f_one_b", "interleaved", "check_sizes", "schedule_problem"]

#: The schedules `build` knows, by name.
SCHEDULES = ("gpipe", "1f1b", "interleaved")

#: Most (microbatch, chunk) pairs a schedule may have: stages x microbatches x virtual stages.
MAX_PAIRS = 65_536


def _chunk_suffix(chunk: int, virtual: int) -> str:
    return f".{chunk}" if virtual > 1 else ""


def _check_int(value: object, what: str, low: int = 0) -> None:
    if type(value) is int and value >= low:  # the builders' every value: one test (~520,000 a 64 x 512 1F1B)
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PipelineError(f"{what} {value!r} must be an int >= {low}")


@dataclass(frozen=True)
class Compute:
    """The forward ("F") or backward ("B") of one microbatch through one chunk."""

    kind: str
    microbatch: int
    chunk: int

    def __post_init__(self) -> None:
        if self.kind not in ("F", "B"):
            raise PipelineError(f"compute kind {self.kind!r} must be 'F' or 'B'")
        _check_int(self.microbatch, "microbatch")
        _check_int(self.chunk, "chunk")

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"

    def label(self, virtual: int = 1) -> str:
        """`F3`, or `F3.5` (chunk 5) when stages hold several chunks."""
        return f"{self.kind}{self.microbatch}{_chunk_suffix(self.chunk, virtual)}"

    token = label  # the schedule-file token is the label


class _Message:
    """What Send and Recv share: validation and the message's identity."""

    what: str
    microbatch: int
    chunk: int
    peer: int
    _verb = ""
    _arrow = ""

    def __post_init__(self) -> None:
        if self.what not in ("act", "grad"):
            raise PipelineError(f"message kind {self.what!r} must be 'act' or 'grad'")
        _check_int(self.microbatch, "microbatch")
        _check_int(self.chunk, "chunk")
        _check_int(self.peer, "peer stage")

    def __str__(self) -> str:
        return f"{self._verb} {self.what} {self.microbatch} {self._arrow} {self.peer}"

    def label(self, virtual: int = 1) -> str:
        """`send act 3 -> 1`; with several chunks per stage `send act 3.2 -> 3` (chunk 2's)."""
        return (f"{self._verb} {self.what} {self.microbatch}{_chunk_suffix(self.chunk, virtual)} "
                f"{self._arrow} stage {self.peer}")

    def token(self, virtual: int = 1) -> str:
        """The schedule-file token: `send-act3`, `recv-grad0.1`."""
        return f"{self._verb}-{self.what}{self.microbatch}{_chunk_suffix(self.chunk, virtual)}"


@dataclass(frozen=True)
class Send(_Message):
    """`what` "act": chunk's output to `peer` (holding chunk+1); "grad": its input's gradient to chunk-1."""

    what: str
    microbatch: int
    chunk: int
    peer: int
    _verb = "send"
    _arrow = "->"

    @property
    def message(self) -> tuple[str, int, int]:
        """(what, microbatch, the chunk that produced it): the same for the matching Recv."""
        return (self.what, self.microbatch, self.chunk)


@dataclass(frozen=True)
class Recv(_Message):
    """`what` "act": chunk's input from `peer` (holding chunk-1); "grad": its output's gradient from chunk+1."""

    what: str
    microbatch: int
    chunk: int
    peer: int
    _verb = "recv"
    _arrow = "<-"

    @property
    def message(self) -> tuple[str, int, int]:
        """(what, microbatch, the chunk that produced it): the same for the matching Send."""
        return (self.what, self.microbatch, self.chunk - 1 if self.what == "act" else self.chunk + 1)


@dataclass(frozen=True)
class Post:
    """Messages posted together (Isend/Irecv) and then all waited for, as Megatron's batched p2p."""

    ops: tuple[Union[Send, Recv], ...]

    def __post_init__(self) -> None:
        ops = self.ops if type(self.ops) is tuple else tuple(self.ops)
        object.__setattr__(self, "ops", ops)
        if not ops:
            raise PipelineError("a post needs at least one send or receive, got ()")
        for op in ops:
            if type(op) is not Send and type(op) is not Recv and not isinstance(op, (Send, Recv)):
                raise PipelineError(f"a post holds sends and receives, got {op!r}")
        if len(ops) > 1 and len(set(ops)) != len(ops):
            raise PipelineError(f"post {self} names a message twice")

    def __str__(self) -> str:
        return "[" + ", ".join(str(op) for op in self.ops) + "]"

    def label(self, virtual: int = 1) -> str:
        return "[" + ", ".join(op.label(virtual) for op in self.ops) + "]"

    def token(self, virtual: int = 1) -> str:
        return "[" + " ".join(op.token(virtual) for op in self.ops) + "]"


Action = Union[Compute, Send, Recv, Post]


@dataclass(frozen=True)
class Schedule:
    """One program per stage, in execution order; `check` has passed when a builder or `parse` returns it."""

    name: str
    stages: int
    microbatches: int
    virtual: int
    programs: tuple[tuple[Action, ...], ...]

    def __post_init__(self) -> None:
        check_sizes(self.stages, self.microbatches, self.virtual)
        programs = tuple(tuple(program) for program in self.programs)
        object.__setattr__(self, "programs", programs)
        if len(programs) != self.stages:
            raise PipelineError(f"schedule {self.name!r} has {len(programs)} programs for "
                                f"{self.stages} stages; expected one per stage")
        records = (Compute, Send, Recv, Post)
        for stage, program in enumerate(programs):
            for action in program:
                if type(action) not in records and not isinstance(action, records):
                    raise PipelineError(f"stage {stage} of schedule {self.name!r} holds {action!r}; "
                                        f"expected Compute, Send, Recv or Post records")

    def __str__(self) -> str:
        tail = f", {self.virtual} chunks per stage" if self.virtual > 1 else ""
        return f"{self.name} ({self.stages} stages, {self.microbatches} microbatches{tail})"

    @property
    def chunks(self) -> int:
        """Model chunks in all: stages x virtual stages."""
        return self.stages * self.virtual

    def stage_of(self, chunk: int) -> int:
        """The stage that holds `chunk`."""
        return chunk % self.stages

    @property
    def orders(self) -> tuple[tuple[Compute, ...], ...]:
        """Per stage, its Compute records in program order (what `timeline` takes)."""
        return tuple(tuple(a for a in program if isinstance(a, Compute)) for program in self.programs)

    def text(self) -> str:
        """The schedule in the file format `parse` reads (one line per stage)."""
        return "".join(f"stage {s}: " + " ".join(a.token(self.virtual) for a in program) + "\n"
                       for s, program in enumerate(self.programs))


def check_sizes(stages: object, microbatches: object, virtual: object = 1) -> None:
    """Raise PipelineError unless the sizes are ints >= 1 and their product is at most MAX_PAIRS."""
    _check_int(stages, "stages", 1)
    _check_int(microbatches, "microbatches", 1)
    _check_int(virtual, "virtual stages", 1)
    pairs = stages * microbatches * virtual
    if pairs > MAX_PAIRS:
        raise PipelineError(f"{stages} stages x {microbatches} microbatches x {virtual} virtual stages "
                            f"= {pairs:,} (microbatch, chunk) pairs is too many; expected at most {MAX_PAIRS:,}")


# --- the builders ------------------------------------------------------------------------------------------


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
    from .check import check  # check.py reads these records: imported here, when a schedule is built

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
    built one (this was also called in_flight, a name two functions with different answers shared)."""
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
    that all live on (no cycles among them), and the collections their numbers set off walked them again and
    again: 0.50 of 0.71 CPU-s building a 64 x 512 1F1B, 0.21 without. On again after, if it was on (another
    thread that paused it meanwhile leaves it on when it ends: at worst a collection comes late)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
