"""Which mesh axes an MoE layer's experts use: Megatron-Core's parallel folding (pure: no runtime, no mpi4py).

Megatron-Core (Liu et al. 2025, "MoE Parallel Folding", arXiv:2504.14960; Megatron-LM's
``--expert-tensor-parallel-size``) gives the experts parallel groups of their own over the ranks attention
uses: attention's tp x dp and the experts' etp x ep x edp, with tp x dp = etp x ep x edp, each with tp
(etp) its fastest-varying rank. On the GPT's mesh ("dp", "ep", "tp") (spmdsim.models.gpt.layouts), where
every layer but the experts splits the batch over ("dp", "ep") and Megatron's tensor parallelism runs over
"tp", `MoEConfig.etp` picks one of three foldings:

- etp = tp (`etp` 0, the default, or the mesh's tp): the experts split over "ep", each column- then
  row-parallel over "tp" (its output summed there), the same experts on each "dp" rank: ep = the mesh's
  ep, edp = its dp.
- etp = 1 with tp > 1: attention's tp ranks folded into the experts' expert-parallel group: the experts split
  over ("ep", "tp") (ep = the mesh's ep x tp ranks, "ep" major), each whole on its rank, the same experts on
  each "dp" rank (edp = the mesh's dp). The tokens, whole on tp in the other layers, are each tp rank's share
  in the MoE layer (`Fold.token_map`): of the batch's sequences with a capacity (a sequence routed whole, as
  its capacity counts), of each sequence's tokens dropless; a local slice before routing (no bytes), and the
  layer's output is gathered over tp after the combine (one Allgather; its backward the slice again, or a
  Reduce_scatter of a gradient pending over tp). Megatron's dispatcher meets its tokens split over tp already
  (sequence parallelism) and all-to-alls over the same ep group.
- 1 < etp < tp (etp dividing tp): attention's tp is two mesh axes, "tp" of tp / etp ranks then "etp" of etp
  ranks (`spmdsim.models.axes.model_layout`; attention's tensor parallelism over ("tp", "etp"), "tp" major),
  and the experts fold the outer one into their ep as etp 1 folds the whole: split over ("ep", "tp") (ep = the
  mesh's ep x tp / etp), each column- then row-parallel over "etp" (fc2's output summed there), the tokens each
  "tp" rank's share (copies over "etp"), gathered over "tp" after the combine.

etp above tp, or not dividing it, is refused in one line (`fold_problem`). With context parallelism (a "cp"
axis: spmdsim.models.gpt.context) each sequence is split over cp in the MoE layer as in the others: cp's ranks
route their own chunks' tokens (with a capacity, each chunk its own) and hold the same experts (edp = the
mesh's dp x cp, as Megatron-Core's folding puts cp in the experts' groups).

    >>> from spmdsim.layouts.layout import Layout
    >>> fold_of(Layout((2, 2, 2), ("dp", "ep", "tp")), 1)
    Fold(ep_axes=('ep', 'tp'), etp_axes=(), edp_axes=('dp',), ep=4, etp=1, edp=2, folded=True)
    >>> fold_of(Layout((1, 2, 2, 2), ("dp", "ep", "tp", "etp")), 2)
    Fold(ep_axes=('ep', 'tp'), etp_axes=('etp',), edp_axes=('dp',), ep=4, etp=2, edp=1, folded=True)
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

from ..axes import CONTEXT, DATA, EXPERT, EXPERT_TENSOR, TENSOR, tensor_axes
from ...base.tables import put

__all__ = ["Fold", "fold_of", "fold_problem", "folded_tp", "fold_words", "mesh_ep", "split_problem"]


class Fold(NamedTuple):
    """The experts' axes on one mesh: `ep_axes` (the experts split over them, first major), `etp_axes` (each
    expert's columns split over them; () when whole), `edp_axes` (the ranks holding the same experts: their
    gradients summed there); their sizes; `folded`: the tokens sliced over tp before routing, gathered after."""

    ep_axes: tuple
    etp_axes: tuple
    edp_axes: tuple
    ep: int
    etp: int
    edp: int
    folded: bool

    @property
    def batch_axes(self) -> tuple:
        """The axes an MoE layer's tokens are split over inside it: every mesh axis but the experts' tp (cp's
        over the sequence, the others' over the batch or, folded dropless, tp's over the sequence too)."""
        return tuple(a for a in (DATA, EXPERT, CONTEXT, TENSOR, EXPERT_TENSOR) if a not in self.etp_axes)

    def token_map(self, names: tuple, dropless: bool) -> tuple:
        """The experts' tokens' (T, B, D) tensor map on a mesh of axes `names`: the batch over the mesh's axes but
        cp and the experts' tp; folded, tp's share (the part of tp outside the experts' own) is the batch's with
        a capacity (each sequence routed whole, as its capacity counts it), the sequence's dropless (each token
        alone: Megatron's sequence-parallel split). With context parallelism the sequence over cp, before tp's."""
        seq = tuple(a for a in (CONTEXT, TENSOR, EXPERT_TENSOR) if a in names and a not in self.etp_axes and
                    (a == CONTEXT or dropless and self.folded))
        batch = tuple(a for a in names if a in self.batch_axes and a not in seq)
        return (seq[0] if len(seq) == 1 else seq or None, batch, None)


def fold_problem(tp: int, etp: int, ep: Optional[int] = None) -> Optional[str]:
    """Why the experts cannot take `etp` (0: tp) beside attention's `tp` (one line), or None. `ep`: the experts'
    expert-parallel size where the caller has it (folded, a multiple of tp / etp: ep / (tp / etp) of it on the
    mesh's "ep")."""
    if etp in (0, tp):
        return None
    if etp > tp or tp % etp:
        return (f"etp {etp} with tp {tp}: the experts' tensor-parallel size must divide tp ({tp}): attention's tp "
                "ranks split into the experts' etp and a part folded into their ep (Megatron-Core's parallel "
                "folding)")
    if ep is not None and ep % (tp // etp):
        return (f"etp {etp} folds attention's tp {tp} ranks into the experts' ep: ep {ep} must be a multiple of "
                + (f"tp {tp}" if etp == 1 else f"tp / etp = {tp // etp}"))
    return None


def split_problem(names: tuple, sizes: dict, etp: int) -> Optional[str]:
    """Why the experts' `etp` does not fit a mesh of axis names `names` and sizes `sizes` (axis -> size), or None:
    1 < etp < tp needs attention's tp split as ("tp" tp / etp, "etp" etp: spmdsim.models.axes.model_layout), and
    an "etp" axis is there for that etp alone."""
    tp = sizes.get(TENSOR, 1) * sizes.get(EXPERT_TENSOR, 1)
    if sizes.get(EXPERT_TENSOR) == etp and 1 < etp < tp or not 1 < etp < tp and EXPERT_TENSOR not in names:
        return None
    return (f"etp {etp} with tp {tp} needs attention's tp as "
            + (f"two mesh axes, {TENSOR!r} {tp // etp} and {EXPERT_TENSOR!r} {etp}" if 1 < etp < tp else
               f"one mesh axis {TENSOR!r}")
            + f" (spmdsim.models.axes.model_layout); got the axes {names!r} of sizes "
            f"{tuple(sizes[a] for a in names)!r}")


def folded_tp(tp: int, etp: int) -> int:
    """How many of attention's `tp` ranks the experts of tp `etp` (0: tp) fold into their ep: tp / etp where etp
    is below tp and divides it, else 1 (not folded)."""
    return tp // etp if 0 < etp < tp and tp % etp == 0 else 1


def fold_words(cfg: Any, dp: int, ep: int, tp: int) -> list[str]:
    """A header's words on folded experts (a GPTConfig `cfg` whose experts' etp is below tp, on the mesh's `dp`,
    `ep` and attention's `tp`): attention's groups, the experts', who routes what (examples/train_moe_gpt.py)."""
    moe = cfg.moe
    etp, by = moe.etp, tp // moe.etp  # (by: the tp ranks folded into each experts' group's ep)
    who = "each tp rank" if etp == 1 else f"each of tp's {by} parts (its etp {etp} ranks alike)"
    routed = (f"{cfg.seq // by} of each sequence's {cfg.seq} tokens" if moe.dropless else
              f"{cfg.batch // (dp * ep * by)} of its group's {cfg.batch // (dp * ep)} sequences")
    return [f"attention tp {tp} x dp {dp * ep};",
            f"experts etp {etp} x ep {ep * by} x edp {dp}, {moe.experts // (ep * by)} per rank;",
            f"{who} routes its own {routed}"]


def mesh_ep(ep: int, tp: int, etp: int) -> int:
    """The size of the mesh's "ep" axis for the experts' expert-parallel size `ep`: ep itself, or folded
    (0 < etp < tp) ep / (tp / etp) (the tp ranks outside etp make up the rest)."""
    return ep // (tp // etp) if 0 < etp < tp else ep


def fold_of(layout: Any, etp: int) -> Fold:
    """The experts' Fold on device matrix `layout` (axes "dp", "ep", "tp", any of them absent) for `etp`
    (MoEConfig.etp: 0 means the mesh's tp); on a mesh whose tp is split ("tp", "etp": `mesh_problem` holds the
    "etp" axis to `etp`), the experts' tp is "etp". One object per (layout, etp), kept."""
    key = (id(layout), etp)
    seen = _FOLDS.get(key)
    if seen is not None and seen[0] is layout:
        return seen[1]
    names = tuple(layout.alias_name)
    size = {a: (layout.axis_size(a) if a in names else 1) for a in (DATA, EXPERT, CONTEXT, TENSOR, EXPERT_TENSOR)}
    tensor, tp = tensor_axes(names), size[TENSOR] * size[EXPERT_TENSOR]
    here = lambda *axes: tuple(a for a in axes if a in names)  # noqa: E731
    edp_axes, edp = here(DATA, CONTEXT), size[DATA] * size[CONTEXT]
    if etp in (0, tp) or etp > tp:  # (etp above tp refused by `fold_problem`)
        fold = Fold(here(EXPERT), tensor, edp_axes, size[EXPERT], tp, edp, False)
    else:  # folded: attention's tp ranks outside the experts' own tp in their ep ("etp": `split_problem`)
        inner = tensor[1:] if etp > 1 else ()
        fold = Fold(here(EXPERT) + tensor[:len(tensor) - len(inner)], inner, edp_axes, size[EXPERT] * tp // etp,
                    etp, edp, True)
    put(_FOLDS, key, (layout, fold), 64)  # (held: its id is not reused while the entry lives)
    return fold


_FOLDS: dict = {}  # (id(device matrix), etp) -> (it, its Fold)
