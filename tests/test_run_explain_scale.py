"""`spmdsim run --explain` stays readable at many simulated ranks (pure: simulated ranks, no MPI).

Each rank's line used to list every member of its collective's group, so the output grew with the
square of the rank count (44,814 lines at 1,024 ranks); and past 64 ranks `spmdsim run` printed one
line per rank.
"""
from __future__ import annotations

from spmdsim.tools.cli.main import main
from spmdsim.tools.demo.registry import group_text


def _run(capsys, *argv: str) -> list[str]:
    assert main(["run", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_group_text_lists_small_groups_and_writes_large_ones_as_ranges():
    assert group_text(range(8)) == "{0,1,2,3,4,5,6,7}"  # what the docs quote at 8 ranks
    assert group_text([1, 3, 5, 7]) == "{1,3,5,7}"
    assert group_text(range(1024)) == "{0-1023} (1,024 ranks)"
    assert group_text(range(3, 1024, 8)) == "{3,11,...,1019} (128 ranks)"
    assert group_text([0, 1, 2, 3, 8, 9, 10, 11, 16]) == "{0-3,8-11,16} (9 ranks)"
    blocks = [r for r in range(1024) if r % 8 < 4]
    assert group_text(blocks) == "{0-3,8-11,16-19,24-27,...,1016-1019} (512 ranks)"
    assert group_text(range(64), braces=False) == "0-63 (64 ranks)"


def test_explain_grows_linearly_with_the_ranks(capsys):
    """64 ranks print about 4 times the lines of 16 (each rank's two lines), not 6.6 times."""
    at16 = _run(capsys, "mlp", "--shape", "4,8,64", "--ranks", "16", "--explain")
    at64 = _run(capsys, "mlp", "--shape", "4,8,64", "--ranks", "64", "--explain")
    assert "  Allreduce over ranks {0-15} (16 ranks)" in at16
    assert at64.count("  Allreduce over ranks {0-63} (64 ranks)") == 64
    assert len(at64) - len(at16) == 2 * (64 - 16), (len(at16), len(at64))


def test_past_64_ranks_a_few_ranks_and_the_rule_for_every_rank(capsys):
    out = _run(capsys, "mlp", "--shape", "4,8,128", "--ranks", "128", "--explain")
    start = out.index("rank 0 (0,): holds x[0:4, 0:8], W1[0:8, 0:1], W2[0:1, 0:8] -> output [0:4, 0:8]")
    assert out[start + 1:start + 8] == [
        "  Allreduce over ranks {0-127} (128 ranks)",
        "rank 1 (1,): holds x[0:4, 0:8], W1[0:8, 1:2], W2[1:2, 0:8] -> output [0:4, 0:8]",
        "  Allreduce over ranks {0-127} (128 ranks)",
        "rank 2 (2,): holds x[0:4, 0:8], W1[0:8, 2:3], W2[2:3, 0:8] -> output [0:4, 0:8]",
        "  Allreduce over ranks {0-127} (128 ranks)",
        "rank 3 (3,): holds x[0:4, 0:8], W1[0:8, 3:4], W2[3:4, 0:8] -> output [0:4, 0:8]",
        "  Allreduce over ranks {0-127} (128 ranks)",
    ]
    assert out[start + 8:start + 17] == [
        "... (123 ranks more)",
        "rank 127 (127,): holds x[0:4, 0:8], W1[0:8, 127:128], W2[127:128, 0:8] -> output [0:4, 0:8]",
        "  Allreduce over ranks {0-127} (128 ranks)",
        "each rank's block (128 ranks; the rule gives every rank's, by its coordinates on Layout(mp=128)):",
        "  x: dim 0: whole; dim 1: whole",
        "  W1: dim 0: whole; dim 1: 128 blocks of 1, block mp",
        "  W2: dim 0: 128 blocks of 1, block mp; dim 1: whole",
        "  output: dim 0: whole; dim 1: whole",
        "  Allreduce over each rank's group along mp: 1 group of 128 ranks",
    ]
    assert len(out) < 30


def test_past_64_ranks_ranks_with_equal_lines_share_one(capsys):
    """Ranks that hold the same blocks and join the same groups: one line names them all."""
    out = _run(capsys, "matmul", "--strategy", "((1,1),(1,1))", "--shape", "4,4,4", "--ranks", "128")
    assert out[1:3] == ["MatMul ((1, 1), (1, 1)): x[m,k] w[k,n] -> [m,n] on Layout(m=1, k=1, n=1, rep=128)",
                        "ranks 0-127 (128 ranks): holds x[0:4, 0:4], w[0:4, 0:4] -> output [0:4, 0:4]"]
