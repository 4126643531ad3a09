"""The GPT of spmdsim.models.gpt on DTensors: Megatron's tensor-parallel splits, data parallel, optional
sequence parallel.

Mesh ``Layout((dp, tp), ("dp", "tp"))``; the batch is split over dp. The parameters' splits are Megatron's, stated in
`spmdsim.models.gpt.layouts` (pure, its table; docs/reference/operators.md, "A GPT"): vocab-parallel embedding,
column-parallel Q, K, V and fc1, row-parallel projections.

Activations are sequence-first, (T, B, D), as Megatron keeps them ([s, b, h]):
a sequence shard is one contiguous block, so the collectives move it as it
lies, with no packing. Without sequence parallelism the row-parallel outputs
are Allreduced; with it (``sp=True``) they are Reduce_scattered onto the
sequence, the layer norms, dropout and residuals run on a sequence shard, and
each block's input is Allgathered along the sequence before its
column-parallel products. The
LayerNorm weights' gradients are then pending over tp (each rank saw its
sequence shard) and are Allreduced at the leaf, as Megatron does. Every
operator is a general rule (spmdsim.nn.ops: einsum, broadcasting, layer_norm,
softmax, dropout), so the model is written as on one device plus layouts.
"""
from __future__ import annotations

import zlib
from functools import partial
from typing import Any, Optional

import numpy as np

from ...nn import ops
from ...nn.autograd import checkpoint, kept_as, no_grad
from ...errors import SpmdsimError
from ...layouts.layout import TensorLayout
from .config import GPTConfig
# Megatron's plan is spmdsim.models.gpt.layouts' (pure); the model runs with it, and its names stay importable here.
from .layouts import DIALECTS, dialect_layouts, megatron_layouts, mesh_problem
from ...nn.autograd.kept import KEPT, kept_problem
from .memory import RECOMPUTE, recompute_problem
from ...base.precision import precision as get_precision, precision_problem, wide
from ...base.fp8 import Scales
from ...runtime.executor import redistribute
from .params import constant, seeded
from .stages import Part, part_specs, whole
from ..axes import CONTEXT, DATA, EXPERT, SHARD, axis_of, tensor_axes, tensor_entry
from .context import Context, position_ids
from .mesh import mesh_checked
from ...nn.fsdp import fully_shard, on_mesh, shard_axes, shard_group, sharded_layout
from ...runtime.door import all_reduce_object
from ...runtime.dtensor import DTensor
from ...runtime.replay import capture
from ...runtime.sim import dry_run_active
from .data import NOT_FINITE, encode, logits_finite, next_id
from .reference import sampling
from .parallel_block import _Block, _with_losses

__all__ = ["GPT", "megatron_layouts", "dialect_layouts", "DIALECTS", "mesh_problem", "RECOMPUTE", "KEPT"]


def _zero_padded_rows(wte: Any, vocab: int) -> None:
    """Zero, in place, the rows of this rank's block of the token embedding `wte` at or past `vocab`: the
    padded vocabulary's rows start at zero (GPTConfig.vocab_pad_to; spmdsim.models.gpt.params.initial_value)."""
    rows = wte.slices[0]
    if rows.stop > vocab and not dry_run_active():  # a dry run's blocks have shapes, not values
        wte.local[max(vocab - rows.start, 0):] = 0.0


class GPT(_Block):
    """The model's parameters as DTensors on `mesh` (each rank builds only its shards) and its forward.

    Args:
        cfg: the model (spmdsim.models.gpt.GPTConfig).
        mesh: a spmdsim Mesh whose layout has axes ("dp", "tp"), or ("dp", "ep", "tp") with MoE layers
            (cfg.moe; spmdsim.models.moe.layer: the batch split over ("dp", "ep"), the experts over "ep"), or
            with `fsdp` ("dp", "fs", "tp") (HSDP: the parameters sharded over "fs", the batch over both).
        sp: sequence parallelism.
        layouts: parameter name -> TensorLayout, overriding `megatron_layouts` (any dialect's layout,
            converted to a TensorLayout: spmdsim.layouts.dialects).
        part: the pieces this object holds (spmdsim.models.gpt.stages.Part: a pipeline chunk's layers,
            embedding, head); default the whole model. Only its parameters are made.
        recompute: activation recomputation (docs/howto/memory.md, "Memory"): "none"; "selective", the
            attention core (scores, softmax, its dropout, times V) recomputed in the backward
            (Korthikanti et al. 2022); "full", each block's input kept and the block recomputed
            (spmdsim.nn.autograd.checkpoint). The same gradients (the same dropout masks: seeded by step,
            site and microbatch). With cfg.attention "flash" the core keeps no scores, and "selective"
            is "none".
        kept: what the graph keeps for backward (docs/howto/memory.md, "Memory"): "graph", what spmdsim's
            general rules keep (every node its inputs' blocks); "megatron", Megatron-LM's set, Korthikanti
            et al.'s count (spmdsim.nn.ops.megatron: each rule keeps only what it reads, boolean dropout
            masks, the column-parallel products' input kept as its sequence shard and gathered again in
            the backward). The same values, under every precision policy (its fused pieces round where the
            general operators round).
        precision: the run's precision policy (spmdsim.base.precision: "fp64", "fp32", "bf16-mixed"): the
            parameters are made in its parameter dtype and the activations are its activation dtype
            (a row-parallel product's float32 pending sum is rounded to it once summed).
        fsdp: fully sharded data parallelism (ZeRO-3; spmdsim.nn.fsdp): None, off; True or False, on, with
            or without resharding after forward; or a dict of fully_shard's options (prefetch too). `params`
            are then the shards over the data axis (the optimizer's), each layer a unit gathered for its
            forward and backward, the embedding, final norm and head the root unit, gathered once a
            forward; the forward reads the gathered ones (`use`).
    """

    def __init__(self, cfg: GPTConfig, mesh: Any, sp: bool = False,
                 layouts: Optional[dict[str, TensorLayout]] = None, part: Optional[Part] = None,
                 recompute: str = "none", kept: str = "graph", precision: Any = "fp64",
                 context: Optional[Context] = None, fsdp: Any = None) -> None:
        problem = recompute_problem(recompute) or kept_problem(kept) or precision_problem(precision)
        if problem:
            raise SpmdsimError(problem)
        self.precision = policy = get_precision(precision)
        self.fp8 = None if policy.fp8 is None else Scales(policy.fp8)  # FP8 scales (spmdsim.models.gpt.fp8_block)
        param_dtype = None if policy.param == "float64" else policy.dtype("param")

        names = tuple(mesh.layout.alias_name)
        cp = mesh_checked(cfg, mesh, sp, context, fsdp)
        # the sequence's split over cp and how attention meets it (spmdsim.models.gpt.context); None without cp
        self.context = (context or Context()) if CONTEXT in names else None
        self.positions = self.context.positions(cp, cfg.seq) if self.context is not None else None
        # a batch's ids (B, T) as the model lays them out: ``x[model.laid]`` (x itself where positions are None)
        self.laid = (slice(None), list(self.positions) if self.positions is not None else slice(None))
        # the positions `embed` looks up over cp > 1, a naive split's its own indices: the lookup's gradient a
        # pending sum over cp, as every other parameter's (a slice of the whole table would arrive summed)
        self._pos_order = self.positions or (tuple(range(cfg.seq)) if cp > 1 else None)
        self.cfg, self.mesh, self.sp, self.recompute, self.kept = cfg, mesh, bool(sp), recompute, kept
        # the attention core's options: flash attention keeps no scores, so selective recomputation of the
        # core has nothing to drop there (the same as "none")
        self._flash = cfg.attention == "flash"
        self._selective = recompute == "selective" and not self._flash
        self.part = whole(cfg) if part is None else part
        chosen = megatron_layouts(cfg, mesh.layout, sp)
        chosen.update(on_mesh(layouts or {}, mesh.layout))  # (layouts written on the mesh's axes, another cut)
        self.layouts = chosen
        self.params: dict[str, Any] = {}
        for spec in part_specs(cfg, self.part):
            layout, source = chosen[spec.name], seeded(cfg, spec)
            if source is None:
                t = DTensor.full(mesh, layout, spec.shape, constant(spec))
            else:
                t = DTensor.from_seeded(mesh, layout, source)
                if spec.name in ("wte", "head.w"):
                    _zero_padded_rows(t, cfg.vocab)
            # The policy's parameter dtype: the float64 values rounded once (the reference's start, too).
            self.params[spec.name] = (t if param_dtype is None else t.astype(param_dtype)).requires_grad_()
        # The tensors the forward reads: the parameters, or under FSDP the gathered ones of the units running.
        options = {"reshard_after_forward": fsdp} if isinstance(fsdp, bool) else fsdp  # fully_shard's
        # sharded over fs (HSDP), else dp and ep: each parameter over those it is replicated over (experts over dp)
        group = shard_group(mesh.layout, {r: axis_of(mesh, r) for r in ("shard", "data", "expert", "context")})
        self.fsdp = None if fsdp is None else fully_shard(self.params, mesh, axis=group, **options)
        if self.fsdp is not None:  # the parameters are the shards; `layouts` theirs (every part's, as Megatron's)
            self.params, group = self.fsdp.params, self.fsdp.group  # (with experts: each over the axes it is on)
            self.layouts = {name: sharded_layout(layout, shard_axes(layout, group))
                            for name, layout in self.layouts.items()}
        self.use: dict = self.params if self.fsdp is None else {}
        self._root_step: Any = None  # under FSDP, the step whose forward gathered the root (`_root`)
        L = mesh.layout
        # The batch's axes: dp, or with experts ("dp", "ep") (the ep ranks are data parallel for every other
        # layer, as in Megatron; the MoE layers move tokens between them, spmdsim.models.moe.layer).
        self.batch = (DATA, EXPERT) if EXPERT in names else (DATA, SHARD) if SHARD in names else DATA
        seq = CONTEXT if CONTEXT in names else None  # the sequence's split over cp, for the whole block
        self.full = L(seq, self.batch, None)  # (T, B, D) whole on tp: the column-parallel products' input
        # (T, B, D) between blocks; without sp the same object as `full` (`_gathered` then stops at `is`)
        tensor = tensor_axes(names)  # attention's tp: ("tp",), or ("tp", "etp") (the experts' own tp)
        self.act = L(((CONTEXT,) + tensor if seq else tensor_entry(names)), self.batch, None) if sp else self.full
        self.ids = L(self.batch, seq)  # token ids (B, T)
        self._whole: dict = {}  # id(layout) -> (that layout, whether it equals `full`) (`_gathered`)
        self._heads: dict = {}  # id(layout) -> (that layout, the all-to-all's heads layout) (`_heads_layout`)
        self._pos_ids: Any = None  # the laid-out sequence's positions as a DTensor (`_position_ids`)
        self._acts: dict = {}  # layout objects found equal to `act` (resolved), by id (`_row_out`)
        self.moe_stats: list = []  # the MoE layers' dispatch figures of the last forward (spmdsim.models.moe.layer)
        self._padding: dict = {}  # the logits' last dim's layout -> this rank's padded-column mask (`_masked`)
        self._activation: Any = None  # (the policy, its activations' dtype), for `_row_out`
        self._router_losses: list = []
        self._rope_tables: Any = None  # (cos, sin, turn) as DTensors, made by `_rope` when first used
        self._rotary_tables: Any = None  # (cos, sin) numpy tables of Megatron's fused rotary, made by `_rotary`
        self._group_ones: Any = None  # grouped-query attention's ones (1, 1, 1, G, 1), made by `_grouped`
        self._layers: dict = {}  # layer -> its _Layer (names and sizes `_block` reads), made at its first forward

    def embed(self, ids: Any, step: Optional[int] = None, train: bool = False, micro: Optional[int] = None) -> Any:
        """The activations (T, B, D) entering the first block, from token ids (B, T) laid out (self.batch, None)."""
        self._root(step, micro, again=False)
        p, cfg = self.use, self.cfg
        # Vocab-parallel lookup of the ids sequence-first: a pending sum over tp, Allreduced (or
        # Reduce_scattered onto the sequence), on tp 1 laid out as the activations already (no move node);
        # each position's embedding added to every sample's row.
        with kept_as("embedding"):
            tok = self._as_act(ops.embedding(ids.T, p["wte"], reduce=False))
            if cfg.positions == "rope":  # positions turn q and k in each block instead
                return self._dropout(tok, "emb", step, train, micro)
            if self._pos_order is None:
                pos = ops.reshape(p["wpe"], (cfg.seq, 1, cfg.d_model))
            else:  # the sequence split over cp (in another order where balanced): each index's position's row
                if self._pos_ids is None:  # (T, 1), split over cp as the activations' T
                    self._pos_ids = position_ids(self.mesh, self._pos_order)
                pos = ops.embedding(self._pos_ids, p["wpe"])
            return self._dropout(tok + pos, "emb", step, train, micro)

    def blocks(self, h: Any, step: Optional[int] = None, train: bool = False, micro: Optional[int] = None,
               scale: float = 1.0) -> Any:
        """The activations after this part's layers (all of them, for the whole model); with full
        recomputation each block is one `checkpoint`, which keeps only its input, and `scale` what its MoE
        layers' router losses are scaled by (a pipeline microbatch's 1/m: chunk_blocks)."""
        for layer in range(self.part.first, self.part.stop):
            if self.fsdp is not None:
                h = self._fsdp_layer(h, layer, step, train, micro, scale)
            elif self.recompute == "full":
                pre = f"h{layer}."
                mine = [t for name, t in self.params.items() if name.startswith(pre)]
                h = checkpoint(partial(self._recomputed, layer, step, train, micro, scale), h, *mine)
            else:
                h = self._block(h, layer, step, train, micro, scale)
        return h

    def chunk_blocks(self, h: Any, step: Optional[int] = None, train: bool = False, micro: Optional[int] = None,
                     scale: float = 1.0) -> tuple[Any, Any]:
        """A pipeline chunk's `blocks`, with its MoE layers' router losses (weighted, times `scale`: a
        microbatch's 1/m) attached to the output: (the output, the losses: a resolved scalar DTensor, read
        when the step ends, so that a replayed step reads its own; None without MoE layers).
        The output's values are `blocks`'; the backward from its gradient reaches the routers through the
        losses too, as the unpipelined `loss` adds them (spmdsim.models.gpt.pipeline)."""
        self._router_losses = []
        self._root(step, micro, again=False)  # (a pipeline's last chunk: its head's)
        h = self.blocks(h, step, train, micro, scale)
        losses, self._router_losses = self._router_losses, []
        if not losses:
            return h, None
        total = ops.resolved(losses[0])
        for extra in losses[1:]:
            total = total + ops.resolved(extra)
        total = total * float(scale)
        return _with_losses(h, total), total

    def _recomputed(self, layer: int, step: Optional[int], train: bool, micro: Optional[int], scale: float, h: Any,
                    *params: Any) -> Any:
        """`_block` as a checkpointed region: its parameters are among the inputs, read from `params`; `scale`: the
        router losses' of the forward that made the region (the backward recomputes it after chunk_blocks)."""
        return self._block(h, layer, step, train, micro, scale)

    def _unit(self, layer: Optional[int]) -> list:
        """The names of layer `layer`'s parameters (an FSDP unit), or with None the root's (the rest)."""
        pre = f"h{layer}."
        if layer is not None:
            return [name for name in self.params if name.startswith(pre)]
        return [name for name in self.params if not (name[0] == "h" and name[1:2].isdigit())]

    def _root(self, step: Any = None, micro: Any = None, again: bool = True) -> None:
        """Under FSDP, the root unit gathered for this forward (kept to the end of its backward; the last
        forward's freed first, its backward done) and the most gathered bytes counted from here. `again`
        False: only where this step's microbatch `micro` has not gathered it yet. A pipeline's microbatch
        (`micro` not None) gathers its own, which its graph holds until its backward (several are in flight)."""
        if self.fsdp is not None and (again or self._root_step != (step, micro)):
            if micro is None:
                self.fsdp.release(self.use)
                self.fsdp.start()
            self.use = self.fsdp.unshard(self._unit(None), held=micro is None)
            self._root_step = (step, micro)

    def _fsdp_layer(self, h: Any, layer: int, step: Any, train: bool, micro: Any, scale: float) -> Any:
        """Layer `layer` as an FSDP unit (spmdsim.nn.fsdp.FullyShard.unit). Under full recomputation with
        resharding its parameters are gathered inside the recomputed region (in its forward, freed after it,
        and in its recomputation); without resharding once, outside it, and kept as its inputs."""
        fs, names = self.fsdp, self._unit(layer)
        if self.recompute != "full":  # (prefetching, the next layer's names and the previous one's)
            after = self._unit(layer + 1) if layer + 1 < self.part.stop else None
            before = self._unit(layer - 1) if layer > self.part.first else None
            return fs.unit(names, self._unit_block, h, layer, step, train, micro, scale, after=after, before=before)
        if fs.reshard_after_forward:
            run = partial(self._recomputed_unit, names, layer, step, train, micro, scale)
            return checkpoint(run, h, *(fs.params[n] for n in names))
        return fs.unit(names, self._checkpointed_unit, h, layer, step, train, micro, scale, reshard=False)

    def _unit_block(self, h: Any, gathered: dict, layer: int, step: Any, train: bool, micro: Any,
                    scale: float) -> Any:
        """`_block` reading the unit's gathered parameters."""
        self.use.update(gathered)
        try:
            return self._block(h, layer, step, train, micro, scale)
        finally:
            for name in gathered:
                self.use.pop(name, None)

    def _recomputed_unit(self, names: list, layer: int, step: Any, train: bool, micro: Any, scale: float, h: Any,
                         *shards: Any) -> Any:
        """A recomputed region that gathers its own parameters (`shards`: their leaves, the region's inputs)."""
        return self.fsdp.unit(names, self._unit_block, h, layer, step, train, micro, scale, reshard=False)

    def _checkpointed_unit(self, h: Any, gathered: dict, layer: int, step: Any, train: bool, micro: Any,
                           scale: float) -> Any:
        """The block as a recomputed region whose inputs are the unit's gathered parameters."""
        names = list(gathered)
        run = partial(self._recomputed_gathered, names, layer, step, train, micro, scale)
        return checkpoint(run, h, *(gathered[n] for n in names))

    def _recomputed_gathered(self, names: list, layer: int, step: Any, train: bool, micro: Any, scale: float,
                             h: Any, *params: Any) -> Any:
        return self._unit_block(h, dict(zip(names, params)), layer, step, train, micro, scale)

    def head(self, h: Any, last: bool = False) -> Any:
        """Logits (B, T, V) split over the vocabulary on tp from the last block's activations;
        `last`: those of the last position only, (B, 1, V) (with sp, only its rows move, not the sequence)."""
        p, cfg = self.use, self.cfg
        if last:
            h = h[-1:]
        with kept_as("head"):
            h = self._gathered(self._norm(h, "lnf"))
            # The head, tied or its own (columns split like the vocabulary), its logits batch-first again.
            return self._masked(ops.einsum("tbd,vd->btv", h, p["wte" if cfg.tied else "head.w"]))

    def _masked(self, z: Any) -> Any:
        """The logits `z` (B, T, padded_vocab) with the padded vocabulary's columns at -inf (GPTConfig
        .vocab_pad_to): exp(-inf) is 0, so they add nothing to the softmax's sum, never win its max, and
        where's backward gives them no gradient. Without padding, `z` itself."""
        cfg = self.cfg
        if cfg.padded_vocab == cfg.vocab:
            return z

        z = ops.resolved(z) if z.layout.partial else z
        layout = TensorLayout(z.layout.layout, (z.layout.tensor_map[-1],))
        block = self._padding.get(layout)
        if block is None:  # this rank's columns of the vocabulary: True where padded
            (start, stop), = layout.bounds(self.mesh.rank, (cfg.padded_vocab,))
            block = self._padding[layout] = np.arange(start, stop) >= cfg.vocab
        return ops.masked_fill(z, DTensor.from_local(self.mesh, block, layout, (cfg.padded_vocab,)), -np.inf)

    def head_loss(self, h: Any, targets: Any) -> Any:
        """Mean cross-entropy over the tokens of `targets` (B, T) from the last block's activations
        (vocab-parallel: the logits are never gathered)."""
        z = self.head(h)
        B, T, V = z.global_shape
        with kept_as("head"):
            if self.context is not None:  # the sequence split over cp too: the rows (B, T) as they lie
                return ops.cross_entropy(z, targets)
            return ops.cross_entropy(ops.reshape(z, (B * T, V)), ops.reshape(targets, (B * T,)))

    def logits(self, ids: Any, step: Optional[int] = None, train: bool = False, last: bool = False) -> Any:
        """Logits (B, T, V) split over the vocabulary on tp, from token ids (B, T) laid out (self.batch, None);
        `last`: those of the last position only, (B, 1, V) (with sp, only its rows move, not the sequence)."""
        self._router_losses, self.moe_stats = [], []
        self._root(step)
        return self.head(self.blocks(self.embed(ids, step, train), step, train), last)

    def loss(self, ids: Any, targets: Any, step: Optional[int], train: bool = True,
             micro: Optional[int] = None) -> Any:
        """Mean cross-entropy over the batch's tokens (vocab-parallel: the logits are never gathered), plus the
        MoE layers' router losses, weighted (spmdsim.models.gpt.reference.router_loss)."""
        self._router_losses, self.moe_stats = [], []
        self._root(step)
        loss = self.head_loss(self.blocks(self.embed(ids, step, train, micro), step, train, micro), targets)
        for extra in self._router_losses:
            loss = loss + ops.resolved(extra)
        self._router_losses = []
        return loss

    def generate(self, prompt: bytes, n: int, temperature: float = 0.0, seed: Optional[int] = None) -> np.ndarray:
        """The ids of `n` characters after `prompt` (eval mode), drawn as spmdsim.models.gpt.reference.generate does.

        Each step: one forward of the last T tokens (left-padded with spaces) on the mesh, the head on the
        last position only (with sp, only that position's rows move to the rest of tp), then greedy
        (temperature 0: ``ops.argmax`` over the vocabulary-split logits of the last position, two
        Allreduces of one number per row, no logits gathered; after the last character one more agrees
        that every rank's logits were finite) or a draw from softmax(logits / temperature) with the
        reference's generator (the last position's logits gathered over tp; every rank draws alike).
        Every character's forward is the same program on a new window: the first is captured
        (spmdsim.runtime.replay) and the others replay it, without the layout inference and planning
        that chose its numpy calls and collectives (MoE layers too: their routing, packing and
        exchanges are replay kernels, so each window routes anew).
        """
        n = sampling(n, temperature)  # every rank alike, before the first forward's collectives
        if self.context is not None:  # (the mesh's: alike on every rank)
            raise SpmdsimError("generate: a window of one new token does not split over the context-parallel "
                               "ranks; draw from the parameters in one process: "
                               "spmdsim.models.gpt.train.reference_sample")
        cfg, mesh = self.cfg, self.mesh
        dp = mesh.layout.group_size((self.batch,) if isinstance(self.batch, str) else self.batch)  # a window each
        rng = np.random.default_rng(zlib.crc32(f"{cfg.seed if seed is None else seed}:generate".encode()))
        ids = [int(i) for i in encode(prompt)]
        pad = 32 if cfg.vocab > 32 else 0

        def next_logits(x: Any) -> Any:  # greedy: the argmax's ids; else the last position's logits, whole
            z = self.logits(x, last=True)[:, -1]
            return (ops.argmax(z, -1), z) if temperature == 0 else redistribute(z, mesh.layout(self.batch, None))

        graph, finite = None, True  # the first character's forward, captured; each later one replays it
        with no_grad(), np.errstate(over="ignore", invalid="ignore"):  # diverged parameters: next_id's one line
            for _ in range(n):
                context = ids[-cfg.seq:]
                window = np.array([[pad] * (cfg.seq - len(context)) + context] * dp, dtype=np.int64)
                x = DTensor.from_global(mesh, window, mesh.layout(self.batch, None), verify=False)
                if graph is not None:
                    out = graph(x)
                elif n > 1:
                    graph = capture(next_logits, x)
                    out = graph.result
                else:  # one character: nothing to replay
                    out = next_logits(x)
                if temperature == 0:  # every row holds the same window: this rank's first row answers
                    ids.append(int(out[0].local[0]))
                    finite = finite and logits_finite(wide(out[1].local))  # this rank's vocabulary's
                else:
                    ids.append(next_id(rng, wide(out.local[0][:cfg.vocab]), temperature))  # bfloat16's in float32
        if temperature == 0 and not all_reduce_object(mesh.comm, int(finite), "min"):  # the argmax ran on logits
            raise SpmdsimError(NOT_FINITE)  # not finite on some rank (`def ????` shown as meaningful): on every rank
        return np.array(ids[len(ids) - n:], dtype=np.int64)
