"""Determinism under MPI: seeded shards at this world size, and a job repeated bit for bit.

Runs at any world size (the suite runs 8 and 4): every factorization of the
world size into 1-3 axes, each rank's DTensor.from_seeded shard equals the
same slice of the global tensor bit for bit; the same operators run twice in
one job (fresh meshes, fresh sub-communicators) give identical bytes on every rank.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from spmdsim import Layout, SeededTensor
from testkit import factorizations as _factorizations

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def test_seeded_shards_match_the_global_slice_for_every_device_matrix() -> None:
    from spmdsim.runtime import DTensor, Mesh

    comm = _world()
    src = SeededTensor((24, 48), "float32", seed=5)
    full = src.full()
    ok, checked = True, 0
    for parts in (1, 2, 3):
        for matrix in _factorizations(comm.size, parts):
            names = tuple("abc"[:parts])
            with Mesh(Layout(matrix, names), comm) as mesh:
                for where in itertools.product((0, 1, None), repeat=parts):
                    dims = [tuple(a for a, w in zip(names, where) if w == d) for d in (0, 1)]
                    tl = mesh.layout(*dims)
                    shard = DTensor.from_seeded(mesh, tl, src).local
                    ok &= shard.tobytes() == np.ascontiguousarray(full[tl.slices(comm.rank, src.shape)]).tobytes()
                    checked += 1
    assert all(comm.allgather(ok)) and checked >= 3


def _run_once(comm) -> bytes:
    from spmdsim.tools.demo import jobs
    from spmdsim.tools.demo.registry import run_job

    out = b""
    size = comm.size
    for job in (
        jobs.strategy_matmul_job(comm, ((1, size), (size, 1)), (8, 8 * size, 8), seed=1),
        jobs.strategy_matmul_job(comm, ((1, size), (size, 1)), (8 * size, 8 * size, 8), seed=2,
                                 out_strategy=(size, 1)),
        jobs.mlp_job(comm, (4, 12, 4 * size), seed=3),
        jobs.embedding_job(comm, "vocab", (3, 5, 4 * size, 6), seed=4),
    ):
        run = run_job(job, comm)
        assert run.verdict.passed, str(run.verdict)
        out += run.out.local.tobytes()
    return out


def test_same_job_twice_is_bit_identical() -> None:
    comm = _world()
    first, second = _run_once(comm), _run_once(comm)
    assert all(comm.allgather(first == second))
