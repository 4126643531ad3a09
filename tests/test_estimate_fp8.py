"""`spmdsim estimate --precision fp8`: the linear layers' FP8 products at the machine's fp8 peak with 1-byte operands,
the FP8 copies and scales the dry run's program holds, the refusal of a machine without an fp8 peak, and the
published FP8 rows of docs/explanation/estimate-h100.md."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from docs_commands import ROOT, quotes, run_here
from spmdsim.base.flop_counts import Gemm
from spmdsim.models.gpt import GPTConfig
from spmdsim.tools.estimate.ledger import gemms_at, gpt_ledger, priced, transfers_at
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.machine_records import GemmEfficiency
from spmdsim.tools.estimate.steptime import step_time

pytest.importorskip("ml_dtypes")

H100 = load_machine("h100-dgx")


def _seconds(gemm: Gemm, machine=H100) -> float:
    return step_time(machine, [(gemm, 1)], []).compute_s


def test_an_fp8_product_runs_at_the_fp8_peak_and_reads_a_byte_an_operand_element():
    # 33 x 64 tiles of 256 x 128: 16 full waves; a contraction at the fp8 curve's best point (16,384)
    big = Gemm(1, 8448, 8192, 16384, "float8_e4m3fn", "forward")
    waves = H100.gemm_efficiency.waves.fraction(1, big.m, big.n)
    assert waves == 1.0
    # each at its own cap: FP8 matmuls sustained at 1288.7 of 1979 TFLOP/s, bf16 ones at 708.5 of 989
    assert _seconds(big) == pytest.approx(big.flops / (1979e12 * 0.651), rel=1e-12)
    assert _seconds(Gemm(1, 8448, 8192, 16384, "bf16", "forward")) == pytest.approx(big.flops / (989e12 * 0.716),
                                                                                   rel=1e-12)
    # a product of 16 rows is bound by its traffic (on the roofline alone, without the waves' share, which
    # bounds it more): e4m3 (or e5m2) operands a byte, the bf16 result two
    roofline = replace(H100, gemm_efficiency=GemmEfficiency(0.8, "the roofline alone"))
    thin = Gemm(1, 16, 8192, 8192, "float8_e5m2", "backward")
    assert _seconds(thin, roofline) == pytest.approx((16 * 8192 + 8192 * 8192 + 2 * 16 * 8192) / 3.35e12,
                                                     rel=1e-12)
    assert _seconds(Gemm(1, 16, 8192, 8192, "bf16", "backward"), roofline) == pytest.approx(
        2 * (16 * 8192 + 8192 * 8192 + 16 * 8192) / 3.35e12, rel=1e-12)


def test_a_machine_without_an_fp8_peak_is_refused_in_one_line():
    code, out, err = run_here("main", ["estimate", "gpt", "--precision", "fp8", "--machine", "a100-dgx"])
    assert code == 2 and out == ""
    assert " ".join(err.split()) == ("spmdsim: error: --precision fp8: machine 'a100-dgx' has no fp8 peak (peak_flops "
                                     "gives bf16, fp16, tf32, fp32, fp64); give a machine whose file has one, such "
                                     "as h100-dgx")


CFG = GPTConfig(layers=3, d_model=32, heads=4, seq=16, batch=4, vocab=128, dropout=0.0)


def test_the_ledger_prices_the_fp8_blocks_and_products_the_dry_run_made():
    (st,) = gpt_ledger(CFG, 1, 2, 1, fp8=True)
    T, B, D, F, L = CFG.seq, CFG.batch // 2, CFG.d_model, 4 * CFG.d_model, CFG.layers
    # e4m3 copies each linear layer keeps for backward (its input and weights), a byte each: QKV's input and
    # three weights, the projection's, fc1's, fc2's (its input F wide)
    copies = L * (T * B * D + 3 * D * D + T * B * D + D * D + T * B * D + D * F + T * B * F + F * D)
    assert sum(n for kind, n in st.memory.kept if kind.endswith(" fp8")) == copies
    # every cast's scale, 1,024-step amax history and amax (float32): 16 tensors a layer (x, w and dy of each
    # weight, QKV's and fc1's input cast once)
    assert st.scales == L * 16 * (1 + 1024 + 1) * 4
    held = priced(st, "fp8", 0)
    assert held["fp8 scales"] == st.scales and "fp8 scales" not in priced(st, "bf16-mixed", 0)
    masks = sum(n for kind, n in st.memory.kept if kind.endswith(" masks"))  # (the loss's, a byte each)
    values = st.memory.kept_total - copies - masks  # float64 in the run, bf16 at fp8's widths
    assert held["activations"] == values // 8 * 2 + copies + masks
    # the linear layers' products (forward, dgrad, wgrad) in fp8; the rest (attention core, head) in bf16
    dtypes = {}
    for g, n in gemms_at(st.gemms, "fp8"):
        dtypes[g.dtype] = dtypes.get(g.dtype, 0) + g.flops * n
    assert dtypes["fp8"] == 3 * 2 * T * B * (3 * D * D + D * D + 2 * D * F) * L
    assert dtypes["fp8"] + dtypes["bf16"] == st.flops()
    (plain,) = gpt_ledger(CFG, 1, 2, 1)
    assert st.flops() == plain.flops()


@pytest.mark.parametrize("microbatches", [1, 2])  # the fully sharded step (sharded_run), and the pipeline trainer's
def test_zero_3_runs_the_fp8_products_and_keeps_its_gathered_weights_e4m3_copies(microbatches):
    """ZeRO-3 under FP8 (once refused: the fully sharded dry run ran without the FP8 policy): the same FP8 products,
    scales and e4m3 copies as ZeRO-1's step, the weights' copies whole (each made from the gathered weight and kept
    for the backward, a byte an element), the parameters sharded over dp."""
    (z3,) = gpt_ledger(CFG, 1, 2, 1, zero=3, microbatches=microbatches, fp8=True)
    (z1,) = gpt_ledger(CFG, 1, 2, 1, zero=1, microbatches=microbatches, fp8=True)
    (plain,) = gpt_ledger(CFG, 1, 2, 1, zero=3, microbatches=microbatches)
    T, B, D, F, L = CFG.seq, CFG.batch // 2 // microbatches, CFG.d_model, 4 * CFG.d_model, CFG.layers

    def copies(run):  # the e4m3 copies of the linear layers' inputs and weights, a byte each
        return sum(n for kind, n in run.memory.kept if kind.endswith(" fp8"))

    inputs = L * (T * B * D + T * B * D + T * B * D + T * B * F)  # QKV's (cast once), the projection's, fc1's, fc2's
    assert copies(z3) == copies(z1) == L * (3 * D * D + D * D + D * F + F * D) + inputs and copies(plain) == 0
    assert z3.scales == z1.scales > 0 and z3.memory.params * 2 == z1.memory.params
    at = {}
    for run in (z3, z1):
        for g, n in gemms_at(run.gemms, "fp8"):
            at[run is z3, g.dtype] = at.get((run is z3, g.dtype), 0) + g.flops * n
    assert at[True, "fp8"] == at[False, "fp8"] > 0 and at[True, "bf16"] == at[False, "bf16"]


def test_under_megatrons_kept_set_the_e4m3_copies_replace_the_linear_layers_inputs():
    """TransformerEngine's Linear saves its input's FP8 copy for the weight's gradient, not the input: Megatron's
    set under FP8 keeps the same e4m3 copies as the graph's, and of its bfloat16 blocks all but the four linear
    layers' inputs (QKV's and fc1's, the projection's and fc2's); the rest is Megatron's set at bf16-mixed."""
    (fp8,) = gpt_ledger(CFG, 1, 2, 1, fp8=True, kept="megatron")
    (bf16,) = gpt_ledger(CFG, 1, 2, 1, kept="megatron")
    (graph,) = gpt_ledger(CFG, 1, 2, 1, fp8=True)
    T, B, D, F, L = CFG.seq, CFG.batch // 2, CFG.d_model, 4 * CFG.d_model, CFG.layers
    a, b = dict(fp8.memory.kept), dict(bf16.memory.kept)
    copies = {kind: n for kind, n in a.items() if kind.endswith(" fp8")}
    assert copies == {kind: n for kind, n in graph.memory.kept if kind.endswith(" fp8")} and copies
    run = 8  # the dry run's float64 element
    assert b["attention"] - a["attention"] == L * 2 * T * B * D * run  # QKV's input, the projection's
    assert b["mlp"] - a["mlp"] == L * (T * B * D + T * B * F) * run  # fc1's input, fc2's
    assert {k: n for k, n in a.items() if k not in copies and k not in ("attention", "mlp")} == \
        {k: n for k, n in b.items() if k not in ("attention", "mlp")}
    assert fp8.memory.kept_total < graph.memory.kept_total
    assert fp8.flops() == graph.flops() and fp8.scales == graph.scales


def test_a_pipeline_stage_holds_its_weights_e4m3_copies_once_a_step():
    """TransformerEngine's Linear casts a weight at the step's first microbatch and keeps that copy for the others:
    a stage's weight copies (their own kind, WEIGHT_COPIES) are its linear layers' weights, a byte an element,
    however many microbatches it holds; its inputs' copies, one set per microbatch in flight."""
    from spmdsim.nn.ops.fp8_linear import WEIGHT_COPIES

    D, F, L = CFG.d_model, 4 * CFG.d_model, CFG.layers
    whole, split = gpt_ledger(CFG, 2, 1, 1, microbatches=1, fp8=True), gpt_ledger(CFG, 2, 1, 1, microbatches=4,
                                                                                  fp8=True)
    copies = [[dict(st.memory.kept)[WEIGHT_COPIES] for st in run] for run in (whole, split)]
    assert copies[0] == copies[1] and sum(copies[0]) == L * (3 * D * D + D * D + D * F + F * D)
    # stage 0 of a 1F1B over 2 stages holds 2 of its 4 microbatches (of 1 sequence) at once: half the inputs'
    # copies of the one microbatch of 4 sequences
    assert dict(split[0].memory.kept)["attention fp8"] * 2 == dict(whole[0].memory.kept)["attention fp8"]


def test_sequence_parallelism_gathers_the_e4m3_copies_at_a_byte_and_sums_the_products_at_bf16():
    """With sp the FP8 step gathers each column layer's e4m3 input along the sequence (forward, and again in the
    backward: TransformerEngine keeps the piece) and reduce-scatters each row layer's float32 product sums, which
    TransformerEngine's bf16 output moves: the trace's element types price the first at a byte an element, the
    second at fp8's activation width, as the float64 rows of the rest."""
    (st,) = gpt_ledger(CFG, 1, 1, 2, sp=True, fp8=True)
    rows = [t for t in st.transfers if t.kind in ("allgather", "reduce_scatter")]  # (not the loss's, the amaxes')
    whole = CFG.seq * CFG.batch * CFG.d_model  # one microbatch's activations, gathered (or before the scatter)
    gathered = [t for t in rows if t.kind == "allgather" and t.width == 1]
    assert sum(t.count for t in gathered) == 4 * CFG.layers and {t.nbytes for t in gathered} == {whole}
    for t in transfers_at(rows, "fp8"):
        assert t.width in (0, 1) and t.nbytes == whole * (1 if t.width else 2), t
    scattered = [t for t in rows if t.kind == "reduce_scatter"]
    (plain,) = gpt_ledger(CFG, 1, 1, 2, sp=True, kept="graph")  # bf16-mixed: as many Reduce_scatters, alike
    assert transfers_at(scattered, "fp8") == transfers_at([t for t in plain.transfers if t.kind == "reduce_scatter"],
                                                          "bf16-mixed")
    # the step prices them so: the estimate takes --sp at fp8
    code, out, err = run_here("main", ["estimate", "gpt", "--precision", "fp8", "--machine", "h100-dgx", "--tp", "2",
                                       "--sp", "--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "256"])
    assert code == 0 and "predicted step time: " in out, err


def _row(prefix: str) -> list:
    """The cells of the one table row of docs/explanation/estimate-h100.md that starts with `prefix`."""
    text = (ROOT / "docs/explanation/estimate-h100.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return [cell.strip() for cell in row.strip("|").split("|")]


def _cells(name: str) -> list:
    """The cells of the table row of docs/explanation/estimate-h100.md that starts with `name` in FP8."""
    return _row(f"| {name} in FP8")


def _predicted(argv: list) -> tuple:
    """(step seconds, TFLOP/s per GPU, the whole output) that `spmdsim` with `argv` prints."""
    code, out, err = run_here("main", argv)
    assert code == 0, err
    return (re.search(r"predicted step time: ([\d.]+) s", out).group(1),
            re.search(r"([\d.]+) TFLOP/s per GPU", out).group(1), out)


def test_the_published_fp8_row_is_the_command_quoted_under_it():
    cells = _cells("Llama 2 7B")
    predicted, published, ratio = cells[2], cells[3], cells[4]
    step, rate = re.fullmatch(r"([\d.]+) s \(([\d.]+)\)", predicted).groups()
    assert published == "3.870 s (780)" and f"{128 * 4096 / (16934 * 8):.3f}" == "3.870"  # 16,934 tokens/s a GPU
    assert ratio == f"{float(step) / 3.870:.2f}"
    (quote,) = [q for q in quotes("docs/explanation/estimate-h100.md")
                if "--precision fp8" in q.command and "--layers 32 " in q.command]
    shown = "\n".join(quote.output)
    assert f"predicted step time: {step} s" in shown and f"{rate} TFLOP/s per GPU" in shown
    code, out, err = run_here("main", quote.command.split()[1:])
    assert code == 0, err
    assert f"predicted step time: {step} s " in out and f"{rate} TFLOP/s per GPU of the bf16 peak" in out
    assert "--kept megatron" in quote.command  # NeMo's layers keep Megatron's set


@pytest.mark.parametrize("name, layers, gpus, tokens, published", [("Llama 2 13B", 40, 16, 8715, "3.760 s (760)"),
                                                                   ("Llama 2 70B", 80, 64, 1728, "4.741 s (768)")])
def test_the_pipelined_fp8_rows_are_their_commands_beside_nemos_tokens(name, layers, gpus, tokens, published):
    """NeMo's figure is tokens per second a GPU: a step of 128 sequences of 4,096 tokens on `gpus` GPUs. The
    command quoted under the table prints the row's prediction (tests/test_classroom_docs.py runs it); the
    70B's row also gives the step with the tensor-parallel collectives unhidden (`--overlap pp`)."""
    cells = _cells(name)
    step = f"{128 * 4096 / (tokens * gpus):.3f}"
    assert cells[3] == published and published.startswith(f"{step} s ")
    (quote,) = [q for q in quotes("docs/explanation/estimate-h100.md")
                if "--precision fp8" in q.command and f"--layers {layers} " in q.command]
    predicted = re.search(r"predicted step time: ([\d.]+) s", "\n".join(quote.output)).group(1)
    rate = re.search(r"([\d.]+) TFLOP/s per GPU", "\n".join(quote.output)).group(1)
    assert cells[2].endswith(f"{predicted} s ({rate})" + (" with `--overlap tp,pp`" if "tp,pp" in quote.command
                                                          else ""))
    ratios = cells[4].split("; ")
    assert ratios[-1] == f"{float(predicted) / float(step):.2f}"
    if len(ratios) == 2:  # the 70B without --overlap tp
        alone, alone_rate, _ = _predicted(quote.command.replace("tp,pp", "pp").split()[1:])
        assert cells[2].startswith(f"{alone} s ({alone_rate}) with `--overlap pp`; ")
        assert ratios[0] == f"{float(alone) / float(step):.2f}"


def test_the_gpt3_20b_fp8_row_is_its_command_beside_nemos_tokens_and_says_it_does_not_fit():
    """NeMo's GPT-3 20B figure is 5,851 tokens/s a GPU: a step of 256 sequences of 2,048 tokens on 64 GPUs. The
    row's first prediction is the command quoted under the table (tests/test_classroom_docs.py runs it), the
    second the same with the tensor-parallel collectives under the GEMMs (`--overlap tp`, run here); the memory
    row is the quote's peak, over the machine's 80 GiB."""
    cells = _cells("GPT-3 20B")
    step = f"{256 * 2048 / (5851 * 64):.3f}"
    assert cells[3] == f"{step} s (750)" == "1.400 s (750)"
    (quote,) = [q for q in quotes("docs/explanation/estimate-h100.md")
                if "--precision fp8" in q.command and "--layers 44 " in q.command]
    shown = "\n".join(quote.output)
    predicted = re.search(r"predicted step time: ([\d.]+) s", shown).group(1)
    rate = re.search(r"([\d.]+) TFLOP/s per GPU", shown).group(1)
    assert "--overlap" not in quote.command and cells[2].startswith(f"{predicted} s ({rate}); ")
    hidden, hidden_rate, out = _predicted((quote.command + " --overlap tp").split()[1:])
    assert cells[2].endswith(f"; {hidden} s ({hidden_rate}) with `--overlap tp`")
    assert cells[4] == f"{float(predicted) / float(step):.2f}; {float(hidden) / float(step):.2f}"
    peak = re.search(r"peak \(transient included\) ([\d.]+) GiB", shown).group(1)
    text = (ROOT / "docs/explanation/estimate-h100.md").read_text()
    assert f"| the same | fits 80 GB | no ({peak} GiB at its peak) | runs |" in text and float(peak) > 80
    assert f"stage 0 needs {peak} GiB a rank at its peak, more than the h100-dgx's 80.00 GiB" in out


def test_the_gpt3_175b_fp8_rows_are_their_commands_beside_nemos_tokens():
    """NeMo's GPT-3 175B in FP8: 726 tokens/s a GPU on 128 GPUs (256 sequences of 2,048 tokens a step), 782 on
    512 (2,048 sequences). The 128-GPU row's first prediction is the command quoted under the table
    (tests/test_classroom_docs.py runs it); this runs the others: the same with `--overlap tp,pp`, and both at
    512 GPUs (`--micro-batch 2 --global-batch 2048 --dp 16`), whose peak the memory row quotes."""
    (quote,) = [q for q in quotes("docs/explanation/estimate-h100.md")
                if "--precision fp8" in q.command and "--layers 96 " in q.command]
    argv = quote.command.split()[1:]
    assert argv[-2:] == ["--overlap", "pp"]
    wide = [{"--micro-batch": "2", "--global-batch": "2048", "--dp": "16"}.get(before, a)
            for before, a in zip([""] + argv, argv)]
    assert wide.count("2048") == 2 and "16" in wide
    shown = "\n".join(quote.output)
    quoted = (re.search(r"predicted step time: ([\d.]+) s", shown).group(1),
              re.search(r"([\d.]+) TFLOP/s per GPU", shown).group(1))
    for prefix, sequences, gpus, tokens, published, args in (
            ("| GPT-3 175B in FP8, 128 H100", 256, 128, 726, "(782)", argv),
            ("| GPT-3 175B in FP8, 512 H100", 2048, 512, 782, "(842)", wide)):
        cells = _row(prefix)
        step = f"{sequences * 2048 / (tokens * gpus):.3f}"
        assert cells[3] == f"{step} s {published}"
        if args is argv:
            alone, alone_rate = quoted
        else:
            alone, alone_rate, out = _predicted(args)
        hidden, hidden_rate, _ = _predicted(args[:-1] + ["tp,pp"])
        assert cells[2] == (f"{alone} s ({alone_rate}) with `--overlap pp`; "
                            f"{hidden} s ({hidden_rate}) with `--overlap tp,pp`")
        assert cells[4] == f"{float(alone) / float(step):.2f}; {float(hidden) / float(step):.2f}"
    peak = re.search(r"stage 0 needs ([\d.]+) GiB a rank at its peak, more than", out).group(1)
    text = (ROOT / "docs/explanation/estimate-h100.md").read_text()
    assert f"| the same | fits 80 GB | no ({peak} GiB at its peak) | runs |" in text
    assert "memory: every stage fits the h100-dgx's 80.00 GiB per GPU" in shown


def test_an_mfu_above_100_percent_says_why_in_one_line(tmp_path):
    """FP8 products at the fp8 peak (twice bf16's) can run faster than the bf16 peak the MFU counts them against:
    a machine file whose GEMMs reach the whole of each peak printed "MFU 167.5%" and no word why."""
    data = json.loads((ROOT / "spmdsim" / "tools" / "estimate" / "machines" / "h100-dgx.json").read_text())
    data["gemm_efficiency"] = {"model": "roofline", "max_fraction": 1, "source": "assumption: every peak reached",
                               "dtypes": {"fp8": {"fraction": 1, "source": "assumption: the fp8 peak reached"}}}
    data["hbm_bandwidth"] = 1e15
    del data["attention_efficiency"]
    path = tmp_path / "fast.json"
    path.write_text(json.dumps(data))
    argv = ["estimate", "gpt", "--layers", "1", "--hidden", "512", "--heads", "4", "--seq", "128", "--vocab", "512",
            "--global-batch", "4", "--precision", "fp8", "--machine", str(path)]
    code, out, err = run_here("main", argv + ["--json"])
    assert code == 0, err
    use = json.loads(out)["utilization"]
    why = "the FP8 products run at the fp8 peak 1,979, 2 times the bf16 peak they are counted against"
    assert use["mfu"] > 1 and use["above_peak"] == f"MFU above 100%: {why}"
    code, out, err = run_here("main", argv)
    assert code == 0, err
    assert f"nothing recomputed: HFU the same) MFU above 100%: {why} assumes:" in " ".join(out.split())
    # the shipped file's products stay under its peaks: no such line, and the JSON's key is null
    code, out, err = run_here("main", argv[:-2] + ["--machine", "h100-dgx", "--json"])
    assert code == 0 and json.loads(out)["utilization"]["above_peak"] is None
