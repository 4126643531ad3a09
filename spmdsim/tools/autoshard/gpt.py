"""The GPT of `spmdsim.models.gpt` as an autoshard graph, every operator a node, and Megatron's layouts for it.

Pure (numpy only; no runtime, no mpi4py). `gpt_graph(cfg, devices)` follows
`spmdsim.models.gpt.parallel.GPT.loss` operator by operator: the token embedding, the
position embedding's add, per block the layer norm, the products' shared input
(an identity, where sequence parallelism Allgathers once), the Q, K and V products
(einsum ``btd,de->bte``) with their biases and head reshapes, the scores
(``bqhd,bkhd->bhqk``), their scale (``constant`` 1/sqrt(head_dim)), the causal softmax (the mask
folded in: ``spec`` "causal"),
the context (``bhqk,bkhd->bqhd``), the heads merged, the output projection,
its bias and the residual add, then the MLP (product, bias, GELU, product,
bias, residual); the final layer norm, the head tied to the token embedding
(``btd,vd->btv``), the flatten and the vocab-parallel cross-entropy (its node's ``source`` the
seeded targets): 25 nodes
a block plus 7 (107 at 4 layers). Dropout (a local mask) moves nothing and is
left out. The parameters are the model's own, stated once in `spmdsim.models.gpt.params`
(`gpt_params`): the names, shapes and initial values the reference and the ranks
start from (seeded weights, layer norms of ones and zeros), each node naming the
ones it reads. Weights are placed where a strategy wants them (the tied table once
per use: the search sums its gradient once per use, the reported backward once
where both uses lay it out alike, as the engine does). Activations are float64,
as the GPT trains.

`megatron(cfg, graph, devices, sp)` gives every node the layouts
`spmdsim.models.gpt.parallel` runs with on a (dp, tp=4) mesh (`spmdsim.models.gpt.layouts.megatron_layouts`):
column-parallel Q, K, V and fc1, row-parallel projections (Allreduce, or
Reduce_scatter onto the sequence with ``sp``), heads split over tp,
vocab-parallel embedding, head and cross-entropy.
"""
from __future__ import annotations

import math
from typing import Optional

from ...layouts.datagen import SeededTensor
from ...errors import OperatorError, SpmdsimError
from ...models.gpt.config import GPTConfig
from ...models.gpt.layouts import megatron_layouts, mesh_problem
from ...models.gpt.params import constant, param_specs, seeded
from ...layouts.layout import Layout
from ...base.validate import counted
from .graph import Constant, Graph, Hand, OpNode, ParamSpec, data_parallel
from ...models.axes import DATA, TENSOR

__all__ = ["gpt_graph", "gpt_params", "gpt_config", "megatron", "MEGATRON_TP", "FULLY_USE_ABOVE"]

#: Megatron's tensor-parallel degree in the hand-written layouts (examples/train_gpt.py: dp 2 x tp 4).
MEGATRON_TP = 4

#: Above this many devices the GPT's candidates are the strategies using every device.
FULLY_USE_ABOVE = 64

_DT = "float64"


def gpt_params(cfg: GPTConfig) -> dict[str, ParamSpec]:
    """The GPT's parameters by name, as `spmdsim.models.gpt.params` states them (`param_specs`): each one's
    initial values, the seeded tensor the model starts from (`seeded`) or its ones or zeros (`constant`)."""
    return {spec.name: ParamSpec(spec.name, seeded(cfg, spec) or Constant(spec.shape, _DT, constant(spec)))
            for spec in param_specs(cfg)}


def gpt_graph(cfg: GPTConfig, devices: int) -> Graph:
    """The GPT's training loss, one node per operator, with the ids arriving data parallel.

    Each node names the parameters it reads; their shapes and values are `gpt_params(cfg)`'s,
    and every one of them is read (the head reads the embedding's "wte": tied).
    """
    B, T, D, H, V, F = cfg.batch, cfg.seq, cfg.d_model, cfg.heads, cfg.vocab, 4 * cfg.d_model
    Dh = cfg.head_dim
    btd, heads, bhqk = (B, T, D), (B, T, H, Dh), (B, H, T, T)
    nodes: list[OpNode] = [OpNode("x", "input", (), (), (B, T), "int64",
                                  layout=data_parallel(devices, (B, T)),
                                  source=SeededTensor((B, T), "int64", cfg.seed, low=0, high=V))]
    weights = gpt_params(cfg)
    unread = set(weights)

    def add(name: str, kind: str, inputs: tuple, in_shapes: tuple, out: tuple, params: tuple = (),
            spec: str = "", **extra) -> str:
        unread.difference_update(params)
        nodes.append(OpNode(name, kind, inputs, in_shapes, out, _DT, tuple(weights[p] for p in params),
                            spec=spec, **extra))
        return name

    h = add("wte", "embedding", ("x",), ((B, T),), btd, ("wte",), "scatter")
    h = add("wpe", "pointwise", (h,), (btd,), btd, ("wpe",), "add")
    for layer in range(cfg.layers):
        p = f"h{layer}."
        a = add(p + "ln1", "layernorm", (h,), (btd,), btd, (p + "ln1.w", p + "ln1.b"))
        # The products' shared input (an identity): one hop into it, where sequence parallelism
        # Allgathers once for Q, K and V (spmdsim.models.gpt.parallel's `_gathered`).
        a = add(p + "qkv_in", "reshape", (a,), (btd,), btd)
        qkv = []
        for w in "qkv":
            y = add(p + w, "einsum", (a,), (btd,), btd, (p + "attn.w" + w,), "btd,de->bte")
            if w != "k":  # no key bias (spmdsim.models.gpt.params)
                y = add(p + w + "_bias", "pointwise", (y,), (btd,), btd, (p + "attn.b" + w,), "add")
            qkv.append(add(p + w + "_heads", "reshape", (y,), (btd,), heads))
        s = add(p + "scores", "einsum", tuple(qkv[:2]), (heads, heads), bhqk, spec="bqhd,bkhd->bhqk")
        s = add(p + "scale", "pointwise", (s,), (bhqk,), bhqk, spec="mul", constant=1.0 / math.sqrt(Dh))
        s = add(p + "softmax", "softmax", (s,), (bhqk,), bhqk, spec="causal")
        o = add(p + "context", "einsum", (s, qkv[2]), (bhqk, heads), heads, spec="bhqk,bkhd->bqhd")
        o = add(p + "merge", "reshape", (o,), (heads,), btd)
        o = add(p + "proj", "einsum", (o,), (btd,), btd, (p + "attn.wo",), "btd,de->bte")
        o = add(p + "proj_bias", "pointwise", (o,), (btd,), btd, (p + "attn.bo",), "add")
        h = add(p + "resid1", "pointwise", (h, o), (btd, btd), btd, spec="add")
        m = add(p + "ln2", "layernorm", (h,), (btd,), btd, (p + "ln2.w", p + "ln2.b"))
        m = add(p + "fc1", "einsum", (m,), (btd,), (B, T, F), (p + "mlp.w1",), "btd,df->btf")
        m = add(p + "fc1_bias", "pointwise", (m,), ((B, T, F),), (B, T, F), (p + "mlp.b1",), "add")
        m = add(p + "gelu", "gelu", (m,), ((B, T, F),), (B, T, F))
        m = add(p + "fc2", "einsum", (m,), ((B, T, F),), btd, (p + "mlp.w2",), "btf,fd->btd")
        m = add(p + "fc2_bias", "pointwise", (m,), (btd,), btd, (p + "mlp.b2",), "add")
        h = add(p + "resid2", "pointwise", (h, m), (btd, btd), btd, spec="add")
    h = add("lnf", "layernorm", (h,), (btd,), btd, ("lnf.w", "lnf.b"))
    z = add("head", "einsum", (h,), (btd,), (B, T, V), ("wte",), "btd,vd->btv")
    z = add("flatten", "reshape", (z,), ((B, T, V),), (B * T, V))
    targets = SeededTensor((B * T,), "int64", cfg.seed + 1, low=0, high=V)  # the next tokens' stand-in
    add("loss", "cross_entropy", (z,), ((B * T, V),), (), source=targets)
    if unread:
        raise OperatorError(f"no node of the GPT's graph reads parameters {sorted(unread)!r}, which "
                            "spmdsim.models.gpt.params gives the model")
    title = (f"GPT {counted(cfg.layers, 'layer')}, d_model {D}, {counted(H, 'head')}, seq {T}, batch {B}, "
             f"vocab {V}: "
             "training loss")
    return Graph("gpt", title, tuple(nodes), fully_use_above=FULLY_USE_ABOVE)


def gpt_config(graph: Graph) -> Optional[GPTConfig]:
    """The GPTConfig (dropout 0) whose `gpt_graph` is `graph`, node for node; None for any other graph."""
    nodes = graph.nodes
    try:
        batch, seq = nodes[0].out_shape
        wte = nodes[graph.index("wte")].params[0]
        vocab, d_model = wte.shape
        heads = nodes[graph.index("h0.q_heads")].out_shape[2]
        layers = sum(1 for n in nodes if n.name.endswith(".ln1"))
        # The embedding is uniform in +-sqrt(3) init_std (spmdsim.models.gpt.params.seeded).
        cfg = GPTConfig(vocab=vocab, d_model=d_model, heads=heads, layers=layers, seq=seq, batch=batch,
                        dropout=0.0, seed=nodes[0].source.seed, init_std=wte.source.high / math.sqrt(3.0))
    except (SpmdsimError, ValueError, IndexError, AttributeError):
        return None
    again = gpt_graph(cfg, nodes[0].layout.layout.num_devices)
    return cfg if again.nodes == nodes else None


def megatron(cfg: GPTConfig, graph: Graph, devices: int, sp: bool = False) -> Optional[tuple]:
    """Megatron's layouts for every node of `gpt_graph` on dp = devices / 4 x tp = 4 (None when they do
    not fit: `mesh_problem`), as `graph.Hand`s (None for the input)."""
    tp = MEGATRON_TP
    if devices % tp or mesh_problem(cfg, devices // tp, tp, sp):
        return None
    L = Layout((devices // tp, tp), (DATA, TENSOR))
    weights = megatron_layouts(cfg, L, sp)
    act, full = (L(DATA, TENSOR, None) if sp else L(DATA, None, None)), L(DATA, None, None)
    cols, head_split, scores = L(DATA, None, TENSOR), L(DATA, None, TENSOR, None), L(DATA, TENSOR, None, None)
    how = "Megatron, sequence parallel" if sp else "Megatron"
    out: list = [None]
    for node in graph.nodes[1:]:
        name, kind = node.name, node.kind
        leaf = name.split(".", 1)[-1]
        params = tuple(weights[p.name] for p in node.params)
        if kind == "embedding":
            ins, res = (L(DATA, None),), act
        elif kind == "layernorm" or leaf in ("wpe", "proj_bias", "fc2_bias", "resid1", "resid2"):
            ins, res = (act,) * len(node.inputs), act
        elif leaf == "qkv_in":
            ins, res = (full,), full
        elif leaf in ("q", "k", "v", "fc1", "head") or name == "head":
            ins, res = (full,), cols
        elif leaf in ("q_bias", "v_bias", "fc1_bias", "gelu"):
            ins, res = (cols,), cols
        elif leaf.endswith("_heads"):
            ins, res = (cols,), head_split
        elif leaf == "scores":
            ins, res = (head_split, head_split), scores
        elif leaf in ("scale", "softmax"):
            ins, res = (scores,), scores
        elif leaf == "context":
            ins, res = (scores, head_split), head_split
        elif leaf == "merge":
            ins, res = (head_split,), cols
        elif leaf in ("proj", "fc2"):
            ins, res = (cols,), act
        elif name == "flatten":
            ins, res = (cols,), L(DATA, TENSOR)
        else:  # the loss
            ins, res = (L(DATA, TENSOR),), L()
        out.append(Hand(ins, params, res, how))
    return tuple(out)
