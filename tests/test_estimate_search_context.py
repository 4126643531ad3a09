"""spmdsim.tools.estimate.search with context parallelism and ZeRO-3: cp (with its method) and fully sharded data
parallelism are searched beside tp, pp, dp, ZeRO 0-2, priced by the same dry run as `spmdsim estimate`; a
sequence too long to fit without cp chooses cp, a model that fits only with its parameters sharded ZeRO-3; every
bound lies below the price."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from collections import Counter
from dataclasses import replace

import pytest

from spmdsim.models.gpt import GPTConfig
from spmdsim.tools.cli.main import main
from spmdsim.tools.estimate import ledger
from spmdsim.tools.estimate.bounds import Cells
from spmdsim.tools.estimate.closed_forms import comm_bounds, lower_bounds, stage_elements
from spmdsim.tools.estimate.configs import configurations
from spmdsim.tools.estimate.ledger import gpt_ledger
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.search import price, search

A100 = load_machine("a100-dgx")
MIB = 1 << 20
#: 2 layers of 4 heads over a sequence of 2,048: one sequence's attention scores are 32 MiB a block at bf16
LONG = GPTConfig(layers=2, d_model=64, heads=4, seq=2048, vocab=128, batch=2, dropout=0.1)
#: one head (no tp), 3 layers (no pp on 4 devices), wide and short: its model states are most of its memory
WIDE = GPTConfig(layers=3, d_model=512, heads=1, seq=8, vocab=128, batch=4, dropout=0.1)


def test_cp_its_methods_and_zero_3_are_enumerated_where_they_run():
    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=64, vocab=128, batch=4, dropout=0.1)
    configs = configurations(cfg, 2, 8)
    kinds = Counter((c.tp, c.dp, c.cp, c.cp_method) for c in configs)
    # cp 2 beside tp 1 and dp 1, by each method (the all-to-all's 2 heads divide over tp x cp = 2)
    assert {k[2:] for k in kinds if k[2] > 1} == {(2, "ring"), (2, "allgather"), (2, "alltoall")}
    assert all(c.tp * c.cp * c.pp * c.dp == 2 for c in configs)
    # ZeRO-1, -2 and -3 shard over dp x cp
    assert {c.zero for c in configs if c.cp == 2} == {0, 1, 2, 3}
    assert {c.zero for c in configs if c.dp == 2} == {0, 1, 2, 3}
    # tp x cp within a node: none on nodes of one GPU, unless cp is held (--fix cp=2)
    assert {c.cp for c in configurations(cfg, 2, 1)} == {1}
    assert {c.cp for c in configurations(cfg, 2, 1, cp=2)} == {2}
    # sp with cp: the tokens a rank holds must divide over tp: seq 12 does over tp 4, its 6 of cp 2 do not
    # (and cp 4 cuts 12 into no 8 chunks)
    wide = configurations(replace(cfg, heads=4, seq=12), 8, 8)
    assert {c.cp for c in wide} == {1, 2} and any(c.sp and c.tp == 4 and c.cp == 1 for c in wide)
    assert any(c.tp == 4 and c.cp == 2 for c in wide) and not any(c.sp and c.tp == 4 and c.cp == 2 for c in wide)
    # cp beside MoE layers of a capacity too (each rank routes its chunks, each with its own capacity); ZeRO-3 beside
    # them only where the search asks (`sharded`: where nothing else fits)
    from spmdsim.models.moe.config import MoEConfig

    moe = configurations(replace(cfg, moe=MoEConfig(experts=2, top_k=1)), 2, 8)
    assert {c.cp for c in moe} == {1, 2} and {c.zero for c in moe} == {0, 1, 2}


def test_a_sequence_that_fits_only_split_chooses_cp():
    """Under 40 MiB a rank cannot hold a 2,048-token sequence's attention whole (each block of its scores is
    32 MiB at bf16; tp 2 halves the heads, not enough), so the choice splits the sequence over cp 2; held at
    cp 1 (--fix cp=1) nothing fits."""
    limit = 40 * MIB
    r = search(LONG, 2, A100, limit)
    x = r.chosen.config
    assert x.cp == 2 and r.chosen.peak <= limit
    assert r.chosen.step_s == pytest.approx(price(LONG, x, A100, "bf16-mixed", "megatron")[0], rel=1e-12)
    assert all(c.peak > limit for c in r.candidates if c.config.cp == 1 and c.peak is not None)
    assert search(LONG, 2, A100, limit, fixed={"cp": 1}).chosen is None


def test_a_model_that_fits_only_with_its_parameters_sharded_chooses_zero_3():
    """One head and 3 layers on 4 devices leave no tp nor pp: dp 4 (or dp x cp 4) shards the optimizer's
    states under ZeRO-1 and -2, but every rank holds the parameters (and under ZeRO-1 the gradients) whole;
    ZeRO-3 shards them over dp x cp too and is the one that fits 64 MiB."""
    limit = 64 * MIB
    r = search(WIDE, 4, A100, limit)
    x = r.chosen.config
    assert x.zero == 3 and x.dp * x.cp == 4 and r.chosen.peak <= limit
    for zero in (0, 1, 2):
        assert search(WIDE, 4, A100, limit, fixed={"zero": zero}).chosen is None, zero


def test_every_bound_lies_below_the_price_of_cp_and_zero_3_configurations():
    cfg = GPTConfig(layers=2, d_model=32, heads=4, seq=32, vocab=64, batch=2, dropout=0.1)
    cells = Cells(cfg, "megatron", 8)
    kinds: dict = {}  # the first and last configuration of each kind (cp, its method, ZeRO, pp, tp): 100 of 333
    for c in configurations(cfg, 4, 8):
        if c.cp > 1 or c.zero == 3:
            kinds.setdefault((c.cp, c.cp_method, c.zero, c.pp, c.tp), []).append(c)
    chosen = list({c: None for group in kinds.values() for c in (group[0], group[-1])})
    assert len(chosen) == 100 and {c.recompute for c in chosen} >= {"none", "full"}
    assert {c.microbatches for c in chosen} >= {1, 2} and {c.sp for c in chosen} == {False, True}
    assert {c.cp_method for c in chosen} == {"ring", "allgather", "alltoall"}
    assert {c.zero for c in chosen} == {0, 1, 2, 3}
    for c in chosen:
        seconds, held, _ = price(cfg, c, A100, "bf16-mixed", "megatron")
        flop_s, states = lower_bounds(cfg, c, A100, "bf16-mixed", 4)
        assert flop_s <= seconds and states <= held, c
        sums = comm_bounds(cfg, c, A100, "bf16-mixed", *stage_elements(cfg, c))[1:]
        assert cells.time_bound(c, A100, "bf16-mixed", *sums) <= seconds * (1 + 1e-12), c
        assert cells.memory_bound(c, "bf16-mixed") <= held, c


def test_the_ledger_counts_every_microbatchs_ring_messages_and_the_sums_over_cp_as_gradients():
    """A dry run's later microbatches repeat the first one's rows: the ring's messages, which a dry run folds
    into one row, too (2 microbatches send twice 1's); dp 1 x cp 2 sums the gradients over cp, priced as the
    gradient sums (hidden under the backward), not as the ring's traffic."""
    def context(m: int) -> Counter:
        [stage] = gpt_ledger(replace(LONG, seq=256, batch=m), 1, 1, 1, microbatches=m, kept="megatron", cp=2)
        return Counter({(t.kind, t.phase): t.count for t in stage.transfers})

    one, two = context(1), context(2)
    assert one[("send", "context")] == 8 and two[("send", "context")] == 16  # 2 layers x (1 forward + 3 backward)
    assert one[("allreduce", "gradients")] >= 1 and one[("allreduce", "context")] == 1  # the loss's mean over cp


@pytest.mark.parametrize("attention, cp, method, alike", [
    ("unfused", 2, "ring", True), ("flash", 1, "ring", True), ("flash", 2, "allgather", True),
    ("unfused", 2, "allgather", False), ("unfused", 1, "ring", False)])
def test_selective_recomputation_where_the_core_keeps_no_scores_is_nones_dry_run(monkeypatch, attention, cp, method,
                                                                                  alike):
    """Ring attention over cp > 1 and flash attention keep no scores, so "selective" runs "none"'s program: its
    dry run is found under none's key (one dry run for the pair a search prices), and each run apart makes the same
    ledgers; where the core keeps its scores the two keys and ledgers differ."""
    cfg = replace(LONG, seq=64, attention=attention)
    keys = {r: ledger.dry_key(cfg, 1, 1, 1, microbatches=2, recompute=r, cp=cp, cp_method=method)
            for r in ("none", "selective")}
    assert (keys["none"] == keys["selective"]) == alike
    runs = {r: ledger.dry_run(key[:8] + (r,) + key[9:]) for r, key in keys.items()}  # each as given
    assert (runs["none"] == runs["selective"]) == alike
    made: list = []
    real = ledger._dry_ledger
    monkeypatch.setattr(ledger, "_dry_ledger", lambda *key: made.append(key) or real(*key))
    monkeypatch.setattr(ledger, "_LEDGERS", {})
    for r in keys:
        ledger.gpt_ledger(cfg, 1, 1, 1, microbatches=2, recompute=r, cp=cp, cp_method=method)
    assert len(made) == (1 if alike else 2)


def test_the_command_prints_cp_and_its_estimate_command_prices_it_alike(capsys):
    sizes = "layers=2,d_model=64,heads=4,seq=2048,batch=2"
    argv = ["autoshard", "--network", "gpt", "--gpt", sizes, "--devices", "2", "--machine", "a100-dgx",
            "--memory-limit", "200M", "--fix", "cp=2", "--fix", "cp-method=allgather", "--max-dry-runs", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fixed (--fix): cp 2, cp-method allgather; the rest searched" in out
    assert " cp 2 allgather, " in out.split("chosen: ", 1)[1].splitlines()[0]
    rows = [line for line in out.splitlines() if re.match(r"\d+ +\d+ ", line)]  # the table's priced rows
    assert rows and all(line[23:29].split() == ["2g"] for line in rows), rows
    command = " ".join(line.strip().rstrip("\\") for line in out.split("the same step time and peak):", 1)[1]
                       .split("\n", 1)[1].splitlines())
    words = shlex.split(command)[1:]
    assert words[words.index("--cp") + 1] == "2" and words[words.index("--cp-method") + 1] == "allgather"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(words + ["--json"]) == 0
    chosen = float(out.split("chosen: ", 1)[1].split(": ", 1)[1].split(" ms")[0])
    assert json.loads(printed.getvalue())["step_time_s"] * 1e3 == pytest.approx(chosen, abs=5e-4)


@pytest.mark.parametrize("fix, message", [
    ("cp=3", "--fix cp=3 leaves no configuration of the GPT on 2 devices; cp can be 1, 2"),
    ("cp-method=ulysses", "--fix cp-method=ulysses must be one of ring, allgather, alltoall"),
])
def test_a_bad_cp_or_zero_fix_is_one_line(fix, message, capsys):
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4", "--devices", "2",
            "--machine", "a100-dgx", "--fix", fix]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
