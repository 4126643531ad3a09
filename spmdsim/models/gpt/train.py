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

Memory (docs/howto/memory.md, "Memory"): `recompute` recomputes activations in the
backward (the GPT's option); `zero=1` steps with ZeRO-1
(spmdsim.nn.optim.DistributedAdamW: states and master copy sharded over dp), and the
check then compares, besides the loss and every updated parameter, the summed
gradient slice each rank updated (its Reduce_scatter's result) with the same
elements of the reference's gradients; `memory=True` measures each step's bytes
(spmdsim.models.gpt.memory.MemoryReport).

Precision (docs/howto/bf16.md): under `precision="fp32"` or
"bf16-mixed" the reference step runs under the same policy (spmdsim.models.gpt.mixed) from the
run's master copies; the loss and gradients are compared with it within the policy's
tolerances (spmdsim.models.gpt.tolerances.tolerances), and AdamW is checked on the run's own
gradients and moments (gathered at the step's start), so its float32 update must agree
to its own rounding whatever the gradients' bf16 flips.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ...nn.autograd.kept import kept_problem
from .config import GPTConfig
from .data import batch, text_problem
from .memory import MemoryReport, recompute_problem, zero_problem
from ...base.precision import precision as get_precision
from .tolerances import tolerances as mixed_tolerances
from .fp8_block import policy_problem
from .params import param_specs
from .wholes import Regions, assemble, regions, row
from ...errors import SpmdsimError
from ...nn import ops
from ...runtime.dtensor import DTensor
from ...runtime.shared_reference import shared_once
from ...runtime import shared_rows
from ...runtime.sim import dry_run_active
from ...runtime.trace import collect_trace
from .checkpoint import (_checkpoint_problem, checkpoint_meta, checkpoint_problem, load, save as save_checkpoint,
                         with_first_loss)
from .checkpoint_lock import releases_save_lock, take_save_lock
from .mixed import architecture_problem
from . import parallel
from .mesh import model_mesh
from ..axes import axis_of
from .context import Context, checked_order, ring_core
from .reference import generate
from .step_looks import _expert_bytes, _restep, step_memory_problem
from .step_check import UNCHECKED, _norm, agreed_overflow, router_weights, stop_if_diverged
from .reference_step import Overflows, _routes
from .step_run import _StepRun, _optimizer
from .checker import StepChecker

__all__ = ["StepResult", "train", "gathered", "reference_sample", "replay_problem", "TOLERANCE",
           "all_rows", "checkpoint_problem", "checkpoint_meta"]

#: The largest relative difference a step may show against the single-process reference (float64).
TOLERANCE = 1e-10


@dataclass(frozen=True)
class StepResult:
    """One step: the loss, the largest relative differences (loss, gradients, parameters), its traffic,
    with ``memory=True`` this rank's bytes (spmdsim.models.gpt.memory.MemoryReport), and with MoE layers this
    rank's dispatch figures (spmdsim.models.moe.report draws them) and its experts' bytes
    (spmdsim.models.moe.ledger)."""

    step: int
    loss: float
    errors: tuple[float, float, float]  # NaN when not checked
    calls: int
    bytes_sent: int
    memory: Optional[MemoryReport] = None
    dispatch: tuple = ()  # with MoE layers: this rank's spmdsim.models.moe.stats.MoEStats of the step's forward
    experts: Any = None  # with MoE layers: this rank's spmdsim.models.moe.ledger.ExpertBytes of the step
    # (loss, gradients, parameters): the policy's (spmdsim.models.gpt.tolerances.tolerances); 1e-10 each at float64
    tolerances: tuple[float, float, float] = (TOLERANCE,) * 3
    norm: Optional[float] = None  # with cfg.clip: the gradients' joint norm before clipping (alike on every rank)
    # under FP8: the gradients' largest difference relative to their tolerance plus one e5m2 step of each
    # element (spmdsim.models.gpt.step_check.flip_ratio: <= 1 within); None otherwise
    flip: Optional[float] = None
    # under a low-precision policy: each gradient's largest difference relative to what its own rounding allows
    # (spmdsim.models.gpt.step_check.rounding_ratio: <= 1 within); None at float64
    rounding: Optional[float] = None
    # checked: where one numpy process's step first overflowed ("AdamW update of 'wte' at float64 overflowed";
    # spmdsim.models.gpt.reference_step.Overflows), which the run computes alike; None where nothing did
    overflow: Optional[str] = None
    # not checked: `overflow` says where the run's own steps first overflowed on some rank, in the last step's
    # result (spmdsim.models.gpt.step_check.agreed_overflow)
    own_overflow: bool = False

    @property
    def passed(self) -> bool:
        return all(e <= t for e, t in zip(self.errors, self.tolerances) if e == e) and self.rounded

    @property
    def rounded(self) -> bool:
        """Each gradient within what its own rounding allows (always at float64, where none is measured)."""
        return self.rounding is None or self.rounding <= 1.0

    @property
    def flipped(self) -> bool:
        """Under FP8, not passed by its gradients alone, each within one e5m2 step of its value more: an FP8
        flip that dominates a sum (the run's verdict allows a few: spmdsim.models.gpt.tolerances.failed_steps)."""
        loss, _, params = (e <= t or e != e for e, t in zip(self.errors, self.tolerances))
        return not self.passed and loss and params and self.rounded and self.flip is not None and self.flip <= 1.0


def gathered(model: Any, blocks: Optional[dict] = None) -> dict:
    """Every parameter whole on every rank (float64), from one Allgather of all this rank's blocks;
    `blocks`: name -> this rank's block to gather in place of the parameter's (a master copy)."""
    where = regions(model.params, model.mesh.size)
    return assemble(where, _params_rows(model, where, blocks))[0]


def reference_sample(model: Any, cfg: GPTConfig, prompt: Any, n: int, temperature: float = 0.0) -> np.ndarray:
    """What the single-process model draws (spmdsim.models.gpt.reference.generate) from `model`'s parameters: a
    collective (one Allgather of every rank's blocks, as `gathered`), the parameters made whole and the draw
    made by one rank for all (spmdsim.runtime.shared_reference.shared_once)."""
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
                             "check.params", where.width))


def _table(model: Any, tables: list, label: str, width: int) -> np.ndarray:
    """Every rank's blocks of each of `tables` (name -> this rank's block, shaped as the parameter's), a row per
    rank (float64), from one Allgather (`all_rows`): spmdsim.models.gpt.wholes.assemble makes them
    whole (of its rows that Regions.used keeps). Each table takes `width` items of a row (Regions.width: under
    an uneven cut, ZeRO-3's, a rank with shorter blocks pads its tables with zeros)."""
    return all_rows(model.mesh, row(tables, model.params, width), label)


def all_rows(mesh: Any, flat: np.ndarray, label: str) -> np.ndarray:
    """Every rank's `flat`, a row per rank, on every rank of `mesh`: spmdsim.runtime.shared_rows.all_rows (its
    home, the runtime's checks share it)."""
    return shared_rows.all_rows(mesh, flat, label)


def replay_problem(cfg: GPTConfig) -> Optional[str]:
    """Why `cfg`'s training step (train's or spmdsim.models.gpt.pipeline's: a pipelined MoE step's router losses are
    read when the step ends, as its other losses are) cannot be replayed (spmdsim.runtime.replay), or None: none
    today (clipping, `cfg.clip`, replays: the norm and the scaling are kernels, spmdsim.nn.optim)."""
    return None


@releases_save_lock
def train(cfg: GPTConfig, comm: Any, dp: int, tp: int, steps: int, text_ids: np.ndarray, sp: bool = False,
          check: bool = True, on_step: Optional[Callable[[StepResult], Any]] = None,
          mesh: Any = None, layouts: Optional[dict] = None, replay: bool = False,
          recompute: str = "none", zero: int = 0, memory: bool = False, kept: str = "graph",
          ep: int = 1, precision: Any = "fp64", save: Optional[str] = None, save_every: int = 0,
          resume: Optional[str] = None, cp: int = 1, context: Optional[Context] = None,
          reshard_after_forward: bool = True, prefetch: bool = False) -> tuple[Any, list]:
    """Train `steps` steps on a (dp, tp) mesh over `comm`; returns (the model, one StepResult per step run).

    Collective: every rank calls it alike. `mesh`: a Mesh (dp, tp) to use instead of making one over `comm`.
    `layouts`: parameter name -> TensorLayout (default Megatron's).
    `replay`: step 0 is captured (spmdsim.runtime.replay) and every later step replays it, checked alike.
    `recompute`: "none", "selective" or "full" (spmdsim.models.gpt.parallel.GPT's). `zero`: 0 (AdamW), 1
    (DistributedAdamW over dp; with MoE layers over dp x ep, the experts' over dp), 2 (the same with the gradients
    sharded too: `zero_options`) or 3 (FSDP: the parameters too, spmdsim.nn.fsdp; `reshard_after_forward`,
    `prefetch`: its). `memory`: measure each step's bytes into StepResult.memory. `kept`: "graph" or
    "megatron" (GPT's: what the graph keeps for backward). `ep`: with MoE layers (cfg.moe), the
    expert-parallel ranks: the mesh (dp, ep, tp), the batch split over dp x ep; the loss has the router losses.
    `precision`: the precision policy ("fp64", "fp32", "bf16-mixed"); the reference step runs under it
    (spmdsim.models.gpt.mixed), the check's tolerance is the policy's (the optimizer on the run's gradients).
    `cp`: context-parallel ranks, attention by `context` (models.gpt.context; default the balanced ring).
    `save`: a directory to write a checkpoint into (spmdsim.models.gpt.checkpoint: a file per rank and rank 0's
    metadata) after the last step, and with `save_every` N > 0 after every N-th step too. `resume`: a checkpoint
    directory to continue from: the steps from the one it reached to `steps` run (and are returned), as the run
    that never stopped runs them, bit for bit; refused in one line, alike on every rank and before any
    collective, when it does not fit this run. With `check`, a resumed run's reference starts from the
    checkpoint's parameters and the run's moments (gathered).
    """
    shard = None if mesh is None else axis_of(mesh, "shard")  # (HSDP's shard group: its checkpoints' mesh)
    fs = 0 if shard is None else mesh.layout.axis_size(shard)
    meta = _refuse(cfg, comm if mesh is None else mesh.comm, dp, tp, steps, text_ids, sp, check, layouts, replay,
                   recompute, zero, kept, ep, precision, save, save_every, resume, cp, fs)
    if mesh is None:
        mesh = model_mesh(cfg, comm, dp, tp, ep, cp, context, zero)
    fsdp, zero = _fsdp_options(zero, reshard_after_forward, prefetch)  # ZeRO-3: AdamW on the shards
    policy = get_precision(precision)
    model = parallel.GPT(cfg, mesh, sp=sp, layouts=layouts, recompute=recompute, kept=kept, precision=policy,
                         context=context, fsdp=fsdp)
    specs = param_specs(cfg)
    tensors = {s.name: model.params[s.name] for s in specs}
    optimizer = _optimizer(cfg, model, mesh, specs, zero)
    replay = replay and not dry_run_active()  # a dry run's steps count bytes: nothing to replay
    run = _StepRun(cfg, model, optimizer, list(tensors.values()), mesh, zero, memory, fsdp is not None)
    # this rank's blocks and optimizer state (collective: the ranks agree on a problem)
    scales = () if model.fp8 is None else (model.fp8,)  # FP8's scales and histories: saved and resumed too
    first = 0 if resume is None else load(resume, mesh, tensors, optimizer, scales, meta)
    checker = _Checker(model, optimizer, specs, policy, zero, kept, first) \
        if check and not dry_run_active() else None  # a dry run has shapes, not values
    tolerances = mixed_tolerances(policy, cfg)
    ids_layout, laid = model.ids, model.laid
    results, watch = [], Overflows()
    for step in range(first, steps):
        x, y = batch(text_ids, cfg, step)  # the sequences as the model lays them out (context parallelism's order)
        xd, yd = (DTensor.from_global(mesh, a[laid], ids_layout, verify=False) for a in (x, y))
        if checker is not None:  # the step's start, every rank's blocks: the reference step starts from it, whole
            checker.start()
        with collect_trace() as trace, watch.at(step):  # an overflow: one line, not numpy's warnings
            loss = run.step(xd, yd, step, replay)
        value = float(ops.resolved(loss).local)
        stop_if_diverged(step, value, tensors, cfg.lr, optimizer=optimizer, weights=router_weights(cfg))
        report = run.report(step, replay)
        *errors, flip, rounding = UNCHECKED if checker is None else checker.errors(value, x, y, step)
        totals = trace.totals()
        ledger = _expert_bytes(cfg, mesh.rank, mesh, model.params, model.moe_stats, optimizer, trace) \
            if cfg.moe is not None else None
        result = StepResult(step, value, tuple(errors), totals["calls"], totals["bytes_sent"],
                            None if report is None else _restep(report, step), tuple(model.moe_stats), ledger,
                            tolerances, _norm(optimizer if zero else None, run.norms), flip, rounding,
                            None if checker is None else checker.overflow)
        results.append(result)
        if on_step is not None:
            on_step(result)
        if save is not None and (step + 1 == steps or save_every and (step + 1) % save_every == 0):
            save_checkpoint(save, with_first_loss(meta, resume, results), step + 1, mesh, tensors, optimizer, scales)
    return model, results if checker is not None else agreed_overflow(mesh.comm, watch, results, policy)


def _fsdp_options(zero: int, reshard_after_forward: Any, prefetch: Any) -> tuple[Optional[dict], int]:
    """(fully_shard's options for the model, the optimizer's ZeRO stage): ZeRO-3's, AdamW on the shards."""
    if zero != 3:
        return None, zero
    return {"reshard_after_forward": bool(reshard_after_forward), "prefetch": bool(prefetch)}, 0


def _refuse(cfg: GPTConfig, comm: Any, dp: int, tp: int, steps: int, text_ids: np.ndarray, sp: bool, check: bool,
            layouts: Optional[dict], replay: bool, recompute: str, zero: int, kept: str, ep: int, precision: Any,
            save: Optional[str], save_every: int, resume: Optional[str], cp: int = 1, fs: int = 0) -> Optional[dict]:
    """`train`'s refusals of what it was given, raised alike on every rank before any block is made; the
    checkpoints' metadata (None without checkpoints; `fs`: its mesh's HSDP shard group, 0 without)."""
    problem = (recompute_problem(recompute) or zero_problem(zero) or kept_problem(kept)
               or (replay_problem(cfg) if replay else None) or policy_problem(precision, replay)
               or text_problem(text_ids, cfg))
    if problem:  # every rank alike, before any collective
        raise SpmdsimError(problem)
    return refuse_run(cfg, comm, check, precision, (steps, save, save_every, resume),
                      dict(dp=dp, tp=tp, sp=sp, layouts=layouts, precision=precision, zero=zero, ep=ep, cp=cp, fs=fs),
                      dict(dp=dp, tp=tp, ep=ep, recompute=recompute, sp=sp, kept=kept, zero=zero % 3,
                           precision=precision, cp=cp))


def refuse_run(cfg: GPTConfig, comm: Any, check: bool, precision: Any, saving: tuple, meta_args: dict,
               memory_args: dict) -> Optional[dict]:
    """The refusals `train` and train_pipelined share once their arguments passed, each one line alike on every
    rank before any block is made: the checkpoints (`saving`: steps, save, save_every, resume; `meta_args`:
    checkpoint_meta's), the --save directory's lock for the run (checkpoint_lock.take_save_lock: another run's
    refused; a collective), the step's memory (`memory_args`: step_memory_problem's, a collective) and, checked under
    a low-precision policy, the architecture its reference writes. The checkpoints' metadata, or None."""
    steps, save, save_every, resume = saving
    meta = None
    if save is not None or resume is not None or save_every:
        meta = checkpoint_meta(cfg, comm.Get_size(), **meta_args)
        problem = _checkpoint_problem(meta, steps, save, save_every, resume)
        if problem:  # every rank alike (each reads the same metadata file), before any collective
            raise SpmdsimError(problem)
    if save is not None:  # rank 0 locks the directory for the run; the ranks agree (a collective)
        take_save_lock(save, comm)
    problem = step_memory_problem(cfg, comm, check=check and not dry_run_active(), **memory_args)
    if problem:  # every rank alike (a collective decided it), before any block is made
        raise SpmdsimError(problem)
    if check and get_precision(precision).activation != "float64" and not dry_run_active():
        problem = architecture_problem(cfg)  # every rank alike, before any collective
        if problem:
            raise SpmdsimError(problem)
    return meta


class _Checker(StepChecker):
    """`train`'s check of each step (spmdsim.models.gpt.checker): its model's parameters, every rank's blocks of
    them from one Allgather (`_table`), the experts the ranks chose."""

    def __init__(self, model: Any, optimizer: Any, specs: list, policy: Any, zero: int, kept: str,
                 first: int) -> None:
        self.model, self.specs = model, specs
        # where every rank's blocks lie, and this rank's, asked once (not per step)
        where = regions(model.params, model.mesh.size)
        slices = {s.name: model.params[s.name].slices for s in specs}
        # a context-parallel run's order of the sequence (its masks drawn in it; with experts of a capacity its
        # chunks, routed apart), or None
        super().__init__(model.cfg, model.mesh, optimizer, policy, zero, kept, 1, first, where, slices,
                         checked_order(model), ring_core(model))

    def tensors(self) -> dict:
        return {s.name: self.model.params[s.name] for s in self.specs}

    def rows(self, tables: list, label: str) -> np.ndarray:
        return _table(self.model, tables, label, self.where.width)

    def scales(self) -> Optional[dict]:
        return None if self.model.fp8 is None else self.model.fp8.snapshot()

    def routes(self) -> Optional[dict]:
        routes = _routes(self.model, self.cfg)  # the ranks' experts, which the reference follows at near-ties
        if self.laid is not None and routes:  # the experts of the tokens at their positions
            back = np.argsort(np.asarray(self.laid))
            routes = {layer: chosen[:, back] for layer, chosen in routes.items()}
        return routes
