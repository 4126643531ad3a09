"""Fitting: a `CostModel` from timed calls (log-ratio least squares, with overrides).

Pure (numpy only; never imports mpi4py). `CostModel.fit` is the public entry point;
it keeps a per-collective or per-group-size override only where that fits better and has a bandwidth term
(`_priced_by_size`).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterable, Sequence, TypeVar

import numpy as np

from ...errors import SpmdsimError
from .terms import ALGORITHMS, OPS, Measurement, OpParams, call_terms

#: The model class `CostModel.fit` passes in (spmdsim.programs.cost.model, which calls this module).
_Model = TypeVar("_Model")

__all__ = ["fit_model"]


def fit_model(cls: type[_Model], measurements: Iterable[Measurement | Sequence[Any]], *,
              algorithm: str | None = None, per_op: bool = True, per_group: bool = True,
              source: str = "fit") -> _Model:
    """`CostModel.fit` (see there): the best of the ring and tree fits, with overrides."""
    data = tuple(m if isinstance(m, Measurement) else Measurement(*m) for m in measurements)
    if len(data) < 2:
        raise SpmdsimError(f"fit needs at least 2 measurements, got {len(data)}")
    choices = ALGORITHMS if algorithm is None else (algorithm,)
    best: tuple[tuple[bool, float], _Model] | None = None
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
                # One collective's beta and gamma terms are proportional (terms.call_terms): its own points
                # cannot split them, and a split left to the fit's start gave beta 0 at random. Beta carries both.
                own = OpParams(op, *_log_fit(mine, algo, use_gamma=False))
                if _priced_by_size(own) and cls(0.0, 0.0, 0.0, algo, (own,)).log_error(mine) < shared.log_error(mine):
                    overrides.append(own)
        model = replace(shared, per_op=tuple(overrides))
        if per_group:
            model = _fit_groups(model, data, algo)
        # A shared fit with no bandwidth term (tree's beta 0, its gamma taking the reducing collectives' growth
        # and the overrides the others') prices every message but the overridden ones as free of bandwidth, and
        # calibrate can neither save it nor make a machine file of it: the other algorithm's wins, if it has one.
        err = (shared.beta_s_per_byte <= 0, model.log_error(data))
        if best is None or err < best[0]:
            best = (err, model)
    assert best is not None  # choices is never empty
    return best[1]


def _fit_groups(model: _Model, data: Sequence[Measurement], algorithm: str) -> _Model:
    """Add an (alpha, beta) override per (collective, group size) where it fits better."""
    overrides = list(model.per_op)
    for op in OPS:
        for g in sorted({m.group_size for m in data if m.op == op and m.group_size > 1}):
            mine = [m for m in data if m.op == op and m.group_size == g]
            if len({m.bytes_per_rank for m in mine}) < 2:
                continue
            own = OpParams(op, *_log_fit(mine, algorithm, use_gamma=False), group_size=g)
            alone = type(model)(0.0, 0.0, 0.0, algorithm, (own,))
            if _priced_by_size(own) and alone.log_error(mine) < model.log_error(mine):
                overrides.append(own)
    return replace(model, per_op=tuple(overrides))


def _priced_by_size(own: OpParams) -> bool:
    """Whether an override's cost grows with the bytes (beta > 0). One whose times do not grow with the size (a
    collective's few points on a busy, oversubscribed machine: `mpiexec -n 4 spmdsim calibrate` on 2 cores, one run
    in three) fits best with beta 0, which prices any message, however large, as free of bandwidth, and would
    make calibrate refuse to save the whole fit. Such a collective is left to the shared fit, which has a
    bandwidth term."""
    return own.beta_s_per_byte > 0


def _rows(data: Sequence[Measurement], algorithm: str, use_gamma: bool) -> np.ndarray:
    rows = np.array([call_terms(m.op, algorithm, m.group_size, m.bytes_per_rank) for m in data])
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
