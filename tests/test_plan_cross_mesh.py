"""Moves between device matrices with no common refinement ((2, 3) and (3, 2)) that move nothing.

Such meshes are planned with one Alltoallv exchange of boxes (after summing on the source mesh).
The planner used to emit it even where every rank already held its new block, pending the same sum:
a step of 0 bytes, and on every rank a call of an Alltoallv of empty counts in the trace. Where each
rank's new block lies inside its old one, the exchange is a local copy: it stays a step (the copy),
but the executor makes no call for it.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout, TensorLayout
from spmdsim.programs.plan import Exchange, emulate, partial_addends, plan_redistribution, shards_of, sum_partials
from spmdsim.programs.plan.meshes import common_refinement, translate
from spmdsim.programs.plan.volume import rank_boxes

A = Layout((2, 3), ("a", "b"))
C = Layout((3, 2), ("c", "d"))
SHAPE = (12, 6)
FULL = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)


def _exact(plan, source, target):
    out = sum_partials(target, emulate(plan, partial_addends(source, FULL)))
    return all(np.array_equal(out[r], block) for r, block in shards_of(target.with_partial(()), FULL).items())


def _ops(plan):
    return [(s.op, s.axes) for s in plan.steps]


def test_the_same_blocks_on_meshes_without_a_common_refinement_is_no_step():
    assert common_refinement(A, C) is None
    for source, target in [(A(("a", "b"), None), C(("c", "d"), None)),  # rank r holds rows 2r:2r+2 on both
                           (A(None, None), C(None, None)),
                           (A(None, None).with_partial(("a", "b")), C(None, None).with_partial(("c", "d"))),
                           (A(None, ("a", "b")).with_partial(()), C(None, ("c", "d")))]:
        plan = plan_redistribution(source, target, SHAPE, "float64")
        assert plan.steps == (), str(plan)
        assert plan.bytes_received == plan.bytes_sent == plan.lower_bound == (0,) * 6
        assert _exact(plan, source, target)


def test_a_sum_resolved_and_pended_again_across_meshes_exchanges_nothing():
    source, target = A(None, None).with_partial(("a",)), C(None, None).with_partial(("c",))
    plan = plan_redistribution(source, target, SHAPE, "float64")
    assert _ops(plan) == [("allreduce", ("a",)), ("local_zero", ("c",))]
    assert plan.meets_lower_bound is False and plan.max_bytes_received == 12 * 6 * 8
    assert _exact(plan, source, target)


def test_an_exchange_that_only_keeps_part_of_each_block_says_so():
    source, target = A("a", None), C(("c", "d"), None)  # row blocks of 6 cut into blocks of 2 on each rank
    plan = plan_redistribution(source, target, SHAPE, "float64")
    assert [type(s) for s in plan.steps] == [Exchange] and plan.bytes_received == (0,) * 6
    assert str(plan.steps[0]).endswith("via local copy (nothing to exchange)")
    assert _exact(plan, source, target)


def test_between_the_two_meshes_no_plan_exchanges_nothing_and_every_plan_is_exact():
    """A sample of pairs of 2-d maps (partial too) from (2, 3) to (3, 2): no exchange between the same boxes,
    no step at all where the blocks and sums are the same, exact in the emulator; without pending sums at
    the lower bound."""
    def maps(layout):
        out = []
        for where in itertools.product(range(3), repeat=2):
            per_dim = [[x for x, w in zip(layout.alias_name, where) if w == d] for d in range(2)]
            for orders in itertools.product(*(itertools.permutations(p) for p in per_dim)):
                tl = layout(*orders)
                out += [tl.with_partial(p) for k in range(len(tl.replicated_axes) + 1)
                        for p in itertools.combinations(tl.replicated_axes, k)]
        return out

    none = 0
    for source, target in itertools.product(maps(A)[::2], maps(C)[::2]):
        plan = plan_redistribution(source, target, SHAPE, "float64")
        for step in plan.steps:
            assert not (isinstance(step, Exchange) and
                        rank_boxes(step.before, SHAPE) == rank_boxes(step.after, SHAPE)), str(plan)
        if plan.steps == ():
            none += 1
        if not source.partial and not target.partial:
            assert plan.meets_lower_bound, str(plan)
        assert _exact(plan, source, target), str(plan)
    assert none >= 3


def test_a_run_between_the_meshes_makes_no_call_that_moves_nothing():
    from spmdsim import DTensor, Mesh, collect_trace
    from spmdsim.runtime.executor import redistribute

    def body(source: TensorLayout, target: TensorLayout):
        mesh = Mesh(source.layout)
        x = DTensor.from_local(mesh, partial_addends(source, FULL)[mesh.rank], source, SHAPE)
        with collect_trace() as trace:
            y = redistribute(x, target)
        return y.local, [(e.op, e.bytes_received) for e in trace.entries]

    for source, target, ops in [(A(("a", "b"), None), C(("c", "d"), None), []),
                                (A("a", None), C(("c", "d"), None), []),
                                (A(None, None).with_partial(("a", "b")), C(None, None).with_partial(("c", "d")), []),
                                (A(None, None).with_partial(("a",)), C(None, "c"), [("allreduce", 12 * 6 * 8)])]:
        runs = spmdsim.simulate(6, body, source, target)
        assert [trace for _, trace in runs] == [ops] * 6
        want = emulate(plan_redistribution(source, target, SHAPE, "float64"), partial_addends(source, FULL))
        for r, (local, _) in enumerate(runs):
            assert local.tobytes() == want[r].tobytes(), (str(source), str(target), r)


@pytest.mark.usefixtures("empty_tables")  # (a table at its limit would start over between the calls)
def test_a_layout_written_on_the_refined_mesh_is_one_object_per_layout():
    """spmdsim.programs.plan.meshes.translate gives the planners' shared layout (candidates.laid_out) each time."""
    mesh, first, _ = common_refinement(Layout((2, 4), ("x", "y")), Layout((4, 2), ("u", "v")))
    source = Layout((2, 4), ("x", "y"))(("x",), ("y",)).with_partial(())
    out = translate(source, mesh, first)
    assert out is translate(source, mesh, first)
    assert out == TensorLayout(mesh, (first["x"], first["y"]))
