"""Fixtures the MPI test files share (the session setup is tests/conftest.py)."""
from __future__ import annotations

import pytest

from spmdsim import Layout


@pytest.fixture
def mesh():
    """1-D mesh over every rank, axis "mp" (closed after the test; a file may define its own)."""
    from mpi4py import MPI

    from spmdsim.runtime import Mesh

    m = Mesh(Layout((MPI.COMM_WORLD.size,), ("mp",)), MPI.COMM_WORLD)
    yield m
    m.close()
