"""Mesh axes of size 1 in a redistribution: no step acts on them alone.

Such an axis splits a dim into one piece and pends a sum of one addend, so no
rank's block changes; the planner used to emit a 0-byte Allgather, Alltoall,
Allreduce or exchange on it (a call on a one-rank sub-communicator, a line in
every trace).
"""
from __future__ import annotations

import itertools

import numpy as np

from spmdsim import Layout, TensorLayout
from spmdsim.programs.plan import emulate, partial_addends, plan_redistribution, shards_of, sum_partials

SHAPE = (8, 12)
FULL = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)


def _maps(layout: Layout):
    """Every 2-d tensor map of `layout`, each with and without every choice of its free axes partial."""
    names = layout.alias_name
    out = []
    for where in itertools.product(range(3), repeat=len(names)):
        per_dim = [[a for a, w in zip(names, where) if w == d] for d in range(2)]
        for orders in itertools.product(*(itertools.permutations(p) for p in per_dim)):
            tl = layout(*orders)
            free = tl.replicated_axes
            out += [tl.with_partial(c) for k in range(len(free) + 1) for c in itertools.combinations(free, k)]
    return out


def _unit_free(tl: TensorLayout) -> TensorLayout:
    size = tl.layout.axis_size
    return TensorLayout(tl.layout, tuple(tuple(a for a in axes if size(a) > 1) for axes in tl.tensor_map),
                        tuple(a for a in tl.partial if size(a) > 1))


def _ops(source, target):
    return [(s.op, s.axes) for s in plan_redistribution(source, target, SHAPE, "float32").steps]


def test_the_reported_plans_have_no_step_on_an_axis_of_size_1():
    m = Layout((1, 4), ("a", "b"))
    assert _ops(TensorLayout(m, ((), ("b",)), ("a",)), m(None, "b")) == []
    assert _ops(m("a", "b"), m("b", "a")) == [("alltoall", ("b",))]
    one = Layout((1,), ("x",))
    assert _ops(one("x", None), one(None, "x")) == []
    # On a bigger mesh too: the unit axis vanishes, the rest plans as before.
    m3 = Layout((2, 1, 2), ("p", "u", "q"))
    assert _ops(m3(("p", "u"), "q"), m3("q", ("u", "p"))) == _ops(m3("p", "q"), m3("q", "p"))
    assert _ops(m3(None, None).with_partial(("u", "q")), m3(None, None)) == [("allreduce", ("q",))]


def test_every_pair_on_meshes_with_a_unit_axis_runs_exactly_with_no_unit_step():
    """Every pair of 2-d maps (partial sources and targets too) on (1, 4), (4, 1), and a third of them
    between the two: bit-exact in the emulator, no step on unit axes alone, the bytes of the pair without
    those axes (the lower bound where nothing is pending), no step where only unit axes differ."""
    meshes = [Layout((1, 4), ("a", "b")), Layout((4, 1), ("c", "d"))]
    pairs = [(s, t) for m in meshes for s in _maps(m) for t in _maps(m)]
    pairs += [(s, t) for s in _maps(meshes[0])[::3] for t in _maps(meshes[1])[::3]]
    same = 0
    for source, target in pairs:
        plan = plan_redistribution(source, target, SHAPE, "float64")
        assert all(not s.axes or s.group_size > 1 for s in plan.steps), str(plan)
        bare = plan_redistribution(_unit_free(source), _unit_free(target), SHAPE, "float64")
        assert plan.bytes_received == bare.bytes_received, (str(plan), str(bare))
        if not source.partial and not target.partial:
            assert plan.meets_lower_bound, str(plan)
        if _unit_free(source) == _unit_free(target):  # the layouts differ only on unit axes
            assert plan.steps == (), str(plan)
            same += 1
        out = sum_partials(target, emulate(plan, partial_addends(source, FULL)))
        for r, block in shards_of(target.with_partial(()), FULL).items():
            assert np.array_equal(out[r], block), (str(source), str(target), r)
    assert same > 20 and len(pairs) == 684


def test_a_run_on_a_mesh_with_a_unit_axis_issues_no_one_rank_call():
    import spmdsim
    from spmdsim import DTensor, Mesh, collect_trace
    from spmdsim.runtime.executor import redistribute

    layout = Layout((1, 4), ("a", "b"))
    full = np.arange(64.0).reshape(8, 8)

    def body(source, target):
        mesh = Mesh(layout)
        x = DTensor.from_local(mesh, shards_of(source, full)[mesh.rank], source, (8, 8))
        with collect_trace() as trace:
            y = redistribute(x, target)
        assert np.array_equal(y.local, shards_of(target, full)[mesh.rank])
        return [(e.op, e.group_size) for e in trace.entries]

    assert spmdsim.simulate(4, body, layout("a", "b"), layout("b", "a")) == [[("alltoall", 4)]] * 4
    assert spmdsim.simulate(4, body, layout("a", "b"), layout(None, "b")) == [[]] * 4


def test_the_runtime_s_own_sums_and_gathers_skip_axes_of_size_1_a_user_s_call_on_them_stays():
    """`resolve` (DTensor.resolved_local, losses, gradient buckets) and `gather` leave out axes of size 1 as
    the planner does: no Allreduce or Allgather on a group of one in the trace. A collective the program
    calls itself on a group of one is a call of the program (MPI makes it too): numbered and traced with
    group_size 1 and 0 bytes, left out of counts() and totals(). The dtype is checked either way."""
    import spmdsim
    from spmdsim import DTensor, DTypeError, Mesh, collect_trace
    from spmdsim.runtime.collectives import allreduce
    from spmdsim.runtime.executor import gather, pending, resolve

    layout = Layout((1, 4), ("a", "b"))

    def body():
        mesh = Mesh(layout)
        x = DTensor.from_local(mesh, np.full((8, 2), mesh.rank + 1.0), layout(None, "b").with_partial(("a",)),
                               (8, 8))
        both = pending(layout, 1, ("a", "b"))
        with collect_trace() as trace:
            alone = x.resolved_local()
            summed = resolve(mesh, np.full(3, mesh.rank + 1.0), both, "sum")
            rows = gather(mesh, np.full(2, float(mesh.rank)), ("a", "b"), "gather")
            mine = allreduce(mesh, np.ones(3), ("a",), label="mine")
        try:
            resolve(mesh, np.ones(3, bool), pending(layout, 1, ("a",)), None)
            refused = None
        except DTypeError as e:
            refused = str(e)
        assert alone is x.local and mine.tolist() == [1.0] * 3
        assert summed.tolist() == [10.0] * 3 and rows.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
        return ([(e.op, e.axes, e.group_size, e.bytes_received, e.label) for e in trace.entries],
                trace.counts(), trace.counts(include_local=True), trace.totals()["calls"], refused)

    entries, counts, local, calls, refused = spmdsim.simulate(4, body)[0]
    assert [e[:3] for e in entries] == [("allreduce", ("b",), 4), ("allgather", ("b",), 4),
                                        ("allreduce", ("a",), 1)]
    assert entries[2][3:] == (0, "mine")
    assert counts == {"allreduce": 1, "allgather": 1} and local == {"allreduce": 2, "allgather": 1} and calls == 2
    assert refused.startswith("allreduce: cannot sum dtype 'bool'")
