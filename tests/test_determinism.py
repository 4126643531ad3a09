"""Determinism: seeded shards for any device matrix, results run to run and across rank counts.

* Pure: a SeededTensor's shard under any layout (1 to 16 devices, every
  factorization, every map) is bit-identical to the same slice of the global
  tensor, so a rank makes the same values whatever the world size.
* The same job launched twice under `mpiexec -n 4` (serial test, each launch
  under timeout) gives bit-identical results run to run (tests/mpi/test_determinism.py
  repeats jobs within one run at 8 and 4 ranks).
* The same job on 1, 2, 4 and 8 simulated ranks, and the MPI runs, agree
  within the documented tolerance (docs/explanation/reliability.md): the contraction is
  split differently, so the summation order, and with it the last bits, differ.
  Which ranks sum in which order is spmdsim's split, the same on either engine;
  simulated ranks show it without starting 15 more Pythons.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from spmdsim import Layout, SeededTensor
from testkit import MPIEXEC as _MPIEXEC
from testkit import factorizations as _factorizations


def _layouts(n: int):
    for parts in (1, 2, 3):
        for matrix in _factorizations(n, parts):
            names = tuple("abc"[:parts])
            layout = Layout(matrix, names)
            # Each axis on dim 0, dim 1 or unused, in every order within a dim.
            for where in itertools.product((0, 1, None), repeat=parts):
                dims = [[a for a, w in zip(names, where) if w == d] for d in (0, 1)]
                for d0 in itertools.permutations(dims[0]):
                    for d1 in itertools.permutations(dims[1]):
                        yield layout(d0, d1)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_seeded_shards_are_bit_identical_for_any_device_matrix(dtype: str) -> None:
    src = SeededTensor((24, 48), dtype, seed=11, low=-5, high=5)
    full = src.full()
    checked = 0
    for n in (1, 2, 3, 4, 6, 8, 12, 16):
        for tl in itertools.islice(_layouts(n), 0, None, 4 if n > 4 else 1):
            try:
                tl.check_shape(src.shape)
            except ValueError:
                continue
            for rank in range(n):
                region = tl.slices(rank, src.shape)
                shard = src.region(region)
                assert shard.dtype == full.dtype
                assert shard.tobytes() == np.ascontiguousarray(full[region]).tobytes(), (str(tl), rank)
                checked += 1
    assert checked > 1000


def test_seed_changes_values_and_same_seed_repeats() -> None:
    a, b = SeededTensor((64,), seed=1).full(), SeededTensor((64,), seed=2).full()
    assert not np.array_equal(a, b)
    assert SeededTensor((64,), seed=1).full().tobytes() == a.tobytes()


# -- under mpiexec, and on simulated ranks --------------------------------------------
_JOB = """\
from spmdsim.runtime import install_excepthook; install_excepthook()
import numpy as np
from spmdsim import Layout, SeededTensor, world
from spmdsim.runtime import Mesh, DTensor
from spmdsim.nn.ops import ParallelMLP, matmul
comm = world()
mesh = Mesh(Layout((comm.size,), ("mp",)))
xs, ws = SeededTensor((8, 48), "float32", 3), SeededTensor((48, 24), "float32", 4)
x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), xs)
w = DTensor.from_seeded(mesh, mesh.layout("mp", None), ws)
y = matmul(x, w).gather()
hs = SeededTensor((6, 24), "float32", 5)
h = DTensor.from_seeded(mesh, mesh.layout(None, None), hs)
z = ParallelMLP(mesh, 24, 48, seed=6)(h).gather()
if comm.rank == 0:
    np.savez(OUT, matmul=y, mlp=z)
"""

#: |a - b| <= ATOL + RTOL * |b| between rank counts (float32, K = 48 products of values in [-1, 1)).
RTOL, ATOL = 1e-4, 48 * float(np.finfo(np.float32).eps)


def _load(out: str) -> dict:
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def _run(ranks: int, out: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               SPMDSIM_EXPECT_WORLD=str(ranks))
    proc = subprocess.run(["timeout", "-k", "2", "60", _MPIEXEC, "-n", str(ranks), sys.executable,
                           "-c", "import sys; OUT = sys.argv[1]\n" + _JOB, out],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.returncode == 0, proc.stdout
    return _load(out)


def _job_on_a_rank(out: str) -> None:
    exec(_JOB, {"OUT": out})  # a namespace of its own on each simulated rank


def _simulated(ranks: int, out: str) -> dict:
    from spmdsim import simulate

    simulate(ranks, _job_on_a_rank, out)
    return _load(out)


@pytest.mark.skipif(not _MPIEXEC, reason="no mpiexec")
def test_same_job_is_bit_identical_run_to_run_and_close_across_rank_counts(tmp_path) -> None:
    mpi, again = _run(4, str(tmp_path / "mpi4.npz")), _run(4, str(tmp_path / "mpi4b.npz"))
    runs = {n: _simulated(n, str(tmp_path / f"sim{n}.npz")) for n in (1, 2, 4, 8)}
    for key in ("matmul", "mlp"):
        assert again[key].tobytes() == mpi[key].tobytes(), key
        ref = runs[1][key]
        for n, run in [*runs.items(), ("mpi 4", mpi)]:
            got = run[key]
            assert got.shape == ref.shape and got.dtype == np.float32
            assert np.all(np.abs(got - ref) <= ATOL + RTOL * np.abs(ref)), (key, n)
