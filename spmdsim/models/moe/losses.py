"""An MoE layer's router losses as one operator and one node (spmdsim.models.moe.layer): the general operators' chain

    aux = ops.sum(ops.mean(probs, (0, 1)) * f) * float(E)                   (load balancing, E sum_e f_e P_e)
    lse = ops.log(ops.sum(ops.exp(logits - top), -1, keepdims=True)) + top  (top: each row's max, no gradient)
    z = ops.mean(lse * lse)                                                  (the z-loss)
    aux * aux_loss_coeff + z * z_loss_coeff

is fourteen nodes, each costing Python on every step (an operator's dispatch, its DTensor, its node and rule,
the backward walk's bookkeeping) for blocks of a few numbers a token. `router_losses` computes what the chain
computes, with the same numpy calls in the same order (the same bits, forward and backward), keeps for backward
every block the chain's nodes kept (spmdsim.nn.autograd.kept_bytes measures the same bytes), and its rule runs the
chain's rules in the walk's order (latest node first), counting their kernels as they do (spmdsim.base.flops) when a
counter is open.

Its first call for a call signature (the layout objects of the probabilities, the logits and f, their shapes and
dtype), a dry run (spmdsim.runtime.sim.dry) and a call under an open counter run the chain itself (its nodes, as
before); the first call's result gives the layout of the losses (pending over the batch's axes, as the means
leave it). The chain moves nothing: the layer's probabilities and logits are laid out as its tokens
(spmdsim.models.moe.layer.input_problem), f is whole, and every reduction leaves a pending sum.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...base import flops as _flops
from ...nn import ops
from ...nn.autograd.graph import attach, with_partial
from ...nn.autograd.rules.grads import grad_tensor
from ...base.buffers import CAPTURE, broadcast_zero
from ...base.flops import sweep
from ...runtime.dtensor import DTensor
from ...base.tables import put

__all__ = ["router_losses"]


def _row_max(block: np.ndarray) -> np.ndarray:
    return block.max(axis=-1, keepdims=True)


def _chain(logits: Any, probs: Any, f: Any, aux_coeff: float, z_coeff: float) -> Any:
    """The general operators' chain (the module's docstring): a first call's, a dry run's, a counted one's."""
    T, B, E = probs.global_shape
    mesh = logits.mesh
    aux = ops.sum(ops.mean(probs, (0, 1)) * f) * float(E)
    # The shift is a constant (no gradient through it); a dry run's: the engine's zeros, the logits' pages not read.
    top = DTensor(mesh, mesh.engine.local(_row_max, broadcast_zero(logits.local.shape[:-1] + (1,), logits.local.dtype),
                                          logits.local), logits.layout, (T, B, 1))
    lse = ops.log(ops.sum(ops.exp(logits - top), -1, keepdims=True)) + top
    z = ops.mean(lse * lse)
    return aux * aux_coeff + z * z_coeff


#: (id(probs' layout), id(logits'), id(f's), the shapes, the dtype) -> (those three layout objects, the losses'
#: layout, its gradient's layout): by the layout objects (the entry holds them, so their ids are not reused).
_CALLS: dict = {}
_SUM = np.add.reduce  # np.sum's kernel on an array, without its Python wrapper (the same call)
_FLOATS = frozenset(np.dtype(t) for t in (np.float32, np.float64))


def router_losses(logits: Any, probs: Any, f: Any, aux_coeff: float, z_coeff: float, name: str = "moe") -> Any:
    """``aux * aux_coeff + z * z_coeff`` (the module's docstring): a 0-d DTensor pending over the batch's axes.

    `logits`, `probs` (T, B, E): the router's, laid out as the layer's tokens; `f` (E,): each expert's share of
    the assignments, whole (no gradient); `name`: the layer's ("h1"), for the node's."""
    P, L = probs._layout, logits._layout
    key = (id(P), id(L), id(f._layout), probs._shape, logits._shape, probs._local.dtype)
    seen = _CALLS.get(key)
    mesh = probs._mesh
    if (seen is None or seen[0] is not P or seen[1] is not L or seen[2] is not f._layout or mesh.engine.dry
            or _flops._OPEN or type(aux_coeff) is not float or type(z_coeff) is not float
            or aux_coeff - aux_coeff != 0 or z_coeff - z_coeff != 0):  # (a number not finite: the chain's moves)
        return _by_chain(logits, probs, f, aux_coeff, z_coeff, key if seen is None else None)
    _, _, _, layout, want = seen
    # a captured step's traced views (spmdsim.runtime.replay), else the blocks themselves
    p, lg, fb = (probs._local, logits._local, f._local) if not CAPTURE.on else (probs.local, logits.local, f.local)
    T, B, E = probs._shape
    dtype = p.dtype
    count = T * B  # the entries each mean sums (the z-loss's: T B 1)
    # The chain's forward kernels (spmdsim.nn.ops.reduce, spmdsim.nn.ops.pointwise), in its order; a 0-d result as the
    # 0-d array its DTensor held; its Python numbers as the 0-d arrays `ops.scalars.lift` made of them.
    m = np.asanyarray(_SUM(p, axis=(0, 1), keepdims=False)) / np.asarray(count, dtype)
    pm = m * fb
    s = np.asanyarray(_SUM(pm, axis=(0,), keepdims=False))
    e_n = np.asarray(float(E), dtype)
    aux = np.asanyarray(s * e_n)
    top = _row_max(lg)
    shifted = lg - top
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # as ops.exp and ops.log run
        ex = np.exp(shifted)
        sums = np.asanyarray(_SUM(ex, axis=(2,), keepdims=True))
        logs = np.log(sums)
    lse = logs + top
    sq = lse * lse
    z = np.asanyarray(np.asanyarray(_SUM(sq, axis=(0, 1, 2), keepdims=False)) / np.asarray(count, dtype))
    a_n, z_n = np.asarray(aux_coeff, dtype), np.asarray(z_coeff, dtype)
    a1 = np.asanyarray(aux * a_n)
    z1 = np.asanyarray(z * z_n)
    total = np.asanyarray(a1 + z1)
    out = DTensor._trusted(mesh, total, layout, ())
    if probs._ag is None and logits._ag is None:
        return out
    # what the chain's nodes kept (their inputs' blocks and outputs), held by the rule until the backward runs
    kept = (m, fb, pm, s, e_n, aux, top, shifted, ex, sums, logs, lse, sq, z, a_n, z_n, a1, z1, total)

    def backward(dy: Any) -> tuple:
        """The chain's rules in the walk's order: the sum's, z's and aux's products by their numbers, the z-loss's
        mean, square, log-sum-exp; then aux's sum and mean (spmdsim.nn.autograd.rules.pointwise, .reduce)."""
        g = dy._local if not CAPTURE.on else dy.local
        counting = _flops._OPEN
        gz, ga = g * z_n, g * a_n
        spread = _spread if CAPTURE.on else _filled
        dsq = spread(gz[None, None, None] / count, sq.shape)
        d1, d2 = dsq * lse, dsq * lse
        dlse = d1 + d2  # the walk's sum of lse's two gradients (spmdsim.nn.autograd.engine.add_grads)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            dsums = dlse / sums
        dex = spread(dsums, ex.shape)
        dlogits = dex * ex
        ds = ga * e_n
        dpm = spread(ds[None], pm.shape)
        dm = dpm * fb
        dprobs = spread(dm[None, None] / count, p.shape)
        if counting:  # the chain's rules' counts (their `_count_grads` and reductions' sweeps), in their order
            for kind, ins, outs in (("mul", [g, z, z_n], [z]), ("mul", [g, aux, a_n], [aux]), ("mean", (gz,), (sq,)),
                                    ("mul", [dsq, lse, lse], [lse, lse]), ("add", (d1, d2), (d1,)),
                                    ("log", [dlse, sums], [sums]), ("sum", (dsums,), (ex,)),
                                    ("exp", [dex, ex], [shifted]), ("mul", [ga, s, e_n], [s]), ("sum", (ds,), (pm,)),
                                    ("mul", [dpm, m, fb], [m]), ("mean", (dm,), (p,))):
                sweep(kind, ins, outs)
        held = kept  # noqa: F841 (the closure holds them, as the chain's nodes did)
        pending = dy._layout.partial
        return grad_tensor(logits, dlogits, pending), grad_tensor(probs, dprobs, pending)

    return attach(out, f"moe router losses {name}", (logits, probs), backward, want, (L, P, layout))


def _by_chain(logits: Any, probs: Any, f: Any, aux_coeff: float, z_coeff: float, key: Any) -> Any:
    """`router_losses` by the general operators' chain (`_chain`); with `key` (a first call), the layouts it
    worked out kept under it (`_CALLS`) where a later call can take the kernels' way."""
    out = _chain(logits, probs, f, aux_coeff, z_coeff)
    P, L, dtype = probs._layout, logits._layout, probs._local.dtype
    if (key is not None and not probs._mesh.engine.dry and dtype in _FLOATS and logits._local.dtype is dtype
            and f._local.dtype is dtype and L.tensor_map == P.tensor_map and not P.partial and not L.partial
            and not f._layout.partial):
        put(_CALLS, key, (P, L, f._layout, out._layout, with_partial(out._layout, ())), 256)
    return out


def _spread(d: np.ndarray, shape: tuple) -> np.ndarray:
    """A sum's (or mean's) gradient spread over the dims it summed, a block of its own (the reduce rule's)."""
    return np.broadcast_to(d, shape).copy(order="K")


def _filled(d: np.ndarray, shape: tuple) -> np.ndarray:
    """`_spread`'s values in a C-ordered block, without numpy's Python broadcast_to (a captured step's
    blocks come from its allocator: there `_spread`)."""
    out = np.empty(shape, d.dtype)
    out[...] = d
    return out
