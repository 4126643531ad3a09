"""Choose a GPT's parallel configuration by predicted step time under a memory limit (docs/estimate.md).

`search(cfg, devices, machine, memory_limit)` enumerates every configuration the training step runs
on `devices` ranks: tensor parallel tp (dividing the heads and the vocabulary, within a node),
pipeline stages pp and virtual stages v (pp * v dividing the layers), data parallel dp = devices /
(tp * pp) (dividing the global batch), microbatches m (a microbatch of batch / m samples divisible
by dp; m divisible by pp for the interleaved schedule), recomputation none / selective / full, ZeRO
0 / 1 / 2 (1 and 2 only with dp > 1) and sequence parallelism (with tp > 1). With MoE layers (cfg.moe) also the
expert-parallel ranks ep of each stage (dividing the experts; dp = devices / (tp * pp * ep), the dense
layers' batch split over dp x ep). Each is priced by the ledger of
its own dry run (spmdsim.tools.estimate.ledger.gpt_ledger: its memory at the precision's widths, and its peak
with ZeRO-2's gradients its backward holds beyond the slices and the largest kernel's transient blocks, which the memory limit bounds as `spmdsim estimate`'s verdict
bounds it by the GPU's memory, spmdsim.tools.estimate.ledger.peak_bytes; and its predicted step time on the
machine, the slowest stage's, as `spmdsim estimate` prints them).

Lower bounds only prune, never choose (branch and bound; a bound of the memory a rank holds is one of its
peak too): closed forms first (the model states of a
rank's transformer layers, with ZeRO-1's summed gradient slice or ZeRO-2's gradient slices, over the memory limit
drops a configuration; the
program's GEMM FLOPs without recomputation, 72 B s l h^2 (1 + s / 6h), spread over the devices at the
machine's capped peak, with the pipeline's bubble, orders the rest), then the layer cells of
spmdsim.tools.estimate.bounds (a dense and an MoE layer's rows from four or six small dry runs, shared by every
configuration with the same tp, sp, micro-batch, recomputation and ep; with MoE layers only with
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

import functools
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ...errors import SpmdsimError
from ...base.sizes import UnmappableError

__all__ = ["Config", "Candidate", "SearchResult", "configurations", "lower_bounds", "flops_bound",
           "comm_bounds", "stage_elements", "model_states", "price", "search", "MAX_CONFIGS", "FIXABLE",
           "parse_fixed", "fixed_configurations"]

#: Most configurations a search enumerates before it refuses (the enumeration alone is cheap).
MAX_CONFIGS = 200_000

RECOMPUTE = ("none", "selective", "full")
#: The ZeRO stages searched (spmdsim.models.gpt.memory.ZERO): 1 and 2 only with more than one data-parallel rank.
ZERO = (0, 1, 2)


@dataclass(frozen=True)
class Config:
    """One way to train the GPT: the mesh, the schedule, recomputation, ZeRO and sequence parallelism."""

    tp: int
    pp: int
    dp: int
    sp: bool
    microbatches: int
    virtual: int
    recompute: str
    zero: int
    ep: int = 1  # expert-parallel ranks of a stage (a GPT with MoE layers; the dense layers' batch: dp x ep)
    # layers per chunk in pipeline order (spmdsim.models.gpt.stages.chunk_parts; `spmdsim estimate --stage-layers`); None,
    # as the search makes every configuration: balanced
    split: Optional[tuple] = None

    @property
    def schedule(self) -> str:
        return "interleaved" if self.virtual > 1 else "1f1b"

    def short(self) -> str:
        return (f"tp {self.tp}{' sp' if self.sp else ''}, pp {self.pp}" + (f" v {self.virtual}" if self.virtual > 1
                else "") + f", dp {self.dp}" + (f", ep {self.ep}" if self.ep > 1 else "")
                + f", {self.microbatches} mb, {self.recompute}, ZeRO {self.zero}")


@dataclass(frozen=True)
class Candidate:
    """A configuration, its lower bounds and, when a dry run priced it, its step time, the memory its fullest rank
    holds (`memory`: `spmdsim estimate`'s memory line) and the most any rank needs at its peak (`peak`: with
    the largest kernel's transient blocks, spmdsim.tools.estimate.ledger.peak_bytes), which the memory limit bounds.

    verdict: "chosen"; "slower" (priced, fits, slower than the chosen); "over the memory limit"
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
    """What `search` found: the candidates, priced first (by time), then the others; the chosen or None."""

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


def vocab_note(cfg: Any, devices: int, gpus_per_node: int) -> str:
    """A line naming the tensor-parallel sizes the vocabulary alone leaves out (each divides the devices and the
    heads within a node, not the embedding's rows), with the padding that lets them in; "" when none is."""
    lost = [tp for tp in _tensor_parallel(cfg, devices, gpus_per_node) if cfg.padded_vocab % tp]
    if not lost:
        return ""
    pad = 128 * math.lcm(*lost)  # Megatron pads to a multiple of 128 x tp: one for every tp left out
    return (f"tp {', '.join(map(str, lost))} left out: they do not divide vocab {cfg.vocab_words} (the embedding is "
            f"split over tp); pad it, e.g. vocab_pad_to={pad} (Megatron pads to 128 x tp)")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tensor_parallel(cfg: Any, devices: int, gpus_per_node: int) -> list[int]:
    """The tp sizes that divide the devices and the heads within a node (the vocabulary aside); the key/value
    heads and the MLP's hidden width too, where Llama's options (GPTConfig kv_heads, ffn) make them differ."""
    return [tp for tp in _divisors(devices) if tp <= gpus_per_node and not cfg.heads % tp and not cfg.kv % tp
            and not cfg.hidden % tp]


def configurations(cfg: Any, devices: int, gpus_per_node: int) -> list[Config]:
    """Every configuration of the module docstring for `cfg` (a GPTConfig, batch = the global batch)."""
    from ...models.gpt.pipeline import pipeline_layout_problem
    from ...programs.pipeline.records import MAX_PAIRS

    out: list[Config] = []
    for tp in _tensor_parallel(cfg, devices, gpus_per_node):
        if cfg.padded_vocab % tp:
            continue
        for pp, ep in itertools.product(_divisors(devices // tp), _eps(cfg, devices // tp)):
            if (devices // tp) % (pp * ep):
                continue
            dp = devices // (tp * pp * ep)
            data = dp * ep  # the dense layers' batch is split over dp x ep
            if cfg.layers % pp or cfg.batch % data:
                continue
            virtuals = [1] + ([v for v in _divisors(cfg.layers // pp) if v > 1] if pp > 1 else [])
            for m, v in itertools.product(_divisors(cfg.batch // data), virtuals):
                if (v > 1 and m % pp) or pp * m * v > MAX_PAIRS:  # more pairs than a schedule runs
                    continue
                for sp, recompute, zero in itertools.product((False, True), RECOMPUTE, ZERO):
                    if (sp and (tp == 1 or cfg.seq % tp)) or (zero and data == 1):
                        continue
                    if pipeline_layout_problem(cfg, pp, dp, tp, sp, m, v, ep=ep) is not None:
                        continue
                    out.append(Config(tp, pp, dp, sp, m, v, recompute, zero, ep))
                    if len(out) > MAX_CONFIGS:
                        raise SpmdsimError(f"more than {MAX_CONFIGS:,} configurations of the GPT on {devices:,} "
                                           "devices; expected fewer: a smaller global batch or fewer layers")
    return out


#: The degrees `--fix NAME=VALUE` holds (the names of the search's table) and the Config field of each.
FIXABLE = {"tp": "tp", "pp": "pp", "v": "virtual", "dp": "dp", "ep": "ep", "mb": "microbatches",
           "recompute": "recompute", "zero": "zero", "sp": "sp"}


def parse_fixed(items: Any) -> dict[str, Any]:
    """{Config field: value} of `--fix NAME=VALUE` items (NAME among FIXABLE), each checked; one line otherwise."""
    names = ", ".join(FIXABLE)
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for item in items:
        name, sep, text = str(item).partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name or not text:
            raise SpmdsimError(f"--fix {item!r} must read DEGREE=VALUE with --machine, e.g. 'tp=8' (DEGREE one of "
                               f"{names})")
        if name not in FIXABLE:
            raise SpmdsimError(f"--fix {name}={text} holds an operator's strategy; with --machine --fix holds a "
                               f"degree of the configuration, one of {names} (e.g. --fix tp=8)")
        if name == "recompute":
            if text not in RECOMPUTE:
                raise SpmdsimError(f"--fix recompute={text} must be one of {', '.join(RECOMPUTE)}")
            value: Any = text
        elif name in ("zero", "sp"):
            can = ("0", "1", "2") if name == "zero" else ("0", "1")  # ZERO; sp off or on
            if text not in can:
                raise SpmdsimError(f"--fix {name}={text} must be {', '.join(can[:-1])} or {can[-1]}")
            value = bool(int(text)) if name == "sp" else int(text)
        else:
            try:
                value = int(text)
            except ValueError:
                value = 0
            if value < 1 or str(value) != text.lstrip("+"):
                raise SpmdsimError(f"--fix {name}={text} must be an integer >= 1")
        field_ = FIXABLE[name]
        if field_ in out and out[field_] != value:
            raise SpmdsimError(f"--fix {name}={given[field_]} and --fix {name}={text} hold {name} two ways; give one")
        out[field_], given[field_] = value, text
    return out


def _shown(field_: str, value: Any) -> str:
    """A fixed value as `--fix` spells it (sp 1, not True)."""
    name = next(n for n, f in FIXABLE.items() if f == field_)
    return f"{name}={int(value) if isinstance(value, bool) else value}"


def fixed_configurations(configs: list[Config], fixed: Any, devices: int) -> list[Config]:
    """The configurations among `configs` with every degree of `fixed` ({Config field: value}, parse_fixed);
    one line naming the first degree that leaves none and the values it can take (with the degrees before it)."""
    done: list[str] = []
    for field_, value in (fixed or {}).items():
        if field_ not in FIXABLE.values():
            raise SpmdsimError(f"fixed degree {field_!r} is unknown; expected one of {tuple(FIXABLE.values())!r}")
        left = [c for c in configs if getattr(c, field_) == value]
        if not left:
            name = _shown(field_, value).split("=")[0]
            can = sorted({getattr(c, field_) for c in configs},
                         key=lambda v: RECOMPUTE.index(v) if isinstance(v, str) else int(v))
            values = ", ".join(_shown(field_, v).split("=")[1] for v in can)
            beside = f" with --fix {', '.join(done)}" if done else ""
            raise SpmdsimError(f"--fix {_shown(field_, value)} leaves no configuration of the GPT on {devices:,} "
                               f"devices{beside}; {name} can be {values}")
        configs = left
        done.append(_shown(field_, value))
    return configs


def _eps(cfg: Any, ranks: int) -> list[int]:
    """The expert-parallel sizes to try: the divisors of `ranks` that divide the experts (1 without MoE)."""
    if cfg.moe is None:
        return [1]
    return [e for e in _divisors(ranks) if cfg.moe.experts % e == 0]


def _layer_elements(cfg: Any) -> int:
    from ...models.gpt.params import param_specs

    return sum(math.prod(s.shape) for s in param_specs(cfg) if s.name.startswith("h0."))


@functools.lru_cache(maxsize=16)
def _layer_sizes(cfg: Any) -> tuple[tuple[int, bool], ...]:
    """(elements, whether an MoE expert's) of each transformer layer's parameter of `cfg` (a search asks for
    every configuration)."""
    from ...models.gpt.params import is_expert, param_specs

    return tuple((math.prod(s.shape), is_expert(s.name)) for s in param_specs(cfg) if s.name.startswith("h"))


def _moe_elements(cfg: Any, tp: int, ep: int) -> tuple[int, int]:
    """Elements of every transformer layer's parameters one rank holds at least, with MoE layers: (the rest of
    each layer's over tp, its experts' over ep x tp)."""
    dense = experts = 0
    for n, expert in _layer_sizes(cfg):
        if expert:
            experts += n // (ep * tp)
        else:
            dense += n // tp
    return dense, experts


def lower_bounds(cfg: Any, c: Config, machine: Any, precision: str, devices: int,
                 layer_elements: Optional[int] = None) -> tuple[float, int]:
    """(seconds, bytes) no priced step time and peak memory of `c` can be below (the module docstring)."""
    return _bounds(cfg, c, machine, precision, devices, layer_elements)[:2]


def _bounds(cfg: Any, c: Config, machine: Any, precision: str, devices: int,
            layer_elements: Optional[int] = None) -> tuple[float, int, float]:
    """`lower_bounds`, and the seconds of the gradient sums within them (the layer cells' bound adds them)."""
    from .ledger import PRECISIONS

    w = PRECISIONS[precision]
    dense, experts = stage_elements(cfg, c, layer_elements)
    states = model_states(c, precision, dense + experts)
    per_rank = flops_bound(cfg) / devices / (machine.peak(w.compute) * machine.gemm_efficiency.max_fraction)
    bubble = (c.pp - 1) / (c.virtual * c.microbatches)
    # A step's time is compute + element-wise + communication - what the backward hides of the gradient sums
    # (no more than those sums, nor than the compute) + the bubble: at least the exchanges + the larger of the
    # products' time and the gradient sums' + the bubble of the products (spmdsim.tools.estimate.steptime).
    exchanges, sums = comm_bounds(cfg, c, machine, precision, dense, experts)
    return exchanges + max(per_rank, sums) + per_rank * bubble, int(states), sums


def model_states(c: Config, precision: str, elements: int) -> int:
    """Bytes of the model states a rank of `c` holds at least for `elements` transformer-layer parameter
    elements it holds: parameters and gradients, and the master copy and Adam's moments (over dp x ep under
    ZeRO-1, with its buffer: the summed gradients' dp-th slice; its flat buffer is the gradients'; under
    ZeRO-2 the gradients too are that slice alone, at the gradients' width, and the buckets' shared flat buffer,
    at most one bucket, is left out), at the precision's widths: a bound of the memory line, so of the peak too
    (which adds the gradients the step measurably holds beyond the line's: ZeRO-2's beyond the slices)."""
    from .ledger import PRECISIONS

    w = PRECISIONS[precision]
    sharded = (w.master if (w.mixed or c.zero) else 0) + 2 * w.states + (w.grads if c.zero == 2 else 0)
    shards = c.dp * c.ep  # ZeRO shards the dense layers' states over dp x ep (the experts' over dp: more)
    whole = w.params + (w.grads if c.zero != 2 else 0)
    states = elements * whole + elements * sharded // (shards if c.zero else 1)
    if c.zero == 1:  # ZeRO-1's buffer (spmdsim.nn.distrib_optim): the Reduce_scatter's slice of the summed gradients
        states += elements * w.buffers // shards
    return states


def stage_elements(cfg: Any, c: Config, layer_elements: Optional[int] = None) -> tuple[int, int]:
    """(elements of the transformer layers' parameters, of them the MoE experts') the busiest rank of `c` holds
    at least: its stage's layers' share over tp (with MoE layers, the mean of every layer's share, the experts'
    over ep x tp); the embeddings left out. `layer_elements`: a dense layer's, when known."""
    if cfg.moe is None:
        per_layer = _layer_elements(cfg) if layer_elements is None else layer_elements
        return cfg.layers // c.pp * per_layer // c.tp, 0
    dense, experts = _moe_elements(cfg, c.tp, c.ep)
    return dense // c.pp, experts // c.pp


def comm_bounds(cfg: Any, c: Config, machine: Any, precision: str, dense: int,
                experts: int) -> tuple[float, float]:
    """(seconds, seconds) of the GPT's communication the busiest rank of `c` spends at least, by the machine's
    link model of each transfer (spmdsim.tools.estimate.steptime): the layers' and the pipeline's, and the gradient
    sums. The layers': with MoE layers the experts' exchanges (with a capacity, forward and backward, 4
    Alltoalls over ep a layer and microbatch, of the whole send buffer, k s c / E slots per expert and
    sequence, at the activation width; the mean of the stages' MoE layers; dropless none counted: their bytes
    follow the routing), each attention's tensor-parallel collectives, two messages of each microbatch
    between stages (its activations forward, their gradient backward). The gradient sums, at the gradient
    width, of the `dense` parameter elements over dp x ep and the `experts`' over dp (an Allreduce each;
    ZeRO-1 and ZeRO-2 a Reduce_scatter and an Allgather), in one call each (buckets only add latency). Each on the link
    of its group (`levels`)."""
    from .ledger import PRECISIONS
    from .records import LEVELS
    from .steptime import level_model, link_seconds

    w, m, gpn = PRECISIONS[precision], cfg.moe, machine.gpus_per_node
    models = {level: level_model(machine, level) for level in LEVELS}

    def levels(stride: int, group: int) -> tuple:
        """The links a group of `group` ranks `stride` apart can take (ranks tp fastest, then ep, dp, pp, as
        the ledger places them): across nodes when its first and last members are a node or more apart,
        within one when its aligned span divides a node, either otherwise (the cheaper bounds it)."""
        if (group - 1) * stride >= gpn:
            return ("cluster",)
        return ("node",) if gpn % (stride * group) == 0 else LEVELS

    def cheapest(stride: int, op: str, group: int, nbytes: float) -> float:
        return min(link_seconds(models[level], op, group, int(nbytes)) for level in levels(stride, group))

    sequences = cfg.batch // (c.dp * c.ep * c.microbatches)  # a rank's share of one microbatch
    exchanges = 0.0
    if m is not None and c.ep > 1 and not m.dropless:
        buffer = sequences * m.experts * m.capacity(cfg.seq) * cfg.d_model * w.activations
        layers = sum(cfg.is_moe(i) for i in range(cfg.layers)) / c.pp
        exchanges = 4 * c.microbatches * layers * cheapest(c.tp, "alltoall", c.ep, buffer)
    # Each block's attention over tp, forward and backward (its MLP's, dense or MoE, left out): with sequence
    # parallelism an Allgather of its input and a Reduce_scatter of its output, and their conjugates; without,
    # an Allreduce of its output and one of its input's gradient; on the microbatch's activations whole.
    activations = sequences * cfg.seq * cfg.d_model * w.activations
    if c.tp > 1:
        ops = ("allgather", "reduce_scatter") if c.sp else ("allreduce",)
        exchanges += 2 * c.microbatches * cfg.layers / c.pp * sum(cheapest(1, op, c.tp, activations)
                                                                  for op in ops)
    # A stage boundary: each microbatch's activations (a sequence shard with sp) cross it forward and their
    # gradient backward, so every stage sends or receives at least two messages a microbatch (the first
    # stage sends the activations and receives their gradients, the last receives and sends; the ledger
    # prices a receive as a send).
    if c.pp > 1:
        stage = c.tp * c.ep * c.dp  # ranks apart from the next stage's
        exchanges += 2 * c.microbatches * cheapest(stage, "send", 2, activations // (c.tp if c.sp else 1))
    sums = 0.0
    for stride, group, elements in ((c.tp, c.dp * c.ep, dense), (c.tp * c.ep, c.dp, experts)):
        if group > 1 and elements:
            n = elements * w.grads
            sums += (cheapest(stride, "reduce_scatter", group, n) + cheapest(stride, "allgather", group, n)
                     if c.zero else cheapest(stride, "allreduce", group, n))
    return exchanges, sums


def flops_bound(cfg: Any) -> float:
    """The matrix products' FLOPs of one training step of `cfg` (all ranks, no recomputation) that any
    configuration executes at least: 72 B s h^2 (1 + s / 6h) a dense layer (with Llama's options, its own
    weights'), forward and backward (the vocabulary's products left out); an MoE layer its attention's
    (24 B s h^2 + 12 B s^2 h by default; with grouped-query attention its own weights') and its experts' two
    (SwiGLU three) products, forward and backward, 12 (18) x rows x h x F, on at least s min(k c, E) rows a sequence (the capacity's E
    min(s, ceil(k s c / E)) slots travel and are multiplied, empty or not; dropless, every one of the k s
    assignments), the routers' products left out."""
    b, s, h, layers = cfg.batch, cfg.seq, cfg.d_model, cfg.layers
    moe_layers = sum(cfg.is_moe(i) for i in range(layers))
    # Llama's options (GPTConfig): Q and the projection h^2 each, K and V h x kv_heads x head_dim, the MLP's 2 (SwiGLU
    # 3) matrices h x ffn; 2 FLOPs a multiply-add, 3 passes (forward and backward's two): 72 B s h^2 by default.
    attention, matrices = cfg.attention_weights, cfg.mlp_matrices
    flops = (layers - moe_layers) * (6 * b * s * (attention + matrices * h * cfg.hidden) + 12 * b * s * s * h)
    if moe_layers:
        m = cfg.moe
        rows = b * s * (m.top_k if m.dropless else min(m.top_k * m.capacity_factor, m.experts))
        flops += moe_layers * (6 * b * s * attention + 12 * b * s * s * h
                               + 6 * matrices * rows * h * cfg.expert_hidden)
    return flops


def price(cfg: Any, c: Config, machine: Any, precision: str, kept: str) -> tuple[float, int, int]:
    """(predicted step seconds, bytes held, peak bytes) of `c` from its dry run: the slowest stage's time, the
    largest stage's memory and the largest stage's peak (transient blocks included: what `spmdsim estimate`'s
    fit verdict compares with the GPU's memory, spmdsim.tools.estimate.ledger.peak_bytes) at `precision`, as
    `spmdsim estimate` prints them."""
    from .ledger import gpt_ledger, peak_bytes, stage_memory, stage_times
    from .steptime import Pipeline

    stages = gpt_ledger(cfg, c.pp, c.dp, c.tp, sp=c.sp, microbatches=c.microbatches, schedule=c.schedule,
                        virtual=c.virtual, recompute=c.recompute, zero=c.zero, kept=kept,
                        gpus_per_node=machine.gpus_per_node, ep=c.ep, split=c.split)
    pipeline = Pipeline(c.pp, c.microbatches, c.virtual, c.schedule)
    seconds = max(t.total_s for t in stage_times(stages, machine, precision, pipeline, ("gradients",)))
    memories = [stage_memory(st, precision, c.zero) for st in stages]
    return seconds, max(m.memory for m in memories), peak_bytes(memories)


def search(cfg: Any, devices: int, machine: Any, memory_limit: int, *, precision: str = "bf16-mixed",
           kept: str = "megatron", max_dry_runs: int = 24, pricer: Any = None, cells: Any = True,
           moe_cells: bool = False, fixed: Any = None) -> SearchResult:
    """The fastest configuration whose peak is within `memory_limit` by predicted step time (module docstring).

    `pricer(cfg, config, machine, precision, kept) -> (seconds, bytes held, peak bytes)`: `price` unless given
    (tests);
    `cells`: bound by the layer cells too (spmdsim.tools.estimate.bounds), not by the closed forms alone; a
    `Cells` of the same model and kept set to reuse its cells (tests). With MoE layers the layer cells bound
    the search only with `moe_cells` (six small dry runs a cell, one for every ep too: on DeepSpeed-MoE's
    1.3B+MoE-128 over 128 devices about 1,200 small dry runs, 12x the search's time; docs/estimate.md).
    `fixed`: {Config field: value} (`parse_fixed`): only the configurations with those degrees are searched.
    """
    import heapq

    from .bounds import Cells
    from .ledger import PRECISIONS

    if precision not in PRECISIONS:
        raise SpmdsimError(f"precision {precision!r} is unknown; expected one of {tuple(PRECISIONS)!r}")
    if isinstance(max_dry_runs, bool) or not isinstance(max_dry_runs, int) or max_dry_runs < 1:
        raise SpmdsimError(f"max dry runs {max_dry_runs!r} must be an integer >= 1")
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, int) or memory_limit < 1:
        raise SpmdsimError(f"memory limit {memory_limit!r} must be a number of bytes >= 1")
    pricer = price if pricer is None else pricer
    per_layer = _layer_elements(cfg)
    bounded, sums = [], {}
    every = configurations(cfg, devices, machine.gpus_per_node)
    for c in (fixed_configurations(every, fixed, devices) if every and fixed else every):
        seconds, nbytes, sums[c] = _bounds(cfg, c, machine, precision, devices, per_layer)
        bounded.append(Candidate(c, seconds, nbytes))
    if not bounded:
        note = vocab_note(cfg, devices, machine.gpus_per_node)  # the padding that lets more tp in, if any
        raise SpmdsimError(f"no configuration of the GPT runs on {devices:,} devices (tp must divide the heads "
                           f"{cfg.heads} and vocab {cfg.vocab_words} within a node of {machine.gpus_per_node}, pp the "
                           f"layers {cfg.layers}, dp the batch {cfg.batch})" + (f"; {note}" if note else ""))
    out = [replace(c, verdict=STATES) for c in bounded if c.bound_bytes > memory_limit]
    # Branch and bound: the heap holds each candidate under its best lower bound so far (first the closed
    # form's, then the layer cells'); the least is bounded further, or priced once its bound is the cells'.
    heap = [(c.bound_s, 0, _order(c), i, c) for i, c in enumerate(bounded) if c.bound_bytes <= memory_limit]
    heapq.heapify(heap)
    if cfg.moe is not None and cells is True and not moe_cells:  # the closed forms alone (the docstring)
        cells = False
    tight = cells if isinstance(cells, Cells) else (Cells(cfg, kept, machine.gpus_per_node) if cells else None)
    made = tight.dry_runs if tight is not None else 0
    best: Optional[float] = None
    runs, stopped = 0, "every configuration the bounds left was priced"
    priced: list[Candidate] = []
    while heap:
        bound, level, order, i, c = heap[0]
        if best is not None and bound >= best:
            break
        heapq.heappop(heap)
        if tight is not None and level == 0:  # the layer cells' bounds: memory, then time
            try:
                nbytes = max(c.bound_bytes, tight.memory_bound(c.config, precision))
            except UnmappableError as exc:
                out.append(replace(c, bound_bytes=_unmapped(exc, precision, memory_limit), verdict=KEPT))
                continue
            if nbytes > memory_limit:
                out.append(replace(c, bound_bytes=nbytes, verdict=KEPT))
                continue
            seconds = max(bound, tight.time_bound(c.config, machine, precision, sums[c.config]))
            heapq.heappush(heap, (seconds, 1, order, i, replace(c, bound_s=seconds, bound_bytes=nbytes)))
            continue
        if runs == max_dry_runs:
            heapq.heappush(heap, (bound, level, order, i, c))
            break
        try:
            seconds, nbytes, peak = pricer(cfg, c.config, machine, precision, kept)
        except UnmappableError as exc:
            out.append(replace(c, bound_bytes=_unmapped(exc, precision, memory_limit), verdict=KEPT))
            continue
        runs += 1
        ok = peak <= memory_limit  # spmdsim estimate's verdict: the peak, transient blocks included
        priced.append(replace(c, step_s=seconds, memory=nbytes, peak=peak, verdict="slower" if ok else OVER))
        if ok and (best is None or seconds < best):
            best = seconds
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
    return SearchResult(devices, machine.name, memory_limit, precision, kept, tuple(priced + out), runs, stopped,
                        chosen, tight.dry_runs - made if tight is not None else 0)


def _unmapped(exc: Any, precision: str, memory_limit: int) -> int:
    """The memory bound of a configuration whose dry run could not map a block (spmdsim.base.sizes.UnmappableError):
    the block's bytes at `precision`, over `memory_limit` (a block beyond this machine's address space is
    beyond any GPU's memory); within it, the error itself (this machine's limit, not the configuration's)."""
    from .ledger import least_bytes

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


def _equal_time(seconds: float) -> float:
    """`seconds` to 9 significant digits: two configurations whose predicted times differ in the last bits of
    their sums alone (a ZeRO-1 configuration and its ZeRO-2 twin, the same transfers and kernels added in
    another order) are equals, ordered by `_order`, not by rounding."""
    return float(f"{seconds:.9g}")


def _order(c: Candidate) -> tuple:
    """A fixed order among equals: fewer pipeline stages, less tensor parallelism, no recomputation first."""
    x = c.config
    return (x.pp, x.tp, x.virtual, RECOMPUTE.index(x.recompute), x.zero, x.sp, x.microbatches, x.ep)
