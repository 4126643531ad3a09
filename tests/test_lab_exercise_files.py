"""An instructor's exercise file whose names have the wrong form: refused in one line naming the name, its value
and the form expected, before any submission runs (not a traceback, nor a rule read letter by letter)."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from test_lab_cli import TINY  # an instructor's exercise in a folder of their own

from spmdsim.tools.cli.main import main


def _course(tmp_path, extra: str) -> str:
    folder = tmp_path / "course"
    folder.mkdir()
    (folder / "01_double.py").write_text(TINY + "\n" + extra + "\n")
    return str(folder)


@pytest.mark.parametrize("extra, words", [
    ('FORBIDDEN = "Bcast"', "FORBIDDEN = 'Bcast'; expected a tuple of call names, such as (\"Bcast\",)"),
    ('ALLOWED = "Scan"', "ALLOWED = 'Scan'; expected a tuple of call names"),
    ('REQUIRED = ("Scan", 2)', "REQUIRED = ('Scan', 2); expected a tuple of call names"),
    ("RANKS = 4", "RANKS = 4; expected a tuple of rank counts, such as (1, 2, 4)"),
    ('MOST_CALLS = ["Scan", 1]', "MOST_CALLS = ['Scan', 1]; expected a dict of call names and counts"),
    ('TIME_LIMIT = "10"', "TIME_LIMIT = '10'; expected a number above 0"),
    ("MEMORY_MB = 0", "MEMORY_MB = 0; expected a number above 0"),
    ('RTOL = "1e-9"', "RTOL = '1e-9'; expected a number, 0 or more"),
    ("HINT = 3", "HINT = 3; expected a sentence (a str)"),
    ("partners = (0, 1)", "partners = (0, 1); expected a function, def partners(...)"),
    ('case = "x"', "case = 'x'; expected a function, def case(seed, n)"),
    ("TITLE = None", "TITLE = None; expected a str"),
], ids=["forbidden-str", "allowed-str", "required-int", "ranks-int", "most-calls-list", "time-limit-str",
        "memory-zero", "rtol-str", "hint-int", "partners-tuple", "case-str", "title-none"])
def test_an_exercise_name_of_the_wrong_form_is_one_line_naming_it(tmp_path, capsys, extra, words):
    """FORBIDDEN = "Bcast" forbade the calls B, c, a, s and t, so a Bcast passed; RANKS = 4, MOST_CALLS as a
    list and TIME_LIMIT = "10" ended in a traceback."""
    course = _course(tmp_path, extra)
    assert main(["lab", "list", "--exercises", course]) == 2
    err = capsys.readouterr().err
    joined = " ".join(err.split())
    assert "01_double.py': " + words in joined and "Traceback" not in err, err


def test_rules_given_as_a_list_or_a_set_are_taken(tmp_path, capsys):
    course = _course(tmp_path, 'FORBIDDEN = ["Bcast"]\nALLOWED = {"Allreduce"}\nMOST_CALLS = {"Allreduce": 0}')
    assert main(["lab", "list", "--exercises", course]) == 0
    assert "Double it" in capsys.readouterr().out


@pytest.mark.parametrize("args, words", [
    ("[x for x in xs]", "case(0, 1) gives rank 0 a value of type ndarray; expected a tuple (x,), the arguments "
                        "double(comm, x) takes after comm"),
    ("[(x, x) for x in xs]", "case(0, 1) gives rank 0 2 arguments; expected a tuple (x,)"),
    ("[(x,) for x in xs][1:]", "case(0, 1) returned 0 'args' and 1 'expected'; expected a dict with 1 'args' and "
                               "1 'expected', one per rank"),
], ids=["bare-array", "two-for-one", "one-rank-short"])
def test_a_case_whose_arguments_do_not_fit_the_signature_is_the_exercise_files_fault(tmp_path, capsys, args, words):
    """A case giving each rank its array bare (not in a tuple) had the check split the array into arguments, and
    one giving a rank too many arguments blamed the reference: "rank 0 raised TypeError: double() takes 2
    positional arguments but 4 were given"; a count of 'args' off by one did not say what case() returned."""
    course = _course(tmp_path, "")
    path = tmp_path / "course" / "01_double.py"
    path.write_text(path.read_text().replace('"args": [(x,) for x in xs]', f'"args": {args}'))
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL the grader stopped at 1 rank (seed 0): exercise 1: " + words in out, out
    assert "raised TypeError" not in out, out


def test_a_budget_above_zero_at_one_rank_does_not_blame_shared_memory(tmp_path, capsys):
    """A Scan's budget written as its send buffer at every rank count (32 B, as the Scan sends from all ranks
    but the last) failed the reference at 1 rank: "no rank sent a byte at 1 rank, ...: the values went through
    memory the simulated ranks share", with no other rank to share with; one rank sends nothing."""
    scan = ("def double(comm, x):\n    from mpi4py import MPI\n    out = np.empty_like(x)\n"
            "    comm.Scan(x, out, op=MPI.SUM)\n    return 2 * x\n")
    course = _course(tmp_path, "def optimal_bytes(case, n):\n    return 24\n\n\n" + scan)
    path = tmp_path / "course" / "01_double.py"
    assert main(["lab", "check", "1", str(path), "--exercises", course]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "PASS: passes at 1, 2 ranks" in out and "memory the simulated ranks share" not in out, out


def test_two_files_of_one_number_are_named(tmp_path, capsys):
    """Two exercise files numbered 1 were refused as "numbers two files 1", which named neither."""
    course = _course(tmp_path, "")
    (tmp_path / "course" / "1_triple.py").write_text(TINY)
    assert main(["lab", "list", "--exercises", course]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (f"spmdsim: error: exercise folder {course!r} gives the number 1 to 01_double.py and 1_triple.py: "
                   "give each file its own number"), err


def test_a_partners_of_the_wrong_form_is_said_as_the_exercises_fault(tmp_path, capsys):
    """partners returning a str stopped the check with "ValueError: the exercise's partners(0, 2) returned ...",
    a Python class name the other faults of an exercise file (sends, case) do not show."""
    ring = ("def double(comm, x):\n    r, n = comm.Get_rank(), comm.Get_size()\n"
            "    comm.sendrecv(x, dest=(r + 1) % n, source=(r - 1) % n)\n    return 2 * x\n")
    course = _course(tmp_path, "def partners(rank, n):\n    return 'left and right'\n\n\n" + ring)
    path = tmp_path / "course" / "01_double.py"
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "2"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert ("FAIL the grader stopped at 2 ranks (seed 0): the exercise's partners(0, 2) returned 'left and right': "
            "expected a rank or a collection of ranks (ints)") in out, out


@pytest.mark.parametrize("returned", ["'24'", "-1", "True"])
def test_an_optimal_bytes_that_is_no_count_is_said_as_the_exercises_fault(tmp_path, capsys, returned):
    """optimal_bytes returning a str stopped the check with "TypeError: '>' not supported between instances of
    'int' and 'str'", which named neither the function nor the value."""
    ring = ("def double(comm, x):\n    r, n = comm.Get_rank(), comm.Get_size()\n"
            "    comm.sendrecv(x, dest=(r + 1) % n, source=(r - 1) % n)\n    return 2 * x\n")
    course = _course(tmp_path, f"def optimal_bytes(case, n):\n    return {returned}\n\n\n" + ring)
    path = tmp_path / "course" / "01_double.py"
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "2"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert (f"FAIL the grader stopped at 2 ranks (seed 0): the exercise's optimal_bytes(case, 2) returned {returned}: "
            "expected a count of bytes (a number, 0 or more)") in out, out


def _row(name: str) -> str:
    """The row of docs/howto/grade-exercises.md's table of optional rules that names `name`."""
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "howto", "grade-exercises.md")) as f:
        return next(line for line in f if line.startswith(f"| `{name}"))


RING = ("def double(comm, x):\n    r, n = comm.Get_rank(), comm.Get_size()\n"
        "    comm.sendrecv(x, dest=(r + 1) % n, source=(r - 1) % n)\n    return 2 * x\n")


def test_the_pages_sends_example_reads_as_the_check_says_it(tmp_path, capsys):
    """The page's example, {"its partial sum": part}, had a check say "carried no its partial sum"."""
    example = re.search(r'`(return \{.*\} if rank else \{\})`, said as "(carried no [^"]*)"', _row("sends"))
    assert example, _row("sends")
    sends = f"def sends(case, n, rank):\n    part = case['args'][rank][0].sum() + 1000\n    {example.group(1)}\n"
    course = _course(tmp_path, sends)
    path = tmp_path / "ring.py"
    path.write_text(RING)
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "2"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"rank 1's messages at 2 ranks (seed 0) {example.group(2)}: in this exercise's" in out, out


def test_the_hint_follows_a_forbidden_call_not_one_outside_allowed_as_the_page_says(tmp_path, capsys):
    """The page said HINT follows "a forbidden call"; a call outside ALLOWED is said with the calls allowed, and
    no HINT."""
    assert "`FORBIDDEN` names" in _row("HINT") and "outside `ALLOWED`" in _row("HINT"), _row("HINT")
    path = tmp_path / "ring.py"
    path.write_text(RING)
    for rule, said in (('FORBIDDEN = ("sendrecv",)', "line 3: comm.sendrecv is not allowed in this exercise: "
                                                     "use Allreduce"),
                       ('ALLOWED = ("Allreduce",)', "line 3: comm.sendrecv is not one of the calls this exercise "
                                                    "allows (Allreduce)\n")):
        course = tmp_path / "course"
        if course.exists():  # (with the __pycache__ loading the exercise wrote, where Python writes bytecode)
            shutil.rmtree(course)
        _course(tmp_path, f'{rule}\nHINT = "use Allreduce"')
        assert main(["lab", "check", "1", str(path), "--exercises", str(course), "--ranks", "2"]) == 1
        out = capsys.readouterr().out
        assert said in out.replace("\n     ", " "), out


def test_a_signature_with_annotations_takes_its_arguments(tmp_path, capsys):
    """A SIGNATURE whose annotation holds a comma (tuple[int, int]) is not counted as two parameters."""
    course = _course(tmp_path, 'SIGNATURE = "double(comm, x: tuple[int, int])"')
    path = tmp_path / "course" / "01_double.py"
    assert main(["lab", "check", "1", str(path), "--exercises", course]) == 0, capsys.readouterr().out


def test_an_exercise_file_that_exits_as_it_is_imported_is_named(tmp_path, capsys):
    """sys.exit("bye") at an exercise file's top ended spmdsim with "bye" and exit code 1, naming no file."""
    course = _course(tmp_path, 'import sys\nsys.exit("bye")')
    assert main(["lab", "list", "--exercises", course]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (f"spmdsim: error: exercise file {os.path.join(course, '01_double.py')!r} does not load: it calls "
                   "sys.exit('bye') as it is imported"), err


@pytest.mark.parametrize("rule, said", [
    ('FORBIDDEN = ("BCast",)', "FORBIDDEN names 'BCast', which no communicator, window or request has: expected a "
                               "call's name, such as 'Bcast'"),
    ('MOST_CALLS = {"Allreduse": 1}', "MOST_CALLS names 'Allreduse'"),
    ('REQUIRED = ("Scatter|Snd",)', "REQUIRED names 'Snd'"),
], ids=["forbidden", "most-calls", "required"])
def test_a_rule_naming_no_call_is_the_exercises_fault(tmp_path, capsys, rule, said):
    """FORBIDDEN = ("BCast",) forbade nothing, and a Bcast passed; MOST_CALLS with a misspelt name limited
    nothing."""
    course = _course(tmp_path, rule)
    path = tmp_path / "course" / "01_double.py"
    assert main(["lab", "check", "1", str(path), "--exercises", course]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"FAIL the grader stopped at 1 rank (seed 0): exercise 1: {said}" in out, out


def test_rules_naming_calls_of_topologies_windows_and_requests_are_taken(tmp_path, capsys):
    course = _course(tmp_path, 'FORBIDDEN = ("Create_cart", "Neighbor_alltoallv", "Fence", "Start", "Iscan")\n'
                               'ALLOWED = ("Put", "sendrecv", "Ibcast")\nMOST_CALLS = {"Send|Isend": 2}')
    path = tmp_path / "course" / "01_double.py"
    assert main(["lab", "check", "1", str(path), "--exercises", course]) == 0, capsys.readouterr().out


def test_under_mpiexec_a_fault_of_the_exercise_file_is_said_as_on_simulated_ranks(tmp_path, capsys):
    """Under --mpiexec a case() whose arguments misfit SIGNATURE was said as "the mpiexec job at 2 ranks ended:
    spmdsim.tools.lab.exercise.LabError: exercise 1: ...", LabError's module path and all."""
    course = _course(tmp_path, "")
    path = tmp_path / "course" / "01_double.py"
    path.write_text(path.read_text().replace('"args": [(x,) for x in xs]', '"args": [(x, x) for x in xs]'))
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "2", "--mpiexec"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "2 ranks: FAIL the grader stopped at 2 ranks: exercise 1: case(0, 2) gives rank 0 2 arguments" in out, out
    assert "LabError" not in out, out


#: An exercise whose rank 0 sends its doubled x, the first block of its buffer, by a v-collective whose counts
#: are a tuple: {call} is the call.
V_SENDS = '''
def sends(case, n, rank):
    return {{"its doubled x": 2 * case["args"][0][0]}} if n > 1 and rank == 0 else {{}}


def double(comm, x):
    from mpi4py import MPI
    n = comm.Get_size()
    y = np.concatenate([2 * x] + [np.full(x.size, -1.0)] * (n - 1))  # 2x for rank 0, -1s for the others
    got = np.empty_like(y)
    {call}
    return 2 * x
'''


@pytest.mark.parametrize("call", [
    "comm.Alltoallv([y, tuple([x.size] * n), MPI.DOUBLE], [got, tuple([x.size] * n), MPI.DOUBLE])",
    "comm.Scatterv([y, tuple([x.size] * n), MPI.DOUBLE], got[:x.size], root=0)",
], ids=["alltoallv", "scatterv"])
def test_a_v_collectives_counts_given_as_a_tuple_send_its_whole_buffer(tmp_path, capsys, call):
    """[y, (3, 3), MPI.DOUBLE] to an Alltoallv or a Scatterv was read as a plain message, 3 entries from
    displacement 3, so rank 0, whose doubled x is its buffer's first block, failed as if another rank did its
    work."""
    course = _course(tmp_path, V_SENDS.format(call=call))
    path = tmp_path / "course" / "01_double.py"
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "2"]) == 0, \
        capsys.readouterr().out


@pytest.mark.parametrize("extra, words", [
    ("import time\n_case = case\n\n\ndef case(seed, n):\n    while True:\n        time.sleep(0.01)\n",
     "the grader stopped at 1 rank (seed 0): exercise 1's case(0, 1) ran past the time limit of 1 s before the "
     "submission ran: an endless loop in the exercise file, not in the submission"),
    ("import time\n\n\ndef optimal_bytes(case, n):\n    while True:\n        time.sleep(0.01)\n",
     "the grader stopped at 1 rank (seed 0): exercise 1's judging of the results (its explain, sends, partners or "
     "optimal_bytes) ran past the time limit of 1 s after the submission returned: an endless loop in the "
     "exercise file, not in the submission"),
], ids=["case", "optimal-bytes"])
def test_an_exercise_function_that_never_returns_is_said_as_the_exercises_fault(tmp_path, capsys, extra, words):
    """A case() with an endless loop was said as the submission's: "ran past the time limit of 1 s at 1 rank
    (seed 0): an endless loop, or a rank waiting for a message no rank sends". (The loops sleep: which side ran
    on is read from the child's events, not its CPU, and a spinning one took a core for the whole limit.)"""
    course = _course(tmp_path, "TIME_LIMIT = 1\n" + extra)
    path = tmp_path / "right.py"
    path.write_text("def double(comm, x):\n    return 2 * x\n")
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert words in out and "a rank waiting" not in out, out


def test_under_mpiexec_a_case_that_never_returns_is_said_as_the_exercises_fault(tmp_path, capsys):
    course = _course(tmp_path, "TIME_LIMIT = 2\nimport time\n\n\ndef case(seed, n):\n    while True:\n"
                               "        time.sleep(0.01)\n")
    path = tmp_path / "right.py"
    path.write_text("def double(comm, x):\n    return 2 * x\n")
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "1", "--mpiexec"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert ("the grader stopped at 1 rank under mpiexec: exercise 1's case(0, 1) ran past the time limit of 2 s "
            "before the submission ran: an endless loop in the exercise file, not in the submission") in out, out


def test_an_explain_that_raises_is_said_as_the_exercises_fault_under_the_wrong_result(tmp_path, capsys):
    """An explain that raised was silent: the wrong result was said with no word of the exercise file's fault."""
    course = _course(tmp_path, "def explain(case, n, rank, got):\n    return 1 / 0\n")
    path = tmp_path / "wrong.py"
    path.write_text("def double(comm, x):\n    return 3 * x\n")
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL wrong at 1 rank (seed 0): rank 0 result[1:3] differs" in out, out
    assert "exercise 1: explain(case, 1, 0, array([0., 3., 6.])) raised ZeroDivisionError: division by zero" in out, out


def test_an_exercise_file_imports_a_helper_module_beside_it_and_each_folder_its_own(tmp_path, capsys):
    """`from helpers import doubled` in an exercise file failed: "exercise file ... does not load:
    ModuleNotFoundError: No module named 'helpers'", its folder not on the path."""
    folders = []
    for name, factor in (("course", 2), ("other", 3)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "helpers.py").write_text(f"def doubled(x):\n    return {factor} * x\n")
        (folder / "01_double.py").write_text("from helpers import doubled\n" + TINY.replace(
            '"expected": [2 * x for x in xs]', '"expected": [doubled(x) for x in xs]').replace(
            "    return 2 * x\n", "    return doubled(x)\n"))
        folders.append(str(folder))
    path = tmp_path / "twice.py"
    path.write_text("def double(comm, x):\n    return 2 * x\n")
    assert main(["lab", "check", "1", str(path), "--exercises", folders[0]]) == 0, capsys.readouterr().out
    assert main(["lab", "check", "1", str(path), "--exercises", folders[1]]) == 1  # 3 * x there: its own helpers
    assert "FAIL wrong at 1 rank (seed 0)" in " ".join(capsys.readouterr().out.split())
    own = str(tmp_path / "other" / "01_double.py")  # its reference, checked: its helpers import, as under grade
    assert main(["lab", "check", "1", own, "--exercises", folders[1]]) == 0
    assert main(["lab", "check", "1", own, "--exercises", folders[1], "--ranks", "2", "--mpiexec"]) == 0
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    (submissions / "uses_helpers.py").write_text("from helpers import doubled\ndef double(comm, x):\n"
                                                 "    return doubled(x)\n")
    book = tmp_path / "book.csv"
    assert main(["lab", "grade", "1", str(submissions), "--csv", str(book), "--exercises", folders[0]]) == 0
    assert "No module named 'helpers'" in book.read_text()  # a submission is one file: not the instructor's


def test_an_exercise_memory_mb_below_what_its_ranks_need_is_refused_as_the_option_is(tmp_path, capsys):
    """MEMORY_MB = 100 was taken at 2 ranks, where --memory-mb 100 is refused, and every submission failed
    alike."""
    course = _course(tmp_path, "MEMORY_MB = 100")
    path = tmp_path / "course" / "01_double.py"
    for command in (["check", "1", str(path)], ["grade", "1", str(tmp_path / "course"), "--csv",
                                                 str(tmp_path / "book.csv")]):
        assert main(["lab", *command, "--exercises", course]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert err == (f"spmdsim: error: exercise 1's MEMORY_MB = 100 is too little for 2 ranks: expected at least "
                       f"160 (the check's own ranks take part of it): raise it in {path}, or give --memory-mb"), err
    assert main(["lab", "check", "1", str(path), "--exercises", course, "--ranks", "1", "--memory-mb", "200"]) == 0
    capsys.readouterr()
