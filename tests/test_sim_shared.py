"""spmdsim.runtime.sim.once: local work simulated ranks share when their inputs are equal."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import spmdsim
import spmdsim.base.context
from spmdsim.runtime.sim import once


class _Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, *args):
        with self.lock:
            self.calls += 1
        return {"sum": np.asarray(args[0]).sum() * np.ones(3), "parts": [np.arange(2.0)], "args": args[1:]}


def test_outside_a_simulation_it_is_a_plain_call():
    count = _Counter()
    first, second = once("k", count, np.ones(2)), once("k", count, np.ones(2))
    assert count.calls == 2 and first["sum"].flags.writeable and first is not second


def test_equal_inputs_are_computed_once_and_shared_read_only():
    count = _Counter()

    def body():
        comm = spmdsim.world()
        out = once(("step", 0), count, np.full((4, 4), 2.0), "same")
        out["mine"] = comm.rank  # containers are each rank's own
        out["parts"].append(None)
        try:
            out["sum"][0] = 0.0
            wrote = True
        except ValueError:  # the shared arrays are read-only
            wrote = False
        comm.Barrier()
        left = len(spmdsim.base.context.current().shared)  # taken by every rank: dropped
        return out["sum"].tolist(), len(out["parts"]), out["mine"], wrote, left

    results = spmdsim.simulate(8, body)
    assert count.calls == 1
    assert [r[0] for r in results] == [[32.0] * 3] * 8
    assert [r[1:] for r in results] == [(2, rank, False, 0) for rank in range(8)]


def test_a_rank_with_other_inputs_gets_its_own_answer():
    count = _Counter()

    def body():
        rank = spmdsim.world().rank
        value = np.full(3, 5.0 if rank == 3 else 1.0)
        value[0] = np.nan  # NaN equals NaN here: ranks 0, 1 and 2 still have equal inputs
        return float(once("k", count, value[1:], value)["args"][0][2])

    results = spmdsim.simulate(4, body)
    assert count.calls == 2  # ranks 0, 1, 2 share one; rank 3 computes its own
    assert results == [1.0, 1.0, 1.0, 5.0]


@pytest.mark.parametrize("a,b,same", [
    (np.zeros(3), np.zeros(3, np.float32), False), (np.zeros(3), np.zeros(4), False),
    ({"a": 1}, {"a": 1}, True), ([1, (2, 3)], [1, (2, 3)], True), ([1, 2], (1, 2), False),
    (np.arange(3), [0, 1, 2], False)])
def test_inputs_compare_exactly(a, b, same):
    from spmdsim.base.once import _equal

    assert _equal(a, b) is same


def test_one_key_holds_each_distinct_input_apart():
    """Two trainers asking with the same key (step 0 of two networks) each share their own result."""
    count = _Counter()

    def body():
        rank = spmdsim.world().rank
        # Ranks ask in different orders, so both entries are live at once.
        order = ("a", "b") if rank % 2 else ("b", "a")
        got = {name: once("step 0", count, np.zeros(1), name)["args"][0] for name in order}
        return got == {"a": "a", "b": "b"}

    results = spmdsim.simulate(8, body)
    assert count.calls == 2 and all(results)


def test_an_unhashable_key_is_refused_alike_in_and_out_of_a_simulation():
    from spmdsim.errors import SpmdsimError

    with pytest.raises(SpmdsimError, match=r"^once: key \['step', 0\] must be hashable"):
        once(["step", 0], _Counter(), np.zeros(1))

    def body():
        once(["step", 0], _Counter(), np.zeros(1))

    with pytest.raises(SpmdsimError, match=r"must be hashable"):
        spmdsim.simulate(4, body)


def test_in_a_dry_run_the_shared_result_is_no_ranks_bytes_held():
    """Whichever rank computes it first would otherwise carry it in its peak: a report that
    changed from run to run (the attention example's reference at 8 ranks: 2 of 8 ranks)."""
    from spmdsim.runtime import DTensor, Mesh

    def body():
        mesh = Mesh(spmdsim.Layout((4,), ("mp",)))
        src = spmdsim.SeededTensor((256, 64), "float64", 3)
        x = DTensor.from_seeded(mesh, mesh.layout("mp", None), src)
        once("whole", lambda: src.full())  # 128 KiB, the global tensor
        return x.local.nbytes

    dry = spmdsim.simulate(4, body, dry_run=True)
    assert [r.peak_bytes_held for r in dry.report.ranks] == [256 * 64 * 8 // 4] * 4


def test_a_whole_output_reference_is_made_once_for_every_replica(monkeypatch):
    """Region references of the whole output from seeded sources go through once(): every replica
    of a replicated output checks against one (`spmdsim run mlp --ranks 1024`: 10 s -> 3 s)."""
    from spmdsim import SeededTensor
    from spmdsim.references import forward as reference

    calls = []
    linear = reference.linear
    monkeypatch.setattr(reference, "linear", lambda *args: calls.append(1) or linear(*args))
    x, w1, w2 = SeededTensor((4, 8), seed=1), SeededTensor((8, 16), seed=2), SeededTensor((16, 8), seed=3)
    fn = reference.mlp_region(x, w1, None, w2, None)
    outs = spmdsim.simulate(16, fn, (slice(0, 4), slice(None)))
    assert len(calls) == 2  # the hidden layer and the output layer, once for all 16 ranks
    assert all(np.array_equal(o, reference.mlp(x.full(), w1.full(), None, w2.full(), None)) for o in outs)
    calls.clear()
    spmdsim.simulate(4, fn, (slice(0, 2), slice(None)))  # a region, not the whole: each rank its own
    assert len(calls) == 8
    calls.clear()
    mine = reference.mlp_region(x.full(), w1, None, w2, None)  # an array source: not compared, not shared
    spmdsim.simulate(4, mine, (slice(None), slice(None)))
    assert len(calls) == 8


def test_ranks_wait_for_a_computation_in_progress_and_compute_their_own_if_it_fails():
    """A rank asking while another computes the same key waits for it (one computation for all);
    when that computation raises, the waiting ranks compute their own."""
    import threading
    import time

    from spmdsim.base.once import once

    calls, lock = [], threading.Lock()

    def slow(x):
        with lock:
            calls.append(1)
        time.sleep(0.05)  # numpy-like work that lets the other ranks run meanwhile
        return x * 2

    assert spmdsim.simulate(8, lambda: once("slow", slow, 21)) == [42] * 8
    assert len(calls) == 1

    calls.clear()

    def fails_first(x):
        with lock:
            calls.append(1)
            first = len(calls) == 1
        time.sleep(0.05)
        if first:
            raise ValueError("the first computation fails")
        return x + 1

    def body():
        try:
            return once("fails", fails_first, 1)
        except ValueError:
            return "raised"

    out = spmdsim.simulate(8, body)
    assert out.count("raised") == 1 and out.count(2) == 7
    assert 2 <= len(calls) <= 8  # the waiters recomputed (sharing among themselves where they can)


def test_a_check_on_simulated_ranks_shares_one_table_and_builds_its_verdict_once(monkeypatch):
    """DTensor.check's table of every rank's record (spmdsim.runtime.check.agree): simulated ranks share one,
    filled by one Gather (spmdsim.runtime.shared_rows), and the first to read it builds the Verdict for all.
    An Allgather gave each of p ranks its own p records and each rank built its own Verdict from them (805 MB
    at 4,096 ranks). A sub-communicator's next check gets a table of its own, never the last one's verdict."""
    from spmdsim import DTensor, Layout, Mesh, SeededTensor
    from spmdsim.runtime import check

    built = []
    real = check._verdict
    monkeypatch.setattr(check, "_verdict", lambda *args: built.append(1) or real(*args))
    src = SeededTensor((8, 16), "float64", seed=3)

    def body():
        with Mesh(Layout((2, 4), ("dp", "mp")), spmdsim.world()) as mesh:
            x = DTensor.from_seeded(mesh, mesh.layout("dp", "mp"), src)
            wrong = np.asarray(src.region((slice(0, 8), slice(0, 16)))).copy()
            wrong[7, 15] += 1.0  # rank 7's block
            verdicts = [x.check(src), x.check(wrong)]
            sub = mesh.group("mp")  # its next call's table is a new one
            record = lambda k: np.array([float(k != 1), k + 0.5, 0.0, 0.0, 4.0, 1.0, 0.0, 0.0, -1.0])  # noqa: E731
            verdicts += [check.agree(sub, record(k), 1e-9, 1e-12) for k in range(2)]
            return verdicts

    ran = spmdsim.simulate(8, body)
    assert [str(v).splitlines()[0] for v in ran[0][:2]] == [
        "check passed: every element within atol 1e-12 + rtol 1e-09 x |ref| (128 elements)",
        "check FAILED on ranks [7]: max abs err 1, max rel err 0.679 (worst rank 7, element [7, 15]; atol 1e-12, "
        "rtol 1e-09; 128 elements)"]
    assert [(v.passed, v.max_abs_error) for v in ran[0][2:]] == [(True, 0.5), (False, 1.5)]
    for k in range(2):  # the same object on every rank: built once
        assert all(verdicts[k] is ran[0][k] for verdicts in ran)
    for k in range(2, 4):  # once per group of 4 (ranks 0-3, 4-7)
        assert all(ran[r][k] is ran[r // 4 * 4][k] for r in range(8)) and ran[0][k] is not ran[4][k]
    assert len(built) == 2 + 2 * 2


def test_the_gpt_table_helper_is_the_runtimes(monkeypatch):
    """spmdsim.models.gpt.train.all_rows, as its callers import it, hands over to spmdsim.runtime.shared_rows' (one
    copy; the gpt package loads no runtime, and the runtime imports no gpt)."""
    from spmdsim.models.gpt import train
    from spmdsim.runtime import shared_rows

    monkeypatch.setattr(shared_rows, "all_rows", lambda *args: ("runtime's", args))
    assert train.all_rows("mesh", "flat", "label") == ("runtime's", ("mesh", "flat", "label"))
