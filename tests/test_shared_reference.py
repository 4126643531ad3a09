"""Central differences shared over simulated ranks, and numeric_grads' runs computed apart.

tests/mpi/test_shared_reference.py checks the same over MPI ranks.
"""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import Layout, SpmdsimError, simulate, world
from spmdsim.references import backward as rg


def _program(x, w, g):  # any argument may carry a leading axis of copies
    return np.tanh((x * g[..., None, :]) @ w) ** 2


def _arrays():
    rng = np.random.default_rng(8)
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(4)


@pytest.mark.parametrize("batch", [0, 7, 64])
def test_runs_computed_apart_and_placed_are_numeric_grads_bits(batch):
    arrays = _arrays()
    shapes = [a.shape for a in arrays]
    parts = rg.numeric_grad_parts(shapes, batch)
    # Every element once, in order: runs of `batch` (an array's last one shorter), or of one element.
    assert [(k, i) for k, start, stop in parts for i in range(start, stop)] == \
        [(k, i) for k, a in enumerate(arrays) for i in range(a.size)]
    assert all(stop - start == min(max(batch, 1), a.size - start) for k, start, stop in parts
               for a in [arrays[k]])
    whole = rg.numeric_grads(_program, *arrays, batch=batch)
    pieces = [rg.numeric_grad_values(_program, arrays, parts[i:i + 3], batch=batch) for i in range(0, len(parts), 3)]
    for got, want in zip(rg.split_flat(np.concatenate(pieces), shapes), whole):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("batch", [0, 7])
def test_simulated_ranks_share_the_differences_and_get_numeric_grads_bits(batch):
    from spmdsim.runtime import Mesh, shared_numeric_grads

    arrays = _arrays()
    want = rg.numeric_grads(_program, *arrays, batch=batch)

    def rank():
        calls = []

        def counted(*a):
            calls.append(1)
            return _program(*a)

        with Mesh(Layout((world().size,), ("x",))) as mesh:
            got = shared_numeric_grads(mesh, counted, *arrays, batch=batch)
        return all(np.array_equal(g, w) for g, w in zip(got, want)), len(calls)

    results = simulate(4, rank)
    runs = len(rg.numeric_grad_parts([a.shape for a in arrays], batch))
    per_run = 2 if batch == 0 else 1
    assert results == [(True, per_run * len(range(runs * r // 4, runs * (r + 1) // 4))) for r in range(4)]
    # A dry run's one rank computes them all (no rank sends values there).
    dry = simulate(4, lambda: [g.copy() for g in shared_numeric_grads(
        Mesh(Layout((world().size,), ("x",))), _program, *arrays, batch=batch)], dry_run=True)
    assert all(np.array_equal(g, w) for g, w in zip(dry[0], want))


def test_simulated_ranks_that_pass_different_arrays_all_raise_the_same_error():
    from spmdsim.runtime import Mesh, shared_numeric_grads

    def rank():
        x, w, g = _arrays()
        with Mesh(Layout((world().size,), ("x",))) as mesh:
            try:
                shared_numeric_grads(mesh, _program, x, w, g * (1 + (mesh.rank == 2)), batch=7)
            except SpmdsimError as exc:
                return str(exc)
        return None

    assert simulate(4, rank) == ["shared_numeric_grads: rank 2's arrays, h or batch differ from rank 0's; "
                                 "pass the same on every rank"] * 4


def test_shared_once_on_simulated_ranks_is_once():
    from spmdsim.runtime.shared_reference import shared_once

    calls = []

    def rank():
        with Mesh(Layout((world().size,), ("x",))) as mesh:
            return shared_once(mesh, "sum", lambda a: calls.append(1) or float(a.sum()), np.arange(4.0))

    from spmdsim.runtime import Mesh

    assert simulate(4, rank) == [6.0] * 4 and len(calls) == 1


def test_thedigest_reads_a_command_line_and_its_functions_by_name_not_address():
    """Two processes' equal command lines digest alike: a namespace by its fields, a function (argparse's
    handler) by module and name, never by its address, which differs from process to process."""
    import argparse

    from spmdsim.runtime.shared_reference import digest

    def handler():
        def run():
            return None
        return run

    first, second = handler(), handler()  # equal functions at two addresses, as in two ranks
    assert first is not second
    same = [digest(argparse.Namespace(network="mlp", run=True, func=f)) for f in (first, second)]
    assert np.array_equal(same[0], same[1])
    assert not np.array_equal(same[0], digest(argparse.Namespace(network="gpt", run=True, func=first)))
    assert not np.array_equal(same[0], digest(argparse.Namespace(network="mlp", run=True, func=len)))
