"""The check of each training step, as `train` and the pipelined training (spmdsim.models.gpt.pipeline) share it:
the reference step from every rank's blocks at the step's start, then each rank's largest differences from it,
the worst over the whole mesh. A run's subclass says which tensors it holds and how every rank's blocks become
one table (`rows`); the rest is here."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...runtime.executor import pending, resolve
from ...runtime.shared_reference import shared_once
from ...runtime.sim import once
from .buckets import anchored_start, anchored_updates
from .reference_step import _checked_mixed, _checked_reference, _resumed_moments, _zero_moments
from .step_check import QUIET, _summed_grads, resolved_errors, step_errors, stop_if_reference_diverged
from .tolerances import flip_tolerance, rounding_tolerance
from .wholes import Regions

__all__ = ["StepChecker", "optimizer_start"]


def optimizer_start(optimizer: Any, tensors: dict) -> list:
    """[master copies (a parameter's values where it keeps none), first moments, second moments (zeros before
    the first step)]: each name -> this rank's block, of the parameters `tensors` names. ZeRO-1's slices are
    gathered over dp (spmdsim.nn.distrib_optim.DistributedAdamW.gathered: collective)."""
    index = {id(p): i for i, p in enumerate(optimizer.params)}
    tables: list = [{}, {}, {}]
    if hasattr(optimizer, "buckets"):
        wholes = [optimizer.gathered(kind) for kind in ("master", "m", "v")]
        for name, t in tensors.items():
            for table, whole in zip(tables, wholes):
                table[name] = whole[index[id(t)]]
        return tables
    for name, t in tensors.items():
        i = index[id(t)]
        tables[0][name] = optimizer.master.get(i, t.local)
        _, m, v = optimizer.state.get(i) or (0, np.zeros(t.local.shape), np.zeros(t.local.shape))
        tables[1][name], tables[2][name] = m, v
    return tables


class StepChecker:
    """One run's check of each step: `start` before the step (the reference starts from every rank's blocks),
    `errors` after it. A subclass gives `tensors` (name -> this rank's DTensor of each parameter it checks, in
    the optimizer's order), `rows` (every rank's blocks of name -> block tables, a row per rank, on every rank:
    collective) and `scales` (FP8's of this step); `routes` where the reference follows the ranks' experts."""

    def __init__(self, cfg: Any, mesh: Any, optimizer: Any, policy: Any, zero: int, kept: str, microbatches: int,
                 first: int, where: Regions, slices: dict, laid: Optional[list], ring: Any) -> None:
        self.cfg, self.mesh, self.optimizer, self.policy, self.zero, self.kept = cfg, mesh, optimizer, policy, zero, \
            kept
        self.microbatches, self.where, self.slices, self.laid, self.ring = microbatches, where, slices, laid, ring
        self.low = policy.activation != "float64"
        self.flip = flip_tolerance(policy, cfg)  # FP8's flips (step_check.flip_ratio)
        self.rounding = rounding_tolerance(policy, cfg)  # each gradient's own (step_check.rounding_ratio)
        self.moments = None  # the reference's moments, whole
        self.overflow: Optional[str] = None  # where the last step's reference first overflowed (reference_step)
        if not self.low and first:  # the run's at the checkpoint (collective)
            self.moments = shared_once(mesh, ("gpt-resumed", cfg, microbatches, first), _resumed_moments, where,
                                       where.used(self.rows(optimizer_start(optimizer, self.tensors()),
                                                            "check.start")))
        elif not self.low:
            self.moments = once(("gpt-reference", cfg, 0), _zero_moments, cfg)

    def tensors(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__}.tensors")

    def rows(self, tables: list, label: str) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__}.rows")

    def scales(self) -> Optional[dict]:
        raise NotImplementedError(f"{type(self).__name__}.scales")

    def routes(self) -> Optional[dict]:
        """The experts the ranks chose (layer -> choices), which the reference follows at near-ties; None."""
        return None

    def start(self) -> None:
        """Every rank's blocks at the step's start (collective): under a low-precision policy the optimizer's
        view (master copies and moments; its AdamW update is checked on gathered inputs), else the parameters and
        this rank's own start (its update checked on the run's inputs)."""
        tensors = self.tensors()
        self.step_scales = self.scales()  # FP8: the scales the step casts with
        if self.low:
            self.begun, self.own = self.where.used(self.rows(optimizer_start(self.optimizer, tensors),
                                                             "check.start")), None
        else:
            self.begun = self.where.used(self.rows([{name: t.local for name, t in tensors.items()}], "check.params"))
            self.own = anchored_start(self.optimizer, tensors)

    def errors(self, value: float, x: np.ndarray, y: np.ndarray, step: int) -> tuple:
        """The step's largest differences from the reference step, the worst over the mesh (collective)."""
        cfg, where, policy, optimizer, microbatches = self.cfg, self.where, self.policy, self.optimizer, \
            self.microbatches
        tensors, routes = self.tensors(), self.routes()
        if self.low:  # the optimizer checked on the run's own gradients (gathered), the rest on the policy's
            # (with ZeRO-1 the summed gradients and the master copy are the ranks' slices, gathered over dp)
            summed, masters = _summed_grads(optimizer, tensors, self.zero)
            run_grads = where.used(self.rows([summed], "check.grads"))
            ref_loss, grads, updated, top = shared_once(
                self.mesh, ("gpt-mixed", cfg, policy.name, microbatches, step), _checked_mixed, where, self.begun,
                run_grads, x, y, cfg, step, policy, microbatches, routes, self.kept, self.laid, self.step_scales,
                self.ring)
        else:  # the wholes, the reference step and its peaks: once for all the ranks (rank 0's under MPI)
            self.moments, ref_loss, grads, updated, top = shared_once(
                self.mesh, ("gpt-reference", cfg, microbatches, step + 1), _checked_reference, where, self.begun,
                self.moments, x, y, cfg, step, microbatches, routes, self.laid)
            masters = None
        stop_if_reference_diverged(step, value, ref_loss, top, cfg)  # nothing to compare with: one line, exit 2
        self.overflow = top.get("overflow")  # said by the check's lines (spmdsim.models.gpt.options.check_lines)
        with np.errstate(**QUIET):  # the reference's AdamW again, on this rank's inputs: it overflows alike
            own = None if self.own is None else anchored_updates(self.own, tensors, cfg, optimizer)
        mine = step_errors(value, ref_loss, grads, updated, tensors, optimizer if self.zero else None, masters, top,
                           self.slices, own, self.flip, self.rounding)
        layout = self.mesh.layout
        worst = resolve(self.mesh, mine, pending(layout, 1, tuple(layout.alias_name)), "check", reduction="max",
                        owned=True)
        return resolved_errors(worst)
