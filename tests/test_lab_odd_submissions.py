"""spmdsim lab on what a folder of student submissions holds besides code: file names that are not UTF-8, messages
a terminal cannot print, each said in the verdict and the grade book, never a traceback."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_lab_cli import SUBMISSIONS, TINY

from spmdsim.tools.cli.main import main
from spmdsim.tools.lab.compare import first_difference
from spmdsim.tools.lab.exercise import find_exercise
from spmdsim.tools.lab.harness import run_case
from spmdsim.tools.lab.ending import case_ended, exercise_fault
from spmdsim.tools.lab.sandbox import _job_said, _mpi_results, check_mpiexec


def _lab(*argv: str) -> subprocess.CompletedProcess:
    """`spmdsim lab ...` run in this process, its stdout and stderr UTF-8 streams that refuse what is not text (as
    an en_US.UTF-8 terminal's do); the bytes each was given."""
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
                for _ in range(2))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["lab", *argv])
    return subprocess.CompletedProcess(argv, code, out.buffer.getvalue(), err.buffer.getvalue())


def _quiet(said: subprocess.CompletedProcess) -> bool:
    """Whether a check's stderr holds only the line it says before it runs: no traceback."""
    return said.stderr.startswith(b"checking ") and said.stderr.count(b"\n") == 1


def test_a_file_name_that_is_not_utf8_is_graded_and_said_as_its_bytes(course, capsys):
    """A name saved in Latin-1 (caf\\xe9.py) stopped the grade at its grade book with UnicodeEncodeError, the
    rows after it never written."""
    folder = course / "s"
    folder.mkdir()
    (folder / "a.py").write_text(SUBMISSIONS["right.py"])
    (folder / os.fsdecode(b"caf\xe9.py")).write_text(SUBMISSIONS["right.py"])
    (folder / os.fsdecode(b"typ\xf6.py")).write_text(SUBMISSIONS["typo.py"])
    (folder / "new\nline.py").write_text(SUBMISSIONS["wrong.py"])
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    rows = list(csv.reader((course / "g.csv").open(encoding="utf-8")))
    assert [row[:3] for row in rows[1:]] == [["a.py", "PASS", "2"], ["caf\\xe9.py", "PASS", "2"],
                                             ["new\\nline.py", "FAIL", "0"], ["typ\\xf6.py", "FAIL", "0"]]
    table = [line.split()[:2] for line in capsys.readouterr().out.splitlines()]
    assert table == [["file", "verdict"]] + [row[:2] for row in rows[1:]] + [["2", "of"]], table
    said = _lab("check", "1", os.fsdecode(b"s/typ\xf6.py"), "--exercises", "course")
    assert said.returncode == 1 and _quiet(said), said.stderr
    assert said.stdout.decode().splitlines() == [
        "exercise 1, Double it: typ\\xf6.py", said.stdout.decode().splitlines()[1]]
    assert "syntax error at line 1: expected ':'" in said.stdout.decode()


#: What the check's child does before its cases (spmdsim.tools.lab.child._start_mpi), then the MPI segments in
#: /dev/shm the process maps, each "(deleted)" once unlinked.
START_MPI = ("import json\nfrom spmdsim.tools.lab.child import _start_mpi\n_start_mpi()\n"
             "print(json.dumps([line.split(None, 5)[-1].strip() for line in open('/proc/self/maps')\n"
             "                  if '/dev/shm/mpich_shm_' in line or '/dev/shm/sm_segment.' in line]))")


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="a process's mappings are read from Linux's /proc")
def test_the_checks_process_leaves_no_mpi_segment_in_dev_shm():
    """The check's child starts MPI as a singleton and ends by os._exit (no MPI_Finalize): a submission that never
    ran (a syntax error) left MPICH's 1 MiB segment in /dev/shm until reboot, one for each graded."""
    done = subprocess.run([sys.executable, "-c", START_MPI], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    mapped = json.loads(done.stdout)
    assert all(path.endswith("(deleted)") for path in mapped if "mpich_shm_" in path), mapped


def test_a_long_file_name_is_shortened_in_the_table_and_whole_in_the_grade_book(course, capsys):
    """A name of 107 characters set the name column's width for every row, and the 100-column cut took every
    row's verdict with it ("ok.py    ...")."""
    long = "x" * 50 + "_lastname_firstname_12345_assignsubmission_file_double.py"
    (course / "s").mkdir()
    (course / "s" / long).write_text(SUBMISSIONS["wrong.py"])
    (course / "s" / "ok.py").write_text(SUBMISSIONS["right.py"])
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    said = capsys.readouterr()
    table = said.out.splitlines()
    assert " of 2: " + "x" * 23 + "...mission_file_double.py FAIL (" in said.err  # the progress line too
    assert [line[:65] for line in table] == [
        ("file" + " " * 44 + "  verdict  cases  reason")[:65], ("ok.py" + " " * 43 + "  PASS      2/2   ")[:65],
        "x" * 23 + "...mission_file_double.py  FAIL      0/2  ", "1 of 2 submissions pass"], table
    assert all(len(line) <= 100 for line in table), table
    assert [row["file"] for row in csv.DictReader((course / "g.csv").open())] == ["ok.py", long]


def test_two_long_names_that_differ_in_their_middle_are_told_apart_in_the_table(course, capsys):
    """Two students' folders whose names share their first 23 characters and their end were cut alike in the
    table (the same start, "...", the same end): only the grade book told whose row was whose."""
    names = [f"Alexander Smith-Johnson_{n}_assignsubmission_file_" for n in (101, 102)]
    for name, text in zip(names, ("wrong.py", "right.py")):
        (course / "s" / name).mkdir(parents=True)
        (course / "s" / name / "double.py").write_text(SUBMISSIONS[text])
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in table[1:-1]] == [
        ["...-Johnson_101_assignsubmission_file_/double.py", "FAIL"],
        ["...-Johnson_102_assignsubmission_file_/double.py", "PASS"]], table
    assert [row["file"] for row in csv.DictReader((course / "g.csv").open())] == [f"{n}/double.py" for n in names]


def test_a_link_to_a_file_that_does_not_exist_is_a_row_naming_its_target(course, capsys):
    """A broken link alice.py (the file it named moved away) was listed on stderr as 'not a .py file, or
    hidden', with no row: it is a NOT GRADED row saying what it is, in a student's folder too."""
    (course / "s" / "bob").mkdir(parents=True)
    (course / "s" / "ok.py").write_text(SUBMISSIONS["right.py"])
    os.symlink("/gone/alice.py", course / "s" / "alice.py")
    os.symlink("../../old/double.py", course / "s" / "bob" / "double.py")
    os.symlink("/gone/notes.txt", course / "s" / "notes.txt")
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    said = capsys.readouterr()
    assert "left out (not a .py file, or hidden): notes.txt (a link to '/gone/notes.txt', which does not " \
        "exist)\n" in said.err, said.err
    assert said.out.endswith("\n1 of 3 submissions pass, 2 not graded\n"), said.out
    rows = [row for row in csv.reader((course / "g.csv").open())][1:]
    assert rows[:2] == [["alice.py", "NOT GRADED", "", "", "a link to '/gone/alice.py', which does not exist", ""],
                        ["bob/double.py", "NOT GRADED", "", "", "a link to '../../old/double.py', which does not "
                         "exist", ""]], rows
    assert said.out.splitlines()[1] == "alice.py       NOT GRADED   -/-   a link to '/gone/alice.py', which does " \
        "not exist", said.out


def test_a_message_a_terminal_cannot_print_is_said_escaped(course):
    """A ValueError whose message holds a lone surrogate ended the check with UnicodeEncodeError's traceback."""
    (course / "odd.py").write_text('def double(comm, x):\n    raise ValueError("bad \\ud800 char")\n')
    said = _lab("check", "1", "odd.py", "--exercises", "course")
    assert said.returncode == 1 and _quiet(said), said.stderr
    assert "   1 rank : FAIL rank 0 raised ValueError at line 2: bad \\ud800 char" in said.stdout.decode()


def test_an_exception_whose_str_raises_is_named_by_its_own_type(course):
    """An exception whose __str__ raises was named by that inner error ("a rank raised RuntimeError at line 3"),
    its rank unknown, and the simulation's thread printed the inner error's traceback ("Exception in thread")."""
    (course / "oops.py").write_text(
        "import numpy as np\nclass Oops(Exception):\n    def __str__(self):\n        raise RuntimeError('no text')\n"
        "def double(comm, x):\n    if comm.Get_rank() == 0:\n        raise Oops('wrong')\n"
        "    comm.Recv(np.empty(3), source=0)\n")  # (rank 1 waits for rank 0: stopped by rank 0's failure)
    said = _lab("check", "1", "oops.py", "--exercises", "course")
    assert said.returncode == 1 and _quiet(said), said.stderr
    out = said.stdout.decode().replace("\n     ", " ")
    for n in ("1 rank ", "2 ranks"):
        assert f"   {n}: FAIL rank 0 raised Oops at line 7: <its message could not be shown: its __str__ raised " \
               "RuntimeError>\n" in out, out


def test_a_submissions_own_exception_raised_by_every_rank_is_said_so(course):
    """Each simulated rank loads the submission for itself, so its own exception class is another object on each
    rank: "rank 0 raised Oops" was said where every rank raised it, as a ValueError is said."""
    (course / "own.py").write_text("class Oops(Exception):\n    pass\ndef double(comm, x):\n    raise Oops('bad')\n")
    said = _lab("check", "1", "own.py", "--exercises", "course")
    assert said.returncode == 1 and _quiet(said), said.stderr
    assert "   2 ranks: FAIL every rank raised Oops at line 4: bad\n" in said.stdout.decode(), said.stdout


def test_a_megabyte_message_is_cut_saying_its_length(course, capsys):
    """`raise ValueError("x" * 10**6)` printed the megabyte, and wrote it into the grade book's cell."""
    (course / "s").mkdir()
    (course / "s" / "loud.py").write_text('def double(comm, x):\n    raise ValueError("x" * 10**6)\n')
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    [row] = list(csv.DictReader((course / "g.csv").open()))
    assert row["reason"] == "rank 0 raised ValueError at line 2: " + "x" * 200 + "... (1,000,000 characters)"
    assert main(["lab", "check", "1", "s/loud.py", "--exercises", "course"]) == 1
    out = capsys.readouterr().out
    assert len(out) < 2000 and "x... (1,000,000 characters)" in " ".join(out.split())


def test_an_array_of_python_objects_is_said_by_its_dtype(course, capsys):
    """`.astype(object)` was said "returned an array of shape (3,), expected an array of shape (3,)"."""
    (course / "objects.py").write_text("def double(comm, x):\n    return (2 * x).astype(object)\n")
    assert main(["lab", "check", "1", "objects.py", "--exercises", "course", "--ranks", "1"]) == 1
    assert "rank 0 returned an array of shape (3,) and dtype object, expected an array of shape (3,)" in \
        " ".join(capsys.readouterr().out.split())


#: A right ring Allreduce (exercise 5) whose result is turned by `{end}` before it is returned.
RING = """import numpy as np
def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    chunks = [c.copy() for c in np.array_split(x, n)]
    for step in range(2 * (n - 1)):
        s, t = (r - step) % n, (r - step - 1) % n
        buf = np.empty_like(chunks[t])
        comm.Sendrecv(chunks[s], dest=(r + 1) % n, recvbuf=buf, source=(r - 1) % n)
        chunks[t] = chunks[t] + buf if step < n - 1 else buf
    return {end}
"""


@pytest.mark.parametrize("end, said", [
    ("np.concatenate(chunks)", None),
    ("np.concatenate(chunks).tolist()", "wrong at 2 ranks (N=16): rank 0 returned a list, expected a NumPy array "
     "(ndarray) of shape (16,) and dtype float64: the exercise asks for an array; make one with np.asarray"),
    ("tuple(np.concatenate(chunks))", "rank 0 returned a tuple, expected a NumPy array (ndarray) of shape (16,)"),
    ("np.concatenate(chunks).astype(complex)", "wrong at 2 ranks (N=16): rank 0 returned an array of dtype "
     "complex128, expected float64: its imaginary parts are all 0: return its real part (.real)"),
    ("np.concatenate(chunks) + 1e-3j", "expected float64: some of its values have an imaginary part"),
], ids=["array", "list", "tuple", "complex", "imaginary"])
def test_a_list_or_a_complex_array_of_the_right_values_fails_naming_its_type(tmp_path, end, said):
    """A list, or a complex array, of the right values passed where the statement asks for a float64 array."""
    (tmp_path / "ring.py").write_text(RING.format(end=end))
    result = run_case(find_exercise(5), str(tmp_path / "ring.py"), 2, 0)
    assert (result.status, result.reason) == ("pass", "") if said is None else \
        result.status == "wrong" and said in result.reason, result


def test_a_list_passes_where_the_statement_says_array_like(course, capsys):
    """An exercise whose statement says "array-like" takes a list of the right values (and still names a list of
    the wrong shape); a complex number where a real one is expected fails naming its dtype."""
    text = (course / "course" / "01_double.py").read_text()
    (course / "course" / "01_double.py").write_text(text.replace('"Return 2 * x', '"Return an array-like 2 * x'))
    (course / "listed.py").write_text("def double(comm, x):\n    return [2 * v for v in x]\n")
    assert main(["lab", "check", "1", "listed.py", "--exercises", "course"]) == 0
    (course / "short.py").write_text("def double(comm, x):\n    return [2 * v for v in x][1:]\n")
    assert main(["lab", "check", "1", "short.py", "--exercises", "course", "--ranks", "1"]) == 1
    assert "rank 0 returned a list of 2 items (shape (2,) as one array), expected an array of shape (3,)" in \
        " ".join(capsys.readouterr().out.split())
    assert first_difference([np.complex128(3.0)], [3.0], [()], 1e-9, 0.0) == \
        "rank 0 returned a complex128 number, (3+0j), expected a real number (3)"


def test_a_submission_of_another_exercise_names_that_exercise(course, capsys):
    """A submission of exercise 2 graded as exercise 1 was said to define "no function 'double' (it defines
    triple)", which reads as a misnamed function."""
    (course / "course" / "02_triple.py").write_text(TINY.replace("double", "triple").replace("2 * x", "3 * x"))
    (course / "mine.py").write_text("def triple(comm, x):\n    return 3 * x\n")
    assert main(["lab", "check", "1", "mine.py", "--exercises", "course"]) == 1
    assert " ".join(capsys.readouterr().out.split()).endswith(
        "mine.py defines no function 'double' (it defines triple: exercise 2's function, not exercise 1's): def "
        "double(comm, x)")
    assert main(["lab", "check", "2", "mine.py", "--exercises", "course"]) == 0


def test_a_folder_graded_under_another_exercises_number_says_which(course, capsys):
    """A folder of exercise 2's submissions graded as exercise 1 failed every row ("defines no function 'double'
    (it defines triple: exercise 2's function ...)", cut at 100 columns), with no word for the whole folder."""
    (course / "course" / "02_triple.py").write_text(TINY.replace("double", "triple").replace("2 * x", "3 * x"))
    (course / "s").mkdir()
    for name in ("a.py", "b.py"):
        (course / "s" / name).write_text("def triple(comm, x):\n    return 3 * x\n")
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "note: every submission defines exercise 2's function, not exercise 1's: grade them with `spmdsim lab " \
           "grade 2 s --csv g.csv --exercises course`" in err, err  # (without --csv the command was refused, and
    # without --exercises it graded the exercise 2 spmdsim ships)
    (course / "s" / "b.py").write_text("def double(comm, x):\n    return 2 * x\n")  # one of exercise 1's: no note
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    assert "note: every submission" not in capsys.readouterr().err


def test_under_mpiexec_a_time_limit_run_out_stops_the_check(course):
    """Each rank count's job ran to the time limit in turn: a deadlock at every count took 5 limits (50 s, where
    simulated ranks take 10), and the reason said "at 1 ranks"."""
    # an endless loop that sleeps, as a deadlocked rank waits: SUBMISSIONS' hanging.py spun a core for the 3 s
    (course / "spin.py").write_text("import time\ndef double(comm, x):\n    while True:\n        time.sleep(0.01)\n")
    verdict = check_mpiexec(find_exercise(1, "course"), "spin.py", time_limit=3)
    assert [(r.ranks, r.status, r.reason) for r in verdict.results] == [
        (1, "timeout", "ran past the time limit of 3 s at 1 rank under mpiexec: a deadlock (MPI ranks wait forever) "
                       "or an endless loop")]


def test_under_mpiexec_an_abort_is_said_in_mpis_words_not_launchs_cleanup(course):
    """The reason of a job ended by comm.Abort is the job's last line on stderr, MPICH's, not the line
    `spmdsim launch` writes after it about the shared-memory segments it removed."""
    (course / "aborts.py").write_text("def double(comm, x):\n    if comm.Get_rank() == 0:\n        comm.Abort(5)\n"
                                      "    return 2 * x\n")
    verdict = check_mpiexec(find_exercise(1, "course"), "aborts.py", ranks=(2,), time_limit=60)
    (result,) = verdict.results
    assert result.status == "exit" and result.reason.startswith("the mpiexec job at 2 ranks ended: "), result
    # MPICH's hydra sometimes ends the job before the aborting rank's line is written (1 of 12 plain
    # `mpiexec -n 2` runs of an Abort printed nothing): then the job's exit code is the reason.
    assert ("MPI_Abort" in result.reason or result.reason.endswith("ended: exit code 5")) \
        and "shared-memory" not in result.reason, result.reason


ABORT_LINE = "Abort(5) on node 0 (rank 0 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 5) - process 0"
RULE = "-" * 74
# Open MPI 5.0.11's prterun on a comm.Abort(5): MPI_ABORT's report, its own, then a NUL byte (no newline), after
# which `spmdsim launch` wrote its line; on a rank's non-zero exit its report, now and then its PMIx server's line.
OMPI_ABORT = (f"{RULE}\nMPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n  Proc: [[6581,1],0]\n"
              "  Errorcode: 5\n\nNOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\nYou may or may "
              f"not see output from other processes, depending on\nexactly when Open MPI kills them.\n{RULE}\n{RULE}\n"
              "prterun has exited due to process rank 0 with PID 0 on node vm calling\n\"abort\". This may have "
              "caused other processes in the application to be\nterminated by signals sent by prterun (as reported "
              f"here).\n{RULE}\n\0")
LAB_ERROR = "spmdsim.tools.lab.exercise.LabError: exercise 1: case(0, 2) gives rank 0 2 arguments"
OMPI_EXIT = (f"{RULE}\nprterun detected that one or more processes exited with non-zero status,\nthus causing the job "
             "to be terminated. The first process to do so was:\n\n   Process name: [prterun-vm-30895@1,0]\n   Exit "
             f"code:    1\n{RULE}\n[vm:29978] PMIX ERROR: PMIX_ERR_UNREACH in file /openmpi-5.0.11/3rd-party/openpmix/"
             "src/server/pmix_server.c at line 3146\n")


@pytest.mark.parametrize("errors, said", [
    (OMPI_ABORT + "spmdsim: removed 2 shared-memory segments made since the job started that no process holds (a "
     "rank's\n  that died at its start, or another job's): sm_segment.vm.0.e330000.0, sm_segment.vm.0.e330000.1\n",
     ""),
    (f"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n{LAB_ERROR}\n{OMPI_EXIT}", LAB_ERROR),
    (f"{RULE}\na rank's own lines between rules\n{RULE}\n", RULE),
    (f"{ABORT_LINE}\nspmdsim: removed 1 shared-memory segment the job left: mpich_shm_a\n  (aborted jobs leave\n",
     ABORT_LINE),
    (f"{ABORT_LINE}\n", ABORT_LINE),
    ("spmdsim: removed 1 shared-memory segment the job left: mpich_shm_a\n  (aborted jobs leave\n", ""),
    ("", ""),
])
def test_a_jobs_reason_is_its_processes_last_line_not_launchs_cleanup_after_it(errors, said):
    assert _job_said(errors) == said


def test_under_mpiexec_a_job_that_aborted_after_its_case_was_written_passed_fails():
    """MPICH 5's MPI_Abort can return before mpiexec ends the job (28 of 40 plain mpi4py launches went on past
    it), so a submission calling comm.Abort(5) on rank 0 sometimes returned its value, its case was written as
    passed and the check said PASS though the job ended with code 5 (1 run in 15). A job that ends with an error
    that none of its cases explains fails, the case written last taking its row."""
    events = [{"event": "start", "ranks": 2, "seed": 0, "time": 0.0},
              {"event": "done", "ranks": 2, "seed": 0, "label": "seed 0", "status": "pass", "reason": "",
               "detail": "", "sent": 0, "optimum": None}]
    said = ("Abort(5) on node 0 (rank 0 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 5) - process 0\n"
            "spmdsim: removed 1 shared-memory segment made since the job started that no process holds (a rank's\n"
            "  that died at its start, or another job's): mpich_shm_5c729fa5_0\n")
    (result,) = _mpi_results(events, 5, 2, 60.0, said)
    assert (result.status, result.seed, result.reason) == (
        "exit", 0, "the mpiexec job at 2 ranks ended: Abort(5) on node 0 (rank 0 in comm 0): application called "
        "MPI_Abort(MPI_COMM_WORLD, 5) - process 0")
    (kept,) = _mpi_results(events, 0, 2, 60.0, "")  # a job that ended well keeps its passed case
    assert kept.status == "pass"


def test_an_exercise_files_fault_reads_alike_on_simulated_ranks_and_under_mpiexec():
    """The child's last line and an mpiexec job's each had LabError's module path cut off by code of its own;
    one helper now says the fault, and both verdicts read it the same."""
    line = "spmdsim.tools.lab.exercise.LabError: exercise 1: case(0, 2) raised KeyError: 'y'"
    assert exercise_fault(line) == "exercise 1: case(0, 2) raised KeyError: 'y'"
    assert exercise_fault("KeyError: 'y'") is None and exercise_fault("LabError: exercise 1") is None
    simulated = case_ended(1, 10.0, 512, {"ranks": 2, "seed": 0}, False, "Traceback ...\n" + line + "\n")
    events = [{"event": "start", "ranks": 2, "seed": 0, "time": 0.0}]
    (mpi,) = _mpi_results(events, 1, 2, 10.0, line + "\n")
    assert simulated.reason == "the grader stopped at 2 ranks (seed 0): exercise 1: case(0, 2) raised KeyError: 'y'"
    assert mpi.reason == "the grader stopped at 2 ranks: exercise 1: case(0, 2) raised KeyError: 'y'"


def test_under_mpiexec_what_the_ranks_printed_is_shown_as_on_simulated_ranks(course, capsys):
    """`check --mpiexec` sent the ranks' output nowhere: a student debugging with print() saw nothing of the case
    that failed. A line left unended before the rank's Abort is there too, a line of its own as on simulated ranks
    (it ran into the next job's first line: '  | no newlinerank 0 of 2 has 0.0'), and mpiexec's banner on the
    Abort is not the ranks'."""
    (course / "chatty.py").write_text(
        "def double(comm, x):\n    if comm.Get_rank() > 0:\n        return 2 * x\n"
        "    print('rank 0 of', comm.Get_size(), 'has', x[0])\n    print('no newline', end='')\n"
        "    raise ValueError('stop')\n")
    assert main(["lab", "check", "1", "chatty.py", "--exercises", "course", "--mpiexec"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "   1 rank : FAIL rank 0 raised ValueError at line 6: stop",
        "   2 ranks: FAIL rank 0 raised ValueError at line 6: stop",
        out[3],
        "its ranks printed 62 B over the cases run; the first lines:",
        "  | rank 0 of 1 has 0.0", "  | no newline", "  | rank 0 of 2 has 0.0", "  | no newline"], out
    assert out[3].startswith("FAIL: fails at 1, 2 ranks (0 of 2 cases, ")
    assert main(["lab", "check", "1", "chatty.py", "--exercises", "course"]) == 1  # on simulated ranks: the same
    simulated = capsys.readouterr().out.splitlines()
    assert simulated[4:] == out[4:], simulated


def test_mpiexec_not_installed_is_refused_not_a_fail_of_the_submission(course, monkeypatch, capsys):
    """Without an mpiexec, every job failed with launch's refusal: a right submission FAIL, exit 1."""
    (course / "right.py").write_text(SUBMISSIONS["right.py"])
    (course / "bin").mkdir()
    monkeypatch.setattr(sys, "executable", str(course / "bin" / "python"))
    monkeypatch.setenv("PATH", str(course / "bin"))
    assert main(["lab", "check", "1", "right.py", "--exercises", "course", "--mpiexec"]) == 2
    out, err = capsys.readouterr()
    assert not out and " ".join(err.split()) == (
        "spmdsim: error: --mpiexec runs each rank count as an MPI job, and no mpiexec was found beside this Python "
        "or on PATH: install the 'mpi' extra, or check without --mpiexec (on simulated ranks)")


def test_a_wider_float_than_the_exercise_asks_for_fails_naming_both_dtypes(course, capsys):
    """An exercise whose expected arrays are float32 passed a float64 result of the right values: the check
    compared values only (a float32 result where float64 is expected already fails past its digits)."""
    text = TINY.replace("np.arange(3.0) + r", "np.arange(3.0, dtype=np.float32) + r")
    (course / "course" / "01_double.py").write_text(text)
    (course / "wide.py").write_text("import numpy as np\ndef double(comm, x):\n    return 2 * x.astype(np.float64)\n")
    assert main(["lab", "check", "1", "wide.py", "--exercises", "course"]) == 1
    assert "rank 0 returned dtype float64, expected float32: the values are right, but the exercise asks for " \
        "float32 (twice the bytes or more to hold and send): compute in float32, or convert the result with " \
        ".astype(np.float32)" in " ".join(capsys.readouterr().out.split())
    (course / "same.py").write_text("def double(comm, x):\n    return x + x\n")
    assert main(["lab", "check", "1", "same.py", "--exercises", "course"]) == 0
    assert first_difference([np.ones(2, np.float32)], [np.ones(2)], [()], 1e-9, 0.0) is None  # narrower, exact


#: An instructor's float32 exercise with no RTOL or ATOL: its reference sums by Allreduce, in MPICH's order.
ALLSUM = '''
import numpy as np

TITLE = "Sum in float32"
FUNCTION = "allsum"
SIGNATURE = "allsum(comm, x)"
STATEMENT = "Return the sum of every rank's float32 x, as float32, on every rank."
RANKS = (4, 8)
SEEDS = (0,)


def case(seed, n):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(1000).astype(np.float32) for _ in range(n)]
    total = xs[0].copy()
    for x in xs[1:]:
        total += x
    return {"args": [(x,) for x in xs], "expected": [total] * n}


def allsum(comm, x):
    out = np.empty_like(x)
    comm.Allreduce(x, out)
    return out
'''


def test_a_float32_exercise_is_compared_at_float32s_tolerance_unless_it_sets_its_own(course, capsys):
    """The defaults RTOL 1e-9 and ATOL 1e-12 are float64's: a float32 exercise's own reference failed at 4 and 8
    ranks ("277 of 1000 values wrong ... by up to 4.77e-07, 4.21e-09 allowed"), its sum in another order."""
    (course / "course" / "01_double.py").unlink()
    (course / "course" / "01_allsum.py").write_text(ALLSUM)
    assert main(["lab", "check", "1", "course/01_allsum.py", "--exercises", "course"]) == 0
    capsys.readouterr()
    own = ALLSUM.replace("SEEDS = (0,)", "SEEDS = (0,)\nRTOL = 1e-9\nATOL = 1e-12")
    (course / "course" / "01_allsum.py").write_text(own)
    assert main(["lab", "check", "1", "course/01_allsum.py", "--exercises", "course"]) == 1  # its own, kept
    assert "(they differ past the digits shown: by up to" in capsys.readouterr().out
    want = np.float32([1.0, 2.0])
    assert first_difference([want * (1 + 3e-5)], [want], [()], None, None) is None
    assert first_difference([want * (1 + 3e-4)], [want], [()], None, None) is not None
    assert first_difference([np.ones(2) * (1 + 1e-8)], [np.ones(2)], [()], None, None) is not None  # float64's
