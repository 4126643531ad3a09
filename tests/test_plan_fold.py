"""Folded planning gives what the listed plan gives, and a 65,536-device plan fits in memory.

spmdsim.programs.plan.folded works an Exchange's bytes out from the block grid instead of
listing every box, and spmdsim.programs.plan.summary describes a plan's traffic per step
and group instead of a ranks x ranks matrix. Here both are pinned, at sizes where
the listed forms still run, to the listed forms; then a plan and its --explain
on 65,536 devices run in a subprocess whose address space is capped.
"""
from __future__ import annotations

import math
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spmdsim import Layout
from spmdsim.tools.cli.main import main
from spmdsim.programs.plan import Exchange, emulate, partial_addends, plan_redistribution, shards_of
from spmdsim.programs.plan import folded, planner
from spmdsim.programs.plan.summary import FOLD_RANKS, plan_traffic, sent_by_rank
from spmdsim.programs.plan.volume import exchange_transfers
from spmdsim.programs.viz.why import byte_matrix
from test_properties import random_pair


@pytest.fixture
def fold_everything(monkeypatch):
    """Fold every exchange (no threshold), with the plan caches emptied before and after."""
    def clear() -> None:
        planner._plan.cache_clear()
        planner._VALIDATED.clear()
    clear()
    monkeypatch.setattr(folded, "FOLD_CHOICES", -1)
    yield
    clear()


def _pairs(seed: int, count: int, counts=(64, 128, 256, 512)) -> list:
    rng = random.Random(seed)
    return [random_pair(rng.choice, counts) for _ in range(count)]


def _figures(plan) -> dict:
    """Everything a folded plan must share with the listed one, whoever sends each box."""
    return {"ops": [s.op for s in plan.steps], "received": [s.bytes_received for s in plan.steps],
            "sent_total": [sum(s.bytes_sent) for s in plan.steps], "lower_bound": plan.lower_bound,
            "boxes": [len(s.transfers) for s in plan.steps if isinstance(s, Exchange)]}


def _one_sender_per_box(plan) -> bool:
    """Whether no exchange of `plan` has a choice of sender (the source holds each box once)."""
    return all(s.before.layout.group_size(s.before.replicated_axes) == 1
               for s in plan.steps if isinstance(s, Exchange))


def test_folded_plans_have_the_listed_plans_totals(fold_everything):
    listed, folded_plans = [], []
    pairs = _pairs(seed=36, count=40)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folded, "FOLD_CHOICES", 1 << 62)  # the listed form, everywhere
        listed = [plan_redistribution(s, t, shape, "float32") for s, t, shape in pairs]
        planner._plan.cache_clear(), planner._VALIDATED.clear()
    folded_plans = [plan_redistribution(s, t, shape, "float32") for s, t, shape in pairs]
    exchanges = same_senders = 0
    for (source, target, shape), one, other in zip(pairs, listed, folded_plans):
        assert _figures(other) == _figures(one), (str(source), str(target), shape)
        assert other.bytes_received == one.bytes_received and other.lower_bound == one.lower_bound
        if any(isinstance(s.transfers, folded.FoldedTransfers) for s in other.steps if isinstance(s, Exchange)):
            exchanges += 1
            if _one_sender_per_box(one):
                # No choice of sender: the same boxes, in the same order, and the same bytes sent.
                assert [s.bytes_sent for s in other.steps] == [s.bytes_sent for s in one.steps]
                assert [tuple(s.transfers) for s in other.steps if isinstance(s, Exchange)] == \
                    [s.transfers for s in one.steps if isinstance(s, Exchange)]
                same_senders += 1
    assert exchanges >= 8 and same_senders >= 4, (exchanges, same_senders)


def test_a_folded_exchange_lists_each_ranks_boxes_alone():
    """`sends(r)`/`receives(r)` (what one rank's executor asks) are that rank's part of the list,
    and the bytes per rank are the list's."""
    checked = 0
    for source, target, shape in _pairs(seed=7, count=60, counts=(8, 12, 16)):
        before, after = source.with_partial(()), target.with_partial(())
        if before.layout != after.layout and planner.common_refinement(before.layout, after.layout):
            continue  # the planner rewrites these on one mesh first
        step = folded.folded_exchange(before, after, shape, 8)
        listed = tuple(step.transfers)
        n = before.layout.num_devices
        sent, received = [0] * n, [0] * n
        for src, dst, box, _, _ in listed:
            size = math.prod(b - a for a, b in box) * 8
            sent[src] += size
            received[dst] += size
        assert tuple(sent) == step.bytes_sent and tuple(received) == step.bytes_received
        for rank in range(n):
            assert step.transfers.sends(rank) == [t for t in listed if t[0] == rank]
            assert step.transfers.receives(rank) == [t for t in listed if t[1] == rank]
        # Every destination's boxes are the ones the greedy listing delivers to it.
        greedy = exchange_transfers(before, after, shape)
        assert sorted((t.dst, t.piece) for t in listed) == sorted((t.dst, t.piece) for t in greedy)
        checked += 1
    assert checked >= 30


def test_the_replica_rule_balances_as_the_greedy_does_on_power_of_two_meshes():
    """With replicas the fold picks senders by a fixed rule; on meshes of powers of two its busiest
    sender sends what the greedy's does (on other meshes it may send up to twice as much)."""
    compared = 0
    for source, target, shape in _pairs(seed=3, count=200, counts=(8, 16)):
        before, after = source.with_partial(()), target.with_partial(())
        if before.layout != after.layout or before.layout.group_size(before.replicated_axes) == 1:
            continue
        greedy = Exchange(before, after, (), transfers=exchange_transfers(before, after, shape)).sized(shape, 4)
        rule = folded.folded_exchange(before, after, shape, 4)
        assert max(rule.bytes_sent) == max(greedy.bytes_sent), (str(before), str(after), shape)
        compared += 1
    assert compared >= 20


@pytest.mark.parametrize("count", [8, 12, 16])
def test_folded_plans_emulate_bit_exactly(fold_everything, count):
    """The shared kernels run a folded exchange: every rank gets exactly its target block."""
    checked = 0
    for source, target, shape in _pairs(seed=count, count=60, counts=(count,)):
        if target.partial:
            continue
        full = (np.arange(math.prod(shape)) % 97 - 48).astype("float64").reshape(shape)
        plan = plan_redistribution(source, target, shape, "float64")
        out = emulate(plan, dict(partial_addends(source, full, seed=1)))
        for rank, block in shards_of(target, full).items():
            assert np.array_equal(out[rank], block), (str(source), str(target), shape, rank)
        checked += any(isinstance(s.transfers, folded.FoldedTransfers) for s in plan.steps if isinstance(s, Exchange))
    assert checked >= 4


def test_traffic_records_add_up_to_the_byte_matrix():
    """Per step and group, the records give each rank's row of the dense matrix."""
    for source, target, shape in _pairs(seed=11, count=30, counts=(8, 16, 32, 64)):
        plan = plan_redistribution(source, target, shape, "float32")
        matrix = byte_matrix(plan.steps, plan.num_ranks)
        assert sent_by_rank(plan) == tuple(sum(row) for row in matrix), (str(source), str(target))
        for step, record in zip(plan.steps, plan_traffic(plan)):
            if "senders" in record:
                assert sum(r["ranks"] for r in record["senders"]) == plan.num_ranks
            else:
                assert record["groups"] * record["group_size"] == plan.num_ranks


def test_explain_names_one_group_in_the_singular(capsys):
    """A collective over every rank of a folded --explain is "1 group of 128 ranks" (it was "1 groups")."""
    assert main(["plan", "--device-matrix", "128", "--alias", "x", "--from", "x,None", "--to", "None,x",
                 "--shape", "128,128", "--explain"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "1 group of 128 ranks; each rank sends each of the 127 others in its group 4 B" in flat, flat


def test_explain_folds_past_the_threshold(capsys):
    argv = ["plan", "--device-matrix", "4,4,8", "--alias", "a,b,c", "--from", "a,None", "--from-partial", "c",
            "--to", "None,(a,b)", "--shape", "256,256", "--explain"]
    assert 4 * 4 * 8 > FOLD_RANKS
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "rank 127 (3, 3, 7): [192:256, 0:256] partial over c -> [0:256, 240:256]" in out
    assert "rank 4 " not in out and "from \\ to" not in out
    assert "  after, on Layout(a=4, b=4, c=8): dim 0: whole; dim 1: 16 blocks of 16, block 4*a + b" in out
    flat = " ".join(out.split())
    assert "Alltoall on ('a', 'b'): 8 groups of 16 ranks; each rank sends each of the 15 others in its " \
           "group 1,024 B" in flat
    assert max(len(line) for line in out.splitlines()) <= 100
    assert main(argv + ["--json"]) == 0
    import json

    record = json.loads(capsys.readouterr().out)
    assert "bytes_matrix" not in record
    assert record["bytes_by_step"][2] == {"step": 3, "op": "allreduce", "axes": ["c"], "groups": 16,
                                          "group_size": 8, "bytes_to_each_peer": 4096}


_CAPPED = textwrap.dedent("""
    import resource, sys
    cap = 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    from spmdsim.tools.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("source, target", [("a,(b,c)", "(a,b),None"), ("(a,b),None", "None,a"),
                                            ("(a,b),c", "(a,b),None")])
def test_a_65536_device_plan_and_its_explanation_fit_in_1_gib(source, target):
    """Listed, the first exchange moves 2**28 boxes and the byte matrix has 2**32 cells."""
    argv = ["plan", "--device-matrix", "16,64,64", "--alias", "a,b,c", "--from", source, "--to", target,
            "--shape", "4096,4096", "--explain", "--json"]
    done = subprocess.run([sys.executable, "-c", _CAPPED, *argv], capture_output=True, text=True,
                          timeout=600, env={"OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    record = json.loads(done.stdout)
    assert record["bytes_received_per_rank"] == record["lower_bound_bytes_received_per_rank"]
    assert sum(r["ranks"] for s in record["bytes_by_step"] for r in s.get("senders", [])) in (0, 65536)


def test_the_bound_before_the_grid_is_never_below_the_choices():
    """`foldable` asks the grid only when `most_choices` (no grid) is past the threshold: it must never be below
    the grid's count, or an exchange that should fold would be listed box by box."""
    for source, target, shape in _pairs(5, 300, (2, 4, 6, 8, 12, 16, 64)):
        if source.layout != target.layout or set(source.partial) & set(target.split_axes):
            continue
        target = target.with_partial(source.partial)  # an exchange keeps the pending sums it has
        choices = folded.exchange_choices(source, target, shape)
        assert folded.most_choices(source, target, shape) >= choices, (str(source), str(target), shape)


def test_a_dim_split_over_an_axis_of_size_1_is_whole_in_the_block_rule():
    """`block_rule` said "dim 1: 1 blocks of 64, block tp" for a dim over an axis of size 1 (run's folded output)."""
    from spmdsim.programs.plan.summary import block_rule

    tl = Layout((8, 1), ("dp", "tp"))("dp", "tp")
    assert block_rule(tl, (16, 64)) == "dim 0: 8 blocks of 2, block dp; dim 1: whole"
