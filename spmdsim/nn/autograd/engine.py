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

import contextlib
from itertools import chain, compress, count, repeat, tee
import math
import sys
from operator import attrgetter, eq, iadd, is_, not_
from typing import Any, Optional

import numpy as np

from ...base import buffers
from ...base.context import current
from ...errors import OperatorError
from ...base import flops as _flops
from ...base.flops import any_open, hold, sweep
from ...layouts.layout import TensorLayout
from .graph import Leaf, Node, _Mode, _passed, stale_reads, used_axes, with_partial

__all__ = ["backward", "backward_kept", "kept_leaves", "reduce_grads", "gradients", "grad_layout", "add_grads"]


def backward(loss: Any, explain: Optional[list] = None, bucket: Any = False, gradient: Any = None,
             keep_pending: Any = (), retain_graph: Any = None, create_graph: Any = False,
             reduce_with: Any = None) -> None:
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
    gradients are not recorded (no gradient of a gradient).
    `reduce_with`: a spmdsim.nn.distrib_optim.DistributedAdamW. ZeRO-2's (``shard_grads=True``): its buckets this
    backward reduces as soon as the walk has given every member its last gradient (this is the last backward
    before the step to add to the parameters it reaches: `_walk_reducing`); ZeRO-1's: each parameter's gradient
    goes into its main gradient (``Leaf.main``, a view of the optimizer's gradient buffer) as soon as the walk
    has given it, not at the walk's end, so the walk never holds every gradient beside that buffer.
    """
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
    pending every microbatch, so their entries are checked once a step, not once a microbatch (issue 58).
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
    DTensor = (_RUNTIME or _runtime())[0]
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
    tensor of each whose gradient is not laid out by that very object (`_take` notes every one's). `explain`, `readers`: as `backward`'s, the steps and the leaves' readers noted there."""
    if explain is not None or _flops._BLOCKS:  # (a counter opens and closes outside the walk, as `any_open`'s)
        _walk_noted(order, grads, owners, explain, readers)
        return
    cached, capture = _GRAD_BY_OBJECT.get, buffers.CAPTURE
    for node in order:
        dy = grads.pop(node, None)
        run, inputs = node.backward, node.inputs
        node.backward, node.inputs = None, ()  # freed: saved tensors go with it
        if dy is None:
            continue
        want = node.want
        if node.low is not None or want is not None and (dy._layout is not want or want.partial):
            dy = _prepared(node, dy, run, inputs)  # else (most nodes) `dy` as it is: _prepared's answer
        # `_take`, written out here without its frame and its counter's test per input (a node a call: issue 58)
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
                        g = (_REDISTRIBUTE or _redistribute())(g, seen[2])
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
        # `_into_grads`, not counted by spmdsim.base.flops: the leaf's one accumulation a backward is its last reader's.)
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


def _resolve_leaves(leaves: list, grads: dict, owners: dict, kept: Any, cap: float, explain: Optional[list],
                    readers: dict) -> None:
    """The walk's end: each leaf's gradient (in `grads`; its tensor's layout in `owners`, else the gradient's own
    layout object, as `_walk` keeps them) added into ``.grad``, in `leaves`' order (first contribution: the same
    on every rank); left pending for the leaves in `kept` (their ids), else its replicas' parts summed (in
    buckets when `cap` is not 0), as its `_LeafPlan` says."""
    gs = list(map(grads.pop, leaves))
    own = tuple(map(owners.get, leaves, map(_LAYOUT, gs)))
    plan = _leaf_plan(leaves, gs, own, kept, cap)
    counting = any_open()  # `_count_accumulation`'s test, once (a counter opens and closes outside the walk)
    if plan.kept:  # their gradients as they are
        kept = plan.kept
        _into_grads(list(map(leaves.__getitem__, kept)), list(map(gs.__getitem__, kept)),
                    list(map(own.__getitem__, kept)), counting)
    if plan.positions:  # the others' whole
        wholes = _whole_grads(plan, leaves, gs) if explain is None else \
            [g for _, g, _ in _wholes(plan, leaves, gs, own, explain, readers)]
        _into_grads(list(map(leaves.__getitem__, plan.positions)), wholes, plan.wholes, counting)


def _into_grads(kl: list, kg: list, layouts: list, counting: bool) -> None:
    """Add the gradients `kg` into the ``.grad`` of the leaves `kl` (`layouts`: the layout each sum takes,
    `add_grads`'): a microbatch's backward under ``keep_pending`` adds ~17 a pipeline stage's microbatch
    (issue 58). Each into its ``.grad``'s block in place where `_added_into`'s conditions hold: here tested for
    all of them at once in C (a map per condition, no Python per leaf), the leaves whose blocks own their
    memory; the others (a placed or viewed block, a ``.grad`` held elsewhere) as `_added_into` decides one by
    one, else `add_grads`. The first backward after ``zero_grad`` sets each ``.grad`` to its gradient. A leaf with
    a main gradient (``Leaf.main``: a view of an optimizer's gradient buffer) takes its gradient there
    (`_into_main`)."""
    if counting:
        for g in kg:
            _count_accumulation(g)
    if not all(map(is_, map(_MAIN, kl), _NONE)):  # (one map in C; none of them most backwards)
        rest = [i for i, leaf, g in zip(range(len(kl)), kl, kg) if leaf.main is None or not _into_main(leaf, g)]
        if not rest:
            return
        kl, kg, layouts = [kl[i] for i in rest], [kg[i] for i in rest], [layouts[i] for i in rest]
    haves = list(map(_GRAD, kl))
    n = len(kl)
    if all(map(is_, haves, _NONE)):  # the first backward since zero_grad: each .grad is its gradient
        # (`is`, mapped: list.count and `in` would call a DTensor's __eq__, an operator)
        list(map(setattr, kl, _GRAD_NAME, kg))
        return
    rest = range(n)
    if not any(map(is_, haves, _NONE)) and not buffers.CAPTURE.on and not kg[0]._mesh.engine.dry:
        xs, ys = list(map(_LOCAL, haves)), list(map(_LOCAL, kg))
        if all(map(is_, map(type, chain(xs, ys)), _NDARRAY)):
            sole = list(map(_SOLE_MAPPED.__eq__, zip(
                map(is_, map(_LAYOUT, haves), map(_LAYOUT, kg)), map(_refs, haves), map(_refs, xs),
                map(is_, map(_BASE, xs), _NONE), map(_CARRAY, xs), map(is_, map(_DTYPE_OF, xs), map(_DTYPE_OF, ys)))))
            done = sole.count(True)
            if done == n:
                list(map(iadd, xs, ys))
                return
            if done:
                list(map(iadd, compress(xs, sole), compress(ys, sole)))
                rest = list(compress(rest, map(not_, sole)))
        haves = xs = ys = None  # (their references would count as other holders in `_added_into`)
    for i in rest:
        leaf, g = kl[i], kg[i]
        if leaf.grad is None:
            leaf.grad = g
        elif not _added_into(leaf, g):
            leaf.grad = add_grads(leaf.grad, g, layouts[i], None)


def _into_main(leaf: Leaf, g: Any) -> bool:
    """Whether `g`, a gradient of `leaf`, went into its main gradient (``leaf.main``, a view of an optimizer's flat
    gradient buffer: Megatron's main_grad), ``leaf.grad`` then a DTensor of that view: copied there when
    ``.grad`` is None (the first backward since the step, whose buffer holds other values: the gathered
    parameters), else added in place (``main += g``: the ufunc and operands of `add_grads`' ``a + b``, so the same
    bits) when ``.grad`` is that view in `g`'s layout, else their sum (`add_grads`, its layout) copied there. So
    the gradient is held once, in the buffer, from the first microbatch on (no block of its own beside the
    buffer the optimizer packs it into). False (nothing done) for a `g` of another shape or dtype than the view.
    A dry run writes nothing (its buffer is the dry engine's zeros); a captured step records the copy or the sum
    as a kernel (spmdsim.runtime.replay), which a replay reruns into the same view."""
    view = leaf.main
    block = g._local if not buffers.CAPTURE.on else g.local
    if block.shape != view.shape or block.dtype != view.dtype:
        return False
    have = leaf.grad
    dry = g._mesh.engine.dry
    if have is None:
        if not dry:
            _main_kernel(_copy_main)(view, block)
        leaf.grad = type(g)._trusted(g._mesh, view, g._layout, g._shape)
        return True
    if have._local is view and (have._layout is g._layout or have._layout == g._layout):
        if not dry:
            _main_kernel(_add_main)(view, block)
        return True
    total = add_grads(have, g, g._layout, None)  # laid out otherwise, or a .grad set elsewhere: their sum
    if not dry:
        _main_kernel(_copy_main)(view, total._local if not buffers.CAPTURE.on else total.local)
    leaf.grad = type(total)._trusted(total._mesh, view, total._layout, total._shape)
    return True


def _copy_main(view: np.ndarray, block: np.ndarray) -> None:
    np.copyto(view, block)


def _add_main(view: np.ndarray, block: np.ndarray) -> None:
    np.add(view, block, out=view)


def _main_kernel(func: Any) -> Any:
    """`func` itself, or while this thread captures a step its recorded kernel (spmdsim.runtime.replay)."""
    if not buffers.CAPTURE.on:
        return func
    from ...runtime.replay import kernel

    return kernel(func)


def _added_into(leaf: Leaf, g: Any) -> bool:
    """Whether `g` was added into the block of ``leaf.grad`` in place (``leaf.grad += g``: the same ufunc on
    the same operands in the same order as `add_grads`' ``a + b``, so the same bits, without a new block and a
    new DTensor per leaf and microbatch). Only where nothing else can see that block: ``leaf.grad`` held by the
    leaf alone (no caller kept the DTensor of an earlier backward, whose values would change under it), its
    block held by that DTensor alone and owning its memory (or the sole view of a placed buffer,
    spmdsim.base.buffers), so no other tensor's block (a gradient handed to two inputs, a bucket's flat Allreduce, a
    view) shares it; writeable and C-contiguous, of `g`'s layout, shape and dtype. Never while a step is
    captured (the capture records `add_grads`' new block) nor in a dry run (whose engine adds nothing)."""
    have = leaf.grad
    if have._layout is not g._layout or buffers.CAPTURE.on or _refs(have) != _SOLE[0]:
        return False
    x, y = have._local, g._local
    if type(x) is not _ndarray or type(y) is not _ndarray or _refs(x) != _SOLE[1] or not x.flags.carray \
            or x.shape != y.shape or x.dtype != y.dtype or have._mesh.engine.dry:
        return False
    base = x.base
    if base is not None and (type(base) is not _ndarray or base.base is not None or _refs(base) != _SOLE[1]):
        return False
    x += y
    return True


_refs, _ndarray = sys.getrefcount, np.ndarray
_MAIN = attrgetter("main")
_GRAD_NAME, _NDARRAY = repeat("grad"), repeat(np.ndarray)
_BASE, _CARRAY, _DTYPE_OF = attrgetter("base"), attrgetter("flags.carray"), attrgetter("dtype")


class _Probe:
    __slots__ = ("_local",)


def _sole_counts() -> tuple:
    """The reference counts `_added_into` reads of a DTensor held by a leaf's slot alone and of a block held
    by that DTensor alone, its frame's own references included; and those `_add_kept` reads through its lists
    (`_SOLE_MAPPED`'s). Measured on this interpreter, as those functions take them, not assumed."""
    leaf = Leaf()
    leaf.grad = _Probe()
    leaf.grad._local = object()
    have = leaf.grad
    x = have._local
    single = _refs(have), _refs(x)
    have = x = None
    haves = list(map(_GRAD, [leaf]))
    xs = list(map(_LOCAL, haves))
    mapped = next(zip(map(_refs, haves), map(_refs, xs)))
    return single, mapped




def _refuse_options(explain: Any, retain_graph: Any, create_graph: Any) -> None:
    """The one-line refusal of `backward`'s `explain` that is no list, or of PyTorch's `retain_graph` or
    `create_graph` asked for (alike on every rank: the arguments are the program's)."""
    if explain is not None and not isinstance(explain, list):
        hint = "; PyTorch's second argument, retain_graph, is spmdsim's explain" if isinstance(explain, bool) else ""
        raise OperatorError(f"backward(explain={explain!r}): expected a list (it receives each answered step's "
                            f"collectives) or None{hint}")
    if retain_graph is not None and retain_graph is not False:
        raise OperatorError(f"backward(retain_graph={retain_graph!r}): not taken; the walk frees each node's saved "
                            "tensors as it goes. Run the forward again for another backward, or add the losses and "
                            "call backward() once: (loss1 + loss2).backward()")
    if create_graph is not False and create_graph is not None:
        raise OperatorError(f"backward(create_graph={create_graph!r}): not taken; the backward records no graph "
                            "of its own (no gradient of a gradient)")


def _refuse_stale(order: list) -> None:
    """Refuse, on every rank alike before any collective, a walk whose graph read a parameter before an optimizer
    step changed its block in place: its rules would read the new values where the forward read the old ones (a
    wrong gradient, without a word; PyTorch's version counter refuses it too)."""
    found = stale_reads(order)
    if found is not None:
        node, t = found
        raise OperatorError(
            f"backward through a graph recorded before an optimizer step changed a parameter it reads in place: "
            f"{node.describe().split(':')[0]!r} read the parameter of global shape {tuple(t.global_shape)!r}, "
            f"layout {t.layout}, whose values are now the step's; run the forward again after step() (or call "
            "backward() before step())")


def kept_leaves(keep_pending: Any) -> set:
    """The ids of the leaves `backward(keep_pending=...)` names, or the error every rank raises alike (before
    any collective). One DTensor was iterated by rows (each a new tensor, no leaf) and anything that is not a
    leaf was skipped, so the gradients named were summed at once without a word."""
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


_IS_LEAF, _GLOBAL_SHAPE = Leaf.__instancecheck__, repeat("global_shape")


def _described(value: Any) -> str:
    """`value` as every rank describes it alike (a DTensor's repr names this rank and its block)."""
    if hasattr(value, "_ag") and hasattr(value, "global_shape"):
        kind = "a leaf" if isinstance(value._ag, Leaf) else "without requires_grad_()" if value._ag is None \
            else "computed by an op"
        return f"a DTensor of global shape {tuple(value.global_shape)!r} ({kind})"
    return f"an object of type {type(value).__name__}"


def _count_accumulation(g: Any) -> None:
    """Count (spmdsim.base.flops.sweep) a leaf's gradient added into its ``.grad``: on every backward, the first
    too (as a framework accumulates into a zeroed main gradient, Megatron's main_grad += grad), so each
    microbatch's backward counts alike."""
    if any_open():  # else nothing would be counted: no blocks to gather
        sweep("add", (g.local, g.local), (g.local,), "grads")


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


def _bucket_cap(bucket: Any) -> float:
    """`backward`'s `bucket` as a byte cap (0: no buckets, inf: no cap), or the error every rank raises."""
    if bucket is False or bucket is None:
        return 0
    if bucket is True:
        return math.inf
    if type(bucket) is int and bucket > 0:
        return bucket
    raise OperatorError(f"bucket {bucket!r} must be True, False or a positive number of bytes "
                        "(each bucket's cap, e.g. 25 << 20)")


class _LeafPlan:
    """What the walk's end does with its leaves' gradients (`_leaf_plan`), by their positions in the walk's
    leaf order: `kept`, the positions of the leaves kept pending; `steps`, (position, the layout its whole
    gradient takes, its bucket's index or -1) for each other leaf, in order; `positions` and `wholes`, those
    steps' positions and layouts as two lists; `actions`, what makes them whole, in order: (a bucket's index,
    its first member's step, that layout) where its one Allreduce is made, (-1, a step, its layout) for a leaf
    whose gradient moves alone (not one already whole: nothing to do); `buckets`, each `_BucketPlan`. `held`:
    the layouts and dtypes whose ids its key holds (alive as long as it is, so no other object takes their
    ids)."""

    __slots__ = ("kept", "steps", "positions", "wholes", "actions", "buckets", "held")


class _BucketPlan:
    """Leaves whose gradients share one Allreduce: `positions`, in leaf order; `slots`, their steps (indices
    into `_LeafPlan.steps`); `slices`, the part of the summed flat block each takes; `shapes`, their blocks'
    shapes; `layouts`, their whole gradients' layouts; `global_shapes`, theirs (five lists, one entry a
    member: `_bucket_sum` maps over them in C)."""

    __slots__ = ("positions", "slots", "slices", "shapes", "layouts", "global_shapes")


def _leaf_plan(leaves: list, gs: list, own: Any, kept: Any, cap: float) -> _LeafPlan:
    """The `_LeafPlan` of leaves whose gradients are `gs` (`own`: the leaves' tensors' layouts), `kept` (the ids of
    those kept pending, or None) and the bucket cap (0: no buckets). It depends on nothing else: the gradients'
    layouts, meshes, dtypes and shapes, the tensors' layouts, which are kept, the cap, all in leaf order, so
    a step that walks the same parameters again takes the plan made for the first (a dict look-up keyed in C;
    the ranks' threads share the table)."""
    # (one tuple, made by one chain of maps in C; the objects whose ids it holds are kept only by a new plan)
    key = (cap, tuple(map(kept.__contains__, map(id, leaves))) if kept else None, *map(id, chain(
        map(_LAYOUT, gs), own, map(_DTYPE, gs), map(_MESH, gs))), *map(_SHAPE, gs), *map(_BLOCK_SHAPE, gs))
    plan = _PLANS.get(key)
    if plan is None:
        own = tuple(own)
        plan = _new_leaf_plan(gs, own, key[1], cap)
        plan.held = (tuple(map(_LAYOUT, gs)), own, tuple(map(_DTYPE, gs)))
        if len(_PLANS) >= 256:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


_PLANS: dict = {}  # `_leaf_plan`'s key -> its _LeafPlan


def _new_leaf_plan(gs: list, own: tuple, kept: Optional[tuple], cap: float) -> _LeafPlan:
    """`_leaf_plan`'s plan, worked out (`own`: the tensors' layouts; `kept`: whether each is kept, or None).

    A bucket groups gradients of one mesh and dtype pending over the same axes with the leaf's own tensor
    map, in leaf order, while the bytes of their shards stay within `cap` (a rank's; the largest shard where
    shards differ); two or more share one call, in the order of their first leaf. Every rank groups alike: the
    layouts and shapes decide."""
    plan = _LeafPlan()
    plan.kept = [i for i in range(len(gs)) if kept is not None and kept[i]]
    open_buckets: dict = {}
    made: list = []
    steps: list = []
    for i, g in enumerate(gs):
        if kept is not None and kept[i]:
            continue
        mine = own[i]
        steps.append([i, mine if not mine.partial else with_partial(mine, ()), None, len(steps)])
        layout = g._layout
        if not cap or not layout.partial or (layout.layout is not mine.layout and layout.layout != mine.layout) \
                or layout.tensor_map != mine.tensor_map:
            continue
        dtype = g._local.dtype  # the block's dtype (a captured step's traced view has the same)
        key = (id(g._mesh), layout.partial, dtype.str)
        size = math.prod(layout.max_local_shape(g._shape)) * dtype.itemsize
        current = open_buckets.get(key)
        if current is None or current[0] + size > cap:
            current = open_buckets[key] = [0, []]
            made.append(current)
        current[0] += size
        current[1].append(steps[-1])
    plan.buckets = []
    for _, members in made:
        if len(members) < 2:
            continue
        bucket, at = _BucketPlan(), 0
        bucket.positions, bucket.slots = [step[0] for step in members], [step[3] for step in members]
        bucket.slices, bucket.shapes, bucket.layouts, bucket.global_shapes = [], [], [], []
        for step in members:
            g = gs[step[0]]
            n = g._local.size  # its block (a captured step's traced view has the same shape)
            bucket.slices.append(slice(at, at + n))
            bucket.shapes.append(g._local.shape)
            bucket.layouts.append(with_partial(g._layout, ()))
            bucket.global_shapes.append(g._shape)
            at += n
            step[2] = len(plan.buckets)
        plan.buckets.append(bucket)
    plan.steps = [(i, whole, -1 if b is None else b) for i, whole, b, _ in steps]
    plan.positions, plan.wholes = [step[0] for step in plan.steps], [step[1] for step in plan.steps]
    plan.actions, met = [], set()
    for k, (i, whole, b) in enumerate(plan.steps):
        if b >= 0:
            if b not in met:
                met.add(b)
                plan.actions.append((b, k, whole))
        elif gs[i]._layout is not whole and gs[i]._layout != whole:  # else `_move` would hand it back as it is
            plan.actions.append((-1, k, whole))
    return plan


_LAYOUT, _DTYPE, _MESH, _SHAPE = attrgetter("_layout"), attrgetter("_local.dtype"), attrgetter("_mesh"), \
    attrgetter("_shape")
_BLOCK_SHAPE, _GRAD, _LOCAL = attrgetter("_local.shape"), attrgetter("grad"), attrgetter("_local")
_GRAD_PARTIAL = attrgetter("grad._layout.partial")
_SOLE, _MAPPED = _sole_counts()
#: What `_add_kept` asks of each kept leaf for an addition in place: its .grad's layout `g`'s, the .grad held
#: by the leaf alone, its block by the .grad alone and owning its memory, C-contiguous and writeable, of g's dtype.
_SOLE_MAPPED = (True, _MAPPED[0], _MAPPED[1], True, True, True)


def _whole_grads(plan: _LeafPlan, leaves: list, gs: list, watch: Any = None, in_grad: bool = False) -> list:
    """The whole gradient of each leaf `plan` does not keep pending (`plan.positions`' leaves, in order): its
    gradient moved to its whole layout, or its bucket's part (the bucket's one Allreduce made where its first
    leaf comes), or its gradient as it is where it is whole already; each bucket's parts put in place in C.
    A bucket's gradients are let go (their entries in `gs`, and with `in_grad`, `reduce_grads`', the leaves'
    ``.grad``, which hold them there: set again by the caller) once its flat block is made, a leaf's moved alone
    once moved: with buckets capped (`backward`'s `bucket` in bytes) the rank holds one bucket's gradients twice
    at a time, not every gradient beside the last bucket's flat block. `watch`: `reduce_grads`'. `_wholes` with
    an explanation."""
    out = list(map(gs.__getitem__, plan.positions))
    for b, k, whole in plan.actions:
        if b < 0:  # a leaf alone: its sum (in place where its block is the walk's alone), then its gradient let go
            i = plan.positions[k]
            # (its references counted here, where nothing but its lists, and the leaf's .grad, hold it)
            held, viewed, buffered = _alone_counts(out[k])
            sole = held == _ALONE[0] + 2 + in_grad and viewed == _ALONE[1] and buffered in (0, _ALONE[2])
            moved = _summed_alone(out[k], whole, sole)
            if watch is not None:
                watch([moved.local] + [g.local for g in chain(gs, out) if g is not None])
            out[k] = moved
            gs[i] = moved = None
            if in_grad:
                leaves[i].grad = None
        else:
            bucket = plan.buckets[b]

            def release(bucket: _BucketPlan = bucket) -> None:
                for i in bucket.positions:
                    gs[i] = None
                    if in_grad:
                        leaves[i].grad = None
                for slot in bucket.slots:
                    out[slot] = None

            list(map(out.__setitem__, bucket.slots, _bucket_sum(bucket, leaves, gs, None, None, release, watch, out)))
    return out


def _wholes(plan: _LeafPlan, leaves: list, gs: list, own: Any, explain: list, readers: dict) -> Any:
    """(leaf, its whole gradient, its layout) for each leaf `plan` does not keep pending, in order, as
    `_whole_grads` makes them (a leaf alone summed out of place here: the explanation's lists hold its block), an
    explanation's entry for each bucket and each leaf (moved or not) added to `explain`."""
    summed: list = [None] * len(plan.buckets)
    for i, whole, b in plan.steps:
        leaf = leaves[i]
        if b >= 0:
            done = summed[b]
            if done is None:
                bucket = plan.buckets[b]
                done = summed[b] = dict(zip(bucket.positions, _bucket_sum(bucket, leaves, gs, explain, readers)))
            yield leaf, done[i], whole
        else:
            with _collector(explain) as trace:
                g = _summed_alone(gs[i], whole, False)
            explain.append((f"leaf {tuple(gs[i]._shape)} {own[i]}: its replicas' "
                            f"gradients summed" + _read_by(readers, [leaf]), trace.entries))
            yield leaf, g, whole


def _summed_alone(g: Any, whole: TensorLayout, sole: bool) -> Any:
    """`g` moved to `whole`: where that is its pending sum alone (the same tensor map, replicated over the axes it
    was pending on), one Allreduce of its block labelled as a gradient bucket's (a gradient sum, as
    spmdsim.tools.estimate.ledger prices one), in place where `sole` (`_whole_grads` found nothing but its two lists,
    and with reduce_grads the leaf's ``.grad``, holding `g`, and nothing but `g` its block or the block's one
    buffer: `_alone_counts`; a captured step records it so): as a bucket's flat block is summed in place, so summing a
    leaf above the bucket cap needs no second block of its size. A dry run's (whose Allreduce moves nothing)
    always in place. Otherwise `_move`'s redistribution."""
    layout = g._layout
    if not layout.partial or whole.partial or layout.tensor_map != whole.tensor_map or (
            layout.layout is not whole.layout and layout.layout != whole.layout):
        return _move(g, whole)
    DTensor, executor = _RUNTIME or _runtime()
    mesh = g._mesh
    capture = buffers.CAPTURE.on
    block = g._local if not capture else g.local
    sole = sole or mesh.engine.dry
    summed = executor.resolve(mesh, block.reshape(-1), executor.pending(mesh.layout, 1, layout.partial),
                              "gradient bucket of 1 leaf", owned=sole)
    return DTensor._trusted(mesh, type(summed).reshape(summed, block.shape), whole, g._shape)


def _alone_counts(g: Any) -> tuple:
    """(the references to `g`, to its block, to the block's buffer; 0 for a block that owns its memory) as
    `_whole_grads` tests them: a block that is not a C-contiguous ndarray, or whose buffer is a view or not an
    ndarray, gives -1 for each (never `_ALONE`'s)."""
    x = g._local
    if type(x) is not _ndarray or not x.flags.carray:
        return -1, -1, -1
    base = x.base
    if base is None:
        return _refs(g), _refs(x), 0
    if type(base) is not _ndarray or base.base is not None:
        return -1, -1, -1
    return _refs(g), _refs(x), _refs(base)


def _alone_probe() -> tuple:
    """`_alone_counts`' answer for a gradient held by nothing but this frame's two lists (as `_whole_grads`' are)
    and a block that owns its buffer's one view, less the two lists: measured on this interpreter, not assumed."""
    probe = _Probe()
    raw = np.empty(16, np.uint8)
    probe._local = np.ndarray((2,), np.float64, raw, 0)
    raw = None
    out, gs = [probe], [probe]
    probe = None
    g, x, base = _alone_counts(out[0])
    return g - 2, x, base


_ALONE = _alone_probe()  # (references to a gradient beyond its holders, to its block, to the block's buffer)


def _bucket_sum(bucket: _BucketPlan, leaves: list, gs: list, explain: Optional[list], readers: dict,
                release: Any = None, watch: Any = None, out: Optional[list] = None) -> list:
    """The whole gradient of each leaf of `bucket`, in its order, from one Allreduce of their blocks; `release`
    (`_whole_grads`': its references to the bucket's gradients let go) called once their flat block is made,
    before the Allreduce, this frame's own references dropped too (without an explanation, which names them);
    `watch` (`reduce_grads`') shown first every gradient block held then: the flat, those in `gs` and in `out`
    (`_whole_grads`' list)."""
    DTensor, executor = _RUNTIME or _runtime()
    grads = list(map(gs.__getitem__, bucket.positions))
    first = grads[0]
    mesh, partial, n = first._mesh, first._layout.partial, len(grads)
    blocks = list(map(_LOCAL, grads)) if not buffers.CAPTURE.on else [g.local for g in grads]
    if mesh.engine.dry:  # the dry engine's zeros, not copied (spmdsim.runtime.sim.dry): never read or written
        like = buffers.broadcast_zero((sum(b.size for b in blocks),), np.result_type(*blocks))
        flat = mesh.engine.local(np.concatenate, like, [b.reshape(-1) for b in blocks])
    else:
        flat = np.concatenate(blocks, axis=None)  # each flattened in C order, no view made per block
    if watch is not None:
        watch([flat] + [g.local for g in chain(gs, out or ()) if g is not None])
    if explain is None:
        first = grads = blocks = None
        if release is not None:
            release()
    label = f"gradient bucket of {n} leaves"
    with _collector(explain) as trace:
        summed = executor.resolve(mesh, flat, executor.pending(mesh.layout, 1, partial), label, owned=True)
    if explain is not None:
        shapes = ", ".join(str(tuple(g.global_shape)) for g in grads)
        explain.append((f"{len(grads)} leaves {shapes}: their replicas' gradients summed in one "
                        "bucket" + _read_by(readers, [leaves[i] for i in bucket.positions]), trace.entries))
    # Each part shaped as its gradient's block (the array's own class's reshape: a captured step's traced
    # view stays one), and a DTensor of it, as DTensor._trusted makes one, each slot set by a map in C.
    blocks = list(map(type(summed).reshape, map(summed.__getitem__, bucket.slices), bucket.shapes))
    return _tensors(DTensor, mesh, blocks, bucket.layouts, bucket.global_shapes)  # (one mesh: theirs)


def _tensors(DTensor: type, mesh: Any, blocks: list, layouts: list, global_shapes: list) -> list:
    """``DTensor._trusted(mesh, block, layout, global_shape)`` for each of `blocks`, `layouts` and
    `global_shapes` (no checks: the bucket's plan shaped each block), made by maps in C: no Python per tensor."""
    made = list(map(_new_object, repeat(DTensor, len(blocks))))
    for name, values in zip(TENSOR_SLOTS, (repeat(mesh), blocks, layouts, global_shapes, _NONE)):
        list(map(setattr, made, repeat(name), values))
    return made


_new_object = object.__new__
_set_attribute = object.__setattr__  # (a frozen TensorLayout's mark: `_walk`)
#: The slots `_tensors` sets, as DTensor._trusted does (tests/test_autograd_accumulate.py checks DTensor's).
TENSOR_SLOTS = ("_mesh", "_local", "_layout", "_shape", "_ag")


def _read_by(readers: dict, leaves: list) -> str:
    """" (read by matmul MatMul1, ...)": the forward steps that read `leaves`, each once; "" if none."""
    names: list = []
    for leaf in leaves:
        names += [n for n in readers.get(leaf, ()) if n not in names]
    return f" (read by {', '.join(names)})" if names else ""


def _take(grads: dict, owners: dict, inputs: tuple, outs: tuple) -> None:
    """Add a node's input gradients `outs` to `grads`, each in the layout `grad_layout` keeps for its tensor
    (summed with one already there), noting its tensor's layout in `owners` at its first. Under a counter that
    records blocks (the estimate's dry run) each parameter's gradient block, as it comes, moved and summed, is
    marked as one the rank holds (spmdsim.base.flops.hold: the memory line counts the gradients)."""
    held = _flops._BLOCKS
    for tensor, g in zip(inputs, outs):
        if g is None or tensor is None:
            continue
        key = tensor._ag
        if key is None:
            continue
        layout = tensor._layout
        if g._layout is not layout or layout.partial:  # else (most gradients) grad_layout's answer is `layout`
            target = grad_layout(layout, g._layout)
            if g._layout is not target:
                g = _move(g, target)
        else:
            target = layout
        have = grads.get(key)
        leaf = held and type(key) is Leaf
        if leaf:
            hold(g.local)
        if have is None:
            grads[key], owners[key] = g, layout
        else:
            grads[key] = add_grads(have, g, target)
        if leaf:
            hold(g.local, grads[key].local)


def _check_loss(loss: Any, gradient: Any) -> None:
    """Refuse a loss or an upstream gradient `backward` cannot take (alike on every rank: shapes, layouts, the
    graph)."""
    shape = getattr(loss, "global_shape", None)
    if shape is None or not hasattr(loss, "_ag"):
        raise OperatorError(f"backward() needs a DTensor loss, got {type(loss).__name__}")
    if gradient is not None:
        g_shape = getattr(gradient, "global_shape", None)
        if g_shape is None or not hasattr(gradient, "_ag"):
            hint = "; explain is a keyword: backward(explain=[...])" if isinstance(gradient, list) else ""
            raise OperatorError(f"backward(gradient): the gradient must be a DTensor, got "
                                f"{type(gradient).__name__}{hint}")
        if tuple(g_shape) != tuple(shape):
            raise OperatorError(f"backward(gradient): gradient of global shape {tuple(g_shape)!r} for a tensor "
                                f"of global shape {tuple(shape)!r}; expected the same shape")
        if gradient.layout.layout != loss.layout.layout:
            raise OperatorError(f"backward(gradient): the gradient is on {gradient.layout.layout} but the tensor "
                                f"on {loss.layout.layout}")
    elif math.prod(shape) != 1:
        raise OperatorError(f"backward() needs a scalar loss (one element), got global shape "
                            f"{tuple(shape)!r}; reduce it first (mse_loss, cross_entropy) or pass its "
                            "upstream gradient: backward(gradient)")
    if loss._ag is None:
        raise OperatorError("backward() of a loss that does not require grad: no tensor it was "
                            "computed from has requires_grad_() (or it was computed under no_grad())")
    if isinstance(loss._ag, Leaf):
        raise OperatorError("backward() of a leaf: the loss must be computed from the parameters")


_SCALAR = ()  # a scalar loss's global shape


def _topological(root: Any) -> list:
    """Nodes reachable from `root`, latest recorded first (`Node.seq`): each after every node that consumes
    it, as a node's inputs were recorded before it (refuses freed ones, before any collective)."""
    if type(root) is not Node:
        return []
    if root.backward is None:
        _refuse_freed(root)
    # Breadth first, in C: `order` is the queue, extended by the new nodes among the graph slots of the inputs of
    # the nodes in it, read as it grows (a list's iterator reads its length at each step, and `extend` appends
    # each node as it comes, before the next slot is read: every node is in `order` before its inputs are read,
    # and the search ends when the slots of the last one are read). A node is new where `first.setdefault` answers
    # its own place in the stream of slots (a count in step). No Python per node or input, and no round per
    # depth (issue 58: a pipeline stage walks a graph each microbatch).
    order = [root]
    first = {root: -1}
    found = filter(_IS_NODE, map(getattr, chain.from_iterable(map(_INPUTS, iter(order))), _AG, _NONE))
    found, again = tee(found)
    order.extend(compress(found, map(eq, map(first.setdefault, again, count()), count())))
    order.sort(key=_SEQ, reverse=True)
    if any(map(is_, _NONE, map(_BACKWARD, order))):  # a freed node (its backward None): named as a search finds it
        _refuse_freed(_first_freed(root))
    return order


_AG, _NONE = repeat("_ag"), repeat(None)  # getattr(t, "_ag", None), mapped
_IS_NODE = Node.__instancecheck__  # isinstance(x, Node) in C (no subclass of Node exists)
_SEQ, _INPUTS = attrgetter("seq"), attrgetter("inputs")
_BACKWARD = attrgetter("backward")


def _first_freed(root: Node) -> Node:
    """The freed node of `root`'s graph (a node whose backward is None) that the search meets first, depth
    first from `root`: the one `backward` names in its refusal (every rank alike)."""
    seen, stack = {root}, [root]
    while stack:
        for t in stack.pop().inputs:
            parent = getattr(t, "_ag", None)
            if type(parent) is Node and parent not in seen:
                if parent.backward is None:
                    return parent
                seen.add(parent)
                stack.append(parent)
    raise AssertionError("internal: no freed node found")  # pragma: no cover - only called when one is


def _refuse_freed(node: Node) -> None:
    raise OperatorError(
        f"backward through the graph of {node.describe()!r} a second time: its saved tensors were "
        "freed by the first backward(); run the forward again (two losses of one forward: add them and call "
        "backward() once)")


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


_F32 = np.dtype(np.float32)


def _rounded_wide(block: np.ndarray, low: np.dtype) -> np.ndarray:
    """`block` rounded once to `low`, widened to float32 again (the engine's kernel: a dry run's zeros)."""
    return block.astype(low).astype(np.float32)


def _of_parameters(inputs: tuple) -> bool:
    """Whether every input that takes a gradient is a leaf (a parameter): the node is a parameter's view. An
    activation a recomputed region reads as a leaf (graph.Detached) is none: its readers round as any."""
    found = [t._ag for t in inputs if t is not None and getattr(t, "_ag", None) is not None]
    return bool(found) and all(type(a) is Leaf for a in found)


def grad_layout(layout: TensorLayout, g_layout: TensorLayout) -> TensorLayout:
    """Where a gradient of a tensor of `layout` is kept: its tensor map, pending sums it may keep.

    A pending sum may stay over axes the tensor is replicated on (the
    tensor's own partial axes excluded: an addend's gradient is the whole
    value); a gradient from another device matrix is resolved.
    """
    # As graph.with_partial: no Python hashing; the entry holds both objects, so while it is there no other
    # object has their ids (a key found is these very two objects).
    seen = _GRAD_BY_OBJECT.get((id(layout), id(g_layout)))
    if seen is not None:
        return seen[2]
    keep = _GRAD_LAYOUTS.get((layout, g_layout))
    if keep is None:
        keep = _grad_layout(layout, g_layout)
    out = with_partial(layout, keep)  # derived from this very object (an equal one's would lead back to it)
    if len(_GRAD_BY_OBJECT) >= 4096:
        _GRAD_BY_OBJECT.clear()
    # (and whether a gradient laid out `g_layout` moves to it: `_move`'s test, pure of the two objects)
    _GRAD_BY_OBJECT[(id(layout), id(g_layout))] = (layout, g_layout, out, g_layout is not out and g_layout != out)
    return out


# (id(layout), id(gradient's layout)) -> (both, grad_layout's answer, whether the gradient moves there)
_GRAD_BY_OBJECT: dict = {}


def _grad_layout(layout: TensorLayout, g_layout: TensorLayout) -> tuple:
    """The pending axes grad_layout keeps, worked out (and kept by value)."""
    key = (layout, g_layout)
    both = set(layout.replicated_axes) & set(g_layout.partial) if g_layout.layout == layout.layout else ()
    keep = tuple(a for a in layout.layout.alias_name if a in both)
    if len(_GRAD_LAYOUTS) >= 4096:  # a long run over many layouts: start over
        _GRAD_LAYOUTS.clear()
    _GRAD_LAYOUTS[key] = keep
    return keep


_GRAD_LAYOUTS: dict = {}  # (layout, gradient's layout) -> the pending axes grad_layout keeps


def _collector(explain: Optional[list]) -> Any:
    """A trace collector for the explanation; a null context when none is asked for."""
    if explain is None:
        return contextlib.nullcontext()
    from ...runtime import collect_trace

    return collect_trace()


def add_grads(a: Any, b: Any, layout: TensorLayout, kind: Optional[str] = "activations") -> Any:
    """a + b for two gradients of one tensor (brought to one layout first: B -> P is free); `kind`: what
    spmdsim.base.flops.sweep counts the sum as (None: not counted here, its caller counts it)."""
    if a._layout is not b._layout and a._layout != b._layout:  # mostly one object: no Python __eq__ call
        both = set(a.layout.partial) | set(b.layout.partial)
        common = layout.with_partial(x for x in layout.layout.alias_name if x in both)
        a, b = _move(a, common), _move(b, common)
    x, y = (a._local, b._local) if not buffers.CAPTURE.on else (a.local, b.local)
    if kind is not None and _flops._OPEN:  # (any_open's test)
        sweep("add", (x, y), (x,), kind)
    mesh = a._mesh
    if mesh.engine.dry:  # the dry engine's zeros, not added (spmdsim.runtime.sim.dry)
        like = buffers.broadcast_zero(x.shape, np.result_type(x, y))
        total = mesh.engine.local(np.add, like, x, y)
    else:
        total = x + y
    if not isinstance(total, np.ndarray):  # 0-d blocks sum to a numpy scalar
        total = np.asarray(total)
    # Both checked DTensors of one layout and global shape: their sum's block is shaped as theirs (DTensor._trusted's
    # tensor, without its call)
    out = _new_object(type(a))
    out._mesh, out._local, out._layout, out._shape, out._ag = mesh, total, a._layout, a._shape, None
    return out


def _move(g: Any, target: TensorLayout) -> Any:
    layout = g._layout
    if layout is target or layout == target:
        return g
    return (_REDISTRIBUTE or _redistribute())(g, target)


_REDISTRIBUTE: Any = None  # runtime.executor.redistribute, bound on first use (an import statement costs ~1 us)


def _redistribute() -> Any:
    global _REDISTRIBUTE
    _REDISTRIBUTE = (_RUNTIME or _runtime())[1].redistribute
    return _REDISTRIBUTE


_RUNTIME: Any = None  # (runtime.DTensor, runtime.executor), bound on first use (importing autograd must not start MPI)


def _runtime() -> tuple:
    """(DTensor, spmdsim.runtime.executor): a relative import statement runs importlib's Python on every
    call (~2 us, several times that on loaded simulated ranks), a global read does not."""
    global _RUNTIME
    from ...runtime import executor
    from ...runtime.dtensor import DTensor

    _RUNTIME = (DTensor, executor)
    return _RUNTIME
