"""``loss.backward()``: walk the recorded graph backwards, moving gradients with the planner.

Gradients are DTensors. The gradient of a tensor keeps the tensor's tensor
map and may be a pending sum over axes the tensor is replicated on: each
rank's copy of a replicated value contributed its own part, and the true
gradient is their sum. Such sums are carried (a backward is linear in the
gradient, so they pass through any operator whose other operands repeat over
those axes) and resolved once, where an operator needs the whole value or at
a leaf, where ``.grad`` is whole: there the planner's Allreduce is the
data-parallel gradient Allreduce. Every move is a redistribution planned by
`spmdsim.programs.plan`, so each backward collective is the conjugate of a forward one
(docs/howto/train.md).
"""
from __future__ import annotations

from itertools import chain, compress
from operator import is_
from typing import Any, Optional

import numpy as np

from ...base import buffers
from ...base.context import current
from ...base.foreign import take_foreign
from ...errors import OperatorError
from ...base import flops as _flops
from .graph import Leaf, Node, _Mode, _passed, used_axes, with_partial
from .checks import _check_loss, _refuse_options, _refuse_stale, _SCALAR, _topological
from .leaves import _described, _GLOBAL_SHAPE, _GRAD_NAME, _into_grads, _IS_LEAF, _resolve_leaves
from . import moves as _moves
from .moves import (
    _collector, _F32, _move, _new_object, _of_parameters, _redistribute, _rounded_wide, _runtime, _take,
    add_grads, grad_layout,
)
from .plans import _AG, _bucket_cap, _GRAD, _GRAD_PARTIAL, _LAYOUT, _leaf_plan, _ndarray, _NONE, _whole_grads

__all__ = ["backward", "backward_kept", "kept_leaves", "reduce_grads", "gradients"]


#: torch.autograd.backward's keywords (spmdsim.base.foreign): the values that ask for what this one does.
_PYTORCH_KEYWORDS = {
    "inputs": ((None,), "the walk fills the .grad of every leaf the loss depends on; read the ones you need"),
}


def backward(loss: Any, explain: Optional[list] = None, bucket: Any = False, gradient: Any = None,
             keep_pending: Any = (), retain_graph: Any = None, create_graph: Any = False,
             reduce_with: Any = None, **foreign: Any) -> None:
    """Fill ``.grad`` of every leaf `loss` depends on; frees the graph (a second backward is refused).

    Collective: every rank calls it on the same graph. Every refusal depends
    only on what all ranks share (shapes, layouts, the graph), so all ranks
    raise it alike before the first collective. `explain`, a list, receives
    (forward step, this rank's trace entries) for each step the backward
    answers, in backward order, and ("gradient of <leaf>", entries) for each
    leaf's resolution. `bucket`: the leaves whose replicas' gradients are
    summed over the same axes share one Allreduce (data-parallel gradient
    bucketing, as DDP and Megatron do): fewer calls, the same bytes. True
    puts them all in one bucket; a byte count caps each bucket (by the bytes
    of the parameters' shards a rank holds, as DDP's ``bucket_cap_mb`` and
    Megatron's ``bucket_size`` count a process's parameters; the largest
    shard where shards differ, so every rank groups alike; a larger one goes alone).
    `gradient`: the upstream gradient, a DTensor of `loss`'s global shape in
    any layout (moved to the loss's); None for a scalar loss (ones).
    `keep_pending`: leaf tensors whose gradient stays a pending sum over the
    axes they are replicated on, added into ``.grad`` as it is, for
    `reduce_grads` to sum once after several backwards (gradient accumulation
    over microbatches: DDP's ``no_sync``, Megatron's one reduction per step).
    PyTorch's `retain_graph` and `create_graph` are taken to be refused when
    true: the walk frees each node's saved tensors as it goes, and its
    gradients are not recorded (no gradient of a gradient); its `inputs` when
    given (spmdsim.base.foreign): every leaf's ``.grad`` is filled.
    `reduce_with`: a spmdsim.nn.distrib_optim.DistributedAdamW. ZeRO-2's (``shard_grads=True``): its buckets this
    backward reduces as soon as the walk has given every member its last gradient (this is the last backward
    before the step to add to the parameters it reaches: `_walk_reducing`); ZeRO-1's: each parameter's gradient
    goes into its main gradient (``Leaf.main``, a view of the optimizer's gradient buffer) as soon as the walk
    has given it, not at the walk's end, so the walk never holds every gradient beside that buffer.
    """
    if foreign:  # PyTorch's keywords, by habit: spmdsim's values pass
        take_foreign("backward", foreign, _PYTORCH_KEYWORDS)
    if explain is not None and not isinstance(explain, list) or retain_graph is not None \
            and retain_graph is not False or create_graph is not False and create_graph is not None:
        _refuse_options(explain, retain_graph, create_graph)
    cap = _bucket_cap(bucket)
    if reduce_with is not None and not hasattr(reduce_with, "_walk_groups"):
        raise OperatorError(f"backward(reduce_with=...): expected a DistributedAdamW (ZeRO-1 or ZeRO-2), "
                            f"got an object of type {type(reduce_with).__name__}")
    kept = () if keep_pending is None or type(keep_pending) is tuple and not keep_pending else \
        kept_leaves(keep_pending)  # (never the truth of a DTensor: a collective)
    context = current()
    was, context.phase = context.phase, "backward"  # the rules' products, for spmdsim.base.flops
    try:
        _backward(loss, explain, cap, gradient, kept, reduce_with)
    finally:
        context.phase = was


def backward_kept(loss: Any, gradient: Any, kept: set, reduce_with: Any = None) -> None:
    """``backward(loss, gradient=gradient, keep_pending=params)`` where `kept` is ``kept_leaves(params)``, made
    once for many backwards: a pipeline stage's microbatches (spmdsim.models.gpt.pipeline) keep the same parameters
    pending every microbatch, so their entries are checked once a step, not once a microbatch.
    `reduce_with` as `backward`'s (a stage's last microbatch's backward of a chunk under ZeRO-2)."""
    context = current()
    was, context.phase = context.phase, "backward"  # the rules' products, for spmdsim.base.flops
    try:
        _backward(loss, None, 0, gradient, kept, reduce_with)
    finally:
        context.phase = was


def _backward(loss: Any, explain: Optional[list], cap: float, gradient: Any, kept: Any,
              reduce_with: Any = None) -> None:
    """`backward`'s walk (`cap`: `_bucket_cap`'s; `kept`: `kept_leaves`', or (); `reduce_with`: `backward`'s)."""
    DTensor = (_moves._RUNTIME or _runtime())[0]
    if type(loss) is not DTensor or type(loss._ag) is not Node or not (
            gradient is None and loss._shape == _SCALAR or type(gradient) is DTensor and gradient._shape == loss._shape
            and gradient._layout.layout is loss._layout.layout):  # else (most calls) nothing to refuse
        _check_loss(loss, gradient)
    node = loss._ag
    order = _topological(node)
    if order[-1].seq < _Mode.step_seq:  # a node recorded before this thread's last step (never a normal step's)
        _refuse_stale(order)
    layout = loss._layout
    if gradient is None:
        # d loss / d loss = 1, whole: a pending loss's every addend gets all of it.
        ones = buffers.fresh(np.ones(loss.local.shape, loss.dtype), 1)  # filled again by a replay
        gradient = DTensor(loss.mesh, ones, with_partial(layout, ()), loss.global_shape)
    if gradient._layout is not layout or layout.partial:  # `_take`'s move of the loss's gradient (a node's)
        target = grad_layout(layout, gradient._layout)
        if gradient._layout is not target:
            gradient = _move(gradient, target)
    grads: dict = {node: gradient}
    owners: dict = {}  # Node/Leaf -> its tensor's layout where its gradient's is not it (see `_walk`)
    readers: dict = {}  # with an explanation: leaf -> the forward steps that read it
    if reduce_with is None:
        _walk(order, grads, owners, explain, readers)
    else:
        _walk_reducing(order, grads, owners, explain, readers, kept, reduce_with)
    # What the walk leaves in `grads` are the leaves', in first-contribution order (the same on every rank).
    _resolve_leaves(list(grads), grads, owners, kept, cap, explain, readers)


def _walk(order: list, grads: dict, owners: dict, explain: Optional[list] = None, readers: Any = None) -> None:
    """Run each node's backward of `order` (latest first) on its output's gradient in `grads` (popped), freeing
    the node, and add the gradients it gives its inputs to `grads` (`_take`); `owners` notes the layout of the
    tensor of each whose gradient is not laid out by that very object (`_take` notes every one's). `explain`, `readers`:
    as `backward`'s, the steps and the leaves' readers noted there."""
    if explain is not None or _flops._BLOCKS:  # (a counter opens and closes outside the walk, as `any_open`'s)
        _walk_noted(order, grads, owners, explain, readers)
        return
    cached, capture = _moves._GRAD_BY_OBJECT.get, buffers.CAPTURE
    for node in order:
        dy = grads.pop(node, None)
        run, inputs = node.backward, node.inputs
        node.backward, node.inputs = None, ()  # freed: saved tensors go with it
        if dy is None:
            continue
        want = node.want
        if node.low is not None or want is not None and (dy._layout is not want or want.partial):
            dy = _prepared(node, dy, run, inputs)  # else (most nodes) `dy` as it is: _prepared's answer
        # `_take`, written out here without its frame and its counter's test per input (a node a call)
        for tensor, g in zip(inputs, run(dy)):
            if g is None or tensor is None:
                continue
            key = tensor._ag
            if key is None:
                continue
            layout = tensor._layout
            if g._layout is not layout or layout.partial:  # else (most gradients) grad_layout's answer is `layout`
                g_layout = g._layout
                # A gradient that stays as it is (most of these: a parameter's, pending over dp) is known by the
                # mark its layout object carries (TensorLayout._grad_of, set below): one attribute read.
                if g_layout._grad_of is not layout:
                    # grad_layout's look-up written out (its answer for these two layout objects, when it has
                    # one; an entry holds both objects, so no other object has their ids while it is there),
                    # with whether `g` moves there (`_move`'s test, kept in the entry: no layout compared again)
                    seen = cached((id(layout), id(g_layout)))
                    if seen is None:
                        grad_layout(layout, g_layout)  # (its entry made)
                        seen = cached((id(layout), id(g_layout)))
                    if seen[3]:
                        g = (_moves._REDISTRIBUTE or _redistribute())(g, seen[2])
                    else:  # kept as it is, as every gradient laid out `g_layout` of a tensor laid out `layout`
                        _set_attribute(g_layout, "_grad_of", layout)
                if key not in owners:
                    owners[key] = layout
            # Else `g` is laid out by `layout` itself, and so is their sum while every addend is: `owners` notes
            # a tensor's layout only where an addend took another (its sum's layout object then is another).
            have = grads.get(key)
            if have is None:
                grads[key] = g
            elif have._layout is g._layout and not capture.on and not _flops._OPEN and not have._mesh.engine.dry \
                    and type(total := have._local + g._local) is _ndarray:
                # add_grads' usual case written out (one layout object, an eager step no counter counts, an ndarray
                # sum): their sum's DTensor built here, as add_grads builds it (else its call, which adds again)
                out = _new_object(type(have))
                out._mesh, out._local, out._layout, out._shape, out._ag = \
                    have._mesh, total, have._layout, have._shape, None
                grads[key] = out
            else:
                grads[key] = add_grads(have, g, g._layout)


def _walk_reducing(order: list, grads: dict, owners: dict, explain: Optional[list], readers: Any, kept: Any,
                   reducer: Any) -> None:
    """`_walk`, stopping where a bucket of `reducer` (a ZeRO-2 DistributedAdamW) has its members' last gradients:
    after the last node of `order` that reads any of them (the members this walk reaches; those an earlier walk
    of the step finished are in ``.grad`` already). There the members' gradients go into ``.grad`` as the walk's
    end puts them (`_resolve_leaves`: added to what earlier microbatches left, kept pending) and the reducer
    reduce-scatters the bucket and frees them (`reducer._bucket_ready(k, grads)`, `grads` the walk's gradients
    then, for a memory look; after them ``reducer._stopped(grads)``, ZeRO-1's look). Several buckets ready at one
    node go in the reducer's order. Every rank of a dp
    group walks the same graph, so each stops at the same nodes and reduces the same buckets in the same order.
    The leaves of `reducer`'s buckets this walk reaches are its last gradients' (`reducer._reached`). A kept leaf
    with a main gradient (ZeRO-0's and ZeRO-1's buffers) that several nodes read (a tied table) also has the walk
    stop after each of its readers but the last, its gradient so far added into that main gradient there, so the
    walk never holds it beside the buffer (Megatron's main_grad, into which each use's weight gradient goes)."""
    groups = reducer._walk_groups()  # [(bucket index, its members' leaves not yet final)], in bucket order
    wanted = set(chain.from_iterable(leaves for _, leaves in groups))
    last: dict = {}  # leaf -> the position in `order` of the last node reading it
    early: dict = {}  # position -> kept leaves with a main gradient that a later node of `order` reads again
    for i, node in enumerate(order):
        for t in node.inputs:
            a = getattr(t, "_ag", None)
            if a is not None and a in wanted:
                j = last.get(a)
                if j is not None and j != i and a.main is not None and id(a) in kept:
                    early.setdefault(j, []).append(a)
                last[a] = i
    stops: dict = {}  # position -> the buckets ready after its node, in bucket order
    for k, leaves in groups:
        if leaves and all(map(last.__contains__, leaves)):
            stops.setdefault(max(map(last.__getitem__, leaves)), []).append((k, leaves))
    start = 0
    stopped = reducer._stopped  # called at each stop once its gradients went into .grad (a memory look)
    for at in sorted(stops.keys() | early.keys()):
        _walk(order[start:at + 1], grads, owners, explain, readers)
        start = at + 1
        # A parameter read twice (a tied table: the head, then the embedding) has its gradient so far put into
        # its main gradient here, as Megatron's fused weight-gradient kernels add each use's into main_grad: the
        # walk does not hold it beside the buffer until its last reader's backward. (Kept pending: `_resolve_leaves`'
        # `_into_grads`, not counted by spmdsim.base.flops: the leaf's one accumulation a backward is its
        # last reader's.)
        here = [leaf for leaf in early.get(at, ()) if leaf in grads]
        if here:
            gs = list(map(grads.pop, here))
            _into_grads(here, gs, list(map(owners.get, here, map(_LAYOUT, gs))), False)
        for k, leaves in stops.get(at, ()):
            here = [leaf for leaf in leaves if leaf in grads]
            if here:
                _resolve_leaves(here, grads, owners, kept, 0, explain, readers)
            reducer._bucket_ready(k, grads)
        stopped(grads)
    _walk(order[start:], grads, owners, explain, readers)
    reducer._reached(last)


def _walk_noted(order: list, grads: dict, owners: dict, explain: Optional[list], readers: Any) -> None:
    """`_walk` with an explanation or under a counter that records blocks (the estimate's dry run): each node's
    step by `_explained`, or by `_take`, which marks the leaves' gradient blocks as held."""
    for node in order:
        dy = grads.pop(node, None)
        run, inputs = node.backward, node.inputs
        node.backward, node.inputs = None, ()  # freed: saved tensors go with it
        if dy is None:
            continue
        if explain is not None:
            _explained(node, dy, run, inputs, grads, owners, explain, readers)
        else:
            _take(grads, owners, inputs, run(_prepared(node, dy, run, inputs)))


def _explained(node: Node, dy: Any, run: Any, inputs: tuple, grads: dict, owners: dict, explain: list,
               readers: dict) -> None:
    """`_walk`'s step of `node` with an explanation: its collectives (and its gradients' moves) as one entry of
    `explain`, and the node's step noted among the readers of the leaves it read."""
    with _collector(explain) as trace:
        _take(grads, owners, inputs, run(_prepared(node, dy, run, inputs)))
    step = node.describe()
    explain.append((step, trace.entries))
    short = step.split(":")[0]  # "matmul MatMul1", without the plan's reasons
    for t in inputs:
        if t is not None and isinstance(t._ag, Leaf):
            names = readers.setdefault(t._ag, [])
            if short not in names:
                names.append(short)


def kept_leaves(keep_pending: Any) -> set:
    """The ids of the leaves `backward(keep_pending=...)` names, or the error every rank raises alike (before
    any collective): iterated as it comes, one DTensor would give its rows (each a new tensor, no leaf), and
    skipping what is not a leaf would sum the gradients named at once without a word."""
    if hasattr(keep_pending, "_ag") or isinstance(keep_pending, (str, bytes)) \
            or not hasattr(keep_pending, "__iter__"):
        raise OperatorError(f"backward(keep_pending=...): expected an iterable of parameters (a list, "
                            f"optimizer.params), got {_described(keep_pending)}; one parameter goes in a list: "
                            "keep_pending=[p]")
    items = keep_pending if type(keep_pending) is list or type(keep_pending) is tuple else list(keep_pending)
    leaves = list(map(getattr, items, _AG, _NONE))
    if all(map(_IS_LEAF, leaves)) and all(map(hasattr, items, _GLOBAL_SHAPE)):  # checked in C (a microbatch each)
        return set(map(id, leaves))
    for i, (t, leaf) in enumerate(zip(items, leaves)):
        if not isinstance(leaf, Leaf) or not hasattr(t, "global_shape"):
            raise OperatorError(f"backward(keep_pending=...): entry {i} is {_described(t)}; expected a leaf "
                                "DTensor with requires_grad_() (a parameter)")
    raise AssertionError("internal: a refused entry not found")  # pragma: no cover - the test above found one


def gradients(out: Any, dy: Any, wrt: tuple) -> tuple:
    """The gradients of the tensors `wrt` (each a leaf of the graph that made `out`) for `out`'s gradient
    `dy`, walking and freeing that graph; each stays a pending sum where it is one (nothing is resolved
    and no ``.grad`` is set: the caller, a recomputed region's node, hands them on to the walk it runs
    in). A leaf of the graph that is not among `wrt` is refused: its gradient would be lost."""
    grads: dict = {}
    owners: dict = {}
    _take(grads, owners, (out,), (dy,))  # `out` itself is no leaf to report
    _walk(_topological(out._ag), grads, owners)
    wanted = {id(t._ag) for t in wrt if t is not None and t._ag is not None}
    lost = [leaf for leaf in grads if type(leaf) is Leaf and id(leaf) not in wanted]  # (the walk leaves leaves)
    if lost:
        g = grads[lost[0]]
        layout = owners.get(lost[0], g._layout)
        raise OperatorError(f"a recomputed region read a tensor requiring grad that it was not given "
                            f"(global shape {tuple(g._shape)!r}, layout {layout}); pass every "
                            "parameter it reads among its inputs")
    return tuple(None if t is None or t._ag is None else grads.get(t._ag) for t in wrt)


def reduce_grads(tensors: Any, bucket: Any = True, watch: Any = None) -> None:
    """Sum the pending gradients `backward(keep_pending=...)` left in these leaves' ``.grad`` (collective).

    Every rank passes the same tensors in the same order; those whose gradient is whole (or None) are
    left alone. `bucket` as `backward`'s: the gradients pending over the same axes share one Allreduce.
    `watch`: called as each bucket's flat block is made (before its Allreduce), and as a leaf summed alone is
    summed, with every gradient block the rank holds then (a memory look: spmdsim.models.gpt.train's), or None.
    """
    cap = _bucket_cap(bucket)
    items = tensors if type(tensors) is list or type(tensors) is tuple else list(tensors)
    found = list(map(getattr, items, _AG, _NONE))
    if all(map(_IS_LEAF, found)) and not any(map(is_, map(_GRAD, found), _NONE)):
        # (a pipeline stage's every parameter, once a step: its leaves and their pending ones found by maps in C)
        pending = list(map(bool, map(_GRAD_PARTIAL, found)))
        leaves, own = list(compress(found, pending)), list(map(_LAYOUT, compress(items, pending)))
    else:
        leaves, own = [], []
        for t, leaf in zip(items, found):
            if isinstance(leaf, Leaf) and leaf.grad is not None and leaf.grad.layout.partial:
                leaves.append(leaf)
                own.append(t._layout)
    gs = list(map(_GRAD, leaves))
    plan = _leaf_plan(leaves, gs, own, None, cap)
    wholes = _whole_grads(plan, leaves, gs, watch, True)  # (no leaf kept: every one, in order)
    list(map(setattr, leaves, _GRAD_NAME, wholes))


_set_attribute = object.__setattr__  # (a frozen TensorLayout's mark: `_walk`)


def _prepared(node: Node, dy: Any, run: Any = None, inputs: tuple = ()) -> Any:
    """`dy` in the layout the node's backward wants, keeping the pending sums it can pass (`run`, `inputs`:
    the node's backward and inputs, which the walk has taken from it).

    A bfloat16 activation's gradient (float32, summed over its consumers) is rounded once to bfloat16 here
    and handed on widened: the rule computes in float32 (spmdsim.base.precision). The value rounded is the whole
    one, as the single-process reference rounds it: a pending sum is summed over its ranks first (float32,
    one Allreduce, where Megatron's column-parallel backward sums its input's gradient), except through a
    move, whose backward (a Reduce_scatter with sp) sums it on its way to the next node, which rounds it.
    A node made from parameters alone (a parameter reshaped) leaves it as it is: a parameter's gradient
    stays float32 (Megatron's main_grad)."""
    want = node.want
    if want is not None:
        partial = dy._layout.partial
        if not partial and not want.partial:  # nothing pending to pass (most nodes): `want` itself
            target = want
        else:
            used = used_axes(node.reads)
            target = with_partial(want, tuple(a for a in partial if a not in used))
        if dy._layout is not target and dy._layout != target:
            dy = _move(dy, target)
    if node.low is None or run is _passed and dy.layout.partial or _of_parameters(inputs):
        return dy
    if dy.layout.partial:
        dy = _move(dy, with_partial(dy.layout, ()))
    rounded = dy.mesh.engine.local(_rounded_wide, buffers.broadcast_zero(dy.local.shape, _F32), dy.local, node.low)
    return type(dy)._trusted(dy.mesh, rounded, dy.layout, dy.global_shape)
