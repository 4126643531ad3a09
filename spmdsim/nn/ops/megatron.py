"""Megatron-LM's fused transformer pieces, each one operator and one node that keeps only what its backward reads.

The GPT's ``kept="megatron"`` blocks (spmdsim.models.gpt.parallel; docs/howto/memory.md, "Memory") are built from
these, `ops.layer_norm(..., kept="megatron")`, `ops.gelu(..., kept="megatron")` and
`ops.attention(..., kept="megatron")`, so a block keeps Korthikanti et al.'s set (2022, table 2):

- ``column_parallel_linear(x, pairs, full)``: x @ W + b for one or several column-split weights (Q, K
  and V in one, as Megatron's fused QKV), x gathered along the sequence first when it comes as a
  sequence shard (`full`: its layout whole there). The node keeps x as it came (the shard) and gathers
  it again in the backward (one more Allgather, Megatron's), not the gathered x nor the output;
- ``row_parallel_linear(x, w, out_layout)``: x @ W, the pending sums Reduce_scattered onto the sequence
  or Allreduced (to `out_layout`); keeps x, not the pending product;
- ``bias_dropout_add(y, bias, residual, p, seed)``: residual + dropout(y + bias) (Megatron's
  bias_dropout_add_fused; bias None, a model without biases: residual + dropout(y), as Megatron's
  _bias_dropout_add_func); keeps the 1-byte boolean mask only;
- ``swiglu(z)``: silu(z[0]) * z[1] on fc1's stacked output (gate and up, one column-parallel product of two
  weights), Megatron's fused bias_swiglu (megatron/core/fusions/fused_bias_swiglu.py, its SwiGLUFunction);
  keeps z only, silu made again in the backward;
- ``rotary(x, cos, sin)``: the rotary embeddings, x cos + rotate_half(x) sin over the head dim (Megatron's
  apply_rotary_pos_emb with apply_rope_fusion, TransformerEngine's fused RoPE kernel); keeps no block of x: its
  backward is the inverse rotation of dY (dY cos + rotate_half^T(dY sin)), which reads the tables alone.

The values are the graph's (the same products and sums); the collectives of the forward are the
graph's, and the backward's are too but for the column products' Allgathers. Under a low-precision policy
(spmdsim.base.precision) each piece rounds where the graph's operators round, so the one reference
(spmdsim.models.gpt.mixed) checks both: a product of bfloat16 blocks is a float32 product rounded once to the
activations' dtype (a row-parallel product after its collective has summed it), the bias added to it and
rounded again; bias-dropout-add rounds y + bias, its dropped-out values and the residual sum, each once, as
the graph's three operators do (Megatron's jit-fused kernel may keep the first two in float32; spmdsim
rounds at the graph's points so that one reference checks both sets, at the policy's tolerances). SwiGLU
rounds as Megatron's fused kernel does and not as the graph's two nodes: silu(gate) * up in float32 on the
widened blocks, rounded once (the graph rounds silu's output, then the product); its backward's two halves in
float32, rounded once where fc1's rule reads them (spmdsim.models.gpt.mixed follows the kept set). The rotary
embeddings likewise round as the fused kernel: float32 tables (TransformerEngine's computes cos and sin in
float32; here the float64 tables rounded once to float32), x cos + rotate_half(x) sin in float32, rounded once;
the backward in float32 (the graph's x cos, turned halves times sin and sum each round, on bfloat16 tables). What
each node keeps is in the activations' dtype (bfloat16: 2 bytes an element), the masks 1 byte. Operands
are laid out as the GPT lays them (the weights' and biases' splits Megatron's); these are its building
blocks, not general operators.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...base.buffers import broadcast_zero
from ...references.activations import sigmoid
from ..autograd.kept import shell
from ..autograd.rules.shapes import record_reshape
from ..autograd.rules.megatron import (record_bias_dropout_add, record_column, record_rotary, record_row,
                                       record_swiglu, rotate_halves)
# the kernel; the dry engine's zeros, not computed
from ...runtime.engines import local as _engine_local, matmul as _engine_matmul
from ...errors import DTypeError, OperatorError
from ...base.flops import sweep
from ...layouts.layout import TensorLayout
from ...base.precision import is_low, rounded, wide
from ._common import add_bias, dry_zeros, local_matmul, make_dtensor
from .local import reshape as _reshape
from .masks import dropout_keep
from ...runtime.executor import redistribute
from ...base.tables import put

__all__ = ["column_parallel_linear", "row_parallel_linear", "bias_dropout_add", "swiglu", "rotary", "reshape"]


def _detached(t: Any) -> Any:
    """`t`'s block as a DTensor outside the graph (a move of it records no node)."""
    return type(t)._trusted(t.mesh, t.local, t.layout, t.global_shape)


def reshape(x: Any, shape: Sequence[int]) -> Any:
    """`spmdsim.nn.ops.reshape(x, shape)`, its node keeping a shell of x: the gradient is reshaped back by x's
    shape alone, so where the next piece keeps something else of x (an FP8 layer its e4m3 copy), x's block is
    not kept alive by the reshape (the attention core's output before the projection)."""
    out = _reshape(_detached(x), shape)
    return out if x._ag is None else record_reshape(out, shell(x))


def gathered(x: Any, full: TensorLayout) -> Any:
    """x laid out as `full` (an Allgather along the sequence; nothing when it is), recorded nowhere."""
    if x.layout == full:
        return x
    return (_REDISTRIBUTE or _redistribute())(_detached(x), full)


_REDISTRIBUTE: Any = None  # runtime.executor.redistribute, bound on first use (an import statement runs importlib)


def _redistribute() -> Any:
    global _REDISTRIBUTE

    _REDISTRIBUTE = redistribute
    return redistribute


def column_parallel_linear(x: Any, pairs: Sequence[tuple], full: Optional[TensorLayout] = None) -> Any:
    """x @ W_i + b_i for each (W_i, b_i or None) of `pairs`, the weights (in, out) split on out.

    x (..., in) is first laid out as `full` (default its own layout): with sequence parallelism an
    Allgather along the sequence. One pair: the output (..., out) split like W's columns; several:
    stacked on a new first dim, (n, ..., out) (Q, K and V of one node). The node keeps x as it came.
    """
    if not pairs:
        raise OperatorError("column_parallel_linear: no weights")
    full = x.layout if full is None else full
    entry = pairs[0][0].layout.tensor_map[-1]
    for w, b in pairs:
        if w.layout.tensor_map != ((),) + (entry,) or w.global_shape[0] != x.global_shape[-1]:
            raise OperatorError(f"column_parallel_linear: weight {tuple(w.global_shape)} {w.layout} is not split "
                                f"on its columns only, alike, with {x.global_shape[-1]} rows")
    X = gathered(x, full)
    low = is_low(x.dtype)
    ys = []
    for w, b in pairs:
        # bfloat16: a float32 product rounded once, as the graph's einsum (spmdsim.base.precision)
        y = _rounded(_engine_matmul(X.local, w.local), x.dtype) if low else local_matmul(X.local, w.local, False)
        if b is not None:  # a dry run's large sum: zeros of its shape (spmdsim.nn.ops._common.dry_zeros), not added
            add = _added_rounded if low else add_bias
            dry = dry_zeros(x.mesh, y.shape, _added_dtype(add, y.dtype, b.local.dtype), add, y, b.local) \
                if x.mesh.engine.dry else None
            try:
                y = add(y, b.local) if dry is None else dry
            except DTypeError:  # add_bias's refusal (numpy's DTypePromotionError): the same line as a dry run's
                raise _no_sum(y.dtype, b.local.dtype) from None
            sweep("bias_add", (y, b.local), (y,))
        ys.append(y)
    one, stacked = _column_layouts(full, entry)
    shape = tuple(x.global_shape[:-1]) + (pairs[0][0].global_shape[-1],)
    if len(ys) == 1:
        block, layout = ys[0], one
    else:
        like = broadcast_zero((len(ys),) + ys[0].shape, ys[0].dtype)
        block = _engine_local(np.stack, like, ys)
        layout, shape = stacked, (len(ys),) + shape
    out = make_dtensor(x.mesh, block, layout, shape)
    if x._ag is None and all(t is None or t._ag is None for pair in pairs for t in pair):
        return out
    return record_column(out, x, tuple(pairs), full, gathered)


_COLUMNS: dict = {}  # (x's full TensorLayout, the weights' column entry) -> `_column_layouts`'s answer


def _column_layouts(full: TensorLayout, entry: tuple) -> tuple:
    """(the output's layout: `full` with its last dim split as the weights' columns, the stacked output's: a
    whole first dim before it), made once per (full, entry): a step's linear layers ask for the same few."""
    key = (full, entry) if type(full) is TensorLayout else None
    made = None if key is None else _COLUMNS.get(key)
    if made is None:
        one = TensorLayout(full.layout, full.tensor_map[:-1] + (entry,))
        made = (one, TensorLayout(full.layout, ((),) + one.tensor_map))
        if key is not None:
            put(_COLUMNS, key, made, 1024)
    return made


def row_parallel_linear(x: Any, w: Any, out_layout: TensorLayout) -> Any:
    """x @ W with x (..., in) and W (in, out) split alike on in: the pending sums moved to `out_layout`
    (Reduce_scatter onto the sequence, or Allreduce). The node keeps x, not the pending product."""
    redistribute = _REDISTRIBUTE or _redistribute()
    if w.layout.tensor_map != (x.layout.tensor_map[-1], ()) or x.layout.partial:
        raise OperatorError(f"row_parallel_linear: x {x.layout} and weight {w.layout} are not split alike "
                            "on the contraction (and whole elsewhere)")
    local = _row_product_layout(x._layout)
    shape = tuple(x.global_shape[:-1]) + (w.global_shape[-1],)
    low = is_low(x.dtype)
    # bfloat16: the pending product float32 (precision.product), summed by the collective, then rounded once
    product = _engine_matmul(x.local, w.local) if low else local_matmul(x.local, w.local, True)
    out = redistribute(make_dtensor(x.mesh, product, local, shape), out_layout)
    if low:
        out = make_dtensor(x.mesh, _rounded(out.local, x.dtype), out.layout, out.global_shape)
    if x._ag is None and w._ag is None:
        return out
    return record_row(out, x, w, local, gathered)


def _row_product_layout(layout: TensorLayout) -> TensorLayout:
    """The layout of x @ W's pending product for x of `layout`: its last dim whole, pending over the axes that
    split it. One object per x layout, kept by value (x's layout is a new, equal object each step): the
    redistributions' table keys its layouts by object, and a new one every call made the product's move to
    the output, and the backward's gather of dY, be planned and compiled again each step."""
    seen = _ROW_PRODUCT.get(id(layout))
    if seen is not None and seen[0] is layout:
        return seen[1]
    out = _ROW_PRODUCT_BY_VALUE.get(layout)
    if out is None:
        axes = tuple(a for a in layout.tensor_map[-1] if layout.layout.axis_size(a) > 1)
        out = TensorLayout(layout.layout, layout.tensor_map[:-1] + ((),), axes)
        put(_ROW_PRODUCT_BY_VALUE, layout, out, 1024)
    put(_ROW_PRODUCT, id(layout), (layout, out), 1024)  # the entry holds the layout: its id is not reused meanwhile
    return out


def _bias_dropout_add(y: np.ndarray, bias: Optional[np.ndarray], residual: np.ndarray, keep: Optional[np.ndarray],
                      scale: np.generic) -> np.ndarray:
    """residual + (y + bias) * keep * scale (bias None: y; keep None: no dropout), in the blocks' dtype."""
    z = y if bias is None else y + bias
    return residual + (z if keep is None else z * np.multiply(keep, scale))


def _bias_dropout_add_low(y: np.ndarray, bias: Optional[np.ndarray], residual: np.ndarray,
                          keep: Optional[np.ndarray], scale: np.generic) -> np.ndarray:
    """`_bias_dropout_add` of bfloat16 blocks in float32, rounded at the graph's three points: y + bias (none
    without a bias), its dropped-out values (times the float32 factor), the residual sum."""
    dtype = y.dtype
    z = y if bias is None else rounded(wide(y) + wide(bias), dtype)
    if keep is not None:
        z = rounded(wide(z) * np.multiply(keep, scale), dtype)
    return rounded(wide(residual) + wide(z), dtype)


def _rounded(block: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float32 product or sum `block` rounded once to the activations' `dtype` (a dry run's zeros)."""
    return _engine_local(rounded, broadcast_zero(block.shape, dtype), block, dtype)


def _added_rounded(y: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """bfloat16 y + bias, in float32, rounded once to y's dtype (the graph's add)."""
    return rounded(wide(y) + wide(bias), y.dtype)


def _added_dtype(add: Any, dtype: np.dtype, bias: np.dtype) -> np.dtype:
    """The dtype `add` (`_added_rounded` or add_bias) gives a product of `dtype` and a bias of dtype `bias`: what a
    dry run's zeros take, as the real sum's (bfloat16 products: theirs, int32 biases too); `_no_sum`'s line where
    numpy has no common dtype of them (float16 beside bfloat16 before ml_dtypes 0.7)."""
    try:
        return add(np.zeros((), dtype), np.zeros((), bias)).dtype
    except DTypeError:  # add_bias's (numpy has no common dtype)
        raise _no_sum(dtype, bias) from None


def _no_sum(dtype: np.dtype, bias: np.dtype) -> DTypeError:
    """column_parallel_linear's refusal of a bias numpy cannot add to products of `dtype`, the same on every rank."""
    return DTypeError(f"column_parallel_linear: a bias of {bias.name} beside products of {dtype.name}: numpy has no "
                      f"common dtype of them; convert the bias first, e.g. b.astype({dtype.name!r})")


_ROW_PRODUCT: dict = {}  # id(x's layout) -> (that layout, _row_product_layout's answer)
_ROW_PRODUCT_BY_VALUE: dict = {}  # x's layout -> the one product layout object for layouts equal to it


def bias_dropout_add(y: Any, bias: Any, residual: Any, p: float, seed: Any = None,
                     mask_dims: Optional[Sequence[int]] = None) -> Any:
    """residual + dropout(y + bias, p) (`seed` and `mask_dims` as ops.dropout's; p 0: no dropout; bias None:
    residual + dropout(y), as Megatron's with no bias), y and residual laid out alike. The node keeps the boolean
    mask only (an add's backward reads no operand)."""
    if y.layout != residual.layout or y.global_shape != residual.global_shape:
        raise OperatorError(f"bias_dropout_add: y {y.layout} and residual {residual.layout} differ")
    mesh = y.mesh
    low = is_low(y.dtype)
    # A scalar (float32 at bfloat16, as ops.dropout's factor): the node keeps no array but the mask.
    scale = (np.float32 if low else y.dtype.type)(1.0 / (1.0 - p))
    keep = dropout_keep(y, p, seed, mask_dims, mesh.engine.dry) if p else None

    b = None if bias is None else bias.local
    like = y.local
    if not low and mesh.engine.dry:  # the real kernel's dtype: numpy's of the blocks (float16 y, a float32 bias)
        like = broadcast_zero(like.shape, _bias_dropout_add(*[None if a is None else np.zeros((), a.dtype)
                                                              for a in (like, b, residual.local)], None, scale).dtype)
    block = _engine_local(_bias_dropout_add_low if low else _bias_dropout_add, like, y.local, b,
                          residual.local, keep, scale)
    out = make_dtensor(mesh, block, y.layout, y.global_shape)
    sweep("bias_dropout_add", (y.local, b, residual.local), (out.local, keep))  # the mask drawn, written
    if y._ag is None and (bias is None or bias._ag is None) and residual._ag is None:
        return out
    return record_bias_dropout_add(out, y, bias, residual, keep, scale)


def _swiglu(z: np.ndarray) -> np.ndarray:
    """silu(z[0]) * z[1] in z's dtype (float64: the graph's silu and product, the same values)."""
    gate = z[0]
    return gate * sigmoid(gate) * z[1]


def _swiglu_low(z: np.ndarray) -> np.ndarray:
    """`_swiglu` of a bfloat16 block in float32 on the widened halves, rounded once (Megatron's fused kernel)."""
    gate, up = wide(z[0]), wide(z[1])
    return rounded(gate * sigmoid(gate) * up, z.dtype)


def swiglu(z: Any) -> Any:
    """silu(z[0]) * z[1] for z (2, ..., F) stacked as `column_parallel_linear` stacks two weights' products (fc1's
    gate and up), laid out whole on its first dim: one node that keeps z and no other block (Megatron's
    bias_swiglu; its biases, where the model has them, are fc1's node's)."""
    if z.global_shape[0] != 2 or z.layout.tensor_map[0] != () or z.layout.partial:
        raise OperatorError(f"swiglu: z {tuple(z.global_shape)} {z.layout} is not fc1's two stacked products "
                            "(2, ..., F), whole on its first dim")
    low = is_low(z.dtype)
    like = broadcast_zero(z.local.shape[1:], z.dtype)
    block = _engine_local(_swiglu_low if low else _swiglu, like, z.local)
    out = make_dtensor(z.mesh, block, TensorLayout(z.layout.layout, z.layout.tensor_map[1:]), tuple(z.global_shape[1:]))
    sweep("bias_swiglu", (z.local,), (out.local,))
    if z._ag is None:
        return out
    return record_swiglu(out, z)


def _rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x cos + rotate_half(x) sin of x (t, b, n, d) with tables (t, 1, 1, 2, d / 2), in the tables' dtype (float32
    beside bfloat16 x: its one rounding is the caller's)."""
    t, b, n, d = x.shape
    halves = x.reshape(t, b, n, 2, d // 2)
    if is_low(x.dtype):
        halves = wide(halves)
    return (halves * cos + rotate_halves(halves) * sin).reshape(t, b, n, d)


def _rotary_low(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    return rounded(_rotary(x, cos, sin), x.dtype)


def rotary(x: Any, cos: np.ndarray, sin: np.ndarray) -> Any:
    """The rotary embeddings of x (T, B, heads, head_dim), whole on its head dim: x cos + [-x2, x1]
    sin over the head dim's halves x1, x2 (rotate-half), `cos` and `sin` numpy tables (T, 1, 1, 2, head_dim / 2)
    of every position (float32 beside bfloat16 x, else x's dtype). One node that keeps no block of x."""
    T, d = x.global_shape[0], x.global_shape[-1]
    if len(x.global_shape) != 4 or x.layout.tensor_map[-1] != () or x.layout.partial:
        raise OperatorError(f"rotary: x {tuple(x.global_shape)} {x.layout} is not (T, B, heads, head_dim) whole on "
                            "its head dim")
    if cos.shape != (T, 1, 1, 2, d // 2) or sin.shape != cos.shape:
        raise OperatorError(f"rotary: tables {cos.shape} and {sin.shape}; expected {(T, 1, 1, 2, d // 2)}")
    if x.layout.tensor_map[0] != ():  # the sequence split (context parallelism): this rank's rows of the tables
        rows = x.slices[0]
        cos, sin = cos[rows], sin[rows]
    low = is_low(x.dtype)
    block = _engine_local(_rotary_low if low else _rotary, x.local, x.local, cos, sin)
    out = make_dtensor(x.mesh, block, x.layout, x.global_shape)
    sweep("rotary", (x.local, cos, sin), (out.local,))
    if x._ag is None:
        return out
    return record_rotary(out, x, cos, sin)
