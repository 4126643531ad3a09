"""Lower bounds of a configuration's priced step time and memory from one layer's dry cells (docs/howto/estimate.md).

The search (spmdsim.tools.estimate.search) prices a configuration by the dry run of its whole training step. A
transformer layer does the same work wherever it sits: under every configuration with the same tensor
parallelism tp, sequence parallelism, micro-batch size b, recomputation, kept set, context parallelism cp
and its method, and (with MoE layers) expert parallelism ep and the experts' own tp (attention's, or folded into
their ep: spmdsim.models.moe.fold), each layer of a kind ("dense"; "moe", an MoE layer's block) runs the same operators
on blocks of the same shapes for each microbatch. `LayerCell` is each kind's share of a dry run, taken from
small dry runs of the real step (pp 2, dp 1, ep, micro-batch b, 1 or 2 microbatches; 2 and 4 layers, or
with an MoE layer every M-th block 2M - 2, 2M and 2M + 2, each size's first stage holding one layer more
than the size before) by difference: what one layer of the kind adds per microbatch (its products,
element-wise kernels, tensor-parallel collectives and the experts' exchanges, the bytes it keeps for
backward) and what it adds once per step (the optimizer's update of its parameters), and each end (the
first stage's embedding, the last stage's head and loss). Every stage of every run is checked to be its end
and its layers, item by item; what a stage does once for all its MoE layers (their router losses summed and
scaled: a scalar's kernels) is left out. Cells are cached on what determines them, so configurations that
differ only in pp, v, dp, microbatches or ZeRO share them.

Chunk k of a configuration's pp * v chunks lives on stage k mod pp (its layers balanced, or as the
configuration's split cuts them), so each stage's layers of each kind are counted exactly, and its ledger holds at least
their rows for each of its m microbatches: `step_time` of those rows alone (with the pipeline's bubble on their compute;
the first and the last stage with their ends; with context parallelism's attention traffic over cp, the ring's hidden
under the products as the priced step hides it; without the data-parallel sums, the pipeline's messages, ZeRO-3's
gathers and, under ZeRO, the optimizer's update) is
a lower bound of the stage's priced time, because every part of `step_time`'s total only grows as rows are
added (the overlap hides at most the communication it is given). With ep > 1 a cell keeps, of the transfers
over a group of ep ranks, the experts' exchanges alone: the sums over the batch's axes (the routers'
load-balancing counts, the loss's mean) run over ep in the cell and over dp x ep in a configuration, whose
price a link model need not order by group size (folded, the same of ep x tp: the routers' sums run over it). The memory
bound is, at its largest over the stages, a stage's layers' model states (their parameter elements at the precision's
bytes) plus the bytes its smallest chunk keeps for backward times the most microbatch-chunks the schedule holds on that
stage at once (spmdsim.programs.pipeline.schedule.in_flight_by_stage): a bound of the stage's memory line, so of its
peak too, which adds to it the largest kernel's transient blocks and the gradients the step holds beyond the memory
line's (spmdsim.tools.estimate.ledger.backward_gradients: ZeRO-2's beyond the slices).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any

from ...errors import SpmdsimError
from ...models.gpt.layouts import folded_by
from ...models.gpt.params import is_expert, param_specs
from ...models.gpt.stages import chunk_parts
from ...nn.ops.fp8_linear import WEIGHT_COPIES
from ...programs.pipeline.schedule import in_flight_by_stage
from .closed_forms import model_states
from .configs import model_of
from .held import own_width
from .ledger import _RUN, PRECISIONS, dry_key, gemms_at, gpt_ledger, kernel_bytes, transfers_at
from .steptime import Pipeline, step_time

__all__ = ["LayerCell", "Cells"]


@dataclass(frozen=True)
class LayerCell:
    """One layer's rows in a dry run, per kind of layer, and a pipeline's two ends'.

    layers: (kind, rows) per kind of layer the model has ("dense", "moe": an MoE layer's block), one such
    layer's rows per microbatch; step: (kind, its kernels once per step: the optimizer's update of its
    parameters; empty where they are not one kernel per tensor); ends: (first stage's, last stage's) rows per
    microbatch besides its layers (the embedding; the head and loss; the stage boundary's tensor-parallel
    gather); an end's item may be below zero where a layer adds what a stage without it lacks (the MoE
    layers' router losses: a stage of k adds k - 1), `_total` adds them to the layers'. Rows: (gemms,
    kernels, transfers), each a tuple of (item, count). kept: (kind, its (kind of bytes, bytes) kept for
    backward in the run (float64) for one microbatch).
    """

    layers: tuple
    step: tuple
    ends: tuple
    kept: tuple

    def of(self, kind: str) -> tuple:
        return dict(self.layers)[kind]


def _rows(stage: Any) -> tuple[dict, dict, dict]:
    transfers: dict = {}
    for t in stage.transfers:
        key = replace(t, count=1)
        transfers[key] = transfers.get(key, 0) + t.count
    return dict(stage.gemms), dict(stage.kernels), transfers


def _minus(a: dict, b: dict) -> dict:
    """`a` less `b`, item by item (`_signed`); SpmdsimError where `b` has more (the rows are not additive)."""
    out = _signed(a, b)
    for key, n in out.items():
        if n < 0:
            raise SpmdsimError(f"internal: dry cells are not additive: {key!r} less by {-n}")
    return out


def _less(a: tuple, b: tuple) -> tuple:
    return tuple(_minus(x, y) for x, y in zip(a, b))


def _exchange(t: Any, groups: tuple) -> bool:
    """Whether a cell keeps transfer `t` of a run with dp 1 whose batch's axes make `groups` (ep; folded, ep and
    ep x tp): not over one of them unless it is the experts' exchange (over the experts' ep in any
    configuration); what runs over the batch's axes (the routers' load-balancing sums, the loss's mean) is over
    those groups here and over dp times them in a configuration, whose price a link model need not order by
    group size."""
    return t.group not in groups or t.kind in ("alltoall", "alltoallv")


def layer_kind(cfg: Any, layer: int) -> str:
    """"moe" where block `layer` of `cfg` is an MoE layer, else "dense"."""
    return "moe" if cfg.is_moe(layer) else "dense"


def layer_kinds(cfg: Any, first: int, stop: int) -> dict:
    """{kind of layer: how many} of `cfg`'s layers first .. stop - 1 (`layer_kind`)."""
    out: dict = {}
    for i in range(first, stop):
        kind = layer_kind(cfg, i)
        out[kind] = out.get(kind, 0) + 1
    return out


def kind_elements(cfg: Any, tp: int, ep: int) -> dict:
    """{kind of layer: parameter elements a rank holds of one such layer} (`_kind_elements`)."""
    return dict(_kind_elements(cfg, tp, ep))


@functools.lru_cache(maxsize=256)
def _kind_elements(cfg: Any, tp: int, ep: int) -> tuple:
    """(kind of layer, parameter elements a rank holds of one such layer) pairs: its tensors over tp, an MoE
    layer's experts over ep x tp (the first layer of each kind's; every layer of a kind has the same tensors)."""
    first: dict = {}
    for i in range(cfg.layers):
        first.setdefault(layer_kind(cfg, i), i)
    kind_of = {f"h{i}": kind for kind, i in first.items()}
    out = dict.fromkeys(first, 0)
    for s in param_specs(cfg):
        kind = kind_of.get(s.name.split(".", 1)[0])
        if kind is not None:
            out[kind] += math.prod(s.shape) // (tp * (ep if is_expert(s.name) else 1))
    return tuple(out.items())


def _signed(a: dict, b: dict) -> dict:
    """`a` less `b`, item by item, an item below zero kept; in `a`'s order, then `b`'s other items' (not a set's,
    whose order follows the hash seed: the sums of these items would differ in their last digits run to run)."""
    return {key: n for key in (*a, *(k for k in b if k not in a)) if (n := a.get(key, 0) - b.get(key, 0))}


def _cell(cfg: Any, tp: int, sp: bool, micro: int, recompute: str, kept: str, gpus_per_node: int,
          ep: int = 1, context: tuple = (1, "ring"), etp: int = 0, fp8: bool = False) -> LayerCell:
    """Small dry runs of the step on pp 2 x dp 1 x ep x tp (two or three sizes of model, 1 or 2 microbatches of
    `micro` sequences a rank) and the rows of each kind of layer and of the ends they solve for (module
    docstring); every run's stages checked to be their ends plus their layers. `context`: (cp, its method),
    each run's sequence split over cp as the configuration's; `etp`: the experts' (below tp: folded, `model_of`);
    `fp8`: the linear layers' products in FP8, as the priced step's (a weight's e4m3 cast, once a step, among the
    step's kernels)."""
    cfg = model_of(cfg, etp)
    by = folded_by(cfg, tp)  # folded: the tp ranks in the experts' ep
    sizes = _sizes(cfg)
    rows, kept_by, kinds = {}, {}, {}
    for layers, m, args, keywords in _cell_runs(cfg, tp, sp, micro, recompute, kept, ep, context, fp8):
        for st in gpt_ledger(*args, gpus_per_node=gpus_per_node, **keywords):  # the dense batch split over dp x ep
            rows[layers, m, st.stage] = _rows(st)
            kept_by[layers, m, st.stage] = dict(st.memory.kept)
    for layers in sizes:
        for stage in (0, 1):
            kinds[layers, stage] = layer_kinds(replace(cfg, layers=layers), stage * layers // 2,
                                               (stage + 1) * layers // 2)
    # per microbatch on each stage: a second microbatch's rows (the step's own rows cancel)
    per_mb = {(layers, s): _less(rows[layers, 2, s], rows[layers, 1, s]) for layers in sizes for s in (0, 1)}
    # the first stage of each size holds one layer more than the size before: a dense layer's, an MoE layer's
    added = [(a, b, next((k for k, n in kinds[b, 0].items() if n > kinds[a, 0].get(k, 0)), "?"))
             for a, b in zip(sizes, sizes[1:])]
    one: dict = {}  # kind -> (its rows per microbatch, its kernels once a step, its kept bytes)
    for a, b, kind in added:
        if kinds[b, 0].get(kind, 0) - kinds[a, 0].get(kind, 0) != 1 or sum(kinds[b, 0].values()) - \
                sum(kinds[a, 0].values()) != 1:
            raise SpmdsimError(f"internal: no one {kind} layer between stage 0 of {a} and {b} layers")
        per = tuple(_signed(x, y) for x, y in zip(per_mb[b, 0], per_mb[a, 0]))
        try:  # per step: the layer's optimizer update, where it is one kernel per tensor (additive)
            step = _minus(_minus(rows[b, 1, 0][1], rows[a, 1, 0][1]), per[1])
        except SpmdsimError:
            step = {}
        one[kind] = (per, step, _minus(kept_by[b, 1, 0], kept_by[a, 1, 0]))

    def layers_of(layers: int, stage: int) -> tuple:
        return tuple({key: sum(n * one[k][0][i].get(key, 0) for k, n in kinds[layers, stage].items())
                      for k in kinds[layers, stage] for key in one[k][0][i]} for i in range(3))

    ends = tuple(tuple(_signed(x, y) for x, y in zip(per_mb[sizes[0], s], layers_of(sizes[0], s))) for s in (0, 1))
    # Every stage of every run is its end and its layers, item by item, but for what a stage does once for all
    # its MoE layers (their router losses summed and scaled: a scalar's kernels); such items are left out of
    # the cell (a bound without them is still below the stage's rows).
    odd: tuple = (set(), set(), set())
    for layers in sizes:
        for s in (0, 1):
            found = tuple(_signed(x, y) for x, y in zip(layers_of(layers, s), (_signed({}, e) for e in ends[s])))
            for into, x, y in zip(odd, per_mb[layers, s], found):
                into.update(_signed(x, y))
    if any(odd):
        one = {k: (tuple({t: n for t, n in d.items() if t not in bad} for d, bad in zip(per, odd)), step, held)
               for k, (per, step, held) in one.items()}
        ends = tuple(tuple({t: n for t, n in d.items() if t not in bad} for d, bad in zip(end, odd)) for end in ends)
    # the batch's axes but dp (folded: and tp's part in the experts' ep)
    groups = tuple(g for g in (ep, ep * by if by > 1 else 1) if g > 1)
    if groups:  # the experts' exchanges kept, the batch's sums left out (module docstring)
        one = {k: ((per[0], per[1], {t: n for t, n in per[2].items() if _exchange(t, groups)}), step, held)
               for k, (per, step, held) in one.items()}
        ends = tuple(end[:2] + ({t: n for t, n in end[2].items() if _exchange(t, groups)},) for end in ends)

    def items(d: dict) -> tuple:
        return tuple(d.items())

    return LayerCell(tuple((k, tuple(map(items, per))) for k, (per, _, _) in one.items()),
                     tuple((k, items(step)) for k, (_, step, _) in one.items()),
                     tuple(tuple(map(items, end)) for end in ends),
                     tuple((k, items(held)) for k, (_, _, held) in one.items()))


def _sizes(cfg: Any) -> tuple:
    """The layers of a cell's small models: 2 and 4, or around the MoE layers' period where dense layers sit
    between them (three sizes)."""
    every = cfg.moe.every if cfg.moe is not None else 1
    return (2 * every - 2, 2 * every, 2 * every + 2) if every > 1 else (2, 4)


def _cell_runs(cfg: Any, tp: int, sp: bool, micro: int, recompute: str, kept: str, ep: int, context: tuple,
               fp8: bool = False) -> list:
    """(layers, microbatches, gpt_ledger's arguments, its keywords but the node size) of each small dry run of a
    cell of `cfg` (its experts at their etp already: `model_of`): pp 2 x dp 1 x ep x tp, 1 or 2 microbatches of
    `micro` sequences a rank."""
    cp, method = context
    return [(layers, m, (replace(replace(cfg, layers=layers), batch=micro * m * ep), 2, 1, tp),
             dict(sp=sp, microbatches=m, recompute=recompute, kept=kept, ep=ep, cp=cp, cp_method=method,
                  **({"fp8": True} if fp8 else {})))
            for layers in _sizes(cfg) for m in (1, 2)]


class Cells:
    """The layer cells of one model, made on first use and kept (keyed on tp, sp, a rank's micro-batch,
    recompute, ep, cp with its method, and the experts' etp).

    `dry_runs`: the small dry runs made so far (`runs_a_cell` a cell).
    """

    def __init__(self, cfg: Any, kept: str, gpus_per_node: int, fp8: bool = False) -> None:
        self.cfg, self.kept, self.gpus_per_node, self.fp8 = cfg, kept, gpus_per_node, fp8
        self.cells: dict = {}
        self._stages: dict = {}  # (pp, v) -> `stages`
        self.dry_runs = 0

    @property
    def runs_a_cell(self) -> int:
        """Small dry runs a cell makes: four, six with dense and MoE layers (three sizes of model)."""
        return 6 if self.cfg.moe is not None and self.cfg.moe.every > 1 else 4

    def cell(self, tp: int, sp: bool, micro: int, recompute: str, ep: int = 1,
             context: tuple = (1, "ring"), etp: int = 0) -> LayerCell:
        key = (tp, sp, micro, recompute, ep, context, etp)
        if key not in self.cells:
            self.dry_runs += self.runs_a_cell
            self.cells[key] = _cell(self.cfg, tp, sp, micro, recompute, self.kept, self.gpus_per_node, ep, context,
                                    etp, self.fp8)
        return self.cells[key]

    def _of(self, c: Any) -> LayerCell:
        """The cell of configuration `c`."""
        return self.cell(*self._key(c))

    def _key(self, c: Any) -> tuple:
        """`cell`'s arguments for configuration `c` (a rank's micro-batch: the batch over dp x ep x
        microbatches), in the order of its key."""
        return (c.tp, c.sp, self.cfg.batch // (c.dp * c.ep * c.microbatches), c.recompute, c.ep, (c.cp, c.cp_method),
                getattr(c, "etp", 0))

    def dry_keys(self, c: Any) -> list:
        """The dry runs (spmdsim.tools.estimate.ledger.dry_key) that the cell of configuration `c` is made from, or
        none once it is made: what a look-ahead can run before the search asks for it (spmdsim.tools.estimate.ahead)."""
        key = self._key(c)
        if key in self.cells:
            return []
        tp, sp, micro, recompute, ep, context, etp = key
        return [dry_key(*args, **keywords) for _, _, args, keywords in
                _cell_runs(model_of(self.cfg, etp), tp, sp, micro, recompute, self.kept, ep, context, self.fp8)]

    def stages(self, c: Any) -> list:
        """Per stage of `c`, per chunk it holds (chunk k on stage k % pp), {kind of layer: how many}: its chunks
        balanced, or as `c.split` cuts them (layers per chunk, where a configuration has one)."""
        split = getattr(c, "split", None)
        key = (c.pp, c.virtual, split)
        if key not in self._stages:
            out: list = [[] for _ in range(c.pp)]
            for k, part in enumerate(chunk_parts(self.cfg, c.pp * c.virtual, split)):
                out[k % c.pp].append(layer_kinds(self.cfg, part.first, part.stop))
            self._stages[key] = out
        return self._stages[key]

    def time_bound(self, c: Any, machine: Any, precision: str, sums: float = 0.0, gathers: float = 0.0) -> float:
        """Seconds below the priced step time of configuration `c` (module docstring): the largest of its
        stages' layers (and the first and the last stage's ends), each priced by `step_time` as the ledger's
        rows are; with `sums`, seconds the gradient sums take at least
        (spmdsim.tools.estimate.closed_forms.comm_bounds),
        what of them exceeds those rows' products and element-wise kernels (the most the backward can hide
        them under); with `gathers`, seconds ZeRO-3's gathers take at least (comm_bounds'), which the priced
        step leaves unhidden (no prefetch)."""
        cell = self._of(c)
        m = c.microbatches
        ring = ("context",) if c.cp > 1 and c.cp_method == "ring" else ()  # as the priced step hides them
        steps = {k: tuple((x, n) for x, n in step if not (c.zero and x.phase == "optimizer"))
                 for k, step in cell.step}
        pipeline = Pipeline(c.pp, m, c.virtual, c.schedule) if c.pp > 1 else None
        best = 0.0
        priced: set = set()  # stages alike (their layers' kinds in order, which ends they hold) price alike
        for stage, chunks in enumerate(self.stages(c)):
            counts: dict = {}
            for chunk in chunks:
                for k, n in chunk.items():
                    counts[k] = counts.get(k, 0) + n
            ends = tuple(at == stage for at in (0, c.pp - 1)) if c.pp > 1 else ()  # pp 1: its one stage's left out
            alike = (tuple(counts.items()), ends)
            if alike in priced:
                continue
            priced.add(alike)
            parts = [(cell.of(k), m * n) for k, n in counts.items()] + \
                [(((), steps[k], ()), n) for k, n in counts.items()]
            parts += [(end, m) for end, held in zip(cell.ends, ends) if held]  # a pipeline's ends
            gemms, kernels, transfers = _total(tuple(parts))
            transfers = [replace(t, count=n) for t, n in transfers if _kept_transfer(t)]
            st = step_time(machine, gemms_at(gemms, precision), transfers_at(transfers, precision),
                           pipeline=pipeline, traffic=kernel_bytes(kernels, precision), overlap=ring)
            best = max(best, st.total_s + gathers + max(0.0, sums - (st.compute_s + st.memory_s)))
        return best

    def memory_bound(self, c: Any, precision: str) -> int:
        """Bytes below the priced peak memory of `c` (the largest stage's; module docstring): the most, over its
        stages, of a stage's layers' model states (spmdsim.tools.estimate.closed_forms.model_states of the elements its
        layers hold) and its least chunk's kept bytes times the most microbatch-chunks the schedule holds on
        that stage at once (spmdsim.programs.pipeline.schedule.in_flight_by_stage); an FP8 step's weight copies, held
        once a step, are left out (`WEIGHT_COPIES`: counting them per microbatch would overshoot)."""
        w = PRECISIONS[precision]
        kept = {k: sum(n if own_width(what) else n // _RUN * w.activations for what, n in rows
                       if what != WEIGHT_COPIES) for k, rows in self._of(c).kept}
        elements = kind_elements(self.cfg, c.tp, c.ep)
        held = in_flight_by_stage(c.schedule, c.pp, c.microbatches, c.virtual)
        best = 0
        for stage, chunks in enumerate(self.stages(c)):
            states = model_states(c, precision, sum(n * elements[k] for chunk in chunks for k, n in chunk.items()))
            least = min(sum(n * kept[k] for k, n in chunk.items()) for chunk in chunks)
            best = max(best, states + held[stage] * least)
        return best


def _kept_transfer(t: Any) -> bool:
    """Whether the time bound keeps a cell's transfer `t`: the layers' collectives, and context parallelism's
    attention traffic over cp (the ring's messages, the gathers, the all-to-alls: over cp in a cell and in a
    configuration alike; not the loss's mean, over cp in a cell and over dp x cp in a configuration)."""
    return t.phase == "layers" or t.phase == "context" and t.kind != "allreduce"


def _total(parts: tuple) -> tuple:
    """(gemms, kernels, transfers), each a list of (item, count): the rows of each (rows, times) pair of `parts`
    `times` times, summed item by item; an item that sums to zero or less left out (an end's items below
    zero: `_cell`)."""
    out: tuple = ({}, {}, {})
    for rows, times in parts:
        for into, part in zip(out, rows):
            for item, n in part:
                into[item] = into.get(item, 0) + n * times
    return tuple([(item, n) for item, n in into.items() if n > 0] for into in out)
