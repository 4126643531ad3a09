"""spmdsim.models.gpt's pipelined training step (1F1B) written by hand in numpy and mpi4py: bench_gpt --pipeline's peer.

    OMP_NUM_THREADS=1 timeout -k 5 600 mpiexec -n 4 python scripts/peer_mpi4py_pipeline.py   # pp 4, 8 microbatches
    OMP_NUM_THREADS=1 timeout -k 5 600 mpiexec -n 4 python scripts/peer_mpi4py_pipeline.py --steps 5 --wait busy

The work of ``train_pipelined(cfg, comm, pp, 1, 1, ..., schedule="1f1b")`` (spmdsim.models.gpt.pipeline, tp 1 and dp
1), with no spmdsim in the step: rank s is stage s and holds its layers (balanced, the first stages one more where
they do not divide), stage 0 also the embedding, the last stage the final LayerNorm and the tied head with its own
copy of wte. A step splits the batch into --microbatches and runs Megatron's non-interleaved 1F1B: pp - s - 1
warm-up forwards, then one forward and one backward in turn, then the remaining backwards; the activations (rows x
d_model, float64) go to the next stage and their gradients back, each boundary's messages posted together (receives
first, then sends, ``Irecv``/``Isend``) and waited for, as Megatron's send_forward_recv_backward and spmdsim's
executor post them. Each stage's math is spmdsim.models.gpt._blocks' numpy (the one-process reference's blocks); the
loss of each microbatch is scaled by 1/m and the gradients summed over the microbatches in flat buffers. After the
flush the first and last stage add their wte gradients by one exchange (Megatron's embedding group), every stage
runs AdamW (torch's semantics, decaying the 2-d weights) over its flat buffers, and the last stage's loss goes to
every rank (one ``Allreduce``), as spmdsim's step ends.

Step 0 uses spmdsim's dropout masks (spmdsim.models.gpt.params, microbatch by microbatch) and is checked: rank 0
prints its loss beside the one-process reference's and how far its gradients are from the reference's. It is also
the warm-up; the timed steps 1..--steps draw masks from numpy's generator, seeded by (seed, step, stage,
microbatch), at the same rate. A step is timed from a barrier to the barrier after it (the slowest rank), its CPU
time from that barrier to the end of the step (before the next barrier), summed over the ranks; the point-to-point
bytes are the send buffers' bytes summed over the ranks. Waiting: ``busy`` makes blocking waits, ``polite`` polls
each request's Test() as spmdsim.runtime.engines.wait does, ``auto`` (the default) decides as spmdsim does. Rank 0
prints the figures and a ``RESULT {json}`` line (scripts/bench_gpt.py reads it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

HERE = Path(__file__).resolve()
for _folder in (HERE.parent, HERE.parents[1]):  # the step beside this file, spmdsim above it: from anywhere
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from _peer_adamw import adamw_flat, flat_state  # noqa: E402
from _peer_mpi4py_step import _polite, _tight_timer_slack  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

__all__ = ["Stage", "layer_counts", "pipeline_args_problem", "main"]

_ACT, _GRAD, _TIE = 0, 1, 2  # message tags


def layer_counts(layers: int, pp: int) -> list[int]:
    """Layers per stage: balanced, the first stages one more where they do not divide (spmdsim.models.gpt.stages)."""
    base, extra = divmod(layers, pp)
    return [base + (s < extra) for s in range(pp)]


def pipeline_args_problem(layers: int, pp: int, microbatches: int, batch: int = 8) -> Optional[str]:
    """Why the pipeline cannot run (one line), or None; counts are checked >= 1 by the caller."""
    if layers < pp:
        return f"--layers {layers} cannot fill {pp} pipeline stages: each stage needs a layer at least"
    if batch % microbatches:
        return f"--microbatches {microbatches} must divide the batch of {batch} samples"
    return None


class Stage:
    """One stage's parameters and optimizer state in flat buffers, its cells and its 1F1B step."""

    def __init__(self, cfg: Any, world: Any, pp: int, microbatches: int, params: dict, polite: bool) -> None:
        from spmdsim.models.gpt.params import param_specs

        self.cfg, self.world, self.pp, self.m, self.polite = cfg, world, pp, microbatches, polite
        self.s = s = world.rank
        counts = layer_counts(cfg.layers, pp)
        self.layers = range(sum(counts[:s]), sum(counts[:s + 1]))
        self.first, self.last = s == 0, s == pp - 1
        held = [n for n in (spec.name for spec in param_specs(cfg)) if self._holds(n)]
        order = sorted(held, key=lambda n: params[n].ndim < 2)  # the decaying 2-d weights first
        sizes = [params[n].size for n in order]
        self.n_decay = sum(sz for n, sz in zip(order, sizes) if params[n].ndim >= 2)
        self.theta, self.grad, self.mom, self.vel, self.p, self.g = flat_state(params, order)
        self.micro = cfg.batch // microbatches
        self.rows = self.micro * cfg.seq  # an activation's rows: (sample, position)
        self.steps, self.sent_bytes, self.waited = 0, 0, 0.0
        self.groups = self.messages = 0  # message groups posted, messages sent (since the last reset)

    def _holds(self, name: str) -> bool:
        if name == "wte":
            return self.first or self.last
        if name == "wpe":
            return self.first
        if name.startswith("lnf."):
            return self.last
        return int(name[1:name.index(".")]) in self.layers

    # -- messages ------------------------------------------------------------------------------------

    def _exchange(self, receives: list, sends: list) -> None:
        """Post the receives, then the sends ((buffer, peer, tag) each), and complete them all.

        `waited` sums the span spmdsim's trace row of a point-to-point call covers
        (spmdsim.runtime.door.point_to_point): from before the first post to after the last wait and the
        byte count."""
        if not receives and not sends:
            return
        t0 = time.perf_counter()
        requests = [self.world.Irecv(buf, peer, tag) for buf, peer, tag in receives]
        requests += [self.world.Isend(buf, peer, tag) for buf, peer, tag in sends]
        for request in requests:
            if self.polite:
                _polite(request)
            else:
                request.Wait()
        self.sent_bytes += sum(buf.nbytes for buf, _, _ in sends)
        self.waited += time.perf_counter() - t0
        self.groups += 1
        self.messages += len(sends)

    def _act_buffer(self) -> np.ndarray:
        return np.empty((self.rows, self.cfg.d_model))

    # -- cells ---------------------------------------------------------------------------------------

    def _forward(self, i: int, h: Optional[np.ndarray], x: np.ndarray, y: np.ndarray, drop: Callable) -> Any:
        """Microbatch i's forward through this stage: its output activation (the last stage: its scaled loss)."""
        from spmdsim.models.gpt import _blocks as blk

        cfg, p, B = self.cfg, self.p, self.micro
        rows = slice(i * B, (i + 1) * B)
        if self.first:
            ids = x[rows]
            h = drop(p["wte"][ids] + p["wpe"][None], "emb").reshape(self.rows, cfg.d_model)
        caches = []
        for layer in self.layers:
            h, cache = blk.block_forward(p, f"h{layer}.", h, B, cfg, drop)
            caches.append(cache)
        self.caches[i] = caches
        if not self.last:
            return np.ascontiguousarray(h)
        hf, lnf = blk.layer_norm(h, p["lnf.w"], p["lnf.b"], cfg.ln_eps)
        out = hf @ p["wte"].T
        targets = y[rows].reshape(-1)
        n = np.arange(out.shape[0])
        top = out.max(axis=1, keepdims=True)
        lse = top + np.log(np.exp(out - top).sum(axis=1, keepdims=True))
        loss = float(np.mean(lse[:, 0] - out[n, targets]))
        dlogits = np.exp(out - lse)
        dlogits[n, targets] -= 1.0
        dlogits *= 1.0 / (out.shape[0] * self.m)  # the mean over its tokens, scaled by 1/m
        self.heads[i] = (dlogits, hf, lnf)
        return loss / self.m

    def _backward(self, i: int, dh: Optional[np.ndarray], x: np.ndarray, undrop: Callable) -> Optional[np.ndarray]:
        """Microbatch i's backward through this stage (gradients summed in), the gradient of its input."""
        from spmdsim.models.gpt import _blocks as blk

        cfg, p, g = self.cfg, self.p, self.g
        grads: dict = {}
        if self.last:
            dlogits, hf, lnf = self.heads.pop(i)
            g["wte"] += dlogits.T @ hf
            dh, dw, db = blk.layer_norm_backward(dlogits @ p["wte"], lnf)
            g["lnf.w"] += dw
            g["lnf.b"] += db
        caches = self.caches.pop(i)
        for layer, cache in zip(reversed(self.layers), reversed(caches)):
            dh = blk.block_backward(p, f"h{layer}.", dh, cache, cfg, undrop, grads)
        for name, value in grads.items():
            g[name] += value
        if not self.first:
            return np.ascontiguousarray(dh)
        B, ids = self.micro, x[i * self.micro:(i + 1) * self.micro]
        dh0 = undrop(dh, "emb").reshape(B, cfg.seq, cfg.d_model)
        g["wpe"] += dh0.sum(axis=0)
        np.add.at(g["wte"], ids.reshape(-1), dh0.reshape(-1, cfg.d_model))
        return None

    # -- the step ------------------------------------------------------------------------------------

    def step(self, x: np.ndarray, y: np.ndarray, masks: Callable[[int], tuple]) -> float:
        """One 1F1B step on the batch's ids x, y; masks(i) -> (drop, undrop) of microbatch i. The loss, on
        every rank."""
        from mpi4py import MPI

        s, pp, m = self.s, self.pp, self.m
        prev, nxt = s - 1, s + 1
        self.grad[...] = 0.0
        self.caches, self.heads = {}, {}
        drops = [masks(i) for i in range(m)]
        losses = []

        def recv_forward() -> Optional[np.ndarray]:
            if self.first:
                return None
            buf = self._act_buffer()
            self._exchange([(buf, prev, _ACT)], [])
            return buf

        def forward(i: int, h: Optional[np.ndarray]) -> Optional[np.ndarray]:
            out = self._forward(i, h, x, y, drops[i][0])
            if self.last:
                losses.append(out)
                return None
            return out

        def backward(i: int, dh: Optional[np.ndarray]) -> Optional[np.ndarray]:
            return self._backward(i, dh, x, drops[i][1])

        warm = min(pp - s - 1, m)
        steady = m - warm
        f = b = 0
        for _ in range(warm):
            out = forward(f, recv_forward())
            f += 1
            self._exchange([], [(out, nxt, _ACT)])
        h = recv_forward() if steady else None
        for k in range(steady):
            out = forward(f, h)
            f += 1
            dh = None
            if not self.last:  # send_forward_recv_backward
                dh = self._act_buffer()
                self._exchange([(dh, nxt, _GRAD)], [(out, nxt, _ACT)])
            dx = backward(b, dh)
            b += 1
            if k == steady - 1:  # send_backward
                if not self.first:
                    self._exchange([], [(dx, prev, _GRAD)])
            elif not self.first:  # send_backward_recv_forward
                h = self._act_buffer()
                self._exchange([(h, prev, _ACT)], [(dx, prev, _GRAD)])
        for _ in range(warm):  # cool-down: recv_backward, backward, send_backward
            dh = self._act_buffer()
            self._exchange([(dh, nxt, _GRAD)], [])
            dx = backward(b, dh)
            b += 1
            if not self.first:
                self._exchange([], [(dx, prev, _GRAD)])
        if pp > 1 and (self.first or self.last):  # the embedding group: the tied table's two gradients added
            theirs = np.empty_like(self.g["wte"])
            self._exchange([(theirs, pp - 1 - s, _TIE)], [(self.g["wte"], pp - 1 - s, _TIE)])
            self.g["wte"] += theirs
        self._adamw()
        total = np.array([sum(losses)], dtype=np.float64)  # 0.0 on the stages without the loss
        self.world.Allreduce(MPI.IN_PLACE, total)
        return float(total[0])

    def _adamw(self) -> None:
        self.steps += 1
        adamw_flat(self.cfg, self.steps, self.theta, self.grad, self.mom, self.vel, self.n_decay)


def _masks(cfg: Any, step: int, stage: int, microbatches: int, own: bool) -> Callable[[int], tuple]:
    """masks(i) -> (drop, undrop) of microbatch i: spmdsim's (own=False) or numpy's generator's, drawn at first
    use and kept for the backward."""
    from spmdsim.models.gpt.params import dropout_shape, dropout_tensor

    q, size = 1.0 - cfg.dropout, cfg.batch // microbatches

    def make(i: int) -> tuple:
        if not cfg.dropout:
            same = (lambda a, site: a)
            return same, same
        keep: dict = {}
        rng = np.random.default_rng((cfg.seed, step, stage, i)) if own else None

        def drop(a: np.ndarray, site: str) -> np.ndarray:
            mask = keep.get(site)
            if mask is None:
                u = rng.random(dropout_shape(cfg, site, size)) if own else \
                    dropout_tensor(cfg, step, site, size, i).full()
                mask = keep[site] = (u >= cfg.dropout) / q
            return a * mask.reshape(a.shape)

        return drop, drop

    return make


def _checked(cfg: Any, world: Any, stage: Stage, loss: float, x: np.ndarray, y: np.ndarray) -> dict:
    """Rank 0: step 0's loss beside the one-process reference's (the same microbatches and masks), and the
    largest gradient difference relative to each tensor's largest entry (every stage's, gathered)."""
    mine = {n: v.copy() for n, v in stage.g.items()}
    everyone = world.gather(mine, root=0)
    if world.rank != 0:
        return {}
    from spmdsim.base.threads import blas_threads
    from spmdsim.models.gpt.reference import init_params, loss_and_grads

    params, m, size = init_params(cfg), stage.m, cfg.batch // stage.m
    ref_loss, ref_grads = 0.0, {}
    with blas_threads(1):
        for i in range(m):
            part, grads = loss_and_grads(params, x[i * size:(i + 1) * size], y[i * size:(i + 1) * size], cfg, 0,
                                         micro=i)
            ref_loss += part / m
            for name, value in grads.items():
                ref_grads[name] = value / m if i == 0 else ref_grads[name] + value / m
    floor = max(float(np.max(np.abs(a))) for a in ref_grads.values())  # a gradient zero but for rounding
    worst = 0.0
    for got in everyone:
        for name, value in got.items():
            scale = max(float(np.max(np.abs(ref_grads[name]))), floor)
            worst = max(worst, float(np.max(np.abs(value - ref_grads[name]))) / scale)
    return {"loss0": loss, "reference0": ref_loss, "grad_error": worst}


def run(args: argparse.Namespace, cfg: Any, polite: bool) -> dict:
    """Check step 0, time steps 1..--steps on this rank; rank 0's figures (others: {})."""
    from mpi4py import MPI

    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim.models.gpt.reference import init_params

    world = MPI.COMM_WORLD
    if polite:
        _tight_timer_slack()
    stage = Stage(cfg, world, world.size, args.microbatches, init_params(cfg), polite)
    ids = encode(load_text())
    x, y = batch(ids, cfg, 0)
    world.Barrier()
    loss = stage.step(x, y, _masks(cfg, 0, stage.s, args.microbatches, own=False))
    result = _checked(cfg, world, stage, loss, x, y)
    walls, waits, sent, groups, messages, cpus = [], [], [], [], [], []
    world.Barrier()
    for k in range(1, args.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        stage.sent_bytes, stage.waited, stage.groups, stage.messages = 0, 0.0, 0, 0
        x, y = batch(ids, cfg, k)
        last = stage.step(x, y, _masks(cfg, k, stage.s, args.microbatches, own=True))
        cpu = time.process_time() - c0  # the step's CPU, not the barrier's (MPICH's blocking Barrier spins)
        world.Barrier()
        walls.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        cpus.append(world.allreduce(cpu))
        waits.append(world.allreduce(stage.waited, op=MPI.MAX))
        sent.append(world.allreduce(stage.sent_bytes))
        groups.append(world.allreduce(stage.groups))
        messages.append(world.allreduce(stage.messages))
    if world.rank != 0:
        return {}
    return dict(result, step=statistics.median(walls), messages=statistics.median(waits),
                cpu=statistics.median(cpus), p2p_bytes=sent[-1],
                p2p_bytes_steps=sent, p2p_groups=groups[-1], p2p_messages=messages[-1], last_loss=last,
                wait="polite" if polite else "busy")


def main(argv: Optional[list[str]] = None) -> int:
    """Parse, check (one line when it cannot run), then run; rank 0 prints the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the checked warm-up step 0")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--wait", choices=("busy", "polite", "auto"), default="auto",
                    help="blocking waits, or each request's Test() polled politely (auto: as spmdsim decides)")
    args = ap.parse_args(argv)
    for name in ("steps", "layers", "d_model", "seq", "microbatches"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least 1")
    from mpi4py import MPI

    from spmdsim.runtime.engines.wait import resolve_wait_mode
    from spmdsim.errors import SpmdsimError
    from spmdsim.models.gpt import GPTConfig

    world = MPI.COMM_WORLD
    problem = pipeline_args_problem(args.layers, world.size, args.microbatches)
    cfg = None
    if problem is None:
        try:
            cfg = GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8,
                            dropout=args.dropout)
        except SpmdsimError as e:
            problem = str(e)
    if problem:  # every rank sees the same arguments: all stop alike
        if world.rank == 0:
            print(f"peer_mpi4py_pipeline: {problem}", file=sys.stderr)
        return 2
    result = run(args, cfg, resolve_wait_mode(args.wait, world) == "polite")
    if result:
        print(f"numpy + mpi4py, {world.size} ranks (pp {world.size}, 1F1B, {args.microbatches} microbatches), "
              f"float64, {result['wait']} wait")
        print(f"step 0 loss {result['loss0']:.12f}, one numpy process {result['reference0']:.12f} (same dropout "
              f"masks), |diff| {abs(result['loss0'] - result['reference0']):.1e}; gradients within "
              f"{result['grad_error']:.1e} of the one process's")
        print(f"training step {result['step']:.3f} s, messages {result['messages']:.3f} s, point-to-point "
              f"{result['p2p_bytes']} bytes in {result['p2p_messages']} messages, {result['p2p_groups']} groups "
              f"(median of {args.steps} after the warm-up, slowest rank)")
        print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
