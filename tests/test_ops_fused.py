"""The graph's fused pieces (spmdsim.nn.ops.fused): each is its chain of separate operators, one node.

The same values and gradients bit for bit, the same bytes kept for backward (spmdsim.nn.autograd.kept_bytes) and the
same FLOPs and kernels counted (spmdsim.base.flops), on a tensor-parallel case with a pending-free product, a broadcast
bias and a transposed dropout mask, a layer norm and an RMSNorm with their weight and bias (the sequence-parallel
layout: the weight's gradient pending), at fp64, fp32 and bfloat16 (the operands a node's outputs of their dtype, so
every bfloat16 rounding is the chain's; the norms at fp64 and fp32 only: a bfloat16 norm rounds once), each measured on
a repeated call signature (which runs its kernels and builds its tensors and node without the general helpers, but at
bfloat16); a GPT block of kept "graph" records 16 nodes where its separate operators recorded 31; and the GPT compares
an activation's layout object with its whole layout once.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.nn import ops
from spmdsim.nn.autograd import kept_as, kept_bytes
from spmdsim.base.flops import counting
from spmdsim.nn.ops import fused, norm_affine, residual

T, B, D, E, N = 4, 2, 6, 8, 2  # (T, B, D) activations, E = N heads of E / N


def _separate_linear(spec, x, w, bias=None, shape=None):
    y = ops.einsum(spec, x, w)
    y = y if bias is None else y + bias
    return y if shape is None else ops.reshape(y, shape)


def _separate_residual(h, y, bias=None, p=0.0, seed=None, mask_dims=None):
    y = y if bias is None else y + bias
    return h + (ops.dropout(y, p, seed=seed, mask_dims=mask_dims) if p else y)


def _separate_reshape_einsum(x, shape, spec, w):
    return ops.einsum(spec, ops.reshape(x, shape), w)


def _separate_norm(x, w=None, b=None, centre=True):
    from spmdsim.nn.ops.normalize import _normalized

    y = _normalized(x, 2, 1e-5, centre, "layer_norm" if centre else "rms_norm")
    y = y if w is None else y * w
    return y if b is None else y + b


def _fused_norm(x, w=None, b=None, centre=True):
    return ops.layer_norm(x, w, b, eps=1e-5) if centre else ops.rms_norm(x, w, eps=1e-5)


_NORMS = {"layer_norm": (True, True, True), "layer_norm_weight": (True, True, False),
          "layer_norm_bias": (True, False, True), "rms_norm": (False, True, False),
          "layer_norm_of_a_leaf": (True, True, True)}


# The general helpers a fused piece's first call goes through; a repeat of its call signature (fp64,
# fp32: no bfloat16 kernel) runs its kernels and builds its tensors and node itself, calling none of them
_HELPERS = ("signature", "prepared_result", "make_dtensor", "_product", "_added", "_dropped", "_add_plan")
_CALLED: dict = {}  # thread -> how many calls of _HELPERS it made


def _operands(name, x, leaf, computed):
    """The operands of the piece `name` after x (made once: a repeated call passes the same tensors) and its leaves
    whose gradients are compared."""
    if name in ("einsum_bias", "einsum_reshape"):
        w = leaf((D, E), None, "tp")
        b = leaf((E,), "tp") if name == "einsum_bias" else None
        return (x, w, b), {k: t for k, t in (("w", w), ("b", b)) if t is not None}
    if name == "reshape_einsum":
        heads = computed(leaf((T, B, N, D // N), None, "dp", "tp", None))
        w = leaf((D, E), "tp", None)
        return (heads, w), {"w": w}
    if name in _NORMS:  # the sequence-parallel layout: rows whole, the weight's gradient pending over both
        centre, weighted, biased = _NORMS[name]
        xn = leaf((T, B, D), "tp", "dp", None)
        w, b = (leaf((D,), None) if weighted else None), (leaf((D,), None) if biased else None)
        # (of a leaf: its bfloat16 node would round nothing, the chain's later nodes do: the separate nodes run)
        xin = xn if name == "layer_norm_of_a_leaf" else computed(xn)
        return (xin, w, b, centre), {k: t for k, t in (("x", xn), ("w", w), ("b", b)) if t is not None}
    # residual, with and without its bias and dropout
    bias, p = {"residual": (True, 0.25), "dropout_add": (False, 0.25), "bias_add": (True, 0.0)}[name]
    y = computed(leaf((T, B, D), "tp", "dp", None))
    h = computed(leaf((T, B, D), "tp", "dp", None))
    b = leaf((D,), None) if bias else None
    return (h, y, b, p), {"b": b} if bias else {}


def _run_piece(name, use_fused, args):
    """The piece `name` on `args` (`_operands`'), fused or as its separate operators."""
    if name == "einsum_bias" or name == "einsum_reshape":
        x, w, b = args
        f = fused.einsum_bias if use_fused else _separate_linear
        return f("tbd,de->tbe", x, w, b, (T, B, N, E // N))
    if name == "reshape_einsum":
        heads, w = args
        f = fused.reshape_einsum if use_fused else _separate_reshape_einsum
        return ops.resolved(f(heads, (T, B, D), "tbd,de->tbe", w))
    if name in _NORMS:
        xin, w, b, centre = args
        return (_fused_norm if use_fused else _separate_norm)(xin, w, b, centre)
    h, y, b, p = args
    f = residual.residual if use_fused else _separate_residual
    return f(h, y, b, p, seed=11 if p else None, mask_dims=(1, 0, 2))


def _case(name, precision):
    """A function of (mesh, fused?) -> (the output's block, {name: gradient block}, kept bytes by kind, kernels
    and products counted, nodes, calls of the general helpers) for the piece `name`, its operands on a (dp 2,
    tp 2) mesh. Fused, the piece runs twice on the same operands (a first call, then a repeat of its call
    signature, which is the one measured and differentiated)."""
    def run(mesh, use_fused):
        dtype = {"fp64": np.float64, "fp32": np.float32}.get(precision) or spmdsim.base.precision.bfloat16()
        rng = np.random.default_rng(7)

        def leaf(shape, *dims):
            return DTensor.from_global(mesh, rng.standard_normal(shape).astype(dtype), mesh.layout(*dims)) \
                .requires_grad_()

        def computed(t):  # a node's output of t's dtype (a Python float would lift a bfloat16 t to float64)
            return t + t

        # x comes from a node (as a block's activations do): its gradient is an activation's (rounded at bfloat16)
        x0 = leaf((T, B, D), None, "dp", None)
        x = computed(x0)
        args, leaves = _operands(name, x, leaf, computed)
        if name in ("einsum_bias", "einsum_reshape"):
            leaves = {"x0": x0, **leaves}
        if use_fused:
            _run_piece(name, True, args)  # the first call of this signature (its node left out of the backward)
        me = threading.get_ident()
        with counting() as flops, kept_as("piece"):
            before = _CALLED.get(me, 0)
            out = _run_piece(name, use_fused, args)
            called = _CALLED.get(me, 0) - before
            kept = kept_bytes([out], exclude=[t for t in leaves.values()])
        nodes = _count_nodes(out)
        with counting() as back:  # the backward's kernels and products too
            (out * out).sum().backward()
        grads = {k: np.asarray(t.grad.local).copy() for k, t in leaves.items()}
        counted = [dict(c.kernels) for c in (flops, back)], [dict(c.counts) for c in (flops, back)]
        return (np.asarray(out.local).copy(), grads, kept) + counted + (nodes, called)
    return run


def _count_nodes(t):
    from spmdsim.nn.autograd.checks import _topological

    return len(_topological(t._ag))


def _counted_helpers(monkeypatch):
    """Count each thread's calls of the fused pieces' general helpers (`_HELPERS`) in `_CALLED`."""
    def counted(f):
        def call(*args, **kwargs):
            me = threading.get_ident()
            _CALLED[me] = _CALLED.get(me, 0) + 1
            return f(*args, **kwargs)
        return call

    for module in (fused, residual, norm_affine):  # each piece's module, where it reaches the helper
        for helper in _HELPERS:
            if hasattr(module, helper):
                monkeypatch.setattr(module, helper, counted(getattr(module, helper)))


def _both(name, precision):
    run = _case(name, precision)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        try:
            return run(mesh, False), run(mesh, True)
        finally:
            mesh.close()

    return spmdsim.simulate(4, body)


# (a bfloat16 norm is not its chain: it rounds once, as TransformerEngine's fused norms; tests/test_bf16_rounding.py)
@pytest.mark.parametrize("name, precision", [
    (name, precision) for name in ("einsum_bias", "einsum_reshape", "reshape_einsum", "residual", "dropout_add",
                                   "bias_add", *_NORMS)
    for precision in ("fp64", "fp32", "bf16") if not (precision == "bf16" and name in _NORMS)])
@pytest.mark.usefixtures("empty_tables")  # (a table of fused calls filled by earlier tests could start over
# between the first call and its repeat, which would then go through the helpers again: tests/bounded_tables.py)
def test_a_fused_piece_is_its_separate_operators_bit_for_bit(name, precision, monkeypatch):
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    _counted_helpers(monkeypatch)
    for separate, one in _both(name, precision):
        out, grads, kept, kernels, products, nodes, _ = separate
        f_out, f_grads, f_kept, f_kernels, f_products, f_nodes, called = one
        assert out.dtype == f_out.dtype and np.array_equal(out, f_out)
        assert grads.keys() == f_grads.keys()
        for k in grads:
            assert grads[k].dtype == f_grads[k].dtype and np.array_equal(grads[k], f_grads[k]), k
        assert kept == f_kept and kept.get("piece", 0) > 0
        assert kernels == f_kernels and products == f_products
        assert f_nodes < nodes  # one node where the chain made two or three
        if precision != "bf16":  # the repeated call: its kernels run, its tensors and node built without the helpers
            assert called == 0, name


def test_a_graph_block_records_16_nodes():
    from spmdsim.nn.autograd.checks import _topological
    from spmdsim.models.gpt import GPTConfig, batch, encode, load_text
    from spmdsim.models.gpt.parallel import GPT

    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=16, batch=4, dropout=0.1)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        model = GPT(cfg, mesh, sp=True)
        x, y = batch(encode(load_text(5_000)), cfg, 0)
        xd, yd = (DTensor.from_global(mesh, a, mesh.layout("dp", None)) for a in (x, y))
        loss = model.loss(xd, yd, 0)
        kinds = [n.kind for n in _topological(loss._ag)]
        loss.backward()
        mesh.close()
        return sum(k in ("layer norm", "attention", "attention core", "mlp") for k in kinds)  # (lnf: "head")

    # 2 layer norms of 2 nodes (normalized times w plus b, gathered); Q, K and V's products 3, attention 1, the
    # projection 2 (reshape and product, its Reduce_scatter), bias + dropout + residual 1; fc1 1, GELU 1, fc2 2 (its
    # product, its Reduce_scatter), bias + dropout + residual 1. Separate: 31 (the layer norms 4 each, Q and V 3
    # each, K 2, the projection 3, the residuals 3 each, fc1 2).
    assert spmdsim.simulate(4, body) == [16] * 4


def test_the_gpt_compares_a_whole_activation_layout_once(monkeypatch):
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.layouts.layout import TensorLayout

    compared = []
    eq = TensorLayout.__eq__

    def counted(self, other):
        compared.append(1)
        return eq(self, other)

    monkeypatch.setattr(TensorLayout, "__eq__", counted)
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=16, batch=4)

    def body():
        mesh = Mesh(Layout((1, 1), ("dp", "tp")), spmdsim.world())
        try:
            model = GPT(cfg, mesh)  # without sp the activations between blocks are whole: one layout object
            assert model.act is model.full
            full = model.full
            alike = TensorLayout(full.layout, full.tensor_map, full.partial)  # equal, another object
            x = DTensor.zeros(mesh, alike, (cfg.seq, cfg.batch, cfg.d_model))
            del compared[:]
            assert all(model._gathered(x) is x for _ in range(3))
            return len(compared)
        finally:
            mesh.close()

    assert spmdsim.simulate(1, body) == [1]  # compared once, then found by the object


def test_a_resolved_row_parallel_output_laid_out_as_the_activations_records_no_move():
    # tp 1 (a pipeline's stages): the row-parallel products' outputs hold no pending sum and are laid out as the
    # activations already (an equal layout object, not the same), as is the embedding's lookup: no redistribute
    # node. (The lookup's identity move once made stage 0's SPMDSIM_CHECK call count equal stage 1's by chance;
    # the stages agree on their counts before the clip's Allreduce over pp now: tests/test_check_across_stages.py)
    from spmdsim.nn.autograd.checks import _topological
    from spmdsim.models.gpt import GPTConfig, batch, encode, load_text
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.layouts.layout import TensorLayout

    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=16, batch=4, dropout=0.1)

    def body():
        mesh = Mesh(Layout((2, 1), ("dp", "tp")), spmdsim.world())
        try:
            model = GPT(cfg, mesh)
            act = model.act
            alike = TensorLayout(act.layout, act.tensor_map, act.partial)  # equal, another object
            y = DTensor.zeros(mesh, alike, (cfg.seq, cfg.batch, cfg.d_model))
            assert all(model._row_out(y) is y for _ in range(2))
            x, t = batch(encode(load_text(5_000)), cfg, 0)
            xd, td = (DTensor.from_global(mesh, a, mesh.layout("dp", None)) for a in (x, t))
            loss = model.loss(xd, td, 0)
            names = [n.name if isinstance(n.name, str) else n.name() for n in _topological(loss._ag)]
            loss.backward()
            return sum(name.startswith("redistribute") for name in names)
        finally:
            mesh.close()

    assert spmdsim.simulate(2, body) == [0, 0]
