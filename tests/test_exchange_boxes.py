"""On simulated ranks an Exchange step copies each box once, from the sender's view of its block into its place
in the receiver's new block (runtime.exchange.exchange_boxes, the thread engine's all_to_all_boxes): the result
is numpy's, the trace row is the Alltoallv's an MPI run records, a captured move replays on new values, and a
box that does not fit its place is refused with one line."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.errors import ShapeError
from spmdsim.programs.plan import plan_redistribution
from spmdsim.runtime import executor
from spmdsim.runtime.replay import capture
from spmdsim.runtime.trace import collect_trace

GRID = Layout((2, 4), ("a", "b"))
MOVES = [(GRID("a", "b"), GRID("b", "a")), (GRID(("a", "b"), None), GRID(None, ("b", "a"))),
         (GRID("b", None), GRID(None, "a"))]


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_a_move_on_simulated_ranks_is_numpy_s_and_traced_as_its_alltoallv(dtype):
    a = (np.arange(24 * 40).reshape(24, 40) % 11 - 5).astype(dtype)

    def body():
        mesh = Mesh(GRID)
        rank = mesh.rank
        out = []
        for source, target in MOVES:
            steps = plan_redistribution(source, target, a.shape, dtype).steps
            x = DTensor.from_global(mesh, a, source)
            with collect_trace() as trace:
                y = executor.redistribute(x, target)
            exchanges = [s for s in steps if s.op == "exchange"]
            want_rows = [(s.bytes_sent[rank], s.bytes_received[rank]) for s in exchanges]
            rows = [(e.bytes_sent, e.bytes_received) for e in trace.entries if e.op == "alltoallv"]
            out.append((np.array_equal(y.local, a[target.slices(rank, a.shape)]), y.local.dtype == a.dtype,
                        rows == want_rows, bool(exchanges)))
        return out

    for results in spmdsim.simulate(8, body):
        assert results[:2] == [(True, True, True, True)] * 2, results  # two moves by an Exchange step
        assert results[2][:2] == (True, True), results


def test_a_captured_move_replays_on_new_values():
    source, target = MOVES[0]

    def body():
        mesh = Mesh(GRID)
        rank = mesh.rank
        x = DTensor.from_global(mesh, np.zeros((16, 32)), source)
        graph = capture(lambda t: executor.redistribute(t, target), x)
        got = []
        for k in (1, 2):
            a = np.arange(16 * 32.0).reshape(16, 32) * k
            y = graph(DTensor.from_global(mesh, a, source))
            got.append(np.array_equal(y.local, a[target.slices(rank, a.shape)]))
        return got

    assert spmdsim.simulate(8, body) == [[True, True]] * 8


def test_a_box_that_does_not_fit_its_place_is_refused_in_one_line():
    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        comm, _, me = mesh.group_info(("x",))
        peer = 1 - me
        block, new = np.zeros((2, 3)), np.zeros((2, 3))
        try:
            mesh.engine.all_to_all_boxes(comm, {peer: block[:, :2] if me == 0 else block}, {peer: new},
                                         block.dtype, None)
        except ShapeError as exc:
            return str(exc)
        return None

    messages = spmdsim.simulate(2, body)
    assert messages[0] is None, messages  # rank 0 receives rank 1's whole block
    assert "\n" not in messages[1] and "a box of shape (2, 2)" in messages[1], messages
    assert messages[1].endswith("expected a box of shape (2, 3)"), messages
