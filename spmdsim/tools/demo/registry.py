"""Scenario registry and runner shared by `spmdsim demo` and `spmdsim run`.

A scenario is a function ``build(ctx) -> Job`` registered with ``@scenario(name,
title, needs=...)`` in any public module of `spmdsim.tools.demo` (`load_scenarios`
imports them all); ``needs(world_size)`` is a reason to skip (pure, so every rank
agrees) or None. A Job is one operator on generated data: a forward callable, the
region reference it is checked against, and what `--explain` prints.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ...errors import SpmdsimError
from ...layouts.holdings import block_text, rank_blocks
from ...programs.plan.steps import Step
from ...programs.viz.model import compact_ranks
from ...references.forward import RegionFn

__all__ = [
    "Context", "Job", "Scenario", "Outcome", "scenario", "scenarios", "load_scenarios", "JobRun",
    "run_job", "run_scenario", "explain_lines", "explain_notes", "rank_line", "group_text",
]


@dataclass(frozen=True)
class Context:
    """What a scenario builds from: the communicator, dtype and seed."""

    comm: Any
    dtype: str = "float32"
    seed: int = 0

    @property
    def world_size(self) -> int:
        return self.comm.Get_size()


@dataclass
class Job:
    """One operator on generated data, ready to run and check.

    Attributes:
        op: operator name for tables ("MatMul", "RowParallelLinear", ...).
        layouts: short text of the input -> output layouts.
        mesh: the runtime Mesh the inputs live on.
        forward: runs the operator, returns the output DTensor.
        reference: region reference of the output.
        inputs: name -> input DTensor (for the local shapes `--explain` prints).
        steps: (collective, why) in the order the forward pass runs them.
        atol: absolute tolerance of the check (None: the runtime's default for the dtype).
        rtol: relative tolerance of the check (None: the runtime's default for the dtype).
        scale: the magnitudes that entered each output element (a region function; None: |reference|), for
            `DTensor.check` (docs/explanation/tolerances.md, "Tolerances").
        notes: this rank's own `--explain` lines (what its local compute does), before its collectives.
    """

    op: str
    layouts: str
    mesh: Any
    forward: Callable[[], Any]
    reference: RegionFn
    inputs: Mapping[str, Any] = field(default_factory=dict)
    steps: tuple[tuple[Step, str], ...] = ()
    atol: Optional[float] = None
    notes: tuple[str, ...] = ()
    rtol: Optional[float] = None
    scale: Optional[RegionFn] = None


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    build: Callable[[Context], Job]
    needs: Callable[[int], Optional[str]]


@dataclass(frozen=True)
class Outcome:
    """The agreed result of one scenario (the same on every rank)."""

    scenario: str
    op: str
    layouts: str
    passed: bool
    max_abs_error: float
    collectives: dict
    bytes_sent_per_rank: int
    skipped: Optional[str] = None

    def record(self) -> dict:
        """The JSON record of `spmdsim demo --json`."""
        out = {
            "scenario": self.scenario,
            "passed": bool(self.passed),
            "max_abs_error": float(self.max_abs_error),
            "collectives": dict(self.collectives),
            "bytes_sent_per_rank": int(self.bytes_sent_per_rank),
        }
        if self.skipped:
            out["skipped"] = self.skipped
        return out


_REGISTRY: dict[str, Scenario] = {}


def _any_size(world_size: int) -> Optional[str]:
    return None


def scenario(
    name: str, title: str, needs: Callable[[int], Optional[str]] = _any_size
) -> Callable[[Callable[[Context], Job]], Callable[[Context], Job]]:
    """Register ``build(ctx) -> Job`` as the demo scenario `name`."""

    def register(build: Callable[[Context], Job]) -> Callable[[Context], Job]:
        old = _REGISTRY.get(name)
        if old is not None and old.build.__qualname__ != build.__qualname__:
            raise SpmdsimError(f"scenario {name!r} is registered twice")
        _REGISTRY[name] = Scenario(name, title, build, needs)
        return build

    return register


def load_scenarios() -> None:
    """Import every public module of the spmdsim.tools.demo package (each registers its scenarios)."""
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__package__}.{info.name}")


def scenarios() -> tuple[Scenario, ...]:
    """Every registered scenario, in registration order (seed scenarios first)."""
    load_scenarios()
    return tuple(_REGISTRY.values())


@dataclass(frozen=True)
class JobRun:
    """What one run of a Job gives: the output, the agreed verdict, this rank's trace, totals."""

    out: Any
    verdict: Any
    entries: tuple
    stats: dict
    span: tuple[float, float] = (0.0, 0.0)  # perf_counter when the forward pass began and ended


def run_job(job: Job, comm: Any) -> JobRun:
    """Run the forward pass under a trace, check it on every rank, reduce the trace, close the mesh."""
    from time import perf_counter

    from ...runtime import collect_trace  # (the runtime's trace: not loaded for --help)

    with collect_trace() as trace:
        began = perf_counter()
        out = job.forward()
        ended = perf_counter()
    verdict = out.check(job.reference, rtol=job.rtol, atol=job.atol, scale=job.scale)
    stats = trace.reduce(comm)
    job.mesh.close()
    return JobRun(out, verdict, trace.entries, stats, (began, ended))


def run_scenario(sc: Scenario, ctx: Context) -> Outcome:
    """Build and run one scenario, or report why it is skipped at this world size."""
    reason = sc.needs(ctx.world_size)
    if reason:
        # Not built, so no layouts to show: the title names the operator.
        return Outcome(sc.name, sc.title, "-", True, 0.0, {}, 0, skipped=reason)
    job = sc.build(ctx)
    run = run_job(job, ctx.comm)
    return Outcome(
        sc.name, job.op, job.layouts, bool(run.verdict.passed),
        float(run.verdict.max_abs_error), dict(run.stats["counts"]),
        int(run.stats["bytes_sent_max"]),
    )


def rank_line(job: Job, out: Any) -> str:
    """This rank's line: coordinates, the block of each input it holds, and its output block.

    Blocks are global index ranges (``W[0:96, 32:64]``), so a reader sees which
    part of each tensor the rank holds, not only how big its piece is.
    """
    mesh = job.mesh
    r = mesh.rank
    return (f"rank {r} {mesh.layout.coords(r)}: holds {rank_blocks(job.inputs, r)} "
            f"-> output {block_text(out.layout, out.global_shape, r)}")


def explain_lines(job: Job) -> list[str]:
    """This rank's `--explain` lines: each collective it joins and over which ranks."""
    mesh = job.mesh
    lines = [f"  {note}" for note in job.notes]
    if not job.steps:
        return lines + ["  no communication: every rank's block of the result is final"]
    for step, _ in job.steps:
        lines.append(f"  {step.via} over ranks {group_text(mesh.group_ranks(step.axes))}")
    return lines


#: Groups of up to this many ranks are listed member by member (``{0,1,2,3,4,5,6,7}``); larger ones
#: as a range, so a rank's line stays short at any rank count (each of N ranks listing N members
#: made `--explain` grow with the square of N: 44,814 lines at 1,024 ranks).
GROUP_LISTED = 8


def group_text(ranks, braces: bool = True) -> str:
    """``{0,1,2,3}``; past GROUP_LISTED members ``{0-1023} (1,024 ranks)``, ``{0,8,...,1016}
    (128 ranks)`` for an even stride, else the runs of consecutive ranks (a long list cut short).
    Without `braces`: ``0-1023 (1,024 ranks)``."""
    ranks = sorted(ranks)
    n = len(ranks)
    left, right = ("{", "}") if braces else ("", "")
    if n <= GROUP_LISTED:
        return left + ",".join(map(str, ranks)) + right
    step = ranks[1] - ranks[0]
    if all(b - a == step for a, b in zip(ranks, ranks[1:])):
        body = f"{ranks[0]}-{ranks[-1]}" if step == 1 else f"{ranks[0]},{ranks[1]},...,{ranks[-1]}"
    else:
        parts = compact_ranks(ranks).split(",")
        body = ",".join(parts) if len(parts) <= 8 else ",".join(parts[:4] + ["...", parts[-1]])
    return left + body + right + f" ({n:,} ranks)"


def explain_notes(job: Job) -> list[str]:
    """Why each collective of `job` runs, once for all ranks (`--explain`, after the rank lines)."""
    return [f"why {step.via}: {why}" for step, why in job.steps]
