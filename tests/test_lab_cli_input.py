"""spmdsim lab's trips for a new user: a submission that does not load, said once; an exercise number not known,
said without the path spmdsim is installed at."""
from __future__ import annotations

import re

import pytest

from test_lab_cli import SUBMISSIONS, TINY

from spmdsim.tools.cli.main import main
from spmdsim.tools.lab import load_exercises
from spmdsim.tools.lab.exercise import EXERCISES, find_exercise
from spmdsim.tools.lab.sandbox import check_mpiexec

#: A submission of the tiny exercise that defines another function than double().
TRIPLE = "def triple(comm, x):\n    return 3 * x\n"


@pytest.fixture
def desk(tmp_path, monkeypatch, capsys):
    """A student's folder as they type its paths: work/ (exercise 5's starter), mine.py (no starter docstring),
    s/right.py, and course/ (an instructor's one exercise, 01_double.py)."""
    monkeypatch.chdir(tmp_path)
    assert main(["lab", "start", "5", "work"]) == 0
    (tmp_path / "mine.py").write_text(SUBMISSIONS["right.py"])
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "right.py").write_text(SUBMISSIONS["right.py"])
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "01_double.py").write_text(TINY)
    capsys.readouterr()
    return tmp_path


@pytest.mark.parametrize("argv, message", [
    # the install path, '.../spmdsim/tools/lab/exercises', named to a student who typed a folder for N
    (["start", "work2"], "no exercise 'work2': expected an exercise's number, 1 to {last} (spmdsim lab list lists "
     "them)"),
    (["start", "work2", "--exercises", "course"], "no exercise 'work2' in 'course': expected an exercise's number, "
     "1 (spmdsim lab list --exercises DIR lists them)"),
])
def test_a_trip_is_one_line_saying_what_was_expected(desk, argv, message, capsys):
    assert main(["lab", *argv]) == 2
    err = capsys.readouterr().err
    last = load_exercises()[-1].number
    assert err.replace("\n  ", " ").strip() == "spmdsim: error: " + message.format(last=last), err
    assert EXERCISES not in err and not (desk / "work2").exists()


@pytest.mark.parametrize("name, source, reason", [
    ("empty.py", "", "empty.py is empty"),
    ("typo.py", SUBMISSIONS["typo.py"], "syntax error at line 1: expected ':'"),
    ("binary.py", "\x00PK", "binary.py is not a Python source file (it holds null bytes)"),
    ("triple.py", TRIPLE, "triple.py defines no function 'double' (it defines triple): def double(comm, x)"),
])
def test_a_submission_that_does_not_load_is_said_once_not_once_a_rank_count(desk, name, source, reason, capsys):
    """An empty file, or a syntax error, printed "FAIL empty.py is empty" once per rank count."""
    (desk / name).write_text(source)
    if name == "typo.py":  # the parser's own words, as this Python says them
        with pytest.raises(SyntaxError) as error:
            compile(source, name, "exec")
        reason = f"syntax error at line 1: {error.value.msg}"
    assert main(["lab", "check", "1", name, "--exercises", "course"]) == 1
    out = capsys.readouterr().out.replace("\n  ", " ").splitlines()
    assert [re.sub(r"\d+\.\d s", "S s", line) for line in out] == [
        f"exercise 1, Double it: {name}", f"FAIL: no case can run (0 of 2 cases, S s): {reason}"], out


def test_a_submission_that_does_not_load_runs_one_mpiexec_job_not_one_a_rank_count(desk):
    (desk / "empty.py").write_text("")
    verdict = check_mpiexec(find_exercise(1, "course"), "empty.py", time_limit=60)
    assert [(r.ranks, r.status, r.reason) for r in verdict.results] == [(1, "unloadable", "empty.py is empty")]
