"""Training the parallel GPT with AdamW, every step checked against the same step in one numpy process.

Each step: the batch (every rank draws the same, spmdsim.models.gpt.data), the
distributed forward and backward (spmdsim.models.gpt.parallel), AdamW on each
rank's shards (spmdsim.nn.optim.AdamW). When checking, the same step runs in one
numpy process (spmdsim.models.gpt.reference: hand-written backward, numpy AdamW)
from the distributed model's parameters at the start of the step (one
Allgather of every rank's blocks; simulated ranks share one table: `all_rows`),
and each rank compares the loss and every gradient in its own region with it,
and every updated parameter with AdamW of
the run's own block, moments and gradient at that step (`anchored_updates`;
ZeRO-1's of each rank's slice, gathered over dp): the largest difference
relative to the tensor's largest entry, agreed by one Allreduce(MAX), must
stay within 1e-10. Anchoring each step keeps the check at rounding level: two
trajectories that differ only in the order of their sums drift apart
exponentially over training (a free-running reference differs by 3e-10 after
60 steps at the default model), whichever is right, and AdamW's first update
(lr x g / (|g| + eps)) of the reference's own gradients would flip where a
gradient has cancelled to its rounding.
The ranks run the reference once between them: simulated ranks by spmdsim.runtime.sim.once, MPI ranks by rank 0
computing it and broadcasting it (spmdsim.runtime.shared_reference.shared_once); the rank that computes it
also makes the gathered blocks whole (spmdsim.models.gpt.wholes: where each lies worked out once per run) and the
largest magnitudes each comparison is relative to.

Memory (docs/training.md, "Memory"): `recompute` recomputes activations in the
backward (the GPT's option); `zero=1` steps with ZeRO-1
(spmdsim.nn.optim.DistributedAdamW: states and master copy sharded over dp), and the
check then compares, besides the loss and every updated parameter, the summed
gradient slice each rank updated (its Reduce_scatter's result) with the same
elements of the reference's gradients; `memory=True` measures each step's bytes
(spmdsim.models.gpt.memory.MemoryReport).

Precision (docs/training.md, "Mixed precision (bf16)"): under `precision="fp32"` or
"bf16-mixed" the reference step runs under the same policy (spmdsim.models.gpt.mixed) from the
run's master copies; the loss and gradients are compared with it within the policy's
tolerances (spmdsim.models.gpt.mixed.tolerances), and AdamW is checked on the run's own
gradients and moments (gathered at the step's start), so its float32 update must agree
to its own rounding whatever the gradients' bf16 flips.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Optional

import numpy as np

from ...nn.autograd.kept import kept_problem
from ...base.buffers import owned_bytes, owner
from ...layouts.layout import Layout
from .config import GPTConfig
from .data import batch, text_problem
from .memory import MemoryReport, recompute_problem, zero_problem
from ...base.precision import is_low, precision as get_precision, precision_problem
from .mixed import tolerances as mixed_tolerances
from .params import decays, is_expert, param_specs
from .wholes import Regions, assemble, peaks, regions
from ..axes import DATA, EXPERT, PIPELINE, TENSOR, model_layout, roles_of
from . import checkpoint
from ...base.sizes import format_size
from ...errors import SpmdsimError
from ...nn import ops
from ...nn.autograd import kept_bytes
from ...nn.autograd.engine import backward
from ...nn.autograd.grad_buffer import GradBuffer
from ...nn.optim import AdamW, DistributedAdamW, adamw_update, clip_grad_norm_
from ...programs.memory import ENV_VAR
from ...runtime import door
from ...runtime.budget import agreed_budget
from ...runtime.dtensor import DTensor
from ...runtime.engines import engine_of, memory as stop
from ...runtime.executor import gather, pending, resolve
from ...runtime.mesh import Mesh
from ...runtime.replay import Scalar, capture
from ...runtime.shared_reference import shared_once
from ...runtime import shared_rows
from ...runtime.sim import dry_run_active, once
from ...runtime.trace import collect_trace
from ..moe.ledger import EXCHANGE_WORDS, ExpertBytes
from .checkpoint import load, run_meta, save as save_checkpoint
from .layouts import megatron_layouts
from .memory import step_need
from .mixed import architecture_problem, loss_and_grads as mixed_loss_and_grads
from . import parallel
from .reference import _masks, clip_grads, generate, loss_and_grads as reference_loss_and_grads

__all__ = ["StepResult", "train", "gathered", "reference_sample", "replay_problem", "step_memory_problem", "TOLERANCE",
           "all_rows", "checkpoint_problem", "checkpoint_meta"]

#: The largest relative difference a step may show against the single-process reference (float64).
TOLERANCE = 1e-10


@dataclass(frozen=True)
class StepResult:
    """One step: the loss, the largest relative differences (loss, gradients, parameters), its traffic,
    with ``memory=True`` this rank's bytes (spmdsim.models.gpt.memory.MemoryReport), and with MoE layers this
    rank's dispatch figures (spmdsim.models.moe.report draws them) and its experts' bytes (spmdsim.models.moe.ledger)."""

    step: int
    loss: float
    errors: tuple[float, float, float]  # NaN when not checked
    calls: int
    bytes_sent: int
    memory: Optional[MemoryReport] = None
    dispatch: tuple = ()  # with MoE layers: this rank's spmdsim.models.moe.stats.MoEStats of the step's forward
    experts: Any = None  # with MoE layers: this rank's spmdsim.models.moe.ledger.ExpertBytes of the step
    # (loss, gradients, parameters): the policy's (spmdsim.models.gpt.mixed.tolerances); 1e-10 each at float64
    tolerances: tuple[float, float, float] = (TOLERANCE,) * 3
    norm: Optional[float] = None  # with cfg.clip: the gradients' joint norm before clipping (alike on every rank)

    @property
    def passed(self) -> bool:
        return all(e <= t for e, t in zip(self.errors, self.tolerances) if e == e)


def _mixed_step(start: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: int, policy: Any,
                grads: dict, microbatches: int = 1, routes: Optional[dict] = None, kept: str = "graph") -> tuple:
    """The references of a step under a low-precision policy (spmdsim.models.gpt.mixed): (loss, gradients) of the
    same policy from the run's parameters at the step's start (its master copies), and the updated master
    copies of AdamW in float32 on the run's own gradients `grads` and moments (`start`: "params", "m", "v",
    each name -> whole array; the moments zeros before the first step). `microbatches` > 1: gradient
    accumulation as `_reference_step`'s (each microbatch its own dropout masks; losses and gradients averaged,
    the gradients in float32). `routes`: the ranks' experts (`_routes`), followed at near-ties. `kept`: the
    model's kept set (the rounding points of Megatron's fused kernels under "megatron": spmdsim.models.gpt.mixed)."""
    loss, ref_grads = _microbatched(x.shape[0], microbatches, lambda rows, i: mixed_loss_and_grads(
        start["params"], x[rows], y[rows], cfg, step, policy, _masks(cfg, step, True, x[rows].shape[0], micro=i),
        _rows(routes, rows), kept))
    if cfg.clip:
        ref_grads = clip_grads(ref_grads, cfg.clip)[1]
    state = policy.dtype("optimizer")
    updated = {}
    for spec in param_specs(cfg):
        name = spec.name
        p, m, v = (start[k][name].astype(state) for k in ("params", "m", "v"))
        adamw_update(p, grads[name].astype(state), m, v, step + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=cfg.weight_decay if decays(spec) else 0.0)
        updated[name] = p
    return loss, ref_grads, updated


def _reference_step(moments: dict, params: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig,
                    step: int, microbatches: int = 1, routes: Optional[dict] = None) -> tuple:
    """(new moments, loss, grads, updated params) of one reference step; nothing given is changed in place.

    `microbatches` > 1: the batch's rows in that many equal microbatches, each with its own dropout masks
    (spmdsim.models.gpt.params.dropout_seed), their losses and gradients averaged: gradient accumulation.
    `routes`: MoE layer -> the ranks' (B, T, k) experts (`_routes`), which the reference follows at near-ties.
    """
    loss, grads = _microbatched(x.shape[0], microbatches, lambda rows, i: reference_loss_and_grads(
        params, x[rows], y[rows], cfg, step, micro=i, routes=_rows(routes, rows)))
    if cfg.clip:
        grads = clip_grads(grads, cfg.clip)[1]
    new_moments, updated = {"m": {}, "v": {}}, {}
    for spec in param_specs(cfg):
        name = spec.name
        p, m, v = params[name].copy(), moments["m"][name].copy(), moments["v"][name].copy()
        adamw_update(p, grads[name], m, v, step + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=cfg.weight_decay if decays(spec) else 0.0)
        new_moments["m"][name], new_moments["v"][name], updated[name] = m, v, p
    return new_moments, loss, grads, updated


def _rows(routes: Optional[dict], rows: slice) -> Optional[dict]:
    """`routes` (MoE layer -> (B, T, k) experts) of the batch's `rows` (a microbatch's); None stays None."""
    return None if routes is None else {name: chosen[rows] for name, chosen in routes.items()}


def _routes(model: Any, cfg: GPTConfig) -> Optional[dict]:
    """MoE layer ("h1") -> every rank's tokens' experts of the step's forward, whole (B, T, k): one Allgather
    of each layer's (its batch rows split as the tokens are, copies over tp); None without MoE
    layers. The check's reference follows them where rounding alone can explain them (the ranks' and its own
    router logits differ by a unit in the last place here and there: spmdsim.models.moe.routing.followed)."""
    if cfg.moe is None or not model.moe_stats:
        return None
    mesh = model.mesh
    batch = mesh.layout(model.batch, None, None)
    routes = {}
    for s in model.moe_stats:
        k = s.chosen.shape[-1]
        mine = DTensor(mesh, s.chosen, batch, (cfg.batch, cfg.seq, k))
        routes[s.layer] = mine.redistribute(mesh.layout(None, None, None)).local
    return routes


def _microbatched(batch: int, microbatches: int, one: Callable[[slice, Optional[int]], tuple]) -> tuple:
    """(loss, gradients) of a batch of `batch` rows in `microbatches` equal microbatches, `one(rows, micro)` each
    (micro None: the whole batch at once), their losses and gradients averaged (in the gradients' own dtype):
    gradient accumulation, as a pipeline makes it."""
    if microbatches == 1:
        return one(slice(None), None)
    size = batch // microbatches
    loss, grads = 0.0, {}
    for i in range(microbatches):
        part, g = one(slice(i * size, (i + 1) * size), i)
        loss += part / microbatches
        for name, value in g.items():
            value = value / microbatches
            grads[name] = value if i == 0 else grads[name] + value
    return loss, grads


def _zero_moments(cfg: GPTConfig) -> dict:
    zeros = {s.name: np.zeros(s.shape) for s in param_specs(cfg)}
    return {"m": zeros, "v": dict(zeros)}


def gathered(model: Any, blocks: Optional[dict] = None) -> dict:
    """Every parameter whole on every rank (float64), from one Allgather of all this rank's blocks;
    `blocks`: name -> this rank's block to gather in place of the parameter's (a master copy)."""
    where = regions(model.params, model.mesh.size)
    return assemble(where, _params_rows(model, where, blocks))[0]


def reference_sample(model: Any, cfg: GPTConfig, prompt: Any, n: int, temperature: float = 0.0) -> np.ndarray:
    """What the single-process model draws (spmdsim.models.gpt.reference.generate) from `model`'s parameters: a
    collective (one Allgather of every rank's blocks, as `gathered`), the parameters made whole and the draw
    made by one rank for all (spmdsim.runtime.shared_once)."""
    where = regions(model.params, model.mesh.size)
    return shared_once(model.mesh, ("gpt-sample", cfg), _sample_from, where, _params_rows(model, where), cfg,
                       prompt, n, temperature)


def _sample_from(where: Regions, rows: np.ndarray, cfg: GPTConfig, prompt: Any, n: int, temperature: float) -> Any:
    return generate(assemble(where, rows)[0], cfg, prompt, n, temperature)


def _params_rows(model: Any, where: Regions, blocks: Optional[dict] = None) -> np.ndarray:
    """The rows of every rank's parameter blocks (`blocks`: name -> this rank's block in place of the parameter's)
    that `where` places (a collective: `_table`'s Allgather)."""
    blocks = blocks or {}
    return where.used(_table(model, [{name: blocks.get(name, t.local) for name, t in model.params.items()}],
                             "check.params"))


def _table(model: Any, tables: list, label: str) -> np.ndarray:
    """Every rank's blocks of each of `tables` (name -> this rank's block, shaped as the parameter's), a row per
    rank (float64), from one Allgather (`all_rows`): spmdsim.models.gpt.wholes.assemble makes them
    whole (of its rows that Regions.used keeps)."""
    flat = np.concatenate([np.asarray(table[name], np.float64).reshape(-1)
                           for table in tables for name in model.params])
    return all_rows(model.mesh, flat, label)


def all_rows(mesh: Any, flat: np.ndarray, label: str) -> np.ndarray:
    """Every rank's `flat`, a row per rank, on every rank of `mesh`: spmdsim.runtime.shared_rows.all_rows (its
    home, the runtime's checks share it)."""
    return shared_rows.all_rows(mesh, flat, label)


def _run_start(model: Any, optimizer: Any, specs: list) -> np.ndarray:
    """The optimizer's view of the step's start, every rank's blocks on every rank (`_table`'s):
    "params" (each parameter's master copy, its values where it keeps none), "m" and "v" (its AdamW
    moments, zeros before its first step), table after table."""
    return _table(model, _optimizer_start(optimizer, {s.name: model.params[s.name] for s in specs}), "check.start")


def _optimizer_start(optimizer: Any, tensors: dict) -> list:
    """[master copies (a parameter's values where it keeps none), first moments, second moments (zeros before
    the first step)]: each name -> this rank's block, of the parameters `tensors` names. ZeRO-1's slices are
    gathered over dp (spmdsim.nn.distrib_optim.DistributedAdamW.gathered: collective)."""
    index = {id(p): i for i, p in enumerate(optimizer.params)}
    tables: list = [{}, {}, {}]
    if hasattr(optimizer, "buckets"):
        wholes = [optimizer.gathered(kind) for kind in ("master", "m", "v")]
        for name, t in tensors.items():
            for table, whole in zip(tables, wholes):
                table[name] = whole[index[id(t)]]
        return tables
    for name, t in tensors.items():
        i = index[id(t)]
        tables[0][name] = optimizer.master.get(i, t.local)
        _, m, v = optimizer.state.get(i) or (0, np.zeros(t.local.shape), np.zeros(t.local.shape))
        tables[1][name], tables[2][name] = m, v
    return tables


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


def _checked_reference(where: Regions, start: np.ndarray, moments: dict, x: np.ndarray, y: np.ndarray,
                       cfg: GPTConfig, step: int, microbatches: int = 1, routes: Optional[dict] = None) -> tuple:
    """`_reference_step` from the step's start as gathered (`_table`'s rows that `where.used` keeps), and the peaks
    (spmdsim.models.gpt.wholes.peaks) of its gradients and updated parameters: the work the ranks share
    (spmdsim.runtime.shared_once; spmdsim.models.gpt.pipeline's too, with its `microbatches`)."""
    moments, loss, grads, updated = _reference_step(moments, assemble(where, start)[0], x, y, cfg, step, microbatches,
                                                    routes)
    return moments, loss, grads, updated, {"grads": peaks(grads), "updated": peaks(updated)}


def _checked_mixed(where: Regions, start: np.ndarray, grads: np.ndarray, x: np.ndarray, y: np.ndarray,
                   cfg: GPTConfig, step: int, policy: Any, microbatches: int = 1,
                   routes: Optional[dict] = None, kept: str = "graph") -> tuple:
    """`_mixed_step` from the step's start and the run's gradients as gathered (`_run_start`'s and `_table`'s rows
    that `where.used` keeps), and the peaks of its gradients and updated master copies: the work the ranks share
    (spmdsim.models.gpt.pipeline's too, with its `microbatches`)."""
    start_wholes = dict(zip(("params", "m", "v"), assemble(where, start, 3)))
    loss, ref_grads, updated = _mixed_step(start_wholes, x, y, cfg, step, policy, assemble(where, grads)[0],
                                           microbatches, routes, kept=kept)
    return loss, ref_grads, updated, {"grads": peaks(ref_grads), "updated": peaks(updated)}


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


def step_memory_problem(cfg: GPTConfig, comm: Any, dp: int, tp: int, *, ep: int = 1, pp: int = 1,
                        microbatches: int = 1, recompute: str = "none", sp: bool = False, kept: str = "graph",
                        zero: int = 0, precision: Any = "fp64") -> Optional[str]:
    """Why one rank of this training step cannot fit the memory a rank may use, or None; collective (every rank
    of `comm` alike: the same answer on each, before anything is allocated).

    The need is spmdsim.models.gpt.memory.step_need's shape-only count (the model states, the activations kept for
    backward and the attention's scores: a lower bound of the dry run's peak, so what is refused cannot fit). The limit is the room before the simulator's memory stop (and, under
    mpiexec, the memory watch: spmdsim.runtime.engines.memory) fires: what this machine, or its cgroup, has left
    (spmdsim.runtime.budget's agreed figure per rank) less the share of the memory the stop keeps free
    (`LOW_FRACTION` of the total, at least `LOW_FLOOR`); SPMDSIM_MEMORY (bytes per rank) sets it instead, and
    SPMDSIM_MEMORY=off, a dry run (no block is written) or a machine that does not say skips the check."""
    import os


    budget = agreed_budget(comm)
    if budget is None:
        return None
    limit, source = budget.bytes, budget.source
    got = stop.readings() if not os.environ.get(ENV_VAR, "").strip() else None
    if got is not None:  # the stop's reserve, shared by the ranks on this node
        reserve = max(stop.LOW_FLOOR, int(stop.LOW_FRACTION * got[2]))
        limit = max(0, limit - reserve // engine_of(comm).node_size(comm))
        source += f", less {format_size(reserve)} kept free for the memory stop"
        if comm.Get_size() > 1:  # nodes may differ: the least, on every rank alike
            limit = door.all_reduce_object(comm, limit, "min")
    need = step_need(cfg, dp, tp, ep=ep, pp=pp, microbatches=microbatches, recompute=recompute, sp=sp, kept=kept,
                     zero=zero, precision=precision)
    if need.nbytes <= limit:
        return None
    if need.attention:
        parts = (f"the attention's scores {format_size(need.attention)}, one layer's {format_size(need.block)}: "
                 f"{need.words()}; other activations kept for backward {format_size(need.activations)}; "
                 f"parameters {format_size(need.states)}")
    elif need.moment == "at the step's end":
        parts = f"parameters, gradients and optimizer states {format_size(need.states)}"
    else:
        parts = (f"activations kept for backward {format_size(need.activations)}; parameters "
                 f"{format_size(need.states)}")
    return (f"the GPT's training step needs at least {format_size(need.nbytes)} per rank {need.moment} at seq "
            f"{cfg.seq:,} ({parts}) but a rank may use "
            f"{format_size(limit)} ({source}); use a smaller seq or batch (--seq, --batch), more ranks, or a "
            f"dry run (--dry-run, or `spmdsim estimate gpt`: the step's peak per rank); {ENV_VAR}=SIZE|off "
            "changes the limit")


def replay_problem(cfg: GPTConfig) -> Optional[str]:
    """Why `cfg`'s training step (train's or spmdsim.models.gpt.pipeline's: a pipelined MoE step's router losses are
    read when the step ends, as its other losses are) cannot be replayed (spmdsim.runtime.replay), or None: none
    today (clipping, `cfg.clip`, replays: the norm and the scaling are kernels, spmdsim.nn.optim)."""
    return None


def train(cfg: GPTConfig, comm: Any, dp: int, tp: int, steps: int, text_ids: np.ndarray, sp: bool = False,
          check: bool = True, on_step: Optional[Callable[[StepResult], Any]] = None,
          mesh: Any = None, layouts: Optional[dict] = None, replay: bool = False,
          recompute: str = "none", zero: int = 0, memory: bool = False, kept: str = "graph",
          ep: int = 1, precision: Any = "fp64", save: Optional[str] = None, save_every: int = 0,
          resume: Optional[str] = None) -> tuple[Any, list]:
    """Train `steps` steps on a (dp, tp) mesh over `comm`; returns (the model, one StepResult per step run).

    Collective: every rank calls it alike. `mesh`: a Mesh of Layout((dp, tp), ("dp", "tp")) to use
    instead of making one over `comm`. `layouts`: parameter name -> TensorLayout (default Megatron's).
    `replay`: step 0 is captured (spmdsim.runtime.replay) and every later step replays it, checked
    the same way (with `cfg.clip` too: each replayed step clips by its own norm).
    `recompute`: "none", "selective" or "full" (spmdsim.models.gpt.parallel.GPT's). `zero`: 0 (AdamW), 1
    (DistributedAdamW over dp; with MoE layers over dp x ep, the experts' over dp) or 2 (the same with the
    gradients sharded too: `zero_options`). `memory`: measure each step's
    bytes into StepResult.memory. `kept`: "graph" or "megatron" (spmdsim.models.gpt.parallel.GPT's: what the graph keeps
    for backward). `ep`: with MoE layers (cfg.moe), the expert-parallel ranks: the mesh is Layout((dp, ep, tp),
    ("dp", "ep", "tp")), the batch split over dp x ep (spmdsim.models.moe.layer); the step's loss includes the router
    losses.
    `precision`: the precision policy (spmdsim.base.precision: "fp64", "fp32", "bf16-mixed"); the reference
    step then runs under it (spmdsim.models.gpt.mixed) and the check's tolerance is the policy's
    (spmdsim.models.gpt.mixed.tolerances: the optimizer checked on the run's own gradients).
    `save`: a directory to write a checkpoint into (spmdsim.models.gpt.checkpoint: a file per rank and rank 0's
    metadata) after the last step, and with `save_every` N > 0 after every N-th step too. `resume`: a checkpoint
    directory to continue from: the steps from the one it reached to `steps` run (and are returned), as the run
    that never stopped runs them, bit for bit; it is refused in one line, alike on every rank and before any
    collective, when it does not fit this run (`checkpoint.resume_problem`). With `check`, a resumed run's
    reference starts from the checkpoint's parameters and the run's moments (gathered).
    """
    problem = (recompute_problem(recompute) or zero_problem(zero) or kept_problem(kept)
               or (replay_problem(cfg) if replay else None) or precision_problem(precision)
               or text_problem(text_ids, cfg))
    if problem:  # every rank alike, before any collective
        raise SpmdsimError(problem)
    policy = get_precision(precision)
    moe = cfg.moe is not None or ep > 1
    meta = None
    if save is not None or resume is not None or save_every:
        world = (comm if mesh is None else mesh.comm).Get_size()
        meta = checkpoint_meta(cfg, world, dp, tp, sp=sp, layouts=layouts, precision=precision, zero=zero, ep=ep)
        problem = _checkpoint_problem(meta, steps, save, save_every, resume)
        if problem:  # every rank alike (each reads the same metadata file), before any collective
            raise SpmdsimError(problem)
    problem = step_memory_problem(cfg, comm if mesh is None else mesh.comm, dp, tp, ep=ep, recompute=recompute,
                                  sp=sp, kept=kept, zero=zero, precision=precision)
    if problem:  # every rank alike (a collective decided it), before any block is made
        raise SpmdsimError(problem)
    low = policy.activation != "float64"
    if check and low and not dry_run_active():  # every rank alike, before any collective

        problem = architecture_problem(cfg)
        if problem:
            raise SpmdsimError(problem)
    if mesh is None:
        shape, names = model_layout(tp, dp, ep if moe else None)
        mesh = Mesh(Layout(shape, names), comm, roles=roles_of(names))
    model = parallel.GPT(cfg, mesh, sp=sp, layouts=layouts, recompute=recompute, kept=kept, precision=policy)
    specs = param_specs(cfg)
    params = [model.params[s.name] for s in specs]
    decaying = [model.params[s.name] for s in specs if decays(s)]
    if zero:
        optimizer = DistributedAdamW(params, mesh, _zero_axes(mesh), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                     weight_decay=cfg.weight_decay, decay=decaying, clip_grad=cfg.clip,
                                     **zero_options(zero, params, mesh))
    else:
        optimizer = AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                          decay=decaying)
    check = check and not dry_run_active()  # a dry run has shapes, not values
    replay = replay and not dry_run_active()  # a dry run's steps count bytes: nothing to replay
    moments: dict = {}  # with `memory`: the totals this step, by moment, and what the graph kept
    norms: list = []  # with clip: each step's norm before clipping

    def look(moment: str, kept: Optional[dict] = None) -> None:
        if memory:
            _look(moments, moment, optimizer, params, kept, sums)

    if memory and zero:  # a look in the backward: ZeRO-2's before each bucket's Reduce_scatter frees its gradients,
        # ZeRO-1's as each parameter's gradient goes into its main gradient
        optimizer.watch = lambda grads: _look_walk(moments, optimizer, params, grads)
    # ZeRO-0's gradient buffer (Megatron DDP's): each bucket's gradients in one flat block the walk writes them
    # into, summed there in place; its look in the backward at each stop of the walk and before each Allreduce
    sums = None if zero else GradBuffer(params, dp_bucket(params, mesh))
    if memory and not zero:
        sums.watch = lambda grads: _look_walk(moments, optimizer, params, grads, sums)
        sums.watch_blocks = lambda blocks: _look_blocks(moments, params, blocks, sums)

    def train_step(xd: Any, yd: Any, step: Any) -> Any:
        optimizer.zero_grad()
        loss = model.loss(xd, yd, step)
        look("after the forward", kept_bytes([loss], exclude=params) if memory else None)
        if zero:  # the dp sums left to the optimizer's Reduce_scatter: ZeRO-2's in the walk as each bucket fills;
            # ZeRO-1's in the step, each gradient put into its main gradient in the walk as soon as it is final
            backward(loss, keep_pending=params, reduce_with=optimizer)
        else:  # each gradient into its bucket's block as the walk gives it; each bucket one Allreduce after it
            backward(loss, keep_pending=params, reduce_with=sums if sums.buckets else None)
            sums.reduce()
            if cfg.clip:  # the joint norm: one Allreduce of one number
                norms.append(clip_grad_norm_(params, cfg.clip))
        look("after the backward")
        optimizer.step()
        look("after the step")
        return loss

    first = 0
    if resume is not None:  # this rank's blocks and optimizer state (collective: the ranks agree on a problem)

        first = load(resume, mesh, {s.name: model.params[s.name] for s in specs}, optimizer)
    graph = None
    reference_moments = None
    if check:  # where every rank's blocks lie, and this rank's, asked once (not per step)
        where = regions(model.params, mesh.size)
        slices = {s.name: model.params[s.name].slices for s in specs}
    if check and not low and first:  # the reference's moments: the run's at the checkpoint, whole (collective)
        reference_moments = shared_once(mesh, ("gpt-resumed", cfg, first), _resumed_moments,
                                         where, where.used(_run_start(model, optimizer, specs)))
    elif check and not low:
        reference_moments = once(("gpt-reference", cfg, 0), _zero_moments, cfg)
    tolerances = mixed_tolerances(policy, cfg)
    ids_layout = mesh.layout(model.batch, None)
    results = []
    report = None
    for step in range(first, steps):
        x, y = batch(text_ids, cfg, step)
        xd, yd = DTensor.from_global(mesh, x, ids_layout), DTensor.from_global(mesh, y, ids_layout)
        if check:  # the step's start, every rank's blocks: the reference step starts from it, whole
            start = where.used(_run_start(model, optimizer, specs)) if low else _params_rows(model, where)
            # This rank's own start: AdamW's update is checked on the run's inputs (a low-precision policy
            # checks it on gathered ones).
            own = anchored_start(optimizer, {s.name: model.params[s.name] for s in specs}) if not low else None
        with collect_trace() as trace:
            if not replay:
                loss = train_step(xd, yd, step)
            elif graph is None:  # the same step as eager, recorded
                graph = capture(train_step, xd, yd, Scalar(step), state=params)
                loss = graph.result
            else:
                loss = graph(xd, yd, step)
        value = float(ops.resolved(loss).local)
        if memory and moments:
            report = _report(step, moments, owned_bytes(p.local for p in params))
            if replay:  # a replayed step runs no Python to look: the captured step's moments, kept
                captured = dict(moments)
            moments.clear()
        elif memory and replay and step:  # the captured step's looks as any later step's (`_steady`)
            report = _report(step, _steady(captured), owned_bytes(p.local for p in params))
        errors = (float("nan"),) * 3
        if check:
            tensors = {s.name: model.params[s.name] for s in specs}
            routes = _routes(model, cfg)  # the ranks' experts, which the reference follows at near-ties
            if low:  # the optimizer checked on the run's own gradients (gathered), the rest on the policy's
                # (with ZeRO-1 the summed gradients and the master copy are the ranks' slices, gathered over dp)
                summed, masters = _summed_grads(optimizer, tensors, zero)
                run_grads = where.used(_table(model, [summed], "check.grads"))
                ref_loss, grads, updated, top = shared_once(mesh, ("gpt-mixed", cfg, policy.name, step),
                                                            _checked_mixed, where, start, run_grads, x, y, cfg, step,
                                                            policy, 1, routes, kept)
            else:
                reference_moments, ref_loss, grads, updated, top = shared_once(
                    mesh, ("gpt-reference", cfg, step + 1), _checked_reference, where, start, reference_moments, x,
                    y, cfg, step, 1, routes)
                masters = None
            mine = step_errors(value, ref_loss, grads, updated, tensors, optimizer if zero else None, masters, top,
                               slices, None if own is None else anchored_updates(own, tensors, cfg, optimizer))
            worst = resolve(mesh, mine, pending(mesh.layout, 1, tuple(mesh.layout.alias_name)), "check",
                            reduction="max", owned=True)
            errors = tuple(float(e) for e in worst)
        totals = trace.totals()
        ledger = _expert_bytes(cfg, mesh.rank, mesh, model.params, model.moe_stats, optimizer, trace) \
            if cfg.moe is not None else None
        result = StepResult(step, value, errors, totals["calls"], totals["bytes_sent"],
                            None if report is None else _restep(report, step), tuple(model.moe_stats), ledger,
                            tolerances, _norm(optimizer if zero else None, norms))
        results.append(result)
        if on_step is not None:
            on_step(result)
        if save is not None and (step + 1 == steps or save_every and (step + 1) % save_every == 0):
            save_checkpoint(save, meta, step + 1, mesh, {s.name: model.params[s.name] for s in specs}, optimizer)
    return model, results


def checkpoint_problem(cfg: GPTConfig, world: int, dp: int, tp: int, steps: int, *, sp: bool = False,
                       layouts: Optional[dict] = None, precision: Any = "fp64", zero: int = 0, ep: int = 1,
                       save: Optional[str] = None, save_every: int = 0, resume: Optional[str] = None,
                       pipeline: Optional[dict] = None) -> Optional[str]:
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
                           pipeline=pipeline)
    return _checkpoint_problem(meta, steps, save, save_every, resume)


def checkpoint_meta(cfg: GPTConfig, world: int, dp: int, tp: int, *, sp: bool = False,
                    layouts: Optional[dict] = None, precision: Any = "fp64", zero: int = 0, ep: int = 1,
                    pipeline: Optional[dict] = None) -> dict:
    """spmdsim.models.gpt.checkpoint.run_meta of a `train` run (or, with `pipeline`, a train_pipelined one, as
    `checkpoint_problem`'s): the mesh's axes (a pipeline's "pp" first), its parameters' layouts (Megatron's and
    `layouts`, on a stage's mesh), and the pipeline's schedule, microbatches, chunks and split (None without)."""
    moe = cfg.moe is not None or ep > 1
    inner = model_layout(tp, dp, ep if moe else None)
    chosen = megatron_layouts(cfg, Layout(*inner), sp)
    chosen.update(layouts or {})
    mesh_layout = Layout(*inner)
    if pipeline is not None:
        pipeline = dict(pipeline)
        mesh_layout = Layout(*model_layout(tp, dp, ep if moe else None, pipeline.pop(PIPELINE)))
        pipeline["split"] = None if pipeline.get("split") is None else [int(n) for n in pipeline["split"]]
    meta = run_meta(cfg, world, mesh_layout, sp, chosen, get_precision(precision).name,
                    "DistributedAdamW" if zero else "AdamW")
    meta["pipeline"] = pipeline
    return meta


def _checkpoint_problem(meta: dict, steps: int, save: Optional[str], save_every: Any,
                        resume: Optional[str]) -> Optional[str]:
    if dry_run_active():
        return "--save and --resume: a dry run holds shapes, no values; leave out --dry-run to save or resume"
    if type(save_every) is not int or save_every < 0:
        return f"--save-every {save_every!r} must be an integer >= 0 (0: save after the last step only)"
    if save_every and save is None:
        return f"--save-every {save_every} saves into the directory --save names; give --save DIR with it"
    problem = checkpoint.resume_problem(resume, meta, steps) if resume is not None else None
    return problem or (checkpoint.save_problem(save) if save is not None else None)


def _resumed_moments(where: Regions, start: np.ndarray) -> dict:
    """The reference's moments at a resumed run's first step: the run's (`_run_start`'s rows), whole."""
    _, m, v = assemble(where, start, 3)
    return {"m": m, "v": v}


#: The gradient buckets' size in elements of a rank's parameter shards, ZeRO-0's and ZeRO-2's alike: Megatron's
#: default bucket_size, max(40M, 1M x the data-parallel size): at a large dp a ring's per-rank chunk of a bucket
#: stays large enough for the bandwidth, not the latency, to set its time (megatron/core/distributed/
#: distributed_data_parallel.py; its buckets count a process's parameter elements, its shards under tensor
#: parallelism). `buckets(mesh)` gives it for a mesh.
ZERO_BUCKET = 40_000_000
ZERO_BUCKET_PER_DP = 1_000_000


def buckets(mesh: Any) -> int:
    """The gradient buckets' size in elements on `mesh` (ZERO_BUCKET, or ZERO_BUCKET_PER_DP a data-parallel rank:
    the ranks over which the dense layers' gradients are summed, dp and, on an MoE mesh, ep, as Megatron's data-
    parallel size counts them)."""
    return max(ZERO_BUCKET, ZERO_BUCKET_PER_DP * mesh.layout.group_size(_zero_axes(mesh)))


def dp_bucket(params: list, mesh: Any) -> int:
    """ZeRO-0's gradient bucket in bytes (its GradBuffer's cap, which counts a rank's shards, as `reduce_grads`'):
    `buckets(mesh)` elements at the widest parameter's bytes."""
    return buckets(mesh) * _widest(params)


def _widest(params: list) -> int:
    """The bytes of an element of the widest of `params` (8 for none): a bucket's elements priced at them."""
    return max((p.local.dtype.itemsize for p in params), default=8)


def zero_options(zero: int, params: list, mesh: Any) -> dict:
    """DistributedAdamW's options for ZeRO stage `zero` (1 or 2) over `params` on `mesh`: ZeRO-2 shards the
    gradients, in buckets of at most `buckets(mesh)` elements (at the widest parameter's bytes; the buckets share
    one flat buffer of the largest's bytes, so the buffer a rank holds beside its gradient slices stays this
    size); ZeRO-1 keeps one bucket."""
    if zero < 2:
        return {}
    return {"shard_grads": True, "bucket": buckets(mesh) * _widest(params)}


def _zero_axes(mesh: Any) -> tuple:
    """The axes ZeRO-1 shards over: the data-parallel ones, "dp" and, on an MoE mesh, "ep" (the dense layers'
    tokens are split over both; the experts, split over ep, shard over dp alone: spmdsim.nn.distrib_optim)."""
    return tuple(a for a in (DATA, EXPERT) if a in mesh.layout.alias_name)


def anchored_start(optimizer: Any, tensors: dict) -> Any:
    """Copies at the step's start of what the update reads, for `anchored_updates`: with AdamW, name -> (this
    rank's block, its first and second moments (None before its first step), its steps so far, whether it
    decays); with ZeRO-1 (spmdsim.nn.optim.DistributedAdamW), per bucket (this rank's master slice, its moments'
    slices, the bucket's steps so far)."""
    if hasattr(optimizer, "buckets"):  # ZeRO-1: each rank updates its slice of each bucket
        return [(b.master.copy(), b.m.copy(), b.v.copy(), b.t) for b in optimizer.buckets]
    index = {id(p): i for i, p in enumerate(optimizer.params)}
    out = {}
    for name, t in tensors.items():
        i = index[id(t)]
        steps, m, v = optimizer.state.get(i) or (0, None, None)
        out[name] = (np.array(t.local, np.float64), None if m is None else np.array(m, np.float64),
                     None if v is None else np.array(v, np.float64), steps, bool(optimizer.decays[i]))
    return out


def anchored_updates(start: Any, tensors: dict, cfg: GPTConfig, optimizer: Any) -> dict:
    """name -> this rank's block after the reference's AdamW (spmdsim.nn.optim.adamw_update) on the run's own
    start (`anchored_start`) and the gradient the run stepped with: the update checked on the run's very
    inputs. A free-running update of the reference's own gradients turns a rounding the gradient check
    accepts into AdamW's first-step sign flip (lr x g / (|g| + eps)) where a gradient has cancelled. With
    ZeRO-1 each rank updates its own slice of each bucket from its summed gradient slice, and the slices are
    gathered over dp (one Allgather a bucket, label "check": a collective) into the parameters' blocks, as the
    optimizer's own Allgather gathers them."""
    if hasattr(optimizer, "buckets"):
        return _zero_anchored(start, tensors, cfg, optimizer)
    out = {}
    for name, (p, m, v, steps, decaying) in start.items():
        p, g = p.copy(), np.asarray(tensors[name].grad.local, np.float64)
        m = np.zeros_like(p) if m is None else m.copy()
        v = np.zeros_like(p) if v is None else v.copy()
        adamw_update(p, g, m, v, steps + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=cfg.weight_decay if decaying else 0.0)
        out[name] = p
    return out


def _zero_anchored(start: list, tensors: dict, cfg: GPTConfig, optimizer: Any) -> dict:
    """`anchored_updates` under ZeRO-1: AdamW of each bucket's slice (decay on its decaying spans), gathered."""
    names = list(tensors)
    out = {}
    for b, (master, m, v, steps) in zip(optimizer.buckets, start):
        p, m, v = master.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
        for a, z in b.decayed:  # decoupled decay first, as AdamW's update makes it
            p[a:z] *= 1 - cfg.lr * cfg.weight_decay
        adamw_update(p, np.asarray(b.grad, np.float64), m, v, steps + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=0.0)
        flat = gather(optimizer.mesh, p, b.axes, "check") if b.axes else p
        for i, a, z in b.members:
            out[names[i]] = flat[a:z].reshape(tensors[names[i]].local.shape)
    return out


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


def _expert_bytes(cfg: GPTConfig, rank: int, mesh: Any, params: dict, stats: Any, optimizer: Any,
                  trace: Any) -> Any:
    """Rank `rank`'s spmdsim.models.moe.ledger.ExpertBytes of the step just taken: `params` the parameters it holds
    (name -> DTensor on `mesh`, a (dp, ep, tp) mesh), `stats` its MoEStats of one forward, `trace` the
    step's trace. A pipeline stage counts the MoE layers it holds."""
    experts = [t for name, t in params.items() if is_expert(name)]
    layers = [f"h{i}" for i in range(cfg.layers) if cfg.is_moe(i) and f"h{i}.moe.w1" in params]
    rows = [e for e in trace.entries if e.label and any(e.label.startswith(f"{layer}{word}") for layer in layers
                                                        for word in EXCHANGE_WORDS)]
    ep, tp = mesh.layout.axis_size(EXPERT), mesh.layout.axis_size(TENSOR)
    return ExpertBytes(rank, len(layers), cfg.moe.experts // ep, cfg.moe.experts, tp,
                       sum(t.local.nbytes for t in experts),
                       optimizer.grads_of(experts) if hasattr(optimizer, "grads_of") else
                       sum(t.grad.local.nbytes for t in experts if t.grad is not None),
                       optimizer.states_of(experts), sum(s.send_bytes for s in stats),
                       sum(s.received_bytes for s in stats), sum(e.bytes_sent for e in rows), len(rows),
                       cfg.moe.dry_routing if dry_run_active() else "router")


def _look(moments: dict, moment: str, optimizer: Any, params: list, kept: Optional[dict] = None,
          sums: Any = None) -> None:
    """Record in `moments` this rank's (optimizer bytes by kind, gradient bytes, total held) at `moment`,
    and what the graph keeps for backward (`kept`, by kind) when given: the trainers' memory looks. `sums`:
    ZeRO-0's GradBuffer, or None."""
    held = optimizer.memory()
    # The gradients: the leaves' blocks and the gradient buffer they accumulate in (ZeRO-1's, ZeRO-0's: their
    # .grad views it from the first backward on; the buffer is held between steps too), each buffer once.
    grads = owned_bytes([p.grad.local for p in params if p.grad is not None]
                        + list(getattr(optimizer, "gradient_buffers", tuple)())
                        + list(sums.gradient_buffers() if sums is not None else ()))
    moments[moment] = (held, grads, owned_bytes(p.local for p in params) + grads
                       + sum(held.values()) + sum((kept or {}).values()))
    if kept is not None:
        moments["kept"] = kept


def _look_walk(moments: dict, optimizer: Any, params: list, grads: dict, sums: Any = None) -> None:
    """A backward's look at a stop of its walk (DistributedAdamW.watch: ZeRO-2's before it reduces a bucket,
    ZeRO-1's as gradients go into its buffer; ZeRO-0's GradBuffer.watch, `sums`, the same and before each bucket's
    sum; `grads`: the walk's gradients then): the most bytes of gradients held so far in the step's backwards,
    under "walk" in `moments`: the parameters' gradients in the walk and in ``.grad``, the optimizer's summed
    slices and the gradient buffers, each buffer once."""
    found = [g for g in map(grads.get, [p._ag for p in params]) if g is not None]
    held = owned_bytes([g.local for g in found] + [p.grad.local for p in params if p.grad is not None]
                       + list(getattr(optimizer, "gradient_buffers", tuple)())
                       + list(sums.gradient_buffers() if sums is not None else ()))
    if held > moments.get("walk", 0):
        moments["walk"] = held


def _look_blocks(moments: dict, params: list, blocks: list, sums: Any) -> None:
    """A ZeRO-0 step's look as `reduce_grads` sums a bucket or a leaf alone in a block of its own (`GradBuffer`'s
    `watch_blocks`, where a gradient was not pending as guessed; `blocks`: every gradient block held then, the
    bucket's flat among them; `sums`: that GradBuffer, whose blocks are held beside them), under "walk" as
    `_look_walk`'s: those, the buffer's blocks and the ``.grad`` blocks, each block's own bytes, the views of one
    buffer at most its bytes (an eager block may view a larger buffer where a captured step's traced block is its
    own: the two report the same)."""
    owners: dict = {}
    for a in chain(blocks, sums.gradient_buffers(), (p.grad.local for p in params if p.grad is not None)):
        whole = owner(a)
        owners.setdefault(id(whole), (whole.nbytes, {}))[1][id(a)] = a.nbytes
    held = sum(min(size, sum(views.values())) for size, views in owners.values())
    if held > moments.get("walk", 0):
        moments["walk"] = held


def _steady(moments: dict) -> dict:
    """A first step's `_look` moments as a later step's: the optimizer's bytes after that step (its states and
    buffers, made in the first step) held at every moment, each total changed by as much. A replayed step's
    report (the replay runs none of the step's Python): what the same step run eagerly reports."""
    after = moments["after the step"][0]
    out = {}
    for moment, value in moments.items():
        if moment in _NOT_MOMENTS:
            out[moment] = value
            continue
        held, grads, total = value
        out[moment] = (after, grads, total - sum(held.values()) + sum(after.values()))
    return out


def _report(step: int, moments: dict, params: int) -> MemoryReport:
    """The step's MemoryReport from the moments `_look` recorded (the peak: the largest total of them)."""
    held, grads, _ = moments["after the step"]
    peak, moment = max((moments[m][2], m) for m in moments if m not in _NOT_MOMENTS)
    kept = tuple(sorted(moments["kept"].items(), key=lambda kv: _KIND_ORDER.get(kv[0], len(_KIND_ORDER))))
    most = max([moments[m][1] for m in moments if m not in _NOT_MOMENTS] + [moments.get("walk", 0)])
    return MemoryReport(step, kept, params, grads, held["master copy"], held["optimizer states"], held["buffers"],
                        peak, moment, most)


#: What `_look` and `_look_walk` record beside the moments: the graph's kept bytes, the backward's most gradients.
_NOT_MOMENTS = ("kept", "walk")


def _restep(report: MemoryReport, step: int) -> MemoryReport:
    from dataclasses import replace

    return report if report.step == step else replace(report, step=step)


_KIND_ORDER = {k: i for i, k in enumerate(("embedding", "block input", "layer norm", "attention", "attention core",
                                           "mlp", "head"))}
