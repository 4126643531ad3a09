"""Resuming a GPT checkpoint under another precision policy (spmdsim.base.precision's presets).

Every preset's checkpoint holds the model's weights, AdamW's moments and its step counts. bf16-mixed, fp8 and
fp8-current hold the same arrays: bfloat16 parameters, their float32 master copies (the weights the optimizer
updates) and float32 moments. A run under one of them resumes another's checkpoint with its weights, moments and
steps as saved; only FP8's tables of amax histories and scales differ: a run kept under the same preset takes
them, a run into fp8 from another preset starts them fresh as a new fp8 run does (scales 1, empty histories:
TransformerEngine's start when a bf16 run goes on in FP8), and a run out of fp8 drops them (`keeps_tables`).

fp64 and fp32 keep no master copy: their parameters are the weights, their moments of the parameters' dtype. Between
them and the mixed presets, and between the two, a checkpoint's state is copied into this run's dtypes as PyTorch's
distributed checkpoint loads a state into a module of another dtype: the weights (the master copy where one was
saved) become this run's master copy, or its parameters where it keeps none, rounded or widened to that dtype; a
bfloat16 parameter is cast from its master copy; the moments take this run's optimizer dtype (`converted`). The
resume line says what was rounded or widened (`switch_words`). A precision this spmdsim does not train is refused.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...base.precision import PRESETS, is_low

__all__ = ["switchable", "converts", "keeps_tables", "converted", "switch_words"]


def switchable(there: Any, here: Any) -> bool:
    """Whether a run under preset `here` resumes a checkpoint saved under preset `there` (another one)."""
    return there != here and there in PRESETS and here in PRESETS


def converts(there: Any, here: Any) -> bool:
    """Whether a run under `here` holds a checkpoint's state saved under `there` in other dtypes (`converted`)."""
    a, b = PRESETS.get(there), PRESETS.get(here)
    return a is not None and b is not None and (a.param, a.optimizer) != (b.param, b.optimizer)


def keeps_tables(there: Any, here: Any) -> bool:
    """Whether a run under `here` takes the FP8 tables of a checkpoint saved under `there`: the same preset."""
    return there == here


def converted(block: np.ndarray, entry: Optional[dict], dtype: Any) -> tuple[np.ndarray, Optional[dict]]:
    """(this run's block of a parameter, its AdamW state) from the saved `block` and state `entry` (its step count,
    "exp_avg", "exp_avg_sq" and where saved "master"; None: none) of another precision, for a parameter of
    `dtype`: the weights (the master copy of a bfloat16 block, else the block) as this run's master copy
    (float32) and the block cast from it where `dtype` is bfloat16, else as the block itself; the moments in
    float32 beside a bfloat16 parameter, else in `dtype`."""
    dtype = np.dtype(dtype)
    weights = entry["master"] if entry is not None and "master" in entry and is_low(block.dtype) else block
    low = is_low(dtype)
    master = weights.astype(np.float32) if low else None
    out = master.astype(dtype) if low else weights.astype(dtype)
    if entry is None:
        return out, None
    state = np.dtype(np.float32) if low else dtype
    moments = {f: entry[f].astype(state) for f in ("exp_avg", "exp_avg_sq") if f in entry}
    return out, {"step": entry["step"], **moments, **({"master": master} if low else {})}


def switch_words(there: Any, here: Any) -> str:
    """What a resume line adds where the checkpoint was saved under preset `there`, this run under `here`:
    ", from bf16-mixed: FP8's scales start fresh" ...; "" under the same preset (or one not known)."""
    if not switchable(there, here):
        return ""
    a, b = PRESETS[there], PRESETS[here]
    said = []
    weights, to = a.master or a.param, b.master or b.param
    if weights != to:
        how = "rounded" if np.dtype(to).itemsize < np.dtype(weights).itemsize else "widened"
        said.append(f"the {'master ' * bool(a.master)}weights and moments {how} to {to}")
    if b.master and not a.master:
        said.append(f"the {b.param} parameters cast from the {b.master} master")
    elif a.master and not b.master and weights == to:
        said.append(f"the {a.master} master as the weights")
    if b.fp8 is not None:
        said.append("FP8's scales start fresh")
    elif a.fp8 is not None:
        said.append("its FP8 scales dropped")
    return f", from {there}: {', '.join(said)}" if said else f", from {there}"
