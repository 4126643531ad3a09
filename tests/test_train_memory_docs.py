"""Every command docs/training.md shows under "Memory" runs, and prints what the doc quotes.

A command quoted with its output (``$ ...``) runs as shown and its output must match
(docs_commands.mismatch: ``...`` skips lines, e-notation differences match any number). A command
marked ``# long`` (50 or 20 training steps, or an MPI launch) runs with ``--steps 2 --sample 0`` in
place of its step count and must PASS; the MPI one needs an mpiexec (tests/testkit.MPIEXEC).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from docs_commands import ROOT, mismatch, quotes
from testkit import MPIEXEC

DOC = "docs/training.md"


def _section() -> list:
    text = (ROOT / DOC).read_text()
    start = text.count("\n", 0, text.index("## Memory: activation recomputation"))
    stop = text.count("\n", 0, text.index("\n## ", text.index("## Memory: activation recomputation") + 1))
    return [q for q in quotes(DOC) if start <= q.line <= stop]


def _run(command: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_section_shows_the_commands_this_test_runs():
    shown = _section()
    assert [q.output is not None for q in shown] == [True, False, False, False, False, False, True, True, True]
    assert sum("# long" in q.command for q in shown) == 5


@pytest.mark.parametrize("index", [0, 6, 7, 8])
def test_a_quoted_command_prints_what_the_doc_quotes(index):
    quote = _section()[index]
    done = _run(quote.command)
    assert done.returncode == 0, quote.where() + "\n" + done.stderr[-2000:]
    why = mismatch(quote.output, done.stdout)
    assert why is None, f"{quote.where()}: {why}\n{done.stdout}"


@pytest.mark.parametrize("index", [1, 2, 3, 4, 5])
def test_a_long_command_runs_two_steps_and_passes(index):
    quote = _section()[index]
    command, _, note = quote.command.partition("#")
    assert note.strip() == "long", quote.where()
    if "mpiexec" in command and not MPIEXEC:
        pytest.skip("no mpiexec")
    short = re.sub(r"--steps \d+", "--steps 2 --sample 0", command.strip())
    assert short != command.strip()
    done = _run(short)
    assert done.returncode == 0, quote.where() + "\n" + done.stderr[-2000:]
    assert "check: 2 steps vs one numpy process (loss, 64 gradients and parameters each): PASS" in done.stdout
