"""Execute a redistribution plan on a DTensor with the runtime's MPI collectives.

The planner (spmdsim.plan) decides; this module only loops over the steps.
mpi4py is imported lazily through spmdsim.runtime, so importing this module
does not start MPI. Every collective is traced with the step as its label
(``redistribute[1] S(0)->S(1) via Alltoall on ('x',)``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .errors import PlanError
from .layout import Layout, TensorLayout
from .plan import Plan, plan_redistribution
from .plan.kernels import exchange_program, local_slice, local_zero
from .plan.steps import (
    Allgather,
    Allreduce,
    Alltoall,
    Exchange,
    LocalSlice,
    LocalZero,
    ReduceScatter,
    step_label,
)
from .runtime import debug

_HOOKS = debug.HOOKS  # whether the debug hooks are on (HOOKS.quiet: one attribute read)

__all__ = ["redistribute"]

def _mesh_for(base: Any, layout: Layout) -> Any:
    """A mesh of `layout` over `base`'s communicator, kept in `base.compiled`.

    Kept so its sub-communicators are split once, not on every call.
    """
    if layout == base.layout:
        return base
    key = ("mesh", layout)
    mesh = base.compiled.get(key)
    if mesh is None:
        from .runtime import Mesh

        mesh = base.compiled[key] = Mesh(layout, base.comm, wait=base.wait_mode,
                                         algorithms=base.algorithms)
    return mesh


def redistribute(dtensor: Any, target: TensorLayout, plan: Optional[Plan] = None) -> Any:
    """`dtensor` re-laid out as `target` (same global shape), by the least-communication plan.

    `target` may use another device matrix with the same device count; the
    returned DTensor then lives on a mesh of that matrix over the same communicator.
    """
    try:  # no isinstance check on the repeated path: an attribute miss says it all
        mesh, local, shape = dtensor.mesh, dtensor.local, dtensor.global_shape
    except AttributeError:
        raise PlanError(f"redistribute: x must be a DTensor, got {type(dtensor).__name__}; build one "
                        "with DTensor.from_local/from_seeded") from None
    if not _HOOKS.quiet:  # SPMDSIM_CHECK: the same move on every rank
        debug.verify_operands(mesh, "redistribute", (("x", shape, dtensor.layout, local.dtype),
                                                     ("target", shape, target, local.dtype)))
    if plan is None:
        # A repeated redistribution finds its compiled plan in one lookup: no
        # planning, imports, labels or per-step set-up between the caller and
        # the MPI calls (at 8 ranks on 2 cores that set-up showed as 10-20% of a
        # 2 MiB step).
        programs = mesh.compiled
        key = ("redistribute", dtensor.layout, target, shape, local.dtype)
        try:
            program = programs[key]
        except (KeyError, TypeError):  # TypeError: an unhashable target
            if not isinstance(target, TensorLayout):
                raise PlanError(f"target {target!r} must be a TensorLayout") from None
            plan = plan_redistribution(dtensor.layout, target, shape, local.dtype.name)
            program = _program(plan, mesh)
            if len(programs) < _PROGRAMS_MAX:
                programs[key] = program
    else:
        if not isinstance(target, TensorLayout):
            raise PlanError(f"target {target!r} must be a TensorLayout")
        if plan.source != dtensor.layout or plan.target != target or plan.shape != shape:
            raise PlanError(
                f"plan {plan.source} -> {plan.target} on shape {plan.shape!r} does not fit "
                f"{dtensor.layout} -> {target} on shape {shape!r}"
            )
        program = _program(plan, mesh)
    for run, step, step_mesh, label in program.steps:
        local = run(step, step_mesh, local, shape, label)
    if local.shape != program.local_shape:
        raise PlanError(f"internal: the plan produced a shard of shape {local.shape!r}, expected "
                        f"{program.local_shape!r} under {target}")
    out = program.wrap(program.target_mesh, local, target, shape)
    if getattr(dtensor, "_ag", None) is not None:  # autograd: the backward is the reverse move
        from .autograd.rules import record_redistribute

        record_redistribute(out, dtensor)
    return out


@dataclass(frozen=True)
class _Program:
    """A plan made ready to run on one mesh: per step its runner, mesh and trace label."""

    steps: tuple[tuple[Callable, Any, Any, str], ...]
    target_mesh: Any
    local_shape: tuple[int, ...]  # this rank's target shard
    wrap: Callable  # DTensor._trusted, bound here so a call imports nothing


# Compiled plans per mesh (in Mesh.compiled, beside its meshes of other layouts),
# by (source layout, target, shape, dtype).
_PROGRAMS_MAX = 1024


def _program(plan: Plan, mesh: Any) -> _Program:
    from .runtime import DTensor, collectives

    steps = []
    for index, step in enumerate(plan.steps, 1):
        step_mesh = _mesh_for(mesh, step.before.layout)
        if isinstance(step, Exchange):
            runner: Callable = _exchange_runner(step, step_mesh.rank, plan.shape, collectives)
        else:
            make = _RUNNERS.get(type(step))
            if make is None:
                raise PlanError(f"unknown plan step {step!r}")
            runner = make(collectives)
        steps.append((runner, step, step_mesh, step_label(step, index)))
    target_mesh = _mesh_for(mesh, plan.target.layout)
    return _Program(tuple(steps), target_mesh, plan.target.local_shape(plan.shape), DTensor._trusted)


# Runner makers: each takes the collectives module (imported once, at compile
# time) and returns run(step, mesh, local, shape, label) -> new local block.
def _local_slice(C: Any) -> Callable:
    return lambda step, mesh, local, shape, label: local_slice(step, mesh.rank, local, shape)


def _local_zero(C: Any) -> Callable:
    return lambda step, mesh, local, shape, label: local_zero(step, mesh.rank, local, shape)


def _allgather(C: Any) -> Callable:
    allgather = C.allgather
    return lambda step, mesh, local, shape, label: allgather(mesh, local, step.axes, step.tensor_dim,
                                                             label=label)


def _alltoall(C: Any) -> Callable:
    alltoall = C.alltoall
    return lambda step, mesh, local, shape, label: alltoall(mesh, local, step.axes, step.split_dim,
                                                            step.concat_dim, label=label)


def _allreduce(C: Any) -> Callable:
    allreduce = C.allreduce
    return lambda step, mesh, local, shape, label: allreduce(mesh, local, step.axes, label=label)


def _reduce_scatter(C: Any) -> Callable:
    reduce_scatter = C.reduce_scatter
    return lambda step, mesh, local, shape, label: reduce_scatter(mesh, local, step.axes, step.tensor_dim,
                                                                  label=label)


_RUNNERS: dict[type, Callable] = {
    LocalSlice: _local_slice,
    LocalZero: _local_zero,
    Allgather: _allgather,
    Alltoall: _alltoall,
    Allreduce: _allreduce,
    ReduceScatter: _reduce_scatter,
}


def _exchange_runner(step: Exchange, rank: int, shape: tuple, C: Any) -> Callable:
    """The Exchange runner for this rank: boxes, counts and offsets worked out once."""
    from .runtime.exchange_spec import ExchangeSpec

    program = exchange_program(step, rank, shape)
    spec = ExchangeSpec.build(
        step.before.layout.num_devices, rank, step.before.local_shape(shape), program.sends,
        [(src, math.prod(box_shape)) for src, _, box_shape in program.places],
    )
    slots = tuple((lo, hi) for _, lo, hi in spec.recv_slots)  # in program.places order
    exchange = C.exchange

    def run(step: Any, mesh: Any, local: Any, shape: tuple, label: str) -> Any:
        recv = exchange(mesh, local, spec, label=label)
        return program.assemble(local, (recv[lo:hi] for lo, hi in slots))
    return run
