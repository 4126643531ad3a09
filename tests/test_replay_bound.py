"""What a replay runs beside the recorded numpy calls (spmdsim.runtime.replay): its calls compiled once a graph
into straight-line Python, a kept collective's call bound to its plan (no check of the collective's
arguments again), a dropout mask drawn from what the capture's draw kept; each gives the values the
eager call gives, and falls back to the whole call where what it bound no longer holds."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout, Mesh, SeededTensor
from spmdsim.base import buffers
from spmdsim.errors import SpmdsimError
from spmdsim.nn.ops._common import keep_mask
from spmdsim.runtime import collectives, door, replay
from spmdsim.runtime.replay import Scalar, capture


def _opcodes(call):
    """(call's result, opcodes run in spmdsim.runtime.replay and in code compiled from strings, the code
    objects of the frames entered)."""
    counts = {"opcodes": 0}
    frames: dict = {}

    def tracer(frame, event, arg):
        if event == "call":
            frames[frame.f_code] = frames.get(frame.f_code, 0) + 1
            frame.f_trace_opcodes = True
            return tracer
        if event == "opcode" and (frame.f_code.co_filename == "<string>"
                                  or frame.f_code.co_filename == replay.__file__):
            counts["opcodes"] += 1
        return tracer

    sys.settrace(tracer)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return result, counts["opcodes"], frames


def test_a_replay_makes_its_calls_as_straight_line_code():
    a = buffers.zeros((4, 3), np.float64)
    a[...] = np.arange(12.0).reshape(4, 3)

    def step(x):
        x = np.asanyarray(x)
        outs = []
        for k in range(150):  # more objects than one compiled run names
            y = x * float(k) + 1.0
            outs.append(np.where(y > 5.0, y, 0.0))  # a copy into its captured result
        z = np.sum(outs[-1], axis=0, keepdims=True)  # keywords
        return outs[0], outs[-1], z

    graph = capture(step, a)
    assert len(graph._runs) >= 2  # split to stay within _NAMES_MAX names each
    new = np.arange(12.0).reshape(4, 3) * -0.5 + 4.0
    (first, last, z), opcodes, _ = _opcodes(lambda: graph(new))
    want = np.where(new * 149.0 + 1.0 > 5.0, new * 149.0 + 1.0, 0.0)
    assert np.array_equal(first, np.where(new * 0.0 + 1.0 > 5.0, new * 0.0 + 1.0, 0.0))
    assert np.array_equal(last, want) and np.array_equal(z, want.sum(axis=0, keepdims=True))
    # A loop over (func, args, kwargs) ran ~14 opcodes a call beside it (~18 here with _copy_into's own
    # frame); compiled, a call is ~8-14 (the call itself: 9.5 here).
    assert opcodes < 11 * graph.operations, (opcodes, graph.operations)


def test_strings_and_keywords_that_are_not_identifiers_replay_as_recorded():
    def kernel_with(x, how, **extra):
        return np.full_like(x, len(how) + sum(extra.values()))

    odd = replay.kernel(kernel_with)
    a = buffers.zeros((2,), np.float64)

    def step(x):
        return odd(np.asanyarray(x), "unsafe", **{"not-a-name": 3, "class": 4})

    graph = capture(step, a)
    out = graph(np.zeros(2))
    assert np.array_equal(out, [13.0, 13.0])


def _collectives_step():
    mesh = Mesh(Layout((2,), ("x",)), spmdsim.world())
    rank = mesh.rank
    x = buffers.zeros((4, 3), np.float64)

    def step(block):
        block = np.asanyarray(block)
        total = collectives.allreduce(mesh, block, "x")
        gathered = collectives.allgather(mesh, block * 2.0, "x", 0)
        part = collectives.reduce_scatter(mesh, gathered, "x", 0)
        return total, gathered, part

    def values(k):
        return np.arange(12.0).reshape(4, 3) * (rank + 1) + k

    x[...] = values(0)
    collectives.allreduce(mesh, x, "x")  # the plans kept before the capture, as an eager step before it
    graph = capture(step, x)
    checks = {getattr(f, "__wrapped__", f).__code__ for f in (collectives.allreduce, collectives.allgather,
                                                collectives.reduce_scatter)} | {door.repeat.__code__}
    results = []
    for k in (1, 2):
        (total, gathered, part), _, frames = _opcodes(lambda: graph(values(k)))
        both = values(k) + (np.arange(12.0).reshape(4, 3) * (2 - rank) + k)
        want = np.concatenate([(np.arange(12.0).reshape(4, 3) * (r + 1) + k) * 2 for r in range(2)])
        results.append((checks & frames.keys(), np.array_equal(total, both), np.array_equal(gathered, want),
                        np.array_equal(part, 2 * want[rank * 4:(rank + 1) * 4])))
    mesh._plans.clear()  # what was bound no longer holds: each collective runs whole (and keeps its plan again)
    (total, gathered, part), _, frames = _opcodes(lambda: graph(values(5)))
    both = values(5) + (np.arange(12.0).reshape(4, 3) * (2 - rank) + 5)
    want = np.concatenate([(np.arange(12.0).reshape(4, 3) * (r + 1) + 5) * 2 for r in range(2)])
    results.append((checks <= frames.keys() or checks - {door.repeat.__code__} <= frames.keys(),
                    np.array_equal(total, both), np.array_equal(part, 2 * want[rank * 4:(rank + 1) * 4])))
    mesh.close()
    return results


def test_a_kept_collective_replays_as_its_plans_transfer_alone():
    for results in spmdsim.simulate(2, _collectives_step):
        for entered, *right in results[:2]:
            assert entered == set() and all(right), results  # no collective's checks, no door.repeat
        assert all(results[2]), results


def test_a_masks_replay_draws_it_without_the_tensors_checks():
    out = []

    def step(seed):
        keep = keep_mask((8, 64, 16), lambda: int(seed.value), (slice(0, 4), slice(16, 32), slice(0, 16)), 0.1)
        out.append(keep)
        return keep

    graph = capture(step, Scalar(3))
    for seed in (3, 7, 2**40):
        mask, _, frames = _opcodes(lambda: graph(Scalar(seed)))
        fresh = SeededTensor((8, 64, 16), "float64", seed=seed, low=0.0, high=1.0).region(
            ((0, 4), (16, 32), (0, 16))) >= 0.1
        assert mask is out[0] and np.array_equal(mask, fresh)
        assert not {"_keep", "with_seed", "at_least"} & {code.co_name for code in frames}, frames
    with pytest.raises(SpmdsimError, match=r"^seed -1 must be an integer in \[0, 2\*\*63\)$"):
        graph(Scalar(-1))  # the whole call's one-line error
