"""A researcher's own op as a `spmdsim.nn.autograd.Function` (docs/howto/add-operator.md), the mistakes they make
next: each refused in one line naming the value and what was expected, alike on every simulated rank."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.nn import ops
from spmdsim.nn.autograd import Function
from test_autograd_api import _refused  # the messages a body raised on each rank

A = np.arange(16.0).reshape(4, 4) / 7 - 1


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


def test_arguments_on_two_meshes_are_refused_naming_both():
    """Its forward multiplied a (2, 2) block by a (1, 4) one: numpy's broadcast error from the user's own
    line, or, where the blocks' shapes agreed, a silent product of unrelated regions."""
    def body():
        layout, x = _rows()
        cols = Layout((2,), ("tp",))
        _Double.apply(x, DTensor.from_global(Mesh(cols), A, cols(None, "tp")))

    assert _refused(2, body) == {"_Double.apply: its DTensor arguments live on different meshes: Layout(dp=2) and "
                                 "Layout(tp=2); redistribute one onto the other's mesh first"}


@pytest.mark.parametrize("given, line", [
    (lambda layout: layout, "layout=Layout(dp=2), a device matrix; expected a TensorLayout on the arguments' mesh, as "
                            "x.mesh.layout(...) gives, or an argument's own (x.layout: (\"dp\", None))"),
    (lambda layout: ("dp", None), "layout=tuple ('dp', None); expected a TensorLayout on the arguments' mesh, as "
                                  "x.mesh.layout(...) gives, or an argument's own (x.layout: (\"dp\", None))"),
    (lambda layout: Layout((2,), ("tp",))("tp", None), "layout=(\"tp\", None) is over Layout(tp=2), but the "
                                                       "arguments live on Layout(dp=2); build it on their mesh: "
                                                       "x.mesh.layout(...)"),
])
def test_a_layout_not_on_the_arguments_mesh_is_refused_before_forward(given, line):
    """A Layout (the device matrix, not a tensor's) or a tuple was an AttributeError ('local_shape') from inside
    apply; a TensorLayout of another device matrix a complaint about the forward's block shape."""
    def body():
        layout, x = _rows()
        _Double.apply(x, layout=given(layout))

    assert _refused(2, body) == {f"_Double.apply: {line}"}


def test_a_shape_given_as_text_is_refused_as_a_shape():
    """shape="4,4" was read as the characters ('4', ',', '4')."""
    def body():
        layout, x = _rows()
        _Double.apply(x, shape="4,4")

    assert _refused(2, body) == {"_Double.apply: shape= '4,4' must be a sequence of integers"}


class _Plain(Function):
    """A PyTorch user's Function with the @staticmethod left off its forward."""

    def forward(self, ctx, x):
        return 2 * x


def test_a_forward_that_is_not_a_static_method_is_refused_as_such():
    """It was "TypeError: _Plain.forward() missing 1 required positional argument: 'x'"."""
    def body():
        layout, x = _rows()
        _Plain.apply(x)

    assert _refused(2, body) == {"_Plain.forward is not a static method; write @staticmethod above "
                                 "def forward(ctx, ...), as PyTorch's Function does"}


class _SquareSum(Function):
    """A custom loss: this rank's sum of squares, a pending sum over every axis that splits x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return float((x * x).sum())  # a Python float, as a researcher writes it

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return 2 * x * dy


def test_a_function_returning_a_scalar_makes_a_0d_dtensor():
    """A scalar's block passed the shape check, then was made 1-d: "local shard shape (1,) does not match ()"."""
    def body():
        layout, x = _rows()
        loss = _SquareSum.apply(x, layout=layout(partial="dp"), shape=())
        loss.backward()
        return ops.resolved(loss).item(), np.array_equal(x.grad.gather(), 2 * A)

    assert spmdsim.simulate(2, body) == [(pytest.approx((A * A).sum()), True)] * 2


def test_a_shape_without_its_layout_names_layout_and_the_ways_to_write_it():
    """shape=() without layout= kept the argument's ("dp", None) and said "tensor map ("dp", None) has 2 entries but
    shape () has 0 dims", naming neither layout= nor how a scalar's layout reads."""
    def body():
        layout, x = _rows()
        _SquareSum.apply(x, shape=())

    assert _refused(2, body) == {
        "_SquareSum.apply: shape=() has 0 dims but the first argument's layout (no layout= given) (\"dp\", None) has "
        "2 entries; give layout= for the output on the arguments' mesh: x.mesh.layout() replicated, or "
        "x.mesh.layout(partial=('dp',)) where each rank's block is an addend"}


class _ForwardOnly(Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x


def test_a_function_without_backward_names_itself_when_a_gradient_is_asked():
    """It was "NotImplementedError: a Function subclass defines backward(ctx, dy)", naming no class."""
    def body():
        layout, x = _rows()
        ops.sum(_ForwardOnly.apply(x)).backward()

    assert _refused(2, body) == {"_ForwardOnly defines no backward, and an argument of it requires grad; write "
                                 "@staticmethod def backward(ctx, dy) returning one gradient per DTensor argument "
                                 "(or call it under spmdsim.nn.autograd.no_grad())"}


class _Columns(Function):
    """x @ w with x whole on every rank and w's columns split over "tp": Megatron's column-parallel matmul."""

    summed = True

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = dy @ w.T  # through this rank's columns alone: the conjugate of using one x everywhere adds them up
        return (spmdsim.runtime.allreduce(ctx.mesh, dx, "tp") if _Columns.summed else dx), x.T @ dy


@pytest.mark.parametrize("summed", [True, False])
def test_a_copys_gradient_returned_without_its_allreduce_is_warned(monkeypatch, recwarn, summed):
    """A backward that forgot the Allreduce over "tp" of a replicated x's gradient gave each rank its own part as
    "the" gradient of a replicated tensor: ranks disagreed and nothing said so. Rank 0 now warns, naming the
    argument, the axis and the collective; the summed backward passes without a word."""
    monkeypatch.setattr(_Columns, "summed", summed)
    w_global = np.arange(8.0).reshape(4, 2) + 1

    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        x = DTensor.from_global(mesh, A[:3], mesh.layout(None, None)).requires_grad_()
        w = DTensor.from_global(mesh, w_global, mesh.layout(None, "tp")).requires_grad_()
        _Columns.apply(x, w, layout=mesh.layout(None, "tp"), shape=(3, 2)).sum().backward()
        return bool(np.array_equal(x.grad.local, np.ones((3, 2)) @ w_global.T))

    assert spmdsim.simulate(2, body) == [summed] * 2
    said = [str(w.message) for w in recwarn if w.category is RuntimeWarning]
    assert said == ([] if summed else [
        "_Columns: DTensor argument 0 is replicated over ('tp',), which splits the output or another argument, and "
        "_Columns.backward returned its gradient without a collective over them: each rank holds the gradient "
        "through its own part only; add the parts up in backward: allreduce(ctx.mesh, grad, ('tp',)) "
        "(docs/howto/add-operator.md)"])
