"""Exchanges too large to list box by box: bytes per rank from the block grid, boxes on demand.

Pure numpy. Even splits cut every tensor dim into equal blocks, so the boxes
an Exchange moves follow from each rank's block index per dim: a target block
``j`` of width ``wt`` meets the source blocks ``j*wt // ws`` to
``ceil((j+1)*wt / ws) - 1`` of width ``ws``. `exchange_transfers` lists every
box and picks each sender greedily (least loaded replica first); that is
O(boxes x replicas) in time and memory, and the boxes alone grow faster than
the devices (65,536 ranks that each gather a row of 4,096 blocks move 2**28
boxes). Past `FOLD_CHOICES` such choices the planner folds the exchange
instead (`folded_exchange`): ranks with the same target block, partial-axis
coordinates and sender choice form one class, and per-rank bytes come from
the classes in O(ranks + classes x boxes per class). The boxes themselves
are worked out per rank when asked for (`FoldedTransfers.sends/receives`,
what one rank's executor needs) or all at once by iterating.

Who sends: a box held by one rank (per partial-axis coordinates) has one
possible sender, the same as the greedy's. A box with replicas (the source
replicates it over `copy` axes) comes from the replica whose index over those
axes is the destination's coordinate sum modulo the replica count: a fixed
rule any rank evaluates alone, spreading a box's destinations over its
replicas (the greedy balances by load, so the busiest sender may differ).
"""
from __future__ import annotations

import math
from functools import cached_property
from typing import Iterator

import numpy as np

from ...layouts.layout import TensorLayout
from ..transfer import Transfer
from .steps import Exchange

__all__ = ["FOLD_CHOICES", "FoldedTransfers", "exchange_choices", "foldable", "folded_exchange"]

#: Sender choices (boxes moved x replicas each could come from) above which an exchange is folded:
#: the greedy's listing takes about 35 us a choice, so 2**16 is about two seconds.
FOLD_CHOICES = 1 << 16
#: Box pairs worked on at once when a replicated exchange sums its classes (bounds the arrays).
_CHUNK = 1 << 20


def _ceil_div(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


class _Grid:
    """Block indices of every rank before and after, per dim, and who holds which box."""

    def __init__(self, before: TensorLayout, after: TensorLayout, shape: tuple) -> None:
        self.shape = shape
        n = before.layout.num_devices
        self.n = n
        self.ws = tuple(s // before.num_shards(d) for d, s in enumerate(shape))
        self.wt = tuple(s // after.num_shards(d) for d, s in enumerate(shape))
        self.ns = tuple(before.num_shards(d) for d in range(len(shape)))
        self.nt = tuple(after.num_shards(d) for d in range(len(shape)))
        self.si = np.stack([before.layout.group_indices(axes) for axes in before.tensor_map], axis=1) \
            if shape else np.zeros((n, 0), dtype=np.int64)
        self.ti = np.stack([after.layout.group_indices(axes) for axes in after.tensor_map], axis=1) \
            if shape else np.zeros((n, 0), dtype=np.int64)
        self.key = before.layout.group_indices(before.partial)
        self.copy_axes = before.replicated_axes
        self.replicas = before.layout.group_size(self.copy_axes)
        self.copy = before.layout.group_indices(self.copy_axes)
        self.keys = before.layout.group_size(before.partial)
        self.sbox = self._linear(self.si, self.ns)
        self.tbox = self._linear(self.ti, self.nt)
        layout = before.layout
        ranks = np.arange(n, dtype=np.int64)
        # The sender rule: the destination's index over the copy axes plus its other coordinates,
        # modulo the replica count (a box's destinations differ in one or the other).
        others = sum(((ranks // s) % k for s, k, a in zip(layout.strides, layout.device_matrix,
                                                        layout.alias_name) if a not in self.copy_axes),
                     np.zeros(n, dtype=np.int64))
        self.choice = (self.copy + others) % self.replicas
        self.holder = np.empty(n, dtype=np.int64)
        self.holder[(self.sbox * self.keys + self.key) * self.replicas + self.copy] = ranks
        # Per dim, the first source block each target block meets and how many (>= 1).
        self.first = [(self.ti[:, d] * wt) // ws for d, (wt, ws) in enumerate(zip(self.wt, self.ws))]
        self.meets = [_ceil_div((self.ti[:, d] + 1) * wt, ws) - self.first[d]
                      for d, (wt, ws) in enumerate(zip(self.wt, self.ws))]

    @staticmethod
    def _linear(index: np.ndarray, sizes: tuple) -> np.ndarray:
        out = np.zeros(index.shape[0], dtype=np.int64)
        for d, k in enumerate(sizes):
            out = out * k + index[:, d]
        return out

    @cached_property
    def held(self) -> np.ndarray:
        """Per rank, the elements of its new block it already holds."""
        out = np.ones(self.n, dtype=np.int64)
        for d, (ws, wt) in enumerate(zip(self.ws, self.wt)):
            lo = np.maximum(self.si[:, d] * ws, self.ti[:, d] * wt)
            hi = np.minimum((self.si[:, d] + 1) * ws, (self.ti[:, d] + 1) * wt)
            out *= np.clip(hi - lo, 0, None)
        return out

    @cached_property
    def receives_from(self) -> np.ndarray:
        """Per rank, how many boxes it receives (source blocks its new block meets, less its own)."""
        count = np.ones(self.n, dtype=np.int64)
        for m in self.meets:
            count *= m
        return count - (self.held > 0)

    def box_of(self, index: tuple) -> tuple:
        """The global box of the source block with per-dim indices `index`."""
        return tuple((i * w, (i + 1) * w) for i, w in zip(index, self.ws))

    def target_box(self, rank: int) -> tuple:
        return tuple((int(j) * w, (int(j) + 1) * w) for j, w in zip(self.ti[rank], self.wt))

    @cached_property
    def first_holder(self) -> np.ndarray:
        """Per source box id, the lowest rank holding it (the greedy's box order)."""
        out = np.full(math.prod(self.ns), self.n, dtype=np.int64)
        np.minimum.at(out, self.sbox, np.arange(self.n, dtype=np.int64))
        return out

    @cached_property
    def by_target(self) -> tuple[np.ndarray, np.ndarray]:
        """Ranks sorted by target box id, and where each box id's ranks start."""
        order = np.argsort(self.tbox, kind="stable")
        starts = np.searchsorted(self.tbox[order], np.arange(math.prod(self.nt) + 1))
        return order, starts


def exchange_choices(before: TensorLayout, after: TensorLayout, shape: tuple) -> int:
    """Boxes `exchange_transfers` would list times the replicas it picks each sender among."""
    shape = tuple(shape)
    if not shape or 0 in shape:
        return 0
    grid = _Grid(before, after, shape)
    return int(grid.receives_from.sum()) * grid.replicas


class FoldedTransfers:
    """An Exchange's boxes (src, dst, box), worked out per rank or listed on iteration.

    Iterating gives the order `exchange_transfers` uses (by destination, then
    by box in the order of the lowest rank holding it); `sends(rank)` and
    `receives(rank)` give one rank's part of that list without the rest.
    """

    def __init__(self, before: TensorLayout, after: TensorLayout, shape: tuple) -> None:
        self.before, self.after, self.shape = before, after, tuple(shape)
        self._grid = _Grid(before, after, self.shape)

    def _sender(self, box_id: int, dst: int) -> int:
        g = self._grid
        return int(g.holder[(box_id * g.keys + g.key[dst]) * g.replicas + g.choice[dst]])

    def receives(self, dst: int) -> list[Transfer]:
        """The boxes `dst` receives, in list order."""
        g = self._grid
        if g.receives_from[dst] == 0:
            return []
        want = g.target_box(dst)
        own = int(g.sbox[dst])
        ranges = [range(int(g.first[d][dst]), int(g.first[d][dst] + g.meets[d][dst])) for d in range(len(g.shape))]
        found = []
        for index in np.ndindex(*(len(r) for r in ranges)):
            block = tuple(r[k] for r, k in zip(ranges, index))
            box_id = 0
            for i, k in zip(block, g.ns):
                box_id = box_id * k + i
            if box_id == own:
                continue  # the part it already holds is copied locally
            box = g.box_of(block)
            part = tuple((max(a, c), min(b, e)) for (a, b), (c, e) in zip(box, want))
            found.append((int(g.first_holder[box_id]), Transfer(self._sender(box_id, dst), dst, part)))
        found.sort(key=lambda item: item[0])
        return [t for _, t in found]

    def sends(self, src: int) -> list[Transfer]:
        """The boxes `src` sends, in list order (by destination)."""
        g = self._grid
        order, starts = g.by_target
        lo = [(int(i) * ws) // wt for i, ws, wt in zip(g.si[src], g.ws, g.wt)]
        hi = [-(-((int(i) + 1) * ws) // wt) for i, ws, wt in zip(g.si[src], g.ws, g.wt)]
        own = int(g.sbox[src])
        dsts = []
        for block in np.ndindex(*(h - l for l, h in zip(lo, hi))):
            box_id = 0
            for b, l, k in zip(block, lo, g.nt):
                box_id = box_id * k + b + l
            for q in order[starts[box_id]:starts[box_id + 1]].tolist():
                if g.sbox[q] != own and self._sender(own, q) == src:
                    dsts.append(q)
        out = []
        for q in sorted(dsts):
            mine = self.receives(q)
            out.extend(t for t in mine if t.src == src)
        return out

    def __iter__(self) -> Iterator[Transfer]:
        for dst in range(self._grid.n):
            yield from self.receives(dst)

    def __len__(self) -> int:
        return int(self._grid.receives_from.sum())

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, index):
        return self._listed[index]

    @cached_property
    def _listed(self) -> tuple:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FoldedTransfers):
            return (self.before, self.after, self.shape) == (other.before, other.after, other.shape)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((FoldedTransfers, self.before, self.after, self.shape))

    def __repr__(self) -> str:
        return f"FoldedTransfers({self.before} -> {self.after}, shape {self.shape}, {len(self):,} boxes)"

    # -- per-rank figures, without listing the boxes ------------------------------------------
    @cached_property
    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, the elements it sends and the ranks it sends to (int64 arrays)."""
        g = self._grid
        if g.replicas == 1:
            # One sender per box: a rank sends its block to every rank whose new block meets it
            # (each target block m times within its partial-axis class), less what it keeps.
            m = g.n // (g.keys * math.prod(g.nt))
            sent = m * math.prod(g.ws) - g.held
            peers = np.ones(g.n, dtype=np.int64)
            for d, (ws, wt) in enumerate(zip(g.ws, g.wt)):
                i = g.si[:, d]
                peers *= _ceil_div((i + 1) * ws, wt) - (i * ws) // wt
            return sent, m * peers - (g.held > 0)
        return self._class_counts()

    def _class_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """`counts` with replicas: destinations folded into classes (target box, key, choice)."""
        g = self._grid
        code = (g.tbox * g.keys + g.key) * g.replicas + g.choice
        classes, first, weight = np.unique(code, return_index=True, return_counts=True)
        sent = np.zeros(g.n, dtype=np.int64)
        peers = np.zeros(g.n, dtype=np.int64)
        per_class = np.ones(len(classes), dtype=np.int64)
        for m in g.meets:
            per_class *= m[first]
        bounds = np.cumsum(per_class)
        start = 0
        while start < len(classes):
            stop = int(np.searchsorted(bounds, (bounds[start - 1] if start else 0) + _CHUNK, side="right"))
            stop = max(stop, start + 1)
            self._add_classes(first[start:stop], weight[start:stop], sent, peers)
            start = stop
        # A rank whose own block meets its new block copies that part: no transfer.
        keep = np.nonzero(g.held > 0)[0]
        sender = g.holder[(g.sbox[keep] * g.keys + g.key[keep]) * g.replicas + g.choice[keep]]
        np.subtract.at(sent, sender, g.held[keep])
        np.subtract.at(peers, sender, 1)
        return sent, peers

    def _add_classes(self, reps: np.ndarray, weight: np.ndarray, sent: np.ndarray, peers: np.ndarray) -> None:
        """Add the boxes of some classes (each given by one member and its size) to their senders."""
        g = self._grid
        rows = np.arange(len(reps), dtype=np.int64)  # which class each pair belongs to
        box = np.zeros(len(reps), dtype=np.int64)
        size = np.ones(len(reps), dtype=np.int64)
        for d, (ws, wt) in enumerate(zip(g.ws, g.wt)):
            count = g.meets[d][reps][rows]
            step = np.arange(count.sum(), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
            rows, box, size = np.repeat(rows, count), np.repeat(box, count), np.repeat(size, count)
            i = g.first[d][reps][rows] + step
            j = g.ti[reps[rows], d]
            box = box * g.ns[d] + i
            size = size * (np.minimum((i + 1) * ws, (j + 1) * wt) - np.maximum(i * ws, j * wt))
        dst = reps[rows]
        sender = g.holder[(box * g.keys + g.key[dst]) * g.replicas + g.choice[dst]]
        np.add.at(sent, sender, size * weight[rows])
        np.add.at(peers, sender, weight[rows])

    @cached_property
    def peers(self) -> int:
        """At least the most distinct ranks any rank talks to: the larger of its senders and receivers.

        (The listed exchange counts their union; the fold does not pair them up.)
        """
        g = self._grid
        return int(max(g.receives_from.max(initial=0), self.counts[1].max(initial=0)))


def folded_exchange(before: TensorLayout, after: TensorLayout, shape: tuple, itemsize: int) -> Exchange:
    """The Exchange from `before` to `after` with its bytes per rank and boxes on demand."""
    transfers = FoldedTransfers(before, after, shape)
    g = transfers._grid
    sent, sends_to = transfers.counts
    # Elements fit int64 (`foldable`); bytes are exact Python ints.
    received = [(math.prod(g.wt) - h) * itemsize for h in g.held.tolist()]
    block = math.prod(g.ws)
    # What the cost model prices as local packing: all a rank sends, unless its whole block to one peer.
    whole = (sends_to == 1) & (sent == block)
    copied = int(sent[~whole].max(initial=0)) * itemsize
    return Exchange(before, after, (), tuple(v * itemsize for v in sent.tolist()), tuple(received),
                    transfers=transfers, peers=transfers.peers, bytes_copied=copied)


def foldable(before: TensorLayout, after: TensorLayout, shape: tuple) -> bool:
    """Whether to fold the exchange: more than FOLD_CHOICES sender choices, element counts in int64."""
    shape = tuple(shape)
    if not shape or 0 in shape or math.prod(shape) * before.layout.num_devices >= 1 << 62:
        return False
    if before.uneven_dims(shape) or after.uneven_dims(shape):
        return False  # the fold works on a grid of equal blocks; unequal ones are listed box by box
    return most_choices(before, after, shape) > FOLD_CHOICES and exchange_choices(before, after, shape) > FOLD_CHOICES


def most_choices(before: TensorLayout, after: TensorLayout, shape: tuple) -> int:
    """At least `exchange_choices` of an even exchange, without its grid: a target block of width wt meets at
    most ceil(wt / ws) + 1 source blocks of width ws per dim, so no rank receives more boxes than their
    product, each from at most the source's replica count."""
    most = before.layout.num_devices * before.layout.group_size(before.replicated_axes)
    for d, s in enumerate(shape):
        most *= -(-(s // after.num_shards(d)) // (s // before.num_shards(d))) + 1
    return most
