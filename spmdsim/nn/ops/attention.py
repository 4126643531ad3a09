"""Scaled dot-product attention on DTensors: one operator and one autograd node for a transformer's core.

``attention(q, k, v, causal=, scale=, dropout=, seed=)`` is
``softmax(q k^T * scale [+ causal mask]) [dropout] v`` per sample and head,
on (batch, sequence, heads, head dim) operands: PyTorch's
``scaled_dot_product_attention`` with the heads as the third dim. Its
sharding rule is spmdsim.programs.infer.attention's (batch, query rows and heads may
be split; keys and head dims are whole); operands laid out otherwise are
redistributed first. Each rank computes its own samples', heads' and query
rows' scores, softmax and weighted values locally: nothing moves forward.

The values are the composite's (``einsum``, ``* scale``, ``masked_fill``,
``softmax``, ``dropout``, ``einsum``: examples/causal_attention.py), the
dropout mask included (``SeededTensor((B, H, Tq, Tk), seed)`` at this rank's
region, as ``ops.dropout`` draws it on the probabilities), but one node
instead of six, so a transformer's step records and walks fewer.

``flash=True`` is FlashAttention-2's core (Dao 2023) on the same operands: the forward runs over tiles of
`tile` query rows (FLASH_TILE, 128, by default; the last tile ragged), each tile's scores against every key
with an exact row softmax (so the values are the composite's, up to the products' rounding), and keeps for
the backward q, k, v, the output and each query row's log-sum-exp (float32 under bfloat16, as flash
attention's kernels keep it; the operands' dtype at float32 and float64), never a (query, key) block
whole. The backward makes each tile's probabilities again as exp(scores - lse) (the dropout mask drawn
again at the tile's region of the same seeded mask: the same bits), with D = rowsum(dO * O), dS = P * (dP
- D), dQ per tile and dK, dV summed over tiles. The transient blocks are one tile's scores.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any, Optional

import numpy as np

from ...base.buffers import broadcast_zero
from ..autograd.kept import kept_problem
from ..autograd.rules.attention import count_core, count_core_kernels, grouped_product, record_attention
from ...base.flops import any_open
from ...runtime.engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ...errors import OperatorError
from ...programs.infer.attention import infer_attention, refuse_empty
from ...layouts.layout import TensorLayout
from ...base.precision import is_low, rounded, wide
from ._common import MASKS, seed_arg
from ._operands import flag, raise_if_not_dtensors, require_float
from ...runtime.executor import redistribute
from .flash import _flash, _result
from ...base.tables import put

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)

__all__ = ["attention", "FLASH_TILE"]

#: Query rows a flash attention tile takes by default (FlashAttention-2's query block on an H100: 128).
FLASH_TILE = 128


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: Optional[float] = None,
              dropout: float = 0.0, seed: Optional[int] = None, training: bool = True, mask: Any = None,
              batch_first: bool = True, recompute: bool = False, kept: str = "graph", flash: bool = False,
              tile: int = FLASH_TILE, positions: Optional[tuple] = None) -> Any:
    """softmax(q k^T * scale, masked above the diagonal if `causal`), dropped out, times v.

    q (B, Tq, H, D), k (B, Tk, H, D), v (B, Tk, H, E) -> (B, Tq, H, E). `scale`: default 1 / sqrt(D).
    k and v may have Hk heads, Hk dividing H (grouped-query attention): query head i reads key/value head
    i // (H / Hk) inside the products, as flash attention does; no head is repeated, and the node keeps k and v
    at Hk heads.
    `batch_first=False`: the operands and the result sequence-first, (T, B, H, D) (Megatron's [s, b, h]
    activations, PyTorch's MultiheadAttention default), read through views: the same values, scores
    and dropout mask (still drawn over (B, H, Tq, Tk)), no copy to batch-first.
    `dropout`: the probabilities' dropout rate (while `training`), with `seed` as ops.dropout's.
    `mask`: a bool DTensor (B, Tk), True where a key takes part and False for padding (PyTorch's
    boolean convention), moved to q's batch split with the keys whole; a query row that sees no key
    gets NaN, as a softmax over nothing.
    `recompute`: keep nothing of the core for the backward but q, k and v (the scores, their softmax, the
    dropout's mask and its output: Korthikanti et al.'s selective recomputation); the backward computes
    them again from q and k, the mask drawn again from `seed` (the same mask), then its gradients.
    `kept`: "graph" keeps the dropout's float factor per probability, "megatron" its 1-byte boolean mask
    (Korthikanti et al.'s count; the backward makes the factor again, bit for bit).
    `flash`: FlashAttention-2's core (the module's docstring): in tiles of `tile` query rows, keeping q, k, v, the
    output and each row's log-sum-exp, no scores; the same values up to the products' rounding. `recompute`
    has nothing more to drop there and is refused with it; `kept` changes nothing (no mask is kept).
    `positions`: with `causal`, the true position of each index of the sequence (a permutation of its
    indices, one tuple for queries and keys alike): a key is masked where its position is after the query's,
    for a sequence laid out in another order (context parallelism's balanced split,
    spmdsim.programs.context.order). None: the index is the position.
    """
    key = _signature(q, k, v, causal, scale, dropout, training, mask, batch_first, recompute, kept, flash, tile,
                     positions)
    decided = _PREPARED.get(key) if key is not None else None
    if decided is None or k._mesh is not q._mesh or v._mesh is not q._mesh:
        decided = _decide(q, k, v, causal, scale, dropout, seed, training, mask, batch_first, recompute, kept, flash,
                          tile, positions)
        if key is not None:
            put(_PREPARED, key, decided, 1024)
    elif seed is not None and type(seed) is not int or decided.drop and seed is None:
        _seed_checked(decided.drop, seed)  # raises (an int seed, or none without dropout, passes)
    plan, heads, keys_t, back = decided.plan, decided.heads, decided.keys_t, decided.back
    scale, drop, groups = decided.scale, decided.drop, decided.groups
    if not decided.stays:  # an operand in another layout than the plan's
        q, k, v = _moved(q, decided.q), _moved(k, decided.kv), _moved(v, decided.kv)
    mesh = q._mesh
    padding = None
    if mask is not None:  # (b, 1, 1, Tk): padding keys, for every head and query row
        padding = ~_moved(mask, plan.mask).local[:, None, None, :]
    if decided.flash:
        return _flash(q, k, v, decided, seed, padding, causal)

    core, forward, saved = _kernels(decided, seed, padding, causal, recompute, kept)
    like = broadcast_zero(decided.block, decided.out_dtype)  # the result's block (numpy's promotion: the kernel's)
    out = _result(mesh, forward, like, q, k, v, decided)
    probs_local = decided.scores  # this rank's (b, h, tq, tk) scores
    scores = (probs_local, decided.probs_dtype)
    grads = not (q._ag is None and k._ag is None and v._ag is None)
    if grads and mesh.engine.dry and not recompute:  # what the rule keeps, sized: the dry engine's zeros, never touched
        _dry_saved(saved, decided, kept)
    if any_open():  # else nothing is counted: no blocks to gather
        # its two products (spmdsim.base.flops) with the blocks the rule keeps and the result's
        count_core(q.local, k.local, v.local, (heads, keys_t, back), saved, out.local)
        count_core_kernels(scores, drop, kept, saved)  # and its element-wise kernels over the scores
    if not grads:
        return out
    return record_attention(out, q, k, v, plan, saved, core if recompute else None, scale, (heads, keys_t, back),
                            (scores, drop, kept), groups)


class _Decided:
    """What an attention call decides from its operands' layouts, global shapes and dtypes, this rank and its
    flags (`_signature`): the plan, the operands' layouts for it, the block orders, scale and dropout rate,
    this rank's slices of the probabilities and the result's layout, global and block shape. Kept per
    signature (`_PREPARED`): a repeated call checks and plans nothing again (only its seed, which changes)."""

    __slots__ = ("layouts", "plan", "first", "heads", "keys_t", "back", "scale", "drop", "dtype", "low", "q", "kv",
                 "probs_dtype", "out_dtype", "tk", "t_", "probs_shape", "region", "out", "shape", "block", "scores",
                 "groups", "stays", "flash", "tiles", "tile_rows", "above", "positions")


def _kernels(decided: _Decided, seed: Any, padding: Any, causal: bool, recompute: bool, kept: str) -> tuple:
    """(core, forward, saved): the unfused core's kernels for one call (`forward` fills `saved` with what the
    gradient rule keeps; `core`, the backward of `recompute`, computes the probabilities again)."""
    heads, keys_t, back, groups = decided.heads, decided.keys_t, decided.back, decided.groups
    scale, drop, dtype, low = decided.scale, decided.drop, decided.dtype, decided.low
    probs_shape, region = decided.probs_shape, decided.region

    def masked() -> Optional[np.ndarray]:
        """What the scores lose: this rank's query rows (global indices) against every key above the
        diagonal if causal (the signature's, `_decide`), and the padding keys; made where used (a recomputing
        backward keeps none: read from `decided` here, the closure holds no mask the graph would count as
        kept)."""
        above = decided.above
        if above is None and causal:  # the first real call's (a dry run's core makes no scores, so no mask)
            above = decided.above = _above(decided)
        if padding is not None:
            above = padding if above is None else above | padding
        return above

    # The core up to the weighted sum: the probabilities, their dropped-out values and the kept entries'
    # factor (keep is 0 or 1: the same bits as keep * factor after each product); None without dropout.
    # Per sample and head, (Tq, D) @ (D, Tk): batched BLAS products on the blocks' (b, h, ...) views
    # (np.einsum's own loops took several times as long). The backward of `recompute` calls it again.
    def masks(qb: np.ndarray, kb: np.ndarray) -> tuple:
        """(p, pd, factors, the boolean keep mask or None)."""
        s = grouped_product(qb.transpose(heads), kb.transpose(keys_t), groups) * scale
        above = masked()
        if above is not None:
            s = np.where(above, -np.inf, s)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / _SUM(e, axis=-1, keepdims=True)
        keep = MASKS.keep_mask(probs_shape, seed, region, drop) if drop else None
        factors = np.multiply(keep, np.asarray(1.0 / (1.0 - drop), np.float32 if low else dtype)) if drop else None
        if low:  # bfloat16: the scores and softmax in float32; p and its dropped-out values kept rounded
            p = rounded(p, dtype)
            return p, (p if factors is None else rounded(wide(p) * factors, dtype)), factors, keep
        return p, (p if factors is None else p * factors), factors, keep

    def core(qb: np.ndarray, kb: np.ndarray) -> tuple:
        return masks(qb, kb)[:3]

    saved: dict = {}  # p, pd and factors (or the keep mask) for the gradient rule (a dry run: zeros, below)

    def forward(qb: np.ndarray, kb: np.ndarray, vb: np.ndarray) -> np.ndarray:
        p, pd, factors, keep = masks(qb, kb)
        if not recompute:
            saved["p"], saved["pd"] = p, pd
            if kept == "megatron" and drop:  # the factor made again from the mask in the backward
                saved["keep"], saved["scale"] = keep, factors.dtype.type(1.0 / (1.0 - drop))  # float32 at bf16
            else:
                saved["factors"] = factors
        if low:  # (spmdsim.base.precision: a float32 product, rounded once)
            return rounded(grouped_product(pd, vb.transpose(heads), groups), dtype).transpose(back)
        if groups > 1:
            return grouped_product(pd, vb.transpose(heads), groups).transpose(back)
        return np.matmul(pd, vb.transpose(heads)).transpose(back)
    return core, forward, saved


def _dry_saved(saved: dict, decided: _Decided, kept: str) -> None:
    """What the gradient rule keeps, sized, in a dry run: the dry engine's zeros, never touched."""
    drop, dtype, low = decided.drop, decided.dtype, decided.low
    block = broadcast_zero(decided.scores, decided.probs_dtype)
    p = _engine_local(np.copy, block, block)
    saved.update(p=p, pd=_engine_local(np.copy, block, block) if drop else p)
    if kept == "megatron" and drop:
        bits = broadcast_zero(block.shape, bool)
        saved.update(keep=_engine_local(np.copy, bits, bits),
                     scale=(np.float32 if low else dtype.type)(1.0 / (1.0 - drop)))
    else:
        factors = broadcast_zero(block.shape, np.float32 if low else dtype)  # the kernel's dtype
        saved.update(factors=_engine_local(np.copy, factors, block) if drop else None)


def _signature(q: Any, k: Any, v: Any, causal: Any, scale: Any, dropout: Any, training: Any, mask: Any,
               batch_first: Any, recompute: Any, kept: Any, flash: Any = False,
               tile: Any = FLASH_TILE, positions: Any = None) -> Optional[tuple]:
    """A call's key in `_PREPARED`: q's, k's and v's layout objects' ids, global shapes and dtypes, q's rank and
    the flags; None for a call that takes the checks every time (a padding mask, flags or numbers not of the
    plain types, operands that are not DTensors)."""
    if (mask is not None or type(causal) is not bool or type(batch_first) is not bool or type(recompute) is not bool
            or type(training) is not bool or type(dropout) is not float or type(kept) is not str
            or scale is not None and type(scale) is not float or type(flash) is not bool or type(tile) is not int
            or positions is not None and type(positions) is not tuple):
        return None
    try:
        return (id(q._layout), id(k._layout), id(v._layout), q._shape, k._shape, v._shape, q._local.dtype,
                k._local.dtype, v._local.dtype, q._mesh.rank, causal, batch_first, recompute, training, dropout,
                scale, kept, flash, tile, None if positions is None else id(positions))
    except AttributeError:  # not DTensors: `_decide` says which
        return None


def _seed_checked(drop: float, seed: Any) -> None:
    """The refusal of `seed` for a dropout rate `drop` (None is refused only with dropout)."""
    if drop and seed is None:
        raise OperatorError("attention: dropout needs a seed (an integer, different per layer and step), so "
                            "every rank draws the same mask")
    if seed is not None:
        seed_arg(seed, "attention")


def _above(decided: Any) -> np.ndarray:
    """What a causal core's scores lose, this rank's query rows (global indices) against every key above the
    diagonal: made once per signature, by its first call that makes scores, not per call (read only: each call's
    scores take it as it is; a dry run's core makes none, so a dry run never holds the (Tq, Tk) mask)."""
    t_, where = decided.t_, decided.positions
    if where is not None:  # the sequence laid out in another order: its true positions
        above = where[None, :decided.tk] > where[t_][:, None]
        above.flags.writeable = False
        return above
    above = np.arange(decided.tk)[None, :] > np.arange(t_.start, t_.stop)[:, None]
    above.flags.writeable = False
    return above


def _decide(q: Any, k: Any, v: Any, causal: Any, scale: Any, dropout: Any, seed: Any, training: Any, mask: Any,
            batch_first: Any, recompute: Any, kept: Any, flash: Any = False, tile: Any = FLASH_TILE,
            positions: Any = None) -> _Decided:
    """`attention`'s checks (each refusal one clear line) and its `_Decided`."""
    raise_if_not_dtensors("attention", ("q", "k", "v"), q, k, v)
    _check_flags(causal, dropout, batch_first, recompute, kept, flash, tile, training)
    out = _Decided()
    out.drop = drop = float(dropout) if training else 0.0
    _seed_checked(drop, seed)
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_float("attention", t.local)
        if t.mesh is not q.mesh and t.mesh.layout != q.mesh.layout:  # two Mesh objects of one layout: one mesh
            raise OperatorError(f"attention: {name} is on mesh {t.mesh.layout}, q on {q.mesh.layout}; expected "
                                "one mesh")
    if mask is not None:
        raise_if_not_dtensors("attention", ("mask",), mask)
        if mask.local.dtype != np.dtype(bool):
            raise OperatorError(f"attention: mask must be a bool DTensor (True where a key takes part), got dtype "
                                f"{mask.local.dtype.name!r}")
        if mask.mesh.layout != q.mesh.layout:
            raise OperatorError(f"attention: mask is on mesh {mask.mesh.layout}, q on {q.mesh.layout}; expected "
                                "one mesh")
    refuse_empty("attention", tuple(q.global_shape), tuple(k.global_shape), 1 if batch_first else 0)
    out.first = first = _batch_first if batch_first else _swapped  # a layout or shape as batch-first, and back
    out.plan = plan = infer_attention(first(q.layout), first(k.layout), first(v.layout), first(tuple(q.global_shape)),
                                      first(tuple(k.global_shape)), first(tuple(v.global_shape)), bool(causal),
                                      None if mask is None else mask.layout,
                                      None if mask is None else tuple(mask.global_shape))
    # Each block seen as (b, h, t, d), k's as (b, h, d, t); a (b, h, t, e) product back in the operands' order.
    out.heads, out.keys_t, out.back = ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3)) if batch_first else \
        ((1, 2, 0, 3), (1, 2, 3, 0), (2, 0, 1, 3))
    d = q.global_shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif not isinstance(scale, Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise OperatorError(f"attention: scale {scale!r} must be a finite number")
    out.scale = scale
    out.layouts = (q.layout, k.layout, v.layout, positions)  # held: their ids (and the positions') key `_PREPARED`
    out.q, out.kv = first(plan.q), first(plan.kv)
    out.stays = q.layout == out.q and k.layout == out.kv and v.layout == out.kv  # none moves (`_moved`)
    rank, shape = q.mesh.rank, tuple(q.global_shape)
    b_, t_, h_ = first(out.q.slices(rank, shape)[:3])  # q's rows here, in the plan's layout
    out.t_, out.tk = t_, first(tuple(k.global_shape))[1]
    # What a causal core's scores lose (`_above`): made by the signature's first call that makes scores, kept
    out.above = None
    b, tq, h = first(shape)[:3]
    out.probs_shape, out.region = (b, h, tq, out.tk), (b_, h_, t_, slice(0, out.tk))
    out.dtype = q.dtype
    out.low = is_low(out.dtype)
    # The unfused core's blocks as numpy's promotion types them (q float32 with k or v float64: float64 scores or
    # result; bfloat16's q rounds both to q's dtype): what a dry run's zeros take, so that its result and the
    # blocks the rule keeps have the real run's dtype and bytes. (Flash's are q's dtype: its kernels round to it.)
    out.probs_dtype = out.dtype if out.low else np.result_type(q.dtype, k.dtype)
    out.out_dtype = out.dtype if out.low else np.result_type(out.probs_dtype, v.dtype)
    out.out, out.shape = first(plan.out), first(plan.shape)
    out.block = out.out.local_shape(out.shape, rank)
    out.scores = (b_.stop - b_.start, h_.stop - h_.start, t_.stop - t_.start, out.tk)
    out.groups = h // first(tuple(k.global_shape))[2]  # query heads per key/value head (1 without grouping)
    out.flash = bool(flash)
    out.positions = _positions(positions, causal, tuple(q.global_shape)[0 if not batch_first else 1], out.tk)
    # flash: this rank's query rows in tiles of `tile` rows, each (local start, stop, its region of the mask:
    # the same object each call, so the mask's draw reuses its plan); tile_rows: (rows, tiles of them)
    rows, tile = t_.stop - t_.start, int(tile)
    out.tiles = tuple((i, min(i + tile, rows), (b_, h_, slice(t_.start + i, t_.start + min(i + tile, rows)),
                                                  slice(0, out.tk))) for i in range(0, rows, tile)) if flash else ()
    out.tile_rows = tuple((n, c) for n, c in ((tile, rows // tile), (rows % tile, 1)) if n and c) if flash else ()
    return out


def _positions(positions: Any, causal: Any, tq: int, tk: int) -> Optional[np.ndarray]:
    """`positions` as an int array (read only), or None; refused in one line unless a permutation of the
    sequence's indices given with `causal`, queries and keys of one length."""
    if positions is None:
        return None
    where = np.asarray(positions)
    if not causal or tq != tk or where.shape != (tq,) or where.dtype.kind not in "iu" or \
            not np.array_equal(np.sort(where), np.arange(tq)):
        raise OperatorError(f"attention: positions must be a permutation of the sequence's {tq} indices, given "
                            f"with causal=True and as many keys as queries; got {len(where.reshape(-1))} positions, "
                            f"causal={causal!r}, {tk} keys")
    where = where.astype(np.int64)
    where.flags.writeable = False
    return where


def _check_flags(causal: Any, dropout: Any, batch_first: Any, recompute: Any, kept: Any, flash: Any,
                 tile: Any, training: Any = True) -> None:
    """`attention`'s refusals of its flags and numbers, each one clear line."""
    problem = kept_problem(kept)
    if problem:
        raise OperatorError(f"attention: {problem}")
    for name, value in (("causal", causal), ("batch_first", batch_first), ("recompute", recompute),
                        ("flash", flash), ("training", training)):
        flag("attention", name, value)
    if isinstance(tile, (bool, np.bool_)) or not isinstance(tile, (int, np.integer)) or tile < 1:
        raise OperatorError(f"attention: tile {tile!r} must be an integer >= 1 (query rows a flash tile takes)")
    if flash and recompute:
        raise OperatorError("attention: flash=True keeps no scores already (q, k, v, the output and each row's "
                            "log-sum-exp); recompute=True has nothing more to drop: pass one of them")
    if not isinstance(dropout, Real) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise OperatorError(f"attention: dropout {dropout!r} must be a number with 0 <= p < 1")


_PREPARED: dict = {}  # `_signature` -> `_Decided` (pure of the key; each entry holds the layouts its key names)


def _batch_first(x: Any) -> Any:
    return x


def _swapped(x: Any) -> Any:
    """A sequence-first layout, shape or slices as batch-first (the first two dims swapped), and back."""
    if isinstance(x, tuple):
        return (x[1], x[0]) + x[2:]
    seen = _SWAPPED.get(id(x))
    if seen is not None and seen[0] is x:
        return seen[1]
    entries = x.tensor_map
    out = TensorLayout(x.layout, (entries[1], entries[0]) + entries[2:], x.partial)
    put(_SWAPPED, id(x), (x, out), 1024)
    return out


# id(layout) -> (that layout, it with its first two dims swapped): a pure function of the layout, kept by
# the layout object (a step passes the same ones; a TensorLayout key hashes in Python), the entry holding it.
_SWAPPED: dict = {}


def _moved(x: Any, target: Any) -> Any:
    if x._layout is target or x._layout == target:
        return x

    return redistribute(x, target)
