"""A replayed MoE layer's exchanges (spmdsim.models.moe.layer, spmdsim.runtime.replay): with a capacity each dispatch
and combine Alltoall is its own recorded call, bound to its mesh's kept plan (the engine's transfer alone: no
collective's checks, no door.repeat on replay); dropless, the Alltoallv whose counts change each step runs whole.
Either way a replay equals the eager layer on the same tokens bit for bit."""
from __future__ import annotations

import contextlib
import sys

import pytest

import spmdsim
from spmdsim.nn import ops
from spmdsim.base.flops import counting
from spmdsim.models.moe.layer import moe_layer
from spmdsim.runtime import collectives, door
from spmdsim.runtime.exchange import group_alltoallv
from spmdsim.runtime.dtensor import DTensor
from spmdsim.runtime.replay import capture

from moekit import layer_inputs

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


def _layer_step(dropless, counted=None):
    """Each replay's (exchanges entered, equal to the eager layer, another output than the first replay's); with
    `counted` (True: captured under a FLOP counter, False: without), (those, the record's length, whether the
    counter's products and kernels are the eager step's)."""
    mesh, params, xs, gd, tokens, moe = layer_inputs((1, 2, 1), T, B, D, E, 1.0, dropless)

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
    with counting() as eager_count:
        step(xd)  # an eager step first: the collectives' plans kept, as a training loop's
    with counting() if counted else contextlib.nullcontext() as captured_count:  # a FLOP counter open, or none
        graph = capture(step, xd, state=params.values())
    counts = (eager_count.counts, eager_count.kernels) == (captured_count.counts, captured_count.kernels) \
        if counted else None
    exchanges = {getattr(collectives.alltoall, "__wrapped__", collectives.alltoall).__code__, door.repeat.__code__,
                 getattr(group_alltoallv, "__wrapped__", group_alltoallv).__code__}
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
    return results if counted is None else (results, graph.operations, counts)


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


@pytest.mark.parametrize("dropless", [False, True])
def test_a_moe_step_captured_under_a_flop_counter_records_what_the_uncounted_capture_does(dropless):
    """The layer counts its products (spmdsim.base.flops) outside its kernels, with its plan's _Exchange: dropless,
    `_Plan.exchange` compared the step's counts there, traced arrays while capturing, so a capture under an open
    counter recorded four np.array_equal guards more than one without (73 operations against 69 at ep 2), and
    every replay whose tokens routed otherwise stopped: "np.array_equal read True from an array while capturing
    and False now". The count takes the exchange the step's kernels made (`_Plan.made`): the same record, the
    replays equal to the eager layer, and the products and kernels counted as the eager step's."""
    plain = spmdsim.simulate(2, lambda: _layer_step(dropless, False))
    counted = spmdsim.simulate(2, lambda: _layer_step(dropless, True))
    for (results, operations, _), (counted_results, counted_operations, same_counts) in zip(plain, counted):
        assert counted_operations == operations
        assert counted_results == results and all(same for _, same, _ in results) and results[1][2]
        assert same_counts
