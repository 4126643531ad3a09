"""The MPI test harness itself: per-rank temp dirs and the expected world size."""
from __future__ import annotations

import os

import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi(min_size=2)


def test_every_rank_has_its_own_working_tmp_path(tmp_path):
    comm = MPI.COMM_WORLD
    (tmp_path / "rank.txt").write_text(str(comm.rank))
    paths = comm.allgather(str(tmp_path))
    assert len(set(paths)) == comm.size
    assert (tmp_path / "rank.txt").read_text() == str(comm.rank)


def test_world_size_is_the_one_asked_for():
    expected = os.environ.get("SPMDSIM_EXPECT_WORLD")
    if not expected:
        pytest.skip("SPMDSIM_EXPECT_WORLD not set (run through scripts/test.sh)")
    assert MPI.COMM_WORLD.size == int(expected)
