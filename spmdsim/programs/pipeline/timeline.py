"""Unit-cost timelines of pipeline runs: when each compute starts, the bubble, microbatches in flight.

Every forward and backward of one chunk costs one time unit and messages are instant. A
stage runs its computes in its order; each starts when the stage is free and what it needs
has finished: F(mb, c) after F(mb, c-1); B(mb, c) after F(mb, c) and B(mb, c+1). The orders
come from a Schedule's programs or from an executed run's trace: the same function reads both.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Optional, Sequence, Union

from ...errors import PipelineError
from .records import Compute, Schedule, check_sizes
from .schedule import SCHEDULES, unknown_schedule

__all__ = ["Timeline", "timeline", "bubble_formula", "formula_text", "in_flight"]


@dataclass(frozen=True)
class Timeline:
    """Per stage, its cells as (start time, Compute) in order; `name` is the schedule's when known."""

    stages: int
    virtual: int
    microbatches: int
    cells: tuple[tuple[tuple[int, Compute], ...], ...]
    name: str = ""

    @cached_property  # (render asks once a band: 292 walks of 131,072 cells took 16 of 18 s at 64 x 256 x 4)
    def length(self) -> int:
        """The makespan: time units from the first start to the last finish."""
        return max((start + 1 for row in self.cells for start, _ in row), default=0)

    @property
    def busy(self) -> int:
        """Busy cells over all stages."""
        return sum(len(row) for row in self.cells)

    @property
    def idle(self) -> int:
        """Idle cells over all stages: stages x length - busy."""
        return self.stages * self.length - self.busy

    @property
    def bubble(self) -> Fraction:
        """The idle share of all cells: idle / (stages x length)."""
        return Fraction(self.idle, self.stages * self.length) if self.length else Fraction(0)

    def grid(self) -> tuple[tuple[Optional[Compute], ...], ...]:
        """Per stage, what runs in each time unit (None: idle)."""
        rows = []
        for row in self.cells:
            line: list[Optional[Compute]] = [None] * self.length
            for start, cell in row:
                line[start] = cell
            rows.append(tuple(line))
        return tuple(rows)

    @property
    def orders(self) -> tuple[tuple[Compute, ...], ...]:
        return tuple(tuple(cell for _, cell in row) for row in self.cells)


def _needs(kind: str, mb: int, c: int, last: int) -> tuple[tuple[str, int, int], ...]:
    """What (kind, microbatch, chunk) waits for: F after the chunk before; B after its F and the chunk after."""
    if kind == "F":
        return (("F", mb, c - 1),) if c > 0 else ()
    return (("F", mb, c), ("B", mb, c + 1)) if c < last else (("F", mb, c),)


def timeline(stages: Union[int, Schedule], orders: Optional[Sequence[Sequence[Compute]]] = None,
             virtual: int = 1) -> Timeline:
    """The unit-cost timeline of `orders[s]`, the computes stage s ran in order (or of a Schedule's).

    Args:
        stages: the number of stages, or a Schedule (then `orders` and `virtual` come from it).
        orders: per stage, its Compute records in the order it ran them.
        virtual: chunks per stage (chunk c runs on stage c % stages).
    """
    name = ""
    if isinstance(stages, Schedule):
        schedule = stages
        stages, orders, virtual, name = schedule.stages, schedule.orders, schedule.virtual, schedule.name
    if orders is None:
        raise PipelineError("timeline(stages, orders) needs the orders (or pass a Schedule)")
    orders = [list(row) for row in orders]
    microbatches = _check_orders(stages, orders, virtual)
    last = stages * virtual - 1
    finish: dict[tuple, int] = {}
    waiting: dict[tuple, list[int]] = defaultdict(list)
    keys = [[(cell.kind, cell.microbatch, cell.chunk) for cell in row] for row in orders]
    at, free = [0] * stages, [0] * stages
    cells: list[list[tuple[int, Compute]]] = [[] for _ in range(stages)]
    ready = list(range(stages))
    while ready:
        s = ready.pop()
        row = keys[s]
        while at[s] < len(row):
            key = row[at[s]]
            needs = _needs(*key, last)
            missing = next((n for n in needs if n not in finish), None)
            if missing is not None:
                waiting[missing].append(s)
                break
            start = max([free[s]] + [finish[n] for n in needs])
            cells[s].append((start, orders[s][at[s]]))
            finish[key] = free[s] = start + 1
            at[s] += 1
            ready.extend(waiting.pop(key, ()))
    stuck = [s for s in range(stages) if at[s] < len(orders[s])]
    if stuck:
        s = stuck[0]
        cell = orders[s][at[s]]
        missing = next(n for n in _needs(*keys[s][at[s]], last) if n not in finish)
        ran = any(missing in row for row in keys)
        why = "which never finishes (the orders wait on each other)" if ran else "which no stage runs"
        raise PipelineError(f"the orders cannot run: stage {s} runs {cell.label(2)} after "
                            f"{Compute(*missing).label(2)}, {why}")
    return Timeline(stages, virtual, microbatches, tuple(tuple(row) for row in cells), name)


def _check_orders(stages: int, orders: list, virtual: int) -> int:
    """Raise unless `orders` has one list of Compute records per stage, each once, on its chunk's stage.

    Returns:
        The number of microbatches (the largest one seen, plus one).
    Messages name each compute with its chunk (F3.1), whatever `virtual` is.
    """
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise PipelineError(f"stages {stages!r} must be an int >= 1")
    if len(orders) != stages:
        raise PipelineError(f"timeline got {len(orders)} orders for {stages} stages; expected one per stage")
    seen: set = set()
    for s, row in enumerate(orders):
        for cell in row:
            if not isinstance(cell, Compute):
                raise PipelineError(f"stage {s}'s order holds {cell!r}; expected Compute records")
            if cell.chunk % stages != s or cell.chunk >= stages * virtual:
                raise PipelineError(f"stage {s}'s order runs {cell.label(2)}, but chunk {cell.chunk} "
                                    f"does not live there ({stages} stages x {virtual} chunks)")
            if cell in seen:
                raise PipelineError(f"stage {s}'s order runs {cell.label(2)} twice; expected once")
            seen.add(cell)
    microbatches = max((cell.microbatch for cell in seen), default=-1) + 1
    check_sizes(stages, max(microbatches, 1), virtual)
    return microbatches


def bubble_formula(name: str, stages: int, microbatches: int, virtual: int = 1) -> Fraction:
    """The bubble the papers give, as idle cells over all cells of a flushed pipeline.

    GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021, section 2.2.1): (p-1)/(m+p-1).
    Interleaved (Narayanan et al. 2021, section 2.2.2): bubble time (1/v)(p-1)/m of the ideal
    time, which is (p-1)/(v*m+p-1) of all cells when each chunk's F and B cost one unit.
    """
    if name not in SCHEDULES:
        raise PipelineError(unknown_schedule(name))
    check_sizes(stages, microbatches, virtual)
    v = virtual if name == "interleaved" else 1
    return Fraction(stages - 1, v * microbatches + stages - 1)


def formula_text(name: str) -> str:
    """The formula `bubble_formula(name, ...)` computes, as text."""
    return "(p-1)/(v*m+p-1)" if name == "interleaved" else "(p-1)/(m+p-1)"


def in_flight(schedule: Union[Schedule, Timeline]) -> tuple[int, ...]:
    """Per stage, the most (microbatch, chunk) pairs whose forward has run and backward has not.

    With one chunk per stage the pairs are microbatches; with several (interleaved) each chunk
    a microbatch has gone forward through on the stage counts once: its activations are kept.
    """
    counts = []
    for row in schedule.orders:
        live = most = 0
        for cell in row:
            live += 1 if cell.kind == "F" else -1
            most = max(most, live)
        counts.append(most)
    return tuple(counts)
