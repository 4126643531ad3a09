"""Routing, stated once for the ranks and the reference (pure numpy): top-k, gates, slots, rows.

Tokens come in groups, one sequence each, as (S, T, E) router probabilities.
A token's experts are its `top_k` largest probabilities, ties going to the
lower expert index (a stable sort of -p). Its gates are those probabilities
(top-1, Switch) or the two renormalized to sum to one (top-2, GShard and
Mixtral). Each (sequence, expert) has `capacity` slots, filled first by every
token's first choice in position order, then by the second choices (GShard's
priority): an assignment past the capacity is dropped and adds nothing to
the layer's output (the token keeps its residual). Dropless routing has room
for all of them.

`rows` places every kept assignment in a flat send buffer, one row each:
with a capacity, the buffer is (ep, S, E / ep, C) slots (empty ones zero),
destination-major for the ep ranks the experts are split over, so each
destination's share is one contiguous block of a fixed size and one Alltoall
moves the buffer as it is; dropless, rows are sorted by expert, then sequence
and slot, with no gaps, and an Alltoallv moves each destination's true count.

A single-process reference routes by its own logits, which differ from the
ranks' by rounding: at a near-tie between two experts it takes the ranks'
experts where rounding alone can explain them (`followed`, `tie_margin`).

A dry run has no probabilities to route by (spmdsim.runtime.sim.dry): `planned`
routes by a rule instead, "balanced" (token t's j-th choice is expert
(t k + j) mod E: every expert gets T k / E of a sequence's assignments when E
divides T k) or "worst" (every token chooses experts 0 .. k-1, which live on
the first ep rank: it receives every assignment, the others none), with
gates 1 / k; slots and drops follow as for routed tokens.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from ...errors import SpmdsimError
from ...base.validate import as_int

__all__ = ["Routing", "route", "planned", "ROUTINGS", "gates_backward", "dispatch_rows", "by_expert", "followed",
           "tie_margin"]

#: The rules a dry run routes by (`planned`).
ROUTINGS = ("balanced", "worst")


@dataclass(frozen=True, eq=False)
class Routing:
    """One batch's routing: per (sequence, position, choice) its expert, gate, slot (-1: dropped).

    Attributes:
        experts, gates, slots: (S, T, k) arrays.
        counts: (S, E) assignments per sequence and expert before dropping (the load the aux loss sees).
        capacity: slots per (sequence, expert).
    """

    experts: np.ndarray
    gates: np.ndarray
    slots: np.ndarray
    counts: np.ndarray
    capacity: int

    @property
    def kept(self) -> np.ndarray:
        """(S, T, k) booleans: the assignments that found a slot."""
        return self.slots >= 0

    @property
    def dropped(self) -> int:
        """Assignments dropped for lack of room."""
        return int(np.count_nonzero(self.slots < 0))

    def per_expert(self) -> np.ndarray:
        """(E,) kept assignments per expert."""
        E = self.counts.shape[1]
        return np.bincount(self.experts[self.kept], minlength=E).astype(np.int64)


def route(probs: np.ndarray, top_k: int, capacity: int, chosen: Optional[np.ndarray] = None) -> Routing:
    """Route (S, T, E) probabilities: each token's `top_k` experts, its gates, and its slots. `chosen`: the
    (S, T, top_k) experts to take instead of the largest probabilities (`followed`'s, a reference's)."""
    if not isinstance(probs, np.ndarray) or probs.ndim != 3:
        raise SpmdsimError(f"route: probabilities of shape {np.shape(probs)!r} must be a numpy array (sequences, "
                           "tokens, experts)")
    S, T, E = probs.shape
    top_k, capacity = _counts(top_k, capacity, E)
    if chosen is not None:
        if np.shape(chosen) != (S, T, top_k):
            raise SpmdsimError(f"route: chosen experts of shape {np.shape(chosen)!r} must be {(S, T, top_k)!r}")
        experts = np.ascontiguousarray(chosen, dtype=np.int64)
    else:
        experts = ranked(probs, top_k)
    chosen = np.take_along_axis(probs, experts, axis=-1)
    total = chosen.sum(axis=-1, keepdims=True)
    # (a dry run's zeros have no probabilities: their gates stay zero, not 0 / 0)
    gates = chosen if top_k == 1 else chosen / np.where(total > 0, total, 1.0)
    return _placed(experts, gates, E, capacity)


def ranked(probs: np.ndarray, top_k: int) -> np.ndarray:
    """(S, T, top_k): each token's experts of the largest probabilities, ties to the lower index (stable)."""
    # (a copy: a view would keep the whole (S, T, E) ordering alive for the backward, E / k times its bytes)
    return np.ascontiguousarray(np.argsort(-probs, axis=-1, kind="stable")[..., :top_k])


def tie_margin(x: np.ndarray, router: np.ndarray, act: Any) -> np.ndarray:
    """(N, E): how far apart two computations' router logits x @ router of the same tokens may lie by rounding
    alone, for tokens x (N, D) of dtype `act` (the activations') and the router's weight (D, E).

    eps |x| @ |router| with eps = 2 D u + 4 u_act: each side's product rounds its D products' sum (|error| <=
    D u |x| @ |w|, u the unit roundoff of the product's dtype, float32 for a low-precision `act`, else
    float64), and each entry of the two sides' tokens may differ by up to two roundings of `act` (the layers
    before round alike but sum in other orders: the ranks' blocks, one process's whole rows).
    """
    dt = np.dtype(act)
    u = 2.0 ** -53 if dt == np.float64 else 2.0 ** -24
    u_act = 2.0 ** -8 if dt.kind == "V" else float(np.finfo(dt).eps) / 2  # (bfloat16: 8 significant bits)
    eps = 2 * x.shape[-1] * u + 4 * u_act
    return eps * (np.abs(x.astype(np.float64)) @ np.abs(router.astype(np.float64)))


def followed(logits: np.ndarray, margin: np.ndarray, own: np.ndarray, follow: np.ndarray) -> np.ndarray:
    """(S, T, k): each token's experts `follow` (another computation's choice: the ranks') where they are a
    top-k of its `logits` (S, T, E) to within `margin` (S, T, E, `tie_margin`), else `own` (S, T, k, this
    computation's top-k).

    A near-tie between two experts' scores may be decided either way by rounding: the ranks' logits and a
    single-process reference's differ by a unit in the last place in a few percent of entries (their sums run
    in other orders), so at a near-tie each may route a token to another expert, and a check that compared them
    would fail on a correct program. Following is accepted where no expert left out of `follow` scores above
    one in it by more than their two margins, and (top-2) its first choice is not below its second by more:
    a choice that only rounding can explain. Any other (a wrong expert, out of range, twice) is not followed,
    so the reference's own routing still tells a wrong one apart.
    """
    S, T, E = logits.shape
    k = own.shape[-1]
    if np.shape(follow) != own.shape:
        raise SpmdsimError(f"followed: the experts to follow of shape {np.shape(follow)!r} must be {own.shape!r}")
    follow = np.asarray(follow)
    valid = np.all((follow >= 0) & (follow < E), axis=-1)
    if k == 2:
        valid &= follow[..., 0] != follow[..., 1]
    f = np.where(valid[..., None], follow, own).astype(np.int64)
    inside = np.zeros((S, T, E), dtype=bool)
    np.put_along_axis(inside, f, True, axis=-1)
    high = np.take_along_axis(logits + margin, f, axis=-1)  # each followed expert's score at its highest
    low = np.take_along_axis(logits - margin, f, axis=-1)
    beaten = np.where(inside, -np.inf, logits - margin).max(axis=-1)  # the best left out, at its lowest
    take = valid & (beaten <= high.min(axis=-1))
    if k == 2:
        take &= low[..., 1] <= high[..., 0]
    return np.where(take[..., None], f, own)


def planned(sequences: int, tokens: int, experts: int, top_k: int, capacity: int, how: str,
            dtype: Any = np.float64) -> Routing:
    """A routing by rule, not by probabilities (a dry run's: see the module docstring): `how` "balanced"
    or "worst", for `sequences` groups of `tokens` tokens over `experts` experts; its gates of `dtype` (the
    router probabilities', as `route` gives them: float32 under a precision policy)."""
    if how not in ROUTINGS:
        raise SpmdsimError(f"planned routing {how!r} is not one of {', '.join(map(repr, ROUTINGS))}")
    top_k, capacity = _counts(top_k, capacity, experts)
    # Each call its own arrays (a layer's node keeps them, as a routed layer keeps its own), copied from the
    # plan: the (S, T, E) slot count that made them is the cost a dry run's every MoE layer paid again.
    made = _plan(sequences, tokens, experts, top_k, capacity, how)
    return Routing(made.experts.copy(), made.gates.astype(dtype), made.slots.copy(), made.counts.copy(),
                   made.capacity)


def _counts(top_k: object, capacity: object, experts: int) -> tuple[int, int]:
    """(top_k, capacity) as Python ints, or one line saying which is wrong.

    Both must be integers, not merely compare as numbers: a capacity of 2.5 kept slots 0, 1 and 2 (the test
    is slot >= capacity) while the Routing said 2, so `dispatch_rows` put each expert's third slot on the
    next expert's first (two assignments, one row); top_k 2.0 passed `in (1, 2)` and then failed as a
    slice index in a numpy traceback."""
    k, c = as_int(top_k), as_int(capacity)
    if k not in (1, 2) or k > experts:
        raise SpmdsimError(f"route: top_k {top_k!r} must be the integer 1 or 2 and at most the {experts} experts")
    if c is None or c < 1:
        raise SpmdsimError(f"route: capacity {capacity!r} must be an integer >= 1")
    return k, c


@functools.lru_cache(maxsize=64)
def _plan(sequences: int, tokens: int, experts: int, top_k: int, capacity: int, how: str) -> Routing:
    """`planned`'s Routing, once per its arguments (a pure function of them); never written, only copied."""
    choice = np.arange(top_k)[None, :]
    if how == "balanced":
        chosen = (np.arange(tokens)[:, None] * top_k + choice) % experts
    else:
        chosen = np.broadcast_to(choice, (tokens, top_k))
    picked = np.ascontiguousarray(np.broadcast_to(chosen, (sequences, tokens, top_k)), dtype=np.int64)
    return _placed(picked, np.full(picked.shape, 1.0 / top_k), experts, capacity)


def _placed(experts: np.ndarray, gates: np.ndarray, E: int, capacity: int) -> Routing:
    """The Routing of (S, T, k) chosen experts and gates: slots filled in GShard's order, then dropped."""
    S, T, top_k = experts.shape
    slots = np.empty((S, T, top_k), dtype=np.int64)
    filled = np.zeros((S, E), dtype=np.int64)
    for j in range(top_k):  # first choices take their slots before any second choice
        onehot = np.zeros((S, T, E), dtype=np.int64)
        np.put_along_axis(onehot, experts[..., j:j + 1], 1, axis=-1)
        place = np.cumsum(onehot, axis=1) - 1 + filled[:, None, :]
        slots[..., j] = np.take_along_axis(place, experts[..., j:j + 1], axis=-1)[..., 0]
        filled += onehot.sum(axis=1)
    counts = filled
    slots[slots >= capacity] = -1
    return Routing(experts, gates, slots, counts, int(capacity))


def gates_backward(probs: np.ndarray, routing: Routing, dgates: np.ndarray) -> np.ndarray:
    """d loss / d probs (S, T, E) from d loss / d gates (S, T, k)."""
    dprobs = np.zeros_like(probs)
    if routing.gates.shape[-1] == 1:
        np.put_along_axis(dprobs, routing.experts, dgates, axis=-1)
        return dprobs
    chosen = np.take_along_axis(probs, routing.experts, axis=-1)
    total = chosen.sum(axis=-1, keepdims=True)
    total = np.where(total > 0, total, 1.0)  # a dry run's zeros (route's gates are zero there too)
    # g_i = p_i / (p_0 + p_1): dp_j = (dg_j - sum_i dg_i g_i) / (p_0 + p_1)
    d = (dgates - (dgates * routing.gates).sum(axis=-1, keepdims=True)) / total
    np.put_along_axis(dprobs, routing.experts, d, axis=-1)
    return dprobs


def by_expert(routing: Routing) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per expert in order, its kept assignments as a one-process layer runs them: the (S, T, k) mask, their
    tokens' rows (sequence-major: s * T + t, in assignment order) and their gates."""
    S, T, _ = routing.experts.shape
    token = np.arange(S * T).reshape(S, T)[..., None] + np.zeros_like(routing.experts)
    for e in range(routing.counts.shape[1]):
        where = routing.kept & (routing.experts == e)
        yield where, token[where], routing.gates[where]


def dispatch_rows(routing: Routing, dropless: bool, ep: int = 1) -> tuple[np.ndarray, int, np.ndarray]:
    """(row of each assignment in the flat send buffer, -1 where dropped; the buffer's rows; rows per expert).

    With a capacity the buffer is (ep, S, E / ep, C) slots, destination-major for experts split over `ep`
    ranks (expert e on e // (E / ep)): row ((e // El * S + s) * El + e % El) * C + slot with El = E / ep,
    and every expert gets S * C rows; with ep 1, (S, E, C). Dropless: rows sorted by expert, then sequence,
    then slot, with no gaps (destination-major for any ep).
    """
    S, E = routing.counts.shape
    C = routing.capacity
    s = np.arange(S)[:, None, None]
    kept = routing.kept
    if not dropless:
        if ep < 1 or E % ep:
            raise SpmdsimError(f"dispatch_rows: ep {ep!r} must be a positive divisor of the {E} experts")
        El = E // ep
        e = routing.experts
        rows = np.where(kept, ((e // El * S + s) * El + e % El) * C + routing.slots, -1)
        return rows, S * E * C, np.full(E, S * C, dtype=np.int64)
    per = routing.counts  # dropless: every assignment kept, so counts are the rows
    before = np.cumsum(per, axis=0) - per  # rows of the same expert in earlier sequences
    start = np.cumsum(per.sum(axis=0)) - per.sum(axis=0)  # each expert's first row
    base = start[None, :] + before  # (S, E)
    rows = np.where(kept, base[s, routing.experts] + routing.slots, -1)
    return rows, int(per.sum()), per.sum(axis=0).astype(np.int64)
