"""Every command docs/howto/memory.md shows runs, and prints what the doc quotes.

A command quoted with its output (``$ ...``) runs as shown and its output must match
(docs_commands.mismatch: ``...`` skips lines, e-notation differences match any number). A command
marked ``# long`` (50 or 20 training steps) runs with ``--steps 2 --sample 0`` in place of its step count and
must PASS (the first of them by the quoted run of the same command, docs_commands.long_run_in); the MPI one runs so
in tests/test_train_docs_mpi.py, in one mpiexec job with the other pages' (mpi_long).
"""
from __future__ import annotations

import pytest

from docs_commands import assert_prints_quote, long_run_in, mpi_long, quotes, run_long

DOC = "docs/howto/memory.md"


def _section() -> list:
    return quotes(DOC)


def test_the_section_shows_the_commands_this_test_runs():
    shown = _section()
    assert [q.output is not None for q in shown] == [True, False, False, False, False, False, True, True, True,
                                                     True]
    assert sum("# long" in q.command for q in shown) == 5
    assert [i for i, q in enumerate(shown) if mpi_long(q)] == [5]  # tests/test_train_docs_mpi.py runs it


@pytest.mark.parametrize("index", [0, 6, 7, 8, 9])
def test_a_quoted_command_prints_what_the_doc_quotes(index):
    quote = _section()[index]
    assert_prints_quote(quote)


def test_the_first_long_command_is_the_quoted_run_for_more_steps():
    """Its 2 steps (run_long's) are the first 2 of the quoted 5-step run of the same command (--memory and --every only
    print), whose quoted PASS test_a_quoted_command_prints_what_the_doc_quotes[0] checks: it is not run again."""
    shown = _section()
    assert long_run_in(shown[1], shown) is shown[0]
    assert all(long_run_in(shown[i], shown) is None for i in (2, 3, 4))  # run below


@pytest.mark.parametrize("index", [2, 3, 4])
def test_a_long_command_runs_two_steps_and_passes(index):
    quote = _section()[index]
    done = run_long(quote)
    assert "check: 2 steps vs one numpy process (loss, 64 gradients and parameters each): PASS" in done.stdout


def test_the_section_sends_a_pipeline_to_the_command_docs_pipeline_md_runs():
    """The section said train_gpt.py refuses --recompute, --zero and --memory beside --pp in one line; they run
    and pass. It points to docs/howto/pipelines.md's run instead, which tests/test_classroom_docs.py runs (its PASS)."""
    from docs_commands import ROOT, quotes

    text = " ".join((ROOT / DOC).read_text().split())
    assert "refuses `--recompute`" not in text
    assert ("`train_gpt.py` takes `--recompute`, `--zero 1` and `--memory` beside `--pp`" in text
            and '(docs/howto/pipelines.md, "Running a pipeline", quotes a run that passes)' in text)
    runs = [q for q in quotes("docs/howto/pipelines.md") if q.output and all(
        flag in q.command.split() for flag in ("--pp", "--recompute", "--zero", "--memory"))]
    assert len(runs) == 1 and any(line.endswith(": PASS") for line in runs[0].output), runs
    assert "## Running a pipeline" in (ROOT / "docs/howto/pipelines.md").read_text()
