"""An MoE layer on DTensors: router, dispatch by Alltoall(v) over ``ep``, experts, combine (runtime).

Mesh ``(dp, ep, tp)``: the tokens (T, B, D) are split over ("dp", "ep") on the
batch and whole on tp, as the GPT's other layers hold them (with a "cp" axis,
over cp on T too: spmdsim.models.moe.fold); expert e lives on
the ep ranks' e // (E / ep)-th share, column-parallel (w1) then row-parallel
(w2) over tp, the same on every dp rank. Each rank routes its own tokens
(spmdsim.models.moe.routing), packs them into a send buffer, and:

- dispatch: with a capacity, one Alltoall over ep of the (ep, S, E / ep, C,
  D) slots, destination-major as routed (spmdsim.models.moe.routing.dispatch_rows),
  so the buffer leaves as it is; dropless, an Alltoall of
  the per-expert counts, then an Alltoallv of the rows with the true counts;
- the experts run on what arrived: x @ w1 + b1, GELU, @ w2, an Allreduce over
  tp (w2's rows are split there), + b2; with SwiGLU experts (the model's mlp
  "swiglu": a parameter moe.w3) silu(x @ w1 + b1) * (x @ w3 + b3) in place of
  GELU, w3 column-parallel over tp as w1 (Megatron's grouped MLP); without
  biases (the model's bias False: no moe.b1, b3, b2) none added;
- combine: the dispatch's reverse exchange, then each token adds its experts'
  outputs times the gates.

With the experts' own tp 1 (MoEConfig.etp, Megatron-Core's parallel folding: spmdsim.models.moe.fold) the
experts are split over ("ep", "tp") and whole: each tp rank takes its share of the tokens (a local slice; with
sequence parallelism, dropless, they come so), the exchanges run over the ep x tp ranks, no Allreduce sums
fc2's product, and the output is gathered over tp again. With an etp between 1 and tp the mesh's tp is the
axes ("tp", "etp"): the same over "tp", each expert column- then row-parallel over "etp" as above over tp.

At ep 1 nothing is exchanged and no collective is called (not even on a group
of one rank): the dispatch and combine are the rows' local reordering alone.

Under a precision policy (fp32, bf16-mixed: spmdsim.base.precision) the router
computes in float32, the exchanges carry the activations' dtype, and the
experts round where the ranks' Linear and GELU round (`_run_experts_mixed`,
`_experts_grad_mixed`; their reference spmdsim.models.moe.mixed); the tokens'
gradient from fc1 is summed over tp inside the layer before its way back.

The backward is the same exchanges the other way (the conjugates: combine's
gradient travels as the dispatch did, dispatch's as the combine did). The
experts' gradients are summed over dp only (the ranks holding the same
experts): they come back pending over "dp" and the backward walk's Allreduce
(bucketed) sums them. The router, its softmax and its two losses are the
general operators' (einsum, softmax, mean ...), so their gradients are too.
Everything goes through runtime.collectives / runtime.exchange and the door
(runtime/door.py): a mesh made with ``algorithms={"alltoall": "pairwise"}``
runs the Alltoalls as that algorithm.

Replay (spmdsim.runtime.replay): the routing, the packing, each exchange, the
experts' products, the unpacking, their gradients and the dispatch figures
are kernels over arrays, so a replayed step reruns them on its own router
probabilities. With a capacity each dispatch and combine Alltoall is recorded as the collective itself,
apart from the slots' reordering (`_dispatched`, `_combined`), so a replay binds it to its kept plan (the
engine's transfer alone); dropless, the rows' Alltoallv runs whole in its kernel, its counts read again
each step. Their arrays have fixed shapes: with a capacity by
construction; dropless, what arrives is written into arrays with room for the
most that can (ep x bl x T x min(k, local experts) rows) while capturing, and
the counts, displacements and each expert's rows are worked out again from
the counts' arrays once a step: the layer's kernels share the last _Exchange
while the counts they are handed are the same (with a capacity, always).
What the kernels index by that depends on the layer's shapes alone is worked
out once (`_tables`, `_facts`) and a capacity's reorderings of the slots are
bound once a graph (`_bind_reorder`), so a replay runs the routing's own numpy
(its sort, gathers, one cumulative sum, the scatters) and no Python loop over
experts, ranks or choices; with a capacity over tp > 1, fc2's Allreduce is
recorded as its own call too, bound as the exchanges are.

A dry run (spmdsim.runtime.sim.dry: shapes, no values) routes by the rule
``moe.dry_routing`` names (spmdsim.models.moe.routing.planned: "balanced" or
"worst"), sends zeros of the sizes that routing gives through the same
exchanges (so the trace has their bytes and the meter their buffers), and
makes none of the experts' products.
"""
from __future__ import annotations

from functools import partial
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any, Optional

import numpy as np

from ...nn import ops
from ...base.buffers import CAPTURE
from ...nn.autograd.graph import record, with_partial
from ...errors import SpmdsimError
from ...base.flops import any_open
from ...base.precision import is_low
from ...runtime import executor
from ...runtime.dtensor import DTensor
from ...runtime.executor import redistribute
from ...runtime.replay import capturing, kernel, kernels
from ...runtime.sim.dry import dry_run_active
from .config import MoEConfig
from .fold import fold_of, fold_problem, split_problem
from .tokens import _expert_layout, input_problem, takes
from .losses import router_losses
from ..axes import CONTEXT, EXPERT, TENSOR, tensor_size
from .dry import _count_experts, _dry_experts, _grad, _tensor
from .exchange import _Plan, _bind_reorder, _by_expert, _by_source, _combine, _dispatch, _plan
from .experts import _experts_grad, _experts_grad_mixed, _present, _run_experts, _run_experts_mixed
from .slots import _combine_grad, _facts, _note, _pack, _probs_grad, _route, _tables, _unpack
from ...base.tables import put

__all__ = ["moe_layer", "moe_experts", "moe_problem", "input_problem", "takes"]


def moe_problem(mesh: Any, moe: MoEConfig, x_shape: tuple, hidden: int) -> Optional[str]:
    """Why an MoE layer cannot run on `mesh` (one line, the same on every rank), or None."""
    names, L = tuple(mesh.layout.alias_name), mesh.layout
    if EXPERT not in names or TENSOR not in names:
        return f"an MoE layer runs on a mesh with axes {EXPERT!r} and {TENSOR!r}, got {names!r}"
    problem = fold_problem(tensor_size(L), moe.etp) or split_problem(names, {a: L.axis_size(a) for a in names},
                                                                      moe.etp)
    if problem:
        return problem
    fold = fold_of(L, moe.etp)
    if moe.experts % fold.ep:
        return f"experts {moe.experts} are not divisible by ep {fold.ep} (experts are split over ep)"
    if hidden % fold.etp:
        return (f"the experts' hidden width {hidden} is not divisible by "
                f"{TENSOR if not fold.folded else 'etp'} {fold.etp}")
    if len(x_shape) != 3:
        return f"the MoE layer's input of shape {x_shape!r} must be (tokens, batch, features)"
    tp = L.axis_size(TENSOR)  # folded: the part of attention's tp whose ranks each route their own tokens
    cp = L.axis_size(CONTEXT) if CONTEXT in names else 1
    etp = f"etp {fold.etp}" if fold.folded else ""
    if fold.folded and moe.dropless and x_shape[0] % (tp * cp):
        by = f"cp {cp} x tp {tp} = {cp * tp}" if cp > 1 else f"tp {tp}"
        return (f"seq {x_shape[0]} is not divisible by {by} ({etp}, dropless: each {TENSOR} rank routes its share "
                "of the tokens)")
    dp = fold.edp // cp  # (the experts' edp holds cp's ranks, which split the sequence, not the batch)
    if fold.folded and not moe.dropless and x_shape[1] % (fold.ep * dp):
        return (f"batch {x_shape[1]} is not divisible by edp {dp} x ep {fold.ep} = {fold.ep * dp} ({etp}: each "
                f"{TENSOR} rank routes its own share of the batch)")
    return None


def moe_layer(x: Any, params: dict, pre: str, moe: MoEConfig, stats: Optional[list] = None) -> tuple[Any, Any]:
    """(output (T, B, D) in x's layout, the weighted router losses: a scalar) of the MoE layer `pre` ("h1.").

    `x` (T, B, D): whole on tp, the batch split over the mesh's other axes. `params`: the model's
    DTensors, read at pre + "moe.router", "moe.w1", "moe.b1", "moe.w2", "moe.b2", and "moe.w3", "moe.b3"
    where the experts are SwiGLU MLPs; a bias the model does not have (GPTConfig bias False) is absent and
    not added (spmdsim.models.gpt.params). `stats`: a list that receives this rank's MoEStats.
    """
    mesh = x.mesh
    w1 = params[pre + "moe.w1"]
    layout, hidden = x._layout, w1._shape[2]
    seen = _LAYER_CHECKED.get((id(layout), x._shape, moe.experts, hidden, moe.etp))
    if seen is None or seen is not layout:  # (checked once per layout object, shape, experts and width)
        problem = moe_problem(mesh, moe, tuple(x.global_shape), hidden) or (None if takes(x, moe) else
                                                                            input_problem(x))
        if problem:
            raise SpmdsimError(problem)
        # (the entry holds the layout: its id is not reused)
        put(_LAYER_CHECKED, (id(layout), x._shape, moe.experts, hidden, moe.etp), layout, 256)
    fold = fold_of(layout.layout, moe.etp)
    whole = x
    if fold.folded:  # each tp rank its share of the tokens (a local slice; its backward an Allgather over tp)
        target = _expert_layout(layout.layout, fold, moe.dropless)
        x = x if layout is target or layout == target else redistribute(x, target)
    router = params[pre + "moe.router"]
    if is_low(x._local.dtype):  # the router in float32 (Megatron's --moe-router-dtype fp32): a bfloat16 softmax
        x32, router = ops.astype(x, np.float32), ops.astype(router, np.float32)  # would tie most top-k choices
    else:
        x32 = x
    logits = ops.einsum("tbd,de->tbe", x32, router)
    probs = ops.softmax(logits, -1)  # in the logits' dtype: float64 at fp64, float32 under a policy
    out, counts = moe_experts(x, probs, w1, params.get(pre + "moe.b1"), params[pre + "moe.w2"],
                              params.get(pre + "moe.b2"), moe, pre.rstrip("."), stats, params.get(pre + "moe.w3"),
                              params.get(pre + "moe.b3"))
    T, B, E = probs.global_shape
    # Load balancing, E * sum_e f_e P_e: f_e the share of the k N assignments routed to e (counted, no
    # gradient: one Allreduce of E numbers over the batch's axes), P_e e's mean probability; the z-loss, the
    # mean over tokens of logsumexp(logits)^2: one node (spmdsim.models.moe.losses).
    f = DTensor._trusted(mesh, (counts / (moe.top_k * T * B)).astype(probs._local.dtype, copy=False),
                         _counts_layout(mesh.layout, fold), (E,))
    if fold.folded and x is not whole:  # the output gathered over tp: whole there, as the layer was given its tokens
        out = redistribute(out, whole._layout)
    return out, router_losses(logits, probs, ops.resolved(f), moe.aux_loss_coeff, moe.z_loss_coeff, pre.rstrip("."))


def _counts_layout(mesh: Any, fold: Any) -> Any:
    """The layout of a layer's (E,) assignment shares on device matrix `mesh`: whole, pending over the batch's
    axes (`fold`'s, spmdsim.models.moe.fold: those other than the experts' tp, of size above one); one object per
    device matrix and fold, so that their Allreduce's plan is found by it (spmdsim.runtime.executor.redistribute)
    rather than made again each call."""
    seen = _COUNTS_LAYOUTS.get((id(mesh), fold))
    if seen is not None and seen[0] is mesh:
        return seen[1]
    batch = tuple(a for a in mesh.alias_name if a in fold.batch_axes and mesh.axis_size(a) > 1)
    layout = mesh(None).with_partial(batch)
    put(_COUNTS_LAYOUTS, (id(mesh), fold), (mesh, layout), 64)  # (held: its id is not reused while the entry lives)
    return layout


_COUNTS_LAYOUTS: dict = {}  # (id(device matrix), fold) -> (it, `_counts_layout`'s answer)
#: (id(tokens' layout), their global shape, experts, the experts' hidden width, etp) -> that layout, for the
#: layers that passed `moe_problem` and `input_problem` (pure of the key).
_LAYER_CHECKED: dict = {}
#: (id(tokens' layout), id(probabilities' layout)) -> (those two layouts), for the pairs that passed
#: `moe_experts`' checks (pure of the key).
_EXPERTS_CHECKED: dict = {}


def moe_experts(x: Any, probs: Any, w1: Any, b1: Any, w2: Any, b2: Any, moe: MoEConfig, name: str = "moe",
                stats: Optional[list] = None, w3: Any = None, b3: Any = None) -> tuple[Any, np.ndarray]:
    """(the experts' outputs times the gates, (T, B, D) in x's layout; this rank's (E,) assignment counts
    before dropping): route, dispatch, run the experts, combine; one node in the graph. `x` as `moe_layer`
    takes it (`input_problem`), `probs` (T, B, E) laid out alike. `w3` (and `b3`): SwiGLU experts' second
    column-parallel weight, laid out as w1; a bias None is not added (a model without biases)."""
    _check_experts_inputs(x, probs, moe.etp, moe.dropless)
    mesh, fold = x.mesh, fold_of(x.mesh.layout, moe.etp)
    block = _BLOCK if not CAPTURE.on else _LOCAL  # the blocks themselves (a captured step: its record's views)
    xb = block(x)
    (T, bl, D), E, k = xb.shape, moe.experts, moe.top_k
    ep, tp = fold.ep, fold.etp
    El = E // ep
    names = _present(b1, b2, w3, b3)
    weights = tuple(filter(_NOT_NONE, (w1, b1, w2, b2, w3, b3)))  # in `names`' order
    if dry_run_active():
        return _dry_experts(x, probs, weights, names, moe, name, stats)
    plan = _plan(mesh, moe, T, bl, El, name)
    C = plan.capacity
    # Routing, packing, the exchanges, the experts and unpacking are kernels (spmdsim.runtime.replay), each
    # writing arrays of fixed shapes: a replayed step reruns them on its own router probabilities. Dropless,
    # what arrives is sized by the step's counts: captured, its arrays have room for the most that can come.
    tab = _tables(T, bl, E, k, C, ep)
    experts, gates, slots, counts, rows, per_expert, load = _K._route(block(probs), tab, moe.dropless)
    nrows = bl * T * k if moe.dropless else bl * E * C  # dropless: every assignment has its row
    send = _K._pack(xb, rows, nrows, tab.tok)
    got = None  # dropless: each member's counts for my experts, by one Alltoall of the counts
    if moe.dropless:
        got = executor.run_block(mesh, plan.slots, per_expert, f"{name} dispatch counts") if ep > 1 else per_expert
    most = ep * bl * T * min(k, El) if moe.dropless and capturing() else None
    xe = _dispatched(plan, send, per_expert, got, most)  # expert-major rows: local expert 0's, then 1's ...
    W1, B1, W2, B2, W3, B3 = (None if w is None else block(w) for w in (w1, b1, w2, b2, w3, b3))
    mixed = xb.dtype != np.float64  # under a precision policy (spmdsim.base.precision): its rounding points
    backward_of = _K._experts_grad_mixed if mixed else _K._experts_grad
    hs, ts, acts, ye, us = _experts_forward(plan, xe, per_expert, got, (W1, B1, W2, B2, W3, B3), mixed, tp,
                                            (El, D), name)
    back = _combined(plan, ye, per_expert, got)
    out = _tensor(x, _K._unpack(back, rows, gates, tab.tok), x._layout)
    if any_open():  # its products and element-wise kernels (spmdsim.base.flops), as a dry run counts them
        _count_experts(plan.made(per_expert, got), x.local.shape, nrows, W1.shape, x.local.dtype, mixed,
                       blocks=dict(x=x.local, xe=xe, hs=hs, ts=ts, acts=acts, ye=ye, back=back, out=out.local,
                                   us=us, **dict(zip(names, (w.local for w in weights)))), names=names)
    if stats is not None:  # read off the routing's arrays by a kernel: a replay reads its own step's again
        stats.append(None)  # (a kernel's list arguments are copied: it is handed the list's __setitem__)
        _K._note(stats.__setitem__, len(stats) - 1, _facts(plan, tab, D * xb.itemsize), experts, slots, rows,
                 per_expert, got)
    tensors = (x, probs) + weights
    if not any(map(_AG, tensors)):  # (a node or leaf is true)
        return out, load
    over_tp = fold.etp_axes if tp > 1 and not mixed else ()  # (mixed: summed over tp before the exchange)
    over_dp = fold.edp_axes if fold.edp > 1 else ()

    def backward(dy: Any) -> tuple:
        # (the closure holds the routing's slots and counts, as before, though no kernel here reads them: the
        # bytes a dry run's ledger counts as kept; and `tab`, not its tables: shared, held by `_tables`)
        held = (slots, counts)  # noqa: F841
        dgates, dback = _K._combine_grad(dy._local if not CAPTURE.on else dy.local, back, rows, gates, tab.tok)
        # the combine's conjugate travels the dispatch's way, the dispatch's the combine's
        dye = _dispatched(plan, dback, per_expert, got, most, f"{name} combine backward")
        # the weights read now, not held from the forward: ZeRO-3 freed them after it and gathered them again
        ws = [None if w is None else block(w) for w in (w1, w2, w3)]
        *grads, dxe = backward_of(plan, xe, hs, ts, acts, dye, per_expert, got, *ws, us, b1 is not None,
                                  b2 is not None, b3 is not None)
        dsend = _combined(plan, dxe, per_expert, got, f"{name} dispatch backward")
        dx = _K._unpack(dsend, rows, None, tab.tok)
        dprobs = _K._probs_grad(probs._local if not CAPTURE.on else probs.local, experts, gates, tab, dgates)
        if any_open():
            _count_experts(plan.made(per_expert, got), x.local.shape, nrows, ws[0].shape, x.local.dtype, mixed,
                           backward=True, names=names,
                           blocks=dict(zip(("g" + n for n in names), grads), dy=dy.local, back=back, dye=dye,
                                       dx=dx, xe=xe, hs=hs, ts=ts, acts=acts, us=us, w1=ws[0], w2=ws[1], w3=ws[2]))
        return (_grad(x, dx, over_tp), _grad(probs, dprobs, ())) + tuple(map(_grad, weights, grads, repeat(over_dp)))

    record(out, f"moe experts {name}", tensors, backward, with_partial(x.layout, ()))
    return out, load


def _check_experts_inputs(x: Any, probs: Any, etp: int, dropless: bool) -> None:
    """`moe_experts`' refusal of tokens or router probabilities it cannot take, checked once per pair of layouts
    and etp."""
    seen = _EXPERTS_CHECKED.get((id(x._layout), id(probs._layout), etp, dropless))
    if seen is None or seen[0] is not x._layout or seen[1] is not probs._layout:
        problem = input_problem(x, etp, dropless) or (None if probs.layout.tensor_map == x.layout.tensor_map and
                                       not probs.layout.addend_axes else
                                       f"the router's probabilities are laid out {probs.layout}; expected the "
                                       f"tokens' layout {x.layout}")
        if problem:
            raise SpmdsimError(problem)
        put(_EXPERTS_CHECKED, (id(x._layout), id(probs._layout), etp, dropless), (x._layout, probs._layout),
            256)  # (held)


def _experts_forward(plan: _Plan, xe: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
                     blocks: tuple, mixed: bool, tp: int, sizes: tuple, name: str) -> tuple:
    """The experts on the dispatched rows `xe`: (hs, ts, acts, ye, us), `blocks` the weights' (W1, B1, W2, B2,
    W3, B3), `sizes` (local experts, model width); us (SwiGLU's x @ w3 + b3, kept for the backward) or None."""
    W1, B1, W2, B2, W3, B3 = blocks
    forward = _K._run_experts_mixed if mixed else _K._run_experts
    if mixed or plan.moe.dropless or tp == 1:
        hs, ts, acts, ye, *more = forward(plan, xe, per_expert, got, W1, B1, W2, B2, W3, B3)
    else:  # fc2's sum over tp a collective of its own (a replay binds it to its kept plan), then b2 added
        hs, ts, acts, ye, *more = forward(plan, xe, per_expert, got, W1, B1, W2, None, W3, B3, summed=False)
        executor.run_block(plan.mesh, plan.sums, ye, f"{name} experts fc2", ye)
        if B2 is not None:
            y3 = ye.reshape(sizes[0], -1, sizes[1])
            y3 += B2[:, None]
    return hs, ts, acts, ye, (more[0] if more else None)


def _dispatched(plan: _Plan, send: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
                most: Optional[int], label: Optional[str] = None) -> np.ndarray:
    """The dispatch's exchange of `send` as `_dispatch` makes it. With a capacity over ep > 1, the Alltoall called
    apart from putting what arrived in the experts' order (`_by_expert`): a captured step records the
    collective as its own call, which a replay binds to its kept plan (the engine's transfer alone,
    spmdsim.runtime.collectives._bind). Dropless, one kernel (its counts change each step)."""
    move = None if plan.moe.dropless else plan.exchange(per_expert, got)
    if move is None or move.ep == 1:
        return _K._dispatch(plan, send, per_expert, got, most, label)
    return _K._by_expert(move, executor.run_block(plan.mesh, plan.slots, send, label or move.labels[0]))


def _combined(plan: _Plan, rows: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
              label: Optional[str] = None) -> np.ndarray:
    """The combine's exchange of `rows` as `_combine` makes it; with a capacity over ep > 1, the slots put in
    the send buffer's order (`_by_source`) and the Alltoall called apart (as `_dispatched`)."""
    move = None if plan.moe.dropless else plan.exchange(per_expert, got)
    if move is None or move.ep == 1:
        return _K._combine(plan, rows, per_expert, got, label)
    return executor.run_block(plan.mesh, plan.slots, _K._by_source(move, rows), label or move.labels[1])


# One call each in a captured step (spmdsim.runtime.replay), rerun by every replay.
# Called as ``_K._route(...)``: the function itself where this thread does not capture (no wrapper's frame).
# `_by_expert` and `_by_source` (a capacity's reorderings of the slots) bound once a graph (`_bind_reorder`).
_K = kernels(*(kernel(f) for f in (_route, _pack, _unpack, _combine_grad, _probs_grad, _note, _dispatch, _combine,
                                   _run_experts, _experts_grad, _run_experts_mixed, _experts_grad_mixed)),
             *(kernel(f, bind=_bind_reorder) for f in (_by_expert, _by_source)))


_AG, _NOT_NONE = attrgetter("_ag"), partial(is_not, None)
_BLOCK, _LOCAL = attrgetter("_local"), attrgetter("local")  # a DTensor's block: itself, or as DTensor.local reads it
