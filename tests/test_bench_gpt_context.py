"""scripts/bench_gpt.py --context (scripts/_bench_gpt_context.py): ring attention's messages, spmdsim's against raw
mpi4py.

One launch (a 2-layer GPT of d_model 32, seq 16 on 4 MPI ranks, cp 4): the real step's point-to-point rows are
the planned ring groups, group by group, and the door's and the replayed calls' rows are the same; the case
prints each way's ratio line beside the A/A control. Values only, never timings. Without mpiexec the case is
one line; rows that differ make it exit 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from testkit import MPIEXEC, bench_launches, load_script

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
_SMALL = ["--layers", "2", "--d-model", "32", "--seq", "16"]


@pytest.fixture
def case(monkeypatch):
    monkeypatch.syspath_prepend(str(_SCRIPTS))
    module = load_script(_SCRIPTS / "_bench_gpt_context.py", "spmdsim_script_bench_gpt_context")
    monkeypatch.setitem(sys.modules, "_bench_gpt_context", module)  # the module bench_gpt.py dispatches to
    return module


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(_SCRIPTS))
    return load_script(_SCRIPTS / "bench_gpt.py", "spmdsim_script_bench_gpt")


def _args(**kw):
    return argparse.Namespace(**{**dict(launches=1, steps=1, layers=2, d_model=32, seq=16), **kw})


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_one_launch_checks_the_rings_rows_and_prints_its_ratios(case, bench, monkeypatch, capsys, tmp_path):
    results = bench_launches(case, _args(), [("ring", 0)], tmp_path)
    monkeypatch.setattr(case, "_launch", lambda args: results["ring"])
    monkeypatch.setattr(sys, "argv", ["bench_gpt.py", "--context", "--launches", "1", *_SMALL])
    assert bench.main() == 0
    printed = capsys.readouterr()
    assert printed.err == "", printed.err
    lines = printed.out.splitlines()
    assert max(len(line) for line in lines) <= 100
    for row, versus in (("  raw again (A/A control)", "the first"), ("  spmdsim runtime.door.point_to_point", "raw"),
                        ("  spmdsim, the door's calls replayed", "raw"), ("  raw mpi4py Send_init/Recv_init", "raw")):
        [line] = [line for line in lines if line.startswith(row)]
        seconds, ratio = line[40:].split()[:2]
        assert float(seconds) > 0 and float(ratio.rstrip("x")) > 0 and line.split("x ", 1)[1].startswith(versus)
    # cp 4, 2 layers: a rank's forward ring 3 groups a layer (K and V on), its backward ring 5 (K and V on at
    # steps 0-2, their gradients one step behind from step 1, home at step 4); blocks of (16 / 4) x 8 x 32 float64
    block = 16 // 4 * 8 * 32 * 8
    assert f"ring groups a step, all ranks: spmdsim's step {4 * 2 * 8}, planned {4 * 2 * 8} (160 messages), " \
        "timed alike (equal)" in lines
    assert f"ring bytes a step, all ranks: spmdsim's step {4 * 2 * 20 * block}, planned {4 * 2 * 20 * block} " \
        "(equal)" in lines


def test_the_ring_groups_pair_up_and_follow_the_program(case):
    from spmdsim.programs.context.ring import TAGS

    cfg = case.context_config(_args(layers=2, seq=16))
    plans = [case.ring_groups(cfg, 4, rank) for rank in range(4)]
    assert [len(plan) for plan in plans] == [2 * 3 + 2 * 5] * 4
    block = 16 // 4 * 8 * 32 * 8
    # each rank sends to the next and receives from the previous, K and V first, their gradients after
    k, v = TAGS["k"], TAGS["v"]
    assert plans[1][0] == ([(block, 0, k), (block, 0, v)], [(block, 2, k), (block, 2, v)])
    assert [len(s) for _, s in plans[0][6:11]] == [2, 4, 4, 2, 2]
    assert [t for *_, t in plans[0][7][1]] == [TAGS["k"], TAGS["v"], TAGS["dk"], TAGS["dv"]]
    # group by group, every send is its peer's receive of the same bytes and tag
    for i in range(len(plans[0])):
        sent = sorted((rank, peer, tag, n) for rank, plan in enumerate(plans) for n, peer, tag in plan[i][1])
        got = sorted((peer, rank, tag, n) for rank, plan in enumerate(plans) for n, peer, tag in plan[i][0])
        assert sent == got, i
    assert case._rows(plans[0][:1]) == [("sendrecv", 2 * block, 2 * block)]


def test_without_mpiexec_or_with_a_sequence_the_split_cannot_take_it_is_one_line(case, capsys, monkeypatch):
    monkeypatch.setattr(case.bench, "_mpiexec", lambda: "")
    assert case.context_case(_args()) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench_gpt --context: no mpiexec beside python or on PATH")
    monkeypatch.setattr(case.bench, "_mpiexec", lambda: "mpiexec")
    assert case.context_case(_args(seq=20)) == 1
    assert capsys.readouterr().err == ("bench_gpt --context: --seq 20 must be a multiple of 8 (the balanced causal "
                                       "split over cp 4)\n")


_RUN = {"raw": 0.01, "door": 0.011, "raw2": 0.01, "replayed": 0.0102, "rawbound": 0.0099, "door_ratio": 1.1,
        "raw2_ratio": 1.0, "replayed_ratio": 1.02, "rawbound_ratio": 0.99, "step_groups": 64, "step_bytes": 8,
        "groups": 64, "bytes": 8, "messages": 160, "same": True, "wait": "polite", "rounds": 30}


@pytest.mark.parametrize("same, code", [(True, 0), (False, 1)])
def test_the_ratios_are_printed_and_rows_that_differ_exit_1(case, monkeypatch, capsys, same, code):
    monkeypatch.setattr(case.bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(case, "_launch", lambda args: dict(_RUN, same=same))
    assert case.context_case(_args()) == code
    out = capsys.readouterr()
    assert "  spmdsim, the door's calls replayed      0.01020   1.02x raw (1.02-1.02)" in out.out
    assert "  raw again (A/A control)                 0.01000   1.00x the first (1.00-1.00)" in out.out
    assert ("the step's ring rows are not the planned groups" in out.err) == (not same)
