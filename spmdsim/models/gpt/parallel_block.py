"""The GPT's transformer block on DTensors (spmdsim.models.gpt.parallel.GPT's): attention and MLP as Megatron
splits them over tp, their dropout, residuals and norms, rotary positions, grouped-query attention and the MoE
layer's place in a block."""
from __future__ import annotations

from functools import partial
from typing import Any, Optional
import numpy as np
from ...base import buffers
from ...nn import ops
from ...nn.autograd import kept_as
from ...nn.autograd.graph import record, with_partial
from .config import GPTConfig
from ...base.context import current
from ...nn.ops import fused, megatron
from ...nn.ops.residual import residual as fused_residual
from ...nn.ops.ring_attention import ring_attention
from ...base.precision import is_low
from ...base.tables import put
from ...runtime.executor import redistribute
from ...runtime.replay import Scalar
from .params import dropout_seed
from ...runtime.dtensor import DTensor
from ..moe.layer import moe_layer
from ..moe.tokens import takes
from ._blocks import rope_tables
from .fp8_block import column, fp8_block, row
from ..axes import CONTEXT, tensor_axes


def _with_losses(h: Any, losses: Any) -> Any:
    """`h` unchanged, with the scalar `losses` attached: in the backward `h`'s gradient passes through and
    `losses` gets ones (Megatron's MoEAuxLossAutoScaler), so a pipeline chunk's router losses are
    differentiated by the backward its output's gradient starts."""
    out = type(h)(h.mesh, h.local, h.layout, h.global_shape)
    if h._ag is None and losses._ag is None:
        return out
    ones = type(losses)(losses.mesh, np.ones(losses.local.shape, losses.dtype), with_partial(losses.layout, ()),
                        losses.global_shape)

    def backward(dy: Any) -> tuple:
        return dy, ones

    return record(out, "router losses attached", (h, losses), backward, reads=())


class _Layer:
    """What `GPT._block` reads of block `layer` beside its tensors, worked out once a model: its parameters' and
    dropout sites' names (each a string made once, where the block made ~20 a forward), the
    config's sizes and choices for it (a frozen GPTConfig's: they never change), and the `kept_as` contexts
    its parts enter, one object a kind (entered one after another, never one inside itself: a model is one
    rank's, its blocks run one at a time)."""

    __slots__ = ("ln1w", "ln1b", "wq", "bq", "wk", "wv", "bv", "attn", "wo", "bo", "resid1", "ln2w", "ln2b", "w1",
                 "b1", "w3", "b3", "w2", "b2", "resid2", "kv", "head_dim", "rope", "grouped", "moe", "swiglu",
                 "norm", "attention", "core", "mlp")

    def __init__(self, cfg: GPTConfig, layer: int) -> None:
        pre = f"h{layer}."
        self.ln1w, self.ln1b, self.ln2w, self.ln2b = pre + "ln1.w", pre + "ln1.b", pre + "ln2.w", pre + "ln2.b"
        self.wq, self.bq, self.wk = pre + "attn.wq", pre + "attn.bq", pre + "attn.wk"
        self.wv, self.bv, self.wo, self.bo = pre + "attn.wv", pre + "attn.bv", pre + "attn.wo", pre + "attn.bo"
        self.attn, self.resid1, self.resid2 = pre + "attn", pre + "resid1", pre + "resid2"
        self.w1, self.b1, self.w3, self.b3 = pre + "mlp.w1", pre + "mlp.b1", pre + "mlp.w3", pre + "mlp.b3"
        self.w2, self.b2 = pre + "mlp.w2", pre + "mlp.b2"
        self.kv, self.head_dim = cfg.kv, cfg.head_dim
        self.rope, self.grouped = cfg.positions == "rope", cfg.kv != cfg.heads
        self.moe, self.swiglu = cfg.is_moe(layer), cfg.mlp == "swiglu"
        self.norm, self.attention, self.core, self.mlp = (kept_as("layer norm"), kept_as("attention"),
                                                          kept_as("attention core"), kept_as("mlp"))


class _Block:
    """The block's methods of `GPT` (spmdsim.models.gpt.parallel), which holds the state they read."""

    def _dropout(self, x: Any, site: str, step: Optional[int], train: bool, micro: Optional[int]) -> Any:
        if not train or self.cfg.dropout == 0:
            return x
        # The mask of the batch-first (B, T, D) twin (spmdsim.models.gpt.reference's), read through a view.
        return ops.dropout(x, self.cfg.dropout, seed=self._seed(step, site, micro), mask_dims=(1, 0, 2),
                           kept=self.kept)

    def _seed(self, step: Any, site: str, micro: Optional[int]) -> Any:
        """The mask's seed at `site` (of microbatch `micro`, None: the whole batch); for a step given as a
        spmdsim.runtime.replay.Scalar, a callable the mask's kernel calls (each replay of a captured step
        draws that step's masks)."""
        if isinstance(step, Scalar):
            return partial(dropout_seed, self.cfg, step, site, micro)
        return dropout_seed(self.cfg, step, site, micro)

    def _row_out(self, y: Any) -> Any:
        """A row-parallel product's pending sum: Reduce_scatter onto the sequence (sp) or Allreduce. Where nothing
        is pending and y is laid out as the activations already (tp 1: a pipeline's stages), y itself: no move
        node (nothing moves; its backward passed the gradient on unchanged)."""
        layout = y._layout
        if layout.partial:
            y = redistribute(y, self.act)
        elif layout is not self.act and self._acts.get(id(layout)) is not layout:
            y = self._as_act(y)  # (an equal layout object: compared once)
        # bfloat16 operands: the pending sum was float32; summed, it is rounded once to the activations' dtype.
        policy = self.precision
        kept = self._activation
        if kept is None or kept[0] is not policy:  # the dtype by the policy object (a dtype's .name is ~3 us)
            kept = self._activation = (policy, policy.dtype("activation"))
        return y if y._local.dtype == kept[1] else ops.astype(y, kept[1])

    def _as_act(self, y: Any) -> Any:
        """y laid out as the activations between blocks (`act`): redistributed, or y itself where nothing is
        pending and its layout equals `act` already (tp 1: no move node, whose backward passed the gradient on
        unchanged; compared once per layout object)."""
        layout = y._layout
        if layout is self.act or self._acts.get(id(layout)) is layout:
            return y
        if layout.partial or layout != self.act:
            return redistribute(y, self.act)
        put(self._acts, id(layout), layout, 64)  # (held: its id is not reused while the entry lives)
        return y

    def _gathered(self, x: Any) -> Any:
        """The activations whole along the sequence (an Allgather with sp; nothing without)."""
        layout = x._layout
        if layout is self.full:
            return x
        seen = self._whole.get(id(layout))  # (the layout, whether it equals `full`): compared once per layout
        if seen is None or seen[0] is not layout:  # object (a pipeline stage receives its own; sp's act is not)
            seen = put(self._whole, id(layout), (layout, layout == self.full), 64)  # (held: its id is not reused)
        return x if seen[1] else redistribute(x, self.full)

    def _block(self, h: Any, layer: int, step: Optional[int], train: bool, micro: Optional[int],
               scale: float = 1.0) -> Any:
        # Each part's nodes are tagged with what they keep for backward (spmdsim.nn.autograd.kept_bytes).
        if self.kept == "megatron":
            return self._megatron_block(h, layer, step, train, micro, scale)
        p, cfg = self.use, self.cfg
        n = self._layers.get(layer)
        if n is None:
            n = self._layers[layer] = _Layer(cfg, layer)
        if self.fp8 is not None:  # the linear layers' products in FP8 (spmdsim.models.gpt.fp8_block)
            return fp8_block(self, h, n, step, train, micro, scale)
        T, B = h.global_shape[:2]
        with n.norm:
            a = self._gathered(self._normed(h, n.ln1w, n.ln1b))
        # x W (+ b), reshaped to the heads: one node each (spmdsim.nn.ops.fused); no key bias
        # (spmdsim.models.gpt.params)
        with n.attention:
            q = fused.einsum_bias("tbd,de->tbe", a, p[n.wq], p.get(n.bq), (T, B, cfg.heads, n.head_dim))
            k = fused.einsum_bias("tbd,de->tbe", a, p[n.wk], None, (T, B, n.kv, n.head_dim))
            v = fused.einsum_bias("tbd,de->tbe", a, p[n.wv], p.get(n.bv), (T, B, n.kv, n.head_dim))
        o = self._attend(n, q, k, v, step, train, micro)
        with n.attention:
            proj = self._row_out(fused.reshape_einsum(o, (T, B, cfg.d_model), "tbd,de->tbe", p[n.wo]))
            h = self._residual(h, proj, n.bo, n.resid1, step, train, micro)
        with n.norm:
            m = self._normed(h, n.ln2w, n.ln2b)
            m = m if n.moe and takes(m, cfg.moe) else self._gathered(m)  # (folded dropless experts take sp's)
        if n.moe:
            return self._moe_mlp(h, m, layer, step, train, micro, scale)
        with n.mlp:
            z = fused.einsum_bias("tbd,de->tbe", m, p[n.w1], p.get(n.b1))
            if n.swiglu:  # silu(m w1 + b1) * (m w3 + b3)
                m = ops.silu(z) * fused.einsum_bias("tbd,de->tbe", m, p[n.w3], p.get(n.b3))
            else:
                m = ops.gelu(z)
            out = self._row_out(ops.einsum("tbf,fd->tbd", m, p[n.w2]))
            return self._residual(h, out, n.b2, n.resid2, step, train, micro)

    def _attend(self, n: Any, q: Any, k: Any, v: Any, step: Optional[int], train: bool,
                micro: Optional[int]) -> Any:
        """Block `n`'s attention output from its heads q, k, v (T, B, heads, head_dim): RoPE and the grouped
        K and V widened (tagged attention), then softmax(q k^T / sqrt(head_dim), causal), dropped out, times v:
        one operator and node (tagged core; its values are those of einsum, masked_fill, softmax, dropout and
        einsum: spmdsim.nn.ops.attention)."""
        with n.attention:
            if n.rope:
                q, k = self._rope(q), self._rope(k)
            if n.grouped:
                k, v = self._grouped(k), self._grouped(v)
        drop = self.cfg.dropout if train else 0.0
        seed = self._seed(step, n.attn, micro) if drop else None
        with n.core:
            return self._core(q, k, v, drop, seed)

    def _core(self, q: Any, k: Any, v: Any, drop: float, seed: Any, kept: str = "graph") -> Any:
        """The causal attention core on sequence-first q, k, v; with a context axis by the model's method
        (spmdsim.models.gpt.context): "allgather" as without one (the core's rule gathers K and V over cp),
        "alltoall" on the heads split over tp and cp and whole sequences, "ring" by ring attention."""
        context = self.context
        if context is not None and context.method == "alltoall":
            back = q._layout
            heads = self._heads_layout(back)
            o = ops.attention(redistribute(q, heads), redistribute(k, heads), redistribute(v, heads), causal=True,
                              dropout=drop, seed=seed, batch_first=False, recompute=self._selective, kept=kept,
                              flash=self._flash, positions=self.positions)
            return redistribute(o, back)
        if context is not None and context.method == "ring":  # grouped K/V heads passed round the ring unrepeated
            return ring_attention(q, k, v, CONTEXT, balanced=context.balanced, dropout=drop, seed=seed)
        return ops.attention(q, k, v, causal=True, dropout=drop, seed=seed, batch_first=False,
                             recompute=self._selective, kept=kept, flash=self._flash, positions=self.positions)

    def _heads_layout(self, seq_split: Any) -> Any:
        """(T, B, H, D) whole along T with the heads over tp and cp: the all-to-all's layout for operands laid
        out `seq_split` (T over cp, the heads over tp)."""
        found = self._heads.get(id(seq_split))
        if found is None or found[0] is not seq_split:
            names = self.mesh.layout.alias_name
            heads = tensor_axes(names) + ((CONTEXT,) if CONTEXT in names else ())
            found = self._heads[id(seq_split)] = (seq_split, self.mesh.layout(None, self.batch, heads, None))
        return found[1]

    def _residual(self, h: Any, y: Any, bias: Optional[str], site: str, step: Optional[int], train: bool,
                  micro: Optional[int]) -> Any:
        """h + dropout(y + the bias `bias` where the model has one), the dropout's at `site` (none in eval mode or
        without cfg.dropout): the graph's add, dropout and add in one node (spmdsim.nn.ops.residual), which
        keeps what they kept."""
        p = self.cfg.dropout if train else 0.0
        b = None if bias is None else self.use.get(bias)
        return fused_residual(h, y, b, p, self._seed(step, site, micro) if p else None, mask_dims=(1, 0, 2))

    def _biased(self, y: Any, name: str) -> Any:
        """y plus the bias `name` where the model has one (GPTConfig.bias)."""
        b = self.use.get(name)
        return y if b is None else y + b

    def _norm(self, h: Any, name: str, kept: str = "graph") -> Any:
        """The norm `name` ("h0.ln1", "lnf") on h: GPTConfig.norm's, layer norm or RMSNorm (`kept` as
        ops.layer_norm's and ops.rms_norm's: "megatron", the fused norm that keeps x and its rows' statistics)."""
        return self._normed(h, name + ".w", name + ".b", kept)

    def _normed(self, h: Any, w: str, b: str, kept: str = "graph") -> Any:
        """`_norm` of the norm whose parameters are named `w` and `b` (RMSNorm has no `b`)."""
        p, cfg = self.use, self.cfg
        if cfg.norm == "rms":
            if kept == "megatron":
                return ops.rms_norm(h, p[w], cfg.ln_eps, kept="megatron")
            return ops.rms_norm(h, p[w], cfg.ln_eps)
        if kept == "megatron":
            return ops.layer_norm(h, p[w], p[b], cfg.ln_eps, kept="megatron")
        return ops.layer_norm(h, p[w], p[b], cfg.ln_eps)

    def _rope(self, x: Any) -> Any:
        """x (T, B, heads, head_dim) turned by the rotary embeddings (GPTConfig.positions "rope"): x cos +
        rotate_half(x) sin over the head dim, whole on every rank (local); x itself with learned positions."""
        cfg = self.cfg
        if cfg.positions != "rope":
            return x

        tables = self._rope_tables
        if tables is None:  # cos and sin (T, 1, 1, 2, Dh / 2); rotate_half's 2 x 2 turn of the halves
            dtype = self.precision.dtype("activation")
            whole = self.mesh.layout(None, None, None, None, None)
            tables = tuple(DTensor.from_global(self.mesh, t, whole, verify=False) for t in self._rope_values(dtype))
            turn = np.array([[0.0, 1.0], [-1.0, 0.0]], dtype)  # [x1, x2] -> [-x2, x1]
            tables += (DTensor.from_global(self.mesh, turn, self.mesh.layout(None, None), verify=False),)
            self._rope_tables = tables
        cos, sin, turn = tables
        T, B, n, Dh = x.global_shape
        # The head dim as its two halves (a view): the turn is a product over 2 (no slices and no
        # concatenation: one node where rotate_half's would be three), then x cos + rotate_half(x) sin.
        x = ops.reshape(x, (T, B, n, 2, Dh // 2))
        out = x * cos + ops.einsum("tbhkd,kj->tbhjd", x, turn) * sin
        return ops.reshape(out, (T, B, n, Dh))

    def _rope_values(self, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
        """The rotary tables (cos, sin) as (seq, 1, 1, 2, head_dim / 2) blocks of `dtype`, rows in the sequence's
        order (`_laid`). A dry run's are zeros that cost no memory (spmdsim.base.buffers.lazy_zeros): it reads no
        value, and at a sequence of 131,072 computing the tables took 0.7 s a pipeline stage."""
        cfg = self.cfg
        shape = (cfg.seq, 1, 1, 2, cfg.head_dim // 2)
        if self.mesh.engine.dry:
            return buffers.lazy_zeros(shape, dtype), buffers.lazy_zeros(shape, dtype)  # two blocks, as a run's
        return tuple(self._laid(t).reshape(shape).astype(dtype) for t in rope_tables(cfg.seq, cfg.head_dim))

    def _laid(self, table: np.ndarray) -> np.ndarray:
        """A table with a row per position (seq, ...) in the order the sequence is laid out (`positions`:
        context parallelism's balanced split), itself where that is the positions' order."""
        return table if self.positions is None else table[np.asarray(self.positions)]

    def _rotary(self, x: Any) -> Any:
        """`_rope`'s values under Megatron's kept set: its fused rotary (spmdsim.nn.ops.megatron.rotary), one node that
        keeps no block of x; its tables float32 beside bfloat16 activations (the fused kernel's), else theirs."""
        cfg = self.cfg
        if cfg.positions != "rope":
            return x
        tables = self._rotary_tables
        dtype = self.precision.dtype("activation")
        width = np.dtype(np.float32) if is_low(dtype) else dtype
        if tables is None or tables[0].dtype != width:
            tables = self._rotary_tables = self._rope_values(width)
        return megatron.rotary(x, *tables)

    def _grouped(self, x: Any) -> Any:
        """Grouped-query attention's keys or values (T, B, kv_heads, head_dim) repeated for their query heads
        (T, B, heads, head_dim): head j serves heads j G .. j G + G - 1, G = heads / kv_heads (on each rank
        its own: kv_heads split over tp like the heads); x itself when kv_heads is heads."""
        cfg = self.cfg
        if cfg.kv == cfg.heads:
            return x

        T, B = x.global_shape[:2]
        G = cfg.heads // cfg.kv
        ones = self._group_ones
        if ones is None or ones.dtype != x.dtype:  # times ones (1, 1, 1, G, 1): an element-wise copy, as Megatron's
            ones = self._group_ones = DTensor.from_global(  # expand (an element-wise copy of each head)
                self.mesh, np.ones((1, 1, 1, G, 1), x.dtype), self.mesh.layout(None, None, None, None, None),
                verify=False)
        x = ops.reshape(x, (T, B, cfg.kv, 1, cfg.head_dim)) * ones
        return ops.reshape(x, (T, B, cfg.heads, cfg.head_dim))

    def _megatron_block(self, h: Any, layer: int, step: Optional[int], train: bool, micro: Optional[int],
                        scale: float = 1.0) -> Any:
        """`_block`'s values from Megatron's fused pieces (spmdsim.nn.ops.megatron), which keep its set: the
        layer norms' inputs (and 2 numbers a row), the QKV and fc1 inputs (a sequence shard with sp),
        Q, K and V (one buffer), the attention core's probabilities, dropped-out probabilities and
        boolean mask, the projection's, GELU's and fc2's inputs, and two boolean dropout masks."""
        p, cfg = self.use, self.cfg
        pre = f"h{layer}."
        T, B, D, H = h.global_shape[0], h.global_shape[1], cfg.d_model, cfg.heads
        drop = cfg.dropout if train else 0.0

        def seed(site: str) -> Any:
            return self._seed(step, pre + site, micro) if drop else None

        with kept_as("layer norm"):
            a = self._norm(h, pre + "ln1", kept="megatron")
        with kept_as("attention"):
            names = [pre + f"attn.w{n}" for n in "qkv"]  # (an FP8 policy's scales: fp8_block.column, row)
            pairs = [(p[name], p.get(pre + f"attn.b{n}") if n != "k" else None) for n, name in zip("qkv", names)]
            if cfg.kv == H:
                qkv = ops.reshape(column(self, a, pairs, pre + "attn", names), (3, T, B, H, cfg.head_dim))
                q, k, v = qkv[0], qkv[1], qkv[2]  # views of one buffer
            else:  # grouped-query attention: Q, and K and V of fewer heads
                q = ops.reshape(column(self, a, pairs[:1], pre + "attn", names[:1]), (T, B, H, cfg.head_dim))
                kv = ops.reshape(column(self, a, pairs[1:], pre + "attn", names[1:]), (2, T, B, cfg.kv, cfg.head_dim))
                k, v = kv[0], kv[1]
            # grouped-query attention inside the core (as flash attention's): K and V at kv_heads, none repeated
            q, k = self._rotary(q), self._rotary(k)
        with kept_as("attention core"):
            o = self._core(q, k, v, drop, seed("attn"), "megatron")
        with kept_as("attention"):
            y = row(self, megatron.reshape(o, (T, B, D)), p[pre + "attn.wo"], pre + "attn.wo")
            h = self._bias_dropout_add(y, pre + "attn.bo", h, drop, seed("resid1"), pre + "resid1", step, train,
                                       micro)
        with kept_as("layer norm"):
            m = self._norm(h, pre + "ln2", kept="megatron")
            if cfg.is_moe(layer) and not takes(m, cfg.moe):  # the MoE layer reads the tokens whole on tp (gathered
                m = self._gathered(m)  # with sp), as the graph's; folded dropless experts take sp's as they are
        if cfg.is_moe(layer):
            return self._moe_mlp(h, m, layer, step, train, micro, scale)
        with kept_as("mlp"):
            ids = ("1", "3") if cfg.mlp == "swiglu" else ("1",)  # fc1 (and its gate's twin, stacked)
            z = column(self, m, [(p[pre + f"mlp.w{i}"], p.get(pre + f"mlp.b{i}")) for i in ids], pre + "mlp",
                       [pre + f"mlp.w{i}" for i in ids])
            # Megatron's fused bias_swiglu (keeps z, silu made again) on fc1's stacked output, or GELU
            act = megatron.swiglu(z) if cfg.mlp == "swiglu" else ops.gelu(z, kept="megatron")
            y = row(self, act, p[pre + "mlp.w2"], pre + "mlp.w2")
            return self._bias_dropout_add(y, pre + "mlp.b2", h, drop, seed("resid2"), pre + "resid2", step, train,
                                          micro)

    def _bias_dropout_add(self, y: Any, bias: str, h: Any, drop: float, seed: Any, site: str, step: Optional[int],
                          train: bool, micro: Optional[int]) -> Any:
        """h + dropout(y + bias): Megatron's fused node, which keeps the boolean mask alone, with or without the
        bias (GPTConfig.bias False: Megatron's bias_dropout_add with bias None; a sum of the graph's would keep
        the dropped-out y and the sum, which an add's backward never reads)."""
        return megatron.bias_dropout_add(y, self.use.get(bias), h, drop, seed, mask_dims=(1, 0, 2))

    def _moe_mlp(self, h: Any, m: Any, layer: int, step: Optional[int], train: bool, micro: Optional[int],
                 scale: float) -> Any:
        """The residual `h` plus an MoE layer's output (spmdsim.models.moe.layer) on the normalized tokens `m` (whole on
        tp), dropped out; its router losses kept for the step's loss. Both kept sets' blocks (the MoE node keeps
        what its backward reads under either; under "megatron" the residual is its bias_dropout_add, which keeps
        the dropout's mask alone).

        With full recomputation the block is a checkpointed region (spmdsim.nn.autograd.checkpoint), run in the
        forward without a graph: the losses' value joins the step's loss there, and their gradient rides on the
        block's output (`_with_losses`, Megatron's MoEAuxLossAutoScaler), so that the region recomputed in the
        backward (routing its tokens and exchanging them again, as Megatron's does) differentiates them once;
        the recomputation adds neither the losses nor the dispatch figures a second time."""
        pre = f"h{layer}."
        again = current().phase == "recompute"
        with kept_as("mlp"):
            out, losses = moe_layer(m, self.use, pre, self.cfg.moe,
                                                       None if again else self.moe_stats)
            if not again:
                self._router_losses.append(losses)
            out = self._as_act(out)  # with sp: a local slice (a redistribution)
            if self.kept == "megatron":  # Megatron's bias_dropout_add (no bias): the boolean mask kept alone
                drop = self.cfg.dropout if train else 0.0
                seed = self._seed(step, pre + "resid2", micro) if drop else None
                y = megatron.bias_dropout_add(out, None, h, drop, seed, mask_dims=(1, 0, 2))
            else:
                y = self._residual(h, out, None, pre + "resid2", step, train, micro)
        if self.recompute == "full":
            y = _with_losses(y, ops.resolved(losses) * float(scale))
        return y
