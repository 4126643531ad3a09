"""A contributor's new operator inside spmdsim (docs/howto/add-operator.md, "Add a rule to spmdsim"): a piece left
out is refused when the op is called, never a silently missing gradient."""
from __future__ import annotations

import numpy as np

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.errors import OperatorError
from spmdsim.nn import ops
from spmdsim.nn.autograd.rules import pointwise as rules
from spmdsim.nn.ops import pointwise
from spmdsim.programs.infer import pointwise as infer

A = np.arange(8.0).reshape(4, 2) / 7 - 0.5


def test_every_elementwise_kernel_has_a_derivative_or_takes_none():
    assert set(pointwise._KERNELS) - set(rules.DERIVATIVES) == rules.NO_DERIVATIVE


def test_an_elementwise_op_without_its_derivative_is_refused(monkeypatch):
    """softplus given its kernel and linearity but no derivative: x.grad was 1 (x's own term), softplus's
    sigmoid(x) silently missing."""
    monkeypatch.setitem(pointwise._KERNELS, "softplus", lambda x: np.logaddexp(0, x))
    monkeypatch.setitem(infer.LINEARITY, "softplus", None)
    monkeypatch.setattr(pointwise, "_PREPARED", {})

    def body():
        layout = Layout((2,), ("dp",))
        x = DTensor.from_global(Mesh(layout), A, layout("dp", None)).requires_grad_()
        try:
            ops.sum(pointwise.pointwise("softplus", x) + x).backward()
        except OperatorError as e:
            return str(e)
        return f"no refusal: x.grad is 1 everywhere: {np.allclose(x.grad.gather(), 1)}"

    assert spmdsim.simulate(2, body) == ["softplus has no derivative: add one to "
                                         "spmdsim.nn.autograd.rules.pointwise.DERIVATIVES (or its name to "
                                         "NO_DERIVATIVE there, where its result is bool or integer)"] * 2
