"""The meshes the GPT runs on, and making one over a communicator (spmdsim.models.gpt.parallel.GPT's)."""
from __future__ import annotations

from typing import Any, Optional

from ...layouts.layout import Layout
from ...runtime.mesh import Mesh
from ...errors import SpmdsimError
from ...nn.fsdp import CUT
from ..axes import (CONTEXT, DATA, EXPERT, EXPERT_TENSOR, SHARD, TENSOR, axis_of, model_layout, roles_of,
                    tensor_size)
from ..moe.fold import split_problem
from .config import GPTConfig
from .context import Context, context_problem
from .layouts import mesh_problem

__all__ = ["MESHES", "model_mesh", "mesh_checked", "zero_cut"]

#: The meshes the GPT runs on: dp and tp, with ep (MoE layers) and cp (context parallelism) between them; with
#: ep, tp may be two axes ("tp", "etp": the experts' own tp between 1 and tp, spmdsim.models.moe.fold).
MESHES = tuple((DATA,) + e + c + (TENSOR,) + t for e in ((), (EXPERT,)) for c in ((), (CONTEXT,))
               for t in ((), (EXPERT_TENSOR,)) if e or not t)


def zero_cut(zero: Any) -> str:
    """The cut (spmdsim.layouts.slicing) of the GPT's meshes under ZeRO stage `zero`: ZeRO-3's shards rows the ranks
    do not divide as FSDP2 does (spmdsim.nn.fsdp.CUT); the other stages' meshes cut evenly."""
    return CUT if zero == 3 else "even"


def model_mesh(cfg: GPTConfig, comm: Any, dp: int, tp: int, ep: int = 1, cp: int = 1,
               context: Optional[Context] = None, zero: int = 0, fs: Optional[int] = None) -> Any:
    """The model's mesh over `comm`: (dp, [ep,] [cp,] tp), ep with MoE layers, cp where given or a context is;
    tp as ("tp", "etp") where the experts' etp is between 1 and tp; cut as ZeRO stage `zero` needs (`zero_cut`).
    `fs` N between 1 and dp: hybrid sharding's (dp / N, N, [cp,] tp), N the shard group (--shard-group)."""
    hybrid = fs is not None and 0 < fs < dp
    shape, names = model_layout(tp, dp // fs if hybrid else dp, ep if cfg.moe is not None or ep > 1 else None,
                                cp=cp if cp > 1 or context is not None else None, fs=fs if hybrid else None,
                                etp=cfg.expert_tp)
    return Mesh(Layout(shape, names, zero_cut(zero)), comm, roles=roles_of(names))


def mesh_checked(cfg: GPTConfig, mesh: Any, sp: bool, context: Optional[Context], fsdp: Any) -> int:
    """The mesh's cp (1 without the axis), once its axes, their roles and their sizes are ones the GPT runs on;
    else the one-line SpmdsimError naming them."""
    names, L = tuple(mesh.layout.alias_name), mesh.layout
    hybrid = ((DATA, SHARD, TENSOR), (DATA, SHARD, CONTEXT, TENSOR))  # fully sharded over fs (and cp): HSDP
    if names not in MESHES and not (names in hybrid and fsdp is not None):
        raise SpmdsimError(f"the GPT runs on a mesh with axes {(DATA, TENSOR)!r}, with {EXPERT!r} and {CONTEXT!r} "
                           f"between them where used ({(DATA, EXPERT, CONTEXT, TENSOR)!r}, {EXPERT_TENSOR!r} "
                           f"after {TENSOR!r} for the experts' own tp; fully sharded, {(DATA, SHARD, TENSOR)!r}, "
                           f"{CONTEXT!r} before {TENSOR!r} where used), got {names!r}")
    if any(axis_of(mesh, role) != axis for role, axis in roles_of(names).items()):
        raise SpmdsimError(f"the GPT's mesh axes play the roles {roles_of(names)!r}, but the mesh was given "
                           f"the roles {mesh.roles!r}")
    size = {a: L.axis_size(a) for a in names}
    dp = size[DATA] * size.get(SHARD, 1)  # HSDP: the batch over (dp, fs)
    cp = size.get(CONTEXT, 1)
    tp = tensor_size(L)
    problem = (mesh_problem(cfg, dp, tp, sp, size.get(EXPERT, 1)) or context_problem(cfg, cp, tp, sp, context)
               or (split_problem(names, size, cfg.moe.etp) if cfg.moe is not None else None))
    if problem:
        raise SpmdsimError(f"the GPT cannot run on {' x '.join(f'{a} {n}' for a, n in size.items())}: {problem}")
    return cp
