"""Softmax over any dim, and layer and RMS norms, on DTensors.

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

Causal masks and dropout: spmdsim.nn.ops.masks; the norms' row kernel: spmdsim.nn.ops.normalize.
"""
from __future__ import annotations

from numbers import Real
from typing import Any, Optional

import numpy as np

from ...base.buffers import broadcast_zero
from ..autograd.graph import no_grad
from ..autograd.rules.norms import record_layer_norm, record_rms_norm
from ..autograd.kept import kept_problem
from ...runtime.engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ...errors import DTypeError, OperatorError, ShapeError
from ...base.flops import any_open, sweep
from ...programs.infer.norms import infer_norm
from ...base.precision import is_low, rounded, wide
from ...base.validate import as_int, dims_expected
from ...layouts.layout import TensorLayout
from . import local as _whole, reduce as R, ufuncs as P
from .norm_affine import norm_affine
from ._common import dim_or_axis, make_dtensor
from ._operands import raise_if_not_dtensors, require_float, ufunc_dtype
from ...runtime.executor import redistribute
from ...base.tables import put

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)
_ndarray = np.ndarray
_new = object.__new__

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "resolved"]


def _whole_rows(kind: str, x: Any) -> bool:
    """``infer_norm(kind, x.layout, x.global_shape).whole``, kept by x's layout object (infer_norm's cache
    hashes and compares the layout in Python: ~100 opcodes a norm); the entry holds the layout."""
    layout = x._layout
    key = (kind, id(layout), x._shape)
    seen = _WHOLE.get(key)
    if seen is not None and seen[0] is layout:
        return seen[1]
    whole = infer_norm(kind, layout, x._shape).whole
    put(_WHOLE, key, (layout, whole), 1024)
    return whole


_WHOLE: dict = {}  # (norm kind, id(layout), global shape) -> (that layout, whether its rows are whole)


def resolved(x: Any) -> Any:
    """`x` with its pending sums added up (Allreduce; the same tensor when nothing is pending)."""
    try:
        if not x.layout.partial:
            return x
    except AttributeError:
        raise_if_not_dtensors("resolved", ("x",), x)
        raise

    return redistribute(x, x.layout.with_partial(()))


def _dim(x: Any, dim: Any, op: str) -> int:
    try:
        ndim = x.layout.ndim
    except AttributeError:
        raise_if_not_dtensors(op, ("x",), x)
        raise
    d = as_int(dim)
    if d is None or not -ndim <= d < ndim:
        raise OperatorError(f"{op}: dim {dim!r} is out of range for a tensor of {ndim} dims "
                            + dims_expected(ndim))
    require_float(op, x._local)  # (its dtype alone: the block's, captured or not)
    return d % ndim


def _shifted(x: Any, d: int) -> Any:
    """x minus its maximum along `d` (the shift carries no gradient: softmax does not depend on it); a dim of
    size 0 has no maximum and nothing to shift (x as it is)."""
    if not x.global_shape[d]:
        return x
    with no_grad():
        top = R.max(x, d, keepdims=True)
    return P.sub(x, top)


def softmax(x: Any, dim: int = -1, *, axis: Any = None) -> Any:
    """exp(x) / sum(exp(x)) along `dim`, which may be split (then two Allreduces of one number per row).

    JAX's ``axis=`` is taken for `dim`."""
    d = _dim(x, dim_or_axis("softmax", dim, axis, -1), "softmax")
    x = resolved(x)
    if not x.layout.tensor_map[d]:
        return _whole.softmax(x, d)
    e = P.exp(_shifted(x, d))
    return P.div(e, resolved(R.sum(e, d, keepdims=True)))


def log_softmax(x: Any, dim: int = -1, *, axis: Any = None) -> Any:
    """x - logsumexp(x) along `dim` (split or whole).

    JAX's ``axis=`` is taken for `dim`."""
    d = _dim(x, dim_or_axis("log_softmax", dim, axis, -1), "log_softmax")
    z = _shifted(resolved(x), d)
    return P.sub(z, P.log(resolved(R.sum(P.exp(z), d, keepdims=True))))


def _normalized_dim(x: Any, op: str) -> int:
    """x's last dim, the one layer_norm and rms_norm normalize over (`_dim`'s checks), refused where it has no
    entries: the mean and variance of nothing have no value to divide by (its 1 / n divided by zero)."""
    d = _dim(x, -1, op)
    if not x.global_shape[d]:
        raise OperatorError(f"{op} of x of shape {tuple(x.global_shape)!r}: its last dim, the one it normalizes over, "
                            "has size 0 (no entries to take a mean of); expected at least 1 entry")
    return d


def _eps(eps: Any, op: str) -> float:
    if not isinstance(eps, Real) or isinstance(eps, bool) or not eps >= 0:
        raise OperatorError(f"{op}: eps {eps!r} must be a non-negative real number")
    return float(eps)


def _check_affine(op: str, x: Any, d: int, weight: Optional[Any], bias: Optional[Any] = None) -> None:
    """Refuse a weight or bias that is not a DTensor of shape (n,), n the size of x's normalized dim, as
    PyTorch does (a numpy array, or another shape, would fail inside the kernel or broadcast silently).
    Every step's norms ask: a DTensor of that shape is let through by one comparison."""
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
        put(_AFFINE_DTYPES, key, out, 256)
    return out


_AFFINE_DTYPES: dict = {}  # (x's dtype, the weight's, the bias's; None: none) -> _affine_dtypes' answer


def layer_norm(x: Any, weight: Optional[Any] = None, bias: Optional[Any] = None, eps: float = 1e-5,
               kept: str = "graph") -> Any:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance, as PyTorch).

    bfloat16 x: computed in float32 and rounded once, as TransformerEngine's fused LayerNorm (docs/howto/bf16.md,
    "Rounding points"), one node keeping x and each row's statistics whatever `kept` says.

    `kept` (rows whole on every rank; split rows take the composite either way): "graph", one node
    (spmdsim.nn.ops.norm_affine) keeping what the normalization's, the weight's and the bias's nodes would
    keep (x, its normalized values and 1 / sqrt(var + eps), the product and the sum); "megatron", one node keeping x and
    each row's mean and standard deviation (Apex's fused layer norm: 2 numbers a row), which makes the rest again
    in the backward.
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
        d = _normalized_dim(x, "layer_norm")
        eps = _eps(eps, "layer_norm")
        problem = kept_problem(kept)
        if problem:
            raise OperatorError(f"layer_norm: {problem}")
        _check_affine("layer_norm", x, d, weight, bias)
        x = resolved(x)
        whole = _whole_rows("layer_norm", x)
        if key is not None:  # (None: not DTensors, or a key that does not hash)
            put(_LAYER_NORMS, key, (layout, (d, eps, whole)), 1024)
    if whole:
        if kept == "megatron" or is_low(x._local.dtype):  # bfloat16: the fused kernel whatever `kept` says
            return _fused_layer_norm(x, d, eps, weight, bias)
        return norm_affine(x, d, eps, True, "layer_norm", weight, bias)
    # bfloat16: the statistics, the normalized values, times weight and plus bias in float32, rounded once
    out, low = _affine_dtypes("layer_norm", x.dtype, weight, bias)[1], is_low(x.dtype)
    if low:
        x = P.astype(x, np.float32)
    inv = 1.0 / x.global_shape[d]
    centred = P.sub(x, P.mul(resolved(R.sum(x, d, keepdims=True)), inv))
    var = P.mul(resolved(R.sum(P.mul(centred, centred), d, keepdims=True)), inv)
    y = _affine(P.div(centred, P.sqrt(P.add(var, eps))), weight, bias)
    return P.astype(y, out) if low else y


# (id(x's layout), x's global shape and dtype, eps's type and value, kept, the weight's and bias's global shapes)
# -> (that layout, (the normalized dim, eps as a float, whether rows are whole)): what layer_norm's checks
# passed and decided for such a call, a pure function of its key; the entry holds the layout.
_LAYER_NORMS: dict = {}


def _fused_layer_norm(x: Any, d: int, eps: float, weight: Optional[Any], bias: Optional[Any]) -> Any:
    """layer_norm along a whole last dim as one node that keeps x and each row's mean and standard
    deviation (spmdsim.nn.autograd.rules.norms.record_layer_norm); the values are the composite's. bfloat16
    (either kept set): as TransformerEngine's fused LayerNorm, the statistics, the normalized values, times
    weight and plus bias in float32, the output rounded once (spmdsim.base.precision)."""
    n = x.global_shape[d]
    w, b = _replicated(weight), _replicated(bias)
    low = is_low(x.dtype)
    stats: dict[str, np.ndarray] = {}  # the rows' mean and sqrt(var + eps) (a dry run's: zeros)

    def kernel(block: np.ndarray) -> np.ndarray:
        inv = 1.0 / n
        block = wide(block)
        stats["mean"] = mean = _SUM(block, axis=d, keepdims=True) * inv
        c = block - mean
        stats["root"] = root = np.sqrt(_SUM(c * c, axis=d, keepdims=True) * inv + eps)
        y = c / root
        if low:  # TransformerEngine's: in float32 throughout, rounded once (float32 beside a float32 weight)
            if w is not None:
                y = y * wide(w.local)
            if b is not None:
                y = y + wide(b.local)
            return rounded(y, dtype)
        if w is not None:
            y = y * w.local
        if b is not None:
            y = y + b.local
        return y

    dtype = _affine_dtypes("layer_norm", x.dtype, w, b)[1]
    out, rows = _fused_out(x, kernel, dtype, d)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("layer_norm", (x.local, None if w is None else w.local, None if b is None else b.local),
              (out.local, rows, rows))  # y and each row's mean and root
    if all(t is None or t._ag is None for t in (x, w, b)):
        return out
    if x.mesh.engine.dry:  # the statistics the rule keeps, sized (the dry engine's zeros)
        rows = broadcast_zero(*rows)
        stats.update(mean=_engine_local(np.copy, rows, rows), root=_engine_local(np.copy, rows, rows))
    return record_layer_norm(out, x, w, b, stats, d)


def _fused_out(x: Any, kernel: Any, dtype: np.dtype, d: int) -> tuple[Any, tuple]:
    """A fused norm's output, `kernel` run on x's block (a dry run's: zeros of `dtype`), and its per-row
    statistics' (shape, dtype): x's block with dim d of one; float32 for bfloat16 x, x's dtype else."""
    out = make_dtensor(x.mesh, _engine_local(kernel, broadcast_zero(x.local.shape, dtype), x.local),
                       x.layout, x.global_shape)
    stat = np.dtype(np.float32) if is_low(x.dtype) else x.dtype  # bfloat16's statistics are float32
    return out, (x.local.shape[:d] + (1,) + x.local.shape[d + 1:], stat)


def _replicated(t: Optional[Any]) -> Optional[Any]:
    """`t` whole on every rank (moved there when it is split or pending), or None."""
    if t is None:
        return None
    lay = t.layout  # whole already (most calls: a norm's weight): no TensorLayout made to compare
    if type(lay) is TensorLayout and not lay.partial and not any(lay.tensor_map) and lay.layout == t.mesh.layout:
        return t
    target = t.mesh.layout(*([None] * lay.ndim))
    if lay == target:
        return t

    return redistribute(t, target)


def rms_norm(x: Any, weight: Optional[Any] = None, eps: float = 1e-6, kept: str = "graph") -> Any:
    """x / sqrt(mean(x ** 2) + eps) * weight over the last dim.

    bfloat16 x: computed in float32 and rounded once, as TransformerEngine's fused RMSNorm, one node keeping x
    and each row's root whatever `kept` says.

    `kept` (rows whole on every rank; split rows take the composite either way): "graph", one node
    (spmdsim.nn.ops.norm_affine) keeping what the normalization's and the weight's nodes would keep (x, its
    normalized values and 1 / sqrt(mean(x ** 2) + eps), the product); "megatron", one node keeping x and each row's root
    (TransformerEngine's fused RMSNorm, whose forward saves its input and rsigma, one number a row), which makes the
    normalized values again in the backward.
    """
    d = _normalized_dim(x, "rms_norm")
    eps = _eps(eps, "rms_norm")
    problem = kept_problem(kept)
    if problem:
        raise OperatorError(f"rms_norm: {problem}")
    _check_affine("rms_norm", x, d, weight)
    x = resolved(x)
    if _whole_rows("rms_norm", x):
        if kept == "megatron" or is_low(x.dtype):  # bfloat16: the fused kernel whatever `kept` says
            return _fused_rms_norm(x, d, eps, weight)
        return norm_affine(x, d, eps, False, "rms_norm", weight, None)
    out, low = _affine_dtypes("rms_norm", x.dtype, weight, None)[1], is_low(x.dtype)  # bfloat16: as layer_norm's
    if low:
        x = P.astype(x, np.float32)
    ms = P.mul(resolved(R.sum(P.mul(x, x), d, keepdims=True)), 1.0 / x.global_shape[d])
    y = _affine(P.div(x, P.sqrt(P.add(ms, eps))), weight, None)
    return P.astype(y, out) if low else y


def _fused_rms_norm(x: Any, d: int, eps: float, weight: Optional[Any]) -> Any:
    """rms_norm along a whole last dim as one node that keeps x and each row's root sqrt(mean(x ** 2) + eps)
    (spmdsim.nn.autograd.rules.norms.record_rms_norm; TransformerEngine keeps its inverse, rsigma: the same
    bytes); the values are the composite's. bfloat16 (either kept set): as the fused kernel, the root and
    x / root in float32, times the widened weight in float32 and rounded once."""
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
    out, rows = _fused_out(x, kernel, dtype, d)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("rms_norm", (x.local, None if w is None else w.local), (out.local, rows))  # y and each row's root
    if all(t is None or t._ag is None for t in (x, w)):
        return out
    if x.mesh.engine.dry:  # the statistics the rule keeps, sized (the dry engine's zeros)
        rows = broadcast_zero(*rows)
        stats["root"] = _engine_local(np.copy, rows, rows)
    return record_rms_norm(out, x, w, stats, d)
