"""The bad-input matrix: each case under `mpiexec -n 8` ends with one line on every rank's behalf.

Every case asserts: exit code 2 (every rank raised the same error within the
guard's grace; one rank alone would abort with 1), exactly one
``spmdsim: error: ...`` line naming the offending value, no traceback, and no
hang (each launch runs under ``timeout -k``; a hang exits 124).

The cases share one launch: a driver runs them one after the other on the same
8 ranks, each library case inside ``abort_on_error()`` and each CLI case as
``spmdsim.tools.cli.main.main(argv)`` (what ``python -m spmdsim`` runs), and rank 0
marks where each case starts and ends and what its exit code is. Starting 8
Pythons is most of a launch's cost (1-12 s on a loaded 2-core machine), so one
launch for the whole matrix instead of one per case. Two cases also run alone
to the end of their process: through the documented guard one-liner
(``install_excepthook``) and through ``python -m spmdsim``, so the real exit
code and output of a whole job stay tested. docs/explanation/reliability.md lists the messages.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shellkit import as_a_shell_starts_it
from testkit import MPIEXEC as _MPIEXEC
from testkit import mpi_batch_streams

RANKS = 8

pytestmark = pytest.mark.skipif(not _MPIEXEC, reason="no mpiexec")

# The guard one-liner (docs/explanation/reliability.md), then a mesh over every rank.
_HOOK = "from spmdsim.runtime import install_excepthook; install_excepthook()\n"
_PRELUDE = """\
import numpy as np
from spmdsim import Layout, SeededTensor
from spmdsim.runtime import Mesh, DTensor
from spmdsim.nn.ops import embedding, matmul
mesh = Mesh(Layout((8,), ("mp",)))
"""

_MM = ["run", "matmul", "--shape", "16,16,16"]
_DM = ["--device-matrix", "2,4", "--alias-name", "dp,mp"]

#: case id -> (argv after `python`, text the error line must contain)
CASES = {
    "cli-unknown-alias": (_MM + _DM + ["--x-map", "dp,zz", "--w-map", "mp,None"], "'zz'"),
    "lib-unknown-alias": ('mesh.layout("mp", "sp")', "'sp'"),
    "cli-axis-twice": (_MM + _DM + ["--x-map", "dp,dp", "--w-map", "mp,None"], "'dp' is used more"),
    "cli-map-length": (_MM + _DM + ["--x-map", "dp", "--w-map", "mp,None"], '("dp",)'),
    "cli-indivisible": (["run", "matmul", "--shape", "16,10,16"] + _DM
                        + ["--x-map", "dp,mp", "--w-map", "mp,None"], "size 10"),
    "cli-world-size": (["run", "matmul", "--shape", "16,16,16", "--device-matrix", "2,2",
                        "--alias-name", "dp,mp", "--x-map", "dp,mp", "--w-map", "mp,None"],
                       "(2, 2)"),
    "lib-world-size": ('Mesh(Layout((3,), ("x",)))', "(3,)"),
    "cli-strategy-divides": (_MM + ["--strategy", "((3,1),(1,1))"], "((3, 1), (1, 1))"),
    "cli-contraction": (_MM + _DM + ["--x-map", "dp,mp", "--w-map", "None,mp"],
                        'over "mp" in x'),
    "lib-contraction": ('x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, 16)))\n'
                        'w = DTensor.from_seeded(mesh, mesh.layout(None, None), SeededTensor((16, 4)))\n'
                        "matmul(x, w)", 'over "mp" in x'),
    "lib-embedding-range": ('ids = DTensor.from_local(mesh, np.array([[1, 70]]), mesh.layout(None, None), (1, 2))\n'
                            'table = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((64, 4)))\n'
                            "embedding(ids, table)", "id 70"),
    "lib-embedding-float": ('ids = DTensor.from_local(mesh, np.array([[1.0, 7.0]]), mesh.layout(None, None), (1, 2))\n'
                            'table = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((64, 4)))\n'
                            "embedding(ids, table)", "'float64'"),
    "lib-local-shape": ('DTensor.from_local(mesh, np.zeros((3, 4)), mesh.layout("mp", None), (16, 4))',
                        "(3, 4)"),
    "lib-local-dtype": ('DTensor.from_local(mesh, np.zeros((2, 4)), mesh.layout("mp", None), (16, 4), '
                        'dtype="float32")', "'float64'"),
    "lib-nan-given": ("src = SeededTensor((16, 8), seed=1); full = src.full(); full[5, 3] = np.nan\n"
                      'x = DTensor.from_global(mesh, full, mesh.layout("mp", None))\n'
                      "x.check(src).raise_if_failed()", "1 non-finite"),
    "lib-inf-produced": ("xs = SeededTensor((8, 16), seed=1, low=1e20, high=2e20)\n"
                         "ws = SeededTensor((16, 8), seed=2, low=1e20, high=2e20)\n"
                         'x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), xs)\n'
                         'w = DTensor.from_seeded(mesh, mesh.layout("mp", None), ws)\n'
                         "y = matmul(x, w)\n"
                         "y.check(xs.full().astype(np.float64) @ ws.full().astype(np.float64))"
                         ".raise_if_failed()", "64 non-finite"),
    # 1.5 used to pass gather's range check and hang the job.
    "lib-gather-root": ('x = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((16, 4)))\n'
                        "x.gather(root=1.5)", "gather root 1.5"),
    "lib-object-dtype": ('DTensor.from_global(mesh, np.zeros((16, 4), object), mesh.layout("mp", None))',
                         "'|O' (object)"),
    "lib-global-differs": ('DTensor.from_global(mesh, np.random.default_rng().standard_normal((16, 4)), '
                           'mesh.layout("mp", None))', "ranks 0 and 1 passed different arrays"),
    "lib-matmul-ndarray": ('x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, 16)))\n'
                           "matmul(x, np.ones((16, 4)))", "got ndarray of shape (16, 4)"),
    "cli-bad-strategy": (_MM + ["--strategy", "((2,1),(1,4)"], "'((2,1),(1,4)'"),
    "cli-bad-sbp": (["run", "redistribute", "--device-matrix", "2,4", "--alias", "a,b",
                     "--from-sbp", "S(x),B", "--to", "None,b", "--shape", "8,8"], "'S(x)'"),
}


def launch(argv: list[str], limit: float = 30.0, ranks: int = RANKS,
           env: dict | None = None) -> tuple[int, str, float]:
    """Run `python argv...` on `ranks` ranks under timeout; (rc, stdout+stderr, seconds)."""
    full_env = dict(os.environ, SPMDSIM_EXPECT_WORLD=str(ranks), OMP_NUM_THREADS="1",
                    OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    full_env.update(env or {})
    cmd = ["timeout", "-k", "2", str(int(limit)), _MPIEXEC, "-n", str(ranks), sys.executable, *argv]
    start = time.perf_counter()
    # In a session of its own, ended whole afterwards: a `timeout` killed from outside (the OOM killer on a
    # loaded machine) leaves mpiexec running, and its ranks waiting for a peer, past the test.
    # Started as a shell starts it: the sigint-alone fault's own SIGINT must reach its rank.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                            start_new_session=True, preexec_fn=as_a_shell_starts_it)
    try:
        out, _ = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the whole job ended: the usual case
            pass
    return proc.returncode, out, time.perf_counter() - start


# Runs the cases of argv[1] (a JSON list of [name, spec]) one after the other on every rank.
# Rank 0 writes all it prints to the file argv[2], in order: through mpiexec, the other ranks'
# lines (numpy's overflow warning on every rank, say) could land in the middle of rank 0's.
_DRIVER = """\
import json, sys, time
from mpi4py import MPI
from spmdsim.tools.cli.main import main
from spmdsim.runtime import abort_on_error
comm = MPI.COMM_WORLD
if comm.rank == 0:
    sys.stdout = sys.stderr = open(sys.argv[2], "w", buffering=1)
for name, spec in json.loads(sys.argv[1]):
    request = comm.Ibarrier()  # polled with sleeps: MPICH's blocking Barrier spins on the cores others need
    while not request.Test():
        time.sleep(0.001)
    if comm.rank == 0:
        print("== case", name)
    try:
        if isinstance(spec, str):
            with abort_on_error():
                exec(PRELUDE + spec, {})
            code = 0
        else:
            code = main(spec)
    except SystemExit as exc:  # abort_on_error's clean all-ranks exit, or argparse's
        code = exc.code
    if comm.rank == 0:
        print("== end", name, "rc", code)
"""

_MARK = re.compile(r"^== case (\S+)$(.*?)^== end \1 rc (\S+)$", re.S | re.M)


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> tuple[int, str, str, dict[str, tuple[str, str]]]:
    """One launch of every case: (rc, the job's output, rank 0's file,
    {case: (exit code, what rank 0 printed between its markers)})."""
    cases = json.dumps([(name, spec) for name, (spec, _) in sorted(CASES.items())])
    log = tmp_path_factory.mktemp("bad_inputs") / "rank0.txt"
    rc, out, seconds = launch(["-c", _DRIVER.replace("PRELUDE", repr(_PRELUDE)), cases, str(log)],
                              limit=120)
    print(f"\n{len(CASES)} cases in one launch: rc={rc} {seconds:.2f} s")
    rank0 = log.read_text() if log.exists() else ""
    return rc, out, rank0, {m.group(1): (m.group(3), m.group(2)) for m in _MARK.finditer(rank0)}


def _one_line(out: str, needle: str) -> None:
    errors = [line for line in out.splitlines() if line.startswith("spmdsim: error")]
    assert "Traceback" not in out, out
    assert len(errors) == 1 and errors[0].startswith("spmdsim: error: "), out
    assert needle in errors[0], (needle, errors[0])


def test_the_batch_ran_every_case_and_only_rank_0_spoke(batch) -> None:
    rc, out, rank0, found = batch
    assert rc == 0, (rc, out, rank0)  # every case ended cleanly, and the driver with it
    assert sorted(found) == sorted(CASES), rank0
    assert "Traceback" not in out + rank0, (out, rank0)
    # The other ranks print no error line of their own (the guard has rank 0 speak for all).
    assert not [line for line in out.splitlines() if "spmdsim: " in line], out


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_ends_the_job_with_one_line(case: str, batch) -> None:
    spec, needle = CASES[case]
    code, out = batch[3].get(case, (None, batch[2]))
    print(f"\n{case}: rc={code} {out.strip()!r}")
    assert code == "2", (code, out)  # 2: a clean error raised on every rank (the guard's exit code)
    _one_line(out, needle)


def test_the_doc_quotes_each_cases_line_as_it_is_printed(batch) -> None:
    """docs/explanation/reliability.md's table of these cases quotes each message exactly: two rows had drifted from
    what the program prints ("has 1 entries" for "has 1 entry"; "e.g. w mapped ("mp", "mp")", itself an invalid map,
    for ("mp", None)). Each case's line, unwrapped, is in the doc (lines the doc abridges with "..." aside)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "explanation" / "reliability.md").read_text()
    missing = []
    for case, (_, out) in sorted(batch[3].items()):
        line = " ".join(out.split("spmdsim: error: ", 1)[-1].split())  # unwrapped (the 100-column wrap)
        line = line.replace("|", "\\|")  # as a Markdown table cell writes it
        if f"`spmdsim: error: {line}`" not in doc and not _abridged(line, doc):
            missing.append((case, line))
    assert len(batch[3]) == len(CASES) and not missing, missing


def _abridged(line: str, doc: str) -> bool:
    """Whether the doc quotes `line` cut short: a quoted message ending in "..." whose start (20 characters at
    least) `line` has."""
    starts = [q[:-3].rstrip() for q in re.findall(r"`spmdsim: error: ([^`]*\.\.\.)`", doc)]
    return any(len(start) >= 20 and line.startswith(start) for start in starts)


#: A case of each kind run alone to the end of its process, on 3 ranks (any count shows it).
ALONE = {
    "cli": (["-m", "spmdsim", *_MM, "--strategy", "((2,1),(1,4)"], "'((2,1),(1,4)'"),
    "lib": (["-c", _HOOK + _PRELUDE.replace("(8,)", "(3,)") + 'mesh.layout("mp", "sp")'], "'sp'"),
}


@pytest.mark.parametrize("kind", sorted(ALONE))
def test_a_case_alone_ends_its_process_with_2_and_one_line(kind: str) -> None:
    argv, needle = ALONE[kind]
    rc, out, seconds = launch(argv, ranks=3)
    print(f"\n{kind} alone: rc={rc} {seconds:.2f} s")
    assert rc == 2, (rc, out)
    _one_line(out, needle)


def test_a_script_under_mpiexec_ends_with_one_line(tmp_path) -> None:
    """`spmdsim.script(__file__)` (every example but the training ones) guards the MPI ranks: one line each."""
    path = tmp_path / "user_script.py"
    path.write_text("import spmdsim\nspmdsim.script(__file__)\n" + _PRELUDE.replace("(8,)", "(3,)")
                    + 'mesh.layout("mp", "sp")\n')
    rc, out, seconds = launch([str(path)], ranks=3)
    print(f"\nscript alone: rc={rc} {seconds:.2f} s")
    assert rc == 2, (rc, out)
    _one_line(out, "'sp'")


#: The training examples' refusals of their command line: case -> (example, argv, the line it prints once).
EXAMPLES = {
    "steps": ("train_gpt.py", ["--steps", "0"], "spmdsim: error: --steps 0 must be at least 1"),
    "every": ("train_moe_gpt.py", ["--every", "0"],
              "spmdsim: error: --every 0 must be at least 1 (print every N steps)"),
    "temperature": ("train_gpt.py", ["--temperature", "-1"],
                    "spmdsim: error: --temperature -1 must be a finite number >= 0 (0: greedy)"),
    "dry-run": ("train_gpt.py", ["--dry-run"],
                "spmdsim: error: --dry-run needs --ranks N (a dry run simulates the ranks in this process)"),
    "unknown-flag": ("train_moe_gpt.py", ["--bogus"], "train_moe_gpt.py: error: unrecognized arguments: --bogus; "
                                                      "see: train_moe_gpt.py --help"),
}


def test_a_training_examples_refusal_under_mpiexec_is_printed_once_and_every_rank_exits_2() -> None:
    """refuse() (spmdsim.models.nets.train) printed on every rank: four copies of "--steps 0 must be at least 1" under
    mpiexec -n 4, at times run together on one line; argparse's error too. Rank 0 says so; every rank
    still exits 2. One launch runs every case (the messages differ, so each is counted in the job's output)."""
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    found, err = mpi_batch_streams([(name, os.path.join(examples, example), args)
                                    for name, (example, args, _) in EXAMPLES.items()], 4, timeout=120)
    for name, (_, _, line) in EXAMPLES.items():
        assert found[name][0] == [2] * 4, (name, found[name], err)
        assert err.count(line) == 1, (name, err)
    assert "usage: " not in err, err  # the unknown flag's error alone, by rank 0 alone
    assert "Traceback" not in err, err
