"""Test-session setup shared by the pure and the MPI runs.

Under ``mpiexec ... pytest --only-mpi`` (see scripts/test.sh) this file makes
pytest-mpi safe (docs/explanation/architecture.md, "Tests under MPI"): a failed test on any rank aborts the
whole job at once instead of deadlocking the next collective, every rank gets
its own temp dir, the world size must be the one the script asked for (a
foreign mpiexec would run N separate 1-rank jobs and falsely pass), and only
rank 0 prints the pytest report.
"""
from __future__ import annotations

import os
import sys
import time

import pytest
from engines import mpi_requested

from spmdsim.base.collector import THRESHOLDS
from spmdsim.tools.cli.segments import remove_left_since

_WORLD = None  # MPI.COMM_WORLD when running under --with-mpi/--only-mpi

#: The world sizes the MPI tests are written for: under another (2, 3, 16 ranks) a dozen files failed, each at
#: a shape or mesh of its own that the world does not divide, and the job ended at the first.
MPI_WORLD_SIZES = (4, 8)


#: The garbage collector's thresholds in a test process (pytest's own: a worker, an MPI pass's rank), in place
#: of Python's (700, 10, 10). A worker's heap grows to ~600,000 objects (spmdsim's bounded caches of layouts,
#: plans and candidates over ~1,000 tests), and each full pass walks all of them (~0.1 s): over the heavy
#: test files 25 full passes took 2.9 of 55 CPU-s, 2 passes 0.6 with these (and 4% of the CPU in all). Cycles
#: are still collected, later. The programs the tests launch keep Python's thresholds (what a user runs).
GC_THRESHOLDS = THRESHOLDS  # spmdsim.base.collector's, as the dry-run commands and the search set them


def _collect_garbage_less_often() -> None:
    import gc

    gc.set_threshold(*GC_THRESHOLDS)


def _keep_freed_heap() -> None:
    """The pure tests' process keeps its freed heap as a program's ``--ranks N`` run does
    (spmdsim.base.malloc): the simulated ranks these tests run in process otherwise fault every large block
    they free in again (system time was about a sixth of the pure tests' CPU)."""
    from spmdsim.base.malloc import keep_freed_buffers_unless_set

    keep_freed_buffers_unless_set()


@pytest.hookimpl(tryfirst=True, specname="pytest_configure")
def pytest_configure_basetemp_per_rank(config: pytest.Config) -> None:
    """Under MPI each rank its own temporary folder, set before pytest's own pytest_configure makes its
    TempPathFactory (which reads the option then): else the ranks number folders in one shared root and clean
    its old ones at once, racing ("PytestWarning: (rm_rf) error removing .../garbage-..."). The folders are
    this run's (rank 0's pid, so two runs at once keep apart: pytest empties a given basetemp first), and each
    rank removes its own at the end."""
    if not mpi_requested(config):
        return
    import shutil

    from mpi4py import MPI

    world = MPI.COMM_WORLD
    given = config.option.basetemp
    base = given or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"spmdsim-pytest-{os.getuid()}",
                                 f"run{world.bcast(os.getpid())}")
    # pytest creates basetemp itself but not its parent.
    os.makedirs(str(base), exist_ok=True)
    config.option.basetemp = mine = os.path.join(str(base), f"rank{world.rank}")

    def remove() -> None:
        shutil.rmtree(mine, ignore_errors=True)
        if not given:
            try:
                os.rmdir(base)  # the last rank to leave removes the run's folder
            except OSError:
                pass

    config.add_cleanup(remove)


# trylast: the terminal reporter registers in its own pytest_configure, which
# must have run before non-zero ranks can unregister it.
@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _WORLD
    _collect_garbage_less_often()
    if hasattr(config.option, "loadscopereorder"):  # xdist >= 3.7: schedule files in collection order
        config.option.loadscopereorder = False
    if not mpi_requested(config):
        _keep_freed_heap()
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
    if _WORLD.size not in MPI_WORLD_SIZES:  # every rank alike, before any test: no collective yet
        pytest.exit(f"tests/mpi run on {' or '.join(map(str, MPI_WORLD_SIZES))} ranks (scripts/test.sh runs both), "
                    f"not {_WORLD.size}: many split 8 rows or a 2 x 2 mesh over the world; run mpiexec -n 4 or "
                    "mpiexec -n 8" if _WORLD.rank == 0 else "", returncode=4)  # said once, every rank ends
    if _WORLD.rank != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


#: Files whose tests mostly wait (on a watchdog, a guard's grace, a killed job's end): 13, 6 and 15 s of a worker
#: for a few CPU-s. Among the heavy files, the two other workers compute meanwhile; placed by their number of
#: tests, test_reliability_watchdog.py ran last and left both cores idle for its 10 s (main 5510e79).
WAITING_FILES = ("test_reliability_faults.py", "test_reliability_watchdog.py", "test_runtime_faults.py")

#: The pure test files that cost the most CPU (getrusage of the pytest process and the children it waited
#: for, summed over the file's tests, on a 2-core machine; the mean of three whole-suite runs), heaviest first:
#: test_classroom_docs 55, test_estimate_bounds 51, test_estimate_search 36, test_train_docs_mpi 36,
#: test_estimate_search_fp8 23 CPU-s (left out, it was placed by its 5 tests among the last 60 files) down to 4-5
#: at the end.
#: Under xdist --dist loadfile a file runs whole on one worker; one of these scheduled last leaves the other
#: worker idle for its length (test_classroom_docs.py, 80 CPU-s and 9 tests, used to start last), so they go
#: first and the many small files fill in at the end (see _schedule_heavy_files_first).
HEAVY_FILES = (
    "test_classroom_docs.py", "test_estimate_bounds.py", "test_estimate_search.py", "test_train_docs_mpi.py",
    "test_estimate_search_fp8.py", "test_sim_mpi4py_suite.py", *WAITING_FILES, "test_fsdp_docs.py",
    "test_tolerance_scale.py", "test_pipeline_train.py", "test_scripts_args.py", "test_train_memory_docs.py",
    "test_lab_cli.py", "test_train_bf16_docs.py", "test_train_bf16.py", "test_autoshard_gpt.py",
    "test_estimate_search_context.py", "test_fsdp.py", "test_context_train.py", "test_moe.py", "test_sim_lab.py",
    "test_bad_inputs.py", "test_estimate_ahead.py", "test_bench_gpt_context.py", "test_sim_cli.py",
    "test_kept_megatron.py", "test_lab_odd_submissions.py", "test_sim_mpi4py_demos.py", "test_gpt_parallel.py",
    "test_new_user.py", "test_bench_gpt_moe.py", "test_autoshard_dag.py", "test_sim_mpirun.py",
    "test_sim_mpi4py_orders.py", "test_plan_exhaustive.py", "test_readme.py", "test_bench_gpt_pipeline.py",
    "test_train_memory.py", "test_bench_gpt_fsdp.py", "test_peer_mpi4py_gpt.py", "test_determinism.py",
    "test_gpt_checkpoint.py", "test_estimate_ledger.py", "test_properties.py",
)


def _schedule_heavy_files_first(items: list) -> None:
    """Order the files: HEAVY_FILES first (in its order), then the others by their number of tests, most
    first (xdist's own order, which this replaces: it put a file of 2 tests and 20 CPU-s last). The
    tests of a file keep their order. xdist schedules the files in this order when its own reordering
    is off (pytest_configure turns it off)."""
    counts: dict = {}
    for item in items:
        counts[item.nodeid.split("::")[0]] = counts.get(item.nodeid.split("::")[0], 0) + 1

    def key(item):
        path = item.nodeid.split("::")[0]
        name = path.rsplit("/", 1)[-1]
        return (HEAVY_FILES.index(name), 0) if name in HEAVY_FILES else (len(HEAVY_FILES), -counts[path])

    items.sort(key=key)


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
    if not _only_mpi(config):
        _schedule_heavy_files_first(items)
    if drop:
        keep = set(map(id, drop))
        items[:] = [item for item in items if id(item) not in keep]
        config.hook.pytest_deselected(items=drop)


#: When this test process started (seconds since the epoch): the MPI segments in /dev/shm made since, that no
#: process holds, are removed when the session ends (pytest_sessionfinish).
_STARTED = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove this user's MPI segments made since the session started that no process holds, as scripts/test.sh
    does after its passes: the tests that abort MPICH jobs on purpose (and compare spmdsim's end with MPICH's)
    leave theirs in /dev/shm, memory until reboot, and a plain `pytest` run kept them. Done once, by the process
    that ran the session (not by an xdist worker, nor by an MPI pass's ranks, which test.sh's trap covers)."""
    if _WORLD is None and not hasattr(session.config, "workerinput"):
        remove_left_since(_STARTED)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _WORLD is None or _WORLD.size == 1 or not report.failed:
        return
    from spmdsim.runtime.process import end_job

    # Written, forwarded by mpiexec, MPICH's /dev/shm segment unlinked, then MPI_Abort.
    end_job(_WORLD, f"\n[rank {_WORLD.rank}] {report.nodeid} failed ({report.when}); aborting the MPI job\n"
                    f"{report.longreprtext}\n")


@pytest.fixture
def empty_tables():
    """spmdsim's bounded tables of decided calls emptied before the test (tests/bounded_tables.py): one that
    the earlier tests of this process filled to the brim could start over between the test's first call and
    the repeat it checks, which would then decide again."""
    import bounded_tables

    bounded_tables.empty()
    yield


@pytest.fixture
def course(tmp_path, monkeypatch):
    """The instructor's one exercise (double, at 1 and 2 ranks: test_lab_cli.TINY) in course/, named relative to
    the working directory, which is `tmp_path` (returned): the lab's tests of an instructor's own exercise."""
    from test_lab_cli import TINY

    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "01_double.py").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    return tmp_path
