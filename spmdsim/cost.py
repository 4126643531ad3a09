"""Alpha-beta cost model of the collectives: predicted seconds per call.

Pure (numpy only; never imports mpi4py). Each collective on a group of ``g``
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

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import SpmdsimError

__all__ = [
    "OPS",
    "ALGORITHMS",
    "CostModel",
    "Measurement",
    "OpParams",
    "DEFAULT_MODEL",
    "default_path",
    "load_or_default",
    "predict_plan",
    "StepPrediction",
    "normalize_op",
]

OPS = ("allgather", "reduce_scatter", "allreduce", "alltoall", "alltoallv", "bcast")
ALGORITHMS = ("ring", "tree")

# Names other modules use for the same collective (planner steps, MPI names).
_ALIASES = {
    "all_gather": "allgather",
    "reducescatter": "reduce_scatter",
    "reduce_scatter_block": "reduce_scatter",
    "all_reduce": "allreduce",
    "all_to_all": "alltoall",
    "all_to_allv": "alltoallv",
    "exchange": "alltoallv",
    "broadcast": "bcast",
}
# Planner steps that move nothing between ranks.
_LOCAL_OPS = frozenset({"localslice", "local_slice", "slice", "local", "noop", "identity",
                        "zero", "localzero", "local_zero", "keep", "b_to_p"})

_FORMAT_VERSION = 1


def normalize_op(op: str) -> str:
    """Canonical collective name (``"AllGather"`` -> ``"allgather"``, ``"exchange"`` -> ``"alltoallv"``)."""
    if not isinstance(op, str):
        raise SpmdsimError(f"collective name {op!r} must be a string; expected one of {OPS!r}")
    key = op.strip().lower().replace("-", "_").replace(" ", "_")
    key = _ALIASES.get(key, _ALIASES.get(key.replace("_", ""), key))
    if key.replace("_", "") == "reducescatter":
        key = "reduce_scatter"
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
        _check_params(self.alpha_s, self.beta_s_per_byte, self.gamma_s_per_byte)
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
        if isinstance(self.group_size, bool) or int(self.group_size) != self.group_size \
                or self.group_size < 1:
            raise SpmdsimError(f"group size {self.group_size!r} must be a positive integer")
        if self.bytes_per_rank < 0 or not self.seconds > 0:
            raise SpmdsimError(
                f"measurement bytes {self.bytes_per_rank!r} / seconds {self.seconds!r} "
                "must be >= 0 and > 0"
            )
        object.__setattr__(self, "group_size", int(self.group_size))


def _check_params(alpha: float, beta: float, gamma: float) -> None:
    for name, value in (("alpha_s", alpha), ("beta_s_per_byte", beta), ("gamma_s_per_byte", gamma)):
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
    """

    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0
    algorithm: str = "ring"
    per_op: tuple[OpParams, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        _check_params(self.alpha_s, self.beta_s_per_byte, self.gamma_s_per_byte)
        if self.algorithm not in ALGORITHMS:
            raise SpmdsimError(
                f"algorithm {self.algorithm!r} is unknown; expected one of {ALGORITHMS!r}"
            )
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
        if isinstance(group_size, bool) or int(group_size) != group_size or group_size < 1:
            raise SpmdsimError(f"group size {group_size!r} must be a positive integer")
        if bytes_per_rank < 0:
            raise SpmdsimError(f"bytes per rank {bytes_per_rank!r} must be >= 0")
        a, b, c = _terms(op, self.algorithm, int(group_size), float(bytes_per_rank))
        alpha, beta, gamma = self.params(op, int(group_size))
        return a * alpha + b * beta + c * gamma

    # -- fitting -------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        measurements: Iterable[Measurement | Sequence[Any]],
        *,
        algorithm: str | None = None,
        per_op: bool = True,
        per_group: bool = True,
        source: str = "fit",
    ) -> "CostModel":
        """Least-squares fit to measured calls; minimizes relative (not absolute) error.

        Args:
            measurements: Measurement values or (op, group_size, bytes, seconds) tuples.
            algorithm: "ring" or "tree"; None tries both and keeps the better fit.
            per_op: also fit each collective with >= 3 distinct (g, n) points on its own.
            per_group: also fit each (collective, group size) with >= 2 sizes on its own
                (alpha and beta; one group size cannot tell beta from gamma).
            Every override is kept only where it fits its own points better.
        """
        data = tuple(m if isinstance(m, Measurement) else Measurement(*m) for m in measurements)
        if len(data) < 2:
            raise SpmdsimError(f"fit needs at least 2 measurements, got {len(data)}")
        choices = ALGORITHMS if algorithm is None else (algorithm,)
        best: tuple[float, CostModel] | None = None
        for algo in choices:
            if algo not in ALGORITHMS:
                raise SpmdsimError(f"algorithm {algo!r} is unknown; expected one of {ALGORITHMS!r}")
            shared = cls(*_log_fit(data, algo), algo, (), source)
            overrides = []
            if per_op:
                for op in OPS:
                    mine = [m for m in data if m.op == op]
                    if len({(m.group_size, m.bytes_per_rank) for m in mine}) < 3:
                        continue
                    own = OpParams(op, *_log_fit(mine, algo))
                    if cls(0.0, 0.0, 0.0, algo, (own,)).log_error(mine) < shared.log_error(mine):
                        overrides.append(own)
            model = replace(shared, per_op=tuple(overrides))
            if per_group:
                model = _fit_groups(model, data, algo)
            err = model.log_error(data)
            if best is None or err < best[0]:
                best = (err, model)
        assert best is not None  # choices is never empty
        return best[1]

    def log_error(self, measurements: Iterable[Measurement]) -> float:
        """Root mean square of log(predicted / measured) (0 = perfect)."""
        errs = [math.log(max(self.predict(m.op, m.group_size, m.bytes_per_rank), 1e-12) / m.seconds)
                for m in measurements]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0

    # -- persistence -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": _FORMAT_VERSION,
            "alpha_s": self.alpha_s,
            "beta_s_per_byte": self.beta_s_per_byte,
            "gamma_s_per_byte": self.gamma_s_per_byte,
            "algorithm": self.algorithm,
            "per_op": [{"op": p.op, "group_size": p.group_size, "alpha_s": p.alpha_s,
                        "beta_s_per_byte": p.beta_s_per_byte,
                        "gamma_s_per_byte": p.gamma_s_per_byte} for p in self.per_op],
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CostModel":
        if not isinstance(data, Mapping) or data.get("version") != _FORMAT_VERSION:
            raise SpmdsimError(
                f"cost model data {data!r:.80} is not a version {_FORMAT_VERSION} spmdsim cost model"
            )
        try:
            raw = data.get("per_op", [])
            if isinstance(raw, Mapping):  # early files: {op: {alpha_s, ...}}
                raw = [dict(vals, op=op) for op, vals in raw.items()]
            per_op = tuple(OpParams(**dict(vals)) for vals in raw)
            return cls(float(data["alpha_s"]), float(data["beta_s_per_byte"]),
                       float(data.get("gamma_s_per_byte", 0.0)), str(data.get("algorithm", "ring")),
                       per_op, str(data.get("source", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise SpmdsimError(f"cost model data is malformed: {exc}") from None

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the model as JSON (default `default_path()`); returns the path."""
        target = Path(path) if path is not None else default_path()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(target)  # atomic: a reader never sees half a file
        return target

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "CostModel":
        """Read a saved model (default `default_path()`); raises if missing or malformed."""
        source = Path(path) if path is not None else default_path()
        try:
            text = source.read_text()
        except OSError as exc:
            raise SpmdsimError(f"cannot read cost model {str(source)!r}: {exc.strerror}") from None
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise SpmdsimError(f"cost model {str(source)!r} is not JSON: {exc}") from None

    def __str__(self) -> str:
        text = (f"CostModel({self.algorithm}: alpha={self.alpha_s * 1e6:.3g} us, "
                f"beta={_gbps(self.beta_s_per_byte)}, gamma={_gbps(self.gamma_s_per_byte)}")
        return text + (f", {len(self.per_op)} per-op/group fits)" if self.per_op else ")")


def _gbps(s_per_byte: float) -> str:
    return "inf GB/s" if s_per_byte == 0 else f"{1e-9 / s_per_byte:.3g} GB/s"


def _fit_groups(model: CostModel, data: Sequence[Measurement], algorithm: str) -> CostModel:
    """Add an (alpha, beta) override per (collective, group size) where it fits better."""
    overrides = list(model.per_op)
    for op in OPS:
        for g in sorted({m.group_size for m in data if m.op == op and m.group_size > 1}):
            mine = [m for m in data if m.op == op and m.group_size == g]
            if len({m.bytes_per_rank for m in mine}) < 2:
                continue
            own = OpParams(op, *_log_fit(mine, algorithm, use_gamma=False), group_size=g)
            alone = CostModel(0.0, 0.0, 0.0, algorithm, (own,))
            if alone.log_error(mine) < model.log_error(mine):
                overrides.append(own)
    return replace(model, per_op=tuple(overrides))


def _rows(data: Sequence[Measurement], algorithm: str, use_gamma: bool) -> np.ndarray:
    rows = np.array([_terms(m.op, algorithm, m.group_size, m.bytes_per_rank) for m in data])
    if not use_gamma:
        rows[:, 2] = 0.0
    return rows


def _nnls_fit(data: Sequence[Measurement], algorithm: str,
              use_gamma: bool = True) -> tuple[float, float, float]:
    """Non-negative least squares on relative error; tries every subset of the 3 terms."""
    rows = _rows(data, algorithm, use_gamma)
    times = np.array([m.seconds for m in data])
    # Divide each row by its measured time: the fit weighs a 10 us call like a 10 ms one.
    a_mat = rows / times[:, None]
    rhs = np.ones(len(data))
    best = (math.inf, (0.0, 0.0, 0.0))
    for mask in range(1, 8):
        cols = [i for i in range(3) if mask >> i & 1]
        sub = a_mat[:, cols]
        if not np.any(sub):
            continue
        coef, *_ = np.linalg.lstsq(sub, rhs, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(3)
        full[cols] = coef
        resid = float(np.sum((a_mat @ full - rhs) ** 2))
        if resid < best[0]:
            best = (resid, tuple(float(v) for v in full))
    return best[1]


def _log_fit(data: Sequence[Measurement], algorithm: str,
             use_gamma: bool = True) -> tuple[float, float, float]:
    """Minimize the squared log ratio predicted/measured (robust to a few fast outliers).

    Starts from the relative-error NNLS solution, then runs damped Gauss-Newton
    on log-parameters so every parameter stays >= 0.
    """
    rows = _rows(data, algorithm, use_gamma)
    log_t = np.log([m.seconds for m in data])
    start = np.array(_nnls_fit(data, algorithm, use_gamma))
    scale = np.abs(rows).max(axis=0)
    used = scale > 0
    # Parameters the data cannot see stay 0; the others start from a floor above 0.
    floor = np.where(used, np.exp(log_t).min() / np.where(used, scale, 1.0) * 1e-6, 0.0)
    p = np.maximum(start, floor)

    def loss(params: np.ndarray) -> float:
        pred = np.maximum(rows @ params, 1e-300)
        return float(np.sum((np.log(pred) - log_t) ** 2))

    best, damping = loss(p), 1e-3
    for _ in range(200):
        pred = np.maximum(rows @ p, 1e-300)
        resid = np.log(pred) - log_t
        jac = rows * p / pred[:, None]  # d log(pred) / d log(p)
        jac[:, ~used] = 0.0
        lhs = jac.T @ jac + damping * np.diag(np.diag(jac.T @ jac) + 1e-12)
        step = np.linalg.solve(lhs, -jac.T @ resid)
        trial = p * np.exp(np.clip(step, -5, 5))
        value = loss(trial)
        if value < best:
            improved = best - value
            p, best, damping = trial, value, damping / 3
            if improved < 1e-12:
                break
        else:
            damping *= 10
            if damping > 1e12:
                break
    # Drop parameters that contribute nothing measurable (cleaner saved models).
    share = (rows * p).max(axis=0) / np.exp(log_t).min()
    p = np.where(share < 1e-4, 0.0, p)
    if loss(p) > loss(start) and np.all(start >= 0):
        p = start
    return tuple(float(v) for v in p)


#: Used when no model was saved: the shared ring fit of `spmdsim calibrate --sizes
#: 1M,2M,4M,8M,16M` for MPICH shared memory, 8 ranks on 2 cores, polite wait (see
#: docs/performance.md). Latency is scheduling-bound there. Run `spmdsim calibrate` for yours.
DEFAULT_MODEL = CostModel(
    alpha_s=200e-6, beta_s_per_byte=0.75e-9, gamma_s_per_byte=0.65e-9, source="default"
)


def default_path() -> Path:
    """$SPMDSIM_COST_FILE, else ~/.cache/spmdsim/cost.json (honours $XDG_CACHE_HOME)."""
    env = os.environ.get("SPMDSIM_COST_FILE")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "spmdsim" / "cost.json"


def load_or_default(path: str | os.PathLike | None = None) -> CostModel:
    """The saved model if there is one, else DEFAULT_MODEL (a malformed file still raises)."""
    source = Path(path) if path is not None else default_path()
    if not source.exists():
        return DEFAULT_MODEL
    return CostModel.load(source)


# -- plans ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPrediction:
    """Predicted time of one plan step (0 for local steps)."""

    index: int
    op: str
    group_size: int
    bytes_per_rank: int
    seconds: float


def predict_plan(plan: Any, model: CostModel | None = None) -> tuple[StepPrediction, ...]:
    """Predicted seconds per step of a redistribution plan (duck-typed on its steps).

    `plan` is a plan with ``.steps`` or an iterable of steps. Each step needs an
    op name (``op``, else its class name), a group size (``group_size``, or
    ``axes`` with a layout) and the bytes one rank moves (``bytes_received`` /
    ``bytes_sent``: an int or one int per rank; the busiest rank counts). Those
    bytes are turned into the collective's buffer ``n`` with spmdsim.plan's
    conventions (Allgather (g-1)n_in, Allreduce 2(g-1)/g n, others (g-1)/g n).
    An Exchange with ``transfers`` is costed with the peers it really has.
    """
    model = DEFAULT_MODEL if model is None else model
    steps = getattr(plan, "steps", plan)
    out = []
    for index, step in enumerate(steps):
        name = _step_op(step)
        key = name.strip().lower().replace("-", "_")
        if key in _LOCAL_OPS or key.replace("_", "") in _LOCAL_OPS:
            out.append(StepPrediction(index, key, 1, 0, 0.0))
            continue
        op = normalize_op(name)
        moved = _step_bytes(step)
        g = _exchange_peers(step) + 1 if op == "alltoallv" else _step_group_size(step, plan)
        if g <= 1 or moved == 0:
            out.append(StepPrediction(index, op, g, 0, 0.0))
            continue
        n = _buffer_bytes(op, g, moved)
        out.append(StepPrediction(index, op, g, int(round(n)), model.predict(op, g, n)))
    return tuple(out)


def _step_op(step: Any) -> str:
    for attr in ("op", "kind", "collective"):
        value = getattr(step, attr, None)
        if isinstance(value, str):
            return value
    return type(step).__name__


def _step_group_size(step: Any, plan: Any) -> int:
    for attr in ("group_size", "size", "num_ranks"):
        value = getattr(step, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    axes = getattr(step, "axes", None)
    layout = getattr(step, "before", None) or getattr(step, "layout", None) \
        or getattr(plan, "layout", None)
    layout = getattr(layout, "layout", layout)  # a TensorLayout carries its Layout
    if axes is not None and layout is not None and hasattr(layout, "group_size"):
        return layout.group_size(tuple(axes))
    raise SpmdsimError(f"plan step {step!r:.80} has no group size (group_size or axes)")


def _as_max(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
        return float(max(value, default=0))
    return None


def _step_bytes(step: Any) -> float:
    """Bytes the busiest rank receives (or sends, if more) in this step."""
    found = [v for v in (_as_max(getattr(step, attr, None)) for attr in (
        "bytes_received", "bytes_sent", "bytes_per_rank", "recv_bytes", "send_bytes"))
        if v is not None]
    if not found:
        raise SpmdsimError(f"plan step {step!r:.80} has no byte count (bytes_received)")
    return max(found)


def _exchange_peers(step: Any) -> int:
    """Most distinct peers any rank talks to in an exchange (else the group size - 1)."""
    transfers = getattr(step, "transfers", None)
    if transfers:
        peers: dict[int, set] = {}
        for src, dst, *_ in transfers:
            if src != dst:
                peers.setdefault(src, set()).add(dst)
                peers.setdefault(dst, set()).add(src)
        if peers:
            return max(len(p) for p in peers.values())
    try:
        return max(1, _step_group_size(step, None) - 1)
    except SpmdsimError:
        return 1


def _buffer_bytes(op: str, g: int, moved: float) -> float:
    """Turn the bytes one rank moves into the collective buffer ``n`` of the formulas."""
    if op == "allreduce":
        return moved * g / (2 * (g - 1))
    if op == "bcast":
        return moved
    return moved * g / (g - 1)
