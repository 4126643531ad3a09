"""The check's verdict of a training step (spmdsim.models.gpt.train, .pipeline): each rank's largest
differences from the reference step, and the gradient norm the run clipped by."""
from __future__ import annotations

import math
from typing import Any, Optional
import numpy as np
from ...base.precision import is_low
from ...errors import SpmdsimError
from ...runtime.sim import dry_run_active
from .wholes import peaks


def _summed_grads(optimizer: Any, tensors: dict, zero: int) -> tuple[dict, dict]:
    """(name -> this rank's block of the summed gradient the update read, name -> the master copy of each
    bfloat16 parameter), of the parameters `tensors` names; ZeRO-1's slices gathered over dp (collective)."""
    index = {id(p): i for i, p in enumerate(optimizer.params)}
    if zero:
        grads, masters = optimizer.gathered("grad"), optimizer.gathered("master")
        return ({name: grads[index[id(t)]] for name, t in tensors.items()},
                {name: masters[index[id(t)]] for name, t in tensors.items() if is_low(t.dtype)})
    return ({name: t.grad.local for name, t in tensors.items()},
            {name: optimizer.master[index[id(t)]] for name, t in tensors.items() if index[id(t)] in optimizer.master})


def _worst(local: np.ndarray, reference: np.ndarray, region: tuple, floor: float = 0.0,
           peak: Optional[float] = None) -> float:
    """The largest difference of this rank's block from its region, relative to the tensor's largest entry
    (`peak`, when known; or `floor`, when larger: a gradient that is zero but for rounding, like the key bias's,
    has no scale)."""
    if peak is None:
        peak = float(np.max(np.abs(reference), initial=0.0))
    scale = max(peak, floor) or 1.0
    return float(np.max(np.abs(local - reference[region]), initial=0.0)) / scale


def _norm(zero: Any, norms: list) -> Optional[float]:
    """The step's norm before clipping: the distributed optimizer's (`zero`), else the last of `norms` (None
    when nothing was clipped; a replayed step's is the array clip_grad_norm_ returned while capturing, which
    each replay rewrites)."""
    if zero is not None:
        return zero.last_norm
    return float(norms[-1]) if norms else None


def step_errors(value: float, ref_loss: float, grads: dict, updated: dict, tensors: dict,
                zero: Any = None, masters: Optional[dict] = None, top: Optional[dict] = None,
                slices: Optional[dict] = None, anchored: Optional[dict] = None) -> np.ndarray:
    """This rank's largest relative differences from the reference step (loss, gradients, updated
    parameters) over `tensors` (parameter name -> DTensor, in the optimizer's order); `zero` as
    `_grad_error`'s; `masters`: name -> this rank's master copy (float32, of a bfloat16 parameter),
    compared in the parameter's place. `top`: {"grads": ..., "updated": ...}, each name -> the reference's
    largest magnitude (spmdsim.models.gpt.wholes.peaks; computed here when not given); `slices`: name -> this rank's
    region (the tensor's own when not given). `anchored`: name -> this rank's block as the reference's AdamW
    updates it from the run's own start and gradient (`anchored_updates`), compared in place of `updated`'s
    region (the run's update of its own inputs, which no gradient's rounding can flip). The trainers take
    the maximum over the mesh."""
    masters = masters or {}
    top = top or {"grads": peaks(grads), "updated": peaks(updated)}
    slices = slices or {name: t.slices for name, t in tensors.items()}
    whole = (slice(None),)
    params = max(_worst(np.asarray(masters.get(name, t.local), np.float64), updated[name], slices[name],
                        peak=top["updated"][name]) if anchored is None else
                 _worst(np.asarray(t.local, np.float64), anchored[name], whole * t.local.ndim,
                        peak=top["updated"][name])
                 for name, t in tensors.items())
    for name, master in masters.items():  # the parameter is its master copy rounded once, exactly
        t = tensors[name]
        params = max(params, _worst(t.local.astype(np.float64), master.astype(t.dtype).astype(np.float64),
                                    (slice(None),) * master.ndim, top["updated"][name]))
    return np.array([abs(value - ref_loss) / max(abs(ref_loss), 1e-300),
                     _grad_error(tensors, grads, zero, top["grads"], slices), params])


def _grad_error(tensors: dict, grads: dict, zero: Any, top: Optional[dict] = None,
                slices: Optional[dict] = None) -> float:
    """The largest difference of this rank's gradients from the reference's, relative to the model's largest
    gradient entry (a gradient that is zero but for rounding, like the key bias's, has no scale of its own).
    With ZeRO-1 (`zero`, the DistributedAdamW over `tensors`' values): the summed gradient slice this rank
    updated. `top` and `slices` as step_errors'."""
    top = top or peaks(grads)
    slices = slices or {name: t.slices for name, t in tensors.items()}
    floor = max(top[name] for name in grads)
    if zero is None:
        return max(_worst(t.grad.local, grads[name], slices[name], floor, top[name]) for name, t in tensors.items())
    names = list(tensors)
    worst = 0.0
    for i, a, z, values in zero.grad_slices():
        reference = grads[names[i]]
        mine = reference[slices[names[i]]].reshape(-1)[a:z]
        scale = max(top[names[i]], floor) or 1.0
        worst = max(worst, float(np.max(np.abs(values - mine), initial=0.0)) / scale)
    return worst


#: The floating-point warnings a training step keeps to itself: an overflow turns into a non-finite loss or
#: parameter, which stop_if_diverged names in one line (16 lines of numpy warnings came before a PASS on NaN).
QUIET = {"over": "ignore", "invalid": "ignore"}


def stop_if_diverged(step: int, loss: float, params: dict, lr: float) -> None:
    """Raise SpmdsimError naming `step` when its loss (alike on every rank) or a block of `params` (name ->
    DTensor) this rank holds after the step's update is not finite: training diverged, where the check's
    differences came out NaN and it said PASS (`train_gpt.py --lr 1e300`). Not in a dry run (shapes only)."""
    if dry_run_active():
        return
    lower = f"expected a finite loss and parameters: a lower learning rate than {lr:g}, or clipping"
    if not math.isfinite(loss):
        raise SpmdsimError(f"step {step}: the loss is {loss} (not finite): training diverged; {lower}")
    bad = next((name for name, t in params.items() if not np.isfinite(t.local).all()), None)
    if bad is not None:
        raise SpmdsimError(f"step {step}: parameter {bad!r} is not finite after the update (loss {loss:.6g}): "
                           f"training diverged; {lower}")
