"""What a pipeline stage holds in a step (spmdsim.models.gpt.pipeline): the moment its schedule held the
most (`_Most`), and a dry run's cells and message buffers, shared by its repeated cells."""
from __future__ import annotations

from typing import Any, Optional
import math
import numpy as np
from ...base import buffers
from ...base.context import current
from ...base.flops import holding
from .memory import MASKS
from ...nn.autograd import kept_bytes
from ...nn.ops.fp8_linear import WEIGHT_COPIES
from .step_looks import _look, _look_blocks, _look_walk, _report, _steady
from ...base.flops import counting


class _Most:
    """What `train_pipelined(memory=True)` looks at on one rank in one step: the bytes each chunk's
    forward keeps for its backward (its first microbatch's graph, spmdsim.nn.autograd.kept_bytes: every
    microbatch of a chunk keeps blocks of the same shapes), summed over the microbatch-chunks held at
    each moment; the moment the schedule held the most, and after the backward and the step."""

    def __init__(self, optimizer: Any, params: list, sums: Any = None, copies: Any = None) -> None:
        self.optimizer, self.params, self.grad_sums = optimizer, params, sums  # (ZeRO-0's GradBuffer, or None)
        self.buffer_owners: list = [None]  # the walk's looks' gradient buffers' owners (step_looks._look_walk)
        # chunk -> its weights' e4m3 copies (an FP8 step's: cast by its first microbatch, held once for the step,
        # spmdsim.nn.ops.fp8_linear.cast), or None
        self.copies = copies
        self.kept_of: dict = {}  # chunk -> {kind: bytes}
        self.sum_of: dict = {}  # chunk -> its kept bytes in all
        self.copied: dict = {}  # chunk -> its weights' e4m3 copies' bytes, held from its first forward on
        self.most = -1  # the most bytes kept at once so far
        self.live: dict = {}  # chunk -> its microbatches live now (forward run, backward not yet)
        self.total = 0  # the bytes they keep
        self.moments: dict = {}  # as spmdsim.models.gpt.step_looks._look records them
        # `live` when the schedule last held more than ever, until that moment is looked at (`_flush`): a look
        # reads the optimizer's and the gradients' bytes, which only a backward or the step changes, so a rise
        # is looked at once, before the next of them (a 64-stage 1F1B's first stage rises 64 forwards in a row).
        self.rise: Optional[dict] = None

    def forward(self, chunk: int, out: Any) -> None:
        """A forward of `chunk` ran (its output `out`): what the live microbatch-chunks keep, summed so far."""
        # (the weights' e4m3 copies, held once a step, are left out of each microbatch's kept bytes)
        if chunk not in self.kept_of:  # boolean dropout masks (kept="megatron") under a kind of their own
            copies = self._copies(chunk)
            values, masks = ({}, {}) if isinstance(out, _Stand) else kept_bytes([out], exclude=self.params + copies,
                                                                                 masks=True)
            self.kept_of[chunk] = {**values, **{kind + MASKS: n for kind, n in masks.items() if n}}
            self.sum_of[chunk] = sum(self.kept_of[chunk].values())
            self.copied[chunk] = buffers.owned_bytes(t.local for t in copies)
            self.total += self.copied[chunk]
        elif holding() and not isinstance(out, _Stand):
            # A later microbatch's blocks are the rank's too while it is live: marked as held (spmdsim.base.flops.hold)
            # for the counters that record blocks, as the first's are (unmarked, a real step counted every block
            # its products and kernels read or wrote as the moment's own, where its dry run, which runs no later
            # cell, counted the first's).
            kept_bytes([out], exclude=self.params + self._copies(chunk))
        self.live[chunk] = self.live.get(chunk, 0) + 1
        self.total += self.sum_of[chunk]
        if self.total > self.most:
            self.most = self.total
            self.rise = dict(self.live)

    def _copies(self, chunk: int) -> list:
        """Chunk `chunk`'s weights' e4m3 copies as `kept_bytes` excludes tensors (none without FP8)."""
        return [] if self.copies is None else [_Block(q) for q in self.copies(chunk)]

    def _flush(self) -> None:
        """Look at the last rise (see `rise`), if not yet."""
        if self.rise is None:
            return
        kinds: dict = {}
        for c, times in self.rise.items():  # (every chunk that ran a forward: its weights' copies held)
            if self.copied.get(c):
                kinds[WEIGHT_COPIES] = kinds.get(WEIGHT_COPIES, 0) + self.copied[c]
            if times:
                for kind, n in self.kept_of[c].items():
                    kinds[kind] = kinds.get(kind, 0) + n * times
        self.rise = None
        _look(self.moments, "the most activations held", self.optimizer, self.params, kinds, self.grad_sums)

    def backward(self, chunk: int) -> None:
        """A backward of `chunk` is about to run: one of its microbatches' kept bytes are no longer live."""
        self._flush()
        self.live[chunk] -= 1
        self.total -= self.sum_of[chunk]

    def walk(self, grads: dict) -> None:
        """A backward's look at a stop of its walk: ZeRO-2's before it reduces a bucket, ZeRO-1's and ZeRO-0's as
        gradients go into the buffer, ZeRO-0's before each bucket's Allreduce
        (spmdsim.models.gpt.step_looks._look_walk)."""
        _look_walk(self.moments, self.optimizer, self.params, grads, self.grad_sums, self.buffer_owners)

    def sums(self, blocks: list) -> None:
        """A ZeRO-0 step's look as `reduce_grads` sums a bucket or a leaf alone, where the gradients are not all
        in their buffer's views (spmdsim.models.gpt.step_looks._look_blocks; the buffer held beside them)."""
        _look_blocks(self.moments, self.params, blocks, self.grad_sums)

    def look(self, moment: str, kept: Optional[dict] = None) -> None:
        self._flush()
        _look(self.moments, moment, self.optimizer, self.params, kept, self.grad_sums)

    def report(self, step: int, replayed: bool = False) -> Any:
        """The step's MemoryReport; `replayed`: a replay of the step these looks were made in (which runs none
        of their Python): its bytes as any later step's (spmdsim.models.gpt.step_looks._steady)."""
        self._flush()
        moments = _steady(self.moments) if replayed else self.moments
        return _report(step, moments, buffers.owned_bytes(p.local for p in self.params))


class _Block:
    """A block as `kept_bytes` takes what it leaves out (a tensor's `local`)."""

    __slots__ = ("local",)

    def __init__(self, local: np.ndarray) -> None:
        self.local = local


class _Stand:
    """A dry run's repeated forward cell: the output's block (zeros) and, while it lives, the bytes the first
    cell of its kind kept for its backward (counted on the run's Meter)."""

    __slots__ = ("local", "input", "__weakref__")

    def __init__(self, local: np.ndarray) -> None:
        self.local, self.input = local, None


class _DryCells:
    """A dry run's cells after the first of each kind ((F or B, chunk)): every microbatch's cell of one kind
    runs the same operators on blocks of the same shapes, so the first one runs (dry) and is measured (its
    trace rows, the bytes it keeps, the bytes it holds at its peak, its matrix products) and the later ones
    add those figures without running again: ranks that do the same work are computed once, and so are
    microbatches."""

    def __init__(self, local_shape: tuple, blocks: "_DryBlocks") -> None:
        self.local_shape, self.blocks = local_shape, blocks
        self.context = current()  # the rank's: its open traces and FLOP counters, its Meter
        # (kind, chunk) -> (trace rows, bytes kept after it, bytes above the start at its peak, its products:
        # a spmdsim.base.flop_counts.FlopCounter)
        self.seen: dict = {}
        self.repeats: dict = {}  # (kind, chunk) -> cells repeated, whose products `flush` adds at once

    def flush(self) -> None:
        """Add the repeated cells' matrix products to the FLOP counters open on this rank (spmdsim.base.flops.
        counting): once per kind of cell, times its repeats, at the end of the step's program."""
        for counter in current().flops:
            for key, times in self.repeats.items():
                counter.merge(self.seen[key][3], times)
        self.repeats.clear()

    def again(self, key: tuple) -> bool:
        """True (and the first cell's rows, peak and products added) if a cell of this kind ran already."""
        seen = self.seen.get(key)
        if seen is None:
            return False
        rows, _, transient, _ = seen
        context = self.context
        for trace in context.traces:
            trace.repeat(rows)
        if context.flops:  # the FLOP counters open on this rank: added at `flush`
            self.repeats[key] = self.repeats.get(key, 0) + 1
        meter = context.meter
        if meter.held + transient > meter.peak:
            meter.peak = meter.held + transient
        return True

    def output(self, key: tuple) -> _Stand:
        """The stand-in of a repeated forward's output, holding the first such forward's kept bytes while it
        lives."""
        out = _Stand(self.blocks.zeros(self.local_shape))
        self.context.meter.count(out, self.seen[key][1])
        return out


class _DryBlocks:
    """A dry run's blocks (of the wire's dtype) that nothing writes: the message buffers a stage receives into
    (the dry engine leaves them as they are) and the stand-ins of repeated cells (only sent). Each is an array of
    its own over one lazy mapping per size (spmdsim.base.buffers.lazy_zeros: zeros the kernel maps on read), so the
    run's Meter counts each as the owner of its bytes, as it counts a mapping of its own, where a mapping a block cost
    ~7 us to make and free (a 1F1B step of 64 stages x 512 microbatches makes ~130,000). `empty` is placed
    as spmdsim.base.buffers.empty places a dry run's block, `zeros` as lazy_zeros places it; a block below the
    size lazy_zeros maps is theirs."""

    __slots__ = ("_maps", "_empty", "_zeros", "dtype")

    def __init__(self, dtype: Any = np.float64) -> None:
        self.dtype = np.dtype(dtype)
        self._maps: dict = {}  # bytes -> the mapping under that size's blocks, or None (numpy's own zeros)
        self._empty: dict = {}  # shape -> the mapping `empty` places its blocks of that shape on, or None
        self._zeros: dict = {}  # the same for `zeros`

    def _map(self, nbytes: int) -> Any:
        if nbytes not in self._maps:
            raw = buffers.owner(buffers.lazy_zeros(nbytes, np.uint8))
            self._maps[nbytes] = raw.base if buffers.is_lazy(raw) else None
        return self._maps[nbytes]

    def empty(self, shape: tuple) -> np.ndarray:
        mapping = self._empty.get(shape, False)
        if mapping is False:
            nbytes = self.dtype.itemsize * math.prod(shape)
            mapping = self._empty[shape] = self._map(nbytes + buffers.PAGE) if nbytes >= buffers.MIN_BYTES else None
        if mapping is None:
            return buffers.empty(shape, self.dtype)
        return np.ndarray(shape, self.dtype, mapping, buffers.PAGE_OFFSET)

    def zeros(self, shape: tuple) -> np.ndarray:
        mapping = self._zeros.get(shape, False)
        if mapping is False:
            mapping = self._zeros[shape] = self._map(self.dtype.itemsize * math.prod(shape))
        if mapping is None:
            return buffers.lazy_zeros(shape, self.dtype)
        return np.ndarray(shape, self.dtype, mapping)


class _first:  # noqa: N801 - a context manager, read as a phrase: `with _first(repeat, key):`
    """Measure the first cell of its kind in a dry run (see _DryCells); nothing otherwise."""

    def __init__(self, repeat: Optional[_DryCells], key: tuple) -> None:
        self.repeat, self.key = repeat, key

    def __enter__(self) -> None:
        if self.repeat is None:
            return

        context = current()
        self.meter, self.trace = context.meter, context.traces[-1]
        self.rows, self.held, self.peak = len(self.trace._rows), self.meter.held, self.meter.peak
        self.folded = len(self.trace._folded)  # the rows folded into earlier ones (a ring's messages) from here
        self.meter.peak = self.meter.held  # the peak inside this cell, from here
        self.counting = counting()  # the cell's matrix products, beside any counter open outside
        self.products = self.counting.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.repeat is None:
            return
        self.counting.__exit__(*exc)
        if exc[0] is not None:
            return
        meter = self.meter
        # the cell's rows: those it appended, and those it folded into an equal earlier row (its messages)
        rows = tuple(self.trace._rows[self.rows:]) + tuple(r for f in self.trace._folded[self.folded:] for r in f)
        self.repeat.seen[self.key] = (rows, meter.held - self.held,
                                      meter.peak - self.held, self.products)
        meter.peak = max(meter.peak, self.peak)
