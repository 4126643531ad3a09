"""Redistribution under MPI: representative plans of every step kind, checked bit-exactly.

Runs at 8 and at 4 ranks; each case list is built for the world size. Values
are integers stored as float64 so partial sums are exact in any order.
"""
from __future__ import annotations

import numpy as np
import engines
import pytest

from spmdsim import Layout, SeededTensor
from spmdsim.programs.plan import plan_redistribution

pytestmark = pytest.mark.mpi(min_size=2)

SHAPE = (16, 24)


def _world():
    return engines.world()  # MPI.COMM_WORLD, or the simulated rank's (tests/engines.py)


def _cases(size: int):
    if size == 8:
        x = Layout((8,), ("x",))
        m = Layout((2, 4), ("dp", "mp"))
        c = Layout((2, 2, 2), ("a", "b", "c"))
        t = Layout((4, 2), ("p", "q"))
        return [
            (x("x", None), x(None, "x"), "alltoall"),
            (m("mp", None), m(None, None), "allgather"),
            (m("dp", None), m(None, "mp"), "local_slice"),
            (m(("dp", "mp"), None), m(("mp", "dp"), None), "exchange"),
            (m(None, None, partial=("mp",)), m(None, "mp"), "reduce_scatter"),
            (m("dp", None, partial=("mp",)), m("dp", None), "allreduce"),
            (m(None, "mp"), m(None, "mp", partial=("dp",)), "local_zero"),
            (m("dp", None), m(None, None, partial=("dp",)), "local_zero"),
            (c("a", ("b", "c")), x(None, "x"), None),
            (c(None, None, partial=("a", "b")), x("x", None), "reduce_scatter"),
            (m("dp", "mp"), t("q", "p"), "exchange"),
        ]
    if size == 4:
        s = Layout((2, 2), ("a", "b"))
        f = Layout((4,), ("x",))
        return [
            (f("x", None), f(None, "x"), "alltoall"),
            (s("a", None), s(None, None), "allgather"),
            (s(None, None), s(None, ("b", "a")), "local_slice"),
            (s(("a", "b"), None), s(("b", "a"), None), "exchange"),
            (s(None, None, partial=("b",)), s("b", None), "reduce_scatter"),
            (s("a", None, partial=("b",)), s("a", None), "allreduce"),
            (s(None, None), s(None, None, partial=("a",)), "local_zero"),
            (s("a", "b"), f(None, "x"), None),
            (s(None, None, partial=("a",)), f("x", None), "reduce_scatter"),
        ]
    return []


def _value(region):
    return SeededTensor(SHAPE, "int64", seed=7, low=-50, high=50).region(region).astype(np.float64)


def _source(mesh, layout):
    """This rank's block: integer addends over the partial axes that sum to the value."""
    from spmdsim.runtime import DTensor

    region = layout.slices(mesh.rank, SHAPE)
    if not layout.partial:
        return DTensor(mesh, _value(region), layout, SHAPE)
    k = layout.layout.group_index(mesh.rank, layout.partial)
    g = layout.layout.group_size(layout.partial)
    addends = [SeededTensor(SHAPE, "int64", seed=100 + j, low=-8, high=8).region(region)
               .astype(np.float64) for j in range(1, g)]
    local = addends[k - 1] if k else _value(region) - sum(addends)
    return DTensor(mesh, local, layout, SHAPE)


def _case_ids(size):
    return [f"{s}->{t}" for s, t, _ in _cases(size)]


@pytest.mark.parametrize("index", range(11))
def test_redistribute_matches_the_generator_bit_exactly(index):
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import Mesh, collect_trace

    comm = _world()
    cases = _cases(comm.size)
    if index >= len(cases):
        pytest.skip(f"no case {index} at {comm.size} ranks")
    source, target, kind = cases[index]
    plan = plan_redistribution(source, target, SHAPE, "float64")
    if kind is not None:
        assert kind in [s.op for s in plan.steps], str(plan)
    mesh = Mesh(source.layout, comm)
    x = _source(mesh, source)
    with collect_trace() as trace:
        y = redistribute(x, target)
    assert y.layout == target and y.mesh.layout == target.layout
    value = y.local
    if target.partial:
        from spmdsim.runtime import allreduce

        value = allreduce(y.mesh, y.local, target.partial)
    ok = np.array_equal(value, _value(target.slices(comm.rank, SHAPE)))
    # Every communicating step is traced with its label, and the bytes match the plan.
    labels = [e.label for e in trace.entries]
    assert all(label and label.startswith("redistribute[") for label in labels)
    moved = sum(e.bytes_received for e in trace.entries)
    ok = ok and moved == plan.bytes_received[comm.rank]
    assert all(comm.allgather(bool(ok))), str(plan)
    # The cost model's packing bytes per step are what the busiest rank really copied.
    from mpi4py import MPI

    from spmdsim.programs.cost import predict_plan

    step_of = lambda e: int(e.label.split("]")[0].split("[")[1])  # noqa: E731
    copied = {step_of(e): e.bytes_copied for e in trace.entries}
    peers = {step_of(e): e.peers for e in trace.entries if e.op == "alltoallv"}
    for index, pred in enumerate(predict_plan(plan), 1):
        busiest = comm.allreduce(copied.get(index, 0), op=MPI.MAX)
        # where ranks share memory an Exchange's boxes are copied once as they move: nothing packed
        boxes = pred.op == "alltoallv" and mesh.engine.moves_boxes
        assert busiest == (0 if boxes else pred.bytes_copied), (index, str(plan))
        # An Exchange is priced with the peers the busiest rank really had.
        if pred.op == "alltoallv":
            assert comm.allreduce(peers.get(index, 0), op=MPI.MAX) + 1 == pred.group_size, (index, str(plan))


def test_plan_labels_name_the_step():
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import Mesh, collect_trace

    comm = _world()
    x8 = Layout((comm.size,), ("x",))
    mesh = Mesh(x8, comm)
    x = _source(mesh, x8("x", None))
    with collect_trace() as trace:
        y = redistribute(x, x8(None, "x"))
    entries = [e for e in trace.entries if e.op == "alltoall"]
    assert [e.label for e in entries] == ["redistribute[1] S(0)->S(1) via Alltoall on ('x',)"]
    assert np.array_equal(y.local, _value(y.layout.slices(comm.rank, SHAPE)))


def test_cli_run_redistribute(capsys):
    from spmdsim.tools.cli.main import main

    comm = _world()
    code = main(["run", "redistribute", "--device-matrix", str(comm.size), "--alias", "x",
                 "--from", "x,None", "--to", "None,x", "--shape", "16,16", "--dtype", "float64"])
    out = engines.rank_output(capsys)
    assert code == 0
    if comm.rank == 0:
        assert "S(0)->S(1) via Alltoall on ('x',)" in out and "PASS" in out


def _exchanges(size: int):
    """(source, target) pairs run as one folded exchange: boxes held once, and with replicas."""
    if size == 8:
        m, c = Layout((2, 4), ("dp", "mp")), Layout((2, 2, 2), ("a", "b", "c"))
        return [(m(("dp", "mp"), None), m(("mp", "dp"), None)), (m("dp", None), m(None, ("mp", "dp"))),
                (c("a", None), c(("c", "b"), "a")), (c(None, "b"), c("c", None))]
    if size == 4:
        s = Layout((2, 2), ("a", "b"))
        return [(s(("a", "b"), None), s(("b", "a"), None)), (s("a", None), s(None, ("b", "a"))),
                (s(None, "b"), s("a", None))]
    return []


@pytest.mark.parametrize("index", range(4))
def test_a_folded_exchange_runs_under_mpi_bit_exactly(index):
    """Each rank works out its own boxes of a folded exchange (spmdsim.programs.plan.folded); the data, the
    bytes each rank receives and the packing the cost model predicts are what the run does."""
    from mpi4py import MPI

    from spmdsim.programs.cost import predict_plan
    from spmdsim.programs.plan import Plan, lower_bound
    from spmdsim.programs.plan.folded import FoldedTransfers, folded_exchange
    from spmdsim.runtime import Mesh, collect_trace
    from spmdsim.runtime.executor import redistribute

    comm = _world()
    pairs = _exchanges(comm.size)
    if index >= len(pairs):
        pytest.skip(f"no exchange {index} at {comm.size} ranks")
    source, target = pairs[index]
    step = folded_exchange(source, target, SHAPE, 8)
    assert isinstance(step.transfers, FoldedTransfers)
    plan = Plan(source, target, SHAPE, "float64", (step,), lower_bound(source, target, SHAPE, 8))
    x = _source(Mesh(source.layout, comm), source)
    with collect_trace() as trace:
        y = redistribute(x, target, plan)
    ok = np.array_equal(y.local, _value(target.slices(comm.rank, SHAPE)))
    ok = ok and sum(e.bytes_received for e in trace.entries) == step.bytes_received[comm.rank]
    ok = ok and sum(e.bytes_sent for e in trace.entries) == step.bytes_sent[comm.rank]
    assert all(comm.allgather(bool(ok))), str(plan)
    copied = max((e.bytes_copied for e in trace.entries), default=0)
    # where ranks share memory the boxes are copied once as they move: nothing packed
    packed = 0 if x.mesh.engine.moves_boxes else predict_plan(plan)[0].bytes_copied
    assert comm.allreduce(copied, op=MPI.MAX) == packed
