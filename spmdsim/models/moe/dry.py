"""The MoE layer in a dry run (shapes, no values): its routing by rule, its exchanges on zeros, and the
experts' products counted, not made (spmdsim.models.moe.layer)."""
from __future__ import annotations

from typing import Any, Optional
import numpy as np
from ...nn.autograd.graph import record, with_partial
from ...base.flops import any_open, gemm, sweep
from ...base.precision import is_low
from ...runtime.collectives import allreduce
from ...runtime.dtensor import DTensor
from ...runtime.sim.dry import zeros
from .config import MoEConfig
from .routing import dispatch_rows, planned
from .fold import fold_of
from .exchange import _Exchange
from .stats import _stats


def _dry_experts(x: Any, probs: Any, weights: tuple, names: tuple, moe: MoEConfig, name: str,
                 stats: Optional[list]) -> tuple[Any, np.ndarray]:
    """`moe_experts` in a dry run: the routing by rule (moe.dry_routing), the exchanges of both ways on zeros
    of their true sizes (traced, their buffers metered), no product made; the backward's exchanges alike.
    `weights`: the experts' DTensors, named by `names` (`_present`)."""
    mesh = x.mesh
    T, bl, D = x.local.shape
    fold = fold_of(mesh.layout, moe.etp)
    ep, tp = fold.ep, fold.etp
    routing = planned(bl, T, moe.experts, moe.top_k, moe.capacity(T), moe.dry_routing, probs.local.dtype)
    rows, nrows, per_expert = dispatch_rows(routing, moe.dropless, ep)
    move = _Exchange(mesh, moe, routing.capacity, bl, moe.experts // ep, per_expert, f"{name} dispatch",
                     f"{name} combine")
    act = x.local.dtype
    mixed = act != np.float64  # a policy's: fc2's sum over tp in float32, the exchanges in the activations' dtype
    local = dict(zip(names, (w.local for w in weights)))
    W1 = local["w1"]
    swiglu = "w3" in local
    xe = move.dispatch(zeros((nrows, D), act))
    # what a real step's experts keep for the backward, sized (`_run_experts`: fc1's output, GELU's tanh and
    # output; SwiGLU's sigmoid, gate and fc3's output), and its fc2's output ye in the activations' dtype: at
    # fp64 fc2's product itself, summed over tp in place; under a policy the product is float32, summed over tp
    # in place, and ye a block of its own that the product is rounded into (`_run_experts_mixed`). The combine
    # is given ye, as the real step's is: at ep 1 it may return ye itself, which the layer then keeps for its
    # backward.
    H = W1.shape[2]
    hs, ts, acts = zeros((xe.shape[0], H), act), zeros((xe.shape[0], H), np.float32 if mixed else act), \
        zeros((xe.shape[0], H), act)
    us = zeros((xe.shape[0], H), act) if swiglu else None
    fc2 = zeros(xe.shape, np.float32 if mixed else act)
    if tp > 1:
        allreduce(mesh, fc2, fold.etp_axes, f"{name} experts fc2", out=fc2)
    ye = zeros(xe.shape, act) if mixed else fc2
    back = move.combine(ye)
    out = DTensor(mesh, zeros(x.local.shape, act), x.layout, x.global_shape)
    if any_open():
        _count_experts(move, x.local.shape, nrows, W1.shape, act, mixed, names=names,
                       blocks=dict(x=x.local, xe=xe, hs=hs, ts=ts, acts=acts, ye=ye, back=back, out=out.local,
                                   us=us, **local))
    if stats is not None:
        stats.append(_stats(mesh, name, routing, move, rows[routing.kept], D * x.local.itemsize))
    counts = routing.counts.sum(axis=0).astype(np.float64)
    tensors = (x, probs) + tuple(weights)
    if all(t._ag is None for t in tensors):
        return out, counts

    # what the real step's backward holds (its closure's arrays, spmdsim.nn.autograd.kept_bytes), of their sizes:
    # not the weights' blocks, which it reads when it runs
    w1_shape = W1.shape
    kept = (routing.experts, routing.gates, routing.slots, routing.counts, rows, per_expert, xe, hs, ts, acts, back,
            us, zeros(per_expert.shape, np.int64) if moe.dropless and ep > 1 else None)  # (dropless: the counts got)

    def backward(dy: Any) -> tuple:
        held = kept  # noqa: F841 (the closure holds them until the backward runs, as the real one does)
        dye = move.dispatch(zeros((nrows, D), act), f"{name} combine backward")
        if mixed and tp > 1:  # d xe summed over tp before its way back (`_experts_grad_mixed`)
            allreduce(mesh, zeros(dye.shape, np.float32), fold.etp_axes, f"{name} experts fc1 backward")
        move.combine(zeros(dye.shape, dye.dtype), f"{name} dispatch backward")
        dx = zeros(x.local.shape, np.float32 if mixed else act)
        grads = tuple(zeros(w.local.shape, np.float32 if is_low(w.local.dtype) else w.local.dtype) for w in weights)
        if any_open():  # counted with the blocks the rank holds: the weights, their gradients, the kept blocks
            now = dict(zip(names, (w.local for w in weights)))  # read now (ZeRO-3: gathered again), not kept
            _count_experts(move, x.local.shape, nrows, w1_shape, act, mixed, backward=True, names=names,
                           blocks=dict(zip(("g" + n for n in names), grads), dy=dy.local, back=back, dye=dye,
                                       dx=dx, xe=xe, hs=hs, ts=ts, acts=acts, us=us, w1=now["w1"], w2=now["w2"],
                                       w3=now.get("w3")))
        over_tp = fold.etp_axes if tp > 1 and not mixed else ()
        over_dp = fold.edp_axes if fold.edp > 1 else ()
        return ((_grad(x, dx, over_tp), _grad(probs, zeros(probs.local.shape, probs.local.dtype), ()))
                + tuple(_grad(w, g, over_dp) for w, g in zip(weights, grads)))

    record(out, f"moe experts {name}", tensors, backward, with_partial(x.layout, ()))
    return out, counts


def _count_experts(move: "_Exchange", x_shape: tuple, nrows: int, w1_shape: tuple, act: Any, mixed: bool,
                   backward: bool = False, blocks: Optional[dict] = None,
                   names: tuple = ("w1", "b1", "w2", "b2")) -> None:
    """Count one layer's expert kernels on this rank in spmdsim.base.flops's open counters, as `_run_experts` (or,
    `backward`, `_combine_grad` and `_experts_grad`) run them: with a capacity one product a weight batched
    over the local experts, dropless one 2-d product per expert and weight, on the rows each expert got; the
    bias adds, GELU (SwiGLU's gate) and its backward, the biases' sums, the packing of the send buffer, the
    combine's unpermutation and, in the backward, their conjugates (`_permute` ... `_permute_backward`). A
    real step and a dry run count the same (the dry run routes by rule).
    `names`: the experts' weights (`_present`): a bias not there is neither added nor summed, and "w3" makes
    them SwiGLU experts (fc3's product beside fc1's, the gate in place of GELU, and their backward).

    `blocks`: the layer's arrays by name ("x", "xe", "hs", "ts", "acts", "ye", "back", "out", "us" (SwiGLU's
    fc3 output), the weights by their names; in the backward also "dy", "dye", "dx" and the weights'
    gradients "gw1", "gb1" ...), each counted at the shape and dtype counted without it but as that array's
    block (a (shape, dtype, array) triple, spmdsim.base.flops.sweep): the counters that record blocks tell the
    parameters, their gradients and what the layer keeps for its backward (held by the rank anyway) from the
    moment's own blocks. A name not given (the send buffers, the gradients' intermediates) is a block held
    by nothing."""
    El, D, H = w1_shape
    dtype = np.float32 if mixed else act  # the products' result (spmdsim.base.precision.product)
    if move.dropless:
        groups = [((), hi - lo) for lo, hi in move.ranges]
    else:
        groups = [((El,), move.arrived // El if El else 0)]
    given = blocks or {}
    swiglu = "w3" in names

    def b(name: str, pair: tuple) -> tuple:
        a = given.get(name)
        return pair if a is None else pair + (a,)

    tokens, rows = (x_shape, act), ((nrows, D), act)
    (_unpermute_backward if backward else _permute)(b, tokens, rows)
    for lead, n in groups:
        xs, hs, ys = (lead + (n, D), act), (lead + (n, H), act), (lead + (n, D), act)
        w1, w2, w3 = b("w1", (lead + (D, H), act)), b("w2", (lead + (H, D), act)), b("w3", (lead + (D, H), act))
        if not backward:
            gemm(xs[0], lead + (D, H), dtype, (b("xe", xs), w1, b("hs", hs)))
            if "b1" in names:
                sweep("moe bias", (b("hs", hs), b("b1", (lead + (H,), act))), (b("hs", hs),))
            if swiglu:
                gemm(xs[0], lead + (D, H), dtype, (b("xe", xs), w3, b("us", hs)))
                if "b3" in names:
                    sweep("moe bias", (b("us", hs), b("b3", (lead + (H,), act))), (b("us", hs),))
                sweep("swiglu", (b("hs", hs), b("us", hs)), (b("ts", hs), b("acts", hs)))
            else:
                sweep("gelu", (b("hs", hs),), (b("ts", hs), b("acts", hs)))
            gemm(hs[0], lead + (H, D), dtype, (b("acts", hs), w2, b("ye", ys)))
            if "b2" in names:
                sweep("moe bias", (b("ye", ys), b("b2", (lead + (D,), act))), (b("ye", ys),))
        else:
            gemm(lead + (H, n), ys[0], dtype, (b("acts", hs), b("dye", ys), b("gw2", w2[:2])))  # d w2
            gemm(ys[0], lead + (D, H), dtype, (b("dye", ys), w2, hs))  # d acts
            if "b2" in names:
                sweep("sum", (b("dye", ys),), (b("gb2", (lead + (D,), act)),))  # d b2
            if swiglu:  # d hs and d us from d acts, the kept hs, us and sigmoid
                sweep("swiglu backward", (b("hs", hs), b("us", hs), hs, b("ts", hs)), (hs, hs))
                gemm(lead + (D, n), hs[0], dtype, (b("xe", xs), hs, b("gw3", w3[:2])))  # d w3
                if "b3" in names:
                    sweep("sum", (hs,), (b("gb3", (lead + (H,), act)),))  # d b3
            else:
                sweep("gelu backward", (b("hs", hs), hs, b("ts", hs)), (hs,))
            gemm(lead + (D, n), hs[0], dtype, (b("xe", xs), hs, b("gw1", w1[:2])))  # d w1
            if "b1" in names:
                sweep("sum", (hs,), (b("gb1", (lead + (H,), act)),))  # d b1
            gemm(hs[0], lead + (H, D), dtype, (hs, w1, xs))  # d xe
            if swiglu:
                gemm(hs[0], lead + (H, D), dtype, (hs, w3, xs))  # d xe's fc3 part, added
    (_permute_backward if backward else _unpermute)(b, tokens, rows)


# The tokens' permutations as Megatron-Core's unfused ones run them (megatron/core/transformer/moe/moe_utils.py at
# core_v0.9.0, the alltoall dispatcher's: `permute`, a gather (`moe_gather`); `unpermute`, a scatter-add into a
# zeroed buffer (`moe_scatter`), the product by the gates, the sum of each token's rows; and their autograd
# backward), each kernel on `tokens` (the layer's (T, bl, D) pair) and `rows` (the send buffer's (rows, D)), a
# name's block by `b` (`_count_experts`).

def _permute(b: Any, tokens: tuple, rows: tuple) -> None:
    sweep("moe pack", (b("x", tokens),), (rows,))


def _unpermute(b: Any, tokens: tuple, rows: tuple) -> None:
    sweep("moe unpermute zero", (), (rows,))
    sweep("moe unpermute", (b("back", rows), rows), (rows,))
    sweep("moe unpermute gates", (rows,), (rows,))
    sweep("moe unpack", (rows,), (b("out", tokens),))


def _unpermute_backward(b: Any, tokens: tuple, rows: tuple) -> None:
    """d rows = dy x gates; d gates = the sum over D of dy x the rows (one a row); the scatter's backward, a
    gather."""
    sweep("moe combine backward", (b("dy", tokens),), (rows,))
    sweep("moe gates backward", (b("dy", tokens), b("back", rows)), (rows,))
    sweep("sum", (rows,), ((rows[0][:1], rows[1]),))
    sweep("moe unpermute backward", (rows,), (rows,))


def _permute_backward(b: Any, tokens: tuple, rows: tuple) -> None:
    """The gather's backward: a zeroed (T, bl, D) the rows' gradients are scatter-added into."""
    sweep("moe permute backward", (), (b("dx", tokens),))
    sweep("moe unpack", (rows, b("dx", tokens)), (b("dx", tokens),))


def _grad(like: Any, local: np.ndarray, pending: tuple) -> Any:
    if like._ag is None:
        return None
    return _tensor(like, local, with_partial(like._layout, pending))


def _tensor(like: Any, local: np.ndarray, layout: Any) -> Any:
    """A DTensor of `like`'s mesh and global shape, block `local`, in `layout` (`like`'s tensor map): built
    without DTensor()'s checks where the block is C-ordered, of `like`'s block's shape and a float dtype (the
    layer's own arrays, always), else by DTensor() (which names what is wrong)."""
    if type(local) is np.ndarray and local.shape == like._local.shape and local.dtype in _FLOATS \
            and local.flags.c_contiguous:
        return type(like)._trusted(like._mesh, local, layout, like._shape)
    return type(like)(like.mesh, local, layout, like.global_shape)


_FLOATS = frozenset(np.dtype(t) for t in (np.float32, np.float64))
