"""Which autoshard choices can run on the ranks, and how: pure (numpy only; no runtime, no mpi4py).

A chain of the network runner's operators (`RUNNABLE`) runs through
`spmdsim.models.nets.NetworkRunner` as a `Network` of stages (`to_network`), every
other graph node by node (`DAG_KINDS`). `check_runnable` says, the same on
every rank and before any collective, what cannot run. The runners themselves
are `execute.run_choice` and `dag.run_dag`; what they measured is a `Measured`
row per operator (spmdsim.tools.autoshard.report, whose `format_measured` prints them beside the prediction).
"""
from __future__ import annotations

from ...layouts.datagen import SeededTensor
from ...errors import SpmdsimError
from ...models.nets.model import Network, Param, Stage
from .report import Result

__all__ = ["RUNNABLE", "DAG_KINDS", "is_chain", "check_runnable", "check_dag", "to_network"]

#: Node kinds the network runner executes (a chain of them runs as a `Network`).
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
        check_dag(result)


def to_network(result: Result) -> Network:
    """The chosen strategies as a `Network` (a chain of stages) for `spmdsim.models.nets.NetworkRunner`."""
    graph = result.graph
    if not graph.is_chain():
        raise SpmdsimError(f"--run executes chains of operators; {graph.name!r} has branches")
    odd = [(n.name, n.kind) for n in graph.nodes if n.kind not in RUNNABLE]
    if odd:
        raise SpmdsimError(f"--run executes {', '.join(RUNNABLE[1:])} operators, not "
                           + ", ".join(f"{name} ({kind})" for name, kind in odd))
    filled = [f"{n.name}'s {p.name}" for n in graph.nodes for p in n.params
              if not isinstance(p.source, SeededTensor)]
    if filled:
        raise SpmdsimError(f"--run: a chain runs through the network runner, whose weights are seeded; "
                           f"{', '.join(filled)} {'is a constant' if len(filled) == 1 else 'are constants'}")
    stages = []
    for node, op in zip(graph.nodes[1:], result.ops[1:]):
        c = op.candidate
        params = tuple(Param(p.name, tl, p.source) for p, tl in zip(node.params, c.params))
        colls = tuple((s.op, tuple(s.axes)) for plan in c.own for s in plan.steps if s.group_size > 1)
        stages.append(Stage(node.name, node.kind, c.text, c.inputs[0], c.out, node.out_shape, params,
                            colls))
    source = graph.nodes[0]
    return Network(graph.name, graph.title, source.source, source.layout, tuple(stages), graph.batch_dims)


#: Node kinds the DAG runner executes.
DAG_KINDS = ("input", "flatten", "matmul", "linear", "bmm", "relu", "gelu", "softmax", "embedding",
             "einsum", "pointwise", "layernorm", "reshape", "cross_entropy")


def check_dag(result: Result) -> None:
    """Raise SpmdsimError (one line) when some node cannot run; pure, the same on every rank."""
    graph = result.graph
    odd = [f"{n.name} ({n.kind})" for n in graph.nodes if n.kind not in DAG_KINDS]
    if odd:
        raise SpmdsimError(f"--run executes {', '.join(DAG_KINDS[1:])} operators, not {', '.join(odd)}")
    for node in graph.nodes:
        if node.kind == "cross_entropy" and node.source is None:
            raise SpmdsimError(f"--run: {node.name} (cross_entropy) has no targets (its node's source)")
        if node.kind == "pointwise" and len(node.inputs) + len(node.params) == 1 and node.constant is None:
            raise SpmdsimError(f"--run: {node.name} (pointwise {node.spec!r} of one operand) has no constant")
