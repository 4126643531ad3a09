"""Choosing one candidate per operator: propagation (MindSpore's), exact tree DP, branch and bound.

Pure (never imports mpi4py). All three read a `Table` (costs per candidate and
per edge) through plain arrays: ``node[i][c]`` and ``edge[(p, q)][cp, cq]``.

* `propagate`: from the decided operators (the input, the fixed ones) outward
  along the edges; each operator takes the candidate with the least
  redistribution cost to its decided neighbours (ties: its own cost, then the
  candidate that uses more devices).
* `tree_search`: exact minimum on graphs without cycles (chains, trees) by
  min-sum message passing, a dynamic program over candidates in two sweeps;
  the messages also give, for every operator and candidate, the best total
  with that candidate (the runners-up).
* `branch_and_bound`: exact on any graph when it finishes within its node
  limit (then `proven` is True), else the best found; keeps the k best plans.
* `eliminate`: exact on any graph by min-sum variable elimination (the
  operator whose elimination makes the smallest table first), for graphs whose
  cycles are short (a GPT's residuals and attention branches); None when a
  table would exceed its limit.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ...errors import SpmdsimError

__all__ = ["Outcome", "propagate", "tree_search", "branch_and_bound", "eliminate", "neighbours",
           "ELIMINATION_MAX_ENTRIES"]

#: The largest table (entries) variable elimination builds before giving up.
ELIMINATION_MAX_ENTRIES = 20_000_000

Edges = dict[tuple[int, int], np.ndarray]


@dataclass(frozen=True)
class Outcome:
    """A choice (candidate index per node), its objective value and how it was found.

    Attributes:
        proven: whether no other choice is cheaper.
        runners_up: (value, choice) of the next best whole plans found, best first.
        next_here: per node, (candidate, value) of the best plan with another
            candidate there (None when the node has one candidate).
        explored: search nodes expanded (branch and bound) or 0.
    """

    method: str
    choice: tuple[int, ...]
    value: float
    proven: bool
    runners_up: tuple[tuple[float, tuple[int, ...]], ...] = ()
    next_here: tuple[Optional[tuple[int, float]], ...] = ()
    explored: int = 0
    reasons: tuple[str, ...] = ()


def neighbours(n: int, edge: Edges) -> list[list[tuple[int, np.ndarray]]]:
    """Per node, (other node, cost matrix oriented [this node's candidate, other's])."""
    adj: list[list] = [[] for _ in range(n)]
    for (p, q), m in edge.items():
        adj[p].append((q, m))
        adj[q].append((p, m.T))
    return adj


def _total(node: Sequence[np.ndarray], edge: Edges, choice: Sequence[int]) -> float:
    value = sum(float(node[i][c]) for i, c in enumerate(choice))
    return value + sum(float(m[choice[p], choice[q]]) for (p, q), m in edge.items())


# -- propagation ---------------------------------------------------------------------
def propagate(node: Sequence[np.ndarray], edge: Edges, decided: Sequence[int], names: Sequence[str],
              unit=str) -> Outcome:
    """MindSpore's sharding propagation (docs/howto/autoshard.md) from the `decided` nodes (their only
    candidate, index 0).

    Breadth first from the decided nodes in the order given (the fixed
    operators, then the input): each operator reached takes the candidate with
    the least redistribution cost to its decided neighbours, then its
    neighbours are queued. `unit` formats a cost for the reasons.
    """
    n = len(node)
    adj = neighbours(n, edge)
    choice = {i: 0 for i in decided}
    reasons = {i: "" for i in decided}
    queue = [v for u in decided for v, _ in adj[u]]
    while queue:
        i = queue.pop(0)
        if i in choice:
            continue
        redis = np.zeros(len(node[i]))
        for j, m in adj[i]:
            if j in choice:
                redis = redis + m[:, choice[j]]
        c = int(np.lexsort((np.arange(len(redis)), node[i], redis))[0])
        froms = ", ".join(names[j] for j, _ in adj[i] if j in choice)
        choice[i] = c
        reasons[i] = f"propagated from {froms}: {unit(redis[c])}"
        queue += [v for v, _ in adj[i] if v not in choice]
    if len(choice) < n:
        raise SpmdsimError("the graph is not connected to the decided operators")
    picked = tuple(choice[i] for i in range(n))
    return Outcome("propagation", picked, _total(node, edge, picked), False,
                   reasons=tuple(reasons[i] for i in range(n)))


# -- exact on trees ------------------------------------------------------------------
def _bfs(n: int, adj: list, root: int = 0) -> tuple[list[int], list[int]]:
    order, parent, seen = [root], [-1] * n, {root}
    for u in order:
        for v, _ in adj[u]:
            if v not in seen:
                seen.add(v)
                parent[v] = u
                order.append(v)
    return order, parent


def tree_search(node: Sequence[np.ndarray], edge: Edges, runners_up: int = 3) -> Outcome:
    """Exact minimum on a tree (connected, no cycle) by min-sum message passing in two sweeps."""
    n = len(node)
    adj = neighbours(n, edge)
    order, parent = _bfs(n, adj)
    msg: dict[tuple[int, int], np.ndarray] = {}

    def belief(u: int, without: int = -1) -> np.ndarray:
        out = np.asarray(node[u], dtype=float)
        for v, _ in adj[u]:
            if v != without:
                out = out + msg[(v, u)]
        return out

    def send(u: int, v: int, m: np.ndarray) -> None:
        msg[(u, v)] = (belief(u, v)[:, None] + m).min(axis=0)

    for u in reversed(order[1:]):  # leaves first: children to parents
        send(u, parent[u], dict(adj[u])[parent[u]])
    for u in order:  # root first: parents to children
        for v, m in adj[u]:
            if parent[v] == u:
                send(u, v, m)
    marginal = [belief(u) for u in range(n)]
    choice = _decode(node, adj, msg, 0, int(np.argmin(marginal[0])))
    value = _total(node, edge, choice)
    ranked = sorted((float(marginal[u][c]), u, c) for u in range(n)
                    for c in range(len(node[u])) if c != choice[u])
    others: list = []
    for v, u, c in ranked:
        if len(others) >= runners_up:
            break
        alt = _decode(node, adj, msg, u, c)
        if alt != choice and all(alt != o for _, o in others):
            others.append((_total(node, edge, alt), alt))
    next_here = []
    for u in range(n):
        alt = [(float(marginal[u][c]), c) for c in range(len(node[u])) if c != choice[u]]
        next_here.append(None if not alt else min(alt)[::-1])
    return Outcome("tree DP", choice, value, True, tuple(others), tuple(next_here))


def _decode(node, adj, msg, start: int, c_start: int) -> tuple[int, ...]:
    """The best choice with node `start` at candidate `c_start`, outward from it."""
    choice = {start: c_start}
    stack = [start]
    while stack:
        u = stack.pop()
        for v, m in adj[u]:
            if v in choice:
                continue
            inner = np.asarray(node[v], dtype=float)
            for w, _ in adj[v]:
                if w != u:
                    inner = inner + msg[(w, v)]
            choice[v] = int(np.argmin(m[choice[u]] + inner))
            stack.append(v)
    return tuple(choice[i] for i in range(len(node)))


# -- any graph -----------------------------------------------------------------------
def branch_and_bound(node: Sequence[np.ndarray], edge: Edges, start: Optional[tuple[int, ...]] = None,
                     runners_up: int = 3, node_limit: int = 200_000,
                     time_limit_s: Optional[float] = None) -> Outcome:
    """Depth-first branch and bound over candidates, cheapest first; proven when it finishes.

    The bound of a partial choice adds, for each undecided operator, its cheapest
    candidate given the edges to decided ones (edges between undecided operators
    count 0, so the bound never overestimates). `start` (e.g. the propagation's
    choice) seeds the incumbent. Stops after `node_limit` expansions (same
    result on every rank) or `time_limit_s` seconds, whichever comes first.
    """
    n = len(node)
    adj = neighbours(n, edge)
    order, _ = _bfs(n, adj)
    keep = runners_up + 1
    best: list = []  # max-heap of (-value, choice): the `keep` best complete plans
    if start is not None:
        best.append((-_total(node, edge, start), tuple(start)))
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    state = {"explored": 0, "stopped": False}
    acc0 = [np.asarray(v, dtype=float) for v in node]

    def bar() -> float:
        return -best[0][0] if len(best) >= keep else float("inf")

    def visit(depth: int, acc: list, cost: float, picked: dict) -> None:
        if depth == n:
            item = (-cost, tuple(picked[i] for i in range(n)))
            if all(item[1] != c for _, c in best):
                heapq.heappush(best, item)
                if len(best) > keep:
                    heapq.heappop(best)
            return
        u = order[depth]
        for c in np.argsort(acc[u], kind="stable"):
            state["explored"] += 1
            if state["explored"] > node_limit or (deadline and time.perf_counter() > deadline):
                state["stopped"] = True
                return
            step = cost + float(acc[u][c])
            nxt = list(acc)
            for v, m in adj[u]:
                if v not in picked:
                    nxt[v] = acc[v] + m[c]
            picked[u] = int(c)
            rest = sum(float(nxt[v].min()) for v in order[depth + 1:])
            if step + rest < bar():
                visit(depth + 1, nxt, step, picked)
            del picked[u]
            if state["stopped"]:
                return

    visit(0, acc0, 0.0, {})
    ranked = sorted((-v, c) for v, c in best)
    value, choice = ranked[0]
    return Outcome("branch and bound", choice, value, not state["stopped"], tuple(ranked[1:]),
                   _local_next(node, edge, adj, choice), state["explored"])


def _local_next(node, edge, adj, choice: tuple[int, ...]) -> tuple[Optional[tuple[int, float]], ...]:
    """Per node, the best other candidate with every other node unchanged, and the plan's value then."""
    base = _total(node, edge, choice)
    out = []
    for u in range(len(node)):
        delta = np.asarray(node[u], dtype=float) - float(node[u][choice[u]])
        for v, m in adj[u]:
            delta = delta + m[:, choice[v]] - float(m[choice[u], choice[v]])
        delta[choice[u]] = np.inf
        c = int(np.argmin(delta)) if len(delta) > 1 else None
        out.append(None if c is None else (c, base + float(delta[c])))
    return tuple(out)


# -- any graph, exactly, when its cycles are short ---------------------------------
def eliminate(node: Sequence[np.ndarray], edge: Edges, runners_up: int = 3,
              max_entries: int = ELIMINATION_MAX_ENTRIES) -> Optional[Outcome]:
    """Exact minimum by min-sum variable elimination; None when a table would exceed `max_entries`.

    Each step removes the operator whose factors join into the smallest table
    (ties: the earliest), minimising it out into a factor over its neighbours,
    and keeps the argmin to decode the choice backwards. The runners-up are the
    best plans with one operator changed (`_local_next`).
    """
    n = len(node)
    sizes = [len(v) for v in node]
    factors: list[tuple[tuple[int, ...], np.ndarray]] = [((i,), np.asarray(v, dtype=float))
                                                          for i, v in enumerate(node)]
    factors += [((p, q), np.asarray(m, dtype=float)) if p < q else ((q, p), np.asarray(m, dtype=float).T)
                for (p, q), m in edge.items()]
    alive, steps = set(range(n)), []
    while alive:
        scopes: dict[int, set] = {v: set() for v in alive}
        for scope, _ in factors:
            for v in scope:
                scopes[v].update(scope)
        v = min(alive, key=lambda u: (int(np.prod([sizes[w] for w in scopes[u]], dtype=float)), u))
        union = tuple(sorted(scopes[v]))
        if np.prod([sizes[w] for w in union], dtype=float) > max_entries:
            return None
        joined = np.zeros([sizes[w] for w in union])
        keep = []
        for scope, table in factors:
            if v in scope:
                joined = joined + table.reshape([sizes[w] if w in scope else 1 for w in union])
            else:
                keep.append((scope, table))
        axis = union.index(v)
        rest = tuple(w for w in union if w != v)
        steps.append((v, rest, np.argmin(joined, axis=axis)))
        factors = keep + [(rest, joined.min(axis=axis))]
        alive.discard(v)
    choice: dict[int, int] = {}
    for v, rest, arg in reversed(steps):
        choice[v] = int(arg[tuple(choice[w] for w in rest)])
    picked = tuple(choice[i] for i in range(n))
    value = _total(node, edge, picked)
    adj = neighbours(n, edge)
    nxt = _local_next(node, edge, adj, picked)
    others = sorted((value_, u, c) for u, item in enumerate(nxt) if item is not None
                    for c, value_ in [item])
    alts = []
    for value_, u, c in others[:runners_up]:
        alt = list(picked)
        alt[u] = c
        alts.append((value_, tuple(alt)))
    return Outcome("variable elimination", picked, value, True, tuple(alts), nxt)
