"""Megatron's plan for the GPT's parameters on a (dp, tp) mesh: pure (numpy only; no runtime, no mpi4py).

Each parameter of `spmdsim.models.gpt.params` gets a TensorLayout on a ``("dp", "tp")``
layout by its role in Megatron's tensor parallelism (docs/reference/operators.md, "A GPT"):

| parameter                | layout          | why                                                   |
| ------------------------ | --------------- | ----------------------------------------------------- |
| wte, head.w (V, D)       | ("tp", None)    | vocab-parallel embedding, and the head's columns      |
|                          |                 | (V padded to a multiple of cfg.vocab_pad_to)          |
| wpe (T, D)               | (None, None); ("tp", None) with sp | added to the sequence-split activations |
| wq, wk, wv, w1, w3 (D, *) | (None, "tp")   | column-parallel: each rank its heads / hidden columns |
| bq, bv, b1, b3 (no key bias) | ("tp",)     | split like the columns                                |
| wo, w2 (*, D)            | ("tp", None)    | row-parallel: a pending sum, resolved by one collective |
| bo, b2, ln*.w, ln*.b     | (None,)         | replicated                                            |
| moe.router (D, E)        | (None, None)    | replicated: every rank routes its own tokens          |
| moe.w1, moe.w3 (E, D, F) | ("ep", None, "tp") | experts over ep, each column-parallel over tp      |
| moe.b1, moe.b3 (E, F)    | ("ep", "tp")    | split like w1's experts and columns                   |
| moe.w2 (E, F, D)         | ("ep", "tp", None) | experts over ep, each row-parallel over tp         |
| moe.b2 (E, D)            | ("ep", None)    | experts over ep                                       |

The MoE rows (spmdsim.models.moe, docs/howto/experts.md) need an "ep" axis: the layout
``(dp, ep, tp)`` with the batch split over ("dp", "ep") in the other layers. With the experts' etp 1
(MoEConfig.etp, Megatron-Core's parallel folding: spmdsim.models.moe.fold) each expert's weights are whole,
the experts split over ("ep", "tp"): moe.w1 (("ep", "tp"), None, None), moe.b1 (("ep", "tp"), None), ... With
an etp between 1 and tp the mesh's tp is two axes ("tp", "etp") (spmdsim.models.axes.model_layout): the tables'
"tp" entries are ("tp", "etp") (attention over both, "tp" major) and the experts' columns split over "etp":
moe.w1 (("ep", "tp"), None, "etp"), moe.w2 (("ep", "tp"), "etp", None).

The model on DTensors (`spmdsim.models.gpt.parallel.GPT`) runs with these layouts, and
`spmdsim autoshard --network gpt` takes them as the hand-written ones
(`spmdsim.tools.autoshard.gpt.megatron`). `dialect_layouts` writes the same plan in
MindSpore's, JAX's, DTensor's or OneFlow's words; `mesh_problem` says why a
model does not fit a (dp, tp) mesh.
"""
from __future__ import annotations

import functools

from typing import Optional

from ...errors import SpmdsimError
from ...layouts.layout import Layout, TensorLayout
from .config import GPTConfig
from .params import param_specs
from ..axes import EXPERT, EXPERT_TENSOR, TENSOR, tensor_entry
from ..moe.fold import fold_of, fold_problem, folded_tp
from ...layouts.dialects.dtensor import placements_to_layout
from ...layouts.dialects.partition_spec import partition_spec_to_layout
from ...layouts.dialects.sbp import sbp_to_layout

__all__ = ["megatron_layouts", "dialect_layouts", "DIALECTS", "batch_split", "folded_by", "mesh_problem", "written"]


def batch_split(dp: int, ep: int, by_tp: int = 1, etp: int = 1) -> str:
    """What a batch is split over, as a refusal names it: dp (x ep); `by_tp` > 1, folded experts with a capacity
    (spmdsim.models.moe.fold, their own tp `etp`), whose tp ranks outside etp each route their own share of the
    batch as well."""
    if by_tp > 1:
        return f"edp {dp} x ep {ep * by_tp} = {dp * ep * by_tp} (etp {etp}: each tp rank routes its own share)"
    return f"dp {dp} x ep {ep} = {dp * ep}" if ep > 1 else f"dp {dp}"


def folded_by(cfg: GPTConfig, tp: int) -> int:
    """How many of attention's `tp` ranks `cfg`'s experts fold into their ep (spmdsim.models.moe.fold): tp / etp
    where their etp is below tp, else 1."""
    return folded_tp(tp, cfg.expert_tp)


def mesh_problem(cfg: GPTConfig, dp: int, tp: int, sp: bool, ep: int = 1) -> Optional[str]:
    """Why the model cannot run on a (dp, tp) mesh, or a (dp, ep, tp) one (one line), or None. `tp`: attention's
    (over "tp" and "etp" where split); `ep`: the mesh's "ep". With the experts' etp below tp (MoEConfig.etp,
    spmdsim.models.moe.fold) the experts are split over ep x tp / etp ranks and each of the tp / etp ranks routes
    its own share of the batch, split over dp x ep x tp / etp (dropless: of each sequence's tokens)."""
    moe = cfg.moe
    if ep > 1 and moe is None:
        return f"ep {ep} splits experts, and this model has none (give it MoE layers or ep 1)"
    by = folded_by(cfg, tp)
    folded = by > 1
    etp = tp // by
    if moe is not None:
        hidden, eps = cfg.expert_hidden, ep * by
        checks = [(fold_problem(tp, moe.etp), fold_problem(tp, moe.etp)),
                  (moe.experts % eps, f"experts {moe.experts} are not divisible by ep {eps} (experts are split "
                                      "over ep)"),
                  (hidden % etp, f"the experts' hidden width {hidden} is not divisible by "
                                 f"{'e' if folded else ''}tp {etp}")]
        problem = next((text for bad, text in checks if bad), None)
        if problem:
            return problem
    by_batch = by if folded and not moe.dropless else 1  # (dropless, each rank routes its share of the tokens)
    batch = batch_split(dp, ep, by_batch, etp)
    checks = [(cfg.batch % (dp * ep * by_batch), f"batch {cfg.batch} is not divisible by {batch}"),
              (folded and moe.dropless and cfg.seq % by,
               f"seq {cfg.seq} is not divisible by tp {by} (etp {etp}, dropless: each tp rank routes its share of "
               "the tokens)"),
              (cfg.heads % tp, f"heads {cfg.heads} is not divisible by tp {tp} (heads are split over tp)"),
              (cfg.kv % tp, f"kv_heads {cfg.kv} is not divisible by tp {tp} (key/value heads are split over tp, "
                            "Megatron's num_query_groups % tp == 0)"),
              (cfg.hidden % tp, f"the MLP's hidden width ffn {cfg.hidden} is not divisible by tp {tp} (its "
                                "columns are split over tp)"),
              (cfg.padded_vocab % tp, _vocab_problem(cfg, tp)),
              (sp and cfg.seq % tp, f"seq {cfg.seq} is not divisible by tp {tp} (sequence parallelism)")]
    return next((text for bad, text in checks if bad), None)


def _vocab_problem(cfg: GPTConfig, tp: int) -> str:
    """What to say when tp does not divide the embedding's rows: pad the vocabulary (to a multiple of tp)."""
    if cfg.padded_vocab == cfg.vocab:
        return (f"vocab {cfg.vocab} is not divisible by tp {tp} (vocab-parallel embedding); pad it to a multiple "
                f"of tp (GPTConfig vocab_pad_to, --pad-vocab-to; Megatron pads to 128 x tp = {128 * tp})")
    return (f"vocab {cfg.vocab} padded to a multiple of {cfg.vocab_pad_to} is {cfg.padded_vocab}, not divisible by "
            f"tp {tp} (vocab-parallel embedding); pad to a multiple of tp (Megatron pads to 128 x tp = {128 * tp})")


def _role(name: str, sp: bool) -> str:
    """A parameter's place in Megatron's plan: "rows" split, "columns" split, a split "vector", or "whole"."""
    leaf = name.rsplit(".", 1)[-1]
    if ".moe." in name:
        return "expert " + leaf
    if name in ("wte", "head.w") or leaf in ("wo", "w2") or (name == "wpe" and sp):
        return "rows"
    if leaf in ("wq", "wk", "wv", "w1", "w3"):
        return "columns"
    if leaf in ("bq", "bv", "b1", "b3"):
        return "vector"
    return "whole"


#: Each split role's tensor map: which mesh axis cuts which dim (the module's table; "whole" is all None).
_MAPS = {"rows": (TENSOR, None), "columns": (None, TENSOR), "vector": (TENSOR,), "expert w1": (EXPERT, None, TENSOR),
         "expert b1": (EXPERT, TENSOR), "expert w3": (EXPERT, None, TENSOR), "expert b3": (EXPERT, TENSOR),
         "expert w2": (EXPERT, TENSOR, None), "expert b2": (EXPERT, None)}


def megatron_layouts(cfg: GPTConfig, layout: Layout, sp: bool = False) -> dict[str, TensorLayout]:
    """Each parameter's TensorLayout on a ("dp", "tp") layout (the module's table)."""
    return dict(_megatron_layouts(cfg, layout, bool(sp)))


def _entries(role: str, ndim: int, names: tuple, folded: bool) -> tuple:
    """A parameter's tensor map by its `role` (`_MAPS`) on a mesh of axis names `names`: tp's entries over
    attention's tp (spmdsim.models.axes.tensor_entry: "tp", or ("tp", "etp") where the experts have a tp of their
    own); `folded` (the experts' etp below tp, spmdsim.models.moe.fold): an expert's weights split over "ep" and
    the tp outside "etp" by expert, their columns over "etp" (whole without it)."""
    entries = _MAPS.get(role, (None,) * ndim)
    tensor = tensor_entry(names) or None
    if not folded or not role.startswith("expert "):
        return tuple(tensor if e == TENSOR else e for e in entries)
    inner = EXPERT_TENSOR if EXPERT_TENSOR in names else None
    return tuple((EXPERT, TENSOR) if e == EXPERT else inner if e == TENSOR else e for e in entries)


def _folded(cfg: GPTConfig, layout: Layout) -> bool:
    """Whether `cfg`'s experts fold attention's tp into their ep on device matrix `layout`."""
    return cfg.moe is not None and EXPERT in layout.alias_name and TENSOR in layout.alias_name and \
        fold_of(layout, cfg.moe.etp).folded


@functools.lru_cache(maxsize=16)  # each stage of a pipeline (and each dry-run representative) asks alike
def _megatron_layouts(cfg: GPTConfig, layout: Layout, sp: bool) -> dict[str, TensorLayout]:
    names = set(layout.alias_name)
    folded = _folded(cfg, layout)
    out = {}
    for s in param_specs(cfg):
        entries = _entries(_role(s.name, sp), len(s.shape), tuple(layout.alias_name), folded)
        out[s.name] = _tensor_layout(layout, tuple(e if e is None or isinstance(e, tuple) or e in names else None
                                                   for e in entries))
    return out


@functools.lru_cache(maxsize=256)
def _tensor_layout(layout: Layout, entries: tuple) -> TensorLayout:
    """``layout(*entries)``, one object for equal arguments: every layer's parameters of one role share it, and
    a search's dry runs (models of other depths on the same meshes) find it again with what it worked out (its
    shards' shapes and bounds, its plans), where a new one works each out again at its first use."""
    return layout(*entries)


#: Megatron's plan as each dialect writes it on the (dp, tp) mesh: per role, a parameter's text.
DIALECTS = {
    "mindspore": {"rows": (TENSOR, "None"), "columns": ("None", TENSOR), "vector": (TENSOR,), "whole": ("None",)},
    "jax": {"rows": (TENSOR, None), "columns": (None, TENSOR), "vector": (TENSOR,), "whole": (None,)},
    "dtensor": {"rows": "R,S(0)", "columns": "R,S(1)", "vector": "R,S(0)", "whole": "R,R"},
    "oneflow": {"rows": "B,S(0)", "columns": "B,S(1)", "vector": "B,S(0)", "whole": "B,B"},
}


def dialect_layouts(cfg: GPTConfig, layout: Layout, dialect: str, sp: bool = False) -> dict[str, TensorLayout]:
    """`megatron_layouts` written in `dialect` ("mindspore", "jax", "dtensor" or "oneflow") and converted
    by spmdsim.layouts.dialects: the same TensorLayouts, whichever dialect wrote them."""
    if dialect not in DIALECTS:
        raise SpmdsimError(f"dialect {dialect!r} is not one of {sorted(DIALECTS)!r}")
    return dict(_dialect_layouts(cfg, layout, dialect, bool(sp)))


def written(dialect: str, role: str, ndim: int, names: tuple, folded: bool = False) -> object:
    """How `dialect` writes a parameter of `role` (`_role`: "rows", "columns", "vector", "whole", "expert w1"
    ...) with `ndim` dims on a mesh of axes `names`: MindSpore's tensor_map of axis names ("None" where whole),
    a JAX PartitionSpec's entries, DTensor's placements ("S(dim)" or "R" per mesh axis) or OneFlow's nd SBP
    ("S(dim)" or "B"). On ("dp", "tp") these are `DIALECTS`' texts; an MoE mesh ("dp", "ep", "tp") adds the
    experts' roles and an axis to DTensor's and OneFlow's; `folded` (etp below tp) their experts over ("ep", "tp"),
    their columns over "etp" where `names` has it."""
    entries = _entries(role, ndim, tuple(names), folded)
    if dialect == "mindspore":
        return tuple("None" if e is None else e for e in entries)
    if dialect == "jax":
        return tuple(entries)
    whole = "R" if dialect == "dtensor" else "B"
    dims = {a: d for d, e in enumerate(entries) for a in ((e,) if isinstance(e, str) else e or ())}
    return ",".join(f"S({dims[a]})" if a in dims else whole for a in names)


@functools.lru_cache(maxsize=16)  # every rank (and each dry-run representative) asks alike: ~1,500 layouts at 96 layers
def _dialect_layouts(cfg: GPTConfig, layout: Layout, dialect: str, sp: bool) -> dict[str, TensorLayout]:
    shape, names = layout.device_matrix, tuple(layout.alias_name)
    folded = _folded(cfg, layout)
    out = {}
    for spec in param_specs(cfg):
        ndim = len(spec.shape)
        text = written(dialect, _role(spec.name, sp), ndim, names, folded)
        if dialect == "mindspore":  # Layout(device_matrix, alias_name)(tensor_map)
            out[spec.name] = layout(*text)
        elif dialect == "jax":
            out[spec.name] = partition_spec_to_layout(text, shape, ndim, names)
        elif dialect == "dtensor":
            out[spec.name] = placements_to_layout(text, shape, ndim, names)
        else:
            out[spec.name] = sbp_to_layout(text, shape, ndim, names)
    return out
