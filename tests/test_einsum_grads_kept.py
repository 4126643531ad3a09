"""The einsum rule's backward keeps, per call signature and dY layout object, each operand's gradient layout and
what its product contracts (spmdsim.nn.autograd.rules.einsum: `Prepared.ways`), and a repeated backward builds the
gradients from it. A kept entry must never serve another dY layout (here: dY whole, then pending over "dp"),
another pattern of operands that take a gradient, or operands of another dtype: each gradient below is checked
against numpy's, and its layout against the pending sums it carries."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.nn import ops
from spmdsim.nn.autograd.rules.einsum import einsum_grads

_EINSUMS = importlib.import_module("spmdsim.nn.ops.einsum")._PREPARED  # (ops.einsum is also the function)

X = np.arange(48.0).reshape(8, 6) / 11 - 1.5
W = np.arange(24.0).reshape(6, 4) / 7 - 1.2
G = np.arange(32.0).reshape(8, 4) / 5 - 3.0  # the upstream gradient dY


@pytest.mark.usefixtures("empty_tables")  # (ops.einsum's table of prepared calls starts over when full: filled
# by earlier tests, it could start over inside this test and a rank's entry, with the dY layouts it saw, go)
def test_kept_gradient_decisions_serve_only_their_own_dy_layout_needs_and_dtypes():
    def body():
        layout = Layout((2, 2), ("dp", "tp"))
        mesh = Mesh(layout)
        whole = layout(None, None)
        x_layout, w_layout = layout(None, "tp"), layout("tp", None)  # one object each: one call signature
        # dY whole on every rank, and dY pending over "dp" (each dp member holds half of it): two layouts
        dys = {"whole": DTensor.from_global(mesh, G, whole),
               "pending": DTensor.from_local(mesh, G / 2, whole.with_partial(("dp",)), G.shape)}
        checked = 0
        for which, x_grad, x_dtype in [("whole", True, "float64"), ("whole", True, "float64"),
                                       ("pending", True, "float64"), ("pending", True, "float64"),
                                       ("whole", False, "float64"), ("pending", False, "float64"),
                                       ("pending", True, "float32"), ("pending", True, "float32"),
                                       ("whole", True, "float64")]:
            x = DTensor.from_global(mesh, X.astype(x_dtype), x_layout)  # j split: y pending over tp
            if x_grad:
                x.requires_grad_()
            w = DTensor.from_global(mesh, W, w_layout).requires_grad_()
            y = ops.einsum("ij,jk->ik", x, w)
            (prepared,) = [p for key, p in _EINSUMS.copy().items()
                           if key[:3] == ("ij,jk->ik", id(x_layout), id(w_layout))
                           and key[5] == x._local.dtype]
            gx, gw = einsum_grads((x, w), prepared)(dys[which])
            pending = ("dp",) if which == "pending" else ()
            if x_grad:
                assert gx.dtype == np.dtype(x_dtype) and gx.layout.partial == pending, (which, x_dtype)
                np.testing.assert_allclose(gx.gather(), G @ W.T, rtol=1e-6)
            else:
                assert gx is None
            # w's gradient sums over i, which nothing splits: pending only where dY was
            assert gw.layout.partial == pending and gw.dtype == np.float64
            np.testing.assert_allclose(gw.gather(), X.astype(x_dtype).astype(np.float64).T @ G, rtol=1e-6)
            assert y.layout.partial == ("tp",)
            checked += 1
        kept = [p for key, p in _EINSUMS.copy().items() if key[:3] == ("ij,jk->ik", id(x_layout), id(w_layout))]
        mesh.close()
        return checked, sorted(len(p.ways) for p in kept)

    for checked, ways in spmdsim.simulate(4, body):
        assert checked == 9 and ways == [1, 2]  # float32 x saw one dY layout, float64 x both
