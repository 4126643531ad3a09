"""README.md's three paths run exactly as printed and print what it shows; its test command is .ci/run's.

The pure commands run in this process (docs_commands.run_here); the program of the second path is
saved as the README says (`my_matmul.py`, in a folder of its own) and run there, on simulated ranks
and under one `mpiexec -n 8`.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from docs_commands import ROOT, mismatch, page_quoting, quotes, run_here
from testkit import MPIEXEC

README = "README.md"


def _shown() -> list:
    """The README's commands with the output it shows under them, in order."""
    return [q for q in quotes(README) if q.output is not None]


def _program() -> str:
    text = (ROOT / README).read_text()
    at = text.index("Save this as `my_matmul.py`")
    return re.search(r"^```python\n(.*?)^```", text[at:], re.S | re.M).group(1)


def _in_folder(command: str, folder) -> tuple[int, str]:
    """(exit code, what it printed) of `command` in bash in `folder`, this Python first on PATH."""
    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout


def test_readme_is_a_front_door():
    lines = (ROOT / README).read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:3] == ["## Two commands", "## Three paths of five minutes", "## What it does"], headings


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / README).read_text()
    ci = (ROOT / ".ci/run").read_text().strip().splitlines()[-1]
    command = re.search(r"^python3 -m venv .*bash scripts/test\.sh$", readme, re.M).group(0)
    assert ci == command


def test_path_a_and_c_print_what_the_readme_shows():
    """The teaching path (show, run --explain) and the sizing path (estimate, autoshard), each within 100 columns
    (the docs' width: tests/test_classroom_docs.py leaves a command README.md quotes with its output to this test,
    but for one a page it runs quotes with its output too: it checks its one run against both quotes)."""
    pure = [q for q in _shown() if q.command.startswith("spmdsim ")]
    assert [q.command.split()[1] for q in pure] == ["show", "run", "estimate", "autoshard"]
    assert [q.command.split()[1] for q in pure if page_quoting(q)] == ["autoshard"]
    for quote in (q for q in pure if not page_quoting(q)):
        code, out, err = run_here("main", shlex.split(quote.command)[1:])
        assert code == 0, quote.where() + "\n" + err
        why = mismatch(quote.output, out)
        assert why is None, f"{quote.where()}: {why}\n{out}"
        assert max((len(line) for line in out.splitlines()), default=0) <= 100, quote.where()


def test_path_b_runs_the_program_as_saved_on_simulated_and_mpi_ranks(tmp_path):
    (tmp_path / "my_matmul.py").write_text(_program())
    shown = [q for q in _shown() if "my_matmul.py" in q.command]
    assert [q.command for q in shown] == ["python my_matmul.py --ranks 8",
                                          "timeout -k 5 120 mpiexec -n 8 python my_matmul.py",
                                          "python my_matmul.py --ranks 4 2>&1"]
    for quote in shown:
        if "mpiexec" in quote.command and not MPIEXEC:
            continue  # no MPI here: the simulated runs still check the program
        code, out = _in_folder(quote.command, tmp_path)
        assert code == (2 if "--ranks 4" in quote.command else 0), f"{quote.where()}\n{out}"
        why = mismatch(quote.output, out)
        assert why is None, f"{quote.where()}: {why}\n{out}"
        assert max(len(line) for line in out.splitlines()) <= 100, quote.where()
