"""Test-session setup shared by the pure and the MPI runs.

Under ``mpiexec ... pytest --only-mpi`` (see scripts/test.sh) this file makes
pytest-mpi safe (docs/architecture.md, "Tests under MPI"): a failed test on any rank aborts the
whole job at once instead of deadlocking the next collective, every rank gets
its own temp dir, the world size must be the one the script asked for (a
foreign mpiexec would run N separate 1-rank jobs and falsely pass), and only
rank 0 prints the pytest report.
"""
from __future__ import annotations

import os
import sys

import pytest
from engines import mpi_requested

_WORLD = None  # MPI.COMM_WORLD when running under --with-mpi/--only-mpi


# trylast: the terminal reporter registers in its own pytest_configure, which
# must have run before non-zero ranks can unregister it.
@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _WORLD
    if not mpi_requested(config):
        return
    from mpi4py import MPI

    _WORLD = MPI.COMM_WORLD
    expected = os.environ.get("SPMDSIM_EXPECT_WORLD")
    if expected and int(expected) != _WORLD.size:
        sys.stderr.write(
            f"world size is {_WORLD.size} but {expected} ranks were asked for: "
            "is mpiexec from the same MPI as mpi4py? (python -m mpi4py --mpi-library)\n"
        )
        raise SystemExit(3)
    base = config.option.basetemp or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"spmdsim-pytest-{os.getuid()}"
    )
    # pytest creates basetemp itself but not its parent.
    os.makedirs(str(base), exist_ok=True)
    config.option.basetemp = os.path.join(str(base), f"rank{_WORLD.rank}")
    if _WORLD.rank != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _WORLD is None or _WORLD.size == 1 or not report.failed:
        return
    from spmdsim.runtime.guard import end_job

    # Written, forwarded by mpiexec, MPICH's /dev/shm segment unlinked, then MPI_Abort.
    end_job(_WORLD, f"\n[rank {_WORLD.rank}] {report.nodeid} failed ({report.when}); aborting the MPI job\n"
                    f"{report.longreprtext}\n")
