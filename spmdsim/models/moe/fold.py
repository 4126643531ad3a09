"""Which mesh axes an MoE layer's experts use: Megatron-Core's parallel folding (pure: no runtime, no mpi4py).

Megatron-Core (Liu et al. 2025, "MoE Parallel Folding", arXiv:2504.14960; Megatron-LM's
``--expert-tensor-parallel-size``) gives the experts parallel groups of their own over the ranks attention
uses: attention's tp x dp and the experts' etp x ep x edp, with tp x dp = etp x ep x edp, each with tp
(etp) its fastest-varying rank. On the GPT's mesh ("dp", "ep", "tp") (spmdsim.models.gpt.layouts), where
every layer but the experts splits the batch over ("dp", "ep") and Megatron's tensor parallelism runs over
"tp", `MoEConfig.etp` picks one of two foldings:

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

Other sizes (1 < etp < tp, or etp > tp) need a mesh axis the GPT's mesh does not have: refused in one line
(`fold_problem`). With context parallelism (a "cp" axis: spmdsim.models.gpt.context) each sequence is split
over cp in the MoE layer as in the others: cp's ranks route their own chunks' tokens (with a capacity, each
chunk its own) and hold the same experts (edp = the mesh's dp x cp, as Megatron-Core's folding puts cp in the
experts' groups).

    >>> from spmdsim.layouts.layout import Layout
    >>> fold_of(Layout((2, 2, 2), ("dp", "ep", "tp")), 1)
    Fold(ep_axes=('ep', 'tp'), etp_axes=(), edp_axes=('dp',), ep=4, etp=1, edp=2, folded=True)
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

from ..axes import CONTEXT, DATA, EXPERT, TENSOR

__all__ = ["Fold", "fold_of", "fold_problem", "mesh_ep"]


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
        return tuple(a for a in (DATA, EXPERT, CONTEXT, TENSOR) if a not in self.etp_axes)

    def token_map(self, names: tuple, dropless: bool) -> tuple:
        """The experts' tokens' (T, B, D) tensor map on a mesh of axes `names`: the batch over the mesh's axes but
        cp and the experts' tp; folded, tp's share is the batch's with a capacity (each sequence routed whole, as
        its capacity counts it), the sequence's dropless (each token alone: Megatron's sequence-parallel split).
        With context parallelism the sequence over cp, before tp's."""
        seq = tuple(a for a in (CONTEXT, TENSOR) if a in names and (a == CONTEXT or dropless and self.folded))
        batch = tuple(a for a in names if a in self.batch_axes and a not in seq)
        return (seq[0] if len(seq) == 1 else seq or None, batch, None)


def fold_problem(tp: int, etp: int, ep: Optional[int] = None) -> Optional[str]:
    """Why the experts cannot take `etp` (0: tp) beside attention's `tp` (one line), or None. `ep`: the experts'
    expert-parallel size where the caller has it (folded, a multiple of tp: ep / tp of it on the mesh's "ep")."""
    if etp in (0, tp):
        return None
    if etp != 1:
        return (f"etp {etp} with tp {tp}: the experts' tensor-parallel size must be tp ({tp}) or 1 (attention's tp "
                "ranks folded into the experts' ep, Megatron-Core's parallel folding)")
    if ep is not None and ep % tp:
        return (f"etp 1 folds attention's tp {tp} ranks into the experts' ep: ep {ep} must be a multiple of tp "
                f"{tp}")
    return None


def mesh_ep(ep: int, tp: int, etp: int) -> int:
    """The size of the mesh's "ep" axis for the experts' expert-parallel size `ep`: ep itself, or folded (etp 1,
    tp > 1) ep / tp (the tp ranks make up the rest)."""
    return ep // tp if etp == 1 and tp > 1 else ep


def fold_of(layout: Any, etp: int) -> Fold:
    """The experts' Fold on device matrix `layout` (axes "dp", "ep", "tp", any of them absent) for `etp`
    (MoEConfig.etp: 0 means the mesh's tp); one object per (layout, etp), kept."""
    key = (id(layout), etp)
    seen = _FOLDS.get(key)
    if seen is not None and seen[0] is layout:
        return seen[1]
    names = tuple(layout.alias_name)
    size = {a: (layout.axis_size(a) if a in names else 1) for a in (DATA, EXPERT, CONTEXT, TENSOR)}
    tp = size[TENSOR]
    here = lambda *axes: tuple(a for a in axes if a in names)  # noqa: E731
    if etp == 1 and tp > 1:
        fold = Fold(here(EXPERT, TENSOR), (), here(DATA, CONTEXT), size[EXPERT] * tp, 1, size[DATA] * size[CONTEXT],
                    True)
    else:
        fold = Fold(here(EXPERT), here(TENSOR), here(DATA, CONTEXT), size[EXPERT], tp, size[DATA] * size[CONTEXT],
                    False)
    if len(_FOLDS) >= 64:
        _FOLDS.clear()
    _FOLDS[key] = (layout, fold)  # (held: its id is not reused while the entry lives)
    return fold


_FOLDS: dict = {}  # (id(device matrix), etp) -> (it, its Fold)
