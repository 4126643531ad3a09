"""`spmdsim estimate --overlap tp,pp` (docs/explanation/estimate.md, "The predicted step time"): the layers'
tensor-parallel collectives hidden under their GEMMs (Megatron's --tp-comm-overlap) and the pipeline's messages under
the microbatches' compute (overlap_p2p_comm), each at most that compute; without it the figures are as before (the dp
gradient sums alone hidden, under the backward). Before, the option did not exist: NeMo's GPT-3 175B recipe, which
turns both on, could not be estimated as it runs."""
from __future__ import annotations

import json
import math

import pytest

from docs_commands import run_here

# Two stages of two chunks (interleaved), tp 2 with sp, dp 2: every transfer phase has communication.
MODEL = ["estimate", "gpt", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128",
         "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--virtual-stages", "2", "--sp"]


def _run(*argv: str) -> str:
    code, out, err = run_here("main", [*MODEL, *argv])
    assert code == 0, err
    return out


def _step_times(overlap: tuple) -> list:
    """Each stage's spmdsim.tools.estimate.steptime.StepTime of MODEL, from the ledger itself, hiding `overlap`."""
    from spmdsim.tools.cli.main import build_parser
    from spmdsim.tools.cli import estimate
    from spmdsim.tools.estimate.ledger import gemms_at, gpt_ledger, kernel_bytes, transfers_at
    from spmdsim.tools.estimate.machine import load_machine
    from spmdsim.tools.estimate.steptime import Pipeline, step_time

    args = build_parser(("estimate",)).parse_args(MODEL)
    cfg, microbatches = estimate._config(args)
    machine = load_machine("a100-dgx")
    stages = gpt_ledger(cfg, 2, 2, 2, sp=True, microbatches=microbatches, schedule="interleaved", virtual=2,
                        gpus_per_node=machine.gpus_per_node)
    pipeline = Pipeline(2, microbatches, 2, "interleaved")
    return [step_time(machine, gemms_at(st.gemms, "bf16-mixed"), transfers_at(st.transfers, "bf16-mixed"),
                      pipeline=pipeline, overlap=overlap, traffic=kernel_bytes(st.kernels, "bf16-mixed"), stage=k)
            for k, st in enumerate(stages)]


def test_overlap_tp_pp_hides_the_layers_and_pipeline_under_their_compute_and_the_default_is_unchanged():
    plain, on = json.loads(_run("--json")), json.loads(_run("--overlap", "tp,pp", "--json"))
    before, after = _step_times(("gradients",)), _step_times(("gradients", "layers", "pipeline"))
    # the default: the gradient sums alone hidden, under the backward, as before (figures and words)
    assert plain["config"]["overlap"] is None and on["config"]["overlap"] == "tp,pp"
    assert [s["step_time_s"] for s in plain["stages"]] == [t.total_s for t in before]
    assert all(dict(t.hidden_by_phase) == {"layers": 0.0, "gradients": t.hidden_s, "pipeline": 0.0, "context": 0.0,
                                                "parameters": 0.0, "updates": 0.0} for t in before)
    assert plain["assumptions"][:2] == ["dp gradient sums hidden under the backward", "GEMMs at most 0.8045 of peak "
                                        "(shape)"]
    # on: the step time the ledger's stages make with the three phases hidden, each bounded by its compute
    assert [s["step_time_s"] for s in on["stages"]] == [t.total_s for t in after]
    assert on["step_time_s"] < plain["step_time_s"]
    for t, was in zip(after, before):
        comm, hidden = dict(t.comm_by_phase), dict(t.hidden_by_phase)
        assert comm["layers"] > 0 and comm["pipeline"] > 0 and hidden["layers"] > 0
        assert hidden["gradients"] == was.hidden_s  # hidden first, under the backward, as without --overlap
        assert hidden["layers"] <= min(comm["layers"], t.compute_s) and hidden["pipeline"] <= comm["pipeline"]
        # hidden up to the compute and the kernels, no more: the step is never shorter than its communication,
        # nor than its compute
        assert t.hidden_s <= t.compute_s + t.memory_s * (1 + 1e-12)
        assert math.isclose(t.total_s, t.compute_s + t.memory_s + t.optimizer_s + t.comm_s - t.hidden_s
                            + t.bubble_s, rel_tol=1e-12)
        assert t.total_s >= max(t.comm_s, t.compute_s) + t.optimizer_s
    assert on["assumptions"][:4] == ["dp gradient sums hidden under the backward", "the layers' tp collectives "
                                     "hidden under their GEMMs", "pipeline messages hidden under the microbatches' "
                                     "compute", "GEMMs at most 0.8045 of peak (shape)"]
    text = _run("--overlap", "tp,pp")
    assert "assumes: dp gradient sums hidden under the backward, the layers' tp collectives under their GEMMs,\n" \
           "  pipeline messages under the microbatches' compute; GEMMs at most 0.8045 of peak (shape);\n" in text
    default = _run()
    assert "hidden by overlap" in default and default.count("    layers phase") == 2  # one row a stage (2)
    assert text.count("    layers phase") == 4  # and one under "hidden by overlap"
    # tp alone: the pipeline's messages are not hidden
    tp = json.loads(_run("--overlap", "tp", "--json"))
    assert [s["step_time_s"] for s in tp["stages"]] == [t.total_s for t in _step_times(("gradients", "layers"))]


@pytest.mark.parametrize("argv, line", [
    (MODEL + ["--overlap", "tp,dp"], "--overlap 'tp,dp': 'dp' is unknown; expected a comma-separated list of tp, pp, "
                             "params (e.g. --overlap tp,pp), or none"),
    (MODEL + ["--overlap", "params"], "--overlap params hides ZeRO-1's and ZeRO-2's gathers of the updated "
     "parameters (Megatron's --overlap-param-gather); --zero 0 has none: give --zero 1 or 2"),
    (MODEL[:-3] + ["--sp", "--overlap", "pp"],
     "--overlap pp hides the pipeline's messages as Megatron's overlap_p2p_comm does, in the interleaved schedule "
     "only, not 1f1b; give --virtual-stages N > 1 or leave out pp"),
])
def test_a_bad_overlap_is_one_line(argv, line):
    code, out, err = run_here("main", argv)
    assert code == 2 and out == ""
    assert " ".join(err.split()).endswith(f"spmdsim: error: {line}")


@pytest.mark.parametrize("zero", ["1", "2"])
def test_overlap_params_hides_zeros_gathers_of_the_updated_parameters_under_the_forward(zero):
    """`--overlap params` (Megatron's --overlap-param-gather): ZeRO-1's and ZeRO-2's Allgathers of the updated
    parameters leave the gradient sums (hidden under the last microbatch's backward) for phase "updates",
    hidden under the forward: the same communication, no more of it hidden than the forward's compute and
    kernels, and the step no longer than without it."""
    plain = json.loads(_run("--zero", zero, "--json"))
    on = json.loads(_run("--zero", zero, "--overlap", "params", "--json"))
    assert on["config"]["overlap"] == "params"
    assert on["step_time_s"] <= plain["step_time_s"]
    text = _run("--zero", zero, "--overlap", "params")
    assert "    updates phase" in text and "    updates phase" not in _run("--zero", zero)
    assert "ZeRO's gathers of the updated parameters under the forward" in " ".join(text.split())
    for was, now in zip(plain["stages"], on["stages"]):
        assert now["step_time_s"] <= was["step_time_s"]


def test_an_moe_gpts_assumptions_name_the_experts_alltoalls_the_layers_phase_hides():
    """`--overlap tp` on an MoE GPT hides the experts' Alltoalls too (the ledger files them in the layers' phase:
    docs/explanation/estimate.md, "Overlap"); the assumes: line said "the layers' tp collectives" alone."""
    moe = ["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128",
           "--global-batch", "8", "--dp", "2", "--ep", "2", "--experts", "4", "--overlap", "tp", "--json"]
    code, out, err = run_here("main", moe)
    assert code == 0, err
    assert json.loads(out)["assumptions"][:2] == [
        "dp gradient sums hidden under the backward", "the layers' tp collectives and the experts' Alltoalls hidden "
        "under their GEMMs"]
    assert "experts" not in _run("--overlap", "tp")  # a dense GPT's line as before


def test_overlap_pp_without_a_pipeline_is_not_said_among_what_the_step_hides():
    """At --pp 1 there are no messages between stages: `--overlap tp,pp` hid what `--overlap tp` hides, but its
    assumptions line said "pipeline messages under the microbatches' compute" too. The pp is dropped there."""
    one = [a if a != "2" or MODEL[i - 1] not in ("--pp", "--virtual-stages") else "1" for i, a in enumerate(MODEL)]
    runs = {}
    for overlap in ("tp,pp", "tp"):
        code, out, err = run_here("main", [*one, "--overlap", overlap, "--json"])
        assert code == 0, err
        runs[overlap] = json.loads(out)
    said = " ".join(runs["tp,pp"]["assumptions"])
    assert "pipeline messages" not in said and "the layers' tp collectives hidden under their GEMMs" in runs[
        "tp,pp"]["assumptions"]
    assert runs["tp,pp"]["step_time_s"] == runs["tp"]["step_time_s"]
    assert runs["tp,pp"]["assumptions"] == runs["tp"]["assumptions"]
