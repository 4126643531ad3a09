"""Ring attention: causal attention over a sequence split across the ranks of one mesh axis (context
parallelism), the keys and values passed round the ring as point-to-point messages.

``ring_attention(q, k, v, axis)`` takes sequence-first (T, B, H, D) DTensors whose T is split over `axis`
alone (the batch and heads may be split over other axes; k and v may have fewer heads, grouped-query
attention's, each read by its group of query heads and passed round the ring as it is, never repeated, as
TransformerEngine's ring does), laid out by spmdsim.programs.context's split
(`balanced`: rank r holds chunks r and 2cp-1-r of 2cp, in that order; else contiguous chunks). Each rank
runs its ring program (spmdsim.programs.context.ring): at each step it attends with one rank's block of
keys and values, only the chunk pairs a causal mask leaves work in, merging the partial results by the
online softmax (a running maximum and sum per query row), while the messages of the step's `Pass` move
the blocks on: a `Messages` step record the executor posts. The backward runs the ring again, the
gradients of each block's keys and values one step behind, added up by each holder in turn and sent
home at the end. The values are the composite's (scores, causal mask, softmax, dropout, times V) up
to the order of the sums; the dropout mask is the one `ops.attention` draws over (B, H, Tq, Tk) at the
same laid-out indices, so the three context-parallel methods give the same numbers.

Under bfloat16 the ring computes as ring flash attention's kernels do (zhuzilin's ring-flash-attention:
the running output in float32, rounded once): the products widened to float32 (spmdsim.base.precision), the
scores, the running maximum, sum and output in float32, the probabilities never rounded, the output
rounded once; in the backward each row's sum of dO x O (the rounded output) as FlashAttention's, and dQ,
dK and dV summed in float32 round the ring (the gradient blocks travel as float32, as a bfloat16 sum does
in a collective, and as ring-flash-attention passes them) and rounded once at the end. The check's
reference follows these rounding points (spmdsim.models.gpt.mixed, `ring`).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ...base import buffers
from ...base.buffers import lazy_zeros
from ...base.flops import any_open, gemm
from ...base.precision import is_low, wide
from ...errors import OperatorError
from ...programs.context.ring import Attend, Pass, RingProgram, TAGS, ring_program
from ...programs.context.split import chunks
from ...programs.infer.attention import refuse_empty
from ...programs.plan.messages import Messages
from ...runtime import executor
from ..autograd.graph import record
from ..autograd.rules.attention import grouped_product, grouped_sum
from ..autograd.rules.grads import grad_tensor
from ._common import MASKS, make_dtensor, seed_arg
from ._operands import raise_if_not_dtensors, require_float

__all__ = ["ring_attention"]


def ring_attention(q: Any, k: Any, v: Any, axis: str, *, balanced: bool = True, dropout: float = 0.0,
                   seed: Any = None, scale: Optional[float] = None) -> Any:
    """Causal attention of sequence-first q, k, v (T, B, H, D), T split over the mesh axis `axis`, by the ring
    (the module's docstring); the result (T, B, H, D) laid out as q."""
    raise_if_not_dtensors("ring_attention", ("q", "k", "v"), q, k, v)
    shape = tuple(q.global_shape)
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_float("ring_attention", t.local)
        mine = tuple(t.global_shape)
        if (t.layout.layout != q.layout.layout or t.layout.tensor_map != q.layout.tensor_map
                or t.layout.partial != q.layout.partial or t.mesh is not q.mesh
                or len(mine) != 4 or mine[:2] != shape[:2] or mine[3] != shape[3] or mine[2] < 1
                or shape[2] % mine[2] or t.local.shape[2] < 1 or q.local.shape[2] % t.local.shape[2]
                or (name == "v" and mine != tuple(k.global_shape))):
            raise OperatorError(f"ring_attention: {name} is {mine} {t.layout}; expected q's {shape} {q.layout}, "
                                "or k and v alike with fewer heads that divide q's on every rank (grouped-query)")
    refuse_empty("ring_attention", tuple(q.global_shape), tuple(k.global_shape), 0)
    tmap = q.layout.tensor_map
    if len(tmap) != 4 or tmap[0] != (axis,) or tmap[3] != () or q.layout.partial:
        raise OperatorError(f"ring_attention: q {q.layout} must be (T, B, H, D) with T split over {axis!r} alone, "
                            "D whole, nothing pending")
    if not 0 <= dropout < 1:
        raise OperatorError(f"ring_attention: dropout {dropout!r} must be a number with 0 <= p < 1")
    if dropout:
        seed_arg(seed, "ring_attention")
    mesh = q.mesh
    comm, cp, me = mesh.group_info((axis,))
    T = q.global_shape[0]
    program = ring_program(me, cp, k.local.nbytes, (axis,), balanced)
    parts = 2 if balanced and cp > 1 else 1
    if (T // cp) % parts:
        raise OperatorError(f"ring_attention: {T // cp} rows a rank do not cut into {parts} chunks")
    ring = _Ring(mesh, comm, program, q, scale or 1.0 / math.sqrt(q.global_shape[3]), dropout, seed, balanced, axis,
                 q.local.shape[2] // k.local.shape[2])
    out_block, lse = ring.forward(q.local, k.local, v.local)
    out = make_dtensor(mesh, out_block, q.layout, q.global_shape)
    if q._ag is None and k._ag is None and v._ag is None:
        return out
    saved = (q.local, k.local, v.local, out_block, lse)

    def backward(dy: Any) -> tuple:
        dq, dk, dv = ring.backward(dy.local, *saved)
        pending = dy.layout.partial
        return grad_tensor(q, dq, pending), grad_tensor(k, dk, pending), grad_tensor(v, dv, pending)

    return record(out, "ring attention", (q, k, v), backward)


class _Ring:
    """One rank's ring attention: its program, the chunk geometry, and the forward and backward on blocks."""

    def __init__(self, mesh: Any, comm: Any, program: RingProgram, q: Any, scale: float, drop: float, seed: Any,
                 balanced: bool, axis: str, groups: int = 1) -> None:
        self.mesh, self.comm, self.program, self.scale, self.drop, self.seed = mesh, comm, program, scale, drop, seed
        self.groups = groups  # query heads a key/value head serves on this rank (grouped-query attention)
        self.axes = (axis,)
        self.balanced, self.cp, self.me = balanced, program.cp, program.rank
        T, B, H, _ = q.global_shape
        b_, h_ = q.slices[1], q.slices[2]
        self.rows = T // program.cp  # a rank's rows
        self.size = self.rows // (2 if balanced and program.cp > 1 else 1)  # a chunk's
        self.probs_shape, self.b_, self.h_ = (B, H, T, T), b_, h_
        self.records: dict = {}  # a Pass's step -> its Messages, made from the first buffers posted
        self.dry = mesh.engine.dry  # shapes only: the messages are posted, the products counted, none computed
        # what the kernel computes and sums in: float32 for bfloat16 blocks (the module's docstring)
        self.inner = np.dtype(np.float32) if is_low(q.dtype) else np.result_type(q.dtype, np.float32)

    def _local(self, rank: int, chunk: int) -> slice:
        """Rows of `chunk` (a global chunk number) in rank `rank`'s block."""
        i = chunks(rank, self.cp, self.balanced).index(chunk)
        return slice(i * self.size, (i + 1) * self.size)

    def _pairs(self, a: Attend) -> list:
        """(query rows, key rows, diagonal) of each chunk pair step `a` works on, in local rows."""
        out = []
        for qc in a.queries:
            for kc in a.keys:
                if kc <= qc:
                    out.append((self._local(self.me, qc), self._local(a.source, kc), kc == qc))
        return out

    def _factors(self, a: Attend, qr: slice, kr: slice) -> Optional[np.ndarray]:
        """The dropout's keep factors (b, h, rows, keys) of query rows `qr` against source rows `kr`: the mask
        ops.attention draws over (B, H, Tq, Tk), at these laid-out indices."""
        if not self.drop:
            return None
        q0, k0 = self.me * self.rows, a.source * self.rows
        region = (self.b_, self.h_, slice(q0 + qr.start, q0 + qr.stop), slice(k0 + kr.start, k0 + kr.stop))
        keep = MASKS.keep_mask(self.probs_shape, self.seed, region, self.drop)
        return np.multiply(keep, np.asarray(1.0 / (1.0 - self.drop), self.inner))

    def _count(self, q: np.ndarray, qr: slice, kr: slice, dv: int, products: int, diagonal: bool) -> None:
        """Count (spmdsim.base.flops) a chunk pair's products: the forward's 2 or the backward's 5, each a product
        of a fused attention kernel (its scores on chip), half of it executed on the `diagonal` (causal) pair."""
        if not any_open():
            return
        _, b, h, d = q.shape
        rows, keys = qr.stop - qr.start, kr.stop - kr.start
        scores = ((b, h, rows, d), (b, h, d, keys))
        if products == 2:  # the forward: q k^T, then p v
            shapes = [scores, ((b, h, rows, keys), (b, h, keys, dv))]
        else:  # the backward: q k^T again, dV = p^T dO, dP = dO v^T, dQ = dS k, dK = dS^T q
            shapes = [scores, ((b, h, keys, rows), (b, h, rows, dv)), ((b, h, rows, dv), (b, h, dv, keys)),
                      ((b, h, rows, keys), (b, h, keys, d)), ((b, h, keys, rows), (b, h, rows, d))]
        for a_shape, b_shape in shapes:
            gemm(a_shape, b_shape, q.dtype, None, "attention", 0.5 if diagonal else 1.0)

    def _scores(self, q: np.ndarray, k: np.ndarray, diagonal: bool) -> np.ndarray:
        """Scaled scores (b, h, rows, keys) of sequence-first blocks q (rows, b, h, d) and k (keys, b, hk, d)."""
        s = grouped_product(q.transpose(1, 2, 0, 3), k.transpose(1, 2, 3, 0), self.groups) * self.scale
        if diagonal:  # a chunk against itself: the keys after each query masked
            s[..., np.triu(np.ones(s.shape[-2:], bool), 1)] = -np.inf
        return s

    def _post(self, step: int, phase: str, sends: list, receives: list) -> None:
        """The step's messages, (buffer, what) each way: to the next rank, from the previous one."""
        nxt, prev = (self.me + 1) % self.cp, (self.me - 1) % self.cp
        out = [(buf, nxt, TAGS[what]) for buf, what in sends]
        into = [(buf, prev, TAGS[what]) for buf, what in receives]
        key = (phase, step)
        made = self.records.get(key)
        if made is None:  # the step's record, made from its buffers once (the same sizes every call)
            made = self.records[key] = Messages.of(self.axes, self.cp, into, out)
        executor.post(self.mesh, self.comm, made, into, out, "ring attention")

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple:
        """(the output block (rows, b, h, dv), each query row's log-sum-exp (b, h, rows))."""
        rows, (b, h) = q.shape[0], q.shape[1:3]
        # (memory from spmdsim.base.buffers: a captured step's, which each replay fills again)
        inner = self.inner
        most = buffers.full((b, h, rows), -np.inf, inner)
        total = buffers.zeros((b, h, rows), inner)
        acc = buffers.zeros((b, h, rows, v.shape[3]), inner)
        kc, vc, later = k, v, None
        for action in self.program.forward:
            if isinstance(action, Pass):
                kn, vn = buffers.empty(kc.shape, kc.dtype), buffers.empty(vc.shape, vc.dtype)
                self._post(action.step, "forward", [(kc, "k"), (vc, "v")], [(kn, "k"), (vn, "v")])
                later = (kn, vn)
                continue
            for qr, kr, diagonal in self._pairs(action):
                self._count(q, qr, kr, v.shape[3], 2, diagonal)  # the scores and the weighted values
                if self.dry:
                    continue
                s = self._scores(q[qr], kc[kr], diagonal)
                m = np.maximum(most[..., qr], s.max(axis=-1))
                keep = np.exp(most[..., qr] - m)
                p = np.exp(s - m[..., None])
                total[..., qr] = total[..., qr] * keep + p.sum(axis=-1)
                factors = self._factors(action, qr, kr)
                pd = p if factors is None else p * factors
                weighted = grouped_product(pd, vc[kr].transpose(1, 2, 0, 3), self.groups)
                acc[..., qr, :] = acc[..., qr, :] * keep[..., None] + weighted
                most[..., qr] = m
            if action.step < self.cp - 1:
                kc, vc = later
        if self.dry:
            return lazy_zeros(q.shape[:3] + v.shape[3:], q.dtype), lazy_zeros((b, h, rows), inner)
        out = buffers.empty(q.shape[:3] + v.shape[3:], q.dtype)  # (rows, b, h, dv), written each replay
        np.divide(acc, total[..., None], out=out.transpose(1, 2, 0, 3))  # (rounded once into a bfloat16 block)
        return out, most + np.log(total)

    def backward(self, dy: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
                 lse: np.ndarray) -> tuple:
        """(dq, dk, dv) blocks of this rank, each laid out as its input."""
        dy_h = dy.transpose(1, 2, 0, 3)  # (b, h, rows, dv)
        # each query row's sum of dy x out, which the block gradients read (a dry run computes none of them)
        delta = None if self.dry else np.sum(wide(dy_h) * wide(out.transpose(1, 2, 0, 3)), axis=-1)
        dq = buffers.zeros(q.shape, np.result_type(self.inner, dy.dtype))  # summed in float32 under bfloat16
        kc, vc, later = k, v, None
        # the sums of the block held at this step (float32 under bfloat16): its own block's at step 0; a later
        # step's arrive from the previous rank, and after the last pass its own block's whole sums come home
        dk, dv = buffers.zeros(k.shape, dq.dtype), buffers.zeros(v.shape, dq.dtype)
        for action in self.program.backward:
            if isinstance(action, Attend):
                self._block_grads(action, q, kc, vc, dy_h, delta, lse, dq, dk, dv)
                if action.step < self.cp - 1:
                    kc, vc = later
                continue
            sends, receives = [], []
            if action.step < self.cp - 1:
                later = (buffers.empty(kc.shape, kc.dtype), buffers.empty(vc.shape, vc.dtype))
                sends += [(kc, "k"), (vc, "v")]
                receives += [(later[0], "k"), (later[1], "v")]
            if action.step >= 1:  # the sums travel as summed (float32 under bfloat16)
                arriving = (buffers.empty(k.shape, dq.dtype), buffers.empty(v.shape, dq.dtype))
                sends += [(dk, "dk"), (dv, "dv")]
                receives += [(arriving[0], "dk"), (arriving[1], "dv")]
            self._post(action.step, "backward", sends, receives)
            if action.step >= 1:
                dk, dv = arriving
        return dq.astype(q.dtype, copy=False), dk.astype(k.dtype, copy=False), dv.astype(v.dtype, copy=False)

    def _block_grads(self, a: Attend, q: np.ndarray, kc: np.ndarray, vc: np.ndarray, dy_h: np.ndarray,
                     delta: np.ndarray, lse: np.ndarray, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray) -> None:
        """Step `a`'s part of dq, and of the held block's dk and dv (added in place)."""
        g = self.groups
        for qr, kr, diagonal in self._pairs(a):
            self._count(q, qr, kr, dy_h.shape[3], 5, diagonal)  # the scores again, dV, dP, dQ and dK
            if self.dry:
                continue
            s = self._scores(q[qr], kc[kr], diagonal)
            p = np.exp(s - lse[..., qr, None])
            factors = self._factors(a, qr, kr)
            pd = p if factors is None else p * factors
            dv[kr] += grouped_sum(pd, dy_h[..., qr, :], g).transpose(2, 0, 1, 3)
            dp = grouped_product(dy_h[..., qr, :], vc[kr].transpose(1, 2, 3, 0), g)
            if factors is not None:
                dp = dp * factors
            ds = p * (dp - delta[..., qr, None]) * self.scale
            dq[qr] += grouped_product(ds, kc[kr].transpose(1, 2, 0, 3), g).transpose(2, 0, 1, 3)
            dk[kr] += grouped_sum(ds, q[qr].transpose(1, 2, 0, 3), g).transpose(2, 0, 1, 3)
