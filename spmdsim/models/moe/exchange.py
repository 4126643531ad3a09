"""The MoE layer's exchanges over ep: a layer's plan, the dispatch and combine that move its tokens and their
reorderings of the capacity's slots (spmdsim.models.moe.layer)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from operator import setitem
from typing import Any, Callable, Optional
import numpy as np
from ...base.buffers import contiguous, into
from ...programs.plan.messages import BlockAllreduce, BlockAlltoall, BlockAlltoallv
from ...runtime import executor
from ...runtime.sim.dry import dry_run_active, zeros
from .config import MoEConfig
from .fold import Fold, fold_of
from ..axes import EXPERT, TENSOR


#: The layer's exchanges as the step records the executor runs (spmdsim.programs.plan.messages): a capacity's
#: slots both ways and the dropless counts (an Alltoall of equal blocks over ep), and the experts' fc2 output
#: (and fc1's input gradient) summed over tp. A dropless step's tokens: its _Exchange's BlockAlltoallv.
SLOTS = BlockAlltoall((EXPERT,))
EXPERTS_SUM = BlockAllreduce((TENSOR,))


def records(fold: Fold) -> tuple:
    """(the slots' and counts' Alltoall, the experts' fc2 Allreduce) over `fold`'s ep and etp axes
    (spmdsim.models.moe.fold): `SLOTS` and `EXPERTS_SUM` unfolded; one pair a fold."""
    seen = _RECORDS.get(fold)
    if seen is None:
        seen = _RECORDS[fold] = ((SLOTS, EXPERTS_SUM) if fold.ep_axes == (EXPERT,) and fold.etp_axes == (TENSOR,)
                                 else (BlockAlltoall(fold.ep_axes), BlockAllreduce(fold.etp_axes or (TENSOR,))))
    return seen


_RECORDS: dict = {}  # Fold -> `records`' pair (a handful: one a mesh shape and etp)


@dataclass(eq=False)
class _Plan:
    """What one layer's exchanges need besides the step's counts (`name`: the layer's, "h1"): `exchange`
    gives this step's _Exchange."""

    mesh: Any
    moe: MoEConfig
    capacity: int
    bl: int
    El: int
    name: str
    #: (per_expert's bytes, got's, their _Exchange) made last: a step's kernels ask seven times (a replay's with
    #: the same captured arrays, rewritten each step, so the counts are compared, not the arrays' identity).
    last: Optional[tuple] = field(default=None, repr=False)
    #: its layer's _Facts for MoEStats (`_facts`), made on first use
    facts: Optional[Any] = field(default=None, repr=False)
    #: the experts' axes on the mesh (spmdsim.models.moe.fold), from the config's etp
    fold: Fold = field(init=False, repr=False)
    #: the experts' tp, etp (w2's rows split over it: fc2's output summed there)
    tp: int = field(init=False, repr=False)
    #: the fold's step records (`records`): the slots' Alltoall over ep, fc2's Allreduce over etp
    slots: Any = field(init=False, repr=False)
    sums: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.fold = fold_of(self.mesh.layout, self.moe.etp)
        self.tp = self.fold.etp
        self.slots, self.sums = records(self.fold)

    def exchange(self, per_expert: np.ndarray, got: Optional[np.ndarray]) -> "_Exchange":
        last = self.last
        if last is not None and (not self.moe.dropless or (got is not None and last[0] == per_expert.tobytes()
                                                          and last[1] == got.tobytes())):
            return last[2]  # with a capacity nothing depends on the counts (dropless: the same counts' bytes)
        move = _Exchange(self.mesh, self.moe, self.capacity, self.bl, self.El, per_expert, f"{self.name} dispatch",
                         f"{self.name} combine", got)
        if not self.moe.dropless:  # (called outside a kernel while capturing: `_dispatched`; nothing copied)
            self.last = (None, None, move)
        elif got is not None:  # (without `got`, dropless exchanges the counts itself)
            self.last = (per_expert.tobytes(), got.tobytes(), move)  # (the layer's int64 counts, as bytes)
        return move

    def made(self, per_expert: np.ndarray, got: Optional[np.ndarray]) -> "_Exchange":
        """This step's _Exchange as the layer's exchanges made it (`last`), for the FLOP count, outside a kernel:
        `exchange` there compares the counts, which while capturing are traced arrays: inside a kernel a
        dropless capture would record each comparison as a guard (np.array_equal) that a replay with other
        counts fails on, and a count under a counter would not be the step's alone. Made by `exchange` where
        none was yet."""
        last = self.last
        return last[2] if last is not None else self.exchange(per_expert, got)


def _plan(mesh: Any, moe: MoEConfig, T: int, bl: int, El: int, name: str) -> _Plan:
    """Layer `name`'s _Plan on `mesh` for `bl` sequences of `T` tokens. With a capacity nothing in it depends on
    a step's counts: one plan a signature, kept by the mesh with its collectives' plans (``mesh._plans``, freed
    when it closes), its _Exchange made once. Dropless: a new one each call (its exchange follows the counts)."""
    if moe.dropless:
        return _Plan(mesh, moe, moe.capacity(T), bl, El, name)
    key = ("moe plan", id(moe), T, bl, name)
    seen = mesh._plans.get(key)
    if seen is None or seen[0] is not moe:
        seen = mesh._plans[key] = (moe, _Plan(mesh, moe, moe.capacity(T), bl, El, name))  # (held: its id is not reused)
    return seen[1]


def _by_expert(move: "_Exchange", got: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """A capacity dispatch's arrived slots (ep, bl, El, C) in the experts' order (El, ep, bl, C): rows (into
    `out` when given)."""
    return move.by_expert(got, out)


def _by_source(move: "_Exchange", rows: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """A capacity combine's expert-major rows (El, ep, bl, C) in the send buffer's order (ep, bl, El, C) (into
    `out` when given)."""
    return move.by_source(rows[:move.arrived], out)


def _bind_reorder(func: Callable, args: tuple, kwargs: dict) -> Optional[Callable]:
    """A captured step's `_by_expert` or `_by_source` call as its replay makes it (spmdsim.runtime.replay.kernel's
    `bind`): the copy of the source's slots, seen in the destination's order, into the captured result, both
    views made once (what the call itself works out again each time: the reshapes, the transpose, its
    frames); None (the call itself) where the arrays are not as a capture leaves them."""
    kwargs = dict(kwargs)
    out = kwargs.pop("out", None)
    if len(args) != 2 or kwargs or not isinstance(args[0], _Exchange) or type(out) is not np.ndarray:
        return None
    move, src = args
    if type(src) is not np.ndarray or move.dropless or src.dtype != out.dtype or not out.flags.c_contiguous:
        return None
    D = src.shape[-1]
    if func is _by_expert:
        seen = src.reshape(move.ep, move.bl, move.El, move.C, D).transpose(2, 0, 1, 3, 4)
    else:
        seen = src[:move.arrived].reshape(move.El, move.ep, move.bl, move.C, D).transpose(1, 2, 0, 3, 4)
    into_ = out.reshape(seen.shape)  # (a view: `out` is C-ordered)
    if np.may_share_memory(into_, seen):
        return None
    return partial(setitem, into_, Ellipsis, seen)  # (no Python frame: a C function's partial)


def _dispatch(plan: _Plan, send: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
              most: Optional[int], label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The dispatch's exchange of `send`: what arrived, expert-major; with `most`, in `most` rows (zero past
    what arrived). `out`: the array to write it into (a replay's: its captured result)."""
    move = plan.exchange(per_expert, got)
    if most is None:
        return move.dispatch(send, label, out)
    rows = np.empty((most, send.shape[1]), send.dtype) if out is None else out
    move.dispatch(send, label, rows[:move.arrived])
    rows[move.arrived:] = 0.0
    return rows


def _combine(plan: _Plan, rows: np.ndarray, per_expert: np.ndarray, got: Optional[np.ndarray],
             label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The combine's exchange of the expert-major `rows` (those that arrived, of a buffer that may be longer):
    the send buffer's rows, back on the ranks the tokens came from (into `out` when given)."""
    move = plan.exchange(per_expert, got)
    return move.combine(rows[:move.arrived], label, out)


class _Exchange:
    """One layer's dispatch and combine on one rank: the Alltoall (capacity) or the counts' Alltoall and the
    Alltoallv (dropless) over ep, and where each local expert's rows lie in what arrives; at ep 1 no call."""

    def __init__(self, mesh: Any, moe: MoEConfig, capacity: int, bl: int, El: int, per_expert: np.ndarray,
                 dispatch_label: str, combine_label: str, got: Optional[np.ndarray] = None) -> None:
        self.mesh, self.dropless, self.C, self.bl, self.El = mesh, moe.dropless, capacity, bl, El
        self.labels = (dispatch_label, combine_label)
        self.dry = dry_run_active()  # zeros: no rows to put in order
        self.fold = fold = fold_of(mesh.layout, moe.etp)
        self.slots = records(fold)[0]
        ep = fold.ep
        self.ep = ep
        if not self.dropless:
            n = ep * bl * capacity
            self.ranges = [(e * n, (e + 1) * n) for e in range(El)]
            self.send_rows = [bl * El * capacity] * ep
            self.recv_rows = self.send_rows
            self.arrived = El * n
            return
        # Dropless: each member's counts for my experts, (ep, El), by one Alltoall of the counts (`got`: done).
        if got is None:
            got = executor.run_block(mesh, self.slots, np.ascontiguousarray(per_expert, dtype=np.int64),
                                     f"{dispatch_label} counts") if ep > 1 else per_expert.astype(np.int64)
        got = got.reshape(ep, El)
        if self.dry:  # every member routed as this rank did (a dry run's rule): each sends me my experts' share
            me = mesh.group_info(fold.ep_axes)[2]
            got = np.tile(np.asarray(per_expert[me * El:(me + 1) * El], np.int64), (ep, 1))
        self.send_rows = np.add.reduce(np.asarray(per_expert, np.int64).reshape(ep, El), 1).tolist()
        self.recv_rows = np.add.reduce(got, 1).tolist()
        self.arrived = sum(self.recv_rows)
        self.tokens = BlockAlltoallv(fold.ep_axes, tuple(self.send_rows), tuple(self.recv_rows))
        self.returned = self.tokens.conjugate()
        # Arrived rows are by source, then local expert; the experts want them by expert, then source: block
        # (s, e) of got[s, e] rows starts at `starts` in what arrived and at `at` in the experts' order.
        flat = got.reshape(-1)
        starts = (np.cumsum(flat) - flat).reshape(ep, El).T.reshape(-1)  # by (e, s)
        sizes = got.T.reshape(-1)
        at = np.cumsum(sizes) - sizes
        self.order = (np.repeat(starts - at, sizes) + np.arange(self.arrived)).astype(np.int64, copy=False)
        per = np.add.reduce(got, 0)
        ends = np.cumsum(per)
        self.ranges = list(zip((ends - per).tolist(), ends.tolist()))

    def dispatch(self, send: np.ndarray, label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Send rows (the routing's buffer, destination-major) -> expert-major rows of this rank's experts (into
        `out`, (arrived, D), when given)."""
        label = label or self.labels[0]
        if not self.dropless:  # the send buffer is (ep, bl, El, C) slots: each member's share is one block
            got = executor.run_block(self.mesh, self.slots, send, label) if self.ep > 1 else send
            return got if self.dry else self.by_expert(got, out)
        if self.ep == 1:  # a group of one: no exchange (no call), and rows by expert from one source are in order
            return into(out, send)
        got = executor.run_block(self.mesh, self.tokens, send, label)
        if self.dry:
            return got
        return got[self.order] if out is None else np.take(got, self.order, axis=0, out=out)

    def by_expert(self, got: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """A capacity dispatch's arrived slots as expert-major rows (into `out`, (arrived, D), when given)."""
        D = got.shape[-1]
        # (ep, bl, El, C, D) -> (El, ep, bl, C, D): each local expert's slots together
        by_expert = got.reshape(self.ep, self.bl, self.El, self.C, D).transpose(2, 0, 1, 3, 4)
        if out is None:
            return contiguous(by_expert).reshape(-1, D)
        np.copyto(out.reshape(by_expert.shape), by_expert)
        return out

    def by_source(self, rows: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """A capacity combine's expert-major rows as the send buffer's slots, each member's block together (into
        `out` when given)."""
        D = rows.shape[1]  # (El, ep, bl, C, D) -> (ep, bl, El, C, D)
        by_source = rows.reshape(self.El, self.ep, self.bl, self.C, D).transpose(1, 2, 0, 3, 4)
        if out is None:
            return contiguous(by_source).reshape(-1, D)
        np.copyto(out.reshape(by_source.shape), by_source)
        return out

    def combine(self, rows: np.ndarray, label: Optional[str] = None, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Expert-major rows -> the send buffer's rows on the ranks the tokens came from (dispatch reversed; into
        `out` when given)."""
        label = label or self.labels[1]
        if not self.dropless:
            if self.dry:  # at ep 1, slots already in the experts' order: the real step's `rows` itself, as here
                blocks = rows if self.ep == 1 and (self.El == 1 or self.bl == 1) else zeros(rows.shape, rows.dtype)
            else:
                blocks = self.by_source(rows)
            if self.ep > 1:
                return executor.run_block(self.mesh, self.slots, blocks, label, out)
            return into(out, blocks)
        if self.ep == 1:  # a group of one: no exchange (no call); one source's rows by expert are in order already
            return into(out, rows)
        if self.dry:
            return executor.run_block(self.mesh, self.returned, rows, label)
        by_source = np.empty_like(rows)
        by_source[self.order] = rows
        return into(out, executor.run_block(self.mesh, self.returned, by_source, label))
