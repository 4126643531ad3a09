"""The memory plan of a captured step (spmdsim.runtime.replay.Graph): intermediates that share memory
by lifetime (`_share_memory`) and a join's parts written where the join puts them (`_joined_in_place`)."""
from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from ..base.buffers import owner as _owner
from .replay_tape import _copy_all, _copy_dict, _copy_into, _ndarray, _take_into


def _share_memory(entries: tuple) -> tuple[tuple, int]:
    """The recorded calls with the step's intermediates sharing memory where their lifetimes allow, and the
    bytes that saved: (entries, bytes).

    A capture keeps every array the step made, each its own memory, so a replay writes each intermediate
    into memory it last touched a step ago, not into what the eager step's allocator handed back warm
    (docs/howto/replay.md, "Memory"). Here an array the step made whose only references are the record's (its
    views' too: no DTensor, gradient, result, cache or request holds it), whose first recorded use writes
    it whole and whose last use ends before another such array of the same size is first written, takes
    that array's memory. The calls, their order and their values are the capture's; only where the
    intermediates live changes.
    """
    objects, first, last, whole, barred = _uses(entries)
    sizes = _shareable(objects, first, whole, barred)
    # Lifetimes to memory: in order of first use, each takes a free host of its size, else hosts itself.
    starts: dict = {}
    for r in sizes:
        starts.setdefault(first[r], []).append(r)
    ends: dict = {}
    free: dict = {}  # nbytes -> ids of hosts free now
    host_of: dict = {}  # id(root) -> id of the root whose memory it takes
    for i in range(len(entries)):
        for r in starts.get(i, ()):
            pool = free.get(sizes[r])
            host_of[r] = pool.pop() if pool else r
            ends.setdefault(last[r], []).append(r)
        for r in ends.pop(i, ()):
            free.setdefault(sizes[r], []).append(host_of[r])
    moved = {r: (objects[h], 0) for r, h in host_of.items() if h != r}
    if not moved:
        return entries, 0
    return _rehomed(entries, objects, moved, ()), sum(sizes[r] for r in moved)


def _joined_in_place(entries: tuple) -> tuple[tuple, int]:
    """The recorded calls with each join written in place, and the bytes no longer copied a replay:
    (entries, bytes).

    A gradient bucket joins its gradients into one flat buffer (``np.concatenate``, of flat views or with
    ``axis=None``) for one Allreduce. Where
    every part is the whole of an array the step made for the join alone (only the record names it, its
    first use writes it whole, the join is its last use) and the flat buffer is first used by the join,
    the parts' arrays become views of their places in the flat buffer and the join goes: the step writes
    each gradient where the bucket reads it (PyTorch DDP's gradient_as_bucket_view, Megatron's grad
    buffer). The values each call computes are the capture's.
    """
    objects, first, last, whole, barred = _uses(entries)
    placed: dict = {}  # id(root) -> (the flat buffer, the byte offset its part starts at)
    hosts: set = set()  # ids of the flat buffers' roots: each keeps its own memory (a join of joins copies)
    dropped: set = set()
    saved = 0
    for i, (func, args, kwargs) in enumerate(entries):
        axis = kwargs.get("axis", 0)  # (None: the parts flattened, each in C order: its bytes as they lie)
        if func is not np.concatenate or len(args) != 1 or set(kwargs) - {"out", "axis"} \
                or axis not in (0, -1, None):
            continue
        flat, parts = kwargs.get("out"), args[0]
        if type(flat) is not _ndarray or flat.ndim != 1 or not flat.flags.c_contiguous \
                or first.get(id(_owner(flat))) != i or type(parts) not in (list, tuple) or len(parts) < 2:
            continue
        roots = [_owner(part) if type(part) is _ndarray else None for part in parts]
        keys = {id(root) for root in roots}
        if len(keys) != len(parts) or id(_owner(flat)) in keys or not all(
                root is not None and part.dtype == flat.dtype and (part.ndim == 1 or axis is None)
                and _whole(part, root)
                and id(root) not in barred and id(root) not in placed and id(root) not in hosts
                and whole.get(id(root))
                and first[id(root)] != i and last[id(root)] == i and root.flags.c_contiguous
                for part, root in zip(parts, roots)):
            continue
        at = 0
        for part, root in zip(parts, roots):
            placed[id(root)] = (flat, at)
            at += part.nbytes
        hosts.add(id(_owner(flat)))
        dropped.add(i)
        saved += flat.nbytes
    if not dropped:
        return entries, 0
    return _rehomed(entries, objects, placed, dropped), saved


def _uses(entries: tuple) -> tuple:
    """What `_share_memory` and `_joined_in_place` decide from: (objects, first, last, whole, barred).

    `objects`: id -> every array the record names, and the arrays their memory is a view of; `first`,
    `last`: id(root) -> the calls that use it first and last; `whole`: id(root) -> whether every use by its
    first call writes it whole; `barred`: ids of roots held by anything but the record (Python's reference
    count less the record's and its views'), whose memory stays their own.
    """
    objects: dict = {}
    counted: dict = {}  # id -> references from the record's containers
    first: dict = {}
    last: dict = {}
    whole: dict = {}
    barred: set = set()
    seen: set = set()  # ids of containers counted

    def use(x: Any, i: int, written: bool, count: bool) -> None:
        if type(x) is _ndarray:
            key = id(x)
            if count:
                counted[key] = counted.get(key, 0) + 1
            root = x
            while isinstance(root.base, _ndarray):
                objects.setdefault(id(root), root)
                root = root.base
            objects.setdefault(key, x)
            objects.setdefault(id(root), root)
            r = id(root)
            if r not in first:
                first[r], whole[r] = i, written and _whole(x, root)
            elif first[r] == i:
                whole[r] = whole[r] and written and _whole(x, root)
            last[r] = i
        elif type(x) in (tuple, list, dict):
            again = id(x) in seen
            seen.add(id(x))
            for v in (x.values() if type(x) is dict else x):
                use(v, i, written, count and not again)

    def walk() -> None:  # its own frame: no name of ours holds an array when the references are counted
        for i, (func, args, kwargs) in enumerate(entries):
            outs = _written_args(func, args, kwargs)
            owner = getattr(func, "__self__", None)
            if type(owner) is _ndarray:  # a bound method (ndarray.fill: it writes its array whole)
                fill = getattr(func, "__name__", "") == "fill"
                use(owner, i, fill, id(func) not in seen)
                seen.add(id(func))
                if not fill:
                    barred.add(id(_owner(owner)))
            for container in (args, kwargs):
                again = id(container) in seen
                seen.add(id(container))
                for k, v in (container.items() if type(container) is dict else enumerate(container)):
                    use(v, i, k in outs, not again)

    walk()
    del use, walk  # `use` names itself (a cycle): its cell emptied, no later count sees these arrays held twice
    # What else holds each array (Python's count less ours, the record's and its views'): anything, and its
    # memory stays its own.
    base = _refcounts({0: np.zeros(1)})[0]
    children = _children(objects)
    for key, n in _refcounts(objects).items():
        if n > base + counted.get(key, 0) + children.get(key, 0):
            barred.add(id(_owner(objects[key])))
    return objects, first, last, whole, barred


def _rehomed(entries: tuple, objects: dict, homes: dict, dropped: Any) -> tuple:
    """The recorded calls but those at `dropped` positions, each array whose root is in `homes` (id(root) ->
    (an array, a byte offset)) replaced by the same view at that offset of that array's memory."""
    new: dict = {}  # id(array) -> the same array in its new home
    for key, obj in objects.items():
        root = _owner(obj)
        home = homes.get(id(root))
        if home is not None and type(obj) is _ndarray:
            host, at = home
            memory = host.view(_ndarray).reshape(-1).view(np.uint8)
            offset = at + obj.__array_interface__["data"][0] - root.__array_interface__["data"][0]
            view = _ndarray(obj.shape, obj.dtype, buffer=memory, offset=offset, strides=obj.strides)
            if not obj.flags.writeable:
                view.flags.writeable = False
            new[key] = view
    remade: dict = {}

    def remake(x: Any) -> Any:
        if type(x) is _ndarray:
            return new.get(id(x), x)
        if type(x) in (tuple, list, dict):
            done = remade.get(id(x))
            if done is None:
                made = {k: remake(v) for k, v in x.items()} if type(x) is dict else type(x)(remake(v) for v in x)
                done = remade[id(x)] = (x, made)  # the old one kept: its id is not reused meanwhile
            return done[1]
        return x

    out = []
    for i, (func, args, kwargs) in enumerate(entries):
        if i in dropped:
            continue
        owner = getattr(func, "__self__", None)
        if type(owner) is _ndarray and id(owner) in new:
            func = getattr(new[id(owner)], func.__name__)
        out.append((func, remake(args), remake(kwargs)))
    del remake  # it names itself (a cycle holding `remade`): the old record goes now, not at a collection
    return tuple(out)


def _children(objects: dict) -> dict:
    """id -> how many of `objects` are views naming it as their base."""
    out: dict = {}
    for obj in objects.values():
        if isinstance(obj.base, _ndarray):
            out[id(obj.base)] = out.get(id(obj.base), 0) + 1
    return out


def _shareable(objects: dict, first: dict, whole: dict, barred: set) -> dict:
    """id(root) -> bytes, of the roots that may share memory: not barred, written whole by their first use,
    contiguous, writeable, of numbers (no Python objects), 16-byte aligned, at least _SHARED_MIN_BYTES,
    their views of plain strides."""
    sizes: dict = {}
    for r in first:
        root = objects[r]
        if r not in barred and whole[r] and root.flags.c_contiguous and root.flags.writeable \
                and not root.dtype.hasobject and root.nbytes >= _SHARED_MIN_BYTES \
                and not root.__array_interface__["data"][0] % 16:
            sizes[r] = root.nbytes
    for obj in objects.values():
        r = id(_owner(obj))
        if r in sizes and min(obj.strides, default=0) < 0:
            del sizes[r]
    return sizes


def _refcounts(objects: dict) -> dict:
    """id -> sys.getrefcount of each of `objects` (the same frame for the probe and the arrays)."""
    return {key: sys.getrefcount(obj) for key, obj in objects.items()}


#: Arrays smaller than this keep their own memory (sharing a few bytes saves nothing).
_SHARED_MIN_BYTES = 4096


def _whole(x: np.ndarray, root: np.ndarray) -> bool:
    """Whether writing `x` writes every byte of `root`."""
    return x is root or (x.nbytes == root.nbytes and x.flags.c_contiguous
                         and x.__array_interface__["data"][0] == root.__array_interface__["data"][0])


def _written_args(func: Callable, args: tuple, kwargs: dict) -> frozenset:
    """Which of a recorded call's arguments (positions, keyword names) it writes whole: its ``out``, the
    destination of a copy. A ufunc's ``where=`` or ``np.copyto``'s writes part: none then."""
    if "where" in kwargs and kwargs["where"] is not True:
        return frozenset()
    if func is _copy_into or func is _copy_all or func is _copy_dict or func is _take_into \
            or func is np.copyto:
        return frozenset({0})
    if getattr(func, "__name__", None) == "at" and type(getattr(func, "__self__", None)) is np.ufunc:
        return frozenset()
    return frozenset({"out"}) if "out" in kwargs else frozenset()
