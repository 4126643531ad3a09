"""A machine's values (spmdsim.tools.estimate.machine reads and writes them as machine files): the GPU's
peaks and memory, the links of each level, the GEMM efficiency model, each checked when it is made, with
one-line refusals that name the key as a machine file spells it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ...errors import SpmdsimError
from .file_keys import _MISSING, _fail, _no_other_keys, _text
from .gemm_shapes import BatchedShapes, UnbatchedShapes
from .machine_units import quoted_hint
from .records import LEVELS

__all__ = ["Machine", "Link", "GemmEfficiency", "Waves", "Achieved", "AttentionEfficiency", "DTYPES",
           "RESULT_BYTES", "ALGORITHMS", "EFFICIENCY_MODELS", "normalize_dtype"]


#: Dtypes a machine file may give a peak for, and their bytes per element (the roofline's traffic): "fp8" the
#: products of e4m3 and e5m2 operands (spmdsim.base.fp8), a byte an element.
DTYPES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: The bytes per element of a product's result where they are not its operands': an FP8 product writes bfloat16
#: (TransformerEngine's output; the weight gradient accumulated into the fp32 main gradient is that kernel's own).
RESULT_BYTES = {"fp8": 2}


#: Other spellings of the same dtypes (numpy's names and common short ones).
_DTYPE_ALIASES = {"float64": "fp64", "double": "fp64", "f8": "fp64", "float32": "fp32", "float": "fp32",
                  "single": "fp32", "f4": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "f2": "fp16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8"}


#: Collective algorithms (the rows of spmdsim.programs.cost.model's table; kept equal to its ALGORITHMS by a test).
ALGORITHMS = ("ring", "tree")


#: GEMM efficiency models a file may name: "roofline" (capped, with the optional waves) and "shape" (the same,
#: and batched products capped by their measured table, single products scaled by their contraction's curve,
#: spmdsim.tools.estimate.gemm_shapes).
EFFICIENCY_MODELS = ("roofline", "shape")


def normalize_dtype(dtype: Any) -> str:
    """The machine-file name of a dtype: ``"bfloat16"`` -> ``"bf16"``, ``np.float32`` -> ``"fp32"``."""
    text = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    key = text.strip().lower()
    return _DTYPE_ALIASES.get(key, key)


def _number(where: str, key: str, value: Any, expected: str, *, positive: bool = True) -> float:
    """A finite number (> 0, or >= 0 where not `positive`), as float."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= 0 if positive else value < 0):
        raise _fail(where, key, value, f"{expected}, {quoted_hint(value)}" if isinstance(value, str) else expected)
    return float(value)


def _integer(where: str, key: str, value: Any, expected: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(where, key, value, f"{expected}, {quoted_hint(value)}" if isinstance(value, str) else expected)
    return value


@dataclass(frozen=True)
class Achieved:
    """The fraction of a datasheet rate a real kernel or collective reaches, and where that figure comes from."""

    fraction: float
    source: str

    def __post_init__(self) -> None:
        _check_achieved("Achieved", "", self.fraction, self.source)


def _check_achieved(where: str, key: str, fraction: Any, source: Any) -> None:
    ok = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
    if not ok or not 0 < fraction <= 1:
        raise _fail(where, f"{key}fraction", fraction, "a number in (0, 1] (fraction achieved)")
    _text(where, f"{key}source", source, "a citation string, or 'assumption: ...'")


def _achieved(where: str, key: str, value: Any) -> Achieved:
    """An `Achieved` from a file's ``{"fraction": f, "source": "..."}`` at `key`, checked."""
    if not isinstance(value, Mapping):
        raise _fail(where, key, value, "an object with 'fraction' and 'source'")
    _no_other_keys(where, key, value, ("fraction", "source"))
    fraction, source = value.get("fraction", _MISSING), value.get("source", _MISSING)
    _check_achieved(where, f"{key}.", fraction, source)
    return Achieved(float(fraction), source)


@dataclass(frozen=True)
class Link:
    """One level's link: bandwidth in bytes/s per GPU per direction, latency in seconds per message,
    and the fraction of that bandwidth a collective achieves (`efficiency`, None: all of it)."""

    bandwidth: float
    latency: float
    efficiency: Optional[Achieved] = None

    def __post_init__(self) -> None:
        _number("Link", "bandwidth", self.bandwidth, "a number > 0 (bytes/s per GPU per direction)")
        _number("Link", "latency", self.latency, "a number >= 0 (seconds)", positive=False)
        if self.efficiency is not None and not isinstance(self.efficiency, Achieved):
            raise _fail("Link", "efficiency", self.efficiency, "an Achieved(fraction, source) or None")

    @property
    def achieved(self) -> float:
        """The bandwidth a collective sees: bandwidth times the efficiency's fraction."""
        return self.bandwidth * (1.0 if self.efficiency is None else self.efficiency.fraction)


@dataclass(frozen=True)
class Waves:
    """The GPU's SMs and the output tile a GEMM kernel gives each, as NVIDIA's "Matrix Multiplication
    Background User's Guide" describes them: a tile sticking out of the output computes its whole size
    (tile quantization) and the tiles run in waves of `sms`, one a SM, a partial last wave leaving SMs
    idle (wave quantization). A product of fewer rows or columns than a tile is priced as a whole tile,
    where cuBLAS would choose a smaller tile or a GEMV kernel: the estimate prices training's products."""

    sms: int
    tile: tuple[int, int]
    source: str

    def __post_init__(self) -> None:
        if isinstance(self.sms, bool) or not isinstance(self.sms, int) or self.sms < 1:
            raise _fail("Waves", "sms", self.sms, "an integer >= 1 (the GPU's streaming multiprocessors)")
        tile = self.tile
        if not (isinstance(tile, tuple) and len(tile) == 2 and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in tile)):
            raise _fail("Waves", "tile", tile, "two integers >= 1 (the output tile's rows and columns)")
        _text("Waves", "source", self.source)

    def fraction(self, batch: int, m: int, n: int) -> float:
        """The share of the waves' tile slots a (batch of) m x n output fills: 1 when it fills them all."""
        rows, cols = self.tile
        tiles = batch * -(-m // rows) * -(-n // cols)
        return batch * m * n / (-(-tiles // self.sms) * self.sms * rows * cols)


@dataclass(frozen=True)
class GemmEfficiency:
    """The roofline capped at `max_fraction` of peak, times the waves' fraction where `waves` is given
    (module docstring); `source` says where it comes from. `dtypes`: ((dtype, Achieved), ...), the cap of
    the dtypes measured apart (an FP8 product's achieved share of the fp8 peak is not bf16's); every other
    dtype is capped at `max_fraction`. Model "shape" also caps a batched product at what its `batched` table
    says products of its smallest dimension achieve, and scales a single product's cap by its contraction's
    point on the `unbatched` curve (spmdsim.tools.estimate.gemm_shapes); it has one table or both."""

    max_fraction: float
    source: str
    model: str = "roofline"
    waves: Optional[Waves] = None
    dtypes: tuple[tuple[str, Achieved], ...] = ()
    batched: Optional[BatchedShapes] = None
    unbatched: Optional[UnbatchedShapes] = None

    def __post_init__(self) -> None:
        _check_efficiency("GemmEfficiency", "", self.model, self.max_fraction, self.source)
        if self.waves is not None and not isinstance(self.waves, Waves):
            raise _fail("GemmEfficiency", "waves", self.waves, "a Waves(sms, tile, source) or None")
        for key, kind in (("batched", BatchedShapes), ("unbatched", UnbatchedShapes)):
            table = getattr(self, key)
            if not (table is None or (isinstance(table, kind) and self.model == "shape")):
                raise _fail("GemmEfficiency", key, table, f"a {kind.__name__} with model 'shape', None with model "
                            "'roofline'")
            for dtype in table.dtypes if table is not None else ():
                if dtype not in DTYPES:
                    raise _fail("GemmEfficiency", f"{key}.dtypes", dtype, f"dtypes among {tuple(DTYPES)!r}")
        if self.model == "shape" and self.batched is None and self.unbatched is None:
            raise _fail("GemmEfficiency", "batched", None, "a BatchedShapes or an UnbatchedShapes with model 'shape'")
        object.__setattr__(self, "dtypes", tuple(dict(self.dtypes).items()))
        for dtype, achieved in self.dtypes:
            if dtype not in DTYPES:
                raise _fail("GemmEfficiency", f"dtypes.{dtype}", achieved, f"a dtype among {tuple(DTYPES)!r}")
            if not isinstance(achieved, Achieved):
                raise _fail("GemmEfficiency", f"dtypes.{dtype}", achieved, "an Achieved(fraction, source)")

    def cap(self, dtype: Any) -> float:
        """The largest fraction of `dtype`'s peak a product reaches: its own entry in `dtypes`, else
        `max_fraction`."""
        key = normalize_dtype(dtype)
        for name, achieved in self.dtypes:
            if name == key:
                return achieved.fraction
        return self.max_fraction


@dataclass(frozen=True)
class AttentionEfficiency:
    """The fraction of a dtype's peak a fused (flash) attention kernel achieves on the FLOPs it executes, its
    forward and its backward (the scores made again, dP, dV, dQ, dK), as the kernel's published benchmarks
    count them (a causal core's half); `source` says where each figure comes from."""

    forward: float
    backward: float
    source: str

    def __post_init__(self) -> None:
        for key in ("forward", "backward"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise _fail("AttentionEfficiency", key, value, "a number in (0, 1] (fraction of peak)")
        _text("AttentionEfficiency", "source", self.source)

    def of(self, phase: str) -> float:
        """The fraction for a product of `phase` ("forward"; "backward" and "recompute" run in the backward)."""
        return self.forward if phase == "forward" else self.backward


def _check_efficiency(where: str, prefix: str, model: Any, max_fraction: Any, source: Any) -> None:
    if model not in EFFICIENCY_MODELS:
        raise _fail(where, prefix + "model", model, f"one of {EFFICIENCY_MODELS!r}")
    ok = isinstance(max_fraction, (int, float)) and not isinstance(max_fraction, bool)
    if not ok or not 0 < max_fraction <= 1:
        raise _fail(where, prefix + "max_fraction", max_fraction, "a number in (0, 1] (fraction of peak)")
    _text(where, prefix + "source", source)


@dataclass(frozen=True)
class Machine:
    """One GPU of a cluster and its links: the figures `spmdsim.tools.estimate.steptime` prices a step with.

    Attributes:
        name, description: what the machine is.
        sources: where each figure comes from (title, URL, which figure), or "assumption: ...".
        gpus_per_node: GPUs (ranks) sharing one node's fast links.
        memory_bytes: memory of one GPU.
        peak_flops: ((dtype, FLOP/s), ...): dense peak per dtype ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8").
        hbm_bandwidth: memory bandwidth of one GPU, bytes/s.
        gemm_efficiency: the achieved fraction of peak as a function of a GEMM's shape.
        node, cluster: the `Link` of each level (records.LEVELS).
        algorithm: "ring" or "tree": which formulas of spmdsim.programs.cost.model price a collective.
        reduction_rate: bytes/s a GPU reduces in a reducing collective, or None (reduction free).
        hbm_efficiency: the fraction of hbm_bandwidth a memory-bound kernel reaches, or None (all of it).
        attention_efficiency: the fraction of peak a fused attention kernel reaches (`AttentionEfficiency`), or
            None (its products priced by the GEMM model, its score tiles counted as a product's traffic).
    """

    name: str
    description: str
    sources: tuple[str, ...]
    gpus_per_node: int
    memory_bytes: int
    peak_flops: tuple[tuple[str, float], ...]
    hbm_bandwidth: float
    gemm_efficiency: GemmEfficiency
    node: Link
    cluster: Link
    algorithm: str = "ring"
    reduction_rate: float | None = field(default=None)
    hbm_efficiency: Optional[Achieved] = None
    attention_efficiency: Optional[AttentionEfficiency] = None

    def __post_init__(self) -> None:
        where = f"machine {self.name!r}"
        _text(where, "name", self.name)
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "peak_flops", tuple((str(d), p) for d, p in dict(self.peak_flops).items()))
        _check_fields(where, {"description": self.description, "sources": list(self.sources),
                              "gpus_per_node": self.gpus_per_node, "memory_bytes": self.memory_bytes,
                              "peak_flops": dict(self.peak_flops), "hbm_bandwidth": self.hbm_bandwidth,
                              "algorithm": self.algorithm, "reduction_rate": self.reduction_rate})
        for level in LEVELS:
            if not isinstance(getattr(self, level), Link):
                raise _fail(where, level, getattr(self, level), "a Link(bandwidth, latency)")
        if not isinstance(self.gemm_efficiency, GemmEfficiency):
            raise _fail(where, "gemm_efficiency", self.gemm_efficiency, "a GemmEfficiency")
        if self.hbm_efficiency is not None and not isinstance(self.hbm_efficiency, Achieved):
            raise _fail(where, "hbm_efficiency", self.hbm_efficiency, "an Achieved(fraction, source) or None")
        if self.attention_efficiency is not None and not isinstance(self.attention_efficiency, AttentionEfficiency):
            raise _fail(where, "attention_efficiency", self.attention_efficiency,
                        "an AttentionEfficiency(forward, backward, source) or None")

    @property
    def hbm_achieved(self) -> float:
        """Bytes/s a memory-bound kernel moves: hbm_bandwidth times hbm_efficiency's fraction."""
        return self.hbm_bandwidth * (1.0 if self.hbm_efficiency is None else self.hbm_efficiency.fraction)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes this machine gives a peak for."""
        return tuple(d for d, _ in self.peak_flops)

    def peak(self, dtype: Any) -> float:
        """Peak FLOP/s for `dtype` (any spelling `normalize_dtype` reads)."""
        key = normalize_dtype(dtype)
        for name, value in self.peak_flops:
            if name == key:
                return value
        raise SpmdsimError(f"dtype {dtype!r} has no peak in machine {self.name!r}; "
                           f"expected one of {self.dtypes!r}")

    def link(self, level: str) -> Link:
        """The `Link` of `level` ("node" or "cluster")."""
        if level not in LEVELS:
            raise SpmdsimError(f"level {level!r} is unknown; expected one of {LEVELS!r}")
        return getattr(self, level)

    def product_seconds(self, gemm: Any) -> float:
        """Seconds of one call of `gemm` (batch, m, n, k, dtype, phase, flops; `kernel` and `share` where it runs
        inside a fused kernel, spmdsim.base.flop_counts.Gemm): a fused attention kernel's product, where the
        machine gives `attention_efficiency`, ``share * flops / (peak * fraction of its phase)``; any other
        ``flops / (peak * gemm_efficiency_of(...))``."""
        peak = self.peak(gemm.dtype)
        if getattr(gemm, "kernel", "") == "attention" and self.attention_efficiency is not None:
            return getattr(gemm, "share", 1.0) * gemm.flops / (peak * self.attention_efficiency.of(gemm.phase))
        return gemm.flops / (peak * self.gemm_efficiency_of(gemm.dtype, gemm.batch, gemm.m, gemm.n, gemm.k))

    def gemm_efficiency_of(self, dtype: Any, batch: int, m: int, n: int, k: int) -> float:
        """Achieved fraction of `dtype`'s peak for a (batch of) m x k @ k x n product (module docstring)."""
        peak = self.peak(dtype)
        key = normalize_dtype(dtype)
        traffic = batch * (DTYPES[key] * (m * k + k * n) + RESULT_BYTES.get(key, DTYPES[key]) * m * n)
        flops = 2 * batch * m * n * k
        if flops == 0:
            return self.gemm_efficiency.cap(key)
        waves = self.gemm_efficiency.waves
        cap = self.gemm_efficiency.cap(key) * (1.0 if waves is None else waves.fraction(batch, m, n))
        table = self.gemm_efficiency.batched
        measured = None if table is None else table.fraction(key, batch, m, n, k)
        if measured is not None:
            cap = min(cap, measured)
        curve = self.gemm_efficiency.unbatched
        factor = None if curve is None else curve.factor(key, batch, k)
        cap *= 1.0 if factor is None else factor
        return min(cap, flops / traffic * self.hbm_bandwidth / peak)


def _check_fields(where: str, data: Mapping[str, Any]) -> None:
    """The plain fields of a machine (not links, not the efficiency model), named as in the file."""
    _text(where, "description", data["description"])
    sources = data["sources"]
    if not isinstance(sources, list) or not sources:
        raise _fail(where, "sources", sources, "a non-empty list of citation strings")
    for i, text in enumerate(sources):
        _text(where, f"sources[{i}]", text, "a citation string (title, URL, which figure)")
    _integer(where, "gpus_per_node", data["gpus_per_node"], "an integer >= 1")
    _integer(where, "memory_bytes", data["memory_bytes"], "an integer >= 1 (bytes per GPU)")
    peaks = data["peak_flops"]
    if not isinstance(peaks, Mapping) or not peaks:
        raise _fail(where, "peak_flops", peaks, f"an object of FLOP/s per dtype, dtypes among {tuple(DTYPES)!r}")
    for dtype, value in peaks.items():
        if dtype not in DTYPES:
            raise _fail(where, f"peak_flops.{dtype}", value, f"a dtype among {tuple(DTYPES)!r}")
        _number(where, f"peak_flops.{dtype}", value, "a number > 0 (FLOP/s)")
    _number(where, "hbm_bandwidth", data["hbm_bandwidth"], "a number > 0 (bytes/s)")
    if data["algorithm"] not in ALGORITHMS:
        raise _fail(where, "algorithm", data["algorithm"], f"one of {ALGORITHMS!r}")
    if data["reduction_rate"] is not None:
        _number(where, "reduction_rate", data["reduction_rate"], "a number > 0 (bytes/s reduced) or null")
