"""Where a bfloat16 computation rounds (docs/howto/bf16.md, "Rounding points"), pinned bit for bit.

A layer norm or RMSNorm on bfloat16 input rounds once, as TransformerEngine's fused norms: its statistics, the
normalized values, times weight and plus bias in float32, the output rounded once to bfloat16. The same on every
layout (rows whole: one node, under either kept set; rows split over tp: the composite of the general rules),
and its backward in float32 (the output's gradient rounded where its rule reads it, dY w and the normalized values
not rounded). The attention core rounds its probabilities, their dropped-out values and its output, its scores
and their 1/sqrt(d) scale float32. The check's reference (spmdsim.models.gpt.mixed) rounds at the same points, and
a reference that rounds the norm three times (normalized, times weight, plus bias) is told apart.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.base.precision import rounded, wide
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import train
from spmdsim.nn import ops

pytest.importorskip("ml_dtypes")

ROWS, D, EPS = 8, 16, 1e-5


def _inputs():
    bf16 = spmdsim.base.precision.bfloat16()
    rng = np.random.default_rng(3)
    x, w, b, dz = (rng.standard_normal(s).astype(np.float32) * k
                   for s, k in (((ROWS, D), 3.0), ((D,), 1.0), ((D,), 0.5), ((ROWS, D), 1.0)))
    return tuple(a.astype(bf16) for a in (x, w, b)) + (dz,)


def _numpy_norm(x, w, b, centre):
    """The fused norm in float32, rounded once; and its input's, weight's and bias's gradients for output
    gradient dz (float32, the rule's order)."""
    block = wide(x)
    c = block - np.add.reduce(block, axis=-1, keepdims=True) * (1.0 / D) if centre else block
    root = np.sqrt(np.add.reduce(c * c, axis=-1, keepdims=True) * (1.0 / D) + EPS)
    y = c / root
    out = y * wide(w)
    if centre:
        out = out + wide(b)
    return rounded(out, x.dtype), y, root


def _run(layout_dims, centre, kept):
    x, w, b, dz = _inputs()

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        try:
            xd = DTensor.from_global(mesh, x, mesh.layout(*layout_dims)).requires_grad_()
            xi = xd + xd * 0  # an activation (a node's output), as a block's are
            wd = DTensor.from_global(mesh, w, mesh.layout(None)).requires_grad_()
            bd = DTensor.from_global(mesh, b, mesh.layout(None)).requires_grad_()
            if centre:
                out = ops.layer_norm(xi, wd, bd, eps=EPS, kept=kept)
            else:
                out = ops.rms_norm(xi, wd, eps=EPS, kept=kept)
            g = DTensor.from_global(mesh, dz.astype(out.dtype), out.layout)
            ops.sum(out * g).backward()
            grads = [t.grad.gather() for t in ((xd, wd, bd) if centre else (xd, wd))]
            return out.gather(), grads
        finally:
            mesh.close()

    return spmdsim.simulate(4, body)[0]


@pytest.mark.parametrize("centre", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dims, kept", [(("dp", None), "graph"), (("dp", None), "megatron"),
                                        ((None, None), "graph"), (("dp", "tp"), "graph")],
                         ids=["rows-whole-graph", "rows-whole-megatron", "replicated", "rows-split-over-tp"])
def test_a_bf16_norm_rounds_its_output_once(centre, dims, kept):
    x, w, b, dz = _inputs()
    out, _ = _run(dims, centre, kept)
    expected, y, root = _numpy_norm(x, w, b, centre)
    assert out.dtype == x.dtype
    if dims[1] is None:  # a whole row: the kernel's order, bit for bit
        assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))
    else:  # split over tp: its statistics summed by Allreduce, another order; at most one ulp apart, rarely
        ulps = np.abs(out.view(np.int16).astype(int) - expected.view(np.int16).astype(int))
        assert ulps.max() <= 1 and np.count_nonzero(ulps) <= out.size // 20
    three = rounded(wide(rounded(wide(rounded(y, x.dtype)) * wide(w), x.dtype)) + (wide(b) if centre else 0),
                    x.dtype)  # the three roundings it no longer makes: most of a row differs somewhere
    assert not np.array_equal(three.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("centre", [True, False], ids=["layer_norm", "rms_norm"])
def test_a_bf16_norms_backward_is_float32_from_the_rounded_output_gradient(centre):
    x, w, b, dz = _inputs()
    _, grads = _run(("dp", None), centre, "graph")
    _, y, root = _numpy_norm(x, w, b, centre)
    bf16 = x.dtype
    d = wide(rounded(dz, bf16))  # the output's gradient, rounded where the node reads it
    dyy = d * wide(w)  # not rounded (TransformerEngine's backward: float32 throughout)
    g = dyy - np.add.reduce(dyy * y, axis=-1, keepdims=True) * (1.0 / D) * y
    if centre:
        g = g - np.add.reduce(dyy, axis=-1, keepdims=True) * (1.0 / D)
    gx = g * (1.0 / root)
    assert all(t.dtype == np.float32 for t in grads)
    # x's gradient reaches xd through xi's node, which rounds it to bfloat16 (an activation's gradient): the
    # float32 value rounded, at most one ulp apart where a float32 sum in another order crosses a rounding
    got, want = (rounded(a, bf16).view(np.int16).astype(int) for a in (grads[0], gx))
    assert np.abs(got - want).max() <= 1 and np.count_nonzero(got - want) <= got.size // 10
    np.testing.assert_allclose(grads[1], (d * y).sum(0), rtol=1e-5, atol=1e-5)
    if centre:
        np.testing.assert_allclose(grads[2], d.sum(0), rtol=1e-5, atol=1e-5)


def test_the_reference_norm_rounds_where_the_ranks_do():
    from spmdsim.models.gpt import mixed

    x, w, b, _ = _inputs()
    r = mixed._Rounder(x.dtype, GPTConfig(dropout=0.0), None)
    for centre in (True, False):
        P = {"n.w": w, **({"n.b": b} if centre else {})}
        out, _ = mixed._ln(P, "n", x, GPTConfig(ln_eps=EPS), r)
        expected = _numpy_norm(x, w, b, centre)[0]
        assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_the_attention_core_rounds_probabilities_not_scores():
    """The core's scores q k^T / sqrt(d) stay float32 into its softmax; the probabilities are rounded once
    (the product with v reads bfloat16, as flash attention's P), the output once: bit for bit against numpy."""
    bf16 = spmdsim.base.precision.bfloat16()
    rng = np.random.default_rng(5)
    B, H, T, Dh = 1, 2, 8, 4
    q, k, v = (rng.standard_normal((B, T, H, Dh)).astype(np.float32).astype(bf16) for _ in range(3))

    def body():
        mesh = Mesh(Layout((1,), ("tp",)), spmdsim.world())
        try:
            qd, kd, vd = (DTensor.from_global(mesh, a, mesh.layout(None, None, None, None)) for a in (q, k, v))
            return ops.attention(qd, kd, vd, causal=True).gather()
        finally:
            mesh.close()

    out = spmdsim.simulate(1, body)[0]
    qh, kh, vh = (wide(a).transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, H, T, Dh)
    s = np.matmul(qh, kh.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(Dh))
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = rounded(e / e.sum(-1, keepdims=True), bf16)
    expected = rounded(np.matmul(wide(p), vh), bf16).transpose(0, 2, 1, 3)
    assert out.dtype == bf16
    assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_a_reference_that_rounds_the_norm_three_times_is_told_apart(monkeypatch):
    """The check's reference with the norms rounding their normalized values, times weight and plus bias each
    (the points before this policy): many gradient entries differ once rounded to bfloat16 (the ranks round
    once), where the reference that rounds where the ranks round changes a few hundredths. Those few depend
    on the BLAS kernels (float32 products summed in another order flip a rounding now and then): at most
    0.05 with OpenBLAS's SkylakeX kernels, 0.075 with its Haswell ones; the thrice-rounded norm's 0.39-0.60."""
    import spmdsim.models.gpt.checker as C
    from spmdsim.models.gpt import mixed

    shares = []

    def checked(cfg):
        act, compare = spmdsim.base.precision.bfloat16(), C.step_errors
        del shares[:]

        def spy(value, ref_loss, grads, updated, tensors, *rest):
            if spmdsim.world().Get_rank() == 0:
                pairs = [(np.asarray(t.grad.local, np.float32).astype(act),
                          np.asarray(grads[n][t.slices], np.float32).astype(act)) for n, t in tensors.items()]
                shares.append(sum(int(np.count_nonzero(a != b)) for a, b in pairs) / sum(a.size for a, _ in pairs))
            return compare(value, ref_loss, grads, updated, tensors, *rest)

        monkeypatch.setattr(C, "step_errors", spy)
        text = encode(load_text(20_000))
        spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), 2, 2, 2, text, sp=True, precision="bf16-mixed"))
        return list(shares)

    cfg = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.0)
    assert max(checked(cfg)) <= 0.15

    def three_times(P, pre, h, cfg, r):
        block = wide(h)
        c = block - np.sum(block, axis=-1, keepdims=True) * (1.0 / h.shape[-1])
        root = np.sqrt(np.sum(c * c, axis=-1, keepdims=True) * (1.0 / h.shape[-1]) + cfg.ln_eps)
        yn = wide(r(c / root))
        return r(wide(r(yn * wide(P[pre + ".w"]))) + wide(P[pre + ".b"])), (yn, 1.0 / root)

    monkeypatch.setattr(mixed, "_ln", three_times)
    assert min(checked(cfg)) >= 0.3
