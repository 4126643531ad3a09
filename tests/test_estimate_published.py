"""`spmdsim estimate` beside published training measurements (docs/explanation/estimate-h100.md): what those
comparisons rest on, on small models.

A Llama trains without dropout (Meta's Llama 3 405B, NVIDIA's Llama 3.1 recipes: attention and hidden dropout 0),
and `estimate` always built its GPT with dropout 0.1: a Llama's estimate held dropout masks and the dropped-out
probabilities it never makes, and ran their kernels. `--dropout P` now sets it (0: none)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docs_commands import ROOT, quotes, run_here

LLAMA = ["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
         "--norm", "rms", "--mlp", "swiglu", "--untied", "--no-bias", "--seq", "16", "--vocab", "128",
         "--kept", "megatron"]


def _json(*argv: str) -> dict:
    batch = [] if "--global-batch" in argv else ["--global-batch", "2"]
    code, out, err = run_here("main", [*LLAMA, *batch, *argv, "--json"])
    assert code == 0, err
    return json.loads(out)


def test_dropout_0_keeps_no_dropout_mask_and_runs_no_dropout_kernel():
    """With --dropout 0 the dry run keeps no dropout mask (the head's loss mask is no dropout's) and no
    dropped-out probabilities, and its kernels move fewer bytes; the products are the same. Before, --dropout
    was refused (argparse: unrecognized arguments) and every estimate had dropout 0.1."""
    dropped, plain = _json(), _json("--dropout", "0")
    assert dropped["config"]["dropout"] == 0.1 and plain["config"]["dropout"] == 0.0
    kinds = {kind: n for kind, n in plain["stages"][0]["program_bytes"]["kept"]}
    assert [kind for kind in kinds if kind.endswith("masks")] == ["head masks"]
    before = {kind: n for kind, n in dropped["stages"][0]["program_bytes"]["kept"]}
    assert {"attention core masks", "attention masks", "mlp masks", "embedding masks"} <= set(before)
    # the attention core kept its probabilities and, with dropout, the dropped-out ones too: half as much without
    assert kinds["attention core"] * 2 == before["attention core"]
    assert plain["stages"][0]["bytes"]["activations"] < dropped["stages"][0]["bytes"]["activations"]
    for phase in ("forward", "backward"):
        assert plain["stages"][0]["kernel_bytes"][phase] < dropped["stages"][0]["kernel_bytes"][phase]
    assert plain["stages"][0]["flops"] == dropped["stages"][0]["flops"]
    assert plain["utilization"]["model_flops"] == dropped["utilization"]["model_flops"]


@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_a_dropout_outside_0_1_is_one_line(value):
    code, out, err = run_here("main", [*LLAMA, "--dropout", value])
    assert code == 2 and out == ""  # the usage error's code, as every refused option of the command
    shown = f"{float(value):g}"
    assert err.strip().splitlines()[-1] == f"spmdsim: error: --dropout {shown} must be in [0, 1) (0: no dropout, " \
                                           "as Llama trains)"


def test_a_llamas_model_flops_are_6_n_tokens_and_the_attention_term():
    """The model FLOPs the published comparisons divide by (the dry run's forward and backward products, all
    ranks) are 6 x the multiplied parameters x tokens plus the attention core's 12 L B s^2 h (scores and
    probabilities times V, every score made: spmdsim's attention masks, it does not skip), with grouped-query
    attention, SwiGLU, an untied head and a pipeline: the 6 N D count published MFUs use, less the embedding
    table (looked up, not multiplied), and the attention term."""
    layers, h, heads, kv, ffn, s, vocab, batch = 2, 64, 4, 2, 128, 16, 128, 4
    d = _json("--pp", "2", "--tp", "2", "--sp", "--global-batch", str(batch), "--dropout", "0")
    head_dim = h // heads
    per_layer = h * (heads * head_dim) + 2 * h * (kv * head_dim) + h * h + 3 * h * ffn  # q, k and v, o; w1, w3, w2
    multiplied = layers * per_layer + vocab * h  # and the untied head
    tokens = batch * s
    assert d["utilization"]["model_flops"] == 6 * multiplied * tokens + 12 * layers * batch * s * s * h


def test_the_405b_long_sequence_row_is_its_two_commands():
    """docs/explanation/estimate-h100.md's Llama 3 405B row at 131,072-token sequences: the all-gather method's and the
    ring's TFLOP/s are the row's command with `--cp-method allgather` and without it, and the ring (K and V round it
    at their own heads, all its messages under the products) is the faster step; each figure the row gives."""
    row = next(line for line in (Path(__file__).resolve().parents[1] / "docs/explanation/estimate-h100.md")
               .read_text().splitlines() if line.startswith("| Llama 3 405B, 16,384 H100 with 131,072-token"))
    argv = ("estimate gpt --layers 126 --hidden 16384 --heads 128 --kv-heads 8 --ffn 53248 --norm rms --mlp swiglu "
            "--untied --rope --no-bias --dropout 0 --seq 131072 --vocab 128256 --micro-batch 1 --global-batch 128 "
            "--tp 8 --pp 16 --cp 16 --dp 8 --sp --zero 1 --kept megatron --machine h100-dgx --first-stage-layers 7 "
            "--last-stage-layers 7 --attention flash").split()
    found = {}
    for method in ("allgather", "ring"):
        code, out, err = run_here("main", argv + ["--cp-method", method])
        assert code == 0, err
        step = float(re.search(r"predicted step time: ([\d.]+) s", out).group(1))
        mfu, rate, flops = re.search(r"MFU ([\d.]+%): ([\d.]+) TFLOP/s per GPU of the bf16 peak 989, from ([\d.e+]+) "
                                     r"model FLOPs", out).groups()
        found[method] = (step, float(rate), float(flops))
        assert f"{rate} ({mfu})" in row and f"{step:.3f} s" in row and f"{float(rate) / 380:.2f}" in row
    assert found["ring"][0] < found["allgather"][0]
    on_its_count = found["allgather"][2] / 16384 / found["ring"][0] / 1e12  # the ring on the all-gather's count
    assert f"the ring on the all-gather method's {on_its_count:.1f} ({on_its_count / 380:.2f})" in row


def _quoted_figures(*has: str, lacks: tuple = ()) -> dict:
    """The step time, MFU, TFLOP/s and most memory at a peak of the one output docs/explanation/estimate-h100.md
    quotes under the command with each of `has` and none of `lacks` (tests/test_classroom_docs.py checks the quoted
    lines against the command's own output)."""
    (quote,) = [q for q in quotes("docs/explanation/estimate-h100.md") if q.output and all(h in q.command for h in has)
                and not any(word in q.command for word in lacks)]
    text = " ".join(" ".join(quote.output).split())
    found = {"step": re.search(r"predicted step time: ([\d.]+) s", text).group(1)}
    mfu = re.search(r"MFU ([\d.]+%): ([\d.]+) TFLOP/s per GPU", text)
    peak = re.search(r"at (?:its|their) peak \(the most, stage \d+: ([\d.]+) GiB\)", text)
    return dict(found, mfu=mfu and mfu.group(1), rate=mfu and mfu.group(2), peak=peak and peak.group(1))


def _cells(prefix: str) -> list:
    """The cells of the one table row of docs/explanation/estimate-h100.md that starts with `prefix`."""
    (row,) = [line for line in (ROOT / "docs/explanation/estimate-h100.md").read_text().splitlines()
              if line.startswith(prefix)]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_the_bf16_rows_of_the_h100_table_are_the_outputs_quoted_under_them():
    """The table's BF16 rows (GPT-3 175B, Llama 3 405B, Llama 3.1 70B) give the figures of the commands the page
    quotes with their outputs, and their ratios to the published figures."""
    gpt = ("--layers 96 --hidden 12288", "--micro-batch 1 --global-batch 256 ")
    base = _quoted_figures(*gpt, lacks=("--overlap", "--recompute", "--attention", "--precision"))
    hidden = _quoted_figures(*gpt, "--overlap tp,pp", lacks=("--attention", "--precision"))
    wide = _quoted_figures("--layers 96 --hidden 12288", "--global-batch 1024", lacks=("--overlap",))
    wide_hidden = _quoted_figures("--layers 96 --hidden 12288", "--global-batch 1024", "--overlap tp,pp")
    selective = _quoted_figures(*gpt, "--recompute selective")
    with_overlap = " with `--overlap tp,pp`"
    assert _cells("| GPT-3 175B, 128 H100")[2:5] == [
        f"{base['step']} s; {hidden['step']} s{with_overlap}", "8.309 s",
        f"{float(base['step']) / 8.309:.2f}; {float(hidden['step']) / 8.309:.2f}"]
    assert _cells("| the same | MFU |")[2:5] == [
        f"{base['mfu']}; {hidden['mfu']}{with_overlap}", "53.54%",
        f"{float(base['mfu'][:-1]) / 53.54:.2f}; {float(hidden['mfu'][:-1]) / 53.54:.2f}"]
    assert _cells("| the same on 512 H100")[2:5] == [
        f"{wide['step']} s; {wide_hidden['step']} s{with_overlap}", "8.42 s",
        f"{float(wide['step']) / 8.42:.2f}; {float(wide_hidden['step']) / 8.42:.2f}"]
    assert _cells("| the same, 128 H100 | fits 80 GB")[2] == (
        f"no ({base['peak']} GiB at its peak; {selective['peak']} GiB with `--recompute selective`)")
    llama = ("--layers 126 --hidden 16384", "--seq 8192 ", "--first-stage-layers 7")
    for prefix, dp, published in (("| Llama 3 405B, 8,192 H100", "--dp 64 ", "430 (43%)"),
                                  ("| the same on 16,384 H100", "--dp 128 ", "400 (41%)")):
        figures = _quoted_figures(*llama, dp, lacks=("--attention",))
        rate = float(published.split()[0])
        assert _cells(prefix)[2:5] == [f"{figures['rate']} ({figures['mfu']})", published,
                                       f"{float(figures['rate']) / rate:.2f}"]
    figures = _quoted_figures("--layers 80 --hidden 8192", "--cp 2")
    assert _cells("| Llama 3.1 70B, 64 H100")[2:5] == [f"{figures['step']} s{with_overlap}", "14.72 s",
                                                       f"{float(figures['step']) / 14.72:.2f}"]


def _slowest_stage(out: str) -> tuple[float, str]:
    """(the predicted step in seconds, the slowest stage's block) of an `spmdsim estimate` output."""
    step, stage = re.search(r"predicted step time: ([\d.]+) s \(stage (\d+)'s", out).groups()
    return float(step), out.split(f"\nstage {stage} (")[1].split("\n\n")[0]


def _seconds(block: str, part: str) -> float:
    """The seconds a stage's step-time table gives `part` (its first row of that name)."""
    return float(re.search(rf"^ +{part} +([\d,.]+) ", block, re.M).group(1).replace(",", "")) / 1e3


def test_the_gpt3_175b_bf16_prose_is_its_commands_with_the_overlaps_and_the_fusion():
    """estimate-h100.md's account of the BF16 175B step beside NeMo's 8.309 s: the step with the recipe's overlaps,
    its phases, the accumulation kernel's bytes and seconds, and the step without that kernel, as the quoted
    command prints them with `--overlap tp,pp` and `--gradient-accumulation-fusion` (one dry run: the estimate
    keeps its ledger for the variants; about 2.5 CPU-s)."""
    (quote,) = [q for q in quotes("docs/explanation/estimate-h100.md") if q.output and "--layers 96 " in q.command
                and "--global-batch 256 " in q.command and q.command.endswith("--kept megatron --machine h100-dgx")]
    runs = {}
    for extra in ((), ("--overlap", "tp,pp"), ("--overlap", "tp,pp", "--gradient-accumulation-fusion")):
        code, out, err = run_here("main", quote.command.split()[1:] + list(extra))
        assert code == 0, err
        runs[extra[-1:]] = _slowest_stage(out)
    (plain, _), (step, block) = runs[()], runs[("tp,pp",)]
    fused, fused_block = runs[("--gradient-accumulation-fusion",)]
    kernels = [float(re.search(r"backward ([\d,.]+) GiB", b).group(1).replace(",", "")) for b in (block, fused_block)]
    elementwise = _seconds(block, "element-wise kernels")
    prose = " ".join((ROOT / "docs/explanation/estimate-h100.md").read_text().split())
    for said in (f"The step time is {plain / 8.309 - 1:.0%} long without the recipe's overlaps, "
                 f"{step / 8.309 - 1:.0%} with them",
                 f"`--overlap tp`: the layers phase, {_seconds(block, 'layers phase'):.2f} s)",
                 f"`--overlap pp`: the pipeline phase, {_seconds(block, 'pipeline phase'):.2f} s,",
                 f"out): {kernels[0] - kernels[1]:,.0f} GiB read and written, "
                 f"{elementwise - _seconds(fused_block, 'element-wise kernels'):.2f} s of the {elementwise:.2f} s of",
                 f"overlaps the whole {_seconds(block, 'communication'):.2f} s of communication is hidden, and the "
                 f"{step:.3f} s are the products ({_seconds(block, 'compute'):.2f} s,",
                 f"it is {fused:.3f} s, {1 - fused / 8.309:.1%} under the published step"):
        assert said in prose, said
