"""What a recorded graph keeps for its backward, in bytes, by kind: measured on the graph itself.

A node keeps alive every array its backward can reach: its inputs' blocks (the walk needs the
tensors) and whatever its backward closure holds (saved activations, a dropout's factors,
attention's probabilities). `kept_bytes` walks the graph from its roots, collects those arrays,
counts each buffer once (a view keeps its whole base alive, so the base's bytes count), leaves out
the parameters' blocks (`exclude`), and groups the bytes by the kind of the node that keeps them
(`spmdsim.autograd.kept_as`); a buffer several nodes keep goes to the one recorded earliest in the
forward (the block's input to the layer norm that reads it first, not to the residual add after
it). These are the bytes a real run holds for its backward, not an estimate: a dry run's blocks
have their real sizes (their pages are never touched), so the figures hold there too.
Pure Python and numpy: importing it starts no MPI.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .graph import Node

__all__ = ["kept_bytes", "UNTAGGED"]

#: The kind of the bytes kept by nodes recorded outside any `kept_as`.
UNTAGGED = "other"


def kept_bytes(roots: Iterable[Any], exclude: Iterable[Any] = ()) -> dict[str, int]:
    """{kind: bytes} the graphs of `roots` (DTensors: a loss, or a stage's outputs) keep for backward.

    `exclude`: tensors whose blocks are not counted (the parameters: they are held anyway).
    """
    skip = {id(_owner(t.local)) for t in exclude}
    order = _forward_order([getattr(t, "_ag", None) for t in roots])
    where: dict[int, tuple[str, int]] = {}  # id(buffer) -> (kind, bytes)
    for node in order:  # later (earlier in the forward) nodes take the buffers they share
        kind = node.kind or UNTAGGED
        for array in _arrays(node):
            owner = _owner(array)
            if id(owner) not in skip:
                where[id(owner)] = (kind, owner.nbytes)
    out: dict[str, int] = {}
    for kind, nbytes in where.values():
        out[kind] = out.get(kind, 0) + nbytes
    return out


def _owner(a: np.ndarray) -> np.ndarray:
    """The array whose memory `a` views (itself when it owns it)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


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
    """Every numpy array `node` keeps alive: its inputs' blocks and what its backward's closure holds."""
    found: list = []
    seen: set = set()
    todo: list = list(node.inputs) + [node.backward]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            found.append(x)
        elif hasattr(x, "_ag") and hasattr(x, "layout") and hasattr(x, "local"):  # a DTensor: its block
            todo.append(x.local)
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (tuple, list)):
            todo.extend(x)
        elif callable(x) and getattr(x, "__closure__", None):
            todo.extend(cell.cell_contents for cell in x.__closure__ if _filled(cell))
    return found


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return False
    return True
