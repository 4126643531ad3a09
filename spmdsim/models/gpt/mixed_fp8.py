"""The reference step's linear layers (spmdsim.models.gpt.mixed): bfloat16 products, or under an FP8 policy the
ranks' FP8 products (spmdsim.nn.ops.fp8_linear) in one process.

Under FP8 each linear layer's input and weight are cast to e4m3 with the scales the run's step casts with (its
scales at the step's start, given, as its parameters are: delayed scaling; under current scaling each made here
from the whole tensor's amax), the FP8 values multiplied in float32 and the sum times the inverse scales, the
bias added in float32 and the output rounded once; in the backward the output's gradient (rounded to bfloat16)
is cast to e5m2, and the weight's gradient and the input's are the float32 products of the FP8 copies. Pure: numpy.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...base.fp8 import BACKWARD, FORWARD, amax, fp8_product, quantize, scale_from
from ...base.precision import product, rounded, wide

__all__ = ["Linears"]


def _inverse(*scales: Any) -> np.float32:
    """As spmdsim.nn.ops.fp8_linear's: the product of each scale's float32 inverse."""
    out = np.float32(1.0)
    for s in scales:
        out = np.float32(out * np.float32(np.float32(1.0) / np.float32(s)))
    return out


class Linears:
    """The reference's linear layers: `recipe` None (bfloat16 products) or the FP8 recipe, `scales` the run's
    (key -> scale at the step's start; keys not given: 1, the first step's). `seen`: each key's amax."""

    def __init__(self, recipe: Any = None, scales: Optional[dict] = None) -> None:
        self.recipe, self.scales = recipe, scales or {}
        self.seen: dict = {}
        self.kept: dict = {}  # weight name -> (FP8 input, its scale, FP8 weight, its scale)

    def cast(self, key: str, block: np.ndarray, fmt: str) -> tuple:
        top = amax(block)
        self.seen[key] = max(self.seen.get(key, np.float32(0.0)), top)
        if self.recipe.scaling == "current":
            scale = scale_from(top, fmt, self.recipe.margin, np.float32(1.0))
        else:
            scale = np.float32(self.scales.get(key, 1.0))
        return quantize(block, scale, fmt), scale

    def forward(self, P: dict, name: str, a: np.ndarray, site: Optional[str] = None) -> np.ndarray:
        """a @ P[name] before its bias: float32 (FP8: of the FP8 copies, times the inverse scales); `site`: the
        input's scale's name (a column layer's, shared by its weights), default the weight's own."""
        if self.recipe is None:
            return product(a, P[name])
        qa, sa = self.cast((site or name) + ":x", a, FORWARD)
        qw, sw = self.cast(name + ":w", P[name], FORWARD)
        self.kept[name] = (qa, sa, qw, sw)
        return fp8_product(qa, qw, _inverse(sa, sw))

    def back(self, grads: dict, P: dict, name: str, a: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The weight's gradient a^T d into `grads` and the input's, d P[name]^T (float32): FP8's from the copies
        `forward` kept and d cast to e5m2."""
        if self.recipe is None:
            grads[name] = product(a.T, d)
            return product(d, P[name].T)
        qa, sa, qw, sw = self.kept[name]
        qd, sd = self.cast(name + ":dy", d, BACKWARD)
        qd2 = qd.reshape(-1, qd.shape[-1])
        grads[name] = fp8_product(qa.reshape(-1, qa.shape[-1]).T, qd2, _inverse(sa, sd))
        return fp8_product(qd2, qw.T, _inverse(sd, sw)).reshape(d.shape[:-1] + (qw.shape[0],))


def biased(out: np.ndarray, bias: Optional[np.ndarray], act: Any, fp8: bool) -> np.ndarray:
    """A float32 product plus `bias` rounded to `act`: `fp8` (a column layer's FP8 product) in one rounding (the
    GEMM's epilogue), else the product rounded, plus the bias, rounded (the graph's two nodes; a row layer's bias
    is added after its sum)."""
    if fp8:
        return rounded(out if bias is None else out + wide(bias), act)
    out = rounded(out, act)
    return out if bias is None else rounded(wide(out) + wide(bias), act)
