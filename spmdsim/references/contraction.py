"""The local einsum: each rank's contraction of its own blocks, as one batched BLAS matmul for two operands.

`spmdsim.nn.ops.einsum` contracts the operands' blocks with it, and its gradient
rule (`spmdsim.nn.autograd.rules.einsum`) contracts dY with the other operands'
blocks. Pure numpy (the product through the running engine: a dry run's
zeros, not multiplied).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..base import flops as _flops
from ..base.buffers import broadcast_zero, contiguous
from ..base.context import _THREAD  # the running thread's context (context.current's read)
from ..base.flops import gemm as _gemm
from ..base.tables import put

__all__ = ["contract", "pair", "pair_plain", "pair_function", "present_letters"]


def _summed(dtype: np.dtype) -> Any:
    """The dtype a letter summed out of an operand is summed in: an integer's (or a bool's: an or, numpy's
    einsum of bools) own, as numpy's einsum keeps it (ndarray.sum widens int32 to int64); None for floats."""
    return dtype if dtype.kind in "biu" else None


def _sum_alone(word: str, block: np.ndarray, keep: str) -> tuple[str, np.ndarray]:
    """Sum out the letters of `word` that are not in `keep`."""
    gone = tuple(i for i, ch in enumerate(word) if ch not in keep)
    if not gone:
        return word, block
    return "".join(ch for ch in word if ch in keep), block.sum(axis=gone, dtype=_summed(block.dtype))


class _Recipe:
    """How `_pair` contracts two blocks of given words and shapes: sums, transposes, one matmul, reshapes.

    Pure in (words, shapes): a training step contracts the same few pairs every step, and working
    the permutations out again is ~15 us of Python per product (paid once per simulated rank).
    A permutation that leaves the order as it is is None (the view numpy's transpose would give).
    """

    __slots__ = ("a_gone", "b_gone", "lhs", "rhs", "lhs_shape", "rhs_shape", "shape", "order", "swap",
                 "lhs_moves", "rhs_moves", "out_moves")

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
        if prod[0] == 1:  # no batch: one (m, k) @ (k, n) GEMM, as numpy's batched matmul makes of a batch of one
            self.lhs_shape, self.rhs_shape = (prod[1], prod[2]), (prod[2], prod[3])
        else:
            self.lhs_shape, self.rhs_shape = (prod[0], prod[1], prod[2]), (prod[0], prod[2], prod[3])
        self.shape = tuple(size[ch] for ch in batch + m + n)
        order = batch + m + n
        self.order = _moved([order.index(ch) for ch in out])
        # Whether each operand (summed, transposed) and the product need a reshape (a new view each call,
        # ~1 us, as much as a small ufunc): a 2-d operand already in its matmul shape needs none.
        self.lhs_moves = tuple(a_shape[i] for i in (self.lhs or range(len(a_shape)))) != self.lhs_shape
        self.rhs_moves = tuple(b_shape[i] for i in (self.rhs or range(len(b_shape)))) != self.rhs_shape
        self.out_moves = self.lhs_shape[:-1] + self.rhs_shape[-1:] != self.shape


def _moved(perm: list) -> tuple | None:
    """`perm` as a tuple, or None when it keeps every axis in place."""
    return None if perm == sorted(perm) else tuple(perm)


_matmul = np.matmul
_result_type = np.result_type


def _recipe(a_word: str, a_shape: tuple, b_word: str, b_shape: tuple, out: str) -> _Recipe:
    recipe = _Recipe(a_word, a_shape, b_word, b_shape, out)
    if recipe.order is not None:  # (B^T A^T)'s product may come out in order where (A B)'s needs a copy
        swapped = _Recipe(b_word, b_shape, a_word, a_shape, out)
        if swapped.order is None:
            recipe, recipe.swap = swapped, True
    return recipe


_PLAIN: dict = {}  # `_RUNS`' keys -> each compiled function's `plain` twin (starts over with _RUNS)
_RUNS: dict = {}  # (a_word, a.shape, b_word, b.shape, out) -> the recipe's compiled function of (a, b)


def _pair(a_word: str, a: np.ndarray, b_word: str, b: np.ndarray, out: str) -> np.ndarray:
    """einsum of two blocks as one batched matmul (transposes around np.matmul): the recipe's own function."""
    return (_RUNS.get((a_word, a.shape, b_word, b.shape, out)) or _run(a_word, a.shape, b_word, b.shape, out))(a, b)


def _run(a_word: str, a_shape: tuple, b_word: str, b_shape: tuple, out: str) -> Callable:
    """The function `_pair` runs for blocks of these words and shapes (made once: `_compiled`); `_PLAIN` keeps
    its twin without the test of a dry run and bfloat16 (`pair_plain`'s)."""
    run = _compiled(_recipe(a_word, a_shape, b_word, b_shape, out))
    put(_RUNS, (a_word, a_shape, b_word, b_shape, out), run, 4096, also=(_PLAIN,))
    _PLAIN[(a_word, a_shape, b_word, b_shape, out)] = run.plain
    return run


def pair_function(a_word: str, a: np.ndarray, b_word: str, b: np.ndarray, out: str) -> Callable:
    """The function of two blocks that `pair` runs for blocks of `a`'s and `b`'s shapes under these words
    (``pair_function(...)(a, b)`` is ``pair(a_word, a, b_word, b, out)``); its `plain` twin where neither block
    is bfloat16 (the caller then calls it on no dry run's engine only). For a caller that keeps it per call
    signature, whose key fixes both blocks' shapes and dtypes (a fused operator's repeat on one rank)."""
    run = _RUNS.get((a_word, a.shape, b_word, b.shape, out)) or _run(a_word, a.shape, b_word, b.shape, out)
    return run if a.dtype.kind == "V" or b.dtype.kind == "V" else run.plain


def pair_plain(a_word: str, a: np.ndarray, b_word: str, b: np.ndarray, out: str) -> np.ndarray:
    """`pair` for a caller that knows the running engine is no dry run's and neither block is bfloat16 (a fused
    operator's repeated call, an einsum rule's kept case): the recipe's function without its test of those (the
    same numpy calls)."""
    return (_PLAIN.get((a_word, a.shape, b_word, b.shape, out)) or _run(a_word, a.shape, b_word, b.shape, out).plain)(
        a, b)


def _compiled(r: _Recipe) -> Callable:
    """`r` as a function of the two blocks that runs only the steps `r` needs (no test of a step it skips):
    a training step's ~75 products a rank each run ~100 opcodes of `_general`'s tests, a 2-d GEMM ~20 here.

    Its numpy calls are `_general`'s, in the same order, with the same arguments (the same bits, the same
    record in a captured step); a dry run's product and a bfloat16 one run `_general` itself. The source
    names only constants (shapes, axes) and this module's globals."""
    first, second = ("b", "a") if r.swap else ("a", "b")  # swapped: the first block is the rhs's
    body = [f"def run({first}, {second}):",
            "    if _THREAD.context.engine.dry or a.dtype.kind == 'V' or b.dtype.kind == 'V':",
            f"        return _general(r, {first}, {second})"]
    if r.a_gone is not None or r.b_gone is not None:
        body.append("    dtype = _summed(_result_type(a, b))")
        if r.a_gone is not None:
            body.append(f"    a = a.sum(axis={r.a_gone!r}, dtype=dtype)")
        if r.b_gone is not None:
            body.append(f"    b = b.sum(axis={r.b_gone!r}, dtype=dtype)")
    lhs, rhs = "a", "b"
    if r.lhs is not None:
        body.append(f"    lhs = a.transpose({r.lhs!r})")
        lhs = "lhs"
    if r.rhs is not None:
        body.append(f"    rhs = b.transpose({r.rhs!r})")
        rhs = "rhs"
    if r.lhs_moves:
        body.append(f"    lhs = {lhs}.reshape({r.lhs_shape!r})")
        lhs = "lhs"
    if r.rhs_moves:
        body.append(f"    rhs = {rhs}.reshape({r.rhs_shape!r})")
        rhs = "rhs"
    body += [f"    result = _matmul({lhs}, {rhs})",
             "    if _flops._OPEN:",
             f"        _gemm({r.lhs_shape!r}, {r.rhs_shape!r}, result.dtype, ({lhs}, {rhs}, result))"]
    if r.out_moves:
        body.append(f"    result = result.reshape({r.shape!r})")
    if r.order is not None:
        body.append(f"    result = result.transpose({r.order!r})")
    if r.order is None and r.shape:
        # np.matmul's result (at most one loop axis, its core axes last: C order) or a view of it in C order,
        # of one axis at least: `_general`'s test would always pass
        body.append("    return result")
    else:
        body.append("    return result if result.flags.c_contiguous and result.ndim else contiguous(result)")
    made: dict = {}  # `run` inside `make`: `r` a cell of its closure, this module's globals its globals
    # `plain`: the same body without its first test (`pair_plain`'s, for callers that know its answer)
    plain = [body[0].replace("def run(", "def plain(")] + body[3:]
    exec("def make(r):\n" + "\n".join("    " + line for line in body + plain) + "\n    return run, plain",
         globals(), made)
    run, run.plain = made["make"](r)
    run.recipe = run.plain.recipe = r  # (tests, and a reader's question "what does this product do")
    return run


def _general(r: _Recipe, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`r`'s product of blocks `a` and `b` with every step's test: a dry run's (shapes only) and a bfloat16
    product's (spmdsim.base.precision.product), and the reference `_compiled`'s functions follow."""
    if r.swap:
        a, b = b, a
    if r.a_gone is not None or r.b_gone is not None:
        dtype = _summed(np.result_type(a, b))
        if r.a_gone is not None:
            a = a.sum(axis=r.a_gone, dtype=dtype)
        if r.b_gone is not None:
            b = b.sum(axis=r.b_gone, dtype=dtype)
    lhs = a if r.lhs is None else a.transpose(r.lhs)
    rhs = b if r.rhs is None else b.transpose(r.rhs)
    engine = _THREAD.context.engine  # current().engine, without its call
    # shapes only (spmdsim.runtime.sim.dry): no operand copied into its matmul shape, no result reordered
    if engine.dry:
        # Read-only zeros in the matmul shapes (the dry engine's product reads their shapes and dtypes alone;
        # reshaping a transposed block would copy it).
        # Counted with the blocks the real product reads (spmdsim.base.flops: a parameter's block is one the rank
        # holds): an operand's own, or where its reshape below copies it, a block of its own (held by nothing).
        product = engine.matmul(broadcast_zero(r.lhs_shape, lhs.dtype), broadcast_zero(r.rhs_shape, rhs.dtype))
        if _flops._BLOCKS:  # (only a counter that records blocks reads them)
            if r.lhs_moves and not _views(lhs, r.lhs_shape):
                lhs = (r.lhs_shape, lhs.dtype)
            if r.rhs_moves and not _views(rhs, r.rhs_shape):
                rhs = (r.rhs_shape, rhs.dtype)
        _gemm(r.lhs_shape, r.rhs_shape, product.dtype, (lhs, rhs, product))
        result = product.reshape(r.shape) if r.out_moves else product
        if r.order is not None:
            result = result.transpose(r.order)
        if result.flags.c_contiguous and result.ndim:  # the product itself, as below (a reorder of unit axes)
            return result
        return engine.local(None, broadcast_zero(result.shape or (1,), product.dtype))  # below's copy; 0-d: 1-d
    if r.lhs_moves:
        lhs = lhs.reshape(r.lhs_shape)
    if r.rhs_moves:
        rhs = rhs.reshape(r.rhs_shape)
    if lhs.dtype.kind != "V" and rhs.dtype.kind != "V":  # no bfloat16: numpy's product (the engine's, inline)
        result = _matmul(lhs, rhs)
    else:  # spmdsim.base.precision.product: widened to float32, as a GPU multiplies bfloat16
        result = engine.matmul(lhs, rhs)
    if _flops._OPEN:  # spmdsim.base.flops: counted where a counter is open (no call otherwise)
        _gemm(r.lhs_shape, r.rhs_shape, result.dtype, (lhs, rhs, result))
    if r.out_moves:
        result = result.reshape(r.shape)
    if r.order is not None:
        result = result.transpose(r.order)
    # As np.ascontiguousarray alone: a copy when not C-ordered, and a 0-d result made 1-d.
    return result if result.flags.c_contiguous and result.ndim else contiguous(result)


def _views(a: np.ndarray, shape: tuple) -> bool:
    """Whether ``a.reshape(shape)`` is a view of `a`'s memory (else numpy copies it), found without copying."""
    try:
        np.reshape(a, shape, copy=False)
    except ValueError:  # a copy would be needed
        return False
    except TypeError:  # numpy 2.0: reshape takes no copy=; a shape set on a view is refused where it would copy
        view = a.view()
        try:
            view.shape = shape
        except AttributeError:
            return False
    return True


def _counted(words: Sequence[str], blocks: Sequence[np.ndarray], present: str, dtype: np.dtype) -> None:
    """Count a contraction of three or more blocks as its one-step batched GEMM (spmdsim.base.flops): the
    kept letters' sizes as its rows, the summed letters' as its depth (2 x every letter's size, FLOPs)."""
    sizes = {ch: n for word, block in zip(words, blocks) for ch, n in zip(word, block.shape)}
    kept = math.prod(n for ch, n in sizes.items() if ch in present)
    summed = math.prod(n for ch, n in sizes.items() if ch not in present)
    _gemm((kept, summed), (summed, 1), dtype)


_PRESENT: dict = {}  # (words, out) -> the letters of `out` some operand has


def present_letters(words: Sequence[str], out: str) -> str:
    """The letters of `out` some operand of `words` has, in `out`'s order (`contract` broadcasts the others)."""
    return "".join(ch for ch in out if any(ch in w for w in words))


#: ``pair(a_word, a, b_word, b, out)`` is ``contract((a_word, b_word), (a, b), out)`` for an `out` not empty of
#: letters `a_word` or `b_word` has (``present_letters(words, out) == out``), without contract's call: for a
#: caller that keeps that test per call signature (spmdsim.nn.ops.einsum and its gradient rule).
pair = _pair


def contract(words: Sequence[str], blocks: Sequence[np.ndarray], out: str) -> np.ndarray:
    """The local einsum ``words -> out`` of `blocks`; letters of `out` in no operand are broadcast."""
    try:
        present = _PRESENT[words, out]
    except (KeyError, TypeError):  # not seen yet, or `words` a list
        key = (tuple(words), out)
        present = _PRESENT.get(key)
        if present is None:
            present = present_letters(words, out)
            put(_PRESENT, key, present, 4096)
    if len(blocks) == 2:
        if present == out and out:  # most products (spmdsim.nn.ops.fused's): `pair`'s, as it comes
            return _pair(words[0], blocks[0], words[1], blocks[1], out)
        result = _pair(words[0], blocks[0], words[1], blocks[1], present)
        if not present and result.ndim:  # a scalar: _pair's product comes back 1-d (np.ascontiguousarray's rule)
            result = result.reshape(())
    elif len(blocks) == 1:
        word, block = _sum_alone(words[0], blocks[0], present)
        result = np.transpose(block, [word.index(ch) for ch in present])
    else:
        result = np.einsum(",".join(words) + "->" + present, *blocks, optimize=True)
        _counted(words, blocks, present, result.dtype)
    if present == out:
        return result
    return result, present  # type: ignore[return-value]  # the caller broadcasts the missing letters
