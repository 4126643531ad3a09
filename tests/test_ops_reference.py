"""Pure tests of the numpy references, region references and per-rank local kernels."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import Layout, OperatorError, SeededTensor, ShapeError
from spmdsim.references import forward as ref
from spmdsim.nn.ops.embedding import pad_vocab_shard, vocab_parallel_lookup, vocab_range
from spmdsim.nn.ops.paddle_split import paddle_layout, paddle_param


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_region_equals_slice_of_whole(dtype, ta, tb):
    x = SeededTensor((10, 6) if ta else (6, 10), dtype, seed=1)
    w = SeededTensor((14, 10) if tb else (10, 14), dtype, seed=2)
    whole = ref.matmul(x.full(), w.full(), ta, tb)
    assert whole.shape == (6, 14) and whole.dtype == np.dtype(dtype)
    region = (slice(2, 5), slice(7, 14))
    np.testing.assert_allclose(ref.matmul_region(x, w, ta, tb)(region), whole[region], rtol=1e-6)


def test_batched_matmul_region_with_shared_and_batched_weight():
    x = SeededTensor((3, 6, 10), "float64", seed=1)
    for w in (SeededTensor((10, 5), "float64", seed=2), SeededTensor((3, 10, 5), "float64", seed=2)):
        whole = ref.matmul(x.full(), w.full())
        region = (slice(1, 3), slice(0, 3), slice(2, 5))
        np.testing.assert_allclose(ref.matmul_region(x, w)(region), whole[region], rtol=1e-12)
    with pytest.raises(ShapeError, match="batch dims"):
        ref.matmul_region(x, SeededTensor((2, 10, 5), "float64"))
    with pytest.raises(ShapeError) as caught:
        ref.matmul_region(x, SeededTensor((9, 5), "float64"))
    assert str(caught.value) == ("contraction sizes differ: x of shape (3, 6, 10) gives K=10, w of shape (9, 5) "
                                 "gives K=9")
    with pytest.raises(ShapeError) as caught:
        ref.matmul(np.ones((2, 3)), np.ones((4, 2)))
    assert str(caught.value) == "contraction sizes differ: x of shape (2, 3) gives K=3, w of shape (4, 2) gives K=4"


def test_linear_and_mlp_regions():
    x = SeededTensor((6, 12), "float64", seed=1)
    w1, b1 = SeededTensor((12, 20), "float64", seed=2), SeededTensor((20,), "float64", seed=3)
    w2, b2 = SeededTensor((20, 12), "float64", seed=4), SeededTensor((12,), "float64", seed=5)
    region = (slice(1, 4), slice(3, 9))
    lin = ref.linear(x.full(), w1.full(), b1.full())
    np.testing.assert_allclose(lin, x.full() @ w1.full() + b1.full())
    # BLAS may block a sub-product differently: equal up to rounding.
    np.testing.assert_allclose(ref.linear_region(x, w1, b1)(region), lin[region], rtol=1e-12)
    for act in ("relu", "gelu"):
        whole = ref.mlp(x.full(), w1.full(), b1.full(), w2.full(), b2.full(), act)
        np.testing.assert_allclose(ref.mlp_region(x, w1, b1, w2, b2, act)(region), whole[region],
                                   rtol=1e-12)
    with pytest.raises(OperatorError, match="activation 'tanh' is not supported"):
        ref.activation("tanh")


def test_activations():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    np.testing.assert_array_equal(ref.relu(x), [0, 0, 0, 0.5, 3.0])
    # GELU (tanh approximation) known values.
    np.testing.assert_allclose(ref.gelu(x), [-0.04540231, -0.15428599, 0.0, 0.34571401, 2.99636261],
                               rtol=1e-7)
    assert ref.gelu(x.astype(np.float32)).dtype == np.float32
    # Integers are not truncated: GELU(1) is 0.841..., not 0.
    assert ref.gelu(np.array([1, -1])).dtype == np.float64
    np.testing.assert_allclose(ref.gelu(np.array([1, -1])), [0.84119199, -0.15880801], rtol=1e-7)


@pytest.mark.parametrize("x", [np.array(0.5), np.float64(0.5), np.array(0.5, np.float32), 0.5, np.array(1)])
def test_gelu_references_take_0d_as_numpy_does(x):
    """They raised numpy's "return arrays must be of ArrayType": a 0-d operand's ufunc result is a scalar, which
    takes no out=. Now a 0-d array of the 1-element answer, in place into a 0-d `out` as well."""
    one = np.reshape(x, 1)
    want_dtype = np.float32 if np.asarray(x).dtype == np.float32 else np.float64
    got = ref.gelu(x)
    assert isinstance(got, np.ndarray) and got.shape == () and got.dtype == want_dtype
    assert got == ref.gelu(one)[0]
    x64 = np.asarray(x, np.float64)
    t = ref.gelu_tanh(x64)
    assert t.shape == () and t == ref.gelu_tanh(np.reshape(x64, 1))[0]
    out = np.full((), np.nan)
    assert ref.gelu_tanh(x64, out) is out and out == t
    y = ref.gelu_from_tanh(x, t)
    assert y.shape == () and y.dtype == want_dtype and y == got
    out = np.full((), np.nan)
    assert ref.gelu_from_tanh(x64, t, out) is out and out == ref.gelu(x64)
    assert ref.activation("gelu")(x) == got


@pytest.mark.parametrize("x, want", [(1.5, 1.5), (-2, 0), (np.float32(-0.5), 0.0), (np.array([-1.0, 2.0]), [0.0, 2.0])])
def test_relu_reference_takes_numbers_as_numpy_does(x, want):
    # A Python number raised AttributeError ('float' object has no attribute 'dtype').
    got = ref.relu(x)
    assert got.dtype == np.asarray(x).dtype
    np.testing.assert_array_equal(got, want)


def test_embedding_reference_and_id_errors():
    table = SeededTensor((40, 6), "float64", seed=1)
    ids = SeededTensor((5, 7), "int64", seed=2, low=0, high=40)
    whole = ref.embedding(ids.full(), table.full())
    assert whole.shape == (5, 7, 6)
    region = (slice(1, 4), slice(2, 7), slice(1, 5))
    np.testing.assert_array_equal(ref.embedding_region(ids, table)(region), whole[region])
    with pytest.raises(OperatorError, match="embedding id 40 is outside \\[0, 40\\)"):
        ref.embedding(np.array([3, 40]), table.full())
    with pytest.raises(OperatorError, match="embedding id -1 is outside"):
        ref.check_ids(np.array([-1]), 40)
    with pytest.raises(OperatorError, match="must be integers, got dtype 'float32'"):
        ref.check_ids(np.array([1.0], dtype=np.float32), 40)


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
def test_vocab_parallel_sum_of_ranks_is_the_lookup(parts):
    # Pure simulation of Paddle's rule: padded shard per rank, then the Allreduce sum.
    table = SeededTensor((24, 5), "float64", seed=3).full()
    ids = SeededTensor((3, 9), "int64", seed=4, low=0, high=24).full()
    total = np.zeros(ids.shape + (5,))
    for r in range(parts):
        start, stop = vocab_range(24, r, parts)
        padded = pad_vocab_shard(table[start:stop])
        assert padded.shape == (24 // parts + 1, 5) and not padded[-1].any()
        total += vocab_parallel_lookup(ids, padded, start)
    np.testing.assert_array_equal(total, ref.embedding(ids, table))


def test_paddle_layout_and_params():
    assert paddle_layout(8, 8) == Layout((8,), ("mp",))
    assert paddle_layout(4, 8) == Layout((2, 4), ("dp", "mp"))
    with pytest.raises(OperatorError, match="num_partitions=3 must divide the world size 8"):
        paddle_layout(3, 8)
    for parts in (0, -2):  # not "must divide the world size": no count of ranks would help
        with pytest.raises(OperatorError, match=f"^num_partitions={parts} must be a positive integer$"):
            paddle_layout(parts, 8)
    assert paddle_param(None, (4, 6), "float32", 0) == SeededTensor((4, 6), "float32", 0)
    assert paddle_param(7, (6,), "float64", 1).seed == 7
    assert paddle_param(False, (6,), "float64", 1) is None
    with pytest.raises(OperatorError, match="does not match the expected"):
        paddle_param(SeededTensor((3,), "float32"), (6,), "float32", 1)


def test_mlp_rounding_bounds_two_summation_orders_where_k_eps_does_not():
    """examples/mlp.py checked with atol = 480 eps (contraction_atol: sums of products of values in [-1, 1)), but
    its hidden units are sums of 96 such products: at 3 ranks its error sat at that atol exactly (5.72e-05), and a
    wider input crosses it. mlp_rounding's (rtol, scale) follow the magnitudes that entered each output."""
    from spmdsim.references.tolerances import contraction_atol

    rng = np.random.default_rng(0)
    x = (4 * rng.uniform(-1, 1, (24, 96))).astype(np.float32)
    w1, w2 = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((96, 480), (480, 96)))
    b1, b2 = (rng.uniform(-1, 1, n).astype(np.float32) for n in (480, 96))
    a = ref.gelu(x @ w1 + b1)
    one = a @ w2 + b2
    split = sum(a[:, i:i + 160] @ w2[i:i + 160] for i in range(0, 480, 160)) + b2  # as 3 ranks sum
    err = np.abs(one.astype(np.float64) - split)
    assert err.max() > contraction_atol(480, "float32")  # the old tolerance cries wolf here
    rtol, scale = ref.mlp_rounding(x, w1, b1, w2, b2, "gelu")
    bound = rtol * np.maximum(scale((slice(None), slice(None))), np.abs(one))
    assert (err <= bound).all() and bound.max() < 1.0  # holds, and still catches a wrong value of order 1


def test_matmul_rounding_is_the_magnitudes_that_entered_each_output():
    """matmul_rounding's scale is |op(x)| @ |op(w)| (+ |bias|) per element and its rtol 2 k eps (k counting the
    bias): the same for a block as for the whole, transposed or batched; a wrong bias shape is refused."""
    x = SeededTensor((2, 7, 5), "float32", 1)
    w = SeededTensor((2, 6, 7), "float32", 2)  # transposed and batched
    rtol, scale = ref.matmul_rounding(x, w, transpose_a=True, transpose_b=True)
    ax = np.abs(x.full().astype(np.float64)).swapaxes(-1, -2)
    aw = np.abs(w.full().astype(np.float64)).swapaxes(-1, -2)
    whole = scale((slice(None), slice(None), slice(None)))
    np.testing.assert_allclose(whole, ax @ aw, rtol=1e-15)
    np.testing.assert_array_equal(scale((slice(1, 2), slice(1, 4), slice(2, 5))), whole[1:2, 1:4, 2:5])
    assert rtol == 2 * 7 * float(np.finfo(np.float32).eps)
    b = SeededTensor((4,), "float64", 3)
    rtol, scale = ref.matmul_rounding(SeededTensor((3, 5), "float64", 4), SeededTensor((5, 4), "float64", 5), bias=b)
    assert rtol == 2 * 6 * float(np.finfo(np.float64).eps)
    expect = (np.abs(SeededTensor((3, 5), "float64", 4).full()) @ np.abs(SeededTensor((5, 4), "float64", 5).full())
              + np.abs(b.full()))
    np.testing.assert_allclose(scale((slice(None), slice(1, 3))), expect[:, 1:3], rtol=1e-15)
    with pytest.raises(ShapeError, match="linear bias of shape \\(3,\\) does not match out_features 4"):
        ref.matmul_rounding(SeededTensor((3, 5)), SeededTensor((5, 4)), bias=SeededTensor((3,)))
    with pytest.raises(ShapeError, match="contraction sizes differ"):
        ref.matmul_rounding(SeededTensor((3, 5)), SeededTensor((4, 4)))
