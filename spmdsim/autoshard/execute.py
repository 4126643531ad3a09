"""Run a choice on the ranks and compare it with the prediction.

Importing this module does not import mpi4py: `to_network` is pure (the
choice as a `spmdsim.nets.Network` of stages with the chosen layouts) and
`run_choice` loads the runtime when called. Chains of the network runner's
operators (`RUNNABLE`) run through `spmdsim.nets.NetworkRunner`, hop by hop;
every other graph (branches, the GPT's kinds) through `dag.run_dag`, node by node.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import SpmdsimError
from ..nets import Network, Param, Stage
from .choose import Result
from ..engines import engine_of

if TYPE_CHECKING:
    from .dag import DagReport

__all__ = ["RUNNABLE", "to_network", "is_chain", "check_runnable", "run_choice", "Measured",
           "format_measured", "format_checks"]

#: Node kinds the network runner executes.
RUNNABLE = ("input", "flatten", "matmul", "linear", "relu", "gelu", "embedding")


def is_chain(result: Result) -> bool:
    """Whether the choice runs through the network runner (a chain of `RUNNABLE` kinds)."""
    graph = result.graph
    return graph.is_chain() and all(n.kind in RUNNABLE for n in graph.nodes)


def check_runnable(result: Result) -> None:
    """Raise SpmdsimError (one line, the same on every rank) when the choice cannot run."""
    if is_chain(result):
        to_network(result)
    else:
        from .dag import check_runnable as check_dag

        check_dag(result)


def to_network(result: Result) -> Network:
    """The chosen strategies as a `Network` (a chain of stages) for `spmdsim.nets.NetworkRunner`."""
    graph = result.graph
    if not graph.is_chain():
        raise SpmdsimError(f"--run executes chains of operators; {graph.name!r} has branches")
    odd = [(n.name, n.kind) for n in graph.nodes if n.kind not in RUNNABLE]
    if odd:
        raise SpmdsimError(f"--run executes {', '.join(RUNNABLE[1:])} operators, not "
                           + ", ".join(f"{name} ({kind})" for name, kind in odd))
    stages = []
    for node, op in zip(graph.nodes[1:], result.ops[1:]):
        c = op.candidate
        params = tuple(Param(p.name, tl, p.source) for p, tl in zip(node.params, c.params))
        colls = tuple((s.op, tuple(s.axes)) for plan in c.own for s in plan.steps if s.group_size > 1)
        stages.append(Stage(node.name, node.kind, c.text, c.inputs[0], c.out, node.out_shape, params,
                            colls))
    source = graph.nodes[0]
    return Network(graph.name, graph.title, source.source, source.layout, tuple(stages), graph.batch_dims)


@dataclass(frozen=True)
class Measured:
    """One operator (with the redistribution into it): measured on the busiest rank, median of runs."""

    name: str
    bytes_received: int
    comm_seconds: float
    seconds: float


def run_choice(result: Result, comm: Any, repeats: int = 3) -> tuple[tuple[Measured, ...], bool]:
    """Run the choice `repeats` times; per operator the measured figures, and whether every value checked.

    Collective: every rank calls it with the same `result`. A graph that is not a
    chain of `RUNNABLE` kinds runs node by node (`dag.run_dag`).
    """
    if not is_chain(result):
        from .dag import run_dag

        report = run_dag(result, comm, repeats)
        return report.measured, report.passed
    runner = _runner(to_network(result), comm)
    runs = []
    try:
        for _ in range(max(1, repeats)):
            runner.seconds = []
            run = runner.forward()
            runs.append((run.entries, tuple(runner.seconds)))
        passed = all(run.check_all()) and all(row.matches() for row in run.rows())
    finally:
        runner.close()
    mine = [[(sum(e.bytes_received for e in hop if e.group_size > 1), sum(e.seconds for e in hop), secs)
             for hop, secs in zip(entries, seconds)] for entries, seconds in runs]
    per_rank = engine_of(comm).all_gather_object(comm, mine)
    out = []
    for i, op in enumerate(result.ops):
        hops = [h for h, hop in enumerate(runner.hops) if hop.stage == i - 1] if i else []

        def busiest(r: int, k: int) -> float:  # the rank with most of figure k in run r
            return max(sum(rank[r][h][k] for h in hops) for rank in per_rank)

        out.append(Measured(op.name, int(busiest(0, 0)),
                            statistics.median(busiest(r, 1) for r in range(len(runs))),
                            statistics.median(busiest(r, 2) for r in range(len(runs)))))
    return tuple(out), passed


def _runner(net: Network, comm: Any) -> Any:
    """A NetworkRunner that times each hop and runs matmul with its chosen output layout."""
    from ..nets import NetworkRunner
    from ..ops import embedding, matmul
    from .. import DTensor  # the front door: DTensor with its operators

    class Runner(NetworkRunner):
        def __init__(self, net: Network, comm: Any) -> None:
            super().__init__(net, comm)
            self.seconds: list[float] = []
            for i, stage in enumerate(net.stages):
                if stage.kind == "embedding":  # the base runner cuts only MatMul/Linear weights
                    self.params[i] = tuple(DTensor.from_seeded(self.mesh(p.layout.layout), p.layout,
                                                               p.source) for p in stage.params)

        def _hop(self, hop: Any, x: Any) -> Any:
            # Start every hop together: its collectives' times then exclude waiting for
            # ranks still busy with the previous hop (the model prices the transfer alone).
            engine_of(self.comm).barrier(self.comm, None)
            t0 = time.perf_counter()
            stage = self.net.stages[hop.stage]
            if hop.is_redistribution or stage.kind not in ("matmul", "embedding"):
                y = super()._hop(hop, x)
            elif stage.kind == "matmul":  # out_layout: a chosen out_strategy reduce-scatters
                y = matmul(x, *self.params[hop.stage], out_layout=stage.out, label=stage.name)
            else:
                y = embedding(x, *self.params[hop.stage], gather_out=False, label=stage.name)
            self.seconds.append(time.perf_counter() - t0)
            return y

    return Runner(net, comm)


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


def format_checks(result: Result, report: "DagReport") -> str:
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
        lines.append(f"gradients: {k - len(wrong)} of {k} weights match spmdsim.gpt.reference's backward; "
                     f"backward {1e3 * back.seconds:.3f} ms")
        if wrong:
            lines.append(f"first gradient to differ: {wrong[0]}: {back.verdicts[wrong[0]]}")
    elif report.no_backward:
        lines.append(f"backward not run (forward only): {report.no_backward}")
    return "\n".join(lines)
