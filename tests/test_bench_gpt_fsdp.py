"""scripts/bench_gpt.py --fsdp: spmdsim's fully sharded GPT step, replayed and eager, beside the same step by hand.

One launch of each at a tiny size (2 layers, d_model 16, seq 8, dp 8): every row and the ratio line are printed,
the hand-written step's loss at step 0 is spmdsim's (eager and replayed) and the one process's, its gradients and
updated shards the one process's, and both sides make the same collectives a step. Values only, never timings.
The refusals are one line each.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from docs_commands import run_here
from testkit import MPIEXEC, bench_launches, load_script

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
_SMALL = ["--layers", "2", "--d-model", "16", "--seq", "8"]


def _value(line: str, after: str) -> float:
    return float(line.split(after, 1)[1].split()[0].rstrip(",x"))


@pytest.fixture
def case(monkeypatch):
    """(bench_gpt, _bench_gpt_fsdp), the second the module bench_gpt's --fsdp dispatch imports."""
    monkeypatch.syspath_prepend(str(_SCRIPTS))
    monkeypatch.delitem(sys.modules, "_bench_gpt_fsdp", raising=False)
    import _bench_gpt_fsdp

    return load_script(_SCRIPTS / "bench_gpt.py", "spmdsim_script_bench_gpt"), _bench_gpt_fsdp


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_one_launch_prints_every_row_and_the_ratio_and_agrees_on_the_values(case, monkeypatch, capsys, tmp_path):
    """Each launch is the case's own command (its _command), its result parsed as the case parses it, the 8-rank
    launches run as programs of one mpiexec job; the A/A control ("fhand2") reuses the checked launch of the same
    command (only --check differs)."""
    bench, fsdp = case
    args = argparse.Namespace(steps=1, layers=2, d_model=16, seq=8)
    results = bench_launches(fsdp, args, [("fhand", 1), ("fsdpreplay", 0), ("fsdp", 0)], tmp_path)
    again, first = fsdp._command(args, "fhand2", 0)[0], fsdp._command(args, "fhand", 1)[0]
    at = again.index("--check") + 1
    assert again[:at] + again[at + 1:] == first[:at] + first[at + 1:]
    results["fhand2"] = results["fhand"]
    launched = []
    monkeypatch.setattr(fsdp, "_launch", lambda args, worker, check=0: launched.append((worker, check)) or
                        results[worker])
    monkeypatch.setattr(sys, "argv", ["bench_gpt.py", "--fsdp", "--launches", "1", "--steps", "1", *_SMALL])
    assert bench.main() == 0
    assert launched == [("fhand", 1), ("fsdpreplay", 0), ("fsdp", 0), ("fhand2", 0)], launched
    printed = capsys.readouterr()
    assert printed.err == "", printed.err
    lines = printed.out.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert lines[0].startswith("GPT 2 layers, d_model 16, seq 8, batch 8; fully sharded over dp 8 (tp 1), ")
    rows = [line.split("  ")[1] for line in lines if line.startswith("  ") and not line.startswith("    ")]
    assert rows == ["numpy + mpi4py by hand", "the same again (A/A control)", "spmdsim, replayed", "spmdsim"]
    [ratio] = [line for line in lines if line.startswith("collectives, spmdsim replayed / by hand: ")]
    mine = _value(ratio, "by hand: ")
    replayed = next(line for line in lines if line.startswith("  spmdsim, replayed"))
    collectives = lines[lines.index(replayed) + 1]
    assert collectives.split("  ")[2].strip() == "its collectives"
    assert collectives.split("x by hand")[0].split()[-1] == f"{mine:.2f}", (collectives, ratio)
    assert ratio.endswith(("within 1.05x", "OVER 1.05x")) and ", A/A control " in ratio, ratio
    # per step at 2 layers, one flat call per unit (spmdsim.nn.fsdp_flat): the root's gather, each layer's twice;
    # each layer's and the root's Reduce_scatter; the loss's one Allreduce
    [calls] = [line for line in lines if line.startswith("collectives a step, each rank: ")]
    assert calls == ("collectives a step, each rank: spmdsim 9 (5 Allgather, 3 Reduce_scatter; replayed 9), "
                     "by hand 9 (equal)")
    [loss] = [line for line in lines if line.startswith("step 0 loss: spmdsim ")]
    assert _value(loss, "|diff| ") <= 1e-10, loss
    [one] = [line for line in lines if line.startswith("step 0 loss: one numpy process ")]
    assert _value(one, "process ") == pytest.approx(_value(loss, "by hand "), abs=1e-10, rel=0)
    [grads] = [line for line in lines if line.startswith("by hand, after step 0: gradients within ")]
    # AdamW's first step divides by sqrt(v) + eps: a gradient entry near 0 turns rounding into 1e-12 of a shard
    assert _value(grads, "gradients within ") <= 1e-12 and _value(grads, "shards within ") <= 1e-9, grads


_ROW = dict(step=0.1, collectives=0.05, waited=0.01, arrived=0.04, cpu=0.2, calls=99, loss0=4.5, losses=[4.5],
            reference=[4.5], grad_error=1e-16, param_error=1e-15, kinds={"allgather": 64, "reduce_scatter": 34})


def test_differing_collectives_or_losses_exit_1_and_the_refusals_are_one_line(case, monkeypatch, capsys):
    bench, fsdp = case
    args = argparse.Namespace(launches=1, steps=1, layers=2, d_model=16, seq=8, moe=False, pipeline=False)
    monkeypatch.setattr(fsdp.bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(fsdp, "_launch", lambda args, worker, check=0: dict(_ROW, calls=98 if worker == "fsdp"
                                                                                  else 99))
    assert fsdp.fsdp_case(args) == 1
    assert capsys.readouterr().err == "bench_gpt --fsdp: the collectives a step differ\n"
    monkeypatch.setattr(fsdp, "_launch", lambda args, worker, check=0: dict(_ROW, loss0=4.6))
    assert fsdp.fsdp_case(args) == 1
    assert capsys.readouterr().err == "bench_gpt --fsdp: step 0's losses differ by 1.0e-01\n"
    monkeypatch.setattr(fsdp, "_launch", lambda args, worker, check=0: dict(
        _ROW, collectives=0.06 if worker == "fsdpreplay" else 0.05))
    assert fsdp.fsdp_case(args) == 0
    assert "collectives, spmdsim replayed / by hand: 1.20x (1.20-1.20), A/A control 1.00x (1.00-1.00); OVER 1.05x" \
        in capsys.readouterr().out
    monkeypatch.setattr(fsdp.bench, "_mpiexec", lambda: "")
    assert fsdp.fsdp_case(args) == 1
    assert capsys.readouterr().err.startswith("bench_gpt --fsdp: no mpiexec beside python or on PATH")
    code, _, err = run_here("scripts/bench_gpt.py", ["--fsdp", "--moe"])  # refused before any launch: in process
    assert code == 2 and err == "bench_gpt: --fsdp, --moe and --pipeline are separate cases: give one\n", err


PEER_REFUSALS = [
    (["--tp", "2"], "peer_mpi4py_fsdp: --tp 2: this peer shards over dp alone (tp 1)"),
    (["--dp", "3"], "peer_mpi4py_fsdp: parameter 'wte' dim 0 of size 128 is not divisible by --dp 3"),
    (["--dp", "2"], "peer_mpi4py_fsdp: --dp 2 is 2 ranks; mpiexec started 1"),
    (["--steps", "0"], "peer_mpi4py_fsdp.py: error: --steps 0 must be at least 1"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> list:
    """`python scripts/peer_mpi4py_fsdp.py ARGV` for each of PEER_REFUSALS, run in turn by one interpreter where
    they can be (testkit.run_scripts)."""
    from testkit import run_scripts

    return run_scripts([(_SCRIPTS / "peer_mpi4py_fsdp.py", argv) for argv, _ in PEER_REFUSALS],
                       tmp_path_factory.mktemp("refused"))


@pytest.mark.parametrize("index", range(len(PEER_REFUSALS)))
def test_the_fsdp_peer_refuses_a_bad_value_in_one_line(index, refused):
    needle, done = PEER_REFUSALS[index][1], refused[index]
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == needle, done.stderr
