"""Every command docs/howto/train.md shows under "An odd vocabulary: padding" runs, and prints what the doc quotes.

A command quoted with its output (``$ ...``) runs as shown and its output must match
(docs_commands.mismatch); the refusal exits 2. The pipeline marked ``# long`` runs with ``--steps 2 --sample 0``
and must PASS and print its padding; the MPI ones run so in tests/test_train_docs_mpi.py, in one mpiexec job with
the other pages' (mpi_long).
"""
from __future__ import annotations

import pytest

from docs_commands import ROOT, assert_prints_quote, mpi_long, run_here, run_long, section

DOC = "docs/howto/train-gpt.md"


def _section() -> list:
    return section(DOC, "## An odd vocabulary: padding")


def test_the_section_shows_the_commands_this_test_runs():
    shown = _section()
    assert [q.output is not None for q in shown] == [True, True, True, True, False, False, False, False]
    assert all("--vocab 50257" in q.command for q in shown)
    assert sum("# long" in q.command for q in shown) == 3
    assert shown[7].argv[:2] == ["estimate", "gpt"]  # the estimate's padding, in prose
    assert [i for i, q in enumerate(shown) if mpi_long(q)] == [4, 5]  # tests/test_train_docs_mpi.py runs them


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_a_quoted_command_prints_what_the_doc_quotes(index):
    quote = _section()[index]
    assert_prints_quote(quote, 2 if index == 0 else 0)


@pytest.mark.parametrize("index", [6])
def test_a_long_command_runs_two_steps_pads_and_passes(index):
    quote = _section()[index]
    done = run_long(quote)
    assert "vocab 50,257 padded to " in done.stdout
    assert "check: 2 steps vs one numpy process (loss, " in done.stdout and "each): PASS" in done.stdout


def test_the_estimate_pads_as_the_prose_says():
    quote = _section()[7]
    code, out, err = run_here("main", quote.argv)
    assert code == 0, err
    assert out.splitlines()[0].startswith("GPT 4 layers, hidden 128, 8 heads, seq 64, vocab 50257 (padded to 51,200);")
    text = " ".join((ROOT / DOC).read_text().split())
    assert "prints `vocab 50257 (padded to 51,200)`" in text  # what the first line says
