"""Exact byte arithmetic at any size: planner, lower bound, cost model, CLI text and JSON.

Each check compares a plan at 2**40, 2**64 and 2**80 elements with the same
plan at a small size: every byte figure is linear in the size of a dim, so the
large figures must be the small ones times the scale, exactly (a fixed-width
integer or a float anywhere on the way breaks that).
"""
from __future__ import annotations

import json
import re

import pytest

from spmdsim import Layout
from spmdsim.tools.cli.main import main
from spmdsim.tools.cli.plan_explain import ratio_text
from spmdsim.programs.cost import predict_plan
from spmdsim.programs.plan import plan_redistribution
from spmdsim.programs.viz.plan import format_bytes

L = Layout((2, 4), ("a", "b"))
M = Layout((4, 2), ("c", "d"))
SMALL = 64  # divisible by every shard count below
# (source, target): collectives, a pending sum, a partial target (the covered-volume
# bound), a Reduce_scatter over two axes, different device matrices (an exchange).
MOVES = [
    (L("a", "b"), L("b", "a")),
    (L("a", None, partial="b"), L("b", "a")),
    (L("a", "b"), L(None, "a", partial="b")),
    (L(None, None, partial=("a", "b")), L(("b", "a"), None)),
    (L("a", "b"), M("d", "c")),
]


def _split(exponent: int) -> tuple[int, int]:
    """Growth factors of the two dims for 2**exponent elements in all, each dim well inside int64.

    Sizes that each fit int64 while their product does not are where a numpy
    product wraps silently (a size past int64 would make numpy use Python ints).
    """
    total = exponent - 9  # (SMALL, 8) has 2**9 elements
    return 2 ** (total // 2), 2 ** (total - total // 2)


def _figures(plan) -> list:
    steps = [[list(s.bytes_sent), list(s.bytes_received)] for s in plan.steps]
    return [list(plan.bytes_received), list(plan.lower_bound), steps]


def _scaled(value, k: int):
    if isinstance(value, (tuple, list)):
        return [_scaled(v, k) for v in value]
    return value * k


@pytest.mark.parametrize("exponent", [40, 64, 80])
@pytest.mark.parametrize("move", range(len(MOVES)))
def test_plan_bytes_are_exact_at_huge_sizes(exponent, move):
    source, target = MOVES[move]
    small = plan_redistribution(source, target, (SMALL, 8), "float64")
    k0, k1 = _split(exponent)
    large = plan_redistribution(source, target, (SMALL * k0, 8 * k1), "float64")
    k = k0 * k1
    assert [type(s) for s in large.steps] == [type(s) for s in small.steps]
    assert _figures(large) == _scaled(_figures(small), k)
    assert all(n >= 0 for n in large.bytes_received + large.lower_bound)
    assert large.max_bytes_received >= 2 ** exponent  # 8-byte items: the figure did not wrap


@pytest.mark.parametrize("exponent", [40, 64, 80])
def test_cost_model_bytes_are_exact_at_huge_sizes(exponent):
    source, target = MOVES[0]
    k0, k1 = _split(exponent)
    k = k0 * k1
    small = predict_plan(plan_redistribution(source, target, (SMALL, 8), "float32"))
    large = predict_plan(plan_redistribution(source, target, (SMALL * k0, 8 * k1), "float32"))
    assert [p.bytes_per_rank * k for p in small] == [p.bytes_per_rank for p in large]
    assert [p.bytes_copied * k for p in small] == [p.bytes_copied for p in large]
    assert all(p.seconds > 0 for p in large)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_command_prints_the_exact_figures_of_a_hundred_billion_square(capsys):
    argv = ("plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x",
            "--shape", "100000000000,100000000000")
    code, out, err = _cli(capsys, *argv)
    # Each rank holds 1e22 / 8 elements of 4 bytes and keeps 1/8 of them: 7/64 of 4e22 B.
    assert code == 0 and err == ""
    assert "4,375,000,000,000,000,000,000 B" in out and not re.search(r"-\d", out)
    assert "35,000,000,000,000,000,000,000 B per rank (8.0x this plan)" in out
    assert "meets it on every rank" in out
    code, out, _ = _cli(capsys, *argv, "--json")
    record = json.loads(out)
    assert record["bytes_received_per_rank"] == 4_375_000_000_000_000_000_000
    assert record["lower_bound_bytes_received_per_rank"] == 4_375_000_000_000_000_000_000


def test_ratio_and_byte_texts_are_exact():
    assert ratio_text(35, 4) == "8.8" and ratio_text(7, 8) == "0.9" and ratio_text(1, 20) == "0.1"
    big = 2 ** 80
    assert ratio_text(3 * big + 1, big) == "3.0"  # a float quotient says the same, but ...
    assert ratio_text(10 ** 400, 10 ** 397) == "1,000.0"  # ... this one overflows a float
    assert format_bytes(2 ** 80) == "1,208,925,819,614,629,174,706,176 B (1 YiB)"
    assert format_bytes(5 * 2 ** 40) == "5,497,558,138,880 B (5 TiB)"


def test_pictures_of_a_tensor_past_int64(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, err = _cli(capsys, "plan", "--device-matrix", "2", "--alias", "a", "--from", "a,None",
                          "--to", "None,a", "--shape", f"{2 ** 70},4", "--png", str(tmp_path))
    written = sorted(tmp_path.iterdir())
    assert (code, err) == (0, "") and f"wrote {len(written)} pictures" in out
    assert len(written) >= 2 and {p.suffix for p in written} == {".png"}
