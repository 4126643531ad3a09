"""What a choice of candidates costs: each operator's own collectives plus the redistributions.

Pure (never imports mpi4py). Two objectives:

* ``bytes``: the bytes the busiest rank receives, summed over the hops (each
  operator's own collectives, each redistribution from a producer's output
  layout to the layout its consumer needs). A redistribution between layouts
  without pending sums costs exactly its lower bound (the planner's exchange
  always meets it, and the planner keeps the least), which `redistribution_bytes`
  (`volume.py`) computes for many targets at once from the blocks each rank holds,
  without building plans: the search prices every pair of candidates this way,
  and the chosen hops are planned by `spmdsim.programs.plan` afterwards;
* ``time``: the calibrated alpha-beta model (`spmdsim.programs.cost`) over the planned
  steps, plus each operator's floating-point work at a stated or measured rate.

`Table` holds, per operator, the cost of each candidate and, per edge, the
matrix of redistribution costs between the producer's and the consumer's candidates.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ...programs.cost import DEFAULT_MODEL, CostModel, predict_plan
from ...errors import SpmdsimError
from ...layouts.layout import Layout, TensorLayout
from ...programs.plan import Plan, plan_redistribution
from . import backward
from .candidates import Candidate
from .graph import Graph
from .volume import redistribution_bytes

__all__ = ["OBJECTIVES", "Objective", "Table", "measure_flops_rate", "plan_seconds"]

#: What the search can minimise: "bytes" (per rank, exact) or "time" (seconds, modelled); `Objective`'s kinds.
OBJECTIVES = ("bytes", "time")


@dataclass(frozen=True)
class Objective:
    """What the search minimises: "bytes" (per rank, exact) or "time" (seconds, modelled).

    Attributes:
        flops_per_s: compute rate of one rank (time objective and the time columns).
        model: the alpha-beta model of the collectives.
        training: add each candidate's and each hop's backward bytes (`backward`).
    """

    kind: str = "bytes"
    flops_per_s: float = 1e9
    model: CostModel = DEFAULT_MODEL
    training: bool = False

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise SpmdsimError(f"objective {self.kind!r} must be one of {OBJECTIVES!r}")
        if self.training and self.kind != "bytes":
            raise SpmdsimError(f"training prices the backward in bytes; objective {self.kind!r} must be "
                               "'bytes' with it")
        if not 0 < self.flops_per_s < float("inf"):  # 1e400 reads as inf: every compute time would be 0
            raise SpmdsimError(f"compute rate {self.flops_per_s!r} FLOP/s (--flops) must be a finite number > 0")


def measure_flops_rate(n: int = 192, repeats: int = 5, dtype: Any = np.float32) -> float:
    """FLOP/s of a `dtype` (float32 or float64) (n, n) @ (n, n) product on this process (best of `repeats`)."""
    a = np.random.default_rng(0).random((n, n), dtype=dtype)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / max(best, 1e-9)


def plan_seconds(plans: Sequence[Plan], model: CostModel) -> float:
    """Predicted seconds of some plans' steps under `model`."""
    return sum(p.seconds for plan in plans for p in predict_plan(plan, model))


class Table:
    """Costs of every candidate (`node[i][c]`) and every edge (`edge[(p, q)][cp, cq]`).

    Parallel edges between the same two operators are summed. Bytes are int64,
    seconds float64; `objective` says which the search minimises.
    """

    def __init__(self, graph: Graph, options: Sequence[Sequence[Candidate]], objective: Objective,
                 dtypes: Sequence[str]) -> None:
        self.graph, self.options, self.objective = graph, options, objective
        self.dtypes = tuple(dtypes)
        self._memo: dict = {}
        self.node_bytes = [self._once(("bytes", tuple(map(id, cands))), lambda: np.array(
            [c.own_bytes for c in cands], dtype=np.int64)) for cands in options]
        # Seconds only where the search minimises them (the report models the chosen ones itself).
        self.node_seconds = [self._once(("seconds", tuple(map(id, cands))), lambda: np.array(
            [self.own_seconds(c) for c in cands])) for cands in options] if objective.kind == "time" else []
        self.edge_bytes: dict[tuple[int, int], np.ndarray] = {}
        self.edge_seconds: dict[tuple[int, int], np.ndarray] = {}
        need = backward.needs_grad(graph) if objective.training else ()
        # Each candidate's backward with its output gradient whole: priced for the node and read again by
        # each of its input edges (backward._whole).
        self._ops: dict = {}
        if objective.training:  # the backward adds to every candidate's and every hop's bytes
            self.node_bytes = [self.node_bytes[i] + self._once(
                ("backward", tuple(map(id, options[i])), _signature(n), self._needs(i, need)),
                lambda: np.array([backward.node_bytes(n, c, self._needs(i, need), self._ops) for c in options[i]],
                                 dtype=np.int64)) for i, n in enumerate(graph.nodes)]
        for p, q, pos in graph.edges:
            b = self._edge_bytes(p, q, pos)
            if objective.training:
                b = b + self._edge_backward(p, q, pos, [need[graph.index(s)] for s in graph.nodes[q].inputs])
            self.edge_bytes[(p, q)] = self.edge_bytes.get((p, q), 0) + b
            if objective.kind == "time":
                s = self._edge_seconds(p, q, pos)
                self.edge_seconds[(p, q)] = self.edge_seconds.get((p, q), 0) + s

    @property
    def node(self) -> list[np.ndarray]:
        return self.node_bytes if self.objective.kind == "bytes" else self.node_seconds

    @property
    def edge(self) -> dict[tuple[int, int], np.ndarray]:
        return self.edge_bytes if self.objective.kind == "bytes" else self.edge_seconds

    def own_seconds(self, c: Candidate) -> float:
        """Modelled seconds of a candidate's own collectives and its compute."""
        return plan_seconds(c.own, self.objective.model) + c.flops / self.objective.flops_per_s

    def _pairs(self, p: int, q: int, pos: int) -> tuple[list, list, tuple, str]:
        sources = [c.out for c in self.options[p]]
        targets = [c.inputs[pos] for c in self.options[q]]
        return sources, targets, self.graph.nodes[q].in_shapes[pos], self.dtypes[p]

    def _once(self, key: tuple, make) -> np.ndarray:
        # Layers of one kind and shape share their candidates (the same objects): price once.
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def _edge_bytes(self, p: int, q: int, pos: int) -> np.ndarray:
        key = (tuple(map(id, self.options[p])), tuple(map(id, self.options[q])), pos,
               self.graph.nodes[q].in_shapes[pos], self.dtypes[p])
        return self._once(key, lambda: self._price_bytes(p, q, pos))

    def _needs(self, i: int, need: Sequence[bool]) -> tuple[bool, ...]:
        return tuple(need[self.graph.index(s)] for s in self.graph.nodes[i].inputs)

    def _edge_backward(self, p: int, q: int, pos: int, need: list) -> np.ndarray:
        # Identical layers share their candidates: price each kind of hop once.
        key = ("edge backward", tuple(map(id, self.options[p])), tuple(map(id, self.options[q])), pos,
               _signature(self.graph.nodes[q]), self.dtypes[p], tuple(need))
        return self._once(key, lambda: backward.edge_bytes(self.graph, p, q, pos, self.options[p],
                                                           self.options[q], need, self._ops))

    def _price_bytes(self, p: int, q: int, pos: int) -> np.ndarray:
        sources, targets, shape, dtype = self._pairs(p, q, pos)
        unique_s, unique_t = list(dict.fromkeys(sources)), list(dict.fromkeys(targets))
        rows, cols = _positions(sources), _positions(targets)
        unique_s, unique_t = fewer_ranks(unique_s + unique_t, len(unique_s))
        return redistribution_bytes(unique_s, unique_t, shape, dtype)[np.ix_(rows, cols)]

    def _edge_seconds(self, p: int, q: int, pos: int) -> np.ndarray:
        key = ("seconds", tuple(map(id, self.options[p])), tuple(map(id, self.options[q])), pos,
               self.graph.nodes[q].in_shapes[pos], self.dtypes[p])
        return self._once(key, lambda: self._price_seconds(p, q, pos))

    def _price_seconds(self, p: int, q: int, pos: int) -> np.ndarray:
        sources, targets, shape, dtype = self._pairs(p, q, pos)
        unique_s, unique_t = list(dict.fromkeys(sources)), list(dict.fromkeys(targets))
        model = self.objective.model
        matrix = np.array([[plan_seconds(hop_plans(s, t, shape, dtype), model) for t in unique_t]
                           for s in unique_s]).reshape(len(unique_s), len(unique_t))
        return matrix[np.ix_(_positions(sources), _positions(targets))]

    def total(self, choice: Sequence[int]) -> float:
        """Objective value of a whole choice (one candidate index per node)."""
        value = sum(self.node[i][c] for i, c in enumerate(choice))
        return value + sum(m[choice[p], choice[q]] for (p, q), m in self.edge.items())


def fewer_ranks(layouts: Sequence[TensorLayout], split: int) -> tuple[list, list]:
    """`layouts` (cut at `split` into two lists) on fewer ranks where every one ends in a "rep" axis that
    repeats the calculation: each such axis divided by m, the gcd of their sizes, each layout on 1/m of
    the ranks. Rank r holds what rank r // m holds there (the row-major rank's last digit, the repeat,
    is the only one that changes), so every rank needs and holds what its image does, and each hop moves
    the same bytes per rank (tested); at 384 = 3 x 128 devices the GPT's hops are priced on 128 ranks,
    which the power-of-two pricing takes quickly. Unchanged where some layout has no such axis."""
    layouts = list(layouts)
    m = 0
    for tl in layouts:
        names = tl.layout.alias_name
        if names[-1] != "rep" or any("rep" in e for e in tl.tensor_map) or "rep" in tl.partial:
            return layouts[:split], layouts[split:]
        m = math.gcd(m, tl.layout.device_matrix[-1])
    if m <= 1:
        return layouts[:split], layouts[split:]
    out = [TensorLayout(Layout(tl.layout.device_matrix[:-1] + (tl.layout.device_matrix[-1] // m,),
                               tl.layout.alias_name, tl.layout.cut), tl.tensor_map, tl.partial)
           for tl in layouts]
    return out[:split], out[split:]


def _signature(node) -> tuple:
    """What a node's backward depends on besides its candidates: kind, spec, shapes, weights."""
    return (node.kind, node.spec, node.in_shapes, node.out_shape, node.dtype, node.transpose_b,
            tuple((p.shape, p.source.dtype) for p in node.params))


def _positions(items: Sequence) -> list[int]:
    """Index of each item among the distinct items, in first-seen order."""
    seen: dict = {}
    return [seen.setdefault(x, len(seen)) for x in items]


def hop_plans(source: TensorLayout, target: TensorLayout, shape: tuple, dtype: str) -> tuple[Plan, ...]:
    """The planner's plan from `source` to `target` (none when they are equal)."""
    return () if source == target else (plan_redistribution(source, target, tuple(shape), dtype),)
