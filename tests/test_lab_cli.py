"""spmdsim lab's commands: list, start, check (the starter's verdict), grade over mixed submissions, bad input."""
from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from docs_commands import run_here
from shellkit import as_a_shell_starts_it

from spmdsim.tools.cli.main import main
from spmdsim.tools.lab import harness, load_exercises
from spmdsim.tools.lab.exercise import find_exercise

#: An instructor's exercise in a folder of their own: spmdsim's code untouched.
TINY = '''
import numpy as np

TITLE = "Double it"
FUNCTION = "double"
SIGNATURE = "double(comm, x)"
STATEMENT = "Return 2 * x on every rank."
RANKS = (1, 2)
SEEDS = (0,)
TIME_LIMIT = 10


def case(seed, n):
    xs = [np.arange(3.0) + r for r in range(n)]
    return {"args": [(x,) for x in xs], "expected": [2 * x for x in xs]}


def double(comm, x):
    return 2 * x
'''

SUBMISSIONS = {
    "right.py": "def double(comm, x):\n    return x + x\n",
    "wrong.py": "def double(comm, x):\n    return 3 * x\n",
    "hanging.py": "def double(comm, x):\n    while True:\n        pass\n",
    "crashing.py": "def double(comm, x):\n    return x[7]\n",
    "hungry.py": "import numpy as np\ndef double(comm, x):\n    return np.ones(10**9)\n",
    "exiting.py": "import sys\ndef double(comm, x):\n    sys.exit(3)\n",
    "os_exiting.py": "import os\ndef double(comm, x):\n    os._exit(4)\n",
    "typo.py": "def double(comm, x)\n    return 2 * x\n",
}

#: file -> (verdict, passed cases, words of the reason)
EXPECTED = {
    "right.py": ("PASS", 2, ""),
    "wrong.py": ("FAIL", 0, "wrong at 1 rank (seed 0): rank 0 result[1:3] differs (2 of 3 values wrong): "
                            "expected [2, 4], got [3, 6]"),
    "hanging.py": ("FAIL", 0, "ran past the time limit of 2 s at 1 rank (seed 0): an endless loop"),
    "crashing.py": ("FAIL", 0, "rank 0 raised IndexError at line 2: index 7 is out of bounds"),
    "hungry.py": ("FAIL", 0, "rank 0 ran out of memory at line 3 (limit 256 MiB)"),
    "exiting.py": ("FAIL", 0, "rank 0 called sys.exit(3) at line 3: return the result instead of exiting"),
    "os_exiting.py": ("FAIL", 0, "rank 0 called os._exit(4) at line 3"),
    "typo.py": ("FAIL", 0, "syntax error at line 1"),
}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """The instructor's folder, named relative to the working directory as a user types it."""
    folder = tmp_path / "course"
    folder.mkdir()
    (folder / "01_double.py").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    return "course"


def test_list_prints_one_line_per_exercise_in_number_order(capsys):
    assert main(["lab", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    numbers = [e.number for e in load_exercises()]
    assert [int(line.split()[0]) for line in lines] == numbers
    assert "Allreduce by ring from Send/Recv" in lines[numbers.index(5)]
    assert all(len(line) <= 100 for line in lines)


def test_the_statement_start_writes_ends_in_lines_of_at_most_100_columns(tmp_path, capsys):
    # exercise 20's "Write `vocab_parallel_cross_entropy(comm, logits, labels)` in ..." ran to 126 columns
    assert main(["lab", "start", "20", str(tmp_path)]) == 0
    text = (tmp_path / "vocab_parallel_cross_entropy.md").read_text()
    assert text.endswith("It\nruns on 1, 2, 3, 4, 8 ranks.\n"), text[-200:]
    assert max(len(line) for line in text.splitlines()) <= 100
    for exercise in load_exercises():  # the statements themselves
        assert max(len(line) for line in exercise.statement.splitlines()) <= 100, exercise.number


def test_start_then_check_of_the_unedited_starter_says_not_yet_implemented(tmp_path, capsys):
    assert main(["lab", "start", "1", str(tmp_path)]) == 0
    assert (tmp_path / "ping_pong.md").read_text().startswith("# Exercise 1: Ping-pong")
    starter = tmp_path / "ping_pong.py"
    assert "def ping_pong(comm, x):" in starter.read_text()
    capsys.readouterr()
    assert main(["lab", "check", "1", str(starter)]) == 1
    out = capsys.readouterr()
    assert "NOT YET IMPLEMENTED: ping_pong() in ping_pong.py still raises NotImplementedError" in out.out
    assert "Traceback" not in out.out + out.err
    assert all(len(line) <= 100 for line in out.out.splitlines())
    assert main(["lab", "start", "1", str(tmp_path)]) == 2  # never overwrites the student's work
    assert "ping_pong.py' exists: not overwritten" in capsys.readouterr().err.replace("\n  ", " ")


def test_grade_gives_each_submission_of_a_mixed_folder_its_row(tiny, tmp_path, capsys):
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name, source in SUBMISSIONS.items():
        (folder / name).write_text(source)
    book = tmp_path / "grades.csv"
    assert main(["lab", "grade", "1", str(folder), "--csv", str(book), "--exercises", tiny, "--time-limit", "2",
                 "--memory-mb", "256"]) == 0
    rows = list(csv.DictReader(book.open()))
    assert sorted(row["file"] for row in rows) == sorted(SUBMISSIONS)
    for row in rows:
        verdict, passed, words = EXPECTED[row["file"]]
        assert (row["verdict"], int(row["passed"]), int(row["cases"])) == (verdict, passed, 2), row
        assert words in row["reason"], row
    said = capsys.readouterr()
    out = said.out.splitlines()
    assert len(out) == len(SUBMISSIONS) + 2 and all(len(line) <= 100 for line in out)
    # a header row names the table's columns (the grade book's: passed/cases as one, `cases`)
    assert out[0].split() == ["file", "verdict", "cases", "reason"], out
    # the count that pass ends the table, on stdout: `grade ... > table.txt` kept the table without it
    assert out[-1] == "1 of 8 submissions pass", out
    assert re.search(r"\ngraded in \d+\.\d s; grade book: \S*grades.csv\n$", said.err) and "pass" not in \
        said.err.splitlines()[-1], said.err


def test_check_names_the_rank_counts_that_fail(tiny, tmp_path, capsys):
    path = tmp_path / "only_one.py"
    path.write_text(textwrap.dedent("""\
        def double(comm, x):
            return 2 * x if comm.Get_size() == 1 else x
        """))
    assert main(["lab", "check", "1", str(path), "--exercises", tiny]) == 1
    out = capsys.readouterr().out
    assert "FAIL: passes at 1 rank; fails at 2 ranks (1 of 2 cases" in out
    assert "it is this rank's own input, unchanged" in out


@pytest.mark.parametrize("extra, words", [
    ("def case(seed, n):\n    return {}['x']\n", "exercise 1: case(0, 1) raised KeyError: 'x'"),
    ("def partners(rank, n):\n    return {}['y']\n", "exercise 1: partners(0, 2) raised KeyError: 'y'"),
    ("def optimal_bytes(case, n):\n    return 1 / 0\n",
     "exercise 1: optimal_bytes(case, 1) raised ZeroDivisionError: division by zero"),
    ("def sends(case, n, rank):\n    return {'x': case['nope']}\n", "exercise 1: sends(case, 1, 0) raised KeyError"),
], ids=["case", "partners", "optimal_bytes", "sends"])
def test_a_fault_of_the_exercise_file_names_its_function_and_the_call(tiny, tmp_path, capsys, extra, words):
    """An instructor's function that raises stops the check naming the exercise, the function and its arguments,
    not the submission's line nor LabError's module path."""
    (tmp_path / "course" / "01_double.py").write_text(TINY + "\n\n" + extra)
    path = tmp_path / "right.py"
    path.write_text(textwrap.dedent("""\
        def double(comm, x):
            r, n = comm.Get_rank(), comm.Get_size()
            comm.sendrecv(x, dest=(r + 1) % n, source=(r - 1) % n)
            return x + x
        """))
    assert main(["lab", "check", "1", str(path), "--exercises", tiny]) == 1
    out = capsys.readouterr().out
    assert "FAIL the grader stopped at " in out and words in " ".join(out.split()), out
    assert "LabError" not in out, out


@pytest.mark.parametrize("argv, message", [
    (["lab", "check", "99", "x.py"], "no exercise '99': expected an exercise's number, 1 to "),
    (["lab", "check", "1", "no_such_file.py"], "submission 'no_such_file.py' does not exist; expected "
     "the .py file that defines ping_pong(comm, x)"),  # was "... is not a file", for a file never written
    (["lab", "grade", "1", "no_such_dir", "--csv", "out.csv"], "submission folder 'no_such_dir' does not exist"),
    (["lab", "list", "--exercises", "no_such_dir"], "exercise folder 'no_such_dir' does not exist"),
    (["lab", "list", "--exercises", __file__], f"exercise folder {__file__!r} is a file; expected a folder of"),
    (["lab", "check", "9", __file__, "--ranks", "3"], "--ranks 3: exercise 9 runs on 1, 2, 4, 8 ranks"),
    (["lab", "start", "1", __file__], f"{__file__!r} is a file; expected a folder to write the"),
    (["lab", "start", "5", "/proc/spmdsim-lab"], "cannot make the folder '/proc/spmdsim-lab': No such file"),
    # it made a folder named alice.py, the starter inside it
    (["lab", "start", "1", "subs/alice.py"], "'subs/alice.py' names a file; expected a folder: lab start writes "
     "ping_pong.md and ping_pong.py into one (spmdsim lab start 1 subs)"),
])
def test_bad_input_is_one_line_naming_the_value(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    # One message, folded at 100 columns (fold_message): how many lines depends on the checkout's path
    joined = err.replace("\n  ", " ").strip()
    assert message in joined and "Traceback" not in err and len(joined.splitlines()) == 1


def test_a_check_of_the_folder_start_wrote_names_the_file_in_it(tmp_path, capsys):
    """`spmdsim lab start 5 work` then `spmdsim lab check 5 work` (the folder, as start took it) said only
    "submission 'work' is not a file"; it now names the file start wrote there."""
    assert main(["lab", "start", "5", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["lab", "check", "5", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (f"spmdsim: error: submission {str(tmp_path)!r} is a folder; expected the file to check, "
                   f"such as {str(tmp_path / 'ring_allreduce.py')!r} (spmdsim lab check 5 "
                   f"{tmp_path / 'ring_allreduce.py'})"), err


def test_a_start_the_system_refuses_is_one_line_and_leaves_no_half(tmp_path, capsys):
    """A starter the folder refuses (a link left where it goes) is named, and the statement already written is
    removed: a second start, once the folder is fixed, is not refused for a file that exists."""
    (tmp_path / "ping_pong.py").symlink_to(tmp_path / "gone" / "ping_pong.py")
    assert main(["lab", "start", "1", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"cannot write '{tmp_path / 'ping_pong.py'}': File exists; expected a folder you can write" in err, err
    assert sorted(os.listdir(tmp_path)) == ["ping_pong.py"]  # the link alone: no ping_pong.md


def test_an_exercise_file_without_its_fields_is_named(tmp_path, capsys):
    (tmp_path / "03_broken.py").write_text("TITLE = 'half an exercise'\n")
    assert main(["lab", "list", "--exercises", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "03_broken.py' lacks STATEMENT, FUNCTION, SIGNATURE, case" in err.replace("\n  ", " ")


def test_check_under_mpiexec_passes_one_rank_and_names_the_deadlock_at_two(tmp_path, capsys, monkeypatch):
    # The two deadlocked ranks wait in MPICH's Recv until the time limit: MPICH's heavy yield has them sleep
    # between polls there instead of spinning through sched_yield (the test took 3.4+8.2 user+system CPU-s,
    # 2.0+1.6 so, the same verdict); an MPI without the variable ignores it.
    monkeypatch.setenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    path = tmp_path / "recv_first.py"  # a ring that receives first: no step at 1 rank, a deadlock at 2
    path.write_text(textwrap.dedent("""\
        import numpy as np
        def ring_allreduce(comm, x):
            rank, n = comm.Get_rank(), comm.Get_size()
            total, current = x.copy(), x.copy()
            for step in range(n - 1):
                got = np.empty_like(current)
                comm.Recv(got, source=(rank - 1) % n)
                comm.Send(current, dest=(rank + 1) % n)
                total, current = total + got, got
            return total
        """))
    assert main(["lab", "check", "5", str(path), "--mpiexec", "--ranks", "1", "2", "--time-limit", "5"]) == 1
    out = capsys.readouterr().out
    assert "   1 rank : pass (2 cases)" in out
    assert "2 ranks: FAIL ran past the time limit of 5 s at 2 ranks under mpiexec: a deadlock" in out
    assert "FAIL: passes at 1 rank; fails at 2 ranks (2 of 4 cases" in out


#: Submissions a teacher's folder holds besides programs: file -> (its bytes, the words of its reason).
ODD = {
    "empty.py": (b"", "empty.py is empty"),
    "binary.py": (b"\x00\x01PK\x03", "binary.py is not a Python source file (it holds null bytes)"),
    "latin1.py": (b"def double(comm, x):\n    return 2 * x  # le double, \xe9crit en latin-1\n",
                  "latin1.py is not UTF-8 text (byte 0xe9 at line 2) and Python refuses to run it"),
    "asks.py": (b"def double(comm, x):\n    return input()\n", "rank 0 read standard input at line 2, which a "
                "check does not give: take the function's arguments instead"),
    "close.py": (b"def double(comm, x):\n    return 2 * x * (1 + 1e-7)\n",
                 "expected [2, 4], got [2, 4] (they differ past the digits shown: by up to 4e-07"),
}


def test_grade_refuses_an_exercise_whose_own_solution_fails_before_any_submission(tiny, tmp_path, capsys):
    """An instructor's exercise whose reference is wrong gave every student FAIL and exited 0; now one line
    names it before any submission runs, and no grade book is written."""
    exercise = tmp_path / "course" / "01_double.py"
    exercise.write_text(TINY.replace("def double(comm, x):\n    return 2 * x",
                                     "def double(comm, x):\n    return 3 * x"))
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "right.py").write_text(SUBMISSIONS["right.py"])
    book = tmp_path / "grades.csv"
    assert main(["lab", "grade", "1", str(folder), "--csv", str(book), "--exercises", tiny]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "exercise 1's own solution fails its check, so every submission would: wrong at 1 rank (seed 0): " \
           "rank 0 result[1:3] differs" in err and "fix course/01_double.py first" in err, err
    assert not book.exists()


def test_grade_gives_a_row_to_python_saved_in_another_form(tiny, tmp_path, capsys):
    """`dave.PY`, `erin.py.txt` and `fay.ipynb` were only named on stderr as left out, so the grade book had no row
    for those students; a file that is no student's (notes.txt) still is only named there."""
    folder = tmp_path / "forms"
    folder.mkdir()
    for name in ("alice.py", "dave.PY", "erin.py.txt"):
        (folder / name).write_text(SUBMISSIONS["right.py"])
    (folder / "fay.ipynb").write_text("{}")
    (folder / "notes.txt").write_text("not code")
    book = tmp_path / "grades.csv"
    assert main(["lab", "grade", "1", str(folder), "--csv", str(book), "--exercises", tiny]) == 0
    said = capsys.readouterr()
    assert "left out (not a .py file, or hidden): notes.txt\n" in said.err, said.err
    assert said.out.splitlines()[-1] == "1 of 4 submissions pass, 3 not graded", said.out
    rows = {row["file"]: (row["verdict"], row["reason"]) for row in csv.DictReader(book.open())}
    renamed = ("NOT GRADED", "not a .py file by its name: rename it to end in .py")
    assert rows == {"alice.py": ("PASS", ""), "dave.PY": renamed, "erin.py.txt": renamed,
                    "fay.ipynb": ("NOT GRADED", "a Jupyter notebook: export its function as a .py file")}, rows


def test_grade_names_what_it_leaves_out_shows_progress_and_says_why_odd_files_fail(tiny, tmp_path, capsys):
    folder = tmp_path / "odd"
    folder.mkdir()
    for name, (data, _) in ODD.items():
        (folder / name).write_bytes(data)
    (folder / "._right.py").write_bytes(b"\x00\x05\x16\x07")  # a zip's macOS companion file: hidden
    (folder / "notes.txt").write_text("not code")
    (folder / "old.py").mkdir()  # a folder named like a submission: a student's, not a FAIL row "Is a directory"
    (folder / "__pycache__").mkdir()  # Python's, beside files it ran: no student's
    (folder / "__MACOSX").mkdir()  # unzipped from a zip made on macOS: the companions' folder, no student's
    (folder / "__MACOSX" / "._right.py").write_bytes(b"\x00\x05\x16\x07")
    book = tmp_path / "grades.csv"
    assert main(["lab", "grade", "1", str(folder), "--csv", str(book), "--exercises", tiny]) == 0
    said = capsys.readouterr()
    err = said.err
    assert "left out (not a .py file, or hidden): ._right.py, __MACOSX/, __pycache__/, notes.txt\n" in err, err
    assert "grading 5 submissions of exercise 1, 2 at a time, each stopped 10 s after its first case" in err
    assert err.count(" of 5: ") == 5 and re.search(r"\ngraded in \d+\.\d s; grade book: ", err), err
    assert said.out.splitlines()[-1] == "0 of 6 submissions pass, 1 not graded", said.out
    rows = list(csv.DictReader(book.open()))
    assert [row["file"] for row in rows] == ["asks.py", "binary.py", "close.py", "empty.py", "latin1.py", "old.py/"]
    assert list(rows[-1].values()) == ["old.py/", "NOT GRADED", "", "", "no .py file", ""], rows[-1]
    for row in rows[:-1]:
        assert ODD[row["file"]][1] in row["reason"], row


def test_a_limit_the_grader_cannot_run_with_is_refused_before_any_submission(tiny, tmp_path, capsys):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "right.py").write_text(SUBMISSIONS["right.py"])
    (tmp_path / "s" / "notes.txt").write_text("not graded: named on stderr before a grade starts")
    for extra, words in ((["--time-limit", "inf"], "--time-limit inf must be a number of seconds above 0"),
                         (["--time-limit", "1e300"], "and at most 86,400"),
                         (["--time-limit", "0"], "--time-limit 0 must be"),  # as typed: it said "0.0"
                         (["--time-limit", "1e400"], "--time-limit 1e400 (read as inf) must be"),
                         (["--memory-mb", "143"], "--memory-mb 143 is too little for 2 ranks: expected at least 160"),
                         (["--memory-mb", str(1 << 70)], f"--memory-mb {1 << 70} is out of range; expected 160 to "
                                                          "1,048,576 (1 TiB)"),  # OverflowError blamed on it
                         (["--jobs", "0"], "--jobs 0 is out of range; expected 1 to 1,024"),
                         (["--jobs", "100000"], "--jobs 100000 is out of range; expected 1 to 1,024"),
                         (["--csv", str(tmp_path / "nowhere" / "g.csv")], "cannot be written"),
                         # os.access says yes to root for /proc, which takes no new file: the grade ran, then
                         # failed at its last step and lost every row
                         (["--csv", "/proc/grades.csv"], "--csv '/proc/grades.csv' cannot be written")):
        argv = ["lab", "grade", "1", str(tmp_path / "s"), "--exercises", tiny]
        book = [] if extra[0] == "--csv" else ["--csv", str(tmp_path / "g.csv")]
        assert main(argv + book + extra) == 2, extra
        err = capsys.readouterr().err
        assert words in " ".join(err.split()) and "grading" not in err and "left out" not in err, err
    assert main(["lab", "check", "1", str(tmp_path / "s" / "right.py"), "--exercises", tiny, "--mpiexec",
                 "--memory-mb", "512"]) == 2
    assert "--memory-mb limits simulated ranks only" in capsys.readouterr().err
    assert main(["lab", "check", "1", str(tmp_path / "s" / "right.py"), "--exercises", tiny, "--memory-mb",
                 str(1 << 70)]) == 2
    assert f"--memory-mb {1 << 70} is out of range; expected 160 to 1,048,576" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full: a file every write to fails")
def test_a_grade_book_whose_write_fails_is_named_in_one_line(tiny, tmp_path, capsys):
    """A full disk passes the check before the grade (the path takes a new file) and fails the write after it:
    it said `cannot write the output: No space left on device`, exit 1, naming no file."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "right.py").write_text(SUBMISSIONS["right.py"])
    assert main(["lab", "grade", "1", str(tmp_path / "s"), "--exercises", tiny, "--csv", "/dev/full"]) == 2
    said = capsys.readouterr()
    assert "--csv '/dev/full': the grade book was not written: No space left on device" in " ".join(
        said.err.split()), said.err
    assert said.out.splitlines()[-1] == "1 of 1 submissions pass", said.out  # (the rows: in the table above)
    # one submission: no "2 at a time" (--jobs' default), which there is no other to share
    assert "grading 1 submission of exercise 1, stopped 10 s after its first case starts\n" in said.err, said.err


def test_a_grade_book_is_written_aside_and_renamed_into_place(tiny, tmp_path, capsys):
    """The grade book was written in place (open "w"): a crash, or a second grade finishing at the same moment,
    left half a file or two interleaved, and a reader of the one before saw it change under it. Now written
    beside it and renamed onto it: the old one stays whole for its reader, a link to it stays a link, its
    permissions are kept, and nothing is left beside it."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "right.py").write_text(SUBMISSIONS["right.py"])
    (tmp_path / "out").mkdir()
    book, link = tmp_path / "out" / "grades.csv", tmp_path / "out" / "latest.csv"
    book.write_text("the grade book before\n")
    book.chmod(0o640)
    link.symlink_to("grades.csv")
    with open(book, encoding="utf-8") as reader:
        assert main(["lab", "grade", "1", str(tmp_path / "s"), "--exercises", tiny, "--csv", str(link)]) == 0
        assert reader.read() == "the grade book before\n"
    capsys.readouterr()
    assert os.path.islink(link) and sorted(os.listdir(tmp_path / "out")) == ["grades.csv", "latest.csv"]
    assert [row[:2] for row in csv.reader(book.read_text().splitlines())][1:] == [["right.py", "PASS"]]
    assert book.stat().st_mode & 0o777 == 0o640


def test_check_shows_what_a_submission_printed(tiny, tmp_path, capsys):
    path = tmp_path / "chatty.py"
    path.write_text("def double(comm, x):\n    print('rank', comm.Get_rank(), 'has', x[0])\n    return 2 * x\n")
    assert main(["lab", "check", "1", str(path), "--exercises", tiny]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-4] == "its ranks printed 45 B over the cases run; the first lines:"
    assert out[-3:] == ["  | rank 0 has 0.0", "  | rank 0 has 0.0", "  | rank 1 has 1.0"] or \
        sorted(out[-3:]) == ["  | rank 0 has 0.0", "  | rank 0 has 0.0", "  | rank 1 has 1.0"], out


def test_a_thread_left_running_is_named_not_called_an_endless_loop(tiny, tmp_path, capsys):
    """Every rank returned the right value, but a thread one started sleeps on, and a rank ends with its threads:
    the time limit said 'an endless loop, or a rank waiting for a message no rank sends'."""
    path = tmp_path / "threaded.py"
    path.write_text("import threading, time\ndef double(comm, x):\n"
                    "    threading.Thread(target=time.sleep, args=(600,)).start()\n    return 2 * x\n")
    assert main(["lab", "check", "1", str(path), "--exercises", tiny, "--time-limit", "2"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "every rank returned its result, but a thread a rank started still runs" in out, out


def test_ctrl_c_stops_a_grade_at_once_and_says_what_it_did_not_write(tiny, tmp_path):
    """Ctrl-C reaches only the grader's main thread: the checks running, and every check queued, ran on to their
    time limits (a folder of endless loops: a minute) before the grade stopped, and then wrote nothing."""
    folder = tmp_path / "loops"
    folder.mkdir()
    started = tmp_path / "started"  # each loop's check marks here that its loop runs (SUBMISSIONS' hanging.py)
    started.mkdir()
    for k in range(4):
        (folder / f"loop{k}.py").write_text(SUBMISSIONS["hanging.py"].replace(
            "\n    while", f"\n    open({str(started / str(k))!r}, 'w').close()\n    while"))
    proc = subprocess.Popen([sys.executable, "-m", "spmdsim", "lab", "grade", "1", str(folder), "--csv", "g.csv",
                             "--exercises", tiny, "--time-limit", "15"], stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_a_shell_starts_it)
    try:
        while "grading 4 submissions" not in proc.stderr.readline():
            pass
        deadline = time.monotonic() + 50
        while len(os.listdir(started)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # both checks' children run their endless loops (it slept 2 s: ~4 CPU-s of spinning)
        assert len(os.listdir(started)) == 2, os.listdir(started)
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=50)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130 and time.monotonic() - began < 10, err
    assert "stopped after 0 of 4 submissions: g.csv not written" in err and not (tmp_path / "g.csv").exists()


def test_a_right_but_slow_submission_is_called_slow_not_an_endless_loop(tiny, tmp_path, capsys):
    """The time limit is for the whole check: a submission whose cases each take 2.5 s ran out of it in its second
    case and was told 'an endless loop, or a rank waiting for a message no rank sends'."""
    path = tmp_path / "slow.py"
    path.write_text("import time\ndef double(comm, x):\n    time.sleep(2.5)\n    return 2 * x\n")
    assert main(["lab", "check", "1", str(path), "--exercises", tiny, "--time-limit", "4"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "1 rank : pass (1 case)" in out and re.search(  # (2.5 s; more on a loaded machine: not what is checked)
        r"2 ranks: FAIL ran past the time limit of 4 s at 2 ranks \(seed 0\), a limit for all cases together: the 1 "
        r"case before it took \d+\.\d s of it: too slow, or an endless loop in this case", out), out
    assert "no rank sends" not in out, out


#: A sitecustomize making this process's MPI slow to start: the first import of mpi4py.MPI waits 4 s.
SLOW_MPI = """import sys
import time


class SlowMPI:
    def find_spec(self, name, path=None, target=None):
        if name == "mpi4py.MPI":
            sys.meta_path.remove(self)
            time.sleep(4)


sys.meta_path.insert(0, SlowMPI())
"""


def test_the_start_of_mpi_is_not_a_cases_time(tiny, tmp_path, capsys, monkeypatch):
    """The child started this process's MPI in its first case, after the time limit's clock began: Open MPI's
    start as a singleton takes a second (a submission sleeping 2.5 s a case was said to take 3.6 s in its first
    one). Here an MPI that takes 4 s to start, a limit of 3 s, and a right submission: it passes."""
    (tmp_path / "slow_mpi").mkdir()
    (tmp_path / "slow_mpi" / "sitecustomize.py").write_text(SLOW_MPI)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "slow_mpi"),
                                                                   os.environ.get("PYTHONPATH")])))
    path = tmp_path / "right.py"
    path.write_text(SUBMISSIONS["right.py"])
    code = main(["lab", "check", "1", str(path), "--exercises", tiny, "--time-limit", "3"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "1 rank : pass (1 case) 2 ranks: pass (1 case)" in out, out


#: Prints 2 MB at each rank of every case, its first case taking over half of a 4 s limit, then ends its second
#: case by `TAIL`.
LOUD_SLOW = """import time
def double(comm, x):
    if comm.Get_size() == 1:
        print("x" * 2_000_000)
        time.sleep(2.5)
        return 2 * x
{tail}    while True:
        time.sleep(0.01)
"""


@pytest.mark.parametrize("load, busy", [(12.0, True), (3.9, False)])
def test_a_time_limit_run_out_on_a_busy_machine_says_the_load(tiny, tmp_path, capsys, monkeypatch, load, busy):
    """The limit is wall time: at load 12 on 2 cores a right exercise 2 took 9.6 s of its 10 (1.1 s idle), and a
    time limit run out there said only "an endless loop"; above twice the cores it names the load and the way out."""
    monkeypatch.setattr("spmdsim.tools.lab.sandbox.os.getloadavg", lambda: (load, load, load))
    monkeypatch.setattr("spmdsim.tools.lab.ending.cores_available", lambda: 2)
    path = tmp_path / "hanging.py"  # an endless loop that sleeps: the load is the one set above, not its own spin
    path.write_text("import time\ndef double(comm, x):\n    while True:\n        time.sleep(0.01)\n")
    assert main(["lab", "check", "1", str(path), "--exercises", tiny, "--time-limit", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "ran past the time limit of 1 s at 1 rank (seed 0): an endless loop" in out, out
    said = ("(this machine is busy, load 12.0 on 2 cores: check again when it is not, or give more time with "
            "--time-limit)")
    assert (said in out) == busy and ("busy" in out) == busy, out


@pytest.mark.parametrize("tail, said", [
    ('    print("y" * 2_000_000)\n', "2 ranks: FAIL ran past the time limit of 4 s at 2 ranks (seed 0) while printing "
                                    "6.0 MB: print less (each line takes tens of us here)"),
    ("", "2 ranks: FAIL ran past the time limit of 4 s at 2 ranks (seed 0), a limit for all cases together: the 1 "
         "case before it took 2."),
], ids=["printing", "silent"])
def test_a_submission_printing_megabytes_is_said_to_print_not_called_slow(tiny, tmp_path, capsys, tail, said):
    """A submission printing megabytes under load, its earlier cases taking half the time limit, was told "too slow,
    or an endless loop" where it was printing when time ran out; one whose earlier cases printed and that loops in
    silence is still told of an endless loop, and of what the cases before it printed."""
    path = tmp_path / "loud.py"
    path.write_text(LOUD_SLOW.format(tail=tail))
    assert main(["lab", "check", "1", str(path), "--exercises", tiny, "--time-limit", "4"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "1 rank : pass (1 case)" in out and said in out, out
    if not tail:
        assert "s of it, printing 2.0 MB: too slow (print less), or an endless loop in this case" in out, out


def test_a_folder_of_student_folders_is_graded_each_under_its_name(tiny, tmp_path, capsys):
    """A learning platform's download, one folder per student, was refused ('its 2 folders are not searched'):
    each folder's one .py file, or the one named as the starter, is graded under the folder's name. A folder
    with none, or with several and none the starter's, was named on stderr alone, and a reader of the grade
    book missed that student: it is a row of its own, NOT GRADED, saying why, and counted."""
    lms = tmp_path / "lms"
    for student, files in (("alice", {"double.py": "right.py"}), ("bob", {"x.py": "right.py", "double.py": "wrong.py"}),
                           ("carol", {}), ("dave", {"a.py": "right.py", "b.py": "right.py"})):
        (lms / student).mkdir(parents=True)
        for name, which in files.items():
            (lms / student / name).write_text(SUBMISSIONS[which])
    (lms / "eve.py").write_text(SUBMISSIONS["right.py"])
    book = tmp_path / "g.csv"
    assert main(["lab", "grade", "1", str(lms), "--csv", str(book), "--exercises", tiny]) == 0
    said = capsys.readouterr()
    assert "left out" not in said.err and said.out.endswith("\n2 of 5 submissions pass, 2 not graded\n"), said
    rows = [row[:6] for row in csv.reader(book.open())][1:]
    assert [row[:2] for row in rows] == [["alice/double.py", "PASS"], ["bob/double.py", "FAIL"],
                                         ["carol/", "NOT GRADED"], ["dave/", "NOT GRADED"], ["eve.py", "PASS"]], rows
    assert rows[2][2:] == ["", "", "no .py file", ""], rows
    assert rows[3][2:] == ["", "", "2 .py files (a.py, b.py), none named double.py", ""], rows
    table = said.out.splitlines()
    assert table[3:5] == ["carol/           NOT GRADED   -/-   no .py file",
                          "dave/            NOT GRADED   -/-   2 .py files (a.py, b.py), none named double.py"], table
    assert table[:2] == ["file             verdict     cases  reason", "alice/double.py  PASS         2/2   "], table
    (lms / "eve.py").unlink()
    for student in ("alice", "bob"):
        for f in (lms / student).iterdir():
            f.unlink()
    assert main(["lab", "grade", "1", str(lms), "--csv", str(book), "--exercises", tiny]) == 2
    assert f"submission folder '{lms}' holds no .py file to grade: alice/ (no .py file), bob/ (no .py file), " \
        "carol/ (no .py file), dave/ (2 .py files (a.py, b.py), none named double.py); expected one file per " \
        "student, side by side in DIR (alice.py, bob.py) or each in its own folder, named double.py where it " \
        "holds several" in " ".join(capsys.readouterr().err.split())
    for student in ("alice", "bob", "carol", "dave"):
        (lms / student).rename(tmp_path / student)
    assert main(["lab", "grade", "1", str(lms), "--csv", str(book), "--exercises", tiny]) == 2
    assert f"submission folder '{lms}' holds no .py file, and no folder holding one; expected one file per " \
        "student, side by side in DIR (alice.py, bob.py) or each in its own folder" in \
        " ".join(capsys.readouterr().err.split())


def test_a_student_folder_with_no_py_file_of_its_own_says_what_it_holds(tiny, tmp_path, capsys):
    """A student's folder holding its file one folder down, or saved as .py.txt, is not graded; its row names
    what the folder holds, so that the reader of the grade book sees the student handed something in."""
    lms = tmp_path / "lms"
    (lms / "alice").mkdir(parents=True)
    (lms / "alice" / "double.py").write_text(SUBMISSIONS["right.py"])
    (lms / "carol" / "attempt 1").mkdir(parents=True)
    (lms / "carol" / "attempt 1" / "double.py").write_text(SUBMISSIONS["right.py"])
    (lms / "gina").mkdir()
    (lms / "gina" / "double.py.txt").write_text(SUBMISSIONS["right.py"])
    (lms / "gina" / ".DS_Store").write_bytes(b"\0")
    (lms / "hal").mkdir()
    book = tmp_path / "g.csv"
    assert main(["lab", "grade", "1", str(lms), "--csv", str(book), "--exercises", tiny]) == 0
    capsys.readouterr()
    reasons = {row["file"]: row["reason"] for row in csv.DictReader(book.open()) if row["verdict"] == "NOT GRADED"}
    assert reasons == {"carol/": "no .py file at its top (a grade does not search the folders inside it, which "
                                 "hold attempt 1/double.py)",
                       "gina/": "no .py file; it holds double.py.txt", "hal/": "no .py file"}, reasons


def test_a_rank_count_given_twice_is_checked_once(tiny, tmp_path, capsys):
    """`--ranks 2 2` ran the cases at 2 ranks twice and printed '2 ranks: pass (2 cases)' twice, '2 of 2 cases'."""
    path = tmp_path / "right.py"
    path.write_text(SUBMISSIONS["right.py"])
    assert main(["lab", "check", "1", str(path), "--exercises", tiny, "--ranks", "2", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "   2 ranks: pass (1 case)" and len(out) == 3, out
    assert out[2].startswith("PASS: passes at 2 ranks (1 of 1 cases"), out


def test_a_large_right_submission_is_compiled_once_a_check_not_once_a_case(tmp_path, capsys, monkeypatch):
    """A right submission holding a 3 MB table was compiled again for each case, 0.7 s each: its ten cases ran out
    of the time limit and it failed, 'too slow', for the grader's own work. The count is taken where the check's
    child runs its cases (run_case, one after another in one process), so the machine's load cannot change it;
    the whole check then passes through the child as a student runs it. The table here is 250 kB: the count does
    not depend on its size, and a 3 MB one made the test's own two compilations 0.9 CPU-s."""
    folder = tmp_path / "course"
    folder.mkdir()
    (folder / "01_double.py").write_text(TINY.replace("SEEDS = (0,)", "SEEDS = tuple(range(10))")
                                         .replace("RANKS = (1, 2)", "RANKS = (1,)"))
    path = tmp_path / "big.py"
    path.write_text("TABLE = [\n" + "".join(f"    {i}.0,\n" for i in range(20_000)) + "]\n" + SUBMISSIONS["right.py"])
    compiled = []
    monkeypatch.setattr(harness, "compile_submission",
                        lambda name, real=harness.compile_submission: compiled.append(name) or real(name))
    exercise = find_exercise(1, str(folder))
    results = [harness.run_case(exercise, str(path), 1, seed) for seed in exercise.seeds]
    assert [r.status for r in results] == ["pass"] * 10, results
    assert compiled == [str(path)], compiled
    monkeypatch.undo()
    # end to end, with room for a loaded machine (alone the check takes under 1 s: one compilation, ten cases)
    assert main(["lab", "check", "1", str(path), "--exercises", str(folder), "--time-limit", "60"]) == 0, \
        capsys.readouterr().out
    assert "PASS: passes at 1 rank (10 of 10 cases" in capsys.readouterr().out


def test_a_submission_reads_its_own_command_line_not_the_checks(tiny, tmp_path, capsys):
    """`N = int(sys.argv[1]) if len(sys.argv) > 1 else 4` read the check's own arguments (its exercise folder) and
    failed: "invalid literal for int() with base 10: '/.../course'"."""
    path = tmp_path / "args.py"
    path.write_text("import sys\nN = int(sys.argv[1]) if len(sys.argv) > 1 else 4\n" + SUBMISSIONS["right.py"])
    assert main(["lab", "check", "1", str(path), "--exercises", tiny]) == 0, capsys.readouterr().out


def test_more_jobs_than_cores_is_noted_before_the_grade(tiny, tmp_path, capsys, monkeypatch):
    """Each check's limit is wall time: --jobs above the cores makes checks share a core, and a right submission
    could run out of its time for the load alone, with no word why."""
    folder = tmp_path / "s"
    folder.mkdir()
    for k in range(2):  # two submissions: --jobs 2 checks two at once (the note counts min(jobs, submissions))
        (folder / f"right{k}.py").write_text(SUBMISSIONS["right.py"])
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # a one-core machine, wherever the test runs
    assert main(["lab", "grade", "1", str(folder), "--csv", "g.csv", "--exercises", tiny, "--jobs", "2"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "note: --jobs 2 on 1 core: the checks share them, and a right but busy submission may run out of its " \
        "10 s (--jobs 1 or fewer, or a longer --time-limit)" in err, err
    assert main(["lab", "grade", "1", str(folder), "--csv", "g.csv", "--exercises", tiny, "--jobs", "1"]) == 0
    assert "note: --jobs" not in capsys.readouterr().err


def test_a_submission_that_kills_its_parent_or_itself_fails_naming_the_signal_and_the_grade_goes_on(
        tiny, tmp_path, capsys):
    """os.kill(os.getppid(), 9) killed the grader (its parent): a check ended at 137 with no output. A kill by
    a signal was called 'used more than its 10 s of CPU time' though the CPU limit was never reached."""
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "parent.py").write_text("import os\ndef double(comm, x):\n    os.kill(os.getppid(), 9)\n")
    (folder / "itself.py").write_text("import os\ndef double(comm, x):\n    os.kill(os.getpid(), 9)\n")
    (folder / "right.py").write_text(SUBMISSIONS["right.py"])
    book = tmp_path / "g.csv"
    assert main(["lab", "grade", "1", str(folder), "--csv", str(book), "--exercises", tiny]) == 0
    rows = {row["file"]: (row["verdict"], row["reason"]) for row in csv.DictReader(book.open())}
    assert rows == {
        "itself.py": ("FAIL", "the process was killed by signal 9 (SIGKILL) at 1 rank (seed 0)"),
        "parent.py": ("FAIL", "the process that watches it was killed by signal 9 (SIGKILL) at 1 rank (seed 0): "
                              "a submission must not signal other processes"),
        "right.py": ("PASS", ""),
    }, rows


def test_a_grade_book_that_would_replace_or_join_the_submissions_is_refused(tiny, tmp_path, capsys):
    """--csv s/right.py overwrote a student's submission, and a grade book in the folder was graded next time."""
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "right.py").write_text(SUBMISSIONS["right.py"])
    (tmp_path / "tool.py").write_text("print('not a grade book')\n")
    for book, words in (("s/right.py", "--csv 's/right.py' is in the submission folder 's'; expected a path "
                                       "outside it"),
                        ("s/grades.csv", "--csv 's/grades.csv' is in the submission folder 's'"),
                        ("./s/../s/g.csv", "is in the submission folder 's'"),
                        ("tool.py", "--csv 'tool.py' is a .py file that exists; expected a grade book file")):
        assert main(["lab", "grade", "1", "s", "--exercises", tiny, "--csv", book]) == 2, book
        err = capsys.readouterr().err
        assert words in " ".join(err.split()) and len(err.strip().splitlines()) <= 2 and "grading" not in err, err
    assert (tmp_path / "s" / "right.py").read_text() == SUBMISSIONS["right.py"]
    assert sorted(os.listdir(tmp_path / "s")) == ["right.py"]
    assert (tmp_path / "tool.py").read_text() == "print('not a grade book')\n"


def test_an_exercise_folder_with_no_exercise_is_refused_not_listed_empty(tmp_path, capsys):
    """`lab list` of an empty folder printed nothing (exit 0), and `lab start 1` said 'expected one of  '."""
    (tmp_path / "notes.txt").write_text("no exercise here")
    for argv in (["lab", "list"], ["lab", "start", "1", str(tmp_path / "w")]):
        assert main(argv + ["--exercises", str(tmp_path)]) == 2, argv
        err = " ".join(capsys.readouterr().err.split())
        assert f"exercise folder {str(tmp_path)!r} holds no exercise; expected files named NN_name.py" in err, err
    assert not (tmp_path / "w").exists()


def test_start_makes_its_folder_but_not_missing_parents(tmp_path, capsys):
    """`lab start 1 /nonexistent/dir` made /nonexistent too: a mistyped path became a tree of folders."""
    assert main(["lab", "start", "1", str(tmp_path / "gone" / "work")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"cannot make the folder {str(tmp_path / 'gone' / 'work')!r}: its parent {str(tmp_path / 'gone')!r} "
            "does not exist; expected a folder in one that exists") in err, err
    assert not (tmp_path / "gone").exists()
    assert main(["lab", "start", "1", str(tmp_path / "work")]) == 0  # the folder itself is made
    assert sorted(os.listdir(tmp_path / "work")) == ["ping_pong.md", "ping_pong.py"]


def test_the_grading_bench_keeps_its_grade_book_beside_the_submissions(tmp_path):
    """scripts/bench_lab_grade.py wrote grades.csv inside the folder it graded, which `lab grade` refuses (the book
    would be graded next time): the book now lies beside the submissions' folder, and each row's verdict is checked."""
    # `python scripts/bench_lab_grade.py ...`, run in this process (its grade's checks start their own)
    out = subprocess.CompletedProcess("bench_lab_grade.py", *run_here("scripts/bench_lab_grade.py",
                                                                      ["--count", "3", "--keep", str(tmp_path)]))
    assert out.returncode == 0, out.stderr
    assert "3 submissions graded" in out.stdout and "rows with an unexpected verdict: 0" in out.stdout
    assert sorted(os.listdir(tmp_path / "submissions")) == ["00_right.py", "01_right_again.py", "02_forbidden.py"]
    with open(tmp_path / "grades.csv") as f:
        assert [row["verdict"] for row in csv.DictReader(f)] == ["PASS", "PASS", "FAIL"]
