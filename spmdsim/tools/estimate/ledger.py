"""One rank's ledger per pipeline stage, from the dry run of the real training step (docs/howto/estimate.md).

`gpt_ledger` runs spmdsim.models.gpt.pipeline.train_pipelined on the dry engine (shapes only: no array is
written, one representative rank per stage, later microbatches' cells repeated from the first's
measured figures) for one step and reads what that run did on each representative: the bytes it held
(parameters, gradients, master copy, optimizer states, buffers, and what the graph kept for backward
at the moment the schedule held the most microbatches: spmdsim.models.gpt.memory.MemoryReport), the matrix
products it executed (spmdsim.base.flops) and every collective and message it took part in (its trace,
as `records.Calls` rows, each placed within a node or across nodes from the mesh).

The program runs in float64. `PRECISIONS` prices the same elements at a training precision's widths
(bf16 mixed precision: 2-byte parameters and activations, 4-byte main gradients, master copy and
Adam moments, as Megatron keeps them); a mixed precision keeps a master copy of every element a rank
updates, which a float64 run has no need for: `priced` names it. The gradients `priced` names are those the
rank keeps after the step (ZeRO-0's and ZeRO-1's whole, in ZeRO-1's gradient buffer; ZeRO-2's the rank's slices,
the model states the ZeRO paper compares); at every ZeRO level the most gradients the rank holds at once is the
run's measured MemoryReport.grads_peak, whose excess over them the peak adds (`backward_gradients`,
`StageMemory`): one rule, what the program holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ...errors import SpmdsimError
from ...models.gpt.memory import BLOCK_KINDS, MASKS
from ...base.sizes import format_size
from .records import Calls
from ...base.context import current
from ...base.flops import counting
from ...emulator.comm import world
from ...models.gpt.params import is_expert
from ...models.gpt.pipeline import train_pipelined
from ...models.gpt.context import Context
from ...models.gpt.sharded_run import train_sharded
from ...programs.memory import ENV_VAR
from ...runtime.sim.run import simulate
from .steptime import step_time
from .transfers import trace_transfers

__all__ = ["Widths", "PRECISIONS", "StageLedger", "gpt_ledger", "priced", "ROLES", "gemms_at", "transfers_at",
           "layers_activations", "kernel_bytes", "least_bytes", "unmappable", "Transient", "largest_transient",
           "StageMemory", "stage_memory", "peak_bytes", "backward_gradients", "stage_times"]

#: What a rank holds, by role, in the order the ledger prints them.
ROLES = ("parameters", "gradients", "master copy", "optimizer states", "buffers", "activations")


@dataclass(frozen=True)
class Widths:
    """Bytes per element of each role under one precision (`mixed`: a master copy of every updated element)."""

    name: str
    params: int
    grads: int
    master: int
    states: int
    buffers: int
    activations: int
    mixed: bool
    compute: str
    about: str


PRECISIONS = {
    "fp64": Widths("fp64", 8, 8, 8, 8, 8, 8, False, "fp64", "as the program runs: every value float64"),
    "bf16-mixed": Widths("bf16-mixed", 2, 4, 4, 4, 4, 2, True, "bf16",
                         "Megatron's bf16: bf16 parameters and activations; fp32 main gradients, master copy "
                         "and Adam moments"),
    "fp16-mixed": Widths("fp16-mixed", 2, 2, 4, 4, 2, 2, True, "fp16",
                         "ZeRO's fp16 mixed precision: fp16 parameters, gradients and activations; fp32 "
                         "master copy, momentum and variance"),
}

_RUN = 8  # the program's bytes per element (float64)


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
    their gradients, what the graph keeps for backward: `largest_transient`).
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


def priced(stage: StageLedger, precision: str, zero: int) -> dict:
    """{role: bytes} of one rank of `stage` under `precision` (PRECISIONS), from its elements in the run: what it
    holds after the step (ZeRO-2's gradients its slices; `backward_gradients` what its step holds beyond them)
    and the activations at the moment the schedule held the most."""
    w = PRECISIONS[precision]
    m = stage.memory
    params = m.params // _RUN
    master = m.master // _RUN if zero in (1, 2) else (params if w.mixed else 0)  # ZeRO-3's: its shards' copy
    masks = sum(n for kind, n in m.kept if kind.endswith(MASKS))  # bools: a byte each at any precision
    values = m.kept_total - masks
    return {"parameters": params * w.params, "gradients": m.grads // _RUN * w.grads,
            "master copy": master * w.master, "optimizer states": m.states // _RUN * w.states,
            "buffers": m.buffers // _RUN * w.buffers, "activations": values // _RUN * w.activations + masks}


def least_bytes(exc: Any, precision: str) -> int:
    """The bytes one rank holds at least at `precision` for the block its dry run could not map
    (spmdsim.base.sizes.UnmappableError): its elements at the precision's narrowest width (its own, if narrower)."""
    w = PRECISIONS[precision]
    narrowest = min(w.params, w.grads, w.master, w.states, w.buffers, w.activations)
    return exc.nbytes // exc.dtype.itemsize * min(narrowest, exc.dtype.itemsize)


def unmappable(exc: Any, precision: str, limit: int, where: str) -> SpmdsimError:
    """The one-line error of a configuration whose dry run could not map a block (spmdsim.base.sizes.UnmappableError):
    when that block alone, at `precision`, is more than `limit` bytes (`where`: whose memory), the configuration
    does not fit, and the line says so; else `exc` as it is (this machine's limit, not the modelled rank's)."""
    least = least_bytes(exc, precision)
    if least <= limit:
        return exc
    return SpmdsimError(f"{exc}; one rank of this configuration holds it, if only for a moment: at least "
                        f"{format_size(least)} at {precision}, more than {where}: it does not fit")


def layers_activations(stage: StageLedger, precision: str) -> int:
    """The bytes the transformer blocks keep for backward (spmdsim.models.gpt.memory.BLOCK_KINDS and their
    masks; not the embedding's nor the head's) on one rank of `stage`, priced at `precision`."""
    w = PRECISIONS[precision]
    out = 0
    for kind, n in stage.memory.kept:
        if kind.endswith(MASKS) and kind[:-len(MASKS)] in BLOCK_KINDS:
            out += n
        elif kind in BLOCK_KINDS:
            out += n // _RUN * w.activations
    return out


def kernel_bytes(kernels: Any, precision: str) -> dict:
    """{phase: bytes} the (Kernel, count) pairs read and write at `precision`'s widths.

    The operators' floating values ("activations") at the activation width; their masks, ids and other
    non-floating elements at their own width (a boolean mask a byte). The optimizer's roles at theirs:
    gradients, moments ("states") and ZeRO-1's master slices at the precision's widths. A mixed
    precision updates a master copy, not the parameters: an updated parameter element (kind "params",
    the program updating its own float64 parameters) is read and written at the master copy's width,
    and every element the update writes (that, or a ZeRO-1 master slice) also writes the parameter's
    low-precision copy.
    """
    w = PRECISIONS[precision]
    width = {"grads": w.grads, "states": w.states, "master": w.master,
             "params": w.master if w.mixed else w.params}
    out: dict = {}
    for k, n in kernels:
        if k.kind == "activations":
            each = w.activations if k.dtype.startswith(("float", "complex")) else k.nbytes // (k.read + k.written)
            nbytes = (k.read + k.written) * each
        else:
            nbytes = (k.read + k.written) * width[k.kind]
            if w.mixed and k.kind in ("params", "master"):
                nbytes += k.written * w.params
        out[k.phase] = out.get(k.phase, 0) + nbytes * n
    return out


@dataclass(frozen=True)
class Transient:
    """The most bytes one kernel or matrix product of a stage's step reads and writes at once beyond what the rank
    holds anyway, at a precision's widths (`largest_transient`): blocks live together for a moment, beside the
    memory line. `what` names it: the operator and phase (a Kernel's), or the product's shape (a Gemm's)."""

    nbytes: int
    what: str


def largest_transient(stage: StageLedger, precision: str) -> Transient:
    """The largest set of blocks one kernel or product of `stage`'s forward, backward or recomputation reads and
    writes at once that the memory line does not hold already, from the dry run's records of each call's blocks
    (StageLedger.fresh, spmdsim.base.flop_counts.Fresh), priced at `precision`.

    The memory line holds the parameters, their gradients and what the graph keeps for backward: a call's block
    that is one of those, by identity in the dry run (a product's weight, the weight's gradient a product writes,
    a kept input), is counted there and not again here (spmdsim.base.flops.hold marks them: the parameters and the
    kept blocks where the trainer measures what the forward keeps, spmdsim.nn.autograd.kept_bytes; a parameter's
    gradients in the backward's walk, as a framework accumulates them into the main gradient the memory line
    holds). The rest are the moment's own: a product's result no graph keeps, a gradient of an activation,
    the attention core's scores and their gradients (blocks of their shapes to its products and kernels, held
    by nothing; its q, k, v and the probabilities it keeps are recorded as those blocks, as an MoE layer's
    experts' weights, their gradients and its kept rows are, spmdsim.models.moe.layer). Floating blocks at the
    activation width, masks and ids at their own width. The optimizer's kernels run after the activations are
    freed: not counted. Temporaries a kernel makes beyond its operands and results (a softmax's sums), and
    blocks of two calls alive at once, are not counted either."""
    w = PRECISIONS[precision]
    best = Transient(0, "nothing")
    for f in stage.fresh:
        nbytes = f.floating * w.activations + f.other
        if nbytes > best.nbytes:
            if isinstance(f.what, str):
                what = f"{f.what} ({f.phase})"
            else:
                g = f.what
                lead = f"{g.batch:,} x " if g.batch != 1 else ""
                what = f"the product {lead}({g.m:,} x {g.k:,}) @ ({g.k:,} x {g.n:,}) ({g.phase})"
            best = Transient(nbytes, what)
    return best


def backward_gradients(stage: StageLedger, precision: str, zero: int) -> int:
    """The gradient bytes one rank of `stage` holds at once in its step beyond `priced`'s "gradients", at
    `precision`: the dry run's measured most (spmdsim.models.gpt.memory.MemoryReport.grads_peak) less the gradients kept
    after the step, at every ZeRO level (`zero` changes nothing: one rule, what the program holds). Under ZeRO-2,
    whose gradients after the step are the rank's 1/dp slices: the buckets not yet reduced, the gradients final
    only at the walk's end, the token embedding's, and with several microbatches the earlier ones' gradients
    whole. Under ZeRO-1, whose gradients accumulate in the gradient buffer (each parameter's view of it, Megatron's
    main_grad; a parameter read twice, the tied table, gets each reader's there as the walk gives it), a node's
    gradients given at once beyond the buffer's; under ZeRO-0, whose gradients accumulate in its gradient buffer
    alike (spmdsim.nn.autograd.grad_buffer), the same, and in a first step whose gradients are pending over other
    axes than the buffer guessed, a copy of such a bucket as it is summed."""
    m = stage.memory
    return max(0, m.grads_peak - m.grads) // _RUN * PRECISIONS[precision].grads


@dataclass(frozen=True)
class StageMemory:
    """One rank of a stage at a precision (`stage_memory`): what it holds, by role (`held`, `priced`'s: the
    memory line), the gradients its step holds beyond the memory line's (`backward`, `backward_gradients`': the
    measured most less those) and the largest set of blocks one kernel or product reads and writes at once beside it
    (`transient`, `largest_transient`'s). `peak`, their sum, is what decides whether the rank fits a GPU:
    `spmdsim estimate`'s verdict and the search by a machine file's memory limit (spmdsim.tools.estimate.search)."""

    held: dict
    transient: Transient
    backward: int = 0
    gathered: int = 0  # ZeRO-3: the most bytes of gathered parameters held beyond those the memory line holds

    @property
    def memory(self) -> int:
        """The memory line: the bytes the rank holds."""
        return sum(self.held.values())

    @property
    def peak(self) -> int:
        """The memory line, the gradients held beyond it (measured) and, for a moment, the largest kernel's or
        product's blocks beside them."""
        return self.memory + self.backward + self.gathered + self.transient.nbytes


def stage_memory(stage: StageLedger, precision: str, zero: int) -> StageMemory:
    """What one rank of `stage` holds at `precision` under ZeRO `zero`, and its peak (StageMemory); ZeRO-3's
    gathered parameters beyond the graph's (a unit's, gathered for its forward or backward) in the peak."""
    m = stage.memory
    beyond = max(0, m.gathered - m.gathered_kept) // _RUN * PRECISIONS[precision].params
    return StageMemory(priced(stage, precision, zero), largest_transient(stage, precision),
                       backward_gradients(stage, precision, zero), beyond)


def peak_bytes(memories: Any) -> int:
    """The most bytes one rank of any stage needs at its peak (`memories`: StageMemory by stage): it fits a GPU,
    by `spmdsim estimate`'s verdict, when this is at most the GPU's memory; the search's memory limit is
    compared with the same figure."""
    return max(m.peak for m in memories)


def gemms_at(gemms: Any, precision: str) -> list:
    """The (Gemm, count) pairs with each product in `precision`'s compute dtype (bf16 under bf16-mixed)."""
    dtype = PRECISIONS[precision].compute
    return [(replace(g, dtype=dtype), n) for g, n in gemms]


def transfers_at(transfers: Any, precision: str) -> list:
    """The Calls rows with their bytes at `precision`'s widths: activations and their gradients (the layers'
    collectives, the pipeline's messages) at the activation width, the data-parallel sums and ZeRO-1's
    buckets at the gradient width (Megatron sums bf16 training's gradients in fp32), ZeRO-3's gathers at the
    parameters'."""
    w = PRECISIONS[precision]
    out = []
    for t in transfers:
        width = w.grads if t.phase == "gradients" else w.params if t.phase == "parameters" else w.activations
        out.append(replace(t, nbytes=t.nbytes * width // _RUN, sent=t.sent * width // _RUN))
    return out


#: The ledgers of the dry runs made in this process, by everything a dry run's figures depend on (the
#: arguments and SPMDSIM_MEMORY): a search and its layer cells, or an estimate, that asks again for an
#: equal configuration reads its ledger here instead of running the same program again. Oldest out first.
_LEDGERS: dict = {}
_KEEP = 256


def gpt_ledger(cfg: Any, pp: int, dp: int, tp: int, *, sp: bool = False, microbatches: int = 1,
               schedule: str = "1f1b", virtual: int = 1, recompute: str = "none", zero: int = 0,
               kept: str = "graph", gpus_per_node: int = 8, ep: int = 1,
               split: Optional[tuple] = None, cp: int = 1, cp_method: str = "ring",
               prefetch: bool = False) -> list[StageLedger]:
    """One StageLedger per pipeline stage: the dry run of one training step of `cfg`'s GPT on a
    (pp, dp, tp) mesh of simulated ranks (spmdsim.models.gpt.pipeline.train_pipelined; pp 1 is the plain step;
    ZeRO-3 on one stage and one microbatch: spmdsim.models.gpt.sharded_run.train_sharded, with `prefetch` FSDP's),
    its layers cut into chunks by `split` (layers per chunk in pipeline order; None: balanced);
    with MoE layers (cfg.moe) on a (pp, dp, ep, tp) mesh, `ep` expert-parallel ranks a stage (a dry run
    routes by cfg.moe.dry_routing); `cp` context-parallel ranks a stage, attention by `cp_method`
    (spmdsim.models.gpt.context). An equal call made before in this process gives that run's ledgers
    (`_LEDGERS`)."""
    import os

    split = None if split is None else tuple(split)
    key = (cfg, pp, dp, tp, sp, microbatches, schedule, virtual, recompute, zero, kept, gpus_per_node, ep,
           os.environ.get(ENV_VAR, ""), split, cp, cp_method, prefetch)
    try:
        known = _LEDGERS.get(key)
    except TypeError:  # an argument that cannot be a key (a list): run it, keep nothing
        return _dry_ledger(cfg, pp, dp, tp, sp, microbatches, schedule, virtual, recompute, zero, kept,
                           gpus_per_node, ep, split, (cp, cp_method), prefetch)
    if known is None:
        known = tuple(_dry_ledger(cfg, pp, dp, tp, sp, microbatches, schedule, virtual, recompute, zero, kept,
                                  gpus_per_node, ep, split, (cp, cp_method), prefetch))
        while len(_LEDGERS) >= _KEEP:
            del _LEDGERS[next(iter(_LEDGERS))]
        _LEDGERS[key] = known
    return list(known)


def _dry_ledger(cfg: Any, pp: int, dp: int, tp: int, sp: bool, microbatches: int, schedule: str, virtual: int,
                recompute: str, zero: int, kept: str, gpus_per_node: int, ep: int = 1,
                split: Optional[tuple] = None, contexts: tuple = (1, "ring"),
                prefetch: bool = False) -> list[StageLedger]:
    """`gpt_ledger`'s dry run; `contexts`: (cp, its method)."""
    cp, method = contexts
    import numpy as np

    if not (type(gpus_per_node) is int and gpus_per_node >= 1):
        raise SpmdsimError(f"gpus per node {gpus_per_node!r} must be an integer >= 1")
    ids = np.arange(2 * cfg.seq + 2, dtype=np.int64) % min(cfg.vocab, 128)  # token ids: a dry run reads shapes

    def body() -> StageLedger:
        with counting(blocks=True) as flops:
            trainer = train_sharded if zero == 3 and pp == microbatches == virtual == 1 and cp == 1 else \
                train_pipelined
            run, steps = trainer(cfg, world(), pp, dp, tp, 1, ids, sp=sp, schedule=schedule,
                                         microbatches=microbatches, virtual=virtual, recompute=recompute,
                                         zero=zero, kept=kept, memory=True, check=False, ep=ep, split=split,
                                         **({"prefetch": prefetch} if trainer is train_sharded else
                                            {"cp": cp, "context": Context(method) if cp > 1 else None}))
        rank = world().Get_rank()
        layer = sum(t.local.size for name, t in run.params.items() if name.startswith("h"))
        total = sum(t.local.size for t in run.params.values())
        experts = sum(t.local.size for name, t in run.params.items() if is_expert(name))
        meter = current().meter
        out = StageLedger(run.stage, rank, steps[-1].memory, layer, total, tuple(flops.counts.items()),
                          trace_transfers(run.trace, run.mesh, rank, gpus_per_node), meter.peak, run.in_flight[-1],
                          kernels=tuple(flops.kernels.items()), expert_params=experts, fresh=flops.fresh())
        run.close()
        return out

    results = simulate(pp * dp * ep * cp * tp, body, dry_run=True)
    stages: dict = {}
    for r, ledger in enumerate(results):
        stages.setdefault(ledger.stage, (ledger, []))[1].append(r)
    return [replace(ledger, ranks=tuple(ranks)) for _, (ledger, ranks) in sorted(stages.items())]


def stage_times(stages: Any, machine: Any, precision: str, pipeline: Any, overlap: Any) -> list:
    """Each stage's spmdsim.tools.estimate.steptime.StepTime from its ledger (`gpt_ledger`'s, in stage order) at
    `precision` on `pipeline` (a Pipeline, its stages those of `stages`), hiding `overlap`: what `spmdsim
    estimate` prints and spmdsim.tools.estimate.search prices."""
    return [step_time(machine, gemms_at(st.gemms, precision), transfers_at(st.transfers, precision),
                      pipeline=pipeline, overlap=overlap, traffic=kernel_bytes(st.kernels, precision), stage=k)
            for k, st in enumerate(stages)]
