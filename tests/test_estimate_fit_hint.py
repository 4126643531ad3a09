"""`spmdsim estimate`: a configuration that does not fit is told what to change (docs/howto/estimate.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import spmdsim.tools.estimate
from docs_commands import run_here
from spmdsim.tools.cli.estimate_report import _gib  # the command's own rounding of a size
from testkit import unfold

MODEL = ["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "256", "--vocab", "128",
         "--global-batch", "4"]


def _machine(tmp_path: Path, memory: int) -> str:
    raw = json.loads((Path(spmdsim.tools.estimate.__file__).parent / "machines" / "a100-dgx.json").read_text())
    path = tmp_path / "small.json"
    path.write_text(json.dumps(raw | {"name": "small", "memory_bytes": memory}))
    return str(path)


def _tail(*argv: str) -> str:
    code, out, err = run_here("main", [*MODEL, *argv])
    assert code == 0, err
    assert all(len(line) <= 100 for line in out.splitlines())
    return unfold(out[out.index("\nmemory: "):]).strip()


@pytest.mark.parametrize("argv, hint", [
    # each part with the options that shrink it, those already given left out
    (["--micro-batch", "2", "--tp", "2"],
     "activations {act} (fewer with --recompute selective or full, --attention flash, --kept megatron, --sp, a "
     "smaller --micro-batch) and {rest} besides them (less with --zero 1 with --dp above 1)"),
    # flash attention keeps no scores: selective recomputation has nothing more to drop
    (["--micro-batch", "2", "--tp", "2", "--attention", "flash"],
     "activations {act} (fewer with --recompute full, --kept megatron, --sp, a smaller --micro-batch) and {rest} "
     "besides them (less with --zero 1 with --dp above 1)"),
    (["--micro-batch", "4", "--recompute", "selective", "--kept", "megatron"],
     "activations {act} (fewer with --recompute full, a smaller --micro-batch) and {rest} besides them (less "
     "with --zero 1 with --dp above 1)"),
    (["--micro-batch", "1", "--recompute", "full", "--kept", "megatron", "--dp", "2"],
     "activations {act} and {rest} besides them (less with --zero 1)"),
    (["--micro-batch", "1", "--recompute", "full", "--kept", "megatron", "--dp", "2", "--zero", "1"],
     "activations {act} and {rest} besides them"),
])
def test_a_stage_over_the_gpus_memory_is_told_what_shrinks_it(tmp_path, argv, hint):
    """The verdict names the stage's peak (as before) and then its activations and what it holds besides them,
    by value, each with this command's options that shrink it; a configuration that fits gets no such line."""
    code, out, _ = run_here("main", [*MODEL, *argv, "--json"])
    (stage,) = json.loads(out)["stages"]
    act = stage["bytes"]["activations"]  # besides them: the rest of the memory line and the gradients held beyond it
    rest = sum(stage["bytes"].values()) - act + stage["backward_gradient_bytes"]
    tail = _tail(*argv, "--machine", _machine(tmp_path, stage["peak_bytes"] - 1))
    assert f"\nto fit: stage 0 holds {hint.format(act=_gib(act), rest=_gib(rest))}; a larger --tp or --pp splits " \
           "both; or let `spmdsim autoshard --network gpt --machine` choose (docs/howto/estimate.md)" in tail, tail
    assert tail.startswith("memory: stage 0 needs ")
    assert "to fit" not in _tail(*argv, "--machine", _machine(tmp_path, stage["peak_bytes"]))


def test_estimate_help_gives_each_default_and_the_shipped_machines(monkeypatch):
    """`spmdsim estimate --help` gave no default: a user sizing a real model could not see that each dimension
    left out is a toy GPT's (4 layers, hidden 128), nor which machines ship."""
    from spmdsim.tools.estimate.machine import machines

    monkeypatch.setenv("COLUMNS", "200")  # (argparse reads the width when it prints the help)
    code, out, err = run_here("main", ["estimate", "--help"])  # in this process: the command's own help
    assert code == 0, err
    text = " ".join(out.split("options:", 1)[1].split())
    for flag, default in (("--layers N", 4), ("--hidden N", 128), ("--seq N", 64), ("--global-batch N", 8)):
        assert f"{flag} " in text and f"(default {default})" in text.split(flag, 1)[1][:80], (flag, text)
    assert all(name in text for name in machines())
    assert "spmdsim's graph (default)" in text and "activation recomputation (default none)" in text


def test_a_stage_of_one_rank_is_named_so(capsys):
    """A stage of one rank read 'stage 0 (ranks 0-0: 1 rank alike; one rank's figures)'."""
    from spmdsim.tools.cli.main import main

    assert main(["estimate", "gpt", "--layers", "2", "--pp", "2"]) == 0
    out = capsys.readouterr().out
    assert "stage 0 (rank 0)\n" in out and "stage 1 (rank 1)\n" in out and "ranks 0-0" not in out


def test_layers_that_do_not_divide_over_the_stages_are_said(capsys):
    """`--pp 5` of 32 layers was split 7, 7, 6, 6, 6 without a word (the slowest stage sets the step)."""
    from spmdsim.tools.cli.main import main

    assert main(["estimate", "gpt", "--layers", "7", "--pp", "3", "--global-batch", "3"]) == 0
    assert "\nlayers uneven: 7 over 3 stages, 3, 2, 2 (the first take one more)\n" in capsys.readouterr().out
    assert main(["estimate", "gpt", "--layers", "6", "--pp", "3", "--global-batch", "3"]) == 0
    assert "uneven" not in capsys.readouterr().out


def test_a_tensor_parallel_group_wider_than_a_node_is_said(capsys):
    """`--tp 16` on 8-GPU nodes was priced on the cluster links without a word."""
    from spmdsim.tools.cli.main import main

    assert main(["estimate", "gpt", "--tp", "16", "--heads", "16"]) == 0
    out = capsys.readouterr().out
    assert "\ntp 16 spans 2 of the a100-dgx's 8-GPU nodes: its collectives are priced on the cluster links\n" in out
    assert main(["estimate", "gpt", "--tp", "8", "--heads", "8"]) == 0
    assert "spans" not in capsys.readouterr().out
