"""The general operators under MPI: every rule on random meshes and layouts of the world's size.

The same cases as tests/test_ops_general.py (tests/generalkit.py), drawn
from a seeded generator every rank shares, so all ranks build the same
programs; forward against numpy, float64 gradients against central
differences, through real MPI collectives.
"""
from __future__ import annotations

import numpy as np
import pytest

from generalkit import CASES, random_case, run_case

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_under_mpi(name):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size & (comm.size - 1):
        pytest.skip("the random meshes factor a power-of-two world")
    rng = np.random.default_rng(sorted(CASES).index(name))
    for _ in range(3):
        case = random_case(name, comm.size, rng)
        forward, gradient, note = run_case(comm, case)
        assert note is None, note
