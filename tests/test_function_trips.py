"""A researcher's own op as a `spmdsim.nn.autograd.Function` (docs/howto/add-operator.md), the mistakes they make
next: each refused in one line naming the value and what was expected, alike on every simulated rank."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.errors import OperatorError
from spmdsim.nn import ops
from spmdsim.nn.autograd import Function

A = np.arange(16.0).reshape(4, 4) / 7 - 1


def _refused(ranks: int, body) -> set:
    """The messages `body` raised on each rank (one entry when every rank raised the same)."""
    def wrapped():
        try:
            body()
        except OperatorError as e:
            return str(e)
        return None

    return set(spmdsim.simulate(ranks, wrapped))


class _Double(Function):
    """2 x, elementwise; `backward` returns what the test puts in `_Double.grad` (a function of dy)."""

    grad = staticmethod(lambda dy: 2 * dy)

    @staticmethod
    def forward(ctx, x, *rest):
        return 2 * x

    @staticmethod
    def backward(ctx, dy):
        return _Double.grad(dy)


def _rows():
    """(the 2-rank mesh's layout, A's rows split over "dp" requiring grad)."""
    layout = Layout((2,), ("dp",))
    return layout, DTensor.from_global(Mesh(layout), A, layout("dp", None)).requires_grad_()


def test_a_complex_block_is_named_by_its_dtype():
    """It said "returned a ndarray as a gradient; expected a numpy array"."""
    def body():
        layout, x = _rows()
        ops.sum(_Double.apply(x)).backward()

    _Double.grad = staticmethod(lambda dy: (2 * dy).astype(np.complex64))
    try:
        assert _refused(2, body) == {"_Double.backward returned an array of dtype 'complex64' as a gradient; "
                                     "expected a numpy array of real numbers (bool, integer or float), the "
                                     "gradient of this rank's block of that argument"}
    finally:
        _Double.grad = staticmethod(lambda dy: 2 * dy)
