"""The meshes the GPT runs on, and making one over a communicator (spmdsim.models.gpt.parallel.GPT's)."""
from __future__ import annotations

from typing import Any, Optional

from ...layouts.layout import Layout
from ...runtime.mesh import Mesh
from ...errors import SpmdsimError
from ..axes import CONTEXT, DATA, EXPERT, SHARD, TENSOR, axis_of, model_layout, roles_of
from .config import GPTConfig
from .context import Context, context_problem
from .layouts import mesh_problem

__all__ = ["MESHES", "model_mesh", "mesh_checked"]

#: The meshes the GPT runs on: dp and tp, with ep (MoE layers) and cp (context parallelism) between them.
MESHES = tuple((DATA,) + e + c + (TENSOR,) for e in ((), (EXPERT,)) for c in ((), (CONTEXT,)))


def model_mesh(cfg: GPTConfig, comm: Any, dp: int, tp: int, ep: int = 1, cp: int = 1,
               context: Optional[Context] = None) -> Any:
    """The model's mesh over `comm`: (dp, [ep,] [cp,] tp), ep with MoE layers, cp where given or a context is."""
    shape, names = model_layout(tp, dp, ep if cfg.moe is not None or ep > 1 else None,
                                cp=cp if cp > 1 or context is not None else None)
    return Mesh(Layout(shape, names), comm, roles=roles_of(names))


def mesh_checked(cfg: GPTConfig, mesh: Any, sp: bool, context: Optional[Context], fsdp: Any) -> int:
    """The mesh's cp (1 without the axis), once its axes, their roles and their sizes are ones the GPT runs on;
    else the one-line SpmdsimError naming them."""
    names, L = tuple(mesh.layout.alias_name), mesh.layout
    if names not in MESHES and not (names == (DATA, SHARD, TENSOR) and fsdp is not None):
        raise SpmdsimError(f"the GPT runs on a mesh with axes {(DATA, TENSOR)!r}, with {EXPERT!r} and {CONTEXT!r} "
                           f"between them where used ({(DATA, EXPERT, CONTEXT, TENSOR)!r}; fully sharded, "
                           f"{(DATA, SHARD, TENSOR)!r}), got {names!r}")
    if any(axis_of(mesh, role) != axis for role, axis in roles_of(names).items()):
        raise SpmdsimError(f"the GPT's mesh axes play the roles {roles_of(names)!r}, but the mesh was given "
                           f"the roles {mesh.roles!r}")
    size = {a: L.axis_size(a) for a in names}
    dp = size[DATA] * size.get(SHARD, 1)  # HSDP: the batch over (dp, fs)
    cp = size.get(CONTEXT, 1)
    problem = mesh_problem(cfg, dp, size[TENSOR], sp, size.get(EXPERT, 1)) or \
        context_problem(cfg, cp, size[TENSOR], sp, context)
    if problem:
        raise SpmdsimError(f"the GPT cannot run on {' x '.join(f'{a} {n}' for a, n in size.items())}: {problem}")
    return cp
