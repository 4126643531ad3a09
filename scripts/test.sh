#!/usr/bin/env bash
# Runs every test: the pure tests in one process, then the MPI tests under
# mpiexec on 8 and on 4 ranks (oversubscribed on small machines). Each mpiexec
# runs under a timeout so a hang fails the run instead of stalling it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONDONTWRITEBYTECODE=1
# One BLAS thread per rank: ranks already outnumber the cores (docs/oversubscription.md).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest -q -p no:cacheprovider "$@"
for ranks in 8 4; do
    echo "== MPI tests on $ranks ranks"
    SPMDSIM_EXPECT_WORLD=$ranks timeout -k 10 420 \
        mpiexec -n "$ranks" python -m mpi4py -m pytest -q -p no:cacheprovider --only-mpi "$@"
done
