"""``einsum(spec, *xs)`` on DTensors by the sharding rules of spmdsim.infer.einsum.

The operands are redistributed to the plan's layouts (the least-bytes
choice), each rank contracts its own blocks, and the result is a pending
sum over the axes that split a contracted letter (no collective here: the
next op that needs the whole value resolves it, or ``redistribute`` does,
by Allreduce or Reduce_scatter). bfloat16 operands are multiplied widened
to float32 (spmdsim.precision): a whole result is rounded once to bfloat16,
a pending sum stays float32 until the collective that sums it. Two operands contract as one batched BLAS
matmul (`spmdsim.contraction`). The gradient of each operand is the einsum of
dY with the other operands, pending over the axes of the letters it sums over
(`spmdsim.autograd.rules.einsum`).
"""
from __future__ import annotations

from typing import Any

from ..autograd.rules.einsum import record_einsum
from ..contraction import contract
from ..errors import OperatorError
from ..infer.einsum import infer_einsum
from ..precision import rounded
from . import _common
from ._common import DTYPE, LAYOUT, LOCAL, SHAPE, check_dtensor, decided, make_dtensor

__all__ = ["einsum"]


def einsum(spec: str, *xs: Any) -> Any:
    """Einstein summation over DTensors, like ``numpy.einsum`` (one '...' per operand allowed)."""
    cls = _common._DTENSOR or _common._dtensor_class()
    for k, x in enumerate(xs):
        if type(x) is not cls:
            check_dtensor(x, f"einsum: operand {k}")
    if not xs:
        raise OperatorError("einsum needs at least one operand")
    plan, dtype, _, stay = decided(infer_einsum, spec, tuple(map(LAYOUT, xs)),
                                   tuple(map(SHAPE, xs)), tuple(map(DTYPE, xs)))
    if not all(stay):
        xs = tuple(x if kept else _redistributed(x, t) for x, t, kept in zip(xs, plan.targets, stay))
    words = plan.spec.inputs
    block = contract(words, list(map(LOCAL, xs)), plan.spec.output)
    if block.dtype != dtype and not plan.local.partial:  # bfloat16 operands: a float32 product, rounded once
        block = rounded(block, dtype)  # (a pending sum stays float32 until the collective that sums it)
    out = make_dtensor(xs[0].mesh, block, plan.local, plan.shape)
    for x in xs:
        if x._ag is not None:
            return record_einsum(out, xs, plan)
    return out


def _redistributed(x: Any, target: Any) -> Any:
    """`x` redistributed to `target` (the import made only when an operand moves: ~2 us a call)."""
    from ..runtime.executor import redistribute

    return redistribute(x, target)
