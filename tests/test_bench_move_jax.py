"""scripts/bench_move_jax.py: the simulated move beside JAX's and numpy's one copy, in one run.

One tiny launch: the moved blocks are checked against numpy before timing (a wrong move stops the run), every
contender prints a time and its ratio to spmdsim's, and JAX is either timed or named in one line. A bad shape
is refused in one line. Values only, never timings.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

_BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_move_jax.py"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(_BENCH), *argv], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_one_tiny_launch_prints_every_contender_beside_spmdsim():
    done = _run("--launches", "2", "--repeat", "2", "--shape", "64x32")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    try:
        import jax  # noqa: F401
        jax_timed = True
    except ImportError:
        jax_timed = False
        assert lines.pop(0).startswith("JAX is not installed (pip install -e '.[bench]')"), lines
    assert lines[0] == "move (S(0),S(1)) -> (S(1),S(0)) of a 64x32 float32 on a 2x4 mesh"
    names = ["spmdsim", "spmdsim again (A/A)", "numpy, one copy"] + (["JAX"] if jax_timed else [])
    assert re.split(r"\s{2,}", lines[2].strip()) == ["launch load", *names], lines[2]
    cell = r"\s+\d+\.\d{3} \(\s*(\d+\.\d\d)x\)"
    for launch, line in zip((1, 2), lines[3:5]):
        match = re.fullmatch(rf"{launch}\s+\d+\.\d" + cell * len(names), line)
        assert match and match.group(1) == "1.00", line  # spmdsim's ratio to itself
    assert re.fullmatch(r"median" + r"\s+\d+\.\d\dx" * len(names), lines[5]), lines[5]
    assert lines[5].split()[1] == "1.00x"


def test_a_bad_shape_is_refused_in_one_line():
    done = _run("--shape", "100x64")
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "'100x64'" in errors[0] and "multiples of 8" in errors[0], done.stderr
