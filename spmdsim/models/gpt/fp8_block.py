"""The GPT's block under an FP8 policy (spmdsim.base.precision "fp8", "fp8-current"): the graph's block
(spmdsim.models.gpt.parallel_block) with its four linear layers' products in FP8 (spmdsim.nn.ops.fp8_linear): Q, K
and V (one cast of their input, gathered along the sequence in e4m3 with sequence parallelism), the attention's
output projection, fc1 (with SwiGLU fc1 and its second weight) and fc2. The attention core, the embedding and
the head compute in bfloat16 as under bf16-mixed (TransformerEngine's Linear and LayerNormLinear are the
layers that take FP8 inputs). After each step the casts' amaxes are agreed over the mesh (`settle`). Under
Megatron's kept set the block of fused pieces (parallel_block._megatron_block) takes its linear layers from
`column` and `row`: the same FP8 products, whose nodes keep the e4m3 pieces of their inputs where Megatron's
pieces keep the inputs in bfloat16 (TransformerEngine's Linear saves its FP8 input for the weight's gradient).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...base.precision import precision as get_precision, precision_problem
from ...nn import ops
from ...nn.ops.fp8_linear import fp8_column, fp8_row
from ...nn.ops import megatron
from ...nn.ops.megatron import _row_product_layout
from ...runtime.executor import pending, resolve
from ..moe.tokens import takes

__all__ = ["fp8_block", "settle", "fp8_problem", "policy_problem", "column", "row"]


def fp8_problem(name: str, replay: bool = False) -> Optional[str]:
    """Why a run under the FP8 policy `name` cannot be made with `replay` (one line), or None (either kept set runs):
    its scales are made in Python each step (delayed: from the amax histories after the step; current: from each
    tensor before its cast), which a replay of step 0 would not make again."""
    if replay:
        return f"precision {name} makes its FP8 scales in Python each step, which a replay would not: run it " \
               "without --replay"
    return None


def policy_problem(name: str, replay: bool = False) -> Optional[str]:
    """Why the precision policy `name` cannot run with `replay` (one line), or None (either kept set runs): a name
    that is no policy (spmdsim.base.precision), or an FP8 policy's options (`fp8_problem`). Pure: the examples call
    it before they print a line, as their other options' refusals."""
    problem = precision_problem(name)
    if problem or get_precision(name).fp8 is None:
        return problem
    return fp8_problem(get_precision(name).name, replay)


def column(model: Any, x: Any, pairs: list, site: str, names: list) -> Any:
    """Megatron's column-parallel linear layer of `pairs` on x (spmdsim.nn.ops.megatron), with FP8 products under
    an FP8 policy (`site` names x's scale, `names` the weights')."""
    if model.fp8 is None:
        return megatron.column_parallel_linear(x, pairs, model.full)
    return fp8_column(x, pairs, model.full, model.fp8, site, names)


def row(model: Any, x: Any, w: Any, name: str) -> Any:
    """Megatron's row-parallel linear layer x @ w (its bias added after), with FP8 products under an FP8 policy."""
    if model.fp8 is None:
        return megatron.row_parallel_linear(x, w, model.act)
    return fp8_row(x, w, model.act, model.fp8, name, _row_product_layout(x._layout))


def fp8_block(model: Any, h: Any, n: Any, step: Optional[int], train: bool, micro: Optional[int],
              scale: float = 1.0) -> Any:
    """`_block` (the graph's) of the layer whose names and sizes are `n` (parallel_block._Layer), its linear
    layers' products in FP8."""
    p, cfg, pre = model.use, model.cfg, n.attn[:-len("attn")]
    T, B = h.global_shape[:2]
    with n.norm:
        a = model._normed(h, n.ln1w, n.ln1b)
    with n.attention:
        if n.kv == cfg.heads:
            qkv = column(model, a, [(p[n.wq], p.get(n.bq)), (p[n.wk], None), (p[n.wv], p.get(n.bv))],
                           n.attn, [n.wq, n.wk, n.wv])
            qkv = ops.reshape(qkv, (3, T, B, cfg.heads, n.head_dim))
            q, k, v = qkv[0], qkv[1], qkv[2]
        else:  # grouped-query attention: Q, and K and V of fewer heads (one cast of x each)
            q = ops.reshape(column(model, a, [(p[n.wq], p.get(n.bq))], n.attn, [n.wq]),
                            (T, B, cfg.heads, n.head_dim))
            kv = ops.reshape(column(model, a, [(p[n.wk], None), (p[n.wv], p.get(n.bv))], n.attn, [n.wk, n.wv]),
                             (2, T, B, n.kv, n.head_dim))
            k, v = kv[0], kv[1]
    o = model._attend(n, q, k, v, step, train, micro)
    with n.attention:
        o = ops.reshape(o, (T, B, cfg.d_model))
        proj = row(model, o, p[n.wo], n.wo)
        h = model._residual(h, proj, n.bo, n.resid1, step, train, micro)
    with n.norm:
        m = model._normed(h, n.ln2w, n.ln2b)
    if n.moe:  # the MoE layer's experts multiply in bfloat16
        m = m if takes(m, model.cfg.moe) else model._gathered(m)  # (folded dropless experts take sp's tokens)
        return model._moe_mlp(h, m, int(pre[1:-1]), step, train, micro, scale)
    with n.mlp:
        if n.swiglu:  # silu(m w1 + b1) * (m w3 + b3): one cast of m for both
            z = column(model, m, [(p[n.w1], p.get(n.b1)), (p[n.w3], p.get(n.b3))], pre + "mlp", [n.w1, n.w3])
            act = ops.silu(z[0]) * z[1]
        else:
            act = ops.gelu(column(model, m, [(p[n.w1], p.get(n.b1))], pre + "mlp", [n.w1]))
        out = row(model, act, p[n.w2], n.w2)
        return model._residual(h, out, n.b2, n.resid2, step, train, micro)


def settle(model: Any) -> None:
    """The step's end: the weights' e4m3 copies let go (the update changes the weights); under delayed scaling this
    rank's amaxes of the step's casts agreed by one Allreduce(MAX) over the mesh, the scales made from the histories
    (spmdsim.base.fp8.Scales.settle). Nothing without FP8."""
    scales = model.fp8
    if scales is not None:
        scales.weights.clear()
    if scales is None or scales.recipe.scaling != "delayed" or not scales.keys:
        return
    mesh = model.mesh
    axes = tuple(a for a in mesh.layout.alias_name if mesh.layout.axis_size(a) > 1)
    seen = np.array(scales.seen, np.float32)
    agreed = resolve(mesh, seen, pending(mesh.layout, 1, axes), "fp8 amax", reduction="max", owned=True) \
        if axes else seen
    scales.settle(np.asarray(agreed, np.float32))
