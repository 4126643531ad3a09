"""An MoE layer on DTensors: router, dispatch by Alltoall(v) over ``ep``, experts, combine (runtime).

Mesh ``(dp, ep, tp)``: the tokens (T, B, D) are split over ("dp", "ep") on the
batch and whole on tp, as the GPT's other layers hold them; expert e lives on
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

from dataclasses import dataclass, field, fields
from functools import partial
from itertools import repeat
from operator import attrgetter, is_not, setitem
from typing import Any, Callable, Optional

import numpy as np

from ...nn import ops
from ...references import forward as reference, backward as reference_grad
from ...base.buffers import CAPTURE, contiguous, into
from ...references.activations import gelu_backward, gelu_from_tanh, gelu_tanh, sigmoid, silu_slope
from ...nn.autograd.graph import record, with_partial
from ...errors import SpmdsimError
from ...layouts.layout import format_tensor_map
from ...base.flops import any_open, gemm, sweep
from ...base.precision import is_low, product, rounded, wide
from ...runtime.collectives import KERNELS
from ...runtime.collectives import allreduce
from ...runtime.dtensor import DTensor
from ...runtime.exchange import group_alltoallv
from ...runtime.replay import capturing, kernel, kernels
from ...runtime.sim.dry import dry_run_active, zeros
from .config import MoEConfig
from .losses import router_losses
from .routing import dispatch_rows, planned
from ..axes import DATA, EXPERT, TENSOR

__all__ = ["MoEStats", "moe_layer", "moe_experts", "moe_problem", "input_problem"]


@dataclass(frozen=True)
class MoEStats:
    """What one rank's dispatch did in one forward: the picture's numbers (spmdsim.models.moe.report).

    Attributes:
        layer: the layer's name ("h1").
        rank: this mesh rank; group: the mesh ranks of its ep group, in group order.
        tokens_to: real token rows sent to each group member (kept assignments).
        bytes_to: bytes sent to each group member by the dispatch (a capacity's empty slots included).
        per_expert: kept assignments routed to each expert (global index), from this rank's tokens.
        dropped: assignments dropped (past capacity); assignments: all of them (k per token).
        send_bytes, received_bytes: the dispatch's send and receive buffers (the combine's are the same
            two, the other way).
        chosen: (bl, T, k) each of this rank's tokens' experts, its batch rows as it holds them (None in a
            dry run): the check's reference follows them at near-ties (spmdsim.models.moe.routing.followed).
    """

    layer: str
    rank: int
    group: tuple[int, ...]
    tokens_to: tuple[int, ...]
    bytes_to: tuple[int, ...]
    per_expert: tuple[int, ...]
    dropped: int
    assignments: int
    send_bytes: int = 0
    received_bytes: int = 0
    chosen: Optional[np.ndarray] = field(default=None, compare=False, repr=False)


def moe_problem(mesh: Any, moe: MoEConfig, x_shape: tuple, hidden: int) -> Optional[str]:
    """Why an MoE layer cannot run on `mesh` (one line, the same on every rank), or None."""
    names = tuple(mesh.layout.alias_name)
    if EXPERT not in names or TENSOR not in names:
        return f"an MoE layer runs on a mesh with axes 'ep' and 'tp', got {names!r}"
    ep, tp = mesh.layout.axis_size(EXPERT), mesh.layout.axis_size(TENSOR)
    if moe.experts % ep:
        return f"experts {moe.experts} are not divisible by ep {ep} (experts are split over ep)"
    if hidden % tp:
        return f"the experts' hidden width {hidden} is not divisible by tp {tp}"
    if len(x_shape) != 3:
        return f"the MoE layer's input of shape {x_shape!r} must be (tokens, batch, features)"
    return None


def input_problem(x: Any) -> Optional[str]:
    """Why the MoE layer cannot take `x` as laid out (one line, the same on every rank), or None.

    The layer counts on each rank holding whole sequences of its own: it routes a rank's local block
    sequence by sequence (the capacity is per sequence), sums the load-balancing loss's counts over the
    mesh's axes other than tp, and sends every feature of a token to its experts. A batch copied over one
    of those axes counts its tokens twice (the aux loss doubled), a sequence split over tp routes and caps
    pieces of it as sequences, features split break the products, pending sums route unsummed tokens: each
    a wrong answer without an error, so each is refused. Axes of size 1 split nothing and are ignored.
    """
    L = x.layout
    big = lambda axes: {a for a in axes if L.layout.axis_size(a) > 1}  # noqa: E731
    want = big(a for a in L.layout.alias_name if a != TENSOR)
    T, batch, D = L.tensor_map
    if big(T) or big(D) or big(batch) != want or L.addend_axes:
        expected = format_tensor_map(((), tuple(a for a in L.layout.alias_name if a in want), ()))
        return (f"the MoE layer's input (tokens, batch, features) is laid out {L}; expected its batch split over "
                f"the mesh's axes other than tp and nothing else split or pending: {expected}")
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
    seen = _LAYER_CHECKED.get((id(layout), x._shape, moe.experts, hidden))
    if seen is None or seen is not layout:  # (checked once per layout object, shape, experts and width)
        problem = moe_problem(mesh, moe, tuple(x.global_shape), hidden) or input_problem(x)
        if problem:
            raise SpmdsimError(problem)
        if len(_LAYER_CHECKED) >= 256:
            _LAYER_CHECKED.clear()
        _LAYER_CHECKED[(id(layout), x._shape, moe.experts, hidden)] = layout  # (held: its id is not reused)
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
                         _counts_layout(mesh.layout), (E,))
    return out, router_losses(logits, probs, ops.resolved(f), moe.aux_loss_coeff, moe.z_loss_coeff, pre.rstrip("."))


def _counts_layout(mesh: Any) -> Any:
    """The layout of a layer's (E,) assignment shares on device matrix `mesh`: whole, pending over the batch's
    axes (those other than tp, of size above one); one object per device matrix, so that their Allreduce's
    plan is found by it (spmdsim.runtime.executor.redistribute) rather than made again each call."""
    seen = _COUNTS_LAYOUTS.get(id(mesh))
    if seen is not None and seen[0] is mesh:
        return seen[1]
    batch = tuple(a for a in mesh.alias_name if a != TENSOR and mesh.axis_size(a) > 1)
    if len(_COUNTS_LAYOUTS) >= 64:
        _COUNTS_LAYOUTS.clear()
    layout = mesh(None).with_partial(batch)
    _COUNTS_LAYOUTS[id(mesh)] = (mesh, layout)  # (held: its id is not reused while the entry lives)
    return layout


_COUNTS_LAYOUTS: dict = {}  # id(device matrix) -> (it, `_counts_layout`'s answer)
#: (id(tokens' layout), their global shape, experts, the experts' hidden width) -> that layout, for the
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
    seen = _EXPERTS_CHECKED.get((id(x._layout), id(probs._layout)))
    if seen is None or seen[0] is not x._layout or seen[1] is not probs._layout:
        problem = input_problem(x) or (None if probs.layout.tensor_map == x.layout.tensor_map and
                                       not probs.layout.addend_axes else
                                       f"the router's probabilities are laid out {probs.layout}; expected the "
                                       f"tokens' layout {x.layout}")
        if problem:
            raise SpmdsimError(problem)
        if len(_EXPERTS_CHECKED) >= 256:
            _EXPERTS_CHECKED.clear()
        _EXPERTS_CHECKED[(id(x._layout), id(probs._layout))] = (x._layout, probs._layout)  # (held)
    mesh = x.mesh
    block = _BLOCK if not CAPTURE.on else _LOCAL  # the blocks themselves (a captured step: its record's views)
    xb = block(x)
    T, bl, D = xb.shape
    E, k = moe.experts, moe.top_k
    ep, tp = mesh.layout.axis_size(EXPERT), mesh.layout.axis_size(TENSOR)
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
        got = KERNELS.alltoall(mesh, per_expert, EXPERT, 0, 0, f"{name} dispatch counts") if ep > 1 else per_expert
    most = ep * bl * T * min(k, El) if moe.dropless and capturing() else None
    xe = _dispatched(plan, send, per_expert, got, most)  # expert-major rows: local expert 0's, then 1's ...
    W1, W2 = block(w1), block(w2)
    B1, B2 = None if b1 is None else block(b1), None if b2 is None else block(b2)
    W3, B3 = (None, None) if w3 is None else (block(w3), None if b3 is None else block(b3))
    mixed = xb.dtype != np.float64  # under a precision policy (spmdsim.base.precision): its rounding points
    forward, backward_of = (_K._run_experts_mixed, _K._experts_grad_mixed) if mixed else \
        (_K._run_experts, _K._experts_grad)
    if mixed or moe.dropless or tp == 1:
        hs, ts, acts, ye, *more = forward(plan, xe, per_expert, got, W1, B1, W2, B2, W3, B3)
    else:  # fc2's sum over tp a collective of its own (a replay binds it to its kept plan), then b2 added
        hs, ts, acts, ye, *more = forward(plan, xe, per_expert, got, W1, B1, W2, None, W3, B3, summed=False)
        KERNELS.allreduce(mesh, ye, TENSOR, f"{name} experts fc2", out=ye)
        if B2 is not None:
            y3 = ye.reshape(El, -1, D)
            y3 += B2[:, None]
    us = more[0] if more else None  # SwiGLU's x @ w3 + b3, kept for the backward
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
    over_tp = (TENSOR,) if tp > 1 and not mixed else ()  # (mixed: summed over tp before the exchange)
    over_dp = (DATA,) if DATA in mesh.layout.alias_name and mesh.layout.axis_size(DATA) > 1 else ()

    def backward(dy: Any) -> tuple:
        # (the closure holds the routing's slots and counts, as before, though no kernel here reads them: the
        # bytes a dry run's ledger counts as kept; and `tab`, not its tables: shared, held by `_tables`)
        held = (slots, counts)  # noqa: F841
        dgates, dback = _K._combine_grad(dy._local if not CAPTURE.on else dy.local, back, rows, gates, tab.tok)
        # the combine's conjugate travels the dispatch's way, the dispatch's the combine's
        dye = _dispatched(plan, dback, per_expert, got, most, f"{name} combine backward")
        *grads, dxe = backward_of(plan, xe, hs, ts, acts, dye, per_expert, got, W1, W2, W3, us, B1 is not None,
                                  B2 is not None, B3 is not None)
        dsend = _combined(plan, dxe, per_expert, got, f"{name} dispatch backward")
        dx = _K._unpack(dsend, rows, None, tab.tok)
        dprobs = _K._probs_grad(probs._local if not CAPTURE.on else probs.local, experts, gates, tab, dgates)
        if any_open():
            _count_experts(plan.made(per_expert, got), x.local.shape, nrows, W1.shape, x.local.dtype, mixed,
                           backward=True, names=names,
                           blocks=dict(zip(("g" + n for n in names), grads), dy=dy.local, back=back, dye=dye,
                                       dx=dx, xe=xe, hs=hs, ts=ts, acts=acts, us=us, w1=W1, w2=W2, w3=W3))
        return (_grad(x, dx, over_tp), _grad(probs, dprobs, ())) + tuple(map(_grad, weights, grads, repeat(over_dp)))

    record(out, f"moe experts {name}", tensors, backward, with_partial(x.layout, ()))
    return out, load


@dataclass(eq=False)
class _Plan:
    """What one layer's exchanges need besides the step's counts (`name`: the layer's, "h1"): `exchange`
    gives this step's _Exchange."""

    mesh: Any
    moe: MoEConfig
    capacity: int
    bl: int
    El: int
    name: str
    #: (per_expert's bytes, got's, their _Exchange) made last: a step's kernels ask seven times (a replay's with
    #: the same captured arrays, rewritten each step, so the counts are compared, not the arrays' identity).
    last: Optional[tuple] = field(default=None, repr=False)
    #: its layer's _Facts for MoEStats (`_facts`), made on first use
    facts: Optional[Any] = field(default=None, repr=False)
    #: the mesh's tp (w2's rows split over it: fc2's output summed there)
    tp: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tp = self.mesh.layout.axis_size(TENSOR)

    def exchange(self, per_expert: np.ndarray, got: Optional[np.ndarray]) -> "_Exchange":
        last = self.last
        if last is not None and (not self.moe.dropless or (got is not None and last[0] == per_expert.tobytes()
                                                          and last[1] == got.tobytes())):
            return last[2]  # with a capacity nothing depends on the counts (dropless: the same counts' bytes)
        move = _Exchange(self.mesh, self.moe, self.capacity, self.bl, self.El, per_expert, f"{self.name} dispatch",
                         f"{self.name} combine", got)
        if not self.moe.dropless:  # (called outside a kernel while capturing: `_dispatched`; nothing copied)
            self.last = (None, None, move)
        elif got is not None:  # (without `got`, dropless exchanges the counts itself)
            self.last = (per_expert.tobytes(), got.tobytes(), move)  # (the layer's int64 counts, as bytes)
        return move

    def made(self, per_expert: np.ndarray, got: Optional[np.ndarray]) -> "_Exchange":
        """This step's _Exchange as the layer's exchanges made it (`last`), for the FLOP count, outside a kernel:
        `exchange` there compares the counts, which while capturing are traced arrays, so a dropless capture
        recorded each comparison as a guard (np.array_equal) that a replay with other counts failed on, and a
        count under a counter was no longer the step's alone. Made by `exchange` where none was yet."""
        last = self.last
        return last[2] if last is not None else self.exchange(per_expert, got)


def _plan(mesh: Any, moe: MoEConfig, T: int, bl: int, El: int, name: str) -> _Plan:
    """Layer `name`'s _Plan on `mesh` for `bl` sequences of `T` tokens. With a capacity nothing in it depends on
    a step's counts: one plan a signature, kept by the mesh with its collectives' plans (``mesh._plans``, freed
    when it closes), its _Exchange made once. Dropless: a new one each call (its exchange follows the counts)."""
    if moe.dropless:
        return _Plan(mesh, moe, moe.capacity(T), bl, El, name)
    key = ("moe plan", id(moe), T, bl, name)
    seen = mesh._plans.get(key)
    if seen is None or seen[0] is not moe:
        seen = mesh._plans[key] = (moe, _Plan(mesh, moe, moe.capacity(T), bl, El, name))  # (held: its id is not reused)
    return seen[1]


def _dispatched(plan: _Plan, send: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
                most: Optional[int], label: Optional[str] = None) -> np.ndarray:
    """The dispatch's exchange of `send` as `_dispatch` makes it. With a capacity over ep > 1, the Alltoall called
    apart from putting what arrived in the experts' order (`_by_expert`): a captured step records the
    collective as its own call, which a replay binds to its kept plan (the engine's transfer alone,
    spmdsim.runtime.collectives._bind). Dropless, one kernel (its counts change each step)."""
    move = None if plan.moe.dropless else plan.exchange(per_expert, got)
    if move is None or move.ep == 1:
        return _K._dispatch(plan, send, per_expert, got, most, label)
    return _K._by_expert(move, KERNELS.alltoall(plan.mesh, send, EXPERT, 0, 0, label or move.labels[0]))


def _combined(plan: _Plan, rows: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
              label: Optional[str] = None) -> np.ndarray:
    """The combine's exchange of `rows` as `_combine` makes it; with a capacity over ep > 1, the slots put in
    the send buffer's order (`_by_source`) and the Alltoall called apart (as `_dispatched`)."""
    move = None if plan.moe.dropless else plan.exchange(per_expert, got)
    if move is None or move.ep == 1:
        return _K._combine(plan, rows, per_expert, got, label)
    return KERNELS.alltoall(plan.mesh, _K._by_source(move, rows), EXPERT, 0, 0, label or move.labels[1])


def _by_expert(move: "_Exchange", got: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """A capacity dispatch's arrived slots (ep, bl, El, C) in the experts' order (El, ep, bl, C): rows (into
    `out` when given)."""
    return move.by_expert(got, out)


def _by_source(move: "_Exchange", rows: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """A capacity combine's expert-major rows (El, ep, bl, C) in the send buffer's order (ep, bl, El, C) (into
    `out` when given)."""
    return move.by_source(rows[:move.arrived], out)


def _bind_reorder(func: Callable, args: tuple, kwargs: dict) -> Optional[Callable]:
    """A captured step's `_by_expert` or `_by_source` call as its replay makes it (spmdsim.runtime.replay.kernel's
    `bind`): the copy of the source's slots, seen in the destination's order, into the captured result, both
    views made once (what the call itself works out again each time: the reshapes, the transpose, its
    frames); None (the call itself) where the arrays are not as a capture leaves them."""
    kwargs = dict(kwargs)
    out = kwargs.pop("out", None)
    if len(args) != 2 or kwargs or not isinstance(args[0], _Exchange) or type(out) is not np.ndarray:
        return None
    move, src = args
    if type(src) is not np.ndarray or move.dropless or src.dtype != out.dtype or not out.flags.c_contiguous:
        return None
    D = src.shape[-1]
    if func is _by_expert:
        seen = src.reshape(move.ep, move.bl, move.El, move.C, D).transpose(2, 0, 1, 3, 4)
    else:
        seen = src[:move.arrived].reshape(move.El, move.ep, move.bl, move.C, D).transpose(1, 2, 0, 3, 4)
    into_ = out.reshape(seen.shape)  # (a view: `out` is C-ordered)
    if np.may_share_memory(into_, seen):
        return None
    return partial(setitem, into_, Ellipsis, seen)  # (no Python frame: a C function's partial)


def _dispatch(plan: _Plan, send: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
              most: Optional[int], label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The dispatch's exchange of `send`: what arrived, expert-major; with `most`, in `most` rows (zero past
    what arrived). `out`: the array to write it into (a replay's: its captured result)."""
    move = plan.exchange(per_expert, got)
    if most is None:
        return move.dispatch(send, label, out)
    rows = np.empty((most, send.shape[1]), send.dtype) if out is None else out
    move.dispatch(send, label, rows[:move.arrived])
    rows[move.arrived:] = 0.0
    return rows


def _combine(plan: _Plan, rows: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
             label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The combine's exchange of the expert-major `rows` (those that arrived, of a buffer that may be longer):
    the send buffer's rows, back on the ranks the tokens came from (into `out` when given)."""
    move = plan.exchange(per_expert, got)
    return move.combine(rows[:move.arrived], label, out)


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
        KERNELS.allreduce(plan.mesh, used, TENSOR, f"{plan.name} experts fc2", out=used)
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
    if plan.mesh.layout.axis_size(TENSOR) > 1:
        def summed(p: np.ndarray) -> None:
            used = p.reshape(-1, D)[:move.arrived]
            KERNELS.allreduce(plan.mesh, used, TENSOR, f"{plan.name} experts fc2", out=used)
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
    if plan.mesh.layout.axis_size(TENSOR) > 1:  # each tp rank's hidden columns' share, summed
        used = dx[:move.arrived]
        KERNELS.allreduce(plan.mesh, used, TENSOR, f"{plan.name} experts fc1 backward", out=used)
    dxe[...] = rounded(dx, act)
    return out


class _Tables:
    """What one layer signature's routing kernels index by, worked out once (`_tables`): integer tables of the
    (T, bl, E, k, C, ep) shapes alone, never written. Kernels handed one (a replay's: the capture's) gather and
    scatter through them with numpy's take and fancy indexing, in place of take_along_axis, put_along_axis and
    broadcast_to (each a few hundred opcodes of numpy's Python a call) and of a loop over the choices.

    Attributes (each int64): tok (bl, T, k): each assignment's token as a row of a (T * bl, D) block, t bl + b;
    tflat (bl, T, 1): (t bl + b) E, where token (b, t)'s E values start in a C-ordered (T, bl, E) block;
    oflat (bl, T, k): ((b k + j) T + t) E, where choice j of token (b, t) starts in a (bl, k, T, E) block (the
    choices in GShard's order of priority: every first choice, then every second); sflat (bl, 1, 1): b E, a
    sequence's start in a (bl, E) block; slot_rows (bl E,): with a capacity, the send buffer's row of slot 0 of
    (sequence b, expert e) at b E + e ((ep, bl, E / ep, C) slots, destination-major); per_expert (E,): rows per
    expert with a capacity, bl C."""

    __slots__ = ("T", "bl", "E", "k", "C", "ep", "tok", "tflat", "oflat", "sflat", "slot_rows", "per_expert")

    def __init__(self, T: int, bl: int, E: int, k: int, C: int, ep: int) -> None:
        self.T, self.bl, self.E, self.k, self.C, self.ep = T, bl, E, k, C, ep
        El = E // ep
        b, t, j = np.arange(bl)[:, None, None], np.arange(T)[None, :, None], np.arange(k)[None, None, :]
        e = np.arange(E)
        self.tok = np.ascontiguousarray(np.broadcast_to(t * bl + b, (bl, T, k)), dtype=np.int64)
        self.tflat = ((t * bl + b) * E).astype(np.int64)
        self.oflat = (((b * k + j) * T + t) * E).astype(np.int64)
        self.sflat = (b * E).astype(np.int64)
        self.slot_rows = (((e // El * bl + b[:, :, 0]) * El + e % El) * C).reshape(-1).astype(np.int64)
        self.per_expert = np.full(E, bl * C, dtype=np.int64)
        for a in (self.tok, self.tflat, self.oflat, self.sflat, self.slot_rows, self.per_expert):
            a.flags.writeable = False


def _tables(T: int, bl: int, E: int, k: int, C: int, ep: int) -> _Tables:
    """The _Tables of a signature, made once (a pure function of its integers; 64 kept, then start over)."""
    key = (T, bl, E, k, C, ep)
    seen = _TABLES.get(key)
    if seen is None:
        if len(_TABLES) >= 64:
            _TABLES.clear()
        seen = _TABLES[key] = _Tables(T, bl, E, k, C, ep)
    return seen


_TABLES: dict = {}  # (T, bl, E, k, C, ep) -> its _Tables


def _route(probs: np.ndarray, tab: _Tables, dropless: bool, out: Optional[tuple] = None) -> tuple:
    """This rank's routing of its (T, bl, E) probabilities, as arrays: (experts, gates, slots (bl, T, k);
    counts (bl, E); rows (bl, T, k), each assignment's row in the send buffer (destination-major over the
    ep ranks), -1 where dropped; rows per expert (E,); the (E,) assignments before dropping, float64, for
    the load-balancing loss); into `out`'s seven arrays when given (a replay's).

    The values of spmdsim.models.moe.routing.route and dispatch_rows on the probabilities as (bl, T, E) (the same
    numpy calls where they compute floats: the stable sort, the gates' sum and division), by `tab`'s tables
    (`_tables`): each token's row of E values sorted where it lies, the chosen ones gathered by flat index,
    and the slots counted by one cumulative sum over the choices in GShard's order (every first choice, then
    every second) where `_placed` counts choice by choice."""
    bl, T, E, k, C = tab.bl, tab.T, tab.E, tab.k, tab.C
    p = probs if probs.flags.c_contiguous else np.ascontiguousarray(probs)
    if out is None:
        experts, slots, rows = (np.empty((bl, T, k), np.int64) for _ in range(3))
        per_expert, load = np.empty(E, np.int64), np.empty(E, np.float64)
    else:
        experts, gates, slots, counts, rows, per_expert, load = out
    experts[...] = (-p).argsort(axis=-1, kind="stable")[..., :k].transpose(1, 0, 2)  # ties to the lower index
    chosen = p.reshape(-1).take(tab.tflat + experts)
    if k == 1:
        g = chosen
    else:
        total = np.add.reduce(chosen, -1, keepdims=True)
        g = chosen / np.where(total > 0, total, 1.0)  # (a dry run's zeros: gates zero, not 0 / 0)
    if out is None:
        gates = g
    else:
        gates[...] = g
    at = tab.oflat + experts
    onehot = np.zeros(bl * k * T * E, np.int64)
    onehot[at] = 1
    seen = onehot.reshape(bl, k * T, E).cumsum(axis=1)  # assignments to each (sequence, expert) so far
    np.subtract(seen.reshape(-1).take(at), 1, out=slots)
    if out is None:
        counts = seen[:, -1].copy()
    else:
        counts[...] = seen[:, -1]
    dropped = slots >= C
    slots[dropped] = -1
    if not dropless:
        np.add(tab.slot_rows.take(tab.sflat + experts), slots, out=rows)
        rows[dropped] = -1
        per_expert[...] = tab.per_expert
    else:  # rows sorted by expert, then sequence, then slot (dispatch_rows')
        per = counts
        before = np.cumsum(per, axis=0) - per
        np.add.reduce(per, 0, out=per_expert)
        base = (np.cumsum(per_expert) - per_expert)[None, :] + before
        np.add(base.reshape(-1).take(tab.sflat + experts), slots, out=rows)
        rows[dropped] = -1
    load[...] = np.add.reduce(counts, 0)
    return experts, gates, slots, counts, rows, per_expert, load


def _pack(x: np.ndarray, rows: np.ndarray, nrows: int, tok: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The dispatch's send buffer (nrows, D): each kept assignment's token row of x (T, bl, D) at its row,
    the rest zero. `tok`: each assignment's token row (`_Tables.tok`)."""
    T, bl, D = x.shape
    send = np.zeros((nrows, D), x.dtype) if out is None else out
    if out is not None:
        send.fill(0.0)
    kept = rows >= 0
    send[rows[kept]] = x.reshape(T * bl, D)[tok[kept]]
    return send


def _unpack(back: np.ndarray, rows: np.ndarray, gates: Optional[np.ndarray], tok: np.ndarray,
            out: Optional[np.ndarray] = None) -> np.ndarray:
    """(T, bl, D): each token's kept assignments' rows of `back` (nrows, D) summed, times their gates (none:
    the rows themselves, the dispatch's gradient). `tok`: each assignment's token row (`_Tables.tok`)."""
    bl, T, _ = rows.shape
    D = back.shape[1]
    kept = rows >= 0
    at = rows[kept]
    if back.dtype != np.float64:  # a policy's: summed in float32, the output rounded once (a gradient is not)
        acc = np.zeros((T, bl, D), np.float32)
        np.add.at(acc.reshape(T * bl, D), tok[kept], wide(back[at]) if gates is None else
                  gates[kept][:, None] * wide(back[at]))
        return into(out, acc if gates is None else rounded(acc, back.dtype))
    ys = np.zeros((T, bl, D)) if out is None else out
    if out is not None:
        ys.fill(0.0)
    np.add.at(ys.reshape(T * bl, D), tok[kept], back[at] if gates is None else gates[kept][:, None] * back[at])
    return ys


def _combine_grad(dy: np.ndarray, back: np.ndarray, rows: np.ndarray, gates: np.ndarray, tok: np.ndarray,
                  out: Optional[tuple] = None) -> tuple:
    """The combine's backward: (d loss / d gates (bl, T, k); d loss / d the combine's rows (nrows, D)) from
    the output's gradient dy (T, bl, D); into `out`'s two arrays when given (a replay's). `tok`: each
    assignment's token row (`_Tables.tok`)."""
    T, bl, D = dy.shape
    kept = rows >= 0
    at = rows[kept]
    mixed = back.dtype != np.float64  # a policy's: float32 math, the rows' gradient rounded once to be sent
    dys = dy.reshape(T * bl, D)[tok[kept]]
    if mixed:
        dys = wide(dys)
    if out is None:
        dgates, dback = np.zeros(gates.shape, gates.dtype), np.zeros(back.shape, back.dtype)
    else:
        dgates, dback = out
        dgates.fill(0)
        dback.fill(0)
    if mixed:
        dgates[kept] = np.einsum("nd,nd->n", dys, wide(back[at]))
        dback[at] = rounded(gates[kept][:, None] * dys, back.dtype)
        return dgates, dback
    dgates[kept] = np.einsum("nd,nd->n", dys, back[at])
    dback[at] = gates[kept][:, None] * dys
    return dgates, dback


def _probs_grad(probs: np.ndarray, experts: np.ndarray, gates: np.ndarray, tab: _Tables, dgates: np.ndarray,
                out: Optional[np.ndarray] = None) -> np.ndarray:
    """d loss / d probs (T, bl, E) from d loss / d gates (bl, T, k) (into `out` when given): the values of
    spmdsim.models.moe.routing.gates_backward (the same numpy calls on the gathered probabilities), scattered by
    `tab`'s flat indices (`_Tables.tflat`)."""
    if out is not None and not out.flags.c_contiguous:  # (written through a flat view below)
        out[...] = _probs_grad(probs, experts, gates, tab, dgates)
        return out
    p = probs if probs.flags.c_contiguous else np.ascontiguousarray(probs)
    dprobs = np.zeros(p.shape, p.dtype) if out is None else out
    if out is not None:
        dprobs.fill(0)
    at = tab.tflat + experts
    if tab.k == 1:
        dprobs.reshape(-1)[at] = dgates
        return dprobs
    chosen = p.reshape(-1).take(at)
    total = np.add.reduce(chosen, -1, keepdims=True)
    total = np.where(total > 0, total, 1.0)  # a dry run's zeros (route's gates are zero there too)
    # g_i = p_i / (p_0 + p_1): dp_j = (dg_j - sum_i dg_i g_i) / (p_0 + p_1)
    dprobs.reshape(-1)[at] = (dgates - np.add.reduce(dgates * gates, -1, keepdims=True)) / total
    return dprobs


class _Facts:
    """What a layer's MoEStats take from its signature and mesh alone (`_facts`), for `_note`."""

    __slots__ = ("name", "rank", "group", "row", "E", "ep", "El", "share", "dropless", "sent", "send_bytes",
                 "received_bytes")

    def __init__(self, mesh: Any, name: str, tab: _Tables, row: int, dropless: bool) -> None:
        self.name, self.rank, self.row, self.dropless = name, mesh.rank, row, dropless
        self.group = tuple(int(r) for r in mesh.group_ranks(EXPERT))
        self.E, self.ep = tab.E, tab.ep
        self.El = tab.E // tab.ep
        self.share = tab.bl * self.El * tab.C  # with a capacity: each destination's slots
        rows = [self.share] * self.ep
        self.sent = tuple(n * row for n in rows)
        self.send_bytes = self.received_bytes = sum(rows) * row


def _facts(plan: "_Plan", tab: _Tables, row: int) -> _Facts:
    """`plan`'s _Facts for rows of `row` bytes, made once a plan (a capacity's plan lives as its mesh's)."""
    facts = plan.facts
    if facts is None or facts.row != row:
        facts = plan.facts = _Facts(plan.mesh, plan.name, tab, row, plan.moe.dropless)
    return facts


def _note(put: Callable, at: int, facts: _Facts, experts: np.ndarray, slots: np.ndarray, rows: np.ndarray,
          per_expert: np.ndarray, got: Optional[np.ndarray]) -> None:
    """put(at, this rank's MoEStats of the routing's arrays), as `_stats` makes it."""
    kept = rows >= 0
    ep, row = facts.ep, facts.row
    sent_to = rows[kept]
    if facts.dropless:  # a kept assignment's row lies in its destination's share of the send buffer
        send_rows = np.add.reduce(per_expert.reshape(ep, facts.El), 1)
        tokens = np.bincount(np.searchsorted(np.cumsum(send_rows), sent_to, side="right"), minlength=ep)
        sent = tuple((send_rows * row).tolist())
        send_bytes = int(np.add.reduce(send_rows)) * row
        received_bytes = int(np.add.reduce(got, None)) * row
    else:  # the slots are destination-major: (ep, bl, El, C)
        tokens = np.bincount(sent_to // facts.share, minlength=ep)
        sent, send_bytes, received_bytes = facts.sent, facts.send_bytes, facts.received_bytes
    # MoEStats(...) made without its frozen __init__'s twelve object.__setattr__ calls: its fields set at once
    stats = _new(MoEStats)
    stats.__dict__.update(zip(_STATS_FIELDS, (
        facts.name, facts.rank, facts.group, tuple(tokens[:ep].tolist()), sent,
        tuple(np.bincount(experts[slots >= 0], minlength=facts.E).tolist()), slots.size - int(np.count_nonzero(kept)),
        slots.size, send_bytes, received_bytes, experts.copy())))
    put(at, stats)


_new = object.__new__
_STATS_FIELDS = tuple(f.name for f in fields(MoEStats))  # (in MoEStats' order: its __init__'s)


# One call each in a captured step (spmdsim.runtime.replay), rerun by every replay.
# Called as ``_K._route(...)``: the function itself where this thread does not capture (no wrapper's frame).
# `_by_expert` and `_by_source` (a capacity's reorderings of the slots) bound once a graph (`_bind_reorder`).
_K = kernels(*(kernel(f) for f in (_route, _pack, _unpack, _combine_grad, _probs_grad, _note, _dispatch, _combine,
                                   _run_experts, _experts_grad, _run_experts_mixed, _experts_grad_mixed)),
             *(kernel(f, bind=_bind_reorder) for f in (_by_expert, _by_source)))


def _dry_experts(x: Any, probs: Any, weights: tuple, names: tuple, moe: MoEConfig, name: str,
                 stats: Optional[list]) -> tuple[Any, np.ndarray]:
    """`moe_experts` in a dry run: the routing by rule (moe.dry_routing), the exchanges of both ways on zeros
    of their true sizes (traced, their buffers metered), no product made; the backward's exchanges alike.
    `weights`: the experts' DTensors, named by `names` (`_present`)."""
    mesh = x.mesh
    T, bl, D = x.local.shape
    ep, tp = mesh.layout.axis_size(EXPERT), mesh.layout.axis_size(TENSOR)
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
        allreduce(mesh, fc2, TENSOR, f"{name} experts fc2", out=fc2)
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

    # what the real step's backward holds (its closure's arrays, spmdsim.nn.autograd.kept_bytes), of their sizes
    kept = (routing.experts, routing.gates, routing.slots, routing.counts, rows, per_expert, xe, hs, ts, acts, back,
            us, zeros(per_expert.shape, np.int64) if moe.dropless and ep > 1 else None)  # (dropless: the counts got)

    def backward(dy: Any) -> tuple:
        held = kept  # noqa: F841 (the closure holds them until the backward runs, as the real one does)
        dye = move.dispatch(zeros((nrows, D), act), f"{name} combine backward")
        if mixed and tp > 1:  # d xe summed over tp before its way back (`_experts_grad_mixed`)
            allreduce(mesh, zeros(dye.shape, np.float32), TENSOR, f"{name} experts fc1 backward")
        move.combine(zeros(dye.shape, dye.dtype), f"{name} dispatch backward")
        dx = zeros(x.local.shape, np.float32 if mixed else act)
        grads = tuple(zeros(w.local.shape, np.float32 if is_low(w.local.dtype) else w.local.dtype) for w in weights)
        if any_open():  # counted with the blocks the rank holds: the weights, their gradients, the kept blocks
            _count_experts(move, x.local.shape, nrows, W1.shape, act, mixed, backward=True, names=names,
                           blocks=dict(zip(("g" + n for n in names), grads), dy=dy.local, back=back, dye=dye,
                                       dx=dx, xe=xe, hs=hs, ts=ts, acts=acts, us=us, w1=W1, w2=local["w2"],
                                       w3=local.get("w3")))
        over_tp = (TENSOR,) if tp > 1 and not mixed else ()
        over_dp = (DATA,) if DATA in mesh.layout.alias_name and mesh.layout.axis_size(DATA) > 1 else ()
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
    bias adds, GELU (SwiGLU's gate) and its backward, the biases' sums, and the packing of the send buffer
    and the tokens' sum of their rows. A real step and a dry run count the same (the dry run routes by rule).
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
    if not backward:
        sweep("moe pack", (b("x", tokens),), (rows,))
    else:
        sweep("moe combine backward", (b("dy", tokens), b("back", rows)), (rows,))
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
    if not backward:
        sweep("moe unpack", (b("back", rows),), (b("out", tokens),))
    else:
        sweep("moe unpack", (rows,), (b("dx", tokens),))


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
_AG, _NOT_NONE = attrgetter("_ag"), partial(is_not, None)
_BLOCK, _LOCAL = attrgetter("_local"), attrgetter("local")  # a DTensor's block: itself, or as DTensor.local reads it


class _Exchange:
    """One layer's dispatch and combine on one rank: the Alltoall (capacity) or the counts' Alltoall and the
    Alltoallv (dropless) over ep, and where each local expert's rows lie in what arrives; at ep 1 no call."""

    def __init__(self, mesh: Any, moe: MoEConfig, capacity: int, bl: int, El: int, per_expert: np.ndarray,
                 dispatch_label: str, combine_label: str, got: Optional[np.ndarray] = None) -> None:
        self.mesh, self.dropless, self.C, self.bl, self.El = mesh, moe.dropless, capacity, bl, El
        self.labels = (dispatch_label, combine_label)
        self.dry = dry_run_active()  # zeros: no rows to put in order
        ep = mesh.layout.axis_size(EXPERT)
        self.ep = ep
        if not self.dropless:
            n = ep * bl * capacity
            self.ranges = [(e * n, (e + 1) * n) for e in range(El)]
            self.send_rows = [bl * El * capacity] * ep
            self.recv_rows = self.send_rows
            self.arrived = El * n
            return
        # Dropless: each member's counts for my experts, (ep, El), by one Alltoall of the counts (`got`: done).
        if got is None:
            got = KERNELS.alltoall(mesh, np.ascontiguousarray(per_expert, dtype=np.int64), EXPERT, 0, 0,
                           f"{dispatch_label} counts") if ep > 1 else per_expert.astype(np.int64)
        got = got.reshape(ep, El)
        if self.dry:  # every member routed as this rank did (a dry run's rule): each sends me my experts' share
            me = mesh.group_info(EXPERT)[2]
            got = np.tile(np.asarray(per_expert[me * El:(me + 1) * El], np.int64), (ep, 1))
        self.send_rows = np.add.reduce(np.asarray(per_expert, np.int64).reshape(ep, El), 1).tolist()
        self.recv_rows = np.add.reduce(got, 1).tolist()
        self.arrived = sum(self.recv_rows)
        # Arrived rows are by source, then local expert; the experts want them by expert, then source: block
        # (s, e) of got[s, e] rows starts at `starts` in what arrived and at `at` in the experts' order.
        flat = got.reshape(-1)
        starts = (np.cumsum(flat) - flat).reshape(ep, El).T.reshape(-1)  # by (e, s)
        sizes = got.T.reshape(-1)
        at = np.cumsum(sizes) - sizes
        self.order = (np.repeat(starts - at, sizes) + np.arange(self.arrived)).astype(np.int64, copy=False)
        per = np.add.reduce(got, 0)
        ends = np.cumsum(per)
        self.ranges = list(zip((ends - per).tolist(), ends.tolist()))

    def dispatch(self, send: np.ndarray, label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Send rows (the routing's buffer, destination-major) -> expert-major rows of this rank's experts (into
        `out`, (arrived, D), when given)."""
        label = label or self.labels[0]
        D = send.shape[1]
        if not self.dropless:  # the send buffer is (ep, bl, El, C) slots: each member's share is one block
            got = KERNELS.alltoall(self.mesh, send, EXPERT, 0, 0, label) if self.ep > 1 else send
            return got if self.dry else self.by_expert(got, out)
        if self.ep == 1:  # a group of one: no exchange (no call), and rows by expert from one source are in order
            return into(out, send)
        got = group_alltoallv(self.mesh, send, self.send_rows, self.recv_rows, EXPERT, label)
        if self.dry:
            return got
        return got[self.order] if out is None else np.take(got, self.order, axis=0, out=out)

    def by_expert(self, got: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """A capacity dispatch's arrived slots as expert-major rows (into `out`, (arrived, D), when given)."""
        D = got.shape[-1]
        # (ep, bl, El, C, D) -> (El, ep, bl, C, D): each local expert's slots together
        by_expert = got.reshape(self.ep, self.bl, self.El, self.C, D).transpose(2, 0, 1, 3, 4)
        if out is None:
            return contiguous(by_expert).reshape(-1, D)
        np.copyto(out.reshape(by_expert.shape), by_expert)
        return out

    def by_source(self, rows: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """A capacity combine's expert-major rows as the send buffer's slots, each member's block together (into
        `out` when given)."""
        D = rows.shape[1]  # (El, ep, bl, C, D) -> (ep, bl, El, C, D)
        by_source = rows.reshape(self.El, self.ep, self.bl, self.C, D).transpose(1, 2, 0, 3, 4)
        if out is None:
            return contiguous(by_source).reshape(-1, D)
        np.copyto(out.reshape(by_source.shape), by_source)
        return out

    def combine(self, rows: np.ndarray, label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Expert-major rows -> the send buffer's rows on the ranks the tokens came from (dispatch reversed; into
        `out` when given)."""
        label = label or self.labels[1]
        D = rows.shape[1]
        if not self.dropless:
            if self.dry:  # at ep 1, slots already in the experts' order: the real step's `rows` itself, as here
                blocks = rows if self.ep == 1 and (self.El == 1 or self.bl == 1) else zeros(rows.shape, rows.dtype)
            else:
                blocks = self.by_source(rows)
            if self.ep > 1:
                return KERNELS.alltoall(self.mesh, blocks, EXPERT, 0, 0, label, out)
            return into(out, blocks)
        if self.ep == 1:  # a group of one: no exchange (no call); one source's rows by expert are in order already
            return into(out, rows)
        if self.dry:
            return group_alltoallv(self.mesh, rows, self.recv_rows, self.send_rows, EXPERT, label)
        by_source = np.empty_like(rows)
        by_source[self.order] = rows
        return into(out, group_alltoallv(self.mesh, by_source, self.recv_rows, self.send_rows, EXPERT, label))


def _stats(mesh: Any, name: str, routing: Any, move: _Exchange, at: np.ndarray, row: int) -> MoEStats:
    """`row`: the bytes of one token row (d_model values of the activations' dtype)."""
    group = mesh.group_ranks(EXPERT)
    ep = move.ep
    # A kept assignment's row lies in its destination's share of the send buffer.
    if move.dropless:
        bounds = np.cumsum(move.send_rows)
        tokens = np.bincount(np.searchsorted(bounds, at, side="right"), minlength=ep)
        sent = [n * row for n in move.send_rows]
    else:  # the slots are destination-major: (ep, bl, El, C)
        tokens = np.bincount(at // (move.bl * move.El * move.C), minlength=ep)
        sent = [n * row for n in move.send_rows]
    return MoEStats(name, mesh.rank, tuple(int(r) for r in group), tuple(int(n) for n in tokens[:ep]),
                    tuple(int(n) for n in sent), tuple(int(n) for n in routing.per_expert()), routing.dropped,
                    int(routing.slots.size), sum(move.send_rows) * row, sum(move.recv_rows) * row,
                    None if dry_run_active() else routing.experts.copy())
