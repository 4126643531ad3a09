"""spmdsim.tools.estimate.bounds and the branch and bound of spmdsim.tools.estimate.search: the layer cells' bounds lie
below every configuration's own dry-run price, so pruning by them never drops the fastest configuration that fits."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from spmdsim.tools.estimate.bounds import Cells, _signed
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.closed_forms import comm_bounds, lower_bounds, stage_elements
from spmdsim.tools.estimate.configs import configurations
from spmdsim.tools.estimate.search import price, search
from spmdsim.models.gpt import GPTConfig
from spmdsim.programs.pipeline.records import Compute
from spmdsim.programs.pipeline.schedule import build, in_flight_by_stage, most_in_flight

A100 = load_machine("a100-dgx")
SMALL = GPTConfig(layers=4, d_model=32, heads=4, seq=32, vocab=64, batch=4, dropout=0.1)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_in_flight_is_the_most_a_built_schedule_holds_and_each_stage_holds_its_own(name):
    for p in range(1, 6):
        for m in range(1, 9):
            for v in ((2, 3) if name == "interleaved" else (1,)):
                if name == "interleaved" and m % p:
                    continue
                stages = []
                for program in build(name, p, m, v).programs:
                    held = most = 0
                    for action in program:
                        if isinstance(action, Compute):
                            held += 1 if action.kind == "F" else -1
                            most = max(most, held)
                    stages.append(most)
                assert most_in_flight(name, p, m, v) == max(stages), (p, m, v)
                assert in_flight_by_stage(name, p, m, v) == tuple(stages), (p, m, v)


@pytest.fixture(scope="module")
def exhaustive():
    """Every configuration of SMALL on 16 devices without context parallelism priced by its own dry run:
    {config: (seconds, bytes held, peak bytes)} (cp's: tests/test_estimate_search_context.py)."""
    return {c: price(SMALL, c, A100, "bf16-mixed", "megatron") for c in configurations(SMALL, 16, 8, cp=1)}


@pytest.fixture(scope="module")
def cells():
    return Cells(SMALL, "megatron", 8)


def test_the_cell_bounds_lie_below_every_configurations_price(exhaustive, cells):
    for c, (seconds, nbytes, _) in exhaustive.items():
        flop_s, states = lower_bounds(SMALL, c, A100, "bf16-mixed", 16)
        assert flop_s <= seconds and states <= nbytes, c
        sums = comm_bounds(SMALL, c, A100, "bf16-mixed", *stage_elements(SMALL, c))[1:]
        time_bound = cells.time_bound(c, A100, "bf16-mixed", *sums)
        assert time_bound <= seconds * (1 + 1e-12), c
        assert cells.memory_bound(c, "bf16-mixed") <= nbytes, c
    assert {c.zero for c in exhaustive} == {0, 1, 2, 3}  # ZeRO-2's and ZeRO-3's bounds below their price too
    # the cells are shared: one per (tp, sp, micro-batch, recomputation), four small dry runs each
    keys = {(c.tp, c.sp, SMALL.batch // (c.dp * c.microbatches), c.recompute) for c in exhaustive}
    assert len(cells.cells) == len(keys) and cells.dry_runs == 4 * len(keys)


@pytest.mark.parametrize("share", [1.0, 0.5, 0.25])
def test_pruning_keeps_the_true_best(exhaustive, cells, share):
    peaks = sorted(peak for *_, peak in exhaustive.values())  # the limit bounds the peak, transient included
    limit = peaks[int(share * (len(peaks) - 1))]
    fits = {c: s for c, (s, _, peak) in exhaustive.items() if peak <= limit}
    fastest = min(fits.values())
    r = search(SMALL, 16, A100, limit, max_dry_runs=1000, pricer=lambda cfg, c, *rest: exhaustive[c], cells=cells,
               fixed={"cp": 1})
    assert r.chosen.step_s == fastest and fits[r.chosen.config] == fastest
    assert r.dry_runs < len(exhaustive)  # the bounds pruned some
    priced = [c for c in r.candidates if c.step_s is not None]
    assert len(priced) == r.dry_runs
    pruned = [c for c in r.candidates if c.verdict.endswith("above the best")]
    assert pruned and all(c.bound_s >= fastest for c in pruned)
    assert all(c.verdict != "not priced" for c in r.candidates)


def test_the_search_at_3072_devices_prices_few(monkeypatch):
    """A deep model on 3,072 devices (tp 8 at most, pp dividing 16 layers), searched by the command
    docs/howto/choose-configuration.md quotes, which prints what the page shows (tests/test_classroom_docs.py leaves
    it to this test: one search of 6-7 CPU-s, not two): 312 configurations (ZeRO 0 to 3, a ring's cp beside tp within
    a node); model states rule out most under 8.5 GiB, the bounds most of the rest, and the choice is the fastest
    that fits of the sixteen priced (ZeRO-3's too, its shards of the 51,200 vocabulary rows uneven): selective
    recomputation under ZeRO-1, its peak its memory line and, for a moment, the attention softmax's backward (3
    blocks of a rank's (1, 20, 2048, 2048) scores). No recomputation is faster under ZeRO-1 (over the limit by
    its memory line alone: its whole fp32 gradients) and under ZeRO-2, whose memory line (its gradients: each
    rank's 1/24 slices) is within the limit but whose peak is not: with 2 microbatches its backward holds the
    first one's gradients whole beside the slices while it reduces the buckets (MemoryReport.grads_peak). Every
    priced configuration's bounds lie below its price, ZeRO-2's too."""
    from docs_commands import in_process, mismatch, run_here, shown
    from spmdsim.tools.cli import autoshard_machine

    cfg = GPTConfig(layers=16, d_model=25600, heads=160, seq=2048, vocab=51200, batch=48)
    limit = 17 << 29  # 8.5 GiB
    (quote,) = [q for q in shown("docs/howto/choose-configuration.md")
                if q.command.startswith("spmdsim autoshard ") and "--devices 3072 --memory-limit 8.5G" in q.command]
    searched = []
    monkeypatch.setattr(autoshard_machine, "search", lambda *a, **k: searched.append((a, k, search(*a, **k)))
                        or searched[-1][2])
    code, out, err = run_here(*in_process(quote.command))
    assert code == 0 and mismatch(quote.output, out) is None, (mismatch(quote.output, out), out, err)
    assert max(len(line) for line in out.splitlines()) <= 100
    ((args, kwargs, r),) = searched
    assert args == (cfg, 3072, A100, limit) and kwargs["max_dry_runs"] == 24  # the command's default cap
    assert len(r.candidates) == 312 and {c.config.zero for c in r.candidates} == {0, 1, 2, 3}
    x = r.chosen.config
    assert (x.tp, x.sp, x.pp, x.virtual, x.dp, x.microbatches, x.recompute, x.zero) == \
        (8, True, 16, 1, 24, 2, "selective", 1)
    counts = {v: sum(c.verdict == v for c in r.candidates) for v in {c.verdict for c in r.candidates}}
    assert counts == {"chosen": 1, "over the memory limit": 7, "cell bound above the best": 68,
                      "FLOP bound above the best": 72, "memory bound over the limit": 2,
                      "model states over the limit": 162}
    assert r.dry_runs == 8 and r.cell_runs == 84
    assert r.chosen.peak == r.chosen.memory + 3 * 20 * 2048 * 2048 * 2 <= limit
    priced = [c for c in r.candidates if c.step_s is not None]
    assert {c.config.zero for c in priced} == {1, 2}  # ZeRO-3's bound, its gathers counted, above the choice
    sharded = min(c.bound_s for c in r.candidates if c.config.zero == 3)
    assert 1.11 < sharded / r.chosen.step_s < 1.12  # the page's "11% or more above the choice"
    assert all(c.bound_s <= c.step_s and c.bound_bytes <= c.memory <= c.peak for c in priced)
    faster = sorted((c for c in priced if c.step_s < r.chosen.step_s), key=lambda c: c.config.zero)
    assert [(c.config.recompute, c.config.zero) for c in faster] == [("none", 1), ("none", 2)]
    assert faster[0].memory > limit and faster[1].memory < limit < faster[1].peak


def test_the_22b_search_prints_what_the_page_quotes():
    """The 22B model of Korthikanti et al. 2022 on one DGX A100, the search docs/howto/choose-configuration.md
    quotes in full under "By predicted step time" (tests/test_classroom_docs.py does not run that section): its
    counts, its choice and the rows it shows, all but the search's own seconds. About 14 CPU-s."""
    from docs_commands import in_process, mismatch, quotes, run_here

    (quote,) = [q for q in quotes("docs/howto/choose-configuration.md")
                if q.command.startswith("spmdsim autoshard ") and "layers=48,d_model=6144," in q.command]
    code, out, err = run_here(*in_process(quote.command))
    seconds = re.compile(r"(configurations) in \d+\.\d s:")
    quoted = tuple(seconds.sub(r"\1 in - s:", line) for line in quote.output)
    assert code == 0 and mismatch(quoted, seconds.sub(r"\1 in - s:", out)) is None, \
        (mismatch(quoted, seconds.sub(r"\1 in - s:", out)), out, err)
    assert sum(bool(seconds.search(line)) for line in quote.output) == 1

# ---- a GPT with MoE layers: cells of a dense and an MoE layer, each stage's layers counted ----


def _moe(layers: int, **moe) -> GPTConfig:
    from spmdsim.models.moe.config import MoEConfig

    return GPTConfig(layers=layers, d_model=32, heads=4, seq=32, vocab=64, batch=4, dropout=0.1,
                     moe=MoEConfig(**{"experts": 4, "top_k": 2, **moe}))


@pytest.mark.parametrize("layers, moe, node", [
    (4, {"capacity_factor": 0.5}, 8), (6, {"every": 3, "top_k": 1, "dropless": True, "dry_routing": "worst"}, 1)])
def test_an_moe_gpts_cells_lie_below_every_configurations_price_and_keep_the_best(layers, moe, node):
    """Every configuration of a small MoE GPT on 2 devices (ep 1 and 2, the experts split over tp 2 or folded
    into their ep, interleaved chunks of one layer, nodes of 8, 2 or 1 GPUs) priced by its own dry run: the cells' time
    and memory bounds lie below it, they are tighter than the closed forms on most, and the search bounded by them
    (`moe_cells`) chooses the fastest."""
    import dataclasses
    cfg = _moe(layers, **moe)
    machine = dataclasses.replace(A100, gpus_per_node=node)
    cells = Cells(cfg, "megatron", node)
    configs = configurations(cfg, 2, node, 1, sharded=True)  # ZeRO-3 too: the search's where nothing else fits
    exhaustive = {c: price(cfg, c, machine, "bf16-mixed", "megatron") for c in configs}
    gain, kept, twins = [], [], {}
    for c, (seconds, nbytes, _) in exhaustive.items():
        flop_s, states = lower_bounds(cfg, c, machine, "bf16-mixed", 2)
        sums = comm_bounds(cfg, c, machine, "bf16-mixed", *stage_elements(cfg, c))[1:]
        time_bound = cells.time_bound(c, machine, "bf16-mixed", *sums)
        assert time_bound <= seconds * (1 + 1e-12), (c, time_bound, seconds)
        memory = cells.memory_bound(c, "bf16-mixed")
        assert memory <= nbytes, (c, memory, nbytes)
        twins.setdefault(replace(c, zero=min(c.zero, 1)) if c.zero < 3 else c, set()).add(time_bound)
        if c.zero < 2:  # ZeRO-2's time bounds are ZeRO-1's (the same sums and update: `twins`), counted once
            gain.append(time_bound / flop_s)
        kept.append(memory > states)
    assert all(len(bounds) == 1 for bounds in twins.values()) and {c.zero for c in exhaustive} == {0, 1, 2, 3}
    # above the closed forms by a tenth or more on half the configurations (a quarter across nodes, where the
    # links' latency, which the closed forms count, is much of a step)
    assert sum(g > 1.1 for g in gain) >= len(gain) * (0.5 if node > 1 else 0.25)
    assert all(kept)  # each stage's kept bytes added to its model states
    assert {c.ep for c in exhaustive} == {1, 2}
    # folded: tp 2 into the experts' ep, where a node holds tp 2
    assert {(c.tp, c.experts_ep) for c in exhaustive if c.etp == 1} == ({(2, 2)} if node > 1 else set())
    assert any(c.virtual * c.pp == layers for c in exhaustive)  # chunks of one layer: dense or MoE alone
    assert cells.dry_runs == 6 * len(cells.cells)  # three sizes of model, 1 and 2 microbatches
    fastest = min(seconds for c, (seconds, *_) in exhaustive.items() if c.zero < 3)  # (all fit: no ZeRO-3 searched)
    r = search(cfg, 2, machine, 1 << 40, max_dry_runs=10_000, pricer=lambda cfg, c, *rest: exhaustive[c], cells=cells,
               moe_cells=True, fixed={"cp": 1})  # (cp: the test below)
    assert r.chosen.step_s == fastest and r.dry_runs < len(exhaustive)
    assert all(c.bound_s >= fastest for c in r.candidates if c.verdict.endswith("bound above the best"))


@pytest.mark.parametrize("moe", [{"dropless": True, "dry_routing": "worst"}, {"capacity_factor": 0.5}])
def test_an_moe_gpts_cells_lie_below_the_price_of_each_configuration_over_cp(moe):
    """Each rank routes its chunks of the sequences (with a capacity, each chunk its own): every configuration of
    cp 2 of a small MoE GPT on 2 devices of a node (the ring) is priced by its own dry run, and its cells' time and
    memory bounds and the closed forms lie below it (the search tries cp beside experts, with the cells or --fix
    cp)."""
    import dataclasses

    cfg = _moe(4, **moe)
    machine = dataclasses.replace(A100, gpus_per_node=2)
    cells = Cells(cfg, "megatron", 2)
    configs = configurations(cfg, 2, 2, 2, methods=("ring",), sharded=True)
    assert configs and {c.cp for c in configs} == {2}
    for c in configs:
        seconds, nbytes, _ = price(cfg, c, machine, "bf16-mixed", "megatron")
        flop_s, states = lower_bounds(cfg, c, machine, "bf16-mixed", 2)
        sums = comm_bounds(cfg, c, machine, "bf16-mixed", *stage_elements(cfg, c))[1:]
        assert flop_s <= seconds and states <= nbytes, c
        assert cells.time_bound(c, machine, "bf16-mixed", *sums) <= seconds * (1 + 1e-12), c
        assert cells.memory_bound(c, "bf16-mixed") <= nbytes, c


def test_a_cells_differences_keep_their_items_order_not_a_sets():
    """The cells' rows are differences of dicts whose values are then summed in their order: taken in a set's
    order (which follows the hash seed for strings), a search's bounds differed in their last digits from one
    run to the next (7.115811508989032e-05 and ...031e-05 under PYTHONHASHSEED 0 and 1). Integers iterate a set
    in their own order, so this order shows it on any seed."""
    assert list(_signed({5: 2, 1: 1, 3: 0}, {2: 1, 5: 1})) == [5, 1, 2]
    assert _signed({5: 2, 1: 1}, {2: 1, 5: 2}) == {1: 1, 2: -1}
