"""Choose a GPT's parallel configuration by predicted step time under a memory limit (docs/howto/estimate.md).

`search(cfg, devices, machine, memory_limit)` enumerates every configuration the training step runs
on `devices` ranks: tensor parallel tp (dividing the heads and the vocabulary, within a node),
pipeline stages pp and virtual stages v (pp * v dividing the layers), data parallel dp = devices /
(tp * pp) (dividing the global batch), microbatches m (a microbatch of batch / m samples divisible
by dp; m divisible by pp for the interleaved schedule), recomputation none / selective / full, ZeRO
0 / 1 / 2 (1 and 2 only with more than one rank to shard over, dp x ep x cp) / 3 (fully sharded data
parallelism: the parameters too, over dp; only with dp > 1 and no MoE layers) and sequence parallelism (with
tp > 1). A dense GPT also the context-parallel ranks cp (each sequence split over them for the whole block,
the balanced causal split: seq a multiple of 2 cp; tp x cp within a node, on its links, unless `fixed`
holds cp; dp = devices / (tp * cp * pp)), with each method of
attention over the split (ring, allgather, alltoall: the all-to-all's heads divide by tp x cp), priced
with the ring's messages hidden under its products as `spmdsim estimate` prices them. With MoE layers
(cfg.moe) also the expert-parallel ranks ep of each stage (dividing the experts; dp = devices / (tp * pp *
ep), the dense layers' batch split over dp x ep), and with tp > 1 the experts' own tp etp: attention's, or 1 or
any divisor of tp between 1 and tp, the other tp / etp of attention's ranks folded into the experts' ep
(Megatron-Core's parallel folding, spmdsim.models.moe.fold: the experts' ep is ep x tp / etp, dividing the experts;
with a capacity a microbatch the tp / etp ranks share, dropless a sequence). Each is priced by the ledger of
its own dry run (spmdsim.tools.estimate.ledger.gpt_ledger: its memory at the precision's widths, and its peak
with ZeRO-2's gradients its backward holds beyond the slices and the largest kernel's transient blocks, which the memory
limit bounds as `spmdsim estimate`'s verdict bounds it by the GPU's memory, spmdsim.tools.estimate.ledger.peak_bytes;
and its predicted step time on the machine, the slowest stage's, as `spmdsim estimate` prints them).

Lower bounds only prune, never choose (branch and bound; a bound of the memory a rank holds is one of its
peak too): closed forms first (the model states of a
rank's transformer layers, with ZeRO-1's summed gradient slice or ZeRO-2's gradient slices, over the memory limit
drops a configuration; the
program's GEMM FLOPs without recomputation, 72 B s l h^2 (1 + s / 6h) (with cp > 1 the attention core's on
the causal half alone), spread over the devices at the machine's capped peak, with the pipeline's bubble,
orders the rest), then the layer cells of spmdsim.tools.estimate.bounds (a dense and an MoE layer's rows from
four or six small dry runs, shared by every configuration with the same tp, cp and its method, sp,
micro-batch, recomputation and ep; with MoE layers only with
`moe_cells`: each stage's layers' model states and the kept bytes of the microbatch-chunks the schedule
holds on it at once over the limit drops it; `step_time` of each stage's layers and ends bounds its time).
The
candidate of least bound is bounded further or, once its bound is the cells', priced; when the least bound
reaches the best predicted time found under the limit, no configuration left can win and the search
stops. At most `max_dry_runs` configurations are priced; those left unpriced then are reported as such.
`fixed` ({Config field: value}, `parse_fixed` of `--fix tp=8 ...`) holds some degrees: only the configurations
that have them are searched.
"""
from __future__ import annotations

import heapq
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ...base.collector import fewer_collections
from ...base.sizes import UnmappableError
from ...errors import SpmdsimError
from ...programs.context import METHODS
from .bounds import Cells
from .closed_forms import bounds_and_sums, dense_layer_elements
from .configs import (RECOMPUTE, SEARCHED_METHODS, Config, configurations, fixed_configurations, model_of,
                      vocab_note)
from .ahead import LookAhead
from .held import peak_refusal
from .ledger import PRECISIONS, dry_key, gpt_ledger, least_bytes, peak_bytes, stage_memory, stage_times
from .steptime import Pipeline

__all__ = ["Candidate", "SearchResult", "price", "search", "OVER", "STATES", "KEPT", "ABOVE", "UNPRICED", "TIED",
           "overlap"]


@dataclass(frozen=True)
class Candidate:
    """A configuration, its lower bounds and, when a dry run priced it, its step time, the memory its fullest rank
    holds (`memory`: `spmdsim estimate`'s memory line) and the most any rank needs at its peak (`peak`: with
    the largest kernel's transient blocks, spmdsim.tools.estimate.ledger.peak_bytes), which the memory limit bounds.

    verdict: "chosen"; "slower" (priced, fits, slower than the chosen); "as fast (a tie)" (priced, fits, the chosen's
    time to 9 digits: `_order` put the chosen first); "over the memory limit"
    (priced: its peak over it); "model states over the limit" (pruned by the closed-form bound); "memory bound over the
    limit" (pruned: model states and the layer cells' kept bytes, or a block its dry run or its cells' could not
    map, spmdsim.base.sizes.UnmappableError, at the precision's narrowest width); "FLOP bound above the best" or "cell
    bound above the best" (pruned: that lower bound of its time is no better than the chosen's time);
    "not priced" (the dry-run cap). bound_s and bound_bytes: the tightest bounds it was given (bound_bytes: of
    its memory, and so of its peak).
    """

    config: Config
    bound_s: float
    bound_bytes: int
    step_s: Optional[float] = None
    memory: Optional[int] = None
    verdict: str = ""
    peak: Optional[int] = None


@dataclass(frozen=True)
class SearchResult:
    """What `search` found: the candidates, priced first (by time), then the others; the chosen or None;
    `folded`: whether the experts folded into ep were searched, whole and over each etp between 1 and tp (or
    `fixed` held the experts' tp either way);
    `sharded`: with MoE layers, whether ZeRO-3 was searched because no configuration of ZeRO 0 to 2 fit;
    `contexts`: whether context parallelism was searched (with MoE layers: with the layer cells, or `fixed` cp)."""

    devices: int
    machine: str
    memory_limit: int
    precision: str
    kept: str
    candidates: tuple[Candidate, ...]
    dry_runs: int
    stopped: str
    chosen: Optional[Candidate] = field(default=None)
    cell_runs: int = 0
    folded: bool = True
    sharded: bool = False
    contexts: bool = True


def price(cfg: Any, c: Config, machine: Any, precision: str, kept: str) -> tuple[float, int, int]:
    """(predicted step seconds, bytes held, peak bytes) of `c` from its dry run: the slowest stage's time, the
    largest stage's memory and the largest stage's peak (transient blocks included: what `spmdsim estimate`'s
    fit verdict compares with the GPU's memory, spmdsim.tools.estimate.ledger.peak_bytes) at `precision`, as
    `spmdsim estimate` prints them (the experts at `c`'s etp: on the mesh's ep, folded or not)."""
    args, keywords = price_run(cfg, c, kept, PRECISIONS[precision].fp8)
    stages = gpt_ledger(*args, gpus_per_node=machine.gpus_per_node, **keywords)
    pipeline = Pipeline(c.pp, c.microbatches, c.virtual, c.schedule)
    seconds = max(t.total_s for t in stage_times(stages, machine, precision, pipeline, overlap(c)))
    memories = [stage_memory(st, precision, c.zero) for st in stages]
    return seconds, max(m.memory for m in memories), peak_bytes(memories)


def price_run(cfg: Any, c: Config, kept: str, fp8: bool = False) -> tuple[tuple, dict]:
    """The arguments and keywords (but the node size) of `price`'s gpt_ledger call for configuration `c`: the dry
    run that prices it (spmdsim.tools.estimate.ahead runs it ahead); `fp8`: its linear layers' products in FP8."""
    return (model_of(cfg, c.etp), c.pp, c.dp, c.tp), dict(
        sp=c.sp, microbatches=c.microbatches, schedule=c.schedule, virtual=c.virtual, recompute=c.recompute,
        zero=c.zero, kept=kept, ep=c.ep, split=c.split, cp=c.cp, cp_method=c.cp_method,
        **({"fp8": True} if fp8 else {}))  # (the key of a run without it: as before)


def overlap(c: Config) -> tuple[str, ...]:
    """The transfer phases `c`'s step time hides, as `spmdsim estimate` hides them: the data-parallel gradient
    sums under the backward, and with the ring method ring attention's messages under its products."""
    return ("gradients",) + (("context",) if c.cp > 1 and c.cp_method == "ring" else ())


def search(cfg: Any, devices: int, machine: Any, memory_limit: int, *, precision: str = "bf16-mixed",
           kept: str = "megatron", max_dry_runs: int = 24, pricer: Any = None, cells: Any = True,
           moe_cells: bool = False, fixed: Any = None, jobs: int = 1) -> SearchResult:
    """The fastest configuration whose peak is within `memory_limit` by predicted step time (module docstring).

    `pricer(cfg, config, machine, precision, kept) -> (seconds, bytes held, peak bytes)`: `price` unless given
    (tests);
    `cells`: bound by the layer cells too (spmdsim.tools.estimate.bounds), not by the closed forms alone; a
    `Cells` of the same model and kept set to reuse its cells (tests). With MoE layers the layer cells bound
    the search only with `moe_cells` (six small dry runs a cell, one for every ep and etp too: on DeepSpeed-MoE's
    1.3B+MoE-128 over 128 devices 5,436 small dry runs; docs/howto/choose-configuration.md).
    `fixed`: {Config field: value} (`parse_fixed`): only the configurations with those degrees are searched.
    `jobs` > 1: that many worker processes run the dry runs the search asks for next, ahead of it
    (spmdsim.tools.estimate.ahead; with `price`, not a `pricer` given): the same result, sooner on as many cores.
    The experts folded into their ep (etp 1, and with the layer cells every etp dividing tp between 1 and tp,
    each bounded by its own cells: a cell per mesh and etp, made when one of its configurations reaches the top
    of the heap) are searched where the layer cells bound them or `fixed` holds etp (that etp alone):
    by the closed forms alone their bounds are the least (half the tokens a rank in each Alltoall) and take the
    dry runs from the configurations split over tp (DeepSpeed-MoE's 1.3B+MoE-128 on 128 A100s: 328.9 ms chosen
    among them where the split experts give 300.4 ms; docs/howto/choose-configuration.md). With MoE layers,
    ZeRO-3 (the experts sharded over dp, the rest over dp x ep) is searched where `fixed` holds zero 3, or
    again, with the rest, where none of ZeRO 0 to 2 priced fits: by the closed forms alone its bounds are
    its ZeRO-1 twin's and take dry runs from the others (the 16-device example of choose-configuration.md: 43.8
    ms chosen where 42.4 ms is without them). Context parallelism beside MoE layers alike: searched with the layer
    cells or where `fixed` holds cp (by the closed forms alone, on that example, a cp 8 configuration at 140.9 ms
    was chosen).
    """
    _check_search(precision, kept, max_dry_runs, memory_limit, jobs, fixed)
    peak_refusal(machine, precision)
    zero = (fixed or {}).get("zero")
    # (the collector less often: spmdsim.base.collector)
    with fewer_collections(), LookAhead(jobs) if jobs > 1 and pricer is None else nullcontext() as ahead:
        args = (cfg, devices, machine, memory_limit, precision, kept, max_dry_runs, pricer, cells, moe_cells, fixed,
                ahead)
        result = _searched(*args, sharded=cfg.moe is None or zero == 3)
        if result.chosen is None and cfg.moe is not None and zero is None:
            result = replace(_searched(*args, sharded=True), sharded=True)
    return result


def _searched(cfg: Any, devices: int, machine: Any, memory_limit: int, precision: str, kept: str,
              max_dry_runs: int, pricer: Any, cells: Any, moe_cells: bool, fixed: Any, ahead: Any,
              sharded: bool) -> SearchResult:
    """`search`'s branch and bound over the configurations (with MoE layers their ZeRO-3 ones where `sharded`)."""
    # With MoE layers the folded experts and cp are searched where the layer cells bound them or `fixed` holds them
    bound_by_cells = cfg.moe is None or moe_cells or isinstance(cells, Cells)
    folded = bound_by_cells or "etp" in (fixed or {})
    contexts = bound_by_cells or "cp" in (fixed or {})
    bounded, sums = _bounded(cfg, devices, machine, precision, fixed, folded, sharded, contexts, bound_by_cells)
    out = [replace(c, verdict=STATES) for c in bounded if c.bound_bytes > memory_limit]
    # Branch and bound: the heap holds each candidate under its best lower bound so far (first the closed
    # form's, then the layer cells'); the least is bounded further, or priced once its bound is the cells'.
    heap = [(c.bound_s, 0, _order(c), i, c) for i, c in enumerate(bounded) if c.bound_bytes <= memory_limit]
    heapq.heapify(heap)
    if cfg.moe is not None and cells is True and not moe_cells:  # the closed forms alone (the docstring)
        cells = False
    tight = cells if isinstance(cells, Cells) else \
        (Cells(cfg, kept, machine.gpus_per_node, PRECISIONS[precision].fp8) if cells else None)
    made = tight.dry_runs if tight is not None else 0
    bound = _Bound(cfg, machine, precision, kept, memory_limit, price if pricer is None else pricer, tight, sums,
                   ahead)
    best, runs, priced = _branch_and_bound(bound, heap, out, max_dry_runs)
    return _result(SearchResult(devices, machine.name, memory_limit, precision, kept, (), runs, "", None,
                                tight.dry_runs - made if tight is not None else 0, folded, contexts=contexts), heap,
                   best, priced, out, max_dry_runs)


def _check_search(precision: str, kept: str, max_dry_runs: Any, memory_limit: Any, jobs: Any, fixed: Any) -> None:
    """`search`'s arguments: one line naming the first bad one."""
    if precision not in PRECISIONS:
        raise SpmdsimError(f"precision {precision!r} is unknown; expected one of {tuple(PRECISIONS)!r}")
    if isinstance(max_dry_runs, bool) or not isinstance(max_dry_runs, int) or max_dry_runs < 1:
        raise SpmdsimError(f"max dry runs {max_dry_runs!r} must be an integer >= 1")
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, int) or memory_limit < 1:
        raise SpmdsimError(f"memory limit {memory_limit!r} must be a number of bytes >= 1")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise SpmdsimError(f"jobs {jobs!r} must be an integer >= 1 (processes running dry runs)")


def _bounded(cfg: Any, devices: int, machine: Any, precision: str, fixed: Any, folded: bool,
             sharded: bool = True, contexts: bool = True, between: bool = False) -> tuple[list, dict]:
    """Every configuration `search` considers under its closed-form bounds (`folded`: the experts folded too;
    `between`: at every experts' tp between 1 and tp too), and the seconds of each one's gradient sums and
    ZeRO-3 gathers within them (the layer cells' bound adds them)."""
    per_layer = dense_layer_elements(cfg)
    bounded, sums = [], {}
    if cfg.moe is None and "etp" in (fixed or {}):
        raise SpmdsimError(f"--fix etp={fixed['etp']} holds the experts' tp, and this GPT has none: give it MoE layers "
                           "(--gpt ...,experts=N)")
    # (--fix cp=N: that cp alone, across nodes too)
    method = (fixed or {}).get("cp_method")
    methods = SEARCHED_METHODS if method is None else (method,)
    cp = (fixed or {}).get("cp") if contexts else 1
    etp = (fixed or {}).get("etp")
    etps = (etp,) if isinstance(etp, int) and etp > 1 else ()  # an experts' tp between 1 and tp: --fix etp=N
    every = configurations(cfg, devices, machine.gpus_per_node, cp, methods, folded, sharded, etps, between)
    if fixed and not every:  # every cp the search takes, for the line that names them
        every = configurations(cfg, devices, machine.gpus_per_node, methods=methods, folded=folded, sharded=sharded,
                               etps=etps, between=between)
    for c in (fixed_configurations(every, fixed, devices) if every and fixed else every):
        seconds, nbytes, sums[c] = bounds_and_sums(cfg, c, machine, precision, devices, per_layer)
        bounded.append(Candidate(c, seconds, nbytes))
    if not bounded:
        note = vocab_note(cfg, devices, machine.gpus_per_node)  # the padding that lets more tp in, if any
        context = (f", ep the experts {cfg.moe.experts}" if cfg.moe is not None else "") + (
            f", 2 x cp the seq {cfg.seq} with tp x cp within a node" if contexts else "")  # seq 96: cp 3 on 6
        if not every and configurations(cfg, devices, machine.gpus_per_node, cp, methods, folded, sharded, etps,
                                        between, even=False):  # tp 4 on 6-GPU nodes
            context += f", and each axis's groups placed alike on the {machine.gpus_per_node}-GPU nodes"
        raise SpmdsimError(f"no configuration of the GPT runs on {devices:,} devices (tp must divide the heads "
                           f"{cfg.heads} and vocab {cfg.vocab_words} within a node of {machine.gpus_per_node}, pp the "
                           f"layers {cfg.layers}, dp the batch {cfg.batch}{context})" + (f"; {note}" if note else ""))
    return bounded, sums


@dataclass(frozen=True)
class _Bound:
    """What the branch and bound of one `search` prices and bounds with."""

    cfg: Any
    machine: Any
    precision: str
    kept: str
    memory_limit: int
    pricer: Any
    tight: Any  # the layer cells (spmdsim.tools.estimate.bounds.Cells) or None: the closed forms alone
    sums: dict
    ahead: Any = None  # a spmdsim.tools.estimate.ahead.LookAhead running the next dry runs, or None

    def dry_keys(self, entry: tuple) -> list:
        """The dry runs the branch and bound needs to take heap entry `entry`: its layer cell's at level 0 (none once
        the cell is made), else the one that prices it (spmdsim.tools.estimate.ledger.dry_key)."""
        c = entry[4].config
        if self.tight is not None and entry[1] == 0:
            return self.tight.dry_keys(c)
        args, keywords = price_run(self.cfg, c, self.kept, PRECISIONS[self.precision].fp8)
        return [dry_key(*args, **keywords)]


def _branch_and_bound(bound: _Bound, heap: list, out: list, max_dry_runs: int) -> tuple:
    """(the best predicted time under the limit or None, dry runs made, the priced candidates): the heap's
    least bounded further or priced until its bound reaches the best time or the dry runs run out; the
    candidates a bound drops go to `out`, those left stay on `heap`."""
    limit, precision = bound.memory_limit, bound.precision
    best: Optional[float] = None
    runs = 0
    priced: list[Candidate] = []
    while heap:
        least, level, order, i, c = heap[0]
        if best is not None and least >= best:
            break
        if bound.ahead is not None and (runs < max_dry_runs or bound.tight is not None and level == 0):
            bound.ahead.before(heap, best, bound.dry_keys)  # (not for a price the cap leaves unmade)
        heapq.heappop(heap)
        if bound.tight is not None and level == 0:  # the layer cells' bounds: memory, then time
            try:
                nbytes = max(c.bound_bytes, bound.tight.memory_bound(c.config, precision))
            except UnmappableError as exc:
                out.append(replace(c, bound_bytes=_unmapped(exc, precision, limit), verdict=KEPT))
                continue
            if nbytes > limit:
                out.append(replace(c, bound_bytes=nbytes, verdict=KEPT))
                continue
            seconds = max(least, bound.tight.time_bound(c.config, bound.machine, precision, *bound.sums[c.config]))
            heapq.heappush(heap, (seconds, 1, order, i, replace(c, bound_s=seconds, bound_bytes=nbytes)))
            continue
        if runs == max_dry_runs:
            heapq.heappush(heap, (least, level, order, i, c))
            break
        try:
            seconds, nbytes, peak = bound.pricer(bound.cfg, c.config, bound.machine, precision, bound.kept)
        except UnmappableError as exc:
            out.append(replace(c, bound_bytes=_unmapped(exc, precision, limit), verdict=KEPT))
            continue
        runs += 1
        ok = peak <= limit  # spmdsim estimate's verdict: the peak, transient blocks included
        priced.append(replace(c, step_s=seconds, memory=nbytes, peak=peak, verdict="slower" if ok else OVER))
        if ok and (best is None or seconds < best):
            best = seconds
    return best, runs, priced


def _result(partial: SearchResult, heap: list, best: Optional[float], priced: list, out: list,
            max_dry_runs: int) -> SearchResult:
    """`partial` with its candidates, why the search stopped and the chosen one: the priced first (by time),
    then the others, the candidates left on `heap` marked by the bound that left them."""
    memory_limit = partial.memory_limit
    stopped = "every configuration the bounds left was priced"
    left = sorted(heap)
    unpriced = [c for bound, *_, c in left if best is None or bound < best]
    out += [replace(c, verdict=ABOVE[level] if best is not None and bound >= best else UNPRICED)
            for bound, level, *_, c in left]
    if unpriced:
        stopped = (f"stopped after {max_dry_runs} dry runs (--max-dry-runs): {len(unpriced):,} configuration(s) "
                   "not priced, the choice is the best of those priced")
    elif left:
        stopped = "the rest's time bounds are no better than the chosen one's predicted time"
    priced.sort(key=lambda c: (c.peak > memory_limit, _equal_time(c.step_s), _order(c)))
    chosen = None
    if priced and priced[0].peak <= memory_limit:
        chosen = replace(priced[0], verdict="chosen")
        priced[0] = chosen
        tie = _equal_time(chosen.step_s)
        priced = [replace(c, verdict=TIED) if c.verdict == "slower" and _equal_time(c.step_s) == tie else c
                  for c in priced]
    return replace(partial, candidates=tuple(priced + out), stopped=stopped, chosen=chosen)


def _unmapped(exc: Any, precision: str, memory_limit: int) -> int:
    """The memory bound of a configuration whose dry run could not map a block (spmdsim.base.sizes.UnmappableError):
    the block's bytes at `precision`, over `memory_limit` (a block beyond this machine's address space is
    beyond any GPU's memory); within it, the error itself (this machine's limit, not the configuration's)."""
    least = least_bytes(exc, precision)
    if least <= memory_limit:
        raise exc
    return least


#: Why a candidate was not chosen: priced, or pruned (by which bound), or left unpriced.
OVER = "over the memory limit"
STATES = "model states over the limit"
KEPT = "memory bound over the limit"
ABOVE = ("FLOP bound above the best", "cell bound above the best")
UNPRICED = "not priced"
TIED = "as fast (a tie)"


def _equal_time(seconds: float) -> float:
    """`seconds` to 9 significant digits: two configurations whose predicted times differ in the last bits of
    their sums alone (a ZeRO-1 configuration and its ZeRO-2 twin, the same transfers and kernels added in
    another order) are equals, ordered by `_order`, not by rounding."""
    return float(f"{seconds:.9g}")


def _order(c: Candidate) -> tuple:
    """A fixed order among equals: fewer pipeline stages, less tensor then context parallelism, the ring first, no
    recomputation first."""
    x = c.config
    return (x.pp, x.tp, x.cp, METHODS.index(x.cp_method), x.virtual, RECOMPUTE.index(x.recompute), x.zero, x.sp,
            x.microbatches, x.ep, x.etp)
