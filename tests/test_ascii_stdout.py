"""A user's own non-ASCII text that the output repeats (a student's file José.py, a checkpoint directory "ck é")
under an ASCII stdout (PYTHONIOENCODING=ascii) is written as a backslash escape, as Python's stderr writes it,
never a UnicodeEncodeError traceback after the work is done."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import pytest

from spmdsim.base.output import escape_unencodable
from spmdsim.tools.lab.exercise import EXERCISES


def _run(argv: list, folder: str, encoding: str = "ascii") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *argv], cwd=folder, env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=120)


def test_lab_check_of_a_non_ascii_file_name_on_an_ascii_stdout(tmp_path) -> None:
    shutil.copy(os.path.join(EXERCISES, "03_pi_reduce.py"), tmp_path / "José.py")
    done = _run(["-m", "spmdsim", "lab", "check", "3", "José.py"], str(tmp_path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "exercise 3, Pi by the midpoint rule and Reduce: Jos\\xe9.py" in done.stdout, done.stdout


PROGRAM = """import spmdsim
spmdsim.script(__file__)
print("checkpoint written to ck \\u00e9", spmdsim.world().Get_rank())
"""


def test_a_program_on_simulated_ranks_prints_a_non_ascii_path_on_an_ascii_stdout(tmp_path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = _run(["prog.py", "--ranks", "2"], str(tmp_path))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "checkpoint written to ck \\xe9 1" in done.stdout, done.stdout


@pytest.mark.parametrize("errors, shown", [("strict", b"ck \\xe9"), ("replace", b"ck ?"),
                                           ("surrogateescape", None)])
def test_only_a_strict_stdout_escapes_and_a_chosen_handler_is_kept(monkeypatch, errors, shown) -> None:
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", errors=errors))
    escape_unencodable()
    assert sys.stdout.errors == ("backslashreplace" if errors == "strict" else errors)
    if shown is not None:
        sys.stdout.write("ck \u00e9")
        sys.stdout.flush()
        assert raw.getvalue() == shown
