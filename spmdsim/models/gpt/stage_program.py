"""A pipeline stage's step (spmdsim.models.gpt.pipeline): its schedule's program run cell by cell, the
activations and gradients between stages as point-to-point messages, and the tied table's exchange."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence
from itertools import repeat as repeat_
from time import perf_counter
import numpy as np
from ...base import buffers
from ...base.tables import put
from ...errors import SpmdsimError
from ..axes import PIPELINE, tensor_coord, tensor_size
from ...nn.autograd import engine as autograd_engine
from ...programs.pipeline.records import Compute
from ...programs.pipeline.timeline import timeline
from ...programs.plan.messages import Messages
from ...runtime import executor
from ...runtime.door import all_gather_object
from ...runtime.dtensor import DTensor
from ...runtime.replay import kernel
from ...runtime.trace_export import write_chrome_trace
from .stage_memory import _DryBlocks, _DryCells, _Most, _Stand, _first
from .stage_steps import compiled_once

__all__ = ["PipelineRun"]


@dataclass
class PipelineRun:
    """What a pipelined training ran: the stage's chunks and models, and each step's executed cells.

    Attributes:
        schedule: the spmdsim.programs.pipeline Schedule every stage ran; ``parts``: each chunk's (stages.Part).
        stage: this rank's stage; ``models``: chunk -> its GPT part on the stage's mesh.
        mesh: the whole (pp, dp, tp) mesh; ``stage_mesh``: this stage's (dp, tp) mesh (with MoE layers
            (pp, dp, ep, tp) and (dp, ep, tp)).
        orders: per step, the Compute records this rank ran, in order (what a timeline is made from).
        in_flight: per step, the most microbatch-chunks whose activations this rank held at once.
        cells: the last step's cells as trace spans: (name, start, end) in perf_counter seconds (made when asked
            from its order, ``orders[-1]``, and ``times``: each cell's start and end, in that order).
        trace: the last step's trace (spmdsim.runtime.trace: collectives and messages).
    """

    schedule: Any
    parts: tuple
    stage: int
    models: dict
    mesh: Any
    stage_mesh: Any
    params: dict
    orders: list
    in_flight: list
    times: tuple = ()
    trace: Any = None

    @property
    def cells(self) -> list:
        times = self.times
        return [(str(c), times[2 * i], times[2 * i + 1]) for i, c in enumerate(self.orders[-1] if self.orders else ())]

    def timeline(self, step: int = -1) -> Any:
        """The unit-cost timeline (spmdsim.programs.pipeline.timeline) of what every stage ran at `step`: each
        stage's executed order gathered from its first rank (collective over the whole mesh)."""
        orders = all_gather_object(self.mesh.comm, self.orders[step])[::self.stage_mesh.size]
        return timeline(self.schedule.stages, orders, self.schedule.virtual)

    def held(self, step: int = -1) -> tuple[int, ...]:
        """Per stage, the most microbatch-chunks whose activations it held at once at `step` (collective)."""
        return tuple(all_gather_object(self.mesh.comm, self.in_flight[step])[::self.stage_mesh.size])

    def write_trace(self, path: str) -> None:
        """The last step as a Chrome/Perfetto trace: one track per rank with its messages and collectives,
        and a second with its pipeline cells (F3, B3; chunk after a dot when v > 1). Collective."""
        start = min((c[1] for c in self.cells), default=None)
        write_chrome_trace(self.mesh.comm, self.trace, path, start=start, spans=self.cells,
                           span_track="pipeline cells")

    def close(self) -> None:
        self.stage_mesh.close()
        self.mesh.close()


_PP = (PIPELINE,)  # the messages' axes


def _run_program(run: PipelineRun, program: Sequence, ids: Callable[[int, int], Any], step: Any,
                 microbatches: int, last: int, shape: tuple, act: Any, wire: Any, pp_comm: Any, params: list,
                 clock: "_Clock", watch: Optional["_Most"] = None, groups: Optional[dict] = None,
                 wire_dtype: Any = np.float64, found: Optional[dict] = None,
                 reducer: Any = None) -> tuple[list, list, int]:
    """One step of this stage's program: (its microbatches' scaled losses: DTensors, the router losses too;
    the Compute records run; the most microbatch-chunks held at once). `ids(0, mb)`: microbatch mb's input
    ids, `ids(1, mb)` its targets; `step`: an int or a replay Scalar (the dropout masks' seeds); `clock`
    gets each cell's start and end. Activations and gradients are `act` blocks in the chunks and `wire`
    blocks between stages (`act`'s rows of this rank's tp coordinate where they differ, all-gathered over tp
    on receipt). `groups`: each message group's step record (a spmdsim.programs.plan.messages.Messages) by what
    it posts (peers, tags, bytes), kept from step to step (its sizes and peers the same every step), filled here.
    `wire_dtype`: the messages' dtype both ways (the activations'; a float32 gradient is rounded to it once
    where it is sent, as the receiving stage's node would round it). `found`: what the run's earlier steps
    found (the chunks' output layout objects), kept from step to step as `groups`.
    `reducer`: the ZeRO-1 or ZeRO-2 optimizer (spmdsim.nn.autograd.backward's `reduce_with`): ZeRO-1's takes each
    microbatch's gradient of a parameter into its main gradient as soon as the walk has it; to ZeRO-2's each
    chunk's last microbatch's backward hands its buckets as they fill, the microbatches before accumulating their
    gradients whole."""
    if groups is None:
        groups = {}
    known = found if found is not None else {}
    steps = compiled_once(program)  # the program's actions as plain tuples
    mesh = run.stage_mesh
    # A kernel while this thread captures the step; else (a dry run, which captures none: its steps count bytes; an
    # eager step) stamps plainly, no wrapper. The blocks sent: read as ``_local`` in an eager step (a capture's are
    # its record's views; a dry run's repeated cells' outputs are stand-ins, `_Stand`, with `.local` alone).
    uncaptured = not buffers.CAPTURE.on and not mesh.engine.dry
    stamp = _stamp if mesh.engine.dry or uncaptured else kernel(_stamp)
    cells = _Cells(run, ids, step, microbatches, last, shape, act, wire, params, watch, wire_dtype, reducer,
                   uncaptured, program, steps)
    # A received gradient takes the very layout object of the chunk's output (equal to `act`), which the output's
    # node wants: the backward's tests then stop at `is`, as between the layers of one chunk (under `act`, an
    # equal object of the model's own, it cost ~8 comparisons and moves a microbatch). Not in a dry run (its
    # repeated cells' outputs are stand-ins). An activation received keeps `act`: the chunk's rules hand its
    # gradient back in that object.
    blocks = cells.blocks
    outward = known.setdefault("outward", {}) if blocks is None else None  # id -> (an output layout, the answer)
    empty = buffers.empty if blocks is None else lambda shape, dtype: blocks.empty(shape)  # a receive's buffer
    order = []
    for entry in steps:
        kind = entry[0]
        if kind < 2:  # a cell: 0 forward, 1 backward
            stamp(clock)
            if kind:
                cells.backward(entry[1], entry[2])
            else:
                cells.forward(entry[1], entry[2])
            stamp(clock)
            order.append(entry[3])
            continue
        _exchange(cells, entry, run.mesh, pp_comm, groups, outward, empty, act, wire)
    if cells.repeat is not None:
        cells.repeat.flush()
    return cells.losses, order, cells.most


class _Cells:
    """One step's cells of a stage (`_run_program`'s): each microbatch's forward and backward through a chunk,
    what they keep between them, and the blocks they hand the messages (`_exchange`)."""

    def __init__(self, run: PipelineRun, ids: Callable[[int, int], Any], step: Any, microbatches: int, last: int,
                 shape: tuple, act: Any, wire: Any, params: list, watch: Optional["_Most"], wire_dtype: Any,
                 reducer: Any, uncaptured: bool, program: Sequence, steps: tuple) -> None:
        self.mesh = mesh = run.stage_mesh
        self.models, self.ids, self.step, self.last, self.params, self.watch = (
            run.models, ids, step, last, params, watch)
        self.wire_dtype, self.reducer, self.uncaptured = wire_dtype, reducer, uncaptured
        self.inputs: dict = {}  # (mb, chunk) -> the received activation (a leaf), the input of chunk's forward
        self.outputs: dict = {}  # (mb, chunk) -> the forward's output (activation, or the scaled loss), until backward
        self.upstream: dict = {}  # (mb, chunk) -> the received gradient of chunk's output
        self.sent_grads: dict = {}  # (mb, chunk) -> the gradient of chunk's input, until sent
        self.losses: list = []
        self.held = self.most = 0
        self.scale = 1.0 / microbatches
        local_shape = act.local_shape(shape)
        self.checked = checked = wire.check_shape(shape)  # the received blocks' global shape, as DTensor checks it
        self.wire_shape = wire.local_shape(checked)  # every rank's (an uneven cut raises here)
        self.scatter = wire != act
        if self.scatter:  # the rows of this rank's tp coordinate in a replicated (T, B, D) block: contiguous
            rows_per = shape[0] // tensor_size(mesh.layout)
            self.mine = slice(tensor_coord(mesh) * rows_per, (tensor_coord(mesh) + 1) * rows_per)
        self.tag_micro = microbatches > 1
        # The parameters every microbatch's backward keeps pending (`backward(keep_pending=params)`), checked once.
        self.kept = autograd_engine.kept_leaves(params)
        self.blocks = _DryBlocks(wire_dtype) if mesh.engine.dry else None
        self.repeat = _DryCells(local_shape, self.blocks) if self.blocks is not None else None
        # Each chunk's first backward runs for real in a dry run (it is measured), so its forward does too; under
        # ZeRO-2 so does its last (`last_backward`, below), which reduces the buckets as they fill.
        self.first_backward: dict = {}
        if self.repeat is not None:
            for action in program:
                if isinstance(action, Compute) and action.kind == "B":
                    self.first_backward.setdefault(action.chunk, action.microbatch)
        self.last_backward: dict = {}  # chunk -> the microbatch of its last backward (ZeRO-2's buckets reduced in it)
        self.zero1 = reducer is not None and not reducer.shard_grads  # every backward hands ZeRO-1's its gradients
        if reducer is not None and reducer.shard_grads:
            for entry in steps:
                if entry[0] == 1:
                    self.last_backward[entry[2]] = entry[1]

    def outgoing(self, block: np.ndarray) -> np.ndarray:  # a copy, if one, recorded while capturing
        if block.dtype != self.wire_dtype:  # a bfloat16 activation's float32 gradient, rounded once
            block = block.astype(self.wire_dtype)
        return buffers.contiguous(block[self.mine] if self.scatter else block)

    def forward(self, mb: int, c: int) -> None:
        self.held += 1
        if self.held > self.most:
            self.most = self.held
        repeat, first_backward = self.repeat, self.first_backward
        if repeat is None or mb == self.last_backward.get(c) != first_backward.get(c):
            # a real run (every cell runs, none measured), or a dry run's ZeRO-2 last microbatch of the chunk
            # (its backward runs: it reduces the buckets as they fill, as the real run's does)
            self._forward(mb, c)
        elif mb != first_backward.get(c) and repeat.again(("F", c)):
            # a dry run's later microbatch: the first's figures
            self.outputs[(mb, c)] = stand = repeat.output(("F", c))
            stand.input = self.inputs.pop((mb, c), None)  # held until the backward, as the graph would hold it
        else:
            with _first(repeat, ("F", c)):
                self._forward(mb, c)
        if self.watch is not None:
            self.watch.forward(c, self.outputs[(mb, c)])

    def _forward(self, mb: int, c: int) -> None:
        model, when, step, ids = self.models[c], (mb if self.tag_micro else None), self.step, self.ids
        h = model.embed(ids(0, mb), step, True, when) if c == 0 else self.inputs[(mb, c)]
        h, router = model.chunk_blocks(h, step, True, when, self.scale)
        if router is not None:
            self.losses.append(router)  # (a scalar DTensor: what the step's loss adds for them)
        if c == self.last:
            h = model.head_loss(h, ids(1, mb)) * self.scale
            self.losses.append(h)
        self.outputs[(mb, c)] = h

    def backward(self, mb: int, c: int) -> None:
        self.held -= 1
        if self.watch is not None:
            self.watch.backward(c)
        repeat, upstream, last = self.repeat, self.upstream, self.last
        out = self.outputs.pop((mb, c))
        reducing = self.last_backward.get(c) == mb  # ZeRO-2's last microbatch of the chunk (else none)
        reduce_with = self.reducer if reducing or self.zero1 else None
        if repeat is None or reducing and mb != self.first_backward.get(c):
            # a real run (every cell runs, none measured), or a dry run's ZeRO-2 last microbatch of the chunk
            # (the gradients it holds while it reduces: the earlier microbatches' whole and its own)
            autograd_engine.backward_kept(out, None if c == last else upstream.pop((mb, c)), self.kept, reduce_with)
        elif isinstance(out, _Stand):  # a dry run's repeated cell: the first backward's figures
            upstream.pop((mb, c), None)
            if not repeat.again(("B", c)):  # pragma: no cover - each chunk's first backward ran for real
                raise SpmdsimError(f"internal: no measured backward of chunk {c} to repeat")
            if c > 0:
                self.sent_grads[(mb, c)] = self.blocks.zeros(self.wire_shape)
            return
        else:
            with _first(repeat, ("B", c)):
                autograd_engine.backward(out, gradient=None if c == last else upstream.pop((mb, c)),
                                         keep_pending=self.params, reduce_with=reduce_with)
        if c > 0:
            grad = self.inputs.pop((mb, c)).grad
            self.sent_grads[(mb, c)] = self.outgoing(grad._local if self.uncaptured else grad.local)


def _exchange(cells: _Cells, entry: tuple, mesh: Any, pp_comm: Any, groups: dict, outward: Optional[dict],
              empty: Callable, act: Any, wire: Any) -> None:
    """One message group of the program (`stage_steps.compiled`'s entry): the activations and gradients `cells`
    sends, and what it receives, taken in as the next forward's inputs or backward's gradients."""
    outputs, uncaptured, wire_shape, wire_dtype = cells.outputs, cells.uncaptured, cells.wire_shape, cells.wire_dtype
    sends: list = []
    for is_act, key, peer, tag in entry[1]:
        sends.append((cells.outgoing(outputs[key]._local if uncaptured else outputs[key].local) if is_act else
                      cells.sent_grads.pop(key), peer, tag))
    gets, n = entry[2], len(entry[2])
    bufs = list(map(empty, repeat_(wire_shape, n), repeat_(wire_dtype, n)))
    receives = list(zip(bufs, entry[3], entry[4]))
    # Its record by what it posts: the groups of one kind between the same stages (every microbatch's) share it.
    known = (entry[5], bufs[0].nbytes if bufs else 0, *[buf.nbytes for buf, _, _ in sends])
    group = groups.get(known)
    if group is None:  # made from the buffers once a run
        group = groups[known] = Messages.of(_PP, pp_comm.Get_size(), receives, sends)
    executor.post(mesh, pp_comm, group, receives, sends, "pipeline")
    trusted, plain, stage_mesh, checked = DTensor._trusted, np.ndarray, cells.mesh, cells.checked
    for (is_act, key), buf in zip(gets, bufs):
        # A block of wire_shape and wire_dtype, made above (a captured step's buffer is a replay.Traced, of
        # which np.asarray makes a plain view, as DTensor's own check would): nothing to check.
        if type(buf) is not plain:
            buf = np.asarray(buf)
        if is_act:
            layout = act
        elif outward is not None:
            layout = _output_layout(outputs.get(key), act, outward)
        else:
            layout = act
        if cells.scatter:  # Megatron's gather: the stage's tp ranks put their rows together
            t = trusted(stage_mesh, buf, wire, checked).redistribute(layout)
        else:  # `wire` is `act`, `layout` an object equal to it
            t = trusted(stage_mesh, buf, layout, checked)
        if is_act:
            cells.inputs[key] = t.requires_grad_()
        else:
            cells.upstream[key] = t


def _output_layout(out: Any, act: Any, seen: dict) -> Any:
    """The layout object of `out` (a chunk's output, whose gradient is being received) where it is equal to
    `act` (the blocks' layout between chunks), else `act`: the gradient then reaches the output's node in the
    very layout object it wants. Compared once per layout object (`seen`: id -> (the object, the answer))."""
    layout = getattr(out, "_layout", None)  # (None: no such output, never in a checked schedule)
    if layout is None or layout is act:
        return act
    hit = seen.get(id(layout))
    if hit is None or hit[0] is not layout:
        hit = put(seen, id(layout), (layout, layout if layout == act else act), 64)  # (held: its id is not reused)
    return hit[1]


class _Clock:
    """perf_counter times, a start and an end per cell, in the order the cells ran."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: list = []


def _stamp(clock: _Clock) -> None:
    """Now, onto `clock` (a kernel while a step is captured: its replays stamp again)."""
    clock.times.append(perf_counter())


def _tie_embedding(run: PipelineRun, wte: Any, other: int, pp_comm: Any, groups: dict) -> None:
    """Add the other end's gradient of the tied table (first and last stage: Megatron's embedding group).
    `groups`: the exchange's step record under "tied" after the first step (a Messages)."""
    g = wte.grad
    mine = buffers.contiguous(g.local)
    theirs = buffers.empty(mine.shape, mine.dtype)
    receives, sends = [(theirs, other, 1 << 14)], [(mine, other, 1 << 14)]
    record = groups.get("tied")
    if record is None:
        record = groups["tied"] = Messages.of(_PP, pp_comm.Get_size(), receives, sends)
    executor.post(run.mesh, pp_comm, record, receives, sends, "embedding group")
    if g._local is wte._ag.main:  # ZeRO-1's main gradient (spmdsim.nn.distrib_optim): the sum into it, in place
        if not g.mesh.engine.dry:
            _add_main(wte._ag.main, theirs)
        return
    total = mine if g.mesh.engine.dry else mine + theirs  # a dry run's zeros stay zeros, unread
    wte._ag.grad = type(g)(g.mesh, total, g.layout, g.global_shape)


def _add_main(main: np.ndarray, theirs: np.ndarray) -> None:
    """``main += theirs`` (the ufunc and operands of ``mine + theirs``: the same bits), a kernel while capturing."""
    (kernel(_added) if buffers.CAPTURE.on else _added)(main, theirs)


def _added(main: np.ndarray, theirs: np.ndarray) -> None:
    np.add(main, theirs, out=main)


def _on_mesh(run: PipelineRun, stats: list) -> tuple:
    """A stage's MoEStats with their ranks on the whole mesh (a stage's ranks follow its first: pp is the
    major axis)."""

    first = run.stage * run.stage_mesh.size
    return tuple(replace(s, rank=first + s.rank, group=tuple(first + r for r in s.group)) for s in stats)


def _largest(stats: tuple) -> tuple:
    """One MoEStats per MoE layer whose dispatch buffers are the largest any microbatch's forward made (the
    ledger counts one forward's buffers; with a capacity every microbatch's are the same size)."""

    most: dict = {}
    for s in stats:
        seen = most.get(s.layer)
        most[s.layer] = s if seen is None else replace(seen, send_bytes=max(seen.send_bytes, s.send_bytes),
                                                       received_bytes=max(seen.received_bytes, s.received_bytes))
    return tuple(most.values())
