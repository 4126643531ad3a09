"""The MoE layer's routing kernels: the slot tables of a layer's shapes, the routing, packing and unpacking of its
tokens, their gradients, and the replayed dispatch figures (spmdsim.models.moe.layer)."""
from __future__ import annotations

from typing import Any, Callable, Optional
import numpy as np
from ...base.buffers import into
from ...base.precision import rounded, wide
from .exchange import _Plan
from .stats import _STATS_FIELDS, MoEStats, _new
from ...base.tables import put


class _Tables:
    """What one layer signature's routing kernels index by, worked out once (`_tables`): integer tables of the
    (T, bl, E, k, C, ep) shapes alone, never written. Kernels handed one (a replay's: the capture's) gather and
    scatter through them with numpy's take and fancy indexing, in place of take_along_axis, put_along_axis and
    broadcast_to (each a few hundred opcodes of numpy's Python a call) and of a loop over the choices.

    Attributes (each int64): tok (bl, T, k): each assignment's token as a row of a (T * bl, D) block, t bl + b;
    tflat (bl, T, 1): (t bl + b) E, where token (b, t)'s E values start in a C-ordered (T, bl, E) block;
    oflat (bl, T, k): ((b k + j) T + t) E, where choice j of token (b, t) starts in a (bl, k, T, E) block (the
    choices in GShard's order of priority: every first choice, then every second); sflat (bl, 1, 1): b E, a
    sequence's start in a (bl, E) block; slot_rows (bl E,): with a capacity, the send buffer's row of slot 0 of
    (sequence b, expert e) at b E + e ((ep, bl, E / ep, C) slots, destination-major); per_expert (E,): rows per
    expert with a capacity, bl C."""

    __slots__ = ("T", "bl", "E", "k", "C", "ep", "tok", "tflat", "oflat", "sflat", "slot_rows", "per_expert")

    def __init__(self, T: int, bl: int, E: int, k: int, C: int, ep: int) -> None:
        self.T, self.bl, self.E, self.k, self.C, self.ep = T, bl, E, k, C, ep
        El = E // ep
        b, t, j = np.arange(bl)[:, None, None], np.arange(T)[None, :, None], np.arange(k)[None, None, :]
        e = np.arange(E)
        self.tok = np.ascontiguousarray(np.broadcast_to(t * bl + b, (bl, T, k)), dtype=np.int64)
        self.tflat = ((t * bl + b) * E).astype(np.int64)
        self.oflat = (((b * k + j) * T + t) * E).astype(np.int64)
        self.sflat = (b * E).astype(np.int64)
        self.slot_rows = (((e // El * bl + b[:, :, 0]) * El + e % El) * C).reshape(-1).astype(np.int64)
        self.per_expert = np.full(E, bl * C, dtype=np.int64)
        for a in (self.tok, self.tflat, self.oflat, self.sflat, self.slot_rows, self.per_expert):
            a.flags.writeable = False


def _tables(T: int, bl: int, E: int, k: int, C: int, ep: int) -> _Tables:
    """The _Tables of a signature, made once (a pure function of its integers; 64 kept, then start over)."""
    key = (T, bl, E, k, C, ep)
    seen = _TABLES.get(key)
    if seen is None:
        seen = put(_TABLES, key, _Tables(T, bl, E, k, C, ep), 64)
    return seen


_TABLES: dict = {}  # (T, bl, E, k, C, ep) -> its _Tables


def _route(probs: np.ndarray, tab: _Tables, dropless: bool, out: Optional[tuple] = None) -> tuple:
    """This rank's routing of its (T, bl, E) probabilities, as arrays: (experts, gates, slots (bl, T, k);
    counts (bl, E); rows (bl, T, k), each assignment's row in the send buffer (destination-major over the
    ep ranks), -1 where dropped; rows per expert (E,); the (E,) assignments before dropping, float64, for
    the load-balancing loss); into `out`'s seven arrays when given (a replay's).

    The values of spmdsim.models.moe.routing.route and dispatch_rows on the probabilities as (bl, T, E) (the same
    numpy calls where they compute floats: the stable sort, the gates' sum and division), by `tab`'s tables
    (`_tables`): each token's row of E values sorted where it lies, the chosen ones gathered by flat index,
    and the slots counted by one cumulative sum over the choices in GShard's order (every first choice, then
    every second) where `_placed` counts choice by choice."""
    bl, T, E, k, C = tab.bl, tab.T, tab.E, tab.k, tab.C
    p = probs if probs.flags.c_contiguous else np.ascontiguousarray(probs)
    if out is None:
        experts, slots, rows = (np.empty((bl, T, k), np.int64) for _ in range(3))
        per_expert, load = np.empty(E, np.int64), np.empty(E, np.float64)
    else:
        experts, gates, slots, counts, rows, per_expert, load = out
    experts[...] = (-p).argsort(axis=-1, kind="stable")[..., :k].transpose(1, 0, 2)  # ties to the lower index
    chosen = p.reshape(-1).take(tab.tflat + experts)
    if k == 1:
        g = chosen
    else:
        total = np.add.reduce(chosen, -1, keepdims=True)
        g = chosen / np.where(total > 0, total, 1.0)  # (a dry run's zeros: gates zero, not 0 / 0)
    if out is None:
        gates = g
    else:
        gates[...] = g
    at = tab.oflat + experts
    onehot = np.zeros(bl * k * T * E, np.int64)
    onehot[at] = 1
    seen = onehot.reshape(bl, k * T, E).cumsum(axis=1)  # assignments to each (sequence, expert) so far
    np.subtract(seen.reshape(-1).take(at), 1, out=slots)
    if out is None:
        counts = seen[:, -1].copy()
    else:
        counts[...] = seen[:, -1]
    dropped = slots >= C
    slots[dropped] = -1
    if not dropless:
        np.add(tab.slot_rows.take(tab.sflat + experts), slots, out=rows)
        rows[dropped] = -1
        per_expert[...] = tab.per_expert
    else:  # rows sorted by expert, then sequence, then slot (dispatch_rows')
        per = counts
        before = np.cumsum(per, axis=0) - per
        np.add.reduce(per, 0, out=per_expert)
        base = (np.cumsum(per_expert) - per_expert)[None, :] + before
        np.add(base.reshape(-1).take(tab.sflat + experts), slots, out=rows)
        rows[dropped] = -1
    load[...] = np.add.reduce(counts, 0)
    return experts, gates, slots, counts, rows, per_expert, load


def _pack(x: np.ndarray, rows: np.ndarray, nrows: int, tok: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The dispatch's send buffer (nrows, D): each kept assignment's token row of x (T, bl, D) at its row,
    the rest zero. `tok`: each assignment's token row (`_Tables.tok`)."""
    T, bl, D = x.shape
    send = np.zeros((nrows, D), x.dtype) if out is None else out
    if out is not None:
        send.fill(0.0)
    kept = rows >= 0
    send[rows[kept]] = x.reshape(T * bl, D)[tok[kept]]
    return send


def _unpack(back: np.ndarray, rows: np.ndarray, gates: Optional[np.ndarray], tok: np.ndarray,
            out: Optional[np.ndarray] = None) -> np.ndarray:
    """(T, bl, D): each token's kept assignments' rows of `back` (nrows, D) summed, times their gates (none:
    the rows themselves, the dispatch's gradient). `tok`: each assignment's token row (`_Tables.tok`)."""
    bl, T, _ = rows.shape
    D = back.shape[1]
    kept = rows >= 0
    at = rows[kept]
    if back.dtype != np.float64:  # a policy's: summed in float32, the output rounded once (a gradient is not)
        acc = np.zeros((T, bl, D), np.float32)
        np.add.at(acc.reshape(T * bl, D), tok[kept], wide(back[at]) if gates is None else
                  gates[kept][:, None] * wide(back[at]))
        return into(out, acc if gates is None else rounded(acc, back.dtype))
    ys = np.zeros((T, bl, D)) if out is None else out
    if out is not None:
        ys.fill(0.0)
    np.add.at(ys.reshape(T * bl, D), tok[kept], back[at] if gates is None else gates[kept][:, None] * back[at])
    return ys


def _combine_grad(dy: np.ndarray, back: np.ndarray, rows: np.ndarray, gates: np.ndarray, tok: np.ndarray,
                  out: Optional[tuple] = None) -> tuple:
    """The combine's backward: (d loss / d gates (bl, T, k); d loss / d the combine's rows (nrows, D)) from
    the output's gradient dy (T, bl, D); into `out`'s two arrays when given (a replay's). `tok`: each
    assignment's token row (`_Tables.tok`)."""
    T, bl, D = dy.shape
    kept = rows >= 0
    at = rows[kept]
    mixed = back.dtype != np.float64  # a policy's: float32 math, the rows' gradient rounded once to be sent
    dys = dy.reshape(T * bl, D)[tok[kept]]
    if mixed:
        dys = wide(dys)
    if out is None:
        dgates, dback = np.zeros(gates.shape, gates.dtype), np.zeros(back.shape, back.dtype)
    else:
        dgates, dback = out
        dgates.fill(0)
        dback.fill(0)
    if mixed:
        dgates[kept] = np.einsum("nd,nd->n", dys, wide(back[at]))
        dback[at] = rounded(gates[kept][:, None] * dys, back.dtype)
        return dgates, dback
    dgates[kept] = np.einsum("nd,nd->n", dys, back[at])
    dback[at] = gates[kept][:, None] * dys
    return dgates, dback


def _probs_grad(probs: np.ndarray, experts: np.ndarray, gates: np.ndarray, tab: _Tables, dgates: np.ndarray,
                out: Optional[np.ndarray] = None) -> np.ndarray:
    """d loss / d probs (T, bl, E) from d loss / d gates (bl, T, k) (into `out` when given): the values of
    spmdsim.models.moe.routing.gates_backward (the same numpy calls on the gathered probabilities), scattered by
    `tab`'s flat indices (`_Tables.tflat`)."""
    if out is not None and not out.flags.c_contiguous:  # (written through a flat view below)
        out[...] = _probs_grad(probs, experts, gates, tab, dgates)
        return out
    p = probs if probs.flags.c_contiguous else np.ascontiguousarray(probs)
    dprobs = np.zeros(p.shape, p.dtype) if out is None else out
    if out is not None:
        dprobs.fill(0)
    at = tab.tflat + experts
    if tab.k == 1:
        dprobs.reshape(-1)[at] = dgates
        return dprobs
    chosen = p.reshape(-1).take(at)
    total = np.add.reduce(chosen, -1, keepdims=True)
    total = np.where(total > 0, total, 1.0)  # a dry run's zeros (route's gates are zero there too)
    # g_i = p_i / (p_0 + p_1): dp_j = (dg_j - sum_i dg_i g_i) / (p_0 + p_1)
    dprobs.reshape(-1)[at] = (dgates - np.add.reduce(dgates * gates, -1, keepdims=True)) / total
    return dprobs


class _Facts:
    """What a layer's MoEStats take from its signature and mesh alone (`_facts`), for `_note`."""

    __slots__ = ("name", "rank", "group", "row", "E", "ep", "El", "share", "dropless", "sent", "send_bytes",
                 "received_bytes")

    def __init__(self, mesh: Any, name: str, tab: _Tables, row: int, dropless: bool, ep_axes: tuple) -> None:
        self.name, self.rank, self.row, self.dropless = name, mesh.rank, row, dropless
        self.group = tuple(int(r) for r in mesh.group_ranks(ep_axes))
        self.E, self.ep = tab.E, tab.ep
        self.El = tab.E // tab.ep
        self.share = tab.bl * self.El * tab.C  # with a capacity: each destination's slots
        rows = [self.share] * self.ep
        self.sent = tuple(n * row for n in rows)
        self.send_bytes = self.received_bytes = sum(rows) * row


def _facts(plan: "_Plan", tab: _Tables, row: int) -> _Facts:
    """`plan`'s _Facts for rows of `row` bytes, made once a plan (a capacity's plan lives as its mesh's)."""
    facts = plan.facts
    if facts is None or facts.row != row:
        facts = plan.facts = _Facts(plan.mesh, plan.name, tab, row, plan.moe.dropless, plan.fold.ep_axes)
    return facts


def _note(put: Callable, at: int, facts: _Facts, experts: np.ndarray, slots: np.ndarray, rows: np.ndarray,
          per_expert: np.ndarray, got: Optional[np.ndarray]) -> None:
    """put(at, this rank's MoEStats of the routing's arrays), as `_stats` makes it."""
    kept = rows >= 0
    ep, row = facts.ep, facts.row
    sent_to = rows[kept]
    if facts.dropless:  # a kept assignment's row lies in its destination's share of the send buffer
        send_rows = np.add.reduce(per_expert.reshape(ep, facts.El), 1)
        tokens = np.bincount(np.searchsorted(np.cumsum(send_rows), sent_to, side="right"), minlength=ep)
        sent = tuple((send_rows * row).tolist())
        send_bytes = int(np.add.reduce(send_rows)) * row
        received_bytes = int(np.add.reduce(got, None)) * row
    else:  # the slots are destination-major: (ep, bl, El, C)
        tokens = np.bincount(sent_to // facts.share, minlength=ep)
        sent, send_bytes, received_bytes = facts.sent, facts.send_bytes, facts.received_bytes
    # MoEStats(...) made without its frozen __init__'s twelve object.__setattr__ calls: its fields set at once
    stats = _new(MoEStats)
    stats.__dict__.update(zip(_STATS_FIELDS, (
        facts.name, facts.rank, facts.group, tuple(tokens[:ep].tolist()), sent,
        tuple(np.bincount(experts[slots >= 0], minlength=facts.E).tolist()), slots.size - int(np.count_nonzero(kept)),
        slots.size, send_bytes, received_bytes, experts.copy())))
    put(at, stats)
