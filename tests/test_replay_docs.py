"""Every training command docs/howto/replay.md shows runs (with ``--steps 2 --sample 0``, as ``# long``
marks) and PASSes.

The simulated ones here; the MPI ones in tests/test_train_docs_mpi.py, in one mpiexec job with docs/howto/train.md's
(docs_commands.mpi_long). The page's other fenced block is an error message it quotes, not a command; the test
counts the commands so a new one cannot be left out.
"""
from __future__ import annotations

import pytest

from docs_commands import mpi_long, quotes, run_long

DOC = "docs/howto/replay.md"


def _commands() -> list:
    return [q for q in quotes(DOC) if "examples/train_gpt.py" in q.command]


def test_the_page_shows_the_commands_this_test_runs():
    shown = _commands()
    assert len(shown) == 4
    assert all(q.command.endswith("# long") and "--replay" in q.command for q in shown)
    assert [i for i, q in enumerate(shown) if mpi_long(q)] == [1, 3]  # tests/test_train_docs_mpi.py runs them


@pytest.mark.parametrize("index", [0, 2])
def test_a_replayed_training_command_runs_two_steps_and_passes(index):
    done = run_long(_commands()[index])
    assert "check: 2 steps vs one numpy process (loss, 64 gradients and parameters each): PASS" in done.stdout
