"""One rank's ledger per pipeline stage, from the dry run of the real training step (docs/howto/estimate.md).

`gpt_ledger` runs spmdsim.models.gpt.pipeline.train_pipelined on the dry engine (shapes only: no array is
written, one representative rank per stage, later microbatches' cells repeated from the first's
measured figures) for one step and reads what that run did on each representative: the bytes it held
(parameters, gradients, master copy, optimizer states, buffers, and what the graph kept for backward
at the moment the schedule held the most microbatches: spmdsim.models.gpt.memory.MemoryReport), the matrix
products it executed (spmdsim.base.flops) and every collective and message it took part in (its trace,
as `records.Calls` rows, each placed within a node or across nodes from the mesh). With `fp8` the run's
linear layers multiply FP8 copies as TransformerEngine's do (spmdsim.models.gpt.fp8_block, on float64
elements): their products are recorded in their FP8 dtypes, the copies the graph keeps and the scales the run
holds are the program's.

The program runs in float64; spmdsim.tools.estimate.held prices what it holds at a training precision's widths
(its names are this module's too), `gemms_at`, `transfers_at` and `kernel_bytes` what it computes and moves.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from ...errors import SpmdsimError
from .records import Calls
from ...base.collector import fewer_collections
from ...base.context import current
from ...base.flops import counting
from ...base.fp8 import DELAYED
from ...base.precision import Precision
from ...emulator.comm import world
from ...models.gpt.params import is_expert
from ...models.gpt.pipeline import train_pipelined
from ...models.gpt.context import Context, runs_as
from ...models.gpt.sharded_run import train_sharded
from ...nn.ops.fp8_linear import WEIGHT_CAST
from ...programs.memory import ENV_VAR
from ...runtime.sim.run import simulate
from .held import (_RUN, PRECISIONS, ROLES, StageMemory, Transient, Widths, backward_gradients, largest_transient,
                   layers_activations, least_bytes, own_width, peak_bytes, priced, stage_memory, unmappable)
from .steptime import step_time
from .transfers import placed, trace_calls
from ...base.tables import put

__all__ = ["Widths", "PRECISIONS", "StageLedger", "gpt_ledger", "dry_key", "dry_run", "known_ledgers", "remember",
           "priced", "ROLES", "gemms_at", "transfers_at",
           "layers_activations", "kernel_bytes", "least_bytes", "unmappable", "Transient", "largest_transient",
           "StageMemory", "stage_memory", "peak_bytes", "backward_gradients", "stage_times", "own_width", "FP8_RUN"]

#: The dry run's policy under "fp8": TransformerEngine's recipe (delayed scaling) on float64 elements, which the
#: ledger prices at the precision's widths; the FP8 copies are e4m3 and e5m2, a byte each, as in any run.
FP8_RUN = Precision("fp8", "float64", "float64", None, "float64", "float64", DELAYED)


@dataclass(frozen=True)
class StageLedger:
    """What one rank of a pipeline stage did in one training step (every rank of a stage does the same).

    memory: its spmdsim.models.gpt.memory.MemoryReport (the program's bytes); layer_params: elements of its
    transformer layers' parameters (the rest are the embeddings, final norm); gemms: (Gemm, count)
    of its matrix products; transfers: its collectives and messages; peak_held: the most bytes the dry
    run's meter saw it hold at once (every buffer, transients included); in_flight: the most
    microbatch-chunks whose activations it held at once; kernels: (Kernel, count) of every other kernel
    it ran (spmdsim.base.flops.sweep: the element-wise and reduction operators, forward, backward and
    recomputed, and the optimizer's update), elements read and written; expert_params: elements of its
    MoE layers' experts (their routers aside), of layer_params; fresh: spmdsim.base.flop_counts.Fresh records, what each
    product and kernel over activations read and wrote beyond the blocks the rank holds anyway (parameters,
    their gradients, what the graph keeps for backward: `largest_transient`); scales: bytes of the FP8 scales,
    amax histories and the step's amaxes its chunks hold (spmdsim.base.fp8.Scales.nbytes; 0 without FP8).
    """

    stage: int
    rank: int
    memory: Any
    layer_params: int
    params: int
    gemms: tuple
    transfers: tuple[Calls, ...]
    peak_held: int
    in_flight: int
    ranks: tuple = field(default=())
    kernels: tuple = field(default=())
    expert_params: int = 0
    fresh: tuple = field(default=())
    scales: int = 0

    def flops(self, phase: Optional[str] = None) -> int:
        return sum(g.flops * n for g, n in self.gemms if phase is None or g.phase == phase)

    def traffic(self, phase: Optional[str] = None) -> int:
        """Bytes the kernels read and wrote in the run (float64), of one phase or all."""
        return sum(k.nbytes * n for k, n in self.kernels if phase is None or k.phase == phase)

    def sent(self, precision: Optional[str] = None) -> dict:
        """Bytes this rank sent, by (kind, level): the run's, or at `precision`'s widths (`transfers_at`)."""
        out: dict = {}
        for t in (self.transfers if precision is None else transfers_at(self.transfers, precision)):
            out[(t.kind, t.level)] = out.get((t.kind, t.level), 0) + t.sent * t.count
        return out


def kernel_bytes(kernels: Any, precision: str, fused_accumulation: bool = False) -> dict:
    """{phase: bytes} the (Kernel, count) pairs read and write at `precision`'s widths; with `fused_accumulation`
    (Megatron's --gradient-accumulation-fusion, its default, NeMo's gradient_accumulation_fusion) not the
    parameters' gradients added into their main gradients (kernels "add" of kind "grads"): the weight-gradient
    GEMM accumulates into the fp32 main gradient in its epilogue, under its products.

    The operators' floating values ("activations") at the activation width; their masks, ids, FP8 copies and
    other non-floating elements at their own width (a boolean mask, an e4m3 element a byte). The optimizer's roles at
    theirs: gradients, moments ("states") and ZeRO-1's master slices at the precision's widths. A mixed
    precision updates a master copy, not the parameters: an updated parameter element (kind "params",
    the program updating its own float64 parameters) is read and written at the master copy's width,
    and every element the update writes (that, or a ZeRO-1 master slice) also writes the parameter's
    low-precision copy.
    """
    w = PRECISIONS[precision]
    known = _KERNEL_BYTES.get(w)  # (the Widths hashed once a call, each kernel once)
    if known is None:
        known = _KERNEL_BYTES[w] = {}
    out: dict = {}
    for k, n in kernels:
        if fused_accumulation and k.op == "add" and k.kind == "grads":
            continue
        try:
            nbytes = known.get(k)
        except TypeError:  # a kernel that does not hash
            nbytes = None
        if nbytes is None:
            nbytes = _kernel_bytes(k, w)
            try:
                put(known, k, nbytes, 4096)
            except TypeError:
                pass
        out[k.phase] = out.get(k.phase, 0) + nbytes * n
    return out


#: Widths -> {Kernel: `_kernel_bytes`}: a search prices the same few kernels again and again (full values as keys)
_KERNEL_BYTES: dict = {}


def _kernel_bytes(k: Any, w: Widths) -> int:
    """Bytes one call of kernel `k` reads and writes at widths `w` (`kernel_bytes`)."""
    if k.kind == "activations":
        floating = k.dtype.startswith(("float", "complex")) and not k.dtype.startswith("float8")
        each = w.activations if floating else k.nbytes // (k.read + k.written)
        return (k.read + k.written) * each
    width = {"grads": w.grads, "states": w.states, "master": w.master, "params": w.master if w.mixed else w.params}
    nbytes = (k.read + k.written) * width[k.kind]
    if w.mixed and k.kind in ("params", "master"):
        nbytes += k.written * w.params
    return nbytes


def gemms_at(gemms: Any, precision: str) -> list:
    """The (Gemm, count) pairs with each product in `precision`'s compute dtype (bf16 under bf16-mixed), an FP8
    product (e4m3 or e5m2 operands, spmdsim.nn.ops.fp8_linear) in "fp8"."""
    dtype = PRECISIONS[precision].compute
    out = []
    for g, n in gemms:
        try:
            at = _GEMMS_AT.get((g, dtype))
        except TypeError:  # a product that does not hash
            at = None
        if at is None:
            at = replace(g, dtype="fp8" if g.dtype.startswith("float8") else dtype)
            put(_GEMMS_AT, (g, dtype), at, 4096)
        out.append((at, n))
    return out


_GEMMS_AT: dict = {}  # (Gemm, compute dtype) -> that Gemm in the dtype (`gemms_at`: a frozen Gemm, made once)


def transfers_at(transfers: Any, precision: str) -> list:
    """The Calls rows with their bytes at `precision`'s widths: activations and their gradients (the layers'
    collectives, the pipeline's messages) at the activation width, the data-parallel sums at the gradient
    width (Megatron sums bf16 training's gradients in fp32), the gathers of parameters (ZeRO-1's and ZeRO-2's
    of the updated ones, Calls.role; ZeRO-3's) at the parameters'; a row of elements with a width of their own
    (Calls.width: FP8 values, integers) as it is."""
    w = PRECISIONS[precision]
    out = []
    for t in transfers:
        if t.width:
            out.append(t)
            continue
        width = w.params if t.role == "parameters" or t.phase == "parameters" else \
            w.grads if t.phase == "gradients" else w.activations
        if type(t) is Calls:  # (`replace`'s row, made directly: ~4x faster)
            out.append(Calls(t.kind, t.group, t.nbytes * width // _RUN, t.level, t.phase, t.count,
                             t.sent * width // _RUN, t.width, t.role, t.lanes))
        else:
            out.append(replace(t, nbytes=t.nbytes * width // _RUN, sent=t.sent * width // _RUN))
    return out


#: The ledgers of the dry runs made in this process, by everything a dry run's figures depend on (the
#: arguments and SPMDSIM_MEMORY; not the node size, which only places each transfer within a node or across
#: nodes: transfers.placed), each stage's with its transfers unplaced: a search and its layer cells, or an
#: estimate, that asks again for an equal configuration, on nodes of any size, reads its ledger here instead of
#: running the same program again. Oldest out first.
_LEDGERS: dict = {}
_KEEP = 512  # (a small MoE GPT on 4 devices has 258 configurations: tests/test_estimate_search.py prices them all)


def gpt_ledger(cfg: Any, pp: int, dp: int, tp: int, *, sp: bool = False, microbatches: int = 1,
               schedule: str = "1f1b", virtual: int = 1, recompute: str = "none", zero: int = 0,
               kept: str = "graph", gpus_per_node: int = 8, ep: int = 1,
               split: Optional[tuple] = None, cp: int = 1, cp_method: str = "ring",
               prefetch: bool = False, fp8: bool = False, shard_group: int = 0,
               reshard: bool = True) -> list[StageLedger]:
    """One StageLedger per pipeline stage: the dry run of one training step of `cfg`'s GPT on a
    (pp, dp, tp) mesh of simulated ranks (spmdsim.models.gpt.pipeline.train_pipelined; pp 1 is the plain step;
    ZeRO-3 on one stage and one microbatch: spmdsim.models.gpt.sharded_run.train_sharded, with `prefetch` FSDP's),
    its layers cut into chunks by `split` (layers per chunk in pipeline order; None: balanced);
    with MoE layers (cfg.moe) on a (pp, dp, ep, tp) mesh, `ep` expert-parallel ranks a stage (a dry run
    routes by cfg.moe.dry_routing); `cp` context-parallel ranks a stage, attention by `cp_method`
    (spmdsim.models.gpt.context); `fp8`: the linear layers' products in FP8 (`FP8_RUN`); `shard_group`: under
    ZeRO-3 on one stage, HSDP's (train_sharded's); `reshard`: there, each layer resharded after its forward (FSDP2's
    reshard_after_forward). An equal call made before in this process gives that run's
    ledgers (`_LEDGERS`)."""
    if not (type(gpus_per_node) is int and gpus_per_node >= 1):
        raise SpmdsimError(f"gpus per node {gpus_per_node!r} must be an integer >= 1")
    key = dry_key(cfg, pp, dp, tp, sp=sp, microbatches=microbatches, schedule=schedule, virtual=virtual,
                  recompute=recompute, zero=zero, kept=kept, ep=ep, split=split, cp=cp, cp_method=cp_method,
                  prefetch=prefetch, fp8=fp8, shard_group=shard_group, reshard=reshard)
    known = known_ledgers(key)
    if known is None:
        with fewer_collections():  # (spmdsim.base.collector: the 1T row's dry run spent 2.1 of 10.8 s collecting)
            known = dry_run(key)
        remember(key, known)
    return [replace(ledger, transfers=placed(*unplaced, ledger.rank, gpus_per_node, ledger.ranks))
            for ledger, unplaced in known]


def dry_key(cfg: Any, pp: int, dp: int, tp: int, *, sp: bool = False, microbatches: int = 1,
            schedule: str = "1f1b", virtual: int = 1, recompute: str = "none", zero: int = 0,
            kept: str = "graph", ep: int = 1, split: Optional[tuple] = None, cp: int = 1, cp_method: str = "ring",
            prefetch: bool = False, fp8: bool = False, shard_group: int = 0, reshard: bool = True) -> tuple:
    """Everything `gpt_ledger`'s dry run depends on (its arguments but the node size, and SPMDSIM_MEMORY), in
    `_dry_ledger`'s order, the environment's value last: `_LEDGERS`'s key, and what `dry_run` runs. Selective
    recomputation where the attention core keeps no scores is "none" (spmdsim.models.gpt.context.runs_as: the same
    program, so the same ledgers: a search prices such a pair by one dry run)."""
    split = None if split is None else tuple(split)
    recompute = runs_as(cfg, recompute, cp, cp_method)
    return (cfg, pp, dp, tp, sp, microbatches, schedule, virtual, recompute, zero, kept, ep, split, (cp, cp_method),
            prefetch, fp8, shard_group, reshard, os.environ.get(ENV_VAR, ""))


def dry_run(key: tuple) -> tuple:
    """The ledgers of the dry run `key` (`dry_key`) names, each stage's (StageLedger without its transfers, its
    transfers unplaced); module-level, so a worker process can run it (spmdsim.tools.estimate.ahead)."""
    return tuple(_dry_ledger(*key[:-1]))


def known_ledgers(key: tuple) -> Optional[tuple]:
    """The ledgers of an equal dry run made before in this process (or given by `remember`), or None."""
    try:
        return _LEDGERS.get(key)
    except TypeError:  # an argument that cannot be a key (a list)
        return None


def remember(key: tuple, ledgers: tuple) -> None:
    """Keeps `ledgers`, the dry run `key`'s, for `gpt_ledger` (oldest out first)."""
    try:
        hash(key)
    except TypeError:  # an argument that cannot be a key: nothing kept
        return
    while len(_LEDGERS) >= _KEEP:
        del _LEDGERS[next(iter(_LEDGERS))]
    _LEDGERS[key] = ledgers


def _dry_ledger(cfg: Any, pp: int, dp: int, tp: int, sp: bool, microbatches: int, schedule: str, virtual: int,
                recompute: str, zero: int, kept: str, ep: int = 1, split: Optional[tuple] = None,
                contexts: tuple = (1, "ring"), prefetch: bool = False, fp8: bool = False,
                shard_group: int = 0, reshard: bool = True) -> list[tuple]:
    """`gpt_ledger`'s dry run: (StageLedger without its transfers, its transfers unplaced:
    spmdsim.tools.estimate.transfers.trace_calls) of each stage; `contexts`: (cp, its method)."""
    cp, method = contexts
    ids = np.arange(2 * cfg.seq + 2, dtype=np.int64) % min(cfg.vocab, 128)  # token ids: a dry run reads shapes

    def body() -> tuple:
        with counting(blocks=True) as flops:
            trainer = train_sharded if zero == 3 and pp == microbatches == virtual == 1 and cp == 1 else \
                train_pipelined
            run, steps = trainer(cfg, world(), pp, dp, tp, 1, ids, sp=sp, schedule=schedule,
                                         microbatches=microbatches, virtual=virtual, recompute=recompute,
                                         zero=zero, kept=kept, memory=True, check=False, ep=ep, split=split,
                                         precision=FP8_RUN if fp8 else "fp64",
                                         **({"prefetch": prefetch, "shard_group": shard_group,
                                             "reshard_after_forward": reshard}
                                            if trainer is train_sharded else
                                            {"cp": cp, "context": Context(method) if cp > 1 else None}))
        rank = world().Get_rank()
        layer = sum(t.local.size for name, t in run.params.items() if name.startswith("h"))
        total = sum(t.local.size for t in run.params.values())
        experts = sum(t.local.size for name, t in run.params.items() if is_expert(name))
        meter = current().meter
        out = StageLedger(run.stage, rank, steps[-1].memory, layer, total, tuple(flops.counts.items()),
                          (), meter.peak, run.in_flight[-1],
                          kernels=_casts_once(flops.kernels.items(), microbatches), expert_params=experts,
                          fresh=flops.fresh(),
                          scales=sum(m.fp8.nbytes() for m in getattr(run, "models", {}).values()
                                     if m.fp8 is not None))
        unplaced = trace_calls(run.trace, run.mesh, rank)
        run.close()
        return out, unplaced

    results = simulate(pp * dp * ep * cp * tp, body, dry_run=True)
    stages: dict = {}
    for r, (ledger, unplaced) in enumerate(results):
        stages.setdefault(ledger.stage, (ledger, unplaced, []))[2].append(r)
    return [(replace(ledger, ranks=tuple(ranks)), unplaced) for _, (ledger, unplaced, ranks) in sorted(stages.items())]


def stage_times(stages: Any, machine: Any, precision: str, pipeline: Any, overlap: Any,
                fused_accumulation: bool = False) -> list:
    """Each stage's spmdsim.tools.estimate.steptime.StepTime from its ledger (`gpt_ledger`'s, in stage order) at
    `precision` on `pipeline` (a Pipeline, its stages those of `stages`), hiding `overlap`, the gradients'
    accumulation fused into the weight-gradient GEMMs where `fused_accumulation` (`kernel_bytes`): what `spmdsim
    estimate` prints and spmdsim.tools.estimate.search prices. With "updates" in `overlap` ZeRO-1's and ZeRO-2's
    gathers of the updated parameters (Calls.role) are that phase's, hidden under the next step's forward as
    Megatron's --overlap-param-gather runs them; else the gradient sums', under the backward."""
    ahead = "updates" in overlap
    return [step_time(machine, gemms_at(st.gemms, precision),
                      [replace(t, phase="updates") if ahead and t.role == "parameters" and t.phase == "gradients"
                       else t for t in transfers_at(st.transfers, precision)],
                      pipeline=pipeline, overlap=overlap, stage=k,
                      traffic=kernel_bytes(st.kernels, precision, fused_accumulation))
            for k, st in enumerate(stages)]


def _casts_once(kernels: Any, microbatches: int) -> tuple:
    """The (Kernel, count) pairs with each weight's cast to e4m3 (spmdsim.nn.ops.fp8_linear.WEIGHT_CAST) counted
    once a step, as the program casts it (TransformerEngine's Linear keeps a weight's FP8 copy from the step's first
    microbatch: Megatron and NeMo pass it ``is_first_microbatch``), where the dry run repeats the first
    microbatch's cells, its cast among them, for the later ones."""
    return tuple((k, n // microbatches if k.op == WEIGHT_CAST else n) for k, n in kernels)
