"""Pipeline schedules as data: one program of small records per stage (the builders: schedule.py).

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

from dataclasses import dataclass
from typing import Union

from ...errors import PipelineError

__all__ = ["Compute", "Send", "Recv", "Post", "Schedule", "Action", "MAX_PAIRS", "check_sizes"]

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
