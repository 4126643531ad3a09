"""FP8 as TransformerEngine trains with it: its two formats, per-tensor scales, and a GEMM of scaled FP8 blocks.

The recipe (docs/howto/bf16.md, "FP8"): the inputs of a linear layer's products are cast to FP8, each tensor
with one float32 scale, ``q = saturate(x * scale)`` rounded to the nearest FP8 value; the product multiplies
the FP8 values (each product of two is exact in float32), accumulates in float32 and multiplies the sum by
``1 / (scale_a scale_b)`` (cuBLAS's alpha), the output rounded once to bfloat16. The forward's operands (the
activations and the weights) are e4m3 (3 significand bits, largest 448), the backward's output gradient e5m2
(2 bits, largest 57344): TransformerEngine's ``Format.HYBRID``.

A scale makes the tensor's largest magnitude (amax) meet the format's largest value:
``scale = fp8_max / amax / 2**margin``, kept as it was where amax is 0 or not finite.

- delayed scaling (TransformerEngine's ``DelayedScaling(margin=0, amax_history_len=1024,
  amax_compute_algo="max")``): each tensor's amax is recorded in a history as it is cast; after the step the
  histories' newest entries are agreed by one Allreduce(MAX) over the mesh, the scale is made from the
  history's largest entry and the history rolled on. The first step casts with scale 1 (TransformerEngine's
  initial scale);
- current scaling (``Float8CurrentScaling``): each cast first takes the tensor's amax (an Allreduce(MAX)
  over the ranks that hold its pieces) and casts with the scale made from it.

Both formats come from ``ml_dtypes`` (float8_e4m3fn, float8_e5m2), an optional dependency. Pure: numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .._lazy import numpy_on_first_use
from ..errors import SpmdsimError

np = numpy_on_first_use(globals())

#: What asking for bfloat16 or FP8 without ml_dtypes says (one line; spmdsim.base.precision's too).
NEEDS_ML_DTYPES = "needs ml_dtypes: pip install -e '.[bf16]'"

__all__ = ["NEEDS_ML_DTYPES", "Recipe", "DELAYED", "CURRENT", "fp8_dtype", "fp8_max", "quantize", "amax",
           "scale_from", "Scales", "fp8_product", "FORWARD", "BACKWARD"]

#: The format of the forward's operands and of the backward's output gradient (Format.HYBRID).
FORWARD, BACKWARD = "e4m3", "e5m2"

_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_DTYPES: dict = {}


def fp8_dtype(fmt: str, what: str = "precision 'fp8'") -> Any:
    """numpy's dtype of the FP8 format `fmt` ("e4m3", "e5m2") from ml_dtypes; SpmdsimError naming `what` without it."""
    found = _DTYPES.get(fmt)
    if found is None:
        try:
            import ml_dtypes
        except ImportError:
            raise SpmdsimError(f"{what} {NEEDS_ML_DTYPES}") from None
        found = _DTYPES[fmt] = np.dtype(getattr(ml_dtypes, _NAMES[fmt]))
    return found


def fp8_max(fmt: str) -> float:
    """The largest finite value of `fmt`: 448 (e4m3), 57344 (e5m2)."""
    return 448.0 if fmt == "e4m3" else 57344.0


@dataclass(frozen=True)
class Recipe:
    """How the scales are made: `scaling` "delayed" (from an amax history of `history` steps, its largest
    entry: amax_compute_algo "max") or "current" (each cast's own amax); `margin` as TransformerEngine's."""

    scaling: str = "delayed"
    history: int = 1024
    margin: int = 0


DELAYED, CURRENT = Recipe("delayed"), Recipe("current")


def amax(a: np.ndarray) -> np.float32:
    """The largest magnitude of `a` (float32; 0 for an empty block)."""
    return np.float32(np.max(np.abs(a), initial=0.0)) if a.size else np.float32(0.0)


def quantize(a: np.ndarray, scale: Any, fmt: str) -> np.ndarray:
    """`a` (widened to float32) times `scale`, saturated to the format's range, rounded to nearest even in `fmt`."""
    top = np.float32(fp8_max(fmt))
    scaled = np.asarray(a, np.float32) * np.float32(scale)
    return np.clip(scaled, -top, top).astype(fp8_dtype(fmt))


def scale_from(top: Any, fmt: str, margin: int, old: Any) -> np.float32:
    """fp8_max / `top` / 2**margin in float32; `old` where `top` is 0 or not finite."""
    top = np.float32(top)
    if not np.isfinite(top) or top <= 0:
        return np.float32(old)
    return np.float32(np.float32(fp8_max(fmt)) / top / np.float32(2.0 ** margin))


def fp8_product(qa: np.ndarray, qb: np.ndarray, inverse: Any) -> np.ndarray:
    """``qa @ qb`` of FP8 blocks: the values widened to float32 (exact; each product of two is exact in float32),
    a float32 product, times `inverse` (1 / (scale_a scale_b), float32): cuBLAS's FP8 GEMM with alpha."""
    a, b = qa.astype(np.float32), qb.astype(np.float32)
    if b.ndim == 2 and a.ndim > 2:
        out = np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[-1],))
    else:
        out = np.matmul(a, b)
    out *= np.float32(inverse)
    return out


class Scales:
    """A run's FP8 scales under `recipe`: tensor key ("h0.attn.wq:w") -> its amax history and scale, and the
    amaxes this step's casts saw (this rank's, until `settle` agrees them over the mesh).

    The keys are made on first use, in the order the forward and backward first cast them (the same on every
    rank and in the reference), so the histories are one (n, history) float32 table and the step's amaxes one
    vector of n."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.keys: dict = {}  # key -> (row, format)
        self.scales = np.ones(0, np.float32)
        self.history = np.zeros((0, recipe.history), np.float32)
        self.seen = np.zeros(0, np.float32)  # this step's amaxes, this rank's
        #: weight key -> (the weight, its e4m3 copy, the scale): each weight cast once a step, its copy used by every
        #: microbatch (TransformerEngine's Linear keeps it from the first, ``is_first_microbatch``); emptied by the
        #: trainer when the step settles, before the update changes the weights
        self.weights: dict = {}

    def _row(self, key: str, fmt: str) -> int:
        found = self.keys.get(key)
        if found is None:
            found = self.keys[key] = (len(self.keys), fmt)
            self.scales = np.append(self.scales, np.float32(1.0))
            self.history = np.concatenate([self.history, np.zeros((1, self.recipe.history), np.float32)])
            self.seen = np.append(self.seen, np.float32(0.0))
        return found[0]

    def scale(self, key: str, fmt: str) -> np.float32:
        """The scale `key`'s cast uses this step (delayed scaling: made from the previous steps' amaxes)."""
        row = self._row(key, fmt)
        return self.scales[row]

    def observe(self, key: str, fmt: str, value: Any) -> None:
        """Record `value`, an amax of (this rank's piece of) `key` cast this step."""
        row = self._row(key, fmt)
        self.seen[row] = max(self.seen[row], np.float32(value))

    def settle(self, agreed: np.ndarray) -> None:
        """The step's end: `agreed` (the mesh's maximum of `seen`) into the histories' newest entries, each scale
        made from its history's largest entry, the histories rolled on (TransformerEngine's amax_and_scale_update)."""
        self.history[:, 0] = np.maximum(self.history[:, 0], agreed)
        margin = self.recipe.margin
        for key, (row, fmt) in self.keys.items():
            self.scales[row] = scale_from(self.history[row].max(), fmt, margin, self.scales[row])
        self.history = np.roll(self.history, 1, axis=1)
        self.history[:, 0] = 0.0
        self.seen[:] = 0.0

    def snapshot(self) -> dict:
        """key -> the scale this step's casts use (what the check's reference step casts with)."""
        return {key: np.float32(self.scales[row]) for key, (row, _) in self.keys.items()}

    def state(self) -> tuple[list, np.ndarray, np.ndarray]:
        """(each key and its format in row order, the scales, the histories): what a checkpoint saves (`load`)."""
        keys = sorted(self.keys.items(), key=lambda item: item[1][0])
        return [[key, fmt] for key, (_, fmt) in keys], self.scales.copy(), self.history.copy()

    def load(self, keys: list, scales: np.ndarray, history: np.ndarray) -> None:
        """Resume from a `state`: the same keys, scales and histories, no amax seen yet; ValueError if the arrays do
        not fit this recipe and the keys."""
        n = len(keys)
        if scales.shape != (n,) or history.shape != (n, self.recipe.history):
            raise ValueError(f"{n} FP8 keys with scales {scales.shape} and histories {history.shape}; expected "
                             f"({n},) and ({n}, {self.recipe.history})")
        self.keys = {str(key): (row, str(fmt)) for row, (key, fmt) in enumerate(keys)}
        self.scales, self.history = scales.astype(np.float32), history.astype(np.float32)
        self.seen = np.zeros(n, np.float32)

    def nbytes(self) -> int:
        """The bytes the scales, the histories and the step's amaxes take."""
        return int(self.scales.nbytes + self.history.nbytes + self.seen.nbytes)


def fixed(scales: Optional[dict]) -> "Fixed":
    """A `Scales`-like view of a snapshot (key -> scale), for the reference step: keys it does not name scale 1."""
    return Fixed(scales or {})


class Fixed:
    """`Scales`' `scale` and `observe` over a fixed snapshot; `seen` collects the amaxes the casts saw."""

    def __init__(self, scales: dict) -> None:
        self.given, self.seen = scales, {}

    def scale(self, key: str, fmt: str) -> np.float32:
        return np.float32(self.given.get(key, 1.0))

    def observe(self, key: str, fmt: str, value: Any) -> None:
        self.seen[key] = max(self.seen.get(key, np.float32(0.0)), np.float32(value))
