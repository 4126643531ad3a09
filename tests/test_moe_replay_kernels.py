"""A replayed MoE layer's kernels (spmdsim.models.moe.layer) run numpy, not the Python that worked out its shapes.

What depends only on the layer's shapes is worked out once (`_tables`: the flat indices its gathers and scatters
use, the send buffer's rows of each slot; `_facts`: its MoEStats' fixed numbers; the slots' reorderings bound
once a graph); what depends on the routing runs each step as a few whole-array numpy calls. The values are
spmdsim.models.moe.routing's (route, dispatch_rows, gates_backward) and the eager layer's, bit for bit."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import spmdsim
from spmdsim.nn import ops
from spmdsim.models.moe import MoEConfig
from spmdsim.models.moe import exchange as moe_exchange, experts as moe_experts, slots as moe_slots
from spmdsim.models.moe import stats as moe_stats
from spmdsim.models.moe.layer import moe_layer
from spmdsim.models.moe.routing import Routing, dispatch_rows, gates_backward, route
from spmdsim.runtime.collectives import KERNELS
from spmdsim.runtime import executor
from spmdsim.runtime.dtensor import DTensor
from spmdsim.runtime.replay import capture

from moekit import layer_inputs


def _probs(rng, T, bl, E, dtype):
    """(T, bl, E) probabilities with ties: a few levels only, so that sorts and slots meet equal values."""
    p = rng.integers(0, 4, size=(T, bl, E)).astype(dtype) + np.asarray(0.5, dtype)
    return (p / p.sum(axis=-1, keepdims=True)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k,dropless,ep,factor", [(1, False, 1, 1.0), (2, False, 2, 1.0), (2, False, 1, 0.5),
                                                  (2, True, 2, 1.0), (1, True, 1, 1.0), (2, False, 4, 2.0)])
def test_the_layers_routing_kernel_is_route_and_dispatch_rows(dtype, k, dropless, ep, factor):
    """`_route` (one cumulative sum over the choices, flat gathers) gives routing.route's and dispatch_rows'
    arrays, dtypes and bits, ties and drops included, into new arrays or a replay's; `_probs_grad` gives
    gates_backward's."""
    rng = np.random.default_rng(7)
    T, bl, E = 6, 3, 4
    C = MoEConfig(experts=E, top_k=k, capacity_factor=factor, dropless=dropless).capacity(T)
    probs = _probs(rng, T, bl, E, dtype)
    want = route(np.ascontiguousarray(probs.transpose(1, 0, 2)), k, C)
    rows, _, per_expert = dispatch_rows(want, dropless, ep)
    tab = moe_slots._tables(T, bl, E, k, C, ep)
    got = moe_slots._route(probs, tab, dropless)
    expected = (want.experts, want.gates, want.slots, want.counts, rows, per_expert,
                want.counts.sum(axis=0).astype(np.float64))
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if factor < 1:
        assert np.count_nonzero(want.slots < 0)  # (the drops compared too)
    again = tuple(np.full_like(a, -7) for a in got)  # a replay's: written into the captured arrays
    moe_slots._route(probs, tab, dropless, out=again)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(again, got))

    dgates = rng.standard_normal(want.gates.shape).astype(dtype)
    grad = gates_backward(probs.transpose(1, 0, 2), want, dgates).transpose(1, 0, 2)
    mine = moe_slots._probs_grad(probs, want.experts, want.gates, tab, dgates)
    assert mine.dtype == grad.dtype and mine.tobytes() == np.ascontiguousarray(grad).tobytes()
    into = np.full_like(mine, 3.0)
    moe_slots._probs_grad(probs, want.experts, want.gates, tab, dgates, out=into)
    assert into.tobytes() == mine.tobytes()


def test_the_layers_stats_kernel_is_stats():
    """`_note` (the replayed figures) gives the MoEStats `_stats` gives (the dry run's way), capacity and
    dropless."""
    def body():
        mesh = spmdsim.Mesh(spmdsim.Layout((1, 2, 1), ("dp", "ep", "tp")), spmdsim.world())
        rng = np.random.default_rng(5 + mesh.rank)
        out = []
        for dropless in (False, True):
            moe = MoEConfig(experts=4, top_k=2, capacity_factor=0.5, dropless=dropless)
            T, bl, E, ep = 6, 2, 4, 2
            plan = moe_exchange._plan(mesh, moe, T, bl, E // ep, "h1")
            tab = moe_slots._tables(T, bl, E, 2, plan.capacity, ep)
            experts, gates, slots, counts, rows, per_expert, _ = moe_slots._route(_probs(rng, T, bl, E, np.float64),
                                                                                  tab,
                                                                              dropless)
            got = KERNELS.alltoall(mesh, per_expert, "ep", 0, 0, "counts") if dropless else None
            put: list = [None]
            moe_slots._note(put.__setitem__, 0, moe_slots._facts(plan, tab, 8 * 16), experts, slots,
                            rows, per_expert, got)
            move = plan.exchange(per_expert, got)
            want = moe_stats._stats(mesh, "h1", Routing(experts, gates, slots, counts, plan.capacity), move,
                                rows[rows >= 0], 8 * 16)
            out.append((put[0] == want, put[0].chosen.tobytes() == want.chosen.tobytes(), want.dropped))
        mesh.close()
        return out

    for results in spmdsim.simulate(2, body):
        assert all(same and chosen for same, chosen, _ in results), results
        assert results[0][2] > 0  # (the capacity dropped some: their figures compared too)


@pytest.mark.parametrize("ep,El", [(1, 3), (2, 2), (3, 1), (4, 3)])
def test_a_dropless_exchange_puts_what_arrived_by_expert_then_source(ep, El):
    """_Exchange (dropless): the rows each member sends and receives, and the order that takes what arrived (by
    source, then local expert) to the experts' (by expert, then source), as one loop over them would make it;
    with members that send an expert nothing."""
    rng = np.random.default_rng(ep * 10 + El)
    for _ in range(5):
        got = rng.integers(0, 4, size=(ep, El)) * (rng.random((ep, El)) > 0.3)
        mine = rng.integers(0, 4, size=ep * El)
        starts = np.cumsum(got.reshape(-1)) - got.reshape(-1)
        order = [i for e in range(El) for s in range(ep)
                 for i in range(starts[s * El + e], starts[s * El + e] + got[s, e])]
        sizes = got.sum(axis=0)
        ranges = [(int(sizes[:e].sum()), int(sizes[:e + 1].sum())) for e in range(El)]
        made = _dropless_exchange(ep, El, mine, got)
        assert made.order.dtype == np.int64 and made.order.tolist() == order
        assert made.ranges == ranges and made.arrived == int(got.sum())
        assert made.send_rows == [int(mine[j * El:(j + 1) * El].sum()) for j in range(ep)]
        assert made.recv_rows == [int(n) for n in got.sum(axis=1)]
        assert all(type(n) is int for n in made.send_rows + made.recv_rows + [v for r in made.ranges for v in r])


class _Mesh:
    """What _Exchange reads of a mesh: its ep (no collective runs: the counts are given)."""

    def __init__(self, ep):
        self.layout = spmdsim.Layout((1, ep, 1), ("dp", "ep", "tp"))


def _dropless_exchange(ep, El, per_expert, got):
    moe = MoEConfig(experts=ep * El, top_k=1, dropless=True)
    return moe_exchange._Exchange(_Mesh(ep), moe, 1, 1, El, np.asarray(per_expert, np.int64), "d", "c",
                           np.asarray(got, np.int64).reshape(-1))


def _frames(call):
    """(call's result, {(code, its caller's code)} of the frames it entered)."""
    pairs: set = set()

    def tracer(frame, event, arg):
        if event == "call":
            pairs.add((frame.f_code, frame.f_back.f_code if frame.f_back is not None else None))
        return None

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return result, pairs


#: Python a replayed layer ran before: its kernels' numpy along-axis helpers and broadcast_to, a Routing's,
#: the stats' group look-up, the slots' reorderings; the router softmax's np.max and np.sum (their wrappers);
#: dropless, np.array_equal of the counts each time a kernel asked for the step's exchange.
_GONE = {"take_along_axis", "put_along_axis", "_make_along_axis_idx", "broadcast_to", "_token_rows", "_stats",
         "group_ranks", "by_expert", "by_source", "_by_expert", "_by_source", "route", "_placed", "dispatch_rows",
         "gates_backward", "_wrapreduction", "array_equal"}

T, B, D, E = 4, 2, 8, 4


def _layer_step(dropless):
    mesh, params, xs, gd, tokens, moe = layer_inputs((1, 2, 2), T, B, D, E, 0.75, dropless)

    def step(xd, stats):
        for t in params.values():
            t.grad = None
        y, losses = moe_layer(xd, params, "h1.", moe, stats)
        ops.resolved(ops.einsum("tbd,tbd->", y, gd) + losses).backward()  # (no np.sum: see _GONE)
        return y

    def eager(x):
        stats: list = []
        y = step(DTensor.from_global(mesh, x, tokens), stats)
        return y.local.copy(), [t.grad.local.copy() for t in params.values()], stats[0]

    xd = DTensor.from_global(mesh, xs[0], tokens)
    step(xd, [])  # an eager step first: the collectives' plans kept, as a training loop's
    held: list = []  # the captured step's list: each replay writes its figures there
    graph = capture(step, xd, held, state=params.values())
    fc2 = executor.run_block.__code__  # (the executor's runner of the experts' sum, EXPERTS_SUM)
    kernels = {f.__code__ for f in (moe_experts._run_experts, moe_experts._experts_grad)}
    replays = []
    for x in xs[1:]:
        y, pairs = _frames(lambda: graph(DTensor.from_global(mesh, x, tokens), held))
        gone = sorted({c.co_name for c, _ in pairs if c.co_name in _GONE})
        summed_inside = any(c is fc2 and caller in kernels for c, caller in pairs)
        replays.append((gone, summed_inside, y.local.copy(), [t.grad.local.copy() for t in params.values()],
                        held[0]))
    results = []
    for x, (gone, summed_inside, y, grads, stats) in zip(xs[1:], replays):
        want_y, want_grads, want_stats = eager(x)
        same = y.tobytes() == want_y.tobytes() and all(a.tobytes() == b.tobytes() for a, b in zip(grads, want_grads))
        same_stats = stats == want_stats and stats.chosen.tobytes() == want_stats.chosen.tobytes()
        results.append((gone, summed_inside, same, same_stats, y.tobytes() != replays[0][2].tobytes(),
                        want_stats.dropped))
    mesh.close()
    return results


@pytest.mark.parametrize("dropless", [False, True])
def test_a_replayed_moe_layer_runs_no_shape_python_and_equals_the_eager_layer(dropless):
    """Before, each replay ran numpy's take_along_axis and put_along_axis (routing, gates' backward), a
    broadcast_to per pack, unpack and combine backward, the stats' group look-up and a Routing's properties,
    each slot reordering's reshapes, and np.max's and np.sum's Python wrappers in the router's softmax and its
    gradient (spmdsim.references.forward.softmax and reference_grad.softmax_grad now call their reductions); with a
    capacity on tp 2, fc2's Allreduce inside the experts' kernel (the collective's checks each replay). Now none of
    them: the Allreduce is its own recorded call, bound to its kept plan (dropless, it sums the rows that arrived, a
    count each step's: inside the kernel still)."""
    for results in spmdsim.simulate(4, lambda: _layer_step(dropless)):
        assert results[1][4]  # the second replay's tokens gave another output
        for gone, summed_inside, same, same_stats, _, dropped in results:
            assert same and same_stats, results  # output, gradients and figures: the eager layer's on its tokens
            assert gone == [] and summed_inside == dropless, results  # (dropless: over the rows that arrived)
        assert dropless or any(r[5] for r in results)  # (a capacity of 0.75 drops some assignments)
