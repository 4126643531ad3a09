"""The activations' local kernels (spmdsim.activations) against the float64 reference."""
import numpy as np
import pytest

from spmdsim import activations, reference
from spmdsim import reference_grad as rg
from spmdsim.errors import OperatorError


def _values(dtype, n=100_000, seed=0):
    # Spread over GELU's whole shape: deep negative tail, the bend near 0, the linear part.
    x = np.random.default_rng(seed).standard_normal(n) * 4
    return np.concatenate([x, [0.0, -0.0, 1e-30, -12.0, 12.0]]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_single_precision_gelu_stays_within_a_few_ulp_of_the_reference(dtype):
    x = _values(dtype)
    got, want = activations.gelu(x), reference.gelu(x)
    assert got.dtype == dtype
    # spmdsim.activations' stated bounds (1 + tanh cancels for negative x in any float32 tanh formula).
    rtol, atol = (2e-5, 5e-7) if dtype == np.float32 else (2e-3, 1e-3)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_single_precision_gelu_backward_is_dy_times_the_derivative(dtype):
    x = _values(dtype)
    dy = np.random.default_rng(1).uniform(-1, 1, x.shape).astype(dtype)  # the bounds are per unit of dy
    got = activations.gelu_backward(x, dy)
    want = dy.astype(np.float64) * rg.gelu_grad(x.astype(np.float64))
    assert got.dtype == dtype and got.shape == x.shape
    rtol, atol = (2e-5, 2e-6) if dtype == np.float32 else (4e-3, 4e-3)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_float64_and_integers_take_the_reference_formula_exactly():
    x = _values(np.float64)
    dy = np.random.default_rng(2).standard_normal(x.shape)
    np.testing.assert_array_equal(activations.gelu(x), reference.gelu(x))
    np.testing.assert_array_equal(activations.gelu_backward(x, dy), dy * rg.gelu_grad(x))
    ints = np.array([-2, 0, 3])
    assert activations.gelu(ints).dtype == np.float64
    np.testing.assert_array_equal(activations.gelu(ints), reference.gelu(ints))


def test_the_kernels_do_not_write_their_inputs():
    x = _values(np.float32)
    dy = np.ones_like(x)
    x0, dy0 = x.copy(), dy.copy()
    activations.gelu(x)
    activations.gelu_backward(x, dy)
    activations.relu_backward(x, dy)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)


def test_relu_backward_passes_dy_where_x_is_positive():
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    np.testing.assert_array_equal(activations.relu_backward(x, np.array([5, 6, 7], np.float32)), [0, 0, 7])


def test_unknown_activation_is_refused_by_name():
    with pytest.raises(OperatorError, match="'tanh' is not supported"):
        activations.forward("tanh")
    with pytest.raises(OperatorError, match="'tanh' is not supported"):
        activations.backward("tanh")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64])
def test_gelu_tanh_and_gelu_from_tanh_write_out_what_they_return(dtype):
    x = np.linspace(-4, 4, 24).reshape(4, 6).astype(dtype)
    t = activations.gelu_tanh(x)
    t_out = np.full(t.shape, np.nan, t.dtype)
    assert activations.gelu_tanh(x, t_out) is t_out and np.array_equal(t_out, t)
    y = activations.gelu_from_tanh(x, t)
    y_out = np.full(y.shape, np.nan, y.dtype)
    assert activations.gelu_from_tanh(x, t, y_out) is y_out and np.array_equal(y_out, y)
