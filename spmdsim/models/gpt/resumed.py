"""The line a GPT trainer prints as it resumes a checkpoint (spmdsim.models.gpt.checkpoint.resume_line): the step,
and where the checkpoint was saved on another mesh, pipeline, sequence parallelism, ZeRO stage or precision, what it
was saved with, from the metadata both sides have (docs/howto/checkpoints.md)."""
from __future__ import annotations

from typing import Any, Optional

from ..axes import AXIS_ORDER
from .reprecision import switch_words
from .reshard_scope import ZERO_ADAMW

__all__ = ["resumed_words"]


def resumed_words(directory: str, saved: dict, mesh: dict, sp: bool, zero: int,
                  precision: Optional[str] = None) -> str:
    """What a trainer says as it resumes from `directory` (its metadata `saved`) on the mesh `mesh` (axis ->
    size, as checkpoint.json records it: "pp" where a pipeline runs) with sequence parallelism `sp` or not and
    ZeRO stage `zero`: the step, and the mesh, sequence parallelism and ZeRO stage it was saved with where any
    of them differs, or the run's that it was saved without (checkpoint.resume_line); under another `precision`
    (None: not said) the one it was saved under and what converted (spmdsim.models.gpt.reprecision.switch_words)."""
    line = f"resuming from {directory} at step {saved['step']}"
    switched = "" if precision is None else switch_words(saved.get("precision"), precision)  # said last
    there = saved.get("mesh") if isinstance(saved.get("mesh"), dict) else {}
    was = bool(saved.get("sequence parallelism"))
    stage = saved.get("zero", _stage(saved.get("optimizer"), zero))
    if (there, was, stage) == (mesh, bool(sp), zero):
        return line + switched
    order = AXIS_ORDER + tuple(a for a in there if a not in AXIS_ORDER)  # (recorded cp first; said in layout order)
    words = " x ".join(f"{axis} {there[axis]}" for axis in order if axis in there)
    extra = [was and "sequence parallelism", stage == 3 and "FSDP (ZeRO-3)",
             stage in (1, 2) and f"ZeRO-{stage}", stage is None and "ZeRO-1 or 2"]
    lacks = [sp and not was and "sequence parallelism", zero and stage == 0 and "ZeRO"]  # what the run adds
    said = [f"with {' and '.join(e for e in extra if e)}" if any(extra) else "",
            f"without {' or '.join(e for e in lacks if e)}" if any(lacks) else ""]
    said = ", ".join(s for s in said if s)
    return f"{line}, resharded from {words}{f' {said}' if said else ''} ({saved.get('world size')} ranks){switched}"


def _stage(optimizer: Any, zero: int) -> Optional[int]:
    """The ZeRO stage of a checkpoint that records none (saved by an older spmdsim) of `optimizer`, resumed under
    stage `zero`: that one where the optimizer is the same, else 0 for AdamW and None (1 or 2) for ZeRO's."""
    if (optimizer == ZERO_ADAMW) == (zero in (1, 2)):
        return zero
    return None if optimizer == ZERO_ADAMW else 0
