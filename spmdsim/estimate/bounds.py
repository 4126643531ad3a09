"""Lower bounds of a configuration's priced step time and memory from one layer's dry cells (docs/estimate.md).

The search (spmdsim.estimate.search) prices a configuration by the dry run of its whole training step. A
transformer layer does the same work wherever it sits: under every configuration with the same tensor
parallelism tp, sequence parallelism, micro-batch size b, recomputation and kept set, each of a stage's
layers runs the same operators on blocks of the same shapes for each microbatch. `LayerCell` is that
layer's share of a dry run, taken from four small dry runs of the real step (pp 1, dp 1, micro-batch b,
1 or 2 layers, 1 or 2 microbatches) by difference: what one layer adds per microbatch (its products,
element-wise kernels, tensor-parallel collectives, the bytes it keeps for backward) and what it adds once
per step (the optimizer's update of its parameters, sequence parallelism's layer-norm sums). Cells are
cached on what determines them, so configurations that differ only in pp, v, dp, microbatches or ZeRO
share them.

A stage of a configuration with pp * v chunks of `layers / (pp v)` layers holds `layers / pp` layers and
runs each for every one of its m microbatches, so its ledger holds at least those layers' rows: `step_time`
of those rows alone (with the pipeline's bubble on their compute; without the data-parallel sums, the
pipeline's messages, the embedding, the head and, under ZeRO-1, the optimizer's update) is a lower bound
of the stage's priced time, because every part of `step_time`'s total only grows as rows are added (the
overlap hides at most the communication it is given). The memory bound is the layers' model states (their
parameter elements at the precision's bytes, exact) plus the bytes one layer keeps for backward times the
layers of a chunk times the most microbatch-chunks the schedule holds at once on a stage
(spmdsim.pipeline.schedule.in_flight, the warmup its builders use).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import SpmdsimError

__all__ = ["LayerCell", "Cells"]


@dataclass(frozen=True)
class LayerCell:
    """One layer's rows in a dry run, and a pipeline's two ends'.

    layer: one layer's rows per microbatch; step: its kernels once per step (the optimizer's update of its
    parameters; empty where they are not one kernel per tensor); ends: (first stage's, last stage's) rows per
    microbatch besides its layers (the embedding; the head and loss; the stage boundary's tensor-parallel
    gather). Rows: (gemms, kernels, transfers), each a tuple of (item, count). kept: (kind, bytes) one layer
    keeps for backward in the run (float64) for one microbatch.
    """

    layer: tuple
    step: tuple
    ends: tuple
    kept: tuple


def _rows(stage: Any) -> tuple[dict, dict, dict]:
    transfers: dict = {}
    for t in stage.transfers:
        key = replace(t, count=1)
        transfers[key] = transfers.get(key, 0) + t.count
    return dict(stage.gemms), dict(stage.kernels), transfers


def _minus(a: dict, b: dict) -> dict:
    """`a` less `b`, item by item; SpmdsimError where `b` has more (the rows are not additive)."""
    out = {}
    for key in set(a) | set(b):
        n = a.get(key, 0) - b.get(key, 0)
        if n < 0:
            raise SpmdsimError(f"internal: dry cells are not additive: {key!r} less by {-n}")
        if n:
            out[key] = n
    return out


def _less(a: tuple, b: tuple) -> tuple:
    return tuple(_minus(x, y) for x, y in zip(a, b))


def _cell(cfg: Any, tp: int, sp: bool, micro: int, recompute: str, kept: str, gpus_per_node: int) -> LayerCell:
    """Four dry runs of the step on pp 2 x dp 1 x tp (1 or 2 layers a stage, 1 or 2 microbatches) and their
    differences (module docstring)."""
    from .ledger import gpt_ledger

    rows, kept_by = {}, {}
    for layers in (2, 4):
        for m in (1, 2):
            small = replace(cfg, layers=layers, batch=micro * m)
            stages = gpt_ledger(small, 2, 1, tp, sp=sp, microbatches=m, recompute=recompute, kept=kept,
                                gpus_per_node=gpus_per_node)
            for st in stages:
                rows[layers, m, st.stage] = _rows(st)
                kept_by[layers, m, st.stage] = dict(st.memory.kept)
    # per microbatch on each stage: a second microbatch's rows (the step's own rows cancel)
    per_mb = {(layers, s): _less(rows[layers, 2, s], rows[layers, 1, s]) for layers in (2, 4) for s in (0, 1)}
    layer = _less(per_mb[4, 1], per_mb[2, 1])
    if layer != _less(per_mb[4, 0], per_mb[2, 0]):
        raise SpmdsimError("internal: a layer's rows differ between the first and the last stage")
    ends = tuple(tuple(tuple(d.items()) for d in _less(per_mb[2, s], layer)) for s in (0, 1))
    try:  # per step: the layer's optimizer update, where it is one kernel per tensor (additive)
        step = _minus(_minus(rows[4, 1, 1][1], rows[2, 1, 1][1]), layer[1])
    except SpmdsimError:
        step = {}
    one = _minus(kept_by[4, 1, 0], kept_by[2, 1, 0])
    return LayerCell(tuple(tuple(d.items()) for d in layer), tuple(step.items()), ends, tuple(one.items()))


class Cells:
    """The layer cells of one model, made on first use and kept (keyed on tp, sp, micro-batch, recompute).

    `dry_runs`: the small dry runs made so far (four a cell).
    """

    def __init__(self, cfg: Any, kept: str, gpus_per_node: int) -> None:
        self.cfg, self.kept, self.gpus_per_node = cfg, kept, gpus_per_node
        self.cells: dict = {}
        self.dry_runs = 0

    def cell(self, tp: int, sp: bool, micro: int, recompute: str) -> LayerCell:
        key = (tp, sp, micro, recompute)
        if key not in self.cells:
            self.dry_runs += 4
            self.cells[key] = _cell(self.cfg, tp, sp, micro, recompute, self.kept, self.gpus_per_node)
        return self.cells[key]

    def time_bound(self, c: Any, machine: Any, precision: str, sums: float = 0.0) -> float:
        """Seconds below the priced step time of configuration `c` (module docstring): the larger of its
        first and last stage's layers and end, each priced by `step_time` as the ledger's rows are; with
        `sums`, seconds the gradient sums take at least (spmdsim.estimate.search.comm_bounds), what of them
        exceeds those rows' products and element-wise kernels (the most the backward can hide them under)."""
        from .ledger import gemms_at, kernel_bytes, transfers_at
        from .steptime import Pipeline, step_time

        cell = self.cell(c.tp, c.sp, self.cfg.batch // (c.dp * c.microbatches), c.recompute)
        m, layers = c.microbatches, self.cfg.layers // c.pp
        step = [(k, n) for k, n in cell.step if not (c.zero and k.phase == "optimizer")]
        pipeline = Pipeline(c.pp, m, c.virtual, c.schedule) if c.pp > 1 else None
        best = 0.0
        for end in (cell.ends if c.pp > 1 else (((), (), ()),)):
            parts = [_times(rows, times) for rows, times in ((cell.layer, m * layers), (end, m))]
            gemms = parts[0][0] + parts[1][0]
            kernels = parts[0][1] + parts[1][1] + _times(((), step, ()), layers)[1]
            transfers = [replace(t, count=n) for t, n in parts[0][2] + parts[1][2] if t.phase == "layers"]
            st = step_time(machine, gemms_at(gemms, precision), transfers_at(transfers, precision),
                           pipeline=pipeline, traffic=kernel_bytes(kernels, precision))
            best = max(best, st.total_s + max(0.0, sums - (st.compute_s + st.memory_s)))
        return best

    def kept_bound(self, c: Any, precision: str) -> int:
        """Bytes below what the busiest stage of `c` keeps for backward at its peak (module docstring): one
        layer's, times the layers of a chunk and the microbatch-chunks the schedule holds at once."""
        from ..gpt.memory import MASKS
        from ..pipeline.schedule import in_flight
        from .ledger import PRECISIONS, _RUN

        cell = self.cell(c.tp, c.sp, self.cfg.batch // (c.dp * c.microbatches), c.recompute)
        w = PRECISIONS[precision]
        per_layer = sum(n if kind.endswith(MASKS) else n // _RUN * w.activations for kind, n in cell.kept)
        held = in_flight(c.schedule, c.pp, c.microbatches, c.virtual)
        return per_layer * (self.cfg.layers // (c.pp * c.virtual)) * held


def _times(rows: tuple, times: int) -> tuple:
    return tuple([(item, n * times) for item, n in part] for part in rows)
