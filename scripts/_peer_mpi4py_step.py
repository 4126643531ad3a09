"""spmdsim.models.gpt's GPT training step written by hand in numpy and mpi4py, with no spmdsim: one rank's replica.

The same model, mesh and splits as spmdsim.models.gpt.parallel (GPT(cfg, mesh, sp=True)
on Layout((dp, tp), ("dp", "tp"))), written as an expert writes Megatron's
sequence-parallel step straight on mpi4py: COMM_WORLD ``Split`` into a tp and a
dp communicator (rank = d * tp + t); the activations sequence-first, rows
(position, sample) as Megatron's [s, b, h], so every sequence shard is one
contiguous block and no collective packs or unpacks; each rank holds its shards
only (wte and the sequence's wpe rows split over tp, q/k/v and w1 columns, wo and
w2 rows). Per step, on 2-d activations:

- vocab-parallel embedding: each rank looks up the ids in its vocabulary
  rows, ``Reduce_scatter_block`` onto the sequence, adds its wpe rows;
- per block: LayerNorm on the sequence shard, ``Allgather``, column-parallel
  q/k/v (its heads), causal attention, row-parallel wo and ``Reduce_scatter_block``,
  the residual; the same for the MLP (w1, tanh-GELU, w2);
- final LayerNorm, ``Allgather``, the tied head's logits on its vocabulary
  columns, Megatron's vocab-parallel cross-entropy (``Allreduce`` MAX of each
  row's largest logit, one ``Allreduce`` of the exp-sums and target logits,
  the loss summed over dp);
- the backward mirrors it (each Allgather's backward a Reduce_scatter_block and
  the other way round), gradients written into one flat buffer;
- gradients summed in two ``Allreduce`` calls, in place: over dp for the
  split weights, over all ranks for the replicated ones (LayerNorms, bo, b2:
  each tp rank saw its sequence shard), as spmdsim's bucketed backward does;
- AdamW (torch's semantics, decaying the 2-d weights) fused over the flat
  parameter, moment and gradient buffers.

That is spmdsim's collective sequence call for call (41 a step at 4 layers).
``Comms(polite=True)`` posts the nonblocking call (Iallreduce, ...) and polls
Test() with spmdsim.runtime.engines.wait's discipline (sched_yield for 1 ms, then sleeps
growing from 20 to 100 us under 1 us timer slack); with False, the blocking call.
Each call's time (post and wait) is summed in ``Comms.seconds``.
scripts/peer_mpi4py_gpt.py sets it up, checks it and times it.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Optional

import numpy as np

from _peer_adamw import adamw_flat, flat_state

__all__ = ["Comms", "Dropout", "Replica", "split_dim", "shard"]

_GELU_C = math.sqrt(2.0 / math.pi)
# spmdsim.runtime.engines.wait's polite wait: sched_yield between Test() polls for _YIELD_S, then sleeps
# growing from _SLEEP_MIN_S to _SLEEP_MAX_S, and on to _LONG_SLEEP_MAX_S once they have lasted _LONG_S
# (tests/test_peer_mpi4py_gpt.py keeps them equal).
_YIELD_S = 1000e-6
_SLEEP_MIN_S = 20e-6
_SLEEP_MAX_S = 100e-6
_LONG_S = 10e-3
_LONG_SLEEP_MAX_S = 1000e-6


def _polite(request: Any) -> None:
    """Complete `request` without spinning: Test() with sched_yield between polls, then with sleeps."""
    test, clock = request.Test, time.perf_counter
    deadline = clock() + _YIELD_S
    while not test():
        if clock() > deadline:
            delay, long_after = _SLEEP_MIN_S, clock() + _LONG_S
            while not test():
                time.sleep(delay)
                delay = min(2.0 * delay, _LONG_SLEEP_MAX_S if clock() > long_after else _SLEEP_MAX_S)
            return
        os.sched_yield()


class Comms:
    """The step's communicators (tp, dp, world) and its three MPI calls, each timed on this rank."""

    def __init__(self, world: Any, dp: int, tp: int, polite: bool) -> None:
        d, t = divmod(world.rank, tp)
        self.world, self.polite = world, polite
        self.tp = world.Split(d, t)  # one replica's tensor-parallel ranks, in t order
        self.dp = world.Split(t, d)  # the ranks holding the same shards, in d order
        self.seconds = 0.0  # inside MPI calls since the last reset
        self.spans: list = []  # (comm, start, end) per call

    def _call(self, comm: Any, name: str, *args: Any) -> None:
        t0 = time.perf_counter()
        if self.polite:
            if not _SLACK[0]:
                _tight_timer_slack()
            _polite(getattr(comm, "I" + name.lower())(*args))
        else:
            getattr(comm, name)(*args)
        t1 = time.perf_counter()
        self.seconds += t1 - t0
        self.spans.append((comm, t0, t1))

    def allgather(self, comm: Any, x: np.ndarray) -> np.ndarray:
        """The members' blocks stacked along dim 0, in rank order."""
        out = np.empty((x.shape[0] * comm.size,) + x.shape[1:])
        self._call(comm, "Allgather", x, out)
        return out

    def reduce_scatter(self, comm: Any, x: np.ndarray) -> np.ndarray:
        """The members' sum of x, this rank's block of dim 0."""
        out = np.empty((x.shape[0] // comm.size,) + x.shape[1:])
        self._call(comm, "Reduce_scatter_block", x, out)
        return out

    def allreduce(self, comm: Any, x: np.ndarray, op: Any = None) -> np.ndarray:
        """x summed (or reduced by `op`) over the members, in place."""
        from mpi4py import MPI

        self._call(comm, "Allreduce", MPI.IN_PLACE, x, MPI.SUM if op is None else op)
        return x


_SLACK = [False]


def _tight_timer_slack() -> None:
    """1 us timer slack, so the polite wait's 20-100 us sleeps stay short (as spmdsim asks Linux)."""
    _SLACK[0] = True
    try:
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns
    except (OSError, AttributeError):
        pass


def split_dim(name: str) -> Optional[int]:
    """The dim a parameter is split on over tp (Megatron's plan with sequence parallelism), None if whole."""
    leaf = name.rsplit(".", 1)[-1]
    if name in ("wte", "wpe") or leaf in ("wo", "w2", "bq", "bv", "b1"):
        return 0
    return 1 if leaf in ("wq", "wk", "wv", "w1") else None


def shard(name: str, full: np.ndarray, t: int, tp: int) -> np.ndarray:
    """Tensor-parallel rank t's block of parameter `name` (whole: a copy)."""
    dim = split_dim(name)
    if dim is None:
        return full.copy()
    n = full.shape[dim] // tp
    return np.ascontiguousarray(full.take(range(t * n, (t + 1) * n), axis=dim))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple:
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    return xhat * w + b, (xhat, rstd, w)


def _layer_norm_back(dy: np.ndarray, cache: tuple, dw: np.ndarray, db: np.ndarray) -> np.ndarray:
    """dx; the weight's and bias's gradients into dw, db."""
    xhat, rstd, w = cache
    dxhat = dy * w
    np.sum(dy * xhat, axis=0, out=dw)
    np.sum(dy, axis=0, out=db)
    return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


def _gelu(z: np.ndarray) -> tuple:
    t = np.tanh(_GELU_C * (z + 0.044715 * z * z * z))
    return 0.5 * z * (1.0 + t), t


def _gelu_back(dm: np.ndarray, z: np.ndarray, t: np.ndarray) -> np.ndarray:
    du = _GELU_C * (1.0 + 3 * 0.044715 * z * z)
    return dm * (0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * du)


class Dropout:
    """Each site's scaled keep mask in this rank's layout, drawn on first use in a step and reused backward.

    Args:
        draw: ``draw(site, shape) -> uniform [0, 1) numbers``; shape (B/dp, T/tp, D) for "emb" and the
            residuals (batch-first, as spmdsim.models.gpt.params orders a mask), (B/dp, H/tp, T, T) for "attn".
    """

    def __init__(self, p: float, draw: Callable[[str, tuple], np.ndarray]) -> None:
        self.p, self.draw, self.masks = p, draw, {}

    def _mask(self, site: str, shape: tuple) -> np.ndarray:
        mask = self.masks.get(site)
        if mask is None:
            u = self.draw(site, shape if len(shape) == 4 else (shape[1], shape[0], shape[2]))
            keep = (u >= self.p) * (1.0 / (1.0 - self.p))
            mask = self.masks[site] = keep if len(shape) == 4 else keep.transpose(1, 0, 2)
        return mask

    def __call__(self, x: np.ndarray, site: str, shape: tuple) -> np.ndarray:
        """x times the mask; `shape`: x seen as (T/tp, B/dp, D), or its attention (B/dp, H/tp, T, T)."""
        if not self.p:
            return x
        return (x.reshape(shape) * self._mask(site, shape)).reshape(x.shape)


class Replica:
    """This rank's shards of the GPT, its optimizer state in flat buffers, and its training step."""

    def __init__(self, cfg: Any, comms: Comms, dp: int, tp: int, params: dict) -> None:
        self.cfg, self.comms = cfg, comms
        self.t = comms.world.rank % tp
        self.B, self.T, self.D = cfg.batch // dp, cfg.seq, cfg.d_model
        self.Tl, self.Hl, self.Vl = cfg.seq // tp, cfg.heads // tp, cfg.vocab // tp
        self.scale = 1.0 / (cfg.batch * cfg.seq)  # the loss is the mean over the global batch's tokens
        self.tp_size = tp
        shards = {name: self.shard(name, value) for name, value in params.items()}
        # Flat order: split weights that decay, split vectors, then the replicated ones (summed over all ranks).
        order = sorted(shards, key=lambda n: (not self.summed_over_dp(n), shards[n].ndim < 2))
        sizes = [shards[n].size for n in order]
        self.n_dp = sum(s for n, s in zip(order, sizes) if self.summed_over_dp(n))
        self.n_decay = sum(s for n, s in zip(order, sizes) if shards[n].ndim >= 2)
        self.theta, self.grad, self.m, self.v, self.p, self.g = flat_state(shards, order)
        T = self.T
        self.causal = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, 0.0)
        self.steps = 0

    @property
    def where(self) -> tuple:
        """This rank's place, as `block` reads it: (t, tp)."""
        return self.t, self.tp_size

    @staticmethod
    def block(where: tuple, name: str, full: np.ndarray) -> np.ndarray:
        """The block of parameter `name` (whole: a copy) that the rank at `where` holds."""
        return shard(name, full, *where)

    def shard(self, name: str, full: np.ndarray) -> np.ndarray:
        """This rank's block of parameter `name`."""
        return self.block(self.where, name, full)

    def summed_over_dp(self, name: str) -> bool:
        """Whether `name`'s gradient is summed over dp only (its tp ranks hold different blocks), not all ranks."""
        return split_dim(name) is not None

    def step(self, x: np.ndarray, y: np.ndarray, drop: Dropout) -> float:
        """One training step on this replica's ids x, y (B/dp, T); the loss of the whole batch."""
        c, p, g, cfg = self.comms, self.p, self.g, self.cfg
        B, D, Tl, Vl = self.B, self.D, self.Tl, self.Vl
        act = (Tl, B, D)
        ids = x.T.reshape(-1) - self.t * Vl  # rows (position, sample); this rank's vocabulary rows from 0
        other = (ids < 0) | (ids >= Vl)
        ids[other] = 0
        e = p["wte"][ids]
        e[other] = 0.0
        h = c.reduce_scatter(c.tp, e)
        h.reshape(act)[...] += p["wpe"][:, None]
        h = drop(h, "emb", act)
        caches = []
        for layer in range(cfg.layers):
            h, cache = self._block(f"h{layer}.", h, drop)
            caches.append(cache)
        out, lnf = _layer_norm(h, p["lnf.w"], p["lnf.b"], cfg.ln_eps)
        hf = c.allgather(c.tp, out)
        loss, dz = self._cross_entropy(hf @ p["wte"].T, y.T.reshape(-1))
        loss += self._extra_loss()
        np.matmul(dz.T, hf, out=g["wte"])  # the tied head; the embedding's rows add in below
        dh = _layer_norm_back(c.reduce_scatter(c.tp, dz @ p["wte"]), lnf, g["lnf.w"], g["lnf.b"])
        for layer in reversed(range(cfg.layers)):
            dh = self._block_back(f"h{layer}.", dh, caches[layer], drop)
        dh = drop(dh, "emb", act)
        np.sum(dh.reshape(act), axis=1, out=g["wpe"])
        de = c.allgather(c.tp, dh)
        np.add.at(g["wte"], ids[~other], de[~other])
        c.allreduce(c.dp, self.grad[:self.n_dp])
        c.allreduce(c.world, self.grad[self.n_dp:])
        self._adamw()
        return loss

    def _block(self, pre: str, h: np.ndarray, drop: Dropout) -> tuple:
        c, p, cfg = self.comms, self.p, self.cfg
        B, T, D, Tl, Hl = self.B, self.T, self.D, self.Tl, self.Hl
        Dh, layer, act = cfg.head_dim, pre[:-1], (Tl, B, D)
        a_l, ln1 = _layer_norm(h, p[pre + "ln1.w"], p[pre + "ln1.b"], cfg.ln_eps)
        a = c.allgather(c.tp, a_l)

        def heads(w: str) -> np.ndarray:  # (B, Hl, T, Dh): this rank's heads are its columns
            out = a @ p[pre + "attn.w" + w]
            if w != "k":
                out += p[pre + "attn.b" + w]
            return out.reshape(T, B, Hl, Dh).transpose(1, 2, 0, 3)

        q, k, v = heads("q"), heads("k"), heads("v")
        probs = q @ k.transpose(0, 1, 3, 2)
        probs *= 1.0 / math.sqrt(Dh)
        probs += self.causal
        probs -= probs.max(axis=-1, keepdims=True)
        np.exp(probs, out=probs)
        probs /= probs.sum(axis=-1, keepdims=True)
        pd = drop(probs, layer + ".attn", probs.shape)
        o = (pd @ v).transpose(2, 0, 1, 3).reshape(T * B, Hl * Dh)
        proj = c.reduce_scatter(c.tp, o @ p[pre + "attn.wo"])
        proj += p[pre + "attn.bo"]
        h = h + drop(proj, layer + ".resid1", act)
        h, mlp = self._mlp(pre, h, drop)
        return h, ((a, ln1, q, k, v, probs, pd, o), mlp)

    def _mlp(self, pre: str, h: np.ndarray, drop: Dropout) -> tuple:
        """The block's second half: LayerNorm, Allgather, the MLP, Reduce_scatter, the residual; (h, its cache)."""
        c, p, cfg = self.comms, self.p, self.cfg
        layer, act = pre[:-1], (self.Tl, self.B, self.D)
        a2_l, ln2 = _layer_norm(h, p[pre + "ln2.w"], p[pre + "ln2.b"], cfg.ln_eps)
        a2 = c.allgather(c.tp, a2_l)
        z = a2 @ p[pre + "mlp.w1"]
        z += p[pre + "mlp.b1"]
        m, th = _gelu(z)
        out = c.reduce_scatter(c.tp, m @ p[pre + "mlp.w2"])
        out += p[pre + "mlp.b2"]
        h = h + drop(out, layer + ".resid2", act)
        return h, (a2, ln2, z, th, m)

    def _mlp_back(self, pre: str, dh: np.ndarray, cache: tuple, drop: Dropout) -> np.ndarray:
        """`_mlp`'s backward: the gradient of its input h from its output's, dh; the weights' into self.g."""
        c, p, g = self.comms, self.p, self.g
        layer, act = pre[:-1], (self.Tl, self.B, self.D)
        a2, ln2, z, th, m = cache
        dr = drop(dh, layer + ".resid2", act)
        np.sum(dr, axis=0, out=g[pre + "mlp.b2"])
        dr = c.allgather(c.tp, dr)
        np.matmul(m.T, dr, out=g[pre + "mlp.w2"])
        dz = _gelu_back(dr @ p[pre + "mlp.w2"].T, z, th)
        np.matmul(a2.T, dz, out=g[pre + "mlp.w1"])
        np.sum(dz, axis=0, out=g[pre + "mlp.b1"])
        dx = c.reduce_scatter(c.tp, dz @ p[pre + "mlp.w1"].T)
        return dh + _layer_norm_back(dx, ln2, g[pre + "ln2.w"], g[pre + "ln2.b"])

    def _block_back(self, pre: str, dh: np.ndarray, cache: tuple, drop: Dropout) -> np.ndarray:
        c, p, g, cfg = self.comms, self.p, self.g, self.cfg
        B, T, D, Tl, Hl = self.B, self.T, self.D, self.Tl, self.Hl
        Dh, layer, act = cfg.head_dim, pre[:-1], (Tl, B, D)
        (a, ln1, q, k, v, probs, pd, o), mlp = cache
        dh = self._mlp_back(pre, dh, mlp, drop)
        dr = drop(dh, layer + ".resid1", act)
        np.sum(dr, axis=0, out=g[pre + "attn.bo"])
        dr = c.allgather(c.tp, dr)
        np.matmul(o.T, dr, out=g[pre + "attn.wo"])
        do = (dr @ p[pre + "attn.wo"].T).reshape(T, B, Hl, Dh).transpose(1, 2, 0, 3)
        dv = pd.transpose(0, 1, 3, 2) @ do
        dprobs = drop(do @ v.transpose(0, 1, 3, 2), layer + ".attn", probs.shape)
        ds = dprobs * probs  # softmax backward; masked entries have probs 0
        dprobs -= ds.sum(axis=-1, keepdims=True)
        np.multiply(probs, dprobs, out=ds)
        ds *= 1.0 / math.sqrt(Dh)
        da = None
        for w, d in (("q", ds @ k), ("k", ds.transpose(0, 1, 3, 2) @ q), ("v", dv)):
            d = d.transpose(2, 0, 1, 3).reshape(T * B, Hl * Dh)
            np.matmul(a.T, d, out=g[pre + "attn.w" + w])
            if w != "k":
                np.sum(d, axis=0, out=g[pre + "attn.b" + w])
            part = d @ p[pre + "attn.w" + w].T
            da = part if da is None else da + part
        dx = c.reduce_scatter(c.tp, da)
        return dh + _layer_norm_back(dx, ln1, g[pre + "ln1.w"], g[pre + "ln1.b"])

    def _extra_loss(self) -> float:
        """Losses beside the cross-entropy, summed over the batch (none: 0.0, no call)."""
        return 0.0

    def _cross_entropy(self, z: np.ndarray, targets: np.ndarray) -> tuple:
        """Megatron's vocab-parallel cross-entropy of logits z (rows, V/tp): the batch's loss, d loss / dz."""
        from mpi4py import MPI

        c, rows = self.comms, np.arange(z.shape[0])
        z -= c.allreduce(c.tp, z.max(axis=1), MPI.MAX)[:, None]
        ids = targets - self.t * self.Vl
        owned = (ids >= 0) & (ids < self.Vl)
        ids[~owned] = 0
        sums = np.stack([np.zeros(z.shape[0]), np.where(owned, z[rows, ids], 0.0)])
        np.exp(z, out=z)
        np.sum(z, axis=1, out=sums[0])
        c.allreduce(c.tp, sums)
        total = c.allreduce(c.dp, np.array([np.sum(np.log(sums[0]) - sums[1])]))
        z /= sums[0][:, None]
        z[rows[owned], ids[owned]] -= 1.0
        z *= self.scale
        return float(total[0]) * self.scale, z

    def _adamw(self) -> None:
        self.steps += 1
        adamw_flat(self.cfg, self.steps, self.theta, self.grad, self.m, self.v, self.n_decay)
