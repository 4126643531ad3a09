"""Execute a redistribution plan on a DTensor with the runtime's MPI collectives.

The planner (spmdsim.plan) decides; this module only loops over the steps.
mpi4py is imported lazily through spmdsim.runtime, so importing this module
does not start MPI. Every collective is traced with the step as its label
(``redistribute[1] S(0)->S(1) via Alltoall on ('x',)``).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

from .errors import PlanError
from .layout import Layout, TensorLayout
from .plan import Plan, plan_redistribution
from .plan.kernels import (
    exchange_assemble,
    exchange_recv_shapes,
    exchange_sends,
    local_slice,
    local_zero,
)
from .plan.steps import (
    Allgather,
    Allreduce,
    Alltoall,
    Exchange,
    LocalSlice,
    LocalZero,
    ReduceScatter,
    Step,
    step_label,
)

__all__ = ["redistribute", "run_plan"]

# Meshes of other device matrices over the same communicator, kept per source
# mesh so their sub-communicators are split once, not on every call.
_MESHES: "weakref.WeakKeyDictionary[Any, dict[Layout, Any]]" = weakref.WeakKeyDictionary()


def _mesh_for(base: Any, layout: Layout) -> Any:
    if layout == base.layout:
        return base
    from .runtime import Mesh

    meshes = _MESHES.setdefault(base, {})
    if layout not in meshes:
        meshes[layout] = Mesh(layout, base.comm, wait=base.wait_mode)
    return meshes[layout]


def redistribute(dtensor: Any, target: TensorLayout, plan: Optional[Plan] = None) -> Any:
    """`dtensor` re-laid out as `target` (same global shape), by the least-communication plan.

    `target` may use another device matrix with the same device count; the
    returned DTensor then lives on a mesh of that matrix over the same communicator.
    """
    from .runtime import DTensor

    if not isinstance(target, TensorLayout):
        raise PlanError(f"target {target!r} must be a TensorLayout")
    shape = tuple(dtensor.global_shape)
    if plan is None:
        plan = plan_redistribution(dtensor.layout, target, shape, dtensor.dtype.name)
    elif plan.source != dtensor.layout or plan.target != target or plan.shape != shape:
        raise PlanError(
            f"plan {plan.source} -> {plan.target} on shape {plan.shape!r} does not fit "
            f"{dtensor.layout} -> {target} on shape {shape!r}"
        )
    local = run_plan(plan, dtensor.mesh, dtensor.local)
    return DTensor(_mesh_for(dtensor.mesh, target.layout), local, target, shape)


def run_plan(plan: Plan, mesh: Any, local: Any) -> Any:
    """This rank's target block after running every step of `plan` from its source block."""
    for index, step in enumerate(plan.steps, 1):
        local = _run_step(step, _mesh_for(mesh, step.before.layout), local, plan.shape,
                          step_label(step, index))
    return local


def _run_step(step: Step, mesh: Any, local: Any, shape: tuple, label: str) -> Any:
    from .runtime import collectives

    rank = mesh.rank
    if isinstance(step, LocalSlice):
        return local_slice(step, rank, local, shape)
    if isinstance(step, LocalZero):
        return local_zero(step, rank, local, shape)
    if isinstance(step, Allgather):
        return collectives.allgather(mesh, local, step.axes, step.tensor_dim, label=label)
    if isinstance(step, Alltoall):
        return collectives.alltoall(mesh, local, step.axes, step.split_dim, step.concat_dim,
                                    label=label)
    if isinstance(step, Allreduce):
        return collectives.allreduce(mesh, local, step.axes, label=label)
    if isinstance(step, ReduceScatter):
        return collectives.reduce_scatter(mesh, local, step.axes, step.tensor_dim, label=label)
    if isinstance(step, Exchange):
        received = collectives.alltoallv(
            mesh,
            exchange_sends(step, rank, local, shape),
            exchange_recv_shapes(step, rank),
            local.dtype,
            label=label,
        )
        return exchange_assemble(step, rank, local, received, shape)
    raise PlanError(f"unknown plan step {step!r}")
