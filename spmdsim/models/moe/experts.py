"""The MoE layer's experts on what the dispatch brought: their products and gradients at float64 and under a
precision policy (spmdsim.models.moe.layer)."""
from __future__ import annotations

from typing import Any, Callable, Optional
import numpy as np
from ...references import forward as reference, backward as reference_grad
from ...references.activations import gelu_backward, gelu_from_tanh, gelu_tanh, sigmoid, silu_slope
from ...base.precision import is_low, product, rounded, wide
from ...runtime import executor
from .exchange import _Plan


def _present(b1: Any, b2: Any, w3: Any, b3: Any) -> tuple:
    """The experts' weights' names, in the order the layer takes and returns them: w1 (b1), w2 (b2), and a SwiGLU
    expert's w3 (b3); a bias the model does not have (None) left out."""
    key = (b1 is None, b2 is None, w3 is None, b3 is None)
    names = _NAMES.get(key)
    if names is None:
        given = dict(zip(("b1", "b2", "w3", "b3"), key))
        names = _NAMES[key] = tuple(n for n in ("w1", "b1", "w2", "b2", "w3", "b3")
                                    if n in ("w1", "w2") or not given[n])
    return names


_NAMES: dict = {}  # which of b1, b2, w3, b3 are None -> `_present`'s names (sixteen patterns at most)


def _batched(a: np.ndarray, El: int) -> np.ndarray:
    """A (rows, n) block of the capacity mode's equal shares as (El, rows / El, n): each local expert's slots."""
    return a.reshape(El, -1, a.shape[-1])


def _plus(y: np.ndarray, b: Optional[np.ndarray]) -> None:
    """y += b, b (El, n) added to each expert's (El, rows, n) or b (n,) to one expert's (rows, n); no bias: nothing."""
    if b is not None:
        y += b[:, None] if y.ndim == 3 else b


def _swiglu(hs: np.ndarray, us: np.ndarray, ts: np.ndarray, acts: np.ndarray) -> None:
    """SwiGLU's gate at float64: ts = sigmoid(hs) (kept for the backward), acts = silu(hs) * us = hs ts us."""
    ts[...] = sigmoid(hs)
    np.multiply(hs, ts, out=acts)
    acts *= us


def _swiglu_backward(hs: np.ndarray, us: np.ndarray, ts: np.ndarray, dacts: np.ndarray) -> tuple:
    """(d hs, d us) from d acts, acts = silu(hs) us: d us = dacts silu(hs), d hs = dacts us silu'(hs) with
    silu'(h) = s (1 + h (1 - s)), s = sigmoid(h) = ts."""
    du = dacts * hs * ts
    dh = dacts * us * silu_slope(hs, ts)
    return dh, du


def _run_experts(plan: _Plan, xe: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray], W1: np.ndarray,
                 B1: Optional[np.ndarray], W2: np.ndarray, B2: Optional[np.ndarray], W3: Optional[np.ndarray] = None,
                 B3: Optional[np.ndarray] = None, summed: bool = True, out: Optional[tuple] = None) -> tuple:
    """The local experts on their rows of `xe` (float64): (x @ w1 + b1, its GELU's tanh (kept for the backward),
    the GELU, the output summed over tp + b2), each as long as `xe` (into `out`'s arrays when given: a
    replay's). SwiGLU experts (`W3`): (x @ w1 + b1, its sigmoid, silu(x @ w1 + b1) * (x @ w3 + b3), the output,
    x @ w3 + b3). A bias None is not added. With a capacity every expert has the same rows: one batched product
    a weight (numpy's matmul makes each expert's the 2-d product would). `summed` False: the output is fc2's
    product alone, its sum over tp and b2 left to the caller (`moe_experts`: a capacity's Allreduce recorded as
    its own call, which a replay binds to its kept plan)."""
    move = plan.exchange(per_expert, got)
    El, D, H = W1.shape
    rows = xe.shape[0]
    swiglu = W3 is not None
    if out is None:
        out = (np.empty((rows, H)), np.empty((rows, H)), np.empty((rows, H)), np.empty((rows, D))) \
            + ((np.empty((rows, H)),) if swiglu else ())
    hs, ts, acts, ye = out[:4]
    us = out[4] if swiglu else None
    if not move.dropless:  # (the blocks as (El, rows / El, n): each local expert's slots)
        x3, h3 = xe.reshape(El, -1, D), hs.reshape(El, -1, H)
        np.matmul(x3, W1, out=h3)
        if B1 is not None:
            h3 += B1[:, None]
        if swiglu:
            u3 = us.reshape(El, -1, H)
            np.matmul(x3, W3, out=u3)
            if B3 is not None:
                u3 += B3[:, None]
            _swiglu(hs, us, ts, acts)
        else:  # (spmdsim.references.activations' GELU of a float64 block: the reference's)
            reference.gelu_from_tanh(hs, reference.gelu_tanh(hs, ts), acts)
        np.matmul(acts.reshape(El, -1, H), W2, out=ye.reshape(El, -1, D))
        if not summed:
            return out
    else:
        ye.fill(0.0)
        for e, (lo, hi) in enumerate(move.ranges):
            np.matmul(xe[lo:hi], W1[e], out=hs[lo:hi])
            _plus(hs[lo:hi], None if B1 is None else B1[e])
            if swiglu:
                np.matmul(xe[lo:hi], W3[e], out=us[lo:hi])
                _plus(us[lo:hi], None if B3 is None else B3[e])
                _swiglu(hs[lo:hi], us[lo:hi], ts[lo:hi], acts[lo:hi])
            else:
                gelu_from_tanh(hs[lo:hi], gelu_tanh(hs[lo:hi], ts[lo:hi]), acts[lo:hi])
            ye[lo:hi] = acts[lo:hi] @ W2[e]
    if plan.tp > 1:  # w2's rows are split over tp
        used = ye[:move.arrived]
        executor.run_block(plan.mesh, plan.sums, used, f"{plan.name} experts fc2", used)
    if B2 is not None:
        if not move.dropless:
            y3 = ye.reshape(El, -1, D)
            y3 += B2[:, None]
        else:
            for e, (lo, hi) in enumerate(move.ranges):
                ye[lo:hi] += B2[e]
    return out


def _grad_names(W3: Optional[np.ndarray], b1: bool, b2: bool, b3: bool) -> tuple:
    """`_present`'s names of the gradients a backward returns, from whether each bias is there (b3 only beside
    a SwiGLU expert's W3)."""
    return _present(b1 or None, b2 or None, W3, (b3 and W3 is not None) or None)


def _grad_outputs(W1: np.ndarray, W2: np.ndarray, names: tuple, xe: np.ndarray, main: Any, act: Any) -> tuple:
    """New arrays for `_experts_grad`'s results: the gradient of each weight in `names` (`_grad_names`), of
    dtype `main`, then d xe (of dtype `act`)."""
    El, D, H = W1.shape
    shapes = dict(w1=W1.shape, b1=(El, H), w2=W2.shape, b2=(El, D), w3=W1.shape, b3=(El, H))
    return tuple(np.zeros(shapes[n], main) for n in names) + (np.zeros(xe.shape, act),)


def _experts_grad(plan: _Plan, xe: np.ndarray, hs: np.ndarray, ts: np.ndarray, acts: np.ndarray, dye: np.ndarray,
                  per_expert: np.ndarray, got: Optional[np.ndarray], W1: np.ndarray, W2: np.ndarray,
                  W3: Optional[np.ndarray] = None, us: Optional[np.ndarray] = None, b1: bool = True,
                  b2: bool = True, b3: bool = True, out: Optional[tuple] = None) -> tuple:
    """`_run_experts`' backward from its output's gradient dye: each present weight's gradient (d w1, d b1, d w2,
    d b2, d w3, d b3: `_present`'s order, a bias only where `b1`, `b2`, `b3` say the model has it), then d xe,
    into `out`'s arrays when given; d xe is pending over tp (each rank's hidden columns' share). `ts`: the
    forward's tanh (SwiGLU: its sigmoid); `W3`, `us`: SwiGLU's second weight and its output."""
    move = plan.exchange(per_expert, got)
    El, D, H = W1.shape
    swiglu = W3 is not None
    if out is None:
        out = _grad_outputs(W1, W2, _grad_names(W3, b1, b2, b3), xe, W1.dtype, xe.dtype)
    if not move.dropless and not swiglu:  # batched, as the forward: GELU experts' straight through
        gw1, gb1, gw2, gb2 = out[0], out[1] if b1 else None, out[1 + b1], out[2 + b1] if b2 else None
        x3, h3, t3, a3, g3 = (xe.reshape(El, -1, D), hs.reshape(El, -1, H), ts.reshape(El, -1, H),
                              acts.reshape(El, -1, H), dye.reshape(El, -1, D))
        if b2:
            gb2[...] = g3.sum(axis=1)
        gw2[...] = a3.transpose(0, 2, 1) @ g3
        dacts = g3 @ W2.transpose(0, 2, 1)
        dh = reference_grad.gelu_grad(h3, t3)  # (spmdsim.references.activations.gelu_backward of float64 blocks)
        dh *= dacts
        gw1[...] = x3.transpose(0, 2, 1) @ dh
        if b1:
            gb1[...] = dh.sum(axis=1)
        out[-1].reshape(El, -1, D)[...] = dh @ W1.transpose(0, 2, 1)
        return out
    g_ = dict(zip(_grad_names(W3, b1, b2, b3), out))
    dxe = out[-1]

    def backward(x: np.ndarray, h: np.ndarray, t: np.ndarray, a: np.ndarray, u: Optional[np.ndarray],
                 g: np.ndarray, e: Any, sum_axis: int) -> np.ndarray:
        """One expert's (or, batched, every expert's) gradients into g_[...][e]; its rows' d xe returned."""
        T = (0, 2, 1) if g.ndim == 3 else (1, 0)
        if "b2" in g_:
            g_["b2"][e] = g.sum(axis=sum_axis)
        g_["w2"][e] = a.transpose(T) @ g
        dacts = g @ W2[e].transpose(T)
        if swiglu:
            dh, du = _swiglu_backward(h, u, t, dacts)
            g_["w3"][e] = x.transpose(T) @ du
            if "b3" in g_:
                g_["b3"][e] = du.sum(axis=sum_axis)
        else:
            dh = gelu_backward(h, dacts, t)
        g_["w1"][e] = x.transpose(T) @ dh
        if "b1" in g_:
            g_["b1"][e] = dh.sum(axis=sum_axis)
        dx = dh @ W1[e].transpose(T)
        if swiglu:
            dx += du @ W3[e].transpose(T)
        return dx

    if not move.dropless:  # batched, as the forward
        dxe.reshape(El, -1, D)[...] = backward(
            _batched(xe, El), _batched(hs, El), _batched(ts, El), _batched(acts, El),
            None if us is None else _batched(us, El), _batched(dye, El), slice(None), 1)
        return out
    for a in out:  # an expert no row reached has zero gradients
        a.fill(0.0)
    for e, (lo, hi) in enumerate(move.ranges):
        dxe[lo:hi] = backward(xe[lo:hi], hs[lo:hi], ts[lo:hi], acts[lo:hi], None if us is None else us[lo:hi],
                              dye[lo:hi], e, 0)
    return out


def _linear_mixed(a: np.ndarray, w: np.ndarray, b: Optional[np.ndarray], act: np.dtype, out: np.ndarray,
                  summed: Optional[Callable] = None) -> None:
    """a @ w + b into `out` as the ranks' Linear computes it under a policy: the product float32 BLAS on the
    widened blocks (`summed` sums it over tp first, in float32), rounded once to `act`, then its bias added
    in float32 and rounded again (no bias: the one rounding). Batched over experts when `a` is (El, rows, in)
    and `b` (El, out)."""
    p = product(a, w)
    if summed is not None:
        summed(p)
    if b is None:
        out[...] = rounded(p, act)
        return
    bias = wide(b)[:, None] if b.ndim == 2 and p.ndim == 3 else wide(b)
    out[...] = rounded(wide(rounded(p, act)) + bias, act)


def _grad_rounded(g: np.ndarray, act: np.dtype) -> np.ndarray:
    """A float32 gradient rounded once to `act` where its activation's rule reads it, widened again."""
    return wide(rounded(g, act))


def _swiglu_mixed(hs: np.ndarray, us: np.ndarray, ts: np.ndarray, acts: np.ndarray) -> None:
    """SwiGLU's gate under a policy, as the ranks' silu and product compute low-precision blocks: the sigmoid of
    the widened hs in float32 (kept, as GELU's tanh is), silu(hs) rounded once, times us in float32, rounded
    once."""
    act = acts.dtype
    ts[...] = sigmoid(wide(hs))
    acts[...] = rounded(wide(_silu_rounded(hs, ts)) * wide(us), act)


def _silu_rounded(hs: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """silu(hs) = hs sigmoid(hs) from the kept float32 sigmoid, rounded once to hs's dtype (the forward's)."""
    return rounded(wide(hs) * ts, hs.dtype)


def _swiglu_backward_mixed(hs: np.ndarray, us: np.ndarray, ts: np.ndarray, dacts: np.ndarray) -> tuple:
    """(d hs, d us), float32, each rounded once to the activations' dtype before the rule that reads it: d us =
    dacts silu(hs) (the rounded silu the product read), d silu = dacts us, d hs = d silu silu'(hs)."""
    act = hs.dtype
    du = _grad_rounded(dacts * wide(_silu_rounded(hs, ts)), act)
    dsilu = _grad_rounded(dacts * wide(us), act)
    dh = _grad_rounded(dsilu * silu_slope(wide(hs), ts), act)
    return dh, du


def _run_experts_mixed(plan: _Plan, xe: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
                       W1: np.ndarray, B1: Optional[np.ndarray], W2: np.ndarray, B2: Optional[np.ndarray],
                       W3: Optional[np.ndarray] = None, B3: Optional[np.ndarray] = None,
                       out: Optional[tuple] = None) -> tuple:
    """`_run_experts` under a precision policy (spmdsim.base.precision; `xe` in the activations' dtype): each product
    and bias as `_linear_mixed`, GELU as spmdsim.references.activations computes a low-precision block (its tanh kept in
    float32, the result rounded once), SwiGLU's gate as `_swiglu_mixed`; fc2's product, its rows split over
    tp, summed by its Allreduce in float32 before its rounding."""
    move = plan.exchange(per_expert, got)
    El, D, H = W1.shape
    rows, act = xe.shape[0], xe.dtype
    swiglu = W3 is not None
    if out is None:
        out = (np.empty((rows, H), act), np.empty((rows, H), np.float32), np.empty((rows, H), act),
               np.zeros((rows, D), act)) + ((np.empty((rows, H), act),) if swiglu else ())
    hs, ts, acts, ye = out[:4]
    us = out[4] if swiglu else None
    summed = None
    if plan.tp > 1:
        def summed(p: np.ndarray) -> None:
            used = p.reshape(-1, D)[:move.arrived]
            executor.run_block(plan.mesh, plan.sums, used, f"{plan.name} experts fc2", used)
    if not move.dropless:
        _linear_mixed(_batched(xe, El), W1, B1, act, _batched(hs, El))
        if swiglu:
            _linear_mixed(_batched(xe, El), W3, B3, act, _batched(us, El))
            _swiglu_mixed(hs, us, ts, acts)
        else:
            gelu_from_tanh(hs, gelu_tanh(hs, ts), acts)
        _linear_mixed(_batched(acts, El), W2, B2, act, _batched(ye, El), summed)
        return out
    ye.fill(0)
    fc2 = np.zeros((rows, D), np.float32)
    for e, (lo, hi) in enumerate(move.ranges):
        _linear_mixed(xe[lo:hi], W1[e], None if B1 is None else B1[e], act, hs[lo:hi])
        if swiglu:
            _linear_mixed(xe[lo:hi], W3[e], None if B3 is None else B3[e], act, us[lo:hi])
            _swiglu_mixed(hs[lo:hi], us[lo:hi], ts[lo:hi], acts[lo:hi])
        else:
            gelu_from_tanh(hs[lo:hi], gelu_tanh(hs[lo:hi], ts[lo:hi]), acts[lo:hi])
        fc2[lo:hi] = product(acts[lo:hi], W2[e])
    if summed is not None:
        summed(fc2)
    for e, (lo, hi) in enumerate(move.ranges):
        ye[lo:hi] = rounded(fc2[lo:hi], act) if B2 is None else rounded(wide(rounded(fc2[lo:hi], act))
                                                                          + wide(B2[e]), act)
    return out


def _experts_grad_mixed(plan: _Plan, xe: np.ndarray, hs: np.ndarray, ts: np.ndarray, acts: np.ndarray,
                        dye: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray], W1: np.ndarray,
                        W2: np.ndarray, W3: Optional[np.ndarray] = None, us: Optional[np.ndarray] = None,
                        b1: bool = True, b2: bool = True, b3: bool = True, out: Optional[tuple] = None) -> tuple:
    """`_experts_grad` under a precision policy: the weights' and biases' gradients float32 (Megatron's
    main_grad) for bfloat16 weights; each activation's gradient (GELU's or SwiGLU's output, fc1's (and fc3's)
    output) rounded once to the activations' dtype before the rule that reads it; d xe summed over tp in
    float32 (an Allreduce here, so that the combine's way back carries whole rows in the activations' dtype)
    and rounded once."""
    move = plan.exchange(per_expert, got)
    El, D, _ = W1.shape
    act = xe.dtype
    swiglu = W3 is not None
    main = np.dtype(np.float32) if is_low(W1.dtype) else W1.dtype
    names = _grad_names(W3, b1, b2, b3)
    if out is None:
        out = _grad_outputs(W1, W2, names, xe, main, act)
    g_ = dict(zip(names, out))
    dxe = out[-1]
    dx = np.zeros(xe.shape, np.float32)

    def backward(x: np.ndarray, h: np.ndarray, t: np.ndarray, a: np.ndarray, u: Optional[np.ndarray],
                 dy: np.ndarray, e: Any, sum_axis: int) -> np.ndarray:
        T = (0, 2, 1) if dy.ndim == 3 else (1, 0)
        g = wide(dy)
        if "b2" in g_:
            g_["b2"][e] = g.sum(axis=sum_axis)
        g_["w2"][e] = product(a.transpose(T), g)
        dacts = _grad_rounded(product(g, W2[e].transpose(T)), act)
        if swiglu:
            dh, du = _swiglu_backward_mixed(h, u, t, dacts)
            g_["w3"][e] = product(x.transpose(T), du)
            if "b3" in g_:
                g_["b3"][e] = du.sum(axis=sum_axis)
        else:
            dh = _grad_rounded(gelu_backward(h, dacts, t), act)
        g_["w1"][e] = product(x.transpose(T), dh)
        if "b1" in g_:
            g_["b1"][e] = dh.sum(axis=sum_axis)
        d = product(dh, W1[e].transpose(T))
        if swiglu:
            d += product(du, W3[e].transpose(T))
        return d

    if not move.dropless:  # batched, as the forward
        dx.reshape(El, -1, D)[...] = backward(
            _batched(xe, El), _batched(hs, El), _batched(ts, El), _batched(acts, El),
            None if us is None else _batched(us, El), _batched(dye, El), slice(None), 1)
    else:
        for a in out:  # an expert no row reached has zero gradients
            a.fill(0)
        for e, (lo, hi) in enumerate(move.ranges):
            dx[lo:hi] = backward(xe[lo:hi], hs[lo:hi], ts[lo:hi], acts[lo:hi], None if us is None else us[lo:hi],
                                 dye[lo:hi], e, 0)
    if plan.tp > 1:  # each tp rank's hidden columns' share, summed
        used = dx[:move.arrived]
        executor.run_block(plan.mesh, plan.sums, used, f"{plan.name} experts fc1 backward", used)
    dxe[...] = rounded(dx, act)
    return out
