"""spmdsim lab's notes on a submission's source: what may change its grade from run to run, beside the verdict."""
from __future__ import annotations

import csv

import pytest

from spmdsim.tools.cli.main import main
from spmdsim.tools.lab import load_exercises
from spmdsim.tools.lab.source_notes import source_notes

#: An instructor's exercise with one case at one rank: a check of a few tenths of a second.
TINY = '''
import numpy as np
TITLE = "Double it"
FUNCTION = "double"
SIGNATURE = "double(comm, x)"
STATEMENT = "Return 2 * x on every rank."
RANKS = (1,)
SEEDS = (0,)
TIME_LIMIT = 10
def case(seed, n):
    return {"args": [(np.arange(3.0),)], "expected": [2 * np.arange(3.0)]}
def double(comm, x):
    return 2 * x
'''


#: source -> the start of each note it gets
SOURCES = [
    ("import random\ndef double(comm, x):\n    return 2 * x if random.random() < 2 else x\n",
     ["note: line 3 draws from random.random, which no seed fixes: its result, and so its grade, may change"]),
    ("import numpy as np\ndef double(comm, x):\n    return 2 * x + 0 * np.random.rand()\n",
     ["note: line 3 draws from numpy.random.rand, which no seed fixes"]),
    ("from numpy.random import default_rng\ndef double(comm, x):\n    return 2 * x + 0 * default_rng().random()\n",
     ["note: line 3 draws from numpy.random.default_rng(), which no seed fixes"]),
    ("from random import randint as r\ndef double(comm, x):\n    return 2 * x + 0 * r(0, 9)\n",
     ["note: line 3 draws from random.randint"]),
    ("import time\ndef double(comm, x):\n    t = time.time()\n    while time.time() - t < 0.01:\n        pass\n"
     "    return 2 * x\n",
     ["note: line 4 branches on time.time(): what the submission does depends on how fast it runs"]),
    # a seeded generator, a seeded module, a clock read that no condition asks: no note
    ("import numpy as np\ndef double(comm, x):\n    return 2 * x + 0 * np.random.default_rng(0).random()\n", []),
    ("import random\nrandom.seed(1)\ndef double(comm, x):\n    return 2 * x + 0 * random.random()\n", []),
    ("import numpy as np\nnp.random.seed(1)\ndef double(comm, x):\n    return 2 * x + 0 * np.random.rand()\n", []),
    ("import time\ndef double(comm, x):\n    t = time.time()\n    print(time.time() - t)\n    return 2 * x\n", []),
    ("def double(comm, x)\n    return 2 * x\n", []),  # (a syntax error: its check says so, no note)
]


@pytest.mark.parametrize("source, notes", SOURCES, ids=[str(i) for i in range(len(SOURCES))])
def test_the_source_notes_an_unseeded_draw_and_a_branch_on_a_clock(tmp_path, source, notes):
    path = tmp_path / "sub.py"
    path.write_text(source)
    got = source_notes(str(path))
    assert len(got) == len(notes), got
    for note, start in zip(got, notes):
        assert note.startswith(start), note


WORLD = "note: line {line} uses MPI.COMM_WORLD, not the communicator double() is given ({comm}): the check gives it"

#: source -> the line of its COMM_WORLD note and the communicator's name, or None: no note
WORLDS = [
    ("from mpi4py import MPI\ndef double(comm, x):\n    return 2 * x * MPI.COMM_WORLD.Get_size() ** 0\n", (3, "comm")),
    ("from mpi4py import MPI\nworld = MPI.COMM_WORLD\ndef double(c, x):\n    return 2 * x\n", (2, "c")),
    ("from mpi4py.MPI import COMM_WORLD as W\ndef double(comm, x):\n    W.Barrier()\n    return 2 * x\n",
     (3, "comm")),
    # the file's own test run, which a check never runs: no note
    ("from mpi4py import MPI\ndef double(comm, x):\n    return 2 * x\nif __name__ == '__main__':\n"
     "    print(double(MPI.COMM_WORLD, 1))\n", None),
]


@pytest.mark.parametrize("source, expected", WORLDS, ids=[str(i) for i in range(len(WORLDS))])
def test_the_source_notes_mpi_comm_world_in_place_of_the_communicator_given(tmp_path, source, expected):
    path = tmp_path / "sub.py"
    path.write_text(source)
    got = source_notes(str(path), "double")
    if expected is None:
        assert got == ()
    else:
        assert len(got) == 1 and got[0].startswith(WORLD.format(line=expected[0], comm=expected[1])), got
        assert got[0].endswith(f"would get the world's ranks; use {expected[1]}"), got


@pytest.mark.parametrize("exercise", load_exercises(), ids=lambda e: str(e.number))
def test_no_exercises_own_solution_gets_a_note(exercise):
    assert source_notes(exercise.path, exercise.function) == ()


def test_a_note_is_said_beside_the_verdict_in_a_check_and_a_grade_book(tmp_path, capsys, monkeypatch):
    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "01_double.py").write_text(TINY)
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "lucky.py").write_text(SOURCES[0][0])
    monkeypatch.chdir(tmp_path)
    assert main(["lab", "check", "1", "subs/lucky.py", "--exercises", "course"]) == 0  # its PASS stays
    out = capsys.readouterr().out
    assert "PASS: passes at 1 rank (1 of 1 cases" in out
    assert "note: line 3 draws from random.random, which no seed fixes" in out.replace("\n  ", " ")
    assert main(["lab", "grade", "1", "subs", "--csv", "book.csv", "--exercises", "course"]) == 0
    assert "grading 1 submission of exercise 1, stopped 10 s" in capsys.readouterr().err
    row, = csv.DictReader((tmp_path / "book.csv").open())
    assert row["verdict"] == "PASS" and row["reason"].startswith("note: line 3 draws from random.random"), row
