"""A capture is this thread's (spmdsim.base.buffers.CAPTURE): while one simulated rank captures a step, another
rank's eager code takes its plain path (the optimizer's remembered parameters, blocks read without
DTensor.local's function), and the captured step replays as it was captured."""
from __future__ import annotations

import numpy as np

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.base import buffers
from spmdsim.nn import ops
from spmdsim.nn.optim import AdamW
from spmdsim.runtime import collectives
from spmdsim.runtime.replay import capture


def _ranks_capture_in_turn():
    mesh = Mesh(Layout((2,), ("x",)), spmdsim.world())
    rank = mesh.rank
    w = DTensor.from_global(mesh, np.arange(6.0).reshape(2, 3), mesh.layout(None, None)).requires_grad_()
    opt = AdamW([w], lr=0.1)
    x = buffers.zeros((3,), np.float64)
    found = []  # per eager window: the optimizer's full checks of its parameters (AdamW._found), made there
    seen = []  # per eager window: whether an array spmdsim made and a block read there were plain arrays
    counting = {"on": False, "calls": 0}
    full = opt._found

    def counted():
        if counting["on"]:
            counting["calls"] += 1
        return full()

    opt._found = counted

    def eager_step():
        opt.zero_grad()
        ops.sum(ops.mul(w, w)).backward()
        opt.step()

    def step(block):
        collectives.allreduce(mesh, np.asanyarray(block), "x", out=np.asanyarray(block))  # the other rank is
        eager = np.asanyarray(block) * 2.0  # in its window from here
        collectives.allreduce(mesh, eager, "x", out=eager)  # ... to here
        return eager

    eager_step()  # the parameters checked once (remembered for the next steps)
    graphs = []
    for capturer in (0, 1):
        x[...] = np.arange(3.0) + rank
        if rank == capturer:
            graphs.append(capture(step, x))
        else:
            a = buffers.zeros((3,), np.float64)
            collectives.allreduce(mesh, a, "x", out=a)
            counting["on"] = True  # the capturing rank is between its two collectives: capturing
            eager_step()
            seen.append((type(buffers.empty((4,))) is np.ndarray, type(w.local) is np.ndarray))
            counting["on"] = False
            found.append(counting["calls"])
            b = buffers.zeros((3,), np.float64)
            collectives.allreduce(mesh, b, "x", out=b)
    # Each rank replays its own graph, the other meeting its two collectives eagerly.
    results = []
    for capturer in (0, 1):
        if rank == capturer:
            results.append(graphs[0](np.arange(3.0) * (rank + 1)).copy())
        else:
            for _ in range(2):
                a = buffers.zeros((3,), np.float64)
                collectives.allreduce(mesh, a, "x", out=a)
    mesh.close()
    return found, seen, results


def test_a_rank_that_does_not_capture_takes_its_plain_path_while_another_captures():
    (found0, seen0, results0), (found1, seen1, results1) = spmdsim.simulate(2, _ranks_capture_in_turn)
    assert found0 == [0] and found1 == [0], (found0, found1)  # no full check: remembered, as outside a capture
    assert seen0 == [(True, True)] and seen1 == [(True, True)]
    # Each graph replays its capture: the block summed with the other rank's zeros, doubled, summed again.
    assert np.array_equal(results0[0], np.arange(3.0) * 2.0) and np.array_equal(results1[0], np.arange(3.0) * 4.0)


def test_a_kernels_namespace_calls_the_function_itself_unless_this_thread_captures():
    """spmdsim.runtime.replay.kernels: ``K.f`` is f itself (no wrapper) in a thread that does not capture, also
    while another thread captures, and f's recorded wrapper in the thread that captures, from its start to its end
    (a namespace first made or first used there included): each call there is one recorded call a replay reruns."""
    import threading

    from spmdsim.runtime.replay import kernel, kernels

    calls = []

    def double(x):
        calls.append("double")
        return x * 2.0

    def plus_one(x):
        calls.append("plus_one")
        return x + 1.0

    recorded_double, recorded_plus_one = kernel(double), kernel(plus_one)
    K = kernels(recorded_double)
    assert K.double is double
    elsewhere = {}

    def look():
        elsewhere["K"] = K.double  # another thread, while the main thread captures
        elsewhere["made"] = kernels(recorded_plus_one)  # made there: first used by the capturing thread

    def step(x):
        assert K.double is recorded_double
        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
        made_here = kernels(recorded_plus_one)
        assert made_here.plus_one is recorded_plus_one and elsewhere["made"].plus_one is recorded_plus_one
        return elsewhere["made"].plus_one(made_here.plus_one(K.double(x)))

    graph = capture(step, np.ones(2))
    assert elsewhere["K"] is double
    assert K.double is double and elsewhere["made"].plus_one is plus_one  # the capture over: the functions again
    assert graph.operations == 3 and calls == ["double", "plus_one", "plus_one"]
    calls.clear()
    assert np.array_equal(graph(np.array([3.0, 4.0])), [8.0, 10.0]) and calls == ["double", "plus_one", "plus_one"]
    assert K.double(np.ones(1)) == 2.0 and calls[-1] == "double"


def test_a_kernels_namespace_names_keyword_kernels_by_their_keyword_and_refuses_two_of_one_name():
    import pytest

    from spmdsim.runtime.replay import kernel, kernels

    def double(x):
        return x * 2.0

    recorded = kernel(double)
    K = kernels(twice=recorded)
    assert K.twice is double and not hasattr(K, "double")
    graph = capture(lambda x: K.twice(x), np.ones(2))
    assert graph.operations == 1 and K.twice is double
    with pytest.raises(ValueError, match="two kernels of one name"):
        kernels(recorded, double=recorded)
