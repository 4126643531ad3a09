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

    from spmdsim.runtime.process import release_segments_once, tune_mpi_process

    _WORLD = MPI.COMM_WORLD
    tune_mpi_process()  # this run is a launched program of spmdsim's: BLAS threads, heap, memory watch
    release_segments_once(_WORLD)  # and MPICH's /dev/shm segment unlinked once every rank mapped it
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


def _only_mpi(config: pytest.Config) -> bool:
    try:
        return bool(config.getoption("--only-mpi"))
    except ValueError:
        return False


def pytest_ignore_collect(collection_path, config: pytest.Config):
    """Under --only-mpi, the pure test files (tests/*.py) are not even imported: none is marked mpi,
    and importing ~80 modules on every rank of an oversubscribed job costs seconds."""
    if (_only_mpi(config) and collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and collection_path.parent.name != "mpi"):
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Deselect, rather than skip one by one, what this pass does not run: under --only-mpi the
    tests without the mpi mark; in the pure pass the MPI tests that have no simulated variant.
    A skip prints an 's' each (about 1,200 per MPI pass); a deselection is one count."""
    if _only_mpi(config):
        drop = [item for item in items if item.get_closest_marker("mpi") is None]
    elif not mpi_requested(config):
        drop = [item for item in items if item.get_closest_marker("mpi") is not None
                and not str(getattr(getattr(item, "callspec", None), "params", {}).get("engine", "")).startswith("sim")]
    else:
        return
    if drop:
        keep = set(map(id, drop))
        items[:] = [item for item in items if id(item) not in keep]
        config.hook.pytest_deselected(items=drop)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _WORLD is None or _WORLD.size == 1 or not report.failed:
        return
    from spmdsim.runtime.guard import end_job

    # Written, forwarded by mpiexec, MPICH's /dev/shm segment unlinked, then MPI_Abort.
    end_job(_WORLD, f"\n[rank {_WORLD.rank}] {report.nodeid} failed ({report.when}); aborting the MPI job\n"
                    f"{report.longreprtext}\n")
