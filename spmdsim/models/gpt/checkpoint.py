"""Checkpoints of the GPT trainer (spmdsim.models.gpt.train): save, validate and resume, per rank
(docs/howto/checkpoints.md).

A checkpoint is a directory: one file per rank, ``rank-00000.npz`` ..., that rank's parameter blocks, its optimizer's
`state_dict()` (spmdsim.nn.optim: this rank's moments, ZeRO-1's slices, a bfloat16 parameter's float32 master; a
pipeline stage's rank, its stage's), under FP8 its scales and amax histories (each chunk's on a pipeline stage) and
the step reached; and ``checkpoint.json``, written by rank 0, which records what a resume must match: the model's
config (GPTConfig, its MoE config too), the world size and the mesh (pp, dp, ep, cp, tp, sequence parallelism), every
parameter's layout, the precision policy and the optimizer, the pipeline (schedule, microbatches, chunks, split; None
without), the step reached and the training's first loss (step 0's: a resumed run judges its loss's trend from it,
`first_loss`). A save into a directory that holds a checkpoint (the one resumed) leaves it readable until the new
one is whole: each rank writes its file aside under its step's name, rank 0 the metadata once every rank has (a
rank that cannot write stops every rank with its line), then each renames its file into place (a resume finds a
file not yet renamed under its step's name: checkpoint_files.saved_file), and a save ends when all have (the whole
checkpoint is there when a trainer returns). The files hold arrays and text only (numpy's .npz read with
``allow_pickle=False``; the optimizer's dict as JSON beside its arrays, bfloat16 as its 16 bits): no pickle.

A step's data and randomness are functions of its index (spmdsim.models.gpt.data.batch, params' dropout seeds), so
the step reached is the whole data position: a run resumed at step s steps as the run that never stopped, bit for bit.

On resume every rank reads ``checkpoint.json`` and refuses, alike and before any collective, a missing or unreadable
directory or metadata file, another config, precision, optimizer or pipeline, and a checkpoint at or past the run's
last step (`resume_problem`); a config field the checkpoint lacks (added to GPTConfig after it was saved, as Llama's
options were) reads as its default, the model it was saved of. Another mesh, world size or sequence parallelism, and
so other layouts, is resharded where only dp, tp, sp, cp, ep, etp, the pipeline and ZeRO (FSDP too) changed
(spmdsim.models.gpt.reshard: rank 0 records each rank's region of every parameter, under ZeRO its slices' parts too,
and on resume each rank reads the pieces it needs from the files that hold them; FP8's tables by key, each layer's
rows from a file of its stage), the precision too (its state converted: spmdsim.models.gpt.reprecision), and
refused in one line otherwise. Then each rank reads its own file
(resharded: the files it needs); what a rank finds wrong there (its file missing or unreadable, blocks of another
shape, another step) can differ between ranks, so the ranks agree on it by one Allgather of their problems and every
rank raises the first one: one line, exit 2, never a hang (`load`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from typing import Any, Optional

import numpy as np

from ...errors import SpmdsimError
from ...base.precision import bfloat16, precision as get_precision
from ...runtime.door import all_gather_object
from .config import GPTConfig
from ...layouts.layout import Layout, TensorLayout
from ...nn.fsdp import on_mesh, shard_axes, sharded_layout
from ...runtime.sim import dry_run_active
from ..axes import CONTEXT, DATA, EXPERT, PIPELINE, SHARD, model_layout
from .layouts import megatron_layouts
from .mesh import zero_cut
from .reshard import load_resharded
from .reshard_scope import (ADAMW, AGAIN, ZERO_ADAMW, etp_of_run, regions, resharded, scope, stage_regions,
                            with_own_regions)
from .resumed import resumed_words
from .checkpoint_files import (FORMAT as _FORMAT, META, VERSION as _VERSION, Arrays, decode, encode, header_problem,
                               pending_file, put_in_place, rank_file, read_meta, remove_past, reason as _reason,
                               saved_file, write_aside)

__all__ = ["META", "agreed", "rank_file", "run_meta", "resume_problem", "save_problem", "save", "load", "read_meta",
           "checkpoint_problem", "checkpoint_meta", "first_loss", "with_first_loss", "resume_line"]


def _plain(value: Any) -> Any:
    """`value` as JSON holds it (tuples as lists, numpy numbers as Python's)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))


def run_meta(cfg: Any, world: int, mesh_layout: Any, sp: bool, layouts: dict, precision: str,
             optimizer: str) -> dict:
    """What a resume must match (JSON-plain): `cfg` (GPTConfig), the world size, the mesh's axes and sizes
    (`mesh_layout`, a Layout) and sequence parallelism, each parameter's layout (`layouts`: name -> TensorLayout),
    the precision policy's name and the optimizer's class name."""
    axes = {str(a): int(n) for a, n in sorted(zip(mesh_layout.alias_name, mesh_layout.device_matrix),
                                              key=lambda axis: axis[0] != CONTEXT)}  # cp first: said, not dp
    return _plain({"world size": world, "mesh": axes, "sequence parallelism": bool(sp),
                   "config": dataclasses.asdict(cfg), "layouts": {k: str(v) for k, v in layouts.items()},
                   "precision": precision, "optimizer": optimizer})


def first_loss(resume: Optional[str]) -> Optional[float]:
    """The first loss of the training a run resumes from `resume` (its step 0's, which that checkpoint records),
    or None: no --resume, or a checkpoint saved before it recorded one."""
    return None if resume is None else ((read_meta(resume)[0] or {}).get("first loss"))


def resume_line(directory: str, dp: int, tp: int, sp: bool, *, pp: Any = None, cp: int = 1, zero: int = 0,
                ep: Optional[int] = None, etp: int = 0, precision: Optional[str] = None, fs: int = 0) -> str:
    """"resuming from DIR at step 3", and where the checkpoint in `directory` was saved on another mesh than this
    run's (pp where a pipeline runs, dp, ep with experts, cp, tp, the experts' etp: `checkpoint_meta`'s), with or
    without sequence parallelism `sp`, or under another ZeRO stage than `zero`, what it was saved with:
    ", resharded from pp 2 x dp 2 x tp 2 with ZeRO-1 (8 ranks)", and under another `precision` (None: not said)
    what converted: ", from bf16-mixed: FP8's scales start fresh": what a trainer prints as it resumes. `fs`:
    HSDP's shard group (as `checkpoint_meta`'s)."""
    hybrid = 0 < fs < dp  # (pp False: none)
    sizes, names = model_layout(tp, dp // fs if hybrid else dp, ep, pp or None, cp if cp > 1 else None,
                                fs if hybrid else None, etp=etp)
    return resumed_words(directory, read_meta(directory)[0], dict(zip(names, sizes)), sp, zero, precision)


def with_first_loss(meta: dict, resume: Optional[str], results: list) -> dict:
    """`meta` for `save` with the training's first loss: the resumed checkpoint's, else this run's first step's
    (`results`: its StepResults)."""
    return {**meta, "first loss": first_loss(resume) if resume is not None else results[0].loss}


def resume_problem(directory: str, meta: dict, steps: int) -> Optional[str]:
    """Why the run described by `meta` (`run_meta`) cannot resume from `directory` and train to `steps`, or None.
    Pure and alike on every rank (each reads the same metadata file): call it before any collective."""
    saved, problem = read_meta(directory)
    if problem:
        return problem
    if isinstance(saved.get("config"), dict):  # a field added since it was saved: its default
        saved = {**saved, "config": {**_config_defaults(), **saved["config"]}}
    meta = {k: v for k, v in meta.items() if k != "zero"}  # (said by the resume line, not compared)
    saved = etp_of_run(saved, meta)  # (the experts' etp: another layout, resharded)
    covered, why_not = scope(saved, meta)  # another mesh: resharded (spmdsim.models.gpt.reshard), or why not
    problem = _difference(directory, saved, meta, steps, covered)
    return problem.replace(f"({AGAIN})", why_not) if problem and why_not else problem


def _difference(directory: str, saved: dict, meta: dict, steps: int, covered: tuple) -> Optional[str]:
    """`resume_problem`'s refusal of the first difference of `meta` from the checkpoint's `saved` metadata but
    those `covered` (by a reshard), or of the step reached against `steps`."""
    for key, here in meta.items():
        there = saved.get(key)
        if key in covered:
            continue
        if key == "mesh" and (saved.get("pipeline") is None) != (meta.get("pipeline") is None):
            # one side a pipeline, the other none: both as typed ("pp none, this run's 2" said the mesh's pp)
            return (f"--resume {directory}: the checkpoint was saved {_pipeline_words(saved)}, this run "
                    f"{_pipeline_words(meta)} ({AGAIN})")
        if there == here:
            continue
        if key == "pipeline" and isinstance(here, dict) and isinstance(there, dict):
            for k in list(here) + [k for k in there if k not in here]:
                if here.get(k) != there.get(k):
                    return (f"--resume {directory}: the checkpoint's pipeline has {_pipeline_flag(k, there.get(k))}, "
                            f"this run's {_pipeline_flag(k, here.get(k))} ({AGAIN})")
        if isinstance(here, dict) and isinstance(there, dict):  # keys one side lacks first (the mesh's "etp")
            said = [_field(k, here.get(k), there.get(k)) for k in sorted(list(here) + [k for k in there if k not in
                    here], key=lambda k: k in here and k in there) if here.get(k) != there.get(k)]
            more = f" and {len(said) - 1} more" if key == "layouts" and len(said) > 1 else ""  # (FSDP's: each one's)
            said = said[:1] if more else said
            mine = said[0][2] if len(said) == 1 and not more else " and ".join(f"{k} {m}" for k, _, m in said) + more
            if said:  # (`--tp 2` resumed with `--tp 4` said "mesh has dp 2, this run's 1")
                return (f"--resume {directory}: the checkpoint's {key} has "
                        f"{' and '.join(f'{k} {t}' for k, t, _ in said)}{more}, this run's {mine} ({AGAIN})")
        return (f"--resume {directory}: the checkpoint's {key} is {_shown(there)}, this run's {_shown(here)} "
                f"({AGAIN})")
    if saved["step"] >= steps:
        return (f"--resume {directory}: the checkpoint is at step {saved['step']}, at or past --steps {steps}; "
                f"give --steps above {saved['step']} to train on")
    return None


def _config_defaults() -> dict:
    """GPTConfig's defaults as run_meta records them: what a checkpoint's config lacking a field (saved before the
    field was added, as Llama's options were) had, since each default is the model as it was before."""
    return _plain(dataclasses.asdict(GPTConfig()))


def save_problem(directory: str) -> Optional[str]:
    """Why checkpoints cannot be written into `directory` (made when missing), or None: checked before any work."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        return f"--save {directory}: is not a directory (expected a directory to write the checkpoint into)"
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        return f"--save {directory}: cannot make the directory: {_reason(e)}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"--save {directory}: the directory is not writable"
    return None


def _shown(value: Any) -> str:
    """A metadata value as a refusal says it."""
    return "none" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else repr(value)


def _field(k: str, mine: Any, theirs: Any) -> tuple[str, str, str]:
    """(name, the checkpoint's, this run's) of a field that differs, shown; of a dict (the MoE config) its first."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        k, mine, theirs = next((f"{k}.{j}", mine.get(j), theirs.get(j)) for j in {**theirs, **mine}
                               if mine.get(j) != theirs.get(j))
    elif k == "moe":  # an MoE GPT's checkpoint resumed dense, or the reverse: its experts, not its whole config
        return k, *(f"{v.get('experts')} experts (an MoE GPT)" if isinstance(v, dict) else "none (a dense GPT)"
                    for v in (theirs, mine))
    return k, _shown(theirs), _shown(mine)


#: The pipeline's recorded fields -> the flag that sets each (spmdsim.programs.pipeline.options.pipeline_arguments).
_PIPELINE_FLAGS = {"schedule": "--schedule", "microbatches": "--microbatches", "virtual": "--virtual-stages",
                   "split": "--stage-layers"}


def _pipeline_flag(field: str, value: Any) -> str:
    """A pipeline's recorded field as the flag that gives it: "--schedule 1f1b", "--stage-layers 1,3" (None:
    balanced)."""
    if field == "split":
        return ("a balanced split (no --stage-layers)" if value is None else
                f"--stage-layers {','.join(map(str, value)) if isinstance(value, list) else value}")
    flag = _PIPELINE_FLAGS.get(field)
    return f"{flag} {value}" if flag else f"{field} {_shown(value)}"


def _pipeline_words(meta: dict) -> str:
    """How the run of `meta` was pipelined, as its flags: "with --pp 2 --schedule 1f1b --microbatches 4" (its
    --virtual-stages beyond 1 and --stage-layers when not balanced too), or "without a pipeline"."""
    pipeline = meta.get("pipeline")
    if pipeline is None:
        return "without a pipeline"
    mesh = meta.get("mesh")
    pp = mesh.get(PIPELINE) if isinstance(mesh, dict) else None
    words = [f"--pp {pp}"] * (pp is not None) + [_pipeline_flag(k, pipeline.get(k))
                                                 for k in ("schedule", "microbatches")]
    words += [_pipeline_flag("virtual", pipeline.get("virtual"))] * (pipeline.get("virtual", 1) != 1)
    words += [_pipeline_flag("split", pipeline.get("split"))] * (pipeline.get("split") is not None)  # not balanced
    return "with " + " ".join(words)


def save(directory: str, meta: dict, step: int, mesh: Any, params: dict, optimizer: Any, scales: tuple = ()) -> None:
    """Write this rank's file of the checkpoint at `step` (the steps done) into `directory`, and on rank 0 the
    metadata `meta` (`run_meta`) after it: `params` name -> DTensor, `optimizer` the trainer's, `scales` its FP8
    scales (spmdsim.base.fp8.Scales: a model's, or each chunk's of a pipeline stage). Collective: every rank writes
    its own aside (checkpoint_files.pending_file; a pipeline's ranks gather their regions: reshard_scope.stage_regions),
    the ranks agree that all did (else each raises the first rank's problem, and the metadata still names the
    checkpoint the directory held), rank 0 writes the metadata, the ranks agree, each renames its file into place
    and they agree again, so that the whole checkpoint is there when any rank goes on (a resume in the same
    program, by any rank, reads it all)."""
    rank = mesh.rank
    arrays: dict = {}
    header = {"rank": rank, "step": step, "world size": meta["world size"], "params": list(params),
              "optimizer": encode(optimizer.state_dict(), arrays), "fp8": []}
    for i, one in enumerate(scales):  # each one's keys in the header, its scales and histories as arrays
        keys, arrays[f"fp8.{i}.scales"], arrays[f"fp8.{i}.history"] = one.state()
        header["fp8"].append(keys)
    for name, t in params.items():
        block = np.asarray(t.local)
        arrays[f"param.{name}"] = block.view(np.uint16) if block.dtype.name == "bfloat16" else block
        header.setdefault("dtypes", {})[name] = block.dtype.name
    arrays["header"] = np.array(json.dumps(header))
    problem = write_aside(pending_file(directory, rank, step), lambda f: np.savez(f, **arrays))  # (the old kept)
    # each rank's region of every parameter too, for a resume on another mesh (a pipeline's gathered: collective)
    where = regions(params, mesh.size, optimizer) if meta.get("pipeline") is None else \
        stage_regions(params, mesh, optimizer)
    agreed(mesh.comm, problem and f"--save {directory}: {problem}")  # every rank's file written: then the metadata
    if rank == 0:
        text = json.dumps({"format": _FORMAT, "version": _VERSION, "step": step, **meta, "regions": where},
                          indent=1) + "\n"
        problem = write_aside(os.path.join(directory, META), lambda f: f.write(text.encode("utf-8")))
    agreed(mesh.comm, problem and f"--save {directory}: {problem}")  # (rank 0's) the new checkpoint is the one
    problem = put_in_place(directory, rank, step)
    if rank == 0 and not problem:  # an earlier checkpoint's files of more ranks, replaced: not left beside it
        remove_past(directory, meta["world size"])
    agreed(mesh.comm, problem and f"--save {directory}: {problem}")


def agreed(comm: Any, problem: Optional[str]) -> None:
    """Raise on every rank of `comm` the first of the ranks' problems (this rank's `problem`), if any: one
    Allgather (collective), so that no rank goes on, or waits, alone."""
    problems = all_gather_object(comm, problem) if comm.Get_size() > 1 else [problem]
    first = next((p for p in problems if p), None)
    if first:
        raise SpmdsimError(first)


def _read_own(directory: str, step: int, rank: int, world: int, params: dict, optimizer: Any,
              scales: tuple = ()) -> Optional[str]:
    """Load this rank's file into `params`, `optimizer` and `scales`; None, or why not (nothing then trusted)."""
    path = saved_file(directory, rank, step)
    if not os.path.exists(path):
        return f"rank {rank}'s file {path} is missing"
    if not zipfile.is_zipfile(path):
        return f"rank {rank}'s file {path} is not a .npz file (damaged, or not written by --save)"
    try:
        with Arrays(path) as f:
            arrays = {k: f[k] for k in f.files}
        header = json.loads(str(arrays["header"]))
        blocks = {}
        for name in header["params"]:
            block = arrays[f"param.{name}"]
            if header["dtypes"][name] == "bfloat16":
                block = block.view(bfloat16())
            blocks[name] = block
        state = decode(header["optimizer"], arrays)
    except FileNotFoundError:
        return f"rank {rank}'s file {path} is missing"
    except Exception as e:  # a damaged file: any reader's error, one line
        return f"rank {rank}'s file {path} cannot be read: {type(e).__name__}: {_reason(e)}"
    problem = header_problem(path, rank, header, step, world)
    if problem:
        return problem
    if list(blocks) != list(params):
        return f"rank {rank}'s file {path} holds the parameters {list(blocks)}, this model {list(params)}"
    for name, t in params.items():
        if blocks[name].shape != t.local.shape or blocks[name].dtype != t.local.dtype:
            return (f"rank {rank}'s file {path}: parameter {name} is {blocks[name].dtype} of shape "
                    f"{blocks[name].shape}, this rank's block {t.local.dtype} of shape {t.local.shape}")
    tables = len(header.get("fp8", ()))
    if tables != len(scales):
        return f"rank {rank}'s file {path} holds {tables} FP8 scale tables, this run {len(scales)}"
    try:
        optimizer.load_state_dict(state)
        for i, one in enumerate(scales):
            one.load(header["fp8"][i], arrays[f"fp8.{i}.scales"], arrays[f"fp8.{i}.history"])
    except (SpmdsimError, ValueError, KeyError) as e:
        return f"rank {rank}'s file {path}: {_reason(e)}"
    for name, t in params.items():
        t.local[...] = blocks[name]
    return None


def load(directory: str, mesh: Any, params: dict, optimizer: Any, scales: tuple = (),
         meta: Optional[dict] = None, layers: Optional[tuple] = None) -> int:
    """Every rank loads its own file of the checkpoint in `directory` into `params` (name -> DTensor), `optimizer`
    and `scales` (`save`'s); returns the step reached. Collective (one Allgather of the ranks' problems): a rank whose
    file is missing or does not fit makes every rank raise the same one line (the lowest such rank's). Call
    `resume_problem` first (the metadata is read again here: it must still be readable). With `meta` (this run's
    `run_meta`), a checkpoint saved on another mesh is resharded (spmdsim.models.gpt.reshard.load_resharded;
    `layers`: the layers of each of `scales`' tables, a range each; None: one table of every layer)."""
    saved, problem = read_meta(directory)
    step = saved["step"] if saved else 0
    if not problem:  # saved on another mesh (`meta`: this run's run_meta): resharded, from the files it needs
        problem = load_resharded(directory, with_own_regions(saved, meta, params, mesh.size, optimizer), params,
                                 optimizer, mesh.rank, scales, layers, meta["precision"]) \
            if meta is not None and resharded(saved, meta) else \
            _read_own(directory, step, mesh.rank, mesh.size, params, optimizer, scales)
        problem = problem and f"--resume {directory}: {problem}"
    agreed(mesh.comm, problem)
    return step


def checkpoint_problem(cfg: GPTConfig, world: int, dp: int, tp: int, steps: int, *, sp: bool = False,
                       layouts: Optional[dict] = None, precision: Any = "fp64", zero: int = 0, ep: int = 1,
                       save: Optional[str] = None, save_every: int = 0, resume: Optional[str] = None,
                       pipeline: Optional[dict] = None, cp: int = 1, fs: int = 0) -> Optional[str]:
    """Why `train`'s checkpoint settings (`save`, `save_every`, `resume`) cannot be for a run of these arguments
    (`train`'s; with `pipeline`, spmdsim.models.gpt.pipeline.train_pipelined's: {"pp", "schedule", "microbatches",
    "virtual", "split"}) on `world` ranks, or None; alike on every rank and no collective (every rank reads the
    same metadata file): a dry run (no values to save), `save_every` not an integer >= 0 or without `save`, an
    unwritable `save` directory, a `resume` checkpoint that does not fit (spmdsim.models.gpt.checkpoint.resume_problem:
    missing, another config, mesh, world size, layout, precision, optimizer or pipeline, at or past `steps`).
    The trainers refuse the same; a program asks first to refuse before it prints anything."""
    if save is None and resume is None and not save_every:
        return None
    meta = checkpoint_meta(cfg, world, dp, tp, sp=sp, layouts=layouts, precision=precision, zero=zero, ep=ep,
                           pipeline=pipeline, cp=cp, fs=fs)
    return _checkpoint_problem(meta, steps, save, save_every, resume)


def checkpoint_meta(cfg: GPTConfig, world: int, dp: int, tp: int, *, sp: bool = False,
                    layouts: Optional[dict] = None, precision: Any = "fp64", zero: int = 0, ep: int = 1,
                    pipeline: Optional[dict] = None, cp: int = 1, fs: int = 0) -> dict:
    """spmdsim.models.gpt.checkpoint.run_meta of a `train` run (or, with `pipeline`, a train_pipelined one, as
    `checkpoint_problem`'s): the mesh's axes (a pipeline's "pp" first, `cp` where above 1), its parameters' layouts
    (Megatron's and `layouts`, on a stage's mesh), and the pipeline's schedule, microbatches, chunks and split
    (None without). `fs`: under ZeRO-3, HSDP's shard group (the dp ranks each parameter is sharded over, on a mesh
    (dp / fs, fs, tp)); 0, or all of dp, shards over dp."""
    moe = cfg.moe is not None or ep > 1
    hybrid = zero == 3 and 0 < fs < dp
    inner = model_layout(tp, dp // fs if hybrid else dp, ep if moe else None, cp=cp if cp > 1 else None,
                         fs=fs if hybrid else None, etp=cfg.expert_tp)  # (with cp: ZeRO-3 shards over it)
    mesh_layout = Layout(*inner, zero_cut(zero))  # (ZeRO-3's shards cut as FSDP2's)
    chosen = megatron_layouts(cfg, mesh_layout, sp)
    chosen.update(on_mesh(layouts or {}, mesh_layout) if not hybrid else  # (given on a (dp, tp) mesh: its maps)
                  {name: TensorLayout(mesh_layout, t.tensor_map, t.partial) if isinstance(t, TensorLayout) else t
                   for name, t in (layouts or {}).items()})
    if zero == 3:  # the shards' layouts (spmdsim.nn.fsdp): a checkpoint of them resumes only fully sharded
        # (FSDP's shard group, spmdsim.nn.fsdp.shard_group: the experts over dp (x cp), the rest over dp x ep (x cp))
        group = ((SHARD,) if hybrid else (DATA,) + (EXPERT,) * moe) + (CONTEXT,) * (cp > 1)
        chosen = {name: sharded_layout(layout, shard_axes(layout, group)) for name, layout in chosen.items()}
    pp = (pipeline or {}).get(PIPELINE)  # (the mesh's, not the pipeline's record)
    if pipeline is not None:
        pipeline = {k: v for k, v in pipeline.items() if k != PIPELINE}
        pipeline["split"] = None if pipeline.get("split") is None else [int(n) for n in pipeline["split"]]
    if pp is not None or cp > 1:  # the mesh as recorded: a resume that leaves out --cp is told cp, not dp
        mesh_layout = Layout(*model_layout(tp, dp // fs if hybrid else dp, ep if moe else None, pp,
                                           cp if cp > 1 else None, fs if hybrid else None, etp=cfg.expert_tp))
    meta = run_meta(cfg, world, mesh_layout, sp, chosen, get_precision(precision).name,
                    ZERO_ADAMW if zero in (1, 2) else ADAMW)
    meta["pipeline"] = pipeline
    meta["zero"] = zero  # (what the resume line says: the state is ZeRO-1 and 2's alike, and the layouts FSDP's)
    return meta


def _checkpoint_problem(meta: dict, steps: int, save: Optional[str], save_every: Any,
                        resume: Optional[str]) -> Optional[str]:
    if dry_run_active():
        given = " and ".join(f for f, v in (("--save", save), ("--resume", resume)) if v is not None) or "--save-every"
        return f"{given}: a dry run holds shapes, no values; leave out --dry-run to save or resume"
    if type(save_every) is not int or save_every < 0:
        return f"--save-every {save_every!r} must be an integer >= 0 (0: save after the last step only)"
    if save_every and save is None:
        return f"--save-every {save_every} saves into the directory --save names; give --save DIR with it"
    problem = resume_problem(resume, meta, steps) if resume is not None else None
    return problem or (save_problem(save) if save is not None else None)
