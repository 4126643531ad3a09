"""The executor: runs step programs (spmdsim.programs.plan.steps) on this rank's block.

One executor for an operator's program (the steps spmdsim.programs.infer gives to
finish its local result) and a redistribution's (the planner's steps). Each
step kind has one runner here, which calls a collective or a local kernel
(spmdsim.programs.plan.kernels), traced with the operator's label or the step's own.
Importing this module does not start MPI: the collectives are bound when a
program first runs. Compiled redistributions live on their mesh (runtime.compiled.keep_move).
"""
from __future__ import annotations

from functools import lru_cache
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..errors import PlanError, ShapeError
from ..layouts.layout import Layout, TensorLayout
from ..layouts.notation import move_name
from ..programs.plan import Plan, plan_redistribution
from ..base.buffers import CAPTURE as _CAPTURE
from ..base.buffers import kept_empty as _kept_empty
from ..programs.plan.kernels import local_slice, local_zero
from ..programs.plan.uneven import check_fits, group_pieces, is_uneven
from ..programs.plan.steps import (Allgather, Allreduce, Alltoall, Exchange, LocalSlice, LocalZero, ReduceScatter,
                                   Step, step_label)
from . import debug_calls, door
# KERNELS: the collectives themselves where this thread does not capture (no wrapper's frame)
from .collectives import KERNELS
from .exchange import group_alltoallv
from ..programs.plan.messages import (BlockAllgather, BlockAllreduce, BlockAlltoall, BlockAlltoallv, BlockReduceScatter,
                                      Messages)
from .exchange_runner import Runner, exchange_runner
from .mesh import Mesh
from .dtensor_build import _cut_hinted, _not_a_tensor_layout, _short_map
from .uneven import allgatherv, alltoallv_dims, reduce_scatterv
from .arguments import _take, _take_order
from ..base.precision import is_low
from .compiled import PROGRAMS, keep_move
from ..base.context import _THREAD  # the running thread's context (debug.quiet's read, without its calls)

__all__ = ["execute", "post", "run_block", "resolve", "gather", "pending", "redistribute"]

# Runner (spmdsim.runtime.exchange_runner): run(step, mesh, local, shape, label, owned) -> the new local block;
# `owned`: `local` is the program's own temporary, which an Allreduce may overwrite in place instead of allocating.
_RUNNERS: dict[type, Runner] = {}


def _bind() -> None:
    """Bind the runners to the collectives (on first use)."""
    global _repeat
    _repeat = door.repeat

    def run_allreduce(step, mesh, local, shape, label, owned):
        in_place = owned and local.flags.c_contiguous and local.flags.writeable
        return KERNELS.allreduce(mesh, local, step.axes, label=label, out=local if in_place else None,
                                 op=step.reduction)

    # On an uneven cut (Layout.cut "chunk"/"balanced") whose pieces differ here: the forms with counts, or,
    # where the group's pieces do not nest (spmdsim.programs.plan.uneven), the planner's redistribution instead.
    def run_allgather(step, mesh, local, shape, label, owned):
        how = step.before.layout.cut != "even" and _pieces(step, shape, mesh, local)
        if how:
            return allgatherv(mesh, local, step.axes, step.tensor_dim, how, label=label) if type(how) is tuple \
                else _detour(how, mesh, local, shape, label)
        return KERNELS.allgather(mesh, local, step.axes, step.tensor_dim, label=label)

    def run_alltoall(step, mesh, local, shape, label, owned):
        how = step.before.layout.cut != "even" and _pieces(step, shape, mesh, local)
        if how:
            return alltoallv_dims(mesh, local, step.axes, step.split_dim, step.concat_dim, *how, label=label) \
                if type(how) is tuple else _detour(how, mesh, local, shape, label)
        return KERNELS.alltoall(mesh, local, step.axes, step.split_dim, step.concat_dim, label=label)

    def run_reduce_scatter(step, mesh, local, shape, label, owned):
        how = step.before.layout.cut != "even" and _pieces(step, shape, mesh, local)
        if how:
            return reduce_scatterv(mesh, local, step.axes, step.tensor_dim, how, label=label) \
                if type(how) is tuple else _detour(how, mesh, local, shape, label)
        return KERNELS.reduce_scatter(mesh, local, step.axes, step.tensor_dim, label=label)

    _RUNNERS.update({
        LocalSlice: lambda step, mesh, local, shape, label, owned: local_slice(step, mesh.rank, local, shape),
        LocalZero: lambda step, mesh, local, shape, label, owned: local_zero(step, mesh.rank, local, shape),
        Allgather: run_allgather,
        Alltoall: run_alltoall,
        Allreduce: run_allreduce,
        ReduceScatter: run_reduce_scatter,
    })


def _pieces(step: Step, shape: tuple, mesh: Any, local: Any) -> Any:
    """How `step` runs where its shards may differ in size: () when they do not; the extents of the
    group's pieces (for the collective with counts); or, when the pieces do not nest, the plan of the
    same move (an operator's step; a redistribution's plan has only steps that fit). A dry run (one rank
    runs for all) is told each rank's bytes, which differ here."""
    how = _uneven_pieces(step, shape, mesh.rank)
    if type(how) is tuple and how and mesh.engine.dry:
        mesh.engine.ran(step.sized(shape, step.itemsize(local.dtype)))  # a bfloat16 sum's: float32's
    return how


@lru_cache(maxsize=1024)
def _uneven_pieces(step: Step, shape: tuple, rank: int) -> Any:
    if not is_uneven(step, shape):
        return ()
    try:
        check_fits(step, shape)
    except ShapeError:
        return plan_redistribution(step.before, step.after, shape, "float64")
    return group_pieces(step, shape, rank)


def _detour(plan: Plan, mesh: Any, local: Any, shape: tuple, label: Optional[str]) -> Any:
    """`plan`'s steps on this rank's block, each traced under the operator's `label`."""
    for run, step, step_mesh, _ in _compile(plan, mesh, None).steps:
        local = run(step, step_mesh, local, shape, label, False)
    return local


def _runner(step: Step) -> Runner:
    if not _RUNNERS:
        _bind()
    run = _RUNNERS.get(type(step))
    if run is None:
        raise PlanError(f"no runner for step {step!r:.120}")
    return run


def execute(mesh: Any, local: Any, steps: tuple[Step, ...], shape: tuple, label: Optional[str],
            owned: bool = False) -> Any:
    """Run an operator's steps on this rank's block `local` of a tensor of global `shape`, traced under `label`.

    `owned`: `local` is the operator's own temporary (an Allreduce may then sum in place).
    """
    for step in steps:
        try:
            run = _RUNNERS[type(step)]
        except KeyError:
            run = _runner(step)
        local = run(step, mesh, local, shape, label, owned)
        owned = True  # a collective's result is a fresh array
    return local


def post(mesh: Any, comm: Any, record: Messages, receives: list, sends: list, label: Optional[str]) -> None:
    """Run the point-to-point `record` on `comm` (a group of `mesh` over `record.axes`): `receives` as (buffer,
    source, tag), `sends` as (buffer, dest, tag), all waited for; refused under SPMDSIM_CHECK unless as told."""
    door.point_to_point(mesh, comm, record.axes, receives, sends, label, record.described())


def run_block(mesh: Any, record: Any, local: Any, label: Optional[str], out: Any = None) -> Any:
    """Run the block collective `record` on this rank's block `local` (into `out` where given: in place)."""
    kind = type(record)
    if kind is BlockAlltoall:  # (`out` only where given: a captured call's result is its replay's `out`)
        return KERNELS.alltoall(mesh, local, record.axes, 0, 0, label) if out is None else \
            KERNELS.alltoall(mesh, local, record.axes, 0, 0, label, out)
    if kind is BlockAllreduce:
        return KERNELS.allreduce(mesh, local, record.axes, label) if out is None else \
            KERNELS.allreduce(mesh, local, record.axes, label, out=out)
    if kind is BlockAlltoallv:
        return group_alltoallv(mesh, local, record.send_rows, record.recv_rows, record.axes, label)
    if kind is BlockAllgather or kind is BlockReduceScatter:  # (a fully sharded unit's packs: 1-d blocks)
        run = KERNELS.allgather if kind is BlockAllgather else KERNELS.reduce_scatter
        return run(mesh, local, record.axes, 0, label) if out is None else run(mesh, local, record.axes, 0, label, out)
    raise PlanError(f"no runner for the record {record!r:.120}")


@lru_cache(maxsize=256)
def pending(layout: Layout, ndim: int, axes: tuple[str, ...]) -> TensorLayout:
    """The layout of an `ndim`-dim value every rank holds whole, pending a sum over `axes`."""
    return TensorLayout(layout, (None,) * ndim, axes)


@lru_cache(maxsize=256)
def _resolution(before: TensorLayout, reduction: str) -> tuple[Step, ...]:
    # As a redistribution's plan: no step on mesh axes of size 1 (a sum of one addend; an Allreduce over
    # them alone would be a call that moves nothing, traced on every rank as a group of one).
    axes = tuple(a for a in before.partial if before.layout.axis_size(a) > 1)
    return (Allreduce(before, before.with_partial(()), axes, reduction=reduction),) if axes else ()


def resolve(mesh: Any, local: Any, layout: TensorLayout, label: Optional[str], reduction: str = "sum",
            owned: bool = False) -> Any:
    """This rank's block of `layout` with its pending values combined: the program Allreduce(P -> B).

    `reduction` "max"/"min": the group's maximum/minimum (a softmax's shift). Losses, gradient
    buckets and `DTensor.resolved_local` finish their values through it.
    """
    steps = _resolution(layout, reduction)
    if not steps and layout.partial:  # pending over axes of size 1 alone: nothing to combine, no call
        _reducible(local, reduction)
    return execute(mesh, local, steps, (), label, owned)


def _reducible(local: Any, reduction: str) -> None:
    """The DTypeError the Allreduce over a larger group raises for `local`'s dtype, on a group of one too."""
    dtype = getattr(local, "dtype", None)
    if dtype is not None and not is_low(dtype):  # bfloat16 is summed and ordered as float32
        _take("allreduce", dtype) if reduction == "sum" else _take_order("allreduce", reduction, dtype)


@lru_cache(maxsize=256)
def _gathering(before: TensorLayout) -> tuple[Step, ...]:
    axes = tuple(a for a in before.split_axes if before.layout.axis_size(a) > 1)  # none of size 1, as above
    return (Allgather(before, TensorLayout(before.layout, (None,) * len(before.tensor_map)), axes,
                      tensor_dim=0),) if axes else ()


def gather(mesh: Any, local: Any, axes: tuple[str, ...], label: Optional[str]) -> Any:
    """Every member's 1-d `local` over `axes`, joined in group order: the program Allgather(S(0) -> B)."""
    return execute(mesh, local, _gathering(TensorLayout(mesh.layout, (tuple(axes),))), (), label)


def _mesh_for(base: Any, layout: Layout) -> Any:
    """A mesh of `layout` over `base`'s communicator, kept so its groups are split once."""
    if layout == base.layout:
        return base
    programs = PROGRAMS.of(base)
    key = ("mesh", layout)
    mesh = programs.get(key)
    if mesh is None:
        mesh = programs[key] = Mesh(layout, base.comm, wait=base.wait_mode, algorithms=base.algorithms)
    return mesh


def redistribute(dtensor: Any, target: TensorLayout, plan: Optional[Plan] = None) -> Any:
    """`dtensor` re-laid out as `target` (same global shape), by the least-communication plan.

    `target` may use another device matrix of as many devices (the result then lives on a mesh of it).
    """
    try:  # no isinstance check on the repeated path: an attribute miss says it all
        mesh, shape, source = dtensor._mesh, dtensor._shape, dtensor._layout
        local = dtensor._local if not _CAPTURE.on else dtensor.local  # (a captured step: its record's view)
    except AttributeError:
        raise PlanError(f"redistribute: x must be a DTensor, got {type(dtensor).__name__}; build one "
                        "with DTensor.from_local/from_seeded") from None
    if not _THREAD.context.hooks.quiet:  # debug.quiet() without its two calls. SPMDSIM_CHECK: the same move on
        # every rank
        debug_calls.verify_operands(mesh, "redistribute", (("x", shape, source, local.dtype),
                                                           ("target", shape, target, local.dtype)))
    if plan is None:
        try:  # a step moves the same layout objects every time: by their ids (`keep_move`)
            entry = mesh._moves[id(source), id(target), shape, local.dtype]
        except (KeyError, TypeError):  # TypeError: a size that does not hash (the planner refuses it)
            if not isinstance(target, TensorLayout):
                raise PlanError(_not_a_tensor_layout(target, "target")) from None
            try:
                plan = plan_redistribution(source, target, shape, local.dtype.name)
            except ShapeError as exc:  # a target whose even cut cannot split the shape: the cuts that can, named
                raise _cut_hinted(exc, target, shape) from None
            except PlanError as exc:  # a target of fewer dims (a short JAX spec): how to pad it, named
                if len(shape) > target.ndim:
                    raise PlanError(f"{exc}{_short_map(target, len(shape))}") from None
                raise
            program = _compile(plan, mesh, type(dtensor))
            entry = keep_move(mesh, (id(source), id(target), shape, local.dtype), (
                source, target, program, move_name(source, target), (source, target)) + _direct(
                program, source.local_shape(shape, mesh.rank), local.dtype))
        # one flat entry, unpacked once: the move's node's name and read layouts made with it, not per move
        _, _, program, name, reads, key, step_mesh, axes, label, sums, block_shape = entry
        if key is not None and not _CAPTURE.on and (kept := step_mesh._plans.get(key)) is not None \
                and type(local) is _ndarray and local.shape == block_shape and local.flags.c_contiguous:
            # One collective whose call the mesh kept (spmdsim.runtime.door.keep: a repeat of the same group,
            # shape, dtype and dim): the collective's repeated call written out, without the runner's and the
            # collective's frames (runtime.collectives' allgather or reduce_scatter, its kept plan's branch).
            # Its buffer from kept_empty itself: buffers.empty's one test more is of a capture, ruled out here.
            dst = _kept_empty(kept.out_shape, local.dtype)
            local = _repeat(step_mesh, kept, axes, label, (local, dst, "sum") if sums else (local, dst), dst, local)
        else:
            for run, step, step_mesh, label in program.steps:
                local = run(step, step_mesh, local, shape, label, False)
    else:
        program = _given(plan, mesh, source, target, shape, type(dtensor))
        name = reads = None
        for run, step, step_mesh, label in program.steps:
            local = run(step, step_mesh, local, shape, label, False)
    if local.shape != program.local_shape:
        raise PlanError(f"internal: the plan produced a shard of shape {local.shape!r}, expected "
                        f"{program.local_shape!r} under {target}")
    # DTensor._trusted's tensor, without its call
    out = _new(program.cls)
    out._mesh, out._local, out._layout, out._shape, out._ag = program.target_mesh, local, target, shape, None
    recorded = dtensor._ag
    if recorded is not None:  # in autograd's graph (Leaf or Node): it records the move
        recorded.moved(out, dtensor, name, reads)
    return out


def _given(plan: Plan, mesh: Any, source: TensorLayout, target: Any, shape: tuple, cls: Any) -> "_Compiled":
    """`redistribute`'s program for a plan the caller gives (a network's hops, `spmdsim redistribute`): checked
    against the tensor's move and compiled the first time, then found on the mesh by the ids of the plan and both
    layouts (`keep_move`, whose entry holds the three objects, so no other object has their ids while it lives):
    a net's step gives the same plan objects every time."""
    key = ("given", id(plan), id(source), id(target), shape, cls)
    try:
        return mesh._moves[key][3]
    except KeyError:
        pass
    except TypeError:  # a size that does not hash: checked below, not kept
        key = None
    if not isinstance(target, TensorLayout):
        raise PlanError(_not_a_tensor_layout(target, "target"))
    if plan.source != source or plan.target != target or plan.shape != shape:
        raise PlanError(
            f"plan {plan.source} -> {plan.target} on shape {plan.shape!r} does not fit "
            f"{source} -> {target} on shape {shape!r}"
        )
    program = _compile(plan, mesh, cls)
    if key is not None:
        keep_move(mesh, key, (plan, source, target, program))
    return program


_new = object.__new__
_ndarray = np.ndarray
_repeat: Any = None  # spmdsim.runtime.door.repeat, bound by `_bind`


_NOT_DIRECT = (None,) * 6


def _direct(program: "_Compiled", block_shape: tuple, dtype: Any) -> tuple:
    """What `redistribute` needs to run `program`'s one collective itself once its mesh keeps that call (an
    Allgather or a Reduce_scatter of an even cut, a plain dtype: the runner's test then calls
    the collective, whose kept plan's branch `redistribute` writes out): (the collective's key in the mesh's
    kept plans, as runtime.collectives spells it, the step's mesh, axes and label, whether it sums, this rank's
    block shape); six Nones for any other program."""
    if len(program.steps) != 1 or not isinstance(dtype, np.dtype) or dtype.kind not in "fiub":
        return _NOT_DIRECT
    run, step, step_mesh, label = program.steps[0]
    kind = type(step)
    if kind is Allgather:
        name = "allgather"
    elif kind is ReduceScatter:
        name = "reduce_scatter"
    else:
        return _NOT_DIRECT
    if step.before.layout.cut != "even" or type(step.tensor_dim) is not int or run is not _RUNNERS.get(kind):
        return _NOT_DIRECT
    return ((name, step.axes, block_shape, dtype, step.tensor_dim), step_mesh, step.axes, label, kind is ReduceScatter,
            block_shape)


@dataclass(frozen=True)
class _Compiled:
    """A plan made ready to run on one mesh: per step its runner, mesh and trace label."""

    steps: tuple[tuple[Runner, Step, Any, str], ...]
    target_mesh: Any
    local_shape: tuple[int, ...]  # this rank's target shard
    cls: Any  # the moved tensor's class (DTensor): its result built as DTensor._trusted builds one


def _compile(plan: Plan, mesh: Any, cls: Any) -> _Compiled:
    """`plan` ready to run on `mesh`, its results of class `cls` (the moved tensor's: DTensor)."""
    steps = []
    for index, step in enumerate(plan.steps, 1):
        step_mesh = _mesh_for(mesh, step.before.layout)
        run = (exchange_runner(step, step_mesh, plan.shape) if isinstance(step, Exchange)
               else _runner(step))
        steps.append((run, step, step_mesh, step_label(step, index)))
    target_mesh = _mesh_for(mesh, plan.target.layout)
    return _Compiled(tuple(steps), target_mesh, plan.target.local_shape(plan.shape, mesh.rank), cls)
