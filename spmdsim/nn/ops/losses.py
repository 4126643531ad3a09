"""Losses on DTensors: mean squared error and cross-entropy (Megatron's vocab-parallel form included).

Both return a replicated scalar DTensor (global shape (), ``.local`` the
value), the mean over the global batch. Each rank sums the terms of its own
rows; one Allreduce over the axes splitting the rows adds them (replicas of a
row are counted once). With the classes split (logits (B, C) with C split
over some axes: Megatron's vocab-parallel cross-entropy) each row's max is
one Allreduce with MPI.MAX over the class axes (one number per row, whatever
the number of ranks) and the sum of exponentials and the target logit are
Allreduced over them together: the logits are never gathered. Their backward
needs no communication.

Labels out of range are counted on each rank and the count rides in the final
Allreduce, so every rank raises the same error after the same collectives; so
does the count of rows that are not ignored (cross_entropy's `ignore_index`,
PyTorch's padding label), the mean's divisor. ``reduction="none"`` returns
each row's loss instead, split like the labels.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Optional

import numpy as np

from ..autograd.rules.grads import axes_of
from ...base.buffers import CAPTURE, broadcast_zero, contiguous, stacked
from ..autograd.rules.losses import record_cross_entropy, record_mse_loss
from ...base.precision import is_low, wide
from ...errors import OperatorError, ShapeError
from ...base.flops import sweep
from ...programs.infer.losses import infer_cross_entropy
from ...layouts.layout import TensorLayout
from ...base.validate import counted
from ._common import dry_zeros, make_dtensor
from ._operands import operands_mesh, require_float
from ...runtime import executor
from .norms import resolved

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)

__all__ = ["mse_loss", "cross_entropy"]


def _scalar(mesh: Any, value: Any, dtype: np.dtype) -> Any:
    """A replicated 0-d DTensor (make_dtensor: a 0-d array stays 0-d)."""
    return make_dtensor(mesh, np.asanyarray(value).astype(dtype), _scalar_layout(mesh.layout), ())


@lru_cache(maxsize=64)
def _scalar_layout(layout: Any) -> TensorLayout:
    """The 0-d layout on `layout` (made once: a loss makes one a step)."""
    return TensorLayout(layout, ())


def _row_sum(mesh: Any, values: np.ndarray, axes: tuple[str, ...], label: str) -> np.ndarray:
    """Allreduce of a small vector over `axes` (nothing when no axis splits the rows)."""
    if not axes:
        return values
    executor = _EXECUTOR or _executor()
    return executor.resolve(mesh, contiguous(values), executor.pending(mesh.layout, values.ndim, axes), label,
                            owned=True)


_EXECUTOR: Any = None  # spmdsim.runtime.executor, bound on first use (an import statement costs ~2 us a call)


def _executor() -> Any:
    global _EXECUTOR

    _EXECUTOR = executor
    return executor


def mse_loss(y: Any, target: Any) -> Any:
    """mean((y - target)^2) over every element; `target` a DTensor of y's shape and layout.

    No elements: NaN, the mean of nothing, as numpy's mean and PyTorch's mse_loss give (its gradient empty)."""
    mesh = operands_mesh("mse_loss", ("y", "target"), y, target)
    if target.global_shape != y.global_shape:  # tuples, as DTensor keeps them
        raise ShapeError(f"mse_loss: target of shape {tuple(target.global_shape)!r} does not match "
                         f"y of shape {tuple(y.global_shape)!r}")
    if y.layout.partial or target.layout.partial:
        raise OperatorError(f"mse_loss of a pending sum (y {y.layout}, target {target.layout}): "
                            "resolve it first (redistribute to a layout without partial axes)")
    if target.layout != y.layout:
        raise OperatorError(f"mse_loss: target is laid out {target.layout} but y {y.layout}; "
                            "redistribute the target to y's layout")
    require_float("mse_loss", y.local)
    n = math.prod(y.global_shape)
    diff = y.local - target.local.astype(y.dtype, copy=False)
    axes = axes_of(y.layout, y.layout.tensor_map)
    total = _row_sum(mesh, stacked([(diff * diff).sum()], y.dtype), axes, "mse_loss")
    with np.errstate(invalid="ignore"):  # no elements: 0 / 0, NaN as PyTorch's
        out = _scalar(mesh, total[0] / n, y.dtype)
    return out if y._ag is None and target._ag is None else record_mse_loss(out, y, target, diff, n)


def _check_labels(logits: Any, labels: Any) -> None:
    """Shapes, dtypes and layouts every rank shares: refused alike before any collective."""
    if logits.layout.ndim < 2:
        raise ShapeError(f"cross_entropy: logits must be (rows..., classes), got shape {tuple(logits.global_shape)!r}")
    require_float("cross_entropy", logits._local)  # (its dtype alone: the block's, captured or not)
    if labels.dtype.kind not in "iu":
        raise OperatorError(f"cross_entropy: labels must be integers (class indices), got dtype "
                            f"{labels.dtype.name!r}")
    if tuple(labels.global_shape) != tuple(logits.global_shape[:-1]):
        raise ShapeError(f"cross_entropy: labels of shape {tuple(labels.global_shape)!r} do not match "
                         f"the logits' rows: expected {tuple(logits.global_shape[:-1])!r}")
    if logits.layout.ndim > 2 and labels.layout.tensor_map != logits.layout.tensor_map[:-1]:
        raise OperatorError(f"cross_entropy: labels {labels.layout} must be split like the logits' rows "
                            f"({logits.layout}): expected map {logits.layout.tensor_map[:-1]!r}")


def _planned(logits: Any, labels: Any, resolve: bool, smooth: bool, reduction: str) -> tuple:
    """(the (rows, classes) layout the loss plans on, its plan: spmdsim.programs.infer.losses')."""
    layout = _rows(logits.layout.with_partial(()) if resolve else logits.layout)
    rows = labels.layout if labels.layout.ndim == 1 else \
        TensorLayout(labels.layout.layout, (layout.tensor_map[0],), labels.layout.partial)
    # bfloat16 logits: the statistics and loss in float32 (a dry run's: the engine's zeros, no page read)
    return layout, infer_cross_entropy(layout, rows, (math.prod(labels.global_shape), logits.global_shape[-1]),
                                       "float32" if is_low(logits._local.dtype) else logits._local.dtype.name,
                                       smooth, reduction)


def _rows(layout: TensorLayout) -> TensorLayout:
    """The 2-d (rows, classes) layout a cross-entropy plans on for logits laid out `layout` (rows..., classes):
    the rows' dims as one, split over all their axes (each rank's rows are its block's, flattened)."""
    if layout.ndim == 2:
        return layout
    return TensorLayout(layout.layout, (tuple(a for m in layout.tensor_map[:-1] for a in m), layout.tensor_map[-1]),
                        layout.partial)


def _run(mesh: Any, values: np.ndarray, steps: tuple, label: str) -> np.ndarray:
    """`values` after the program's `steps` (spmdsim.programs.infer.losses: none, or one Allreduce)."""
    if not steps:
        return values
    return (_EXECUTOR or _executor()).execute(mesh, contiguous(values), steps, (), label, owned=True)


def _counts(mesh: Any, summed: Any, bad: int, ignored: int, plan: Any, dtype: np.dtype) -> tuple[Any, int, int]:
    """(the rows' summed loss, out-of-range labels, ignored rows) over the row axes, in one Allreduce.

    The two counts travel as one number, bad * (batch + 1) + ignored (each at most `batch`), where the
    loss's dtype holds it exactly (`plan.packed`: float64 up to ~9e7 rows, float32 up to 4,094); else as two.
    """
    if not plan.total:
        return summed, bad, ignored
    if plan.packed:
        base = plan.shape[0] + 1
        total = _run(mesh, stacked([summed, bad * base + ignored], dtype), plan.total, "cross_entropy")
        code = int(total[1])
        return total[0], code // base, code % base
    total = _run(mesh, stacked([summed, bad, ignored], dtype), plan.total, "cross_entropy")
    return total[0], int(total[1]), int(total[2])


def _widened(mesh: Any, block: np.ndarray) -> np.ndarray:
    """`block` as float32 when it is bfloat16 (`wide`), through the engine: a dry run's large block gives
    the engine's zeros, not a float32 copy of its pages."""
    if not is_low(block.dtype):
        return block
    return mesh.engine.local(wide, broadcast_zero(block.shape, np.float32), block)


def _check_options(reduction: Any, ignore_index: Any, label_smoothing: Any) -> None:
    """`cross_entropy`'s refusals of its keyword arguments, each one clear line."""
    if reduction not in ("mean", "sum", "none"):
        raise OperatorError(f"cross_entropy: reduction {reduction!r} must be 'mean', 'sum' or 'none'")
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer))):
        raise OperatorError(f"cross_entropy: ignore_index {ignore_index!r} must be an integer or None")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float, np.integer, np.floating)) \
            or not 0 <= label_smoothing <= 1:
        raise OperatorError(f"cross_entropy: label_smoothing {label_smoothing!r} must be a number from 0 to 1")


def _shifted_exp(mesh: Any, z: np.ndarray, dry: Any, plan: Any) -> tuple:
    """(each row's shift, the shifted exponentials) of this rank's logits block `z`, counted. Megatron (classes
    split): a common shift per row, the maximum over the class axes; an uneven cut's empty block of classes
    gives the maximum's identity, -inf. A dry run's (`dry`: its zeros) rows' maximum is zeros, not read off
    its logits."""
    most = (z.max(axis=1, initial=-np.inf) if z.size == 0 else z.max(axis=1)) if dry is None \
        else np.zeros(z.shape[0], z.dtype)
    shift = _run(mesh, most, plan.shift, "cross_entropy.max")
    e = np.exp(z - shift[:, None]) if dry is None else dry
    # the rows' maximum, the shifted exponentials, their row sums: three passes over the logits
    sweep("max", (z,), (shift,))
    sweep("cross_entropy", (z, shift), (e,))
    sweep("sum", (e,), (shift,))
    return shift, e


def cross_entropy(logits: Any, labels: Any, *, ignore_index: Optional[int] = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Any:
    """-log softmax(logits)[label] per row, averaged over the global batch; vocab-parallel when classes are split.

    As PyTorch's ``F.cross_entropy``: rows whose label is `ignore_index` (-100 by default; None: none)
    count for nothing, and "mean" divides by the rows that count (NaN if none do, with a gradient of 0,
    as PyTorch's); "sum" adds them up; "none" gives each row's loss (0 where ignored) as a DTensor
    (batch,) split like the labels.
    `label_smoothing` e: each row's loss is (1 - e) times its -log p[label] plus e times the mean of
    -log p over the classes (PyTorch's), the classes' sum of logits riding in the same Allreduce.
    Its collectives are the program of spmdsim.programs.infer.losses (`infer_cross_entropy`).

    Args:
        logits: float DTensor (rows..., classes), any split of any dim; a pending sum is added up
            first (one Allreduce, as softmax does).
        labels: integer DTensor (rows...), split like the logits' rows.
    """
    mesh = operands_mesh("cross_entropy", ("logits", "labels"), logits, labels)
    _check_labels(logits, labels)
    _check_options(reduction, ignore_index, label_smoothing)
    smooth = float(label_smoothing)
    # A pending sum (a row-parallel product's output) is added up first, as softmax and layer_norm do:
    # one Allreduce over its pending axes, its gradient passed back whole. The program is inferred on
    # the layout it will have, before that Allreduce: labels laid out otherwise are refused first.
    resolve = bool(logits.layout.partial) and not labels.layout.partial
    layout, plan = _planned(logits, labels, resolve, bool(smooth), reduction)
    classes, rows_shape = logits.global_shape[-1], tuple(labels.global_shape)
    batch = math.prod(rows_shape)
    if resolve:
        logits = resolved(logits)
    z, ids = (_widened(mesh, logits._local), labels._local) if not CAPTURE.on else \
        (_widened(mesh, logits.local), labels.local)  # (a captured step reads its record's views)
    if z.ndim > 2:  # (rows..., classes): this rank's rows flattened, as the plan's layout has them
        z, ids = z.reshape(-1, z.shape[-1]), ids.reshape(-1)
    start = layout.bounds(mesh.rank, (batch, classes))[1][0]
    valid = ids != ignore_index if ignore_index is not None else np.ones(ids.shape, bool)
    bad = int(np.count_nonzero(valid & ((ids < 0) | (ids >= classes))))
    ids = np.where(valid, np.clip(ids, 0, classes - 1), 0) - start
    owned = valid & (ids >= 0) & (ids < z.shape[1])
    rows = np.arange(z.shape[0])
    # A dry run's large block: zeros for the exponentials, ones for their row sums (no log of 0).
    dry = dry_zeros(mesh, z.shape, z.dtype, np.exp, z)
    shift, e = _shifted_exp(mesh, z, dry, plan)
    # An uneven cut may leave a rank no classes: then it owns no label. A dry run's large logits are zeros:
    # so is each row's pick (read off them, one page fault a row).
    picked = z[rows, np.where(owned, ids, 0)] if z.shape[1] and dry is None else np.zeros(z.shape[0], z.dtype)
    target = np.where(owned, picked - shift, 0.0)
    parts = [_SUM(e, axis=1) if dry is None else np.ones(z.shape[0], z.dtype), target] + \
        ([_SUM(z, axis=1)] if smooth else [])
    sums = _run(mesh, np.stack(parts), plan.sums, "cross_entropy.sum")
    nll = np.log(sums[0]) - sums[1]  # -log p[label]: log of the shifted exponentials' sum - (z[label] - shift)
    if smooth:  # mean over the classes of -log p = shift + log(sum) - mean of the logits
        nll = (1 - smooth) * nll + smooth * (shift + np.log(sums[0]) - sums[2] / classes)
    terms = np.where(valid, nll, 0.0)
    ignored = int(ids.size - np.count_nonzero(valid))
    summed, bad, ignored = _counts(mesh, _SUM(terms, axis=None), bad, ignored, plan, z.dtype)
    if bad:
        raise OperatorError(f"cross_entropy: {counted(bad, 'label')} outside [0, {classes}): "
                            "labels are class indices, from 0 to the number of classes - 1"
                            + (f", or ignore_index {ignore_index}" if ignore_index is not None else ""))
    divisor = float(batch - ignored) if reduction == "mean" else 1.0
    if reduction == "none":
        out = make_dtensor(mesh, terms.astype(z.dtype, copy=False).reshape(labels.local.shape), labels.layout,
                           rows_shape)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):  # every row ignored: 0 / 0, NaN as PyTorch
            out = _scalar(mesh, summed / np.asarray(divisor, z.dtype), z.dtype)
    if logits._ag is None:
        return out
    return record_cross_entropy(out, logits, labels, e=e, sum_exp=sums[0], rows=rows, ids=ids, owned=owned,
                                valid=valid, smooth=smooth, classes=classes, reduction=reduction, divisor=divisor)
