"""`spmdsim run linear|embedding --front megatron|paddle`: the rank lines and `--explain` text.

In-process under the suite's mpiexec; rank 0 prints every rank's lines. Paddle's
split() makes its weights inside the call, and the rank lines still name each
rank's block of them (seed 004); its column Linear gathers by default.
"""
from __future__ import annotations

import pytest

from spmdsim.tools.cli.main import main

pytestmark = pytest.mark.mpi(min_size=2)


def _run(capsys, *argv: str) -> str:
    """rank 0's output of `spmdsim run ARGV`, the same text on every rank (rc 0 everywhere)."""
    from mpi4py import MPI

    rc = main(["run", *argv])
    out = capsys.readouterr().out
    assert MPI.COMM_WORLD.allgather(rc) == [0] * MPI.COMM_WORLD.size
    return MPI.COMM_WORLD.bcast(out if MPI.COMM_WORLD.rank == 0 else None)


def _size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.size


def _all(size: int) -> str:
    return "{" + ",".join(str(r) for r in range(size)) + "}"


@pytest.mark.parametrize("front", ["megatron", "paddle"])
def test_row_linear_rank_lines_name_the_weight_blocks_on_both_fronts(capsys, front):
    p = _size()
    n = 3 * p
    text = _run(capsys, "linear", "--parallel", "row", "--shape", f"4,{2 * p},{n}",
                "--front", front, "--explain")
    for r in range(p):
        assert (f"rank {r} ({r},): holds x[0:4, {2 * r}:{2 * r + 2}], "
                f"W[{2 * r}:{2 * r + 2}, 0:{n}], b[0:{n}] -> output [0:4, 0:{n}]") in text, text
    assert text.count(f"\n  Allreduce over ranks {_all(p)}\n") == p
    assert " ".join(text.split()).count(
        "so each rank holds a partial sum (the bias is added once, after the sum)") == 1
    assert text.rstrip().endswith("PASS")


def test_paddle_column_linear_gathers_by_default_and_names_its_blocks(capsys):
    p = _size()
    n, k = 3 * p, 2 * p
    text = _run(capsys, "linear", "--shape", f"4,{k},{n}", "--front", "paddle", "--explain")
    assert text.startswith("paddle split linear axis=1 gather_out=True: x[-,-] W[-,mp] -> [-,-]")
    for r in range(p):
        assert (f"rank {r} ({r},): holds x[0:4, 0:{k}], W[0:{k}, {3 * r}:{3 * r + 3}], "
                f"b[{3 * r}:{3 * r + 3}] -> output [0:4, 0:{n}]") in text, text
    assert text.count(f"\n  Allgather over ranks {_all(p)}\n") == p
    assert " ".join(text.split()).count(
        "why Allgather: output columns are split over \"mp\" and gather_out asks for whole rows") == 1
    assert "allgather over ('mp',)" in text and text.rstrip().endswith("PASS")


@pytest.mark.parametrize("argv", [("--front", "paddle", "--no-gather-out"), ()],
                         ids=["paddle-no-gather-out", "megatron-default"])
def test_column_linear_without_gather_keeps_columns_split(capsys, argv):
    p = _size()
    n, k = 3 * p, 2 * p
    text = _run(capsys, "linear", "--shape", f"4,{k},{n}", *argv, "--explain")
    for r in range(p):
        assert (f"rank {r} ({r},): holds x[0:4, 0:{k}], W[0:{k}, {3 * r}:{3 * r + 3}], "
                f"b[{3 * r}:{3 * r + 3}] -> output [0:4, {3 * r}:{3 * r + 3}]") in text, text
    assert text.count("no communication: every rank's block of the result is final") == p
    assert f"collectives:\n  ranks 0-{p - 1}: no communication\n" in text and text.rstrip().endswith("PASS")


def test_paddle_embedding_shows_each_ranks_rows_and_its_padding_row(capsys):
    p = _size()
    text = _run(capsys, "embedding", "--shape", f"3,{4 * p},6", "--front", "paddle", "--explain")
    for r in range(p):
        # At 100 columns this rank line wraps: compare with the line breaks taken out.
        assert (f"rank {r} ({r},): holds ids[0:3], table[{4 * r}:{4 * r + 4}, 0:6] + zero padding "
                f"row (local (5, 6)) -> output [0:3, 0:6]") in " ".join(text.split()), text
        assert f"in its rows [{4 * r}, {4 * r + 4}); the other " in text
    assert ("so each rank holds a partial sum (ids outside a rank's rows look up its zero "
            "padding row, local row 4)") in " ".join(text.split())
    assert "Megatron" not in text and text.rstrip().endswith("PASS")


def test_megatron_embedding_says_it_masks_not_pads(capsys):
    p = _size()
    text = _run(capsys, "embedding", "--shape", f"3,{4 * p},6", "--explain")
    for r in range(p):
        assert (f"rank {r} ({r},): holds ids[0:3], table[{4 * r}:{4 * r + 4}, 0:6] "
                "-> output [0:3, 0:6]") in text, text
        assert f"in its rows [{4 * r}, {4 * r + 4}); the other " in text
    assert ("(ids outside a rank's rows give zero rows: Megatron masks them and zeroes their "
            "output; this layer reads the zeros from a zero row kept beside the weight, as Paddle "
            "does)") in " ".join(text.split())
    assert "padding row" not in text and text.rstrip().endswith("PASS")
