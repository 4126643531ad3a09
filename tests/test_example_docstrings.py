"""The examples say what they run: the commands their docstrings give run as written (here their dry runs, which
take a second or two), and every flag of the training examples' --help says what it sets.

A command cut short in a docstring (train_moe_gpt.py's 1,024-rank dry run without its --batch) stopped with
"batch 8 is not divisible by dp 2 x ep 64" where its docs page ran; --steps, --layers, --d-model, --heads,
--seq, --batch and others were listed bare, their defaults nowhere but the source."""
from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from docs_commands import run_here

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def docstring_commands(path: pathlib.Path) -> list[str]:
    """The `python examples/...` commands of `path`'s docstring, a line ending in a backslash joined with the next,
    each from its `python` on."""
    doc = path.read_text().split('"""')[1]  # as written: a backslash at a line's end is still there
    joined = re.sub(r"\s*\\\n\s*", " ", doc)
    commands = []
    for line in joined.splitlines():
        at = line.find("python examples/")
        if at >= 0:
            commands.append(" ".join(line[at:].split("  ")[0].split()))  # up to a comment's wide gap
    return commands


DRY_RUNS = [(path.stem, command) for path in EXAMPLES for command in docstring_commands(path) if "--dry-run" in command]


def test_the_docstrings_give_dry_runs():
    assert {stem for stem, _ in DRY_RUNS} >= {"train_gpt", "train_moe_gpt"}


@pytest.mark.parametrize("stem, command", DRY_RUNS, ids=[stem for stem, _ in DRY_RUNS])
def test_a_docstrings_dry_run_runs_as_written(stem, command):
    words = shlex.split(command)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (command, done.stderr[-2000:])
    assert "dry run on" in done.stdout, done.stdout[-2000:]


def _bare_flags(help_text: str) -> list[str]:
    """The options of an argparse --help with no words of their own."""
    lines = help_text.split("options:\n", 1)[1].splitlines()
    bare = []
    for i, line in enumerate(lines):
        if not line.startswith("  -"):
            continue
        words = line.strip().split("  ", 1)  # the invocation, then its help after a gap
        below = lines[i + 1] if i + 1 < len(lines) else ""
        if len(words) == 1 and not (below.startswith(" " * 8) and not below.strip().startswith("-")):
            bare.append(words[0])
    return bare


@pytest.mark.parametrize("name", ["train_gpt", "train_moe_gpt"])
def test_every_flag_of_a_training_example_has_its_help(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # (argparse reads the width when it prints the help)
    # `python examples/NAME.py --help`, in this process (docs_commands.run_here): the example's own help
    code, out, err = run_here(f"examples/{name}.py", ["--help"])
    assert code == 0, err
    assert _bare_flags(out) == []
    assert "--steps N             training steps (default " in out


@pytest.mark.parametrize("name, steps", [("train_seed_networks", 10), ("train_mindspore_tutorial", 100),
                                         ("train_megatron_block", 20)])
def test_every_flag_of_a_small_training_example_has_its_help(name, steps, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run_here(f"examples/{name}.py", ["--help"])
    assert code == 0, err
    assert _bare_flags(out) == []
    assert f"training steps (default {steps})" in " ".join(out.split())
