"""The models' mesh axes in one table: which axis name plays which role (pure: no imports of the package).

The GPT (spmdsim.models.gpt), its MoE layers (spmdsim.models.moe), the estimate and autoshard name
their mesh axes from `ROLES` and nowhere else: the batch over "dp", Megatron's tensor parallelism over
"tp", the pipeline's stages over "pp", the experts over "ep", the sequence over "cp" (context parallelism);
with hybrid sharding (HSDP) the parameters over "fs", the batch over ("dp", "fs"). A role is one of
spmdsim.runtime.mesh.AXIS_ROLES; a mesh the models make is given these roles (`roles_of`), and code
running on a mesh asks it (``mesh.axis("tensor")``) or this table for the axis of a role.

    >>> from spmdsim.models.axes import ROLES, TENSOR
    >>> TENSOR, ROLES["tensor"]
    ('tp', 'tp')
"""
from __future__ import annotations

from typing import Any, Iterable

__all__ = ["ROLES", "DATA", "TENSOR", "PIPELINE", "EXPERT", "CONTEXT", "SHARD", "roles_of", "axis_of",
           "model_layout"]

#: role (spmdsim.runtime.mesh.AXIS_ROLES) -> the name of the models' axis that plays it.
ROLES = {"data": "dp", "tensor": "tp", "pipeline": "pp", "expert": "ep", "context": "cp", "shard": "fs"}
#: The axes by role, for code that names one.
DATA, TENSOR, PIPELINE, EXPERT = ROLES["data"], ROLES["tensor"], ROLES["pipeline"], ROLES["expert"]
CONTEXT = ROLES["context"]
#: HSDP's shard group (spmdsim.nn.fsdp): the parameters split over it, replicated over DATA's groups.
SHARD = ROLES["shard"]


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
                 cp: int | None = None, fs: int | None = None) -> tuple[tuple, tuple]:
    """The GPT's mesh as (device matrix, axis names): (pp,) dp, (fs,) (ep,) (cp,) tp, pp, fs, ep and cp where
    given (cp next to tp, as Megatron-LM orders its groups: a context group's ranks share a node before dp's)."""
    sizes = ((PIPELINE, pp), (DATA, dp), (SHARD, fs), (EXPERT, ep), (CONTEXT, cp), (TENSOR, tp))
    kept = [(name, size) for name, size in sizes if size is not None]
    return tuple(size for _, size in kept), tuple(name for name, _ in kept)
