"""A run started with its stdout (or stderr) closed (``spmdsim ... >&-``, a launcher that closes them) drops its
output, as Python's print does where sys.stdout is None, and ends with the command's own exit code: never an
AttributeError traceback from a flush, and a file it writes (a grade book) is whole."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from spmdsim.tools.lab.exercise import EXERCISES

SPMDSIM = [sys.executable, "-m", "spmdsim"]


def _closed(argv: list, folder: str, closed: str = ">&-") -> subprocess.CompletedProcess:
    """`argv` run by sh with `closed` (its redirections: >&- closes stdout), stderr captured where left open."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(["sh", "-c", f'"$@" {closed}', "sh", *argv], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("words", [["lab", "list"], ["demo", "--ranks", "4", "--only", "mlp"],
                                   ["show", "--device-matrix", "2,4", "--alias", "dp,mp", "--tensor-map", "mp,None",
                                    "--shape", "8,6"]])
def test_a_command_with_stdout_closed_ends_as_it_would(tmp_path, words) -> None:
    done = _closed([*SPMDSIM, *words], str(tmp_path))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_stdout_and_stderr_closed_too(tmp_path) -> None:
    done = _closed([*SPMDSIM, "demo", "--ranks", "4", "--only", "mlp"], str(tmp_path), ">&- 2>&-")
    assert done.returncode == 0


PROGRAM = """import spmdsim
spmdsim.script(__file__)
print("rank", spmdsim.world().Get_rank())
"""


def test_a_program_on_simulated_ranks_with_stdout_closed(tmp_path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = _closed([sys.executable, "prog.py", "--ranks", "2"], str(tmp_path))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_a_grade_book_written_with_stdout_closed_is_whole(tmp_path) -> None:
    (tmp_path / "subs").mkdir()
    shutil.copy(os.path.join(EXERCISES, "03_pi_reduce.py"), tmp_path / "subs" / "carol.py")
    done = _closed([*SPMDSIM, "lab", "grade", "3", "subs", "--csv", "grades.csv"], str(tmp_path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    book = (tmp_path / "grades.csv").read_text().splitlines()
    assert book[0].startswith("file,verdict,") and book[1].startswith("carol.py,PASS,10,10,"), book
