"""What a check says of a student's typical mistakes in words that are not the student's own: MPICH's error
stacks, the emulator's long messages, test code left at a submission's top level, an MPI call on one rank."""
from __future__ import annotations

import csv
import json

from spmdsim.tools.cli.main import main
from spmdsim.tools.lab.failure import _first_line


def _check(course, name: str, source: str, capsys, *ranks: str) -> str:
    """The stdout of `spmdsim lab check 1 NAME` of `source`, its folded lines joined."""
    (course / name).write_text(source)
    main(["lab", "check", "1", name, "--exercises", "course", *(("--ranks", *ranks) if ranks else ())])
    return " ".join(capsys.readouterr().out.split())


def test_an_mpich_error_stack_is_said_by_its_last_line_not_error_stack(course, capsys):
    """A call on the MPI.COMM_NULL a Split of color MPI.UNDEFINED gives reaches MPICH, whose message's first line
    is "Invalid communicator, error stack:": the reason ended there, the cause unsaid."""
    out = _check(course, "null.py", "from mpi4py import MPI\ndef double(comm, x):\n"
                 "    sub = comm.Split(MPI.UNDEFINED, 0)\n    sub.Barrier()\n    return 2 * x\n", capsys, "2")
    assert "FAIL every rank raised MPI.Exception at line 4: Invalid communicator: Null communicator" in out, out
    assert "error stack" not in out


def test_mpichs_truncation_under_mpiexec_is_said_with_its_detail():
    """Under --mpiexec a Recv into too small a buffer was said "Message truncated, error stack:", then with MPICH's
    detail, whose sizes MPICH 5.0.2 gives the other way round ("20 bytes received but buffer size is 40" of a
    40-byte message into Recv's 5 floats): said the right way round, whichever way MPICH gives them."""
    message = ("Message truncated, error stack:\ninternal_Recv_c(339).....: MPI_Recv_c(buf=0x55, count=5, "
               "MPI_FLOAT, 1, MPI_ANY_TAG, MPI_COMM_WORLD, status=0x1) failed\nMPIR_Wait(745)...........: \n"
               "MPIDIG_recv_type_init(74): Message from rank 1 and tag 0 truncated; 20 bytes received but buffer "
               "size is 40")
    said = ("Message truncated: rank 1's message (tag 0) is 40 bytes, the buffer receiving it 20: receive with a "
            "buffer of at least 40 bytes")
    assert _first_line(message) == said  # (MPICH's sizes swapped: its count=5 floats are the 20-byte buffer)
    assert _first_line(message.replace("20 bytes received but buffer size is 40",
                                       "40 bytes received but buffer size is 20")) == said
    assert _first_line("Invalid rank, error stack:") == "Invalid rank"


def test_a_recv_into_too_small_a_buffer_under_mpiexec_names_both_sizes_the_right_way(course, capsys):
    """MPICH 5.0.2 said a 40-byte message into a 20-byte Recv "20 bytes received but buffer size is 40"."""
    out = _check(course, "small.py", "import numpy as np\ndef double(comm, x):\n    if comm.Get_rank() == 0:\n"
                 "        comm.Send(np.ones(10, np.float32), dest=1)\n    else:\n"
                 "        comm.Recv(np.empty(5, np.float32), source=0)\n    return 2 * x\n", capsys, "2", "--mpiexec")
    assert ("FAIL rank 1 raised MPI.Exception at line 6: Message truncated: rank 0's message (tag 0) is 40 bytes, "
            "the buffer receiving it 20: receive with a buffer of at least 40 bytes") in out, out


#: What a check under --mpiexec says of a message its receive buffer cannot hold, where MPICH's stack says no more.
TRUNCATED = ("Message truncated: the message is larger than the buffer receiving it: receive with a buffer at least "
             "the message's size, or with comm.recv, which takes any size")


def test_mpichs_bare_truncation_is_said_with_what_to_do(course, capsys):
    """A pickled object past MPICH's eager limit into irecv's own 32 KiB buffer ends MPICH's stack in
    "(unknown)(): Message truncated", naming neither size: it was said "Message truncated: (unknown)(): Message
    truncated"."""
    message = ("Message truncated, error stack:\ninternal_Wait(105): MPI_Wait(request=0x7f96424a01d0, "
               "status=0x7f9642442480) failed\nMPIR_Wait(745)....: \n(unknown)(): Message truncated")
    assert _first_line(message) == TRUNCATED
    out = _check(course, "big.py", "def double(comm, x):\n    if comm.Get_rank() == 0:\n"
                 "        comm.send(list(range(100000)), dest=1)\n    else:\n        comm.irecv(source=0).wait()\n"
                 "    return 2 * x\n", capsys, "2", "--mpiexec")
    assert f"FAIL rank 1 raised MPI.Exception at line 5: {TRUNCATED}" in out, out


def test_the_emulators_long_message_keeps_its_advice(course, capsys):
    """The emulator's message for an object received into an array ends with what to do; cut at 200 characters
    it ended "or send an array with S... (203 characters)"."""
    out = _check(course, "obj.py", "import numpy as np\ndef double(comm, x):\n    if comm.Get_rank() == 0:\n"
                 "        comm.send('hi', dest=1)\n"
                 "    else:\n        comm.Recv(np.empty(3), source=0)\n    return 2 * x\n", capsys, "2")
    assert "rank 1 raised MPI.Exception at line 6: Invalid datatype: rank 0 sends" in out, out
    assert "receive it with recv(), or send an array with Send" in out and "characters)" not in out, out


def test_test_code_at_the_files_top_level_is_noted(course, capsys):
    """A student tries the function at the bottom of the file: a check runs that code on every rank as it loads
    the file, where a send of it is taken by the function's receive; the note named MPI.COMM_WORLD only, saying
    the function did not use its communicator, which it did."""
    source = ("import numpy as np\nfrom mpi4py import MPI\ndef double(comm, x):\n    return 2 * x\n"
              "comm = MPI.COMM_WORLD\nprint(double(comm, np.ones(2)))\n")
    out = _check(course, "tries.py", source, capsys)
    assert "PASS" in out and "MPI.COMM_WORLD, not the communicator" not in out, out
    assert ("note: line 6 calls double() at the file's top level: a check runs that line on every rank as it loads "
            "the file, before it calls double() itself; put the code that tries the function under "
            '`if __name__ == "__main__":`') in out, out
    guarded = source.replace("comm = MPI", 'if __name__ == "__main__":\n    comm = MPI').replace("print(", "    print(")
    out = _check(course, "guarded.py", guarded, capsys)
    assert "PASS" in out and "note" not in out, out
    out = _check(course, "sends.py", "from mpi4py import MPI\ndef double(comm, x):\n    return 2 * x\n"
                 "if MPI.COMM_WORLD.Get_rank() == 0:\n    MPI.COMM_WORLD.send('hi', dest=0)\n", capsys, "1")
    assert "note: line 5 calls MPI.COMM_WORLD.send() at the file's top level" in out, out
    out = _check(course, "main.py", "from mpi4py import MPI\nimport numpy as np\ndef double(comm, x):\n"
                 "    return 2 * x\ndef table(n):\n    return np.arange(n)\nROWS = table(3)\ndef main():\n"
                 "    print(double(MPI.COMM_WORLD, ROWS))\nmain()\n", capsys, "1")
    assert "note: line 10 calls main() at the file's top level" in out and "line 7" not in out, out
    out = _check(course, "folds.py", "import functools\nimport numpy as np\nTOTAL = functools.reduce(max, [1, 2])\n"
                 "MOST = np.maximum.reduce([1, 2])\ndef double(comm, x):\n    return 2 * x\n", capsys, "1")
    assert "PASS" in out and "note" not in out, out


def test_a_function_that_uses_the_world_is_still_noted_beside_top_level_code(course, capsys):
    source = ("from mpi4py import MPI\ndef double(comm, x):\n    return 2 * x * MPI.COMM_WORLD.Get_size() / "
              "comm.Get_size()\nprint(double(MPI.COMM_WORLD, 1.0))\n")
    out = _check(course, "world.py", source, capsys, "1")
    assert "note: line 4 calls double() at the file's top level" in out, out
    assert "note: line 3 uses MPI.COMM_WORLD, not the communicator double() is given (comm)" in out, out


def test_a_rank_outside_a_one_rank_communicator_is_said_in_the_singular(course, capsys):
    out = _check(course, "peer.py", "def double(comm, x):\n    comm.send(x, dest=1)\n    return 2 * x\n", capsys,
                 "1")
    assert "Invalid rank: dest rank 1 is outside the communicator of 1 rank (0, or MPI.PROC_NULL)" in out, out


def test_mpi_init_at_the_top_of_a_submission_says_mpi4py_did_it(course, capsys):
    """A student who learned MPI in C calls MPI.Init(); mpi4py initialized MPI at its import, and the check said
    only MPICH's "Cannot call MPI_INIT or MPI_INIT_THREAD more than once"."""
    out = _check(course, "init.py", "from mpi4py import MPI\nMPI.Init()\ndef double(comm, x):\n    return 2 * x\n",
                 capsys)
    assert ("raised MPI.Exception at line 2: Other MPI error: Cannot call MPI_INIT or MPI_INIT_THREAD more than once "
            "(mpi4py calls MPI_Init as a program imports mpi4py.MPI: drop this call, or set mpi4py.rc.initialize = "
            "False before that import)") in out, out


def test_a_deadlock_in_the_grade_book_says_why_the_ranks_wait(course, capsys):
    """The grade book said "deadlock at 1 rank: rank 0 waits in send to group rank 0 ... (a message of 24 bytes)"
    and no more: a reader who knows that MPICH buffers such a Send could not tell why it waits."""
    (course / "s").mkdir()
    (course / "s" / "first.py").write_text(
        "import numpy as np\ndef double(comm, x):\n    y = np.empty_like(x)\n    comm.Send(x, dest=comm.Get_rank())\n"
        "    comm.Recv(y, source=comm.Get_rank())\n    return 2 * y\n")
    assert main(["lab", "grade", "1", "s", "--csv", "g.csv", "--exercises", "course"]) == 0
    [row] = list(csv.DictReader((course / "g.csv").open()))
    assert row["reason"].startswith("deadlock at 1 rank: rank 0 waits in send to group rank 0 (tag 0)"), row
    assert row["reason"].endswith("(a message of 24 bytes) at line 4; no standard Send is buffered here (eager limit "
                                  "0): the program relies on MPI buffering its standard Sends, which the MPI standard "
                                  "calls unsafe (it deadlocks once the messages outgrow MPI's buffer, or under another "
                                  "MPI): post the receive first on one side, or use Sendrecv or Isend/Irecv"), row


def test_checking_a_jupyter_notebook_is_refused_saying_to_export_it(course, capsys):
    """A notebook's JSON reads as a Python dict, so a check ran it and said "every rank raised NameError at line 15:
    name 'null' is not defined", a line of no file the student wrote."""
    cell = {"cell_type": "code", "metadata": {}, "source": ["def double(comm, x):\n", "    return 2 * x\n"],
            "outputs": [], "execution_count": None}
    (course / "work.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4}, indent=1))
    assert main(["lab", "check", "1", "work.ipynb", "--exercises", "course"]) == 2
    said = capsys.readouterr()
    assert " ".join(said.err.split()) == (
        "spmdsim: error: submission 'work.ipynb' is a Jupyter notebook; expected a .py file: export the notebook's "
        "function as one (jupyter nbconvert --to script work.ipynb), then check that"), said.err
    assert said.out == ""


def test_a_recursion_without_end_names_the_function_not_the_checks_hook(course, capsys):
    """A recursion without a base case was said "maximum recursion depth exceeded in comparison": the comparison
    was in the check's own profile hook, which notes each call."""
    out = _check(course, "deep.py", "def twice(n):\n    return twice(n + 1)\ndef double(comm, x):\n"
                 "    return twice(x)\n", capsys, "1")
    assert "FAIL rank 0 raised RecursionError at line 1: maximum recursion depth exceeded in twice(), which calls " \
           "itself without end (or deeper than Python allows)" in out, out
    out = _check(course, "nested.py", "import pickle\ndef double(comm, x):\n    deep = []\n    for _ in range(10**5):\n"
                 "        deep = [deep]\n    pickle.dumps(deep)\n    return 2 * x\n", capsys, "1")
    assert "rank 0 raised RecursionError at line 6: maximum recursion depth exceeded" in out, out
    assert "calls itself" not in out, out
