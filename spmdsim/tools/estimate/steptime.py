"""One rank's predicted step time on a `Machine`: its GEMMs, its communication, the pipeline bubble.

Pure. `step_time(machine, gemms, transfers, pipeline=..., overlap=...)` adds:

- compute: each GEMM (any object with ``batch, m, n, k, dtype, phase`` and ``flops``, such as
  spmdsim.base.flop_counts.Gemm), ``count * flops / (peak_flops[dtype] * efficiency)`` seconds, the efficiency
  of the machine's GEMM model, or a fused attention kernel's (Machine.product_seconds);
- memory-bound kernels (`traffic`: bytes per phase, spmdsim.base.flops.sweep's count priced at the
  training precision): the element-wise and reduction kernels of phases "forward", "backward" and
  "recompute", and the optimizer's update (phase "optimizer"), each ``bytes / (hbm_bandwidth *
  hbm_efficiency)`` (the machine's achieved HBM rate);
- communication: each records.Calls, ``count`` times spmdsim.programs.cost.model's formula for its
  collective with alpha = the latency and beta = 1 / (bandwidth * efficiency) of its level's link
  (the bus bandwidth a collective achieves), gamma = 1 / the machine's reduction rate (0 where it
  gives none); "send" and "recv" cost alpha + n beta;
- the bubble of a pipeline of p stages, m microbatches, v virtual stages per rank: the rank idles
  (p - 1) / v times one microbatch's forward and backward on one stage, taken as the step's
  compute and element-wise seconds (not the optimizer's) / m (communication inside a stage is not in it);
- overlap: communication of the phases named in `overlap` runs beside compute and costs only what
  exceeds it (OVERLAP_UNDER): "gradients" (the data-parallel sums) under the backward pass's compute
  (the GEMMs and element-wise kernels of phases "backward" and "recompute"), as DDP's no_sync and
  Megatron's --overlap-grad-reduce run them with several microbatches (`pipeline`: m, v; stages 1 for
  gradient accumulation alone): each model chunk's sums start with its last microbatch's backward, one
  chunk's after another, under the backward left after it and the idle of stage `stage` after its last
  backward (`_sums_window`; without `pipeline`, the whole backward); "layers" (tensor and
  sequence parallelism's collectives, Megatron's --tp-comm-overlap) under the products of the passes
  they run in (every GEMM phase: a Calls row does not say its pass); "pipeline" (the messages between
  stages, Megatron's overlap_p2p_comm) under the adjacent microbatches' compute (the GEMMs and
  element-wise kernels of every GEMM phase); "context" (ring attention's messages, each block's transfer
  posted before the block's compute) under the products; "parameters" (ZeRO-3's gathers of the layers'
  parameters, prefetched: spmdsim.nn.fsdp) under every pass's compute; "updates" (ZeRO-1/2's gathers, --overlap
  params: spmdsim.tools.estimate.ledger.stage_times) under the forward's. Each phase hides at most its own
  communication and its window, all of them together at most the compute and element-wise seconds. Default: none.

    total = compute + element-wise + optimizer + communication - hidden + bubble

`utilization(model_flops, hardware_flops, gpus, step_s, peak)` turns a step's counted FLOPs and its
predicted seconds into TFLOP/s per GPU, MFU and HFU (the figures the papers publish), and
`assumptions(machine)` says in two short lines what the prediction above rests on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from ...base.flop_counts import PHASES, Gemm
from ...programs.cost.model import CostModel
from ...programs.cost.terms import OPS
from ...errors import SpmdsimError
from .machine_records import Machine, normalize_dtype
from .links import P2P as _P2P, lane_model, level_model, link_seconds
from .records import LEVELS, Calls

__all__ = ["StepTime", "Pipeline", "step_time", "link_seconds", "level_model", "SCHEDULES", "GEMM_PHASES",
           "TRANSFER_PHASES", "TRAFFIC_PHASES", "OVERLAP_UNDER", "Utilization", "utilization", "assumptions"]

#: Pipeline schedules (the names of spmdsim.programs.pipeline.SCHEDULES; a test keeps them equal).
SCHEDULES = ("gpipe", "1f1b", "interleaved")

#: What a GEMM was doing (spmdsim.base.flop_counts.Gemm.phase) and what a transfer was doing (records.Calls.phase).
GEMM_PHASES = PHASES  # a Gemm's own, checked when it is made (`_gemm_seconds` trusts a Gemm's)
TRANSFER_PHASES = ("layers", "gradients", "pipeline", "context", "parameters", "updates")
TRAFFIC_PHASES = GEMM_PHASES + ("optimizer",)

#: Each transfer phase `step_time`'s overlap can hide, in the order it is hidden, and the compute it hides under:
#: (GEMM phases of the products, whether the element-wise kernels of those phases count too).
OVERLAP_UNDER = {"gradients": (("backward", "recompute"), True), "layers": (GEMM_PHASES, False),
                 "pipeline": (GEMM_PHASES, True), "context": (GEMM_PHASES, False),
                 "parameters": (GEMM_PHASES, True),  # ZeRO-3's gathers, prefetched under the layers' compute
                 "updates": (("forward",), True)}  # ZeRO-1/2's gathers, under the next step's forward


@dataclass(frozen=True)
class Pipeline:
    """p stages, m microbatches, v virtual stages (model chunks) per rank, the schedule's name.

    "gpipe" and "1f1b" have one chunk per rank (v = 1); "interleaved" any v >= 1.
    """

    stages: int
    microbatches: int
    virtual_stages: int = 1
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        for name in ("stages", "microbatches", "virtual_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpmdsimError(f"pipeline {name} {value!r} must be an integer >= 1")
        if self.schedule not in SCHEDULES:
            low = self.schedule.lower() if isinstance(self.schedule, str) else None
            hint = f" (lower-case: {low!r})" if low in SCHEDULES else ""
            raise SpmdsimError(f"pipeline schedule {self.schedule!r} is unknown; expected one of {SCHEDULES!r}{hint}")
        if self.schedule != "interleaved" and self.virtual_stages != 1:
            raise SpmdsimError(f"pipeline schedule {self.schedule!r} has one chunk per rank, not virtual_stages "
                               f"{self.virtual_stages!r}; expected 1 (or schedule 'interleaved')")

    def bubble_s(self, compute_s: float) -> float:
        """Idle seconds per step: (p - 1) / v x (compute_s / m), one microbatch's forward and backward."""
        return (self.stages - 1) / self.virtual_stages * (compute_s / self.microbatches)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one rank's step, by part. Pairs keep the order of GEMM_PHASES, LEVELS, TRANSFER_PHASES.

    compute_s: the GEMMs; compute_by_phase: (phase, seconds) per GEMM phase;
    memory_s: the element-wise and reduction kernels (forward, backward, recompute) at the achieved
    HBM rate; memory_by_phase: (phase, seconds) per GEMM phase; optimizer_s: the optimizer's update;
    comm_s: every transfer, before overlap; comm_by_level, comm_by_phase: the same split two ways;
    hidden_s: communication the overlap hides under compute; hidden_by_phase: (phase, seconds) of it per
    transfer phase;
    bubble_s: the pipeline's idle time;
    total_s = compute_s + memory_s + optimizer_s + comm_s - hidden_s + bubble_s.
    """

    machine: str
    compute_s: float
    compute_by_phase: tuple[tuple[str, float], ...]
    comm_s: float
    comm_by_level: tuple[tuple[str, float], ...]
    comm_by_phase: tuple[tuple[str, float], ...]
    hidden_s: float
    bubble_s: float
    total_s: float
    memory_s: float = 0.0
    memory_by_phase: tuple[tuple[str, float], ...] = ()
    optimizer_s: float = 0.0
    hidden_by_phase: tuple[tuple[str, float], ...] = ()

    def lines(self) -> list[str]:
        """A short breakdown table (within 100 columns): seconds in ms and each part's share of the total."""
        rows = [("compute", self.compute_s)]
        rows += [(f"  {phase} phase", s) for phase, s in self.compute_by_phase if s]
        if self.memory_s:
            rows += [("element-wise kernels", self.memory_s)]
            rows += [(f"  {phase} phase", s) for phase, s in self.memory_by_phase if s]
        if self.optimizer_s:
            rows.append(("optimizer update", self.optimizer_s))
        rows += [("communication", self.comm_s)]
        rows += [(f"  {level} links", s) for level, s in self.comm_by_level if s]
        rows += [(f"  {phase} phase", s) for phase, s in self.comm_by_phase if s]
        if self.hidden_s:
            rows.append(("hidden by overlap", -self.hidden_s))
            hiding = [(phase, s) for phase, s in self.hidden_by_phase if s]
            if len(hiding) > 1:  # which phase's, where more than one hides some
                rows += [(f"  {phase} phase", -s) for phase, s in hiding]
        if self.bubble_s:
            rows.append(("pipeline bubble", self.bubble_s))
        rows.append(("step total", self.total_s))
        out = [f"predicted step time of one rank on {self.machine}",
               f"{'part':<24}{'ms':>14}{'share':>9}"]
        for name, seconds in rows:
            share = f"{seconds / self.total_s:.1%}" if self.total_s else "-"
            out.append(f"{name:<24}{seconds * 1e3:>14,.3f}{share:>9}")
        return out


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpmdsimError(f"{what} count {value!r} must be an integer >= 0")
    return value


def _gemm_seconds(machine: Machine, gemm: Any, dtypes: tuple) -> tuple[str, float]:
    """(phase, seconds) of one call of `gemm`; `dtypes`: the machine's. A `Gemm` checked its fields when made
    (spmdsim.base.flop_counts: a dry run's ~20 a price): only its dtype is checked here, against the machine."""
    if type(gemm) is not Gemm:
        _check_gemm(gemm)
    if normalize_dtype(gemm.dtype) not in dtypes:
        raise SpmdsimError(f"gemm dtype {gemm.dtype!r} has no peak in machine {machine.name!r}; "
                           f"expected one of {dtypes!r}")
    if gemm.flops == 0:
        return gemm.phase, 0.0
    return gemm.phase, machine.product_seconds(gemm)


def _check_gemm(gemm: Any) -> None:
    """A product given as any other object: its fields checked (one line naming the bad one)."""
    for name in ("batch", "m", "n", "k", "dtype", "phase", "flops"):
        if not hasattr(gemm, name):
            raise SpmdsimError(f"gemm {gemm!r:.80} has no {name!r}; expected an object with batch, m, n, k, "
                               "dtype, phase and flops (spmdsim.base.flop_counts.Gemm)")
    dims = (gemm.batch, gemm.m, gemm.n, gemm.k)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims):
        raise SpmdsimError(f"gemm dimensions (batch, m, n, k) {dims!r} must be integers >= 0")
    if gemm.phase not in GEMM_PHASES:
        raise SpmdsimError(f"gemm phase {gemm.phase!r} is unknown; expected one of {GEMM_PHASES!r}")
    flops = gemm.flops
    if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not math.isfinite(flops) or flops < 0:
        raise SpmdsimError(f"gemm flops {flops!r} must be a finite number >= 0")


def _transfer_seconds(models: dict[str, CostModel], t: Any) -> float:
    """Seconds of one call of transfer `t`."""
    if not isinstance(t, Calls):
        raise SpmdsimError(f"transfer {t!r:.80} is a {type(t).__name__}; expected spmdsim.tools.estimate.records.Calls")
    if t.kind not in OPS and t.kind not in _P2P:
        raise SpmdsimError(f"transfer kind {t.kind!r} is unknown; expected one of {OPS + _P2P!r}")
    if t.level not in LEVELS:
        raise SpmdsimError(f"transfer level {t.level!r} is unknown; expected one of {LEVELS!r}")
    if t.phase not in TRANSFER_PHASES:
        raise SpmdsimError(f"transfer phase {t.phase!r} is unknown; expected one of {TRANSFER_PHASES!r}")
    if isinstance(t.group, bool) or not isinstance(t.group, int) or t.group < 1:
        raise SpmdsimError(f"transfer group {t.group!r} must be an integer >= 1 (ranks in the communicator)")
    if isinstance(t.nbytes, bool) or not isinstance(t.nbytes, int) or t.nbytes < 0:
        raise SpmdsimError(f"transfer nbytes {t.nbytes!r} must be an integer >= 0")
    if isinstance(t.lanes, bool) or not isinstance(t.lanes, int) or not 1 <= t.lanes <= t.group:
        raise SpmdsimError(f"transfer lanes {t.lanes!r} must be an integer from 1 to its group {t.group!r} (the "
                           "group's members on a node)")
    return link_seconds(lane_model(models, t.level, t.lanes, t.kind), t.kind, t.group, t.nbytes)


def step_time(machine: Machine, gemms: Iterable[tuple[Any, int]], transfers: Iterable[Calls], *,
              pipeline: Pipeline | None = None, overlap: Iterable[str] = (),
              traffic: Any = None, stage: int = 0) -> StepTime:
    """Predicted seconds of one rank's training step (module docstring).

    Args:
        machine: the `Machine` (spmdsim.tools.estimate.machine.load_machine).
        gemms: (gemm, count) pairs: one rank's products in one step.
        transfers: records.Calls values: one rank's calls in one step (each with its count).
        pipeline: adds the bubble; None for no pipeline.
        overlap: transfer phases whose communication runs under compute (OVERLAP_UNDER; e.g.
            ("gradients",): the data-parallel gradient sums under the backward, as DDP and Megatron run them;
            "layers" under the products, "pipeline" under the microbatches' compute).
        traffic: {phase: bytes} of the memory-bound kernels (phases among TRAFFIC_PHASES;
            spmdsim.tools.estimate.ledger.kernel_bytes), or None for none.
        stage: the rank's pipeline stage (0 .. stages - 1): the idle after its last backward hides gradient sums.
    """
    if not isinstance(machine, Machine):
        raise SpmdsimError(f"machine {machine!r:.80} is a {type(machine).__name__}; expected a Machine "
                           "(spmdsim.tools.estimate.machine.load_machine)")
    if pipeline is not None and not isinstance(pipeline, Pipeline):
        raise SpmdsimError(f"pipeline {pipeline!r:.80} is a {type(pipeline).__name__}; expected a Pipeline or None")
    stages = 1 if pipeline is None else pipeline.stages
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
        raise SpmdsimError(f"stage {stage!r} must be an integer from 0 to {stages - 1} (the pipeline's stages)")
    overlap = (overlap,) if isinstance(overlap, str) else tuple(overlap)
    for phase in overlap:
        if phase not in TRANSFER_PHASES:
            raise SpmdsimError(f"overlap phase {phase!r} is unknown; expected phases among {TRANSFER_PHASES!r}")
    compute = dict.fromkeys(GEMM_PHASES, 0.0)
    dtypes = machine.dtypes
    for pair in gemms:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise SpmdsimError(f"gemms entry {pair!r:.80} must be a (gemm, count) pair")
        gemm, count = pair
        phase, seconds = _gemm_seconds(machine, gemm, dtypes)
        compute[phase] += _count(count, "gemm") * seconds
    models = {level: level_model(machine, level) for level in LEVELS}
    by_level = dict.fromkeys(LEVELS, 0.0)
    by_phase = dict.fromkeys(TRANSFER_PHASES, 0.0)
    for t in transfers:
        seconds = _transfer_seconds(models, t) * _count(t.count, "transfer")
        by_level[t.level] += seconds
        by_phase[t.phase] += seconds
    memory = _traffic_seconds(machine, traffic)
    compute_s = sum(compute.values())
    memory_s = sum(memory[p] for p in GEMM_PHASES)
    comm_s = sum(by_level.values())
    hidden = dict.fromkeys(TRANSFER_PHASES, 0.0)
    room = compute_s + memory_s  # all of the phases together hide at most the compute and element-wise seconds
    for phase, (gemm_phases, kernels) in OVERLAP_UNDER.items():
        if phase in overlap:
            under = sum(compute[p] + (memory[p] if kernels else 0.0) for p in gemm_phases)
            if phase == "gradients" and pipeline is not None:
                under = _sums_window(pipeline, stage, under, by_phase[phase])
            hidden[phase] = min(by_phase[phase], under, room)
            room -= hidden[phase]
    hidden_s = sum(hidden.values())
    bubble_s = pipeline.bubble_s(compute_s + memory_s) if pipeline is not None else 0.0
    total = compute_s + memory_s + memory["optimizer"] + comm_s - hidden_s + bubble_s
    return StepTime(machine=machine.name, compute_s=compute_s, compute_by_phase=tuple(compute.items()),
                    comm_s=comm_s, comm_by_level=tuple(by_level.items()), comm_by_phase=tuple(by_phase.items()),
                    hidden_s=hidden_s, bubble_s=bubble_s, total_s=total, memory_s=memory_s,
                    memory_by_phase=tuple((p, memory[p]) for p in GEMM_PHASES), optimizer_s=memory["optimizer"],
                    hidden_by_phase=tuple(hidden.items()))


def _sums_window(pipeline: Pipeline, stage: int, backward_s: float, sums_s: float) -> float:
    """The seconds of `sums_s` (the step's data-parallel gradient sums) that run beside compute when, as DDP's
    no_sync and Megatron's --overlap-grad-reduce do, each model chunk's sums start with its last microbatch's
    backward: chunk j's last backward ends j x p microbatch-backwards before the stage's last (the interleaved
    cooldown takes the chunks last to first, p microbatches each), the sums run one after another on the link,
    and stage `stage` idles `stage` microbatch-backwards after its last one (stage 0 ends the step)."""
    p, v = pipeline.stages, pipeline.virtual_stages
    one = backward_s / (pipeline.microbatches * v)  # a chunk's backward of one microbatch
    per_chunk = sums_s / v
    done = -math.inf
    for j in range(v - 1, -1, -1):  # times from the stage's last backward's end
        start = -(j * p + 1) * one
        done = max(done, start) + per_chunk
    exposed = max(0.0, done - stage * one)
    return max(0.0, sums_s - exposed)


def _traffic_seconds(machine: Machine, traffic: Any) -> dict:
    """{phase: seconds} of `traffic` ({phase: bytes}) at the machine's achieved HBM rate."""
    out = dict.fromkeys(TRAFFIC_PHASES, 0.0)
    if traffic is None:
        return out
    if not hasattr(traffic, "items"):
        raise SpmdsimError(f"traffic {traffic!r:.80} must be a mapping of phase to bytes, or None")
    for phase, nbytes in traffic.items():
        if phase not in TRAFFIC_PHASES:
            raise SpmdsimError(f"traffic phase {phase!r} is unknown; expected one of {TRAFFIC_PHASES!r}")
        _count(nbytes, "traffic bytes")
        out[phase] += nbytes / machine.hbm_achieved
    return out


@dataclass(frozen=True)
class Utilization:
    """What a step's FLOPs at its predicted time make of the GPUs' peak (Korthikanti et al. 2022's MFU and HFU).

    model_flops: the step's matrix products of the forward and the backward, all GPUs (no recomputation);
    hardware_flops: the same and the recomputed forward's products; gpus: the GPUs the step runs on;
    step_s: its predicted seconds; peak: one GPU's peak FLOP/s at the products' dtype.
    tflops_per_gpu = model_flops / (gpus * step_s) / 1e12, mfu = that / peak; hardware_tflops_per_gpu and
    hfu the same of hardware_flops (equal to the model's without recomputation).
    """

    model_flops: int
    hardware_flops: int
    gpus: int
    step_s: float
    peak: float

    @property
    def tflops_per_gpu(self) -> float:
        return self.model_flops / (self.gpus * self.step_s) / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        return self.hardware_flops / (self.gpus * self.step_s) / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu * 1e12 / self.peak

    @property
    def hfu(self) -> float:
        return self.hardware_tflops_per_gpu * 1e12 / self.peak

    def as_json(self) -> dict:
        return {"model_flops": self.model_flops, "hardware_flops": self.hardware_flops, "gpus": self.gpus,
                "step_time_s": self.step_s, "peak_flops_per_gpu": self.peak,
                "tflops_per_gpu": self.tflops_per_gpu, "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
                "mfu": self.mfu, "hfu": self.hfu}


def utilization(model_flops: Any, hardware_flops: Any, gpus: Any, step_s: Any, peak: Any) -> Utilization:
    """The `Utilization` of a step that executes `model_flops` (forward and backward products, all GPUs) and
    `hardware_flops` (those and the recomputed ones) on `gpus` GPUs of `peak` FLOP/s each in `step_s` seconds."""
    for name, value in (("model flops", model_flops), ("hardware flops", hardware_flops)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpmdsimError(f"{name} {value!r} must be an integer >= 0 (FLOPs of one step, all GPUs)")
    if hardware_flops < model_flops:
        raise SpmdsimError(f"hardware flops {hardware_flops:,} must be at least the model flops {model_flops:,} "
                           "(they add the recomputed products)")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise SpmdsimError(f"gpus {gpus!r} must be an integer >= 1")
    for name, value in (("step seconds", step_s), ("peak", peak)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise SpmdsimError(f"{name} {value!r} must be a finite number > 0")
    return Utilization(model_flops, hardware_flops, gpus, float(step_s), float(peak))


def _fraction(achieved: Any) -> str:
    """An achieved fraction as the prediction uses it ("0.88"; "1" where the machine file gives none)."""
    return "1" if achieved is None else f"{achieved.fraction:g}"


def assumptions(machine: Machine, *, overlap: Iterable[str] = ("gradients",), experts: bool = False,
                whole: bool = False) -> list[str]:
    """Two short lines naming what `step_time` assumed: which communication it hid under which compute
    (`overlap`; `experts`: the model's MoE layers, whose Alltoalls the layers' phase holds beside tp's
    collectives) and the machine file's achieved fractions (the GEMM cap, the HBM and the links' efficiencies)
    with the collectives' formulas; `whole`: each of those one string, not cut into the printed lines."""
    moe = " and the experts' Alltoalls" if experts else ""
    names = {"gradients": ("dp gradient sums", "under the backward"),
             "layers": (f"the layers' tp collectives{moe}", "under their GEMMs"),
             "pipeline": ("pipeline messages", "under the microbatches' compute"),
             "context": ("ring attention's messages", "under the products"),
             "parameters": ("ZeRO-3's prefetched gathers", "under the layers' compute"),
             "updates": ("ZeRO's gathers of the updated parameters", "under the forward")}
    overlap = {overlap} if isinstance(overlap, str) else set(overlap)
    hidden = [names[p] for p in OVERLAP_UNDER if p in overlap]
    eff, caps = machine.gemm_efficiency, "".join(f", {d} {a.fraction:g}" for d, a in machine.gemm_efficiency.dtypes)
    rest = [f"GEMMs at most {eff.max_fraction:g} of peak{caps} ({eff.model})",
            f"other kernels at {_fraction(machine.hbm_efficiency)} of HBM bandwidth",
            f"{machine.algorithm} collectives at {_fraction(machine.node.efficiency)} (node), "
            f"{_fraction(machine.cluster.efficiency)} (cluster) of links"]
    said = [f"{what}{' hidden' if whole or not i else ''} {where}" for i, (what, where) in enumerate(hidden)]
    said = said or ["no communication hidden"]
    return said + rest if whole else [f"assumes: {', '.join(said)}; {rest[0]};", f"  {rest[1]}; {rest[2]}"]
