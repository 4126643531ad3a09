"""Which tokens an MoE layer takes, and how the folded experts hold theirs (pure: the layouts alone).

`input_problem` refuses a layout the layer would silently get wrong; `takes` says whether folded dropless
experts (spmdsim.models.moe.fold) take the tokens as sequence parallelism leaves them; `_expert_layout` is the
folded experts' own tokens' layout (spmdsim.models.moe.fold.Fold.token_map) on a device matrix.
"""
from __future__ import annotations

from typing import Any, Optional

from ...layouts.notation import format_tensor_map, normalize_entry
from .config import MoEConfig
from .fold import fold_of
from ...base.tables import put

__all__ = ["input_problem", "takes"]


def input_problem(x: Any, etp: int = 0, dropless: bool = False) -> Optional[str]:
    """Why the MoE layer cannot take `x` as laid out (one line, the same on every rank), or None.

    The layer counts on each rank holding whole sequences of its own: it routes a rank's local block
    sequence by sequence (the capacity is per sequence), sums the load-balancing loss's counts over the
    mesh's axes other than tp, and sends every feature of a token to its experts. A batch copied over one
    of those axes counts its tokens twice (the aux loss doubled), a sequence split over tp routes and caps
    pieces of it as sequences, features split break the products, pending sums route unsummed tokens: each
    a wrong answer without an error, so each is refused. Axes of size 1 split nothing and are ignored.
    `etp`: the experts' (MoEConfig.etp); folded (etp below tp) the experts' own tokens, inside the layer,
    are split over every axis but "etp" (spmdsim.models.moe.fold.Fold.token_map: tp's over the sequence when `dropless`,
    where no capacity counts a sequence's tokens).
    """
    L = x.layout
    fold = fold_of(L.layout, etp)
    big = lambda axes: {a for a in axes if L.layout.axis_size(a) > 1}  # noqa: E731
    want_T, want_batch, _ = fold.token_map(tuple(L.layout.alias_name), dropless)
    seq = normalize_entry(want_T)
    want_T, want = big(seq), big(want_batch)
    T, batch, D = L.tensor_map
    if big(T) != want_T or big(D) or big(batch) != want or L.addend_axes:
        expected = format_tensor_map((tuple(a for a in seq if a in want_T),
                                      tuple(a for a in L.layout.alias_name if a in want), ()))
        which = ("the mesh's axes other than tp" if not fold.folded else "the mesh's axes (etp 1: the experts' tokens)"
                 if not fold.etp_axes else f"the mesh's axes other than {fold.etp_axes[0]} (etp {fold.etp}: the "
                 "experts' tokens)")
        return (f"the MoE layer's input (tokens, batch, features) is laid out {L}; expected its batch split over "
                f"{which} and nothing else split or pending: {expected}")
    return None


def takes(x: Any, moe: Optional[MoEConfig]) -> bool:
    """Whether `moe_layer` takes `x` as laid out beside the usual tokens whole on tp: folded dropless experts
    (spmdsim.models.moe.fold) given their own tokens, each sequence split over tp (sequence parallelism's
    layout, as Megatron's dispatcher meets them): no Allgather before the layer, none after. Checked once per
    layout object."""
    if moe is None or not moe.dropless or moe.etp != 1:
        return False
    layout = x._layout
    seen = _TAKEN.get(id(layout))
    if seen is None or seen[0] is not layout:
        seen = put(_TAKEN, id(layout),
                   (layout, fold_of(layout.layout, 1).folded and input_problem(x, 1, True) is None), 64)
    return seen[1]


_TAKEN: dict = {}  # id(tokens' layout) -> (it, `takes`' answer for folded dropless experts)


def _expert_layout(mesh: Any, fold: Any, dropless: bool) -> Any:
    """The folded experts' tokens (T, B, D) on device matrix `mesh` (`fold.token_map`: tp's share of the batch,
    or dropless of the sequence), one object per device matrix and mode (a redistribution's plan found by it)."""
    seen = _EXPERT_LAYOUTS.get((id(mesh), dropless))
    if seen is not None and seen[0] is mesh:
        return seen[1]
    layout = mesh(*fold.token_map(tuple(mesh.alias_name), dropless))
    put(_EXPERT_LAYOUTS, (id(mesh), dropless), (mesh, layout), 64)  # (held)
    return layout


_EXPERT_LAYOUTS: dict = {}  # (id(device matrix), dropless) -> (it, `_expert_layout`'s answer)
