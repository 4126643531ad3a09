"""The GPT's memory-saving choices and one rank's memory figures per step: pure values and their text.

`RECOMPUTE` and `ZERO` are the choices (spmdsim.models.gpt.parallel.GPT's `recompute`, the trainer's `zero`),
each with its one-line refusal; `memory_line` says a run's choices (examples/train_gpt.py's header).
`MemoryReport` is what the trainer measured on one rank at one step (spmdsim.models.gpt.train, ``memory=True``):
the bytes the autograd graph kept for backward after the forward, by kind (spmdsim.nn.autograd.kept_bytes), the
parameters, gradients, master copy, optimizer states and buffers, and the largest total of the three moments it
looked (after the forward, the backward, the step). `korthikanti_bytes` is the closed formula those measurements
are compared with (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
section 4 and table 2), at spmdsim's dtypes. `step_need` is the shape-only count of what a rank of a step holds at
least, the check before a training run (spmdsim.models.gpt.step_looks.step_memory_problem). Pure: no mpi4py; numpy
only where `step_need` asks a precision its dtypes' widths.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional
from ...base.precision import precision as policy_of
from ..axes import CONTEXT, DATA

__all__ = ["RECOMPUTE", "ZERO", "recompute_problem", "zero_problem", "shard_group_problem", "reshard_problem",
           "memory_line", "sharded_problem", "MemoryReport", "BLOCK_KINDS", "MASKS",
           "korthikanti_bytes", "per_layer_units", "StepNeed", "step_need", "check_need"]

#: Activation recomputation: none, the attention core (selective), each whole block (full).
RECOMPUTE = ("none", "selective", "full")
#: ZeRO stages: 0 (every rank holds the whole optimizer), 1 (states and master copy sharded over dp), 2 (the
#: gradients too: each rank keeps its slice of the summed gradients), 3 (the parameters too: fully sharded data
#: parallelism, spmdsim.nn.fsdp).
ZERO = (0, 1, 2, 3)
#: The suffix of a kind of kept bytes that are boolean masks ("mlp masks"): a byte each at any precision.
MASKS = " masks"
#: The kinds of kept bytes that belong to the blocks (the rest: the embedding, the head).
BLOCK_KINDS = ("layer norm", "attention", "attention core", "mlp", "block input")


def recompute_problem(value: Any, said: str = "recompute") -> Optional[str]:
    """Why `value` is not a recompute choice, or None; `said`: how the refusal names it (a flag: "--recompute")."""
    if isinstance(value, str) and value in RECOMPUTE:
        return None
    return f"{said} {value!r} is not one of {', '.join(map(repr, RECOMPUTE))}"


def zero_problem(value: Any, said: str = "zero") -> Optional[str]:
    """Why `value` is not a ZeRO stage spmdsim runs, or None (each composes with a pipeline, and ZeRO-3 with
    experts: spmdsim.nn.fsdp shards them over the ranks that hold the same experts); `said`: how the refusal
    names it (a flag: "--zero")."""
    if type(value) is int and value in ZERO:
        return None
    return (f"{said} {value!r} is not 0, 1, 2 or 3 (ZeRO-1: optimizer states and master copy sharded over dp; "
            "ZeRO-2: gradients too; ZeRO-3: parameters too)")


def shard_group_problem(value: Any, zero: Any, dp: int) -> Optional[str]:
    """Why `value` is not a shard group (HSDP: the dp ranks each parameter is sharded over, with the cp ranks
    beside them) of a run with ZeRO stage `zero` on `dp` data-parallel ranks, or None: one line."""
    if zero != 3:
        return f"--shard-group {value} shards parameters: give --zero 3 with it"
    if type(value) is not int or value < 1 or dp % value:
        return f"--shard-group {value!r} must be a positive divisor of the dp ranks ({dp})"
    return None


def reshard_problem(value: Any, zero: Any, typed: bool = True) -> Optional[str]:
    """Why `value` is not --reshard-after-forward's (true or false) in a run with ZeRO stage `zero`, or None: one
    line. `typed`: the flag was typed, and without ZeRO-3, which alone gathers parameters, it would do nothing
    (its default is not refused)."""
    if value not in ("true", "false"):
        return f"--reshard-after-forward {value!r} must be true or false"
    if typed and zero != 3:
        return f"--reshard-after-forward {value} is for ZeRO-3's gathered parameters: give --zero 3 with it"
    return None


def memory_line(args: Any, zero: int, alone: bool = False) -> str:
    """examples/train_gpt.py's header line on memory, from its flags (--recompute, --attention,
    --reshard-after-forward, --kept) and ZeRO's stage `zero` (a no-op where dp is 1: `alone`)."""
    gathered = ("each layer gathered again for its backward" if args.reshard_after_forward == "true" else
                "each layer kept gathered until its backward")
    over = f"{DATA} x {CONTEXT}" if getattr(args, "cp", 1) > 1 else DATA  # (context parallelism's ranks shard too)
    stage = {1: f"; ZeRO-1 (states and master copy sharded over {over}", 2: "; ZeRO-2 (states, master copy and "
             f"gradients sharded over {over}", 3: f"; ZeRO-3 (all sharded over {over}; {gathered}"}.get(zero, "")
    stage += (": a no-op, dp 1 shards nothing)" if alone else ")") if zero else ""
    none = " (as none: flash keeps no scores)" if (args.recompute, args.attention) == ("selective", "flash") else ""
    kept = "; Megatron's kept set" if args.kept == "megatron" else ""
    return f"memory: recompute {args.recompute}{none}{stage}{kept}"


def sharded_problem(pp: int, microbatches: int, ep: int = 1, virtual: int = 1) -> Optional[str]:
    """Why spmdsim.models.gpt.sharded_run.train_sharded (one stage, one microbatch) cannot run a fully sharded
    step as these pipeline arguments ask, or None: one line. (A pipeline's, or several microbatches', ZeRO-3 runs
    by spmdsim.models.gpt.pipeline.train_pipelined.)"""
    if pp > 1 or virtual > 1:
        return (f"--zero 3 with --pp {pp}: train_sharded runs one stage; a pipeline's fully sharded step runs by "
                "train_pipelined")
    if microbatches > 1:
        return (f"--zero 3 with {microbatches} microbatches a step: train_sharded runs one; several run by "
                "train_pipelined, or give --global-batch = --micro-batch x --dp")
    return None


@dataclass(frozen=True)
class MemoryReport:
    """One rank's bytes at one step (spmdsim.models.gpt.train's measurement; see the module docstring).

    `kept`: (kind, bytes) the graph kept for backward after the forward; `grads`: the gradients after the
    step (ZeRO-1's: its gradient buffer, which then holds the gathered parameters; ZeRO-2's: its slices of the
    summed gradients, 1/dp); `buffers`: the
    optimizer's buffers (the update's scratch and AdamW's gather buffer, one group's each; ZeRO-1's summed
    gradient slice); `peak`: the largest of the totals after the forward, after the backward and after the
    step, at `moment`; `grads_peak`: the most bytes of gradients the rank held at once, at those moments and in
    the backward: under ZeRO-1 wherever the walk has put gradients into the gradient buffer (the buffer and the
    walk's gradients not final yet), under ZeRO-2 where each bucket is reduced (its members' blocks, before
    they are freed, and every other gradient held then: the walk's, the ``.grad`` blocks, the summed slices),
    under ZeRO-0 as under ZeRO-1 (its gradient buffer, spmdsim.nn.autograd.grad_buffer) and before each bucket's
    Allreduce.
    The estimate's ledger prices `grads` (ZeRO-2's: the model states between steps) and adds
    ``grads_peak - grads`` to its peak at every ZeRO level (spmdsim.tools.estimate.ledger.backward_gradients).
    """

    step: int
    kept: tuple[tuple[str, int], ...]
    params: int
    grads: int
    master: int
    states: int
    buffers: int
    peak: int
    moment: str
    grads_peak: int = 0
    gathered: int = 0  # ZeRO-3: the most bytes of parameters gathered whole on dp held at once (spmdsim.nn.fsdp)
    gathered_kept: int = 0  # ZeRO-3: those held at the forward's end, which `kept` counts (the graph holds them)

    @property
    def kept_total(self) -> int:
        return sum(n for _, n in self.kept)

    def kept_of(self, kind: str) -> int:
        return dict(self.kept).get(kind, 0)

    def lines(self) -> list[str]:
        """The report as lines of at most 100 characters."""
        kinds = ", ".join(f"{kind} {n:,}" for kind, n in self.kept)
        out = [f"memory (rank 0, step {self.step}, bytes): kept for backward {self.kept_total:,}"]
        line = "  "
        for part in kinds.split(", "):
            if len(line) + len(part) + 2 > 100:
                out.append(line.rstrip(", ").rstrip())
                line = "  "
            line += part + ", "
        if kinds:
            out.append(line.rstrip(", "))
        out.append(f"  parameters {self.params:,}, gradients {self.grads:,}, master copy {self.master:,}")
        out.append(f"  optimizer states {self.states:,}, buffers {self.buffers:,}")
        out.append(f"  peak {self.peak:,} {self.moment}; gradients at most {self.grads_peak:,}")
        if self.gathered:
            out.append(f"  gathered parameters at most {self.gathered:,}, {self.gathered_kept:,} of them kept "
                       "for backward")
        return out


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str,
                      value_bytes: int = 2, mask_bytes: int = 1) -> tuple[float, float]:
    """(the s·b·h term, the a·s²·b term) of the bytes one layer keeps for backward on one of `t`
    tensor-parallel ranks, by Korthikanti et al.'s count (section 4.1, table 2): per layer, values
    (2 bytes each in the paper) of the two layer norms' inputs, the QKV and MLP inputs (4 s·b·h, whole
    on every rank unless `sp`), Q, K, V, the projection's input, GeLU's input and output (12 s·b·h, split
    over t), the softmax and its dropout's output (2 a·s²·b, split over t), and dropout masks (1 byte
    each): two of s·b·h (whole unless `sp`) and the attention's a·s²·b. With the defaults, t = 1:
    34 s·b·h + 5 a·s²·b. Selective recomputation drops the a·s²·b term; full keeps the layer's input
    (one value of s·b·h, split over t with `sp`). The GPT's ``kept="megatron"`` blocks keep exactly this
    at ``value_bytes=8, mask_bytes=1`` (fp64), ``value_bytes=4`` (fp32) or the defaults (bf16-mixed: the
    paper's widths), plus their layer norms' row statistics (2 x 2 numbers a row of s·b/t with `sp`, s·b
    without, each 8 bytes at fp64 and 4 under fp32 and bf16-mixed, whose statistics are float32; none with
    full recomputation): tests/test_kept_megatron.py.
    """
    shared = t if sp else 1  # what every tp rank holds whole without sp is split over t with it
    if recompute == "full":
        return value_bytes * s * b * h / shared, 0.0
    sbh = s * b * h * ((4 * value_bytes + 2 * mask_bytes) / shared + 12 * value_bytes / t)
    core = 0.0 if recompute == "selective" else a * s * s * b * (2 * value_bytes + mask_bytes) / t
    return sbh, core


def per_layer_units(kept: dict[str, int], layers: int, s: int, b: int, h: int, a: int) -> tuple[float, float]:
    """One layer's kept bytes in Korthikanti et al.'s units: (bytes of every block kind but the attention
    core / (s·b·h), the attention core's / (a·s²·b)), from measured `kept` bytes (kind -> bytes)."""
    rest = sum(n for kind, n in kept.items() if kind in BLOCK_KINDS and kind != "attention core")
    return rest / layers / (s * b * h), kept.get("attention core", 0) / layers / (a * s * s * b)


@dataclass(frozen=True)
class StepNeed:
    """A shape-only count of the bytes one rank of the GPT's training step holds at least at its peak
    (`step_need`): `nbytes` in all, at `moment` ("in the forward": the attention cores' scores and the
    activations kept for backward beside the parameters; or "at the step's end": the parameters, their
    gradients and the optimizer's master copy and states). `attention`: the attention cores' bytes then (the
    kept probabilities of the layers before, and for a moment two blocks of scores); `activations`: the other
    activations kept for backward then; `states`: the model states then. `block`: the bytes of one layer's
    attention scores on the rank, of shape `shape` (local batch, local heads, seq, seq) at `width` bytes an
    element."""

    nbytes: int
    moment: str
    attention: int
    activations: int
    states: int
    block: int
    shape: tuple[int, int, int, int]
    width: int

    def words(self) -> str:
        """ "4 sequences x 1 head x 100,000 x 100,000 at 8 bytes": one layer's scores on the rank (no size)."""
        b, h, s, _ = self.shape
        heads = "1 head" if h == 1 else f"{h:,} heads"
        return f"{b:,} sequences x {heads} x {s:,} x {s:,} at {self.width} bytes"


def step_need(cfg: Any, dp: int, tp: int, *, ep: int = 1, pp: int = 1, microbatches: int = 1,
              recompute: str = "none", sp: bool = False, kept: str = "graph", zero: int = 0,
              precision: Any = "fp64", cp: int = 1) -> StepNeed:
    """The bytes one rank of a (pp, dp, ep, tp) mesh holds at least at its training step's peak: a shape-only
    count, no array made, a few dozen operations (the pre-check before a run: spmdsim.models.gpt.train's
    `step_memory_problem`). `precision`: a policy or its name (spmdsim.base.precision); every width is the policy's
    own dtype's itemsize (`Precision.dtype`).

    The larger of two moments, each counting only what the step surely holds then:
    - in the forward, at its end or at the last layer's softmax: the rank's share of the transformer layers'
      weight matrices (and, on one stage, the token embedding) at the parameters' width, and one microbatch's
      activations kept for backward by at least Megatron's kept set (Korthikanti et al., `korthikanti_bytes`:
      two layer norms' inputs, the QKV and MLP inputs, whole on every tp rank unless `sp`, Q, K, V, the
      projection's input, GeLU's input and output split over tp (with Llama's options, GPTConfig: K and V of
      kv_heads, and two of the MLP's hidden width), a dropout mask each for the attention's and
      the MLP's output; an MoE layer's MLP part left out; `kept` "graph" keeps dropout's factors as values, not
      one-byte masks) in each of the stage's layers; the attention core of each layer before the last keeps
      its probabilities (with dropout, their dropped-out values and the mask too; none with recomputation),
      and the last layer's softmax holds its scores and probabilities at once (2 blocks of (local batch,
      local heads, seq, seq)); with flash attention (cfg.attention) no core keeps or holds a block of scores;
    - at the step's end: the weights, their gradients at the gradients' width, and AdamW's two moments (and
      under a mixed precision the master copy) at theirs; with ZeRO-1 the gradients, moments and master copy
      counted as slices over dp x ep.
    At the forward's end (one stage) the head's logits too. Replicated vectors (biases, layer norms), buffers, the
    positions, what the optimizer allocates and the pipeline's other microbatches in flight are left out, and a
    stage is counted with layers // pp layers; with `cp` a rank's share of the sequence, no scores kept: a lower
    bound of the dry run's peak
    (spmdsim.tools.estimate.ledger.stage_memory: `spmdsim estimate`), so a run refused by it cannot fit."""
    if cp > 1:  # a rank's seq / cp tokens; the ring keeps no scores (as flash), the others' at least no fewer
        cfg = replace(cfg, seq=max(1, cfg.seq // cp), attention="flash")
    policy = policy_of(precision)
    width = policy.dtype("activation").itemsize
    mask = width if kept == "graph" else 1  # the graph keeps dropout's factors, Megatron a byte each
    b = max(1, cfg.batch // (dp * ep * max(1, microbatches)))
    h = max(1, cfg.heads // tp)
    s, d = cfg.seq, cfg.d_model
    elements = b * h * s * s
    block = elements * width
    layers = max(1, cfg.layers // max(1, pp))
    shared = tp if sp else 1  # what every tp rank holds whole without sp is split over tp with it
    flash = getattr(cfg, "attention", "unfused") == "flash"  # the core keeps no scores, holds a tile's at most
    per_layer = _per_layer(cfg, b, ep, tp, width, mask, shared, recompute, flash)
    if pp > 1:  # a stage's layers: as many as the fewest of each kind a layer holds
        least = tuple(min(x[i] for x in per_layer) for i in range(3))
        weights, other, core = (n * layers for n in least)
        last = least
    else:
        weights, other, core = (sum(x[i] for x in per_layer) for i in range(3))
        # the token embedding, split over tp (the head tied to it, or its own: GPTConfig.tied)
        weights += (1 if cfg.tied else 2) * cfg.padded_vocab * d // tp
        last = per_layer[-1]
    params = weights * policy.dtype("param").itemsize
    # In the forward: at its end every layer's kept set; at the last layer's softmax the layers' before and,
    # for a moment, its scores and probabilities.
    # at its end the head's logits too (batch, seq, vocab / tp; a pipeline's stage may not hold the head)
    logits = b * s * cfg.padded_vocab // tp * width if pp == 1 else 0
    ends, softmax = (other + logits, core), (other - last[1], core - last[2] + (0 if flash else 2 * block))
    kept_then = max(ends, softmax, key=sum)
    forward = params + sum(kept_then)
    shards = dp * ep if zero else 1
    states = (weights * policy.dtype("grad").itemsize // shards  # ZeRO-1's reduced slices at the least
              + 2 * weights * policy.dtype("optimizer").itemsize // shards
              + (weights * policy.dtype("master").itemsize // shards if policy.master else 0))
    end = params + states
    if forward >= end:
        return StepNeed(forward, "in the forward", kept_then[1], kept_then[0], params, block, (b, h, s, s), width)
    return StepNeed(end, "at the step's end", 0, 0, end, block, (b, h, s, s), width)


def check_need(cfg: Any, precision: Any = "fp64") -> int:
    """The bytes the check's one numpy process holds at least (spmdsim.models.gpt.checker: the reference step of the
    whole model, unsplit and unpadded): every weight matrix and the token embedding (and an untied head) at the
    parameters' width, their gradients and AdamW's two moments (and a master copy) at theirs; no activation, no
    table of the ranks' blocks. Shape-only (`step_need`'s count at one rank)."""
    policy = policy_of(precision)
    weights = (sum(x[0] for x in _per_layer(cfg, 1, 1, 1, 1, 1, 1, "full", True))
               + (1 if cfg.tied else 2) * cfg.vocab * cfg.d_model)
    widths = (policy.dtype("param").itemsize + policy.dtype("grad").itemsize + 2 * policy.dtype("optimizer").itemsize
              + (policy.dtype("master").itemsize if policy.master else 0))
    return weights * widths


def _per_layer(cfg: Any, b: int, ep: int, tp: int, width: int, mask: int, shared: int, recompute: str,
               flash: bool) -> list:
    """(weight elements, other activations kept, attention core kept) of each layer on the rank (`step_need`'s):
    `b` the microbatch's local sequences, `mask` a dropout mask's bytes per element, `shared` what divides the
    activations held whole on every tp rank (tp with sp, else 1)."""
    s, d, moe = cfg.seq, cfg.d_model, cfg.moe
    elements = b * max(1, cfg.heads // tp) * s * s
    sbh = s * b * d
    drop = 1 if cfg.dropout else 0
    per_layer = []
    for layer in range(cfg.layers):
        # Q and the projection, K and V (kv_heads of them), the MLP's (or each local expert's) 2 (SwiGLU: 3)
        # matrices
        kvd = cfg.kv * cfg.head_dim
        mats = cfg.mlp_matrices
        if moe is not None and cfg.is_moe(layer):
            weights = cfg.attention_weights + max(1, moe.experts // ep) * mats * d * cfg.expert_hidden
            whole, masks, split = 3, drop, 4
        else:
            weights = cfg.attention_weights + mats * d * cfg.hidden
            whole, masks, split = 4, 2 * drop, 2 * d + 2 * kvd + 2 * cfg.hidden  # split: per token, not per d
        if recompute == "full":  # each layer keeps its input alone
            other = sbh * width // shared
        elif moe is not None and cfg.is_moe(layer):
            other = sbh * (whole * width + masks * mask) // shared + sbh * split * width // tp
        else:
            other = sbh * (whole * width + masks * mask) // shared + s * b * split * width // tp
        core = elements * (2 * width + mask if drop else width) if recompute == "none" and not flash else 0
        per_layer.append((weights // tp, other, core))
    return per_layer
