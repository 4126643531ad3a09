"""A training run's precision policy, and the one place low-precision blocks are widened and rounded.

A policy names the dtype of each kind of array (docs/howto/bf16.md):

| preset | parameters | gradients | master copy | optimizer states | activations |
| --- | --- | --- | --- | --- | --- |
| ``fp64`` (default) | float64 | float64 | none | float64 | float64 |
| ``fp32`` | float32 | float32 | none | float32 | float32 |
| ``bf16-mixed`` | bfloat16 | float32 | float32 | float32 | bfloat16 |
| ``fp8``, ``fp8-current`` | bfloat16 | float32 | float32 | float32 | bfloat16 |

``fp8`` and ``fp8-current`` are bf16-mixed with the products of the linear layers (QKV, the attention's output
projection, fc1, fc2) in FP8 as TransformerEngine computes them (spmdsim.base.fp8).

``bf16-mixed`` is Megatron-LM's bf16 recipe: the parameters the forward and backward read are
bfloat16, the optimizer keeps a float32 master copy and float32 Adam states, and each parameter's
gradient is accumulated and reduced in float32 (Megatron's ``main_grad``; the weight-gradient
product accumulates straight into it, as its gradient-accumulation fusion does).

Where a bfloat16 block is computed, as a GPU computes it: a kernel reads bfloat16, works in float32
(`wide`) and writes its result rounded once to bfloat16 (`rounded`). A product of bfloat16 blocks
is float32 BLAS on the widened blocks (`product`), rounded once when complete; a product that is
a pending sum (its contraction split over ranks) stays float32 until the collective that sums it,
and is rounded after the sum. Rounded to what its operator gives, the same for every layout:
einsum (np.einsum's dtype) and the GPT's layers round to bfloat16; ops.matmul, ops.linear and
ops.mlp give np.matmul's dtype (`product_dtype`: float32 beside bfloat16, float16 or float32),
the float32 product itself, whole or summed by its collective. Layer norm, softmax and cross-entropy take their
statistics in float32. A tensor's gradient is summed in float32 over its consumers and rounded once to the
tensor's dtype before its own rule runs (spmdsim.nn.autograd.engine).

bfloat16 comes from ``ml_dtypes`` (the package JAX gives numpy its bfloat16 with), an optional
dependency: ``pip install -e '.[bf16]'``. Pure: numpy (and ml_dtypes when asked for bfloat16).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import SpmdsimError
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["Precision", "PRESETS", "precision", "precision_problem", "bfloat16", "is_low", "is_float", "wide",
           "sent_itemsize", "rounded", "product", "product_dtype", "unit_roundoff", "named_dtype", "NEEDS_ML_DTYPES"]

from .fp8 import CURRENT, DELAYED, NEEDS_ML_DTYPES, Recipe, fp8_dtype
from .tables import put

_BF16: list = []  # [np.dtype(ml_dtypes.bfloat16)] once loaded


def bfloat16(what: str = "bfloat16") -> np.dtype:
    """numpy's dtype for bfloat16 (from ml_dtypes); SpmdsimError ``<what> needs ml_dtypes: ...`` without it."""
    if not _BF16:
        try:
            import ml_dtypes
        except ImportError:
            raise SpmdsimError(f"{what} {NEEDS_ML_DTYPES}") from None
        _BF16.append(np.dtype(ml_dtypes.bfloat16))
    return _BF16[0]


#: ml_dtypes' float types by name, as the FP8 formats are named in spmdsim.base.fp8 (bfloat16: `bfloat16`).
_ML_DTYPES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def named_dtype(dtype: Any, what: str = "dtype") -> np.dtype:
    """``np.dtype(dtype)``, with ml_dtypes' names ("bfloat16", "float8_e4m3fn", "float8_e5m2") resolved
    through ml_dtypes whether or not it was imported (numpy knows them only once it is); SpmdsimError
    ``<what> 'bfloat16' needs ml_dtypes: ...`` without it, numpy's own error for a name nobody knows."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return bfloat16(f"{what} 'bfloat16'")
    if isinstance(dtype, str) and dtype in _ML_DTYPES:
        return fp8_dtype(_ML_DTYPES[dtype], f"{what} {dtype!r}")
    return np.dtype(dtype)


def is_low(dtype: Any) -> bool:
    """Whether blocks of `dtype` are computed widened to float32 (bfloat16).

    ml_dtypes' bfloat16 is of kind "V"; the kind (a C attribute) is asked first, since numpy's
    ``dtype.name`` is Python code (~1 us warm) and this test runs on every collective and operator."""
    return getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16"


def is_float(dtype: Any) -> bool:
    """Whether `dtype` is a float: numpy's (kind "f") or ml_dtypes' bfloat16 (kind "V"), not FP8's storage types."""
    return dtype.kind == "f" or is_low(dtype)


def wide(a: Any) -> Any:
    """`a` as float32 when it is bfloat16 (exact), else `a` itself: what a kernel computes on."""
    if getattr(a, "dtype", None) is not None and is_low(a.dtype):
        return a.astype(np.float32)
    return a


def sent_itemsize(dtype: Any, sums: bool) -> int:
    """Bytes one element of a `dtype` tensor takes in a collective's messages: float32's 4 for bfloat16 in a
    sum (`sums`), else the dtype's own itemsize.

    A sum is an Allreduce or a Reduce_scatter: MPI has no bfloat16 sum, so the collectives add the `wide`
    blocks and round the total once (spmdsim.runtime.collectives); otherwise bfloat16 is moved as its 2-byte
    words. What the runtime's collectives send, and so what a plan and a dry run count (spmdsim.programs.plan.steps,
    `Step.itemsize`)."""
    dtype = np.dtype(dtype)
    return 4 if sums and is_low(dtype) else dtype.itemsize


def rounded(a: Any, dtype: Any) -> Any:
    """`a` rounded to `dtype` (round to nearest even) when it is a float of another dtype; else `a`."""
    dtype = np.dtype(dtype)
    if a.dtype == dtype or a.dtype.kind not in "fV" or not is_float(dtype):
        return a
    return a.astype(dtype)


def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)`` as a GPU multiplies bfloat16: both widened to float32, BLAS, float32 result
    (numpy's own matmul on bfloat16 is slow and accumulates otherwise). Other dtypes: numpy's (`matmul`)."""
    if a.dtype.kind != "V" and b.dtype.kind != "V":  # most products: no bfloat16 (is_low's first test, inline)
        return matmul(a, b)
    if is_low(a.dtype) or is_low(b.dtype):
        return matmul(wide(a), wide(b))
    return matmul(a, b)


def product_dtype(a: Any, b: Any) -> np.dtype:
    """The dtype `product` gives blocks of dtypes `a` and `b`: numpy's own np.matmul's.

    numpy's matmul has no bfloat16 loop; it computes in the first of its loops both dtypes cast to, as `product`
    does: float32 for bfloat16 beside bfloat16, float16, float32, bool or a small int, float64 beside float64 or
    int32 and wider ints; np.result_type's for numpy's own dtypes. Whatever splits the contraction, a product's
    dtype is this one (spmdsim.nn.ops._common.local_matmul; spmdsim.references.forward.matmul). Kept per pair; numpy's
    own error where it multiplies no such blocks."""
    out = _PRODUCT_DTYPES.get((a, b))
    if out is None:
        out = product(np.zeros((1, 1), a), np.zeros((1, 1), b)).dtype
        put(_PRODUCT_DTYPES, (a, b), out, 256)
    return out


# (dtype, dtype) -> `product_dtype`'s answer (read directly by a hot path: ``_PRODUCT_DTYPES.get((a, b))``)
_PRODUCT_DTYPES: dict = {}


def matmul(a: np.ndarray, b: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)``, the same values; a C-contiguous stack of rows (..., m, k) times one
    matrix (k, n) as one (M, k) @ (k, n) product on views.

    numpy multiplies such a stack matrix by matrix, one small GEMM each: for activations (T, B, D) =
    (64, 4, 128) against a 128 x 128 weight that is 5x slower than the one GEMM on the same rows (760
    against 150 us here), and it is how a Linear meets its weight (spmdsim.nn.ops.megatron's pieces).
    Each output element is the same dot product either way (tests/test_precision.py)."""
    if b.ndim == 2 and a.ndim > 2 and a.shape[-1] and a.flags.c_contiguous:
        n = b.shape[1]
        if out is None:
            return np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + (n,))
        if out.flags.c_contiguous:
            np.matmul(a.reshape(-1, a.shape[-1]), b, out=as_rows(out))
            return out
    return np.matmul(a, b, out=out)


def as_rows(a: np.ndarray) -> np.ndarray:
    """`a` (..., n) as (rows, n): ``a.reshape(-1, n)``, also for an empty block whose last dim is 0 (a rank's
    share of columns under an uneven cut), whose rows numpy cannot infer from -1."""
    n = a.shape[-1]
    return a.reshape(-1, n) if n else a.reshape(math.prod(a.shape[:-1]), 0)


def unit_roundoff(dtype: Any) -> float:
    """The largest relative error of one rounding to `dtype`: 2**-8 for bfloat16 (8 significand bits),
    eps / 2 for numpy's floats."""
    dtype = np.dtype(dtype)
    if is_low(dtype):
        return 2.0 ** -8
    return float(np.finfo(dtype).eps) / 2


@dataclass(frozen=True)
class Precision:
    """The dtypes of a run's arrays, by kind; ``precision("bf16-mixed")`` gives a preset.

    `master`: the optimizer's copy of the parameters it updates (None: it updates them in place). `fp8`: the
    FP8 recipe of the linear layers' products (spmdsim.base.fp8), None: they multiply the activations' dtype.
    """

    name: str
    param: str
    grad: str
    master: Optional[str]
    optimizer: str
    activation: str
    fp8: Optional[Recipe] = None

    def dtype(self, kind: str) -> np.dtype:
        """The numpy dtype of `kind` ("param", "grad", "master", "optimizer", "activation")."""
        name = getattr(self, kind)
        return bfloat16(f"precision {self.name!r}") if name == "bfloat16" else np.dtype(name)

    @property
    def low(self) -> bool:
        """Whether some arrays are bfloat16 (the run then needs ml_dtypes)."""
        return "bfloat16" in (self.param, self.activation)

    def __str__(self) -> str:
        return self.name


#: The policies by name: `fp64` (the default), `fp32`, `bf16-mixed`, and bf16-mixed with the linear layers'
#: products in FP8 under delayed (`fp8`) or current (`fp8-current`) scaling (docs/howto/bf16.md).
PRESETS = {
    "fp64": Precision("fp64", "float64", "float64", None, "float64", "float64"),
    "fp32": Precision("fp32", "float32", "float32", None, "float32", "float32"),
    "bf16-mixed": Precision("bf16-mixed", "bfloat16", "float32", "float32", "float32", "bfloat16"),
    "fp8": Precision("fp8", "bfloat16", "float32", "float32", "float32", "bfloat16", DELAYED),
    "fp8-current": Precision("fp8-current", "bfloat16", "float32", "float32", "float32", "bfloat16", CURRENT),
}


#: What the refusal adds for a precision `spmdsim estimate` prices but no step here runs.
_ESTIMATED_ONLY = {"fp16-mixed": " (fp16-mixed, with its loss scaling, is priced by `spmdsim estimate --precision "
                                 "fp16-mixed` but not trained here; bf16-mixed trains in the same 2-byte values)"}


def precision_problem(name: Any) -> Optional[str]:
    """Why `name` is not a precision this machine can run (one line), or None."""
    if isinstance(name, Precision):
        name = name.name
    if not isinstance(name, str) or name not in PRESETS:
        return f"precision {name!r} must be one of {', '.join(PRESETS)}" + _ESTIMATED_ONLY.get(name, "")
    if PRESETS[name].low:
        try:
            bfloat16()
            if PRESETS[name].fp8 is not None:
                fp8_dtype("e4m3")
        except SpmdsimError:
            return f"precision {name!r} {NEEDS_ML_DTYPES}"
    return None


def precision(name: Any = "fp64") -> Precision:
    """The preset `name` (a key of `PRESETS`; "fp64" by default) or a Precision as given; SpmdsimError otherwise."""
    problem = precision_problem(name)
    if problem:
        raise SpmdsimError(problem)
    return name if isinstance(name, Precision) else PRESETS[name]
