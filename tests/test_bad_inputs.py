"""The bad-input matrix: each case under `mpiexec -n 8` ends with one line on every rank's behalf.

Each case launches ``timeout -k 2 30 mpiexec -n 8 ...`` (the CLI, or a
`python -c` snippet that uses the library behind the documented guard
one-liner) and asserts: exit code 2 (every rank raised the same error within
the guard's grace; one rank alone would abort with 1), before the 30 s
timeout (a hang exits 124; the seconds are printed, not asserted: a loaded
2-core machine takes 1-12 s to start 8 Pythons), exactly
one ``spmdsim: error: ...`` line naming the offending value, no traceback.
docs/reliability.md lists the messages and times.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from testkit import MPIEXEC as _MPIEXEC

RANKS = 8

pytestmark = pytest.mark.skipif(not _MPIEXEC, reason="no mpiexec")

# The guard one-liner (docs/reliability.md) and a mesh over every rank.
_PRELUDE = """\
from spmdsim.runtime import install_excepthook; install_excepthook()
import numpy as np
from spmdsim import Layout, SeededTensor
from spmdsim.runtime import Mesh, DTensor
from spmdsim.ops import embedding, matmul
mesh = Mesh(Layout((8,), ("mp",)))
"""

_MM = ["run", "matmul", "--shape", "16,16,16"]
_DM = ["--device-matrix", "2,4", "--alias-name", "dp,mp"]

#: case id -> (argv after `python`, text the error line must contain)
CASES = {
    "cli-unknown-alias": (_MM + _DM + ["--x-map", "dp,zz", "--w-map", "mp,None"], "'zz'"),
    "lib-unknown-alias": ('mesh.layout("mp", "sp")', "'sp'"),
    "cli-axis-twice": (_MM + _DM + ["--x-map", "dp,dp", "--w-map", "mp,None"], "'dp' is used more"),
    "cli-map-length": (_MM + _DM + ["--x-map", "dp", "--w-map", "mp,None"], '("dp",)'),
    "cli-indivisible": (["run", "matmul", "--shape", "16,10,16"] + _DM
                        + ["--x-map", "dp,mp", "--w-map", "mp,None"], "size 10"),
    "cli-world-size": (["run", "matmul", "--shape", "16,16,16", "--device-matrix", "2,2",
                        "--alias-name", "dp,mp", "--x-map", "dp,mp", "--w-map", "mp,None"],
                       "(2, 2)"),
    "lib-world-size": ('Mesh(Layout((3,), ("x",)))', "(3,)"),
    "cli-strategy-divides": (_MM + ["--strategy", "((3,1),(1,1))"], "((3, 1), (1, 1))"),
    "cli-contraction": (_MM + _DM + ["--x-map", "dp,mp", "--w-map", "None,mp"],
                        'over "mp" in x'),
    "lib-contraction": ('x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, 16)))\n'
                        'w = DTensor.from_seeded(mesh, mesh.layout(None, None), SeededTensor((16, 4)))\n'
                        "matmul(x, w)", 'over "mp" in x'),
    "lib-embedding-range": ('ids = DTensor.from_local(mesh, np.array([[1, 70]]), mesh.layout(None, None), (1, 2))\n'
                            'table = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((64, 4)))\n'
                            "embedding(ids, table)", "id 70"),
    "lib-embedding-float": ('ids = DTensor.from_local(mesh, np.array([[1.0, 7.0]]), mesh.layout(None, None), (1, 2))\n'
                            'table = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((64, 4)))\n'
                            "embedding(ids, table)", "'float64'"),
    "lib-local-shape": ('DTensor.from_local(mesh, np.zeros((3, 4)), mesh.layout("mp", None), (16, 4))',
                        "(3, 4)"),
    "lib-local-dtype": ('DTensor.from_local(mesh, np.zeros((2, 4)), mesh.layout("mp", None), (16, 4), '
                        'dtype="float32")', "'float64'"),
    "lib-nan-given": ("src = SeededTensor((16, 8), seed=1); full = src.full(); full[5, 3] = np.nan\n"
                      'x = DTensor.from_global(mesh, full, mesh.layout("mp", None))\n'
                      "x.check(src).raise_if_failed()", "1 non-finite"),
    "lib-inf-produced": ("xs = SeededTensor((8, 16), seed=1, low=1e20, high=2e20)\n"
                         "ws = SeededTensor((16, 8), seed=2, low=1e20, high=2e20)\n"
                         'x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), xs)\n'
                         'w = DTensor.from_seeded(mesh, mesh.layout("mp", None), ws)\n'
                         "y = matmul(x, w)\n"
                         "y.check(xs.full().astype(np.float64) @ ws.full().astype(np.float64))"
                         ".raise_if_failed()", "64 non-finite"),
    # 1.5 used to pass gather's range check and hang the job.
    "lib-gather-root": ('x = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((16, 4)))\n'
                        "x.gather(root=1.5)", "gather root 1.5"),
    "lib-object-dtype": ('DTensor.from_global(mesh, np.zeros((16, 4), object), mesh.layout("mp", None))',
                         "'|O' (object)"),
    "lib-matmul-ndarray": ('x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, 16)))\n'
                           "matmul(x, np.ones((16, 4)))", "got ndarray of shape (16, 4)"),
    "cli-bad-strategy": (_MM + ["--strategy", "((2,1),(1,4)"], "'((2,1),(1,4)'"),
    "cli-bad-sbp": (["run", "redistribute", "--device-matrix", "2,4", "--alias", "a,b",
                     "--from-sbp", "S(x),B", "--to", "None,b", "--shape", "8,8"], "'S(x)'"),
}


def launch(argv: list[str], limit: float = 30.0, ranks: int = RANKS,
           env: dict | None = None) -> tuple[int, str, float]:
    """Run `python argv...` on `ranks` ranks under timeout; (rc, stdout+stderr, seconds)."""
    full_env = dict(os.environ, SPMDSIM_EXPECT_WORLD=str(ranks), OMP_NUM_THREADS="1",
                    OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    full_env.update(env or {})
    cmd = ["timeout", "-k", "2", str(int(limit)), _MPIEXEC, "-n", str(ranks), sys.executable, *argv]
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=full_env)
    return proc.returncode, proc.stdout, time.perf_counter() - start


def _argv(spec: object) -> list[str]:
    if isinstance(spec, str):
        return ["-c", _PRELUDE + spec]
    return ["-m", "spmdsim", *spec]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_ends_the_job_with_one_line(case: str) -> None:
    spec, needle = CASES[case]
    rc, out, seconds = launch(_argv(spec))
    errors = [line for line in out.splitlines() if line.startswith("spmdsim: error")]
    print(f"\n{case}: rc={rc} {seconds:.2f} s {errors[0] if errors else out[-400:]!r}")
    assert "Traceback" not in out, out
    assert rc == 2, (rc, out)  # 2: a clean error raised on every rank (the guard's exit code)
    assert len(errors) == 1 and errors[0].startswith("spmdsim: error: "), out
    assert needle in errors[0], (needle, errors[0])
