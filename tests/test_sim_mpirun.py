"""`spmdsim mpirun -n 8 python script.py`: unmodified mpi4py programs print what MPICH's mpiexec prints."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from spmdsim.tools.cli.main import main
from testkit import MPIEXEC, mpich_batch, unfold

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "mpi4py"
STDIN = {"cpi.py": "10000\n100\n0\n"}  # cpi reads interval counts until 0


def _launched(prog, n: int, **kwargs) -> subprocess.CompletedProcess:
    """`python -m spmdsim mpirun -n N python PROG` in a process of its own, under `timeout -k 5 60`."""
    return subprocess.run(["timeout", "-k", "5", "60", sys.executable, "-m", "spmdsim", "mpirun", "-n", str(n),
                           "python", str(prog)], capture_output=True, text=True, timeout=90, **kwargs)


def _lines(name: str, out: str) -> list:
    if name == "helloworld.py":  # ranks print at once: MPICH may even join lines
        return sorted(re.findall(r"Hello, World! I am process \d+ of \d+ on \S+\.", out))
    return out.splitlines()


SAME_AS_MPICH = ["helloworld.py", "cpi.py", "ring.py", "matvec.py", "psort.py", "onesided.py", "parallel_io.py"]


@pytest.fixture(scope="module")
def mpich_out():
    """{example: what it printed under MPICH's mpiexec -n 8, its ranks' lines in rank order}: one job for all
    (stdin, cpi's, to rank 0)."""
    found = mpich_batch([(name, EXAMPLES / name, []) for name in SAME_AS_MPICH], 8, stdin=STDIN["cpi.py"])
    return {name: "".join(line + "\n" for lines in per_rank for line in lines) for name, per_rank in found.items()}


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec beside this Python (pip install -e '.[mpi]')")
@pytest.mark.parametrize("name", SAME_AS_MPICH)
def test_example_prints_what_mpiexec_prints(name, mpich_out, capsys, monkeypatch):
    """`spmdsim mpirun -n 8 python EXAMPLE` run in this process, rank 0 reading STDIN's text (the tests below
    that start `python -m spmdsim mpirun` check its launch)."""
    monkeypatch.setattr("sys.stdin", io.StringIO(STDIN.get(name, "")))
    code = main(["mpirun", "-n", "8", "python", str(EXAMPLES / name)])
    sim = capsys.readouterr()
    assert code == 0, sim.err
    assert sim.err == ""
    assert _lines(name, sim.out) == _lines(name, mpich_out[name]) and sim.out.strip()


#: One `spmdsim mpirun -n 3` launch shared by the three tests below (a launch each, ~0.5 CPU-s apiece, before),
#: run with no mpiexec on PATH: rank 0 names the heavy modules loaded at the program's start, every rank then reads
#: the process manager's attributes, and last imports numpy (late: after mpi4py) and draws from its generator.
SHARED = ("import sys\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\nif c.rank == 0:\n"
          "    heavy = ('spmdsim.tools.autoshard', 'spmdsim.programs.cost', 'spmdsim.programs.pipeline', "
          "'spmdsim.programs.plan', 'spmdsim.runtime.door', 'spmdsim.runtime.guard')\n"
          "    print('heavy', sorted(m for m in sys.modules if m.startswith(heavy)))\n"
          "print('attrs', c.Get_attr(MPI.UNIVERSE_SIZE), c.Get_attr(MPI.APPNUM), c.Get_attr(MPI.TAG_UB) > 0)\n"
          "import numpy as np\nrank = MPI.COMM_WORLD.rank\nnp.random.seed(rank)\n"
          "print('late', rank, np.random.rand())\n")


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory) -> dict:
    """{'heavy' | 'attrs' | 'late': the lines SHARED's launch printed so, the word cut off}; it exits 0."""
    folder = tmp_path_factory.mktemp("shared")
    (folder / "prog.py").write_text(SHARED)
    env = dict(os.environ, PATH=os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                                 if not os.path.exists(os.path.join(p, "mpiexec"))))
    run = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "3", "python", "prog.py"],
                         capture_output=True, text=True, timeout=120, cwd=folder, env=env)
    assert run.returncode == 0, run.stderr
    said: dict = {"heavy": [], "attrs": [], "late": []}
    for line in run.stdout.splitlines():
        word, _, rest = line.partition(" ")
        assert word in said, run.stdout  # nothing printed but the program's lines
        said[word].append(rest)
    return said


def test_mpirun_loads_no_planner(shared_run):
    """`spmdsim mpirun` loads the emulator and what it needs, not every command's modules: the planner,
    the cost model, the pipeline parser and the MPI door took about half of a short program's start."""
    assert shared_run["heavy"] == ["[]"]


def test_mpirun_of_a_program_without_numpy_loads_no_numpy(tmp_path, shared_run):
    """numpy was half of hello world's start under `spmdsim mpirun` (which then took longer than mpiexec):
    a program that never imports numpy runs without it; one that imports it late (SHARED) still gets each rank's
    own numpy.random generator (spmdsim.emulator.rank_random swaps its functions when it loads)."""
    plain = tmp_path / "plain.py"
    plain.write_text("import atexit, sys\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                     "comm.Barrier()\nprint(comm.allreduce(comm.rank), comm.bcast('hi'))\n"
                     "if comm.rank == 0:\n    atexit.register(lambda: print('numpy' in sys.modules))\n")
    run = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "3", "python", str(plain)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["3 hi"] * 3 + ["False"]
    import numpy as np

    assert sorted(shared_run["late"]) == [f"{r} {np.random.RandomState(r).rand()}" for r in range(3)]


def test_the_process_managers_attributes_need_no_mpiexec_on_path(shared_run):
    """MPI.UNIVERSE_SIZE and MPI.APPNUM read as MPICH's `mpiexec -n N` ranks read them (None and 0). Asked of
    this process's MPICH (a singleton), UNIVERSE_SIZE forked an mpiexec and, with none on PATH (a venv's
    spmdsim run without activating it), waited for it forever (mpi4py's test_environ under the suite).
    SHARED's launch has no mpiexec on PATH."""
    assert shared_run["attrs"] == ["None 0 True"] * 3


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec beside this Python (pip install -e '.[mpi]')")
def test_the_start_benchmark_runs():
    """scripts/bench_mpirun_start.py (docs/howto/simulate.md quotes its medians), one round: every configuration
    ran and printed what mpiexec printed (the script exits non-zero otherwise)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import mpi4py_suite

    found = mpi4py_suite.find_tests()
    if found is None or not (found.parent / "demo").is_dir():
        pytest.skip("mpi4py's demos are not here: python tests/mpi4py_suite.py --fetch")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_mpirun_start.py"), "--repeat", "1",
                          "--ranks", "2", "--demo", "helloworld.py", "--before", str(ROOT)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("helloworld.py at 2 ranks, median of 1 launches each"), run.stdout
    assert [line[:29].strip() for line in lines[1:]] == ["spmdsim mpirun", "--before's spmdsim mpirun", "mpiexec",
                                                          "spmdsim mpirun, A/A"], run.stdout
    # --demo osu_bw.py / osu_latency.py (seconds each, not run here): their lines compare with the rates
    # masked and the message sizes kept
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_mpirun_start", ROOT / "scripts" / "bench_mpirun_start.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.MEASURED == ("osu_bw.py", "osu_latency.py")
    assert bench._NUMBER.sub("#", "      1024               10.82") == "      1024               #"
    assert bench._NUMBER.sub("#", "      1024  76.01\n   2048  3e-05") == "      1024  #\n   2048  #"


def test_a_closed_pipe_stops_quietly(tmp_path, capsys):
    # `spmdsim mpirun -n 8 python ring.py | head -2`: a BrokenPipeError traceback of each rank that printed.
    prog = tmp_path / "prog.py"
    prog.write_text("raise BrokenPipeError(32, 'Broken pipe')\n")
    assert main(["mpirun", "-n", "2", "python", str(prog)]) == 141  # 128 + SIGPIPE, as a shell tool ends
    assert capsys.readouterr().err == ""


def test_exit_codes_errors_and_module_form(tmp_path, capsys):
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                    "print('rank', comm.rank, 'argv', sys.argv[1:])\n"
                    "if comm.rank == 2 and sys.argv[1:] == ['boom']:\n    raise ValueError('rank two broke')\n"
                    "comm.Barrier()\nsys.exit(comm.rank if sys.argv[1:] == ['codes'] else 0)\n")
    assert main(["mpirun", "-n", "4", "python", str(prog), "codes"]) == 3
    out = capsys.readouterr().out
    assert sorted(out.splitlines()) == [f"rank {r} argv ['codes']" for r in range(4)]
    assert main(["mpirun", "-n", "4", str(prog), "boom"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("spmdsim mpirun: error on simulated rank 2: ValueError: rank two broke\n")
    assert err.endswith("raised on simulated rank 2 of 4\n")
    assert main(["mpirun", "-n", "0", str(prog)]) == 2
    assert "-n 0 must be a number of ranks from 1 to 4096" in capsys.readouterr().err
    assert main(["mpirun", "-n", "2", "python", str(tmp_path / "absent.py")]) == 2
    assert "does not exist" in unfold(capsys.readouterr().err)
    run = subprocess.run([sys.executable, "-m", "spmdsim.emulator.mpirun", "-n", "3", "-m",
                          "mpi4py.bench", "helloworld"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == sorted(f"Hello, World! I am process {r} of 3 on "
                                                     f"{run.stdout.split(' on ')[1].split('.')[0]}."
                                                     for r in range(3))


def test_a_spmdsim_program_on_too_few_ranks_of_mpirun_is_told_mpiruns_flag(tmp_path, capsys):
    """`spmdsim mpirun -n 4 my_matmul.py` (the README's program, 8 ranks) said "simulate 8 ranks with `--ranks 8` /
    spmdsim.simulate(8, main)", which mpirun does not read, in a line of 180 columns: now mpirun's -n, folded."""
    prog = tmp_path / "prog.py"
    prog.write_text("from spmdsim import Layout, Mesh\nMesh(Layout((2, 4), ('dp', 'mp')))\n")
    assert main(["mpirun", "-n", "4", "python", str(prog)]) == 1
    err = capsys.readouterr().err
    assert max(map(len, err.splitlines())) <= 100, err
    assert unfold(err) == ("spmdsim mpirun: error: device matrix (2, 4) needs 8 ranks but the communicator has 4 "
                           "(run 8 ranks: spmdsim mpirun -n 8 ..., or mpiexec -n 8 ...)\n"), err


def test_a_mesh_error_a_program_catches_under_mpirun_says_mpiruns_ways(tmp_path, capsys):
    """The error's own text says mpirun's -n where mpirun started the world: a program that caught it and printed
    it said "simulate 8 ranks with `--ranks 8` / spmdsim.simulate(8, main)" (mpirun's report alone rewrote it)."""
    prog = tmp_path / "prog.py"
    prog.write_text("from spmdsim import Layout, Mesh, RuntimeMismatchError\n"
                    "try:\n    Mesh(Layout((2, 4), ('dp', 'mp')))\n"
                    "except RuntimeMismatchError as exc:\n"
                    "    print(getattr(exc, 'needed', None), getattr(exc, 'size', None), exc)\n")
    assert main(["mpirun", "-n", "2", "python", str(prog)]) == 0
    assert capsys.readouterr().out == 2 * ("8 2 device matrix (2, 4) needs 8 ranks but the communicator has 2 "
                                           "(run 8 ranks: spmdsim mpirun -n 8 ..., or mpiexec -n 8 ...)\n")


def test_spmdsim_run_under_mpirun_says_mpiruns_ways_to_a_strategys_ranks(capsys):
    """`spmdsim mpirun -n 2 python -m spmdsim run matmul --strategy ((2,4),(4,1))` was told to "simulate 8 ranks
    with `--ranks 8`", which mpirun does not read: the ways were guessed from the communicator, not its launcher."""
    argv = ["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,16,16"]
    assert main(["mpirun", "-n", "4", "python", "-m", "spmdsim", *argv]) == 2
    said = ("spmdsim: error: matmul strategy ((2, 4), (4, 1)) needs 8 devices but the world size is 4; the product "
            "of the slice counts must not exceed the number of ranks (run 8 ranks: spmdsim mpirun -n 8 ..., or "
            "mpiexec -n 8 ...)")
    # Said once, as under mpiexec (its rank 0 says what every rank met): each of the 4 simulated ranks said it
    assert unfold(capsys.readouterr().err).splitlines() == [said]


def test_usage_errors_and_pure_commands_under_mpirun_are_said_once_as_under_mpiexec(capsys):
    """Under mpiexec rank 0 alone prints a usage error (OnceParser), an example's refusal and a command that needs
    no MPI (by PMI_RANK); simulated ranks of mpirun share one environment, so each printed them: 3 errors, 3 slices
    tables. A rank of mpirun is a process of its job: launcher_rank() is its rank."""
    assert main(["mpirun", "-n", "3", "python", "-m", "spmdsim", "run", "matmul"]) == 2
    err = capsys.readouterr().err
    assert unfold(err) == ("spmdsim run matmul: error: the following arguments are required: --shape; see: spmdsim run "
                           "matmul --help\n")
    slices = ["slices", "--device-matrix", "2,4", "--alias", "a,b", "--tensor-map", "a,None", "--shape", "8,8"]
    assert main(["mpirun", "-n", "3", "python", "-m", "spmdsim", *slices]) == 0
    assert capsys.readouterr().out.count('"rank_slices"') == 1
    assert main(["mpirun", "-n", "3", "python", str(ROOT / "examples" / "train_gpt.py"), "--steps", "0"]) == 2
    assert capsys.readouterr().err == "spmdsim: error: --steps 0 must be at least 1\n"


@pytest.mark.parametrize("entry", ["spmdsim mpirun", "python -m spmdsim.emulator.mpirun"])
def test_spmdsim_mpirun_under_mpiexec_is_refused_in_one_line(entry, capsys, monkeypatch):
    """`mpiexec -n 2 spmdsim mpirun -n 2 python ring.py`: rank 1 raised a TypeError (mpirun's program words, a
    list, read as the subcommand's name), and rank 0 waited in MPI's start for it till the timeout. Each
    process would run all the simulated ranks: rank 0 says so in one line, every rank exits 2, before any other
    refusal (-n 0 here), by either way in. `python -m spmdsim.emulator.mpirun` only warned and ran every
    simulated rank in each process."""
    from spmdsim.base import threads
    from spmdsim.emulator import mpirun

    for name in threads.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_SIZE", "2")
    ring = str(ROOT / "examples" / "mpi4py" / "ring.py")
    for rank, lines in (("1", []), ("0", ["spmdsim mpirun: error: mpiexec started 2 processes, and each would run "
                                          "every simulated rank; run spmdsim mpirun without mpiexec, or the program "
                                          "under mpiexec alone (mpiexec -n 2 python prog.py)"])):
        monkeypatch.setenv("PMI_RANK", rank)
        for n in ("4", "0"):
            args = ["-n", n, "python", ring]
            assert (main(["mpirun", *args]) if entry == "spmdsim mpirun" else mpirun.main(args)) == 2
            out, err = capsys.readouterr()
            assert out == "" and unfold(err).splitlines() == lines


def test_a_cli_error_only_some_mpirun_ranks_meet_is_said_once_too(tmp_path, capsys):
    """Ranks of `spmdsim mpirun` that meet the same error say it once; one that meets another still says its own."""
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nfrom mpi4py import MPI\nfrom spmdsim.tools.cli.main import main\n"
                    "shape = '1' if MPI.COMM_WORLD.Get_rank() == 1 else '1,2'\n"
                    "sys.exit(main(['run', 'matmul', '--shape', shape]))\n")
    assert main(["mpirun", "-n", "3", "python", str(prog)]) == 2
    assert sorted(capsys.readouterr().err.splitlines()) == [
        "spmdsim: error: --shape '1' has 1 size; expected M,K,N (or B,...,M,K,N)",
        "spmdsim: error: --shape '1,2' has 2 sizes; expected M,K,N (or B,...,M,K,N)"]


def test_spmdsim_mpirun_takes_the_module_and_code_forms_its_help_offers(tmp_path, capsys, monkeypatch):
    # `--help` offers "[python] -m module": `spmdsim mpirun -n 2 -m mod` said "unrecognized arguments: -m"
    # (argparse took the program's -m, and -c, for mpirun's own flags); `python -m mod` alone worked.
    (tmp_path / "hello_mod.py").write_text("from mpi4py import MPI\nprint('module rank', MPI.COMM_WORLD.rank)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["mpirun", "-n", "2", "-m", "hello_mod"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == ["module rank 0", "module rank 1"]
    assert main(["mpirun", "--np", "2", "--oversubscribe", "-c",
                 "from mpi4py import MPI; print(MPI.COMM_WORLD.size)"]) == 0
    assert capsys.readouterr().out.splitlines() == ["2", "2"]
    for limit in (["--eager-limit", "0"], ["--eager-limit=0"]):  # the README's flag before -c: its code, too
        assert main(["mpirun", "-n", "2", *limit, "-c", "from mpi4py import MPI; print(MPI.COMM_WORLD.size)"]) == 0
        assert capsys.readouterr().out.splitlines() == ["2", "2"]
    assert main(["mpirun", "-m", "hello_mod", "-n", "2"]) == 2  # -n after the program: its own, said so
    assert "-n N goes before the program" in unfold(capsys.readouterr().err)


def test_a_folder_or_zip_with_main_and_a_module_not_found_run_as_python_runs_them(tmp_path, capsys):
    """`python folder` and `python file.zip` run their __main__.py (sys.path[0] the folder or zip), as python and
    mpiexec do: it said "script 'folder' does not exist" (exit 2). `-m no_such_mod` and a folder without
    __main__.py: Python's one line and its exit status 1, not an ImportError's traceback from <frozen runpy>."""
    import zipfile

    app = tmp_path / "app"
    app.mkdir()
    (app / "helper.py").write_text("from mpi4py import MPI\nmine = MPI.COMM_WORLD.rank\n")
    main_py = ("import sys, helper\nfrom mpi4py import MPI\n"
               "print(MPI.COMM_WORLD.rank, helper.mine, __name__, __file__.endswith('__main__.py'), sys.argv,\n"
               "      sys.path[0] == __file__.rpartition('/')[0], __spec__.name, repr(__package__))\n")
    (app / "__main__.py").write_text(main_py)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("__main__.py", main_py)
        z.writestr("helper.py", "from mpi4py import MPI\nmine = MPI.COMM_WORLD.rank\n")
    for target in ("app", "app.zip"):
        assert main(["mpirun", "-n", "2", "python", str(tmp_path / target), "x"]) == 0
        out, err = capsys.readouterr()
        assert err == "" and sorted(out.splitlines()) == [
            f"{r} {r} __main__ True ['{tmp_path / target}', 'x'] True __main__ ''" for r in range(2)]
    (tmp_path / "empty").mkdir()
    assert main(["mpirun", "-n", "2", "python", str(tmp_path / "empty")]) == 1
    assert unfold(capsys.readouterr().err) == (f"spmdsim mpirun: error: can't find '__main__' module in "
                                       f"'{tmp_path / 'empty'}'\n")
    # Was Python's line alone ('No module named no_such_mod'): now the command it ran too. MPICH's
    # `mpiexec -n 2 python -m no_such_mod` exits 1 (Python's status), each rank printing Python's line.
    assert main(["mpirun", "-n", "2", "python", "-m", "no_such_mod"]) == 1
    assert capsys.readouterr().err == "spmdsim mpirun: error: python -m no_such_mod: No module named no_such_mod\n"
    assert main(["mpirun", "-n", "2", "python", "-m", "json"]) == 1
    assert capsys.readouterr().err == ("spmdsim mpirun: error: python -m json: No module named json.__main__; 'json' "
                                       "is a package and cannot be directly executed\n")


@pytest.mark.parametrize("exits, code", [("sys.exit(-1)", 255), ("raise SystemExit(-3)", 253),
                                         ("sys.exit(300)", 44), ("sys.exit(256)", 0)])
def test_a_ranks_exit_code_is_its_status_as_the_os_reports_it(exits, code, tmp_path, capsys):
    """mpiexec passes on the largest of the ranks' exit statuses, each the code's low 8 bits (the OS's):
    sys.exit(-1) on one rank, the others exiting 0, gave 0 (the largest of -1 and 0)."""
    prog = tmp_path / "prog.py"
    prog.write_text(f"import sys\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.rank == 1:\n    {exits}\n")
    assert main(["mpirun", "-n", "3", "python", str(prog)]) == code
    assert capsys.readouterr().err == ""


def test_each_rank_captures_its_own_stderr(tmp_path, capsys):
    """A rank that sets sys.stderr = StringIO() gets its own tracebacks and prints only (also print() and
    traceback.print_exc(), which write through the process's stream), and setting it back ends it."""
    prog = tmp_path / "prog.py"
    prog.write_text("import io, sys, traceback\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                    "saved = sys.stderr\nsys.stderr = io.StringIO()\ncomm.Barrier()\n"
                    "try:\n    raise ValueError(f'rank {comm.rank}')\nexcept ValueError:\n    traceback.print_exc()\n"
                    "print(f'by {comm.rank}', file=sys.stderr)\ncomm.Barrier()\nmine = sys.stderr.getvalue()\n"
                    "sys.stderr = saved\nprint(comm.rank, sys.stderr is saved, mine.count('ValueError'),\n"
                    "      f'rank {comm.rank}' in mine, mine.count('by '), f'by {comm.rank}' in mine)\n"
                    "print('after', comm.rank, file=sys.stderr)\n")
    assert main(["mpirun", "-n", "4", "python", str(prog)]) == 0
    out = capsys.readouterr()
    assert sorted(out.out.splitlines()) == [f"{r} True 2 True 1 True" for r in range(4)]
    assert sorted(out.err.splitlines()) == [f"after {r}" for r in range(4)]


def test_json_tool_runs_on_the_ranks_reading_a_file_or_stdin(tmp_path, capsys, monkeypatch):
    """`python -m json.tool` closes stdin and stdout with `with`: each rank closes its own, the process's stay open."""
    (tmp_path / "in.json").write_text('{"a": [1, 2]}')
    pretty = '{\n    "a": [\n        1,\n        2\n    ]\n}\n'
    assert main(["mpirun", "-n", "2", "python", "-m", "json.tool", str(tmp_path / "in.json")]) == 0
    assert capsys.readouterr() == (pretty * 2, "")
    monkeypatch.setattr("sys.stdin", io.StringIO('{"a": [1, 2]}'))
    assert main(["mpirun", "-n", "1", "python", "-m", "json.tool", "--sort-keys"]) == 0
    assert capsys.readouterr() == (pretty, "") and not sys.stdin.closed and not sys.stdout.closed


def test_a_ranks_stdout_and_stdin_are_file_objects_it_closes_for_itself(tmp_path, capsys, monkeypatch):
    """`with sys.stdout:` on rank 0 writes its partial line and closes its own stdout: its later print raises
    ValueError, as a closed stdout's does, and rank 1 and the run print on, on a line of their own; likewise
    stdin."""
    prog = tmp_path / "prog.py"
    prog.write_text("import sys\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.rank\n"
                    "sys.stdout.writelines([f'{r} ', 'lines\\n'])\nout, inp = sys.stdout, sys.stdin\n"
                    "print(r, out.isatty(), out.writable(), out.closed, inp.closed)\n"
                    "MPI.COMM_WORLD.Barrier()\nif r == 0:\n    with sys.stdout as same, sys.stdin as mine:\n"
                    "        print('partial', end='', flush=same is sys.stdout and mine is sys.stdin)\n"
                    "    for name in ('print', 'readline'):\n        try:\n"
                    "            print('x') if name == 'print' else sys.stdin.readline()\n"
                    "        except ValueError as exc:\n            print(name, exc, file=sys.stderr)\n"
                    "    print(sys.stdout.closed, sys.stdin.closed, file=sys.stderr)\n"
                    "MPI.COMM_WORLD.Barrier()\nif r:\n    print('after', r, sys.stdout.closed, sys.stdin.closed)\n")
    monkeypatch.setattr("sys.stdin", io.StringIO("line\n"))
    assert main(["mpirun", "-n", "2", "python", str(prog)]) == 0
    print("the run's own")
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == sorted(["0 lines", "1 lines", "0 False True False False",
                                               "1 False True False False", "partial", "after 1 False False",
                                               "the run's own"]), out
    assert err.splitlines() == ["print I/O operation on closed file.", "readline I/O operation on closed file.",
                                "True True"]
    assert not sys.stdin.closed and sys.stdin.read() == "line\n"


def test_a_programs_mpi4py_rc_settings_end_with_its_run(tmp_path, capsys):
    """Under mpiexec `mpi4py.rc.errors = "fatal"` dies with the program's processes; the simulated ranks share
    this process's mpi4py.rc, so `spmdsim mpirun` undoes the run's settings (a later simulation's communicators
    started with ERRORS_ARE_FATAL when a demo of mpi4py's init-fini had set it)."""
    import mpi4py

    program = tmp_path / "fatal.py"
    program.write_text("import mpi4py\nmpi4py.rc.errors = 'fatal'\nmpi4py.rc.threads = False\n"
                       "from mpi4py import MPI\nprint(MPI.COMM_WORLD.Get_errhandler() == MPI.ERRORS_ARE_FATAL)\n")
    before = dict(vars(mpi4py.rc)), mpi4py.rc.errors, mpi4py.rc.threads
    assert main(["mpirun", "-n", "2", "python", str(program)]) == 0
    assert capsys.readouterr().out == "True\nTrue\n"
    assert (dict(vars(mpi4py.rc)), mpi4py.rc.errors, mpi4py.rc.threads) == before


def test_packing_with_a_simulated_communicator_is_refused_with_what_runs_instead(tmp_path, capsys):
    """MPI's Datatype.Pack_size/Pack/Unpack take a real communicator (mpi4py's C code checks its type): mpirun ends
    with mpi4py's TypeError and one folded hint naming the calls that take none, and those run on simulated ranks
    (the bytes external32 defines: big-endian int32)."""
    from spmdsim.emulator.mpirun_report import REAL_COMM_HINT
    from spmdsim.errors import fold_message

    packing = tmp_path / "packing.py"
    packing.write_text("import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                       "out = bytearray(MPI.INT.Pack_size(4, comm))\n")
    assert main(["mpirun", "-n", "2", str(packing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("spmdsim mpirun: error on simulated ranks 0,1: TypeError: Argument 'comm' has incorrect "
                          "type (expected mpi4py.MPI.Comm, got Intracomm)\n")
    assert err.endswith("\n" + fold_message(REAL_COMM_HINT) + "\n")
    assert all(len(line) <= 100 for line in fold_message(REAL_COMM_HINT).splitlines())
    # what the doc quotes
    assert fold_message(REAL_COMM_HINT) in (ROOT / "docs" / "howto" / "mpi4py-lab.md").read_text()
    external = tmp_path / "external.py"
    external.write_text(
        "import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
        "a = np.arange(4, dtype='i') + 256 * comm.rank\n"
        "out = bytearray(MPI.INT.Pack_external_size('external32', 4))\n"
        "end = MPI.INT.Pack_external('external32', a, out, 0)\n"
        "b = np.empty(4, 'i')\nMPI.INT.Unpack_external('external32', out, 0, b)\n"
        "print(comm.rank, end, bytes(out).hex(), b.tolist())\n")
    assert main(["mpirun", "-n", "2", str(external)]) == 0
    lines = sorted(capsys.readouterr().out.splitlines())
    assert lines == [f"{r} 16 {''.join(f'{256 * r + i:08x}' for i in range(4))} {[256 * r + i for i in range(4)]}"
                     for r in range(2)]


def test_errors_of_the_program_and_its_modules_read_as_pythons(tmp_path, capsys):
    """A SyntaxError in the program: its file, line and caret, no frames of spmdsim's (they were all printed); an
    error raised while the program's own module is imported: at the import statement (a module with a SyntaxError
    imported and not used passed before: each rank ran its copy on first use), then the module's frame, without
    importlib's and the rank loader's frames, as Python prints it."""
    (tmp_path / "broken.py").write_text("from mpi4py import MPI\nprint(MPI.COMM_WORLD.rank\n")
    assert main(["mpirun", "-n", "2", str(tmp_path / "broken.py")]) == 1
    assert capsys.readouterr().err == (
        "spmdsim mpirun: error on simulated ranks 0,1: SyntaxError: '(' was never closed (broken.py, line 2)\n"
        f'  File "{tmp_path / "broken.py"}", line 2\n    print(MPI.COMM_WORLD.rank\n         ^\n'
        "SyntaxError: '(' was never closed\nraised on every simulated rank\n")
    (tmp_path / "uses_broken.py").write_text("import broken\n")
    (tmp_path / "raising.py").write_text("x = 1\nraise ValueError('bad module')\n")
    (tmp_path / "uses_raising.py").write_text("import sys\nimport raising\n")
    for program, module, tail in (
            ("uses_broken.py", "broken.py", "  File \"{}\", line 2\n    print(MPI.COMM_WORLD.rank\n         ^\n"
                                            "SyntaxError: '(' was never closed\n"),
            ("uses_raising.py", "raising.py", "  File \"{}\", line 2, in <module>\n"
                                              "    raise ValueError('bad module')\nValueError: bad module\n")):
        assert main(["mpirun", "-n", "2", str(tmp_path / program)]) == 1
        err = capsys.readouterr().err
        line = 1 if program == "uses_broken.py" else 2
        assert err.split("\n", 1)[1].startswith(
            "Traceback (most recent call last):\n"
            f'  File "{tmp_path / program}", line {line}, in <module>\n    import {module[:-3]}\n'
            + tail.format(tmp_path / module)), err
        assert "importlib" not in err and "rank_modules" not in err


def test_a_programs_excepthook_runs_on_the_rank_that_raised_and_its_encoding_is_read_as_pythons(tmp_path, capsys,
                                                                                                monkeypatch):
    """A program's sys.excepthook is called on the failing rank with the exception and its traceback from the
    program's frame on, in place of the traceback (python calls it in each failing process under mpiexec);
    a hook that raises gets python's two reports; the hook ends with the run. A script python would refuse
    for its bytes (a Latin-1 comment and no coding line: compile() of the bytes takes it) is refused in
    python's words before any rank starts."""
    hook = ("import sys\nfrom mpi4py import MPI\n"
            "def hook(kind, exc, tb):\n"
            "    {}print(f'rank {{MPI.COMM_WORLD.rank}}: {{kind.__name__}}: {{exc}} at line {{tb.tb_lineno}}')\n"
            "sys.excepthook = hook\nif MPI.COMM_WORLD.rank == 1:\n    raise ValueError('boom')\n"
            "MPI.COMM_WORLD.Barrier()\n")
    (tmp_path / "hooked.py").write_text(hook.format(""))
    before = sys.excepthook
    assert main(["mpirun", "-n", "2", str(tmp_path / "hooked.py")]) == 1
    out, err = capsys.readouterr()
    assert out == "rank 1: ValueError: boom at line 7\n" and sys.excepthook is before
    assert err == "spmdsim mpirun: error on simulated rank 1: ValueError: boom\n"
    (tmp_path / "hooked.py").write_text(hook.format("1 / 0; "))
    assert main(["mpirun", "-n", "2", str(tmp_path / "hooked.py")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error in sys.excepthook:\nTraceback (most recent call last):\n"
                          f'  File "{tmp_path / "hooked.py"}", line 4, in hook\n'), err
    assert "ZeroDivisionError: division by zero\n\nOriginal exception was:\nTraceback" in err
    assert err.endswith("ValueError: boom\nspmdsim mpirun: error on simulated rank 1: ValueError: boom\n")
    # a hook set before the run (spmdsim's guard installs one) is not the program's: the traceback as always
    monkeypatch.setattr(sys, "excepthook", lambda *exc: print("the launcher's hook"))
    (tmp_path / "plain.py").write_text("from mpi4py import MPI\nraise ValueError('plain')\n")
    assert main(["mpirun", "-n", "2", str(tmp_path / "plain.py")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" in err and err.endswith("ValueError: plain\nraised on every simulated rank\n"), err
    (tmp_path / "latin1.py").write_bytes(b"from mpi4py import MPI\n# caf\xe9\nprint(MPI.COMM_WORLD.rank)\n")
    assert main(["mpirun", "-n", "2", str(tmp_path / "latin1.py")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and unfold(err) == (
        "spmdsim mpirun: error: Non-UTF-8 code starting with '\\xe9' in file "
        f"{tmp_path / 'latin1.py'} on line 2, but no encoding declared; see https://peps.python.org/pep-0263/ for "
        "details\n")


def test_an_spmdsim_error_under_spmdsims_guard_ends_the_run_as_the_guard_ends_an_mpiexec_job(tmp_path, capsys):
    """A program that installed spmdsim's excepthook (or ran through run_guarded / abort_on_error) prints an
    SpmdsimError every rank raised as that hook does under mpiexec: one line, exit 2 (the ranks' texts that
    differ named, as under --ranks); raised on some ranks, that rank's line, exit 1; no traceback either way
    (the report printed the traceback from the program down for each, exit 1). Without the guard, an error
    not spmdsim's, or a deadlock (which the guard never sees under mpiexec: it hangs) read as before."""
    head = ("import sys\nfrom mpi4py import MPI\nimport spmdsim\nfrom spmdsim.runtime import "
            "abort_on_error, run_guarded\n")
    programs = {
        "every.py": "spmdsim.install_excepthook(MPI.COMM_WORLD)\nraise spmdsim.SpmdsimError('bad --tp 3')\n",
        "some.py": "spmdsim.install_excepthook()\nif MPI.COMM_WORLD.rank == 1:\n"
                   "    raise spmdsim.SpmdsimError('bad on rank 1')\nMPI.COMM_WORLD.Barrier()\n",
        "run_guarded.py": "def f():\n    raise spmdsim.SpmdsimError(f'bad {MPI.COMM_WORLD.rank % 2}')\n"
                          "sys.exit(run_guarded(f))\n",
        "abort_on_error.py": "with abort_on_error():\n    raise spmdsim.SpmdsimError('bad in the block')\n",
        "unguarded.py": "raise spmdsim.SpmdsimError('no guard')\n",
        "value.py": "spmdsim.install_excepthook()\nraise ValueError('not spmdsim')\n",
        "deadlock.py": "spmdsim.install_excepthook()\nif MPI.COMM_WORLD.rank == 0:\n    "
                       "MPI.COMM_WORLD.recv(source=1)\n",
        # spmdsim.script(__file__) installs the guard under mpiexec (one plain process: a one-line hook)
        "script.py": "spmdsim.script(__file__)\nraise spmdsim.SpmdsimError('bad after script')\n",
    }
    ended = {}
    for name, body in programs.items():
        (tmp_path / name).write_text(head + body)
        code = main(["mpirun", "-n", "4", "python", str(tmp_path / name)])
        ended[name] = (code, unfold(capsys.readouterr().err))
    assert ended["every.py"] == (2, "spmdsim: error: bad --tp 3\n")
    assert ended["some.py"] == (1, "spmdsim: error on simulated rank 1: bad on rank 1\n")
    assert ended["run_guarded.py"] == (2, "spmdsim: error: bad 0 (ranks 0,2; ranks differ: ranks 1,3: bad 1)\n")
    assert ended["abort_on_error.py"] == (2, "spmdsim: error: bad in the block\n")
    assert ended["script.py"] == (2, "spmdsim: error: bad after script\n")
    for name, kind, text in (("unguarded.py", "SpmdsimError", "no guard"), ("value.py", "ValueError", "not spmdsim")):
        code, err = ended[name]
        assert code == 1 and err.startswith(f"spmdsim mpirun: error on simulated ranks 0-3: {kind}: {text}\n"
                                            "Traceback (most recent call last):"), err
    code, err = ended["deadlock.py"]
    assert code == 1 and err.startswith("spmdsim mpirun: error: simulated ranks deadlock"), err


def test_a_training_example_refusing_its_flags_under_mpirun_says_one_line_as_under_mpiexec():
    """examples/train_gpt.py --tp 3 on 4 ranks: under mpiexec -n 4 one line and exit 2 (run_main's excepthook);
    under spmdsim mpirun -n 4 it was the line with a traceback from the example down, exit 1."""
    run = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "4", str(ROOT / "examples" / "train_gpt.py"),
                          "--tp", "3"], capture_output=True, text=True, timeout=120, env=_one_thread())
    assert (run.returncode, run.stdout, run.stderr) == (
        2, "", "spmdsim: error: the GPT cannot run on 4 ranks: --tp 3 must divide the world size 4\n")


def _one_thread() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def test_the_ranks_share_the_process_pid_environment_and_folder(tmp_path, capsys):
    """What docs/howto/simulate.md says the simulated ranks share, unlike MPI processes: one PID, one os.environ (each
    rank sets XR to its rank, then all read the last setter's value), one working folder."""
    program = tmp_path / "env.py"
    program.write_text("import os\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\nos.environ['XR'] = str(c.rank)\n"
                       "c.Barrier()\nprint(c.rank, os.getpid(), os.environ['XR'], os.getcwd())\n")
    try:
        assert main(["mpirun", "-n", "3", str(program)]) == 0
    finally:
        os.environ.pop("XR", None)
    rows = [line.split(" ") for line in capsys.readouterr().out.splitlines()]
    assert sorted(r[0] for r in rows) == ["0", "1", "2"]
    assert {r[1] for r in rows} == {str(os.getpid())} and len({r[2] for r in rows}) == 1
    assert {r[3] for r in rows} == {os.getcwd()}


def test_the_ranks_share_pythons_warning_filters(tmp_path, capsys):
    """docs/reference/emulator.md: a rank's warnings.simplefilter sets every rank's (one list per process; under
    mpiexec rank 1 would print its warning). mpi4py's testRecvObjArg is out of scope for it (tests/mpi4py_suite.py)."""
    program = tmp_path / "filters.py"
    program.write_text("import warnings\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
                       "if c.rank == 0:\n    warnings.simplefilter('error')\nc.Barrier()\n"
                       "if c.rank == 1:\n    try:\n        warnings.warn('from rank 1')\n        print('warned')\n"
                       "    except UserWarning:\n        print('raised')\n")
    with warnings.catch_warnings():  # this process's filters, as they were, afterwards
        assert main(["mpirun", "-n", "2", str(program)]) == 0
    assert capsys.readouterr().out == "raised\n"


def test_the_ranks_share_pythons_logging_set_up_and_a_filter_names_each_ranks_lines(tmp_path):
    """docs/reference/emulator.md: the first rank's logging.basicConfig is every rank's (one logging module per
    process), so a format with the rank written in names one rank on every line; a handler's filter that reads
    MPI.COMM_WORLD.rank as each line is logged names the line's own rank, as under mpiexec."""
    program = tmp_path / "log.py"
    program.write_text("import logging\nimport sys\nfrom mpi4py import MPI\nrank = MPI.COMM_WORLD.rank\n\n\n"
                       "class RankFilter(logging.Filter):\n    def filter(self, record):\n"
                       "        record.rank = MPI.COMM_WORLD.rank\n        return True\n\n\n"
                       "if sys.argv[1] == 'written':\n    logging.basicConfig(format=f'{rank} %(message)s')\nelse:\n"
                       "    handler = logging.StreamHandler()\n    handler.addFilter(RankFilter())\n"
                       "    logging.basicConfig(format='%(rank)s %(message)s', handlers=[handler])\n"
                       "logging.warning('logged by %d', rank)\n")
    lines = {}
    for how in ("written", "filter"):
        run = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "3", "python", str(program), how],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout == "", run.stderr
        lines[how] = sorted(line.split(" ", 1) for line in run.stderr.splitlines())
    assert [text for _, text in lines["written"]] == [f"logged by {r}" for r in range(3)]
    assert len({named for named, _ in lines["written"]}) == 1
    assert lines["filter"] == [[str(r), f"logged by {r}"] for r in range(3)]


def test_command_lines_as_mpiexec_users_type_them(tmp_path, capsys):
    """-np, a leading --, python3.N or this interpreter's path, Open MPI's --oversubscribe, Python's -u and -B all
    run the program; another Python option is refused in one line naming it and the ones taken."""
    program = tmp_path / "hello.py"
    program.write_text("from mpi4py import MPI\nprint('rank', MPI.COMM_WORLD.rank)\n")
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for args in (["-np", "2", "python", str(program)], ["-n", "2", "--", "python", str(program)],
                 ["-n", "2", minor, str(program)], ["-n", "2", sys.executable, "-u", str(program)],
                 ["--oversubscribe", "-n", "2", "python", "-B", "-u", str(program)]):
        assert main(["mpirun", *args]) == 0, args
        assert sorted(capsys.readouterr().out.splitlines()) == ["rank 0", "rank 1"], args
    assert main(["mpirun", "-n", "2", "python", "-O", str(program)]) == 2
    err = capsys.readouterr().err
    assert max(map(len, err.splitlines())) <= 100
    assert unfold(err) == ("spmdsim mpirun: error: python option '-O' is not supported (the simulated "
                                       "ranks run in this interpreter, as it was started; -u and -B are taken); "
                                       "give a script, -m module or -c program\n")


def test_a_ranks_print_reaches_a_pipe_at_once_with_or_without_python_u(tmp_path):
    """What `mpiexec -n 2 python -u` is for: rank 0's line arrives while the program still waits (on stdin, read
    without input()'s flush), where a pipe's buffer would hold it until the end."""
    import select

    program = tmp_path / "wait.py"
    program.write_text("import sys\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\nif comm.rank == 0:\n"
                       "    print('waiting')\n    sys.stdin.readline()\ncomm.Barrier()\n")
    for flags in ([], ["-u"]):
        proc = subprocess.Popen([sys.executable, "-m", "spmdsim", "mpirun", "-n", "2", "python", *flags, str(program)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready and proc.stdout.readline() == "waiting\n", flags
            assert proc.poll() is None  # still waiting: the line came through before the end
            out, err = proc.communicate("go\n", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0 and err == "", (flags, err)


def test_a_call_not_simulated_ends_the_run_from_any_thread_of_a_rank(tmp_path):
    """A thread of a rank makes a call not simulated while its rank waits for it outside MPI (as mpi4py.futures'
    pool waits for its manager thread): the refusal was printed by the thread and the job hung. A call not
    simulated now ends the run with its one refusal as the rank's error, from a rank's thread or its own while
    another rank waits outside MPI."""
    threaded = tmp_path / "threaded.py"
    threaded.write_text("import threading\nfrom mpi4py import MPI\ndone = threading.Event()\n\n\ndef serve():\n"
                        "    MPI.Comm.f2py(0)\n    done.set()\n\n\n"
                        "threading.Thread(target=serve).start()\ndone.wait()\n")
    stuck = tmp_path / "stuck.py"
    stuck.write_text("import threading\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\nif comm.rank == 0:\n"
                     "    MPI.Comm.f2py(0)\nthreading.Event().wait()\n")
    for program, ranks in ((threaded, "ranks 0,1"), (stuck, "rank 0")):
        done = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "2", "python", str(program)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr.startswith(f"spmdsim mpirun: error on simulated {ranks}: NotImplementedError: a "
                                      "communicator from an MPI handle (Comm.fromint, Comm.f2py, Comm.fromhandle): "
                                      "not simulated;"), done.stderr
        assert "spmdsim/emulator" not in done.stderr and done.stderr.count("Traceback") == 1, done.stderr


def test_mpi4py_futures_pool_runs_under_its_runner(tmp_path):
    """`python -m mpi4py.futures prog.py`: rank 0 runs the program, the other ranks serve its MPIPoolExecutor
    over an intercommunicator of the world's two parts. Each rank has its own mpi4py.futures (its pool is a
    module global) and its own __main__ (a worker imports the program as __worker__), so a function or class
    of the program pickles by name to the worker's copy, and a task's exception comes back as itself; the
    lines are MPICH's (`mpiexec -n 4 python -m mpi4py.futures prog.py`)."""
    prog = tmp_path / "pool.py"
    prog.write_text(textwrap.dedent("""
        from mpi4py import MPI
        from mpi4py.futures import MPIPoolExecutor


        class Point:
            def __init__(self, x):
                self.x = x


        def where(p):
            return abs(p.x), MPI.COMM_WORLD.Get_rank(), __name__


        if __name__ == "__main__":
            with MPIPoolExecutor() as ex:
                got = list(ex.map(where, [Point(-x) for x in range(8)]))
                print([x for x, _, _ in got], {r for _, r, _ in got} <= {1, 2, 3}, {n for _, _, n in got})
                print(repr(ex.submit(divmod, 1, 0).exception()), ex.num_workers)
        """))
    done = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "4", "python", "-m", "mpi4py.futures",
                           str(prog)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == ["[0, 1, 2, 3, 4, 5, 6, 7] True {'__worker__'}",
                                        "ZeroDivisionError('integer division or modulo by zero') 3"]


def test_a_thread_left_running_by_a_failed_run_never_meets_the_real_mpi(tmp_path):
    """Rank 1's thread computes on after rank 0's refused call ended the run: it met the real MPI (its world this
    process alone: `1 ranks`; mpi4py.futures' pool, left waiting on a rank, spawned real processes). The failed
    run is reported while the ranks' mpi4py is still theirs, so the thread sees its simulated world."""
    prog = tmp_path / "late.py"
    prog.write_text("import threading\nimport time\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n\n\ndef late():\n"
                    "    start = time.monotonic()\n    while time.monotonic() - start < 0.8:\n        pass\n"
                    "    print('the late thread sees', MPI.COMM_WORLD.Get_size(), 'ranks', flush=True)\n\n\n"
                    "if comm.rank == 1:\n    threading.Thread(target=late).start()\nif comm.rank == 0:\n"
                    "    MPI.Comm.f2py(0)\ncomm.Barrier()\n")
    run = _launched(prog, 2, cwd=tmp_path)
    assert run.returncode == 1, run
    assert run.stdout == "the late thread sees 2 ranks\n", run
    assert run.stderr.startswith("spmdsim mpirun: error on simulated rank 0: NotImplementedError: a communicator "
                                 "from an MPI handle"), run


def test_ranks_a_failed_run_left_computing_print_whole_lines_until_the_process_exits(tmp_path):
    """Ranks 1-3 compute and print on after rank 0's refused call ended the run; rank 0's thread holds the report
    for a second (`_failed`). Their prints went straight to the process's stdout once the simulation ended, two
    ranks' halves run together on one line ("rank 1 says rank 2 says hello")."""
    prog = tmp_path / "late.py"
    prog.write_text("import sys\nimport threading\nimport time\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n\n\n"
                    "def hold():\n    start = time.monotonic()\n"
                    "    while time.monotonic() - start < 3:\n        pass\n\n\nif comm.rank == 0:\n"
                    "    threading.Thread(target=hold).start()\n    MPI.Comm.f2py(0)\n"
                    "start = time.monotonic()\nwhile time.monotonic() - start < 2:\n"
                    "    sys.stdout.write(f'rank {comm.rank} says ')\n    sys.stdout.write('hello\\n')\n"
                    "    pause = time.monotonic()\n    while time.monotonic() - pause < 0.0002:\n        pass\n")
    run = _launched(prog, 4, cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert run.stderr.startswith("spmdsim mpirun: error on simulated rank 0: NotImplementedError: a communicator "
                                 "from an MPI handle"), run.stderr
    lines = run.stdout.splitlines()
    assert lines and [line for line in lines if not re.fullmatch(r"rank [123] says hello", line)] == [], lines[:5]


def test_a_program_sees_what_is_set_on_builtins(tmp_path, capsys):
    """The program's own __import__ (rank_modules.rank_builtins) leaves every other builtin the builtins module's,
    read when asked: a name a program sets on `builtins` is found bare, and an unknown one is a NameError."""
    program = tmp_path / "builtins_set.py"
    program.write_text("import builtins\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                       "if comm.rank == 0:\n    builtins.spmdsim_answer = 42\ncomm.Barrier()\n"
                       "print(comm.rank, spmdsim_answer, len([1, 2]))\ncomm.Barrier()\n"
                       "if comm.rank == 0:\n    del builtins.spmdsim_answer\ncomm.Barrier()\nspmdsim_answer\n")
    assert main(["mpirun", "-n", "2", str(program)]) == 1
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["0 42 2", "1 42 2"]
    assert err.startswith("spmdsim mpirun: error on simulated ranks 0,1: NameError: name 'spmdsim_answer' is not "
                          "defined\n"), err


def test_numpy_reads_and_writes_files_by_path_and_a_program_sees_its_own_open(tmp_path, capsys):
    """numpy's tofile and fromfile of a path look "open" up in their caller's builtins from C, where the
    program's builtins (rank_modules.rank_builtins) had no such entry: "SystemError: <method 'tofile' of
    'numpy.ndarray' objects> returned NULL without setting an exception". A program that replaces builtins.open
    still sees its own, bare."""
    program = tmp_path / "numpy_files.py"
    program.write_text("import builtins\nimport numpy as np\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.rank\n"
                       f"path = {str(tmp_path)!r} + f'/a{{r}}.bin'\nnp.arange(3.0 + r).tofile(path)\n"
                       "print(r, np.fromfile(path).tolist())\nreal = builtins.open\n"
                       "builtins.open = lambda *a, **k: 'mine'\nprint(r, open(path))\nbuiltins.open = real\n")
    assert main(["mpirun", "-n", "2", str(program)]) == 0
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["0 [0.0, 1.0, 2.0]", "0 mine", "1 [0.0, 1.0, 2.0, 3.0]", "1 mine"], err


@pytest.mark.parametrize("argv, said", [
    (["prog.py", "-n", "4"], "-n N goes before the program, not after it (there it is the program's own "
                             "argument): spmdsim mpirun -n 4 python prog.py"),
    (["python", "prog.py", "-np=4"], "-np N goes before the program, not after it (there it is the program's own "
                                     "argument): spmdsim mpirun -n 4 python prog.py"),
    (["prog.py"], "-n N is missing: the number of simulated ranks, as in spmdsim mpirun -n 4 python prog.py"),
])
def test_ranks_missing_or_after_the_program_is_one_line(argv, said, capsys):
    # argparse said 'the following arguments are required: -n/-np/--np' under its usage, for `-n` it had been given
    assert main(["mpirun", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and unfold(out.err) == f"spmdsim mpirun: error: {said}\n"


def test_ranks_failing_otherwise_are_named_and_a_chdir_moves_no_later_ranks_script(tmp_path, capsys, monkeypatch):
    """The lowest failing rank's traceback, then a line for each rank that failed otherwise (rank 2's
    ValueError came first and was not said); a script given relative to a folder rank 0 left by os.chdir still
    starts on the later ranks (each opened it as it started: FileNotFoundError from spmdsim's frames)."""
    prog = tmp_path / "two.py"
    prog.write_text("import time\nfrom mpi4py import MPI\nrank = MPI.COMM_WORLD.Get_rank()\n"
                    "if rank == 1:\n    time.sleep(0.2)\n    {}['b']\nif rank == 2:\n    int('x')\n"
                    "MPI.COMM_WORLD.Barrier()\n")
    assert main(["mpirun", "-n", "4", "python", str(prog)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("spmdsim mpirun: error on simulated rank 1: KeyError: 'b'\n")
    assert err.endswith("spmdsim mpirun: also failed: rank 2: ValueError: invalid literal for int() with base 10: "
                        "'x'\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "moves.py").write_text("import os\nfrom mpi4py import MPI\n"
                                                "if MPI.COMM_WORLD.Get_rank() == 0:\n    os.chdir(os.sep)\n"
                                                "print(os.path.basename(__file__))\n")
    monkeypatch.chdir(tmp_path / "sub")
    try:
        assert main(["mpirun", "-n", "4", "python", "moves.py"]) == 0
    finally:
        os.chdir(tmp_path)
    assert capsys.readouterr().out.splitlines() == ["moves.py"] * 4


@pytest.mark.parametrize("message", [
    "if comm.rank == 0:\n    comm.Send([np.arange(4.0), 1, t], dest=1)\n"
    "else:\n    comm.Recv([np.zeros(4), 1, t], source=0)\n",
    "comm.Scatter([np.arange(8.0), 1, t], [np.zeros(4), 1, t], root=0)\n",
    "t = MPI.DOUBLE.Create_contiguous(2)\nif comm.rank == 0:\n    comm.Send([np.arange(4.0), 1, t], dest=1)\n"
    "else:\n    comm.Recv(np.zeros(2), source=0)\n",
    "buf = np.zeros(8)\nwin = MPI.Win.Create(buf, disp_unit=8, comm=comm)\nwin.Fence()\n"
    "if comm.rank == 0:\n    win.Put([np.arange(4.0), 1, t], 1)\nwin.Fence()\n"],
    ids=["Send", "Scatter", "contiguous", "Put"])
def test_a_datatype_not_committed_is_refused_at_the_programs_line(tmp_path, capsys, message):
    """MPI refuses a message or a one-sided operation of a derived datatype never committed (MPI.ERR_TYPE),
    a contiguous one too; the report named the packing call MPI_Pack_size_c (a Scatter's: MPI_Pack_c) on
    MPI_COMM_SELF, which the program never made, and showed spmdsim's frames; a contiguous type's Send and
    a Put went through. Under Open MPI, whose Pack_size reads a type not committed, the process crashed."""
    prog = tmp_path / "nocommit.py"
    prog.write_text("import numpy as np\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
                    "t = MPI.DOUBLE.Create_vector(2, 1, 2)\n" + message)
    assert main(["mpirun", "-n", "2", "python", str(prog)]) == 1
    err = capsys.readouterr().err
    assert "datatype has not been committed: call its .Commit()" in err
    assert "Pack" not in err and "spmdsim/emulator" not in err, err


def test_maxloc_of_plain_doubles_is_refused_at_the_programs_line(tmp_path, capsys):
    """MPI.MAXLOC takes (value, index) pairs; on plain doubles MPI raises MPI.ERR_OP. The report showed the
    thread engine's eight frames and MPI_Reduce_local_c on a datatype the program never made."""
    prog = tmp_path / "maxloc.py"
    prog.write_text("import numpy as np\nfrom mpi4py import MPI\n"
                    "MPI.COMM_WORLD.Allreduce(np.ones(2), np.empty(2), op=MPI.MAXLOC)\n")
    assert main(["mpirun", "-n", "2", "python", str(prog)]) == 1
    err = capsys.readouterr().err
    assert "MPI.MAXLOC is not defined on floating data: MPI defines it on (value, index) pair" in err
    assert "Reduce_local" not in err and "spmdsim/runtime" not in err, err


def test_a_rank_that_failed_before_ctrl_c_is_still_named(tmp_path):
    """Rank 0 raises while the others compute outside MPI (its report would come when they next call it):
    Ctrl-C then said only that the ranks were stopped, and the error was lost."""
    prog = tmp_path / "busy.py"
    prog.write_text("import time\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.rank == 0:\n"
                    "    raise RuntimeError('bad config on rank 0')\ntime.sleep(60)  # (outside MPI)\n")
    run = subprocess.run(["timeout", "-s", "INT", "-k", "10", "3", sys.executable, "-m", "spmdsim", "mpirun", "-n",
                          "3", "python", str(prog)], capture_output=True, text=True, timeout=60)
    assert run.returncode in (124, 130), run
    assert run.stderr.splitlines()[-2:] == [
        "spmdsim mpirun: interrupted (Ctrl-C): the simulated ranks were stopped",
        "spmdsim mpirun: rank 0 had failed at busy.py:4: RuntimeError: bad config on rank 0"], run.stderr


def test_a_keyboardinterrupt_the_program_raises_is_its_error_not_ctrl_c(tmp_path):
    """`raise KeyboardInterrupt` on rank 1 is the program's error, reported with its traceback and Python's exit
    status, 130, as `mpiexec -n 4 python -m mpi4py prog.py` prints it; the run said "interrupted (Ctrl-C)",
    which no one pressed."""
    prog = tmp_path / "kbd.py"
    prog.write_text("from mpi4py import MPI\nif MPI.COMM_WORLD.rank == 1:\n    raise KeyboardInterrupt\n"
                    "MPI.COMM_WORLD.Barrier()\n")
    run = subprocess.run([sys.executable, "-m", "spmdsim", "mpirun", "-n", "3", "python", str(prog)],
                         capture_output=True, text=True, timeout=120)
    err = run.stderr
    assert run.returncode == 130, err
    assert err.startswith("spmdsim mpirun: error on simulated rank 1: KeyboardInterrupt\n"), err  # (no ': ')
    assert 'kbd.py", line 3, in <module>' in err and "Ctrl-C" not in err, err


@pytest.mark.parametrize("end, code, said", [("MPI.COMM_WORLD.Abort(3)", 3, "called Abort(3) on the world"),
                                             ("raise ValueError('boom')", 1, "ValueError: boom")])
def test_a_failed_run_ends_though_threads_its_ranks_started_compute_on(tmp_path, end, code, said):
    """Each rank starts a thread (no daemon) that computes forever, then rank 0 fails: the report was printed and
    the process never exited (Python's exit waits for such threads); MPI_Abort ends every process with its
    threads. It exits with the run's code, its output flushed, saying how many threads it left."""
    prog = tmp_path / "spin.py"
    prog.write_text("import threading\nfrom mpi4py import MPI\n\ndef spin():\n    while True:\n"
                    "        sum(range(100))\n\nthreading.Thread(target=spin).start()\n"
                    "print('rank', MPI.COMM_WORLD.rank, 'started')\nMPI.COMM_WORLD.Barrier()\n"
                    f"if MPI.COMM_WORLD.rank == 0:\n    {end}\nMPI.COMM_WORLD.Barrier()\n")
    run = _launched(prog, 2)
    assert run.returncode == code, run
    assert sorted(run.stdout.splitlines()) == ["rank 0 started", "rank 1 started"], run
    assert said in run.stderr and unfold(run.stderr).endswith(
        "spmdsim mpirun: 2 threads the ranks started still ran 1 s after the run failed: the process exits without "
        "waiting for them\n"), run.stderr


def test_a_run_whose_ranks_ended_says_it_waits_for_the_threads_they_started(tmp_path):
    """Every rank's program returns while a thread it started (no daemon) computes forever: the run waits for
    it, as Python's exit does under mpiexec (which hangs), but said nothing while it did. The thread computes a
    little every 10 ms, never calling MPI (what the run counts as computing), not spinning a core for the 8 s."""
    prog = tmp_path / "spin.py"
    prog.write_text("import threading\nimport time\nfrom mpi4py import MPI\n\ndef spin():\n    while True:\n"
                    "        sum(range(100))\n        time.sleep(0.01)\n\nthreading.Thread(target=spin).start()\n"
                    "print('rank', MPI.COMM_WORLD.rank, 'done')\n")
    run = subprocess.run(["timeout", "-k", "5", "8", sys.executable, "-m", "spmdsim", "mpirun", "-n", "2", "python",
                          str(prog)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 124, run
    assert sorted(run.stdout.splitlines()) == ["rank 0 done", "rank 1 done"], run
    assert unfold(run.stderr) == (
        "spmdsim mpirun: every rank's program ended, and 2 threads the ranks started (no daemons) still run: the "
        "run waits for them, as Python's exit does under mpiexec (Ctrl-C stops them)\n"
        "spmdsim mpirun: terminated (SIGTERM): the simulated ranks were stopped\n"), run.stderr


def test_a_failure_the_other_ranks_have_not_met_is_said_within_seconds(tmp_path):
    """Rank 0 raises while the others are outside MPI for 3.5 s: its failure is said after
    FailureNotice.SOON (2 s), before their next MPI call ends the run and the report follows."""
    prog = tmp_path / "busy.py"
    prog.write_text("import time\nfrom mpi4py import MPI\nif MPI.COMM_WORLD.rank == 0:\n"
                    "    raise RuntimeError('bad config on rank 0')\ntime.sleep(3.5)\nMPI.COMM_WORLD.Barrier()\n")
    run = subprocess.run(["timeout", "-k", "10", "60", sys.executable, "-m", "spmdsim", "mpirun", "-n", "3", "python",
                          str(prog)], capture_output=True, text=True, timeout=90)
    assert run.returncode == 1, run
    assert unfold(run.stderr).startswith("spmdsim mpirun: rank 0 failed at busy.py:4: RuntimeError: bad config on "
                                         "rank 0; the other ranks stop at their next MPI call\nspmdsim mpirun: error "
                                         "on simulated rank 0: RuntimeError: bad config on rank 0\n"), run.stderr


def test_a_package_run_with_m_from_the_working_folder_is_each_ranks_own(tmp_path, capsys, monkeypatch):
    """`python -m mypkg.main` with mypkg in the working folder: each MPI process imports mypkg.util itself; the
    ranks shared one copy (every rank printed util.rank 1 and results [1, 0, 2, 3])."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "util.py").write_text("from mpi4py import MPI\nrank = MPI.COMM_WORLD.Get_rank()\n"
                                                "results = []\n")
    (tmp_path / "mypkg" / "main.py").write_text("from mpi4py import MPI\nfrom mypkg import util\n"
                                                "util.results.append(MPI.COMM_WORLD.Get_rank())\n"
                                                "MPI.COMM_WORLD.Barrier()\nprint(util.rank, util.results)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["mpirun", "-n", "4", "python", "-m", "mypkg.main"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == [f"{r} [{r}]" for r in range(4)]


@pytest.mark.parametrize("flag, value", [("-host", "localhost"), ("--bind-to", "core"), ("-ppn", "4"),
                                         ("-hostfile", "hosts.txt"), ("-host", " ")])  # " " named quoted: ' '
def test_mpiexecs_placement_options_are_refused_saying_ranks_run_here(flag, value, capsys):
    """`-host localhost` was read as `-h ost`: 'argument -h/--help: ignored explicit argument 'ost''."""
    with pytest.raises(SystemExit) as info:
        main(["mpirun", "-n", "4", flag, value, "python", "prog.py"])
    assert info.value.code == 2
    value = value if value.strip() else repr(value)
    assert unfold(capsys.readouterr().err).splitlines()[-1] == (
        f"spmdsim mpirun: error: {flag} {value} says where mpiexec starts its ranks; simulated ranks all run in "
        "this process: leave it out (spmdsim mpirun takes -n N, --eager-limit and --oversubscribe)")


_AFTER_FINALIZE = """\
import sys
from mpi4py import MPI
import numpy as np
comm = MPI.COMM_WORLD
if sys.argv[1:] == ["fatal"]:
    comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
win = MPI.Win.Create(np.zeros(1), comm=comm) if sys.argv[1:] == ["window"] else None
rank = comm.rank
MPI.Finalize()
print(rank, MPI.Is_initialized(), MPI.Is_finalized(), MPI.Get_version() >= (3, 0), MPI.COMM_WORLD == comm)
if rank == 1:
    sys.stdout.flush()
    CALL
    print("went on")
"""


@pytest.mark.parametrize("how, statement, call", [
    ("", "comm.Barrier()", "Barrier"), ("fatal", "comm.Barrier()", "Barrier"), ("", "comm.rank", "Get_rank"),
    ("", "MPI.Finalize()", "Finalize"), ("", "comm.Isend(np.zeros(1), dest=0).Wait()", "Isend"),
    ("", "comm.allreduce(1)", "allreduce"), ("", "MPI.Query_thread()", "Query_thread"),
    ("window", "win.Fence()", "Fence")])
def test_an_mpi_call_after_the_ranks_finalize_ends_the_run_naming_it(tmp_path, capsys, how, statement, call):
    """A call after the rank's MPI.Finalize (a second Finalize too, a window's, and under a fatal error handler,
    whose guard stands between) ends the run with exit code 1, as MPICH ends the job ("Attempting to use an MPI routine
    (internal_Barrier) before initializing or after finalizing MPICH"), in one line naming the call, its line and
    where the rank finalized; what MPICH answers after Finalize answers, and printing goes on."""
    prog = tmp_path / "prog.py"
    prog.write_text(_AFTER_FINALIZE.replace("CALL", statement))
    assert main(["mpirun", "-n", "2", "python", str(prog), how]) == 1
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == ["0 True True True True", "1 True True True True"]
    assert unfold(err) == (f"spmdsim mpirun: simulated rank 1 called {call} (prog.py:13) after its MPI.Finalize "
                           "(prog.py:9): MPICH ends the job there; every rank was stopped\n")


def test_a_run_after_one_ended_by_a_call_after_finalize_runs_as_before(tmp_path, capsys):
    """The check after a rank's Finalize is that rank's alone and ends with its run: the next run in the process
    calls MPI without a word, finalizes and ends 0, and an MPI error under a fatal handler names the program's
    call, not a check between."""
    prog = tmp_path / "prog.py"
    prog.write_text(_AFTER_FINALIZE.replace("CALL", "comm.Get_size()"))
    assert main(["mpirun", "-n", "2", "python", str(prog), "fatal"]) == 1
    assert "called Get_size (prog.py:13) after its MPI.Finalize" in unfold(capsys.readouterr().err)
    again = tmp_path / "again.py"
    again.write_text("from mpi4py import MPI\ncomm = MPI.COMM_WORLD\ncomm.Barrier()\n"
                     "print(comm.allreduce(comm.rank))\nMPI.Finalize()\nprint(MPI.Is_finalized())\n")
    assert main(["mpirun", "-n", "2", "python", str(again)]) == 0
    out, err = capsys.readouterr()
    assert (sorted(out.splitlines()), err) == (["1", "1", "True", "True"], "")
    fatal = tmp_path / "fatal.py"
    fatal.write_text("from mpi4py import MPI\ncomm = MPI.COMM_WORLD\ncomm.Set_errhandler(MPI.ERRORS_ARE_FATAL)\n"
                     "comm.Send(b'x', dest=5)\n")
    assert main(["mpirun", "-n", "2", "python", str(fatal)]) != 0
    err = unfold(capsys.readouterr().err)
    assert "(in Send on the world, whose error handler is MPI.ERRORS_ARE_FATAL; at fatal.py:4)" in err, err
