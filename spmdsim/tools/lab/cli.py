"""`spmdsim lab`: exercises students solve in code, checked on simulated ranks.

    spmdsim lab list                          the exercises, one line each
    spmdsim lab start N [DIR]                 the statement and a starter file to complete
    spmdsim lab check N FILE [--ranks n,...]  run a submission on each rank count, with feedback
                                              (--mpiexec: as MPI jobs)
    spmdsim lab grade N DIR --csv OUT         every submission of a folder, one CSV row each
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import sys
import textwrap
import threading
from typing import Any, Optional

from ...base.files import write_aside
from ...base.typed_numbers import flag_float
from ...base.validate import counted
from ...errors import fold_message
from ..cli.paths import check_output_file
from .exercise import EXERCISES, Exercise, LabError, find_exercise, load_exercises, meant_by_all
from .limits import checked_limits
from .shown import file_name, shortened, shortened_apart
from .archive import a_zip, unpacked
from .submissions import submissions

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lab", help="exercises students solve in code, graded on simulated ranks",
                              description=__doc__.split("\n\n")[0])
    _add_folder(p, EXERCISES)
    p.set_defaults(func=_no_command, _lab_parser=p)
    commands = p.add_subparsers(dest="lab_command", metavar="{list,start,check,grade}")
    p_list = commands.add_parser("list", help="the exercises, one line each")
    p_start = commands.add_parser("start", help="write an exercise's statement and starter")
    p_check = commands.add_parser("check", help="check one submission")
    p_grade = commands.add_parser("grade", help="grade a folder of submissions")
    for sub in (p_list, p_start, p_check, p_grade):  # before or after the command: `lab check ... --exercises D`
        _add_folder(sub, argparse.SUPPRESS)
    numbers = [sub.add_argument("number", metavar="N", help="the exercise's number (spmdsim lab list)")
               for sub in (p_start, p_check, p_grade)]
    p_start.add_argument("dir", metavar="DIR", nargs="?", default=".", help="where to write them (default: .)")
    # check and grade say themselves which of N and FILE (DIR) is missing: argparse, given the file alone (in N),
    # said 'the following arguments are required: FILE'; and `--ranks 4 8 FILE` gives --ranks the file
    for action in (*numbers[1:], p_check.add_argument("file", metavar="FILE", help="the submission: a .py file "
                                                      "defining the exercise's function"),
                   p_grade.add_argument("dir", metavar="DIR", help="the folder of submissions (every .py file "
                                        "in it), or a zip of it")):
        action.required = False  # (still shown, and matched, as one value each)
    for sub in (p_check, p_grade):
        sub.add_argument("--time-limit", type=flag_float, metavar="S", help="seconds of wall time per submission "
                         "(default: the exercise's)")
        sub.add_argument("--memory-mb", type=int, metavar="M", help="MiB of memory per submission "
                         "(default: the exercise's)")
    p_check.add_argument("--ranks", nargs="+", metavar="n", help="rank counts, space- or comma-separated: 4 8 or "
                         "4,8 (default: the exercise's)")
    p_check.add_argument("--mpiexec", action="store_true", help="run each rank count as an mpiexec job (values "
                         "only: calls and bytes are checked on simulated ranks)")
    p_grade.add_argument("--csv", required=True, metavar="OUT", help="the grade book to write")
    p_grade.add_argument("--jobs", type=int, default=2, metavar="J", help="submissions checked at once "
                         "(default 2)")
    for sub, func in ((p_list, _list), (p_start, _start), (p_check, _check), (p_grade, _grade)):
        sub.set_defaults(func=func)


def _add_folder(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--exercises", metavar="DIR", default=default,
                        help="the folder of exercise files (default: the exercises spmdsim ships)")


def _no_command(args: argparse.Namespace) -> int:
    args._lab_parser.print_help()
    return 2


def _list(args: argparse.Namespace) -> int:
    exercises = load_exercises(args.exercises)
    rows = [(e.number, e.title, "ranks " + ",".join(map(str, e.ranks))) for e in exercises]
    room = 100 - 3 - 4 - max((len(r[2]) for r in rows), default=0)  # the title's columns within 100
    width = min(room, max((len(r[1]) for r in rows), default=0))
    for number, title, ranks in rows:
        title = title if len(title) <= width else title[:width - 3] + "..."
        print(f"{number:>3}  {title:<{width}}  {ranks}")
    return 0


def _start(args: argparse.Namespace) -> int:
    exercise = find_exercise(args.number, args.exercises)
    if os.path.exists(args.dir) and not os.path.isdir(args.dir):
        raise LabError(f"{args.dir!r} is a file; expected a folder to write the exercise into "
                       f"(spmdsim lab start {exercise.number} DIR)")
    if not os.path.exists(args.dir) and args.dir.lower().endswith(".py"):  # a file's name: start writes two files
        raise LabError(f"{args.dir!r} names a file; expected a folder: lab start writes {exercise.name}.md and "
                       f"{exercise.name}.py into one (spmdsim lab start {exercise.number} "
                       f"{shlex.quote(os.path.dirname(args.dir) or '.')})")
    parent = os.path.dirname(os.path.abspath(args.dir))
    if not os.path.isdir(args.dir) and not os.path.isdir(parent):  # a mistyped path: not made, parents and all
        raise LabError(f"cannot make the folder {args.dir!r}: its parent {parent!r} does not exist; expected a "
                       f"folder in one that exists (spmdsim lab start {exercise.number} DIR)")
    code = os.path.join(args.dir, f"{exercise.name}.py")
    text = os.path.join(args.dir, f"{exercise.name}.md")
    for path in (code, text):
        if os.path.exists(path):
            raise LabError(f"{path!r} exists: not overwritten (remove it, or give another folder: "
                           f"spmdsim lab start {exercise.number} DIR)")
    task = textwrap.fill(f"Write `{exercise.signature}` in {exercise.name}.py. It runs on "
                         f"{', '.join(map(str, exercise.ranks))} ranks.", 100, break_on_hyphens=False)
    statement = f"# Exercise {exercise.number}: {exercise.title}\n\n{exercise.statement.strip()}\n\n{task}\n"
    _write_start(exercise.number, args.dir, ((text, statement), (code, exercise.starter(_course(args, whole=True)))))
    print(f"wrote {text} (the statement) and {code} (the function to write)")
    print(f"check it with: spmdsim lab check {exercise.number} {shlex.quote(code)}{_course(args)}")
    return 0


def _write_start(number: int, folder: str, files: tuple) -> None:
    """Make `folder` (its parent exists) and write each (path, text) of `files` into it; where the system
    refuses, remove what was written and raise LabError naming the path and why."""
    written = []
    try:
        if not os.path.isdir(folder):
            os.mkdir(folder)
        for path, content in files:
            with open(path, "x") as f:
                written.append(path)
                f.write(content)
    except OSError as exc:
        for path in written:
            with contextlib.suppress(OSError):
                os.remove(path)
        what = f"write {exc.filename!r}" if exc.filename in dict(files) else f"make the folder {folder!r}"
        raise LabError(f"cannot {what}: {exc.strerror or exc}; expected a folder you can write "
                       f"(spmdsim lab start {number} DIR)") from None


#: The most columns a file name takes in a grade's table (of 100): a longer one is shortened in its middle, so
#: that the verdict and the reason after it stay in view (the grade book has it whole).
NAME_COLUMNS = 48
#: The verdict of a student's row with no file to check (the reason says why: "no .py file"); no case ran, so
#: its passed, cases and seconds are left empty.
NOT_GRADED = "NOT GRADED"
#: The most --jobs taken: each is a process of its own, and more at once would fork-bomb the machine.
MOST_JOBS = 1024


def _check(args: argparse.Namespace) -> int:
    # The runner loads the emulator: imported when a check runs, not for `spmdsim --help`.
    from .report import bound_line, verdict_lines, verdict_word
    from .sandbox import check, check_mpiexec, mpiexec_found

    exercise, path, counts = _check_inputs(args)
    if not os.path.isfile(path):
        raise LabError(_not_a_file(path, exercise))
    if path.lower().endswith(".ipynb"):  # (JSON reads as a Python dict: its `null` was said as the student's NameError)
        raise LabError(f"submission {path!r} is a Jupyter notebook; expected a .py file: export the notebook's "
                       f"function as one (jupyter nbconvert --to script {shlex.quote(path)}), then check that")
    ranks = tuple(dict.fromkeys(counts or exercise.ranks))  # each once: `--ranks 2 2` checks 2 ranks
    bad = [n for n in ranks if n not in exercise.ranks]
    if bad:
        raise LabError(f"--ranks {bad[0]!r}: exercise {exercise.number} runs on "
                       f"{', '.join(map(str, exercise.ranks))} ranks")
    limits = checked_limits(args.time_limit, args.memory_mb, max(ranks), exercise, simulated=not args.mpiexec)
    if args.mpiexec and args.memory_mb is not None:
        raise LabError("--memory-mb limits simulated ranks only; under --mpiexec no memory limit is set "
                       "(leave it out, or check without --mpiexec)")
    mpiexec_found() if args.mpiexec else _mpi_module_loads()  # (each refused before the check says what it runs)
    print(bound_line(exercise, path, ranks, limits["time_limit"], args.mpiexec), file=sys.stderr, flush=True)
    verdict = check_mpiexec(exercise, path, ranks, limits["time_limit"]) if args.mpiexec else \
        check(exercise, path, ranks, **limits)
    print("\n".join(verdict_lines(exercise, verdict)))
    return 0 if verdict_word(verdict) == "PASS" else 1


def _not_a_file(path: str, exercise: Any) -> str:
    """Why `path` cannot be checked: not a file; a folder (`lab start`'s, whose file it names)."""
    if not os.path.isdir(path):  # (missing, or a fifo: never read)
        what = "does not exist" if not os.path.exists(path) else "is not a file"
        return f"submission {path!r} {what}; expected the .py file that defines {exercise.signature}"
    mine = os.path.join(path, f"{exercise.name}.py")
    return (f"submission {path!r} is a folder; expected the file to check, such as {mine!r} (spmdsim lab check "
            f"{exercise.number} {mine})")


def _grade(args: argparse.Namespace) -> int:
    exercise = _grade_inputs(args)
    if not 1 <= args.jobs <= MOST_JOBS:
        raise LabError(f"--jobs {args.jobs!r} is out of range; expected 1 to {MOST_JOBS:,}")
    _writable(args.csv, args.dir)
    limits = checked_limits(args.time_limit, args.memory_mb, max(exercise.ranks), exercise)
    with unpacked(args.dir) as folder:  # (a zip: its temporary folder, removed after)
        return _grade_folder(args, exercise, limits, folder)


def _grade_folder(args: argparse.Namespace, exercise: Exercise, limits: dict, folder: str) -> int:
    """Grade the submissions of `folder` (args.dir, or the folder its zip unpacked to): the table on stdout, the
    grade book written, progress on stderr."""
    import concurrent.futures  # (a thread pool: `spmdsim --help` loads none)
    import time

    from .report import CSV_HEADER, csv_row  # (the runner: imported when a grade runs)
    from .sandbox import check, reference_failure

    failing = reference_failure(exercise, limits) if args.exercises != EXERCISES else None
    if failing:  # an instructor's exercise whose own solution fails: every submission would, for the same reason
        raise LabError(f"exercise {exercise.number}'s own solution fails its check, so every submission would: "
                       f"{failing}; fix {exercise.path} first")
    entries = submissions(folder, f"{exercise.name}.py", args.dir)  # (says what it leaves out: the options good)
    files = [entry for entry in entries if isinstance(entry, str)]  # (the others: students not graded, and why)
    _mpi_module_loads()
    limit = exercise.time_limit if limits["time_limit"] is None else limits["time_limit"]
    at_once = f"{min(args.jobs, len(files))} at a time, each " if len(files) > 1 else ""  # (one: no "2 at a time")
    print(f"grading {counted(len(files), 'submission')} of exercise {exercise.number}, {at_once}stopped {limit:g} s "
          "after its first case starts", file=sys.stderr)
    cores = os.cpu_count() or 1
    if min(args.jobs, len(files)) > cores:  # the limit is wall time: checks sharing a core each get less
        print(f"note: --jobs {args.jobs} on {counted(cores, 'core')}: the checks share them, and a "
              f"right but busy submission may run out of its {limit:g} s (--jobs {cores} or fewer, or a longer "
              "--time-limit)", file=sys.stderr)
    began, done, stop = time.monotonic(), {}, threading.Event()  # done: path -> its grade-book row
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        pending = {pool.submit(check, exercise, path, **limits, stop=stop): path for path in files}
        try:
            for future in concurrent.futures.as_completed(pending):
                path = pending[future]  # a student's folder named with its file (alice/ring_allreduce.py)
                label = "/".join(map(file_name, os.path.relpath(path, folder).split(os.sep)))
                row = done[path] = (label, *csv_row(future.result())[1:])
                print(f"  {len(done)} of {len(files)}: {shortened(row[0], NAME_COLUMNS)} {row[1]} ({row[5]} s)",
                      file=sys.stderr)
        except KeyboardInterrupt:  # the checks running kill their submissions; the others never start
            stop.set()
            pool.shutdown(cancel_futures=True)
            print(f"stopped after {len(done)} of {len(files)} submissions: {args.csv} not written",
                  file=sys.stderr)
            raise
    rows = [done[entry] if isinstance(entry, str) else (entry.label, NOT_GRADED, "", "", entry.reason, "")
            for entry in entries]
    passed, unread = (sum(row[1] == word for row in rows) for word in ("PASS", NOT_GRADED))
    for line in _table(rows, unread):  # (first: before the grade book)
        print(line if len(line) <= 100 else line[:97] + "...")
    print(f"{passed} of {len(rows)} submissions pass" + (f", {unread} not graded" if unread else ""))  # (the table's)
    meant = meant_by_all([row[4] for row in rows if row[1] != NOT_GRADED])
    if meant is not None:
        print(fold_message(f"note: every submission defines exercise {meant}'s function, not exercise "
                           f"{exercise.number}'s: grade them with `spmdsim lab grade {meant} "
                           f"{shlex.quote(args.dir)} --csv {shlex.quote(args.csv)}{_course(args)}`"), file=sys.stderr)
    _write_book(args.csv, [CSV_HEADER, *rows])
    print(f"graded in {time.monotonic() - began:.1f} s; grade book: {args.csv}", file=sys.stderr)
    return 0


def _table(rows: list, unread: int) -> list:
    """The grade's table: a header row naming its columns (file, verdict, passed/cases as `cases`, reason), then
    a line per grade-book row."""
    width = min(NAME_COLUMNS, max(len("file"), *(len(row[0]) for row in rows)))
    wide = len(NOT_GRADED) if unread else len("verdict")  # (the verdicts' column: NOT GRADED beside PASS)
    lines = [f"{'file':<{width}}  {'verdict':<{wide}}  cases  reason"]
    for row, name in zip(rows, shortened_apart([row[0] for row in rows], width)):
        counts = f"{row[2]:>2}/{row[3]:<2}" if row[1] != NOT_GRADED else " -/- "
        lines.append(f"{name:<{width}}  {row[1]:<{wide}}  {counts}  {row[4]}")
    return lines


def _write_book(path: str, rows: list) -> None:
    """Write the grade book beside `path` and rename it onto it: a reader, a crash or a second grade finishing
    at once never leaves half a grade book or two interleaved (a device or a pipe, /dev/stdout, is written in
    place). A write that fails after the grade (a full disk, which _writable cannot foresee) is said in one line
    naming `path`, its part written removed: no grade book short of rows is read as whole."""
    import csv  # (the CSV writer: `spmdsim --help` does not load it)

    why = write_aside(path, lambda f: csv.writer(f).writerows(rows), text=True)  # (spmdsim.base.files)
    if why:
        raise LabError(f"--csv {path!r}: the grade book was not written: {why} (its rows are the table above; give "
                       "a path on a disk with room)")


#: A value of --ranks that is rank counts ("4", "4,8").
_COUNTS = re.compile(r"\d+(?:,\d+)*")
#: A value of --ranks meant as numbers ("-1", "4.5"): refused as a count, never taken for the file.
_NUMBERS = re.compile(r"[\d\s,.+-]*")
#: The head of a starter `lab start` writes: its docstring names its exercise ("Exercise 5: ...").
_STARTER = re.compile(r'\s*[rRuU]?(?:"""|\'\'\')\s*Exercise (\d+):')


def _check_inputs(args: argparse.Namespace) -> tuple:
    """(the exercise, FILE, the rank counts --ranks gives) of `lab check`; N or FILE missing refused in one line
    saying which. FILE is taken from the end of --ranks, where argparse put it (`--ranks 4 8 FILE`)."""
    values = list(args.ranks or ())
    path = args.file
    if path is None and values and not _NUMBERS.fullmatch(values[-1]):
        path = values.pop()
    if args.number is None:
        raise LabError("lab check needs the exercise's number and the submission's file" +
                       (", before --ranks: spmdsim lab check N FILE --ranks n" if values else
                        ": spmdsim lab check N FILE (spmdsim lab list lists the exercises)"))
    if path is None and _a_path(args.number):
        named = _starter_number(args.number)
        raise LabError(f"lab check needs the exercise's number before the file: spmdsim lab check {named or 'N'} "
                       f"{shlex.quote(args.number)}{_course(args)}" + (
                           f" (its docstring names exercise {named})" if named else
                           " (spmdsim lab list lists the exercises)"))
    exercise = find_exercise(args.number, args.exercises)
    if path is None:
        raise LabError(f"lab check needs the submission's file after the exercise's number: spmdsim lab check "
                       f"{exercise.number} FILE")
    bad = next((value for value in values if not _COUNTS.fullmatch(value)), None)
    if bad is not None:
        raise LabError(f"--ranks {bad!r} is not a rank count; expected whole numbers, space- or comma-separated "
                       "(--ranks 4 8, or --ranks 4,8)")
    return exercise, path, tuple(int(n) for value in values for n in value.split(","))


def _grade_inputs(args: argparse.Namespace) -> Exercise:
    """The exercise of `lab grade`; N or DIR missing refused in one line saying which, and a file for DIR."""
    csv = shlex.quote(args.csv)
    if args.number is None:
        raise LabError(f"lab grade needs the exercise's number and the folder of submissions: spmdsim lab grade "
                       f"N DIR --csv {csv}")
    if args.dir is None and _a_path(args.number):
        raise LabError(f"lab grade needs the exercise's number before the folder: spmdsim lab grade N "
                       f"{shlex.quote(args.number)} --csv {csv} (spmdsim lab list lists the exercises)")
    exercise = find_exercise(args.number, args.exercises)
    if args.dir is None:
        raise LabError(f"lab grade needs the folder of submissions after the exercise's number: spmdsim lab grade "
                       f"{exercise.number} DIR --csv {csv}")
    if os.path.isfile(args.dir) and not a_zip(args.dir):
        if args.dir.lower().endswith(".zip"):
            raise LabError(f"{args.dir!r} is not a zip file that can be read (cut short, or damaged?); expected a "
                           "zip of the submissions, or their folder")
        raise LabError(f"lab grade takes a folder of submissions (or a zip of one), and {args.dir!r} is a file; "
                       f"for one file: spmdsim lab check {exercise.number} {shlex.quote(args.dir)}{_course(args)}")
    return exercise


def _a_path(value: str) -> bool:
    """Whether N, as given, is a path (a file or folder given without the number before it)."""
    return not value.isdigit() and (value.endswith(".py") or os.sep in value or os.path.exists(value))


def _starter_number(path: str) -> Optional[str]:
    """The exercise a starter's docstring names ("Exercise 5: ...", as `lab start` writes it), or None."""
    if not os.path.isfile(path):  # (not a fifo: its read would wait)
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except (OSError, ValueError):
        return None
    match = _STARTER.match(head)
    return str(int(match.group(1))) if match else None


def _course(args: argparse.Namespace, whole: bool = False) -> str:
    """The --exercises flag to repeat in a command said back: "" for the exercises spmdsim ships; `whole`: the
    folder by its whole path (a starter file's, read from wherever it is moved)."""
    folder = os.path.abspath(args.exercises) if whole else args.exercises
    return "" if args.exercises == EXERCISES else f" --exercises {shlex.quote(folder)}"


def _writable(path: str, folder: str) -> None:
    """Refuse, before any submission runs, a grade book that cannot be written (spmdsim.tools.cli.paths: a file
    tried in its folder, as os.access says yes to root and to /proc), or that would replace a submission: one in
    the submission folder `folder` (where a next grade would take it for one), or a .py file that exists."""
    if os.path.isdir(path):
        raise LabError(f"--csv {path!r} is a folder; expected a file to write the grade book to")
    if os.path.realpath(os.path.dirname(os.path.abspath(path))) == os.path.realpath(folder):
        raise LabError(f"--csv {path!r} is in the submission folder {folder!r}; expected a path outside it (a "
                       "grade book there would replace a submission, or be graded as one)")
    if path.endswith(".py") and os.path.exists(path):
        raise LabError(f"--csv {path!r} is a .py file that exists; expected a grade book file (grades.csv), not "
                       "code to overwrite")
    check_output_file(path, "--csv")


def _mpi_module_loads() -> None:
    """Refuse in one line (exit 2) where mpi4py's MPI module does not load: the simulated ranks take MPI's
    constants and datatypes from it, and every case of every submission, right ones too, failed with
    'a rank raised RuntimeError: cannot load MPI library' (a grade book of zeros)."""
    from ...runtime.mpi_library import load_mpi  # (CLI start-up: loaded when a check runs)

    load_mpi(why="spmdsim lab's ranks take MPI's constants, datatypes and exceptions from it")
