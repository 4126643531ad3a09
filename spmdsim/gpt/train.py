"""Training the parallel GPT with AdamW, every step checked against the same model trained in one numpy process.

Each step: the batch (every rank draws the same, spmdsim.gpt.data), the
distributed forward and backward (spmdsim.gpt.parallel), AdamW on each
rank's shards (spmdsim.optim.AdamW); then, when checking, the reference step
(spmdsim.gpt.reference: hand-written backward, numpy AdamW) and one
comparison: the loss, each parameter's gradient and its updated value, each
rank against its own region of the reference, the largest relative
difference (to the tensor's largest entry) agreed by one Allreduce(MAX).
Simulated ranks run the reference once between them (spmdsim.sim.once).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..layout import Layout
from .config import GPTConfig
from .data import batch
from .params import decays, param_specs

__all__ = ["StepResult", "train", "TOLERANCE"]

#: The largest relative difference a step may show against the single-process reference (float64).
TOLERANCE = 1e-10


@dataclass(frozen=True)
class StepResult:
    """One step: the loss, the largest relative differences (loss, gradients, parameters), its traffic."""

    step: int
    loss: float
    errors: tuple[float, float, float]  # NaN when not checked
    calls: int
    bytes_sent: int

    @property
    def passed(self) -> bool:
        return all(e <= TOLERANCE for e in self.errors if e == e)


def _reference_step(state: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: int) -> tuple:
    """(new state, loss, grads) of one reference step; the state's arrays are replaced, never changed."""
    from ..optim import adamw_update
    from .reference import loss_and_grads

    loss, grads = loss_and_grads(state["params"], x, y, cfg, step)
    new = {"params": {}, "m": {}, "v": {}}
    for spec in param_specs(cfg):
        name = spec.name
        p, m, v = (state[k][name].copy() for k in ("params", "m", "v"))
        adamw_update(p, grads[name], m, v, step + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=cfg.weight_decay if decays(spec) else 0.0)
        new["params"][name], new["m"][name], new["v"][name] = p, m, v
    return new, loss, grads


def _initial_state(cfg: GPTConfig) -> dict:
    from .reference import init_params

    params = init_params(cfg)
    return {"params": params, "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def _worst(local: np.ndarray, reference: np.ndarray, region: tuple, floor: float = 0.0) -> float:
    """The largest difference of this rank's block from its region, relative to the tensor's largest entry
    (or `floor`, when larger: a gradient that is zero but for rounding, like the key bias's, has no scale)."""
    scale = max(float(np.max(np.abs(reference), initial=0.0)), floor) or 1.0
    return float(np.max(np.abs(local - reference[region]), initial=0.0)) / scale


def train(cfg: GPTConfig, comm: Any, dp: int, tp: int, steps: int, text_ids: np.ndarray, sp: bool = False,
          check: bool = True, on_step: Optional[Callable[[StepResult], Any]] = None) -> tuple[Any, list]:
    """Train `steps` steps on a (dp, tp) mesh over `comm`; returns (the model, one StepResult per step).

    Collective: every rank calls it alike.
    """
    from .. import ops
    from ..optim import AdamW
    from ..runtime import DTensor, Mesh, collect_trace, collectives
    from ..sim import dry_run_active, once
    from .parallel import GPT

    mesh = Mesh(Layout((dp, tp), ("dp", "tp")), comm)
    model = GPT(cfg, mesh, sp=sp)
    specs = param_specs(cfg)
    params = [model.params[s.name] for s in specs]
    optimizer = AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                      decay=[model.params[s.name] for s in specs if decays(s)])
    check = check and not dry_run_active()  # a dry run has shapes, not values
    state = once(("gpt-reference", cfg, 0), _initial_state, cfg) if check else None
    ids_layout = mesh.layout("dp", None)
    results = []
    for step in range(steps):
        x, y = batch(text_ids, cfg, step)
        xd, yd = DTensor.from_global(mesh, x, ids_layout), DTensor.from_global(mesh, y, ids_layout)
        optimizer.zero_grad()
        with collect_trace() as trace:
            loss = model.loss(xd, yd, step)
            loss.backward()
            optimizer.step()
        value = float(ops.resolved(loss).local)
        errors = (float("nan"),) * 3
        if check:
            state, ref_loss, grads = once(("gpt-reference", cfg, step + 1), _reference_step, state, x, y, cfg, step)
            # Gradients against the model's largest gradient entry: a softmax's key bias gets a gradient
            # that is zero but for rounding, which has no scale of its own.
            floor = max(float(np.max(np.abs(g))) for g in grads.values())
            mine = np.array([abs(value - ref_loss) / max(abs(ref_loss), 1e-300),
                             max(_worst(model.params[s.name].grad.local, grads[s.name], model.params[s.name].slices,
                                        floor) for s in specs),
                             max(_worst(model.params[s.name].local, state["params"][s.name],
                                        model.params[s.name].slices) for s in specs)])
            errors = tuple(float(e) for e in collectives.allreduce(mesh, mine, ("dp", "tp"), label="check",
                                                                   op="max"))
        totals = trace.totals()
        result = StepResult(step, value, errors, totals["calls"], totals["bytes_sent"])
        results.append(result)
        if on_step is not None:
            on_step(result)
    return model, results
