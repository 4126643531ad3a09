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


@pytest.fixture(scope="module")
def meshes():
    """The random cases' meshes by Layout, kept for the module: 168 cases draw about 15 layouts, and each new
    mesh built its axis groups again (collective over the world). Every rank runs the same cases in the same
    order, so all ranks build, reuse and close the same meshes."""
    kept: dict = {}
    yield kept
    for mesh in kept.values():
        mesh.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_under_mpi(name, meshes):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size & (comm.size - 1):
        pytest.skip("the random meshes factor a power-of-two world")
    rng = np.random.default_rng(sorted(CASES).index(name))
    for _ in range(3):
        case = random_case(name, comm.size, rng)
        forward, gradient, note = run_case(comm, case, meshes=meshes)
        assert note is None, note
