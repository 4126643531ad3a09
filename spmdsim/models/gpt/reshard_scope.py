"""What a GPT checkpoint records for a resume on another mesh, and what such a resume may change
(docs/howto/checkpoints.md); spmdsim.models.gpt.reshard loads it.

A checkpoint (spmdsim.models.gpt.checkpoint) records, beside every parameter's layout, each saved rank's region of
every parameter: [start, stop) per dim (`regions`, in its checkpoint.json), and under ZeRO-1 or 2 (DistributedAdamW:
each rank holds a slice of flat buckets of the moments and master copy) the part of each rank's flattened block of
it that the rank's slice holds, and where in the slice (Megatron-Core's "dp-reshardable" distributed optimizer
checkpoint likewise maps bucket slices back to parameters); a pipeline's, gathered at the save, each rank's blocks of
its stage's parameters and None for the others' (`stage_regions`: a parameter's name is the same on any stage).

A resume reshards (`resharded`) where the run's mesh, pipeline, optimizer (AdamW and ZeRO-1 or 2's
DistributedAdamW) or precision differ from the checkpoint's; `scope` says which metadata keys the reshard then
covers, so that only another config is refused. An MoE GPT's experts' tensor-parallel size (config moe.etp) lays
them out as the mesh does (`etp_of_run`). A checkpoint that records no regions (under ZeRO no slices: saved by an
older spmdsim) takes this run's where only the precision changed, off a pipeline (`with_own_regions`), else is
refused in one line naming what differs and why (`scope`), alike on every rank before any collective.
"""
from __future__ import annotations

from typing import Any, Optional

from ...runtime.door import all_gather_object
from .reprecision import switchable

__all__ = ["MESH_KEYS", "OPTIMIZERS", "ADAMW", "ZERO_ADAMW", "AGAIN", "regions", "stage_regions", "resharded",
           "scope", "with_own_regions", "etp_of_run"]

#: The metadata a reshard may change: the mesh, its world size, sequence parallelism and so the layouts.
MESH_KEYS = ("world size", "mesh", "sequence parallelism", "layouts")

#: The optimizers a reshard moves the state between, as checkpoint.json names them: AdamW (no ZeRO, or FSDP's) and
#: ZeRO-1 and 2's.
OPTIMIZERS = (ADAMW, ZERO_ADAMW) = ("AdamW", "DistributedAdamW")

#: How a refusal to resume ends: the way out.
AGAIN = "resume with the settings it was saved with"


def regions(params: dict, world: int, optimizer: Any = None) -> dict:
    """name -> {"shape": the global shape, "blocks": each of the `world` ranks' [start, stop) per dim} of
    `params` (name -> DTensor): what checkpoint.json records for a resume on another mesh; under ZeRO
    (`optimizer` a DistributedAdamW) "slices" too: each rank's [bucket, start, stop, offset] of the parameter's
    flattened block that its slice of the bucket holds, from `offset` in the slice (start == stop: none)."""
    zero = [optimizer.slices_of(r) for r in range(world)] if hasattr(optimizer, "slices_of") else None
    index = {id(p): i for i, p in enumerate(getattr(optimizer, "params", ()))}
    out = {}
    for name, t in params.items():
        shape = tuple(int(n) for n in t.global_shape)
        out[name] = {"shape": list(shape),
                     "blocks": [[[int(a), int(b)] for a, b in t.layout.bounds(r, shape)] for r in range(world)]}
        if zero is not None:
            out[name]["slices"] = [[int(n) for n in one[index[id(t)]]] for one in zero]
    return out


def stage_regions(params: dict, mesh: Any, optimizer: Any) -> dict:
    """`regions` of a pipeline's stages (collective: one Allgather over `mesh`, the whole (pp, ...) mesh, of
    each rank's own): each rank's block of the parameters of its stage (`params`, on its stage's mesh), and None
    in "blocks" (and "slices") for a rank whose stage does not hold the parameter."""
    zero = optimizer.slices_of(optimizer.mesh.rank) if hasattr(optimizer, "slices_of") else None
    index = {id(p): i for i, p in enumerate(getattr(optimizer, "params", ()))}
    own = {}
    for name, t in params.items():
        shape = tuple(int(n) for n in t.global_shape)
        own[name] = (list(shape), [[int(a), int(b)] for a, b in t.layout.bounds(t.mesh.rank, shape)],
                     None if zero is None else [int(n) for n in zero[index[id(t)]]])
    every = all_gather_object(mesh.comm, own) if mesh.size > 1 else [own]
    out: dict = {}
    for r, theirs in enumerate(every):
        for name, (shape, bounds, slices) in theirs.items():
            one = out.setdefault(name, {"shape": shape, "blocks": [None] * len(every)})
            one["blocks"][r] = bounds
            if slices is not None:
                one.setdefault("slices", [None] * len(every))[r] = slices
    return out


def _covered(saved: dict, meta: dict) -> tuple:
    """The metadata keys a reshard from `saved` to the run of `meta` may change: the mesh's, the pipeline's, and
    the optimizer between AdamW and ZeRO-1 or 2's DistributedAdamW, the precision where the state converts."""
    both = saved.get("optimizer") in OPTIMIZERS and meta.get("optimizer") in OPTIMIZERS
    other = switchable(saved.get("precision"), meta.get("precision"))  # (spmdsim.models.gpt.reprecision)
    return MESH_KEYS + ("pipeline",) + ("optimizer",) * both + ("precision",) * other


def resharded(saved: dict, meta: dict) -> bool:
    """Whether the run of `meta` (checkpoint.run_meta) lays the checkpoint's parameters or optimizer state out
    otherwise (its mesh, its pipeline's stages, its optimizer) or holds them in other dtypes (its precision)."""
    return any(saved.get(key) != meta.get(key) for key in MESH_KEYS + ("pipeline", "optimizer", "precision"))


def scope(saved: dict, meta: dict) -> tuple[tuple, Optional[str]]:
    """(the metadata keys a reshard covers, which the comparison of the run of `meta` with the checkpoint's
    `saved` metadata (its config's defaults filled in) then skips; what ends the refusal of the first difference
    in place of "(resume with the settings it was saved with)" where a reshard is ruled out, or None)."""
    if not resharded(saved, meta):
        return (), None  # the same layout
    keys = _covered(saved, meta)
    if any(saved.get(key) != here for key, here in meta.items() if key not in keys):
        return keys, None  # the config, precision or optimizer differs too: said, as on the same mesh
    if _recorded(saved) or (_laid_out_as_saved(saved, meta) and saved.get("pipeline") is None):
        return keys, None
    pipeline = _laid_out_as_saved(saved, meta)  # the precision changed only, on a pipeline: else the layout's
    what = "convert a pipeline's state" if pipeline else "reshard"  # difference is said, not the precision's
    return ("precision",) * (not pipeline), f"(it records no ranks' regions to {what} from, saved by an older " \
        f"spmdsim: {AGAIN})"


def _recorded(saved: dict) -> bool:
    """Whether checkpoint metadata `saved` records each rank's regions (under ZeRO, its slices too)."""
    one = saved.get("regions")
    return isinstance(one, dict) and (saved.get("optimizer") != ZERO_ADAMW or all(
        isinstance(r, dict) and "slices" in r for r in one.values()))


def _laid_out_as_saved(saved: dict, meta: dict) -> bool:
    """Whether the run of `meta` lays the state out as the checkpoint (`saved`) did: mesh, pipeline, optimizer."""
    return all(saved.get(k) == meta.get(k) for k in MESH_KEYS + ("pipeline", "optimizer"))


def with_own_regions(saved: dict, meta: dict, params: dict, world: int, optimizer: Any) -> dict:
    """`saved` (a checkpoint's metadata) with this run's `regions` of `params` on `world` ranks where it records
    none (saved by an older spmdsim) and the run of `meta` changed its precision only, without a pipeline."""
    keep = _recorded(saved) or not _laid_out_as_saved(saved, meta) or saved.get("pipeline") is not None
    return saved if keep else {**saved, "regions": regions(params, world, optimizer)}


def etp_of_run(saved: dict, meta: dict) -> dict:
    """`saved` (a checkpoint's metadata) with its experts' tensor-parallel size (config moe.etp) the run of
    `meta`'s where the two configs differ in nothing else: etp lays the experts out, as the mesh does (resharded
    where the layouts differ)."""
    there, here = saved.get("config"), meta.get("config")
    if not (isinstance(there, dict) and isinstance(here, dict) and isinstance(there.get("moe"), dict)
            and isinstance(here.get("moe"), dict)):
        return saved
    config = {**there, "moe": {**there["moe"], "etp": here["moe"].get("etp")}}
    return {**saved, "config": config} if config == here else saved
