"""Resuming a GPT checkpoint on another mesh: dp, tp and sequence parallelism changed (docs/howto/train-gpt.md,
"Stopping and resuming the GPT").

A checkpoint (spmdsim.models.gpt.checkpoint) records, beside every parameter's layout, each saved rank's region of
every parameter: [start, stop) per dim (`regions`, in its checkpoint.json). A run on another mesh whose model
config, precision, optimizer and pipeline settings match is a redistribution from the saved layout to the new one,
through the files, as PyTorch's distributed checkpoint reshards at load time from each tensor's saved chunks: each
rank works out, from the recorded regions and its own layout, which saved blocks overlap its own block of every
parameter, opens only those ranks' files (an .npz's arrays are read one by one, when named), and copies the
overlaps into its blocks of the parameter and of its optimizer's state for it: AdamW's moments, a bfloat16
parameter's float32 master copy and the step counts (`load_resharded`). No collective: the regions are in the
metadata every rank reads, and what a rank finds wrong is agreed as on the same mesh (checkpoint.load).

Resharding covers dp, tp and sp changes only: a checkpoint or run with ZeRO, FSDP, a pipeline, experts, context
parallelism or FP8's scales is refused in one line that names what differs and why (`scope`), as is a checkpoint
that records no regions (saved by an older spmdsim), alike on every rank and before any collective.
"""
from __future__ import annotations

import json
import math
import os
import zipfile
from contextlib import ExitStack
from typing import Any, Optional

import numpy as np

from ...errors import SpmdsimError
from ...base.precision import bfloat16
from ..axes import CONTEXT, DATA, EXPERT, PIPELINE, TENSOR
from .checkpoint_files import decode, header_problem, rank_file, reason

__all__ = ["MESH_KEYS", "regions", "scope", "resharded", "load_resharded", "resumed_words"]

#: The metadata a reshard may change: the mesh, its world size, sequence parallelism and so the layouts.
MESH_KEYS = ("world size", "mesh", "sequence parallelism", "layouts")

#: How a refusal to resume ends: the way out.
AGAIN = "resume with the settings it was saved with"


def regions(params: dict, world: int) -> dict:
    """name -> {"shape": the global shape, "blocks": each of the `world` ranks' [start, stop) per dim} of
    `params` (name -> DTensor): what checkpoint.json records for a resume on another mesh."""
    out = {}
    for name, t in params.items():
        shape = tuple(int(n) for n in t.global_shape)
        out[name] = {"shape": list(shape),
                     "blocks": [[[int(a), int(b)] for a, b in t.layout.bounds(r, shape)] for r in range(world)]}
    return out


def resharded(saved: dict, meta: dict) -> bool:
    """Whether the run of `meta` (checkpoint.run_meta) lays the checkpoint's parameters out otherwise."""
    return any(saved.get(key) != meta.get(key) for key in MESH_KEYS)


def scope(saved: dict, meta: dict) -> tuple[tuple, Optional[str]]:
    """(the metadata keys a reshard covers, which the comparison of the run of `meta` with the checkpoint's
    `saved` metadata (its config's defaults filled in) then skips; what ends the refusal of the first difference
    in place of "(resume with the settings it was saved with)" where a reshard is ruled out, or None)."""
    if not resharded(saved, meta) or (saved.get("pipeline") is None) != (meta.get("pipeline") is None):
        return (), None  # the same layout; or one side a pipeline: said by its flags
    blockers = [b for b in _blockers(saved) + _blockers(meta) if b]
    blockers = sorted(set(blockers), key=blockers.index)
    if any(saved.get(key) != here for key, here in meta.items() if key not in MESH_KEYS):
        # the config, precision, optimizer or pipeline differs too: said, as the mesh was before resharding
        return (() if blockers else MESH_KEYS), None  # (the config alone where the mesh could be resharded)
    if blockers:
        return (), f"(resharding covers dp, tp and sp changes only, not {' or '.join(blockers)}: {AGAIN})"
    if not isinstance(saved.get("regions"), dict):
        return (), f"(it records no ranks' regions to reshard from, saved by an older spmdsim: {AGAIN})"
    return MESH_KEYS, None


def _blockers(meta: dict) -> list:
    """What in the run of `meta` rules resharding out, each as a refusal names it."""
    mesh = meta.get("mesh") if isinstance(meta.get("mesh"), dict) else {}
    layouts = meta.get("layouts") if isinstance(meta.get("layouts"), dict) else {}
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    return [meta.get("optimizer") != "AdamW" and "ZeRO (--zero 1 or 2)",
            any(f'"{DATA}"' in str(layout) for layout in layouts.values()) and "FSDP (--zero 3)",
            (meta.get("pipeline") is not None or PIPELINE in mesh) and "a pipeline (--pp)",
            (config.get("moe") is not None or EXPERT in mesh) and "experts (MoE layers)",
            CONTEXT in mesh and "context parallelism (--cp)",
            meta.get("precision") == "fp8" and "FP8's scales (--precision fp8)"]


def load_resharded(directory: str, saved: dict, params: dict, optimizer: Any) -> Optional[str]:
    """Load this rank's blocks of `params` (name -> DTensor) and its `optimizer`'s state for them from the
    checkpoint in `directory` (its metadata `saved`), saved on another mesh: from each saved block that overlaps
    this rank's, read from only the files of the ranks chosen to give them. None, or why not (nothing then
    changed). No collective."""
    chosen: list = []  # the saved ranks whose files this rank reads, in the order first needed
    plans = {}
    for name, t in params.items():
        plans[name] = _plan(name, (saved.get("regions") or {}).get(name), t, chosen)
        if isinstance(plans[name], str):
            return plans[name]
    with ExitStack() as files:
        opened = {}
        for r in chosen:
            path = rank_file(directory, r)
            opened[r], problem = _open(files, path, r, saved)
            if problem:
                return problem
        try:
            blocks = {name: _gather(plans[name], _param_reader(opened, name), opened[chosen[0]][1]["dtypes"][name])
                      for name in params}
            state = _state(optimizer.state_dict(), opened, plans, list(params), chosen[0])
        except Exception as e:  # a damaged file: any reader's error, one line
            return f"the files of ranks {chosen} cannot be read: {type(e).__name__}: {reason(e)}"
    try:
        optimizer.load_state_dict(state)
    except (SpmdsimError, ValueError, KeyError) as e:  # moments of another shape: one line
        return f"the files of ranks {chosen}, resharded: {reason(e)}"
    for name, t in params.items():
        t.local[...] = blocks[name]
    return None


def _plan(name: str, recorded: Any, t: Any, chosen: list) -> Any:
    """(this rank's bounds, [(saved rank, its region, the overlap with this rank's)]) that make up this rank's
    block of parameter `name` (DTensor `t`; `recorded`: its regions in the metadata), each overlap from one of the
    saved ranks that hold it: one already `chosen` (appended to) where one is, else this rank where it is one,
    else the first; or why not."""
    shape = tuple(int(n) for n in t.global_shape)
    if not isinstance(recorded, dict) or tuple(recorded.get("shape", ())) != shape:
        return f"the checkpoint records no regions of parameter {name} of shape {shape}"
    mine = tuple(tuple(b) for b in t.layout.bounds(t.mesh.rank, shape))
    holders: dict = {}  # each saved region -> the ranks that hold it (replicas), in rank order
    for r, bounds in enumerate(recorded["blocks"]):
        holders.setdefault(tuple(tuple(b) for b in bounds), []).append(r)
    pieces, covered = [], 0
    for region, ranks in holders.items():
        overlap = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(region, mine))
        if any(lo >= hi for lo, hi in overlap):
            continue
        r = next((r for r in ranks if r in chosen), t.mesh.rank if t.mesh.rank in ranks else ranks[0])
        if r not in chosen:
            chosen.append(r)
        pieces.append((r, region, overlap))
        covered += math.prod(hi - lo for lo, hi in overlap)
    if covered != math.prod(b - a for a, b in mine):
        return (f"the saved blocks of parameter {name} cover {covered} of the {math.prod(b - a for a, b in mine)} "
                f"elements of this rank's block {mine} (regions that overlap or leave gaps)")
    return mine, pieces


def _open(files: ExitStack, path: str, r: int, saved: dict) -> tuple[Any, Optional[str]]:
    """((rank `r`'s .npz, opened lazily into `files`, its header, its optimizer state_dict with each array a
    reference), None), or (None, why not)."""
    if not os.path.exists(path):
        return None, f"rank {r}'s file {path} is missing"
    if not zipfile.is_zipfile(path):
        return None, f"rank {r}'s file {path} is not a .npz file (damaged, or not written by --save)"
    try:
        npz = files.enter_context(np.load(path, allow_pickle=False))
        header = json.loads(str(npz["header"]))
        state = decode(header["optimizer"], None)
    except Exception as e:  # a damaged file: any reader's error, one line
        return None, f"rank {r}'s file {path} cannot be read: {type(e).__name__}: {reason(e)}"
    problem = header_problem(path, r, header, saved["step"], saved["world size"])
    return (None if problem else (npz, header, state)), problem


def _param_reader(opened: dict, name: str) -> Any:
    return lambda r: opened[r][0][f"param.{name}"]


def _state_reader(opened: dict, index: int, field: str) -> Any:
    return lambda r: opened[r][0][opened[r][2]["state"][index][field]["array"]]


def _gather(plan: tuple, read: Any, dtype: str) -> np.ndarray:
    """This rank's block of `plan` (`_plan`'s: its bounds and pieces), each saved block read by `read(rank)`
    (bfloat16's as its 16 bits), of `dtype`'s name."""
    mine, pieces = plan
    out = np.empty(tuple(b - a for a, b in mine), np.uint16 if dtype == "bfloat16" else np.dtype(dtype))
    for r, region, overlap in pieces:
        src = read(r)[tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(overlap, region))]
        out[tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(overlap, mine))] = src
    return out.view(bfloat16()) if dtype == "bfloat16" else out


def _state(fresh: dict, opened: dict, plans: dict, names: list, first: int) -> dict:
    """This rank's optimizer state_dict (`fresh`: this optimizer's own, its placement) with the saved steps,
    hyperparameters and each parameter's state: step counts as saved, arrays gathered as its blocks are."""
    header, saved = opened[first][1], opened[first][2]
    state = {}
    for j, name in enumerate(names):
        i = header["params"].index(name)
        entry = saved["state"].get(i)
        if entry is None:  # a parameter that has not stepped: no state, as saved
            continue
        state[j] = {field: value if not isinstance(value, dict) else
                    _gather(plans[name], _state_reader(opened, i, field), value["dtype"])
                    for field, value in entry.items()}
    return {**fresh, "steps": saved["steps"], "param_groups": saved["param_groups"], "state": state}


def resumed_words(directory: str, saved: dict, dp: int, tp: int, sp: bool) -> str:
    """What a trainer says as it resumes from `directory` (its metadata `saved`) on a (`dp`, `tp`) mesh with
    sequence parallelism `sp` or not: the step, and the mesh it was saved on where that differs
    (checkpoint.resume_line)."""
    line = f"resuming from {directory} at step {saved['step']}"
    mesh = saved.get("mesh") if isinstance(saved.get("mesh"), dict) else {}
    was = bool(saved.get("sequence parallelism"))
    if (mesh.get(DATA), mesh.get(TENSOR), was) == (dp, tp, bool(sp)):
        return line
    words = " x ".join(f"{axis} {n}" for axis, n in mesh.items())
    return (f"{line}, resharded from {words} ({saved.get('world size')} ranks)"
            f"{' with sequence parallelism' if was else ''}")
