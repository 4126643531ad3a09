"""``einsum(spec, *xs)`` on DTensors by the sharding rules of spmdsim.infer.einsum.

The operands are redistributed to the plan's layouts (the least-bytes
choice), each rank contracts its own blocks, and the result is a pending
sum over the axes that split a contracted letter (no collective here: the
next op that needs the whole value resolves it, or ``redistribute`` does,
by Allreduce or Reduce_scatter). Two operands contract as one batched BLAS
matmul. The gradient of each operand is the einsum of dY with the other
operands, pending over the axes of the letters it sums over.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..autograd.graph import record, with_partial
from ..autograd.rules import grad_tensor
from ..errors import OperatorError
from ..infer.einsum import infer_einsum
from ..engines import matmul as _product
from ..validate import dtype_name
from ._common import check_dtensor, make_dtensor, result_dtype

__all__ = ["einsum", "contract"]


def _sum_alone(word: str, block: np.ndarray, keep: str) -> tuple[str, np.ndarray]:
    """Sum out the letters of `word` that are not in `keep`."""
    gone = tuple(i for i, ch in enumerate(word) if ch not in keep)
    if not gone:
        return word, block
    return "".join(ch for ch in word if ch in keep), block.sum(axis=gone)


class _Recipe:
    """How `_pair` contracts two blocks of given words and shapes: sums, transposes, one matmul, reshapes.

    Pure in (words, shapes): a training step contracts the same few pairs every step, and working
    the permutations out again was ~15 us of Python per product (paid once per simulated rank).
    A permutation that leaves the order as it is is None (the view numpy's transpose would give).
    """

    __slots__ = ("a_gone", "b_gone", "lhs", "rhs", "lhs_shape", "rhs_shape", "shape", "order", "swap")

    def __init__(self, a_word: str, a_shape: tuple, b_word: str, b_shape: tuple, out: str) -> None:
        def gone(word: str, keep: str) -> tuple:
            return tuple(i for i, ch in enumerate(word) if ch not in keep)

        def kept(word: str, shape: tuple, keep: str) -> tuple[str, tuple]:
            return ("".join(ch for ch in word if ch in keep),
                    tuple(n for ch, n in zip(word, shape) if ch in keep))

        self.swap = False  # True: the recipe of (b, a), whose product comes out in `out`'s order
        self.a_gone = gone(a_word, b_word + out) or None
        a_word, a_shape = kept(a_word, a_shape, b_word + out)
        self.b_gone = gone(b_word, a_word + out) or None
        b_word, b_shape = kept(b_word, b_shape, a_word + out)
        batch = [ch for ch in out if ch in a_word and ch in b_word]
        m = [ch for ch in a_word if ch not in b_word]
        n = [ch for ch in b_word if ch not in a_word]
        k = [ch for ch in a_word if ch in b_word and ch not in out]
        size = dict(zip(a_word, a_shape)) | dict(zip(b_word, b_shape))
        self.lhs = _moved([a_word.index(ch) for ch in batch + m + k])
        self.rhs = _moved([b_word.index(ch) for ch in batch + k + n])
        prod = [math.prod(size[ch] for ch in group) for group in (batch, m, k, n)]
        self.lhs_shape = (prod[0], prod[1], prod[2])
        self.rhs_shape = (prod[0], prod[2], prod[3])
        self.shape = tuple(size[ch] for ch in batch + m + n)
        order = batch + m + n
        self.order = _moved([order.index(ch) for ch in out])


def _moved(perm: list) -> tuple | None:
    """`perm` as a tuple, or None when it keeps every axis in place."""
    return None if perm == sorted(perm) else tuple(perm)


_RECIPES: dict = {}  # (a_word, a.shape, b_word, b.shape, out) -> _Recipe
_CACHE_MAX = 4096


def _recipe(a_word: str, a_shape: tuple, b_word: str, b_shape: tuple, out: str) -> _Recipe:
    key = (a_word, a_shape, b_word, b_shape, out)
    try:
        return _RECIPES[key]
    except KeyError:
        pass
    recipe = _Recipe(a_word, a_shape, b_word, b_shape, out)
    if recipe.order is not None:  # (B^T A^T)'s product may come out in order where (A B)'s needs a copy
        swapped = _Recipe(b_word, b_shape, a_word, a_shape, out)
        if swapped.order is None:
            recipe, recipe.swap = swapped, True
    if len(_RECIPES) >= _CACHE_MAX:  # a long run over many shapes: start over
        _RECIPES.clear()
    _RECIPES[key] = recipe
    return recipe


def _pair(a_word: str, a: np.ndarray, b_word: str, b: np.ndarray, out: str) -> np.ndarray:
    """einsum of two blocks as one batched matmul (transposes around np.matmul)."""
    r = _recipe(a_word, a.shape, b_word, b.shape, out)
    if r.swap:
        a, b = b, a
    if r.a_gone is not None:
        a = a.sum(axis=r.a_gone)
    if r.b_gone is not None:
        b = b.sum(axis=r.b_gone)
    lhs = a if r.lhs is None else a.transpose(r.lhs)
    rhs = b if r.rhs is None else b.transpose(r.rhs)
    result = _product(lhs.reshape(r.lhs_shape), rhs.reshape(r.rhs_shape)).reshape(r.shape)
    if r.order is not None:
        result = result.transpose(r.order)
    # As np.ascontiguousarray alone: a copy when not C-ordered, and a 0-d result made 1-d.
    return result if result.flags.c_contiguous and result.ndim else np.ascontiguousarray(result)


_PRESENT: dict = {}  # (words, out) -> the letters of `out` some operand has


def contract(words: Sequence[str], blocks: Sequence[np.ndarray], out: str) -> np.ndarray:
    """The local einsum ``words -> out`` of `blocks`; letters of `out` in no operand are broadcast."""
    key = (tuple(words), out)
    present = _PRESENT.get(key)
    if present is None:
        present = "".join(ch for ch in out if any(ch in w for w in words))
        if len(_PRESENT) >= _CACHE_MAX:
            _PRESENT.clear()
        _PRESENT[key] = present
    if len(blocks) == 2:
        result = _pair(words[0], blocks[0], words[1], blocks[1], present)
    elif len(blocks) == 1:
        word, block = _sum_alone(words[0], blocks[0], present)
        result = np.transpose(block, [word.index(ch) for ch in present])
    else:
        result = np.einsum(",".join(words) + "->" + present, *blocks, optimize=True)
    if present == out:
        return result
    return result, present  # type: ignore[return-value]  # the caller broadcasts the missing letters


def einsum(spec: str, *xs: Any) -> Any:
    """Einstein summation over DTensors, like ``numpy.einsum`` (one '...' per operand allowed)."""
    for k, x in enumerate(xs):
        check_dtensor(x, f"einsum: operand {k}")
    if not xs:
        raise OperatorError("einsum needs at least one operand")
    dtype = result_dtype(*[x.local.dtype for x in xs])
    plan = infer_einsum(spec, tuple(x.layout for x in xs), tuple(x.global_shape for x in xs), dtype_name(dtype))
    xs = tuple(x if x.layout == t else _redistributed(x, t) for x, t in zip(xs, plan.targets))
    words = plan.spec.inputs
    block = contract(words, [x.local for x in xs], plan.spec.output)
    out = make_dtensor(xs[0].mesh, block, plan.local, plan.shape)
    if all(x._ag is None for x in xs):
        return out
    return _record(out, xs, plan)


def _redistributed(x: Any, target: Any) -> Any:
    """`x` redistributed to `target` (the import made only when an operand moves: ~2 us a call)."""
    from ..runtime.executor import redistribute

    return redistribute(x, target)


def _record(out: Any, xs: tuple, plan: Any) -> Any:
    words, output = plan.spec.inputs, plan.spec.output
    mesh = plan.local.layout
    split = dict(plan.choice.splits)
    need = tuple(x._ag is not None for x in xs)

    def backward(dy: Any) -> tuple:
        grads = []
        for k, x in enumerate(xs):
            if not need[k]:
                grads.append(None)
                continue
            others = [i for i in range(len(xs)) if i != k]
            g = contract([output] + [words[i] for i in others], [dy.local] + [xs[i].local for i in others], words[k])
            if isinstance(g, tuple):  # letters only x has (summed away by the forward): dY spread over them
                g, present = g  # `present` keeps x's letter order, so a reshape puts the ones in place
                g = np.broadcast_to(np.reshape(g, [g.shape[present.index(ch)] if ch in present else 1
                                                   for ch in words[k]]), x.local.shape).copy()
            summed = tuple(a for ch, axes in split.items() if ch not in words[k] for a in axes
                           if mesh.axis_size(a) > 1)
            carried = tuple(a for i in others for a in xs[i].layout.partial)
            grads.append(grad_tensor(x, g, dy.layout.partial, summed, carried))
        return tuple(grads)

    return record(out, f"einsum {plan.spec}", xs, backward, with_partial(plan.local, ()))
