"""``einsum(spec, *xs)`` on DTensors by the sharding rules of spmdsim.programs.infer.einsum.

The operands are redistributed to the plan's layouts (the least-bytes
choice), each rank contracts its own blocks, and the result is a pending
sum over the axes that split a contracted letter (no collective here: the
next op that needs the whole value resolves it, or ``redistribute`` does,
by Allreduce or Reduce_scatter). bfloat16 operands are multiplied widened
to float32 (spmdsim.base.precision): a whole result is rounded once to bfloat16,
a pending sum stays float32 until the collective that sums it. Two operands contract as one batched BLAS
matmul (`spmdsim.references.contraction`). The gradient of each operand is the einsum of
dY with the other operands, pending over the axes of the letters it sums over
(`spmdsim.nn.autograd.rules.einsum`).
"""
from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ..autograd.graph import attach
from ..autograd.rules.einsum import EinsumGrads, record_einsum, static
from ..autograd.rules.grads import NEED2
from ...references.contraction import contract, pair, present_letters
from ...errors import OperatorError
from ...programs.infer.einsum import infer_einsum, parse_einsum
from ...base.precision import rounded
from . import _common
from ...base.buffers import CAPTURE
from ._common import BLOCK, LOCAL, Prepared, dry_zeros, moved, prepare, prepared_result, signature
from ._operands import check_dtensor

__all__ = ["einsum"]


def einsum(spec: str, *xs: Any) -> Any:
    """Einstein summation over DTensors, like ``numpy.einsum`` (one '...' per operand allowed).

    What the call decides is a `Prepared` (spmdsim.nn.ops._common), kept per call signature: a repeated call
    contracts and builds its result and node directly. Bool operands alone that sum over a letter are refused:
    numpy's einsum of bools is a logical or of ands, a bool result; the blocks' sums would count (int64)."""
    try:
        if len(xs) == 2:  # `signature`'s key, without its call (most products: two operands)
            a, b = xs
            key = spec, id(a._layout), id(b._layout), a._shape, b._shape, a._local.dtype, b._local.dtype
        else:
            key = signature(spec, xs)
        prepared = _PREPARED.get(key)
    except (AttributeError, TypeError):  # an operand that is no DTensor, a spec that does not hash: refused below
        key = prepared = None
    if prepared is None:
        prepared = first_call(spec, xs, key)
    plan = prepared.plan
    if not prepared.stays:
        xs = moved(xs, prepared)
    if prepared.paired:  # two operands, every letter of the product in one: `contract` without its call
        a, b = xs
        (a_word, b_word), output = prepared.words
        block = (pair(a_word, a._local, b_word, b._local, output) if not CAPTURE.on
                 else pair(a_word, a.local, b_word, b.local, output))
    else:
        blocks = list(map(BLOCK, xs)) if not CAPTURE.on else list(map(LOCAL, xs))
        block = contract(plan.spec.inputs, blocks, plan.spec.output)
    mesh = xs[0]._mesh
    if block.dtype != prepared.dtype and not plan.local.partial:  # bfloat16 operands: a float32 product,
        # rounded once (a pending sum stays float32 until summed); a dry run's large one: zeros, not rounded
        dry = dry_zeros(mesh, block.shape, prepared.dtype, rounded, block, prepared.dtype)
        block = rounded(block, prepared.dtype) if dry is None else dry
    if type(block) is _ndarray and block.shape == prepared.block and block.flags.c_contiguous:
        # `prepared_result`'s usual case, its DTensor built here (DTensor._trusted without its call)
        out = _new(_common._DTENSOR)
        out._mesh, out._local, out._layout, out._shape, out._ag = mesh, block, prepared.out, prepared.shape, None
    else:
        out = prepared_result(mesh, block, prepared)
    if len(xs) == 2:  # record_einsum's node without its call (most products: two operands)
        a, b = xs
        need = NEED2[a._ag is None][b._ag is None]
        if need is _NONE:
            return out
        if type(xs) is not tuple:
            xs = tuple(xs)
        grads = _new(EinsumGrads)
        grads.xs, grads.prepared, grads.need = xs, prepared, need
        return attach(out, prepared.name, xs, grads, prepared.want, prepared.reads)
    for x in xs:
        if x._ag is not None:
            return record_einsum(out, xs, prepared)
    return out


_ndarray = np.ndarray
_new = object.__new__
_NONE = NEED2[True][True]  # two operands, neither taking a gradient


class _Prepared(Prepared):
    """An einsum call's `Prepared`, with what its node and backward take from the plan alone
    (spmdsim.nn.autograd.rules.einsum's `static`: the node's name, per operand what its gradient contracts and
    the axes it is pending over), `ways`, what its backward decides per dY layout (the gradients' layouts, what
    each product contracts), the plan's `words` (the operands' words, the product's) and whether the product
    is `pair`'s (`paired`)."""

    __slots__ = ("name", "per", "ways", "words", "paired")

    def __init__(self, spec: str, layouts: tuple, shapes: tuple, dtypes: tuple) -> None:
        super().__init__(infer_einsum, spec, layouts, shapes, dtypes, "local")
        self.name, self.per = static(self.plan)
        self.ways: dict = {}
        words, output = self.words = self.plan.spec.inputs, self.plan.spec.output
        # Whether the local product is `pair`'s of the two blocks (contraction.contract's two-operand case).
        self.paired = len(words) == 2 and bool(output) and present_letters(words, output) == output


def first_call(spec: str, xs: tuple, key: Any) -> Any:
    """What a call signature's first call decides (its `_Prepared`, kept under `key` in the table: None, not
    kept), after the operands' checks: each a DTensor, at least one, no bool sum. spmdsim.nn.ops.fused's products
    share the table."""
    cls = _common._DTENSOR or _common._dtensor_class()
    for k, x in enumerate(xs):
        if type(x) is not cls:
            check_dtensor(x, f"einsum: operand {k}")
    if not xs:
        raise OperatorError("einsum needs at least one operand")
    parse_einsum(spec, tuple(len(x.global_shape) for x in xs))  # its refusals, before the cached plan hashes spec
    _refuse_bool_sum(spec, xs)
    return prepare(_PREPARED, 4096, partial(_Prepared, spec), xs, key)


def _refuse_bool_sum(spec: Any, xs: tuple) -> None:
    """One line for an einsum of bool operands only that sums over a letter (before the plan is kept, so a
    repeated call is refused too). numpy gives a bool, each element the or of the products' ands; a block's
    ``sum`` gives the count (int64), a silently different value and dtype, and a split summed letter a pending
    sum of bools, which MPI cannot add. A bool einsum that sums nothing (a transpose, an outer product) runs."""
    if not all(x.dtype.kind == "b" for x in xs):
        return
    parsed = parse_einsum(spec, tuple(len(x.global_shape) for x in xs))
    summed = sorted({ch for term in parsed.inputs for ch in term if ch not in parsed.output})
    if summed:
        raise OperatorError(f"einsum {spec!r}: the operands have dtype 'bool', but it sums over "
                            f"{''.join(summed)!r} (numpy's bool einsum is a logical or of ands, a sum would "
                            "count); convert them first, e.g. x.astype('int64'), or reduce a bool with x.any(axis)")


_PREPARED: dict = {}  # signature -> Prepared (spmdsim.nn.ops._common)
