"""spmdsim lab's reference solutions on real MPI ranks: each passes every case on this job's world."""
from __future__ import annotations

import json
import os
import tempfile

import pytest
from mpi4py import MPI

from spmdsim.tools.lab import load_exercises
from spmdsim.tools.lab.mpi_child import cases_on

pytestmark = pytest.mark.mpi(min_size=1)


@pytest.mark.parametrize("exercise", load_exercises(), ids=lambda e: f"{e.number}-{e.name}")
def test_every_reference_passes_every_case_under_mpiexec(exercise):
    comm = MPI.COMM_WORLD
    if comm.size not in exercise.ranks:
        pytest.skip(f"exercise {exercise.number} runs on {exercise.ranks} ranks, not {comm.size}")
    folder = comm.bcast(tempfile.mkdtemp(prefix="spmdsim-lab-mpi-") if comm.rank == 0 else None, root=0)
    out = os.path.join(folder, "cases.jsonl")
    passed = cases_on(comm, exercise, exercise.path, out)
    comm.Barrier()
    if comm.rank == 0:
        with open(out) as f:
            done = [json.loads(line) for line in f if '"done"' in line]
        os.remove(out)
        os.rmdir(folder)
        assert [(d["ranks"], d["status"]) for d in done] == [(comm.size, "pass")] * len(exercise.seeds), done
    assert passed
