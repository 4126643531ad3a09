"""Who holds what: every rank's block of each tensor, from the layouts alone."""
from __future__ import annotations

import pytest

from spmdsim import Layout, LayoutError, ShapeError
from spmdsim.layouts.holdings import block_text, holdings, holdings_lines, rank_blocks

MESH = Layout((2, 4), ("dp", "mp"))


def test_one_line_per_rank_with_global_blocks():
    lines = holdings_lines({"x": (MESH("dp", "mp"), (4, 8)), "w": (MESH("mp", None), (8, 3))})
    assert len(lines) == 8
    assert lines[0] == "rank 0 (0, 0): x[0:2, 0:2], w[0:2, 0:3]"
    assert lines[6] == "rank 6 (1, 2): x[2:4, 4:6], w[4:6, 0:3]"
    assert holdings({"x": (MESH("dp", "mp"), (4, 8))}, ranks=(5,)) == "rank 5 (1, 1): x[2:4, 2:4]"
    assert rank_blocks({"x": (MESH("dp", "mp"), (4, 8))}, 5) == "x[2:4, 2:4]"


def test_replicated_and_partial_blocks():
    # Ranks that differ only in dp hold copies; a pending sum is marked.
    assert block_text(MESH("mp", None), (8, 2), 1) == block_text(MESH("mp", None), (8, 2), 5) == "[2:4, 0:2]"
    assert block_text(MESH(None, "mp", partial="dp"), (3, 8), 7) == "[0:3, 6:8] partial over dp"


def test_refuses_what_it_cannot_list():
    with pytest.raises(LayoutError, match="at least one tensor"):
        holdings({})
    with pytest.raises(LayoutError, match="one device matrix"):
        holdings({"x": (MESH("dp", None), (4, 4)), "y": (Layout((8,), ("x",))("x"), (8,))})
    with pytest.raises(LayoutError, match=r"'x' is of type ndarray; expected a DTensor, a \(TensorLayout, shape\) pair "
                       r"or a \(TensorLayout, shape, note\) triple"):
        import numpy as np

        holdings({"x": np.zeros(4)})
    with pytest.raises(ShapeError):
        holdings({"x": (MESH("mp", None), (6, 4))})  # 6 rows do not divide over 4
    with pytest.raises(LayoutError) as caught:  # a list of tensors: an AttributeError of list.items before
        holdings([(MESH("dp", None), (4, 4))])
    assert str(caught.value) == ("holdings takes a dict name -> tensor, got list; e.g. holdings({'x': x, 'w': w}), "
                                 "the names its lines print")


def test_a_note_follows_the_block_it_qualifies():
    # Paddle's vocab-parallel table: the global rows a rank holds, and the padding row no layout says.
    mesh = Layout((2,), ("mp",))
    held = {"ids": (mesh(None), (3,)), "table": (mesh("mp", None), (8, 6), "+ zero padding row"),
            "b": (mesh(None), (6,), "")}
    assert holdings_lines(held) == [
        "rank 0 (0,): ids[0:3], table[0:4, 0:6] + zero padding row, b[0:6]",
        "rank 1 (1,): ids[0:3], table[4:8, 0:6] + zero padding row, b[0:6]",
    ]
    assert rank_blocks({"table": (mesh("mp", None), (8, 6), "+ pad")}, 1) == "table[4:8, 0:6] + pad"
    with pytest.raises(LayoutError, match=r"the note of 'table' is 3; expected a string"):
        rank_blocks({"table": (mesh("mp", None), (8, 6), 3)}, 0)
    with pytest.raises(LayoutError, match=r"\(TensorLayout, shape, note\) triple"):
        holdings({"x": (mesh("mp"), (8,), "a", "b")})
