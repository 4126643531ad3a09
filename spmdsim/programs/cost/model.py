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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ...errors import SpmdsimError
from .fit import fit_model
from .store import default_path, load_model, model_from_dict, model_to_dict, save_model
from .terms import (ALGORITHMS, OPS, Measurement, OpParams, call_terms, check_bytes, check_group_size, check_params,
                    normalize_op)

__all__ = ["CostModel", "DEFAULT_MODEL", "load_or_default"]


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
        check_params(alpha_s=self.alpha_s, beta_s_per_byte=self.beta_s_per_byte,
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
        check_group_size(group_size)
        check_bytes(bytes_per_rank, "bytes per rank")
        a, b, c = call_terms(op, self.algorithm, int(group_size), float(bytes_per_rank))
        alpha, beta, gamma = self.params(op, int(group_size))
        return a * alpha + b * beta + c * gamma

    def predict_copy(self, bytes_copied: float) -> float:
        """Predicted seconds to pack or unpack `bytes_copied` bytes locally (a strided copy)."""
        check_bytes(bytes_copied, "bytes copied")
        return bytes_copied * self.copy_s_per_byte

    # -- fitting (spmdsim.programs.cost.fit) ---------------------------------------------------
    @classmethod
    def fit(cls, measurements: Iterable[Measurement | Sequence[Any]], *, algorithm: str | None = None,
            per_op: bool = True, per_group: bool = True, source: str = "fit") -> "CostModel":
        """Least-squares fit to measured calls; minimizes relative (not absolute) error.

        Args:
            measurements: Measurement values or (op, group_size, bytes, seconds) tuples.
            algorithm: "ring" or "tree"; None tries both and keeps the better fit.
            per_op: also fit each collective with >= 3 distinct (g, n) points on its own (alpha and
                beta: one collective's points cannot tell beta from gamma, their terms are proportional).
            per_group: also fit each (collective, group size) with >= 2 sizes on its own (alpha and beta).
            Every override is kept only where it fits its own points better.
        """
        return fit_model(cls, measurements, algorithm=algorithm, per_op=per_op,
                         per_group=per_group, source=source)

    def log_error(self, measurements: Iterable[Measurement]) -> float:
        """Root mean square of log(predicted / measured) (0 = perfect)."""
        errs = [math.log(max(self.predict(m.op, m.group_size, m.bytes_per_rank), 1e-12) / m.seconds)
                for m in measurements]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0

    # -- persistence (spmdsim.programs.cost.store) ----------------------------------------------
    def to_dict(self) -> dict:
        return model_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CostModel":
        return model_from_dict(cls, data)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the model as JSON (default `default_path()`); returns the path."""
        return save_model(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "CostModel":
        """Read a saved model (default `default_path()`); raises if missing or malformed."""
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


def load_or_default(path: str | os.PathLike | None = None) -> CostModel:
    """The saved model if there is one, else DEFAULT_MODEL (a malformed file still raises)."""
    source = Path(path) if path is not None else default_path()
    if not source.exists():
        return DEFAULT_MODEL
    return CostModel.load(source)
