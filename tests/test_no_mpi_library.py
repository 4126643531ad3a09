"""A laptop whose mpi4py finds no MPI library (installed without the 'mpi' extra and with no system MPI).

mpi4py's wheels install without one and look for it when ``mpi4py.MPI`` is imported, raising
``RuntimeError: cannot load MPI library`` and a line per file tried. Simulated ranks need no MPI
library, so programs on them run; what needs one (MPI ranks, the mpi4py emulator, which borrows
mpi4py's constants) says so in one line with the way on. Each case runs in a child process whose
``mpi4py.MPI`` import fails as that wheel's does.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NO_LIBMPI = textwrap.dedent("""\
    import sys

    class NoLibmpi:  # what mpi4py's wheel raises when it finds no libmpi
        def find_spec(self, name, path=None, target=None):
            if name == "mpi4py.MPI":
                raise RuntimeError("cannot load MPI library\\nlibmpi.so: cannot open shared object file")

    sys.meta_path.insert(0, NoLibmpi())
    """)


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_LIBMPI + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def test_dtensor_program_on_simulated_ranks_needs_no_mpi_library(tmp_path):
    # spmdsim.world() on a simulated rank once asked mpi4py for its error handler: every example's
    # `--ranks N` failed with the wheel's RuntimeError on every rank.
    run = _run("""
        import numpy as np
        import spmdsim
        from spmdsim import DTensor, Layout, Mesh

        def main():
            comm = spmdsim.world()
            mesh = Mesh(Layout((comm.size,), ("tp",)), comm)
            X, W = np.arange(12.0).reshape(3, 4), np.arange(8.0).reshape(4, 2)
            y = (DTensor.from_global(mesh, X, mesh.layout(None, "tp"))
                 @ DTensor.from_global(mesh, W, mesh.layout("tp", None)))
            return bool(y.check(X @ W)), comm.Get_size()

        print(spmdsim.simulate(2, main), "mpi4py.MPI" in sys.modules)
        """, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "[(True, 2), (True, 2)] False\n"


def test_mpirun_says_in_one_line_that_it_needs_an_mpi_library(tmp_path):
    (tmp_path / "prog.py").write_text("from mpi4py import MPI\nprint(MPI.COMM_WORLD.rank)\n")
    run = _run("""
        from spmdsim.tools.cli.main import main
        sys.exit(main(["mpirun", "-n", "2", "prog.py"]))
        """, tmp_path)
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.replace("\n  ", " ") == (
        "spmdsim mpirun: error: mpi4py's MPI module does not load here (RuntimeError: cannot load MPI "
        "library): spmdsim mpirun's ranks take MPI's constants, datatypes and exceptions from it; install "
        "the 'mpi' extra (pip install mpich), or use your system's MPI\n")


def test_command_on_mpi_ranks_names_ranks_flag_in_one_line(tmp_path):
    run = _run("""
        from spmdsim.tools.cli.main import main
        sys.exit(main(["collective", "ring-allreduce", "--size", "64"]))
        """, tmp_path)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.replace("\n  ", " ") == (
        "spmdsim: error: mpi4py's MPI module does not load here (RuntimeError: cannot load MPI library): "
        "add --ranks N to run on simulated ranks, which need no MPI library, or install the 'mpi' extra "
        "(pip install mpich), or use your system's MPI\n")


def test_a_script_run_without_ranks_ends_with_one_line(tmp_path):
    # `python prog.py` of a script that needs MPI ranks (spmdsim.world() outside a simulation) ended in a traceback
    # through spmdsim whose last line was the clear one; now that line alone, naming the program (exit 1).
    # script(__file__, ranks=8) (the examples'): that line alone too, not the 1-rank hint before it
    for call in ("spmdsim.script(__file__)", "spmdsim.script(__file__, ranks=8)"):
        (tmp_path / "prog.py").write_text(f"import spmdsim\n{call}\ncomm = spmdsim.world()\nprint(comm.Get_size())\n")
        run = _run("""
            import runpy
            sys.argv = ["prog.py"]
            runpy.run_path("prog.py", run_name="__main__")
            """, tmp_path)
        assert run.returncode == 1 and run.stdout == ""
        assert run.stderr.replace("\n  ", " ") == (
            "prog.py: error: mpi4py's MPI module does not load here (RuntimeError: cannot load MPI library): "
            "simulate the ranks, which needs no MPI library (`python prog.py --ranks N` with spmdsim.script(__file__), "
            "or spmdsim.simulate(N, main)), or install the 'mpi' extra (pip install mpich), or use your system's MPI\n")
    # Caught, it changes nothing; another error left uncaught is Python's traceback as before.
    run = _run("""
        import spmdsim
        try:
            spmdsim.world()
        except RuntimeError as exc:
            print(type(exc).__name__)
        raise ValueError("other")
        """, tmp_path)
    assert run.returncode == 1 and run.stdout == "MPILibraryError\n"
    assert run.stderr.startswith("Traceback (most recent call last):\n") and run.stderr.endswith("ValueError: other\n")


def test_a_training_example_run_without_ranks_ends_with_one_line(tmp_path):
    # `python examples/train_gpt.py` (run_main, the training examples') imported mpi4py.MPI itself: a 30-line
    # traceback through mpi4py's loader on a laptop without MPI; now the same one line as a script's.
    run = _run(f"""
        import runpy
        sys.argv = ["train_gpt.py", "--steps", "2"]
        sys.path.insert(0, {str(ROOT / "examples")!r})
        runpy.run_path({str(ROOT / "examples" / "train_gpt.py")!r}, run_name="__main__")
        """, tmp_path)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.replace("\n  ", " ") == (
        "train_gpt.py: error: mpi4py's MPI module does not load here (RuntimeError: cannot load MPI library): "
        "add --ranks N to run on simulated ranks, which need no MPI library, or install the 'mpi' extra "
        "(pip install mpich), or use your system's MPI\n")


def test_the_lab_grader_says_in_one_line_that_it_needs_an_mpi_library(tmp_path):
    # Every case of every submission, right ones too, was "FAIL a rank raised RuntimeError: cannot load MPI
    # library": a check that failed a right answer, a grade book of zeros. Now refused before any case runs.
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "ping_pong.py").write_text("def ping_pong(comm, x):\n    return None\n")
    for argv in (["check", "1", "subs/ping_pong.py"], ["grade", "1", "subs", "--csv", "book.csv"]):
        run = _run(f"""
            from spmdsim.tools.cli.main import main
            sys.exit(main(["lab", *{argv!r}]))
            """, tmp_path)
        assert (run.returncode, run.stdout) == (2, ""), run.stdout + run.stderr
        assert run.stderr.replace("\n  ", " ") == (
            "spmdsim: error: mpi4py's MPI module does not load here (RuntimeError: cannot load MPI library): "
            "spmdsim lab's ranks take MPI's constants, datatypes and exceptions from it; install the 'mpi' extra "
            "(pip install mpich), or use your system's MPI\n")
    assert not (tmp_path / "book.csv").exists()
