"""Every command docs/training.md shows under "Memory" runs, and prints what the doc quotes.

A command quoted with its output (``$ ...``) runs as shown and its output must match
(docs_commands.mismatch: ``...`` skips lines, e-notation differences match any number). A command
marked ``# long`` (50 or 20 training steps, or an MPI launch) runs with ``--steps 2 --sample 0`` in
place of its step count and must PASS; the MPI one needs an mpiexec (tests/testkit.MPIEXEC).
"""
from __future__ import annotations

import pytest

from docs_commands import assert_prints_quote, run_long, section
from testkit import MPIEXEC

DOC = "docs/training.md"


def _section() -> list:
    return section(DOC, "## Memory: activation recomputation")


def test_the_section_shows_the_commands_this_test_runs():
    shown = _section()
    assert [q.output is not None for q in shown] == [True, False, False, False, False, False, True, True, True]
    assert sum("# long" in q.command for q in shown) == 5


@pytest.mark.parametrize("index", [0, 6, 7, 8])
def test_a_quoted_command_prints_what_the_doc_quotes(index):
    quote = _section()[index]
    assert_prints_quote(quote)


@pytest.mark.parametrize("index", [1, 2, 3, 4, 5])
def test_a_long_command_runs_two_steps_and_passes(index):
    quote = _section()[index]
    done = run_long(quote, MPIEXEC)
    assert "check: 2 steps vs one numpy process (loss, 64 gradients and parameters each): PASS" in done.stdout
