"""Prepared (persistent) collectives give the same results as the per-call ones."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from spmdsim import Layout, ShapeError
from spmdsim.runtime import Mesh, collect_trace
from spmdsim.runtime import collectives as C
from spmdsim.runtime import prepared as P

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(params=["busy", "polite"])
def mesh(request):
    world = MPI.COMM_WORLD
    m = Mesh(Layout((2, world.size // 2), ("dp", "mp")), wait=request.param)
    yield m
    m.close()


def _local(mesh, shape, step):
    return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
            + 100 * mesh.rank + step)


@pytest.mark.parametrize("axes", [("mp",), ("dp",), ("dp", "mp"), ("mp", "dp")])
def test_prepared_matches_per_call_collectives_over_several_runs(mesh, axes):
    g = mesh.layout.group_size(axes)
    buf = np.empty((4 * g, 3))
    calls = [
        (P.prepare_allreduce(mesh, buf, axes), lambda: C.allreduce(mesh, buf, axes)),
        (P.prepare_allgather(mesh, buf, axes, 0), lambda: C.allgather(mesh, buf, axes, 0)),
        (P.prepare_reduce_scatter(mesh, buf, axes, 0), lambda: C.reduce_scatter(mesh, buf, axes, 0)),
        (P.prepare_alltoall(mesh, buf, axes, 0), lambda: C.alltoall(mesh, buf, axes, 0, 0)),
    ]
    for step in range(3):
        buf[...] = _local(mesh, buf.shape, step)  # refilled in place between runs
        for prepared, per_call in calls:
            np.testing.assert_array_equal(prepared.run(), per_call())
    for prepared, _ in calls:
        prepared.free()


def test_in_place_allreduce_and_trace(mesh):
    grads = np.ones(10) * (mesh.rank + 1)
    with collect_trace() as trace, P.prepare_allreduce(mesh, grads, ("dp", "mp"), out=grads) as step:
        result = step.run()
    assert result is grads
    np.testing.assert_array_equal(grads, np.full(10, sum(range(1, mesh.size + 1)), float))
    (entry,) = trace.entries
    assert (entry.op, entry.axes, entry.group_size) == ("allreduce", ("dp", "mp"), mesh.size)
    assert entry.bytes_sent == 2 * (mesh.size - 1) * grads.nbytes // mesh.size


def test_prepared_collectives_keep_mpis_call_on_a_mesh_that_emulates_algorithms():
    # A mesh's algorithms= applies to the per-call collectives (docs/explanation/algorithms.md): a prepared
    # call binds MPI's persistent request and stays on it, traced under MPI's name.
    world = MPI.COMM_WORLD
    mesh = Mesh(Layout((world.size,), ("x",)), algorithms={"allreduce": "ring"})
    x = np.arange(4 * world.size, dtype=np.float64) + world.rank
    expected = world.size * np.arange(4 * world.size) + sum(range(world.size))
    with collect_trace() as trace, P.prepare_allreduce(mesh, x, "x") as step:
        np.testing.assert_array_equal(step.run(), expected)
        np.testing.assert_array_equal(C.allreduce(mesh, x, "x"), expected)
    assert [e.op for e in trace.entries] == ["allreduce", "allreduce[ring]"]
    mesh.close()


def test_group_of_one_rank_returns_the_input_without_communicating():
    world = MPI.COMM_WORLD
    mesh = Mesh(Layout((world.size, 1), ("dp", "one")))
    x = np.arange(6.0) + world.rank
    out = np.empty(6)
    with collect_trace() as trace:
        result = P.prepare_allreduce(mesh, x, ("one",), out=out).run()
    np.testing.assert_array_equal(result, x)
    assert trace.entries[0].bytes_sent == 0
    mesh.close()


def test_blocks_that_would_need_packing_are_rejected_before_communicating(mesh):
    x = np.zeros((3, 2 * mesh.size))
    with pytest.raises(ShapeError, match="prepared alltoall needs tensor dim 1 of local shape"):
        P.prepare_alltoall(mesh, x, ("dp", "mp"), 1)
    with pytest.raises(ShapeError, match="out"):
        P.prepare_allreduce(mesh, np.zeros(4), ("mp",), out=np.zeros(5))


def test_a_captured_point_to_point_group_is_bound_once_and_replayed_by_startall(mesh, monkeypatch):
    """A step that sends a ring's messages through the door, captured (spmdsim.runtime.replay): the capture
    binds the group's messages to their buffers (persistent requests, receives first), each replay starts
    them again without posting (no Irecv/Isend), the values of each replay arrive, one trace row a replay
    with the bytes each way, and dropping the graph frees the requests."""
    import gc

    from spmdsim.runtime.engines.mpi import MpiEngine
    from spmdsim.runtime.door import point_to_point
    from spmdsim.runtime.replay import Scalar, capture, kernel

    g, me = mesh.size, mesh.rank
    comm = mesh.group(("dp", "mp"))
    left, right = (me - 1) % g, (me + 1) % g
    got, mine = np.empty(3), np.zeros(3)
    bound, posted = [], []
    bind, post = MpiEngine.bind, MpiEngine.post
    monkeypatch.setattr(MpiEngine, "bind", lambda self, *a: bound.append(bind(self, *a)) or bound[-1])
    monkeypatch.setattr(MpiEngine, "post", lambda self, *a: posted.append(1) or post(self, *a))

    @kernel
    def fill(step, out):
        out[...] = 10.0 * int(step) + me

    def step(k):
        fill(k, mine)
        point_to_point(mesh, comm, ("dp", "mp"), [(got, left, 9)], [(mine, right, 9)], "ring")

    with collect_trace() as trace:
        graph = capture(step, Scalar(0))
        assert np.array_equal(got, np.full(3, float(left)))
        for k in (1, 2, 3):
            graph(Scalar(k))
            assert np.array_equal(got, np.full(3, 10.0 * k + left))
    assert len(bound) == 1 and len(bound[0].requests) == 2 and posted == []
    rows = [(e.op, e.bytes_sent, e.bytes_received, e.label) for e in trace.entries]
    assert rows == [("sendrecv", 24, 24, "ring")] * 4
    requests = list(bound[0].requests)
    assert all(requests)  # inactive, not freed
    del graph, bound[:]
    gc.collect()
    assert not any(requests)  # freed with the graph
