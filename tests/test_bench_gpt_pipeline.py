"""scripts/bench_gpt.py --pipeline: spmdsim's pipelined step beside the same 1F1B step by hand on mpi4py.

One launch of each (a 4-layer GPT of d_model 32 on 4 MPI ranks, one timed step;
--replay: spmdsim eager and replayed, and their CPU rows):
the hand-written step's loss at step 0 is spmdsim's and the one process's, its
gradients the one process's, and both sides and the messages-only replay send the
same point-to-point bytes in the same groups and messages, the counts a 1F1B step
over pp 4 must send (the door's calls captured and replayed write the rows the
door's calls write). Values only, never timings. Without mpiexec the case is one
line; bytes, groups, messages or losses that differ make it exit 1.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from docs_commands import run_here
from testkit import MPIEXEC, bench_launches, load_script

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
_SMALL = ["--layers", "4", "--d-model", "32", "--seq", "16"]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(_SCRIPTS))
    return load_script(_SCRIPTS / "bench_gpt.py", "spmdsim_script_bench_gpt")


def _value(line: str, after: str) -> float:
    return float(line.split(after, 1)[1].split()[0].rstrip(","))


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_one_launch_agrees_on_the_loss_and_the_bytes(bench, monkeypatch, capsys, tmp_path):
    """Each launch is the script's own command (its _command), its result parsed as the script parses it, the
    4-rank launches run as programs of one mpiexec job (testkit.batch_launches); the A/A control ("phand2")
    reuses the launch of the same command it repeats."""
    import argparse

    args = argparse.Namespace(steps=1, layers=4, d_model=32, seq=16, microbatches=8)
    workers = [(w, 0) for w in ("phand", "pipe", "pipereplay", "pmsg")]
    results = bench_launches(bench, args, workers, tmp_path)
    assert bench._command(args, "phand2") == bench._command(args, "phand")
    results["phand2"] = results["phand"]
    launched = []
    monkeypatch.setattr(bench, "_launch", lambda args, worker: launched.append(worker) or results[worker])
    monkeypatch.setattr(sys, "argv", ["bench_gpt.py", "--pipeline", "--replay", "--launches", "1", "--steps", "1",
                                      *_SMALL])
    assert bench.main() == 0
    assert launched == ["phand", "pipe", "pipereplay", "phand2", "pmsg"], launched
    printed = capsys.readouterr()
    done = argparse.Namespace(stdout=printed.out, stderr=printed.err)
    assert done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    for row in ("numpy + mpi4py by hand, 1F1B", "the same again (A/A control)",
                "spmdsim train_pipelined, 1F1B   ", "spmdsim train_pipelined, 1F1B, replayed",
                "  eager / replayed, the same rounds", "  numpy + mpi4py by hand", "  the same again (A/A control)",
                "  spmdsim eager", "  spmdsim replayed   ", "  eager / replayed, CPU",
                "  spmdsim replayed (the same rows)", "  by hand   ", "  by hand again (A/A control)",
                "  spmdsim (its send/recv trace rows)",
                "  raw mpi4py Irecv/Isend, the same wait", "  raw again (A/A control)",
                "  spmdsim runtime.door.point_to_point", "  raw mpi4py, Request.Waitall",
                "  spmdsim, the door's calls replayed", "  raw mpi4py Send_init/Recv_init"):
        assert sum(line.startswith(row) for line in lines) == 1, (row, done.stdout)
    [sent] = [line for line in lines if line.startswith("point-to-point bytes a step, all ranks: ")]
    ours, theirs, replayed = _value(sent, "spmdsim "), _value(sent, "by hand "), _value(sent, "replayed ")
    # 3 boundaries x 8 microbatches x (activation + gradient) of 16 x 1 x 32 float64, and the tied table's
    # gradient (128 x 32 float64) each way between the first and the last stage
    assert ours == theirs == replayed == 3 * 8 * 2 * 16 * 32 * 8 + 2 * 128 * 32 * 8, sent
    assert sent.endswith("(equal)")
    # 1F1B over pp 4, 8 microbatches: 11, 21, 19 and 9 groups on the stages, and the tied table's exchange
    # on the first and the last; 50 messages (48 across the boundaries and the table's two)
    [groups] = [line for line in lines if line.startswith("point-to-point groups a step, all ranks: ")]
    assert _value(groups, "spmdsim ") == _value(groups, "by hand ") == _value(groups, "replayed ") == 62, groups
    assert groups.endswith("(equal)")
    [messages] = [line for line in lines if line.startswith("point-to-point messages a step, all ranks: ")]
    assert _value(messages, "by hand ") == _value(messages, "replayed ") == 50, messages
    assert messages.endswith("(equal)")
    [loss] = [line for line in lines if line.startswith("step 0 loss: spmdsim ")]
    assert _value(loss, "|diff| ") <= 1e-10, loss
    assert _value(loss, "spmdsim ") == pytest.approx(_value(loss, "by hand "), abs=1e-10, rel=0)
    [one] = [line for line in lines if line.startswith("step 0 loss: one numpy process ")]
    assert _value(one, "process ") == pytest.approx(_value(loss, "by hand "), abs=1e-10, rel=0)
    [grads] = [line for line in lines if line.startswith("by hand, after step 0: gradients within ")]
    assert _value(grads, "within ") <= 1e-10, grads


def _args(bench, **kw):
    import argparse

    base = dict(launches=1, steps=1, layers=4, d_model=32, seq=16, microbatches=8, replay=False, simulated=False)
    return argparse.Namespace(**{**base, **kw})


def test_without_mpiexec_it_is_one_line(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_mpiexec", lambda: "")
    assert bench._pipeline(_args(bench)) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith("bench_gpt --pipeline: no mpiexec beside python or on PATH (pip install mpich)")


def test_simulated_adds_the_peer_and_the_replayed_step_on_simulated_ranks(bench, monkeypatch, capsys):
    """--simulated: each round also the peer under spmdsim mpirun -n 4 (blocking calls), spmdsim's replayed step
    on 4 simulated ranks and the peer there again (A/A), their rows printed; refused without --pipeline."""
    launched = []
    monkeypatch.setattr(bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(bench, "_launch", lambda args, worker: launched.append(worker) or dict(
        _REPLAY if worker == "pmsg" else _HAND, step=0.15 if worker == "psim" else 0.1))
    assert bench._pipeline(_args(bench, replay=True, simulated=True)) == 0
    assert launched == ["phand", "pipe", "pipereplay", "phand2", "psimhand", "psim", "psimhand2", "pmsg"]
    out = capsys.readouterr().out
    assert f"{'  spmdsim replayed on simulated ranks':40}    0.150   1.50x by hand (1.50-1.50)" in out
    assert f"{'  by hand on them again (A/A control)':40}    0.100   1.00x the first (1.00-1.00)" in out
    monkeypatch.undo()
    cmds = []
    monkeypatch.setattr(bench.subprocess, "run", lambda c, **kw: cmds.append(c) or subprocess.CompletedProcess(
        c, 0, "RESULT {}\n", ""))
    for worker in ("psimhand", "psim"):
        bench._launch(_args(bench, simulated=True), worker)
    hand, ours = cmds
    assert hand[4:9] == [sys.executable, "-m", "spmdsim", "mpirun", "-n"] and hand[9] == "4", hand
    assert hand[11].endswith("peer_mpi4py_pipeline.py") and hand[-2:] == ["--wait", "busy"], hand
    assert "mpiexec" not in " ".join(ours) and ours[ours.index("--worker") + 1] == "psim", ours
    monkeypatch.undo()  # subprocess.run again
    code, _, err = run_here("scripts/bench_gpt.py", ["--simulated"])  # refused before any launch: in process
    assert code == 2 and err.splitlines()[-1].endswith("error: --simulated applies to --pipeline and --moe only")


def test_replay_adds_a_replayed_launch_beside_the_eager_one(bench, monkeypatch, capsys):
    """--replay: a second spmdsim launch a round, the replayed one (worker pipereplay:
    train_pipelined(replay=True)), beside the eager one; without it none is made; the header, the replayed
    rows and eager / replayed (the same round's launches) say so; without --pipeline it is refused."""
    launched = []
    monkeypatch.setattr(bench, "_mpiexec", lambda: "mpiexec")
    for replay in (False, True):
        monkeypatch.setattr(bench, "_launch", lambda args, worker: launched.append(worker) or dict(
            _REPLAY if worker == "pmsg" else _HAND, step=0.2 if worker == "pipe" else 0.1,
            cpu=0.3 if worker == "pipe" else 0.25 if worker == "pipereplay" else 0.2))
        assert bench._pipeline(_args(bench, replay=replay)) == 0
        assert launched == ["phand", "pipe"] + ["pipereplay"] * replay + ["phand2", "pmsg"], (replay, launched)
        launched.clear()
        out = capsys.readouterr().out
        assert ("spmdsim train_pipelined, 1F1B, replayed" in out) == replay
    assert "8 microbatches\nspmdsim eager, then again with step 0 captured (spmdsim.runtime.replay), the timed " \
        "steps replayed\n" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "spmdsim train_pipelined, 1F1B, replayed     0.100   1.00x by hand" in out
    assert f"{'  eager / replayed, the same rounds':50}  2.00x replayed (2.00-2.00)" in out
    assert f"{'  spmdsim replayed':40}    0.250   1.25x by hand (1.25-1.25)" in out
    assert f"{'  eager / replayed, CPU':50}  1.20x replayed (1.20-1.20)" in out
    monkeypatch.undo()  # the real _launch, on a stand-in for subprocess.run
    cmd = []
    monkeypatch.setattr(bench.subprocess, "run", lambda c, **kw: cmd.append(c) or subprocess.CompletedProcess(
        c, 0, "RESULT {}\n", ""))
    bench._launch(_args(bench, replay=True), "pipereplay")
    assert cmd[0][cmd[0].index("--worker") + 1] == "pipereplay" and "--replay" not in cmd[0]
    monkeypatch.undo()  # subprocess.run again
    code, _, err = run_here("scripts/bench_gpt.py", ["--replay"])  # refused before any launch: in process
    assert code == 2 and err.splitlines()[-1].endswith("error: --replay applies to --pipeline only")


def test_message_groups_follow_the_schedule(bench):
    from _bench_gpt_pipeline import message_groups  # the case's module beside bench_gpt.py (on the path)
    from spmdsim.models.gpt import GPTConfig

    cfg = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8)
    plans = [message_groups(cfg, 4, 8, rank) for rank in range(4)]
    assert [len(plan) for plan in plans] == [12, 21, 19, 10]
    act, table = 16 * 32 * 8, 128 * 32 * 8
    assert plans[0][0] == ([], [(act, 1, 0)])  # F0's activation to stage 1, tagged by chunk 0
    assert plans[3][1] == ([(act, 2, 4)], [(act, 2, 7)])  # B0's gradient back, F1's activation in
    for rank, other in ((0, 3), (3, 0)):  # the tied table's gradient, each way, ends the step
        assert plans[rank][-1] == ([(table, other, 1 << 14)], [(table, other, 1 << 14)])
    # every send is one receive of the same bytes and tag on its peer
    sent = sorted((rank, peer, tag, n) for rank, plan in enumerate(plans) for _, sends in plan
                  for n, peer, tag in sends)
    got = sorted((peer, rank, tag, n) for rank, plan in enumerate(plans) for receives, _ in plan
                 for n, peer, tag in receives)
    assert sent == got and len(sent) == 50
    assert sum(n for *_, n in sent) == 3 * 8 * 2 * act + 2 * table


_HAND = {"step": 0.1, "messages": 0.05, "cpu": 0.2, "p2p_bytes": 4, "p2p_bytes_steps": [4], "p2p_groups": 2,
         "p2p_messages": 1, "loss0": 4.7, "reference0": 4.7, "grad_error": 0.0}
_REPLAY = {"raw": 0.01, "door": 0.011, "raw2": 0.01, "waitall": 0.012, "replayed": 0.0098, "rawbound": 0.009,
           "door_ratio": 1.1, "raw2_ratio": 1.0, "waitall_ratio": 1.2, "replayed_ratio": 0.98, "rawbound_ratio": 0.9,
           "groups": 2, "bytes": 4, "replay_rows_same": True, "planned_groups": 2, "messages": 1, "planned_bytes": 4,
           "wait": "polite", "rounds": 30}


@pytest.mark.parametrize("pipe, replay, needle", [
    ({"p2p_bytes": 8, "p2p_bytes_steps": [8]}, {}, "point-to-point bytes differ"),
    ({}, {"bytes": 8}, "point-to-point bytes differ"),
    ({"p2p_groups": 3}, {}, "point-to-point groups or messages differ"),
    ({}, {"messages": 2}, "point-to-point groups or messages differ"),
    ({}, {"replay_rows_same": False}, "point-to-point groups or messages differ"),
    ({"loss0": 4.5}, {}, "step 0's losses differ by 2.0e-01"),
])
def test_bytes_groups_or_losses_that_differ_exit_1(bench, monkeypatch, capsys, pipe, replay, needle):
    rows = {"pipe": {**_HAND, **pipe}, "pmsg": {**_REPLAY, **replay}}
    monkeypatch.setattr(bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(bench, "_launch", lambda args, worker: dict(rows.get(worker, _HAND)))
    assert bench._pipeline(_args(bench)) == 1
    out = capsys.readouterr()
    assert needle in out.err and "Traceback" not in out.err


def test_equal_counts_exit_0_and_print_both_ratios(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(bench, "_launch", lambda args, worker: dict(_REPLAY if worker == "pmsg" else _HAND))
    assert bench._pipeline(_args(bench)) == 0
    out = capsys.readouterr().out
    assert "  spmdsim (its send/recv trace rows)        0.050   1.00x by hand (1.00-1.00)" in out
    assert "  spmdsim runtime.door.point_to_point     0.01100   1.10x raw (1.10-1.10)" in out
    assert "  spmdsim, the door's calls replayed      0.00980   0.98x raw (0.98-0.98)" in out
    assert "  raw mpi4py Send_init/Recv_init          0.00900   0.90x raw (0.90-0.90)" in out
    assert "point-to-point groups a step, all ranks: spmdsim 2, by hand 2, replayed 2 (equal)" in out
