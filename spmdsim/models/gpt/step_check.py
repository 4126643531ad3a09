"""The check's verdict of a training step (spmdsim.models.gpt.train, .pipeline): each rank's largest
differences from the reference step, and the gradient norm the run clipped by."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterator, Optional
import numpy as np
from ...base.precision import is_low
from ...errors import SpmdsimError
from ...nn.optim_state import STATE_WORDS
from ...base.validate import counted
from ...runtime.door import all_gather_object
from ...runtime.sim import dry_run_active
from .reference_step import Overflows
from .tolerances import FP8_FLIP, ROUNDING
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
    (`peak`, when known), or `floor` when larger."""
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
                slices: Optional[dict] = None, anchored: Optional[dict] = None,
                flip: Optional[float] = None, rounding: Optional[float] = None) -> np.ndarray:
    """This rank's largest relative differences from the reference step (loss, gradients, updated
    parameters, under FP8 the gradients' `flip_ratio`, under a low-precision policy their `rounding_ratio`)
    over `tensors` (parameter name -> DTensor, in the optimizer's order); `zero` as `_grad_blocks`';
    `masters`: name -> this rank's master copy (float32, of a bfloat16 parameter), compared in the
    parameter's place. `top`: {"grads": ..., "updated": ...}, each name
    -> the reference's largest magnitude (spmdsim.models.gpt.wholes.peaks; computed here when not given);
    `slices`: name -> this rank's region (the tensor's own when not given). `anchored`: name -> this rank's
    block as the reference's AdamW updates it from the run's own start and gradient (`anchored_updates`),
    compared in place of `updated`'s region (the run's update of its own inputs, which no gradient's rounding
    can flip). `flip`: under FP8 the gradients' tolerance (the fourth entry NaN without it); `rounding`: under a
    low-precision policy the same (the fifth entry NaN without it; `top` then has "rounding"). The trainers take
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
    blocks = list(_grad_blocks(tensors, grads, zero, top["grads"], slices))
    grad = max((float(np.max(d, initial=0.0)) / scale for d, _, scale, _ in blocks), default=0.0)
    loss = abs(value - ref_loss) / max(abs(ref_loss), 1e-300)
    # a NaN difference (a value the run or the reference made non-finite) is within nothing: never a PASS
    return np.array([*(e if e == e else float("inf") for e in (loss, grad, params)),
                     float("nan") if flip is None else flip_ratio(blocks, flip),
                     float("nan") if rounding is None else rounding_ratio(blocks, top, rounding)])


#: resolved_errors' entries of a step not checked (a dry run, or the check turned off).
UNCHECKED = (float("nan"),) * 3 + (None, None)


def resolved_errors(worst: Any) -> tuple:
    """step_errors' five entries, the worst over the mesh, as the trainers keep them: three floats, the flip
    ratio (None without FP8) and the rounding ratio (None at float64): a NaN is not equal to itself, and every
    rank's StepResult must be."""
    loss, grad, params, flip, rounding = (float(e) for e in worst)
    return loss, grad, params, None if flip != flip else flip, None if rounding != rounding else rounding


def rounding_ratio(blocks: list, top: dict, tolerance: float) -> float:
    """The gradients' largest difference relative to what their own rounding allows each (<= 1: within):
    ROUNDING times the distance of the tensor's reference gradient from the same step one precision wider
    (`top["rounding"]`, spmdsim.models.gpt.reference_step._wider_grads), or the gradients' `tolerance` of the
    tensor's own largest entry when larger.

    The gradients' tolerance is of the larger of the tensor's largest entry and the model's largest
    gradient (`_grad_blocks`), which a wrong gradient much smaller than the model's largest passes. Here
    each is measured against its own: where its sums cancel (the queries' and keys' weights, through
    softmax's backward) the reference's own rounding moves it far more than 2u of its largest entry, and
    the run, rounding the same values in another order, moves as far; where nothing cancels both are small
    (docs/explanation/tolerances.md, "Low precision")."""
    worst = 0.0
    for d, _, _, name in blocks:
        allowed = max(ROUNDING * top["rounding"][name], tolerance * top["grads"][name])
        largest = float(np.max(d, initial=0.0))
        worst = max(worst, largest / allowed if allowed else (0.0 if largest == 0.0 else float("inf")))
    return worst


def flip_ratio(blocks: list, tolerance: float) -> float:
    """The gradients' largest difference relative to what one FP8 flip allows each element: the gradients'
    `tolerance` of its tensor's scale plus one e5m2 step of its reference value (FP8_FLIP; <= 1: within).

    A cast of a gradient to e5m2 that falls the other way in the run and the reference (their bfloat16 inputs
    a flip apart) moves that value by one e5m2 step, up to 2^-2 of it; where the flipped value dominates a
    sum downstream (the embeddings' rows of a sequence's first positions, where one token's gradient is
    most of the row) the sum moves by up to 2^-2 of itself: more than the tolerance's expected-value
    argument allows (docs/explanation/tolerances.md, "FP8")."""
    worst = 0.0
    for d, reference, scale, _ in blocks:
        allowed = tolerance * scale + FP8_FLIP * np.abs(reference)
        worst = max(worst, float(np.max(d / allowed, initial=0.0)))
    return worst


def _grad_blocks(tensors: dict, grads: dict, zero: Any, top: Optional[dict] = None,
                 slices: Optional[dict] = None) -> Iterator[tuple]:
    """(|difference|, the reference's values, scale, the parameter's name) of each of this rank's gradient
    blocks from the reference's, the scale the larger of its tensor's largest entry and the model's largest
    gradient entry.

    Not the tensor's own alone: under bf16 a gradient whose sums cancel (the queries' and keys' weights,
    through softmax's backward) differs from its reference by up to 10% of its own largest entry in a
    correct run (a flip is 2u of the terms, not of what they sum to), so a gradient much smaller than the
    model's largest is checked loosely here (and closely by `rounding_ratio`); at fp64 every gradient's
    difference is within 1e-10 of the model's largest entry (docs/explanation/tolerances.md, "Low
    precision"). With ZeRO-1 (`zero`, the DistributedAdamW over `tensors`' values): the summed gradient slice
    this rank updated. `top` and `slices` as step_errors'."""
    top = top or peaks(grads)
    slices = slices or {name: t.slices for name, t in tensors.items()}
    floor = max(top[name] for name in grads)
    if zero is None:
        for name, t in tensors.items():
            reference = grads[name][slices[name]]
            yield np.abs(t.grad.local - reference), reference, max(top[name], floor) or 1.0, name
        return
    names = list(tensors)
    for i, a, z, values in zero.grad_slices():
        mine = grads[names[i]][slices[names[i]]].reshape(-1)[a:z]
        yield np.abs(values - mine), mine, max(top[names[i]], floor) or 1.0, names[i]


#: The floating-point warnings a training step keeps to itself: an overflow turns into a non-finite loss or
#: parameter, which stop_if_diverged names in one line (16 lines of numpy warnings came before a PASS on NaN).
QUIET = {"over": "ignore", "invalid": "ignore"}


def stop_if_diverged(step: int, loss: float, params: dict, lr: float, clipping: bool = True, what: str = "",
                     optimizer: Any = None, weights: str = "") -> None:
    """Raise SpmdsimError naming `step` (after `what`, the network's name, where given) when its loss (alike on
    every rank) or a block of `params` (name -> DTensor) this rank holds after the step's update is not finite:
    training diverged, where the check's differences would come out NaN and pass (`train_gpt.py --lr 1e300`).
    With `optimizer`, its state too (AdamW's second moment past float range: the parameters stop moving while
    the loss still looks fine, `train_moe_gpt.py --z-loss-coeff 1e300`). `clipping`: the trainer can clip its
    gradients (said beside the lower learning rate); `weights`: other weights to lower ("router-loss weights
    (aux 0.01, z 1e+300)": `router_weights`).
    Not in a dry run."""
    if dry_run_active():
        return
    lower = _lower(lr, clipping, weights)
    if not math.isfinite(loss):
        raise SpmdsimError(f"{what}step {step}: the loss is {loss} (not finite): training diverged; {lower}")
    bad = next((name for name, t in params.items() if not np.isfinite(t.local).all()), None)
    if bad is not None:
        raise SpmdsimError(f"{what}step {step}: parameter {bad!r} is not finite after the update (loss {loss:.6g}): "
                           f"training diverged; {lower}")
    found = None if optimizer is None else optimizer.nonfinite_state()
    if found is not None:
        field, held = found
        name = next((name for name, t in params.items() if t is held), None)
        of = "" if name is None else f" of {name!r}"
        raise SpmdsimError(f"{what}step {step}: {type(optimizer).__name__}'s "
                           f"{STATE_WORDS.get(field, field)}{of} is not finite after the update (loss {loss:.6g}): "
                           "training diverged, the parameters stop moving; "
                           f"{lower.replace('loss and parameters', 'optimizer state')}")


def _lower(lr: float, clipping: bool, weights: str) -> str:
    """What a diverged training's line expects, and the ways to it (stop_if_diverged's arguments)."""
    lower = f"expected a finite loss and parameters: a lower learning rate than {lr:g}{', or clipping' * clipping}"
    return lower + (f", or lower {weights}" if weights else "")


def stop_if_reference_diverged(step: int, loss: float, ref_loss: float, top: dict, cfg: Any) -> None:
    """Raise SpmdsimError naming `step` where the check's reference step (one numpy process's: its loss `ref_loss`,
    its gradients' and updated parameters' largest magnitudes `top`, spmdsim.models.gpt.wholes.peaks) is not
    finite while the run's loss `loss` and parameters are (stop_if_diverged passed them): the values outgrew their
    dtype in the reference's order of operations first, and the check has nothing to compare them with. Its
    differences would come out NaN and pass (`train_gpt.py --lr 1e20 --steps 6`). Alike on every rank (the
    reference is the ranks' one, spmdsim.runtime.shared_reference.shared_once), before any collective of the check's."""
    if not math.isfinite(ref_loss):
        said = f"its loss is {ref_loss}"
    else:
        bad = next(((what, name) for what, key in (("gradient", "grads"), ("updated parameter", "updated"))
                    for name, peak in top[key].items() if not math.isfinite(peak)), None)
        if bad is None:
            return
        said = f"its {bad[0]} {bad[1]!r} is not finite"
    raise SpmdsimError(f"step {step}: the check's step in one numpy process went past float range ({said}) where the "
                       f"run's did not (loss {loss:.6g}): training diverged, the step cannot be checked; "
                       f"{_lower(cfg.lr, True, router_weights(cfg))}")


def router_weights(cfg: Any) -> str:
    """The router losses' weights of `cfg`'s MoE layers, as stop_if_diverged names them (none without)."""
    moe = getattr(cfg, "moe", None)
    return "" if moe is None else f"router-loss weights (aux {moe.aux_loss_coeff:g}, z {moe.z_loss_coeff:g})"


def agreed_overflow(comm: Any, watch: Overflows, results: list, policy: Any) -> list:
    """`results` with the first step any rank's own step overflowed (`watch`, this rank's, watching each step `at`
    its number in place of QUIET) said in the last one's `overflow`: one Allgather of one small object over
    `comm` (collective; an unchecked run's, not a dry run's, whose reference says none). `policy`: the run's
    precision policy, named in the line."""
    if dry_run_active() or not results:
        return results
    firsts = [f for f in all_gather_object(comm, (watch.first, watch.kind)) if f[0] is not None]
    if not firsts:
        return results
    step, kind = min(firsts)
    on = sum(f[0] == step for f in firsts)
    said = (f"step {step} {kind} ({policy.name}) on {on} of {counted(comm.Get_size(), 'rank')}; unchecked, its "
            "loss and parameters are not to be trusted")
    return results[:-1] + [replace(results[-1], overflow=said, own_overflow=True)]
