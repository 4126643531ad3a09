"""A first MPI lab under `spmdsim mpirun -n 4`: students' programs, right and wrong, as mpiexec runs them.

The programs are in tests/data/lab/. The right ones print under `spmdsim mpirun`
the lines they print under MPICH's `mpiexec -n 4` (in any order); the wrong ones
end with the one-line report docs/simulate.md shows ("What the simulator does
where MPI would hang or abort"), where MPI hangs or aborts.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from spmdsim.cli.main import main
from testkit import MPIEXEC

LAB = Path(__file__).resolve().parent / "data" / "lab"
ARGS = {"argv_files.py": ["inputs.txt"]}
SAME_AS_MPICH = ["hello.py", "ring_objects.py", "ring_buffers.py", "sendrecv.py", "any_source.py",
                 "collectives_objects.py", "collectives_buffers.py", "reduce_ops.py", "nonblocking.py",
                 "split.py", "pi.py", "main_guard.py", "argv_files.py", "truncate_caught.py"]


def _per_rank_lines(out: str) -> list:
    """The lines of `mpiexec -prepend-rank` output, each rank's chunks joined first (MPICH interleaves
    chunks of different ranks within a line)."""
    parts = re.split(r"\[(\d+)\] ", out)
    texts: dict = {}
    for rank, chunk in zip(parts[1::2], parts[2::2]):
        texts[rank] = texts.get(rank, "") + chunk
    return sorted(line for text in texts.values() for line in text.splitlines())


def _mpirun(capsys, *command: str) -> tuple:
    code = main(["mpirun", "-n", "4", "python", *command])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def in_lab(tmp_path, monkeypatch):
    """A lab directory as cwd: the input file argv_files.py reads by a relative path."""
    (tmp_path / "inputs.txt").write_text("1 2 3\n4 5 6\n7 8 9\n10 11 12\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec beside this Python (pip install -e '.[mpi]')")
@pytest.mark.parametrize("name", SAME_AS_MPICH)
def test_right_programs_print_what_mpiexec_prints(name, in_lab, capsys):
    script = str(LAB / name)
    mpi = subprocess.run(["timeout", "-k", "5", "120", MPIEXEC, "-n", "4", "-prepend-rank", sys.executable, script,
                          *ARGS.get(name, [])], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert mpi.returncode == 0, mpi.stderr
    code, out, err = _mpirun(capsys, script, *ARGS.get(name, []))
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == _per_rank_lines(mpi.stdout) and out.strip()


def test_user_ops_made_by_every_rank_and_python_functions(capsys):
    # Each rank runs MPI.Op.Create itself (a handle per rank): not a mismatch. mpi4py's lowercase
    # reductions take a plain function of two objects.
    code, out, err = _mpirun(capsys, str(LAB / "reduce_ops.py"))
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == [f"rank {r}: max={3.5 if r == 0 else None} minloc=(0.5, 0) maxloc=(3.5, 1) "
                                        f"Allreduce MAX=3.5 absmax=-3.0 lambda=0123" for r in range(4)]


def test_the_mpi4py_runner_and_dash_c(in_lab, capsys):
    # `python -m mpi4py script.py` (its -rc options configure MPI_Init) and `python -c`: mpi4py's runner
    # used to rewrite the one sys.argv every rank shares and to arm the real MPI's abort at exit.
    script = str(LAB / "argv_files.py")
    for runner in (["-m", "mpi4py"], ["-m", "mpi4py", "-rc", "thread_level=single"], ["-m", "mpi4py.run"]):
        code, out, err = _mpirun(capsys, *runner, script, "inputs.txt")
        assert (code, err) == (0, "")
        assert sorted(out.splitlines())[0] == ("rank 0: argv0=argv_files.py args=['inputs.txt'] line=[1, 2, 3] "
                                               "sum=78")
    code, out, err = _mpirun(capsys, "-c", "import sys; from mpi4py import MPI; "
                                            "print(MPI.COMM_WORLD.rank, sys.argv, '__file__' in globals())", "x")
    assert (code, err) == (0, "")
    assert sorted(out.splitlines()) == [f"{r} ['-c', 'x'] False" for r in range(4)]
    code, out, err = _mpirun(capsys, "-m", "mpi4py", "-", script)
    assert code == 2 and "(the program from stdin) is not supported" in err


def test_file_is_absolute_as_python_sets_it(in_lab, capsys):
    (in_lab / "where.py").write_text("import os\nprint(os.path.isabs(__file__), os.path.basename(__file__))\n")
    code, out, err = _mpirun(capsys, "where.py")
    assert (code, err) == (0, "")
    assert out.splitlines() == ["True where.py"] * 4
