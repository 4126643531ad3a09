"""spmdsim.references.contraction: a two-block product runs its recipe's compiled function (`_compiled`), one per
(words, shapes), which must give `_general`'s result bit for bit, C-ordered, and never be reused for blocks
of other shapes or words (a dtype is read per call: one function serves every dtype)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import spmdsim
from spmdsim.references import contraction
from spmdsim.references.contraction import _general, contract, pair

# (a word, a shape, b word, b shape, out): a plain GEMM, a batched one, a transposed operand, a product that
# needs a reorder (and its swapped recipe), letters summed alone on either side, an outer product, a scalar.
CASES = [
    ("ij", (3, 4), "jk", (4, 5), "ik"),
    ("tbd", (6, 2, 4), "de", (4, 3), "tbe"),
    ("tbe", (6, 2, 3), "de", (4, 3), "tbd"),
    ("tbe", (6, 2, 3), "tbd", (6, 2, 4), "de"),
    ("tbd", (6, 2, 4), "vd", (5, 4), "btv"),
    ("btv", (2, 6, 5), "tbd", (6, 2, 4), "vd"),
    ("bij", (2, 3, 4), "bjk", (2, 4, 5), "kbi"),
    ("ijz", (3, 4, 2), "jky", (4, 5, 3), "ik"),
    ("i", (3,), "j", (4,), "ij"),
    ("ij", (3, 4), "ij", (3, 4), ""),
]


def _in_a_rank(fn) -> list:
    """fn() on one simulated rank (a product reads its rank's engine); its result."""
    out = []
    spmdsim.simulate(1, lambda: out.append(fn()))
    return out[0]


def _blocks(a_shape: tuple, b_shape: tuple, dtype: str, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return rng.integers(-5, 5, a_shape).astype(dtype), rng.integers(-5, 5, b_shape).astype(dtype)
    return rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_each_recipes_function_gives_the_general_products_bits(dtype):
    def run():
        for k, (a_word, a_shape, b_word, b_shape, out) in enumerate(CASES):
            a, b = _blocks(a_shape, b_shape, dtype, k)
            got = pair(a_word, a, b_word, b, out)
            made = contraction._RUNS[(a_word, a_shape, b_word, b_shape, out)]
            want = _general(made.recipe, a, b)
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), \
                (a_word, b_word, out)
            assert got.flags.c_contiguous and got.ndim >= 1  # np.ascontiguousarray's result, as _general's
            expected = np.einsum(f"{a_word},{b_word}->{out}", a, b)
            np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)
        return True

    assert _in_a_rank(run)


def test_a_compiled_product_is_not_reused_for_other_shapes_words_or_dtypes():
    """The table is keyed by words and shapes: a block of another shape (or the same shapes under other words)
    gets its own function; the same words and shapes in another dtype reuse it and keep their dtype; a
    bfloat16 pair takes the general path (spmdsim.base.precision.product: a float32 product)."""
    def run():
        contraction._RUNS.clear()
        a, b = _blocks((6, 2, 4), (4, 3), "float64", 0)
        first = pair("tbd", a, "de", b, "tbe")
        assert len(contraction._RUNS) == 1
        wide_a, wide_b = _blocks((6, 2, 4), (4, 5), "float64", 1)  # another shape of b: another recipe
        wide = pair("tbd", wide_a, "de", wide_b, "tbe")
        assert wide.shape == (6, 2, 5) and len(contraction._RUNS) == 2
        np.testing.assert_allclose(wide, np.einsum("tbd,de->tbe", wide_a, wide_b))
        # The same shapes, other words: b's letters read the other way round (its transpose)
        other = pair("tbd", a, "ed", b.T.copy(), "tbe")
        assert len(contraction._RUNS) == 3 and other.tobytes() == first.tobytes()
        low = pair("tbd", a.astype(np.float32), "de", b.astype(np.float32), "tbe")
        assert low.dtype == np.float32 and len(contraction._RUNS) == 3
        np.testing.assert_allclose(low, first, rtol=1e-5)
        ints = pair("tbd", a.astype(np.int32), "de", b.astype(np.int32), "tbe")
        assert ints.dtype == np.int32
        np.testing.assert_array_equal(ints, np.einsum("tbd,de->tbe", a.astype(np.int32), b.astype(np.int32)))
        bf = ml_dtypes.bfloat16
        half = pair("tbd", a.astype(bf), "de", b.astype(bf), "tbe")
        assert half.dtype == np.float32  # widened, as a GPU multiplies bfloat16 (the general path's)
        np.testing.assert_allclose(half, np.einsum("tbd,de->tbe", a.astype(bf).astype(np.float32),
                                                   b.astype(bf).astype(np.float32)), rtol=1e-6)
        return True

    assert _in_a_rank(run)


def test_contract_of_two_blocks_is_pairs_and_broadcasts_missing_letters():
    def run():
        a, b = _blocks((3, 4), (4, 5), "float64", 2)
        same = contract(("ij", "jk"), [a, b], "ik")
        assert same.tobytes() == pair("ij", a, "jk", b, "ik").tobytes()
        scalar = contract(["ij", "ij"], (a, a), "")
        assert scalar.shape == () and scalar == pytest.approx(float((a * a).sum()))
        spread, present = contract(("ij", "jk"), (a, b), "ikz")  # z in no operand: the caller broadcasts it
        assert present == "ik" and spread.tobytes() == same.tobytes()
        return True

    assert _in_a_rank(run)
