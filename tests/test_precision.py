"""spmdsim.base.precision.matmul: np.matmul's values, a stack of rows times one matrix as one product."""
import numpy as np
import pytest

from spmdsim.base.precision import matmul, product


def _within(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """`got` is np.matmul(a, b) up to the rounding of a k-term dot product (its terms' magnitudes)."""
    want = np.matmul(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    k = a.shape[-1]
    bound = k * np.finfo(want.dtype).eps * np.matmul(np.abs(a), np.abs(b))
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("a_shape, b_shape", [((64, 4, 128), (128, 128)), ((2, 3, 5, 7), (7, 4)),
                                              ((1, 6, 3), (3, 2)), ((0, 4, 3), (3, 5)), ((4, 2, 0), (0, 3)),
                                              ((6, 5), (5, 4)), ((2, 6, 5), (2, 5, 4))])
def test_matmul_is_numpys(a_shape: tuple, b_shape: tuple) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    _within(matmul(a, b), a, b)
    _within(product(a, b), a, b)
    _within(matmul(a, b.T.copy().T), a, b)  # a transposed view of b, as a backward's W^T
    out = np.empty(np.matmul(a, b).shape)
    assert matmul(a, b, out=out) is out
    _within(out, a, b)


def test_matmul_on_views_numpy_takes_as_they_are() -> None:
    """A stack that is no C-contiguous block (a transposed view), or an `out` that is none, goes to
    np.matmul as it is: values and the `out` written alike."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 64, 8)).transpose(1, 0, 2)  # (64, 4, 8), not C-contiguous
    b = rng.standard_normal((8, 5))
    _within(matmul(a, b), a, b)
    out = np.empty((4, 64, 5)).transpose(1, 0, 2)
    assert matmul(a, b, out=out) is out
    _within(out, a, b)
    c = np.ascontiguousarray(a)
    out = np.empty((4, 64, 5)).transpose(1, 0, 2)
    assert matmul(c, b, out=out) is out
    _within(out, c, b)


def test_one_product_for_a_stack_times_a_matrix() -> None:
    """The stack's rows meet the matrix in one 2-d product: what np.matmul gets is (M, k) @ (k, n)."""
    seen = []
    real = np.matmul

    class Spy:
        def __getattr__(self, name):  # the module's numpy, but np.matmul recorded
            return getattr(np, name)

        @staticmethod
        def matmul(x, y, out=None):
            seen.append((x.shape, y.shape))
            return real(x, y, out=out)

    import spmdsim.base.precision as precision
    was = precision.np
    precision.np = Spy()
    try:
        matmul(np.ones((64, 4, 16)), np.ones((16, 8)))
    finally:
        precision.np = was
    assert seen == [((256, 16), (16, 8))]
