"""A leaf's gradient plan and the buckets: what the backward does at each leaf, made once per call signature.

A leaf's plan (`_leaf_plan`) says how its gradient becomes whole (`.grad`): resolved alone, or summed with
others of its bucket by one Allreduce (`_bucket_sum`); the whole gradients are made slot by slot in C
(`_tensors`)."""
from __future__ import annotations

from itertools import chain, repeat
import math
import sys
from operator import attrgetter
from typing import Any, Optional

import numpy as np

from ...base import buffers
from ...errors import OperatorError
from ...layouts.layout import TensorLayout
from .graph import Leaf, with_partial
from . import moves as _moves
from .moves import _collector, _move, _new_object, _runtime
from ...base.tables import put


_refs, _ndarray = sys.getrefcount, np.ndarray


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
        put(_PLANS, key, plan, 256)
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
                # each list's entries let go by a map in C (a bucket holds tens of leaves)
                list(map(gs.__setitem__, bucket.positions, _NONE))
                if in_grad:
                    for i in bucket.positions:
                        leaves[i].grad = None
                list(map(out.__setitem__, bucket.slots, _NONE))

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
    DTensor, executor = _moves._RUNTIME or _runtime()
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
    DTensor, executor = _moves._RUNTIME or _runtime()
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


#: The slots `_tensors` sets, as DTensor._trusted does (tests/test_autograd_accumulate.py checks DTensor's).
TENSOR_SLOTS = ("_mesh", "_local", "_layout", "_shape", "_ag")


def _read_by(readers: dict, leaves: list) -> str:
    """" (read by matmul MatMul1, ...)": the forward steps that read `leaves`, each once; "" if none."""
    names: list = []
    for leaf in leaves:
        names += [n for n in readers.get(leaf, ()) if n not in names]
    return f" (read by {', '.join(names)})" if names else ""


_AG, _NONE = repeat("_ag"), repeat(None)  # getattr(t, "_ag", None), mapped
