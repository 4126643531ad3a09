"""A GPT training step in one numpy process, on simulated ranks, on MPI ranks and by hand on mpi4py, side by side.

    python scripts/bench_gpt.py                          # 3 launches of each, 3 timed steps each
    python scripts/bench_gpt.py --launches 5 --steps 5 --layers 2
    python scripts/bench_gpt.py --pipeline               # pp 4, 1F1B, 8 microbatches: spmdsim and by hand
    python scripts/bench_gpt.py --pipeline --replay      # spmdsim's steps 1.. replayed from step 0's capture
    python scripts/bench_gpt.py --pipeline --replay --simulated   # also on 4 simulated ranks
    python scripts/bench_gpt.py --moe --simulated        # the MoE step, eager and replayed, and by hand
    python scripts/bench_gpt.py --context                # ring attention's messages (cp 4) against raw mpi4py

Each worker is its own launch (the rows interleave, launch by launch), runs one
warm-up step, then times --steps steps (each after a barrier, the slowest
rank's wall time); a row is the median over launches of each launch's median
step. Rows:

- one numpy process: spmdsim.models.gpt.reference's step (loss, hand-written
  backward, AdamW) on one BLAS thread, twice: the second is the A/A control,
  the spread between two equal runs on this machine now;
- 1 simulated rank on a 1 x 1 mesh: the same step through spmdsim with
  nothing to communicate, so its excess over one process is what spmdsim's
  per-operator Python costs one rank (8 ranks pay it 8 times on the cores);
- 8 simulated ranks (dp 2 x tp 4, sequence parallel): forward, backward, AdamW;
- numpy + mpi4py by hand on 8 simulated ranks: the hand-written peer below,
  unmodified, under `spmdsim mpirun -n 8` (its ranks are threads of one process
  meeting in spmdsim's rendezvous, blocking calls): what 8 ranks of plain numpy
  cost in one interpreter, so the simulated row's excess over it is spmdsim's
  per-operator Python and its excess over one process is the simulation's;
  launched again after spmdsim's simulated launches, the A/A control of 8
  simulated ranks;
- 8 simulated ranks, replayed: the warm-up step captured (spmdsim.runtime.replay)
  and each timed step a replay of it: the same numpy calls and collectives,
  none of the Python that chose them (examples/train_gpt.py --replay checks
  such steps against one process);
- 8 MPI ranks (mpiexec): the same step, the time its collectives take inside
  spmdsim (the trace's seconds, the slowest rank), split in two: the time a
  rank waited in them for a later member of the call's group to arrive, and
  the time after each call's last group member arrived (a call cannot end
  before that: its own cost), each summed over a rank's calls, the slowest
  rank's; and the CPU time of the 8 ranks together (on 2 cores, a rank waits
  in a collective while the others compute: the step follows the CPU all
  ranks need, and a rank that computes less waits longer for ranks the
  scheduler has not run yet);
- 8 MPI ranks, replayed: as the simulated replay, with the same figures as
  the row above;
- numpy + mpi4py by hand (scripts/peer_mpi4py_gpt.py, 8 ranks under mpiexec):
  the same step written directly on mpi4py buffer calls (Allgather,
  Reduce_scatter_block, Allreduce on Split sub-communicators), Megatron's
  sequence-parallel step with spmdsim's 41 collectives, from spmdsim.models.gpt's
  initial parameters, with its own numpy dropout masks; its collectives (the
  time inside its MPI calls, the slowest rank), the waits for later members in
  them, their time after each call's last member arrived and the CPU time of its
  ranks are measured as spmdsim's. It runs with spmdsim's wait (polite: the
  nonblocking call, Test() with sched_yield, then short sleeps; spmdsim waits
  so when ranks outnumber cores, and its 8-rank launches here are told to on
  any machine, SPMDSIM_WAIT=polite, so that on free cores too both sides wait
  alike), twice (the second, launched
  after spmdsim's, is the A/A control of 8-rank launches), and with the
  blocking calls a plain mpi4py program makes.
  Its first launch also runs step 0 with spmdsim's dropout masks and prints its
  loss beside the one-process reference's, and how far its gradients and updated
  parameters are from the reference's;
- PyTorch DTensor (gloo, 8 ranks under mpiexec): the same GPT in torch float64,
  from spmdsim.models.gpt's initial parameters, with PyTorch's tensor-parallel plan on
  the same dp 2 x tp 4 mesh, sequence parallel (scripts/peer_dtensor_gpt.py);
  the first launch also runs step 0 with spmdsim's dropout masks and prints its
  loss beside the one-process reference's. Needs torch (the `bench` extra);
  without it, one line.

Ratios compare like with like: two runs on the same engine, with the same
number of ranks on the same cores (one process; 8 threads of one process; 8
MPI processes): the simulated A/A control, spmdsim's replayed step / the
hand-written step on simulated ranks, spmdsim's eager step / its replayed
step; on MPI ranks the same for the step, its collectives, collectives after
arrival and CPU time (the peer on the same work: the same model, mesh, splits
and collectives); the blocking peer / the polite one; spmdsim's MPI steps /
DTensor's. A ratio is the median over launches of each launch's ratio (a
launch of a row against the same round's launch of its base), printed with
its min-max over launches; the load average (1, 5, 15 min) is printed at the
start and at the end: on a shared machine compare within one run only.
Every launch (spmdsim's, the peers', the one process's) runs with the glibc
heap thresholds that spmdsim's MPI ranks set for themselves (tune_mpi_process),
given as `spmdsim launch` gives them (spmdsim.base.malloc.glibc_env), unless the
environment sets glibc's variables already: under glibc's defaults a step that
allocates its results afresh (an eager step, the peers') gives its freed heap
top back to the OS and faults it in again the next step (docs/explanation/performance.md),
so every row runs on the same heap.

``--pipeline`` times the pipelined step instead, on 4 MPI ranks (pp 4, tp 1,
dp 1, 1F1B, --microbatches, default 8): spmdsim.models.gpt.pipeline's
train_pipelined (the activations and their gradients between stages as
point-to-point messages) beside the same schedule written by hand on mpi4py
(scripts/peer_mpi4py_pipeline.py: Irecv/Isend of numpy buffers between
neighbouring stages, each stage's layers in numpy), launched before spmdsim and
again after it (the A/A control). Each launch runs step 0 (spmdsim's dropout
masks in both; the peer's loss is printed beside spmdsim's step 0 and the one
process's) and times steps 1..--steps from a barrier to the next (the slowest
rank); a row is the median over launches of each launch's median step, the
ratios the median over launches of each launch's ratio, beside their spread.
Point-to-point time a step: the span spmdsim's trace row of each
point-to-point call covers (runtime.door.point_to_point: from before its first
post to after its last wait), summed over the step's calls, the slowest rank;
the peer times the same span of each of its message groups. It includes the
wait for the neighbouring stage's compute, so it follows the stages' cells.
Messages only: one more launch per round replays each rank's message groups of
one step (message_groups: sizes, peers, tags and order from the schedule
spmdsim runs, and the tied table's exchange) with no compute between, on the
same buffers and communicator, ROUNDS times, each round through spmdsim's door
and by raw mpi4py Irecv/Isend (completed by the same wait as spmdsim's, twice:
the second is the A/A control, and by Request.Waitall), then with the messages
bound to their buffers once: the step's door calls captured and replayed
(spmdsim.runtime.replay: the door binds each group at the capture, a replay
starts it with one Startall) and raw mpi4py's Recv_init/Send_init, in an order
that turns each round; each launch's ratio is the median of the rounds' ratios,
a row the median over launches. The point-to-point bytes, groups and messages
of a step (all ranks) are printed for spmdsim, the peer and the replay (whose
captured calls must write the door's rows); the script exits 1 when they differ
or the losses do not agree. The CPU time of a step is each rank's from the
step's barrier to the step's end (not the next barrier's spin), summed over the
4 ranks, on both sides. ``--replay``: spmdsim is launched twice a round, eager
and then with its pipelined step 0 captured and the timed steps replaying it
(train_pipelined(replay=True)); each launch of either is compared with the
same round's peer, and the eager launch with the replayed one (eager /
replayed: the same engine, ranks and cores). ``--simulated`` (with
--pipeline) adds, each round, the peer unmodified on 4 simulated ranks
(``spmdsim mpirun -n 4``: threads of one process, blocking calls), spmdsim's
replayed step on 4 simulated ranks (spmdsim.simulate) and the peer there again
(the A/A control): the step times of the same engine on the same threads.

``--moe`` times the MoE GPT's step instead (the same sizes, every second
block's MLP 4 experts behind a top-2 router, capacity factor 1) on 8 MPI ranks,
dp 2 x ep 2 x tp 2, sequence parallel: each round the hand-written peer
(scripts/peer_mpi4py_moe.py: the dense peer's step with its MoE layers on
mpi4py, Alltoall over ep, the same collectives a step as spmdsim's; polite
wait), spmdsim's step replayed (step 0 captured, the timed steps replaying it),
spmdsim's step eager, and the peer again (the A/A control), with the step, its
collectives, the waits for later members in them, their time after the last
member arrived and the 8 ranks' CPU, as the dense rows. ``--simulated`` adds
each round the peer on 8 simulated ranks (``spmdsim mpirun -n 8``, blocking
calls), spmdsim's replayed step on 8 simulated ranks and the peer there again. Step 0 runs with spmdsim's dropout
masks on both sides: the peer's loss is printed beside spmdsim's (eager and
replayed) and the one process's, and the script exits 1 when the losses or
the collectives a step differ.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
MESH = (2, 4)
PP = 4  # --pipeline's stages, one MPI rank each
MOE_MESH = (2, 2, 2)  # --moe's (dp, ep, tp) on 8 MPI ranks
MOE_EXPERTS = 4  # --moe: experts per MoE layer (every second block), top-2, capacity factor 1
P2P = ("send", "recv", "sendrecv")  # the trace's point-to-point rows (spmdsim.runtime.door.point_to_point)

sys.path.insert(0, str(HERE.parent))  # the peer and the shared parts beside this file, also when imported by path
from peer_dtensor_gpt import missing  # noqa: E402
from _bench_gpt_shared import (FIGURES, MessageGroups, _arrivals, _config, _line, _load, _max, _median,  # noqa: E402
                               _mpi_rows, _mpiexec, _ratio, _result, agreement, gpt_step, message_rows)

from spmdsim.base.malloc import glibc_env  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402


def _moe_config(args):
    """--moe's model: the dense one's sizes, every second block's MLP MOE_EXPERTS experts (the peer's too)."""
    from peer_mpi4py_moe import moe_config

    return moe_config(argparse.Namespace(layers=args.layers, d_model=args.d_model, seq=args.seq, dropout=0.1,
                                         experts=MOE_EXPERTS, capacity_factor=1.0))


def _reference(args) -> dict:
    from spmdsim.base.threads import blas_threads
    from spmdsim.models.gpt import encode, load_text
    from spmdsim.models.gpt.reference import Trainer

    cfg = _config(args)
    times = []
    with blas_threads(1):
        trainer = Trainer(cfg, encode(load_text()))
        for step in range(args.steps + 1):
            t0 = time.perf_counter()
            trainer.step()
            times.append(time.perf_counter() - t0)
    return {"step": statistics.median(times[1:])}


def _steps(args, comm, mpi: bool, shape: tuple = MESH, replay: bool = False, moe: bool = False) -> dict:
    """Time the distributed steps on this rank's comm; with `mpi` (a process per rank), also their collectives
    after arrival and the CPU time of all ranks. `replay`: the warm-up step is captured
    (spmdsim.runtime.replay) and each timed step replays it. `moe`: the MoE GPT (_moe_config) on MOE_MESH."""
    from spmdsim import Layout
    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim import DTensor, Mesh, collect_trace
    from spmdsim.nn import ops
    from spmdsim.runtime.replay import Scalar, capture

    cfg, ids = (_moe_config(args) if moe else _config(args)), encode(load_text())
    walls, inside, waited, arrived, cpus = [], [], [], [], []

    mesh = Mesh(Layout(MOE_MESH, ("dp", "ep", "tp")), comm) if moe else Mesh(Layout(shape, ("dp", "tp")), comm)
    model, params, train_step = gpt_step(cfg, mesh)
    graph = None
    for step in range(args.steps + 1):
        x, y = batch(ids, cfg, step)
        xd, yd = (DTensor.from_global(mesh, a, mesh.layout(model.batch, None)) for a in (x, y))
        comm.Barrier()
        # A rank's CPU: its process's on MPI ranks (spmdsim's own threads, if any, included), its thread's
        # on simulated ranks (threads of one process), as the hand-written peer measures its ranks'.
        clock = time.process_time if mpi else time.thread_time
        t0, c0 = time.perf_counter(), clock()
        with collect_trace() as trace:
            if not replay:
                loss = train_step(xd, yd, step)
            elif graph is None:
                loss = graph = capture(train_step, xd, yd, Scalar(step), state=params)
            else:
                loss = graph(xd, yd, step)
        wall, cpu = time.perf_counter() - t0, clock() - c0
        if step == 0:  # spmdsim's dropout masks: the peer's checked step 0 draws the same
            loss0 = float(ops.resolved(graph.result if loss is graph else loss).local)
        spent = sum(e.seconds for e in trace.entries)
        if mpi:
            before, after = _arrivals(mesh, trace.entries)
            waited.append(comm.allreduce(before, op=_max()))
            arrived.append(comm.allreduce(after, op=_max()))
        cpus.append(comm.allreduce(cpu))
        walls.append(comm.allreduce(wall, op=_max()))
        inside.append(comm.allreduce(spent, op=_max()))
    mesh.close()
    out = {"step": statistics.median(walls[1:]), "collectives": statistics.median(inside[1:]),
           "cpu": statistics.median(cpus[1:]), "loss0": loss0, "calls": len(trace.entries)}
    if mpi:
        out["waited"], out["arrived"] = statistics.median(waited[1:]), statistics.median(arrived[1:])
    return out


def _pipeline_steps(args, comm, replay: bool = False, clock=time.process_time) -> dict:
    """spmdsim's pipelined training (pp = the world, 1F1B) on `comm`: step 0 (the warm-up, its loss kept) and
    steps 1..steps, each timed from a barrier to the barrier after it (the slowest rank), its CPU time from
    that barrier to the end of the step (before the next barrier, whose MPICH wait spins), summed over the
    ranks, as the peer measures its own; the point-to-point bytes and message seconds of each step from its
    trace rows (spmdsim.runtime.door.point_to_point). `replay`: step 0 captured, the later steps replayed.
    `clock`: a rank's CPU clock (a simulated rank's is its thread's)."""
    from spmdsim import collect_trace
    from spmdsim.models.gpt import encode, load_text
    from spmdsim.models.gpt.pipeline import train_pipelined

    stamps, marks, clocks, ends = [], [], [], []
    with collect_trace() as trace:
        def on_step(result) -> None:
            ends.append(clock())
            comm.Barrier()
            stamps.append(time.perf_counter())
            clocks.append(clock())
            marks.append(len(trace))

        comm.Barrier()
        stamps.append(time.perf_counter())
        clocks.append(clock())
        marks.append(0)
        _, results = train_pipelined(_config(args), comm, comm.size, 1, 1, args.steps + 1, encode(load_text()),
                                     schedule="1f1b", microbatches=args.microbatches, check=False, on_step=on_step,
                                     replay=replay)
    entries = trace.entries
    walls, sent, waited, groups, cpus = [], [], [], [], []
    for k in range(2, len(stamps)):  # stamps[1] ends the warm-up step 0
        mine = [e for e in entries[marks[k - 1]:marks[k]] if e.op in P2P]
        walls.append(comm.allreduce(stamps[k] - stamps[k - 1], op=_max()))
        cpus.append(comm.allreduce(ends[k - 1] - clocks[k - 1]))
        sent.append(comm.allreduce(sum(e.bytes_sent for e in mine)))
        waited.append(comm.allreduce(sum(e.seconds for e in mine), op=_max()))
        groups.append(comm.allreduce(len(mine)))
    return {"step": statistics.median(walls), "messages": statistics.median(waited), "cpu": statistics.median(cpus),
            "p2p_bytes": sent[-1], "p2p_bytes_steps": sent, "p2p_groups": groups[-1], "loss0": results[0].loss}


#: --pipeline's messages-only pair: rounds a launch (after one untimed round of each way) and its ways, each
#: round running every way once, in an order that turns by one each round.
ROUNDS = 30
REPLAYS = ("raw", "door", "raw2", "waitall", "replayed", "rawbound")


def message_groups(cfg, pp: int, microbatches: int, rank: int) -> list:
    """`rank`'s point-to-point groups of one 1F1B step, in the order spmdsim.models.gpt.pipeline posts them:
    (receives, sends), each a list of (bytes, peer, tag), from the schedule spmdsim runs
    (spmdsim.programs.pipeline.schedule.build; tags as spmdsim.models.gpt.pipeline tags them) and, on the first and the
    last stage, the tied table's gradient exchange that ends the step (spmdsim.models.gpt.stage_program._tie_embedding)."""
    from spmdsim.models.gpt.stage_program import _tag
    from spmdsim.programs.pipeline.records import Compute, Post, Send
    from spmdsim.programs.pipeline.schedule import build

    act = cfg.batch // microbatches * cfg.seq * cfg.d_model * 8  # a microbatch's activation, float64
    groups = []
    for action in build("1f1b", pp, microbatches).programs[rank]:
        if isinstance(action, Compute):
            continue
        receives, sends = [], []
        for op in action.ops if isinstance(action, Post) else (action,):
            if isinstance(op, Send):
                sends.append((act, op.peer, _tag(op.what, op.chunk)))
            else:
                receives.append((act, op.peer, _tag(op.what, op.chunk - 1 if op.what == "act" else op.chunk + 1)))
        groups.append((receives, sends))
    if pp > 1 and rank in (0, pp - 1):
        table = (cfg.vocab * cfg.d_model * 8, pp - 1 - rank, 1 << 14)  # _tie_embedding's tag
        groups.append(([table], [table]))
    return groups


def _message_replay(args, comm) -> dict:
    """--pipeline's messages only: this rank's groups of one step (message_groups) on the same buffers, no
    compute between, through spmdsim's door (runtime.door.point_to_point on the pipeline mesh's pp group,
    a trace open as train_pipelined keeps one) and by raw mpi4py on the same communicator: Irecv/Isend
    completed by spmdsim's wait ("raw", and "raw2", its A/A control: the peer's polite Test() polling on
    a polite mesh, else Wait) and by Request.Waitall ("waitall"). A way's time in a round: the sum of its
    groups' spans (from before the first post to after the last wait), the slowest rank. Two more ways post
    the messages bound to their buffers once: the step's door calls captured (spmdsim.runtime.replay, as
    train_pipelined(replay=True) captures step 0: the door binds each group, a replay starts it again) and
    replayed ("replayed", timed whole: its calls and the replay's Python between them), and raw mpi4py's
    Recv_init/Send_init, each group started by Prequest.Startall and completed by the same wait ("rawbound")."""
    from mpi4py import MPI

    from _peer_mpi4py_step import _tight_timer_slack
    from spmdsim import Layout, Mesh, collect_trace
    from spmdsim.models.gpt.stage_program import _PP
    from spmdsim.runtime.replay import capture

    cfg, clock = _config(args), time.perf_counter
    mesh = Mesh(Layout((comm.size,), ("pp",)), comm)
    if mesh.polite:
        _tight_timer_slack()
    msgs = MessageGroups(mesh, mesh.group("pp"), _PP, message_groups(cfg, comm.size, args.microbatches, comm.rank),
                         "pipeline", clock)  # the pipeline's, as it calls the door
    groups, raw = msgs.groups, msgs.raw

    def replayed() -> float:
        t0 = clock()
        graph()
        return clock() - t0

    ways = {"raw": raw, "door": msgs.door, "raw2": raw, "waitall": lambda: raw(True), "replayed": replayed,
            "rawbound": lambda: raw(persistent=True)}
    times: dict = {way: [] for way in REPLAYS}
    with collect_trace() as trace:
        graph = capture(msgs.step)  # posts the step's groups once, as the door binds them (untimed)
        mark = captured = len(trace.entries)
        for r in range(-1, ROUNDS):  # round -1: each way once, untimed
            for way in REPLAYS[r % len(REPLAYS):] + REPLAYS[:r % len(REPLAYS)]:
                comm.Barrier()
                spent = comm.allreduce(ways[way](), op=MPI.MAX)
                if r >= 0:
                    times[way].append(spent)
                if r == -1 and way == "door":
                    rows = [e for e in trace.entries[mark:] if e.op in P2P]
                if r == -1 and way == "replayed":
                    replay_rows = [e for e in trace.entries[mark:] if e.op in P2P]
                mark = len(trace.entries)
    del graph  # its bound requests freed before the communicators
    msgs.free()
    mesh.close()
    out = {way: statistics.median(times[way]) for way in REPLAYS}
    for way in REPLAYS[1:]:
        out[way + "_ratio"] = statistics.median(t / base for t, base in zip(times[way], times["raw"]))
    same = [(e.op, e.bytes_sent, e.bytes_received) for e in replay_rows] == [(e.op, e.bytes_sent, e.bytes_received)
                                                                             for e in rows] and captured == len(rows)
    out.update(groups=comm.allreduce(len(rows)), bytes=comm.allreduce(sum(e.bytes_sent for e in rows)),
               replay_rows_same=comm.allreduce(int(not same)) == 0,
               planned_groups=comm.allreduce(len(groups)), messages=comm.allreduce(sum(len(s) for _, s in groups)),
               planned_bytes=comm.allreduce(sum(b.nbytes for _, sends in groups for b, _, _ in sends)),
               wait="polite" if msgs.polite else "busy", rounds=ROUNDS)
    return out


def _worker(args) -> None:
    if args.worker == "ref":
        result = _reference(args)
    elif args.worker in ("sim", "simreplay"):
        import spmdsim

        replay = args.worker == "simreplay"
        result = spmdsim.simulate(8, lambda: _steps(args, spmdsim.world(), False, replay=replay))[0]
    elif args.worker == "one":
        import spmdsim
        from spmdsim.base.threads import blas_threads

        # One BLAS thread, as the one-process row: simulate() caps BLAS from 2 ranks only, and a
        # multithreaded OpenBLAS on a loaded machine took 15 ms for a (128, 32) @ (32, 128) product
        # with a transposed operand (20 us on one thread).
        with blas_threads(1):
            result = spmdsim.simulate(1, lambda: _steps(args, spmdsim.world(), False, (1, 1)))[0]
    elif args.worker == "msim":  # --moe --simulated: the replayed MoE step on 8 simulated ranks
        import spmdsim

        result = spmdsim.simulate(8, lambda: _steps(args, spmdsim.world(), False, replay=True, moe=True))[0]
    elif args.worker == "psim":  # --pipeline --simulated: the replayed step on PP simulated ranks
        import spmdsim

        result = spmdsim.simulate(PP, lambda: _pipeline_steps(args, spmdsim.world(), True, time.thread_time))[0]
    elif args.worker in ("pipe", "pipereplay", "pmsg"):
        from mpi4py import MPI

        from spmdsim.runtime.process import tune_mpi_process

        tune_mpi_process()
        if args.worker == "pmsg":
            result = _message_replay(args, MPI.COMM_WORLD)
        else:
            result = _pipeline_steps(args, MPI.COMM_WORLD, replay=args.worker == "pipereplay")
        if MPI.COMM_WORLD.rank != 0:
            return
    else:
        from mpi4py import MPI

        from spmdsim.runtime.process import tune_mpi_process

        tune_mpi_process()  # as the guard does for spmdsim's commands: BLAS threads, heap, memory watch
        result = _steps(args, MPI.COMM_WORLD, True, replay=args.worker in ("mpireplay", "moereplay"),
                        moe=args.worker in ("moe", "moereplay"))
        if MPI.COMM_WORLD.rank != 0:
            return
    print("RESULT " + json.dumps(result))


#: The hand-written peer's launches: worker -> its wait ("hand2" is "hand" again, the A/A control).
HAND = {"hand": "polite", "hand2": "polite", "busy": "busy"}
#: --pipeline's launches, in their order: the peer, spmdsim (eager; with --replay then replayed), the peer again
#: (A/A); with --simulated the peer on simulated ranks, spmdsim replayed on them, the peer again (A/A); the
#: messages-only pair.
PIPE = ("phand", "pipe", "pipereplay", "phand2", "psimhand", "psim", "psimhand2", "pmsg")
SIMULATED = ("psimhand", "psim", "psimhand2")
#: --moe's launches, in their order: the peer, spmdsim replayed, then eager, the peer again (A/A); with --simulated
#: the peer on 8 simulated ranks, spmdsim replayed on them, the peer there again (A/A).
MOE = ("mhand", "moereplay", "moe", "mhand2", "msimhand", "msim", "msimhand2")
MOE_SIMULATED = ("msimhand", "msim", "msimhand2")


def _launch(args, worker: str, check: int = 0) -> dict | None:
    """`worker`'s launch (_command) run to its end: the result its RESULT line printed, else None (one line)."""
    cmd, env = _command(args, worker, check)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=960)
    return _result(worker, done.returncode, done.stdout, done.stderr)


def _command(args, worker: str, check: int = 0) -> tuple[list, dict]:
    """`worker`'s launch: its command line and its environment."""
    common = ["--steps", str(args.steps), "--layers", str(args.layers), "--d-model", str(args.d_model),
              "--seq", str(args.seq), "--worker", worker]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]))
    if worker in ("mpi", "mpireplay", "moe", "moereplay"):  # as the polite peer waits, also on free cores
        env["SPMDSIM_WAIT"] = "polite"
    env = glibc_env(env)  # every launch on the heap spmdsim's MPI ranks keep (tune_mpi_process), as `spmdsim launch`
    cmd = [sys.executable, str(HERE)] + common
    if worker == "dtensor":
        cmd = [sys.executable, str(HERE.parent / "peer_dtensor_gpt.py")] + common[:-2] + ["--check", str(check)]
    if worker in HAND:
        cmd = [sys.executable, str(HERE.parent / "peer_mpi4py_gpt.py")] + common[:-2] + [
            "--check", str(check), "--wait", HAND[worker]]
    if worker == "handsim":  # the peer, unmodified, on 8 simulated ranks: blocking calls, as threads meet
        spmdsim_cli = [sys.executable, "-m", "spmdsim", "mpirun", "-n", "8"]
        cmd = ["timeout", "-k", "5", "900"] + spmdsim_cli + [
            sys.executable, str(HERE.parent / "peer_mpi4py_gpt.py")] + common[:-2] + ["--check", "0", "--wait", "busy"]
    ranks = "8"
    if worker in PIPE:  # --pipeline: pp 4, one rank a stage
        ranks = str(PP)
        common = common[:-2] + ["--microbatches", str(args.microbatches)]
        cmd = [sys.executable, str(HERE)] + common + ["--pipeline", "--worker", worker]
        if worker not in ("pipe", "pipereplay", "psim", "pmsg"):
            cmd = [sys.executable, str(HERE.parent / "peer_mpi4py_pipeline.py")] + common
        if worker in ("psimhand", "psimhand2"):  # the peer, unmodified, on simulated ranks (threads meet)
            cmd = ["timeout", "-k", "5", "900", sys.executable, "-m", "spmdsim", "mpirun", "-n", ranks] + cmd + [
                "--wait", "busy"]
        if worker == "psim":
            cmd = ["timeout", "-k", "5", "900"] + cmd
    if worker in ("mpi", "mpireplay", "dtensor") + PIPE and worker not in SIMULATED or worker in HAND:
        cmd = ["timeout", "-k", "5", "900", _mpiexec() or "mpiexec", "-n", ranks] + cmd
    if worker in MOE:
        cmd = _moe_command(worker, common, check)
    return cmd, env


def _moe_command(worker: str, common: list, check: int) -> list:
    """--moe's launch of `worker`: spmdsim's MoE step (eager or replayed) on 8 MPI ranks, or replayed on 8
    simulated ones; the hand-written peer on 8 MPI ranks (polite wait) or on 8 simulated ones (blocking)."""
    stop = ["timeout", "-k", "5", "900"]
    if worker in ("moe", "moereplay", "msim"):
        cmd = [sys.executable, str(HERE)] + common + ["--moe"]
        return stop + cmd if worker == "msim" else stop + [_mpiexec() or "mpiexec", "-n", "8"] + cmd
    dp, ep, tp = MOE_MESH
    cmd = [sys.executable, str(HERE.parent / "peer_mpi4py_moe.py")] + common[:-2] + [
        "--dp", str(dp), "--ep", str(ep), "--tp", str(tp), "--experts", str(MOE_EXPERTS), "--check", str(check)]
    if worker in MOE_SIMULATED:
        return stop + [sys.executable, "-m", "spmdsim", "mpirun", "-n", "8"] + cmd + ["--wait", "busy"]
    return stop + [_mpiexec() or "mpiexec", "-n", "8"] + cmd + ["--wait", "polite"]


def _moe(args) -> int:
    """--moe: spmdsim's MoE step, eager and replayed, beside the hand-written one, launch by launch; 1 if their
    collectives a step or step 0's losses differ."""
    if not _mpiexec():
        print("bench_gpt --moe: no mpiexec beside python or on PATH (pip install mpich); the MoE case runs on 8 MPI "
              "ranks", file=sys.stderr)
        return 1
    start = _load()
    rows: dict = {worker: [] for worker in MOE if args.simulated or worker not in MOE_SIMULATED}
    for launch in range(args.launches):
        for worker in rows:
            rows[worker].append(_launch(args, worker, check=int(launch == 0 and worker == "mhand")))
    if not all(all(r) for r in rows.values()):
        return 1
    cfg, n = _moe_config(args), args.launches
    dp, ep, tp = MOE_MESH
    print(f"MoE GPT {args.layers} layers ({sum(map(cfg.is_moe, range(cfg.layers)))} MoE), d_model {args.d_model}, "
          f"seq {args.seq}, batch 8; {cfg.moe.experts} experts, top-{cfg.moe.top_k}, capacity factor "
          f"{cfg.moe.capacity_factor:g}")
    print(f"mesh dp {dp} x ep {ep} x tp {tp} (sequence parallel); {len(os.sched_getaffinity(0))} cores")
    print(f"load average at the start {start} (1, 5, 15 min); {n} launch{'es' if n > 1 else ''} of each run, "
          f"interleaved")
    print(f"{'run':44} {'s/step':>8}  ratio: median of the launches' (min-max)")
    _mpi_rows(rows, "mhand", "mhand2", "moereplay", "moe")
    if args.simulated:
        print("8 simulated ranks (threads of one process; the peer under spmdsim mpirun, blocking calls):")
        for worker, title, base, versus in (("msimhand", "  numpy + mpi4py by hand", None, ""),
                                            ("msimhand2", "  the same again (A/A control)", "msimhand", "by hand"),
                                            ("msim", "  spmdsim, replayed", "msimhand", "by hand")):
            against = rows[base] if base else None
            print(_line(title, rows[worker], "step", against, versus))
            print(_line("    CPU time of its 8 ranks", rows[worker], "cpu", against, versus))
    ours, theirs = rows["moe"][0], rows["mhand"][0]
    same_calls = all(r["calls"] == theirs["calls"] for w in rows for r in rows[w])
    print(f"collectives a step, each rank: spmdsim {ours['calls']} (replayed {rows['moereplay'][0]['calls']}), "
          f"by hand {theirs['calls']} ({'equal' if same_calls else 'DIFFERENT'})")
    return agreement("--moe", ours, rows["moereplay"][0], theirs, same_calls, "parameters")


def _pipeline(args) -> int:
    """--pipeline: spmdsim's pipelined step and the hand-written one, launch by launch; 1 if their bytes or
    losses differ."""
    if not _mpiexec():
        print("bench_gpt --pipeline: no mpiexec beside python or on PATH (pip install mpich); the pipeline case "
              "runs on 4 MPI ranks", file=sys.stderr)
        return 1
    print(f"GPT {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch 8; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"pipeline pp {PP} x dp 1 x tp 1 on {PP} MPI ranks, 1F1B, {args.microbatches} microbatches")
    if args.replay:
        print("spmdsim eager, then again with step 0 captured (spmdsim.runtime.replay), the timed steps replayed")
    # The peer's A/A pair brackets spmdsim's launches, so a drift of the machine's load shows in the pair.
    rows: dict = {worker: [] for worker in PIPE
                  if (args.replay or worker != "pipereplay") and (args.simulated or worker not in SIMULATED)}
    for _ in range(args.launches):
        for worker in rows:
            rows[worker].append(_launch(args, worker))
    if not all(all(r) for r in rows.values()):
        return 1
    n = args.launches
    print(f"{'run':40} {'s/step':>8}  ratio (median of {n} launch{'es' if n > 1 else ''}, spread)")
    print(f"{'numpy + mpi4py by hand, 1F1B':40} {_median(rows['phand'], 'step'):8.3f}")
    print(f"{'the same again (A/A control)':40} {_median(rows['phand2'], 'step'):8.3f}  "
          f"{_ratio(rows['phand2'], rows['phand'], 'step', 'the first')}")
    print(f"{'spmdsim train_pipelined, 1F1B':40} {_median(rows['pipe'], 'step'):8.3f}  "
          f"{_ratio(rows['pipe'], rows['phand'], 'step', 'by hand')}")
    if args.replay:
        print(f"{'spmdsim train_pipelined, 1F1B, replayed':40} {_median(rows['pipereplay'], 'step'):8.3f}  "
              f"{_ratio(rows['pipereplay'], rows['phand'], 'step', 'by hand')}")
        print(f"{'  eager / replayed, the same rounds':40} {'':8}  "
              f"{_ratio(rows['pipe'], rows['pipereplay'], 'step', 'replayed')}")
    print(f"CPU time a step, the {PP} ranks' summed (each from the step's barrier to its end):")
    print(f"{'  numpy + mpi4py by hand':40} {_median(rows['phand'], 'cpu'):8.3f}")
    print(f"{'  the same again (A/A control)':40} {_median(rows['phand2'], 'cpu'):8.3f}  "
          f"{_ratio(rows['phand2'], rows['phand'], 'cpu', 'the first')}")
    print(f"{'  spmdsim eager':40} {_median(rows['pipe'], 'cpu'):8.3f}  "
          f"{_ratio(rows['pipe'], rows['phand'], 'cpu', 'by hand')}")
    if args.replay:
        print(f"{'  spmdsim replayed':40} {_median(rows['pipereplay'], 'cpu'):8.3f}  "
              f"{_ratio(rows['pipereplay'], rows['phand'], 'cpu', 'by hand')}")
        print(f"{'  eager / replayed, CPU':40} {'':8}  "
              f"{_ratio(rows['pipe'], rows['pipereplay'], 'cpu', 'replayed')}")
    if args.simulated:
        print(f"{PP} simulated ranks (threads of one process; the peer under spmdsim mpirun, blocking calls):")
        print(f"{'  by hand on simulated ranks':40} {_median(rows['psimhand'], 'step'):8.3f}")
        print(f"{'  by hand on them again (A/A control)':40} {_median(rows['psimhand2'], 'step'):8.3f}  "
              f"{_ratio(rows['psimhand2'], rows['psimhand'], 'step', 'the first')}")
        print(f"{'  spmdsim replayed on simulated ranks':40} {_median(rows['psim'], 'step'):8.3f}  "
              f"{_ratio(rows['psim'], rows['psimhand'], 'step', 'by hand')}")
    print("point-to-point time a step (posting and waits of each group, summed, the slowest rank):")
    print(f"{'  by hand':40} {_median(rows['phand'], 'messages'):8.3f}")
    print(f"{'  by hand again (A/A control)':40} {_median(rows['phand2'], 'messages'):8.3f}  "
          f"{_ratio(rows['phand2'], rows['phand'], 'messages', 'the first')}")
    print(f"{'  spmdsim (its send/recv trace rows)':40} {_median(rows['pipe'], 'messages'):8.3f}  "
          f"{_ratio(rows['pipe'], rows['phand'], 'messages', 'by hand')}")
    if args.replay:
        print(f"{'  spmdsim replayed (the same rows)':40} {_median(rows['pipereplay'], 'messages'):8.3f}  "
              f"{_ratio(rows['pipereplay'], rows['phand'], 'messages', 'by hand')}")
    replays = rows["pmsg"]
    first = replays[0]
    print(f"messages only: a step's groups replayed, no compute, {first['rounds']} rounds a launch, "
          f"{first['wait']} wait:")
    message_rows(replays, ("raw2", "door", "waitall", "replayed", "rawbound"))
    ours, theirs = rows["pipe"][0], rows["phand"][0]
    same_bytes = ours["p2p_bytes_steps"] == theirs["p2p_bytes_steps"] and \
        all(r["bytes"] == r["planned_bytes"] == ours["p2p_bytes"] for r in replays)
    same_groups = ours["p2p_groups"] == theirs["p2p_groups"] and \
        all(r["groups"] == r["planned_groups"] == ours["p2p_groups"] for r in replays)
    same_messages = all(r["messages"] == theirs["p2p_messages"] for r in replays)
    same_groups = same_groups and all(r["replay_rows_same"] for r in replays)
    print(f"point-to-point groups a step, all ranks: spmdsim {ours['p2p_groups']}, by hand {theirs['p2p_groups']}, "
          f"replayed {first['groups']} ({'equal' if same_groups else 'DIFFERENT'})")
    print(f"point-to-point messages a step, all ranks: by hand {theirs['p2p_messages']}, replayed "
          f"{first['messages']} ({'equal' if same_messages else 'DIFFERENT'})")
    print(f"point-to-point bytes a step, all ranks: spmdsim {ours['p2p_bytes']}, by hand {theirs['p2p_bytes']}, "
          f"replayed {first['bytes']} ({'equal' if same_bytes else 'DIFFERENT'})")
    diff = max(abs(theirs["loss0"] - r["loss0"]) for r in rows["pipe"][:1] + rows.get("pipereplay", [])[:1])
    print(f"step 0 loss: spmdsim {ours['loss0']:.12f}, by hand {theirs['loss0']:.12f}, |diff| {diff:.1e}")
    print(f"step 0 loss: one numpy process {theirs['reference0']:.12f} (the same masks)")
    print(f"by hand, after step 0: gradients within {theirs['grad_error']:.1e} of the one process's")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if not same_bytes:
        print("bench_gpt --pipeline: the point-to-point bytes differ", file=sys.stderr)
    if not (same_groups and same_messages):
        print("bench_gpt --pipeline: the point-to-point groups or messages differ", file=sys.stderr)
    if diff > 1e-10:
        print(f"bench_gpt --pipeline: step 0's losses differ by {diff:.1e}", file=sys.stderr)
    return 0 if same_bytes and same_groups and same_messages and diff <= 1e-10 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--pipeline", action="store_true",
                    help=f"time the pipelined step (pp {PP}, 1F1B) against the same schedule by hand on mpi4py")
    ap.add_argument("--microbatches", type=int, default=None, help="with --pipeline: microbatches a step (8)")
    ap.add_argument("--replay", action="store_true",
                    help="with --pipeline: spmdsim also launched with step 0 captured and replayed for the timed steps")
    ap.add_argument("--moe", action="store_true",
                    help=f"time the MoE GPT's step (dp {MOE_MESH[0]} x ep {MOE_MESH[1]} x tp {MOE_MESH[2]}), eager and "
                    "replayed, against the same step by hand on mpi4py")
    ap.add_argument("--fsdp", action="store_true", help="time the fully sharded step (ZeRO-3, dp 8), eager and "
                    "replayed, against the same step by hand on mpi4py (scripts/_bench_gpt_fsdp.py)")
    ap.add_argument("--context", action="store_true",
                    help="time ring attention's messages (cp 4) against raw mpi4py (scripts/_bench_gpt_context.py)")
    ap.add_argument("--simulated", action="store_true",
                    help="with --pipeline or --moe: also the replayed step and the peer on simulated ranks (threads)")
    ap.add_argument("--worker", choices=("ref", "one", "sim", "simreplay", "mpi", "mpireplay", "pipe", "pipereplay",
                                         "psim", "pmsg", "moe", "moereplay", "msim"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("launches", "steps", "layers", "d_model", "seq", "microbatches"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1")
    if args.microbatches is not None and not args.pipeline:
        ap.error(f"--microbatches {args.microbatches} applies to --pipeline only")
    if args.replay and not args.pipeline:
        ap.error("--replay applies to --pipeline only")
    if args.simulated and not (args.pipeline or args.moe):
        ap.error("--simulated applies to --pipeline and --moe only")
    if args.moe and args.pipeline:
        ap.error("--moe and --pipeline are separate cases: give one")
    if args.pipeline:
        from peer_mpi4py_pipeline import pipeline_args_problem

        args.microbatches = args.microbatches or 8
        problem = pipeline_args_problem(args.layers, PP, args.microbatches)
        if problem:
            ap.error(problem)
    if args.context:  # its own module: the case, its workers and its rows
        from _bench_gpt_context import context_case
        return context_case(args)
    if args.worker:
        _worker(args)
        return 0
    if args.fsdp:
        from _bench_gpt_fsdp import fsdp_case

        return fsdp_case(args)
    if args.pipeline:
        return _pipeline(args)
    if args.moe:
        return _moe(args)
    start = _load()
    peer = missing()
    # Each A/A pair brackets spmdsim's launches of its kind, so a drift of the machine's load shows in the pair.
    rows = {worker: [] for worker in LAUNCHES}
    rows |= {} if peer else {"dtensor": []}
    for launch in range(args.launches):
        for worker in rows:
            check = int(launch == 0 and worker in ("hand", "dtensor"))
            rows[worker].append(_launch(args, AGAIN.get(worker, worker), check=check))
    if not all(any(r) for r in rows.values()):
        return 1
    _report(args, rows, start, peer)
    return 0


#: The launches of a round, in their order (bench_gpt's rows): "ref2", "handsim2" and "hand2" launch "ref",
#: "handsim" and "hand" again, the A/A controls, after the spmdsim launches they are compared with.
LAUNCHES = ("ref", "ref2", "one", "handsim", "simreplay", "sim", "handsim2", "hand", "mpireplay", "mpi", "hand2",
            "busy")
AGAIN = {"ref2": "ref", "handsim2": "handsim", "hand2": "hand"}
def _report(args, rows: dict, start: str, peer: str | None) -> None:
    """bench_gpt's table: each ratio compares two runs on the same engine, the same ranks and the same cores (one
    process; 8 threads of one process; 8 MPI processes), launch by launch: the median over launches of each
    launch's ratio and its min-max."""
    n = args.launches
    print(f"GPT {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch 8; mesh dp 2 x tp 4 "
          f"(sequence parallel); {len(os.sched_getaffinity(0))} cores")
    print(f"load average at the start {start} (1, 5, 15 min); {n} launch{'es' if n > 1 else ''} of each run, "
          f"interleaved")
    print(f"{'run':44} {'s/step':>8}  ratio: median of the launches' (min-max)")
    print(_line("one numpy process", rows["ref"], "step"))
    print(_line("  again (A/A control)", rows["ref2"], "step", rows["ref"], "the first"))
    print(_line("1 simulated rank on a 1 x 1 mesh", rows["one"], "step", rows["ref"], "one process"))
    print("8 simulated ranks (threads of one process):")
    for worker, title, base, versus in (("handsim", "  numpy + mpi4py by hand", "ref", "one process"),
                                        ("handsim2", "  the same again (A/A control)", "handsim", "by hand"),
                                        ("simreplay", "  spmdsim, replayed", "handsim", "by hand"),
                                        ("sim", "  spmdsim", "simreplay", "replayed")):
        print(_line(title, rows[worker], "step", rows[base], versus))
        cpu = "    CPU time of its 8 ranks"  # the threads' own, summed: steadier than the wall on a loaded machine
        print(_line(cpu, rows[worker], "cpu", rows[base] if base != "ref" else None, versus))
    _mpi_rows(rows, "hand", "hand2", "mpireplay", "mpi")
    print("8 MPI ranks, blocking calls:")
    print(_line("  numpy + mpi4py by hand", rows["busy"], "step", rows["hand"], "polite"))
    for key, label in FIGURES:
        print(_line("    " + label, rows["busy"], key, rows["hand"], "polite"))
    checked = rows["hand"][0]
    for k, (loss, ref) in enumerate(zip(checked["losses"], checked["reference"]) if checked else ()):
        print(f"by hand, step {k} loss {loss:.12f}, one process {ref:.12f} (same masks), |diff| {abs(loss - ref):.1e}")
    if checked:
        print(f"by hand, after step 0: gradients within {checked['grad_error']:.1e}, parameters within "
              f"{checked['param_error']:.1e} of the one process's")
    if peer:
        print(peer)
    else:
        print(_line("PyTorch DTensor (gloo, 8 MPI ranks)", rows["dtensor"], "step"))
        print(f"{'  spmdsim on 8 MPI ranks / DTensor':44} {'':8}  {_ratio(rows['mpi'], rows['dtensor'], 'step', '')}")
        print(f"{'  the same, replayed / DTensor':44} {'':8}  "
              f"{_ratio(rows['mpireplay'], rows['dtensor'], 'step', '')}")
        first = rows["dtensor"][0]
        for k, (loss, ref) in enumerate(zip(first["losses"], first["reference"]) if first else ()):
            print(f"DTensor step {k} loss {loss:.12f}, one process {ref:.12f} (same masks), "
                  f"|diff| {abs(loss - ref):.1e}")
    print(f"load average at the end {_load()}")


if __name__ == "__main__":
    sys.exit(run_script(main))
