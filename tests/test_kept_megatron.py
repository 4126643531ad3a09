"""The GPT with Megatron's kept set (``kept="megatron"``): Korthikanti et al.'s count, measured.

Per layer and tensor-parallel rank the blocks keep exactly the bytes of Korthikanti et al. 2022 (section
4.1, table 2) at spmdsim's widths, float64 values and 1-byte boolean masks
(spmdsim.models.gpt.memory.korthikanti_bytes(..., value_bytes=8, mask_bytes=1)), plus one named difference: each
layer norm also keeps its rows' mean and standard deviation (Apex's fused layer norm; 2 float64 a row,
s·b/t rows with sequence parallelism, s·b without: 32 s·b / t bytes a layer, 1/h of one s·b·h value
per layer norm and statistic), which the paper leaves out as negligible. Measured on simulated ranks and
in dry runs alike; every step still agrees with one numpy process. Under bf16-mixed (2-byte values, the
paper's own widths) and fp32 the blocks keep the same count at their width, the statistics float32, and each
step passes the policy's check (spmdsim.models.gpt.mixed), its first loss kept="graph"'s to the bit.
"""
from __future__ import annotations

import re
import shlex

import numpy as np
import pytest

import spmdsim
from docs_commands import ROOT, quotes, run_example
from spmdsim import DTensor, Layout, Mesh
from spmdsim.nn.autograd import kept_bytes
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.data import batch
from spmdsim.models.gpt.memory import BLOCK_KINDS, korthikanti_bytes
from spmdsim.models.gpt.parallel import GPT
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.nn.ops.megatron import column_parallel_linear

CFG = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.2)
TEXT = encode(load_text(20_000))
DP = 2
S, B, H, A = CFG.seq, CFG.batch // DP, CFG.d_model, CFG.heads


def _stats(tp: int, sp: bool, width: int = 8) -> int:
    """The bytes of the two layer norms' row statistics (mean and sqrt(var + eps), `width` bytes each: float64,
    float32 beside bfloat16 values) a layer keeps."""
    return 2 * 2 * width * S * B // (tp if sp else 1)


def _paper(tp: int, sp: bool, recompute: str, width: int = 8) -> tuple[float, float]:
    """Korthikanti et al.'s (values, masks) bytes of one layer on one tp rank, `width`-byte values, 1-byte masks."""
    values = sum(korthikanti_bytes(S, B, H, A, tp, sp, recompute, value_bytes=width, mask_bytes=0))
    masks = sum(korthikanti_bytes(S, B, H, A, tp, sp, recompute, value_bytes=0, mask_bytes=1))
    return values, masks


def _forward_kept(tp: int, sp: bool, recompute: str, dry: bool) -> list:
    """Per rank: kept_bytes(..., masks=True) of one training forward's graph, the blocks' kinds only."""

    def body():
        mesh = spmdsim.Mesh(Layout((DP, tp), ("dp", "tp")), spmdsim.world())
        model = GPT(CFG, mesh, sp=sp, recompute=recompute, kept="megatron")
        x, y = batch(TEXT, CFG, 0)
        ids = spmdsim.DTensor.from_global(mesh, x, mesh.layout("dp", None))
        targets = spmdsim.DTensor.from_global(mesh, y, mesh.layout("dp", None))
        loss = model.loss(ids, targets, 0)
        values, masks = kept_bytes([loss], exclude=list(model.params.values()), masks=True)
        return ({k: n for k, n in values.items() if k in BLOCK_KINDS},
                {k: n for k, n in masks.items() if k in BLOCK_KINDS})

    return spmdsim.simulate(DP * tp, body, dry_run=dry)


@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_each_layer_keeps_the_papers_count_plus_the_layer_norm_statistics(recompute, tp, sp):
    """Values and masks apart, on every rank, real and dry alike."""
    if tp == 1 and not sp:
        pytest.skip("tp 1: sequence parallelism changes nothing")
    values, masks = _paper(tp, sp, recompute)
    real, dry = _forward_kept(tp, sp, recompute, False), _forward_kept(tp, sp, recompute, True)
    for rank in range(DP * tp):
        kept_values, kept_masks = real[rank]
        assert sum(kept_values.values()) == CFG.layers * (values + _stats(tp, sp)), (rank, kept_values)
        assert sum(kept_masks.values()) == CFG.layers * masks, (rank, kept_masks)
        assert dry[rank] == real[rank], rank
    # Without sp every tp rank holds 4 values and 2 masks of s·b·h whole: 34 s·b·h at t = 1 (2-byte values).
    assert korthikanti_bytes(S, B, H, A, tp, sp, recompute)[0] == S * B * H * (
        (34 / tp) if sp else (10 + 24 / tp))


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_trainers_memory_report_measures_the_same_per_layer(recompute):
    """train(memory=True): the blocks' kept bytes over the layers, real and dry, at dp 2 x tp 4 with sp."""
    tp = 4

    def run():
        return train(CFG, spmdsim.world(), DP, tp, 1, TEXT, sp=True, recompute=recompute, kept="megatron",
                     memory=True, check=False)[1][-1]

    real, dry = spmdsim.simulate(DP * tp, run), spmdsim.simulate(DP * tp, run, dry_run=True)
    values, masks = _paper(tp, True, recompute)
    stats = _stats(tp, True) if recompute != "full" else 0
    for rank in range(DP * tp):
        kept = dict(real[rank].memory.kept)
        assert sum(n for k, n in kept.items() if k in BLOCK_KINDS) == CFG.layers * (values + masks + stats)
        assert real[rank].memory.kept == dry[rank].memory.kept
        assert (real[rank].calls, real[rank].bytes_sent) == (dry[rank].calls, dry[rank].bytes_sent)


def _one_step(kept: str, sp: bool, recompute: str = "none", zero: int = 0, tp: int = 2) -> list:
    def body():
        model, results = train(CFG, spmdsim.world(), DP, tp, 1, TEXT, sp=sp, recompute=recompute, zero=zero,
                               kept=kept)
        return results[0], {n: p.grad.local.copy() for n, p in model.params.items() if p.grad is not None}

    return spmdsim.simulate(DP * tp, body)


@pytest.mark.parametrize("sp", [True, False])
def test_the_same_step_as_the_graph_but_one_allgather_more_per_column_parallel_product(sp):
    """The loss and every gradient block within 1e-12 of kept="graph" (the same math, other sums' order);
    with sp the backward gathers each column-parallel product's input again (QKV's and fc1's): 2 more
    Allgathers a layer, each (t - 1)/t of s·b·h float64 values sent by every rank."""
    tp = 2
    graph, lean = _one_step("graph", sp, tp=tp), _one_step("megatron", sp, tp=tp)
    for rank in range(DP * tp):
        (g, g_grads), (m, m_grads) = graph[rank], lean[rank]
        assert m.passed and g.passed
        assert abs(m.loss - g.loss) <= 1e-12 * abs(g.loss)
        for name, block in g_grads.items():
            assert np.max(np.abs(m_grads[name] - block)) <= 1e-12 * max(np.max(np.abs(block)), 1e-300), name
        gathers = 2 * CFG.layers if sp else 0
        assert m.calls == g.calls + gathers
        assert m.bytes_sent - g.bytes_sent == gathers * (tp - 1) * S * B * H * 8 // tp


@pytest.mark.parametrize("sp, recompute, zero", [
    (True, "none", 0), (True, "selective", 1), (True, "full", 0), (False, "none", 1), (False, "selective", 0),
    (False, "full", 1)])
def test_training_under_megatrons_kept_set_matches_one_numpy_process(sp, recompute, zero):
    def run():
        return train(CFG, spmdsim.world(), DP, 2, 2, TEXT, sp=sp, recompute=recompute, zero=zero,
                     kept="megatron")[1]

    for steps in spmdsim.simulate(DP * 2, run):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps


@pytest.mark.parametrize("policy", ["fp64", "bf16-mixed"])
def test_the_pipeline_trains_with_megatrons_kept_set(policy):
    if policy != "fp64":
        pytest.importorskip("ml_dtypes")
    cfg = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=8, dropout=0.1)

    def main():
        run, steps = train_pipelined(cfg, spmdsim.world(), 2, 2, 2, 2, TEXT, sp=True, schedule="1f1b",
                                     microbatches=4, recompute="selective", zero=1, kept="megatron", memory=True,
                                     precision=policy)
        run.close()
        return steps

    for steps in spmdsim.simulate(8, main):
        assert all(r.passed and all(e <= t for e, t in zip(r.errors, r.tolerances)) for r in steps), steps
        assert policy == "fp64" or all(r.errors[2] == 0.0 for r in steps), steps


def _low(policy: str, kept: str = "megatron", sp: bool = True, recompute: str = "none", steps: int = 2) -> list:
    """Each step's StepResult (rank 0's; every rank reports the same) of a dp 2 x tp 2 run under `policy`, its
    memory measured."""
    if policy == "bf16-mixed":
        pytest.importorskip("ml_dtypes")
    results = spmdsim.simulate(DP * 2, lambda: train(CFG, spmdsim.world(), DP, 2, steps, TEXT, sp=sp,
                                                     recompute=recompute, kept=kept, precision=policy,
                                                     memory=True)[1])
    assert all(r == results[0] for r in results)
    return results[0]


@pytest.mark.parametrize("policy, sp, recompute", [
    ("bf16-mixed", True, "none"), ("bf16-mixed", True, "selective"), ("bf16-mixed", False, "full"),
    ("fp32", True, "none")])
def test_under_a_low_precision_policy_each_step_passes_and_keeps_the_papers_count(policy, sp, recompute):
    """The policy's check (spmdsim.models.gpt.mixed: the graph's rounding points), the update exact; per layer the
    blocks keep Korthikanti et al.'s count at the activations' width (2 bytes at bf16-mixed, the paper's),
    1-byte masks, plus the layer norms' float32 row statistics."""
    width = 2 if policy == "bf16-mixed" else 4
    values, masks = _paper(2, sp, recompute, width)
    stats = _stats(2, sp, 4) if recompute != "full" else 0
    for r in _low(policy, sp=sp, recompute=recompute):
        assert r.passed and r.errors[2] == 0.0, r
        assert all(e <= t for e, t in zip(r.errors, r.tolerances)), r
        kept = dict(r.memory.kept)
        assert sum(n for k, n in kept.items() if k in BLOCK_KINDS) == CFG.layers * (values + masks + stats), kept


def test_at_bf16_the_losses_are_the_graphs():
    """The same rounding points as kept="graph": the first step's loss to the bit (the forward rounds the same
    values alike), the next within the loss tolerance (the gradients' float32 sums run in another order)."""
    graph, lean = _low("bf16-mixed", kept="graph"), _low("bf16-mixed")
    assert lean[0].loss == graph[0].loss
    for g, m in zip(graph, lean):
        assert m.passed and abs(m.loss - g.loss) <= m.tolerances[0] * abs(g.loss), (g, m)


def test_at_bf16_a_row_parallel_sum_left_float32_is_caught(monkeypatch):
    """The row-parallel products' sums not rounded to bfloat16 after their Reduce_scatter (their (.., d_model)
    blocks only): the loss leaves the policy's reference beyond its tolerance at the second step."""
    from spmdsim.nn.ops import megatron

    real = megatron._rounded
    monkeypatch.setattr(megatron, "_rounded",
                        lambda block, dtype: block if block.shape[-1] == H else real(block, dtype))
    steps = _low("bf16-mixed")
    assert any(r.errors[0] > r.tolerances[0] for r in steps) and not all(r.passed for r in steps), steps


def test_the_documented_bf16_table_is_what_the_command_prints():
    """docs/howto/memory.md ("Megatron's kept set"): the bf16-mixed table is the documented command's first table,
    row for row."""
    pytest.importorskip("ml_dtypes")
    from docs_commands import ROOT, run_quoted

    command = "python scripts/memory_table.py --kept megatron --precision bf16-mixed"
    text = (ROOT / "docs/howto/memory.md").read_text()
    start = text.index("## Megatron's kept set")
    shown = text[start:]
    at = shown.index(f"`{command}`")
    table = [line for line in shown[at:].split("\n\n")[1].splitlines()]
    assert table and all(line.startswith("| ") for line in table), table
    done = run_quoted(command)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = done.stdout.splitlines()
    assert all(line in printed for line in table), (table, done.stdout)


def test_the_documented_bf16_step_is_what_bf16_s_first_command_prints():
    """docs/howto/memory.md ("At bf16-mixed and fp32"): docs/howto/bf16.md's first command with --kept megatron
    added sends the bytes in the collectives the page gives, against the graph's, and its first loss is the
    graph's to the bit (both print 4.7169847 on one CPU, 4.7169857 on another: OpenBLAS picks its kernels by the
    CPU, and they sum in another order), the figure the page gives to four decimals (it gave 4.7169018 once)."""
    pytest.importorskip("ml_dtypes")
    text = " ".join((ROOT / "docs/howto/memory.md").read_text().split())
    loss = re.search(r"its first loss kept=\"graph\"'s to the bit \((\d\.\d{4});", text).group(1)
    sent, calls, graph_sent, graph_calls = re.search(
        r"It sends ([\d,]+) bytes in (\d+) collectives against the graph's ([\d,]+) in (\d+)", text).groups()
    (quote,) = [q for q in quotes("docs/howto/bf16.md") if q.output is not None][:1]
    argv = shlex.split(quote.command)[2:]
    assert argv[-4:] == ["--steps", "3", "--sample", "0"] and "--precision" in argv, argv
    printed: dict = {}
    for kept, want in (("graph", (graph_calls, graph_sent)), ("megatron", (calls, sent))):
        done = run_example("examples/train_gpt.py", *argv[:-4], "--steps", "1", "--sample", "0", "--no-check",
                           "--kept", kept)
        assert done.returncode == 0, done.stderr[-2000:]
        assert re.search(r"^ +0 +[\d.]+ +(\d+) +([\d,]+)", done.stdout, re.M).groups() == want, (kept, done.stdout)
        printed[kept] = re.search(r"^loss ([\d.]+) \(1 step", done.stdout, re.M).group(1)
        assert f"{float(printed[kept]):.4f}" == loss, (kept, loss, done.stdout)
    assert printed["graph"] == printed["megatron"], printed


def test_a_bad_kept_choice_is_refused_in_one_line():
    with pytest.raises(SpmdsimError, match="kept 'fused' is not one of 'graph', 'megatron'"):
        spmdsim.simulate(2, lambda: train(CFG, spmdsim.world(), 2, 1, 1, TEXT, kept="fused"))


#: The large step's FLOPs by phase (spmdsim.base.flops), as counted before its dry run skipped any kernel.
PINNED_FLOPS = {"forward": 894426939392, "backward": 1788853878784, "recompute": 34359738368}


@pytest.mark.parametrize("sp, recompute", [(True, "selective"), (False, "none")])
def test_a_dry_step_counts_what_the_real_step_does(sp, recompute):
    """FLOPs by GEMM, kept bytes, calls and bytes sent of one kept="megatron" step: dry equal to real."""
    from spmdsim.base.flops import counting

    def body():
        with counting() as flops:
            r = train(CFG, spmdsim.world(), DP, 2, 1, TEXT, sp=sp, recompute=recompute, kept="megatron",
                      memory=True, check=False)[1][-1]
        return dict(flops.counts), r.memory.kept, r.calls, r.bytes_sent

    real, dry = spmdsim.simulate(DP * 2, body), spmdsim.simulate(DP * 2, body, dry_run=True)
    assert real[0][0] and real == dry


# One dry-run step of a GPT too large to write on this machine's every page, tp 8 with sp and selective
# recomputation: run in a fresh process (its peak RSS its own), it prints its peak and its ledger.
_LARGE_STEP = """
import json
import numpy as np
import spmdsim
from spmdsim.base.flops import counting
from spmdsim.models.gpt import GPTConfig
from spmdsim.models.gpt.train import train
from spmdsim.programs.memory import peak_rss

cfg = GPTConfig(layers=2, d_model=4096, heads=32, seq=2048, batch=4, vocab=128, dropout=0.1)
ids = np.arange(2 * cfg.seq + 2, dtype=np.int64) % cfg.vocab

def body():
    with counting() as flops:
        r = train(cfg, spmdsim.world(), 1, 8, 1, ids, sp=True, recompute="selective", kept="megatron",
                  memory=True, check=False)[1][-1]
    phases = {p: flops.total(p) for p in ("forward", "backward", "recompute")}
    return dict(kept=dict(r.memory.kept), flops=phases, calls=r.calls, sent=r.bytes_sent)

out = spmdsim.simulate(8, body, dry_run=True)
assert all(o == out[0] for o in out)
print("ledger", json.dumps(dict(out[0], peak=peak_rss())))
"""


def test_a_dry_run_of_a_large_megatron_step_writes_none_of_its_blocks():
    """d_model 4096, seq 2048, batch 4, tp 8 with sp, 2 layers, float64: a real run keeps 1.8 GB for the
    backward (kept_bytes), every page written, and writes larger products still (a whole (T, B, D)
    activation is 256 MiB); the dry run holds none of it: its blocks are lazy zeros, its large kernels
    skipped (the QKV and fc1 biases, the bias gradients' sums, the narrowed QKV's gradient, the head's
    einsum). Its ledger is the one measured before they were skipped."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _LARGE_STEP], capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("ledger ")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    got = json.loads(lines[0][len("ledger "):])
    assert got["kept"] == {"embedding": 339812352, "layer norm": 134283264, "attention": 343932928,
                           "mlp": 612368384, "head": 405110784}
    assert (got["calls"], got["sent"]) == (27, 5638291456)
    assert got["flops"] == PINNED_FLOPS
    # The bound: the interpreter, numpy and spmdsim with a dry run's small values (about 40 MiB) within
    # 128 MiB, plus a 16th of what a real run keeps (115 MiB). Writing any one layer's QKV output (3 s·b·h/t
    # float64: 96 MiB) and fc1 output (4 s·b·h/t: 128 MiB), or the head's (T, B, D) gradient (256 MiB),
    # passes it; before the dry run skipped them its peak was 810 MiB.
    kept = sum(got["kept"].values())
    assert got["peak"] < (128 << 20) + kept // 16, f"peak RSS {got['peak'] >> 20} MiB"


def test_column_parallel_linears_output_layouts_are_made_once_per_input_layout():
    """A step's linear layers ask for the same output layouts again and again: each is made once per (x's
    layout, the weights' split) and handed out again, equal to the one made fresh."""
    def run():
        mesh = Mesh(Layout((2,), ("tp",)))
        x = DTensor.from_global(mesh, np.ones((4, 8)), mesh.layout(None, None))
        w = DTensor.from_global(mesh, np.ones((8, 6)), mesh.layout(None, "tp"))
        ones = [column_parallel_linear(x, [(w, None)]).layout for _ in range(2)]
        stacked = [column_parallel_linear(x, [(w, None), (w, None)]).layout for _ in range(2)]
        return (ones[0] is ones[1] and stacked[0] is stacked[1], ones[0] == mesh.layout(None, "tp"),
                stacked[0] == mesh.layout(None, None, "tp"))

    assert spmdsim.simulate(2, run) == [(True, True, True)] * 2
