"""What one rank of a stage holds at a training precision, from its dry run's ledger (spmdsim.tools.estimate.ledger):
the precisions' widths, the bytes by role, the gradients its backward holds beyond them, the largest transient
blocks and the peak.

The program runs in float64. `PRECISIONS` prices the same elements at a training precision's widths
(bf16 mixed precision: 2-byte parameters and activations, 4-byte main gradients, master copy and
Adam moments, as Megatron keeps them); a mixed precision keeps a master copy of every element a rank
updates, which a float64 run has no need for: `priced` names it. Blocks of a byte at any precision are
counted at their own width: dropout's boolean masks and, under "fp8", the e4m3 copies of the linear layers'
inputs and weights the graph keeps for backward (the kinds spmdsim.nn.autograd.kept_bytes names with the
suffix " fp8"); the FP8 scales and amax histories are the program's float32 tables as it holds them
(StageLedger.scales). The gradients `priced` names are those the rank keeps after the step (ZeRO-0's and
ZeRO-1's whole, in ZeRO-1's gradient buffer; ZeRO-2's the rank's slices, the model states the ZeRO paper
compares); at every ZeRO level the most gradients the rank holds at once is the run's measured
MemoryReport.grads_peak, whose excess over them the peak adds (`backward_gradients`, `StageMemory`): one
rule, what the program holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...base.sizes import format_size
from ...errors import SpmdsimError
from ...models.gpt.memory import BLOCK_KINDS, MASKS
from ...nn.autograd.kept import FP8
from .machine import precision_peak_refusal

__all__ = ["Widths", "PRECISIONS", "ROLES", "priced", "least_bytes", "unmappable", "layers_activations",
           "own_width", "Transient", "largest_transient", "backward_gradients", "StageMemory", "stage_memory",
           "peak_bytes", "peak_refusal"]

#: What a rank holds, by role, in the order the ledger prints them.
ROLES = ("parameters", "gradients", "master copy", "optimizer states", "buffers", "activations", "fp8 scales")


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
    fp8: bool = False  # the linear layers' products in FP8 (their operands' copies and scales the program's)


PRECISIONS = {
    "fp64": Widths("fp64", 8, 8, 8, 8, 8, 8, False, "fp64", "as the program runs: every value float64"),
    "bf16-mixed": Widths("bf16-mixed", 2, 4, 4, 4, 4, 2, True, "bf16",
                         "Megatron's bf16: bf16 parameters and activations; fp32 main gradients, master copy "
                         "and Adam moments"),
    "fp16-mixed": Widths("fp16-mixed", 2, 2, 4, 4, 2, 2, True, "fp16",
                         "ZeRO's fp16 mixed precision: fp16 parameters, gradients and activations; fp32 "
                         "master copy, momentum and variance"),
    "fp8": Widths("fp8", 2, 4, 4, 4, 4, 2, True, "bf16",
                  "bf16-mixed with TransformerEngine's FP8 linear layers: their products at the fp8 peak, e4m3 "
                  "and e5m2 operands a byte each; their FP8 copies and scales as the program holds them", True),
}

#: What `--precision` of the estimate and the search says of a precision the trainer runs but no ledger prices.
TRAINED_ONLY = {
    "fp32": "fp32 trains (examples/train_gpt.py --precision fp32) but is not priced: fp64 prices 8-byte values, "
            "bf16-mixed Megatron's recipe",
    "fp8-current": "fp8-current trains (examples/train_gpt.py --precision fp8-current) but is not priced: fp8 prices "
                   "TransformerEngine's FP8 linear layers under delayed scaling",
}

_RUN = 8  # the program's bytes per element (float64)


def peak_refusal(machine: Any, precision: str) -> None:
    """SpmdsimError, before any dry run, where `machine` (spmdsim.tools.estimate.machine) has no peak for a dtype
    `precision`'s products run at (its FP8 products' and the others', `Widths.compute`), naming the precisions
    the machine's file does price."""
    others = tuple(sorted((name for name, w in PRECISIONS.items()
                           if name != precision and all(d in machine.dtypes for d in _product_dtypes(w))),
                          key=lambda name: not PRECISIONS[name].mixed))  # a mixed precision first
    precision_peak_refusal(machine, precision, _product_dtypes(PRECISIONS[precision]), others)


def _product_dtypes(w: Widths) -> tuple[str, ...]:
    """The dtypes whose peaks price the products under `w`: fp8's FP8 products first, then the rest's."""
    return (("fp8",) if w.fp8 else ()) + (w.compute,)


def priced(stage: Any, precision: str, zero: int) -> dict:
    """{role: bytes} of one rank of `stage` under `precision` (PRECISIONS), from its elements in the run: what it
    holds after the step (ZeRO-2's gradients its slices; `backward_gradients` what its step holds beyond them)
    and the activations at the moment the schedule held the most; under "fp8" also "fp8 scales", the scales and
    amax histories the run holds (the ROLES after "activations")."""
    w = PRECISIONS[precision]
    m = stage.memory
    params = m.params // _RUN
    master = m.master // _RUN if zero in (1, 2) else (params if w.mixed else 0)  # ZeRO-3's: its shards' copy
    own = sum(n for kind, n in m.kept if own_width(kind))  # masks, FP8 copies: a byte each at any precision
    values = m.kept_total - own
    out = {"parameters": params * w.params, "gradients": m.grads // _RUN * w.grads,
           "master copy": master * w.master, "optimizer states": m.states // _RUN * w.states,
           "buffers": m.buffers // _RUN * w.buffers, "activations": values // _RUN * w.activations + own}
    return {**out, "fp8 scales": stage.scales} if w.fp8 else out


def own_width(kind: str) -> bool:
    """Whether the kept bytes of `kind` are priced at their own width: boolean masks, FP8 copies."""
    return kind.endswith((MASKS, FP8))


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


def layers_activations(stage: Any, precision: str) -> int:
    """The bytes the transformer blocks keep for backward (spmdsim.models.gpt.memory.BLOCK_KINDS, their masks and
    FP8 copies; not the embedding's nor the head's) on one rank of `stage`, priced at `precision`."""
    w = PRECISIONS[precision]
    out = 0
    for kind, n in stage.memory.kept:
        if own_width(kind) and kind.rsplit(" ", 1)[0] in BLOCK_KINDS:
            out += n
        elif kind in BLOCK_KINDS:
            out += n // _RUN * w.activations
    return out


@dataclass(frozen=True)
class Transient:
    """The most bytes one kernel or matrix product of a stage's step reads and writes at once beyond what the rank
    holds anyway, at a precision's widths (`largest_transient`): blocks live together for a moment, beside the
    memory line. `what` names it: the operator and phase (a Kernel's), or the product's shape (a Gemm's)."""

    nbytes: int
    what: str


def largest_transient(stage: Any, precision: str) -> Transient:
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


def backward_gradients(stage: Any, precision: str, zero: int) -> int:
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


def stage_memory(stage: Any, precision: str, zero: int) -> StageMemory:
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
