"""Fixtures and hooks the MPI test files share (the session setup is tests/conftest.py).

The files named in tests/engines.py SIMULATED also run in the plain pytest
pass, each body on 8 and on 4 simulated ranks (spmdsim.simulate).
"""
from __future__ import annotations

import engines
import pytest

from spmdsim import Layout


@pytest.fixture(autouse=True)
def engine(request):
    """Which engine runs the test: "mpi" (mpiexec), or "sim8"/"sim4" (simulated ranks, pure pass)."""
    return getattr(request, "param", "mpi")


def pytest_generate_tests(metafunc):
    engines.parametrize(metafunc)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    engines.unskip(config, items)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    return engines.call(pyfuncitem)


@engines.per_rank
def mesh():
    """1-D mesh over every rank, axis "mp" (closed after the test; a file may define its own)."""
    from spmdsim.runtime import Mesh

    comm = engines.world()
    m = Mesh(Layout((comm.size,), ("mp",)), comm)
    yield m
    m.close()
