"""Helpers shared by test modules (pure and MPI; tests/ is on the path, setup.cfg)."""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from types import ModuleType

__all__ = ["MPIEXEC", "MPICH", "MPICH_WAIT_ASLEEP", "EXAMPLE_ARGS", "allgather_after_all", "batch_launches",
           "bench_launches", "factorizations", "load_script", "mpi_batch", "mpich_batch", "mpich_version",
           "program_lines", "readme_library_example", "root_for_all", "wait_for_all"]

# The venv's mpiexec (the pip `mpich` wheel) first, else the one on PATH, else "".
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
if not os.access(MPIEXEC, os.X_OK):
    MPIEXEC = shutil.which("mpiexec") or ""


@functools.cache
def mpich_version() -> tuple | None:
    """(major, minor) of the MPICH whose launcher MPIEXEC is (Hydra's ``--version``), None for another MPI's or
    none: the lab's comparisons with MPICH were made with MPICH 5 (the `mpi` extra's), and MPICH 4.2 departs
    from the standard on two of their programs (tests/test_sim_lab.py, OLDER_MPICH)."""
    if not MPIEXEC:
        return None
    out = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"HYDRA build details:\s+Version:\s+(\d+)\.(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else None


# The mpiexec above when it is MPICH's (Hydra), else "": the tests that compare the emulator with MPICH, what it
# mimics, run beside it alone (under Open MPI its reduction order, messages and banners differ).
MPICH = MPIEXEC if mpich_version() is not None else ""

#: The environment the MPICH side of a comparison runs with: MPICH's heavy yield has the ranks that wait in a
#: blocking call sleep between polls, not spin through sched_yield on the cores the ranks that compute need
#: (4 or 8 ranks on 2 cores). The comparisons' programs mostly wait: test_sim_lab's batch took 2.5-2.7 CPU-s of
#: its children with it, 3.0-5.6 without (6 alternating rounds, load average 8-12), the same lines; mpi4py's
#: demos 5.1-5.4 and 5.8-6.0, the same output; test_sim_mpi4py_orders' five launches 4.2 and 5.6, the same
#: bits. Not for mpi_batch's benches: their 8-rank training steps took more CPU with it (the system time of its
#: sleeps). Another MPI ignores the variable.
MPICH_WAIT_ASLEEP = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


def mpi_says(name: str) -> str:
    """The text this process's MPI gives error class `name` ("ERR_TAG": MPICH's "Invalid tag", Open MPI's
    "MPI_ERR_TAG: invalid tag"), with which the emulator's MPI.Exception starts (it is MPI's own class, its
    detail after); a class the MPI lacks reads as its ERR_ARG (spmdsim.runtime.sim._mpi.mpi_error)."""
    from mpi4py import MPI

    code = getattr(MPI, name)
    return MPI.Get_error_string(MPI.ERR_ARG if code == MPI.ERR_LASTCODE else code)


# Arguments the test runs give examples that would otherwise run for long (training: 2 steps).
EXAMPLE_ARGS = {"train_mindspore_tutorial": ["--steps", "2", "--synthetic"],
                "train_megatron_block": ["--steps", "2"], "train_seed_networks": ["--steps", "2"],
                "train_gpt": ["--layers", "1", "--d-model", "16", "--seq", "8", "--batch", "4", "--steps", "2",
                              "--sample", "4"],
                "train_moe_gpt": ["--layers", "2", "--d-model", "16", "--seq", "8", "--steps", "2", "--dispatch"]}


def on_simulated_ranks(n: int, body):
    """`body()` on `n` simulated ranks whose mpi4py.MPI.COMM_WORLD is their own (the emulator swapped in):
    each rank's result, in rank order."""
    from spmdsim.emulator.mpi4py_world import swapped
    from spmdsim.runtime.sim import simulate

    with swapped():
        return simulate(n, body)


def root_for_all(comm, work):
    """Rank 0's `work()` (local work), broadcast to every rank of `comm`. The others wait without spinning
    (`wait_for_all`), where MPICH's blocking bcast polls and takes the cores rank 0 computes on (8 ranks on 2
    cores: 7 spinning for all of rank 0's work)."""
    result = work() if comm.rank == 0 else None
    wait_for_all(comm)
    return comm.bcast(result, root=0)


def wait_for_all(comm) -> None:
    """Return once every rank of `comm` has called it; meanwhile sleep between polls of an Ibarrier (every
    10 ms), where MPICH's blocking calls poll and take the cores the late ranks still work on. A test's
    blocking collective after one rank's long work goes through it first: while rank 0 drew the 8 pictures of
    docs/tutorials/lab.md's `--png` command, the 3 others spun in the test's allgather as long (4 ranks on 2 cores:
    test_classroom_docs.py 10.7-11.5 CPU-s, 5.8-6.0 with this). spmdsim's polite wait is not used: its
    20-100 us sleeps are for collectives that end within a millisecond, not for seconds of one rank's work."""
    import time

    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.01)


def allgather_after_all(comm, value):
    """`comm.allgather(value)` once every rank has come to it (`wait_for_all`: the early ones sleep)."""
    wait_for_all(comm)
    return comm.allgather(value)


def readme_library_example() -> str:
    """The Python program docs/tutorials/first-program.md quotes (its first python block)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs/tutorials/first-program.md").read_text()
    return re.search(r"^```python\n(.*?)^```", text, re.S | re.M).group(1)


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way to write n as a product of `parts` positive integers."""
    if parts == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0
            for rest in factorizations(n // d, parts - 1)]


def load_script(path: str | os.PathLike, name: str) -> ModuleType:
    """Import a file that is not in a package (scripts/, a test module) as module `name`.

    Registered in sys.modules first: dataclasses look their module up there. Its folder joins the end of
    sys.path, so that it imports the modules beside it as it does when run (scripts/_peer_mpi4py_step.py's
    `_peer_adamw`), whichever test file loads it first.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: The lines of a generated runner (a fresh interpreter, or every rank of an MPI job) that turn a program's
#: SystemExit into its exit code as the interpreter does: None is 0, a message is printed and 1. Shared by
#: `run_scripts`' runner and `mpi_batch`'s, each after ``    try:\n        runpy.run_path(...)``.
_EXITED = """    except SystemExit as exc:  # as the interpreter exits: None is 0, a message is printed and 1
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if code == 1 and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
"""


_SCRIPTS_RUNNER = r"""
import json, os, runpy, sys
cases, folder = json.loads(sys.argv[1]), sys.argv[2]
environ = dict(os.environ)
for i, (path, args) in enumerate(cases):
    sys.stdout.flush(); sys.stderr.flush()
    for fd, suffix in ((1, "out"), (2, "err")):  # this case's own output, C-level writes included
        opened = os.open(os.path.join(folder, f"{i}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.argv, sys.excepthook = [path, *args], sys.__excepthook__  # as a fresh interpreter has them
    os.environ.clear(); os.environ.update(environ)
    here = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, here)
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
""" + _EXITED + r"""    except BaseException as exc:  # as the interpreter ends: the excepthook the script set
        sys.excepthook(type(exc), exc, exc.__traceback__)  # (it may end us), else 1
        code = 1
    finally:
        sys.path.remove(here)
    sys.stdout.flush(); sys.stderr.flush()
    with open(os.path.join(folder, f"{i}.code"), "w") as f:
        f.write(str(code))
"""


def run_scripts(cases: list, tmp: str | os.PathLike, timeout: int = 120) -> list[subprocess.CompletedProcess]:
    """What `python PATH ARGS` gives (exit code, stdout, stderr) for each (path, args) of `cases`, the commands run
    in turn by ONE fresh interpreter where they can be (a Python start and spmdsim's imports, 0.2-0.5 CPU-s, for a
    command that only refuses its arguments): each as a fresh interpreter runs it (runpy as __main__, its argv,
    its folder first on sys.path, Python's own excepthook, the environment as it was), its file descriptors 1
    and 2 its own files. A command that ends the process (an excepthook that exits, as spmdsim's
    install_excepthook does) gets the process's exit code, and the commands after it a fresh interpreter again.
    `tmp`: a folder for the outputs."""
    import json

    results: list = []
    while len(results) < len(cases):
        start = len(results)
        folder = os.path.join(str(tmp), f"scripts-{start}")
        os.makedirs(folder, exist_ok=True)
        done = subprocess.run([sys.executable, "-c", _SCRIPTS_RUNNER,
                               json.dumps([[str(p), list(a)] for p, a in cases[start:]]), folder],
                              capture_output=True, text=True, timeout=timeout)
        for i, (path, args) in enumerate(cases[start:]):
            base = os.path.join(folder, str(i))
            if not os.path.exists(base + ".out"):
                break
            out, err = (open(f"{base}.{s}", errors="replace").read() for s in ("out", "err"))
            ended = not os.path.exists(base + ".code")
            code = done.returncode if ended else int(open(base + ".code").read())
            results.append(subprocess.CompletedProcess([sys.executable, str(path), *args], code, out, err))
            if ended:
                break
        else:
            assert done.returncode == 0, done.stderr  # the runner's own exit, after every command
        assert len(results) > start, done.stderr
    return results


def program_lines(stderr: str) -> list[str]:
    """The non-blank stderr lines a job's ranks printed, without the launcher's own report.

    MPICH's mpiexec adds nothing when a job exits non-zero; Open MPI's prterun
    adds a block between lines of dashes that names itself ("prterun detected
    that one or more processes exited with non-zero status ..."), libevent
    "[warn]" lines, and now and then a line of its PMIx server's about a process
    that exited ("[host:pid] PMIX ERROR: PMIX_ERR_UNREACH in file .../server/pmix_server.c
    at line 3146"). Only such lines are dropped, so anything spmdsim prints counts.
    """
    lines, out, i = stderr.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if _is_rule(line):
            end = next((j for j in range(i + 1, len(lines)) if _is_rule(lines[j])), None)
            block = "\n".join(lines[i:end])
            if end is not None and ("prterun" in block or "mpirun" in block or "Open MPI" in block):
                i = end + 1
                continue
        if line.strip() and not line.startswith("[warn] ") and not _PMIX_SERVER.match(line):
            out.append(line)
        i += 1
    return out


#: A line of Open MPI's launcher's PMIx server (its host and pid, then the error and its source file).
_PMIX_SERVER = re.compile(r"\[[\w.-]+:\d+\] PMIX ERROR: \w+ in file \S*/server/\S+ at line \d+$")


def _is_rule(line: str) -> bool:
    text = line.strip()
    return len(text) >= 20 and set(text) == {"-"}


def unfold(text: str) -> str:
    """An error folded within 100 columns (spmdsim.errors.fold_message) back on one line."""
    return text.replace("\n  ", " ")


def run_train_gpt(argv: list[str], before: str = "", after: str = "",
                  script: str = "train_gpt.py") -> subprocess.CompletedProcess:
    """examples/train_gpt.py (or examples/`script`) with `argv` in a fresh interpreter on one BLAS thread (a
    many-core machine's OpenBLAS reserves address space per thread). `before` and `after`: Python lines run
    there around it (`after` sees its exit code as `code`); the process exits with that code."""
    code = (f"import resource, runpy, sys\n{before}sys.argv = [{script!r}] + {argv!r}\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n    code = 0\n"
            f"except SystemExit as e:\n    code = e.code\n{after}sys.exit(code)\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    return subprocess.run([sys.executable, "-c", code], cwd=examples, capture_output=True, text=True,
                          timeout=300, env=env)


_MARK = "@@ spmdsim program "
_CODES = "@@ spmdsim exit codes "
_TAGGED = ("-prepend-pattern", "<@%r@> ")  # mpiexec tags every chunk of output with its rank


def _batch(programs: list, ranks: int, cwd, stdin: str, timeout: int, mpiexec: str, tagged: bool, env=()):
    """The finished job that runs each (name, path, args) of `programs` in turn on every rank (mpi_batch), with
    the variables of `env` set besides ours."""
    code = f"""
import os, runpy, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
for name, path, args in {[(name, str(path), list(args)) for name, path, args in programs]!r}:
    if {tagged!r} or comm.rank == 0:
        print({_MARK!r} + name, flush=True)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
{_EXITED}    sys.path.pop(0)
    sys.stdout.flush()
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.001)
    codes = comm.gather(code)
    if comm.rank == 0:
        print({_CODES!r} + repr(codes), flush=True)
"""
    return subprocess.run(["timeout", "-k", "5", str(timeout), mpiexec, "-n", str(ranks), *(_TAGGED if tagged else ()),
                           sys.executable, "-m", "mpi4py", "-c", code], input=stdin, capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1", **dict(env)))  # ranks outnumber the cores


def _cut(text: str) -> list:
    """[(name, its text, its exit codes or None)] of one stream of _batch's output, cut where a marker starts, also
    within a line: a program's output may end without a newline (cpi.py's last prompt); text before the first
    marker, if any, goes under None (not a program's)."""
    cut = re.split(re.escape(_MARK) + r"(.*)\n", text)
    found = []
    for name, part in zip([None] + cut[1::2], cut[0::2]):
        codes = re.split(re.escape(_CODES) + r"(.*)\n", part)
        found.append((name, "".join(codes[0::2]), ast.literal_eval(codes[1]) if len(codes) > 1 else None))
    return found


def mpi_batch(programs: list, ranks: int, cwd: str | os.PathLike | None = None, timeout: int = 300,
              mpiexec: str = MPIEXEC) -> dict:
    """{name: (each rank's exit code, what the job printed)} for each (name, path, args) of `programs`, all run by
    ONE mpiexec job (mpiexec's start and each rank's imports are most of a short program's cost): each rank runs
    each program in turn as `python PATH ARGS` would (runpy as __main__, its argv, its directory first on
    sys.path; SystemExit is its exit code), rank 0 printing a marker line before it; then an Ibarrier polled
    with 1 ms sleeps (in MPICH's blocking Barrier the ranks done first spin on the cores the others still
    need) and a gather of the codes. For programs whose ranks other than 0 print nothing (any mpiexec:
    the ranks' output is not tagged); the job must end with exit 0 (an exception ends it: mpi4py's -m)."""
    return mpi_batch_streams(programs, ranks, cwd, timeout, mpiexec)[0]


def mpi_batch_streams(programs: list, ranks: int, cwd: str | os.PathLike | None = None, timeout: int = 300,
                      mpiexec: str = MPIEXEC) -> tuple[dict, str]:
    """(mpi_batch's answer, everything the job wrote to stderr): for programs whose errors go there (the
    examples' refusals, one line each, which a test counts in the job's whole stderr)."""
    done = _batch(programs, ranks, cwd, "", timeout, mpiexec, tagged=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {name: (codes, text) for name, text, codes in _cut(done.stdout) if name is not None or text}
    assert list(found) == [name for name, _, _ in programs], done.stdout
    return found, done.stderr


def mpich_batch(programs: list, ranks: int, cwd: str | os.PathLike | None = None, stdin: str = "") -> dict:
    """{name: [each rank's lines, in rank order]}: what `mpiexec -n RANKS python PATH *ARGS` prints for each
    (name, path, args) of `programs`, all run by ONE mpiexec job, as mpi_batch runs them (each must exit 0 on
    every rank), every rank printing the marker. `stdin` goes to rank 0 (as mpiexec forwards it), for the
    programs that read it. MPICH's mpiexec tags each chunk of output with its rank, so the lines are each
    rank's whole, however MPICH interleaves the ranks' chunks (4 ranks on 2 cores, test_sim_lab's batch:
    6.2-6.6 CPU-s with a blocking Barrier between programs, 2.5-3.6 with the polled Ibarrier; with
    test_loop_late.py and test_loop_feeding.py, whose rank 0 spins while it polls, at 0.8 s and 5 x 0.2 s,
    3.9-4.0 CPU-s, the fixture's call under /usr/bin/time, 3 rounds, load average 3.6-4.5); its ranks wait
    asleep (MPICH_WAIT_ASLEEP)."""
    if not MPICH:  # the emulator is compared with MPICH, what it mimics (docs/explanation/runtime.md)
        import pytest

        pytest.skip(f"compares the emulator with MPICH's mpiexec; {MPIEXEC or 'none'} is another MPI's launcher")
    done = _batch(programs, ranks, cwd, stdin, 300, MPIEXEC, tagged=True, env=MPICH_WAIT_ASLEEP)
    assert done.returncode == 0, done.stderr
    parts = re.split(r"<@(\d+)@> ", done.stdout)
    texts: dict = {}
    for rank, chunk in zip(parts[1::2], parts[2::2]):
        texts[int(rank)] = texts.get(int(rank), "") + chunk
    found: dict = {}
    for rank in sorted(texts):
        for name, text, codes in _cut(texts[rank]):
            assert codes is None or codes == [0] * ranks, (name, codes, done.stderr)
            if name is not None or text:
                found.setdefault(name, [[] for _ in range(ranks)])[rank] = text.splitlines()
    assert list(found) == [name for name, _, _ in programs], done.stdout
    return found


_WITH_ENV = """
import os, runpy, sys
changes, path = {changes}, sys.argv[1]
saved = {{key: os.environ.get(key) for key in changes}}
for key, value in changes.items():
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
for entry in reversed((changes.get("PYTHONPATH") or "").split(os.pathsep)):
    if entry and entry not in sys.path:
        sys.path.insert(0, entry)  # as the launch's PYTHONPATH would put it
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
try:
    runpy.run_path(path, run_name="__main__")
finally:
    sys.path.remove(os.path.dirname(os.path.abspath(path)))
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
"""


def batch_launches(launches: list, tmp: str | os.PathLike, timeout: int = 300) -> dict:
    """{name: (exit code, stdout, stderr)} for each (name, cmd, env) of `launches`, a launch's command line and its
    environment as a script would hand them to subprocess.run. Launches of the form ``[timeout -k K S] mpiexec -n
    RANKS python PATH ARGS`` with the same RANKS run as programs of ONE mpiexec job (mpi_batch: mpiexec's start
    and each rank's imports are most of a short launch's cost), each with its environment's differences from
    ours set around it (os.environ, and PYTHONPATH's entries on sys.path; an environment read when a program
    runs, as spmdsim reads SPMDSIM_WAIT when a mesh is made, holds; one read at a process's start would not);
    their stdout is rank 0's, their stderr "" (only the job's, on failure). Any other launch runs by itself,
    as given. `tmp`: a folder for the wrapper program."""
    wrapper = os.path.join(str(tmp), "_with_env_program.py")
    batches: dict = {}
    done: dict = {}
    for name, cmd, env in launches:
        rest = cmd[4:] if cmd[:2] == ["timeout", "-k"] else cmd
        if len(rest) > 4 and os.path.basename(rest[0]) == "mpiexec" and rest[1] == "-n" and rest[3] == sys.executable:
            changes = {key: value for key, value in env.items() if os.environ.get(key) != value}
            changes |= {key: None for key in os.environ if key not in env}
            batches.setdefault(int(rest[2]), []).append((name, changes, rest[4:]))
        else:
            ran = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
            done[name] = (ran.returncode, ran.stdout, ran.stderr)
    for ranks, programs in batches.items():
        for k, (name, changes, argv) in enumerate(programs):
            path = f"{wrapper[:-3]}_{ranks}_{k}.py"
            with open(path, "w") as f:
                f.write(_WITH_ENV.format(changes=repr(changes)))
            programs[k] = (name, path, argv)
        found = mpi_batch(programs, ranks, timeout=timeout)
        for name, (codes, text) in found.items():
            done[name] = (max(codes, key=abs), text, "")
    return {name: done[name] for name, _, _ in launches}


def bench_launches(bench, args, workers: list, tmp: str | os.PathLike, here: tuple = ()) -> dict:
    """{worker: its result} for each (worker, check) of `workers`, launched as scripts/bench_gpt.py (`bench`, loaded
    by load_script) would launch it (its _command), the MPI ones batched (batch_launches), each result parsed
    from its output as the script parses it (its _result; a failed launch fails here with its output). The
    workers named in `here` (bench_gpt's own workers that launch no ranks of their own: "ref", "one", "sim", ...)
    run in this process instead, as `bench_gpt.py --worker W` would run them (bench._worker)."""
    import argparse
    import contextlib
    import io

    launches = [(worker, *bench._command(args, worker, check)) for worker, check in workers if worker not in here]
    ran = dict(batch_launches(launches, tmp))
    for worker in here:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            bench._worker(argparse.Namespace(**{**vars(args), "worker": worker}))
        ran[worker] = (0, printed.getvalue(), "")
    results = {}
    for worker, (code, out, err) in ran.items():
        results[worker] = bench._result(worker, code, out, err)
        assert results[worker] is not None and code == 0, (worker, code, out, err)
    return results


def moe_layer_on_ranks(moe, mesh_shape: tuple, p: dict, x, g, batch: int, algorithms=None) -> list:
    """Each simulated rank of a (dp, ep, tp) mesh, or a (dp, ep, tp, etp) one (four sizes: tp split for the experts'
    own tp, spmdsim.models.moe.fold): (output, loss value, every parameter's gradient, d x, its MoEStats, the
    trace's op names) of one MoE layer "h1." (spmdsim.models.moe.layer) on parameters `p` (whole arrays, laid out
    as spmdsim.models.gpt.layouts lays them), tokens `x` (batch * seq, d_model) batch-first, for the loss
    sum(y * g) + the router losses; the output and d x batch-first rows again, the gradients whole."""
    import numpy as np

    import spmdsim
    from spmdsim.nn import ops
    from spmdsim.models.moe.layer import moe_layer
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.trace import collect_trace

    rows, D = x.shape
    T = rows // batch
    maps = {"router": (None, None), "w1": ("ep", None, "tp"), "b1": ("ep", "tp"), "w2": ("ep", "tp", None),
            "b2": ("ep", None), "w3": ("ep", None, "tp"), "b3": ("ep", "tp")}  # (w3, b3: SwiGLU experts')
    names = ("dp", "ep", "tp", "etp")[:len(mesh_shape)]
    inner = "etp" if len(mesh_shape) == 4 else None  # the experts' own tp where tp is split for it
    if moe.etp == 1 and mesh_shape[2] > 1 or inner:  # folded (spmdsim.models.moe.fold): experts over ("ep", "tp")
        maps = {n: tuple(("ep", "tp") if e == "ep" else inner if e == "tp" else e for e in m) for n, m in maps.items()}

    def run():
        mesh = spmdsim.Mesh(spmdsim.Layout(mesh_shape, names), spmdsim.world(), algorithms=algorithms)
        L = mesh.layout
        params = {n: DTensor.from_global(mesh, v, L(*maps[n.split(".")[-1]])).requires_grad_() for n, v in p.items()}
        seq_first = L(None, ("dp", "ep"), None)
        xd = DTensor.from_global(mesh, x.reshape(batch, T, D).transpose(1, 0, 2), seq_first).requires_grad_()
        gd = DTensor.from_global(mesh, g.reshape(batch, T, D).transpose(1, 0, 2), seq_first)
        stats: list = []
        with collect_trace() as trace:
            y, losses = moe_layer(xd, params, "h1.", moe, stats)
            loss = ops.resolved(ops.sum(y * gd) + losses)
            loss.backward()
        whole = L(None, None, None)
        grads = {n: t.grad.redistribute(L(*([None] * len(t.global_shape)))).local for n, t in params.items()}
        dx = xd.grad.redistribute(whole).local.transpose(1, 0, 2).reshape(rows, D)
        out = y.redistribute(whole).local.transpose(1, 0, 2).reshape(rows, D)
        return out, float(loss.local), grads, dx, stats, sorted({e.op for e in trace.entries})

    return spmdsim.simulate(int(np.prod(mesh_shape)), run)
