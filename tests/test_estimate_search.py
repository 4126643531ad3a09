"""spmdsim.tools.estimate.search and `spmdsim autoshard --network gpt --machine`: the choice is the fastest
configuration under the memory limit by each configuration's own dry-run estimate."""
from __future__ import annotations

import json
from dataclasses import replace
import re
from pathlib import Path

import numpy as np
import pytest

import spmdsim.tools.estimate
from spmdsim.tools.cli.main import main
from spmdsim.errors import SpmdsimError
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.closed_forms import lower_bounds
from spmdsim.tools.estimate.configs import SEARCHED_METHODS, Config, configurations
from spmdsim.tools.estimate.search import price, search
from spmdsim.models.gpt import GPTConfig

from testkit import unfold

CFG = GPTConfig(layers=2, d_model=32, heads=2, seq=64, batch=4, vocab=128, dropout=0.1)
A100 = load_machine("a100-dgx")


def test_the_configurations_are_every_valid_mesh_schedule_and_memory_choice():
    configs = configurations(CFG, 2, 8, cp=1)  # (cp's: tests/test_estimate_search_context.py)
    # tp 2 x pp 1 x dp 1, tp 1 x pp 2, tp 1 x pp 1 x dp 2; ZeRO only with dp > 1, sp only with tp > 1
    assert {(c.tp, c.pp, c.dp) for c in configs} == {(2, 1, 1), (1, 2, 1), (1, 1, 2)}
    assert all(c.dp > 1 or c.zero == 0 for c in configs) and all(c.tp > 1 or not c.sp for c in configs)
    # pp 2 with 2 layers: v 1 only (a virtual stage needs a layer); microbatches divide batch / dp
    assert {c.microbatches for c in configs if c.dp == 2} == {1, 2}
    assert {c.microbatches for c in configs if c.dp == 1} == {1, 2, 4}
    assert {c.zero for c in configs if c.dp == 2} == {0, 1, 2, 3}
    # tp 2: sp or not x m 1, 2, 4 x 3 recomputations; pp 2: m x 3; dp 2: m 1, 2 x ZeRO 0, 1, 2, 3 x 3
    assert len(configs) == len(set(configs)) == 2 * 3 * 3 + 3 * 3 + 2 * 4 * 3
    assert all(c.virtual == 1 for c in configs)


def test_the_ranking_is_the_configurations_own_estimates_sorted():
    calls = []

    def pricer(*args):
        calls.append(args[1])
        return price(*args)

    # the closed forms' bounds alone (cells=False): the layer cells' bounds are tests/test_estimate_bounds.py's,
    # and on this 2-layer model their small dry runs cost more than pricing every configuration
    r = search(CFG, 2, A100, 1 << 40, max_dry_runs=1000, pricer=pricer, cells=False)
    priced = [c for c in r.candidates if c.step_s is not None]
    assert len(priced) == r.dry_runs == len(calls) and r.chosen is priced[0] and r.chosen.verdict == "chosen"
    assert [round(c.step_s, 15) for c in priced] == sorted(round(c.step_s, 15) for c in priced)
    # every bound is below what the dry run priced (they only prune)
    assert all(c.bound_s <= c.step_s and c.bound_bytes <= c.memory <= c.peak for c in priced)
    # each is what `spmdsim estimate` predicts for that configuration alone
    for c in (priced[0], priced[-1]):
        x = c.config
        assert _estimate(x)["step_time_s"] == pytest.approx(c.step_s, rel=1e-12)
    # those the time bound pruned could not have won: their bound is no better than the chosen's time
    assert all(c.bound_s >= r.chosen.step_s for c in r.candidates if c.verdict.endswith("bound above the best"))


def _estimate(x: Config, machine: str = "a100-dgx") -> dict:
    """`spmdsim estimate gpt ... --json` of CFG under configuration `x` on `machine`."""
    import contextlib
    import io

    out = io.StringIO()
    argv = ["estimate", "gpt", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "64", "--vocab", "128",
            "--global-batch", "4", "--micro-batch", str(4 // (x.dp * x.microbatches)), "--tp", str(x.tp),
            "--pp", str(x.pp), "--dp", str(x.dp), "--recompute", x.recompute, "--zero", str(x.zero),
            "--kept", "megatron", "--machine", machine, "--json"] + (["--sp"] if x.sp else []) + \
        (["--cp", str(x.cp), "--cp-method", x.cp_method] if x.cp > 1 else [])
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(out.getvalue())


def test_the_memory_limit_bounds_the_peak_the_estimates_verdict_bounds(tmp_path):
    """The search compares each configuration's peak (its memory line and the largest kernel's transient
    blocks, spmdsim.tools.estimate.ledger.peak_bytes) with the memory limit, as `spmdsim estimate`'s verdict does
    with the GPU's memory: on a machine whose memory lies between the free choice's memory line and its peak
    (tp 1, dp 2, no recomputation: its attention scores and their softmax's blocks, for a moment), the search
    does not choose it (it did by the memory line, and the estimate then said it did not fit), and the estimate
    says the configuration it does choose fits."""
    free = search(CFG, 2, A100, 1 << 40, max_dry_runs=1000, cells=False)
    first = free.chosen
    assert first.memory < first.peak
    limit = (first.memory + first.peak) // 2
    raw = json.loads((Path(spmdsim.tools.estimate.__file__).parent / "machines" / "a100-dgx.json").read_text())
    path = tmp_path / "small.json"
    path.write_text(json.dumps(raw | {"name": "small", "memory_bytes": limit}))
    machine = load_machine(path)
    r = search(CFG, 2, machine, machine.memory_bytes, max_dry_runs=1000, cells=False)
    (lost,) = [c for c in r.candidates if c.config == first.config]
    assert lost.verdict == "over the memory limit" and lost.memory <= limit < lost.peak
    assert r.chosen.config != first.config and r.chosen.peak <= limit
    assert _estimate(first.config, str(path))["fits"] is False
    estimate = _estimate(r.chosen.config, str(path))
    assert estimate["fits"] is True
    (stage,) = estimate["stages"]  # pp 1: the search's figures are the estimate's
    assert (stage["peak_bytes"], sum(stage["bytes"].values())) == (r.chosen.peak, r.chosen.memory)


def test_a_memory_limit_forces_recomputation():
    fast = Config(2, 1, 1, True, 1, 1, "none", 0)
    saved = Config(2, 1, 1, True, 1, 1, "full", 0)
    (fast_s, _, fast_bytes), (saved_s, _, saved_bytes) = (price(CFG, c, A100, "bf16-mixed", "megatron")
                                                          for c in (fast, saved))  # their peaks
    assert saved_bytes < fast_bytes and saved_s > fast_s  # recomputation trades time for memory
    free = search(CFG, 2, A100, 1 << 40, max_dry_runs=1000, cells=False)  # cells=False: as above
    tight = search(CFG, 2, A100, saved_bytes, max_dry_runs=1000, cells=False)
    assert free.chosen.peak > saved_bytes  # unbounded, the choice needs more than the limit below allows
    assert tight.chosen.peak <= saved_bytes and tight.chosen.step_s >= free.chosen.step_s
    # every configuration faster than the choice under the limit lost by memory
    faster = [c for c in tight.candidates if c.step_s is not None and c.step_s < tight.chosen.step_s]
    assert faster and all(c.verdict == "over the memory limit" and c.peak > saved_bytes for c in faster)


#: The search the next two tests print (the second's finds the first's dry runs): stopped by its cap, 4 configurations
#: left unpriced. One microbatch held: the same choice, the layer cells of the other micro-batch sizes not run (58
#: dry runs, not 134).
STOPPED_SEARCH = ("autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4",
                  "--devices", "2", "--machine", "a100-dgx", "--memory-limit", "1G", "--max-dry-runs", "4",
                  "--fix", "mb=1")


def test_the_command_prints_the_choice_and_the_runners_up(capsys):
    argv = list(STOPPED_SEARCH)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines())
    assert "chosen: " in out and "stopped after 4 dry runs" in out and "not priced" in out
    assert " MiB at its peak\n  (" in out and "     peak MiB  why not chosen" in out  # what the limit bounds
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dry_runs"] == 4 and data["chosen"]["verdict"] == "chosen"
    # every priced candidate carries its memory line and its peak, transient blocks included; the unpriced neither
    priced = [c for c in data["candidates"] if c["step_s"] is not None]
    assert len(priced) == 4 and all(c["memory"] < c["peak"] for c in priced)
    assert all(c["memory"] is None and c["peak"] is None for c in data["candidates"] if c["step_s"] is None)
    assert re.search(rf"chosen: .*, {data['chosen']['peak'] / 2 ** 20:,.1f} MiB at its peak\n"
                     rf"  \({data['chosen']['memory'] / 2 ** 20:,.1f} MiB held, and for a moment", out)


def test_the_choice_is_printed_as_the_estimate_command_that_prices_it_alike(capsys):
    """The search ends with the chosen configuration as a `spmdsim estimate` command, every option spelled
    out: --kept megatron (the search's default, not the estimate's) and the micro-batch size among them, so
    that the estimate prints the step time and the peak the search chose by (before, a user who typed the
    chosen configuration into `spmdsim estimate` got spmdsim's own kept set and was told it did not fit)."""
    from spmdsim.tools.cli.autoshard_machine import estimate_command
    from spmdsim.models.moe.config import MoEConfig

    argv = list(STOPPED_SEARCH)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines())
    head = "the chosen one, stage by stage (`spmdsim estimate`, the same step time and peak):\n"
    assert head in out
    command = out.split(head)[1].replace("\\\n", " ")
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert " ".join(data["estimate_command"].split()) == " ".join(command.split())
    estimate = _run_estimate(command)
    assert estimate["config"]["kept"] == "megatron" and estimate["fits"] is True
    assert estimate["step_time_s"] == pytest.approx(data["chosen"]["step_s"], rel=1e-12)
    assert max(s["peak_bytes"] for s in estimate["stages"]) == data["chosen"]["peak"]
    # the options a choice can need: sp, virtual stages, experts over ep, a padded vocabulary; the experts folded
    # (etp 1: the command's --ep the experts' 4, the mesh's ep 2 x tp 2), with a capacity and dropless
    dense = GPTConfig(layers=4, d_model=32, heads=2, seq=64, batch=4, vocab=117, vocab_pad_to=8, dropout=0.1)
    moe = GPTConfig(layers=2, d_model=32, heads=2, seq=64, batch=4, vocab=128, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=1, capacity_factor=0.5))
    dropless = replace(moe, moe=MoEConfig(experts=4, top_k=2, dropless=True))
    for cfg, x in ((dense, Config(2, 2, 1, True, 2, 2, "selective", 0)),
                   (moe, Config(1, 1, 1, False, 2, 1, "none", 1, ep=2)),
                   (moe, Config(2, 1, 1, True, 1, 1, "none", 1, ep=2, etp=1)),
                   (dropless, Config(2, 1, 1, False, 4, 1, "none", 0, ep=1, etp=1))):
        seconds, _, peak = price(cfg, x, A100, "bf16-mixed", "megatron")
        command = estimate_command(cfg, x, "a100-dgx", "bf16-mixed", "megatron")
        assert (f" --ep {x.experts_ep} --etp 1 " in command) == (x.etp == 1)
        estimate = _run_estimate(command)
        assert estimate["step_time_s"] == pytest.approx(seconds, rel=1e-12)
        assert max(s["peak_bytes"] for s in estimate["stages"]) == peak


# ---- --fix with --machine: some degrees held, the rest searched ----

def test_fixed_degrees_are_held_and_the_rest_searched():
    """search(..., fixed=...) searches only the configurations with those degrees, and chooses the fastest of
    them by their own dry runs (here tp 2 without recomputation; free, the search chooses tp 1)."""
    from spmdsim.tools.estimate.configs import fixed_configurations, parse_fixed

    fixed = parse_fixed(["tp=2", "recompute=none"])
    assert fixed == {"tp": 2, "recompute": "none"}
    held = fixed_configurations(configurations(CFG, 2, 8), fixed, 2)
    assert held and all(c.tp == 2 and c.recompute == "none" for c in held)
    times = {c: price(CFG, c, A100, "bf16-mixed", "megatron")[0] for c in held}
    r = search(CFG, 2, A100, 1 << 40, max_dry_runs=1000, cells=False, fixed=fixed)
    assert {c.config for c in r.candidates} == set(held)
    assert r.chosen.config == min(times, key=times.get) and r.chosen.step_s == times[r.chosen.config]


def test_fix_holds_the_experts_ep_and_tp():
    """With MoE layers `--fix ep=N` holds the experts' ep (folded, the mesh's ep x tp: `spmdsim estimate --ep`),
    `--fix etp=1` the experts whole (tp 1, or tp 2 folded into their ep), `--fix etp=tp` the experts split over
    attention's tp (tp 1 among them); a fold no configuration has is one line naming the values left."""
    from spmdsim.tools.estimate.configs import fixed_configurations, parse_fixed

    cfg = _moe_cfg()
    configs = configurations(cfg, 4, 8)
    assert parse_fixed(["etp=1", "ep=4"]) == {"etp": 1, "ep": 4} and parse_fixed(["etp=tp"]) == {"etp": "tp"}
    whole = fixed_configurations(configs, {"etp": 1}, 4)
    assert {(c.tp, c.etp) for c in whole} == {(1, 0), (2, 1)} and all(c.experts_tp == 1 for c in whole)
    split = fixed_configurations(configs, {"etp": "tp"}, 4)
    assert {(c.tp, c.etp) for c in split} == {(1, 0), (2, 0)}  # (heads 2: no tp 4)
    assert set(whole) | set(split) == set(configs) and set(whole) & set(split) == {c for c in configs if c.tp == 1}
    four = fixed_configurations(configs, {"ep": 4}, 4)
    assert {(c.tp, c.ep, c.etp) for c in four} == {(1, 4, 0), (2, 2, 1)}
    with pytest.raises(SpmdsimError) as e:
        fixed_configurations(configs, {"tp": 2, "etp": 1, "ep": 1}, 4)
    assert str(e.value) == ("--fix ep=1 leaves no configuration of the GPT on 4 devices with --fix tp=2, etp=1; ep can "
                            "be 2, 4")
    with pytest.raises(SpmdsimError) as e:
        fixed_configurations(configs, {"tp": 2, "ep": 1, "etp": 1}, 4)
    assert str(e.value) == ("--fix etp=1 leaves no configuration of the GPT on 4 devices with --fix tp=2, ep=1; etp "
                            "can be tp")


def test_the_command_takes_fix_with_machine(capsys):
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4", "--devices", "2",
            "--machine", "a100-dgx", "--fix", "tp=2", "--fix", "sp=1", "--fix", "mb=1", "--fix", "recompute=none"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "\nfixed (--fix): tp 2, mb 1, recompute none, sp 1; the rest searched\n" in out
    assert "chosen: tp 2 sp, pp 1, dp 1, 1 mb, none, ZeRO 0: " in out and " --tp 2 --sp --pp 1 " in unfold(out)
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fixed"] == {"tp": 2, "mb": 1, "recompute": "none", "sp": True}
    assert len(data["candidates"]) == 1 and data["chosen"]["config"]["sp"] is True


def test_zero_2_is_searched_and_its_estimate_command_prints_its_figures(capsys):
    """`--fix zero=2` holds ZeRO-2 (each rank keeps its 1/dp slice of the summed gradients): the search chooses
    among dp 2's configurations with it, and the `spmdsim estimate` command it prints gives the same step time,
    memory and peak."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4", "--devices", "2",
            "--machine", "a100-dgx", "--fix", "zero=2", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fixed"] == {"zero": 2}
    assert {c["config"]["zero"] for c in data["candidates"]} == {2}
    # over the data-parallel ranks or the context-parallel ones (each rank saw part of every sequence)
    assert {(c["config"]["dp"], c["config"]["cp"]) for c in data["candidates"]} == {(2, 1), (1, 2)}
    assert data["chosen"]["config"]["zero"] == 2 and " --zero 2 " in data["estimate_command"]
    estimate = _run_estimate(data["estimate_command"])
    assert estimate["config"]["zero"] == 2
    assert estimate["step_time_s"] == pytest.approx(data["chosen"]["step_s"], rel=1e-12)
    (stage,) = estimate["stages"]
    assert (stage["peak_bytes"], sum(stage["bytes"].values())) == (data["chosen"]["peak"], data["chosen"]["memory"])


@pytest.mark.parametrize("fix, message", [
    (["MatMul1=hand"], "--fix MatMul1=hand holds an operator's strategy; with --machine --fix holds a degree of "
                       "the configuration, one of tp, pp, v, dp, ep, etp, cp, cp-method, mb, recompute, zero, sp "
                       "(e.g. --fix tp=8)"),
    (["tp"], "--fix 'tp' must read DEGREE=VALUE with --machine, e.g. 'tp=8' (DEGREE one of tp, pp, v, dp, ep, etp, "
             "cp, cp-method, mb, recompute, zero, sp)"),
    (["tp=3"], "--fix tp=3 leaves no configuration of the GPT on 2 devices; tp can be 1, 2"),
    (["tp=2", "pp=2"], "--fix pp=2 leaves no configuration of the GPT on 2 devices with --fix tp=2; pp can be 1"),
    (["recompute=some"], "--fix recompute=some must be one of none, selective, full"),
    (["zero=4"], "--fix zero=4 must be 0, 1, 2 or 3"),
    (["sp=2"], "--fix sp=2 must be 0 or 1"),
    (["tp=2", "zero=2"], "--fix zero=2 leaves no configuration of the GPT on 2 devices with --fix tp=2; zero can be 0"),
    (["v=0"], "--fix v=0 must be an integer >= 1"),
    (["tp=2", "tp=1"], "--fix tp=2 and --fix tp=1 hold tp two ways; give one"),
    # --gpt's comma-separated spelling: it was "--fix tp=2,pp=1 must be an integer >= 1"
    (["tp=2,pp=1"], "--fix 'tp=2,pp=1' holds one degree a --fix; expected --fix tp=2 --fix pp=1"),
    (["etp=0"], "--fix etp=0 must be an integer >= 1 (the experts' tp: 1, whole; below tp, the rest of attention's "
                "tp folded into their ep) or tp (the experts split over attention's tp)"),
    (["etp=1"], "--fix etp=1 holds the experts' tp, and this GPT has none: give it MoE layers (--gpt ...,experts=N)"),
])
def test_a_bad_fix_with_machine_is_one_line(fix, message, capsys):
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4", "--devices", "2",
            "--machine", "a100-dgx"] + [w for f in fix for w in ("--fix", f)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert unfold(err).rstrip("\n") == "spmdsim: error: " + message


# ---- what the search refuses, cannot price or ties ----

def test_a_search_with_no_fit_names_the_limit_it_used(tmp_path, capsys):
    """With no --memory-limit the limit is the machine's memory a GPU: the refusal named '--memory-limit 128 KiB',
    an option the user never gave (here a machine file of 128 KiB a GPU)."""
    machine = json.loads((Path(spmdsim.tools.estimate.__file__).parent / "machines" / "a100-dgx.json").read_text())
    machine["name"], machine["memory_bytes"] = "tiny", 128 << 10
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(machine))
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4",
            "--devices", "2", "--machine", str(path), "--max-dry-runs", "2"]
    assert main(argv) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "no configuration fits machine tiny's 128 KiB a GPU on 2 devices; the least needs " in err, err
    assert "--memory-limit" not in err, err


def test_one_configuration_priced_is_said_in_the_singular(capsys):
    """--max-dry-runs 1 where the one priced does not fit: it said "none of the 1 configurations priced fits"."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=8,d_model=32,heads=2,seq=128,batch=2,experts=4,top_k=1",
            "--devices", "8", "--machine", "h100-dgx", "--max-dry-runs", "1", "--memory-limit", "1M"]
    assert main(argv) == 2
    err = unfold(capsys.readouterr().err)
    assert re.fullmatch(r"spmdsim: error: the 1 configuration priced does not fit --memory-limit 1 MiB; [0-9,]+ "
                        r"not priced: raise --max-dry-runs\n", err), err


def test_a_limit_without_its_unit_says_it_counts_bytes(capsys):
    """A GPU's memory in GB written without its unit (--memory-limit 80): the line said "80 B" and the need, not
    how to write 80 GiB."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4",
            "--devices", "2", "--machine", "a100-dgx", "--max-dry-runs", "2", "--memory-limit", "80"]
    assert main(argv) == 2
    assert unfold(capsys.readouterr().err).rstrip("\n") == (
        "spmdsim: error: no configuration fits --memory-limit 80 B on 2 devices; the least needs 223 KiB (a limit "
        "without a unit is bytes: 80G is 80 GiB)")


@pytest.mark.parametrize("extra, message", [
    (["--network", "attention"], "--machine chooses the GPT's configuration; --network 'attention' is not 'gpt'"),
    (["--max-dry-runs", "0"], "--max-dry-runs 0 must be >= 1"),
    (["--memory-limit", "1K"], "no configuration fits --memory-limit 1 KiB on 2 devices; the least needs "),
    (["--machine", "tpu-pod"], "machine 'tpu-pod' is neither a shipped machine nor a file"),
    # a limit above the GPU's memory chose what the estimate it printed then said did not fit
    (["--memory-limit", "100G"], "--memory-limit 100 GiB is more than machine a100-dgx's 80 GiB a GPU;"),
    (["--training"], "--training does not go with --machine"),
    # the operator search's options, refused where given (they were ignored), their defaults not
    (["--objective", "bytes"], "--objective bytes does not go with --machine (the dry run of a training step"),
    (["--method", "propagate"], "--method propagate does not go with --machine"),
    (["--ranks", "2"], "--ranks 2 does not go with --machine"),
    (["--node-limit", "1"], "--node-limit 1 does not go with --machine"),
    (["--repeat", "5"], "--repeat 5 does not go with --machine"),
    (["--flops", "0"], "--flops 0.0 does not go with --machine"),
])
def test_bad_input_is_one_line(extra, message, capsys):
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4",
            "--devices", "2", "--machine", "a100-dgx", "--max-dry-runs", "2"]
    for i in range(0, len(extra), 2):
        if extra[i] in argv:
            argv[argv.index(extra[i]) + 1] = extra[i + 1]
        else:
            argv += extra[i:i + 2]
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("spmdsim: error: " + message) and "Traceback" not in err


def test_a_configuration_whose_dry_run_cannot_map_a_block_is_over_the_limit_not_a_traceback():
    """A dry run that cannot map a block (spmdsim.base.sizes.UnmappableError: beyond this machine's address space) of
    a configuration prices it as over the memory limit by that block at the precision's narrowest width, and the
    search goes on; a block within the limit is this machine's limit, not the configuration's: raised."""
    from spmdsim.base.sizes import UnmappableError

    huge = Config(1, 1, 2, False, 1, 1, "none", 0)

    def pricer(cfg, c, *rest):
        if c == huge:
            raise UnmappableError((1 << 40, 64), np.dtype(np.float64), 8 << 46)
        return price(cfg, c, *rest)

    r = search(CFG, 2, A100, 1 << 40, max_dry_runs=1000, pricer=pricer, cells=False)
    (lost,) = [c for c in r.candidates if c.config == huge]
    assert lost.verdict == "memory bound over the limit" and lost.bound_bytes == 2 << 46  # bf16: 2 bytes each
    assert lost.step_s is None and r.chosen is not None and r.dry_runs == sum(c.step_s is not None
                                                                              for c in r.candidates)
    with pytest.raises(UnmappableError, match=r"^the dry run cannot map a block of shape \(1099511627776, 64\)"):
        search(CFG, 2, A100, 4 << 46, max_dry_runs=1000, pricer=pricer, cells=False)


def test_equal_times_are_ordered_by_the_fixed_order_not_by_their_last_bits():
    """A ZeRO-1 configuration and its ZeRO-2 twin predict the same time, their sums added in other orders: a
    time an ulp or two lower is no faster, and the fixed order among equals (lower ZeRO first) decides; a time
    lower in its seventh digit is faster."""
    def pricer(below):
        def priced(cfg, c, *rest):
            seconds, nbytes, peak = price(cfg, c, *rest)
            if c.zero == 2:  # the twin, just below its ZeRO-1 configuration's time
                seconds = below(price(cfg, replace(c, zero=1), *rest)[0])
            return seconds, nbytes, peak
        return priced

    def twins(r):
        """The order of each ZeRO-1 configuration and its ZeRO-2 twin among the priced ones."""
        at = {c.config: i for i, c in enumerate(r.candidates) if c.step_s is not None}
        return {at[c] < at[twin] for c in at if c.zero == 1 and (twin := replace(c, zero=2)) in at}

    two_ulps = search(CFG, 2, A100, 1 << 40, max_dry_runs=1000, cells=False,
                      pricer=pricer(lambda t: float(np.nextafter(np.nextafter(t, 0.0), 0.0))))
    assert twins(two_ulps) == {True}  # ZeRO-1 first, as without the ulps
    faster = search(CFG, 2, A100, 1 << 40, max_dry_runs=1000, cells=False, pricer=pricer(lambda t: t * (1 - 1e-7)))
    assert twins(faster) == {False}


def test_the_refusal_of_every_configuration_names_what_cp_must_divide(capsys):
    """On 6 devices a factor 3 goes to dp, tp, pp or cp: the refusal named the first three's rules alone, though
    seq 96 (not 64) runs cp 3."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=4,d_model=64,heads=4,seq=64,batch=8", "--devices", "6",
            "--machine", "a100-dgx", "--max-dry-runs", "1"]
    assert main(argv) == 2
    assert unfold(capsys.readouterr().err).rstrip("\n") == (
        "spmdsim: error: no configuration of the GPT runs on 6 devices (tp must divide the heads 4 and vocab 128 "
        "within a node of 8, pp the layers 4, dp the batch 8, 2 x cp the seq 64 with tp x cp within a node)")
    argv[4] = argv[4].replace("seq=64", "seq=96")
    # (recomputation held at none, the factor 3 in cp all the same: the other two's layer cells not run, 57 dry
    # runs, not 113)
    assert main(argv + ["--fix", "recompute=none"]) == 0
    chosen = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("chosen: "))
    assert re.search(r", cp [36] ring, ", chosen), chosen  # the factor 3 in cp


def test_the_search_refuses_bad_arguments():
    with pytest.raises(SpmdsimError, match=r"^max dry runs 0 must be an integer >= 1$"):
        search(CFG, 2, A100, 1 << 30, max_dry_runs=0)
    with pytest.raises(SpmdsimError, match=r"^no configuration of the GPT runs on 3 devices"):
        search(CFG, 3, A100, 1 << 30)


@pytest.mark.parametrize("flag, value", [("--precision", "fp64"), ("--kept", "graph"), ("--max-dry-runs", "3")])
def test_the_searchs_own_options_without_machine_are_refused_not_ignored(flag, value, capsys):
    code = main(["autoshard", "--network", "gpt", "--devices", "2", flag, value])
    err = capsys.readouterr().err
    assert code == 2 and unfold(err).rstrip("\n") == (f"spmdsim: error: {flag} {value} is an option of the search by "
                                         "predicted step time: give --machine NAME|PATH too")


# ---- a GPT with MoE layers: the expert-parallel size is searched too ----

def _moe_cfg(**moe):
    from spmdsim.models.moe.config import MoEConfig

    return GPTConfig(layers=2, d_model=32, heads=2, seq=64, batch=4, vocab=128, dropout=0.1,
                     moe=MoEConfig(experts=4, top_k=2, **moe))


# ({}, 2) right after ({}, 8): the same dry runs on nodes of 2 (spmdsim.tools.estimate.ledger keeps them, the
# transfers placed on each node size), not run again after the others' ~1,000 have pushed them out
@pytest.mark.parametrize("moe, node", [({}, 8), ({}, 2), ({"capacity_factor": 0.5}, 8),
                                       ({"dropless": True, "dry_routing": "worst"}, 8)])
def test_an_moe_gpts_bounds_hold_for_every_configuration_and_the_choice_is_the_fastest(moe, node):
    """On 4 devices every (tp, pp, dp, ep, etp) of a 2-layer MoE GPT (ep dividing its 4 experts; with tp 2 the
    experts split over it or folded into their ep, etp 1; dropless, cp 2 and 4 too) is priced by its own dry run:
    each closed-form bound
    lies below its price (the experts' products bounded by k s c rows a sequence, c the capacity factor; the
    communication on each group's link, nodes of 8 GPUs or of 2, where groups cross them), and the search
    chooses the fastest."""
    import dataclasses

    cfg = _moe_cfg(**moe)
    machine = dataclasses.replace(A100, gpus_per_node=node)
    # (cp's other methods: the ring's bounds; ZeRO-3, which the search tries where nothing else fits, bounded too;
    # cp beside the capacity 0.5 and dropless cases (each chunk its own capacity), cp 1 held in the others: each cp
    # configuration a dry run)
    cp = None if moe.get("dropless") or moe.get("capacity_factor") else 1
    configs = configurations(cfg, 4, node, cp, methods=SEARCHED_METHODS, sharded=True)
    assert {c.ep for c in configs} == {1, 2, 4} and all(c.dp * c.ep * c.cp * c.tp * c.pp == 4 for c in configs)
    # folded: tp 2 with the experts' ep 2 (mesh ep 1) or 4 (mesh ep 2), never beside tp 1
    assert {(c.tp, c.experts_ep) for c in configs if c.etp == 1} == {(2, 2), (2, 4)}
    assert all(c.dp * c.experts_ep * c.experts_tp * c.cp * c.pp == 4 for c in configs)
    # the sequence split over cp too (each rank routing its chunks; with a capacity, each chunk its own)
    assert {c.cp for c in configs} == ({1, 2, 4} if cp is None else {1})
    assert all(c.zero == 0 or c.dp * c.ep * c.cp > 1 for c in configs) and {c.zero for c in configs} == {0, 1, 2, 3}
    assert all(c.dp * c.ep * c.cp > 1 for c in configs if c.zero == 3)  # FSDP over dp x ep x cp, experts' dp x cp
    prices = {c: price(cfg, c, machine, "bf16-mixed", "megatron") for c in configs}
    for c, (seconds, nbytes, _) in prices.items():
        bound_s, bound_bytes = lower_bounds(cfg, c, machine, "bf16-mixed", 4)
        assert bound_s <= seconds and bound_bytes <= nbytes, (c, bound_s, seconds, bound_bytes, nbytes)
    r = search(cfg, 4, machine, 1 << 40, max_dry_runs=10_000, pricer=lambda cfg, c, *rest: prices[c],  # (priced above)
               fixed=None if cp is None else {"cp": 1})
    priced = [c for c in r.candidates if c.step_s is not None]
    assert len(priced) == r.dry_runs and r.chosen is priced[0]
    # the fastest, or one of its ties: dp 2 and cp 2 can price a unit in the last place apart (sums in another order)
    # (everything fits: no ZeRO-3; beside the experts cp is searched with the layer cells or --fix cp)
    fastest = min(seconds for c, (seconds, *_) in prices.items() if c.zero < 3 and c.cp == 1)
    assert r.chosen.step_s == pytest.approx(fastest, rel=1e-12, abs=0)
    assert all(c.bound_s >= r.chosen.step_s for c in r.candidates if c.verdict.endswith("bound above the best"))


def test_the_command_searches_an_moe_gpt_and_shows_its_ep(capsys, monkeypatch):
    from spmdsim.tools.cli import autoshard_common

    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4,experts=4,top_k=1",
            "--devices", "4", "--machine", "a100-dgx", "--max-dry-runs", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "4 experts, top-1, in 1 of every 2 blocks (the dry runs route balanced)" in unfold(out)
    assert "  ep etp  cp     mb recompute" in out and "chosen: " in out and all(len(line) <= 100
                                                                                for line in out.splitlines())
    assert "0 small dry runs of layer cells" in unfold(out)  # the closed forms alone, unless --moe-cells
    monkeypatch.setattr(autoshard_common, "PATIENCE_S", 0.05)  # the search's cells take seconds: never silent that long
    # the cells on 2 devices, tp 1 and no recomputation held (the CLI's path and its patience line; every cell's
    # bound is tests/test_estimate_bounds.py's): 48 small dry runs, where the three recomputations make 144 and
    # tp 2's split and folded cells more
    assert main(argv[:6] + ["2"] + argv[7:] + ["--moe-cells", "--fix", "tp=1", "--fix", "recompute=none"]) == 0
    out, err = capsys.readouterr()
    cells = re.search(r"(\d+) small dry runs of layer cells", unfold(out))
    assert cells and int(cells.group(1)) > 0 and int(cells.group(1)) % 6 == 0
    assert "spmdsim: still pricing gpt on 2 devices after 0 s" in err
    assert main(["autoshard", "--network", "gpt", "--gpt", "layers=2", "--devices", "4", "--machine", "a100-dgx",
                 "--moe-cells"]) == 2
    assert "--moe-cells bounds an MoE GPT's search by its layer cells (a dense GPT's always are): give --gpt " \
           "...,experts=N" in unfold(capsys.readouterr().err)
    assert main(["autoshard", "--network", "gpt", "--moe-cells"]) == 2
    assert "--moe-cells is an option of the search by predicted step time: give --machine NAME|PATH too" in \
        unfold(capsys.readouterr().err)
    argv[4] = "layers=2,top_k=1"
    assert main(argv) == 2
    assert capsys.readouterr().err == "spmdsim: error: --gpt top_k set MoE layers: give experts=N too\n"
    argv[4] = "layers=2,experts=4,moe_every=3"
    assert main(argv) == 2
    assert "--gpt moe_every 3 makes none of the 2 blocks an MoE layer" in unfold(capsys.readouterr().err)
    assert main(["autoshard", "--network", "gpt", "--gpt", "layers=2,experts=4", "--devices", "4"]) == 2
    assert "--gpt experts sets MoE layers, which only the search by a machine file prices: add --machine" in \
        unfold(capsys.readouterr().err)


def test_an_moe_gpt_that_fits_only_fully_sharded_is_searched_again_with_zero_3(capsys):
    """A wide one-head MoE GPT on 4 devices under 80 MiB: no configuration of ZeRO 0 to 2 fits (the least peak
    85.8 MiB, tp 1: one head), so the search runs again with ZeRO-3 (the experts sharded over dp, the rest over dp
    x ep) and says so; it chooses ep 4 at 69.9 MiB, and the estimate it prints gives the same time and peak.
    `--fix zero=3` searches them at once, without the line; ZeRO-3's bounds: the MoE tests above."""
    from docs_commands import run_here

    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=512,heads=1,seq=16,vocab=128,batch=4,experts=4,"
            "top_k=1", "--devices", "4", "--machine", "a100-dgx", "--memory-limit", "80M"]
    assert main(argv) == 0
    out = unfold(capsys.readouterr().out)
    assert "searched again with ZeRO-3 (the experts sharded over dp, the rest over dp x ep): none of ZeRO 0 to 2 " \
        "priced fits" in out
    assert "chosen: tp 1, pp 1, dp 1, ep 4, 1 mb, none, ZeRO 3: 0.844 ms, 69.9 MiB at its peak" in out, out
    command = [w for w in out.split("(`spmdsim estimate`, the same step time and peak):", 1)[1].split() if w != "\\"]
    code, estimate, err = run_here("main", command[1:command.index("a100-dgx") + 1] + ["--json"])
    assert code == 0, err
    stage = json.loads(estimate)["stages"][0]
    assert f"{stage['step_time_s'] * 1e3:.3f}" == "0.844" and f"{stage['peak_bytes'] / 2 ** 20:.1f}" == "69.9"
    assert main(argv + ["--fix", "zero=3"]) == 0
    out = unfold(capsys.readouterr().out)
    assert "searched again" not in out and "ZeRO 3: 0.844 ms, 69.9 MiB at its peak" in out
    assert main(argv[:-1] + ["60M"]) == 2  # none of those priced, even fully sharded
    printed = capsys.readouterr()
    assert "searched again with ZeRO-3" in unfold(printed.out)
    assert unfold(printed.err).startswith("spmdsim: error: none of the 24 configurations priced fits --memory-limit "
                                          "60 MiB;")


@pytest.mark.parametrize("dropless", [1, 0])
def test_the_command_searches_cp_beside_experts_and_prints_the_estimate_that_prices_it(capsys, dropless):
    """`--gpt ...,dropless=1`: the experts drop no token (0: a capacity, each cp chunk its own); `--fix cp=2`
    chooses a configuration with each sequence split over cp, printed as the `spmdsim estimate` command that
    prices it alike (time and peak); dropless is 0 or 1."""
    from docs_commands import run_here

    argv = ["autoshard", "--network", "gpt", "--gpt", f"layers=2,d_model=64,heads=4,seq=64,batch=4,experts=4,"
            f"dropless={dropless}", "--devices", "4", "--machine", "a100-dgx", "--fix", "cp=2", "--fix", "ep=2",
            "--max-dry-runs", "4"]
    assert main(argv) == 0
    out = unfold(capsys.readouterr().out)
    assert f"; 4 {'dropless ' if dropless else ''}experts, top-2" in out, out
    chosen = re.search(r"chosen: (.*): ([\d.]+) ms, ([\d.]+) MiB at its peak", out)
    assert chosen and "ep 2, cp 2 ring" in chosen.group(1), out
    command = [w for w in out.split("(`spmdsim estimate`, the same step time and peak):", 1)[1].split() if w != "\\"]
    command = command[:command.index("a100-dgx") + 1]
    assert command[:3] == ["spmdsim", "estimate", "gpt"] and ("--dropless" in command) == bool(dropless)
    assert "--cp" in command
    code, estimate, err = run_here("main", command[1:])
    assert code == 0, err
    assert f"predicted step time: {chosen.group(2)} ms" in estimate
    peak = re.search(r"\(the most, stage \d+: ([\d.]+) MiB\)", estimate)
    assert peak and f"{float(peak.group(1)):.1f}" == chosen.group(3), estimate
    argv[4] = argv[4].replace(f",dropless={dropless}", ",dropless=2")
    assert main(argv) == 2
    assert "--gpt dropless '2' must be 0 or 1 (1: the experts drop no token)" in capsys.readouterr().err


@pytest.mark.parametrize("moe, llama", [({}, {}), ({"capacity_factor": 0.5}, {}),
                                        ({"dropless": True, "dry_routing": "worst"}, {}), ({"dropless": True}, {}),
                                        ({"capacity_factor": 1e17}, {}),
                                        ({}, {"kv_heads": 1, "mlp": "swiglu", "ffn": 96, "bias": False})])
def test_the_flop_bound_is_the_dry_runs_products_but_the_routers_and_the_vocabularys(moe, llama):
    """flops_bound against what every rank of a dry run multiplied (no recomputation, ep 4; k s c = 128 and 64
    rows a sequence: no capacity rounding; at factor 1e17 each expert's capacity stops at s, E s rows, where the
    dry run raised OverflowError): below it by the routers' and the head's products alone, which it leaves out
    (under `worst` routing the representative rank is the busiest: ranks x its count is more)."""
    from spmdsim.tools.estimate.ledger import gpt_ledger
    from spmdsim.tools.estimate.closed_forms import flops_bound

    # (llama: a Mixtral-like MoE layer, grouped-query attention and SwiGLU experts: the bound counted 4 h^2 of
    # attention weights and two matrices an expert, more than such a layer multiplies: not a lower bound)
    cfg = GPTConfig(layers=2, d_model=128, heads=2, seq=64, batch=4, vocab=128, dropout=0.1,
                    moe=_moe_cfg(**moe).moe, **llama)
    (stage,) = gpt_ledger(cfg, 1, 1, 1, ep=4)
    counted = stage.flops() * len(stage.ranks)
    b, s, h, V, E = cfg.batch, cfg.seq, cfg.d_model, cfg.vocab, cfg.moe.experts
    left_out = 6 * b * s * h * V + 6 * b * s * h * E  # the head's logits and the one MoE layer's router
    if moe.get("dry_routing") == "worst":  # rank 0 multiplies every rank's first choices: the others, less
        assert flops_bound(cfg) < counted - left_out
    else:
        assert flops_bound(cfg) == counted - left_out


@pytest.mark.parametrize("zero", [0, 1])
def test_the_moe_communication_bounds_lie_below_the_dry_runs_transfers_and_meet_its_exchanges(zero):
    """comm_bounds against the transfers of the configuration's own dry run, priced as the step time prices
    them. ep 4 alone: the layers' bound is the exchanges' time exactly (with a capacity every Alltoall moves the
    whole send buffer). tp 2 x ep 2 with sp, and tp 2 folded into the experts' ep 4 (each rank's half of the
    sequences over 4 ranks): above the exchanges (the attention's collectives) and at most the layers'
    transfers (the MLPs' and the folded layer's gathers left out). The gradient sums' bound is at
    most theirs (the buckets' latency and padding, the sequence-parallel replicas' larger groups, the
    embeddings left out)."""
    from spmdsim.tools.estimate.ledger import gpt_ledger, transfers_at
    from spmdsim.tools.estimate.closed_forms import _moe_elements, comm_bounds
    from spmdsim.tools.estimate.steptime import level_model

    from spmdsim.tools.estimate.configs import model_of

    cfg = _moe_cfg()
    for c in (Config(1, 1, 1, False, 1, 1, "none", zero, 4), Config(2, 1, 1, True, 2, 1, "none", zero, 2),
              Config(2, 1, 1, False, 1, 1, "none", zero, 2, etp=1)):  # (folded: the experts' ep 4)
        (stage,) = gpt_ledger(model_of(cfg, c.etp), 1, 1, c.tp, sp=c.sp, microbatches=c.microbatches, zero=zero,
                              kept="megatron", ep=c.ep)

        def seconds(phases, kinds=None):
            return sum(level_model(A100, t.level).predict(t.kind, t.group, t.nbytes) * t.count
                       for t in transfers_at(stage.transfers, "bf16-mixed")
                       if t.phase in phases and (kinds is None or t.kind in kinds))

        layers, sums, _ = comm_bounds(cfg, c, A100, "bf16-mixed", *_moe_elements(cfg, c.tp, c.ep))
        exchanges = seconds(("layers",), ("alltoall",))
        if c.tp == 1:
            assert layers == pytest.approx(exchanges, rel=1e-12) and layers > 0
        else:
            assert exchanges < layers <= seconds(("layers", "pipeline"))
        assert 0 < sums <= seconds(("gradients",))


def test_a_vocabulary_no_tp_divides_is_said_and_padded_with_vocab_pad_to(capsys):
    """GPT-2's 50257 tokens leave tp 2 and 4 out of a search on 8 devices (the embedding is split over tp): the
    output says so and how to pad; --gpt vocab_pad_to=512 lets them in (50257 -> 50688 rows)."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=64,vocab=50257,batch=8",
            "--devices", "8", "--machine", "a100-dgx", "--max-dry-runs", "2", "--fix", "cp=1", "--fix",
            "recompute=none"]  # (cp and recomputation: not the point; the recomputations' layer cells tripled its cost)
    assert main(argv) == 0
    out = unfold(capsys.readouterr().out)
    assert ("tp 2, 4 left out: they do not divide vocab 50257 (the embedding is split over tp); pad it, e.g. "
            "vocab_pad_to=512 (Megatron pads to 128 x tp)") in out
    # ZeRO-3 is searched on dp 8 all the same: its shards cut the rows as FSDP2's do (the last ones short)
    assert main(argv + ["--fix", "zero=3"]) == 0
    assert "chosen: tp 1, pp 1, dp 8, 1 mb, none, ZeRO 3: " in capsys.readouterr().out
    assert {c.tp for c in configurations(GPTConfig(layers=2, d_model=64, heads=4, seq=64, vocab=50257, batch=8),
                                         8, 8)} == {1}
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["note"].startswith("tp 2, 4 left out: they do not divide vocab 50257")
    argv[4] += ",vocab_pad_to=512"
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "note" not in data and {c["config"]["tp"] for c in data["candidates"]} == {1, 2, 4}
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPT 2 layers, hidden 64, 4 heads, seq 64, vocab 50257 (padded to 50,688), global batch 8")
    assert "left out" not in out
    # where the vocabulary rules out every configuration (tp 1 needs pp 4 of 2 layers, or cp 4: 250 tokens do not
    # split into 8 chunks), the refusal names the padding
    bare = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=250,batch=1,vocab=1001",
            "--devices", "4", "--machine", "a100-dgx"]
    assert main(bare) == 2
    assert unfold(capsys.readouterr().err).rstrip("\n") == (
        "spmdsim: error: no configuration of the GPT runs on 4 devices (tp must divide the heads 4 and vocab 1001 "
        "within a node of 8, pp the layers 2, dp the batch 1, 2 x cp the seq 250 with tp x cp within a node); tp 2, 4 "
        "left out: they do not divide vocab 1001 (the "
        "embedding is split over tp); pad it, e.g. vocab_pad_to=512 (Megatron pads to 128 x tp)")
    bare[4] += ",vocab_pad_to=512"
    assert main(bare) == 0 and "chosen: tp 2, pp 2, dp 1" in capsys.readouterr().out
    # the operators' graph (no --machine) has no mask for padded logits: it cuts the vocabulary unevenly instead
    assert main(["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,vocab=257,vocab_pad_to=8"]) == 2
    assert unfold(capsys.readouterr().err).startswith(
        "spmdsim: error: --gpt vocab_pad_to pads the vocabulary in the search by a machine file (add --machine")


def test_narayanans_1t_configuration_without_interleaving_fits_80_gib():
    """docs/howto/choose-configuration.md: Narayanan et al.'s t 8, p 64, d 6 with full recomputation, not
    interleaved (`spmdsim estimate gpt --layers 128 --hidden 25600 --heads 160 --seq 2048 --vocab 51200
    --global-batch 3072 --tp 8 --pp 64 --dp 6 --recompute full --kept megatron`), holds 72,669 MiB on its
    fullest rank and 71.43 GiB at its peak (the estimate prints it so), a kernel's blocks the memory line does
    not hold beside it for a moment: within 80 GiB. 1F1B's first stage holds pp = 64 microbatches at once from
    64 microbatches up, so 64 (a global batch of 384) give the same bytes as the docs' 512 at an eighth of the
    dry run's time."""
    cfg = GPTConfig(layers=128, d_model=25600, heads=160, seq=2048, vocab=51200, batch=6 * 64, dropout=0.1)
    _, memory, peak = price(cfg, Config(8, 64, 6, False, 64, 1, "full", 0), A100, "bf16-mixed", "megatron")
    assert memory == 76_199_334_912 and peak == 76_702_651_392 and peak < 80 << 30
    assert abs(peak / 2 ** 30 - 71.43) < 0.01
    from pathlib import Path

    prose = " ".join((Path(__file__).resolve().parents[1] / "docs/howto/choose-configuration.md").read_text().split())
    assert "is 104.1 s and 71.43 GiB at its peak in the same ledger, within the limit but slower" in prose
    assert "at 104.1 s and 71.43 GiB at its peak, which fits but is slower" in prose


def _run_estimate(command: str) -> dict:
    """`command` (a `spmdsim estimate gpt ...` line, as the search prints it) run with --json."""
    import contextlib
    import io
    import shlex

    words = shlex.split(command)
    assert words[:3] == ["spmdsim", "estimate", "gpt"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(words[1:] + ["--json"]) == 0
    return json.loads(out.getvalue())


# ---- the experts' own tp: folded where it is faster ----

FOLD_ARGV = ["autoshard", "--network", "gpt", "--gpt",
             "layers=2,d_model=1024,heads=8,seq=1024,vocab=32000,batch=16,experts=16,top_k=2,moe_every=1",
             "--mlp", "swiglu", "--devices", "16", "--machine", "h100-dgx", "--fix", "tp=8", "--fix", "sp=1",
             "--fix", "pp=1", "--fix", "mb=1", "--fix", "recompute=none", "--fix", "zero=1", "--json", "--moe-cells"]


def test_folding_wins_beside_tp_8_and_fix_etp_tp_forbids_it(capsys):
    """16 H100s with attention's tp held at 8 (docs/howto/choose-configuration.md): of the eight configurations
    left (the experts split over tp, whole, or over etp 2 or 4 with the rest of tp folded into their ep), the
    experts over etp 2 and ep 8 (each "tp" rank dispatching its own quarter of the tokens, fc2's product summed
    over 2 ranks, not 8) are the fastest, ahead of whole experts over ep 16, and the command the search prints
    says --ep 8 --etp 2 and prices alike; `--fix etp=tp` leaves the experts split over tp and chooses a slower
    one, at the price the first search gave it."""
    assert main(FOLD_ARGV) == 0
    data = json.loads(capsys.readouterr().out)
    configs = [Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in c["config"].items()})
               for c in data["candidates"]]
    assert {(c.dp, c.ep, c.etp) for c in configs} == {(dp, 3 - dp, etp) for dp in (1, 2) for etp in (0, 1, 2, 4)}
    chosen = Config(**data["chosen"]["config"])
    assert (chosen.dp, chosen.experts_ep, chosen.experts_tp) == (1, 8, 2)
    assert " --ep 8 --etp 2 " in data["estimate_command"]
    whole = next(c for c in configs if (c.dp, c.etp) == (1, 1))  # ep 16: the best before etp 2 was searched
    assert data["chosen"]["step_s"] < data["candidates"][configs.index(whole)]["step_s"]
    estimate = _run_estimate(data["estimate_command"])
    assert estimate["step_time_s"] == pytest.approx(data["chosen"]["step_s"], rel=1e-12)
    assert max(s["peak_bytes"] for s in estimate["stages"]) == data["chosen"]["peak"]
    times = {c: x["step_s"] for c, x in zip(configs, data["candidates"])}
    assert main(FOLD_ARGV + ["--fix", "etp=tp"]) == 0
    split = json.loads(capsys.readouterr().out)
    held = Config(**split["chosen"]["config"])
    assert held.etp == 0 and split["fixed"]["etp"] == "tp"
    assert split["chosen"]["step_s"] == times[held] > data["chosen"]["step_s"]
    assert held == min((c for c in configs if c.etp == 0 and times[c] is not None), key=times.get)
    # By the closed forms alone (no --moe-cells) the experts stay split over tp unless --fix etp=1 asks for them
    # folded: there the folded bounds are the least and would take the dry runs (search's docstring).
    # (the output says so where a configuration could fold them; not where --fix etp holds them either way)
    said = ("not searched: the experts folded into ep, whole or in part (etp 1, 2, 4); --moe-cells or --fix etp=N "
            "adds them")
    for extra, etps in (([], {0}), (["--fix", "etp=1"], {1}), (["--fix", "etp=tp"], {0})):
        assert main(FOLD_ARGV[:-1] + extra) == 0
        quick = json.loads(capsys.readouterr().out)
        assert {c["config"]["etp"] for c in quick["candidates"]} == etps
        assert quick.get("note") == (said if not extra else None)
        assert main([a for a in FOLD_ARGV[:-1] if a != "--json"] + extra) == 0
        assert (said in " ".join(capsys.readouterr().out.split())) == (not extra)  # (wrapped at 100 columns)
    assert data.get("note") is None  # (with --moe-cells they are searched)


def test_a_runner_up_as_fast_as_the_choice_is_a_tie_not_slower(capsys):
    """Under cp 2 selective recomputation prices exactly as none; the order among equals chose none."""
    assert main(["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=256,batch=4",
                 "--devices", "2", "--machine", "a100-dgx", "--fix", "cp=2"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if re.match(r"[12] {3,}1 ", line)]
    assert [row[7] for row in rows] == ["none", "selective"] and rows[0][9] == rows[1][9]
    assert rows[0][11:] == ["chosen"] and rows[1][11:] == ["as", "fast", "(a", "tie)"]
