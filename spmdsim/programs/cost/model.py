"""The formulas: predicted seconds of one collective call under a frozen `CostModel`.

Pure (standard library only; never imports mpi4py). Each collective on a group of ``g``
ranks costs ``a * alpha + b * beta + c * gamma`` seconds, where ``alpha`` is
the per-message latency, ``beta`` the seconds per byte moved and ``gamma`` the
seconds per byte reduced (Thakur, Rabenseifner & Gropp 2005). ``n`` is the
collective's per-rank buffer, the usual "message size":

=============== ============================== ===========================
op              ring (large messages)          tree (small messages)
=============== ============================== ===========================
allgather       (g-1)a + (g-1)/g n b           log2(g) a + (g-1)/g n b
reduce_scatter  (g-1)a + (g-1)/g n (b + c)     log2(g) a + (g-1)/g n (b + c)
allreduce       2(g-1)a + 2(g-1)/g n b         log2(g) (a + n b + n c)
                + (g-1)/g n c
alltoall        (g-1)a + (g-1)/g n b           log2(g) a + log2(g) n/2 b
alltoallv       (g-1)a + (g-1)/g n b           (same as ring: no Bruck)
bcast           (log2(g) + g-1)a + 2(g-1)/g n b  log2(g) (a + n b)
=============== ============================== ===========================

with ``n`` = gathered output (allgather), unreduced input (reduce_scatter),
the buffer (allreduce, bcast) or the whole send buffer including the rank's
own block (alltoall, alltoallv/exchange). In every ring row ``(g-1)/g n`` is
exactly what one rank sends and receives. A group of one rank costs 0.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ...errors import SpmdsimError

__all__ = ["OPS", "ALGORITHMS", "CostModel", "Measurement", "OpParams", "DEFAULT_MODEL", "normalize_op"]

OPS = ("allgather", "reduce_scatter", "allreduce", "alltoall", "alltoallv", "bcast")
ALGORITHMS = ("ring", "tree")

# Names other modules use for the same collective (planner steps, MPI names).
_ALIASES = {"all_gather": "allgather", "reducescatter": "reduce_scatter", "reduce_scatter_block": "reduce_scatter",
            "all_reduce": "allreduce", "all_to_all": "alltoall", "all_to_allv": "alltoallv", "exchange": "alltoallv",
            "broadcast": "bcast"}


def normalize_op(op: str) -> str:
    """Canonical collective name (``"AllGather"`` -> ``"allgather"``, ``"exchange"`` -> ``"alltoallv"``)."""
    if not isinstance(op, str):
        raise SpmdsimError(f"collective name {op!r} must be a string; expected one of {OPS!r}")
    key = op.strip().lower().replace("-", "_").replace(" ", "_")
    key = _ALIASES.get(key, _ALIASES.get(key.replace("_", ""), key))
    if key not in OPS:
        raise SpmdsimError(f"unknown collective {op!r}; expected one of {OPS!r}")
    return key


def _terms(op: str, algorithm: str, g: int, n: float) -> tuple[float, float, float]:
    """Coefficients (of alpha, beta, gamma) for one call; see the module table."""
    if g <= 1 or n < 0:
        return 0.0, 0.0, 0.0
    lg = math.log2(g)
    frac = (g - 1) / g * n
    ring = algorithm == "ring"
    if op == "allgather":
        return ((g - 1) if ring else lg), frac, 0.0
    if op == "reduce_scatter":
        return ((g - 1) if ring else lg), frac, frac
    if op == "allreduce":
        return (2 * (g - 1), 2 * frac, frac) if ring else (lg, lg * n, lg * n)
    if op == "alltoall":
        return ((g - 1), frac, 0.0) if ring else (lg, lg * n / 2, 0.0)
    if op == "alltoallv":
        return (g - 1), frac, 0.0
    if op == "bcast":
        return (lg + g - 1, 2 * frac, 0.0) if ring else (lg, lg * n, 0.0)
    raise SpmdsimError(f"unknown collective {op!r}; expected one of {OPS!r}")


@dataclass(frozen=True)
class OpParams:
    """Override of (alpha, beta, gamma) for one collective, or one collective and group size.

    Set by `CostModel.fit`; ``group_size=None`` applies to every group size
    that has no override of its own.
    """

    op: str
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0
    group_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", normalize_op(self.op))
        _check_params(alpha_s=self.alpha_s, beta_s_per_byte=self.beta_s_per_byte,
                      gamma_s_per_byte=self.gamma_s_per_byte)
        g = self.group_size
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 2):
            raise SpmdsimError(f"override group size {g!r} must be None or an integer >= 2")

    @property
    def key(self) -> tuple[str, int]:
        return self.op, self.group_size or 0


@dataclass(frozen=True)
class Measurement:
    """One timed call: collective, group size, per-rank buffer bytes ``n``, seconds."""

    op: str
    group_size: int
    bytes_per_rank: int
    seconds: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", normalize_op(self.op))
        _check_group_size(self.group_size)
        _check_bytes(self.bytes_per_rank, "measurement bytes")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, numbers.Real) or not (
                0 < self.seconds < math.inf):
            raise SpmdsimError(f"measurement seconds {self.seconds!r} must be a finite number > 0")
        object.__setattr__(self, "group_size", int(self.group_size))


def _check_group_size(g: int) -> None:
    # A NaN or infinite size raised ValueError/OverflowError from int(); a string compared unequal.
    if isinstance(g, bool) or not isinstance(g, numbers.Real) or not math.isfinite(g) or int(g) != g or g < 1:
        raise SpmdsimError(f"group size {g!r} must be a positive integer")


def _check_bytes(value: Any, what: str) -> None:
    """A byte count: a finite real number >= 0 (a NaN or infinite one priced NaN or inf seconds, a string or
    None raised TypeError, True counted as 1 byte)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise SpmdsimError(f"{what} {value!r} must be a finite number >= 0")


def _check_params(**params: float) -> None:
    """Each named parameter (a rate or latency) must be a finite number >= 0."""
    for name, value in params.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise SpmdsimError(f"{name} {value!r} must be a finite number >= 0")


@dataclass(frozen=True)
class CostModel:
    """Alpha-beta(-gamma) model: ``CostModel(alpha_s=2e-6, beta_s_per_byte=2e-10)``.

    Attributes:
        alpha_s: latency per message step, seconds.
        beta_s_per_byte: transfer time per byte a rank sends, seconds.
        gamma_s_per_byte: reduction time per byte reduced, seconds.
        algorithm: "ring" (bandwidth-optimal) or "tree" (log-latency) formulas.
        per_op: fitted overrides per collective (and per collective and group size).
        source: where the numbers come from (free text, saved with the model).
        copy_s_per_byte: local packing time per byte copied (a strided block copied
            into a send buffer or out of a receive buffer), seconds; `predict_copy`.
    """

    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0
    algorithm: str = "ring"
    per_op: tuple[OpParams, ...] = ()
    source: str = ""
    copy_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        _check_params(alpha_s=self.alpha_s, beta_s_per_byte=self.beta_s_per_byte,
                      gamma_s_per_byte=self.gamma_s_per_byte, copy_s_per_byte=self.copy_s_per_byte)
        if self.algorithm not in ALGORITHMS:
            raise SpmdsimError(f"algorithm {self.algorithm!r} is unknown; expected one of {ALGORITHMS!r}")
        per_op = tuple(self.per_op)
        if any(not isinstance(p, OpParams) for p in per_op):
            raise SpmdsimError(f"per_op {per_op!r} must hold OpParams values")
        keys = [p.key for p in per_op]
        if len(set(keys)) != len(keys):
            raise SpmdsimError(f"per_op overrides a collective and group size twice: {keys!r}")
        per_op = sorted(per_op, key=lambda p: (OPS.index(p.op), p.group_size or 0))
        object.__setattr__(self, "per_op", tuple(per_op))

    def params(self, op: str, group_size: int | None = None) -> tuple[float, float, float]:
        """(alpha, beta, gamma) for `op` on `group_size` ranks.

        The override for (op, group_size) if any, else the one for op, else the shared values.
        """
        op = normalize_op(op)
        found = None
        for p in self.per_op:
            if p.op == op and p.group_size == group_size and group_size is not None:
                return p.alpha_s, p.beta_s_per_byte, p.gamma_s_per_byte
            if p.op == op and p.group_size is None:
                found = p
        if found is not None:
            return found.alpha_s, found.beta_s_per_byte, found.gamma_s_per_byte
        return self.alpha_s, self.beta_s_per_byte, self.gamma_s_per_byte

    def predict(self, op: str, group_size: int, bytes_per_rank: float) -> float:
        """Predicted seconds of one `op` over `group_size` ranks with per-rank buffer bytes."""
        op = normalize_op(op)
        _check_group_size(group_size)
        _check_bytes(bytes_per_rank, "bytes per rank")
        a, b, c = _terms(op, self.algorithm, int(group_size), float(bytes_per_rank))
        alpha, beta, gamma = self.params(op, int(group_size))
        return a * alpha + b * beta + c * gamma

    def predict_copy(self, bytes_copied: float) -> float:
        """Predicted seconds to pack or unpack `bytes_copied` bytes locally (a strided copy)."""
        _check_bytes(bytes_copied, "bytes copied")
        return bytes_copied * self.copy_s_per_byte

    # -- fitting (spmdsim.programs.cost.fit) ---------------------------------------------------
    @classmethod
    def fit(cls, measurements: Iterable[Measurement | Sequence[Any]], *, algorithm: str | None = None,
            per_op: bool = True, per_group: bool = True, source: str = "fit") -> "CostModel":
        """Least-squares fit to measured calls; minimizes relative (not absolute) error.

        Args:
            measurements: Measurement values or (op, group_size, bytes, seconds) tuples.
            algorithm: "ring" or "tree"; None tries both and keeps the better fit.
            per_op: also fit each collective with >= 3 distinct (g, n) points on its own.
            per_group: also fit each (collective, group size) with >= 2 sizes on its own
                (alpha and beta; one group size cannot tell beta from gamma).
            Every override is kept only where it fits its own points better.
        """
        from .fit import fit_model

        return fit_model(cls, measurements, algorithm=algorithm, per_op=per_op,
                         per_group=per_group, source=source)

    def log_error(self, measurements: Iterable[Measurement]) -> float:
        """Root mean square of log(predicted / measured) (0 = perfect)."""
        errs = [math.log(max(self.predict(m.op, m.group_size, m.bytes_per_rank), 1e-12) / m.seconds)
                for m in measurements]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0

    # -- persistence (spmdsim.programs.cost.store) ----------------------------------------------
    def to_dict(self) -> dict:
        from .store import model_to_dict

        return model_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CostModel":
        from .store import model_from_dict

        return model_from_dict(cls, data)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the model as JSON (default `default_path()`); returns the path."""
        from .store import save_model

        return save_model(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "CostModel":
        """Read a saved model (default `default_path()`); raises if missing or malformed."""
        from .store import load_model

        return load_model(cls, path)

    def __str__(self) -> str:
        text = (f"CostModel({self.algorithm}: alpha={self.alpha_s * 1e6:.3g} us, "
                f"beta={_gbps(self.beta_s_per_byte)}, gamma={_gbps(self.gamma_s_per_byte)}")
        if self.copy_s_per_byte:
            text += f", copy={_gbps(self.copy_s_per_byte)}"
        return text + (f", {len(self.per_op)} per-op/group fits)" if self.per_op else ")")


def _gbps(s_per_byte: float) -> str:
    return "inf GB/s" if s_per_byte == 0 else f"{1e-9 / s_per_byte:.3g} GB/s"


#: Used when no model was saved: the shared ring fit of `spmdsim calibrate --sizes
#: 1M,2M,4M,8M,16M` for MPICH shared memory, 8 ranks on 2 cores, polite wait (see
#: docs/explanation/performance.md). Latency is scheduling-bound there. Run `spmdsim calibrate` for yours.
DEFAULT_MODEL = CostModel(
    alpha_s=200e-6, beta_s_per_byte=0.75e-9, gamma_s_per_byte=0.65e-9, source="default",
    copy_s_per_byte=1.0e-9,  # 1 GB/s: packing inside a collective step (spmdsim calibrate)
)
