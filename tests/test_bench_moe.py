"""scripts/bench_moe.py: an MoE layer's dispatch + combine on 8 MPI ranks beside raw mpi4py.

One launch at a tiny size: spmdsim's rows after the dispatch and the combine
equal raw mpi4py's on the same counts, the trace counts the bytes the buffers
give, and the ratios beside the A/A control and the load are printed. Values
only, never timings.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from types import SimpleNamespace

import pytest

from spmdsim.models.moe import MoEConfig, dispatch_rows, route
from testkit import MPIEXEC, load_script

_BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_moe.py"
_RATIO = r"\s+(\d+\.\d{3})x raw \((\d+\.\d\d)-(\d+\.\d\d)\)$"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(_BENCH), *argv], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_one_tiny_launch_prints_its_ratios_and_agrees_with_raw_mpi4py():
    tokens, sequences, d = 8, 2, 4
    done = _run("--launches", "1", "--rounds", "2", "--tokens", str(tokens), "--sequences", str(sequences),
                "--d-model", str(d))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert re.match(r"load average at the start \d+\.\d\d \d+\.\d\d \d+\.\d\d ", lines[1]), lines[1]
    assert re.match(r"load average at the end \d+\.\d\d \d+\.\d\d \d+\.\d\d$", lines[-1]), lines[-1]
    # dropless: every rank sends its 16 tokens x 2 choices of 4 float64 and gets them back (the trace counts
    # what leaves the rank: all but the rows its routing gives its own expert); with a capacity of
    # ceil(2 x 8 x 1.25 / 8) = 3 slots, every rank sends its (2, 8, 3, 4) slots, 7/8 of them leaving it, each way
    send = {"dropless": 8 * sequences * tokens * 2 * d * 8, "capacity": 8 * sequences * 8 * 3 * d * 8}
    bench = load_script(_BENCH, "spmdsim_bench_moe")
    args = SimpleNamespace(seed=0, sequences=sequences, tokens=tokens, experts=8)
    capacity = MoEConfig(experts=8, top_k=2, dropless=True).capacity(tokens)  # as the bench routes
    own = sum(int(dispatch_rows(route(bench._probs(args, r), 2, capacity), True, 8)[2][r]) for r in range(8))
    assert 0 < own < 8 * sequences * tokens * 2  # some rows stay home, not all
    traced = {"dropless": 2 * (send["dropless"] - own * d * 8), "capacity": 2 * send["capacity"] * 7 // 8}
    for mode, kind in (("dropless", "Alltoallv"), ("capacity", "Alltoall")):
        at = lines.index(next(line for line in lines if line.startswith(f"{mode} ({kind}): ")))
        assert lines[at].endswith(f"send buffers {send[mode]:,} B all ranks"), lines[at]
        assert lines[at + 1] == (f"  rows after dispatch and combine equal to raw's; traced bytes "
                                 f"{traced[mode]:,} (as expected)")
        assert re.match(r"  raw mpi4py\s+\d+\.\d{3} ms$", lines[at + 2]), lines[at + 2]
        for row, label in ((3, "raw again \\(A/A control\\)"), (4, "spmdsim dispatch \\+ combine")):
            found = re.match(f"  {label}{_RATIO}", lines[at + row])
            assert found, lines[at + row]
            ratio, low, high = (float(v) for v in found.groups())
            assert ratio > 0 and low <= high  # one launch: its spread is the ratio itself
            # its spread is printed to 2 decimals from the unrounded ratio, the ratio itself to 3
            assert low == high and abs(low - ratio) <= 0.0051
        # the ranks' CPU: raw's, then each way's against it
        assert re.match(r"  CPU of the 8 ranks, raw\s+\d+\.\d{3} ms$", lines[at + 5]), lines[at + 5]
        for row, label in ((6, "raw again \\(A/A control\\)"), (7, "spmdsim dispatch \\+ combine")):
            found = re.match(f"  {label}{_RATIO.replace(' raw ', ' raw.s CPU ')}", lines[at + row])
            assert found, (_RATIO, lines[at + row])
            ratio, low, high = (float(v) for v in found.groups())
            assert ratio > 0 and low == high and abs(low - ratio) <= 0.0051


def test_bad_sizes_are_refused_in_one_line():
    done = _run("--experts", "12")
    assert done.returncode == 2 and "--experts 12 must be a multiple of the 8 ep ranks" in done.stderr
    done = _run("--rounds", "0")
    assert done.returncode == 2 and "--rounds 0 must be at least 1" in done.stderr
