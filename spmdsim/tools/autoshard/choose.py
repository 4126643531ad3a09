"""`autoshard(...)`: candidates, costs, propagation or search, and the report of the choice.

Pure (never imports mpi4py).

    from spmdsim.tools.autoshard import autoshard
    result = autoshard("net_mindspore_tutorial", 8, fix={"MatMul1": "((2, 4), (4, 1))"})
    print(result.table()); result.total_bytes_per_rank
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import replace
from typing import Mapping, Optional, Sequence, Union

from ...programs.cost import CostModel, load_or_default
from ...layouts.dialects.strategy import parse_strategy
from ...errors import OperatorError, SpmdsimError
from ...base.validate import describe, int_arg
from .backward import replay
from .candidates import Candidate, candidates, make_candidate, most_devices
from .cost import Objective, Table, hop_plans, measure_flops_rate, plan_seconds
from .graph import Graph, Hand
from .networks import NAMES, build
from .search import Outcome, branch_and_bound, eliminate, propagate, tree_search
from .volume import redistribution_bytes
from .report import OpReport, Result

__all__ = ["autoshard", "METHODS", "PLANNED_HOPS_MAX_DEVICES",
           "TIME_OBJECTIVE_MAX_DEVICES"]

#: How `autoshard` chooses: "search" (tree DP, else branch and bound) or "propagate" (sharding propagation).
METHODS = ("search", "propagate")

#: The time objective plans every pair of candidate layouts (~20 s for the tutorial at 16).
TIME_OBJECTIVE_MAX_DEVICES = 16

#: Graphs with cycles and more operators than this are searched by variable elimination (exact
#: when its tables fit), smaller ones by branch and bound (which keeps the k best whole plans).
BRANCH_AND_BOUND_MAX_NODES = 16

#: Above this many devices the chosen hops are priced from the blocks alone
#: (exact bytes) and not planned step by step (the planner takes ~0.5 s a hop at 4,096).
PLANNED_HOPS_MAX_DEVICES = 512


def autoshard(network: Union[str, Graph], devices: int = 8, *,
              fix: Optional[Mapping[str, str]] = None, memory_limit: Optional[int] = None,
              objective: str = "bytes", method: str = "search", flops_per_s: Optional[float] = None,
              model: Optional[CostModel] = None, runners_up: int = 3, node_limit: int = 200_000,
              time_limit_s: Optional[float] = None, hand: Optional[Sequence[Optional[Hand]]] = None,
              training: bool = False) -> Result:
    """Choose every operator's strategy of `network` on `devices` devices.

    Args:
        network: a name (`spmdsim.tools.autoshard.networks.NAMES`) or a Graph (then `hand`
            may give its hand-written layouts, one per node, None for the input).
        fix: {operator: strategy text} held fixed, e.g. ``"((2, 4), (4, 1))"``,
            ``"((2, 4), (4, 1)) out ((8, 1),)"``, or ``"hand"`` (the hand-written one);
            ``{"*": "hand"}``: every operator not named holds its hand-written strategy.
        memory_limit: bytes per rank an operator may hold (weights, inputs, output).
        objective: "bytes" (per rank, exact) or "time" (alpha-beta model + compute).
        method: "search" (tree DP, else branch and bound) or "propagate" (MindSpore's sharding propagation).
        flops_per_s: compute rate of one rank (default: measured now).
        model: the collectives' cost model (default: the calibrated one, `spmdsim calibrate`).
        node_limit, time_limit_s: when branch and bound stops (then not proven optimal).
        training: also price the backward of a training step (bytes objective only).
    """
    devices = int_arg(devices, "devices", low=1)
    fix = _check_arguments(network, fix, memory_limit, runners_up, node_limit, time_limit_s)
    if method not in METHODS:
        raise SpmdsimError(f"method {method!r} must be one of {METHODS!r}")
    if objective == "time" and devices > TIME_OBJECTIVE_MAX_DEVICES:
        raise SpmdsimError(f"the time objective plans every pair of layouts, too slow at {devices} "
                           f"devices; expected at most {TIME_OBJECTIVE_MAX_DEVICES} (or --objective bytes)")
    if isinstance(network, str):
        graph, hand = build(network, devices)
    else:
        graph = network
    obj = Objective(objective, flops_per_s or measure_flops_rate(),
                    model if model is not None else load_or_default(), bool(training))
    dtypes = [n.dtype for n in graph.nodes]
    in_dtypes = [tuple(dtypes[graph.index(i)] for i in n.inputs) for n in graph.nodes]
    hand_cands = _hand(graph, hand, in_dtypes)
    fix = _every(graph, fix, hand_cands, devices)
    options, considered, ruled_out = _options(graph, devices, in_dtypes, hand_cands, fix, memory_limit)
    table = Table(graph, options, obj, dtypes)
    names = [n.name for n in graph.nodes]
    fixed = [i for i, n in enumerate(graph.nodes) if n.name in fix] + [0]
    prop = propagate(table.node, table.edge, fixed, names, _unit(obj))
    if method == "propagate":
        outcome = prop
    elif graph.is_tree():
        outcome = tree_search(table.node, table.edge, runners_up)
    else:
        outcome = _general_search(len(graph.nodes), table, options, prop, hand_cands, runners_up, node_limit,
                                  time_limit_s)
    chosen = [options[i][c] for i, c in enumerate(outcome.choice)]
    whys = _whys(graph, options, outcome, fixed, obj)
    ops = _reports(graph, chosen, considered, ruled_out, obj, whys)
    hand_ops = None if hand_cands is None else _reports(graph, hand_cands, considered, ruled_out, obj,
                                                        ["hand-written"] * len(chosen))
    others = tuple((_exact_bytes(graph, [options[i][c] for i, c in enumerate(alt)]), value,
                    tuple(f"{names[i]}={options[i][c].text}" for i, c in enumerate(alt)
                          if c != outcome.choice[i]))
                   for value, alt in outcome.runners_up)
    prop_bytes = _exact_bytes(graph, [options[i][c] for i, c in enumerate(prop.choice)])
    back = replay(graph, chosen) if training else ()
    hand_back = replay(graph, hand_cands) if training and hand_cands is not None else None
    return Result(graph, devices, obj, outcome, ops, hand_ops, prop, prop_bytes, others, back, hand_back)


def _check_arguments(network, fix, memory_limit, runners_up, node_limit, time_limit_s) -> dict:
    """Refuse, before any work, what `autoshard` cannot take: a network that is no name or Graph, `fix` that is
    no mapping of operator names to strategy text, a negative memory limit or count of runners-up, a node limit
    below 1, a time limit that is no finite number of seconds > 0. `fix` as a dict."""
    if not isinstance(network, (str, Graph)):
        raise OperatorError(f"network {describe(network)} must be a network name (one of {tuple(NAMES)!r}) "
                            "or a spmdsim.tools.autoshard Graph")
    if fix is not None and not isinstance(fix, Mapping):
        raise SpmdsimError(f"fix {describe(fix)} must be a mapping {{operator name: strategy text}}, "
                           "e.g. {'fc1': '((2, 4), (4, 1))'} or {'*': 'hand'}")
    fix = dict(fix or {})
    for name, text in fix.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise SpmdsimError(f"fix {{{name!r}: {text!r}}} must map an operator name to strategy text, "
                               "e.g. {'fc1': '((2, 4), (4, 1))'} or {'fc1': 'hand'}")
    if memory_limit is not None:
        int_arg(memory_limit, "memory_limit (bytes per rank)", low=0, error=SpmdsimError)
    int_arg(runners_up, "runners_up", low=0, error=SpmdsimError)
    int_arg(node_limit, "node_limit", low=1, error=SpmdsimError)
    if time_limit_s is not None and (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, numbers.Real)
                                     or not math.isfinite(time_limit_s) or time_limit_s <= 0):
        raise SpmdsimError(f"time_limit_s {time_limit_s!r} must be a finite number of seconds > 0, or None")
    return fix


def _general_search(nodes: int, table: Table, options: list, prop: Outcome, hand_cands: Optional[list],
                    runners_up: int, node_limit: int, time_limit_s: Optional[float]) -> Outcome:
    """The choice on a graph that is no tree: variable elimination on a large graph, else branch and bound
    seeded by the better of propagation and the hand-written plan (elimination again if it stopped at its
    limit)."""
    outcome = None
    big = nodes > BRANCH_AND_BOUND_MAX_NODES
    if big:
        outcome = eliminate(table.node, table.edge, runners_up)
    if outcome is None:
        start = prop.choice
        if hand_cands is not None:  # the better of propagation and the hand-written plan seeds it
            mine = tuple(next(k for k, c in enumerate(options[i]) if c.same_layouts(hand_cands[i]))
                         if any(c.same_layouts(hand_cands[i]) for c in options[i]) else 0
                         for i in range(len(options)))
            start = min((prop.choice, mine), key=table.total)
        outcome = branch_and_bound(table.node, table.edge, start, runners_up, node_limit,
                                   time_limit_s)
        # Stopped at its limit: elimination is exact, and quick when its tables are small (a large graph's
        # is tried first, and finds a table too large).
        if not outcome.proven and not big:
            exact = eliminate(table.node, table.edge, runners_up)
            if exact is not None:
                outcome = replace(exact, method="variable elimination (branch and bound stopped)",
                                  explored=outcome.explored)
    return outcome


def _hand(graph: Graph, hand, in_dtypes) -> Optional[list[Candidate]]:
    """The hand-written layouts as candidates (the input's is its given layout)."""
    if hand is None:
        return None
    out = []
    for node, h, dts in zip(graph.nodes, hand, in_dtypes):
        if h is None:
            out.append(make_candidate(node, (), (), dts, hand=True))
        else:
            want = h.out if node.kind in ("matmul", "einsum", "embedding") else None
            out.append(make_candidate(node, h.inputs, h.params, dts, want, hand=True))
    return out


def _every(graph: Graph, fix: dict, hand_cands: Optional[list], devices: int) -> dict:
    """`fix` with ``"*": "hand"`` spelled out: every operator not named on its own holds its
    hand-written strategy (Megatron's on the GPT), so a run shows the hand-written plan."""
    if "*" not in fix:
        return fix
    if fix["*"].strip().lower() != "hand":
        raise SpmdsimError(f"--fix '*={fix['*']}': '*' fixes every operator and takes 'hand' only "
                           "(the hand-written strategies); name an operator to fix it to a strategy")
    if hand_cands is None:
        raise SpmdsimError(f"--fix '*=hand': {graph.name} has no hand-written strategies at {devices} devices")
    every = {n.name: "hand" for n in graph.nodes[1:]}
    every.update((name, text) for name, text in fix.items() if name != "*")
    return every


def _options(graph: Graph, devices: int, in_dtypes, hand_cands, fix: dict, memory_limit) -> tuple:
    """Per node: the candidates the search may take, how many were enumerated, how many ruled out."""
    for name in fix:
        graph.index(name)  # an unknown name raises, listing the known ones
    if graph.nodes[0].name in fix:
        raise OperatorError(f"{graph.nodes[0].name!r} is the network input; its layout is given")
    wanted = {name: _parse_fix(name, text) for name, text in fix.items()}  # bad text: before any enumeration
    options, considered, ruled_out = [], [], []
    full = graph.fully_use_above is not None and devices > graph.fully_use_above
    # Fully using the devices means those a strategy can use: at 384 = 3 x 128 the GPT's power-of-two
    # shapes use at most 128, each block repeated on 3 ranks, which changes no byte (`most_devices`).
    use = most_devices(graph.nodes, devices) if full else None
    for i, node in enumerate(graph.nodes):
        cands = list(candidates(node, devices, in_dtypes[i], full, use))
        if hand_cands is not None and i and not any(c.same_layouts(hand_cands[i]) for c in cands):
            cands.append(hand_cands[i])
        considered.append(len(cands))
        if node.name in fix:
            held = _fixed(node.name, fix[node.name], wanted[node.name], cands, hand_cands and hand_cands[i])
            if memory_limit is not None and held.memory > memory_limit:  # not "no strategy fits": others may
                fit = [c.memory for c in cands if c.memory <= memory_limit]
                others = (f"{len(fit)} of its {len(cands)} candidates fit, the smallest needs {min(fit):,}"
                          if fit else f"none of its {len(cands)} candidates fits")
                raise SpmdsimError(f"--fix {node.name}={fix[node.name].strip()} needs {held.memory:,} bytes per "
                                   f"rank, over the memory limit of {memory_limit:,}; {others}")
            cands = [held]
        fits = [c for c in cands if memory_limit is None or c.memory <= memory_limit or i == 0]
        if not fits:
            least = min(c.memory for c in cands)
            raise SpmdsimError(f"no strategy of {node.name} fits the memory limit of {memory_limit:,} "
                               f"bytes per rank; the smallest needs {least:,}")
        ruled_out.append(len(cands) - len(fits) if node.name not in fix else 0)
        options.append(tuple(fits))
    return options, considered, ruled_out


def _parse_fix(name: str, text: str) -> Optional[tuple]:
    """None for "hand", else (strategy, out strategy or None) of "STRATEGY [out OUT]" (one line when malformed)."""
    if text.strip().lower() == "hand":
        return None
    parts = re.split(r"\s+out\s+", text.strip())
    if len(parts) > 2:  # not the parts after the second dropped unsaid: the operator would run another strategy
        raise SpmdsimError(f"--fix {name}={text.strip()} has {len(parts) - 1} 'out' parts; expected "
                           "STRATEGY or STRATEGY out OUT_STRATEGY, e.g. '((2,4),(4,1)) out ((8,1),)'")
    return parse_strategy(parts[0]), parse_strategy(parts[1]) if len(parts) == 2 else None


def _fixed(name: str, text: str, wanted: Optional[tuple], cands: list, hand: Optional[Candidate]) -> Candidate:
    """The candidate `text` names (`wanted`, from `_parse_fix`): "hand", or an in-strategy with an optional
    "out" strategy."""
    if wanted is None:
        if hand is None:
            raise SpmdsimError(f"{name} has no hand-written strategy at this device count")
        return next(c for c in cands if c.same_layouts(hand))
    strategy, out = wanted
    for c in sorted(cands, key=lambda c: c.hand):  # an enumerated one before a hand-written twin
        if c.strategy == strategy and c.out_strategy == out:
            return c
    shown = ", ".join(c.text for c in cands[:6])
    raise SpmdsimError(f"strategy {text!r} is not a candidate of {name}; candidates are e.g. {shown}"
                       f" ({len(cands)} in all)")


def _whys(graph: Graph, options, outcome: Outcome, fixed: Sequence[int], obj: Objective) -> list[str]:
    out = []
    unit = _unit(obj)
    for i, node in enumerate(graph.nodes):
        if i == 0:
            out.append("input (given)")
        elif i in fixed:
            out.append("fixed")
        elif outcome.reasons:
            out.append(outcome.reasons[i])
        elif len(options[i]) == 1:
            out.append("the only candidate")
        else:
            nxt = outcome.next_here[i] if outcome.next_here else None
            if nxt is None:
                out.append("least total")
            else:
                c, value = nxt
                alt = options[i][c].text.replace(", ", ",")
                out.append(f"next best +{unit(max(0, value - outcome.value))}: {alt}")
    return out


def _unit(obj: Objective):
    if obj.kind == "bytes":
        return lambda v: f"{int(round(v)):,} B"
    return lambda v: f"{v * 1e3:.3g} ms"


def _reports(graph: Graph, chosen: Sequence[Candidate], considered, ruled_out, obj: Objective,
             whys: Sequence[str]) -> tuple[OpReport, ...]:
    """Exact bytes (planned hops up to PLANNED_HOPS_MAX_DEVICES) and modelled seconds per operator."""
    devices = chosen[0].out.layout.num_devices
    planned = devices <= PLANNED_HOPS_MAX_DEVICES
    out = []
    for q, node in enumerate(graph.nodes):
        hops, in_bytes = [], 0
        for pos, src in enumerate(node.inputs):
            p = graph.index(src)
            s, t, shape = chosen[p].out, chosen[q].inputs[pos], node.in_shapes[pos]
            if planned:
                hops += hop_plans(s, t, shape, graph.nodes[p].dtype)
            in_bytes += int(redistribution_bytes([s], [t], shape, graph.nodes[p].dtype)[0, 0])
        c = chosen[q]
        comm = plan_seconds(tuple(hops) + c.own, obj.model)
        out.append(OpReport(node.name, node.kind, considered[q], ruled_out[q], c, in_bytes,
                            c.own_bytes, tuple(hops), comm, c.flops / obj.flops_per_s, whys[q]))
    return tuple(out)


def _exact_bytes(graph: Graph, chosen: Sequence[Candidate]) -> int:
    total = sum(c.own_bytes for c in chosen)
    for p, q, pos in graph.edges:
        total += int(redistribution_bytes([chosen[p].out], [chosen[q].inputs[pos]],
                                          graph.nodes[q].in_shapes[pos], graph.nodes[p].dtype)[0, 0])
    return total
