"""The step records of messages and block collectives (spmdsim.programs.plan.messages): their bytes from the
layout steps' formulas, their conjugates, and a pipelined MoE step whose messages and expert exchanges all
reach the trace through the executor (spmdsim.runtime.executor.post and run_block)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import spmdsim
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.moe import MoEConfig
from spmdsim.programs.plan.messages import (BlockAllgather, BlockAllreduce, BlockAlltoall, BlockAlltoallv,
                                           BlockReduceScatter, Messages)
from spmdsim.programs.plan.steps import KINDS
from spmdsim.runtime import door, executor

TEXT = encode(load_text(20_000))
PACKAGE = Path(__file__).resolve().parents[1] / "spmdsim"

#: A call of the collectives' kernels or of the door's point-to-point (the grep of docs/explanation/architecture.md).
TRAFFIC = re.compile(r"\bKERNELS\.|\bpoint_to_point\(")


def test_collectives_and_messages_are_called_by_the_executor_alone():
    """Every byte a program moves leaves through the executor: the collectives' kernels and the door's
    point-to-point are called in spmdsim/runtime/executor.py alone."""
    calls = {}
    for path in PACKAGE.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if TRAFFIC.search(code) and not re.match(r"\s*def ", code):
                calls.setdefault(path.relative_to(PACKAGE.parent).as_posix(), []).append(n)
    assert calls.get("spmdsim/runtime/executor.py"), "the scan sees the executor's calls"
    others = {f: lines for f, lines in calls.items() if f != "spmdsim/runtime/executor.py"}
    assert not others, others


class _Comm:
    def __init__(self, size: int) -> None:
        self.size = size

    def Get_size(self) -> int:
        return self.size


def test_a_messages_record_says_of_its_buffers_what_the_door_counts():
    sends = [(np.zeros(6), 1, 3), (np.zeros(2, np.float32), 2, 4)]
    receives = [(np.zeros(5), 3, 3)]
    record = Messages.of(("pp",), 4, receives, sends)
    assert record.described() == door.messages(_Comm(4), ("pp",), receives, sends)
    assert (record.op, record.bytes_sent, record.bytes_received, record.peers) == ("sendrecv", 56, 40, 3)
    back = record.conjugate()
    assert (back.bytes_sent, back.bytes_received, back.conjugate()) == (40, 56, record)
    assert Messages.of(("pp",), 2, [], sends[:1]).op == "send" and Messages.of(("pp",), 2, receives, []).op == "recv"


@pytest.mark.parametrize("g, n", [(2, 64), (4, 4096), (8, 800)])
def test_a_block_collectives_bytes_are_its_layout_steps(g, n):
    assert BlockAlltoall(("ep",)).moved(g, n) == KINDS["alltoall"].moved(g, n) == (g - 1) * n // g
    assert BlockAllreduce(("tp",)).moved(g, n) == KINDS["allreduce"].moved(g, n) == 2 * (g - 1) * n // g
    rows = tuple(range(1, g + 1))
    v = BlockAlltoallv(("ep",), rows, rows[::-1])
    assert [v.moved(g, sum(rows) * 8, m) for m in range(g)] == [(sum(rows) - r) * 8 for r in rows]
    assert v.conjugate() == BlockAlltoallv(("ep",), rows[::-1], rows)
    assert BlockAlltoall(("ep",)).conjugate() == BlockAlltoall(("ep",)) and BlockAllreduce(("tp",)).conjugate() is None
    # a fully sharded unit's gather (n: a member's pack) and its gradients' sum (n: the whole packed buffer)
    assert BlockAllgather(("dp",)).moved(g, n) == KINDS["allgather"].moved(g, n) == (g - 1) * n
    assert BlockReduceScatter(("dp",)).moved(g, g * n) == KINDS["reduce_scatter"].moved(g, g * n) == (g - 1) * n
    assert BlockAllgather(("dp",)).conjugate() == BlockReduceScatter(("dp",))
    assert BlockReduceScatter(("dp", "ep")).conjugate() == BlockAllgather(("dp", "ep"))


_MOE_LABELS = ("dispatch", "combine", "experts fc")


@pytest.mark.parametrize("dropless", [False, True])
def test_a_pipelined_moe_steps_traffic_comes_from_the_executor(monkeypatch, dropless):
    """Every trace row of a message between stages or of an expert exchange is one the executor ran from a
    step record: the calls to `executor.post` and `executor.run_block` by label are the trace's rows."""
    ran: dict = {}
    post, run_block = executor.post, executor.run_block

    def counted(run, record_at, label_at):
        def call(*args, **kwargs):
            ran.setdefault(spmdsim.world().rank, []).append((type(args[record_at]).__name__, args[label_at]))
            return run(*args, **kwargs)
        return call

    monkeypatch.setattr(executor, "post", counted(post, 2, 5))  # (mesh, comm, record, receives, sends, label)
    monkeypatch.setattr(executor, "run_block", counted(run_block, 1, 3))  # (mesh, record, local, label[, out])
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless)
    cfg = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=8, dropout=0.1, moe=moe)

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 2, 1, TEXT, ep=2, microbatches=2)
        rows = sorted(e.label for e in run.trace.entries if e.group_size > 1 and (
            e.label in ("pipeline", "embedding group") or any(w in (e.label or "") for w in _MOE_LABELS)))
        run.close()
        return results[0].passed, rows

    for rank, (passed, rows) in enumerate(spmdsim.simulate(8, main)):
        assert passed
        mine = ran[rank]
        assert rows and sorted(label for _, label in mine) == rows, (rank, rows, mine)
        kinds = {kind for kind, _ in mine}
        assert "Messages" in kinds and "BlockAlltoall" in kinds and "BlockAllreduce" in kinds
        assert ("BlockAlltoallv" in kinds) == dropless
