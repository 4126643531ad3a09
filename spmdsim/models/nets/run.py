"""Run a `Network` under MPI: hop by hop, each traced on its own, every output checkable.

Importing this module loads the runtime and the operators, never mpi4py
(spmdsim.models.nets loads it on first use of `NetworkRunner`).
Each rank builds only its shards: the input and the weights come from
SeededTensors cut by the layout each operator requires. Between operators
whose layouts differ, `spmdsim.runtime.executor.redistribute` moves the value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...runtime.engines import engine_of
from ...layouts.layout import Layout
from ...nn.ops import activation, linear, matmul, split  # loading the operators gives DTensor its own (x + y)
from ...runtime.dtensor import DTensor
from ...runtime.executor import redistribute
from ...runtime.mesh import Mesh
from ...runtime.trace import collect_trace
from ...references.tolerances import network_atol
from .model import Hop, Network, reference_rows, schedule
from .table import HopRow, format_table, row_of

__all__ = ["NetworkRunner", "NetworkRun"]


class NetworkRunner:
    """``NetworkRunner(net, comm)``: meshes and weight shards of `net`, ready to run.

    Building validates every layout and shape (pure, identical on all ranks)
    before any collective. Call `forward()` for a traced run, `close()` at the end.
    """

    def __init__(self, net: Network, comm: Any) -> None:
        self.net = net
        self.comm = comm
        self.hops = schedule(net)
        self._meshes: dict[Layout, Any] = {}
        for hop in self.hops:
            self.mesh(hop.before.layout)
            self.mesh(hop.after.layout)
        # Weights of the strategy and SBP operators, cut once; the Paddle front end cuts its own.
        self.params: dict[int, tuple] = {}
        for i, stage in enumerate(net.stages):
            if stage.kind in ("matmul", "linear"):
                self.params[i] = tuple(
                    DTensor.from_seeded(self.mesh(p.layout.layout), p.layout, p.source)
                    for p in stage.params)

    def mesh(self, layout: Layout) -> Any:
        """The runtime Mesh of `layout` over this runner's communicator (one per device matrix)."""
        mesh = self._meshes.get(layout)
        if mesh is None:
            mesh = self._meshes[layout] = Mesh(layout, self.comm)
        return mesh

    @property
    def out_mesh(self) -> Any:
        return self.mesh(self.net.out.layout)

    def input(self) -> Any:
        """This rank's shard of the network input, in the layout it arrives in."""
        net = self.net
        return DTensor.from_seeded(self.mesh(net.input_layout.layout), net.input_layout, net.source)

    def forward(self, x: Any = None) -> "NetworkRun":
        """Run every hop, each under its own trace, on `x` (default: `input()`); the outputs and traces."""
        value = self.input() if x is None else x
        outputs, entries = [], []
        for hop in self.hops:
            with collect_trace() as trace:
                value = self._hop(hop, value)
            outputs.append(value)
            entries.append(trace.entries)
        return NetworkRun(self, tuple(outputs), tuple(entries))

    def _hop(self, hop: Hop, x: Any) -> Any:
        if hop.is_redistribution:
            y = redistribute(x, hop.after, hop.plan)
            # Keep every value on this runner's mesh of its device matrix.
            return DTensor(self.mesh(hop.after.layout), y.local, y.layout, y.global_shape)
        stage = self.net.stages[hop.stage]
        return _STAGES[stage.kind](self, hop.stage, x)

    def close(self, keep: Any = None) -> None:
        """Free the meshes' sub-communicators, except `keep`'s (collective: all ranks call it)."""
        for mesh in self._meshes.values():
            if mesh is not keep:
                mesh.close()


def _flatten(runner: NetworkRunner, index: int, x: Any) -> Any:
    stage = runner.net.stages[index]
    local = x.local.reshape(x.local.shape[0], -1)  # only dim 0 is split: a local reshape
    return DTensor(runner.mesh(stage.out.layout), local, stage.out, stage.out_shape)


def _product(runner: NetworkRunner, index: int, x: Any) -> Any:
    stage = runner.net.stages[index]
    op = matmul if stage.kind == "matmul" else linear
    return op(x, *runner.params[index], label=stage.name)


def _activation(runner: NetworkRunner, index: int, x: Any) -> Any:
    return activation(x, runner.net.stages[index].kind)


def _paddle(runner: NetworkRunner, index: int, x: Any) -> Any:
    stage = runner.net.stages[index]
    w = stage.params[0].source
    b = stage.params[1].source if len(stage.params) > 1 else False
    parts = stage.x.layout.num_devices
    if stage.kind == "embedding":
        return split(x, w.shape, "embedding", num_partitions=parts, weight_attr=w,
                     name=stage.name)
    axis = 1 if stage.kind == "column_linear" else 0
    return split(x, w.shape, "linear", axis=axis, num_partitions=parts, gather_out=False,
                 weight_attr=w, bias_attr=b, name=stage.name)


_STAGES = {"flatten": _flatten, "matmul": _product, "linear": _product, "relu": _activation, "gelu": _activation,
           "embedding": _paddle, "column_linear": _paddle, "row_linear": _paddle}


@dataclass(frozen=True)
class NetworkRun:
    """One forward pass: the value after each hop and this rank's trace entries per hop."""

    runner: NetworkRunner
    outputs: tuple
    entries: tuple

    @property
    def output(self) -> Any:
        return self.outputs[-1]

    def check(self, hop: Optional[int] = None) -> Any:
        """Verdict (agreed by all ranks) of hop `hop`'s value (default: the network output)."""
        index = len(self.outputs) - 1 if hop is None else hop
        net, upto = self.runner.net, self.runner.hops[index].upto
        return self.outputs[index].check(lambda region: reference_rows(net, upto, region),
                                         atol=network_atol(net, upto))

    def check_all(self) -> tuple:
        """Verdicts of every hop's value, in order."""
        return tuple(self.check(i) for i in range(len(self.outputs)))

    def rows(self) -> tuple[HopRow, ...]:
        """Per hop: collectives and the largest bytes sent by a rank (one allgather)."""
        mine = [[(e.op, e.axes, e.group_size, e.bytes_sent) for e in hop] for hop in self.entries]
        everyone = engine_of(self.runner.comm).all_gather_object(self.runner.comm, mine)
        return tuple(row_of(i + 1, hop, [r[i] for r in everyone])
                     for i, hop in enumerate(self.runner.hops))

    def table(self) -> str:
        """The per-operator table (a collective call; every rank gets the text)."""
        return format_table(self.runner.net, self.rows(), self.runner.comm.Get_size())
