"""`spmdsim estimate gpt`'s report: the dry run of one configuration priced on a machine, its stages' memory,
FLOPs, bytes and times, the predicted step time, the utilization and whether it fits (or one JSON record).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from math import prod
from typing import Any

from ...base.sizes import UnmappableError, format_size
from ...base.validate import counted
from ...errors import SpmdsimError
from ...models.axes import CONTEXT, DATA, EXPERT, PIPELINE, TENSOR
from ...models.gpt.flags import architecture_words
from ...models.gpt.params import param_specs
from ...models.gpt.stages import chunk_parts
from ...programs.pipeline.options import split_words
from ...programs.viz.table import wrap_lines
from ..estimate.ledger import (_RUN, PRECISIONS, gpt_ledger, kernel_bytes, layers_activations, peak_bytes, stage_memory,
                               stage_times, unmappable)
from ..estimate.held import peak_refusal
from ..estimate.machine import load_machine
from ...nn.autograd.kept import FP8
from ..estimate.steptime import Pipeline, assumptions, utilization
from ..estimate.transfers import uneven_on_nodes

__all__ = ["report"]

GIB = 1024 ** 3


def report(args: argparse.Namespace, record: dict, cfg: Any, microbatches: int, split: Any, schedule: str,
           overlap: tuple[str, ...]) -> int:
    """`spmdsim estimate gpt`'s dry run of `cfg` on the machine, printed (or one JSON record, its configuration
    `record`); exit code 0."""
    machine = load_machine(args.machine)
    fp8 = PRECISIONS[args.precision].fp8
    peak_refusal(machine, args.precision)
    start = time.perf_counter()
    try:
        stages = gpt_ledger(cfg, args.pp, args.dp, args.tp, sp=args.sp, microbatches=microbatches,
                            schedule=schedule, virtual=args.virtual_stages, recompute=args.recompute, zero=args.zero,
                            kept=args.kept, gpus_per_node=machine.gpus_per_node, ep=args.ep, split=split,
                            cp=args.cp, cp_method=args.cp_method, prefetch=args.prefetch, fp8=fp8,
                            shard_group=args.shard_group or 0, reshard=args.reshard_after_forward != "false")
    except UnmappableError as exc:  # a block beyond this machine's address space: more than any GPU's memory
        raise unmappable(exc, args.precision, machine.memory_bytes,
                         f"the {machine.name}'s {_gib(machine.memory_bytes)} per GPU") from None
    seconds = time.perf_counter() - start
    _even_on_nodes(args, machine)  # (after the dry run's refusals of what cannot train on the mesh at all)
    pipeline = Pipeline(args.pp, microbatches, args.virtual_stages, schedule)
    fused = getattr(args, "gradient_accumulation_fusion", False)
    times = stage_times(stages, machine, args.precision, pipeline, overlap, fused)
    # Whether a rank fits: what it holds (the memory line) and, for a moment, the largest kernel's blocks beside it
    # (its peak: the same figure the search by a machine file compares with its memory limit)
    memories = [stage_memory(st, args.precision, args.zero) for st in stages]
    # The first, a middle and the last stage, and the slowest and the fullest where they are others (an uneven
    # split can make a stage between them set the step or the memory line)
    slowest = max(range(len(stages)), key=lambda s: times[s].total_s)  # a step ends with its slowest stage
    fullest = max(range(len(stages)), key=lambda s: memories[s].peak)
    shown = sorted({0, len(stages) // 2, len(stages) - 1, slowest, fullest})
    rows = [(stages[s], memories[s], times[s]) for s in shown]
    ranks = args.pp * args.dp * args.ep * args.cp * args.tp
    use = _utilization(stages, max(t.total_s for t in times), ranks, machine, args.precision)
    above = _above_peak(use, stages, machine, args.precision)
    if args.json:  # each assumption one string, not the text's two lines
        assumed = assumptions(machine, overlap=overlap, experts=cfg.moe is not None, whole=True)
        print(json.dumps(_json_record(args, record, cfg, microbatches, split, seconds, machine, memories,
                                      times, use, above, assumed, rows), default=str, indent=1))
        return 0
    worst = cfg.moe is not None and cfg.moe.dry_routing == "worst" and args.ep > 1
    head = _head_lines(args, cfg, microbatches, split, schedule, machine, stages, seconds, worst)
    print("\n".join(wrap_lines(head)))
    holds = _holds(cfg, args.pp, args.virtual_stages, split) if args.pp > 1 else {}
    for st, mem, timing in rows:
        print()
        print("\n".join(_stage_lines(st, mem, timing, args.zero, args.precision, worst=worst,
                                     holds=holds.get(st.stage), fused=fused)))
    total = times[slowest].total_s
    when = f"{total:,.3f} s" if total >= 1 else f"{total * 1e3:,.3f} ms"
    print(f"\npredicted step time: {when} (stage {slowest}'s, the slowest of {len(stages)})")
    assumed = assumptions(machine, overlap=overlap, experts=cfg.moe is not None)
    print("\n".join(wrap_lines(_utilization_lines(use, args.precision, worst) + ([above] if above else []) + assumed)))
    print("\n".join(wrap_lines([_fit_line(memories, machine)])))
    hint = _to_fit(memories, machine, args)
    if hint:
        print("\n".join(wrap_lines([hint])))
    return 0


def _head_lines(args: argparse.Namespace, cfg: Any, microbatches: int, split: Any, schedule: str, machine: Any,
                stages: list, seconds: float, worst: bool) -> list[str]:
    """The lines above the stages' table: the model, the mesh, the schedule, the machine, the split, the
    experts, the parameters and FLOPs, and the dry run."""
    ranks = args.pp * args.dp * args.ep * args.cp * args.tp
    mesh = f"pp {args.pp} x dp {args.dp}" + (f" x ep {args.ep}" if cfg.moe else "") + \
        (f" x cp {args.cp} ({args.cp_method})" if args.cp > 1 else "") + f" x tp {args.tp}"
    head = [f"GPT {counted(args.layers, 'layer')}, hidden {args.hidden}, {counted(args.heads, 'head')}, "
            f"seq {args.seq}, vocab {cfg.vocab_words}{architecture_words(cfg)}; "
            f"global batch {args.global_batch}",
            f"mesh {mesh} ({ranks:,} rank{'s' if ranks > 1 else ''}){_sp(args)}; "
            f"{counted(microbatches, 'microbatch')} of {args.micro_batch} per "
            f"{f'{DATA} x {EXPERT}' if cfg.moe else DATA} rank, {schedule}",
            f"recompute {args.recompute}, dropout {args.dropout:g}, ZeRO {args.zero}{_alone(args)}, kept {args.kept}; "
            f"machine {machine.name}"]
    if args.tp > machine.gpus_per_node:  # said: each layer's tensor-parallel collectives cross the nodes
        head.append(f"tp {args.tp} spans {-(-args.tp // machine.gpus_per_node)} of the {machine.name}'s "
                    f"{machine.gpus_per_node}-GPU nodes: its collectives are priced on the cluster links")
    chunks = args.pp * args.virtual_stages
    over = f"{args.layers} over {chunks} {'chunks' if args.virtual_stages > 1 else 'stages'}"
    if split is not None:  # the user's split: said, with the flags it came from
        head.append(f"layers split as given: {over}, {split_words(split)}")
    elif chunks > 1 and args.layers % chunks:  # said, not left to be found: the slowest chunk sets the step
        counts = [p.stop - p.first for p in chunk_parts(cfg, chunks)]
        head.append(f"layers uneven: {over}, {', '.join(map(str, counts))} (the first take one more)")
    if cfg.moe:
        m = cfg.moe
        moe_layers = sum(cfg.is_moe(i) for i in range(cfg.layers))
        capacity = "dropless" if m.dropless else f"capacity factor {m.capacity_factor:g}"
        eps = getattr(args, "expert_ep", args.ep)  # folded (--etp below --tp): the experts' ep, args.ep x tp / etp
        folded = f" (etp {m.etp} x ep {eps} x edp {args.dp}: attention's tp folded into ep)" if eps != args.ep else ""
        head.append(f"experts: {counted(moe_layers, 'MoE layer')} of {m.experts} experts, top-{m.top_k}, {capacity}; "
                    f"{m.experts // eps} per ep rank{folded}; the dry run routes {m.dry_routing}")
    elements = sum(prod(spec.shape) for spec in param_specs(cfg))
    flops = sum(st.flops() * len(st.ranks) for st in stages)
    head.append(f"model {elements:,} parameters; one step: {flops:.4e} FLOPs of matrix products, all ranks"
                + (" (each as busy as rank 0: at most)" if worst else ""))
    head.append(f"dry run of one step: {counted(len(stages), 'representative rank')}, {seconds:.1f} s; bytes and "
                f"GEMMs at {args.precision} ({PRECISIONS[args.precision].about})")
    return head


def _even_on_nodes(args: argparse.Namespace, machine: Any) -> None:
    """Refuse a mesh whose groups of one axis fall unevenly on the machine's nodes (--tp 6 on 8-GPU nodes: ranks
    6-11's tp group crosses two nodes, rank 0's does not), which the dry run would price as its one rank a stage."""
    axes = ((TENSOR, args.tp), (CONTEXT, args.cp), (EXPERT, args.ep), (DATA, args.dp))
    found = uneven_on_nodes(axes, args.pp, machine.gpus_per_node)
    if found is None:
        return
    name, size, block, inside, outside = found
    nodes = machine.gpus_per_node
    inner = axes[:[n for n, _ in axes].index(name)] if name != PIPELINE else axes
    flags = " x ".join(f"--{n}" for n, s in (*inner, (name, size)) if s > 1 and n != PIPELINE)
    if name == TENSOR:
        expected = f"a --tp that divides {nodes} (every group within a node) or is larger (every group across nodes)"
    elif name == PIPELINE:  # a stage's ranks: within a node, or whole nodes
        expected = f"the ranks of a stage, {flags} ({block // size}), dividing {nodes} or a multiple of it"
    else:
        expected = f"{flags} ({block}) dividing {nodes}"
    raise SpmdsimError(f"--{name} {size} falls unevenly on the {machine.name}'s {nodes}-GPU nodes: rank {inside}'s "
                       f"{name} group is within its node, rank {outside}'s crosses nodes, and the estimate prices "
                       f"one rank of a stage for all of its ranks; expected {expected}")


def _json_record(args: argparse.Namespace, record: dict, cfg: Any, microbatches: int, split: Any,
                 seconds: float, machine: Any, memories: list, times: list, use: Any, above: str, assumed: Any,
                 rows: list) -> dict:
    """The JSON record of `spmdsim estimate gpt --json`."""
    return {"config": record,
            "parameters": sum(prod(spec.shape) for spec in param_specs(cfg)),  # the text's "model N parameters"
            "microbatches": microbatches, "dry_run_s": seconds,
            "chunk_layers": [p.stop - p.first for p in chunk_parts(cfg, args.pp * args.virtual_stages, split)],
            "memory_bytes_per_gpu": machine.memory_bytes,
            "fits": peak_bytes(memories) <= machine.memory_bytes,
            "to_fit": _to_fit(memories, machine, args) or None,  # the text's "to fit:" line (None: it fits)
            "step_time_s": max(t.total_s for t in times),
            "utilization": use.as_json() | {"above_peak": above or None}, "assumptions": assumed,
            "stages": [_as_json(st, mem, timing, args.precision, getattr(args, "gradient_accumulation_fusion", False))
                       for st, mem, timing in rows]}


def _utilization(stages: list, step_s: float, gpus: int, machine: Any, precision: str) -> Any:
    """The step's spmdsim.tools.estimate.steptime.Utilization: the dry run's products of every stage, each rank of a
    stage alike (forward and backward: the model's FLOPs; and the recomputed: the hardware's), at the
    predicted step time, against the machine's peak at the precision's compute dtype."""
    model = sum((st.flops("forward") + st.flops("backward")) * len(st.ranks) for st in stages)
    hardware = sum(st.flops() * len(st.ranks) for st in stages)
    return utilization(model, hardware, gpus, step_s, machine.peak(PRECISIONS[precision].compute))


def _utilization_lines(use: Any, precision: str, worst: bool) -> list[str]:
    """MFU (and HFU, where recomputation adds products) at the predicted step time: the papers' figures."""
    out = [f"MFU {use.mfu:.1%}: {_tflops(use.tflops_per_gpu)} TFLOP/s per GPU of the {PRECISIONS[precision].compute} "
           f"peak {use.peak / 1e12:,.4g}, from {use.model_flops:.4e} model FLOPs a step"]
    what = "the dry run's forward and backward products, all ranks" + (
        ", each as busy as rank 0: at most" if worst else "") + (
        ", the FP8 ones against the bf16 peak too, as NVIDIA reports MFU" if PRECISIONS[precision].fp8 else "")
    if use.hardware_flops > use.model_flops:
        out += [f"  ({what})", f"HFU {use.hfu:.1%}: {_tflops(use.hardware_tflops_per_gpu)} TFLOP/s per GPU with the "
                               f"{use.hardware_flops - use.model_flops:.4e} FLOPs recomputed"]
    else:
        out.append(f"  ({what}; nothing recomputed: HFU the same)")
    return out


def _above_peak(use: Any, stages: list, machine: Any, precision: str) -> str:
    """Why the MFU (or the HFU) is above 100%, in one line ("" where neither is): the FP8 products at the fp8 peak,
    above the peak the MFU counts them against, or a causal attention's products counted whole where its fused
    kernel executes half of them."""
    if max(use.mfu, use.hfu) <= 1:
        return ""
    why, compute = [], PRECISIONS[precision].compute
    fp8 = machine.peak("fp8") if PRECISIONS[precision].fp8 else 0.0
    if fp8 > use.peak:
        why.append(f"the FP8 products run at the fp8 peak {fp8 / 1e12:,.4g}, {fp8 / use.peak:.3g} times the "
                   f"{compute} peak they are counted against")
    if machine.attention_efficiency is not None and any(g.share < 1 for st in stages for g, _ in st.gemms):
        why.append("a causal attention's products are counted whole, where its fused kernel executes half of them")
    if not why:
        why.append(f"the machine file's figures run the products faster than the {compute} peak")
    return f"{'MFU' if use.mfu > 1 else 'HFU'} above 100%: {'; '.join(why)}"


def _tflops(rate: float) -> str:
    """A TFLOP/s figure: one decimal, or four digits below 0.1 (a CPU's calibrated machine file: "0.03345",
    where one decimal printed "MFU 32.5%: 0.0 TFLOP/s per GPU of the bf16 peak 0.1029")."""
    return f"{rate:,.1f}" if rate >= 0.1 else f"{rate:.4g}"


def _to_fit(memories: list, machine: Any, args: argparse.Namespace) -> str:
    """What to change when a stage does not fit ("" when every one does): the fullest stage's activations and
    what it holds besides them, by value, each with the options of this command that shrink it."""
    most = max(range(len(memories)), key=lambda s: memories[s].peak)
    if memories[most].peak <= machine.memory_bytes:
        return ""
    held = memories[most].held
    activations = held["activations"]
    rest = sum(held.values()) - activations + memories[most].backward  # (the gradients held beyond the line too)
    flash = getattr(args, "attention", "unfused") == "flash"  # no scores kept: selective drops nothing more
    fewer = {"none": ["--recompute full" if flash else "--recompute selective or full"],
             "selective": ["--recompute full"]}.get(args.recompute, [])
    fewer += ["--attention flash"] if not flash and args.recompute == "none" else []
    fewer += ["--kept megatron"] if args.kept == "graph" else []
    fewer += ["--sp"] if args.tp > 1 and not args.sp else []
    fewer += ["a smaller --micro-batch"] if args.micro_batch > 1 else []
    less = [] if args.zero else ["--zero 1" if args.dp * args.ep > 1 else "--zero 1 with --dp above 1"]
    parts = [f"activations {_gib(activations)}" + (f" (fewer with {', '.join(fewer)})" if fewer else ""),
             f"{_gib(rest)} besides them" + (f" (less with {', '.join(less)})" if less else "")]
    return (f"to fit: stage {most} holds {parts[0]} and {parts[1]}; a larger --tp or --pp splits both; or let "
            "`spmdsim autoshard --network gpt --machine` choose (docs/howto/estimate.md)")


def _fit_line(memories: list, machine: Any) -> str:
    """Whether one rank of every stage holds its peak (`memories`, by stage: spmdsim.tools.estimate.ledger.StageMemory,
    the ledger's bytes and the largest kernel's blocks) in the machine's memory per GPU; a stage over it names
    that kernel when its blocks alone are more than the memory."""
    held = [m.peak for m in memories]
    most = max(range(len(held)), key=lambda s: held[s])
    limit = f"the {machine.name}'s {_gib(machine.memory_bytes)} per GPU"
    over = [s for s in range(len(held)) if held[s] > machine.memory_bytes]
    if not over:
        return f"memory: every stage fits {limit} at its peak (the most, stage {most}: {_gib(held[most])})"
    if len(over) == 1:
        line = f"memory: stage {over[0]} needs {_gib(held[over[0]])} a rank at its peak, more than {limit}"
    else:
        line = f"memory: {len(over)} of {len(held)} stages need more than {limit} at their peak (the most, stage " \
               f"{most}: {_gib(held[most])})"
    alone = memories[most].transient
    if alone.nbytes > machine.memory_bytes:
        line += f"; {alone.what} alone reads and writes {_gib(alone.nbytes)} at once"
    return line


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB" if n >= GIB // 100 else format_size(n)


def _holds(cfg: Any, pp: int, virtual: int, split: Any) -> dict:
    """{stage: the line saying which layers (and ends) it holds}: its chunks (stage k holds chunks k, k + pp, ...)
    of spmdsim.models.gpt.stages.chunk_parts, with the split given (None: balanced)."""
    parts = chunk_parts(cfg, pp * virtual, split)
    out = {}
    for stage in range(pp):
        mine = parts[stage::pp]
        layers = sum(p.stop - p.first for p in mine)
        what = "; ".join(str(p) for p in mine) if virtual == 1 else \
            f"{counted(len(mine), 'chunk')}: " + "; ".join(str(p) for p in mine)
        out[stage] = f"holds {what} ({counted(layers, 'layer')})"
    return out


def _stage_lines(st: Any, mem: Any, timing: Any, zero: int, precision: str, worst: bool = False,
                 holds: Any = None, fused: bool = False) -> list[str]:
    bytes_, transient = mem.held, mem.transient
    lo, hi = st.ranks[0], st.ranks[-1]
    if worst:  # every rank runs rank 0's routing (spmdsim.models.moe.routing.planned): rank 0 is the busiest
        out = [f"stage {st.stage} (ranks {lo}-{hi}; rank {lo}'s figures: routed worst, the busiest; the others "
               "receive fewer tokens)"]
    else:
        alike = counted(len(st.ranks), "rank")
        out = [f"stage {st.stage} (rank {lo})" if lo == hi else
               f"stage {st.stage} (ranks {lo}-{hi}: {alike} alike; one rank's figures)"]
    if holds:
        out.append("  " + holds)
    out.append(f"  memory {_gib(mem.memory)}: " + ", ".join(f"{role} {_gib(n)}" for role, n in bytes_.items()))
    states = sum(bytes_[role] for role in ("parameters", "gradients", "master copy", "optimizer states"))
    line = f"    model states {_gib(states)} ({states / 1e9:,.2f} GB)"
    if zero in (0, 3):  # every element is updated on this rank: the layers' share is theirs exactly
        layers = states * st.layer_params // st.params
        line += f", of which the transformer layers' {_gib(layers)} ({layers / 1e9:,.2f} GB)"
    out.append(line)
    out.append(f"    activations {_gib(bytes_['activations'])}, of which the transformer layers' "
               f"{_gib(layers_activations(st, precision))}; {st.in_flight} microbatch-chunk(s) in flight at "
               f"the most; transformer layers' parameters {st.layer_params:,} of {st.params:,}"
               + (f", of which the experts' {st.expert_params:,}" if st.expert_params else ""))
    if PRECISIONS[precision].fp8:  # the program's FP8 blocks (spmdsim.nn.autograd.kept_bytes' kinds " fp8")
        copies = sum(n for kind, n in st.memory.kept if kind.endswith(FP8))
        out.append(f"    of the activations, the linear layers' e4m3 copies of their inputs and weights "
                   f"{_gib(copies)}; fp8 scales: {st.scales:,} B of scales and amax histories")
    beside = f", {_gib(mem.backward)} more gradients in the backward (measured, beside those above)" \
        if mem.backward else ""
    if st.memory.gathered:  # ZeRO-3 (spmdsim.nn.fsdp): gathered parameters, those the graph keeps are above
        w = PRECISIONS[precision].params
        out.append(f"    gathered parameters at most {_gib(st.memory.gathered // _RUN * w)} at once, "
                   f"{_gib(st.memory.gathered_kept // _RUN * w)} of them kept for backward (in the activations)")
        beside += f", {_gib(mem.gathered)} of the layers' gathered parameters" if mem.gathered else ""
    out.append(f"  peak (transient included) {_gib(mem.peak)}: the memory above{beside} and, "
               f"for a moment, the blocks of {transient.what}: {_gib(transient.nbytes)}")
    out.append("  TFLOP: " + ", ".join(f"{p} {st.flops(p) / 1e12:,.3f}" for p in ("forward", "backward", "recompute"))
               + f"; total {st.flops() / 1e12:,.3f}")
    traffic = kernel_bytes(st.kernels, precision, fused)
    out.append("  element-wise and optimizer kernels read and write: " + ", ".join(
        f"{p} {_gib(traffic.get(p, 0))}" for p in ("forward", "backward", "recompute", "optimizer")))
    sent = ", ".join(f"{kind} ({level}) {format_size(n)}" for (kind, level), n in sorted(st.sent(precision).items())
                     if n)
    out.append(f"  sent: {sent or 'nothing'}")
    out.extend("  " + line for line in timing.lines())
    return wrap_lines(out)


def _sp(args: argparse.Namespace) -> str:
    """The mesh line's word for sequence parallelism ("" without it): at tp 1 it splits nothing."""
    if not args.sp:
        return ""
    return ", sp" if args.tp > 1 else ", sp (at tp 1 the sequence is not split)"


def _alone(args: argparse.Namespace) -> str:
    """ZeRO over a data-parallel group of one shards nothing (dp x ep x cp 1: the context-parallel ranks, which
    hold the same parameters, shard them too), ZeRO-3's hybrid sharding its groups, and its layers kept gathered
    (--reshard-after-forward false): said beside it ("" else)."""
    group = args.shard_group
    kept = ", each layer kept gathered until its backward" if args.reshard_after_forward == "false" else ""
    if args.zero == 3 and group is not None and group < args.dp:
        return f" (hybrid: sharded over groups of {group} dp ranks, replicated over {args.dp // group}{kept})"
    if kept and args.dp * args.ep * args.cp > 1:
        return f" ({kept[2:]})"
    return " (a data-parallel group of one: nothing sharded)" if args.zero and args.dp * args.ep * args.cp == 1 \
        else ""


def _as_json(st: Any, mem: Any, timing: Any, precision: str, fused: bool = False) -> dict:
    return {"stage": st.stage, "ranks": [st.ranks[0], st.ranks[-1]], "bytes": mem.held,
            "program_bytes": asdict(st.memory), "flops": {p: st.flops(p) for p in ("forward", "backward",
                                                                                       "recompute")},
            "sent": {f"{k} {lvl}": n for (k, lvl), n in st.sent(precision).items()}, "in_flight": st.in_flight,
            "kernel_bytes": kernel_bytes(st.kernels, precision, fused),
            "peak_held": st.peak_held, "step_time_s": timing.total_s,
            "transient": {"bytes": mem.transient.nbytes, "what": mem.transient.what},
            "backward_gradient_bytes": mem.backward, "peak_bytes": mem.peak,
            "params": st.params, "layer_params": st.layer_params, "expert_params": st.expert_params}
