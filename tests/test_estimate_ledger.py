"""spmdsim.tools.estimate.ledger and `spmdsim estimate gpt`: the dry run's ledger is what a real run does.

At small scale (dp 2 x tp 2 x pp 2 with sequence parallelism, each recomputation mode, ZeRO-1 on and
off) a real run of the same step keeps the same bytes for backward at the moment its schedule held the
most, holds the same optimizer states, master copy and buffers, executes the same matrix products and
sends the same bytes per collective kind as each stage's line of the ledger says.
"""
from __future__ import annotations

import json
import subprocess

import pytest

import spmdsim
from docs_commands import run_here
from testkit import unfold
from spmdsim.tools.estimate.ledger import PRECISIONS, gemms_at, gpt_ledger, layers_activations, priced, transfers_at
from spmdsim.base.flop_counts import PHASES
from spmdsim.base.flops import counting
from spmdsim.models.gpt import GPTConfig
from spmdsim.models.moe.config import MoEConfig
from spmdsim.models.gpt.pipeline import train_pipelined

CFG = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, vocab=128, dropout=0.1)


def _real(recompute: str, zero: int) -> list:
    import numpy as np

    ids = np.arange(2 * CFG.seq + 2, dtype=np.int64) % 128

    def body():
        with counting() as flops:
            run, steps = train_pipelined(CFG, spmdsim.world(), 2, 2, 2, 1, ids, sp=True, microbatches=2,
                                         recompute=recompute, zero=zero, memory=True, check=False)
        sent: dict = {}
        for e in run.trace.entries:
            if e.group_size > 1:  # a message's bytes count as sent, its receive sends nothing
                key = "send" if e.op in ("sendrecv", "recv", "send") else e.op
                sent[key] = sent.get(key, 0) + e.bytes_sent
        out = (run.stage, steps[-1].memory, flops.total(), {p: flops.total(p) for p in PHASES}, sent,
               dict(flops.kernels))
        run.close()
        return out

    return spmdsim.simulate(8, body)


@pytest.mark.parametrize("recompute, zero", [("none", 0), ("selective", 1), ("full", 0), ("full", 1), ("none", 2)])
def test_the_ledger_equals_a_real_run_of_the_same_step(recompute, zero):
    ledger = gpt_ledger(CFG, 2, 2, 2, sp=True, microbatches=2, recompute=recompute, zero=zero)
    assert [(s.stage, s.ranks) for s in ledger] == [(0, (0, 1, 2, 3)), (1, (4, 5, 6, 7))]
    real = _real(recompute, zero)
    for rank, (stage, memory, total, by_phase, sent, kernels) in enumerate(real):
        mine = ledger[stage]
        assert (memory.kept, memory.master, memory.states, memory.buffers) == \
            (mine.memory.kept, mine.memory.master, mine.memory.states, mine.memory.buffers), rank
        assert 0 <= memory.params - mine.memory.params < 4096 * 40  # real blocks sit in page-rounded buffers
        assert mine.flops() == total and {p: mine.flops(p) for p in by_phase} == by_phase
        ours: dict = {}
        for (kind, _), n in mine.sent().items():
            ours[kind] = ours.get(kind, 0) + n
        assert {k: v for k, v in ours.items() if v} == {k: v for k, v in sent.items() if v}, rank
        # every element-wise, reduction and optimizer kernel, by shape, dtype and phase: the same counts
        assert dict(mine.kernels) == kernels, rank
    assert (ledger[0].flops("recompute") > 0) == (recompute != "none")
    assert (ledger[0].traffic("recompute") > 0) == (recompute != "none")
    assert ledger[0].traffic("optimizer") > 0


def test_a_zero2_ledger_holds_gradients_at_one_dp_th_of_zero1s():
    """ZeRO-2's dry run: each rank's gradients after the step are its slices of the summed gradients, 1/dp of
    ZeRO-1's gradient buffer (dp 2 over pp 2 x tp 2: a stage's buffer is padded to an even number of elements);
    the rest of the model states as ZeRO-1's; its Reduce_scatter and Allgather are the gradients' phase."""
    one, two = (gpt_ledger(CFG, 2, 2, 2, sp=True, microbatches=2, zero=zero) for zero in (1, 2))
    for a, b in zip(one, two):
        assert b.memory.grads * 2 == a.memory.grads > 0
        assert (b.memory.params, b.memory.master, b.memory.states) == (a.memory.params, a.memory.master,
                                                                       a.memory.states)
        assert b.sent() == a.sent() and ("reduce_scatter", "node") in {k for k, _ in b.sent().items()}
        assert priced(b, "fp16-mixed", 2)["gradients"] * 2 == priced(a, "fp16-mixed", 1)["gradients"]


def test_a_zero2_peak_holds_the_gradients_its_backward_measured():
    """ZeRO-2's peak is the memory line (its gradients: the slices kept between steps, the model states the ZeRO
    paper compares) plus what the dry run's backward measurably held beside them (MemoryReport.grads_peak less
    the slices, at the gradients' width): on one stage, the token embedding's gradient, final only at the walk's
    end, is among them (a vocabulary of 4,096 rows, 131,072 elements of 16,384 x 8 on a rank, at 2 bytes); the
    fit verdict's figure (peak_bytes, `--json`'s peak_bytes) is that peak. ZeRO-1 by the same rule: its gradients
    whole (its gradient buffer, each gradient accumulated in its view of it, the tied table's head gradient put
    there before the embedding's backward adds to it, as Megatron's main_grad) and nothing beside them."""
    from spmdsim.tools.estimate import ledger

    cfg = GPTConfig(layers=1, d_model=32, heads=4, seq=16, batch=2, vocab=4096, dropout=0.0)
    (stage,) = gpt_ledger(cfg, 1, 2, 1, zero=2)
    m, held = stage.memory, ledger.stage_memory(stage, "fp16-mixed", 2)
    assert held.held == priced(stage, "fp16-mixed", 2) and held.held["gradients"] == m.grads // 8 * 2
    beside = (m.grads_peak - m.grads) // 8 * 2
    assert beside >= cfg.vocab * cfg.d_model * 2  # the table's gradient whole, beside the slices
    assert ledger.peak_bytes([held]) == held.peak == held.memory + beside + held.transient.nbytes
    assert held.backward == ledger.backward_gradients(stage, "fp16-mixed", 2) == beside
    (one,) = gpt_ledger(cfg, 1, 2, 1, zero=1)
    m1, held1 = one.memory, ledger.stage_memory(one, "fp16-mixed", 1)
    assert held1.held["gradients"] == m1.grads // 8 * 2 == 2 * m.grads // 8 * 2  # whole: twice ZeRO-2's slices
    assert held1.backward == (m1.grads_peak - m1.grads) // 8 * 2 == 0
    js = json.loads(_cli("--layers", "1", "--hidden", "32", "--heads", "4", "--seq", "16", "--vocab", "4096",
                         "--dropout", "0", "--global-batch", "2", "--dp", "2", "--zero", "2",
                         "--precision", "fp16-mixed", "--json").stdout)
    (shown,) = js["stages"]
    assert (shown["backward_gradient_bytes"], shown["peak_bytes"]) == (held.backward, held.peak)


def test_a_zero2_dry_run_measures_what_the_real_runs_backward_holds(monkeypatch):
    """pp 2 x dp 2 (x tp 2, sp), two microbatches, buckets of 2,000 elements: the real run reduces each bucket in
    the last microbatch's backward, holding the first's gradients whole beside its own walk's; the dry run runs
    that backward too (it repeated the first's figures, and the step reduced every bucket: whole gradients and
    slices, 16,384 bytes short of the real figure on the last stage), so every rank's measured gradients at
    most (MemoryReport.grads_peak) are its stage's ledger's. Stage 0's real run holds one row more: the
    embedding's backward scatters into a spare last row (spmdsim.nn.autograd.rules.matmul) a dry run does not make."""
    import numpy as np

    import spmdsim.tools.estimate.ledger as ledger_module
    import spmdsim.models.gpt.buckets as trainer

    monkeypatch.setattr(trainer, "ZERO_BUCKET", 2000)
    monkeypatch.setattr(trainer, "ZERO_BUCKET_PER_DP", 1)  # 2,000 elements at any dp
    monkeypatch.setattr(ledger_module, "_LEDGERS", {})  # this bucket size's own dry run
    ids = np.arange(2 * CFG.seq + 2, dtype=np.int64) % 128

    def body():
        run, steps = train_pipelined(CFG, spmdsim.world(), 2, 2, 2, 1, ids, sp=True, microbatches=2, zero=2,
                                     memory=True, check=False)
        run.close()
        return run.stage, steps[-1].memory.grads_peak

    ledger = gpt_ledger(CFG, 2, 2, 2, sp=True, microbatches=2, zero=2)
    row = CFG.d_model * 8  # a row of the table's gradient (its rows split over tp)
    for stage, real in spmdsim.simulate(8, body):
        dry = ledger[stage].memory.grads_peak
        assert real - dry == (row if stage == 0 else 0), (stage, real, dry)


def test_prices_follow_the_precision_and_the_machine_levels():
    ledger = gpt_ledger(CFG, 1, 2, 4, sp=True, microbatches=1, gpus_per_node=2)
    (stage,) = ledger
    elements = stage.memory.params // 8
    bf16 = priced(stage, "bf16-mixed", 0)
    assert bf16["parameters"] == 2 * elements and bf16["gradients"] == 4 * elements
    assert bf16["master copy"] == 4 * elements and bf16["optimizer states"] == 8 * elements
    assert priced(stage, "fp64", 0)["master copy"] == 0  # a float64 run's parameters are their own master
    masks = sum(n for kind, n in stage.memory.kept if kind.endswith(" masks"))  # booleans: a byte at any width
    assert bf16["activations"] == (stage.memory.kept_total - masks) // 4 + masks
    # tp 4 on nodes of 2: the tensor-parallel group spans two nodes; dp pairs do too (stride 4)
    assert {t.level for t in stage.transfers} == {"cluster"}
    assert all(g.dtype == "bf16" for g, _ in gemms_at(stage.gemms, "bf16-mixed"))
    assert sum(t.sent * t.count for t in transfers_at(stage.transfers, "bf16-mixed")) * 4 == \
        sum(t.sent * t.count for t in stage.transfers if t.phase != "gradients") + \
        2 * sum(t.sent * t.count for t in stage.transfers if t.phase == "gradients")
    assert set(PRECISIONS) == {"fp64", "bf16-mixed", "fp16-mixed", "fp8"}


@pytest.mark.parametrize("zero", [1, 2])
def test_zeros_gathers_of_the_updated_parameters_move_the_parameters_width(zero):
    """ZeRO-1's and ZeRO-2's Allgather of the updated parameters moves parameter elements, its Reduce_scatter
    gradient elements: at bf16-mixed and fp8 the gathers half the bytes of the sums (bf16 parameters gathered
    in bf16, as the program gathers them: tests/test_train_bf16.py,
    test_zero1_at_bf16_keeps_float32_slices_and_gathers_bfloat16; fp32 main gradients summed in fp32), at
    fp16-mixed and fp64 the same; both still run with the gradient sums (phase "gradients")."""
    (stage,) = gpt_ledger(CFG, 1, 2, 2, sp=True, microbatches=1, zero=zero)
    gathers = [t for t in stage.transfers if t.kind == "allgather" and t.phase == "gradients"]
    assert gathers and {t.role for t in gathers} == {"parameters"}
    assert {t.role for t in stage.transfers if t not in gathers} == {""}

    def sent(precision: str, kind: str) -> int:
        return sum(t.sent * t.count for t in transfers_at(stage.transfers, precision)
                   if t.kind == kind and t.phase == "gradients")

    assert sent("fp64", "allgather") == sent("fp64", "reduce_scatter") > 0  # the same buckets' elements
    for precision, ratio in (("bf16-mixed", 2), ("fp8", 2), ("fp16-mixed", 1), ("fp64", 1)):
        assert sent(precision, "allgather") * ratio == sent(precision, "reduce_scatter"), precision


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """`spmdsim estimate gpt ARGV` (a pure command: in this process, docs_commands.run_here)."""
    code, out, err = run_here("main", ["estimate", "gpt", *argv])
    return subprocess.CompletedProcess(argv, code, out, err)


def test_the_command_prints_each_stage_within_100_columns():
    done = _cli("--pp", "4", "--dp", "1", "--tp", "2", "--sp", "--layers", "4", "--global-batch", "8",
                "--micro-batch", "1", "--recompute", "selective", "--zero", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert [line.split(" (")[0] for line in lines if line.startswith("stage ")] == ["stage 0", "stage 2", "stage 3"]
    assert "pipeline bubble" in done.stdout and "step total" in done.stdout
    js = _cli("--pp", "2", "--tp", "2", "--json")
    assert js.returncode == 0 and '"stages"' in js.stdout


@pytest.mark.parametrize("argv, message", [
    (["--global-batch", "6", "--micro-batch", "4"], "--global-batch 6 must be a multiple of --micro-batch x --dp"),
    (["--tp", "0"], "--tp 0 must be >= 1"),
    (["--machine", "nowhere-dgx"], "nowhere-dgx"),
    (["--virtual-stages", "2"], "virtual stages 2 interleave the layers over the pipeline's stages (chunk k on "
                                "stage k mod pp): they need pp 2 or more, got pp 1"),  # was a KeyError's traceback
    (["--schedule", "interleaved"], "--schedule interleaved interleaves 2 model chunks a stage (the default "
                                    "--virtual-stages) over the pipeline's stages: expected --pp 2 or "
                                    "more, got --pp 1"),
    (["--pad-vocab-to", "0"], "--pad-vocab-to 0 must be >= 1"),
    # the dry run's token ids: np.arange(2 * seq + 2) was a ValueError's traceback, or numpy asked for 149 GiB
    (["--seq", "1180591620717411303424"], "--seq 1,180,591,620,717,411,303,424 is too long; expected at most "
                                          "16,777,216 (the dry run makes a microbatch's token ids"),
    (["--seq", "10000000000"], "--seq 10,000,000,000 is too long; expected at most 16,777,216"),
    (["--micro-batch", "262145", "--global-batch", "262145"],
     "--micro-batch 262,145 x --seq 64 is 16,777,280 tokens a microbatch; expected at most 16,777,216"),
])
def test_bad_input_is_one_line(argv, message):
    done = _cli(*argv)
    text = " ".join(line.strip() for line in done.stderr.splitlines())  # one message, folded at 100 columns
    assert done.returncode != 0 and message in text and "Traceback" not in text, done.stderr
    assert text.startswith("spmdsim: error: ") and text.count("error") == 1, done.stderr


def test_the_interleaved_schedule_takes_two_chunks_a_stage_by_default_as_the_examples_do():
    """`--schedule interleaved --pp 2` was refused ("needs virtual stages >= 2, got 1") where examples/train_gpt.py
    and `spmdsim pipeline` take 2 chunks a stage; now the same default, and the same step as --virtual-stages 2."""
    default = json.loads(_cli("--pp", "2", "--layers", "8", "--schedule", "interleaved", "--json").stdout)
    given = json.loads(_cli("--pp", "2", "--layers", "8", "--virtual-stages", "2", "--json").stdout)
    plain = json.loads(_cli("--pp", "2", "--layers", "8", "--json").stdout)
    assert default["config"]["virtual_stages"] == 2 and plain["config"]["virtual_stages"] == 1
    assert default["step_time_s"] == given["step_time_s"] != plain["step_time_s"]


@pytest.mark.parametrize("tp, sp, recompute", [(2, False, "none"), (4, True, "selective"), (2, True, "none")])
def test_megatrons_kept_set_at_bf16_is_korthikantis_count(tp, sp, recompute):
    """With kept="megatron" the blocks' activations priced at bf16 (values 2 bytes, boolean masks 1) are
    Korthikanti et al.'s s·b·h(10 + 24/t + 5as/(ht)) per layer (34/t·s·b·h with sp and selective
    recomputation), plus each layer norm's two row statistics (priced as values)."""
    from spmdsim.models.gpt.memory import korthikanti_bytes

    (stage,) = gpt_ledger(CFG, 1, 1, tp, sp=sp, recompute=recompute, kept="megatron")
    s, b, h, a, layers = CFG.seq, CFG.batch, CFG.d_model, CFG.heads, CFG.layers
    per_layer = sum(korthikanti_bytes(s, b, h, a, tp, sp, recompute, value_bytes=2, mask_bytes=1))
    rows = s * b // (tp if sp else 1)
    statistics = 2 * 2 * 2 * rows  # two layer norms, mean and deviation per row, at 2 bytes
    assert layers_activations(stage, "bf16-mixed") == layers * (per_layer + statistics)


def test_the_optimizers_bytes_are_its_elements_at_the_precisions_widths():
    from spmdsim.tools.estimate.ledger import kernel_bytes

    for zero in (0, 1):
        (stage,) = gpt_ledger(CFG, 1, 2, 2, sp=True, microbatches=1, zero=zero)
        updated = stage.params if not zero else stage.memory.master // 8  # elements this rank updates
        opt = [(k, n) for k, n in stage.kernels if k.phase == "optimizer"]
        assert sum(k.read * n for k, n in opt) == 4 * updated  # the updated copy, its gradient, m and v
        assert sum(k.written * n for k, n in opt) == 3 * updated  # the updated copy, m and v
        # bf16-mixed: fp32 master, gradient and moments read (16 bytes), fp32 master and moments and the
        # bf16 parameter written (14); fp64: 8 bytes each of 4 read and 3 written
        assert kernel_bytes(opt, "bf16-mixed") == {"optimizer": 30 * updated}
        assert kernel_bytes(opt, "fp64") == {"optimizer": 56 * updated}


def test_an_equal_call_reads_the_ledger_of_the_dry_run_made_before(monkeypatch):
    """gpt_ledger keeps its ledgers by its arguments and SPMDSIM_MEMORY: an equal call runs nothing again and
    gives equal ledgers in a list of its own; another configuration or memory setting runs its own."""
    from spmdsim.tools.estimate import ledger

    runs = []
    real = ledger.simulate  # spmdsim.runtime.sim.run's, as the ledger calls it

    def counted(*args, **kwargs):
        runs.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(ledger, "simulate", counted)
    monkeypatch.setattr(ledger, "_LEDGERS", {})
    small = GPTConfig(layers=2, d_model=16, heads=2, seq=8, batch=4, vocab=32)
    first = gpt_ledger(small, 2, 1, 2, microbatches=2)
    again = gpt_ledger(small, 2, 1, 2, microbatches=2)
    assert runs == [4] and again == first and again is not first
    again.clear()  # the caller's list: the kept ledgers stay whole
    assert gpt_ledger(small, 2, 1, 2, microbatches=2) == first and runs == [4]
    other = gpt_ledger(small, 2, 1, 2, microbatches=1)
    assert runs == [4, 4] and other != first
    monkeypatch.setenv("SPMDSIM_MEMORY", "64G")
    assert gpt_ledger(small, 2, 1, 2, microbatches=2) == first and runs == [4, 4, 4]


# ---- MoE layers (cfg.moe) on a (pp, dp, ep, tp) mesh ----

MOE = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, vocab=128, dropout=0.1,
                moe=MoEConfig(experts=4, top_k=2, every=2, capacity_factor=1.25))


def _real_moe(zero: int) -> list:
    import numpy as np

    ids = np.arange(2 * MOE.seq + 2, dtype=np.int64) % 128

    def body():
        with counting() as flops:
            run, steps = train_pipelined(MOE, spmdsim.world(), 2, 1, 2, 1, ids, sp=True, microbatches=2, ep=2,
                                         zero=zero, memory=True, check=False)
        sent: dict = {}
        for e in run.trace.entries:
            if e.group_size > 1:
                key = "send" if e.op in ("sendrecv", "recv", "send") else e.op
                sent[key] = sent.get(key, 0) + e.bytes_sent
        out = (run.stage, steps[-1].memory, dict(flops.counts), sent, dict(flops.kernels))
        run.close()
        return out

    return spmdsim.simulate(8, body)


@pytest.mark.parametrize("zero", [0, 1])
def test_an_moe_ledger_equals_a_real_run_of_the_same_step(zero):
    """pp 2 x ep 2 x tp 2 with a capacity (the bytes do not depend on the routing): a real step keeps the
    same bytes for backward (the experts' fc1 output, GELU's tanh and output, the routing's arrays), holds the
    same states, executes the same products (the experts' batched GEMMs among them) and element-wise kernels,
    and sends the same bytes per kind as the dry run's ledger says; the dispatch and combine are the layers'
    transfers, the buckets over ep (the dense layers' gradients) and over dp the gradients'."""
    ledger = gpt_ledger(MOE, 2, 1, 2, sp=True, microbatches=2, zero=zero, ep=2)
    assert [(s.stage, s.ranks) for s in ledger] == [(0, (0, 1, 2, 3)), (1, (4, 5, 6, 7))]
    for rank, (stage, memory, gemms, sent, kernels) in enumerate(_real_moe(zero)):
        mine = ledger[stage]
        assert (memory.kept, memory.master, memory.states, memory.buffers) == \
            (mine.memory.kept, mine.memory.master, mine.memory.states, mine.memory.buffers), rank
        assert dict(mine.gemms) == gemms and dict(mine.kernels) == kernels, rank
        ours: dict = {}
        for (kind, _), n in mine.sent().items():
            ours[kind] = ours.get(kind, 0) + n
        assert {k: v for k, v in ours.items() if v} == {k: v for k, v in sent.items() if v}, rank
    first = ledger[0]  # blocks 0 and 1: block 1's MLP is the MoE layer, 2 of its 4 experts here, split over tp
    D, F = MOE.d_model, 4 * MOE.d_model
    assert first.expert_params == 2 * (D * F // 2 + F // 2 + F // 2 * D + D)
    # its experts' forward products: fc1 and fc2 batched over the 2 local experts, on the 2 x 2 x 10 rows each
    # gets per microbatch (ep 2 members x 2 sequences x capacity ceil(2 x 16 x 1.25 / 4)), over 2 microbatches
    experts = sum(g.flops * n for g, n in first.gemms if g.batch == 2 and g.m == 40 and g.phase == "forward")
    assert experts == 2 * 2 * (2 * 2 * 40 * D * F // 2)
    phases = {(t.kind, t.phase) for t in first.transfers}
    assert ("alltoall", "layers") in phases and ("alltoall", "gradients") not in phases
    assert ("reduce_scatter" if zero else "allreduce", "gradients") in phases


def test_a_dropless_ledger_prices_its_alltoallv_and_follows_the_routing():
    """Dropless, the dry run's routing decides the bytes: `worst` sends rank 0 every ep peer's first choices."""
    import dataclasses

    def sent(routing):
        moe = dataclasses.replace(MOE.moe, dropless=True, dry_routing=routing)
        (stage,) = gpt_ledger(dataclasses.replace(MOE, moe=moe), 1, 1, 1, microbatches=1, ep=4)
        out: dict = {}
        for t in stage.transfers:
            if t.kind.startswith("alltoall"):
                out[t.kind] = out.get(t.kind, 0) + t.sent * t.count
        return out

    balanced, worst = sent("balanced"), sent("worst")
    assert set(balanced) == set(worst) == {"alltoall", "alltoallv"}  # the counts, then the rows
    # Balanced, a rank sends 3/4 of its rows (the rest go to its own expert, copied within the rank). Under
    # `worst` rank 0 holds expert 0, every token's first choice (top-2): it dispatches its second choices alone
    # (1/2 of its rows) and its combine sends the other 3 members' first choices back (3/2): 4/3 of balanced's.
    assert 3 * worst["alltoallv"] == 4 * balanced["alltoallv"] and worst["alltoall"] == balanced["alltoall"]


def test_the_command_estimates_an_moe_gpt_and_refuses_bad_expert_settings():
    done = _cli("--experts", "8", "--ep", "4", "--tp", "2", "--sp", "--layers", "4", "--hidden", "64",
                "--global-batch", "8")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "mesh pp 1 x dp 1 x ep 4 x tp 2 (8 ranks), sp" in out
    assert "experts: 2 MoE layers of 8 experts, top-2, capacity factor 1; 2 per ep rank" in out
    assert "stage 0 (ranks 0-7: 8 ranks alike; one rank's figures)" in out
    worst = _cli("--experts", "8", "--ep", "4", "--global-batch", "8", "--dropless", "--routing", "worst").stdout
    assert "stage 0 (ranks 0-3; rank 0's figures: routed worst, the busiest; the others receive fewer tokens)" \
        in unfold(worst) and "FLOPs of matrix products, all ranks (each as busy as rank 0: at most)" in unfold(worst)
    assert ", of which the experts' " in out and "alltoall (node)" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    js = json.loads(_cli("--experts", "8", "--ep", "4", "--global-batch", "8", "--json").stdout)
    (stage,) = js["stages"]
    assert 0 < stage["expert_params"] < stage["layer_params"] < stage["params"] and js["fits"] is True
    # what it sends at the precision's widths: the exchanges' rows at bf16, a quarter of the program's float64
    (fp64,) = json.loads(_cli("--experts", "8", "--ep", "4", "--global-batch", "8", "--json", "--precision",
                              "fp64").stdout)["stages"]
    assert stage["sent"]["alltoall node"] * 4 == fp64["sent"]["alltoall node"] > 0
    for argv, message in [(["--ep", "2"], "--ep 2 splits experts: give --experts N"),
                          # the MoE layers' options without --experts: refused where given (they were ignored)
                          (["--capacity-factor", "-1"], "--capacity-factor -1 sets the MoE layers: give --experts N"),
                          (["--capacity-factor", "nan"], "--capacity-factor nan sets the MoE layers"),
                          (["--dropless"], "--dropless sets the MoE layers: give --experts N"),
                          (["--routing", "worst"], "--routing worst sets the MoE layers: give --experts N"),
                          (["--top-k", "2"], "--top-k 2 sets the MoE layers: give --experts N"),
                          (["--moe-every", "1"], "--moe-every 1 sets the MoE layers: give --experts N"),
                          (["--experts", "6", "--ep", "4"], "--experts 6 must be a multiple of --ep 4"),
                          (["--experts", "8", "--ep", "4", "--global-batch", "6"],
                           "--global-batch 6 must be a multiple of --micro-batch x --dp x --ep (1 x 1 x 4 = 4)"),
                          (["--experts", "-1"], "--experts -1 must be >= 0"),
                          (["--experts", "8", "--moe-every", "5"],
                           "--moe-every 5 makes none of the 4 blocks an MoE layer"),
                          (["--experts", "1"], "--top-k 2 must not exceed --experts 1"),
                          (["--experts", "8", "--capacity-factor", "0"],
                           "--capacity-factor 0 must be a finite number > 0 (or --dropless)"),
                          # was taken silently, the run dropless (train_moe_gpt.py refuses it too)
                          (["--experts", "8", "--dropless", "--capacity-factor", "2"],
                           "--capacity-factor 2 sets the experts' capacity, which --dropless removes: give one of "
                           "them, not both"),
                          (["--experts", "8", "--ep", "4", "--tp", "3"],
                           "the experts' hidden width 512 is not divisible by tp 3")]:
        bad = _cli(*argv)
        text = " ".join(line.strip() for line in bad.stderr.splitlines())
        assert bad.returncode != 0 and message in text and "Traceback" not in text, bad.stderr


def test_the_command_says_whether_a_rank_fits_the_machines_memory():
    """DeepSpeed-MoE's 1.3B+MoE-128 with one expert per GPU fits an 80 GiB A100 (38.42 GiB a rank at bf16
    mixed precision, 38.67 GiB at its peak: the attention dropout's backward, its gradient in and out, 2 blocks of
    (1, 16, 2048, 2048) scores, for a moment; the tied table's two gradients go into its view of the gradient
    buffer, which the memory line holds, where the walk held the head's beside it, 0.38 GiB, until the
    embedding's backward); with 16 experts a GPU (ep 8) it does not (139.70 GiB, 139.95 GiB at its peak, the
    same dropout's backward: the 16 experts' fc1 weights, 512 MiB, are parameters the memory line holds, not
    their product's moment)."""
    model = ["--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "2048", "--vocab", "50304",
             "--experts", "128", "--top-k", "1", "--micro-batch", "1", "--global-batch", "128"]
    fits = _cli(*model, "--ep", "128").stdout.splitlines()[-1]
    assert fits == ("memory: every stage fits the a100-dgx's 80.00 GiB per GPU at its peak (the most, stage 0: "
                    "38.67 GiB)")
    over = _cli(*model, "--ep", "8", "--dp", "16").stdout.split("\nto fit: ")[0].splitlines()[-1]
    assert over == "memory: stage 0 needs 139.95 GiB a rank at its peak, more than the a100-dgx's 80.00 GiB per GPU"


def test_a_zero1_dry_run_whose_experts_have_no_data_parallel_peer_touches_no_pages():
    """ZeRO-1 with one expert per GPU on 128 (ep 128, dp 1): the experts' states shard over a group of one, whose
    Reduce_scatter and Allgather are copies a dry run's zeros need not make (they wrote 6 GB of pages, 13 s)."""
    import sys

    code = ("import sys\nfrom spmdsim.tools.cli.main import main\nfrom spmdsim.programs.memory import peak_rss\n"
            "code = main(['estimate', 'gpt', '--layers', '24', '--hidden', '2048', '--heads', '16', '--seq', '2048',"
            " '--vocab', '50304', '--experts', '128', '--top-k', '1', '--ep', '128', '--micro-batch', '1',"
            " '--global-batch', '128', '--zero', '1'])\nprint('peak', peak_rss(), code)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    peak = [line.split() for line in out.stdout.splitlines() if line.startswith("peak ")]
    assert peak and peak[0][2] == "0", out.stdout[-2000:] + out.stderr[-2000:]
    assert int(peak[0][1]) < 1 << 30, f"peak RSS {int(peak[0][1]) >> 20} MiB"
    assert "memory: every stage fits the a100-dgx's 80.00 GiB per GPU" in out.stdout


def test_gpt2s_vocabulary_is_padded_as_megatron_pads_it():
    """GPT-2's 50257 tokens divide no tp > 1: the refusal names --pad-vocab-to, which the command takes
    (Megatron's 128 x tp: 50257 -> 51200 at tp 8); the dry run's embedding is the padded one."""
    model = ["--layers", "2", "--hidden", "256", "--heads", "8", "--seq", "128", "--vocab", "50257", "--tp", "8"]
    bad = _cli(*model)
    text = " ".join(line.strip() for line in bad.stderr.splitlines())
    assert bad.returncode == 2 and "vocab 50257 is not divisible by tp 8" in text and "--pad-vocab-to" in text
    padded = _cli(*model, "--pad-vocab-to", "1024", "--json")
    data = json.loads(padded.stdout)
    assert data["config"]["pad_vocab_to"] == 1024
    head = _cli(*model, "--pad-vocab-to", "1024").stdout.splitlines()[0]
    assert head == "GPT 2 layers, hidden 256, 8 heads, seq 128, vocab 50257 (padded to 51,200); global batch 8"
    # the embedding's rows are the padded ones: a rank holds 51200 / 8 of them, as with a vocabulary of 51200
    rows = [a if a != "50257" else "51200" for a in model]
    assert json.loads(_cli(*rows, "--json").stdout)["stages"][0]["params"] == data["stages"][0]["params"]
    assert json.loads(_cli(*model, "--pad-vocab-to", "128", "--json").stdout)["stages"][0]["params"] \
        < data["stages"][0]["params"]  # 50304 rows
    zero = _cli(*model, "--pad-vocab-to", "0")
    assert zero.returncode == 2 and "--pad-vocab-to 0 must be >= 1" in zero.stderr


def test_a_block_no_address_space_holds_ends_the_estimate_in_one_line_saying_it_does_not_fit():
    """docs/howto/estimate.md: at seq 1,048,576 a rank's attention scores are 32 TiB a block, which the dry run cannot
    map (numpy's MemoryError was an 80-line traceback); at bf16 still more than a GPU holds, so the line says the
    configuration does not fit. The address space is limited to 16 TiB, so that the first such block fails on
    any machine (with 47-bit addresses the third did)."""
    import sys

    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (16 << 40, 16 << 40))\n"
            "from spmdsim.tools.cli.main import main\nsys.exit(main(sys.argv[1:]))\n")
    argv = ("estimate gpt --layers 2 --hidden 4096 --heads 32 --seq 1048576 --vocab 32000 --micro-batch 1 "
            "--global-batch 1 --tp 8 --sp").split()
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    assert unfold(done.stderr).rstrip("\n") == (
        "spmdsim: error: the dry run cannot map a block of shape (1, 4, 1048576, 1048576) float64 (32 TiB): more "
        "than this machine's address space has left (a dry run's blocks cost no memory, but still their "
        "addresses); one rank of this configuration holds it, if only for a moment: at least 8 TiB at "
        "bf16-mixed, more than the a100-dgx's 80.00 GiB per GPU: it does not fit")


def test_a_model_larger_than_this_machine_is_estimated_not_refused():
    """docs/explanation/estimate.md, "A dry run is not this machine" (its flags, which the page quoted without
    --heads, --seq and --global-batch: those gave 974.36 GiB): a 48.8 GiB float64 shard (the embedding at tp 1) is more
    than this machine has, and a dry run writes none of it: the estimate runs and says the rank does not
    fit the A100."""
    done = _cli("--layers", "1", "--hidden", "65536", "--heads", "64", "--seq", "128", "--vocab", "100000",
                "--tp", "1", "--global-batch", "1", "--micro-batch", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\nto fit: ")[0].splitlines()[-1] == ("memory: stage 0 needs 974.85 GiB a rank at its "
                                                                   "peak, more than the "
                                            "a100-dgx's 80.00 GiB per GPU")


def test_the_head_counts_its_ranks_and_says_what_sp_and_zero_split_nothing():
    assert _cli("--sp").stdout.splitlines()[1].startswith(
        "mesh pp 1 x dp 1 x tp 1 (1 rank), sp (at tp 1 the sequence is not split); ")
    assert _cli("--sp", "--tp", "2", "--dp", "2").stdout.splitlines()[1].startswith(
        "mesh pp 1 x dp 2 x tp 2 (4 ranks), sp; ")
    assert _cli("--zero", "1").stdout.splitlines()[2].startswith(
        "recompute none, dropout 0.1, ZeRO 1 (a data-parallel group of one: nothing sharded), kept graph")
    assert _cli("--zero", "1", "--dp", "2").stdout.splitlines()[2].startswith(
        "recompute none, dropout 0.1, ZeRO 1, kept graph")
    # (the context-parallel ranks hold the same parameters: ZeRO shards over them too; it said "nothing sharded")
    assert _cli("--zero", "3", "--cp", "2", "--seq", "64").stdout.splitlines()[2].startswith(
        "recompute none, dropout 0.1, ZeRO 3, kept graph")


def test_the_head_says_the_dropout_it_prices():
    """A Llama priced without `--dropout 0` carried GPT-3's 0.1 (its masks and kernels) with nothing said."""
    assert _cli("--dropout", "0").stdout.splitlines()[2].startswith("recompute none, dropout 0, ZeRO 0, ")
    assert _cli("--dropout", "0.25").stdout.splitlines()[2].startswith("recompute none, dropout 0.25, ZeRO 0, ")


def test_a_transient_block_beyond_the_gpus_memory_does_not_fit_and_is_named():
    """At seq 1,048,576 with selective recomputation the ledger keeps none of the attention core (66.42 GiB a
    rank: "fits" was the answer), yet every layer's forward and backward make its (1, 4, 2^20, 2^20) scores and
    probabilities for a moment: the peak counts the largest kernel's blocks, so it does not fit, and the line
    names that kernel (the softmax's backward: scores' gradient written, probabilities and their gradient
    read, 3 x 4 x 2^40 values of 2 bytes at bf16-mixed = 24 TiB)."""
    done = _cli("--layers", "2", "--hidden", "4096", "--heads", "32", "--seq", "1048576", "--tp", "8", "--sp",
                "--recompute", "selective", "--kept", "megatron", "--global-batch", "1")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # the wrapped lines as one
    assert "memory 66.42 GiB:" in text
    assert "peak (transient included) 24,642.42 GiB: the memory above and, for a moment, the blocks of attention " \
           "softmax (backward): 24,576.00 GiB" in text  # (the gradients summed in place in their buffer: no more)
    assert text.split(" to fit: ")[0].endswith(
        "memory: stage 0 needs 24,642.42 GiB a rank at its peak, more than the a100-dgx's 80.00 GiB per GPU; "
        "attention softmax (backward) alone reads and writes 24,576.00 GiB at once")
    data = json.loads(_cli("--layers", "2", "--hidden", "4096", "--heads", "32", "--seq", "1048576", "--tp", "8",
                           "--sp", "--recompute", "selective", "--kept", "megatron", "--global-batch", "1",
                           "--json").stdout)
    assert data["fits"] is False and data["stages"][0]["transient"]["bytes"] == 3 * 4 * 2 ** 40 * 2
    assert " ".join(data["to_fit"].split()) == "to fit: " + text.split(" to fit: ")[1].split(" predicted step")[0]


@pytest.mark.parametrize("precision, width", [("bf16-mixed", 2), ("fp64", 8)])
def test_the_peak_is_the_memory_and_the_softmax_backwards_three_score_blocks(precision, width):
    """A moderate case (seq 256, 2 heads a rank, selective recomputation): the memory line keeps no score, and
    the peak adds the largest kernel's blocks, the attention softmax's backward over the (2, 2, 256, 256)
    scores (3 blocks), counted by hand (the dry run records the kernels a real run does: the tests above)."""
    argv = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "256", "--tp", "2", "--sp",
            "--micro-batch", "2", "--global-batch", "2", "--recompute", "selective", "--kept", "megatron",
            "--precision", precision]
    data = json.loads(_cli(*argv, "--json").stdout)
    stage = data["stages"][0]
    scores = 2 * 2 * 256 * 256
    assert stage["transient"] == {"bytes": 3 * scores * width, "what": "attention softmax (backward)"}
    # beside the memory line no gradient: ZeRO-0's are summed in place in their buffer (spmdsim.nn.autograd.grad_buffer)
    held = sum(stage["bytes"].values()) + stage["backward_gradient_bytes"]
    assert stage["peak_bytes"] == held + 3 * scores * width and stage["backward_gradient_bytes"] == 0
    lines = " ".join(_cli(*argv).stdout.split())
    assert f"peak (transient included) {_gib(held + 3 * scores * width)}: the memory above" in lines
    assert lines.endswith(f"at its peak (the most, stage 0: {_gib(held + 3 * scores * width)})")
    # the step keeps none of the core for backward (its kind "attention core"): the scores are transient
    kept = gpt_ledger(GPTConfig(layers=2, d_model=64, heads=4, seq=256, batch=2, vocab=128, dropout=0.1), 1, 1, 2,
                      sp=True, recompute="selective", kept="megatron")[0].memory.kept
    assert dict(kept).get("attention core", 0) == 0 and dict(kept)["attention"] > 0


def _gib(n: int) -> str:
    from spmdsim.tools.cli.estimate_report import _gib as shown

    return shown(n)


def test_the_json_config_is_the_commands_options_not_every_attribute_of_its_arguments(capsys):
    """`--json` wrote vars(args): argparse's and main()'s own attributes (func, _usage_parser, json) and any added
    later went into "config". Now its fields are named: the keys and values it had, less those three."""
    from spmdsim.tools.cli import estimate
    from spmdsim.tools.cli.main import build_parser

    args = build_parser(("estimate",)).parse_args(["estimate", "gpt", "--json", "--layers", "1", "--hidden", "16",
                                                   "--heads", "2", "--seq", "8", "--vocab", "16", "--global-batch",
                                                   "2", "--pad-vocab-to", "32"])
    args.a_later_attribute = object()  # not JSON: vars(args) put it in (as str, by json's default=str)
    assert estimate.run(args) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config == {"command": "estimate", "network": "gpt", "layers": 1, "hidden": 16, "heads": 2, "seq": 8,
                      "vocab": 16, "micro_batch": 1, "global_batch": 2, "tp": 1, "pp": 1, "dp": 1,
                      "virtual_stages": 1, "pad_vocab_to": 32, "schedule": None, "sp": False, "recompute": "none",
                      "zero": 0, "reshard_after_forward": "true", "prefetch": False, "shard_group": None,
                      "kept": "graph", "experts": 0, "ep": 1,
                      "etp": None, "top_k": 2, "moe_every": 2,
                      "capacity_factor": 1.0, "dropless": False, "routing": "balanced", "precision": "bf16-mixed",
                      "machine": "a100-dgx", "ffn": None, "kv_heads": None, "norm": "layer", "mlp": "gelu",
                      "untied": False, "rope": False, "no_bias": False, "dropout": 0.1,
                      "overlap": None, "attention": "unfused", "first_stage_layers": None,
                      "last_stage_layers": None, "stage_layers": None, "cp": 1, "cp_method": "ring",
                      "gradient_accumulation_fusion": False}
    # every option of the command is a field (a new one must be named in CONFIG_FIELDS), --json aside
    dests = {a.dest for a in build_parser(("estimate",))._subparsers._group_actions[0].choices["estimate"]._actions}
    assert dests - {"help", "json"} == set(estimate.CONFIG_FIELDS)


def test_the_peak_adds_no_block_the_memory_line_holds():
    """The transient part of the peak counts only the blocks of a product or kernel that the memory line does
    not hold already (spmdsim.base.flop_counts.Fresh: the dry run tells them apart by identity). One layer of width 256
    on one rank, seq 8, no recomputation, Megatron's kept set: MLP fc1's forward product (8 x 256) @ (256 x 1024)
    reads x, which its backward keeps, and the weight W1, a parameter: only its result (8 x 1024, before the
    bias add) is the moment's own; its weight-gradient product x^T dA reads the kept x and writes W1's gradient,
    which the memory line holds as the gradients: only dA. The largest moment is then the backward walk's sum
    of two gradients of the stacked Q, K, V into the first, in place (2 blocks of 3 x 8 x 256: the block read and
    written is one block, not two, as it was counted), not fc1's product with its weight beside it (memory +
    (2,048 + 262,144 + 8,192) x 2 bytes, as the peak was counted)."""
    from spmdsim.tools.estimate.ledger import Transient, stage_memory
    from spmdsim.base.flop_counts import Gemm

    (stage,) = gpt_ledger(GPTConfig(layers=1, d_model=256, heads=4, seq=8, batch=1, vocab=128), 1, 1, 1,
                          kept="megatron")
    fresh: dict = {}
    for f in stage.fresh:
        fresh.setdefault((f.what, f.phase), set()).add((f.floating, f.other))
    assert fresh[(Gemm(1, 8, 1024, 256, "float64", "forward"), "forward")] == {(8 * 1024, 0)}
    assert fresh[(Gemm(1, 256, 1024, 8, "float64", "backward"), "backward")] == {(8 * 1024, 0)}
    mem = stage_memory(stage, "bf16-mixed", 0)
    assert mem.transient == Transient(2 * 3 * 8 * 256 * 2, "add (backward)")
    assert mem.peak == mem.memory + 2 * 3 * 8 * 256 * 2


def _fresh(stage) -> dict:
    """(what, phase) -> the set of (floating elements, other bytes) of its Fresh records."""
    out: dict = {}
    for f in stage.fresh:
        out.setdefault((f.what, f.phase), set()).add((f.floating, f.other))
    return out


def test_an_moe_layers_products_count_no_block_the_memory_line_holds():
    """The MoE experts' products and kernels are recorded with their blocks (spmdsim.models.moe.dry._count_experts), as
    the other products are: the experts' weights (parameters), their gradients and the rows the layer keeps for its
    backward (xe, fc1's output, GELU's tanh and output) are the memory line's. One MoE layer of 4 experts on one
    rank (top-1, capacity 2 a sequence of 8, width 64, hidden 256): fc1's product reads the kept rows and W1 and
    writes fc1's kept output, nothing of its own (it counted x + W1 + h, 512 + 65,536 + 2,048 elements, W1 the
    step's largest moment); fc2's nothing either: at ep 1 with one sequence the experts' rows are in the send
    buffer's order, so the combine returns fc2's output itself, which the layer keeps for its backward (the dry
    run made a block there and counted fc2's result, 512 elements, as the real step does not); the backward's
    d w1 product only dh (not W1's gradient), d xe dh and its result (not W1); the largest moment is then GELU's
    backward (dacts in, dh out)."""
    from spmdsim.tools.estimate.ledger import Transient, stage_memory
    from spmdsim.base.flop_counts import Gemm

    cfg = GPTConfig(layers=1, d_model=64, heads=4, seq=8, batch=1, vocab=128,
                    moe=MoEConfig(experts=4, top_k=1, every=1))
    (stage,) = gpt_ledger(cfg, 1, 1, 1)
    fresh = _fresh(stage)
    rows, hidden = 4 * 2 * 64, 4 * 2 * 256  # the experts' rows (4 experts x 2 slots) at width 64 and 256
    assert fresh[(Gemm(4, 2, 256, 64, "float64", "forward"), "forward")] == {(0, 0)}  # fc1
    assert fresh[(Gemm(4, 2, 64, 256, "float64", "forward"), "forward")] == {(0, 0)}  # fc2, kept as combined
    assert fresh[(Gemm(4, 64, 256, 2, "float64", "backward"), "backward")] == {(hidden, 0)}  # d w1 = xe^T dh
    assert fresh[(Gemm(4, 2, 64, 256, "float64", "backward"), "backward")] == {(hidden + rows, 0)}  # d xe
    assert fresh[("moe bias", "forward")] == {(0, 0)}  # fc1's and fc2's outputs, both kept
    mem = stage_memory(stage, "bf16-mixed", 0)
    assert mem.transient == Transient(2 * hidden * 2, "gelu backward (backward)")


@pytest.mark.parametrize("ep, batch", [(2, 2), (1, 1), (1, 2)])
def test_an_moe_layer_counts_the_same_blocks_in_a_real_step_as_in_its_dry_run(ep, batch):
    """A real step's MoE layer (ep 2 on 2 ranks; ep 1 on one, one sequence or two) passes its own arrays where
    the dry run passes its stand-ins: the same Fresh records of its products and kernels. At ep 1 with one
    sequence the real combine returns fc2's output itself (kept for the backward), and the dry run's made a
    block: it counted fc2's result and its bias add as the moment's own (512 elements) where the real step
    holds them."""
    import numpy as np

    from spmdsim.base.flop_counts import Gemm

    cfg = GPTConfig(layers=1, d_model=64, heads=4, seq=8, batch=batch, vocab=128,
                    moe=MoEConfig(experts=4, top_k=1, every=1))

    def experts(fresh) -> set:  # the experts' products are batched over a rank's 4 / ep experts
        return {f for f in fresh if isinstance(f.what, Gemm) and f.what.batch == 4 // ep
                or isinstance(f.what, str) and f.what.startswith(("moe", "gelu"))}

    (stage,) = gpt_ledger(cfg, 1, 1, 1, ep=ep)
    ids = np.arange(batch * cfg.seq + 2, dtype=np.int64) % 128

    def body():
        with counting(blocks=True) as flops:
            run, _ = train_pipelined(cfg, spmdsim.world(), 1, 1, 1, 1, ids, memory=True, check=False, ep=ep)
        run.close()
        return experts(flops.fresh())

    dry = experts(stage.fresh)
    assert len(dry) > 10 and spmdsim.simulate(ep, body) == [dry] * ep


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_the_attention_cores_products_count_no_block_the_memory_line_holds(recompute):
    """The attention core's products are recorded with q, k and v, which its rule keeps, and the probabilities
    it keeps without recomputation (spmdsim.nn.autograd.rules.attention.count_core): one layer of 4 heads of 16 on
    one rank, seq 8, dropout, Megatron's kept set. The scores' product q k^T counts only the scores (it counted
    q + k + the scores, 512 + 512 + 256 elements); the weighted values' product reads the kept probabilities
    and v and writes the block the output projection keeps: nothing (under selective recomputation the
    probabilities, made again, are its own: 256); the backward's dy v^T dy and the gradient, dq = ds k and
    dk = ds^T q the scores' gradient and theirs, dv = pd^T dy dy and dv, none of q, k, v (nor pd but under
    recomputation)."""
    from spmdsim.base.flop_counts import Gemm

    cfg = GPTConfig(layers=1, d_model=64, heads=4, seq=8, batch=1, vocab=128, dropout=0.1)
    (stage,) = gpt_ledger(cfg, 1, 1, 1, kept="megatron", recompute=recompute)
    fresh = _fresh(stage)
    block, scores = 4 * 8 * 16, 4 * 8 * 8  # q's (and k's, v's, dy's) block and the scores' (b, h, s, s)
    again = recompute == "selective"
    assert fresh[(Gemm(4, 8, 8, 16, "float64", "forward"), "forward")] == {(scores, 0)}
    assert fresh[(Gemm(4, 8, 16, 8, "float64", "forward"), "forward")] == {(scores if again else 0, 0)}
    assert fresh[(Gemm(4, 8, 8, 16, "float64", "backward"), "backward")] == {(block + scores, 0)}
    assert fresh[(Gemm(4, 8, 16, 8, "float64", "backward"), "backward")] == \
        {(scores + block, 0), ((scores if again else 0) + 2 * block, 0)}
    if again:
        assert fresh[(Gemm(4, 8, 8, 16, "float64", "recompute"), "recompute")] == {(scores, 0)}


def test_the_optimizers_bytes_per_parameter_are_megatrons():
    """Megatron-LM's bytes per parameter with bf16 parameters and fp32 main gradients (the Megatron Core
    user guide, "Distributed Optimizer"): 18 without the distributed optimizer, 6 + 12/d with it. The dry
    run's ledger holds those (every parameter in one ZeRO-1 bucket of this rank, padded to a multiple of d),
    and beside them only what spmdsim's optimizers allocate more: one group's scratch (and gather buffer) of
    AdamW's update, 64 Ki float32 elements each; with ZeRO-1 the Reduce_scatter's slice of the summed
    gradients (4/d: Megatron reduces in place into its grad buffer) and the update's scratch. Before, the
    scratch was the parameters' size (22 B a parameter without ZeRO-1) and ZeRO-1 packed the gradients into
    a second buffer of their size (10 + 20/d)."""
    args = ("--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "64", "--vocab", "256",
            "--global-batch", "8", "--precision", "bf16-mixed", "--json")
    group = 1 << 16
    for zero, d in ((0, 1), (1, 8)):
        done = _cli(*args, "--dp", str(d), "--zero", str(zero))
        assert done.returncode == 0, done.stderr
        stage = json.loads(done.stdout)["stages"][0]
        n, held = stage["params"], stage["bytes"]
        shard = -(-n // d)
        states = held["parameters"] + held["gradients"] + held["master copy"] + held["optimizer states"]
        if zero:
            assert states == 6 * n + 12 * shard + 4 * (shard * d - n)  # the bucket's padding in its gradients
            assert held["buffers"] == 4 * shard + 4 * min(shard, group)
        else:
            assert states == 18 * n
            assert held["buffers"] == 2 * 4 * min(n, group)
        assert n > group  # the scratch is smaller than the parameters


def test_a_65b_gpt_at_tp_8_pp_2_with_full_recomputation_fits_an_a100():
    """GPT-3's 65B shape (80 layers, hidden 8192) at tp 8 with sequence parallelism, pp 2, full recomputation,
    bf16-mixed, without the distributed optimizer: Megatron-LM's 18 B a parameter, 68.45 GiB of model states a
    rank, fits 80 GiB; the ledger said 84.25 GiB, "does not fit", while AdamW kept a scratch the parameters'
    size (buffers 15.21 GiB)."""
    done = _cli("--layers", "80", "--hidden", "8192", "--heads", "64", "--seq", "2048", "--vocab", "51200",
                "--micro-batch", "1", "--global-batch", "128", "--tp", "8", "--pp", "2", "--dp", "8", "--sp",
                "--recompute", "full", "--precision", "bf16-mixed", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    first = out["stages"][0]
    assert first["bytes"]["buffers"] == 2 * 4 * (1 << 16)
    assert out["fits"] is True and out["to_fit"] is None and max(s["peak_bytes"] for s in out["stages"]) < 70 << 30


def test_hybrid_sharding_is_priced_from_its_own_dry_run():
    """`--shard-group N` (HSDP) with --zero 3: the dry run steps the hybrid mesh (dp / N, N, tp), so each rank
    holds dp / N times the parameters of ZeRO-3 over all dp, its gathers and Reduce_scatters run within a group
    (one node here, nodes of 2) and the groups' shard gradients are summed across nodes by an Allreduce, priced as
    the gradients' sums; on another pipeline or with several microbatches it is refused in one line."""
    from spmdsim.tools.estimate.ledger import gpt_ledger

    cfg = GPTConfig(layers=2, d_model=64, heads=4, seq=32, vocab=128, batch=8)
    (full,) = gpt_ledger(cfg, 1, 8, 1, zero=3, gpus_per_node=2)
    (hybrid,) = gpt_ledger(cfg, 1, 8, 1, zero=3, shard_group=2, gpus_per_node=2)
    assert hybrid.memory.params == 4 * full.memory.params
    rows = {(t.kind, t.group, t.phase, t.level) for t in hybrid.transfers}
    assert {("allgather", 2, "parameters", "node"), ("reduce_scatter", 2, "gradients", "node"),
            ("allreduce", 4, "gradients", "cluster")} <= rows
    assert ("allgather", 8, "parameters", "cluster") in {(t.kind, t.group, t.phase, t.level) for t in full.transfers}
    small = ("--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128", "--zero", "3",
             "--dp", "4", "--micro-batch", "1", "--shard-group", "2")
    assert _cli(*small, "--global-batch", "4").stdout.splitlines()[2].startswith(
        "recompute none, dropout 0.1, ZeRO 3 (hybrid: sharded over groups of 2 dp ranks, replicated over 2)")
    for given, said in (("--global-batch 8", "2 microbatches a step"), ("--global-batch 4 --pp 2", "--pp 2"),
                        ("--global-batch 4 --cp 2", "--cp 2")):
        refused = _cli(*small, *given.split())
        assert refused.returncode == 2 and " ".join(refused.stderr.split()) == (
            f"spmdsim: error: --shard-group 2 with {said}: the estimate prices hybrid sharding on one stage, one "
            "microbatch a step, without --ep or --cp"), refused.stderr
