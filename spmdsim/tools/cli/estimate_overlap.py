"""`spmdsim estimate`'s --overlap: the transfer phases a step's compute hides (spmdsim.tools.estimate.steptime)."""
from __future__ import annotations

from typing import Any

from ...errors import SpmdsimError
from ...models.axes import PIPELINE, TENSOR

__all__ = ["OVERLAP_HELP", "OVERLAP", "overlap_phases"]

OVERLAP_HELP = ("also hide, as NeMo's recipes run them: tp, the layers' tensor-parallel collectives under their "
                 "GEMMs (Megatron's --tp-comm-overlap); pp, the pipeline's messages under the microbatches' compute "
                 "(overlap_p2p_comm; interleaved schedule only); params, ZeRO-1's and ZeRO-2's gathers of the "
                 "updated parameters under the next step's forward (--overlap-param-gather; else with the gradient "
                 "sums under the backward); each at most that compute's time; none, nothing "
                 "hidden, the dp gradient sums after the backward (Megatron's local DDP). Default: only the dp "
                 "gradient sums, under the backward")

#: The transfer phases the step time lets the backward hide (spmdsim.tools.estimate.steptime's overlap): the
#: data-parallel gradient sums, as DDP's and Megatron's buckets run under the backward.
OVERLAP = ("gradients",)

#: --overlap's words and the transfer phase each adds to OVERLAP (spmdsim.tools.estimate.steptime.OVERLAP_UNDER).
OVERLAP_WORDS = {TENSOR: "layers", PIPELINE: "pipeline", "params": "updates"}
#: --overlap's word for hiding nothing, the gradient sums included (Megatron's local DDP sums after the backward).
NONE = "none"


def overlap_phases(given: Any, pp: int, schedule: str) -> tuple[str, ...]:
    """The transfer phases the step time hides: OVERLAP and those --overlap names ("tp,pp"; None: none)."""
    if given is None:
        return OVERLAP
    if given.strip() == NONE:
        return ()
    words = [w.strip() for w in given.split(",")]
    for word in words:
        if word not in OVERLAP_WORDS:
            raise SpmdsimError(f"--overlap {given!r}: {word!r} is unknown; expected a comma-separated list of "
                               f"{', '.join(OVERLAP_WORDS)} (e.g. --overlap tp,pp), or none")
    if pp == 1:  # no pipeline, no messages between stages to hide: not said among what the step hides
        words = [w for w in words if w != PIPELINE]
    elif PIPELINE in words and schedule != "interleaved":
        raise SpmdsimError(f"--overlap pp hides the pipeline's messages as Megatron's overlap_p2p_comm does, in the "
                           f"interleaved schedule only, not {schedule}; give --virtual-stages N > 1 or leave out pp")
    return OVERLAP + tuple(OVERLAP_WORDS[w] for w in OVERLAP_WORDS if w in words)
