"""Resuming a GPT checkpoint on another mesh: dp, tp, sequence and context parallelism, experts' ep and etp, the
pipeline, ZeRO (1, 2 or FSDP's 3) or the precision changed (docs/howto/checkpoints.md).

A checkpoint records each saved rank's region of every parameter (under ZeRO-1 or 2 its slices' parts too; a
pipeline's, each stage's ranks' blocks of its own parameters), and what a resume may change is decided from the
metadata alone (spmdsim.models.gpt.reshard_scope). Loading is then a redistribution from the saved layout to the
new one, through the files, as PyTorch's distributed checkpoint reshards at load time from each tensor's saved
chunks: each rank works out, from the recorded regions and its own layout, which saved blocks overlap its own block
of every parameter (under ZeRO, the part of it its new slice holds; saved under ZeRO, which saved slices hold those
elements: spmdsim.models.gpt.flat_ranges), opens only those ranks' files (an .npz's arrays are read one by one,
when named), and copies the overlaps into its blocks of the parameter and of its optimizer's state for it: the
moments, the float32 master copy of a bfloat16 parameter (ZeRO's master slices whatever the dtype) and the step
counts (`load_resharded`); under another precision in this run's dtypes (spmdsim.models.gpt.reprecision). No
collective: the regions are in the metadata every rank reads, and what a rank finds wrong is agreed as on the same
mesh (checkpoint.load).

FSDP's shards (--zero 3: AdamW on each rank's rows of a parameter) are blocks as any other, and the parameters are
replicated over cp. An MoE GPT's experts are blocks over ("ep", ...), and ZeRO's groups of its dense parameters
over dp x ep are slices as any other. FP8's tables of amax histories and scales (spmdsim.base.fp8.Scales: the
model's, alike on every rank, or over a pipeline each chunk's, of its own layers' keys) are built by key: each of
the run's tables from the rows of its layers in the files of saved ranks that held those layers
(spmdsim.models.gpt.reshard_fp8), so FP8 resumes on another pipeline or none, and a run without a pipeline's
checkpoint on one.
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
from ...base.precision import bfloat16, is_low
from .checkpoint_files import Arrays, decode, header_problem, reason, saved_file
from .flat_ranges import wanted_range
from .reshard_fp8 import holders, tables
from .reprecision import converted, converts, keeps_tables
from .reshard_scope import ZERO_ADAMW

__all__ = ["load_resharded"]


def load_resharded(directory: str, saved: dict, params: dict, optimizer: Any, rank: int,
                   scales: tuple = (), layers: Optional[tuple] = None,
                   precision: Optional[str] = None) -> Optional[str]:
    """Load this rank's blocks of `params` (name -> DTensor) and its `optimizer`'s state for them (AdamW's or
    DistributedAdamW's) from the checkpoint in `directory` (its metadata `saved`), saved on another mesh or with
    the other of those optimizers: from each saved block that overlaps this rank's, read from only the files of
    the ranks chosen to give them (under ZeRO, of the ranks whose slices hold the overlap's elements; `rank`:
    this rank's on the whole mesh, its own file's where that holds a block), and FP8's `scales` (each table's
    `layers`, a range each; None: one table of every layer) by key from the files of ranks that held those
    layers (spmdsim.models.gpt.reshard_fp8). Under another `precision` than the saved one (None: the same), the
    state in this run's dtypes and FP8's tables fresh (spmdsim.models.gpt.reprecision). None, or why not (nothing
    then changed). No collective."""
    precision = saved.get("precision") if precision is None else precision
    convert = converts(saved.get("precision"), precision)  # (the weights then from the whole master: read all)
    chosen: list = []  # the saved ranks whose files this rank reads, in the order first needed
    zero = saved.get("optimizer") == ZERO_ADAMW
    index = {id(p): i for i, p in enumerate(optimizer.params)}
    needs = optimizer.slices_of(optimizer.mesh.rank) if hasattr(optimizer, "slices_of") else None  # ZeRO's
    plans = {}
    for name, t in params.items():  # (under ZeRO, of the moments only the part of the block its slice holds)
        need = True if needs is None or convert else needs[index[id(t)]][1:3]
        plans[name] = _plan(name, (saved.get("regions") or {}).get(name), t, chosen, zero and need)
        if isinstance(plans[name], str):
            return plans[name]
    for name, (mine, pieces) in plans.items():  # each block from a file read already where one holds it
        plans[name] = mine, [(_holder(ranks, chosen, rank), *rest) for ranks, *rest in pieces]
    layers = tuple(layers or (range(int(saved["config"]["layers"])),)) if scales else ()
    if len(layers) != len(scales):
        return f"this run gives the layers of {len(layers)} FP8 scale tables, for {len(scales)} tables"
    given = holders(saved.get("regions"), sorted({n for one in layers for n in one}))
    if isinstance(given, str):
        return given
    given = {n: _holder(ranks, chosen, rank) for n, ranks in given.items()}  # (FP8's rows: files read already)
    with ExitStack() as files:
        opened = {}
        for r in chosen:
            path = saved_file(directory, r, saved["step"])
            opened[r], problem = _open(files, path, r, saved)
            if problem:
                return problem
        try:
            blocks = {name: _gather(plans[name], _reader(opened, lambda r, name=name: f"param.{name}"),
                                    opened[plans[name][1][0][0]][1]["dtypes"][name]) for name in params}
            moments = {name: _moments(name, plans[name], opened, zero) for name in params}
            for name in params if convert else ():  # into this run's dtypes
                blocks[name], moments[name] = converted(blocks[name], moments[name], params[name].local.dtype)
            state = _state(optimizer.state_dict(), opened[chosen[0]][2], moments, blocks, list(params))
            built = tables(opened, given, list(layers), scales[0].recipe.history) \
                if scales and keeps_tables(saved.get("precision"), precision) else []  # else: fresh
        except Exception as e:  # a damaged file: any reader's error, one line
            return f"the files of ranks {chosen} cannot be read: {type(e).__name__}: {reason(e)}"
    if isinstance(built, str):
        return built
    try:
        optimizer.load_state_dict(state)
        for one, table in zip(scales, built):  # each chunk's rows by key, from the tables that held them
            one.load(*table)
    except (SpmdsimError, ValueError, KeyError) as e:  # moments of another shape: one line
        return f"the files of ranks {chosen}, resharded: {reason(e)}"
    for name, t in params.items():
        t.local[...] = blocks[name]
    return None


def _plan(name: str, recorded: Any, t: Any, chosen: list, zero: Any) -> Any:
    """(this rank's bounds, [(the saved ranks that hold a region, the region, its overlap with this rank's,
    ZeRO's sources or None)]) that make up this rank's block of parameter `name` (DTensor `t`; `recorded`: its
    regions in the metadata); with `zero` (saved under ZeRO: True, or the [start, stop) of this rank's flattened
    block its moments are wanted of) the slices that hold the overlap's moments too (`_sources`: their ranks
    appended to `chosen`); or why not."""
    shape = tuple(int(n) for n in t.global_shape)
    if not isinstance(recorded, dict) or tuple(recorded.get("shape", ())) != shape:
        return f"the checkpoint records no regions of parameter {name} of shape {shape}"
    mine = tuple(tuple(b) for b in t.layout.bounds(t.mesh.rank, shape))
    held_by: dict = {}  # each saved region -> the ranks that hold it (replicas), in rank order
    for r, bounds in enumerate(recorded["blocks"]):
        if bounds is None:  # a pipeline stage's rank that does not hold it
            continue
        held_by.setdefault(tuple(tuple(b) for b in bounds), []).append(r)
    pieces, covered = [], 0
    for region, ranks in held_by.items():
        overlap = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(region, mine))
        if any(lo >= hi for lo, hi in overlap):
            continue
        wanted = wanted_range(region, overlap, mine, zero) if zero else None
        sources = _sources(recorded.get("slices"), wanted, ranks, chosen) if zero else None
        if isinstance(sources, str):
            return f"the ZeRO slices recorded of parameter {name} {sources}"
        pieces.append((ranks, region, overlap, sources))
        covered += math.prod(hi - lo for lo, hi in overlap)
    if covered != math.prod(b - a for a, b in mine):
        return (f"the saved blocks of parameter {name} cover {covered} of the {math.prod(b - a for a, b in mine)} "
                f"elements of this rank's block {mine} (regions that overlap or leave gaps)")
    return mine, pieces


def _holder(ranks: list, chosen: list, me: int) -> int:
    """Which of the saved `ranks` that hold a block gives it: one already `chosen` (appended to) where one is,
    else this rank `me` where it is one, else the first."""
    r = next((r for r in ranks if r in chosen), me if me in ranks else ranks[0])
    if r not in chosen:
        chosen.append(r)
    return r


def _sources(slices: Any, need: list, ranks: list, chosen: list) -> Any:
    """[(saved rank, bucket, start, stop, where in its slice)]: the parts of the ZeRO slices of the saved ranks
    `ranks` (which hold the region; `slices`: each rank's [bucket, start, stop, offset] of the parameter's
    flattened block) that cover the ranges `need` of the region's flattened block (`wanted_range`), ranks already
    `chosen` (appended to) first; or why not."""
    if not isinstance(slices, list) or len(slices) <= max(ranks):
        return "are missing"
    out = []
    for r in sorted(ranks, key=lambda r: (r not in chosen, r)):
        k, lo, hi, off = slices[r]
        left = []
        for a, z in need:
            s, e = max(a, lo), min(z, hi)
            if s >= e:
                left.append((a, z))
                continue
            out.append((r, k, s, e, off + s - lo))
            if r not in chosen:
                chosen.append(r)
            left += [(x, y) for x, y in ((a, s), (e, z)) if x < y]
        need = left
    return f"leave elements {need[0][0]} to {need[0][1]} of a saved block uncovered" if need else out


def _open(files: ExitStack, path: str, r: int, saved: dict) -> tuple[Any, Optional[str]]:
    """((rank `r`'s .npz, opened lazily into `files`, its header, its optimizer state_dict with each array a
    reference), None), or (None, why not)."""
    if not os.path.exists(path):
        return None, f"rank {r}'s file {path} is missing"
    if not zipfile.is_zipfile(path):
        return None, f"rank {r}'s file {path} is not a .npz file (damaged, or not written by --save)"
    try:
        npz = files.enter_context(Arrays(path))
        header = json.loads(str(npz["header"]))
        state = decode(header["optimizer"], None)
    except Exception as e:  # a damaged file: any reader's error, one line
        return None, f"rank {r}'s file {path} cannot be read: {type(e).__name__}: {reason(e)}"
    problem = header_problem(path, r, header, saved["step"], saved["world size"])
    return (None if problem else (npz, header, state)), problem


def _within(inner: tuple, outer: tuple) -> tuple:
    """The slices of bounds `inner` within bounds `outer`."""
    return tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inner, outer))


def _reader(opened: dict, key: Any) -> Any:
    """A piece of a saved block: the overlap's part of the array `key(rank)` names in that rank's file."""
    return lambda r, region, overlap, sources: opened[r][0][key(r)][_within(overlap, region)]


def _slice_reader(opened: dict, field: str) -> Any:
    """A piece of a saved block's moments or master copy from the ZeRO slices that hold it (`_sources`)."""
    def piece(r: int, region: tuple, overlap: tuple, sources: list) -> np.ndarray:
        flat = np.zeros(math.prod(b - a for a, b in region))  # (float32's values exactly; none unread wanted)
        for q, k, s, e, off in sources:
            flat[s:e] = opened[q][0][opened[q][2]["state"][k][field]["array"]][off:off + e - s]
        return flat.reshape(tuple(b - a for a, b in region))[_within(overlap, region)]
    return piece


def _gather(plan: tuple, piece: Any, dtype: str) -> np.ndarray:
    """This rank's block of `plan` (`_plan`'s: its bounds and pieces), each piece read by `piece(rank, region,
    overlap, sources)` (bfloat16's as its 16 bits), of `dtype`'s name."""
    mine, pieces = plan
    out = np.empty(tuple(b - a for a, b in mine), np.uint16 if dtype == "bfloat16" else np.dtype(dtype))
    for r, region, overlap, sources in pieces:
        out[_within(overlap, mine)] = piece(r, region, overlap, sources)
    return out.view(bfloat16()) if dtype == "bfloat16" else out


def _moments(name: str, plan: tuple, opened: dict, zero: bool) -> Optional[dict]:
    """This rank's block of parameter `name`'s saved state (`plan`: `_plan`'s): its step count and, gathered,
    "exp_avg", "exp_avg_sq" and, where saved, "master"; None where it had not stepped (no state, as saved)."""
    r, _, _, sources = plan[1][0]
    if zero:  # every saved slice holds all three, for the bucket's members
        held = [one for piece in plan[1] for one in piece[3]]
        if not held:  # none of it wanted (in no part of this rank's ZeRO slice)
            return None
        entry = opened[held[0][0]][2]["state"][held[0][1]]
    else:
        entry = opened[r][2]["state"].get(opened[r][1]["params"].index(name))
        if entry is None:
            return None
    out = {"step": entry["step"]}
    for field in ("exp_avg", "exp_avg_sq", "master"):
        if field in entry:
            out[field] = _gather(plan, _field_reader(opened, name, field, zero), entry[field]["dtype"])
    return out


def _field_reader(opened: dict, name: str, field: str, zero: bool) -> Any:
    """A piece of parameter `name`'s saved state `field`: from the ZeRO slices (`zero`), else from a block."""
    if zero:
        return _slice_reader(opened, field)
    return _reader(opened, lambda q: opened[q][2]["state"][opened[q][1]["params"].index(name)][field]["array"])


def _state(fresh: dict, saved: dict, moments: dict, blocks: dict, names: list) -> dict:
    """This rank's optimizer state_dict (`fresh`: this optimizer's own, its placement) with the saved steps and
    hyperparameters (`saved`: a saved rank's state_dict; those this optimizer has) and each parameter's state
    (`moments`: `_moments`' of each name in parameter order `names`; `blocks`: the parameters' blocks): AdamW's
    per parameter (a float32 master for a bfloat16 one only), DistributedAdamW's per bucket (`_bucket_state`)."""
    group = fresh["param_groups"][0]
    group = {**group, **{h: v for h, v in saved["param_groups"][0].items() if h in group and h != "params"}}
    if "buckets" in fresh:
        state = _bucket_state(fresh, moments, blocks, names, saved["steps"])
    else:
        state = {j: {f: v for f, v in moments[name].items() if f != "master" or is_low(blocks[name].dtype)}
                 for j, name in enumerate(names) if moments[name] is not None}
    return {**fresh, "steps": saved["steps"], "param_groups": [group], "state": state}


def _bucket_state(fresh: dict, moments: dict, blocks: dict, names: list, steps: int) -> dict:
    """DistributedAdamW's state of this rank's slice of each bucket (`fresh`'s "buckets": members and slice)
    from each member's part of its block's state: the moments, and the master copy (the parameter's block
    where none was saved: AdamW's of a parameter of the master's own dtype), zeros in the padding."""
    state = {}
    for k, (_, _, members, (lo, hi)) in enumerate(fresh["buckets"]):
        out = {"step": steps, **{f: np.zeros_like(fresh["state"][k][f]) for f in ("exp_avg", "exp_avg_sq", "master")}}
        for i, a, z in members:
            s, e = max(a, lo), min(z, hi)
            if s >= e or moments[names[i]] is None:
                continue
            out["step"] = moments[names[i]]["step"]
            for f in ("exp_avg", "exp_avg_sq", "master"):
                whole = moments[names[i]].get(f, blocks[names[i]])
                out[f][s - lo:e - lo] = whole.reshape(-1)[s - a:e - a]
        state[k] = out
    return state
