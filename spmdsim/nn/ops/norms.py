"""Softmax over any dim, layer and RMS norms, causal masks and dropout on DTensors.

Built from the general rules (spmdsim.nn.ops.pointwise, reduce), so each
works on any layout and its gradient comes from theirs:

- ``softmax``/``log_softmax`` along a split dim: the row maximum by
  Allreduce(MAX), the sum of exponentials by Allreduce; no rank gathers a row.
  A whole dim takes the local kernel.
- ``layer_norm``/``rms_norm`` over the last dim (their program is
  spmdsim.programs.infer.norms'): split there (tensor
  parallel), the statistics are Allreduces of one number per row; split along
  the sequence instead (sequence parallel) or not at all, a row is whole on
  every rank: one local kernel and one autograd node with its own backward
  (not nine of the general rules), nothing moves forward, and the weight's
  gradient is a pending sum over the sequence axes that the backward resolves
  by Allreduce, as Megatron does.
- ``causal_mask`` builds only this rank's block; ``masked_fill`` is ``where``.
- ``dropout``: the mask of element i is a pure function of (seed, i) over the
  global index (spmdsim.SeededTensor), so replicas of a region draw the same
  mask and different regions independent ones, whatever the layout, and one
  numpy process reproduces it exactly.
"""
from __future__ import annotations

import operator
from numbers import Real
from typing import Any, Optional, Sequence

import numpy as np

from ...base.buffers import CAPTURE, broadcast_zero
from ...base.context import _THREAD  # the running thread's context (its engine, without current()'s call)
from ..autograd.graph import no_grad
from ..autograd.rules.norms import record_layer_norm, record_normalized, record_rms_norm
from ..autograd.kept import kept_problem
from ..autograd.rules.pointwise import record_dropout, record_dropout_mask
from ...runtime.engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ...errors import DTypeError, OperatorError, ShapeError
from ...base import flops as _flops
from ...base.flops import any_open, sweep
from ...programs.infer.norms import infer_norm
from ...base.precision import is_low, rounded, wide
from ...base.validate import as_int, shape_arg
from . import local as _whole
from . import pointwise as P
from . import reduce as R
from . import _common
from ._common import (
    KERNELS, dry_zeros, make_dtensor, raise_if_not_dtensors, shaped_as, require_float, seed_arg, ufunc_dtype,
)

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)
_ndarray = np.ndarray
_new = object.__new__

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "causal_mask", "masked_fill", "dropout",
           "resolved", "dropout_keep"]


def _whole_rows(kind: str, x: Any) -> bool:
    """``infer_norm(kind, x.layout, x.global_shape).whole``, kept by x's layout object (infer_norm's cache
    hashes and compares the layout in Python: ~100 opcodes a norm); the entry holds the layout."""
    layout = x._layout
    key = (kind, id(layout), x._shape)
    seen = _WHOLE.get(key)
    if seen is not None and seen[0] is layout:
        return seen[1]
    whole = infer_norm(kind, layout, x._shape).whole
    if len(_WHOLE) >= 1024:  # a long run over many layouts: start over
        _WHOLE.clear()
    _WHOLE[key] = (layout, whole)
    return whole


_WHOLE: dict = {}  # (norm kind, id(layout), global shape) -> (that layout, whether its rows are whole)


def resolved(x: Any) -> Any:
    """`x` with its pending sums added up (Allreduce; the same tensor when nothing is pending)."""
    if not x.layout.partial:
        return x
    from ...runtime.executor import redistribute

    return redistribute(x, x.layout.with_partial(()))


def _dim(x: Any, dim: Any, op: str) -> int:
    try:
        ndim = x.layout.ndim
    except AttributeError:
        raise_if_not_dtensors(op, ("x",), x)
        raise
    d = as_int(dim)
    if d is None or not -ndim <= d < ndim:
        raise OperatorError(f"{op}: dim {dim!r} is out of range for a tensor of {ndim} dims")
    require_float(op, x._local)  # (its dtype alone: the block's, captured or not)
    return d % ndim


def _shifted(x: Any, d: int) -> Any:
    """x minus its maximum along `d` (the shift carries no gradient: softmax does not depend on it)."""
    with no_grad():
        top = R.max(x, d, keepdims=True)
    return P.sub(x, top)


def softmax(x: Any, dim: int = -1) -> Any:
    """exp(x) / sum(exp(x)) along `dim`, which may be split (then two Allreduces of one number per row)."""
    d = _dim(x, dim, "softmax")
    x = resolved(x)
    if not x.layout.tensor_map[d]:
        return _whole.softmax(x, d)
    e = P.exp(_shifted(x, d))
    return P.div(e, resolved(R.sum(e, d, keepdims=True)))


def log_softmax(x: Any, dim: int = -1) -> Any:
    """x - logsumexp(x) along `dim` (split or whole)."""
    d = _dim(x, dim, "log_softmax")
    z = _shifted(resolved(x), d)
    return P.sub(z, P.log(resolved(R.sum(P.exp(z), d, keepdims=True))))


def _eps(eps: Any, op: str) -> float:
    if not isinstance(eps, Real) or isinstance(eps, bool) or not eps >= 0:
        raise OperatorError(f"{op}: eps {eps!r} must be a non-negative real number")
    return float(eps)


def _check_affine(op: str, x: Any, d: int, weight: Optional[Any], bias: Optional[Any] = None) -> None:
    """Refuse a weight or bias that is not a DTensor of shape (n,), n the size of x's normalized dim, as
    PyTorch does (a numpy array, or another shape, would fail inside the kernel or broadcast silently).
    Every step's norms ask: a DTensor of that shape is let through by one comparison (issue 58)."""
    n = x.global_shape[d]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None or getattr(t, "_shape", None) == (n,) and hasattr(t, "_ag"):  # a DTensor's own fields
            continue
        raise_if_not_dtensors(op, (name,), t)
        if tuple(t.global_shape) != (n,):
            raise ShapeError(f"{op}: {name} of shape {tuple(t.global_shape)!r} does not fit x's last dim "
                                f"of size {n} (x of shape {tuple(x.global_shape)!r}); expected shape ({n},)")


def _affine(y: Any, weight: Optional[Any], bias: Optional[Any]) -> Any:
    if weight is not None:
        y = P.mul(y, weight)
    if bias is not None:
        y = P.add(y, bias)
    return y


def _affine_dtypes(op: str, dtype: np.dtype, weight: Optional[Any], bias: Optional[Any]) -> tuple:
    """(the dtype of normalized values of `dtype` times `weight`, of that plus `bias`): the graph's ops.mul's and
    ops.add's (numpy's ufuncs': float32 for bfloat16 beside float32 or float16), which Megatron's fused norms give
    too, whatever the layout, real or dry; decided once per dtypes. A DTypeError naming `op` where no loop of
    numpy's takes them."""
    key = (dtype, None if weight is None else weight._local.dtype, None if bias is None else bias._local.dtype)
    out = _AFFINE_DTYPES.get(key)
    if out is None:
        try:
            scaled = dtype if key[1] is None else ufunc_dtype(dtype, key[1])
            out = (scaled, scaled if key[2] is None else ufunc_dtype(scaled, key[2]))
        except DTypeError as e:
            raise DTypeError(f"{op}: {e}") from None
        if len(_AFFINE_DTYPES) >= 256:
            _AFFINE_DTYPES.clear()
        _AFFINE_DTYPES[key] = out
    return out


_AFFINE_DTYPES: dict = {}  # (x's dtype, the weight's, the bias's; None: none) -> _affine_dtypes' answer


def _normalize(block: np.ndarray, d: int, n: int, eps: float, centre: bool) -> tuple[np.ndarray, np.ndarray]:
    """(y, 1 / sqrt(var + eps)) of rows along a whole dim `d` of `n` entries, in the composite's order of
    operations (its sums, products and quotient), so the values are the composite's."""
    inv = 1.0 / n
    c = block - _SUM(block, axis=d, keepdims=True) * inv if centre else block
    var = _SUM(c * c, axis=d, keepdims=True) * inv
    root = np.sqrt(var + eps)
    return c / root, 1.0 / root


def _normalized(x: Any, d: int, eps: float, centre: bool, op: str) -> Any:
    """layer_norm's (``centre``) or rms_norm's normalization along a whole dim: one local kernel and one
    autograd node (spmdsim.nn.autograd.rules.norms: dX = r (dY - mean(dY) - y mean(dY y)), rms without
    mean(dY), shard by shard).

    The composite of the general rules would take nine operators (and their nodes) where a row is whole on
    every rank: the sequence-parallel and replicated layer norms of a transformer.
    """
    out, y, kept = normal_values(x, d, eps, centre, op)
    if x._ag is None:
        return out
    return record_normalized(out, x, y, kept, d, centre, op)


def normal_values(x: Any, d: int, eps: float, centre: bool, op: str) -> tuple:
    """`_normalized`'s forward without its node: (the normalized DTensor, its block, {"rstd": 1 / sqrt(var +
    eps)} kept for the rule where x takes a gradient: a dry run's zeros), its kernel counted
    (spmdsim.nn.ops.fused.norm_affine records it with its weight and bias as one node)."""
    n = x._shape[d]
    kept: dict[str, np.ndarray] = {}  # 1 / sqrt(var + eps), for the gradient rule (a dry run's: zeros)
    if not CAPTURE.on and (local := x._local).dtype.kind != "V" and not _THREAD.context.engine.dry:
        # The kernel below on the running engine, called as that engine calls it, without its frames: no
        # bfloat16 block to widen, y rounded only where its dtype is not the block's (`rounded`'s test)
        # `_normalize` written out (its numpy calls, in its order: the same values), without its frame and tuple
        inv = 1.0 / n
        c = local - _SUM(local, axis=d, keepdims=True) * inv if centre else local
        root = np.sqrt(_SUM(c * c, axis=d, keepdims=True) * inv + eps)
        y = c / root
        kept["rstd"] = 1.0 / root
        if type(y) is _ndarray and y.dtype is local.dtype and y.shape == local.shape and y.flags.c_contiguous \
                and _common._DTENSOR is not None:  # shaped_as's usual case, its DTensor built here
            out = _new(_common._DTENSOR)
            out._mesh, out._local, out._layout, out._shape, out._ag = x._mesh, y, x._layout, x._shape, None
        else:
            if y.dtype != local.dtype:
                y = rounded(y, local.dtype)
            out = shaped_as(x, y, x._layout)
    else:
        def kernel(block: np.ndarray) -> np.ndarray:
            # bfloat16: the statistics and y in float32, y rounded once (spmdsim.base.precision)
            y, kept["rstd"] = _normalize(wide(block), d, n, eps, centre)
            return rounded(y, block.dtype)

        local = x._local if not CAPTURE.on else x.local  # this rank's block, read once (captured: its record's view)
        y = _engine_local(kernel, local, local)
        out = shaped_as(x, y, x._layout)
    if _flops._OPEN:  # (any_open()'s test, without its call) else nothing is counted: no blocks to gather
        rows = local.shape[:d] + (1,) + local.shape[d + 1:]
        sweep(op, (local,), (y, (rows, y.dtype) if x._ag is not None else None))  # y and the kept 1 / root
    if x._ag is not None and x.mesh.engine.dry:  # the rstd the rule keeps, sized (the dry engine's zeros): kept
        rows = local.shape[:d] + (1,) + local.shape[d + 1:]
        stat = np.float32 if is_low(y.dtype) else y.dtype  # bytes measure alike (bfloat16's statistics: float32)
        kept["rstd"] = _engine_local(np.copy, broadcast_zero(rows, stat), y)
    return out, y, kept


def layer_norm(x: Any, weight: Optional[Any] = None, bias: Optional[Any] = None, eps: float = 1e-5,
               kept: str = "graph") -> Any:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance, as PyTorch).

    `kept` (rows whole on every rank; split rows take the composite either way): "graph", one node
    (spmdsim.nn.ops.fused.norm_affine) keeping what the normalization's, the weight's and the bias's nodes would
    keep (x, its normalized values and 1 / sqrt(var + eps), the product and the sum); "megatron", one node keeping x and each row's mean and standard
    deviation (Apex's fused layer norm: 2 numbers a row), which makes the rest again in the backward.
    """
    try:  # a call like one that passed the checks below: x's layout object, shape and dtype, eps, kept and
        # the weight's and bias's shapes (each a DTensor's) as then
        layout = x._layout
        key = (id(layout), x._shape, x._local.dtype, type(eps), eps, kept,
               None if weight is None else weight._shape, None if bias is None else bias._shape)
        seen = _LAYER_NORMS.get(key)
    except (AttributeError, TypeError):  # not DTensors, or what does not hash: the checks say which
        seen = key = None
    if (seen is not None and seen[0] is layout and (weight is None or hasattr(weight, "_ag"))
            and (bias is None or hasattr(bias, "_ag"))):
        d, eps, whole = seen[1]
        if layout.partial:
            x = resolved(x)
    else:
        d = _dim(x, -1, "layer_norm")
        eps = _eps(eps, "layer_norm")
        problem = kept_problem(kept)
        if problem:
            raise OperatorError(f"layer_norm: {problem}")
        _check_affine("layer_norm", x, d, weight, bias)
        x = resolved(x)
        whole = _whole_rows("layer_norm", x)
        if key is not None:  # (None: not DTensors, or a key that does not hash)
            if len(_LAYER_NORMS) >= 1024:  # a long run over many shapes: start over
                _LAYER_NORMS.clear()
            _LAYER_NORMS[key] = (layout, (d, eps, whole))
    if whole:
        if kept == "megatron":
            return _fused_layer_norm(x, d, eps, weight, bias)
        return (_NORM_AFFINE or _norm_affine())(x, d, eps, True, "layer_norm", weight, bias)
    # bfloat16: the statistics and the normalized values in float32, those rounded once (the whole rows' kernel's)
    dt, low = x.dtype, is_low(x.dtype)
    if low:
        x = P.astype(x, np.float32)
    inv = 1.0 / x.global_shape[d]
    centred = P.sub(x, P.mul(resolved(R.sum(x, d, keepdims=True)), inv))
    var = P.mul(resolved(R.sum(P.mul(centred, centred), d, keepdims=True)), inv)
    y = P.div(centred, P.sqrt(P.add(var, eps)))
    return _affine(P.astype(y, dt) if low else y, weight, bias)


# (id(x's layout), x's global shape and dtype, eps's type and value, kept, the weight's and bias's global shapes)
# -> (that layout, (the normalized dim, eps as a float, whether rows are whole)): what layer_norm's checks
# passed and decided for such a call, a pure function of its key; the entry holds the layout.
_LAYER_NORMS: dict = {}


def _fused_layer_norm(x: Any, d: int, eps: float, weight: Optional[Any], bias: Optional[Any]) -> Any:
    """layer_norm along a whole last dim as one node that keeps x and each row's mean and standard
    deviation (spmdsim.nn.autograd.rules.norms.record_layer_norm); the values are the composite's. bfloat16:
    the statistics float32 (Apex's), and the normalized values, times weight and plus bias each rounded
    once, where the graph's (spmdsim.nn.ops.fused.norm_affine) rounds them (spmdsim.base.precision)."""
    n = x.global_shape[d]
    w, b = _replicated(weight), _replicated(bias)
    low = is_low(x.dtype)
    stats: dict[str, np.ndarray] = {}  # the rows' mean and sqrt(var + eps) (a dry run's: zeros)

    def kernel(block: np.ndarray) -> np.ndarray:
        inv = 1.0 / n
        dt, block = block.dtype, wide(block)
        stats["mean"] = mean = _SUM(block, axis=d, keepdims=True) * inv
        c = block - mean
        stats["root"] = root = np.sqrt(_SUM(c * c, axis=d, keepdims=True) * inv + eps)
        y = c / root
        if low:  # each rounded once to what the graph's ops.mul and ops.add give (float32 beside float32)
            y = rounded(y, dt)
            if w is not None:
                y = rounded(wide(y) * wide(w.local), scaled)
            if b is not None:
                y = rounded(wide(y) + wide(b.local), dtype)
            return y
        if w is not None:
            y = y * w.local
        if b is not None:
            y = y + b.local
        return y

    scaled, dtype = _affine_dtypes("layer_norm", x.dtype, w, b)
    out = make_dtensor(x.mesh, _engine_local(kernel, broadcast_zero(x.local.shape, dtype), x.local),
                       x.layout, x.global_shape)
    stat = np.dtype(np.float32) if low else x.dtype  # bfloat16's statistics are float32
    rows = (x.local.shape[:d] + (1,) + x.local.shape[d + 1:], stat)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("layer_norm", (x.local, None if w is None else w.local, None if b is None else b.local),
              (out.local, rows, rows))  # y and each row's mean and root
    if all(t is None or t._ag is None for t in (x, w, b)):
        return out
    if x.mesh.engine.dry:  # the statistics the rule keeps, sized (the dry engine's zeros)
        rows = broadcast_zero(x.local.shape[:d] + (1,) + x.local.shape[d + 1:], stat)
        stats.update(mean=_engine_local(np.copy, rows, rows), root=_engine_local(np.copy, rows, rows))
    return record_layer_norm(out, x, w, b, stats, d)


def _replicated(t: Optional[Any]) -> Optional[Any]:
    """`t` whole on every rank (moved there when it is split or pending), or None."""
    if t is None:
        return None
    target = t.mesh.layout(*([None] * t.layout.ndim))
    if t.layout == target:
        return t
    from ...runtime.executor import redistribute

    return redistribute(t, target)


def rms_norm(x: Any, weight: Optional[Any] = None, eps: float = 1e-6, kept: str = "graph") -> Any:
    """x / sqrt(mean(x ** 2) + eps) * weight over the last dim.

    `kept` (rows whole on every rank; split rows take the composite either way): "graph", one node
    (spmdsim.nn.ops.fused.norm_affine) keeping what the normalization's and the weight's nodes would keep (x, its
    normalized values and 1 / sqrt(mean(x ** 2) + eps), the product); "megatron", one node keeping x and each row's root (TransformerEngine's fused RMSNorm,
    whose forward saves its input and rsigma, one number a row), which makes the normalized values again in the
    backward.
    """
    d = _dim(x, -1, "rms_norm")
    eps = _eps(eps, "rms_norm")
    problem = kept_problem(kept)
    if problem:
        raise OperatorError(f"rms_norm: {problem}")
    _check_affine("rms_norm", x, d, weight)
    x = resolved(x)
    if _whole_rows("rms_norm", x):
        if kept == "megatron":
            return _fused_rms_norm(x, d, eps, weight)
        return (_NORM_AFFINE or _norm_affine())(x, d, eps, False, "rms_norm", weight, None)
    dt, low = x.dtype, is_low(x.dtype)  # bfloat16: as layer_norm's
    if low:
        x = P.astype(x, np.float32)
    ms = P.mul(resolved(R.sum(P.mul(x, x), d, keepdims=True)), 1.0 / x.global_shape[d])
    y = P.div(x, P.sqrt(P.add(ms, eps)))
    return _affine(P.astype(y, dt) if low else y, weight, None)


def _fused_rms_norm(x: Any, d: int, eps: float, weight: Optional[Any]) -> Any:
    """rms_norm along a whole last dim as one node that keeps x and each row's root sqrt(mean(x ** 2) + eps)
    (spmdsim.nn.autograd.rules.norms.record_rms_norm; TransformerEngine keeps its inverse, rsigma: the same
    bytes); the values are the composite's. bfloat16: as the fused kernel, the root and x / root in float32,
    times the widened weight in float32 and rounded once (the graph's norm rounds the normalized values,
    then their product with the weight)."""
    n = x.global_shape[d]
    w = _replicated(weight)
    low = is_low(x.dtype)
    stats: dict[str, np.ndarray] = {}  # the rows' sqrt(mean(x ** 2) + eps) (a dry run's: zeros)

    def kernel(block: np.ndarray) -> np.ndarray:
        block = wide(block)
        stats["root"] = root = np.sqrt(_SUM(block * block, axis=d, keepdims=True) * (1.0 / n) + eps)
        y = block / root
        if w is not None:
            y = y * (wide(w.local) if low else w.local)
        return rounded(y, dtype) if low else y  # (dtype: the graph's ops.mul's: float32 beside float32)

    dtype = _affine_dtypes("rms_norm", x.dtype, w, None)[1]
    out = make_dtensor(x.mesh, _engine_local(kernel, broadcast_zero(x.local.shape, dtype), x.local),
                       x.layout, x.global_shape)
    stat = np.dtype(np.float32) if low else x.dtype  # bfloat16's statistics are float32
    rows = (x.local.shape[:d] + (1,) + x.local.shape[d + 1:], stat)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("rms_norm", (x.local, None if w is None else w.local), (out.local, rows))  # y and each row's root
    if all(t is None or t._ag is None for t in (x, w)):
        return out
    if x.mesh.engine.dry:  # the statistics the rule keeps, sized (the dry engine's zeros)
        rows = broadcast_zero(x.local.shape[:d] + (1,) + x.local.shape[d + 1:], stat)
        stats["root"] = _engine_local(np.copy, rows, rows)
    return record_rms_norm(out, x, w, stats, d)


def causal_mask(mesh: Any, shape: Any, layout: Any = None) -> Any:
    """A bool DTensor, True where the last dim's index exceeds the second last's (keys after the query).

    `layout`: its TensorLayout (default replicated); only this rank's block is built.
    """
    shape = shape_arg(shape, "causal_mask shape")
    if len(shape) < 2:
        raise OperatorError(f"causal_mask shape {shape!r} needs at least 2 dims (queries, keys)")
    layout = mesh.layout(*([None] * len(shape))) if layout is None else layout
    if mesh.engine.dry:  # a large mask: the engine's zeros of its block (spmdsim.runtime.sim.dry), neither built nor kept
        dry = dry_zeros(mesh, layout.local_shape(shape, mesh.rank), bool, np.greater)
        if dry is not None:
            return make_dtensor(mesh, dry, layout, shape)
    key = (layout, mesh.rank, shape)
    block = _MASKS.get(key)
    if block is None:
        region = layout.slices(mesh.rank, shape)
        rows = np.arange(region[-2].start, region[-2].stop)[:, None]
        cols = np.arange(region[-1].start, region[-1].stop)[None, :]
        block = np.broadcast_to(cols > rows, layout.local_shape(shape, mesh.rank)).copy()
        if len(_MASKS) >= 256:  # many shapes or layouts: start over
            _MASKS.clear()
        _MASKS[key] = block
    return make_dtensor(mesh, block.copy(), layout, shape)  # the caller's own block, as before


# (layout, rank, global shape) -> that rank's mask block: a transformer asks for the same one in
# every layer of every step, and working out the region cost more than copying the block.
_MASKS: dict = {}


def masked_fill(x: Any, mask: Any, value: float) -> Any:
    """x with `value` where the bool DTensor `mask` is True (broadcasting), e.g. -inf above the diagonal."""
    raise_if_not_dtensors("masked_fill", ("x", "mask"), x, mask)
    if mask.local.dtype != np.dtype(bool):
        raise OperatorError(f"masked_fill: mask must be a bool DTensor, got dtype {mask.local.dtype.name!r}; "
                            "compare first (ids == 0, x < 0) or use ops.causal_mask")
    return P.where(mask, value, x)



def dropout_args(p: Any, seed: Any) -> None:
    """`dropout`'s refusals of its rate and seed (spmdsim.nn.ops.fused's residual makes the same)."""
    if not isinstance(p, Real) or isinstance(p, bool) or not 0 <= p < 1:
        raise OperatorError(f"dropout: p {p!r} must be a number with 0 <= p < 1")
    if seed is None:
        raise OperatorError("dropout: a seed is required (an integer, different per layer and step, e.g. "
                            "ops.dropout(x, 0.1, seed=1000 * step + layer)), so every rank draws the same mask")
    seed_arg(seed, "dropout")


def dropout(x: Any, p: float, seed: Optional[int] = None, training: bool = True,
            mask_dims: Optional[Sequence[int]] = None, kept: str = "graph") -> Any:
    """Zero each element with probability `p` and scale the rest by 1 / (1 - p); identity when not training.

    The mask is ``SeededTensor(x.global_shape, seed=seed) >= p`` read at this rank's region, so the
    result does not depend on the layout; a pending sum stays pending (dropout is linear). `seed` is
    required: no default could give each layer and step its own mask. `mask_dims`: a permutation of x's
    dims; the mask is then the one ``x.transpose(mask_dims)`` would get, read through a view (a
    sequence-first (T, B, D) x with (1, 0, 2) drops what its batch-first twin drops, with no copy).
    `kept`: what the node keeps for backward: "graph", the kept entries' float factor and x's block;
    "megatron", the 1-byte boolean mask only (the backward multiplies by mask and 1 / (1 - p)).
    """
    dropout_args(p, seed)
    problem = kept_problem(kept)
    if problem:
        raise OperatorError(f"dropout: {problem}")
    if not hasattr(x, "_layout"):
        raise_if_not_dtensors("dropout", ("x",), x)
    if not training or p == 0:
        return x
    local = x.local  # this rank's block, read once (a captured step: its record's view)
    require_float("dropout", local)
    # The kept entries' factor, once: x * (keep * scale) is x * keep * scale bit for bit (keep is 0 or 1),
    # one product forward and one backward.
    # bfloat16: the factor in float32 and x * factor rounded once (spmdsim.base.precision)
    low = is_low(x.dtype)
    scale = np.asarray(1.0 / (1.0 - p), np.float32 if low else x.dtype)
    # A dry run's large block (spmdsim.nn.ops._common.dry_zeros): zeros, forward and backward, no mask drawn.
    dry = dry_zeros(x.mesh, local.shape, local.dtype, np.multiply, local, scale)
    if kept == "megatron":
        keep = dropout_keep(x, p, seed, mask_dims, dry is not None)
        if dry is not None:
            block = dry
        else:  # bfloat16: x times the float32 factor, rounded once (the graph's values)
            block = rounded(wide(local) * np.multiply(keep, scale), x.dtype) if low else local * np.multiply(
                keep, scale)
        out = shaped_as(x, block, x._layout)
        if any_open():  # else nothing is counted: no blocks to gather
            sweep("dropout", (local,), (out.local, keep))  # the mask drawn in the kernel and written
        return out if x._ag is None else record_dropout_mask(out, x, keep, scale.dtype.type(scale))
    order, mask_shape, mask_region, back = _mask_geometry(x, mask_dims)
    if dry is not None:  # the factors the rule keeps, sized (zeros never touched): kept bytes measure alike
        like = broadcast_zero(dry.shape, scale.dtype)  # the factors' dtype (float32 at bfloat16)
        factors = None if x._ag is None else _engine_local(np.copy, like, dry)
    elif order is None:
        factors = np.multiply(KERNELS.keep_mask(mask_shape, seed, mask_region, p), scale)
    else:
        factors = np.multiply(KERNELS.keep_mask(mask_shape, seed, mask_region, p), scale).transpose(back)
    if dry is not None:
        block = dry
    else:
        block = rounded(wide(local) * factors, x.dtype) if low else local * factors
    out = shaped_as(x, block, x._layout)
    # the kept entries' factors drawn in the kernel and written beside the result
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("dropout", (local,), (out.local, local))
    return out if x._ag is None else record_dropout(out, x, factors, scale)


def dropout_keep(x: Any, p: float, seed: Any, mask_dims: Optional[Sequence[int]], dry: bool) -> np.ndarray:
    """This rank's boolean keep mask of `dropout` on x (shaped like x's block; with `mask_dims`, a view);
    `dry`: a dry run's zeros of its size, not drawn (pages never touched)."""
    if dry:
        like = broadcast_zero(x.local.shape, bool)
        return _engine_local(np.copy, like, like)
    order, mask_shape, mask_region, back = _mask_geometry(x, mask_dims)
    keep = KERNELS.keep_mask(mask_shape, seed, mask_region, p)
    return keep if order is None else keep.transpose(back)


def _mask_geometry(x: Any, mask_dims: Any) -> tuple:
    """(the permutation `mask_dims` checked, or None; the mask's global shape and this rank's region of it,
    in that order; the permutation that puts the mask's dims back in x's) for dropout on x: a function of
    x's layout, global shape and rank and of `mask_dims`, remembered by the layout object (a step's
    dropouts ask for the same few; the entry holds the layout, so its id is not reused)."""
    layout, shape, rank = x._layout, x._shape, x._mesh.rank
    key = (id(layout), shape, rank, mask_dims)
    try:
        seen = _GEOMETRY.get(key)
    except TypeError:  # mask_dims as a list: worked out each time
        seen = key = None
    if seen is not None and seen[0] is layout:
        return seen[1]
    region = layout.slices(rank, shape)
    if mask_dims is None:
        out = (None, tuple(shape), region, None)
    else:
        order = _permutation(mask_dims, len(region))
        out = (order, tuple(shape[d] for d in order), tuple(region[d] for d in order),
               tuple(np.argsort(order).tolist()))
    if key is not None and type(shape) is tuple:
        if len(_GEOMETRY) >= 1024:  # a long run over many layouts: start over
            _GEOMETRY.clear()
        _GEOMETRY[key] = (layout, out)
    return out


_GEOMETRY: dict = {}  # (id(layout), global shape, rank, mask_dims) -> (that layout, _mask_geometry's answer)


def _permutation(dims: Any, ndim: int) -> tuple:
    """`dims` as a tuple of ints, checked to be a permutation of range(ndim)."""
    try:
        order = tuple(operator.index(d) for d in dims)
    except TypeError:
        order = None
    if order is None or sorted(order) != list(range(ndim)):
        raise OperatorError(f"dropout: mask_dims {dims!r} must be a permutation of the tensor's {ndim} dims, "
                            f"e.g. {tuple(range(ndim))[::-1]!r}")
    return order


# The graph's fused norm with its weight and bias (its module reads `normal_values` above).
_NORM_AFFINE: Any = None  # spmdsim.nn.ops.fused.norm_affine, once imported (fused imports this module: no cycle at import)


def _norm_affine() -> Any:
    """spmdsim.nn.ops.fused.norm_affine (the graph-mode norm and its weight and bias as one node), imported at its
    first use: spmdsim.nn.ops.fused imports this module's kernels."""
    global _NORM_AFFINE
    from .fused import norm_affine

    _NORM_AFFINE = norm_affine
    return norm_affine
