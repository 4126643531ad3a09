"""Cross-entropy's sharding rule (pure): where its labels must be, and the Allreduces of its program.

Logits (rows, classes), either dim split any way; labels (rows,), split like
the logits' rows; neither a pending sum. Each rank works on its own block of
logits and no logit ever moves (Megatron's vocab-parallel cross-entropy when
the classes are split). The program, in order:

- Allreduce(MAX) over class axes: each of its rows' largest logit (one number per row): the common shift
- Allreduce over class axes: per row the sum of the shifted exponentials and the label's shifted logit (two numbers; a
  third, the row's sum of logits, with label smoothing)
- Allreduce over row axes: its rows' summed loss and the labels' counts (out of range, ignored): two numbers when both
  counts fit one, ``bad * (rows + 1) + ignored``, exactly in the logits' dtype (float64 up to ~9e7 rows, float32 up to
  4,094), else three

Classes whole: no first two steps; rows whole: no third. `ops.cross_entropy`
runs these steps; the strategy search prices them (`spmdsim.tools.autoshard.rules`).
Never imports mpi4py.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ...errors import OperatorError, ShapeError
from ...layouts.layout import TensorLayout
from ..plan.steps import Allreduce, Step

__all__ = ["CrossEntropyPlan", "infer_cross_entropy", "counts_packed"]


def counts_packed(rows: int, dtype: str) -> bool:
    """Whether the two label counts (each at most `rows`) travel as one number of `dtype`:
    ``bad * (rows + 1) + ignored`` is exact there (below 2 ** (mantissa bits + 1))."""
    base = rows + 1
    return base * base <= 2 ** (np.finfo(np.dtype(dtype)).nmant + 1)


@dataclass(frozen=True)
class CrossEntropyPlan:
    """Where the labels go, the loss's layout, and the three parts of the program (each () or one Allreduce)."""

    logits: TensorLayout
    labels: TensorLayout  # split like the logits' rows
    out: TensorLayout  # the loss: 0-d, replicated ("mean", "sum"); reduction "none": the labels' layout
    shape: tuple[int, int]
    row_axes: tuple[str, ...]  # the axes (of size above one) splitting the rows
    class_axes: tuple[str, ...]  # and the classes
    parts: int  # numbers per row summed over the class axes: 2, or 3 with label smoothing
    words: int  # numbers summed over the row axes: 2 when the counts are packed into one, else 3
    shift: tuple[Step, ...]  # Allreduce(MAX) of each row's largest logit over the class axes
    sums: tuple[Step, ...]  # Allreduce of (parts, rows) over the class axes
    total: tuple[Step, ...]  # Allreduce of (words,) over the row axes

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.shift + self.sums + self.total

    @property
    def packed(self) -> bool:
        """The label counts travel as one number."""
        return self.words == 2

    @property
    def program(self) -> tuple[tuple[Step, tuple[int, ...]], ...]:
        """Each step with the global shape of the tensor it acts on: (rows,), (parts, rows), (words,)."""
        rows = self.shape[0]
        return (tuple((s, (rows,)) for s in self.shift) + tuple((s, (self.parts, rows)) for s in self.sums)
                + tuple((s, (self.words,)) for s in self.total))

    def why(self) -> str:
        parts = []
        if self.class_axes:
            parts.append(f"classes split over {self.class_axes!r}: Allreduce(MAX) of one number per row, then "
                         f"Allreduce of {self.parts} per row; the logits never move")
        if self.row_axes:
            parts.append(f"rows split over {self.row_axes!r}: one Allreduce of {self.words} numbers")
        return "cross_entropy: " + ("; ".join(parts) if parts else "every rank holds every logit: no communication")


def _axes(layout: TensorLayout, entry: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for a in entry if layout.layout.axis_size(a) > 1)


@lru_cache(maxsize=256)
def infer_cross_entropy(logits: TensorLayout, labels: TensorLayout, shape: tuple[int, int], dtype: str,
                        smoothing: bool = False, reduction: str = "mean") -> CrossEntropyPlan:
    """The program of cross_entropy(logits, labels) on these layouts; `shape` the logits' (rows, classes),
    `dtype` theirs; `smoothing`: label smoothing (its row sums of logits ride along); `reduction` "none":
    the loss per row, laid out as the labels (else a 0-d loss on every rank)."""
    if logits.ndim != 2 or len(shape) != 2:
        raise ShapeError(f"cross_entropy: logits must be 2-d (rows, classes), got layout {logits} and shape "
                         f"{tuple(shape)!r}")
    shape = logits.check_shape(shape)
    if logits.partial or labels.partial:
        raise OperatorError(f"cross_entropy of a pending sum (logits {logits}): resolve it first")
    if labels.layout != logits.layout or labels.tensor_map != logits.tensor_map[:1]:
        raise OperatorError(f"cross_entropy: labels {labels} must be split like the logits' "
                            f"batch dim ({logits}): expected map {logits.tensor_map[:1]!r}")
    mesh = logits.layout
    row_axes, class_axes = _axes(logits, logits.tensor_map[0]), _axes(logits, logits.tensor_map[1])
    parts = 3 if smoothing else 2
    words = 2 if counts_packed(shape[0], dtype) else 3
    shift = sums = total = ()
    if class_axes:
        rows = TensorLayout(mesh, logits.tensor_map[:1], class_axes)
        per_row = TensorLayout(mesh, ((),) + logits.tensor_map[:1], class_axes)
        shift = (Allreduce(rows, rows.with_partial(()), class_axes, reduction="max"),)
        sums = (Allreduce(per_row, per_row.with_partial(()), class_axes),)
    if row_axes:
        summed = TensorLayout(mesh, ((),), row_axes)
        total = (Allreduce(summed, summed.with_partial(()), row_axes),)
    out = labels if reduction == "none" else TensorLayout(mesh, ())
    return CrossEntropyPlan(logits, labels, out, shape, row_axes, class_axes, parts, words, shift, sums, total)
