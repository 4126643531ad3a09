"""Topology communicators called through mpi4py's base classes, ranks given as floats, and freed copies of
the predefined communicators behave on simulated ranks as under MPICH: values from MPI's semantics, and
MPICH's own (tests/mpi4py_ranks_and_handles.py run under ``mpiexec -n 4``)."""
from __future__ import annotations

import json
import operator
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import mpi4py_ranks_and_handles as programs
from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.runtime.sim import simulate
from testkit import MPICH, mpi_says

HERE = Path(__file__).resolve().parent
RANK, ARG = f"MPI.Exception {mpi_says('ERR_RANK')}", f"MPI.Exception {mpi_says('ERR_ARG')}"


@pytest.fixture(scope="module")
def simulated4():
    # cart.Sub([np.bool_(True), False]) on purpose: numpy 2.2 reads the numpy bool as 1 with a DeprecationWarning,
    # mpi4py's own array reading and the emulator's alike (_numpy_bool_sub); expected here, not a finding.
    with swapped(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*'np\.bool' scalars to be interpreted as an index", DeprecationWarning)
        return [json.loads(json.dumps(r, default=repr)) for r in simulate(4, programs.run_all)]


def _grid_neighbours(r: int) -> list:
    """Rank r's neighbours in the 2 x 2 grid, periodic in its first dimension only: back, forward per dimension."""
    from mpi4py import MPI

    null = MPI.PROC_NULL
    return [(r + 2) % 4, (r + 2) % 4, r - 1 if r % 2 else null, r + 1 if r % 2 == 0 else null]


def test_topology_communicators_through_the_base_classes(simulated4):
    # MPI.Topocomm.neighbor_alltoall(cart, ...) raised MPICH's "Invalid communicator" from mpi4py's own code
    # (MPI.Topocomm was not the simulated class); MPI.Comm.Dup(cart) and cart.Dup_with_info gave a communicator
    # without the grid, and MPI.Comm.Get_topology(cart) MPI.UNDEFINED.
    from mpi4py import MPI

    for r, res in enumerate(simulated4):
        around = _grid_neighbours(r)
        # from neighbour i, the block it sent this way: the one back sent it forward (i ^ 1)
        alltoall = [None if n == MPI.PROC_NULL else 10 * n + (i ^ 1) for i, n in enumerate(around)]
        gathered = [None if n == MPI.PROC_NULL else n for n in around]
        assert res["base_class_calls"] == [
            alltoall, gathered, [(r - 1) % 4], True, False, True, [r // 2, r % 2], 4, r, [around, around],
            gathered, True, "TypeError", False, True, True,
            ["Cartcomm", True, gathered], ["Cartcomm", True, gathered], ["Distgraphcomm", True, [(r - 1) % 4]],
            [float(n) if n != MPI.PROC_NULL else 0.0 for n in around]]


def test_float_ranks_in_groups(simulated4):
    # Range_incl([(0.0, 2.0, 1)]) raised TypeError (mpi4py reads each number as a C int: MPICH takes it), and
    # Incl([-1]) gave the last rank, Excl([9]) and Excl([-1]) every rank, where MPICH raises MPI.ERR_RANK.
    from mpi4py import MPI

    for res in simulated4:
        assert res["float_ranks_in_groups"] == [
            ["group", [0, 1, 2]], ["group", [0, 1, 2]], ["group", [3, 1]], ["group", [3]], "TypeError", "ValueError",
            ARG, ARG, ARG, ["group", [2, 0]], "TypeError", RANK, RANK, ["group", [0, 2, 3]], "TypeError", RANK, RANK,
            [3, MPI.PROC_NULL], "TypeError", RANK]


def _numpy_bool_sub():
    """What mpi4py's ``cart.Sub([np.bool_(True), False])`` gives under this numpy: its integer array refuses a
    numpy bool (TypeError) where operator.index does (numpy 2.4 and 2.5); numpy 2.2 still takes one as 1, with a
    DeprecationWarning, and mpi4py makes the 2-rank grid (seen with MPICH under Python 3.10's numpy 2.2.6)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            operator.index(np.bool_(True))
        except TypeError:
            return "TypeError"
    return ["comm", "Cartcomm", 2]


def test_float_ranks_in_grids(simulated4):
    # cart.Shift(0, 1.0) returned (3.0, 1.0) where MPICH returns ints, and Create_cart([2.0, 2]) made a grid
    # where mpi4py's integer arrays refuse a float (TypeError).
    for r, res in enumerate(simulated4):
        across = (r + 2) % 4
        back, forward = _grid_neighbours(r)[2:]
        assert res["float_ranks_in_grids"] == [
            [across, across], [back, forward], [across, across], "TypeError", "OverflowError", [1, 1], "TypeError",
            "ValueError", "TypeError", _numpy_bool_sub(), "ValueError", "TypeError", "TypeError",
            ["comm", "Cartcomm", 4], "TypeError", "TypeError", [2, 0], [1, 1], "TypeError", ["int", "int"]]


def test_freed_copies_of_the_predefined_communicators(simulated4):
    # c = type(MPI.COMM_WORLD)(MPI.COMM_WORLD); c.free() left c true (MPICH: MPI.COMM_NULL), as for COMM_SELF;
    # Free of a null communicator did nothing (MPICH: MPI.ERR_COMM).
    comm = f"MPI.Exception {mpi_says('ERR_COMM')}"
    for res in simulated4:
        assert res["freed_copies_of_predefined"] == [False, True, True, 4, comm, False, True, True, 1, comm, comm,
                                                     True]


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
def test_same_results_as_mpich(simulated4, tmp_path):
    out = tmp_path / "mpich.json"
    run = subprocess.run(["timeout", "-k", "5", "120", MPICH, "-n", "4", sys.executable,
                          str(HERE / "mpi4py_ranks_and_handles.py"), str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(out.read_text())
    assert len(theirs) == 4
    for r, (ours, mpich) in enumerate(zip(simulated4, theirs)):
        for name in mpich:
            assert ours[name] == mpich[name], f"{name} on rank {r}"
