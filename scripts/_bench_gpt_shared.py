"""What scripts/bench_gpt.py and its cases (scripts/_bench_gpt_pipeline.py, _bench_gpt_moe.py,
_bench_gpt_context.py, _bench_gpt_fsdp.py) share.

The GPT they time (`_config`, `gpt_step`) and its steps timed (`reference_step`, `gpt_steps`), the waits in a
step's collectives (`_arrivals`), a step's message groups timed both ways (`MessageGroups`), a launch's
RESULT line (`_result`) and mpiexec (`_mpiexec`), and the rows of their tables (`agreement`, `message_rows`,
`_mpi_rows`, `_line`, `_ratio`, `_median`). The cases import this module, not bench_gpt.py, which dispatches
to them.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path


def _config(args):
    from spmdsim.models.gpt import GPTConfig

    return GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, dropout=0.1)


def gpt_step(cfg, mesh, kept: str = "graph", fsdp=None) -> tuple:
    """(the GPT of `cfg` on `mesh`, sequence parallel where tp > 1, keeping `kept`'s set for backward; its
    parameters in order; its training step ``train_step(xd, yd, step) -> loss``: forward, backward with
    buckets, AdamW) as every bench here times it. `fsdp`: GPT's (None: off; True: its parameters fully sharded
    over dp, resharded after forward), each unit's gradients then reduce-scattered by its gather's conjugate,
    no buckets."""
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.models.gpt.params import decays, param_specs
    from spmdsim.nn.optim import AdamW

    model = GPT(cfg, mesh, sp=mesh.layout.axis_size("tp") > 1, kept=kept, fsdp=fsdp)
    specs = param_specs(cfg)
    params = [model.params[s.name] for s in specs]
    opt = AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                decay=[model.params[s.name] for s in specs if decays(s)])

    def train_step(xd, yd, step):
        opt.zero_grad()
        loss = model.loss(xd, yd, step)
        loss.backward(bucket=fsdp is None)
        opt.step()
        return loss

    return model, params, train_step


def reference_step(args) -> dict:
    """The one numpy process's step (spmdsim.models.gpt.reference, one BLAS thread): its median seconds."""
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


def gpt_steps(args, comm, mpi: bool, cfg, mesh: tuple, replay: bool = False) -> dict:
    """Time the distributed steps of the GPT of `cfg` on this rank's comm, on a mesh of `mesh` (its shape and
    axis names); with `mpi` (a process per rank), also their collectives after arrival and the CPU time of
    all ranks. `replay`: the warm-up step is captured (spmdsim.runtime.replay) and each timed step replays it."""
    from spmdsim import Layout
    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    ids = encode(load_text())
    walls, inside, waited, arrived, cpus = [], [], [], [], []

    mesh = Mesh(Layout(*mesh), comm)
    model, params, train_step = gpt_step(cfg, mesh)
    graph = None
    for step in range(args.steps + 1):
        x, y = batch(ids, cfg, step)
        xd, yd = (DTensor.from_global(mesh, a, mesh.layout(model.batch, None)) for a in (x, y))
        comm.Barrier()
        # A rank's CPU: its process's on MPI ranks (spmdsim's own threads, if any, included), its thread's
        # on simulated ranks (threads of one process), as the hand-written peer measures its ranks'.
        clock = time.process_time if mpi else time.thread_time
        loss, graph, wall, cpu, trace = timed_step(train_step, (xd, yd, step), params, graph, replay, clock)
        if step == 0:  # spmdsim's dropout masks: the peer's checked step 0 draws the same
            loss0 = float(ops.resolved(loss).local)
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


def timed_step(train_step, inputs: tuple, params, graph, replay: bool, clock) -> tuple:
    """One of a bench's steps, ``train_step(xd, yd, step)`` on `inputs`, timed: eager; or, with `replay`, captured
    (spmdsim.runtime.replay, when `graph` is None) or `graph` replayed. Returns (the step's loss, the graph to
    replay next, wall seconds, `clock`'s seconds, the step's collect_trace)."""
    from spmdsim import collect_trace
    from spmdsim.runtime.replay import Scalar, capture

    xd, yd, step = inputs
    t0, c0 = time.perf_counter(), clock()
    with collect_trace() as trace:
        if not replay:
            loss = train_step(xd, yd, step)
        elif graph is None:
            graph = capture(train_step, xd, yd, Scalar(step), state=params)
            loss = graph.result
        else:
            loss = graph(xd, yd, step)
    return loss, graph, time.perf_counter() - t0, clock() - c0, trace


def _arrivals(mesh, entries) -> tuple[float, float]:
    """Seconds this rank spent in the collectives of trace `entries` (alike on every rank) before their group's
    last member arrived, and after it: scripts/peer_mpi4py_gpt.py's `arrivals`, which measures the peer's
    calls, on spmdsim's (a call on a group of one rank waits for nobody)."""
    from peer_mpi4py_gpt import arrivals

    spans = []
    for e in entries:
        comm, g, _ = mesh.group_info(e.axes)
        if g > 1:
            spans.append((comm, e.started_at, e.ended_at))
    return arrivals(spans)


class MessageGroups:
    """A step's message groups on `group`, the axes `axes` of `mesh`: each (receives, sends) of (buffer, peer, tag),
    made from `plan`'s (bytes, peer, tag), timed by `clock` through spmdsim's door as `label` (`door`; `step`
    posts them untimed, for a caller to capture) and on raw mpi4py (`raw`), on the same buffers. `free`: the
    raw way's bound requests freed."""

    def __init__(self, mesh, group, axes: tuple, plan: list, label: str, clock) -> None:
        import numpy as np

        from spmdsim.base import buffers
        from spmdsim.runtime.door import messages

        self.mesh, self.group, self.axes, self.label, self.clock = mesh, group, axes, label, clock
        self.polite = mesh.polite
        self.groups = [([(buffers.empty(n // 8, np.float64), peer, tag) for n, peer, tag in receives],
                        [(np.full(n // 8, 1.0), peer, tag) for n, peer, tag in sends]) for receives, sends in plan]
        self.described = [messages(group, axes, receives, sends) for receives, sends in self.groups]
        self.bound = [[group.Recv_init(buf, peer, tag) for buf, peer, tag in receives]
                      + [group.Send_init(buf, peer, tag) for buf, peer, tag in sends]
                      for receives, sends in self.groups]

    def door(self) -> float:
        """Seconds the groups take through spmdsim's door (each group's span summed)."""
        from spmdsim.runtime.door import point_to_point

        spent, clock = 0.0, self.clock
        for (receives, sends), known in zip(self.groups, self.described):
            t0 = clock()
            point_to_point(self.mesh, self.group, self.axes, receives, sends, self.label, known)
            spent += clock() - t0
        return spent

    def step(self) -> None:
        """The groups through spmdsim's door, untimed."""
        from spmdsim.runtime.door import point_to_point

        for (receives, sends), known in zip(self.groups, self.described):
            point_to_point(self.mesh, self.group, self.axes, receives, sends, self.label, known)

    def raw(self, waitall: bool = False, persistent: bool = False) -> float:
        """Seconds the groups take on raw mpi4py: each group's requests posted (`persistent`: its bound ones
        started by Prequest.Startall), then waited as spmdsim waits (the peer's polite Test() polling on a polite
        mesh, else Wait) or by Request.Waitall (`waitall`)."""
        from mpi4py import MPI

        from _peer_mpi4py_step import _polite

        spent, clock, group = 0.0, self.clock, self.group
        for i, (receives, sends) in enumerate(self.groups):
            t0 = clock()
            if persistent:
                requests = self.bound[i]
                MPI.Prequest.Startall(requests)
            else:
                requests = [group.Irecv(buf, peer, tag) for buf, peer, tag in receives]
                requests += [group.Isend(buf, peer, tag) for buf, peer, tag in sends]
            if waitall:
                MPI.Request.Waitall(requests)
            else:
                for request in requests:
                    _polite(request) if self.polite else request.Wait()
            spent += clock() - t0
        return spent

    def timed_rounds(self, comm, ways: dict, order: tuple, rounds: int) -> tuple[dict, dict, int]:
        """Time `ways` (name -> a function giving this rank's seconds) and "replayed" (`step` captured once,
        untimed, with spmdsim.runtime.replay, then its graph replayed, timed whole), each way in `order`, the
        order turning by a way each round, after a barrier; round -1 runs each way once, untimed. Returns the
        median over `rounds` rounds of each way's time (the slowest rank's) and of its ratio to "raw" in the same
        round (`<way>_ratio`); the point-to-point rows (op, bytes sent, received) the door's and the replay's
        untimed rounds traced; and how many trace rows the capture made. The graph's bound requests are freed on
        return, before a caller frees this object's."""
        from mpi4py import MPI

        from spmdsim import collect_trace
        from spmdsim.runtime.replay import capture

        def replayed() -> float:
            t0 = self.clock()
            graph()
            return self.clock() - t0

        timed = dict(ways, replayed=replayed)
        times: dict = {way: [] for way in order}
        rows: dict = {}
        with collect_trace() as trace:
            graph = capture(self.step)  # posts the step's groups once, as the door binds them (untimed)
            mark = captured = len(trace.entries)
            for r in range(-1, rounds):
                for way in order[r % len(order):] + order[:r % len(order)]:
                    comm.Barrier()
                    spent = comm.allreduce(timed[way](), op=MPI.MAX)
                    if r >= 0:
                        times[way].append(spent)
                    elif way in ("door", "replayed"):
                        rows[way] = [(e.op, e.bytes_sent, e.bytes_received) for e in trace.entries[mark:]
                                     if e.op in P2P]
                    mark = len(trace.entries)
        graph = timed = None  # the graph's bound requests freed before the communicators
        out = {way: statistics.median(times[way]) for way in order}
        for way in order[1:]:
            out[way + "_ratio"] = statistics.median(t / base for t, base in zip(times[way], times["raw"]))
        return out, rows, captured

    def free(self) -> None:
        for requests in self.bound:
            for request in requests:
                request.Free()


#: The trace's point-to-point rows (spmdsim.runtime.door.point_to_point).
P2P = ("send", "recv", "sendrecv")


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _result(worker: str, code: int, out: str, err: str, case: str = "") -> dict | None:
    """The result a launch of `worker` printed (its `RESULT {json}` line), else None and one line saying so
    (`case`: the case's flag, " --context", in that line)."""
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"bench_gpt{case}: the {worker} worker failed (exit {code}): "
          f"{(err.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
    return None


def agreement(case: str, ours: dict, replayed: dict, theirs: dict, same_calls: bool, held: str) -> int:
    """The lines that say a case's spmdsim step (eager `ours`, `replayed`) and its peer by hand (`theirs`) agree:
    step 0's losses beside one numpy process's, the peer's `held` (its parameters or shards) after step 0;
    0, or 1 and a line saying what differs (the calls a step: `same_calls`; the losses: over 1e-10)."""
    diff = max(abs(theirs["losses"][0] - r["loss0"]) for r in (ours, replayed))
    print(f"step 0 loss: spmdsim {ours['loss0']:.12f} (eager and replayed), by hand {theirs['losses'][0]:.12f}, "
          f"|diff| {diff:.1e}")
    print(f"step 0 loss: one numpy process {theirs['reference'][0]:.12f} (the same masks)")
    print(f"by hand, after step 0: gradients within {theirs['grad_error']:.1e}, {held} within "
          f"{theirs['param_error']:.1e} of the one process's")
    print(f"load average at the end {_load()}")
    if not same_calls:
        print(f"bench_gpt {case}: the collectives a step differ", file=sys.stderr)
    if diff > 1e-10:
        print(f"bench_gpt {case}: step 0's losses differ by {diff:.1e}", file=sys.stderr)
    return 0 if same_calls and diff <= 1e-10 else 1


def _mpiexec() -> str:
    """The venv's mpiexec (the pip `mpich` wheel), else the one on PATH, else ""."""
    import shutil

    beside = str(Path(sys.executable).parent / "mpiexec")
    return beside if os.access(beside, os.X_OK) else (shutil.which("mpiexec") or "")


#: The messages-only rows (message_rows): each way's label and what its ratio is against.
MESSAGE_WAYS = {"raw2": ("  raw again (A/A control)", "the first"),
                "door": ("  spmdsim runtime.door.point_to_point", "raw"),
                "waitall": ("  raw mpi4py, Request.Waitall", "raw"),
                "replayed": ("  spmdsim, the door's calls replayed", "raw"),
                "rawbound": ("  raw mpi4py Send_init/Recv_init", "raw")}


def message_rows(replays: list, ways: tuple) -> None:
    """The messages-only table: raw mpi4py's seconds, then each of `ways` (MESSAGE_WAYS), its seconds and its
    median ratio (spread) over the launches' `replays`."""
    print(f"{'  raw mpi4py Irecv/Isend, the same wait':40} {_median(replays, 'raw'):8.5f}")
    for way in ways:
        label, versus = MESSAGE_WAYS[way]
        ratios = [r[way + "_ratio"] for r in replays]
        print(f"{label:40} {_median(replays, way):8.5f}  {statistics.median(ratios):5.2f}x {versus} "
              f"({_spread(ratios)})")


def _spread(values: list) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def _ratio(rows: list, base: list, key: str, versus: str) -> str:
    """The median over launches of each launch's ratio of `key` to the base launch's, and their spread (launches
    where either failed left out)."""
    ratios = [r[key] / b[key] for r, b in zip(rows, base) if r and b]
    return f"{statistics.median(ratios):5.2f}x {versus} ({_spread(ratios)})".replace("x  (", "x (")


def _median(rows: list, key: str) -> float:
    return statistics.median(r[key] for r in rows if r)


#: The MPI launches' figures under their step row.
FIGURES = (("collectives", "its collectives"), ("waited", "waiting for a later member"),
           ("arrived", "after the last member arrived"),
           ("cpu", "CPU time of its 8 ranks"))


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _line(label: str, rows: list, key: str, base: list | None = None, versus: str = "") -> str:
    """One row: the median over launches of `key`, and with `base`, the median and spread of each launch's ratio."""
    text = f"{label:44} {_median(rows, key):8.3f}"
    return text + f"  {_ratio(rows, base, key, versus)}" if base is not None else text


def _mpi_rows(rows: dict, hand: str, again: str, replayed: str, eager: str) -> None:
    """The 8 MPI ranks' rows, each with its figures: the peer, the peer again (A/A), spmdsim replayed / the
    peer, spmdsim eager / replayed (the launches named by those workers)."""
    print("8 MPI ranks (mpiexec), polite wait:")
    for worker, title, base, versus in ((hand, "  numpy + mpi4py by hand", None, ""),
                                        (again, "  the same again (A/A control)", hand, "by hand"),
                                        (replayed, "  spmdsim, replayed", hand, "by hand"),
                                        (eager, "  spmdsim", replayed, "replayed")):
        against = rows[base] if base else None
        print(_line(title, rows[worker], "step", against, versus))
        for key, label in FIGURES:
            print(_line("    " + label, rows[worker], key, against, versus))
