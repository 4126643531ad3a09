"""Central differences shared over MPI ranks (spmdsim.runtime.shared_numeric_grads), and work done by one
rank for all (shared_once).

Each rank computes its share of reference_grad.numeric_grads' runs and one
Allgather places the shares: the result must be numeric_grads' own bits, every
rank must have computed only its share, and ranks that pass different arrays
must all raise the same error.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from spmdsim import Layout, SpmdsimError
from spmdsim.references import backward as rg
from spmdsim.runtime import Mesh, shared_numeric_grads
from spmdsim.runtime.shared_reference import shared_once, shared_once_on

pytestmark = pytest.mark.mpi(min_size=2)


def _program(x, w, g):  # any argument may carry a leading axis of copies
    return np.tanh((x * g[..., None, :]) @ w) ** 2


def _arrays():
    rng = np.random.default_rng(8)
    return rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(4)


@pytest.mark.parametrize("batch", [0, 7])
def test_shared_differences_are_numeric_grads_bits_and_each_rank_computes_its_share(batch):
    comm = MPI.COMM_WORLD
    arrays = _arrays()
    calls = []

    def counted(*a):
        calls.append(1)
        return _program(*a)

    with Mesh(Layout((comm.size,), ("x",)), comm) as mesh:
        got = shared_numeric_grads(mesh, counted, *arrays, batch=batch)
    want = rg.numeric_grads(_program, *arrays, batch=batch)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        assert g.dtype == np.float64 and np.array_equal(g, w)  # bit for bit, not within a tolerance
    # 32 elements: 32 runs of one element (2 calls each), or 2 + 3 + 1 runs of up to 7 (1 call each).
    runs = len(rg.numeric_grad_parts([a.shape for a in arrays], batch))
    per_run = 2 if batch == 0 else 1
    share = [len(range(runs * r // comm.size, runs * (r + 1) // comm.size)) for r in range(comm.size)]
    assert comm.allgather(len(calls)) == [per_run * n for n in share] and sum(share) == runs


def test_ranks_that_pass_different_arrays_all_raise_the_same_error():
    comm = MPI.COMM_WORLD
    x, w, g = _arrays()
    if comm.rank == comm.size - 1:
        w = w + 1e-12
    with Mesh(Layout((comm.size,), ("x",)), comm) as mesh:
        with pytest.raises(SpmdsimError) as err:
            shared_numeric_grads(mesh, _program, x, w, g, batch=7)
    assert str(err.value) == (f"shared_numeric_grads: rank {comm.size - 1}'s arrays, h or batch differ from "
                              "rank 0's; pass the same on every rank")
    assert comm.allgather(str(err.value)) == [str(err.value)] * comm.size


def _step(moments, params, scale):  # a reference step's shape: dicts of arrays in, a tuple out
    return {k: v * scale for k, v in moments.items()}, float(sum(p.sum() for p in params.values())) * scale


def test_shared_once_is_computed_by_rank_0_and_received_by_the_others():
    comm = MPI.COMM_WORLD
    x, w, _ = _arrays()
    calls = []

    def counted(*a):
        calls.append(1)
        return _step(*a)

    with Mesh(Layout((comm.size,), ("x",)), comm) as mesh:
        moments, total = shared_once(mesh, ("step", 1), counted, {"m": x}, {"w": w, "x": x}, 0.5)
        assert comm.allgather(len(calls)) == [1] + [0] * (comm.size - 1)
        want = _step({"m": x}, {"w": w, "x": x}, 0.5)
        assert list(moments) == ["m"] and np.array_equal(moments["m"], want[0]["m"]) and total == want[1]
        # Arguments that differ on one rank: every rank computes its own answer.
        scale = 2.0 if comm.rank == 1 else 0.5
        moments, total = shared_once(mesh, ("step", 2), counted, {"m": x}, {"w": w}, scale)
        assert comm.allgather(len(calls)) == [2] + [1] * (comm.size - 1)
        assert total == _step({"m": x}, {"w": w}, scale)[1]


def test_shared_once_on_a_world_with_a_command_line_is_computed_by_rank_0():
    """`spmdsim autoshard --run`'s search: a command line (argparse's namespace, its handler a function at each
    process's own address) and the world, no mesh: rank 0 searches, the others receive its answer."""
    import argparse

    comm = MPI.COMM_WORLD
    calls = []
    args = argparse.Namespace(network="mlp", run=True, func=_program)

    def search(a, size):
        calls.append(1)
        return {"network": a.network, "size": size}

    assert shared_once_on(comm, ("search", comm.size), search, args, comm.size) == {"network": "mlp",
                                                                                    "size": comm.size}
    assert comm.allgather(len(calls)) == [1] + [0] * (comm.size - 1)


def test_shared_once_whose_rank_0_fails_lets_each_rank_compute_its_own():
    comm = MPI.COMM_WORLD

    def step(value):
        if comm.rank == 0:
            raise ValueError("rank 0 cannot")
        return value + comm.rank

    with Mesh(Layout((comm.size,), ("x",)), comm) as mesh:
        try:
            got = shared_once(mesh, "failing", step, 10)
        except ValueError as exc:
            got = str(exc)
    assert comm.allgather(got) == ["rank 0 cannot"] + [10 + r for r in range(1, comm.size)]


def test_shared_once_whose_result_does_not_pickle_lets_each_rank_compute_its_own():
    comm = MPI.COMM_WORLD
    calls = []

    def make():
        calls.append(1)
        return lambda: comm.rank  # a local function: pickle cannot carry it

    with Mesh(Layout((comm.size,), ("x",)), comm) as mesh:
        got = shared_once(mesh, "unpicklable", make)
    assert got() == comm.rank and comm.allgather(len(calls)) == [1] * comm.size


def test_a_shared_reference_trainer_is_stepped_by_rank_0_for_all(monkeypatch):
    """SharedReferenceTrainer(comm=...) under MPI: rank 0 computes each step and the others receive it, the same bits
    as a trainer of their own; a batch that differs on one rank makes every rank compute its own from then on
    (the trainers' starts differ after it)."""
    from spmdsim.models.nets import reference as tr
    from spmdsim.models.nets import mindspore_layout
    from spmdsim.models.nets.shared import SharedReferenceTrainer
    from spmdsim.models.nets.digits import load_digits

    comm = MPI.COMM_WORLD
    calls = []
    real = tr._train_step

    def counted(*a):
        calls.append(1)
        return real(*a)

    net = mindspore_layout(8, dtype="float64", seed=0)
    data = load_digits(seed=0, synthetic=True)
    shared = SharedReferenceTrainer(net, optimizer="adam", lr=1e-3, comm=comm)
    own = tr.ReferenceTrainer(net, optimizer="adam", lr=1e-3)
    for step in range(3):
        x, labels = data.batch(step, net.source.shape[0])
        if step == 1 and comm.rank == comm.size - 1:
            x = x + 1e-3  # this rank's batch differs: its own step, and so every later step its own
        monkeypatch.setattr(tr, "_train_step", counted)
        got = shared.step(x, labels)
        monkeypatch.setattr(tr, "_train_step", real)
        want = own.step(x, labels)
        assert got.loss == want.loss
        for a, b in zip(got.grads + got.params + got.grad_scales + got.param_scales,
                        want.grads + want.params + want.grad_scales + want.param_scales):
            assert a.tobytes() == b.tobytes()
        assert all(a.tobytes() == b.tobytes() for a, b in zip(shared.params, own.params))
    assert comm.allgather(len(calls)) == [3] + [2] * (comm.size - 1)
