"""Audit findings on the teaching notes: size-1 axes, the partial-sum demo, --no-values, multi-axis formulas."""
from __future__ import annotations

import math

import numpy as np

from spmdsim import Layout
from spmdsim.layouts.dialects.sbp import parse_sbp, sbp_to_layout
from spmdsim.layouts.explain import (explain, explanation_to_dict, format_explanation,
                             partial_text)

ABCDE = ("a", "b", "c", "d", "e")


def _sbp(text, placement, shape):
    return sbp_to_layout(parse_sbp(text), placement, len(shape))


def test_size1_axis_is_no_replica_axis():
    # Seed case 2: axis c (size 1) is not in the map, but makes no copies.
    tl = Layout((4, 1, 1, 2, 1), ABCDE)("b", "d", "e", "a")
    assert tl.replicated_axes == ("c",) and tl.copy_axes == ()
    text = format_explanation(explain(tl, (1, 2, 1, 4)))
    assert "replica" not in text and "Note:" not in text
    assert "dropped (not in the tensor map): c" in text  # step 2 still drops the column


def test_only_axes_above_size1_are_named_as_replicas():
    tl = Layout((2, 1, 2), ("a", "b", "c"))("a")
    assert tl.copy_axes == ("c",)
    text = format_explanation(explain(tl, (4,)))
    assert ("Note: axis c is not in the tensor map: ranks that differ only there hold the\n"
            "same shard (replicas): (0, 1), (2, 3).") in text


def test_partial_demo_one_addend_keeps_the_values():
    shape = (8, 8)
    tl = _sbp("S(0),P", (2, 4), shape)
    ex = explain(tl, shape)
    full = np.arange(64).reshape(shape)
    # Rank 0 (axis_1=0) keeps rows 0:4, ranks 1-3 hold zeros; likewise rank 4 for rows 4:8.
    assert ex.rows[0].values == tuple(full[0:4].ravel())
    assert ex.rows[4].values == tuple(full[4:8].ravel())
    for rank in (1, 2, 3, 5, 6, 7):
        assert ex.rows[rank].values == (0,) * 32
    # The sum of the addends is the global value, as the note says.
    for group in tl.layout.axis_groups(("axis_1",)):
        total = np.sum([ex.rows[r].values for r in group], axis=0)
        assert tuple(total) == tuple(full[tl.slices(group[0], shape)].ravel())
    text = format_explanation(ex)
    assert "     1      0  (0, 0)         [0:4, 0:8]  0 0 0 0 0 0 0 0 0 0 ... (32 values)" in text
    assert ("Note: partial over axis_1: ranks differing only there hold addends, not copies; "
            "the value is their sum. In the arange demo the rank with axis_1=0 holds the values "
            "and the other addends hold zeros (one addend keeps the value, as B -> P does), "
            "so the sum is arange.") in " ".join(text.split())  # wrapped at 80 columns
    assert explanation_to_dict(ex)["ranks"][1]["values"] == [0] * 32


def test_partial_over_several_axes_keeps_values_at_coordinate_zero():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("dp", None, partial=("sp", "mp"))
    ex = explain(tl, (4, 2))
    kept = [row.rank for row in ex.rows if any(row.values)]
    assert kept == [0, 4]  # sp=0 and mp=0
    assert "the rank with sp=0, mp=0 holds the values" in format_explanation(ex).replace("\n", " ")


def test_partial_size1_axis_has_one_addend():
    tl = Layout((2, 1), ("a", "m"))("a", partial=("m",))
    assert tl.addend_axes == ()
    assert partial_text(tl) == (
        "partial over m: an axis of size 1 has one addend, so each block is the whole value"
    )
    ex = explain(tl, (4,))
    assert [row.values for row in ex.rows] == [(0, 1), (2, 3)]


def test_no_values_note_gives_the_real_reason():
    tl = Layout((4,), ("x",))("x")
    text = format_explanation(explain(tl, (16,), values=False))
    assert "Note: values omitted because --no-values was given." in text
    assert "65536" not in text


def test_multi_axis_formula_is_mixed_radix_for_three_axes():
    tl = Layout((2, 2, 2), ("a", "b", "c"))(("c", "a", "b"))
    ex = explain(tl, (8,))
    text = format_explanation(ex).replace("\n", " ")
    assert "shard = i_c*|a|*|b| + i_a*|b| + i_b = i_c*4 + i_a*2 + i_b" in text
    # The formula is what the table computes: rank (a, b, c) -> c*4 + a*2 + b.
    for row in ex.rows:
        a, b, c = row.coords
        assert row.shard_number == c * 4 + a * 2 + b


def test_multi_axis_formula_uses_the_real_sizes():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))
    text = format_explanation(explain(tl, (32, 784))).replace("\n", " ")
    assert "(mixed radix: shard = i_sp*|dp| + i_dp = i_sp*2 + i_dp)" in text
    assert math.prod((2, 2, 2)) == len(explain(tl, (32, 784)).rows)
