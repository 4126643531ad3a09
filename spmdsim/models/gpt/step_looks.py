"""A training step's memory (spmdsim.models.gpt.train, spmdsim.models.gpt.pipeline): the pre-check before a run,
the looks at what a rank holds during a step, and the MoE layers' bytes."""
from __future__ import annotations

import os
from dataclasses import replace
from itertools import chain, repeat
from operator import is_
from typing import Any, Optional
from ...base.buffers import owned_bytes, owner, owners_of
from .config import GPTConfig
from .memory import MemoryReport
from .params import is_expert
from ..moe.fold import fold_of
from ...base.sizes import format_size
from ...programs.memory import ENV_VAR
from ...runtime import door
from ...runtime.budget import agreed_budget
from ...runtime.engines import engine_of, memory as stop
from ...runtime.sim import dry_run_active
from ..moe.ledger import EXCHANGE_WORDS, ExpertBytes
from .memory import check_need, step_need
from ...base.validate import counted


def step_memory_problem(cfg: GPTConfig, comm: Any, dp: int, tp: int, *, ep: int = 1, pp: int = 1,
                        microbatches: int = 1, recompute: str = "none", sp: bool = False, kept: str = "graph",
                        zero: int = 0, precision: Any = "fp64", check: bool = False, cp: int = 1) -> Optional[str]:
    """Why one rank of this training step cannot fit the memory a rank may use, or None; collective (every rank
    of `comm` alike: the same answer on each, before anything is allocated).

    The need is spmdsim.models.gpt.memory.step_need's shape-only count (the model states, the activations kept for
    backward and the attention's scores: a lower bound of the dry run's peak, so what is refused cannot fit). The limit
    is the room before the simulator's memory stop (and, under mpiexec, the memory watch:
    spmdsim.runtime.engines.memory) fires: what this machine, or its cgroup, has left (spmdsim.runtime.budget's agreed
    figure per rank) less the share of the memory the stop keeps free (`LOW_FRACTION` of the total, at least
    `LOW_FLOOR`); SPMDSIM_MEMORY (bytes per rank) sets it instead, and SPMDSIM_MEMORY=off, a dry run (no block is
    written) or a machine that does not say skips the check. With `check` (each step compared with one numpy
    process) the reference's whole model (`check_need`) is counted too, shared by the node's ranks: on simulated
    ranks one process holds it beside all of theirs, and under MPI rank 0 computes it and each rank receives its
    gradients and updated parameters."""

    budget = agreed_budget(comm)
    if budget is None:
        return None
    limit, source = budget.bytes, budget.source
    got = stop.readings() if not os.environ.get(ENV_VAR, "").strip() else None
    node = engine_of(comm).node_size(comm)
    if got is not None:  # the stop's reserve, shared by the ranks on this node
        reserve = max(stop.LOW_FLOOR, int(stop.LOW_FRACTION * got[2]))
        limit = max(0, limit - reserve // node)
        source += f", less {format_size(reserve)} kept free for the memory stop"
        if comm.Get_size() > 1:  # nodes may differ: the least, on every rank alike
            limit = door.all_reduce_object(comm, limit, "min")
    need = step_need(cfg, dp, tp, ep=ep, pp=pp, microbatches=microbatches, recompute=recompute, sp=sp, kept=kept,
                     zero=zero, precision=precision, cp=cp)
    share = check_need(cfg, precision) // max(1, node) if check else 0  # alike on every rank of a node
    if comm.Get_size() > 1 and check:  # nodes of other sizes: the largest share, on every rank alike
        share = door.all_reduce_object(comm, share, "max")
    if need.nbytes <= limit and need.nbytes + share > limit:
        return (f"the GPT's training step and its check need at least {format_size(need.nbytes + share)} per rank: "
                f"the step {format_size(need.nbytes)} {need.moment}, and the check's one numpy process "
                f"{format_size(check_need(cfg, precision))} (the whole model's parameters, gradients and optimizer "
                f"states) over the {counted(node, 'rank')} on this node, {format_size(share)} each; but a rank may "
                f"use {format_size(limit)} ({source}); leave out the check (--no-check), or use a smaller model or "
                f"more ranks; {ENV_VAR}=SIZE|off changes the limit")
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


def _expert_bytes(cfg: GPTConfig, rank: int, mesh: Any, params: dict, stats: Any, optimizer: Any,
                  trace: Any) -> Any:
    """Rank `rank`'s spmdsim.models.moe.ledger.ExpertBytes of the step just taken: `params` the parameters it holds
    (name -> DTensor on `mesh`, a (dp, ep, tp) mesh), `stats` its MoEStats of one forward, `trace` the
    step's trace. A pipeline stage counts the MoE layers it holds."""
    experts = [t for name, t in params.items() if is_expert(name)]
    layers = [f"h{i}" for i in range(cfg.layers) if cfg.is_moe(i) and f"h{i}.moe.w1" in params]
    rows = [e for e in trace.entries if e.label and any(e.label.startswith(f"{layer}{word}") for layer in layers
                                                        for word in EXCHANGE_WORDS)]
    fold = fold_of(mesh.layout, cfg.moe.etp)
    ep, tp = fold.ep, fold.etp
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


def _look_walk(moments: dict, optimizer: Any, params: list, grads: dict, sums: Any = None,
               kept: Optional[list] = None) -> None:
    """A backward's look at a stop of its walk (DistributedAdamW.watch: ZeRO-2's before it reduces a bucket,
    ZeRO-1's as gradients go into its buffer; ZeRO-0's GradBuffer.watch, `sums`, the same and before each bucket's
    sum; `grads`: the walk's gradients then): the most bytes of gradients held so far in the step's backwards,
    under "walk" in `moments`: the parameters' gradients in the walk and in ``.grad``, the optimizer's summed
    slices and the gradient buffers, each buffer once. `kept`: the caller's ``[None]``, where the look keeps
    the gradient buffers' owners from one stop to the next (`_buffer_owners`)."""
    nodes = [p._ag for p in params]  # each parameter's ``.grad`` is its node's (DTensor.grad), read once here
    arrays = [g.local for g in map(grads.get, nodes) if g is not None]
    arrays += [g.local for g in map(getattr, nodes, repeat("grad"), repeat(None)) if g is not None]
    buffers = getattr(optimizer, "gradient_buffers", tuple)()
    if sums is not None:
        buffers += sums.gradient_buffers()
    owners, total = _buffer_owners(buffers, [None] if kept is None else kept)
    held = total + sum(n for i, n in owners_of(arrays).items() if i not in owners)
    if held > moments.get("walk", 0):
        moments["walk"] = held


def _buffer_owners(buffers: tuple, kept: list) -> tuple:
    """(`owners_of` the gradient buffers, their bytes), from ``kept[0]`` while they are the same arrays as at the
    last look: a walk stops at every bucket, and a ZeRO buffer's ~200 blocks are the same at each stop."""
    last = kept[0]
    if last is None or len(buffers) != len(last[0]) or not all(map(is_, buffers, last[0])):
        owners = owners_of(buffers)
        last = kept[0] = (buffers, owners, sum(owners.values()))
    return last[1], last[2]


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
    return report if report.step == step else replace(report, step=step)


_KIND_ORDER = {k: i for i, k in enumerate(("embedding", "block input", "layer norm", "attention", "attention core",
                                           "mlp", "head"))}
