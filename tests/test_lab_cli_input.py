"""spmdsim lab's trips for a new user: an argument left out or out of place, a file where grade takes a folder, a
submission that does not load, each said once in one line naming what was given and what was expected."""
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
    # N left out: argparse took the file for N and said "the following arguments are required: FILE"
    (["check", "work/ring_allreduce.py"], "lab check needs the exercise's number before the file: spmdsim lab "
     "check 5 work/ring_allreduce.py (its docstring names exercise 5)"),
    (["check", "mine.py"], "lab check needs the exercise's number before the file: spmdsim lab check N mine.py "
     "(spmdsim lab list lists the exercises)"),
    (["check", "work/ring_allreduce.py", "--exercises", "course"], "lab check needs the exercise's number before "
     "the file: spmdsim lab check 5 work/ring_allreduce.py --exercises course (its docstring names exercise 5)"),
    (["check", "5"], "lab check needs the submission's file after the exercise's number: spmdsim lab check 5 FILE"),
    (["check"], "lab check needs the exercise's number and the submission's file: spmdsim lab check N FILE "
     "(spmdsim lab list lists the exercises)"),
    (["check", "--ranks", "4", "8", "7", "mine.py"], "lab check needs the exercise's number and the submission's "
     "file, before --ranks: spmdsim lab check N FILE --ranks n"),
    # --ranks took "4,8" for one int ("invalid int value: '4,8'")
    (["check", "7", "mine.py", "--ranks", "4,x"], "--ranks '4,x' is not a rank count; expected whole numbers, "
     "space- or comma-separated (--ranks 4 8, or --ranks 4,8)"),
    (["check", "7", "mine.py", "--ranks", "-1"], "--ranks '-1' is not a rank count; expected whole numbers, "
     "space- or comma-separated (--ranks 4 8, or --ranks 4,8)"),
    # a file for grade's folder was "submission folder 's/right.py' does not exist"
    (["grade", "5", "s/right.py", "--csv", "g.csv"], "lab grade takes a folder of submissions (or a zip of one), "
     "and 's/right.py' is a file; for one file: spmdsim lab check 5 s/right.py"),
    (["grade", "1", "s/right.py", "--csv", "g.csv", "--exercises", "course"], "lab grade takes a folder of "
     "submissions (or a zip of one), and 's/right.py' is a file; for one file: spmdsim lab check 1 s/right.py "
     "--exercises course"),
    (["grade", "s", "--csv", "g.csv"], "lab grade needs the exercise's number before the folder: spmdsim lab grade "
     "N s --csv g.csv (spmdsim lab list lists the exercises)"),
    (["grade", "5", "--csv", "g.csv"], "lab grade needs the folder of submissions after the exercise's number: "
     "spmdsim lab grade 5 DIR --csv g.csv"),
    (["grade", "--csv", "g.csv"], "lab grade needs the exercise's number and the folder of submissions: spmdsim "
     "lab grade N DIR --csv g.csv"),
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


def test_a_file_after_ranks_is_the_file_and_ranks_take_commas(desk, capsys):
    """`--ranks 4 8 FILE` said "argument --ranks: invalid int value: 'FILE'" (nargs took the file), and
    `--ranks 4,8` "invalid int value: '4,8'"."""
    for argv in (["1", "--ranks", "2", "1", "s/right.py"], ["1", "s/right.py", "--ranks", "2,1"],
                 ["1", "s/right.py", "--ranks", "2,1", "2"]):
        assert main(["lab", "check", *argv, "--exercises", "course"]) == 0, argv
        out = capsys.readouterr().out.splitlines()
        assert out[:3] == ["exercise 1, Double it: right.py", "   2 ranks: pass (1 case)", "   1 rank : pass (1 case)"]
        assert re.sub(r"\d+\.\d s", "S s", out[3]) == "PASS: passes at 1, 2 ranks (2 of 2 cases, S s)", out


@pytest.mark.parametrize("name, source, reason", [
    ("empty.py", "", "empty.py is empty"),
    ("typo.py", SUBMISSIONS["typo.py"], "syntax error at line 1: expected ':'"),
    ("binary.py", "\x00PK", "binary.py is not a Python source file (it holds null bytes)"),
    ("triple.py", TRIPLE, "triple.py defines no function 'double' (it defines triple): def double(comm, x)"),
    # an import at its top of a module not there: said at each rank count, each case run to fail alike
    ("torchy.py", "import torchy_not_here\n" + SUBMISSIONS["right.py"], "rank 0 raised ModuleNotFoundError at line "
     "1: No module named 'torchy_not_here'"),
])
def test_a_submission_that_does_not_load_is_said_once_not_once_a_rank_count(desk, name, source, reason, capsys):
    """An empty file, or a syntax error, printed "FAIL empty.py is empty" once per rank count (and an import of a
    module that is not there, "every rank raised ModuleNotFoundError")."""
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


def test_a_start_from_an_instructors_folder_says_the_check_with_that_folder(desk, capsys):
    """`lab start 1 stud --exercises course` said `check it with: spmdsim lab check 1 stud/double.py`, which
    checks the shipped exercise 1 (ping-pong: "double.py defines no function 'ping_pong'")."""
    assert main(["lab", "start", "1", "stud", "--exercises", "course"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "check it with: spmdsim lab check 1 stud/double.py --exercises course"
    head = (desk / "stud" / "double.py").read_text().splitlines()[2]
    assert head == f"Check it with: spmdsim lab check 1 double.py --exercises {desk / 'course'}"
    assert main(["lab", "start", "5", "work5"]) == 0  # the exercises spmdsim ships: no flag to give
    assert capsys.readouterr().out.splitlines()[-1] == "check it with: spmdsim lab check 5 work5/ring_allreduce.py"
    assert "--exercises" not in (desk / "work5" / "ring_allreduce.py").read_text()


def test_a_check_says_its_cases_and_time_bound_before_it_runs(desk, capsys):
    """A check printed nothing until its verdict: an endless loop was 12 s of silence at a 10 s limit."""
    assert main(["lab", "check", "1", "s/right.py", "--exercises", "course", "--time-limit", "7"]) == 0
    said = capsys.readouterr()
    assert said.err == "checking right.py at 1, 2 ranks (2 cases), stopped 7 s after its first case starts\n"
    assert said.out.startswith("exercise 1, Double it: right.py\n")
