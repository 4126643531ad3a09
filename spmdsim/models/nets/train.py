"""Train a seed `Network` under MPI: forward hop by hop, cross-entropy, backward, optimizer; checked step by step.

mpi4py is imported lazily (through spmdsim.runtime). Every parameter is this
rank's shard of its SeededTensor, marked ``requires_grad_()``; the forward runs
the network's schedule (redistributions planned by `spmdsim.programs.plan`, operators
from `spmdsim.nn.ops`), so the backward's collectives are the conjugates of those
hops. Each phase runs under its own trace. `NetworkTrainer.check` compares the
step with `spmdsim.models.nets.reference` on each rank's own slices (one agreed
verdict per tensor). With ``step(..., anchor=True)`` the reference takes the
run's step as its start (`Anchor`: every rank's parameters at the step's start,
from one Allgather, for the loss and gradients; this rank's parameters,
optimizer state and gradients, for the update of its region), so each step is
checked at rounding level: two trajectories that differ only in the order of
their sums drift apart under Adam, whichever is right (docs/howto/train.md).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Optional

import numpy as np

from ...errors import OperatorError, fold_message
from ...layouts.layout import Layout, TensorLayout
from .model import Hop, Network, schedule
from ...base.context import PROCESS, SIMULATE, RankContext, current, enter, leave
from ...base.threads import launcher_rank
from ...base.typed_numbers import fixed
from ...errors import RankCountError, SpmdsimError
from ...nn import ops, optim
from ...nn.ops import cross_entropy, reshape
from ...runtime import install_excepthook
from ...runtime.dtensor import DTensor
from ...runtime.engines import ways_out
from ...runtime.executor import redistribute
from ...runtime.mesh import Mesh
from ...runtime.mpi_library import load_mpi
from ...runtime.sim.launch import DRY_RUN_NEEDS_RANKS, launched_problem, ranks_problem, run_on_ranks
from ...runtime.trace import collect_trace
from ..gpt.options import printing_problem
from ..gpt.step_check import QUIET, stop_if_diverged
from ..gpt.train import all_rows
from ..gpt.wholes import regions
from .model import short_layout
from .sharded import shard_stages, zero_problem

__all__ = ["NetworkTrainer", "StepResult", "Anchor", "PHASES", "explain_backward", "world_size", "run_main",
           "refuse", "loss_trend"]

#: Trace phases of a step, in order.
PHASES = ("forward", "backward", "optimizer")
#: The most steps of a dry run (``--dry-run``), whose report comes after its last step and nothing before it.
MAX_DRY_STEPS = 1_000


@dataclass(frozen=True)
class Anchor:
    """A run's step as its reference takes it (`ReferenceTrainer.step(..., anchor=)`). `where` and `rows`:
    every rank's blocks of each parameter at the step's start, a row per rank (the Allgather's rows that
    `where.used` keeps; spmdsim.models.gpt.wholes.Regions says where each block lies), the same on every rank, from
    which the reference's loss and gradients are computed once for all. `blocks`: this rank's own blocks at
    the step's start, "params" and each part of the optimizer's state (`kinds`: "buffer" for SGD's momentum,
    "m" and "v" for Adam's moments; zeros before a parameter's first step, which the optimizers' first update
    equals), and its gradients the update stepped with ("grads"), from which the reference's update of this
    rank's region is computed (elementwise: no rank needs another's)."""

    where: Any
    rows: np.ndarray
    kinds: tuple[str, ...]
    blocks: dict


@dataclass(frozen=True)
class StepResult:
    """One step on this rank: the loss DTensor, the trace of each phase, and with ``anchor=True`` the step as
    its reference takes it (`Anchor`)."""

    loss: Any
    traces: dict
    anchor: Optional[Anchor] = None

    @property
    def value(self) -> float:
        return float(self.loss.local)


class NetworkTrainer:
    """``NetworkTrainer(net, comm, optimizer="sgd", lr=1e-2, momentum=0.0, bucket=False, zero=0)``: shards,
    meshes, optimizer.

    Call `step(x, labels)` with the global batch (every rank passes the same
    arrays; each cuts its own shard), `check(step, reference_step)` to compare,
    and `close()` at the end. `bucket`: the backward sums the replicas'
    gradients of parameters pending over the same axes in one Allreduce. `zero` 3: every parameter fully
    sharded over the network's data axis, each stage gathered for its use (spmdsim.models.nets.sharded).
    """

    def __init__(self, net: Network, comm: Any, optimizer: str = "sgd", lr: float = 1e-2,
                 momentum: float = 0.0, bucket: Any = False, zero: int = 0) -> None:
        if net.stages[-1].out.ndim < 2:
            raise OperatorError(f"{net.name}: the output must have a class dim to train with cross-entropy")
        problem = f"zero {zero!r} must be 0 or 3 (fully sharded)" if zero not in (0, 3) or type(zero) is not int \
            else zero_problem(net) if zero == 3 else None
        if problem or (zero == 3 and bucket):
            raise SpmdsimError(problem or "bucket sums whole gradients in one Allreduce; with zero 3 each gradient "
                               "is reduce-scattered onto its shard: give one of them")
        self.net, self.comm, self.bucket = net, comm, bucket
        self.steps = 0  # steps run, for stop_if_diverged's line
        self.hops = schedule(net)
        self._meshes: dict[Layout, Any] = {}
        self._mesh_type = Mesh
        self.params: list[tuple] = []
        for stage in net.stages:
            self.params.append(tuple(DTensor.from_seeded(self.mesh(p.layout.layout), p.layout, p.source)
                                     .requires_grad_() for p in stage.params))
        self.units: list = [None] * len(net.stages)  # per stage its FullyShard under zero 3
        if zero == 3:
            self.params, self.units = shard_stages(net, self.params, self.mesh)
        flat = [p for ps in self.params for p in ps]
        # What of the optimizer's state an `Anchor` carries: SGD's momentum buffers, Adam's two moments.
        self._kinds = ("m", "v") if optimizer == "adam" else ("buffer",) if momentum else ()
        self._where: Any = None  # spmdsim.models.gpt.wholes.Regions of the parameters, made by the first anchored step
        if optimizer == "sgd":
            self.optimizer: Any = optim.SGD(flat, lr, momentum)
        elif optimizer == "adam":
            self.optimizer = optim.Adam(flat, lr)
        else:
            raise OperatorError(f"optimizer {optimizer!r} must be 'sgd' or 'adam'")

    def mesh(self, layout: Layout) -> Any:
        """The runtime Mesh of `layout` over this trainer's communicator (one per device matrix)."""
        mesh = self._meshes.get(layout)
        if mesh is None:
            mesh = self._meshes[layout] = self._mesh_type(layout, self.comm)
        return mesh

    @property
    def flat_params(self) -> tuple:
        return tuple(p for ps in self.params for p in ps)

    def step(self, x: np.ndarray, labels: np.ndarray, explain: Optional[list] = None,
             anchor: bool = False) -> StepResult:
        """zero_grad, forward, cross-entropy, backward and the optimizer step, each phase traced.

        `explain`: a list that receives what each backward collective answers
        (`spmdsim.nn.autograd.backward`). `anchor`: also gather the step as its reference takes it
        (`StepResult.anchor`): a collective after the optimizer, outside the phases' traces; none in a dry
        run, which checks no values (its calls and bytes are the phases', as a real run's report counts).
        """
        net = self.net
        start = self._start() if anchor and not current().dry_run else None
        self.optimizer.zero_grad()
        traces = {}
        with collect_trace() as traces["forward"], np.errstate(**QUIET):  # an overflow: stop_if_diverged's line
            value = DTensor.from_global(self.mesh(net.input_layout.layout), x.astype(net.source.dtype),
                                        net.input_layout, verify=False)
            for hop in self.hops:
                value = self._hop(hop, value)
            classes = value.global_shape[-1]
            if value.layout.ndim > 2:
                value = reshape(value, (-1, classes))
            loss = cross_entropy(value, DTensor.from_global(value.mesh, np.asarray(labels).reshape(-1),
                                                            _labels_layout(value.layout), verify=False))
        with collect_trace() as traces["backward"], np.errstate(**QUIET):
            loss.backward(explain=explain, bucket=self.bucket)
        with collect_trace() as traces["optimizer"], np.errstate(**QUIET):
            self.optimizer.step()
        named = {f"{stage.name}.{p.name}": t for stage, ts in zip(net.stages, self.params)
                 for p, t in zip(stage.params, ts)}
        stop_if_diverged(self.steps, float(loss.local), named, self.optimizer.lr, clipping=False,
                         what=f"{net.title}: ", optimizer=self.optimizer)  # its state too (none in a dry run)
        self.steps += 1
        return StepResult(loss, traces, None if start is None else self._anchor(start))

    def _start(self) -> dict:
        """This rank's blocks of the parameters and of each part of the optimizer's state at the step's start
        (copies: the step updates them in place), as `Anchor.blocks` holds them."""
        params = self.flat_params
        blocks = {"params": tuple(p.local.copy() for p in params)}
        opt = self.optimizer
        for kind in self._kinds:
            held = []
            for i, p in enumerate(params):
                if kind == "buffer":
                    state = opt.buffers.get(i)
                else:
                    moments = opt.moments.get(i)
                    state = None if moments is None else moments[0 if kind == "m" else 1]
                held.append(np.zeros(p.local.shape) if state is None else state.copy())
            blocks[kind] = tuple(held)
        return blocks

    def _anchor(self, start: dict) -> Anchor:
        """The step's `Anchor`: every rank's parameters at the step's start in one Allgather (label "check"; on
        simulated ranks one table they share: spmdsim.models.gpt.train.all_rows), this rank's `start` and gradients."""
        params = self.flat_params
        if self._where is None:  # where each rank's blocks lie: the same every step
            self._where = regions({i: p for i, p in enumerate(params)}, self.comm.Get_size())
        where = self._where
        row = np.zeros(where.width)  # a shorter row (an uneven cut) padded at its end
        at = 0
        for block in start["params"]:
            row[at:at + block.size] = block.reshape(-1)
            at += block.size
        mesh = params[0].mesh
        rows = all_rows(mesh, row, "check")  # on simulated ranks one table they share (p tables of p rows before)
        return Anchor(where, where.used(rows), self._kinds, dict(start, grads=tuple(p.grad.local for p in params)))

    def _hop(self, hop: Hop, x: Any) -> Any:
        if hop.is_redistribution:
            y = redistribute(x, hop.after, hop.plan)
            if y._ag is not None:  # name the node after the hop, for explanations
                y._ag.name = f"{hop.label} ({_plan_text(hop)})"
            return y
        stage = self.net.stages[hop.stage]
        unit = self.units[hop.stage]
        if unit is not None:  # its parameters gathered for the operator, freed after it (ZeRO-3)
            names = [p.name for p in stage.params]
            return unit.unit(names, lambda h, used: self._operator(stage, h, tuple(used[n] for n in names)), x)
        return self._operator(stage, x, self.params[hop.stage])

    def _operator(self, stage: Any, x: Any, params: tuple) -> Any:
        """`stage`'s operator on `x` with its parameters `params` (whole on the data axis)."""
        if stage.kind == "flatten":  # only the batch dim is split: a local reshape (x needs no grad)
            local = x.local.reshape(x.local.shape[:self.net.batch_dims] + (-1,))
            return DTensor(self.mesh(stage.out.layout), local, stage.out, stage.out_shape)
        if stage.kind in ("relu", "gelu"):
            return ops.activation(x, stage.kind)
        if stage.kind == "matmul":
            return ops.matmul(x, params[0], label=stage.name)
        if stage.kind == "embedding":
            return ops.embedding(x, params[0], label=stage.name)
        return ops.linear(x, *params, label=stage.name)  # linear, column_linear, row_linear

    def check(self, result: StepResult, ref: Any, rtol: float, atol: float = 0.0,
              param_rtol: Optional[float] = None) -> tuple:
        """Verdicts (agreed by all ranks) of the loss, every gradient and every updated parameter.

        Each element passes within `atol` + `rtol` x the magnitudes that entered
        it (`ReferenceStep`'s scales: the step on absolute values), not x the
        tensor's largest entry: a gradient near zero made of large terms keeps
        the rounding those terms can have (docs/explanation/tolerances.md, "Tolerances").
        `param_rtol` (default `rtol`) for the updated parameters. From an anchored
        step (``step(..., anchor=True)``, ``ref`` from ``ReferenceTrainer.step(...,
        anchor=result.anchor)``) their scale is that step's update terms: the update
        of the run's own inputs, `rtol` like the rest. Free-running it is |first
        value| + the sum of |update| so far, and Adam, which divides each gradient
        by its history's size, moves the parameters further than their terms'
        rounding: a free-running Adam check can fail a correct run (docs/howto/train.md).
        """
        param_rtol = rtol if param_rtol is None else param_rtol
        loss_scale = np.asarray(ref.loss_scale) if ref.grad_scales else None
        verdicts = [result.loss.check(np.asarray(ref.loss), rtol=rtol, atol=atol, scale=loss_scale)]
        grad_scales = ref.grad_scales or (None,) * len(ref.grads)
        param_scales = ref.param_scales or (None,) * len(ref.params)
        for p, g, new, gs, ps in zip(self.flat_params, ref.grads, ref.params, grad_scales, param_scales):
            verdicts.append(p.grad.check(g, rtol=rtol, atol=atol, scale=gs))
            verdicts.append(p.check(new, rtol=param_rtol, atol=atol, scale=ps))
        return tuple(verdicts)

    def close(self, keep: Any = None) -> None:
        """Free the meshes' sub-communicators, except `keep`'s (collective: all ranks call it)."""
        for mesh in self._meshes.values():
            if mesh is not keep:
                mesh.close()


def explain_backward(explain: list) -> str:
    """Lines "collective(axes) bytes  <- forward step" for the backward steps that communicated."""
    lines = ["backward collectives (this rank) <- the forward step each answers"]
    for step, entries in explain:
        for e in entries:
            if e.group_size > 1:
                call = f"{e.op}({','.join(e.axes) or 'all'})"
                text = f"  {call:<22} {e.bytes_sent:>9,} B  <- "
                head, cut, tail = step.partition(" (read by ")
                if cut and len(text + step) > 100:  # the readers on a line of their own, under the step
                    lines += [text + head, " " * len(text) + "(read by " + tail]
                else:
                    lines.append(text + step)
    return "\n".join(lines)


def _plan_text(hop: Hop) -> str:
    """The forward move of a redistribution hop: "Allreduce(k) [m,n] -> [s0,s1]"."""
    ops = ", ".join(f"{s.op}({','.join(s.axes)})" for s in hop.plan.steps) or "no step"
    return f"{short_layout(hop.before)} -> {short_layout(hop.after)} by {ops}"


def _labels_layout(logits: TensorLayout) -> TensorLayout:
    """Labels split like the logits' batch dim."""
    return TensorLayout(logits.layout, logits.tensor_map[:1])


def refuse(text: str) -> NoReturn:
    """Bad input of an example: one line on stderr and exit 2, as the CLI does (no traceback).

    Under mpiexec every rank refuses the same command line (before MPI starts); one says so, or the line is
    printed once per rank, the copies run together. Every rank still exits 2.
    """
    if launcher_rank() == 0:
        print(fold_message(f"spmdsim: error: {text}"), file=sys.stderr)  # 100 columns, as the CLI's refusals
    sys.exit(2)


def world_size(ranks: Optional[int], dry_run: bool = False) -> int:
    """The rank count a run will have: `ranks` simulated ranks (None: the MPI world's size)."""
    if ranks is not None:
        problem = ranks_problem(ranks, dry_run) or launched_problem(ranks)  # --ranks under mpiexec: first
        if problem:
            refuse(problem)
        return ranks
    return load_mpi().COMM_WORLD.Get_size()  # no MPI library: one line naming --ranks N, not a traceback


def loss_trend(losses: Any, first: Optional[float] = None, lr: Optional[float] = None) -> tuple[str, bool]:
    """("loss first a, last b (falling)", whether the trend passes) for a training's losses.

    One step has no trend: its loss alone, and a pass (a user asking for one
    step to see its collectives is not told the training failed); nor has a run at learning rate `lr` 0, whose
    steps leave the parameters as they were (its steps are still checked). `first`: a resumed run's training's
    first loss (its checkpoint's), which the trend starts from, as the trend of the run that never stopped does.
    """
    if lr == 0:
        return (f"loss first {fixed(losses[0] if first is None else first, 7)}, last {fixed(losses[-1], 7)} "
                "(--lr 0: no trend to judge)"), True
    if first is not None:
        falling = losses[-1] < first
        return (f"loss first {fixed(first, 7)} (step 0, before the checkpoint), last {fixed(losses[-1], 7)} "
                f"({'falling' if falling else 'NOT falling'})"), falling
    if len(losses) < 2:
        return f"loss {fixed(losses[0], 7)} (1 step: no trend to judge)", True
    falling = losses[-1] < losses[0]
    return (f"loss first {fixed(losses[0], 7)}, last {fixed(losses[-1], 7)} "
            f"({'falling' if falling else 'NOT falling'})"), falling


def _check_first(checks: Callable[[int], Any], size: int, dry_run: bool) -> None:
    """``checks(size)`` before the simulated ranks start, its SpmdsimError refused in one line; in a dry run under a
    context of this thread's that says so (PROCESS's but for `dry_run`), so that a check asking dry_run_active()
    answers as it will on the ranks (a checkpoint's refusal of a dry run, a dry run's --routing)."""
    if dry_run:
        enter(RankContext(size=size, dry_run=True, hooks=PROCESS.hooks))
    try:
        checks(size)
    except SpmdsimError as e:
        refuse(str(e))
    finally:
        if dry_run:
            leave()


def run_main(main: Any, args: Any, ranks: Optional[int], needs: Optional[Callable[[int], Optional[str]]] = None,
             fits: int = 8, checks: Optional[Callable[[int], Any]] = None) -> int:
    """``main(args)`` on `ranks` simulated ranks, or on this MPI rank (`ranks` None); the exit code.

    First, on inputs every rank shares: ``--steps`` at least 1 (and, where the example has them, ``--every``
    at least 1, ``--sample`` an integer >= 0, ``--temperature`` and ``--lr`` finite numbers >= 0, each named as
    typed), a valid ``--ranks``,
    ``--dry-run`` only beside ``--ranks`` (then the run is a dry run: shapes only,
    the report of each rank's bytes instead of the output; docs/howto/simulate.md),
    ``needs(world size)`` (why the network cannot run at that size, or None; the line ends with the ways to
    `fits` ranks, where it runs, as this run was launched: a RankCountError),
    and ``checks(world size)`` (the example's own checks of its flags, pure: the SpmdsimError it raises is the
    line), each refused in one line with exit 2, before the banner. Simulated ranks go through the same
    launcher as every example's ``--ranks N`` (spmdsim.runtime.sim.launch: the
    one-process banner first, errors named by rank, the largest rank's exit
    code). Under MPI an exception on some ranks ends the whole job instead of
    hanging the others.
    """
    steps = getattr(args, "steps", 1)
    if steps < 1:
        refuse(f"--steps {steps!r} must be at least 1")
    problem = printing_problem(args)
    if problem:
        refuse(problem)
    dry_run = bool(getattr(args, "dry_run", False))
    if dry_run and ranks is None:
        refuse(DRY_RUN_NEEDS_RANKS)
    if dry_run and steps > MAX_DRY_STEPS:  # its report comes at the end: a million steps would be silent for hours
        refuse(f"--steps {steps:,} with --dry-run is too many; expected at most {MAX_DRY_STEPS:,} (a dry run prints "
               "nothing until its last step; --steps 1 gives one step's bytes)")
    if ranks is not None:
        size = world_size(ranks, dry_run)  # refuses a count that cannot be
        problem = needs(size) if needs is not None else None
        if problem:
            refuse(str(RankCountError(problem, fits, size).with_ways(ways_out(fits, size, SIMULATE))))
        if checks is not None:  # the flags' values, the world's split of them: before "running on N simulated ranks"
            _check_first(checks, size, dry_run)
        return run_on_ranks(ranks, lambda: main(args), dry_run=dry_run)
    MPI = load_mpi()  # no MPI library: one line naming --ranks N, not a 30-line traceback
    install_excepthook(MPI.COMM_WORLD)
    size = MPI.COMM_WORLD.Get_size()
    problem = needs(size) if needs is not None else None
    if problem:  # raised on every rank alike: the excepthook prints it once and exits 2
        raise RankCountError(problem, fits, size)  # the excepthook says how to get `fits`
    if checks is not None:  # (raised alike too)
        checks(size)
    return main(args)
