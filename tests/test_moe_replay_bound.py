"""A replayed MoE layer's exchanges (spmdsim.moe.layer, spmdsim.runtime.replay): with a capacity each dispatch and
combine Alltoall is its own recorded call, bound to its mesh's kept plan (the engine's transfer alone: no
collective's checks, no door.repeat on replay); dropless, the Alltoallv whose counts change each step runs whole.
Either way a replay equals the eager layer on the same tokens bit for bit."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import spmdsim
from spmdsim import ops
from spmdsim.moe import MoEConfig
from spmdsim.moe.layer import moe_layer
from spmdsim.runtime import collectives, door
from spmdsim.runtime.exchange import group_alltoallv
from spmdsim.runtime.dtensor import DTensor
from spmdsim.runtime.replay import capture

T, B, D, E = 4, 2, 8, 4


def _entered(call):
    """(call's result, the code objects of the frames it entered)."""
    frames: set = set()

    def tracer(frame, event, arg):
        if event == "call":
            frames.add(frame.f_code)
        return None

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return result, frames


def _layer_step(dropless):
    rng = np.random.default_rng(3)
    p = {"h1.moe.router": rng.standard_normal((D, E)), "h1.moe.w1": rng.standard_normal((E, D, 2 * D)) * 0.3,
         "h1.moe.b1": rng.standard_normal((E, 2 * D)) * 0.1, "h1.moe.w2": rng.standard_normal((E, 2 * D, D)) * 0.3,
         "h1.moe.b2": rng.standard_normal((E, D)) * 0.1}
    xs = [rng.standard_normal((T, B, D)) for _ in range(3)]
    g = rng.standard_normal((T, B, D))
    moe = MoEConfig(experts=E, top_k=2, capacity_factor=1.0, dropless=dropless)
    maps = {"router": (None, None), "w1": ("ep", None, "tp"), "b1": ("ep", "tp"), "w2": ("ep", "tp", None),
            "b2": ("ep", None)}
    mesh = spmdsim.Mesh(spmdsim.Layout((1, 2, 1), ("dp", "ep", "tp")), spmdsim.world())
    L = mesh.layout
    params = {n: DTensor.from_global(mesh, v, L(*maps[n.split(".")[-1]])).requires_grad_() for n, v in p.items()}
    tokens = L(None, ("dp", "ep"), None)
    gd = DTensor.from_global(mesh, g, tokens)

    def step(xd):
        for t in params.values():
            t.grad = None
        y, losses = moe_layer(xd, params, "h1.", moe)
        ops.resolved(ops.sum(y * gd) + losses).backward()
        return y

    def eager(x):
        y = step(DTensor.from_global(mesh, x, tokens))
        return y.local.copy(), [t.grad.local.copy() for t in params.values()]

    xd = DTensor.from_global(mesh, xs[0], tokens)
    step(xd)  # an eager step first: the collectives' plans kept, as a training loop's
    graph = capture(step, xd, state=params.values())
    exchanges = {collectives.alltoall.__wrapped__.__code__, door.repeat.__code__, getattr(group_alltoallv, "__wrapped__", group_alltoallv).__code__}
    replays = []
    for x in xs[1:]:
        y, frames = _entered(lambda: graph(DTensor.from_global(mesh, x, tokens)))
        replays.append((sorted(c.co_name for c in exchanges & frames), y.local.copy(),
                        [t.grad.local.copy() for t in params.values()]))
    results = []
    for x, (entered, y, grads) in zip(xs[1:], replays):  # (an eager step sets the parameters' .grad anew)
        want_y, want_grads = eager(x)
        same = y.tobytes() == want_y.tobytes() and all(a.tobytes() == b.tobytes() for a, b in zip(grads, want_grads))
        results.append((entered, same, y.tobytes() != replays[0][1].tobytes()))
    mesh.close()
    return results


@pytest.mark.parametrize("dropless", [False, True])
def test_a_replayed_moe_layers_capacity_exchanges_are_bound_and_dropless_ones_run_whole(dropless):
    """Before, each capacity dispatch and combine was one kernel with its Alltoall inside, rerun whole by every
    replay: the collective's checks and door.repeat, four times a layer and step. Dropless, the counts' Alltoall
    (fixed shape) is bound and the rows' Alltoallv, sized by each step's counts, runs whole."""
    for results in spmdsim.simulate(2, lambda: _layer_step(dropless)):
        assert results[1][2]  # the second replay's tokens gave another output
        for entered, same, _ in results:
            assert same, results  # each replay equals the eager layer on its tokens, output and gradients
            assert entered == (["group_alltoallv"] if dropless else []), results
