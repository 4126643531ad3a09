"""The models' mesh axes in one table: which axis name plays which role (pure: no imports of the package).

The GPT (spmdsim.models.gpt), its MoE layers (spmdsim.models.moe), the estimate and autoshard name
their mesh axes from `ROLES` and nowhere else: the batch over "dp", Megatron's tensor parallelism over
"tp", the pipeline's stages over "pp", the experts over "ep", the sequence over "cp" (context parallelism);
with hybrid sharding (HSDP) the parameters over "fs", the batch over ("dp", "fs"). Where the experts keep a
tensor-parallel size of their own between 1 and tp (spmdsim.models.moe.fold) attention's tp is two axes, "tp"
(tp / etp ranks) then "etp" (etp ranks, fastest), and its tensor parallelism runs over both ("tp" major:
`tensor_axes`, `tensor_entry`, `tensor_size`). A role is one of
spmdsim.runtime.mesh.AXIS_ROLES; a mesh the models make is given these roles (`roles_of`), and code
running on a mesh asks it (``mesh.axis("tensor")``) or this table for the axis of a role.

    >>> from spmdsim.models.axes import ROLES, TENSOR
    >>> TENSOR, ROLES["tensor"]
    ('tp', 'tp')
"""
from __future__ import annotations

from typing import Any, Iterable

__all__ = ["ROLES", "DATA", "TENSOR", "PIPELINE", "EXPERT", "CONTEXT", "SHARD", "EXPERT_TENSOR", "AXIS_ORDER",
           "roles_of", "axis_of", "model_layout", "tensor_axes", "tensor_coord", "tensor_entry", "tensor_size"]

#: role (spmdsim.runtime.mesh.AXIS_ROLES) -> the name of the models' axis that plays it.
ROLES = {"data": "dp", "tensor": "tp", "pipeline": "pp", "expert": "ep", "context": "cp", "shard": "fs"}
#: The axes by role, for code that names one.
DATA, TENSOR, PIPELINE, EXPERT = ROLES["data"], ROLES["tensor"], ROLES["pipeline"], ROLES["expert"]
CONTEXT = ROLES["context"]
#: HSDP's shard group (spmdsim.nn.fsdp): the parameters split over it, replicated over DATA's groups.
SHARD = ROLES["shard"]
#: The inner part of attention's tp where the experts' tp (etp) is between 1 and tp: the experts' tp axis.
EXPERT_TENSOR = "etp"
#: The GPT's mesh axes in `model_layout`'s order, outermost first.
AXIS_ORDER = (PIPELINE, DATA, SHARD, EXPERT, CONTEXT, TENSOR, EXPERT_TENSOR)


def roles_of(names: Iterable[str]) -> dict[str, str]:
    """The roles of the axes `names` has (role -> axis), read from `ROLES`: a Mesh's ``roles=``."""
    names = tuple(names)
    return {role: axis for role, axis in ROLES.items() if axis in names}


def axis_of(mesh: Any, role: str) -> str | None:
    """The axis of `role` on `mesh`: the one the mesh's maker named (``mesh.axis``), else `ROLES`' where the
    mesh has that axis, else None."""
    named = mesh.axis(role)
    if named is not None or mesh.roles:
        return named
    name = ROLES.get(role)
    return name if name in mesh.layout.alias_name else None


def model_layout(tp: int, dp: int, ep: int | None = None, pp: int | None = None,
                 cp: int | None = None, fs: int | None = None, etp: int = 0) -> tuple[tuple, tuple]:
    """The GPT's mesh as (device matrix, axis names): (pp,) dp, (fs,) (ep,) (cp,) tp, pp, fs, ep and cp where
    given (cp next to tp, as Megatron-LM orders its groups: a context group's ranks share a node before dp's).
    With the experts' `etp` between 1 and tp (dividing it), tp is two axes: "tp" of tp / etp ranks, then
    "etp" of etp ranks."""
    split = 1 < etp < tp
    sizes = zip(AXIS_ORDER, (pp, dp, fs, ep, cp, tp // etp if split else tp, etp if split else None))
    kept = [(name, size) for name, size in sizes if size is not None]
    return tuple(size for _, size in kept), tuple(name for name, _ in kept)


def tensor_axes(names: Iterable[str]) -> tuple:
    """The axes of attention's tensor parallelism among axis names `names`: ("tp",), or ("tp", "etp") where tp
    is split for the experts' own tp (`model_layout`); () where neither is."""
    names = tuple(names)
    return tuple(a for a in (TENSOR, EXPERT_TENSOR) if a in names)


def tensor_entry(names: Iterable[str]) -> Any:
    """A tensor map's entry splitting a dim over attention's tp on axis names `names`: "tp", or ("tp", "etp")."""
    axes = tensor_axes(names)
    return axes[0] if len(axes) == 1 else axes


def tensor_coord(mesh: Any) -> int:
    """This rank's place in attention's tp on `mesh` (a Mesh: its layout and ``coord``): its `tensor_axes`'
    coordinates read first major."""
    at = 0
    for a in tensor_axes(mesh.layout.alias_name):
        at = at * mesh.layout.axis_size(a) + mesh.coord(a)
    return at


def tensor_size(layout: Any) -> int:
    """Attention's tp on device matrix `layout`: the product of its `tensor_axes`' sizes (1 where none)."""
    size = 1
    for a in tensor_axes(layout.alias_name):
        size *= layout.axis_size(a)
    return size
