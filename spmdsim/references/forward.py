"""Single-process numpy references for every operator, whole or region by region.

Pure numpy; never imports mpi4py. Two kinds of functions:

* whole-tensor references (`matmul`, `linear`, `embedding`, `relu`, `gelu`,
  `add`, `bias_add`, `mlp`, `vocab_parallel_embedding_local`) on ndarrays;
* region references (`*_region`) built from SeededTensors: they return a
  callable ``region(slices) -> ndarray`` that computes only the asked block
  (``Y[rows, cols] = X[rows, :] @ W[:, cols]``), so a rank checking its shard
  never builds the global result. This is the form ``DTensor.check`` takes.

References accumulate in float64 and return the inputs' dtype, so a float32
distributed result is compared with the best float32 answer.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ..layouts.datagen import SeededTensor
from ..errors import OperatorError, ShapeError
from ..base.precision import product_dtype
from ..base.once import once

__all__ = ["ACTIVATIONS", "Region", "RegionFn", "matmul", "linear", "embedding", "relu", "gelu", "gelu_tanh",
           "gelu_from_tanh", "activation", "add", "bias_add", "softmax", "transpose", "mlp", "check_ids",
           "matmul_region", "linear_region", "embedding_region", "mlp_region", "mlp_rounding",
           "matmul_rounding"]

Region = Sequence[slice]
RegionFn = Callable[[Region], np.ndarray]
Source = Union[SeededTensor, np.ndarray]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# -- elementwise ---------------------------------------------------------------
def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0), same dtype (a number as numpy takes it: a 0-d array of its dtype)."""
    x = np.asanyarray(x)
    return np.maximum(x, np.zeros((), dtype=x.dtype))


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Megatron's `bias_gelu`, Paddle `approximate=True`); floats keep their dtype."""
    x = np.asanyarray(x)
    if x.ndim == 0:  # as one element (`_zero_d`)
        return gelu(x.reshape(1)).reshape(())
    t = gelu_tanh(x.astype(np.float64, copy=False))
    return gelu_from_tanh(x, t, out=t)


def _zero_d(fn: Callable[..., np.ndarray], out: Optional[np.ndarray], *operands: np.ndarray) -> np.ndarray:
    """`fn` of 0-d `operands` (and `out`) as 1-element views, the result back 0-d (`out` when given).

    numpy gives a ufunc's result on 0-d operands as a scalar, which takes no ``out=`` (``TypeError: return
    arrays must be of ArrayType``) and no in-place update; the GELU formulas work in place."""
    one = fn(*(np.reshape(a, 1) for a in operands), None if out is None else out.reshape(1))
    return one.reshape(()) if out is None else out


def gelu_from_tanh(x: np.ndarray, t: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """GELU of x given its `gelu_tanh` t, 0.5 x (1 + t): floats keep their dtype, integers get float64.

    `out`: where to write it (t itself when the caller is done with t); default a new array. Integers
    get float64 as softmax does, never truncated values.
    """
    x = np.asanyarray(x)
    if x.ndim == 0:
        return _zero_d(gelu_from_tanh, out, x, t)
    out = np.add(t, 1.0, out=out)
    out *= x.astype(np.float64, copy=False)
    out *= 0.5
    return out.astype(x.dtype, copy=False) if x.dtype.kind == "f" else out


def gelu_tanh(x64: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """tanh(sqrt(2/pi) (x + 0.044715 x^3)) of a float64 array, a new array or `out` (GELU and its gradient).

    In place on one temporary: ``x**3`` (numpy's pow) costs 100x a product. A 0-d array (or a number) gives a
    0-d array.
    """
    if getattr(x64, "ndim", 0) == 0:
        return _zero_d(gelu_tanh, out, np.asarray(x64, np.float64))
    inner = np.multiply(x64, x64, out=out)
    inner *= x64
    inner *= 0.044715
    inner += x64
    inner *= _SQRT_2_OVER_PI
    return np.tanh(inner, out=inner)


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"relu": relu, "gelu": gelu}


def activation(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The activation function called `name` ("relu" or "gelu")."""
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
        raise OperatorError(f"activation {name!r} is not supported; expected one of {tuple(ACTIVATIONS)!r}") from None


def softmax(x: np.ndarray, dim: int = -1) -> np.ndarray:
    """exp(x) / sum(exp(x)) along `dim`, shifted by the max for range (float results).

    A dim of size 0 gives the empty result, as numpy's exp(x) / sum(exp(x)) does (its max has no identity)."""
    x = np.asanyarray(x)
    if not x.shape[dim]:
        return np.exp(x)
    # (np.max's and np.sum's reductions called themselves: the same kernels, without their Python wrappers,
    # which a replayed step ran each time it replayed a router's softmax: spmdsim.runtime.replay)
    shifted = x - np.maximum.reduce(x, dim, keepdims=True)
    e = np.exp(shifted)
    return e / np.add.reduce(e, dim, keepdims=True)


def transpose(x: np.ndarray, perm: Optional[Sequence[int]] = None) -> np.ndarray:
    """numpy's transpose (`perm` None reverses the dims)."""
    return np.transpose(x, perm)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b with numpy broadcasting."""
    return np.add(a, b)


def bias_add(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """x + bias along the last dim."""
    x, bias = np.asanyarray(x), np.asanyarray(bias)
    if bias.ndim != 1 or x.shape[-1:] != bias.shape:
        raise ShapeError(f"bias of shape {bias.shape!r} does not match last dim of {x.shape!r}")
    return x + bias


# -- matmul family ---------------------------------------------------------------
def matmul(x: np.ndarray, w: np.ndarray, transpose_a: bool = False, transpose_b: bool = False) -> np.ndarray:
    """x @ w (batched over leading dims), optionally transposing the last two dims.

    In float64, rounded to the dtype spmdsim's products give (spmdsim.base.precision.product_dtype, numpy's
    np.matmul's: float32 for bfloat16 beside bfloat16 or float16)."""
    x, w = np.asanyarray(x), np.asanyarray(w)
    if x.ndim < 2 or w.ndim < 2:
        raise ShapeError(f"matmul needs 2-d or batched operands, got shapes {x.shape!r} and {w.shape!r}")
    a = np.swapaxes(x, -1, -2) if transpose_a else x
    b = np.swapaxes(w, -1, -2) if transpose_b else w
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"contraction sizes differ: x of shape {x.shape!r} gives K={a.shape[-1]!r}, w of shape "
                         f"{w.shape!r} gives K={b.shape[-2]!r}")
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(product_dtype(x.dtype, w.dtype))


def linear(x: np.ndarray, weight: np.ndarray, bias: Optional[np.ndarray] = None) -> np.ndarray:
    """x @ weight + bias; weight has shape (in_features, out_features)."""
    out = matmul(x, weight)
    return out if bias is None else bias_add(out, bias)


def check_ids(ids: np.ndarray, num_embeddings: int) -> None:
    """Raise OperatorError unless `ids` are integers in [0, num_embeddings)."""
    ids = np.asanyarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise OperatorError(f"embedding ids must be integers, got dtype {ids.dtype.name!r}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_embeddings):
        bad = ids[(ids < 0) | (ids >= num_embeddings)]
        raise OperatorError(f"embedding id {int(bad.flat[0])!r} is outside [0, {num_embeddings}) "
                            f"({bad.size} ids out of range)")


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table[ids]: one row of `table` (num_embeddings, dim) per id."""
    check_ids(ids, table.shape[0])
    return table[ids]


def mlp(x: np.ndarray, w1: np.ndarray, b1: Optional[np.ndarray], w2: np.ndarray, b2: Optional[np.ndarray],
        act: str = "gelu") -> np.ndarray:
    """linear(act(linear(x, w1, b1)), w2, b2)."""
    return linear(activation(act)(linear(x, w1, b1)), w2, b2)


# -- region references ------------------------------------------------------------
def _block(src: Source, region: Sequence[slice]) -> np.ndarray:
    if isinstance(src, SeededTensor):
        region = tuple(region)
        if all(s == _WHOLE for s in region):
            # A whole tensor (an MLP's W1, a contraction's other operand): every simulated rank
            # asks for the same one, so it is generated once (read-only; a plain call under MPI).
            return once(("reference: whole", src), src.full)
        return src.region(region)
    return np.asarray(src)[tuple(region)]


_WHOLE = slice(None)


def _shared(what: tuple, region: Region, shape: tuple, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """compute(): for the whole output from seeded sources, once per simulation (spmdsim.runtime.sim.once).

    Every replica of a replicated output checks the same whole reference, which p simulated
    ranks computed p times (a plain call under MPI, for a region, or from an array source).
    """
    region = tuple(region)
    whole = len(region) == len(shape) and all(
        isinstance(r, slice) and r.indices(n) == (0, n, 1) for r, n in zip(region, shape))
    if not whole or not all(w is None or isinstance(w, (SeededTensor, str, bool)) for w in what):
        return compute()

    return once(("reference: whole output", *what), compute)


def _shape(src: Source) -> tuple[int, ...]:
    return tuple(src.shape) if hasattr(src, "shape") else np.shape(src)


def _check_bias(bias: Source, out_features: int, what: str) -> None:
    """Raise ShapeError unless `bias` is 1-d with one entry per output column."""
    if _shape(bias) != (out_features,):
        raise ShapeError(f"{what} bias of shape {_shape(bias)!r} does not match out_features {out_features!r}; "
                         f"expected shape {(out_features,)!r}")


def matmul_region(x: Source, w: Source, transpose_a: bool = False, transpose_b: bool = False) -> RegionFn:
    """Region reference of x @ w: block (batch..., rows, cols) reads only X rows and W cols.

    `w` may have the same leading batch dims as `x` or none (shared weight).
    """
    xs, ws = _shape(x), _shape(w)
    if len(xs) < 2 or len(ws) < 2:
        raise ShapeError(f"matmul needs 2-d or batched operands, got {xs!r} and {ws!r}")
    if len(ws) > 2 and ws[:-2] != xs[:-2]:
        raise ShapeError(f"batch dims of x {xs[:-2]!r} and w {ws[:-2]!r} differ")
    k_x = xs[-2] if transpose_a else xs[-1]
    k_w = ws[-1] if transpose_b else ws[-2]
    if k_x != k_w:
        raise ShapeError(f"contraction sizes differ: x of shape {xs!r} gives K={k_x!r}, w of shape {ws!r} gives "
                         f"K={k_w!r}")
    out = (*xs[:-2], xs[-1] if transpose_a else xs[-2], ws[-2] if transpose_b else ws[-1])

    def region_fn(region: Region) -> np.ndarray:
        return _shared(("matmul", x, w, transpose_a, transpose_b), region, out,
                       lambda: _matmul_block(x, w, region, transpose_a, transpose_b))
    region_fn.shape = out  # type: ignore[attr-defined]  # the result's: DTensor.check refuses another's
    return region_fn


def _matmul_block(x: Source, w: Source, region: Region, transpose_a: bool = False,
                  transpose_b: bool = False) -> np.ndarray:
    """The (batch..., rows, cols) block of x @ w from the X rows and W cols it reads."""
    *batch, rows, cols = tuple(region)
    xr = (*batch, _WHOLE, rows) if transpose_a else (*batch, rows, _WHOLE)
    wb = tuple(batch) if len(_shape(w)) > 2 else ()
    wr = (*wb, cols, _WHOLE) if transpose_b else (*wb, _WHOLE, cols)
    return matmul(_block(x, xr), _block(w, wr), transpose_a, transpose_b)


def linear_region(x: Source, weight: Source, bias: Optional[Source] = None) -> RegionFn:
    """Region reference of x @ weight + bias (bias read only for the asked columns)."""
    mm = matmul_region(x, weight)  # its shape checks
    if bias is None:
        return mm
    _check_bias(bias, _shape(weight)[-1], "linear")
    out = (*_shape(x)[:-1], _shape(weight)[-1])

    def region_fn(region: Region) -> np.ndarray:
        return _shared(("linear", x, weight, bias), region, out,
                       lambda: _matmul_block(x, weight, region) + _block(bias, (tuple(region)[-1],)))
    region_fn.shape = out  # type: ignore[attr-defined]
    return region_fn


def embedding_region(ids: Source, table: Source) -> RegionFn:
    """Region reference of table[ids]: reads the asked ids and only the table rows they use."""
    num_embeddings = _shape(table)[0]

    def region_fn(region: Region) -> np.ndarray:
        *id_region, cols = tuple(region)
        block_ids = np.asarray(_block(ids, id_region))
        check_ids(block_ids, num_embeddings)
        if block_ids.size == 0:
            width = len(range(*cols.indices(_shape(table)[1])))
            return np.empty(block_ids.shape + (width,), dtype=np.dtype(table.dtype))
        lo, hi = int(block_ids.min()), int(block_ids.max()) + 1
        rows = _block(table, (slice(lo, hi), cols))
        return rows[block_ids - lo]

    return region_fn


def mlp_region(x: Source, w1: Source, b1: Optional[Source], w2: Source, b2: Optional[Source],
               act: str = "gelu") -> RegionFn:
    """Region reference of the MLP: the hidden layer is built only for the asked rows."""
    fn = activation(act)
    matmul_region(x, w1)  # shape checks up front, as linear_region does
    if len(_shape(w2)) != 2 or _shape(w2)[0] != _shape(w1)[-1]:
        raise ShapeError(f"mlp w2 of shape {_shape(w2)!r} does not take w1's {_shape(w1)[-1]!r} outputs")
    for name, bias, w in (("b1", b1, w1), ("b2", b2, w2)):
        if bias is not None:
            _check_bias(bias, _shape(w)[-1], f"mlp {name}")
    out = (*_shape(x)[:-1], _shape(w2)[-1])

    def region_fn(region: Region) -> np.ndarray:
        *rows, cols = tuple(region)

        def compute() -> np.ndarray:
            hidden = linear(_block(x, (*rows, _WHOLE)), _block(w1, (_WHOLE, _WHOLE)),
                            None if b1 is None else _block(b1, (_WHOLE,)))
            return linear(fn(hidden), _block(w2, (_WHOLE, cols)), None if b2 is None else _block(b2, (cols,)))
        return _shared(("mlp", x, w1, b1, w2, b2, act), region, out, compute)
    region_fn.shape = out  # type: ignore[attr-defined]
    return region_fn


#: The largest slope of each activation (|f'|): how much an error in its input can grow through it.
_SLOPE = {"relu": 1.0, "gelu": 1.13}


def mlp_rounding(x: Source, w1: Source, b1: Optional[Source], w2: Source, b2: Optional[Source],
                 act: str = "gelu") -> tuple[float, RegionFn]:
    """(rtol, scale) for checking an MLP against `mlp_region`: the magnitudes that entered each output.

    They bound how far two float computations of `mlp_region`'s MLP, summing in different orders, can differ:
    for ``DTensor.check(ref, rtol=rtol, scale=scale)``, the magnitudes that entered each output and the
    rounding of the sums they entered, not the size of the output (docs/explanation/tolerances.md, "Tolerances").

    To first order, each computation of y = act(x W1 + b1) W2 + b2 is off by at most eps (k2 S2 + L k1 (S1 @
    |W2|)), where S1 = |x| @ |W1| + |b1| entered each hidden unit (a sum of k1 = in features + 1 terms), S2 =
    |act(h)| @ |W2| + |b2| each output (k2 = hidden units + 1 terms), and L bounds the activation's slope: rtol
    is 2 k2 eps (two computations) and scale is S2 + L (k1 / k2) (S1 @ |W2|), each element's, float64."""
    k1, k2 = _shape(w1)[0] + 1, _shape(w2)[0] + 1
    eps = _product_eps(x, w1, w2)
    fn, slope = activation(act), _SLOPE[act]
    out = (*_shape(x)[:-1], _shape(w2)[-1])

    def region_fn(region: Region) -> np.ndarray:
        *rows, cols = tuple(region)

        def compute() -> np.ndarray:
            def wide(src: Optional[Source], where: tuple) -> Any:  # the block in float64; 0.0 for no bias
                return 0.0 if src is None else _block(src, where).astype(np.float64)

            xs, v1, c1 = wide(x, (*rows, _WHOLE)), wide(w1, (_WHOLE, _WHOLE)), wide(b1, (_WHOLE,))
            a2, c2 = np.abs(wide(w2, (_WHOLE, cols))), wide(b2, (cols,))
            s1 = np.abs(xs) @ np.abs(v1) + np.abs(c1)
            s2 = np.abs(fn(xs @ v1 + c1)) @ a2 + np.abs(c2)
            return s2 + slope * (k1 / k2) * (s1 @ a2)
        return _shared(("mlp rounding", x, w1, b1, w2, b2, act), region, out, compute)

    return 2 * k2 * eps, region_fn


def _product_eps(*sources: Source) -> float:
    """The machine epsilon of the products of these operands in turn (x @ w1, then @ w2): their dtype's
    (spmdsim.base.precision.product_dtype: float32's for bfloat16 blocks, whose products are float32)."""
    dtype = None
    for s in sources:
        own = np.dtype(s.dtype if isinstance(s, SeededTensor) else np.asarray(s).dtype)
        dtype = own if dtype is None else product_dtype(dtype, own)
    return float(np.finfo(dtype).eps)


def matmul_rounding(x: Source, w: Source, transpose_a: bool = False, transpose_b: bool = False,
                    bias: Optional[Source] = None) -> tuple[float, RegionFn]:
    """(rtol, scale) for checking x @ w (+ bias) against `matmul_region` or `linear_region`: the magnitudes.

    They bound how far two float computations of ``op(x) @ op(w) (+ bias)``, summing in different orders
    (split over ranks, blocked, any order), can differ: for ``DTensor.check(ref, rtol=rtol, scale=scale)``
    (docs/explanation/tolerances.md, "Tolerances"), as `mlp_rounding` for one contraction.

    Each output is a sum of k = K (+ 1 with a bias) terms; each computation rounds it by at most k eps/2 of
    the terms' magnitudes S = |op(x)| @ |op(w)| (+ |bias|), whatever the sum's own size: rtol is 2 k eps (two
    computations) and scale is S, each element's, float64. `matmul_region`'s and `linear_region`'s shape
    checks apply."""
    matmul_region(x, w, transpose_a, transpose_b)  # its shape checks
    xs, ws = _shape(x), _shape(w)
    out = (*xs[:-2], xs[-1] if transpose_a else xs[-2], ws[-2] if transpose_b else ws[-1])
    if bias is not None:
        _check_bias(bias, out[-1], "linear")
    k = (xs[-2] if transpose_a else xs[-1]) + (bias is not None)
    eps = _product_eps(x, w)

    def region_fn(region: Region) -> np.ndarray:
        region = tuple(region)

        def compute() -> np.ndarray:
            def wide(src: Source, where: tuple) -> np.ndarray:
                return np.abs(_block(src, where).astype(np.float64))

            *batch, rows, cols = region
            xr = (*batch, _WHOLE, rows) if transpose_a else (*batch, rows, _WHOLE)
            wb = tuple(batch) if len(ws) > 2 else ()
            wr = (*wb, cols, _WHOLE) if transpose_b else (*wb, _WHOLE, cols)
            s = matmul(wide(x, xr), wide(w, wr), transpose_a, transpose_b)
            return s if bias is None else s + wide(bias, (cols,))
        return _shared(("matmul rounding", x, w, bias, bool(transpose_a), bool(transpose_b)), region, out, compute)

    return 2 * k * eps, region_fn
