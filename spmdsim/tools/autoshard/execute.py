"""Run a choice on the ranks and compare it with the prediction (loads the runtime, never mpi4py).

What can run and how is decided in `runnable` (pure); this module runs it.
Chains of the network runner's operators (`runnable.RUNNABLE`) run through
`spmdsim.models.nets.NetworkRunner`, hop by hop; every other graph (branches, the
GPT's kinds) through `dag.run_dag`, node by node. `report.format_measured`
prints what was measured beside the prediction.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from ...runtime.engines import engine_of
from ...models.nets.model import Network
from ...models.nets.run import NetworkRunner
from ...nn.ops import embedding, matmul
from ...runtime.dtensor import DTensor
from .report import Measured, Result
from .dag import run_dag
from .runnable import is_chain, to_network

__all__ = ["run_choice"]


def run_choice(result: Result, comm: Any, repeats: int = 3) -> tuple[tuple[Measured, ...], bool]:
    """Run the choice `repeats` times; per operator the measured figures, and whether every value checked.

    Collective: every rank calls it with the same `result`. A graph that is not a
    chain of `RUNNABLE` kinds runs node by node (`dag.run_dag`).
    """
    if not is_chain(result):
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
