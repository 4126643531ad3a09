"""What autoshard found and what a run of it measured: the records (`Result` and its `OpReport` rows, `Measured`,
`DagReport`), and their text table and JSON object (pure).

The search (spmdsim.tools.autoshard.choose) makes a `Result`; the runners (`execute`, `dag`) make the `Measured`
rows and the `DagReport` they print beside it; `runnable` reads a `Result` to say what can run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...base.validate import counted
from ...programs.plan import Plan
from .backward import BackwardOp
from .candidates import Candidate
from .cost import Objective
from .graph import Graph
from .search import Outcome

__all__ = ["Result", "OpReport", "Measured", "DagReport", "Backward", "format_result", "result_json",
           "format_measured", "format_checks", "WIDTH"]

#: Columns the default output fits in.
WIDTH = 100


@dataclass(frozen=True)
class OpReport:
    """One operator of a choice: its candidate and what it costs.

    Attributes:
        considered: candidates enumerated; ruled_out: of those, over the memory limit.
        in_bytes: bytes the busiest rank receives redistributing its inputs.
        own_bytes: bytes the busiest rank receives in its own collectives.
        hops: the planner's plans of those redistributions (empty when not planned).
        comm_seconds, compute_seconds: modelled.
        why: the reason for the choice.
    """

    name: str
    kind: str
    considered: int
    ruled_out: int
    candidate: Candidate
    in_bytes: int
    own_bytes: int
    hops: tuple[Plan, ...]
    comm_seconds: float
    compute_seconds: float
    why: str = ""

    @property
    def bytes_per_rank(self) -> int:
        return self.in_bytes + self.own_bytes

    @property
    def seconds(self) -> float:
        return self.comm_seconds + self.compute_seconds


@dataclass(frozen=True)
class Result:
    """What `autoshard` chose, why, and how it compares with the hand-written strategies."""

    graph: Graph
    devices: int
    objective: Objective
    outcome: Outcome
    ops: tuple[OpReport, ...]
    hand_ops: Optional[tuple[OpReport, ...]]
    propagation: Outcome
    propagation_bytes: int
    runners_up: tuple[tuple[int, float, tuple[str, ...]], ...]
    backward: tuple[BackwardOp, ...] = ()
    hand_backward: Optional[tuple[BackwardOp, ...]] = None

    @property
    def backward_bytes_per_rank(self) -> int:
        """Bytes per rank of a training step's backward (`backward.replay`; 0 without --training)."""
        return sum(op.bytes_per_rank for op in self.backward)

    @property
    def hand_written_backward_bytes_per_rank(self) -> Optional[int]:
        return None if self.hand_backward is None else sum(op.bytes_per_rank for op in self.hand_backward)

    @property
    def total_bytes_per_rank(self) -> int:
        return sum(op.bytes_per_rank for op in self.ops)

    @property
    def hand_written_total_bytes_per_rank(self) -> Optional[int]:
        return None if self.hand_ops is None else sum(op.bytes_per_rank for op in self.hand_ops)

    @property
    def total_seconds(self) -> float:
        return sum(op.seconds for op in self.ops)

    def table(self) -> str:
        return format_result(self)

    def to_json(self) -> dict:
        return result_json(self)


@dataclass(frozen=True)
class Measured:
    """One operator (with the redistribution into it): measured on the busiest rank, median of runs."""

    name: str
    bytes_received: int
    comm_seconds: float
    seconds: float


@dataclass(frozen=True)
class Backward:
    """The backward of `run_dag(train=True)`: the busiest rank's bytes and seconds, each weight's verdict."""

    bytes_received: int
    seconds: float
    verdicts: dict


@dataclass(frozen=True)
class DagReport:
    """What `run_dag` found: per node the busiest rank's figures, the verdicts, the loss if any.

    `backward`: the backward's figures and gradients' verdicts (None when not run);
    `no_backward`: why a training run ran forward only ("" otherwise).
    """

    measured: tuple
    verdicts: dict
    loss: Optional[tuple[float, float]]  # (ranks', numpy's)
    backward: Optional[Backward] = None
    no_backward: str = ""

    @property
    def passed(self) -> bool:
        grads = () if self.backward is None else self.backward.verdicts.values()
        return all(self.verdicts.values()) and all(grads)


def _b(n: int) -> str:
    return f"{n:,}"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def format_result(result: Result) -> str:
    """Per operator: candidates, choice, bytes in and own, why; then the totals."""
    g, out = result.graph, result.outcome
    proof = "proven optimal" if out.proven else f"best found, not proven ({out.explored:,} nodes)"
    if out.method == "propagation":
        proof = "greedy from the fixed operators and the input"
    lines = [_fit(f"{g.name}: {g.title}", WIDTH),
             f"{counted(result.devices, 'device')}, objective {result.objective.kind}: {out.method}, {proof}",
             "in B: bytes the busiest rank receives redistributing inputs; own B: in own collectives"]
    back = result.backward
    if back:
        lines.append("bwd B: in the backward (gradients' reverse moves, weight gradients' sums)")
    head = ("op", "cands", "strategy", "in B", "own B") + (("bwd B",) if back else ()) + ("why",)
    rows = []
    for i, op in enumerate(result.ops):
        cands = f"{op.considered}" + (f"-{op.ruled_out}" if op.ruled_out else "")
        rows.append((op.name, cands, op.candidate.text, _b(op.in_bytes), _b(op.own_bytes))
                    + ((_b(back[i].bytes_per_rank),) if back else ()) + (op.why,))
    n = len(head) - 1
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(n)]
    widths[2] = min(widths[2], 30)
    room = WIDTH - sum(widths) - 2 * n
    for r in [head] + rows:
        cells = [_fit(c, w).rjust(w) if i not in (0, 2) else _fit(c, w).ljust(w)
                 for i, (c, w) in enumerate(zip(r[:n], widths))]
        lines.append("  ".join(cells + [_fit(r[n], max(room, 10))]).rstrip())
    lines += _totals(result)
    return "\n".join(lines)


def saving_text(theirs: int, ours: int) -> str:
    """'saves N B (p%)' against `theirs`, or 'costs N B more (p% more)' when `ours` is larger: never a
    negative saving (with --training the search minimises the training total, so the forward alone may cost more)."""
    diff = theirs - ours
    if diff >= 0:
        return f"saves {_b(diff)} B" + (f" ({100 * diff / theirs:.1f}%)" if theirs else "")
    return f"costs {_b(-diff)} B more" + (f" ({100 * -diff / theirs:.1f}% more)" if theirs else "")


def _totals(result: Result) -> list[str]:
    total, hand = result.total_bytes_per_rank, result.hand_written_total_bytes_per_rank
    line = f"total {_b(total)} B/rank" + (" forward" if result.backward else "")
    lines = []
    if hand is not None:
        line += f"; hand-written {_b(hand)} B/rank; {saving_text(hand, total)}"
    lines.append(line)
    if result.backward:
        bwd, hand_bwd = result.backward_bytes_per_rank, result.hand_written_backward_bytes_per_rank
        line = f"training {_b(total + bwd)} B/rank = fwd {_b(total)} + bwd {_b(bwd)}"
        head = [line]
        if hand is not None and hand_bwd is not None:
            theirs = f"hand-written {_b(hand + hand_bwd)} = {_b(hand)} + {_b(hand_bwd)}"
            both = f"{line}; {theirs}"
            head = [both] if len(both) <= WIDTH else [line, f"{theirs} B/rank"]
        lines = [_fit(text, WIDTH) for text in head] + lines
    lines.append(f"propagation (MindSpore's) from the input and fixed operators: "
                 f"{_b(result.propagation_bytes)} B/rank" + (" forward" if result.backward else ""))
    comm = sum(op.comm_seconds for op in result.ops)
    compute = sum(op.compute_seconds for op in result.ops)
    lines.append(f"modelled time {1e3 * (comm + compute):.3g} ms: communication {1e3 * comm:.3g} ms "
                 f"+ compute {1e3 * compute:.3g} ms at {result.objective.flops_per_s / 1e9:.3g} GFLOP/s")
    if any(op.ruled_out for op in result.ops):
        lines.append("cands N-M: N enumerated, M over the memory limit")
    for k, (nbytes, value, changes) in enumerate(result.runners_up, 1):
        what = f"{_b(int(value))} B/rank training (search's price)" if result.backward else \
            f"{_b(nbytes)} B/rank"
        lines.append(_fit(f"runner-up {k}: {what} with " + ("; ".join(changes) or "-"), WIDTH))
    return lines


def result_json(result: Result) -> dict:
    """The `spmdsim autoshard --json` object."""
    def ops(reports) -> list:
        return [{
            "name": op.name,
            "kind": op.kind,
            "strategy": op.candidate.text,
            "candidates": op.considered,
            "ruled_out_by_memory": op.ruled_out,
            "bytes_per_rank": op.bytes_per_rank,
            "redistribution_bytes_per_rank": op.in_bytes,
            "own_bytes_per_rank": op.own_bytes,
            "own_collectives": list(op.candidate.collectives()),
            "inputs": [str(t) for t in op.candidate.inputs],
            "out": str(op.candidate.out),
            "memory_bytes_per_rank": op.candidate.memory,
            "seconds": op.seconds,
            "why": op.why,
            "hops": [p.to_json() for p in op.hops],
        } for op in reports]

    def with_backward(rows: list, back) -> list:
        for row, b in zip(rows, back or ()):
            row["backward_bytes_per_rank"] = b.bytes_per_rank
        return rows

    out = result.outcome
    return {
        "network": result.graph.name,
        "devices": result.devices,
        "objective": result.objective.kind,
        "method": out.method,
        "proven_optimal": out.proven,
        "explored": out.explored,
        "training": result.objective.training,
        "operators": with_backward(ops(result.ops), result.backward),
        "total_bytes_per_rank": result.total_bytes_per_rank,
        "hand_written_total_bytes_per_rank": result.hand_written_total_bytes_per_rank,
        "hand_written": None if result.hand_ops is None else with_backward(ops(result.hand_ops),
                                                                           result.hand_backward),
        "backward_bytes_per_rank": result.backward_bytes_per_rank if result.backward else None,
        "hand_written_backward_bytes_per_rank": result.hand_written_backward_bytes_per_rank,
        "propagation_total_bytes_per_rank": result.propagation_bytes,
        "total_seconds": result.total_seconds,
        "flops_per_s": result.objective.flops_per_s,
        "runners_up": [{"total_bytes_per_rank": b, "objective_value": v, "changes": list(c)}
                       for b, v, c in result.runners_up],
    }


def format_measured(result: Result, measured: Sequence[Measured]) -> str:
    """Predicted vs measured per operator: bytes, communication time, total time."""
    head = ("op", "pred B/rank", "meas B/rank", "pred comm ms", "meas comm ms", "meas/pred",
            "pred ms", "meas ms")
    rows = []
    for op, m in zip(result.ops[1:], measured[1:]):
        ratio = f"{m.comm_seconds / op.comm_seconds:.2f}" if op.comm_seconds > 0 else "-"
        rows.append((op.name, f"{op.bytes_per_rank:,}", f"{m.bytes_received:,}",
                     f"{1e3 * op.comm_seconds:.3f}", f"{1e3 * m.comm_seconds:.3f}", ratio,
                     f"{1e3 * op.seconds:.3f}", f"{1e3 * m.seconds:.3f}"))
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head] + rows]
    return "\n".join(lines)


def format_checks(result: Result, report: DagReport) -> str:
    """The DAG runner's verdicts: bytes that differ from the prediction, the first failed value, the loss."""
    lines = []
    for op, m in zip(result.ops[1:], report.measured[1:]):
        if m.bytes_received != op.bytes_per_rank:
            lines.append(f"note: {op.name} ({op.kind}) moved {m.bytes_received:,} B/rank where the model "
                         f"predicted {op.bytes_per_rank:,}: the operator ran another plan than its "
                         "candidate's")
    failed = [name for name, v in report.verdicts.items() if not v]
    n = len(report.verdicts)
    line = f"values: {n - len(failed)} of {n} operators' outputs match numpy (one process)"
    if report.loss is not None:
        line += f"; loss {report.loss[0]:.6g}, numpy {report.loss[1]:.6g}"
    lines.append(line)
    if failed:
        first = failed[0]
        lines.append(f"first to differ: {first}: {report.verdicts[first]}")
    back = report.backward
    if back is not None:
        wrong = [name for name, v in back.verdicts.items() if not v]
        k = len(back.verdicts)
        # The prediction adds each node's busiest rank; the pass is traced as one (its busiest rank):
        # equal where one rank is the busiest throughout (Megatron's layouts), else lower.
        lines.append(f"backward: {back.bytes_received:,} B/rank, busiest rank of the pass; predicted "
                     f"{result.backward_bytes_per_rank:,} (each node's busiest, summed)")
        lines.append(f"gradients: {k - len(wrong)} of {k} weights match spmdsim.models.gpt.reference's backward; "
                     f"backward {1e3 * back.seconds:.3f} ms")
        if wrong:
            lines.append(f"first gradient to differ: {wrong[0]}: {back.verdicts[wrong[0]]}")
    elif report.no_backward:
        lines.append(f"backward not run (forward only): {report.no_backward}")
    return "\n".join(lines)
