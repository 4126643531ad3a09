"""Closed-form lower bounds of a configuration's step time and memory (spmdsim.tools.estimate.search):
the model states of a rank's transformer layers, the GEMM FLOPs of a step, and the least communication.

No dry run: each bound is a formula of the GPT's sizes and the configuration; the search's docstring says
how it uses them (they prune, never choose).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional

from ...models.gpt.params import is_expert, param_specs
from .configs import Config
from .ledger import PRECISIONS
from .records import LEVELS
from .links import lane_model, level_model, link_seconds

__all__ = ["dense_layer_elements", "lower_bounds", "bounds_and_sums", "model_states", "stage_elements", "comm_bounds",
           "flops_bound"]


def dense_layer_elements(cfg: Any) -> int:
    """Elements of one dense transformer layer's parameters of `cfg` (its first layer's)."""
    return sum(math.prod(s.shape) for s in param_specs(cfg) if s.name.startswith("h0."))


@functools.lru_cache(maxsize=16)
def _layer_sizes(cfg: Any) -> tuple[tuple[int, bool], ...]:
    """(elements, whether an MoE expert's) of each transformer layer's parameter of `cfg` (a search asks for
    every configuration)."""
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
    return bounds_and_sums(cfg, c, machine, precision, devices, layer_elements)[:2]


def bounds_and_sums(cfg: Any, c: Config, machine: Any, precision: str, devices: int,
                    layer_elements: Optional[int] = None) -> tuple[float, int, tuple[float, float]]:
    """`lower_bounds`, and the seconds of the gradient sums and of ZeRO-3's gathers within them (`comm_bounds`'; the
    layer cells' bound adds them)."""
    w = PRECISIONS[precision]
    dense, experts = stage_elements(cfg, c, layer_elements)
    states = model_states(c, precision, dense + experts)
    peak = max(machine.peak(dtype) * machine.gemm_efficiency.cap(dtype)  # FP8: its linear layers' at the fp8 peak
               for dtype in (w.compute, "fp8")[:1 + w.fp8])
    per_rank = flops_bound(cfg, causal=c.cp > 1) / devices / peak
    bubble = (c.pp - 1) / (c.virtual * c.microbatches)
    # A step's time is compute + element-wise + communication - what the backward hides of the gradient sums
    # (no more than those sums, nor than the compute) + the bubble: at least the exchanges + the larger of the
    # products' time and the gradient sums' + the bubble of the products (spmdsim.tools.estimate.steptime).
    exchanges, sums, gathers = comm_bounds(cfg, c, machine, precision, dense, experts)
    return exchanges + max(per_rank, sums) + per_rank * bubble, int(states), (sums, gathers)


def model_states(c: Config, precision: str, elements: int) -> int:
    """Bytes of the model states a rank of `c` holds at least for `elements` transformer-layer parameter
    elements it holds: parameters and gradients, and the master copy and Adam's moments (over dp x ep under
    ZeRO-1, with its buffer: the summed gradients' dp-th slice; its flat buffer is the gradients'; under
    ZeRO-2 the gradients too are that slice alone, at the gradients' width, and the buckets' shared flat buffer,
    at most one bucket, is left out; ZeRO-1 and ZeRO-2 shard over dp x ep x cp, each rank having summed the
    gradients of part of every sequence; under ZeRO-3 every one of them is its slice over dp x ep x cp, the
    gathered layers left out: the experts' are over dp x cp alone, so theirs is at least that), at the precision's
    widths: a
    bound of the memory line, so of the peak too
    (which adds the gradients the step measurably holds beyond the line's: ZeRO-2's beyond the slices)."""
    w = PRECISIONS[precision]
    if c.zero == 3:  # FSDP (spmdsim.nn.fsdp): parameters, gradients, master copy, moments in slices over dp x ep x cp
        return elements * (w.params + w.grads + (w.master if w.mixed else 0) + 2 * w.states) // (c.dp * c.ep * c.cp)
    sharded = (w.master if (w.mixed or c.zero) else 0) + 2 * w.states + (w.grads if c.zero == 2 else 0)
    shards = c.dp * c.ep * c.cp  # ZeRO shards the dense layers' states over dp x ep x cp
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
        per_layer = dense_layer_elements(cfg) if layer_elements is None else layer_elements
        return cfg.layers // c.pp * per_layer // c.tp, 0
    dense, experts = _moe_elements(cfg, c.tp, c.ep)
    return dense // c.pp, experts // c.pp


def comm_bounds(cfg: Any, c: Config, machine: Any, precision: str, dense: int,
                experts: int) -> tuple[float, float, float]:
    """(seconds, seconds, seconds) of the GPT's communication the busiest rank of `c` spends at least, by the machine's
    link model of each transfer (spmdsim.tools.estimate.steptime): the layers' and the pipeline's, and the gradient
    sums. The layers': with MoE layers the experts' exchanges (with a capacity, forward and backward, 4
    Alltoalls over the experts' ep a layer and microbatch, of the whole send buffer, k s c / E slots per expert
    and sequence (with cp of each rank's chunk of it, s / cp), at the activation width, folded of a tp rank's share of
    the sequences; the mean of the stages' MoE layers; dropless none counted: their bytes follow the routing), each
    attention's tensor-parallel collectives, two messages of each microbatch between stages (its activations forward,
    their gradient backward), each on a rank's part of the sequence with cp (context parallelism's own messages left
    out: the ring's run under the products); under ZeRO-3 each layer's parameters gathered over dp x cp twice a
    microbatch.
    The gradient sums, at the gradient width, of the `dense` parameter elements over dp x ep x cp and the `experts`'
    over dp (an Allreduce each; ZeRO-1 and ZeRO-2 a Reduce_scatter and an Allgather of the updated parameters, at the
    parameters' width; ZeRO-3 a Reduce_scatter over dp x cp), in one call each
    (buckets only add latency). Each on the link of its group (`levels`). The third: of the first, ZeRO-3's gathers
    (0 without), which the priced step leaves unhidden (no prefetch): the layer cells' bound adds them."""
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
        lanes = min(group, max(1, gpn // stride))  # the most members a node can hold (links.lane_model)
        return min(link_seconds(lane_model(models, level, lanes, op), op, group, int(nbytes))
                   for level in levels(stride, group))

    sequences = cfg.batch // (c.dp * c.ep * c.microbatches)  # a rank's share of one microbatch
    exchanges = 0.0
    if m is not None and c.experts_ep > 1 and not m.dropless:
        # folded (etp below tp): each of tp's tp / etp parts dispatches its share of the sequences over the
        # experts' ep ranks, etp apart (etp fastest); unfolded, all of them over ep, tp apart
        routed, stride = (sequences // (c.tp // c.etp), c.etp) if c.etp else (sequences, c.tp)
        # (with cp each rank routes its chunk of a sequence, with the chunk's own capacity)
        buffer = routed * m.experts * m.capacity(cfg.seq // c.cp) * cfg.d_model * w.activations
        layers = sum(cfg.is_moe(i) for i in range(cfg.layers)) / c.pp
        exchanges = 4 * c.microbatches * layers * cheapest(stride, "alltoall", c.experts_ep, buffer)
    # Each block's attention over tp, forward and backward (its MLP's, dense or MoE, left out): with sequence
    # parallelism an Allgather of its input and a Reduce_scatter of its output, and their conjugates (under
    # FP8 the Allgathers at a byte an element: the forward's of the input's e4m3 copy, the backward's its
    # copy gathered again); without, an Allreduce of its output and one of its input's gradient; on the
    # microbatch's activations whole (of a rank's part of each sequence with cp: context parallelism's own
    # messages left out).
    elements = sequences * cfg.seq // c.cp * cfg.d_model
    activations = elements * w.activations
    if c.tp > 1:
        ops = (("allgather", elements if w.fp8 else activations), ("reduce_scatter", activations)) if c.sp else \
            (("allreduce", activations),)
        exchanges += 2 * c.microbatches * cfg.layers / c.pp * sum(cheapest(1, op, c.tp, nbytes)
                                                                  for op, nbytes in ops)
    # A stage boundary: each microbatch's activations (a sequence shard with sp) cross it forward and their
    # gradient backward, so every stage sends or receives at least two messages a microbatch (the first
    # stage sends the activations and receives their gradients, the last receives and sends; the ledger
    # prices a receive as a send).
    if c.pp > 1:
        stage = c.tp * c.cp * c.ep * c.dp  # ranks apart from the next stage's
        exchanges += 2 * c.microbatches * cheapest(stage, "send", 2, activations // (c.tp if c.sp else 1))
    if c.zero == 3:  # FSDP: each layer gathered over dp x cp (x ep) a microbatch's forward and again for its
        # backward (resharded after forward, the search's and a pipeline's way), unhidden (no prefetch)
        gathers = 2 * c.microbatches * cheapest(c.tp, "allgather", c.dp * c.cp, dense * w.params)
        return exchanges + gathers, cheapest(c.tp, "reduce_scatter", c.dp * c.cp, dense * w.grads), gathers
    sums = 0.0
    for stride, group, elements in ((c.tp, c.dp * c.ep * c.cp, dense), (c.tp * c.cp * c.ep, c.dp, experts)):
        if group > 1 and elements:
            n = elements * w.grads
            sums += (cheapest(stride, "reduce_scatter", group, n)
                     + cheapest(stride, "allgather", group, elements * w.params)
                     if c.zero else cheapest(stride, "allreduce", group, n))
    return exchanges, sums, 0.0


def flops_bound(cfg: Any, causal: bool = False) -> float:
    """The matrix products' FLOPs of one training step of `cfg` (all ranks, no recomputation) that any
    configuration executes at least: 72 B s h^2 (1 + s / 6h) a dense layer (with Llama's options, its own
    weights'), forward and backward (the vocabulary's products left out); an MoE layer its attention's
    (24 B s h^2 + 12 B s^2 h by default; with grouped-query attention its own weights') and its experts' two
    (SwiGLU three) products, forward and backward, 12 (18) x rows x h x F, on at least s min(k c, E) rows a sequence
    (the capacity's E min(s, ceil(k s c / E)) slots travel and are multiplied, empty or not; dropless, every one of the
    k s assignments), the routers' products left out. `causal`: the attention's scores and context counted on
    the causal half of the square alone, s (s + 1) / 2 (query, key) pairs a sequence, the least a method
    that skips the masked blocks computes (context parallelism's ring; 12 B s^2 h becomes 6 B s (s + 1) h)."""
    b, s, h, layers = cfg.batch, cfg.seq, cfg.d_model, cfg.layers
    moe_layers = sum(cfg.is_moe(i) for i in range(layers))
    # Llama's options (GPTConfig): Q and the projection h^2 each, K and V h x kv_heads x head_dim, the MLP's 2 (SwiGLU
    # 3) matrices h x ffn; 2 FLOPs a multiply-add, 3 passes (forward and backward's two): 72 B s h^2 by default.
    attention, matrices = cfg.attention_weights, cfg.mlp_matrices
    core = 6 * b * s * (s + 1) * h if causal else 12 * b * s * s * h  # the scores' and the context's products
    flops = (layers - moe_layers) * (6 * b * s * (attention + matrices * h * cfg.hidden) + core)
    if moe_layers:
        m = cfg.moe
        rows = b * s * (m.top_k if m.dropless else min(m.top_k * m.capacity_factor, m.experts))
        flops += moe_layers * (6 * b * s * attention + core
                               + 6 * matrices * rows * h * cfg.expert_hidden)
    return flops
