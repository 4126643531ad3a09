"""The seed's shard derivation (number, reorder, compute) and its text/JSON forms."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from spmdsim import Layout
from spmdsim.layouts.explain import MAX_VALUE_ELEMENTS, explain, explanation_to_dict, format_explanation

ABCDE = ("a", "b", "c", "d", "e")

# (device matrix, tensor map, shape, value held by ranks 0..7) from MindSpore's Layout tutorial
# (docs/explanation/semantics.md).
SEED_CASES = [
    ((2, 1, 2, 2, 1), ("b", "d", "e", "c", "a"), (1, 2, 1, 2, 2), [0, 4, 2, 6, 1, 5, 3, 7]),
    ((4, 1, 1, 2, 1), ("b", "d", "e", "a"), (1, 2, 1, 4), [0, 4, 1, 5, 2, 6, 3, 7]),
    ((2, 1, 2, 2, 1), ("b", "e", "c", "a"), (1, 1, 2, 2), [0, 0, 2, 2, 1, 1, 3, 3]),
]


@pytest.mark.parametrize("matrix, tmap, shape, expected", SEED_CASES)
def test_seed_cases_values_and_shard_numbers(matrix, tmap, shape, expected):
    ex = explain(Layout(matrix, ABCDE)(*tmap), shape)
    assert [row.values for row in ex.rows] == [(v,) for v in expected]
    # Every shard is one element, so the shard number is the value itself.
    assert list(ex.shard_numbers) == expected


def test_design_identity_case():
    ex = explain(Layout((2, 4), ("axis_0", "axis_1"))("axis_0", "axis_1"), (2, 4))
    assert [row.values for row in ex.rows] == [(r,) for r in range(8)]


def test_seed1_steps():
    ex = explain(Layout((2, 1, 2, 2, 1), ABCDE)("b", "d", "e", "c", "a"), (1, 2, 1, 2, 2))
    assert ex.map_axes == ("b", "d", "e", "c", "a")
    assert ex.map_strides == (8, 4, 4, 2, 1)  # the seed's stride["b"] .. stride["a"]
    assert ex.dropped == ()
    assert ex.rows[5].coords == (1, 0, 0, 1, 0)
    assert ex.rows[5].map_coords == (0, 1, 0, 0, 1)


def test_seed2_and_3_drop_unused_axes():
    ex2 = explain(Layout((4, 1, 1, 2, 1), ABCDE)("b", "d", "e", "a"), (1, 2, 1, 4))
    assert ex2.dropped == ("c",) and ex2.map_strides == (8, 4, 4, 1)
    ex3 = explain(Layout((2, 1, 2, 2, 1), ABCDE)("b", "e", "c", "a"), (1, 1, 2, 2))
    assert ex3.dropped == ("d",) and ex3.map_strides == (4, 4, 2, 1)


LAYOUTS = [
    (Layout((2, 2, 2), ("dp", "sp", "mp")), ("mp", ("sp", "dp")), (32, 784)),
    (Layout((2, 2, 2), ("dp", "sp", "mp")), (("dp", "mp"), None), (8, 3)),
    (Layout((2, 4), ("dp", "mp")), ("dp", None), (4, 6)),
    (Layout((8,), ("x",)), ("x",), (16,)),
    (Layout((2, 2, 2), ("a", "b", "c")), ("c", "a", "b"), (2, 4, 6)),
]


@pytest.mark.parametrize("layout, tmap, shape", LAYOUTS)
def test_shard_number_is_row_major_block_number(layout, tmap, shape):
    tl = layout(*tmap)
    ex = explain(tl, shape)
    for row in ex.rows:
        assert row.shard_number == int(np.ravel_multi_index(row.shard_index, tl.shards_per_dim))
        assert row.bounds == tl.bounds(row.rank, shape)
        full = np.arange(math.prod(shape)).reshape(shape)
        assert row.values == tuple(full[tl.slices(row.rank, shape)].ravel())


def test_seed1_text_exact():
    tl = Layout((2, 1, 2, 2, 1), ABCDE)("b", "d", "e", "c", "a")
    assert format_explanation(explain(tl, (1, 2, 1, 2, 2))) == SEED1_TEXT


def test_seed3_text_exact_names_replicas():
    tl = Layout((2, 1, 2, 2, 1), ABCDE)("b", "e", "c", "a")
    assert format_explanation(explain(tl, (1, 1, 2, 2))) == SEED3_TEXT


def test_text_fits_80_columns_for_seed_cases():
    for matrix, tmap, shape, _ in SEED_CASES:
        text = format_explanation(explain(Layout(matrix, ABCDE)(*tmap), shape))
        assert max(len(line) for line in text.splitlines()) <= 80


def test_partial_and_multi_axis_notes():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))(("sp", "dp"), None, partial=("mp",))
    text = format_explanation(explain(tl, (4, 2)))
    assert "partial over mp" in text
    assert 'tensor dim 0 is split over ("sp", "dp"): the first listed axis is major' in text


def test_strategy_wording_and_repeat_axis():
    # Seed 2.2.2: strategy (2, 1, 1, 2, 1) on 8 ranks, a repeated-calculation axis on the right.
    from spmdsim.layouts.dialects.strategy import strategy_to_layout

    tl = strategy_to_layout((2, 1, 1, 2, 1), 8)
    ex = explain(tl, (2, 1, 1, 2, 1), strategy=(2, 1, 1, 2, 1))
    assert list(ex.shard_numbers) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ex.map_strides == (2, 2, 2, 1, 1)  # the seed's stride[4] .. stride[0]
    text = format_explanation(ex)
    assert "so step 2 keeps the axis order" in text
    assert "uses 4 of 8 ranks" in text


def test_values_skipped_for_large_tensors():
    tl = Layout((2,), ("x",))("x", None)
    ex = explain(tl, (2, MAX_VALUE_ELEMENTS))
    assert all(row.values is None for row in ex.rows)
    assert "values omitted" in format_explanation(ex)
    assert explain(tl, (2, 4), values=False).rows[0].values is None


def test_json_form():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))
    data = explanation_to_dict(explain(tl, (4, 8)))
    json.dumps(data)  # JSON-ready
    assert data["tensor_map"] == ["mp", ["sp", "dp"]]
    assert data["step2"] == {"axes": ["mp", "sp", "dp"], "tensor_dims": [0, 1, 1], "dropped": []}
    assert data["step3"]["strides"] == [4, 2, 1]
    rank4 = data["ranks"][4]
    assert rank4["coords"] == [1, 0, 0] and rank4["map_coords"] == [0, 0, 1]
    assert rank4["shard_number"] == 1 and rank4["slice"] == [[0, 2], [2, 4]]
    assert rank4["values"] == [2, 3, 10, 11]
    assert data["replica_groups"] == [[r] for r in range(8)]


SEED1_TEXT = """\
layout      Layout((2, 1, 2, 2, 1), ("a", "b", "c", "d", "e"))
tensor map  ("b", "d", "e", "c", "a")
shape       (1, 2, 1, 2, 2)

Step 1. Number the device matrix right to left: the last axis varies
        fastest and each axis counts in base its size (mixed radix).

  axis  a  b  c  d  e
  size  2  1  2  2  1

  rank  a  b  c  d  e
     0  0  0  0  0  0
     1  0  0  0  1  0
     2  0  0  1  0  0
     3  0  0  1  1  0
     4  1  0  0  0  0
     5  1  0  0  1  0
     6  1  0  1  0  0
     7  1  0  1  1  0

Step 2. Reorder the columns by the tensor map; drop the axes it does not use.

  axis        b  d  e  c  a
  tensor dim  0  1  2  3  4

  rank  b  d  e  c  a
     0  0  0  0  0  0
     1  0  1  0  0  0
     2  0  0  0  1  0
     3  0  1  0  1  0
     4  0  0  0  0  1
     5  0  1  0  0  1
     6  0  0  0  1  1
     7  0  1  0  1  1

Step 3. Stride of each axis = product of the sizes to its right (new order);
        shard number = sum of index * stride.

  axis    b  d  e  c  a
  size    1  2  1  2  2
  stride  8  4  4  2  1

  rank  shard number
     0  0*8 + 0*4 + 0*4 + 0*2 + 0*1 = 0
     1  0*8 + 1*4 + 0*4 + 0*2 + 0*1 = 4
     2  0*8 + 0*4 + 0*4 + 1*2 + 0*1 = 2
     3  0*8 + 1*4 + 0*4 + 1*2 + 0*1 = 6
     4  0*8 + 0*4 + 0*4 + 0*2 + 1*1 = 1
     5  0*8 + 1*4 + 0*4 + 0*2 + 1*1 = 5
     6  0*8 + 0*4 + 0*4 + 1*2 + 1*1 = 3
     7  0*8 + 1*4 + 0*4 + 1*2 + 1*1 = 7

Result. Each rank's block, and its values of arange(n).reshape(shape).

  rank  shard  index per dim    slice                      values
     0      0  (0, 0, 0, 0, 0)  [0:1, 0:1, 0:1, 0:1, 0:1]  0
     1      4  (0, 1, 0, 0, 0)  [0:1, 1:2, 0:1, 0:1, 0:1]  4
     2      2  (0, 0, 0, 1, 0)  [0:1, 0:1, 0:1, 1:2, 0:1]  2
     3      6  (0, 1, 0, 1, 0)  [0:1, 1:2, 0:1, 1:2, 0:1]  6
     4      1  (0, 0, 0, 0, 1)  [0:1, 0:1, 0:1, 0:1, 1:2]  1
     5      5  (0, 1, 0, 0, 1)  [0:1, 1:2, 0:1, 0:1, 1:2]  5
     6      3  (0, 0, 0, 1, 1)  [0:1, 0:1, 0:1, 1:2, 1:2]  3
     7      7  (0, 1, 0, 1, 1)  [0:1, 1:2, 0:1, 1:2, 1:2]  7
"""

SEED3_TEXT = """\
layout      Layout((2, 1, 2, 2, 1), ("a", "b", "c", "d", "e"))
tensor map  ("b", "e", "c", "a")
shape       (1, 1, 2, 2)

Step 1. Number the device matrix right to left: the last axis varies
        fastest and each axis counts in base its size (mixed radix).

  axis  a  b  c  d  e
  size  2  1  2  2  1

  rank  a  b  c  d  e
     0  0  0  0  0  0
     1  0  0  0  1  0
     2  0  0  1  0  0
     3  0  0  1  1  0
     4  1  0  0  0  0
     5  1  0  0  1  0
     6  1  0  1  0  0
     7  1  0  1  1  0

Step 2. Reorder the columns by the tensor map; drop the axes it does not use.

  dropped (not in the tensor map): d

  axis        b  e  c  a
  tensor dim  0  1  2  3

  rank  b  e  c  a
     0  0  0  0  0
     1  0  0  0  0
     2  0  0  1  0
     3  0  0  1  0
     4  0  0  0  1
     5  0  0  0  1
     6  0  0  1  1
     7  0  0  1  1

Step 3. Stride of each axis = product of the sizes to its right (new order);
        shard number = sum of index * stride.

  axis    b  e  c  a
  size    1  1  2  2
  stride  4  4  2  1

  rank  shard number
     0  0*4 + 0*4 + 0*2 + 0*1 = 0
     1  0*4 + 0*4 + 0*2 + 0*1 = 0
     2  0*4 + 0*4 + 1*2 + 0*1 = 2
     3  0*4 + 0*4 + 1*2 + 0*1 = 2
     4  0*4 + 0*4 + 0*2 + 1*1 = 1
     5  0*4 + 0*4 + 0*2 + 1*1 = 1
     6  0*4 + 0*4 + 1*2 + 1*1 = 3
     7  0*4 + 0*4 + 1*2 + 1*1 = 3

Result. Each rank's block, and its values of arange(n).reshape(shape).

  rank  shard  index per dim  slice                 values
     0      0  (0, 0, 0, 0)   [0:1, 0:1, 0:1, 0:1]  0
     1      0  (0, 0, 0, 0)   [0:1, 0:1, 0:1, 0:1]  0
     2      2  (0, 0, 1, 0)   [0:1, 0:1, 1:2, 0:1]  2
     3      2  (0, 0, 1, 0)   [0:1, 0:1, 1:2, 0:1]  2
     4      1  (0, 0, 0, 1)   [0:1, 0:1, 0:1, 1:2]  1
     5      1  (0, 0, 0, 1)   [0:1, 0:1, 0:1, 1:2]  1
     6      3  (0, 0, 1, 1)   [0:1, 0:1, 1:2, 1:2]  3
     7      3  (0, 0, 1, 1)   [0:1, 0:1, 1:2, 1:2]  3

Note: axis d is not in the tensor map: ranks that differ only there hold the
same shard (replicas): (0, 1), (2, 3), (4, 5), (6, 7).
"""
