"""What products of a given shape achieve: a machine file's measured tables (gemm_efficiency "batched",
"unbatched").

Pure (standard library only). A batched product (batch > 1: the attention core's scores, QKᵀ, and context,
PV, with their gradients) whose smallest dimension is small runs far below the cap a large GEMM reaches: its
tiles' main loop is short (the scores' contraction, the head dimension) or its output is thin (the context's
columns, the head dimension), and the roofline does not see either. A machine file may give what such
products were measured to achieve, as a fraction of the dtype's peak, by the smallest dimension:

    "batched": {"dtypes": ["fp16", "bf16"],
                "contraction": [[64, 0.189], [128, 0.337], ...],
                "output": [[64, 0.256], [128, 0.442], ...],
                "source": "..."}

"contraction" prices a product whose contraction k is its smallest dimension (the scores' shape),
"output" one whose smallest dimension is a row or column count of its result (the context's). The fraction
at a dimension between two points is interpolated linearly, below the first point it is the first's and
above the last the last's (the measured curve flat there). It caps the product's efficiency beside the
roofline and the waves (spmdsim.tools.estimate.machine_records.Machine.gemm_efficiency_of); products of
other dtypes and unbatched ones (a linear layer's, one GEMM of all its rows) are not priced by it.

A linear layer's product (batch 1, thousands of rows and columns) loses to its contraction length K instead:
each output tile's main loop runs K / k-tile steps between a fixed prologue and epilogue, so a short K
leaves the Tensor Cores idle a larger share of the tile's time. A machine file may give what such products
were measured to achieve by K, for the dtypes measured:

    "unbatched": {"dtypes": ["fp8"], "contraction": [[512, 0.392], ..., [16384, 0.768]], "source": "..."}

The curve's shape is what it prices: a product of contraction k reaches the dtype's cap (its sustained best,
gemm_efficiency.dtypes) times the curve at k over the curve's highest point (`UnbatchedShapes.factor`), so a
table measured at boost clocks in short runs scales the sustained cap and never raises it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .file_keys import _MISSING, _fail, _no_other_keys, _text

__all__ = ["BatchedShapes", "UnbatchedShapes", "batched_from_dict", "batched_to_dict", "unbatched_from_dict",
           "unbatched_to_dict", "KEYS", "UNBATCHED_KEYS"]

#: The keys of gemm_efficiency.batched.
KEYS = ("dtypes", "contraction", "output", "source")
#: The keys of gemm_efficiency.unbatched.
UNBATCHED_KEYS = ("dtypes", "contraction", "source")

_CITATION = "a citation string (title, URL, which figure)"
_POINTS = "a list of [dimension, fraction] pairs, dimensions integers >= 1 rising, fractions in (0, 1]"


def _points(where: str, key: str, value: Any) -> tuple[tuple[int, float], ...]:
    """A table row: [[dimension, fraction], ...], dimensions rising, each fraction of peak in (0, 1]."""
    ok = isinstance(value, (list, tuple)) and len(value) >= 1
    rows = []
    for pair in value if ok else ():
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            ok = False
            break
        dim, fraction = pair
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1 or (rows and dim <= rows[-1][0]):
            ok = False
            break
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            ok = False
            break
        rows.append((dim, float(fraction)))
    if not ok:
        raise _fail(where, key, value, _POINTS)
    return tuple(rows)


@dataclass(frozen=True)
class BatchedShapes:
    """The fraction of peak batched products reach by their smallest dimension (module docstring): `dtypes`
    the dtypes it was measured in, `contraction` and `output` ((dimension, fraction), ...) rising, `source`
    where each figure comes from."""

    dtypes: tuple[str, ...]
    contraction: tuple[tuple[int, float], ...]
    output: tuple[tuple[int, float], ...]
    source: str

    def __post_init__(self) -> None:
        where = "BatchedShapes"
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        for key in ("contraction", "output"):
            object.__setattr__(self, key, _points(where, key, getattr(self, key)))
        if not self.dtypes or not all(isinstance(d, str) and d for d in self.dtypes):
            raise _fail(where, "dtypes", self.dtypes, "a non-empty list of dtype names")
        _text(where, "source", self.source, _CITATION)

    def fraction(self, dtype: str, batch: int, m: int, n: int, k: int) -> float | None:
        """The measured fraction of peak for a batch of m x k @ k x n products in `dtype` (a machine-file dtype
        name), or None where the table does not price it (one product, or another dtype)."""
        if batch <= 1 or dtype not in self.dtypes:
            return None
        smallest = min(m, n, k)
        return interpolate(self.contraction if k == smallest else self.output, smallest)


@dataclass(frozen=True)
class UnbatchedShapes:
    """The fraction of peak one large product reaches by its contraction length (module docstring): `dtypes` the
    dtypes it was measured in, `contraction` ((k, fraction), ...) rising, `source` where each figure comes from."""

    dtypes: tuple[str, ...]
    contraction: tuple[tuple[int, float], ...]
    source: str

    def __post_init__(self) -> None:
        where = "UnbatchedShapes"
        object.__setattr__(self, "dtypes", tuple(self.dtypes))
        object.__setattr__(self, "contraction", _points(where, "contraction", self.contraction))
        if not self.dtypes or not all(isinstance(d, str) and d for d in self.dtypes):
            raise _fail(where, "dtypes", self.dtypes, "a non-empty list of dtype names")
        _text(where, "source", self.source, _CITATION)

    def factor(self, dtype: str, batch: int, k: int) -> float | None:
        """The share of the dtype's cap a single m x k @ k x n product in `dtype` reaches: the curve at `k` over
        its highest point; None where the table does not price it (a batch of products, or another dtype)."""
        if batch > 1 or dtype not in self.dtypes:
            return None
        return interpolate(self.contraction, k) / max(f for _, f in self.contraction)


def interpolate(points: Sequence[tuple[int, float]], dim: int) -> float:
    """The fraction at `dim` on the rising points, linear between two, the end's value beyond either end."""
    if dim <= points[0][0]:
        return points[0][1]
    for (d0, f0), (d1, f1) in zip(points, points[1:]):
        if dim <= d1:
            return f0 + (f1 - f0) * (dim - d0) / (d1 - d0)
    return points[-1][1]


def _checked(where: str, prefix: str, data: Any, keys: Sequence[str], dtypes: Sequence[str]) -> dict:
    """A table's object, its keys, dtypes, points and source checked: one line naming the key on bad input."""
    if not isinstance(data, Mapping):
        raise _fail(where, prefix, data, f"an object with {tuple(keys)!r}")
    _no_other_keys(where, prefix, data, keys)
    for key in keys:
        if key not in data:
            raise _fail(where, f"{prefix}.{key}", _MISSING, _CITATION if key == "source" else "present")
    names = data["dtypes"]
    if not isinstance(names, list) or not names or any(d not in dtypes for d in names):
        raise _fail(where, f"{prefix}.dtypes", names, f"a non-empty list of dtypes among {tuple(dtypes)!r}")
    out = {key: _points(where, f"{prefix}.{key}", data[key]) for key in keys if key not in ("dtypes", "source")}
    out["source"] = _text(where, f"{prefix}.source", data["source"], _CITATION)
    out["dtypes"] = tuple(names)
    return out


def batched_from_dict(where: str, data: Any, dtypes: Sequence[str]) -> BatchedShapes:
    """gemm_efficiency.batched of a machine file, checked: one line naming the key on bad input; `dtypes` the
    dtypes a machine file may name."""
    rows = _checked(where, "gemm_efficiency.batched", data, KEYS, dtypes)
    return BatchedShapes(rows["dtypes"], rows["contraction"], rows["output"], rows["source"])


def unbatched_from_dict(where: str, data: Any, dtypes: Sequence[str]) -> UnbatchedShapes:
    """gemm_efficiency.unbatched of a machine file, checked as `batched_from_dict`."""
    rows = _checked(where, "gemm_efficiency.unbatched", data, UNBATCHED_KEYS, dtypes)
    return UnbatchedShapes(rows["dtypes"], rows["contraction"], rows["source"])


def batched_to_dict(table: BatchedShapes) -> dict:
    """The JSON object `batched_from_dict` reads back equal."""
    return {"dtypes": list(table.dtypes), "contraction": [list(p) for p in table.contraction],
            "output": [list(p) for p in table.output], "source": table.source}


def unbatched_to_dict(table: UnbatchedShapes) -> dict:
    """The JSON object `unbatched_from_dict` reads back equal."""
    return {"dtypes": list(table.dtypes), "contraction": [list(p) for p in table.contraction],
            "source": table.source}
