"""An Exchange step's runner on one rank (spmdsim.runtime.executor compiles a plan's steps with it): the
boxes, counts and offsets of its Alltoallv worked out once, then each run of the step moves and assembles
this rank's new block."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

from ..base.buffers import empty as _new_block  # placed for MPI's copies (spmdsim.base.buffers)
from ..programs.plan.kernels import exchange_program
from ..programs.plan.steps import Exchange
from .collectives import exchange
from .exchange import exchange_boxes
from .exchange_spec import ExchangeSpec

__all__ = ["Runner", "exchange_runner"]

# A step's runner: run(step, mesh, local, shape, label, owned) -> the new local block (spmdsim.runtime.executor's)
Runner = Callable[[Any, Any, Any, tuple, Optional[str], bool], Any]


def exchange_runner(step: Exchange, mesh: Any, shape: tuple) -> Runner:
    """The Exchange runner for this rank: boxes, counts and offsets worked out once."""
    rank = mesh.rank
    if step.bytes_received and not any(step.bytes_received):  # no rank lacks any of its new block: no call
        return _kept_runner(exchange_program(step, rank, shape))
    if mesh.engine.dry:  # one rank runs for all: the step record says what each rank moves
        return _told(mesh.engine, _exchange_runner_of(step, rank, shape))
    return _exchange_runner_of(step, rank, shape, mesh.engine.moves_boxes and mesh.algorithms is None)


def _kept_runner(program: Any) -> Runner:
    """An Exchange that moves nothing (each rank's new block lies inside its old one, as where the meshes
    share no refinement): this rank's part copied out, no Alltoallv of empty counts (not traced)."""
    def run(step: Any, mesh: Any, local: Any, shape: tuple, label: Optional[str], owned: bool) -> Any:
        return program.assemble(local, ())
    return run


def _told(engine: Any, run: Runner) -> Runner:
    def told(step: Any, mesh: Any, local: Any, shape: tuple, label: Optional[str], owned: bool) -> Any:
        engine.ran(step)
        return run(step, mesh, local, shape, label, owned)
    return told


def _exchange_runner_of(step: Exchange, rank: int, shape: tuple, boxes: bool = False) -> Runner:
    """`step`'s runner on `rank`: by `exchange_boxes` where `boxes` (ranks that share memory), else packed."""
    program = exchange_program(step, rank, shape)
    spec = ExchangeSpec.build(
        step.before.layout.num_devices, rank, step.before.local_shape(shape, rank), program.sends,
        [(src, math.prod(box_shape)) for src, _, box_shape in program.places],
    )
    slots = tuple((lo, hi) for _, lo, hi in spec.recv_slots)  # in program.places order
    total = spec.recv_total
    out_shape = program.out_shape
    # The new block arrives whole from one peer (a permutation of blocks): receive it in place.
    whole = (program.own is None and len(program.places) == 1
             and program.places[0][2] == out_shape and math.prod(out_shape) == total)

    def run(step: Any, mesh: Any, local: Any, shape: tuple, label: Optional[str], owned: bool) -> Any:
        if boxes:  # ranks that share memory: each box copied once, from its view into its place
            return exchange_boxes(mesh, local, spec, program, label)
        if whole:
            out = _new_block(out_shape, local.dtype)
            exchange(mesh, local, spec, label=label, out=out.reshape(-1))
            return out
        # Into the mesh's kept receive buffer (Mesh.scratch): assemble copies out of it at once.
        recv = exchange(mesh, local, spec, label=label, out=mesh.scratch("recv", (total,), local.dtype))
        return program.assemble(local, (recv[lo:hi] for lo, hi in slots))
    return run
