"""MPI's engine: every kind of transfer under mpiexec, checked as the thread engine's is (tests/enginekit.py)."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from enginekit import check_transfers, run_transfers

pytestmark = pytest.mark.mpi(min_size=3)


def test_the_mpi_engine_runs_every_transfer_as_mpi_defines_it():
    comm = MPI.COMM_WORLD.Dup()
    try:
        check_transfers(run_transfers(comm), comm.Get_rank(), comm.Get_size())
    finally:
        comm.Free()
