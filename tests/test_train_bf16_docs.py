"""Every command docs/howto/bf16.md shows runs, and prints what the doc quotes.

The quoted command (``$ ...``) runs as shown and its output must match (docs_commands.mismatch); a command
marked ``# long`` (200 steps on four layouts) runs with ``--steps 2 --sample 0`` in place of its step count and must
PASS (the first of them by the quoted run of the same command, docs_commands.long_run_in); the MPI one (50 steps)
runs so in tests/test_train_docs_mpi.py, in one mpiexec job with the other pages' (mpi_long).
"""
from __future__ import annotations

import re

import pytest

from docs_commands import ROOT, assert_prints_quote, long_run_in, mpi_long, quotes, run_here, run_long

pytest.importorskip("ml_dtypes")

DOC = "docs/howto/bf16.md"


def _section() -> list:
    """The bf16 part's commands (the page up to its "## FP8" section)."""
    return [q for q in quotes(DOC) if q.line < _fp8_line()]


def _fp8_line() -> int:
    text = (ROOT / DOC).read_text()
    return text.count("\n", 0, text.index("\n## FP8\n")) + 2


def test_the_fp8_section_shows_one_long_command_and_it_passes():
    """Its 100-step run, with --steps 2 --sample 0: FP8 training checked against one process under its policy."""
    (quote,) = [q for q in quotes(DOC) if q.line > _fp8_line() and not q.inline]  # (and `spmdsim estimate` in prose)
    assert "--precision fp8 " in quote.command and quote.command.rstrip().endswith("# long")
    done = run_long(quote)
    assert "check: 2 steps vs one numpy process" in done.stdout and ": PASS" in done.stdout, done.stdout[-2000:]


def test_the_section_shows_the_commands_this_test_runs():
    shown = _section()
    assert [q.output is not None for q in shown] == [True, False, False, False, False, False]
    assert all("--precision bf16-mixed" in q.command for q in shown)
    assert sum("# long" in q.command for q in shown) == 5
    assert [i for i, q in enumerate(shown) if mpi_long(q)] == [5]  # tests/test_train_docs_mpi.py runs it


def test_the_quoted_command_prints_what_the_doc_quotes():
    quote = _section()[0]
    assert_prints_quote(quote)


def test_the_first_long_command_is_the_quoted_run_for_fewer_steps():
    """Its 2 steps (run_long's) are the first 2 of the quoted 3-step run of the same command (--every only prints),
    whose quoted PASS and tolerance lines test_the_quoted_command_prints_what_the_doc_quotes checks: not run again."""
    shown = _section()
    assert long_run_in(shown[1], shown) is shown[0]
    assert all(long_run_in(shown[i], shown) is None for i in (2, 3, 4))  # run below
    quoted = "\n".join(shown[0].output)  # the lines test_a_long_command_runs_two_steps_and_passes asks for
    assert "tolerances under bf16-mixed: loss 6.1e-05, gradients 4.7e-02, parameters 9.5e-07" in quoted
    assert "of what its own rounding allows (at most 1)" in quoted


@pytest.mark.parametrize("index", [2, 3, 4])
def test_a_long_command_runs_two_steps_and_passes(index):
    quote = _section()[index]
    done = run_long(quote)
    assert "check: 2 steps vs one numpy process (loss, 64 gradients and parameters each): PASS" in done.stdout
    assert "tolerances under bf16-mixed: loss 6.1e-05, gradients 4.7e-02, parameters 9.5e-07" in done.stdout
    assert "of what its own rounding allows (at most 1)" in done.stdout


def test_the_tables_quote_the_tolerances_the_code_uses():
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.models.gpt.tolerances import tolerances
    from spmdsim.base.precision import precision

    text = (ROOT / DOC).read_text()
    shown = text
    loss, grads, params = tolerances(precision("bf16-mixed"), GPTConfig())
    for figure in (f"{loss:.1e}", f"{grads:.1e}", f"{params:.1e}"):
        assert figure in shown, figure


def test_zero1_at_bf16_sends_the_bytes_the_doc_quotes():
    """The section's figure for ZeRO-1 (the first command with `--zero 1`): the bytes one step sends, beside
    AdamW's in the quote."""
    from docs_commands import run_quoted

    text = (ROOT / DOC).read_text()
    shown = text
    assert "with `--zero 1` sends 3,741,704 bytes" in " ".join(shown.split())
    done = run_quoted(_section()[0].command.split(" --steps")[0] + " --zero 1 --steps 1 --sample 0")
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in _section()[0].output if line.startswith("    0 "))
    loss = row.split()[1]  # the quote's first loss: ZeRO-1 computes the same step
    assert f"    0  {loss}           42   3,741,704" in done.stdout, done.stdout


def test_the_can_it_fail_table_comes_from_its_script():
    """scripts/bf16_references.py makes the "Can it fail?" table: its header is the page's, and on a small GPT the
    policy's reference passes every step while float64's and the thrice-rounded norm's loss fail at some step."""
    from docs_commands import run_quoted

    done = run_quoted("python scripts/bf16_references.py --layers 2 --d-model 32 --seq 16 --steps 3")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    header = next(line for line in (ROOT / DOC).read_text().splitlines() if line.startswith("| reference | loss"))
    assert rows[0] == header.replace("6.1e-05", "1.5e-05").replace("4.7e-02", "3.1e-02")  # the small GPT's tolerances
    over = {row.split(" | ")[0][2:]: row.split(" | ")[2] for row in rows[2:]}
    assert list(over) == ["the same policy", "float64 throughout", "norm rounded three times"], rows
    assert over["the same policy"] == "0 of 3", rows
    assert all(re.fullmatch(r"[1-3] of 3, step [0-2]", over[name]) for name in list(over)[1:]), rows
    code, out, err = run_here("scripts/bf16_references.py", ["--d-model", "30"])
    assert code == 2 and err.splitlines()[-1].startswith("bf16_references.py: error: GPTConfig d_model 30 must be "
                                                         "divisible by heads 4"), err
