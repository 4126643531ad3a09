"""Every file in examples/ runs and passes its own check on this world size.

The examples are run in-process (runpy) under the suite's mpiexec rather than
one launch each, which on 2 cores would cost seconds per file. An example that
needs another world size raises a RankCountError on every rank, and is skipped;
any other error fails the test.
"""
from __future__ import annotations

import contextlib
import io
import pathlib
import runpy
import sys

import pytest
from mpi4py import MPI

from spmdsim.errors import RankCountError, SpmdsimError

pytestmark = pytest.mark.mpi(min_size=2)

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[2] / "examples").glob("*.py"))
# Arguments that keep an example short here (the training examples default to 100 steps).
from testkit import EXAMPLE_ARGS as ARGS, allgather_after_all  # noqa: E402


def test_examples_are_found():
    assert len(EXAMPLES) >= 12


def _run_example(path: pathlib.Path, monkeypatch) -> tuple[list, str]:
    """Every rank's exit code (a str: the world size it needs) and this rank's output."""
    comm = MPI.COMM_WORLD
    monkeypatch.setattr(sys, "argv", [str(path)] + ARGS.get(path.stem, []))
    # install_excepthook replaces sys.excepthook; keep the suite's own.
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            code = exc.code
        except SpmdsimError as exc:
            if not isinstance(exc, RankCountError):  # a refusal of this world size, saying the sizes it needs
                raise
            code = str(exc)  # the world size it needs, on every rank alike
    # The ranks end an example at different times (rank 0 prints the verdicts): the early ones sleep
    # until all have come, where MPICH's blocking allgather polls on the cores the late ones need.
    return allgather_after_all(comm, code), out.getvalue()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_passes(path, monkeypatch):
    comm = MPI.COMM_WORLD
    codes, out = _run_example(path, monkeypatch)
    if all(isinstance(c, str) for c in codes):
        pytest.skip(f"{path.name}: {codes[0]}")
    assert codes == [0] * comm.size or codes == [None] * comm.size, (codes, out)
    if comm.rank == 0:
        assert "PASS" in out or "passed" in out, out


def _example(name: str) -> pathlib.Path:
    return next(path for path in EXAMPLES if path.stem == name)


def test_mindspore_tutorial_example_prints_every_ranks_blocks(monkeypatch):
    comm = MPI.COMM_WORLD
    if comm.size != 8:
        pytest.skip("the tutorial's strategies need exactly 8 ranks")
    codes, out = _run_example(_example("net_mindspore_tutorial"), monkeypatch)
    assert codes == [0] * comm.size, (codes, out)
    if comm.rank == 0:
        # images over all 8 ranks; fc1 rows over "k" of (m, k, n) = (2, 4, 1), rank = 4 m + k;
        # fc2 rows over all 8; fc3 whole (data-parallel MatMul3).
        lines = out.splitlines()
        for r in range(8):
            k = r % 4
            assert lines[r] == (f"rank {r}: images[{4 * r}:{4 * r + 4}, 0:1, 0:28, 0:28], "
                                f"fc1[{196 * k}:{196 * k + 196}, 0:512], "
                                f"fc2[{64 * r}:{64 * r + 64}, 0:512], fc3[0:512, 0:10]"), out
        assert lines[8].startswith("net_mindspore_tutorial: ")


def test_paddle_example_prints_every_ranks_blocks(monkeypatch):
    comm = MPI.COMM_WORLD
    p = comm.size
    if 960 % p or 240 % p:
        pytest.skip(f"the Paddle network does not split over {p} ranks")
    codes, out = _run_example(_example("net_paddle_tp"), monkeypatch)
    assert codes == [0] * p, (codes, out)
    if comm.rank == 0:
        v, f = 960 // p, 240 // p
        lines = out.splitlines()
        # Two blocks of rank lines (the lookup, then the MLP's weights) keep within 100 columns.
        for r in range(p):
            assert lines[r] == (f"rank {r} ({r},): ids[0:4, 0:16], "
                                f"table[{v * r}:{v * r + v}, 0:64] + zero padding row"), out
            assert lines[p + r] == (f"rank {r} ({r},): "
                                    f"W1[0:64, {f * r}:{f * r + f}], b1[{f * r}:{f * r + f}], "
                                    f"W2[{f * r}:{f * r + f}, 0:64], b2[0:64]"), out
        assert lines[2 * p].startswith("net_paddle_tp: ")
        assert max(len(line) for line in lines) <= 100, out


def test_readme_library_example_runs_under_mpi(tmp_path, monkeypatch):
    """docs/tutorials/first-program.md's example, as the page quotes it, on this MPI world (it needs 8 ranks)."""
    from testkit import readme_library_example

    comm = MPI.COMM_WORLD
    if comm.size != 8:
        pytest.skip("the first program's layout needs 8 ranks")
    path = tmp_path / "my_matmul.py"
    if comm.rank == 0:
        path.write_text(readme_library_example())
    path = pathlib.Path(comm.bcast(str(path)))
    codes, out = _run_example(path, monkeypatch)
    assert codes == [0] * comm.size, (codes, out)  # it ran to its end on every rank
    if comm.rank == 0:
        lines = out.splitlines()
        assert "rank 1 (0, 1): x[0:32, 24:48], w[24:48, 0:32], y[0:32, 0:32]" in lines
        at = lines.index("ranks 0-7:")
        assert lines[at + 1].startswith("  check passed: ") and lines[-1] == "  {'allreduce': 1}"
    else:
        assert out == ""  # only rank 0 prints: the verdicts come in rank order, not interleaved


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("schedule, replay", [("gpipe", False), ("1f1b", False), ("interleaved", False),
                                              ("interleaved", True)])
def test_train_gpt_over_a_pipeline_under_mpi(schedule, replay, monkeypatch):
    """docs/howto/pipelines.md's pipelined training under MPI: pp 2 x tp 2 (x dp on 8 ranks), checked every step;
    with --replay steps 1-2 replay step 0 (docs/howto/replay.md)."""
    comm = MPI.COMM_WORLD
    if comm.size % 4:
        pytest.skip("pp 2 x tp 2 needs a multiple of 4 ranks")
    path = next(p for p in EXAMPLES if p.stem == "train_gpt")
    monkeypatch.setitem(ARGS, "train_gpt", ["--pp", "2", "--tp", "2", "--dp", str(comm.size // 4), "--sp",
                                           "--microbatches", "4", "--schedule", schedule, "--steps", "3",
                                           "--layers", "4", "--d-model", "32", "--heads", "2", "--seq", "16",
                                           "--batch", "8", "--sample", "0"] + ["--replay"] * replay)
    codes, out = _run_example(path, monkeypatch)
    assert codes == [0] * comm.size, (codes, out)
    if comm.rank == 0:
        assert "check: 3 steps vs one numpy process" in out and "PASS" in out, out
        assert "executed schedule (last step, unit cost per cell): bubble" in out, out
