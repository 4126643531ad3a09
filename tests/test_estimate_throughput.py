"""`spmdsim estimate`: the MFU and HFU lines are the dry run's FLOPs at the predicted step time, and the
assumptions line is the machine file's (docs/howto/estimate.md, "MFU, HFU and what the prediction assumes")."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import spmdsim.tools.estimate
from docs_commands import quotes, run_here
from spmdsim.errors import SpmdsimError
from spmdsim.tools.estimate.ledger import gpt_ledger
from spmdsim.tools.estimate.steptime import utilization
from spmdsim.models.gpt import GPTConfig
from testkit import unfold

MODEL = ["estimate", "gpt", "--hidden", "64", "--heads", "4", "--seq", "128", "--vocab", "128", "--global-batch", "4",
         "--micro-batch", "1", "--pp", "2", "--tp", "2", "--sp"]


def _estimate(*argv: str) -> tuple[str, dict]:
    """(the text output, the --json output) of `spmdsim estimate gpt ...`."""
    code, out, err = run_here("main", [*MODEL, *argv])
    assert code == 0, err
    assert all(len(line) <= 100 for line in out.splitlines())
    code, raw, err = run_here("main", [*MODEL, *argv, "--json"])
    assert code == 0, err
    return out, json.loads(raw)


def _ledger_flops(layers: int, recompute: str) -> tuple[int, int]:
    """(forward and backward, all) FLOPs of every rank of MODEL's step, from the ledger itself."""
    cfg = GPTConfig(vocab=128, d_model=64, heads=4, layers=layers, seq=128, batch=4, dropout=0.1)
    stages = gpt_ledger(cfg, 2, 1, 2, sp=True, microbatches=4, recompute=recompute, kept="graph", gpus_per_node=8)
    model = sum((st.flops("forward") + st.flops("backward")) * len(st.ranks) for st in stages)
    return model, sum(st.flops() * len(st.ranks) for st in stages)


@pytest.mark.parametrize("layers", [2, 4])
def test_the_mfu_line_is_the_dry_runs_flops_at_the_predicted_step_time(layers):
    """The model's FLOPs follow the model (2 layers, then 4: each count is the ledger's of that model), and the
    TFLOP/s and MFU are those FLOPs over the GPUs and the predicted step time, against the bf16 peak."""
    out, data = _estimate("--layers", str(layers), "--recompute", "selective")
    out = unfold(out)  # the MFU line folded within 100 columns, on one line
    model, hardware = _ledger_flops(layers, "selective")
    use = data["utilization"]
    assert (use["model_flops"], use["hardware_flops"], use["gpus"]) == (model, hardware, 4)
    assert model < hardware  # selective recomputation makes the scores again
    assert use["step_time_s"] == data["step_time_s"] and use["peak_flops_per_gpu"] == 312e12
    per_gpu = model / 4 / data["step_time_s"]
    assert use["tflops_per_gpu"] == pytest.approx(per_gpu / 1e12, rel=1e-12)
    assert use["mfu"] == pytest.approx(per_gpu / 312e12, rel=1e-12)
    assert use["hfu"] == pytest.approx(hardware / 4 / data["step_time_s"] / 312e12, rel=1e-12)
    assert (f"MFU {use['mfu']:.1%}: {use['tflops_per_gpu']:,.1f} TFLOP/s per GPU of the bf16 peak 312, from "
            f"{model:.4e} model FLOPs a step (the dry run's forward and backward products, all ranks)\n") in out
    assert (f"HFU {use['hfu']:.1%}: {use['hardware_tflops_per_gpu']:,.1f} TFLOP/s per GPU with the "
            f"{hardware - model:.4e} FLOPs recomputed\n") in out
    # the head's count of the step's products is the hardware's
    assert f"one step: {hardware:.4e} FLOPs of matrix products, all ranks" in out


def test_without_recomputation_the_hfu_is_the_mfu_and_full_recomputation_counts_a_forward_again():
    out, data = _estimate("--layers", "2", "--recompute", "none")
    use = data["utilization"]
    assert use["hardware_flops"] == use["model_flops"] == _ledger_flops(2, "none")[0] and use["hfu"] == use["mfu"]
    assert "all ranks; nothing recomputed: HFU the same)\nassumes: " in out and "\nHFU " not in out
    _, full = _estimate("--layers", "2", "--recompute", "full")
    model, hardware = _ledger_flops(2, "full")
    assert (full["utilization"]["model_flops"], full["utilization"]["hardware_flops"]) == (model, hardware)
    assert model == use["model_flops"]  # recomputation changes the hardware's FLOPs, not the model's
    # the recomputed products are the transformer layers' forward again: under a third of the model's (a forward
    # and a backward of twice its products), the head's forward not among them
    assert 0 < hardware - model < model / 3


def test_the_assumptions_are_the_machine_files(tmp_path):
    """The assumptions lines read the machine file: another GEMM cap, HBM and link efficiencies are printed as
    given (a link without one at 1), and the prediction and the MFU change with them."""
    out, data = _estimate("--layers", "2")
    # --json: each assumption one whole string (it gave the text's two lines, cut where the text wraps them)
    assert data["assumptions"] == ["dp gradient sums hidden under the backward", "GEMMs at most 0.8045 of peak (shape)",
                                   "other kernels at 0.88 of HBM bandwidth",
                                   "ring collectives at 0.775 (node), 0.96 (cluster) of links"]
    assert ("\nassumes: dp gradient sums hidden under the backward; GEMMs at most 0.8045 of peak (shape);\n"
            "  other kernels at 0.88 of HBM bandwidth; ring collectives at 0.775 (node), 0.96 (cluster) of links\n"
            in out)  # two lines, as printed
    raw = json.loads((Path(spmdsim.tools.estimate.__file__).parent / "machines" / "a100-dgx.json").read_text())
    raw["gemm_efficiency"]["max_fraction"] = 0.6
    raw["hbm_efficiency"]["fraction"] = 0.5
    raw["links"]["node"]["efficiency"]["fraction"] = 0.7
    del raw["links"]["cluster"]["efficiency"]
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(raw | {"name": "slow"}))
    slow_out, slow = _estimate("--layers", "2", "--machine", str(path))
    assert slow["assumptions"] == ["dp gradient sums hidden under the backward", "GEMMs at most 0.6 of peak (shape)",
                                   "other kernels at 0.5 of HBM bandwidth",
                                   "ring collectives at 0.7 (node), 1 (cluster) of links"]
    assert ("\nassumes: dp gradient sums hidden under the backward; GEMMs at most 0.6 of peak (shape);\n"
            "  other kernels at 0.5 of HBM bandwidth; ring collectives at 0.7 (node), 1 (cluster) of links\n"
            in slow_out)
    assert slow["step_time_s"] > data["step_time_s"]
    assert slow["utilization"]["mfu"] < data["utilization"]["mfu"]
    assert slow["utilization"]["model_flops"] == data["utilization"]["model_flops"]  # the same dry run


def test_the_text_and_json_agree_on_every_figure():
    out, data = _estimate("--layers", "2", "--recompute", "full")
    mfu = re.search(r"\nMFU ([0-9.]+)%: ([0-9.,]+) TFLOP/s per GPU", out)
    assert float(mfu.group(1)) == round(data["utilization"]["mfu"] * 100, 1)
    assert float(mfu.group(2).replace(",", "")) == round(data["utilization"]["tflops_per_gpu"], 1)


def test_the_json_gives_the_models_parameters_and_the_steps_flops_the_text_gives():
    """The text's `model N parameters; one step: F FLOPs` line: --json had F (the hardware FLOPs) but not N, so a
    program sweeping model sizes had to count the parameters itself."""
    out, data = _estimate("--layers", "2", "--recompute", "full")
    model = re.search(r"\nmodel ([0-9,]+) parameters; one step: ([0-9.e+]+) FLOPs", out)
    # two layers of 12 x 64² + 13 x 64, the token and position tables of 128 x 64
    assert data["parameters"] == int(model.group(1).replace(",", "")) == 116_352
    assert f"{data['utilization']['hardware_flops']:.4e}" == model.group(2)


@pytest.mark.parametrize("args, message", [
    ((-1, 0, 1, 1.0, 1.0), "model flops -1 must be an integer >= 0 (FLOPs of one step, all GPUs)"),
    ((2, 1, 1, 1.0, 1.0), "hardware flops 1 must be at least the model flops 2 (they add the recomputed products)"),
    ((1, 1, 0, 1.0, 1.0), "gpus 0 must be an integer >= 1"),
    ((1, 1, 1, 0.0, 1.0), "step seconds 0.0 must be a finite number > 0"),
    ((1, 1, 1, 1.0, float("nan")), "peak nan must be a finite number > 0"),
])
def test_utilization_refuses_bad_values_in_one_line(args, message):
    with pytest.raises(SpmdsimError, match=f"^{re.escape(message)}$"):
        utilization(*args)


def _quoted(text: str, what: str) -> dict:
    """{"MFU": (percent, TFLOP/s), "HFU": ...} of the output docs/explanation/estimate-published.md quotes under the
    command with `what` (tests/test_classroom_docs.py checks the quoted lines against the command's own output)."""
    from docs_commands import quotes

    (quote,) = [q for q in quotes("docs/explanation/estimate-published.md") if what in q.command and q.output
                and any(line.startswith("MFU ") for line in q.output)]
    out = {}
    for line in quote.output:
        m = re.match(r"(MFU|HFU) ([0-9.]+%): ([0-9.,]+) TFLOP/s per GPU", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


def test_the_docs_comparisons_with_the_papers_are_the_quoted_outputs():
    """docs/explanation/estimate-published.md's table beside Korthikanti's Table 5 and Narayanan's Table 1, and its
    prose, give the MFU, HFU and TFLOP/s the commands it quotes print (each quoted line is checked against
    the program)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "explanation" / "estimate-published.md").read_text()
    prose = " ".join(text.split())
    # (the 22B model's own flags: the Mixtral section quotes a selective, kept megatron run with an MFU line too)
    selective = _quoted(text, "--hidden 6144 --heads 64 --seq 2048 --vocab 51200 --micro-batch 4 --global-batch 4 "
                              "--tp 8 --sp --recompute selective --kept megatron")
    (mfu, _), (hfu, _) = selective["MFU"], selective["HFU"]
    assert f"MFU, HFU | {mfu}, {hfu} | 41.5%, 43.7% | Korthikanti et al. 2022, Table 5 |" in text
    assert f"the estimate's are {mfu} and {hfu} at its 1.094 s (the command above)" in prose
    full = _quoted(text, "--hidden 6144 --heads 64 --seq 2048 --vocab 51200 --micro-batch 4 --global-batch 4 --tp 8 "
                         "--recompute full --kept megatron")
    assert f"Full recomputation: MFU {full['MFU'][0]} (1.446 s), HFU {full['HFU'][0]}." in prose
    big = _quoted(text, "--pp 64 --dp 6")
    (mfu, model), (hfu, hardware) = big["MFU"], big["HFU"]
    assert f"(HFU) | {hardware} ({hfu}) | 163 (52%) | Narayanan et al. 2021, Table 1 |" in text
    assert f"make {hardware} TFLOP/s per GPU, HFU {hfu} (the FLOPs command above)" in prose
    assert f"Its MFU, counting the forward once, is {mfu}, {model} TFLOP/s" in prose


def _quote_text(*has: str, lacks: str = "\n") -> str:
    """The output docs/explanation/estimate-published.md quotes under the one command with each of `has` and not
    `lacks`, its lines joined (tests/test_classroom_docs.py checks the quoted lines against the command's own
    output)."""
    (quote,) = [q for q in quotes("docs/explanation/estimate-published.md")
                if q.output and all(h in q.command for h in has) and lacks not in q.command]
    return " ".join(" ".join(quote.output).split())


def _spmdsim_cell(prefix: str) -> str:
    """The spmdsim column of the one row of docs/explanation/estimate-published.md's first table starting with
    `prefix`."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "explanation" / "estimate-published.md").read_text()
    (row,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return row.strip("|").split("|")[1].strip()


def test_the_published_figures_table_gives_the_outputs_quoted_below_it():
    """The first table's memory, ZeRO, FLOPs, step-time and activation rows are the figures the quoted commands
    print."""
    zero = "--dp 64 --precision fp16-mixed --zero "
    for level, prefix in ((0, "| 7.5B, 64 dp ranks"), (1, "| the same, optimizer states sharded"),
                          (2, "| the same, gradients sharded too"), (3, "| the same, parameters sharded too")):
        states = re.search(r"model states [\d.]+ GiB \(([\d.]+ GB)\)", _quote_text(zero + str(level))).group(1)
        assert _spmdsim_cell(prefix) == states, level
    big = _quote_text("--pp 64 --dp 6")
    flops = re.search(r"one step: ([\d.]+e\+\d+) FLOPs", big).group(1)
    assert _spmdsim_cell("| 1T, one step's FLOPs") == flops.replace("e+", "e")
    step = float(re.search(r"predicted step time: ([\d.]+) s", big).group(1))
    assert _spmdsim_cell("| 1T, 3,072 A100 (t 8, p 64, d 6): step time") == f"{step:.1f} s"
    for prefix, flags in (("| 22B, 8 A100, sp + selective recomputation (`--kept megatron`): step time",
                           "--tp 8 --sp --recompute selective --kept megatron --precision"),
                          ("| 22B, 8 A100, full recomputation", "--tp 8 --recompute full --kept megatron")):
        step = re.search(r"predicted step time: ([\d.]+ s)", _quote_text(flags)).group(1)
        assert _spmdsim_cell(prefix) == step, prefix
    kept = _quote_text("--tp 8 --sp --recompute selective --kept megatron", lacks="--precision")
    states = re.search(r"model states [\d.]+ GiB \([\d.]+ GB\), of which the transformer layers' ([\d.]+ GiB)", kept)
    assert _spmdsim_cell("| 22B, t 8: weights, gradients and Adam") == states.group(1)
    layers = re.search(r"activations [\d.]+ GiB, of which the transformer layers' ([\d.]+ GiB)", kept)
    assert _spmdsim_cell("| 22B, t 8, sp + selective: the layers' activations") == layers.group(1)


def test_an_mfu_above_100_percent_from_a_causal_attention_says_why(tmp_path):
    """The model FLOPs count a causal attention's products whole, its fused kernel executes half of them: on a machine
    file whose kernels reach their whole peak, a long sequence printed "MFU 139.5%" and no word why."""
    raw = json.loads((Path(spmdsim.tools.estimate.__file__).parent / "machines" / "h100-dgx.json").read_text())
    raw["gemm_efficiency"] = {"model": "roofline", "max_fraction": 1, "source": "assumption: the whole peak"}
    raw["hbm_bandwidth"] = 1e15
    raw["attention_efficiency"] = {"forward": 1, "backward": 1, "source": "assumption: the whole peak"}
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(raw))
    code, out, err = run_here("main", ["estimate", "gpt", "--layers", "1", "--hidden", "256", "--heads", "2", "--seq",
                                       "4096", "--vocab", "512", "--global-batch", "1", "--attention", "flash",
                                       "--machine", str(path), "--json"])
    assert code == 0, err
    use = json.loads(out)["utilization"]
    assert use["mfu"] > 1 and use["above_peak"] == ("MFU above 100%: a causal attention's products are counted whole, "
                                                    "where its fused kernel executes half of them")
