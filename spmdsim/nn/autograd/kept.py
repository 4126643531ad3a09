"""What a recorded graph keeps for its backward, in bytes, by kind: measured on the graph itself.

A node keeps alive every array its backward can reach: its inputs' blocks (the walk needs the
tensors) and whatever its backward closure holds (saved activations, a dropout's factors,
attention's probabilities). `kept_bytes` walks the graph from its roots, collects those arrays,
counts each buffer once (a view keeps its whole base alive, so the base's bytes count), leaves out
the parameters' blocks (`exclude`), and groups the bytes by the kind of the node that keeps them
(`spmdsim.nn.autograd.kept_as`); a buffer several nodes keep goes to the one recorded earliest in the
forward (the block's input to the layer norm that reads it first, not to the residual add after
it). These are the bytes a real run holds for its backward, not an estimate: a dry run's blocks
have their real sizes (their pages are never touched), so the figures hold there too.
`masks=True` tells the 1-byte boolean dropout masks apart from the values (a ledger prices values at
the training precision's width and masks at one byte). The FP8 blocks a linear layer keeps (its e4m3 copies of
its input and weight, spmdsim.nn.ops.fp8_linear) are counted under their node's kind with the suffix `FP8`
("mlp fp8"): a byte each at any precision.

`KEPT` names what a model's rules keep: "graph", every node keeps its inputs' blocks and what its
rule saved; "megatron", each rule keeps only what its backward reads, as Megatron-LM's fused layers
do (its nodes hold `shell`s of the inputs they do not read: the walk's layout, shape and graph slot,
no block). Pure Python and numpy: importing it starts no MPI.
"""
from __future__ import annotations

from types import FunctionType
from typing import Any, Iterable, Optional

import numpy as np

from ...base import buffers
from ...base.flops import hold, holding
from .graph import Node
from ...base.tables import put

__all__ = ["kept_bytes", "UNTAGGED", "FP8", "KEPT", "kept_problem", "shell", "nothing"]

#: The kind of the bytes kept by nodes recorded outside any `kept_as`.
UNTAGGED = "other"
#: The suffix of the kind of kept FP8 blocks (float8_e4m3fn, float8_e5m2): "attention fp8".
FP8 = " fp8"
#: What the rules keep for backward (see the module docstring).
KEPT = ("graph", "megatron")


def kept_problem(value: Any, said: str = "kept") -> Optional[str]:
    """Why `value` is not one of `KEPT`, or None; `said`: how the refusal names it (a flag: "--kept")."""
    if isinstance(value, str) and value in KEPT:
        return None
    return f"{said} {value!r} is not one of {', '.join(map(repr, KEPT))}"


_NOTHING: dict = {}  # dtype -> one 0-d zero: every shell's block is a broadcast view of it, never counted
_VIEWS: dict = {}  # (dtype, shape) -> `nothing`'s view (np.broadcast_to takes ~6 us; a step asks for a few shapes)


def nothing(dtype: Any, shape: tuple) -> np.ndarray:
    """A read-only block of `shape` and `dtype` that holds no memory: a broadcast view of one zero,
    which `kept_bytes` does not count (one view per dtype and shape, made once)."""
    try:
        view = _VIEWS.get((dtype, shape))
    except TypeError:  # a shape given as a list
        view = None
    if view is None:
        dtype = np.dtype(dtype)
        zero = _NOTHING.get(dtype)
        if zero is None:
            zero = _NOTHING.setdefault(dtype, np.zeros((), dtype))
        view = np.broadcast_to(zero, shape)
        if type(shape) is tuple and all(type(n) is int for n in shape):  # (a pure function of the key)
            put(_VIEWS, (dtype, shape), view, 4096)
    return view


def shell(t: Any) -> Any:
    """`t` as the backward walk needs it (mesh, layout, global shape, dtype and graph slot) without its
    block (`nothing`). A rule that does not read an input records its shell, so the node does not keep
    the input's block alive."""
    out = type(t)._trusted(t.mesh, nothing(t.dtype, t.local.shape), t.layout, t.global_shape)
    out._ag = t._ag
    return out


def kept_bytes(roots: Iterable[Any], exclude: Iterable[Any] = (), masks: bool = False) -> Any:
    """{kind: bytes} the graphs of `roots` (DTensors: a loss, or a stage's outputs) keep for backward.

    `exclude`: tensors whose blocks are not counted (the parameters: they are held anyway). `masks`:
    return two such dicts, (values, masks), the second the boolean arrays' bytes (dropout masks kept
    as 1-byte bools), the first everything else; their sum is the dict returned without it.

    The blocks counted and the excluded ones are held by the rank: under a counter that records blocks
    (spmdsim.base.flops.counting(blocks=True)) they are marked so (spmdsim.base.flops.hold), and a kernel or product
    that reads or writes them adds none of them to its transient blocks.
    """
    exclude = list(exclude)
    skip = {id(buffers.owner(t.local)) for t in exclude} | {id(z) for z in list(_NOTHING.values())}
    order = _forward_order([getattr(t, "_ag", None) for t in roots])
    where: dict[int, tuple] = {}  # id(buffer) -> (kind, bytes, a bool mask, the buffer)
    for node in order:  # later (earlier in the forward) nodes take the buffers they share
        kind = node.kind or UNTAGGED
        for array in _arrays(node):
            owner = buffers.owner(array)
            if id(owner) not in skip:
                fp8, is_mask = _flags(owner.dtype)
                where[id(owner)] = (kind + FP8 if fp8 else kind, owner.nbytes, is_mask, owner)
    if holding():
        hold(*(t.local for t in exclude), *(w[3] for w in where.values()))
    values: dict[str, int] = {}
    bools: dict[str, int] = {}
    for kind, nbytes, is_mask, _ in where.values():
        into = bools if masks and is_mask else values
        into[kind] = into.get(kind, 0) + nbytes
    return (values, bools) if masks else values


_FLAGS: dict = {}  # dtype -> (an FP8 dtype, a bool mask's): numpy's dtype.name is a Python property, ~1 us a call


def _flags(dtype: np.dtype) -> tuple:
    flags = _FLAGS.get(dtype)
    if flags is None:
        flags = _FLAGS[dtype] = (dtype.name.startswith("float8"), dtype == np.bool_)
    return flags


def _forward_order(roots: list) -> list:
    """The nodes reachable from `roots`, each after every node that consumes it (the backward's order)."""
    order: list = []
    seen: set = set()
    stack = [(r, False) for r in roots if isinstance(r, Node)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for t in node.inputs:
            parent = getattr(t, "_ag", None)
            if isinstance(parent, Node) and id(parent) not in seen:
                stack.append((parent, False))
    order.reverse()
    return order


def _arrays(node: Node) -> list:
    """Every numpy array `node` keeps alive: its inputs' blocks and what its backward's closure (or, for a
    rule written as a callable object, its slots) holds."""
    found: list = []
    seen: set = set()
    todo: list = list(node.inputs) + [node.backward]
    pop, push, extend, see = todo.pop, todo.append, todo.extend, seen.add
    while todo:
        x = pop()
        if x is None:
            continue
        i = id(x)
        if i in seen:
            continue
        see(i)
        # The commonest types first, by exact type (a plain array, tuple, list, scalar or function is none of
        # the other kinds below), then the general tests in their order.
        kind = type(x)
        if kind is _NDARRAY:
            found.append(x)
        elif kind is tuple or kind is list:
            extend(x)
        elif kind in _ATOMS:  # nothing kept
            continue
        elif kind is _FUNCTION:  # a closure: what its cells hold
            if x.__closure__:
                extend(cell.cell_contents for cell in x.__closure__ if _filled(cell))
        elif isinstance(x, np.ndarray):
            found.append(x)
        elif hasattr(x, "_ag") and hasattr(x, "layout") and (local := getattr(x, "local", _NO)) is not _NO:
            push(local)  # a DTensor: its block (read once: the property is Python)
        elif isinstance(x, dict):
            extend(x.values())
        elif isinstance(x, (tuple, list)):
            extend(x)
        elif callable(x) and getattr(x, "__closure__", None):
            extend(cell.cell_contents for cell in x.__closure__ if _filled(cell))
        elif callable(x) and not isinstance(x, type) and hasattr(type(x), "__slots__"):  # a rule's object
            extend(getattr(x, name, None) for name in type(x).__slots__)
    return found


#: Types whose values are no array, tensor, container or callable: `_arrays` passes them at once.
_ATOMS = frozenset((int, float, bool, str, bytes, complex, slice))
_NDARRAY, _FUNCTION = np.ndarray, FunctionType
_NO = object()  # getattr's default: no such attribute


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return False
    return True
