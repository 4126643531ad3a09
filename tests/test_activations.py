"""The activations' local kernels (spmdsim.references.activations) against the float64 reference."""
import numpy as np
import pytest

from spmdsim.references import activations, forward as reference
from spmdsim.references import backward as rg
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
    # spmdsim.references.activations' stated bounds (1 + tanh cancels for negative x in any float32 tanh formula).
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


@pytest.mark.parametrize("shape", [(4, 6), ()])  # a 0-d shard as one element, its results 0-d arrays
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64])
def test_gelu_tanh_and_gelu_from_tanh_write_out_what_they_return(dtype, shape):
    x = np.linspace(-4, 4, 24).reshape(4, 6).astype(dtype)
    x = x[2, 1, ...] if shape == () else x  # a 0-d array (x[2, 1] would be a numpy scalar)
    t = activations.gelu_tanh(x)
    t_out = np.full(t.shape, np.nan, t.dtype)
    assert activations.gelu_tanh(x, t_out) is t_out and np.array_equal(t_out, t)
    y = activations.gelu_from_tanh(x, t)
    y_out = np.full(y.shape, np.nan, y.dtype)
    assert activations.gelu_from_tanh(x, t, y_out) is y_out and np.array_equal(y_out, y)
    g = activations.gelu_backward(x, np.ones_like(y), t)
    assert type(x) is type(t) is type(y) is type(g) is np.ndarray and t.shape == y.shape == g.shape == x.shape


def _np_activations():
    """name -> (numpy forward, numpy derivative) in float64, written out here (not spmdsim's formulas)."""
    import math

    c, erf = math.sqrt(2 / math.pi), np.vectorize(math.erf, otypes=[np.float64])

    def tanh_(x):
        return np.tanh(c * (x + 0.044715 * x ** 3))

    def sig(x):
        return 1 / (1 + np.exp(-x))

    def phi(x):
        return np.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    return {
        "relu": (lambda x: np.maximum(x, 0), lambda x: (x > 0) * 1.0),
        "gelu": (lambda x: 0.5 * x * (1 + tanh_(x)),
                 lambda x: 0.5 * (1 + tanh_(x)) + 0.5 * x * (1 - tanh_(x) ** 2) * c * (1 + 3 * 0.044715 * x * x)),
        "gelu_none": (lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), lambda x: 0.5 * (1 + erf(x / math.sqrt(2)))
                      + x * phi(x)),
        "sigmoid": (sig, lambda x: sig(x) * (1 - sig(x))),
        "silu": (lambda x: x * sig(x), lambda x: sig(x) + x * sig(x) * (1 - sig(x))),
        "erf": (erf, lambda x: 2 / math.sqrt(math.pi) * np.exp(-x * x)),
    }


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_activations_of_0d_and_1_element_dtensors_forward_and_backward(dtype):
    """Every activation on a 0-d DTensor (replicated, and a pending sum added up first) and a 1-element one, on 2
    simulated ranks: values and gradients against numpy's formulas (GELU's tanh form crashed on 0-d: numpy gives
    a 0-d operand's result as a scalar, which takes no out=)."""
    import spmdsim
    from spmdsim import DTensor, Layout, Mesh, TensorLayout
    from spmdsim.nn import ops

    numpy = _np_activations()
    numpy["gelu_megatron"] = numpy["gelu"]  # the tanh form, its backward computing the tanh again
    calls = {"gelu": ops.gelu, "gelu_megatron": lambda x: ops.gelu(x, kept="megatron"),
             "gelu_none": lambda x: ops.gelu(x, approximate="none"), "relu": ops.relu, "sigmoid": ops.sigmoid,
             "silu": ops.silu, "erf": ops.erf}
    value = -0.7

    def body():
        mesh = Mesh(Layout((2,), ("m0",)))
        out = []
        for name, call in calls.items():
            pending = TensorLayout(mesh.layout, (), ("m0",))  # each rank's addend half the value
            for shape, layout, local in (((), mesh.layout(), value), ((), pending, value / 2),
                                         ((1,), mesh.layout(None), [value])):
                x = DTensor.from_local(mesh, np.array(local, dtype), layout, shape).requires_grad_()
                y = call(x)
                ops.sum(y * 3.0).backward()  # an upstream of 3 on every element
                out.append((name, str(layout), y.gather(), x.grad.gather(), y.local.dtype, x.grad.local.dtype))
        return out

    results = spmdsim.simulate(2, body)
    rtol = 1e-14 if dtype == "float64" else 2e-6
    assert len(results[0]) == 3 * len(calls)
    for name, layout, y, grad, ydtype, gdtype in results[0]:
        forward, slope = numpy[name]
        x = np.full(y.shape, value)
        assert ydtype == gdtype == dtype, (name, layout)
        assert y.shape == grad.shape and y.shape in ((), (1,)), (name, layout)
        np.testing.assert_allclose(y, forward(x), rtol=rtol, atol=0, err_msg=f"{name} {layout}")
        np.testing.assert_allclose(grad, 3.0 * slope(x), rtol=rtol, atol=0, err_msg=f"{name} {layout} gradient")


def test_bfloat16_blocks_give_the_float32_they_are_computed_in():
    """sigmoid and gelu_erf of a bfloat16 block gave float32 (the `wide` precision the forward rounds from, and a
    gradient rule reads), erf float64: wider than its peers. Now erf gives float32 too, erf of the widened block;
    gelu rounds to bfloat16 within itself, and the pointwise ops round each once (bfloat16 results)."""
    pytest.importorskip("ml_dtypes")
    from spmdsim.base.precision import bfloat16

    bf16 = bfloat16()
    x = np.array([-2.5, -0.7, 0.0, 0.3, 1.9]).astype(bf16)
    wide = x.astype(np.float32)
    for kernel in (activations.sigmoid, activations.erf, activations.gelu_erf):
        got = kernel(x)
        assert got.dtype == np.float32, (kernel.__name__, got.dtype)
        np.testing.assert_array_equal(got, kernel(wide))
    assert activations.gelu(x).dtype == bf16


def test_bfloat16_gelu_erf_slope_is_the_widened_blocks():
    """The gelu_erf rule's slope of a bfloat16 block: its Python constants kept x / sqrt 2 and x^2 / 2 in bfloat16
    under ml_dtypes 0.7 (a weak Python number beside bfloat16), 3e-4 from the float32 slope the forward's
    gelu_erf matches. Now the slope of the widened block, float32, bit for bit."""
    pytest.importorskip("ml_dtypes")
    from spmdsim.base.precision import bfloat16
    from spmdsim.nn.autograd.rules.pointwise import _gelu_erf_slope

    x = np.linspace(-3, 3, 13).astype(bfloat16())
    got = _gelu_erf_slope(x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _gelu_erf_slope(x.astype(np.float32)))
