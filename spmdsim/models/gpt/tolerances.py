"""What the training check allows under a precision policy (spmdsim.models.gpt.train, .pipeline): the loss's,
the gradients' and the parameters' tolerances against the reference step, from the longest sum a step rounds."""
from __future__ import annotations

from typing import Optional

import numpy as np
from ...base.precision import Precision, unit_roundoff
from ...references.tolerances import sum_rtol
from .config import GPTConfig

#: One e5m2 step relative to the value it rounds, at most (two mantissa bits): what an FP8 flip of a gradient
#: moves the value by, and a sum it dominates (spmdsim.models.gpt.step_check.flip_ratio).
FP8_FLIP = 2.0 ** -2
#: The steps in which a correct FP8 run may show a flip beyond the gradients' tolerance: one in this many.
FLIP_STEPS = 100
#: How far a low-precision run's gradient may be from the reference's, in units of the reference's own
#: distance from the same step one precision wider (spmdsim.models.gpt.step_check.rounding_ratio).
ROUNDING = 4.0


def longest_sum(cfg: GPTConfig) -> int:
    """The most terms any one sum of a training step adds: the batch's tokens (the loss's mean, each weight
    gradient), the MLP's second product (its hidden width, an expert's too), the vocabulary (softmax), a row
    (d_model)."""
    return max(cfg.batch * cfg.seq, cfg.hidden, cfg.expert_hidden, cfg.vocab, cfg.d_model)


def tolerances(policy: Precision, cfg: GPTConfig) -> tuple[float, float, float]:
    """(loss, gradients, updated parameters): the largest relative difference a checked step may show from
    the reference under `policy` (spmdsim.models.gpt.train: the loss relative to itself, a gradient or parameter
    relative to its tensor's largest entry). 1e-10 each at float64 (spmdsim.models.gpt.train.TOLERANCE).

    Under a low-precision policy the run and the reference round the same values at the same points; they
    differ only in the order of their float32 sums (a contraction split over ranks is summed by its
    collective, a gradient from each rank's rows). Two orders of a K-term sum differ by at most
    ``K eps32`` of the magnitudes that entered it (spmdsim.references.tolerances.sum_rtol); where the rounding to the
    activations' dtype falls between the two, they round to neighbours one ulp apart (2u of the value;
    u = 2**-8 for bfloat16), and that flip carries on through the rest of the step.

    - updated parameters: AdamW in float32 on the run's own gradients and moments (the reference's
      optimizer step takes them, not its own), so only its float32 operations round: ``sum_rtol(8,
      float32)`` for the update's eight operations; a bfloat16 parameter must equal its master copy
      rounded, exactly.
    - loss: a value whose two float32 sums differ by d flips with probability at most d / ulp, by one ulp:
      its expected change is d, what float32 would give. The loss (the mean of the tokens' losses, each
      >= 0, so the magnitudes that entered are the loss itself) is allowed float32's bound for the step's
      longest sum (`longest_sum`), ``K eps32``: an expected-value argument, not a worst case; the
      measured margins are in docs/howto/train.md ("Mixed precision (bf16)").
    - gradients: one flip moves a value by 2u of it, at most 2u of its tensor's largest entry, and is
      carried on by each later layer (layer norm renormalizes each row, the residual stream adds): 2u for
      each of the L layers and the embedding and the head, ``2u (L + 2)`` of the tensor's largest entry
      (at least the loss's K eps32). It bounds the flips of a correct run; it is about the size of the
      difference a reference that rounds elsewhere shows, so the loss is what separates those.
    """
    if policy.activation == "float64":
        return (1e-10,) * 3
    eps32 = sum_rtol(longest_sum(cfg), np.float32)
    u = unit_roundoff(policy.dtype("activation"))
    return eps32, max(2 * u * (cfg.layers + 2), eps32), sum_rtol(8, np.float32)


def flip_tolerance(policy: Precision, cfg: GPTConfig) -> Optional[float]:
    """Under an FP8 policy the gradients' tolerance, which the check's flip ratio adds one e5m2 step to
    (spmdsim.models.gpt.step_check.flip_ratio); None without FP8 (no flip is measured)."""
    return tolerances(policy, cfg)[1] if policy.fp8 is not None else None


def rounding_tolerance(policy: Precision, cfg: GPTConfig) -> Optional[float]:
    """Under a low-precision policy the gradients' tolerance, which the check's rounding ratio also allows of
    each gradient's own largest entry (spmdsim.models.gpt.step_check.rounding_ratio); None at float64."""
    return None if policy.activation == "float64" else tolerances(policy, cfg)[1]


def failed_steps(results: list) -> tuple[int, int]:
    """(the steps the check fails, the steps it passes as FP8 flips) of a run's StepResults
    (spmdsim.models.gpt.train).

    Under FP8 a step whose gradients exceed their tolerance, each element within one e5m2 step of its
    reference value more (`StepResult.flipped`), is a flip where the flipped value dominates a sum: rare
    (docs/explanation/tolerances.md, "FP8": one step in 200 where seen, none in most runs). One such step in
    FLIP_STEPS passes so, and one in any run of 2 steps or more (a flip is as likely in a short run); more
    fail, every one of them: a wrong gradient shows at every step, so at two steps of any run of two."""
    flipped = sum(r.flipped for r in results)
    failed = sum(not r.passed for r in results) - flipped
    allowed = max(1, len(results) // FLIP_STEPS) if len(results) >= 2 else 0
    if flipped > allowed:
        return failed + flipped, 0
    return failed, flipped
