"""The pipeline's layers split as the user says (spmdsim.programs.pipeline.options.layer_split): --first-stage-layers
and --last-stage-layers (Megatron's --decoder-first/last-pipeline-num-layers) and --stage-layers, for `spmdsim
estimate gpt` (its dry run, ledger and bounds of THAT split), examples/train_gpt.py and train_moe_gpt.py (a real
pipelined run, checked every step), each bad value refused in one line."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from docs_commands import run_here
from spmdsim.programs.pipeline.options import layer_split, split_words


def _flags(first=None, last=None, stage=None):
    return SimpleNamespace(first_stage_layers=first, last_stage_layers=last, stage_layers=stage)


def test_megatrons_flags_give_the_ends_their_count_and_the_others_the_rest_evenly():
    meta = (7,) + (8,) * 14 + (7,)  # Llama 3 405B: 126 layers on 16 stages, one fewer on the first and the last
    assert layer_split(_flags(7, 7), 126, 16, 1) == (meta, None)
    assert layer_split(_flags(stage="7,8x14,7"), 126, 16, 1) == (meta, None)
    assert split_words(meta) == "7, 8 x 14, 7" and split_words((1, 2)) == "1, 2"
    assert layer_split(_flags(6), 126, 16, 1) == ((6,) + (8,) * 15, None)  # the last among the others
    assert layer_split(_flags(last=1), 3, 2, 1) == ((2, 1), None)
    assert layer_split(_flags(3), 3, 2, 1) == ((3, 0), None)  # the last stage holds the head alone
    assert layer_split(_flags(), 3, 2, 1) == (None, None)  # none given: the balanced default
    # virtual stages: a stage's count spread over its chunks (chunk k on stage k mod pp), Megatron-core's rule
    assert layer_split(_flags(2, 2), 12, 4, 2) == ((1, 2, 2, 1, 1, 2, 2, 1), None)
    assert layer_split(_flags(stage="0,2,2,0"), 4, 2, 2) == ((0, 2, 2, 0), None)


@pytest.mark.parametrize("flags, layers, pp, v, message", [
    (_flags(1), 3, 1, 1, "--first-stage-layers 1 splits the layers over pipeline stages: give --pp 2 or more "
                         "(got --pp 1)"),
    (_flags(-1), 3, 2, 1, "--first-stage-layers -1 must be >= 0"),
    (_flags(2, 2), 3, 2, 1, "--first-stage-layers 2 and --last-stage-layers 2 take 4 layers: more than the model's 3"),
    (_flags(1, 1), 3, 2, 1, "--first-stage-layers 1 and --last-stage-layers 1 take 2 of the model's 3 layers and "
                            "--pp 2 has no other stage for the 1 left: expected them to add up to 3"),
    (_flags(7), 126, 16, 1, "--first-stage-layers 7 leaves 119 layers for the other 15 stages, which must share them "
                            "evenly, a layer at least each (as Megatron's flags do); give --stage-layers for any other "
                            "split"),
    (_flags(3, 4), 16, 4, 2, "--first-stage-layers 3 and --last-stage-layers 4 leave 9 layers for the other 2 "
                             "stages, which must share them evenly, a layer at least each (as Megatron's flags do); "
                             "give --stage-layers for any other split"),
    (_flags(3, 3), 12, 4, 2, "--first-stage-layers 3 cannot be spread evenly over --virtual-stages 2 chunks: "
                             "expected a multiple of 2 (Megatron's rule), or give each chunk's with --stage-layers"),
    (_flags(0), 4, 2, 2, "--first-stage-layers 0 leaves every chunk of stage 0 without a layer; with "
                         "--virtual-stages 2 only the first and the last chunk may have none: give them with "
                         "--stage-layers"),
    (_flags(stage="1,2.5"), 3, 2, 1, "--stage-layers '1,2.5' must be layer counts (integers >= 0) separated by "
                                     "commas, a run of K equal counts N as NxK (K >= 1), e.g. 7,8x14,7"),
    (_flags(stage="1,1"), 3, 2, 1, "--stage-layers 1,1 covers 2 layers: expected the model's 3"),
    (_flags(stage="1,1,1"), 3, 2, 1, "--stage-layers 1,1,1 gives 3 counts: expected 2, one for each of --pp 2 "
                                     "stages"),
    (_flags(stage="1,2"), 3, 2, 2, "--stage-layers 1,2 gives 2 counts: expected 4, one for each of --pp 2 x "
                                   "--virtual-stages 2 = 4 chunks"),
    (_flags(stage="1,0,1"), 2, 3, 1, "--stage-layers 1,0,1 leaves chunk 1 without a layer: only the first and the "
                                     "last chunk, which hold the embedding and the head, may have none"),
    # none given: the balanced default, which needs a layer in every chunk
    (_flags(), 1, 2, 1, "--layers 1 cannot fill --pp 2 stages: each stage needs a layer at least"),
    (_flags(), 4, 2, 3, "--layers 4 cannot fill --pp 2 x --virtual-stages 3 = 6 chunks: each chunk needs a layer at "
                        "least"),
    (_flags(1, stage="1,2"), 3, 2, 1, "--stage-layers 1,2 gives every chunk's layers: leave out --first-stage-layers "
                                      "1 (or give --first-stage-layers and --last-stage-layers alone)"),
])
def test_a_split_that_cannot_be_is_refused_in_one_line_naming_the_flag(flags, layers, pp, v, message):
    assert layer_split(flags, layers, pp, v) == (None, message)


# A small GPT (dropout 0: no masks); 3 layers on 2 stages, 4 microbatches, unless a test says otherwise
MODEL = ["estimate", "gpt", "--hidden", "32", "--heads", "2", "--seq", "16", "--vocab", "64", "--dropout", "0"]
SIZES = {"--layers": "3", "--pp": "2", "--global-batch": "4"}


def _model(argv: tuple) -> list:
    return MODEL + [w for flag, n in SIZES.items() if flag not in argv for w in (flag, n)] + list(argv)


def _estimate(*argv: str) -> tuple[str, dict]:
    code, out, err = run_here("main", _model(argv))
    assert code == 0, err
    code, data, err = run_here("main", _model(argv) + ["--json"])
    assert code == 0, err
    return out, json.loads(data)


def test_the_estimate_dry_runs_the_split_it_is_given():
    out, data = _estimate("--first-stage-layers", "1")
    same, twin = _estimate("--stage-layers", "1,2")
    balanced, plain = _estimate()
    assert "\nlayers split as given: 3 over 2 stages, 1, 2\n" in out
    assert "\nstage 0 (rank 0)\n  holds embedding + layer 0 (1 layer)\n" in out
    assert "\nstage 1 (rank 1)\n  holds layers 1-2 + head (2 layers)\n" in out
    assert "\nlayers uneven: 3 over 2 stages, 2, 1 (the first take one more)\n" in balanced
    assert "\nstage 0 (rank 0)\n  holds embedding + layers 0-1 (2 layers)\n" in balanced
    assert data["chunk_layers"] == [1, 2] and plain["chunk_layers"] == [2, 1]
    # each stage's figures are its dry run's: the layers' parameters and products follow the split
    params = [s["layer_params"] for s in data["stages"]]
    assert params[1] == 2 * params[0] and [s["layer_params"] for s in plain["stages"]] == params[::-1]
    assert data["stages"][1]["flops"]["forward"] > plain["stages"][1]["flops"]["forward"]

    def figures(text: str) -> list:  # the output less the dry run's own time
        return [line for line in text.splitlines() if not line.startswith("dry run of one step")]

    assert figures(same) == figures(out) and twin["stages"] == data["stages"]  # --stage-layers 1,2: the same split
    assert data["config"]["first_stage_layers"] == 1 and twin["config"]["stage_layers"] == "1,2"


def test_the_estimate_shows_the_slowest_and_the_fullest_stage_too():
    """With four stages it printed the first, a middle and the last; a split that loads stage 1 most makes it the
    slowest and the fullest, whose figures the step time and the memory line name: now shown too."""
    out, data = _estimate("--layers", "5", "--pp", "4", "--stage-layers", "1,2,1,1", "--global-batch", "8")
    assert [s["stage"] for s in data["stages"]] == [0, 1, 2, 3]
    assert "stage 1's, the slowest of 4" in out and "\nstage 1 (rank 1)\n  holds layers 1-2 (2 layers)\n" in out


@pytest.mark.parametrize("argv, message", [
    (["--first-stage-layers", "2", "--last-stage-layers", "2"],
     "--first-stage-layers 2 and --last-stage-layers 2 take 4 layers: more than the model's 3"),
    (["--pp", "1", "--stage-layers", "3"], "--stage-layers 3 splits the layers over pipeline stages: give --pp 2 or "
                                           "more (got --pp 1)"),
    (["--virtual-stages", "2", "--pp", "2", "--layers", "4", "--first-stage-layers", "1"],
     "--first-stage-layers 1 cannot be spread evenly over --virtual-stages 2 chunks: expected a multiple of 2 "
     "(Megatron's rule), or give each chunk's with --stage-layers"),
])
def test_the_estimate_refuses_a_bad_split_in_one_line(argv, message):
    code, out, err = run_here("main", _model(tuple(argv)))
    assert code == 2 and out == "" and err.replace("\n  ", " ") == f"spmdsim: error: {message}\n", err


def test_the_bounds_and_the_price_of_a_configuration_with_a_split():
    """spmdsim.tools.estimate.configs.Config's split: its price is the dry run of that split, and the layer cells'
    bounds count each stage's layers as it cuts them, still below the price."""
    from spmdsim.tools.estimate.bounds import Cells
    from spmdsim.tools.estimate.machine import load_machine
    from spmdsim.tools.estimate.configs import Config
    from spmdsim.tools.estimate.search import price
    from spmdsim.models.gpt import GPTConfig

    cfg = GPTConfig(layers=4, d_model=32, heads=4, seq=32, vocab=64, batch=4, dropout=0.1)
    a100 = load_machine("a100-dgx")
    cells = Cells(cfg, "megatron", 8)
    balanced = Config(1, 2, 1, False, 2, 1, "none", 0)
    split = Config(1, 2, 1, False, 2, 1, "none", 0, split=(1, 3))
    seconds, held, _ = price(cfg, split, a100, "bf16-mixed", "megatron")
    even_s, even_held, _ = price(cfg, balanced, a100, "bf16-mixed", "megatron")
    assert seconds > even_s  # stage 1's three layers set the step
    time_bound = cells.time_bound(split, a100, "bf16-mixed")
    assert cells.time_bound(balanced, a100, "bf16-mixed") < time_bound <= seconds
    assert cells.memory_bound(split, "bf16-mixed") <= held
    assert cells.stages(split) == [[{"dense": 1}], [{"dense": 3}]]


def test_train_gpt_trains_a_pipeline_of_an_uneven_split_checked_every_step():
    code, out, err = run_here("examples/train_gpt.py", [
        "--ranks", "2", "--pp", "2", "--layers", "3", "--stage-layers", "1,2", "--d-model", "32", "--seq", "16",
        "--batch", "4", "--steps", "2", "--every", "1", "--sample", "0"])
    assert code == 0, err
    assert "\nlayers per stage: 1, 2\n" in out
    assert "check: 2 steps vs one numpy process (loss, 49 gradients and parameters each): PASS" in out
    code, out, err = run_here("examples/train_gpt.py", [
        "--ranks", "2", "--pp", "2", "--layers", "3", "--first-stage-layers", "4", "--steps", "1"])
    assert code == 2 and err.replace("\n  ", " ").endswith(
        "spmdsim: error: --first-stage-layers 4 takes 4 layers: more than the model's 3\n"), err


def test_train_moe_gpt_takes_megatrons_flag_over_its_pipeline():
    code, out, err = run_here("examples/train_moe_gpt.py", [
        "--ranks", "4", "--pp", "2", "--ep", "2", "--layers", "4", "--first-stage-layers", "1", "--d-model", "32",
        "--seq", "16", "--batch", "4", "--microbatches", "2", "--steps", "1"])
    assert code == 0, err
    assert "\n  layers per stage: 1, 3\n" in out and ": PASS" in out


@pytest.mark.parametrize("example", ["train_gpt.py", "train_moe_gpt.py"])
def test_the_examples_refuse_fewer_layers_than_stages_naming_the_layers(example):
    # not "no dp x tp of 4 ranks runs it (tp 4: 1 layers cannot fill 2 pipeline chunks; tp 2: ...)"
    moe = ["--moe-every", "1"] if "moe" in example else []  # (its one block an MoE layer)
    code, out, err = run_here(f"examples/{example}",
                              ["--ranks", "8", "--pp", "2", "--layers", "1", "--steps", "1"] + moe)
    assert code == 2 and err.replace("\n  ", " ").endswith(
        "spmdsim: error: --layers 1 cannot fill --pp 2 stages: each stage needs a layer at least\n"), err
