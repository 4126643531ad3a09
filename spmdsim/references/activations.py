"""The activations' local kernels: what each rank computes on its own shard, forward and backward.

`spmdsim.references.forward` computes GELU in float64 and rounds once, the best
float32 answer, which is what a check compares with. A rank's shard is
computed here instead, in float32 for float32 and float16 shards (as PyTorch
and Megatron compute GELU in the tensor's own precision) and in float64 for
float64 ones (then exactly the reference's formula). In float32 the forward
stays within 2e-5 relative or 5e-7 absolute of the reference and the
derivative within 2e-5 or 2e-6 (1 + tanh cancels for negative x and 1 - tanh^2
for large |x|, as in every float32 tanh formula, PyTorch's too): far inside
the float32 check's rtol 1e-4 and atol 1e-5. The saving is the time: on a
(64, 512) float32 shard the forward takes about a third of the float64
formula's time, and the derivative times the incoming gradient about a third
of the reference's derivative alone (docs/explanation/performance.md,
"Activations in the shard's precision", has the figures and the command).

`sigmoid`, `erf` and `gelu_erf` are the elementwise kernels that
`spmdsim.nn.ops.pointwise` runs forward (sigmoid, silu, erf, and gelu with
``approximate="none"``) and their gradient rules read
(`spmdsim.nn.autograd.rules.pointwise`). A float block keeps its dtype; a bfloat16
block gives float32, the precision a bfloat16 block is computed in
(`spmdsim.base.precision.wide`): the forward runs them on the widened block and
rounds once to bfloat16, as `gelu` does within itself, and a gradient rule
reads them in float32.

Pure numpy; never imports mpi4py.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from . import forward as reference, backward as reference_grad
from ..base.buffers import into
from ..base.precision import is_low, wide

__all__ = ["forward", "backward", "gelu", "gelu_tanh", "gelu_from_tanh", "gelu_backward", "relu_backward",
           "sigmoid", "silu_slope", "erf", "gelu_erf"]

_C = 0.044715
_SQRT_2_OVER_PI = reference._SQRT_2_OVER_PI


def _single(dtype: np.dtype) -> bool:
    """Whether a shard of `dtype` is computed in float32 (float32, float16 and bfloat16; float64 and integers
    not)."""
    return (dtype.kind == "f" and dtype.itemsize <= 4) or is_low(dtype)


def _one(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """A 0-d array as a 1-element view of it (None stays None).

    numpy returns a ufunc's result on 0-d operands as a scalar, which takes no ``out=`` (``TypeError:
    return arrays must be of ArrayType``) and no in-place update: the GELU kernels, which work in place,
    take a 0-d shard (a DTensor of shape ()) as one element and give its result back 0-d."""
    return None if a is None else a.reshape(1)


def _zero_d(values: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    """A kernel's 1-element result on a 0-d shard, back 0-d: `out` when it was given (written through `_one`)."""
    return values.reshape(()) if out is None else out


def _tanh_inner(x: np.ndarray) -> np.ndarray:
    """tanh(sqrt(2/pi) x (1 + 0.044715 x^2)) of a float32 array, a new float32 array."""
    t = np.multiply(x, x)
    t *= np.float32(_C)
    t += np.float32(1.0)
    t *= x
    t *= np.float32(_SQRT_2_OVER_PI)
    return np.tanh(t, out=t)


def gelu_tanh(x: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """GELU's inner tanh of a shard, a new array (or `out`): float32 for float32 and float16 shards, else float64.

    The forward computes it once; kept, it spares the backward a second tanh (the costliest of GELU's
    elementwise steps: ~13 ns a float64 value here, against ~1 ns for a product).
    """
    if x.ndim == 0:  # as one element (`_one`)
        return _zero_d(gelu_tanh(x.reshape(1), _one(out)), out)
    if _single(x.dtype):
        return into(out, _tanh_inner(x.astype(np.float32, copy=False)))
    return reference.gelu_tanh(x.astype(np.float64, copy=False), out)


def gelu_from_tanh(x: np.ndarray, t: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """GELU of a shard given its `gelu_tanh` t (not modified), a new array (or `out`) in x's dtype (integers:
    float64)."""
    if x.ndim == 0:  # as one element (`_one`)
        return _zero_d(gelu_from_tanh(x.reshape(1), t.reshape(1), _one(out)), out)
    if not _single(x.dtype):
        if out is not None and x.dtype != np.float64:  # the reference writes float64 values
            return into(out, reference.gelu_from_tanh(x, t))
        return reference.gelu_from_tanh(x, t, out)
    y = np.add(t, np.float32(1.0))
    y *= x.astype(np.float32, copy=False)
    y *= np.float32(0.5)
    return into(out, y.astype(x.dtype, copy=False))


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU (tanh approximation) of a shard, in x's dtype (integers: float64, as the reference)."""
    return gelu_from_tanh(x, gelu_tanh(x))


def gelu_backward(x: np.ndarray, dy: np.ndarray, tanh: np.ndarray | None = None) -> np.ndarray:
    """dy * gelu'(x), a new array in dy's dtype (float32 math for float32 and float16).

    `tanh`: the forward's `gelu_tanh(x)` when it was kept (not modified), else computed here.
    """
    if x.ndim == 0:  # as one element (`_one`)
        return gelu_backward(x.reshape(1), np.reshape(dy, 1), _one(tanh)).reshape(())
    if not _single(x.dtype):
        out = reference_grad.gelu_grad(x, tanh)
        if out.dtype == dy.dtype and out.shape == dy.shape:
            out *= dy  # the derivative is this function's own temporary
            return out
        return dy * out
    x32 = x.astype(np.float32, copy=False)
    t = _tanh_inner(x32) if tanh is None else tanh
    # 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), on two temporaries besides t.
    right = np.multiply(t, t)
    np.subtract(np.float32(1.0), right, out=right)
    right *= x32
    right *= np.float32(0.5 * _SQRT_2_OVER_PI)
    square = np.multiply(x32, x32)
    square *= np.float32(3 * _C)
    square += np.float32(1.0)
    right *= square
    half = t if tanh is None else np.empty_like(t)  # a kept tanh stays as it is
    np.add(t, np.float32(1.0), out=half)
    half *= np.float32(0.5)
    half += right
    if half.shape == dy.shape and dy.dtype == np.float32:
        half *= dy
        return half
    return (dy * half).astype(dy.dtype, copy=False)


def relu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dy where x > 0, else 0 (0 at 0, as PyTorch): a new array in dy's dtype."""
    return dy * reference_grad.relu_grad(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) as (1 + tanh(x / 2)) / 2: no overflow for large |x|, and x's float precision kept.

    bfloat16: float32, computed on the widened block (a Python number beside bfloat16 is bfloat16 with
    ml_dtypes 0.7, so the widening is asked for, not left to numpy's promotion)."""
    x = wide(x)
    return 0.5 * np.tanh(0.5 * x) + 0.5


def silu_slope(x: np.ndarray, s: Optional[np.ndarray] = None) -> np.ndarray:
    """d silu / dx = s (1 + x (1 - s)), s = sigmoid(x) (given when a forward kept it): the silu rule's, the
    SwiGLU gates' (dense, fused and the MoE experts') and the bf16 reference's, one expression."""
    if s is None:
        s = sigmoid(x)
    return s * (1 + x * (1 - s))


_ERF = np.frompyfunc(math.erf, 1, 1)  # the C library's erf, element by element (numpy has none)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)


def erf(x: np.ndarray) -> np.ndarray:
    """erf of a float array in its own dtype (libm's, correctly rounded to within an ulp); bfloat16: float32, as
    `sigmoid` and `gelu_erf` give; integers: float64.

    (bfloat16 gave float64, libm's own, wider than its peers.)"""
    x = np.asanyarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float32) if is_low(x.dtype) else np.dtype(np.float64)
    return np.asanyarray(_ERF(x.astype(np.float64, copy=False))).astype(np.float64).astype(dtype, copy=False)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) = x (1 + erf(x / sqrt 2)) / 2: GELU without the tanh approximation (PyTorch's default).

    bfloat16: float32, computed on the widened block (as `sigmoid`)."""
    x = wide(x)
    return 0.5 * x * (1.0 + erf(x * _INV_SQRT_2))


def forward(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The local kernel of the activation `name` ("relu" or "gelu"); refuses others as the reference does."""
    reference.activation(name)  # the one message for an unknown name
    return _FORWARD[name]


def backward(name: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The local kernel ``(x, dy) -> dx`` of the activation `name`."""
    reference.activation(name)
    return _BACKWARD[name]


_FORWARD = {"relu": reference.relu, "gelu": gelu}
_BACKWARD = {"relu": relu_backward, "gelu": gelu_backward}
