"""MPI's engine: every kind of transfer under mpiexec, checked as the thread engine's is (tests/enginekit.py)."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from enginekit import check_dtypes, check_transfers, run_dtypes, run_transfers

pytestmark = pytest.mark.mpi(min_size=3)


def test_the_mpi_engine_runs_every_transfer_as_mpi_defines_it():
    comm = MPI.COMM_WORLD.Dup()
    try:
        check_transfers(run_transfers(comm), comm.Get_rank(), comm.Get_size())
    finally:
        comm.Free()


def test_text_moves_and_what_mpi_cannot_take_is_refused_as_on_simulated_ranks():
    """Text (numpy's S and U) raised mpi4py's raw KeyError "cannot map '2w' to MPI datatype" in every
    collective that moves it, where simulated ranks moved it; a complex max was MPICH's "Invalid MPI_Op"
    error stack, where simulated ranks took numpy's maximum. Now MPI moves text's bytes, and both
    engines refuse the same dtypes with the same line (tests/test_engines.py runs the same body)."""
    comm = MPI.COMM_WORLD.Dup()
    try:
        check_dtypes(run_dtypes(comm), comm.Get_rank(), comm.Get_size())
    finally:
        comm.Free()
