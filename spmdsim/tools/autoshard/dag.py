"""Run any autoshard choice node by node on the ranks (graphs with branches: the GPT, attention).

Importing this module loads the runtime and the operators (never mpi4py);
which choices can run is decided in `runnable` (pure). Every rank builds only
its shards: the input, each weight on the layout the node's chosen candidate
gives it (`DTensor.from_seeded`; `DTensor.full` for a `graph.Constant`) and
the cross-entropy's targets split like the logits' rows. In topological
order, each node's inputs are redistributed into the layouts its candidate
wants, the operator of `spmdsim.nn.ops` runs on them, and its result is brought
to the candidate's output layout (an einsum's, MatMul's or vocab-parallel
embedding's pending sum: its own Allreduce or Reduce_scatter). Each node runs
under its own trace, its ranks started together (a barrier), so its measured
bytes and times sit beside the prediction (`report.format_measured`); every
node's output is then checked against `evaluate.evaluate` (numpy, one process).

With ``train=True`` (``--run --training``) the loss's ``backward()`` runs too,
under one trace, and each weight's gradient (the tied embedding's summed over
its uses) is checked against `spmdsim.models.gpt.reference`'s hand-written backward
on the graph's weights (the GPT's own, `gpt.gpt_params`): only for the GPT's
graphs (`gpt.gpt_config`), the one numpy backward there is; other graphs run
forward only.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ...nn import ops  # the operators; loading them gives the runtime's DTensor its operators (x + y, backward)
from ...runtime.engines import engine_of
from ...base.once import once
from ...errors import SpmdsimError
from ...layouts.layout import Layout, TensorLayout
from ...runtime.dtensor import DTensor
from ...runtime.executor import redistribute
from ...runtime.mesh import Mesh
from ...runtime.trace import collect_trace
from .graph import Constant
from .report import Backward, DagReport, Measured, Result
from .runnable import DAG_KINDS, check_dag
from ...models.gpt import reference
from .evaluate import evaluate
from .gpt import gpt_config

__all__ = ["DagRunner", "run_dag"]


@dataclass(frozen=True)
class NodeRun:
    """One node on this rank: bytes received in collectives, their seconds, the node's seconds."""

    bytes_received: int
    comm_seconds: float
    seconds: float


class DagRunner:
    """``DagRunner(result, comm)``: meshes, weight shards and targets of a choice, ready to run.

    Collective to build and to run: every rank calls with the same `result`.
    `train`: the weights require gradients and values keep their autograd records.
    """

    def __init__(self, result: Result, comm: Any, train: bool = False) -> None:
        check_dag(result)
        self.result, self.graph, self.comm, self.train = result, result.graph, comm, bool(train)
        self._meshes: dict[Layout, Any] = {}
        source = self.graph.nodes[0]
        self.x = DTensor.from_seeded(self.mesh(source.layout.layout), source.layout, source.source)
        self.params: list[tuple] = [()]
        self._weights: dict[tuple, Any] = {}
        self.targets: dict[int, Any] = {}
        for i, (node, op) in enumerate(zip(self.graph.nodes[1:], result.ops[1:]), 1):
            c = op.candidate
            self.params.append(tuple(self._weight(spec, layout) for spec, layout in zip(node.params, c.params)))
            if node.kind == "cross_entropy":
                x = c.inputs[0]
                rows = TensorLayout(x.layout, x.tensor_map[:1])
                self.targets[i] = DTensor.from_seeded(self.mesh(x.layout), rows, node.source)

    def _weight(self, spec: Any, layout: TensorLayout) -> Any:
        """This rank's shard of a weight on `layout`, made once per (weight, layout).

        A weight two nodes use alike (the tied embedding) is one tensor: one leaf, its gradient
        summed over both uses before the leaf's Allreduce, as the engine does. The key holds the
        source too: the attention's Q, K and V weights are all called "w".
        """
        key = (spec.name, spec.source, layout)
        p = self._weights.get(key)
        if p is None:
            mesh, source = self.mesh(layout.layout), spec.source
            if isinstance(source, Constant):  # ones or zeros (the GPT's layer norms and biases)
                p = DTensor.full(mesh, layout, source.shape, source.value, source.dtype)
            else:
                p = DTensor.from_seeded(mesh, layout, source)
            self._weights[key] = p
            if self.train:
                p.requires_grad_()
        return p

    def mesh(self, layout: Layout) -> Any:
        """The runtime Mesh of `layout` over this runner's communicator (one per device matrix)."""
        mesh = self._meshes.get(layout)
        if mesh is None:
            mesh = self._meshes[layout] = Mesh(layout, self.comm)
        return mesh

    def _into(self, x: Any, layout: TensorLayout) -> Any:
        """`x` laid out as `layout`, on this runner's mesh of its device matrix."""
        if x.layout == layout:
            return x
        y = redistribute(x, layout)
        if self.train:  # the moved value keeps its record (the backward moves its gradient back)
            return y
        return DTensor(self.mesh(layout.layout), y.local, y.layout, y.global_shape)

    def forward(self) -> tuple[dict[str, Any], tuple[NodeRun, ...]]:
        """Every node's output (finished, in its chosen layout) and this rank's figures per node."""
        values: dict[str, Any] = {self.graph.nodes[0].name: self.x}
        figures = [NodeRun(0, 0.0, 0.0)]
        for i, (node, op) in enumerate(zip(self.graph.nodes[1:], self.result.ops[1:]), 1):
            c = op.candidate
            # Start every node together: its collectives' times then exclude waiting for
            # ranks still busy with the previous node (the model prices the transfer alone).
            engine_of(self.comm).barrier(self.comm, None)
            t0 = time.perf_counter()
            with collect_trace() as trace:
                xs = [self._into(values[src], layout) for src, layout in zip(node.inputs, c.inputs)]
                try:
                    y = self._into(self._op(i, node, xs), c.out)
                except SpmdsimError as e:  # the layouts every rank shares: all ranks raise alike
                    raise SpmdsimError(f"{node.name} ({node.kind}, strategy {c.text}) cannot run as the cost "
                                  f"model priced it: {e}") from None
            seconds = time.perf_counter() - t0
            entries = [e for e in trace.entries if e.group_size > 1]
            figures.append(NodeRun(sum(e.bytes_received for e in entries), sum(e.seconds for e in entries),
                                   seconds))
            values[node.name] = y
        return values, tuple(figures)

    def _op(self, i: int, node: Any, xs: list) -> Any:
        kind, params = node.kind, self.params[i]
        if kind in ("flatten", "reshape"):
            return ops.reshape(xs[0], node.out_shape)
        if kind in ("matmul", "bmm"):
            a, b = (xs[0], params[0]) if kind == "matmul" else xs
            return ops.matmul(a, b, transpose_b=node.transpose_b, reduce=False, label=node.name)
        if kind == "linear":
            return ops.linear(xs[0], *params, reduce=False, label=node.name)
        if kind in ("relu", "gelu"):
            return ops.activation(xs[0], kind)
        if kind == "softmax":
            x = xs[0]
            if node.spec == "causal":  # only this rank's block of the mask, split like the scores
                keys = TensorLayout(x.layout.layout, x.layout.tensor_map[-2:])
                x = ops.masked_fill(x, ops.causal_mask(x.mesh, x.global_shape[-2:], keys), -np.inf)
            return ops.softmax(x, -1)
        if kind == "embedding":
            return ops.embedding(xs[0], params[0], gather_out=False, reduce=False, label=node.name)
        if kind == "einsum":
            return ops.einsum(node.spec, *xs, *params)
        if kind == "pointwise":
            operands = list(xs) + list(params)
            if len(operands) == 1:
                operands.append(node.constant)
            return getattr(ops, node.spec)(*operands)
        if kind == "layernorm":
            return ops.layer_norm(xs[0], *params)
        if kind == "cross_entropy":
            return ops.cross_entropy(xs[0], self.targets[i])
        raise SpmdsimError(f"{node.name}: kind {kind!r} is not one of {DAG_KINDS!r}")

    def check(self, values: dict[str, Any], expected: dict[str, np.ndarray]) -> dict[str, Any]:
        """Each node's verdict against `expected` (`evaluate.evaluate`), agreed by all ranks (collective)."""
        verdicts = {}
        for node in self.graph.nodes[1:]:
            ref = expected[node.name]
            value = values[node.name]
            scale = float(np.max(np.abs(ref))) if ref.size and ref.dtype.kind == "f" else 0.0
            # Sums in another order (split contractions, reductions over ranks) round differently;
            # float64 (the GPT's) to about 1e-12 of the largest magnitude, float32 to its defaults.
            rtol, atol = (1e-9, 1e-11 * max(1.0, scale)) if value.dtype == np.float64 else (None, None)
            verdicts[node.name] = value.check(ref, rtol=rtol, atol=atol)
        return verdicts

    def backward(self, values: dict[str, Any]) -> NodeRun:
        """The loss's backward (collective), traced as one: this rank's bytes and seconds."""
        loss = values[self.graph.nodes[-1].name]
        engine_of(self.comm).barrier(self.comm, None)
        t0 = time.perf_counter()
        with collect_trace() as trace:
            loss.backward()
        seconds = time.perf_counter() - t0
        entries = [e for e in trace.entries if e.group_size > 1]
        return NodeRun(sum(e.bytes_received for e in entries), sum(e.seconds for e in entries), seconds)

    def check_grads(self, expected: dict[str, np.ndarray]) -> dict[str, Any]:
        """Each weight's gradient against `expected` (by name), agreed by all ranks (collective).

        A weight several nodes use in different layouts (the tied embedding, maybe) has one
        tensor per layout: their gradients are added in the first one's layout.
        """
        uses: dict[str, list] = {}
        for node, shards in zip(self.graph.nodes[1:], self.params[1:]):
            for spec, p in zip(node.params, shards):
                if not any(p is q for q in uses.setdefault(spec.name, [])):
                    uses[spec.name].append(p)
        verdicts = {}
        for name, weights in uses.items():
            total = weights[0].grad
            for w in weights[1:]:
                total = total + redistribute(w.grad, total.layout)
            ref = expected[name]
            atol = 1e-11 * max(1.0, float(np.max(np.abs(ref))))
            verdicts[name] = total.check(ref, rtol=1e-9, atol=atol)
        return verdicts

    def close(self) -> None:
        """Free the meshes' sub-communicators (collective: all ranks call it)."""
        for mesh in self._meshes.values():
            mesh.close()


def _reference_grads(graph: Any) -> tuple[Optional[dict], str]:
    """spmdsim.models.gpt.reference's gradients of the graph's weights, or (None, why not)."""
    last = graph.nodes[-1]
    if last.kind != "cross_entropy":
        return None, f"{graph.name} ends in {last.name} ({last.kind}), not a loss"
    cfg = gpt_config(graph)
    if cfg is None:
        return None, (f"{graph.name} is not the GPT's graph, and spmdsim.models.gpt.reference's is the one "
                      "numpy backward to check gradients against")
    params = {p.name: np.asarray(p.source.full(), dtype=np.float64) for n in graph.nodes for p in n.params}
    ids = graph.nodes[0].source.full()
    _, grads = reference.loss_and_grads(params, ids, last.source.full().reshape(ids.shape), cfg, None,
                                        train=False)
    return grads, ""


def run_dag(result: Result, comm: Any, repeats: int = 3, train: bool = False) -> DagReport:
    """Run the choice `repeats` times (figures: busiest rank, median), check the last run's values.

    `train`: then the last run's backward too, its gradients checked (GPT graphs only; the
    report says why not otherwise). Collective: every rank calls it with the same `result`.
    """
    # numpy first: evaluated while the ranks run, it would slow the last node's measured time.
    # Local work on the graph every rank shares: simulated ranks do it once, not once each.
    expected = once(("spmdsim autoshard: numpy values",), evaluate, result.graph)
    grads, no_backward = once(("spmdsim autoshard: numpy gradients",), _reference_grads, result.graph) if train \
        else (None, "")
    runner = DagRunner(result, comm, train=grads is not None)
    back = None
    try:
        runs = []
        for _ in range(max(1, repeats)):
            values, figures = runner.forward()
            runs.append(figures)
        verdicts = runner.check(values, expected)
        if grads is not None:
            mine = runner.backward(values)
            grad_verdicts = runner.check_grads(grads)
            everyone = engine_of(comm).all_gather_object(comm, (mine.bytes_received, mine.seconds))
            back = Backward(max(b for b, _ in everyone), max(t for _, t in everyone), grad_verdicts)
    finally:
        runner.close()
    per_rank = engine_of(comm).all_gather_object(comm, [[(f.bytes_received, f.comm_seconds, f.seconds)
                                                          for f in run] for run in runs])
    measured = []
    for i, op in enumerate(result.ops):
        def busiest(r: int, k: int) -> float:  # the rank with most of figure k in run r
            return max(rank[r][i][k] for rank in per_rank)

        measured.append(Measured(op.name, int(busiest(0, 0)),
                                 statistics.median(busiest(r, 1) for r in range(len(runs))),
                                 statistics.median(busiest(r, 2) for r in range(len(runs)))))
    last = result.graph.nodes[-1]
    loss = None
    if last.kind == "cross_entropy":
        loss = (float(values[last.name].local), float(expected[last.name]))
    return DagReport(tuple(measured), verdicts, loss, back, no_backward)
