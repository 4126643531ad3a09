"""The reference trainer of a seed network, shared over MPI: rank 0 steps it for every rank."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...runtime.shared_reference import across_processes, digest, shared_once_on
from . import reference
from .reference import ReferenceTrainer

__all__ = ["SharedReferenceTrainer"]


class SharedReferenceTrainer(ReferenceTrainer):
    """``SharedReferenceTrainer(net, ..., comm=comm)``: spmdsim.models.nets.reference.ReferenceTrainer, whose `step`
    is a collective over `comm` under MPI: rank 0 computes each step and every rank whose trainer and batch
    equal rank 0's receives its result (`shared_once_on`). The parameters and optimizer state are not
    compared byte by byte each step: they are a function of the network, its seeded start and every step's
    batch, whose digest each trainer carries (`lineage`) and compares; a rank whose differ computes its own
    from then on. On simulated ranks or one rank it is a ReferenceTrainer."""

    def __init__(self, *args: Any, comm: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.comm = comm
        self.lineage: Any = None  # a digest of the start and of every step's inputs so far

    def _computed(self, config: tuple, x: np.ndarray, labels: np.ndarray) -> tuple:
        if not across_processes(self.comm):  # `once` shares it, with no digest of the step's inputs
            return super()._computed(config, x, labels)
        if self.lineage is None:  # the start: the seeded parameters, digested once
            self.lineage = digest(("spmdsim.ReferenceTrainer", tuple(self.params)))
        params, state = tuple(self.params), tuple(self.state)
        result, state = shared_once_on(self.comm, ("spmdsim.ReferenceTrainer.step", self.steps),
                                       lambda *given: _step_and_state(params, state, *given), self.lineage,
                                       config, self.steps, x, labels)
        self.lineage = digest((self.lineage, config, self.steps, x, labels))
        return result, tuple(p.copy() for p in result.params), state  # the parameters the trainer's own

    def _shared_anchored(self, anchor: Any, x: np.ndarray, labels: np.ndarray) -> Any:
        """An anchored step's loss and gradients (every input given: the run's parameters, gathered alike on
        every rank), rank 0 computing them for all under MPI; the lineage starts again after it."""
        if not across_processes(self.comm):
            return super()._shared_anchored(anchor, x, labels)
        self.lineage = None
        return shared_once_on(self.comm, ("spmdsim.ReferenceTrainer.anchored", self.steps),
                              reference._anchored_step, self.net, anchor.where, anchor.rows, x, labels)


def _step_and_state(params: tuple, state: tuple, lineage: Any, config: tuple, steps: int, x: np.ndarray,
                    labels: np.ndarray) -> tuple:
    """The reference step's (ReferenceStep, optimizer state after it): what rank 0 sends (the parameters after
    the update are the ReferenceStep's, so they travel once). `lineage`: digested, not read."""
    step, _, state = reference._train_step(config, params, state, steps, x, labels)
    return step, state
