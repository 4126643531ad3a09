"""Floating-point Reduce, Allreduce, Scan, Exscan and Reduce_scatter on simulated ranks give MPICH 5's bits
(spmdsim.runtime.sim.orders), and the lowercase reduce, allreduce, scan and exscan mpi4py's values, compared with
``mpiexec`` at 3, 4, 5, 6 and 8 ranks; and mpi4py's cpi demo prints MPICH's digits at 4 ranks."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpi4py_orders
from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.runtime.sim import simulate
from spmdsim.runtime.sim.orders import allreduce_tree, reduce_tree, scan_trees
from spmdsim.tools.cli.main import main
from testkit import MPICH, MPICH_WAIT_ASLEEP

HERE = Path(__file__).resolve().parent


def test_trees():
    assert reduce_tree(5) == (((0, 1), (2, 3)), 4) and allreduce_tree(5) == (((0, 1), 2), (3, 4))
    assert reduce_tree(3, root=2) == ((2, 0), 1) and allreduce_tree(8) == reduce_tree(8)
    assert scan_trees(4) == (0, (0, 1), ((0, 1), 2), ((0, 1), (2, 3)))
    assert scan_trees(5, exclusive=True) == (None, 0, (0, 1), ((0, 1), 2), ((0, 1), (2, 3)))


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
@pytest.mark.parametrize("n", [3, 4, 5, 6, 8])
def test_same_bits_as_mpich(n, tmp_path):
    out = tmp_path / "mpich.json"
    run = subprocess.run(["timeout", "-k", "5", "120", MPICH, "-n", str(n), sys.executable,
                          str(HERE / "mpi4py_orders.py"), str(out)], capture_output=True, text=True,
                         env=dict(os.environ, **MPICH_WAIT_ASLEEP))
    assert run.returncode == 0, run.stderr[-2000:]
    with swapped():
        ours = simulate(n, mpi4py_orders.results)
    gathered = json.loads(out.read_text())
    mpich = gathered[0][0]
    assert ours[0][0] == mpich
    assert [r[1] for r in ours] == [g[1] for g in gathered]  # every rank's object reductions
    assert [r[2] for r in ours] == [g[2] for g in gathered]  # every rank's Scan and Exscan
    assert [r[3] for r in ours] == [g[3] for g in gathered]  # and its Reduce_scatter blocks
    assert [r[4] for r in ours] == [g[4] for g in gathered]  # and Reduce to rank 0 and the last rank
    if n >= 4:  # adding in rank order gives other bits: the test sees the association
        xs = []
        for r in range(n):
            rng = np.random.default_rng(1234 + r)
            xs.append(rng.standard_normal(64) * 10.0 ** rng.integers(-8, 8, 64))
        in_rank_order = xs[0].copy()
        for x in xs[1:]:
            in_rank_order += x
        assert in_rank_order.tobytes().hex() != mpich[0]
        assert gathered[0][1][5] != int("".join(str(r + 1) for r in range(n)))  # not folded left to right


def test_cpi_prints_mpichs_digits(capsys, monkeypatch):
    """examples/mpi4py/cpi.py at 4 ranks under `spmdsim mpirun`, run in this process: MPICH prints
    3.1415926535981167 (rank order would give ...171)."""
    monkeypatch.setattr("sys.stdin", io.StringIO("100000\n0\n"))
    assert main(["mpirun", "-n", "4", sys.executable, str(HERE.parent / "examples" / "mpi4py" / "cpi.py")]) == 0
    out = capsys.readouterr().out
    assert "pi is approximately 3.1415926535981167, error is 0.0000000000083236" in out, out
