"""The networks `spmdsim autoshard` knows by name, as graphs plus their hand-written layouts.

Pure (numpy only; no runtime, no mpi4py). The seed networks of `spmdsim.models.nets` (their demo
names, ``net_mindspore_tutorial``, ...) become chains made from their `Network`, every stage
keeping the layouts its hand-written strategy gives (`graph.Hand`); at a device count their
strategies were not written for, the same shapes are searched without them.
The examples' patterns: ``mlp`` (examples/mlp.py), ``attention``
(examples/attention.py's pattern, one head) and ``chain`` (MatMul/ReLU x 50).
``gpt`` is examples/train_gpt.py's GPT, every operator a node (`gpt`), against
Megatron's layouts on dp x tp 4; ``gpt_sp`` the same against Megatron's with
sequence parallelism.
"""
from __future__ import annotations

from typing import Callable, Optional

from ...layouts.datagen import SeededTensor
from ...errors import OperatorError, SpmdsimError
from ...models.gpt.config import GPTConfig
from ...layouts.layout import Layout
from ...models.nets import NETWORKS as SEED_NETWORKS
from ...models.nets import Network
from ...models.nets.seeds import weight
from .gpt import gpt_graph, megatron
from .graph import Graph, Hand, OpNode, ParamSpec, attention, data_parallel, mlp_chain

__all__ = ["NAMES", "build", "from_network", "gpt_network"]

#: Stage kinds of `spmdsim.models.nets` -> node kinds here (Paddle's split layers are Linear layers).
_KIND = {"flatten": "flatten", "matmul": "matmul", "linear": "linear", "relu": "relu", "gelu": "gelu",
         "embedding": "embedding", "column_linear": "linear", "row_linear": "linear"}


def from_network(net: Network, devices: Optional[int] = None) -> tuple[Graph, Optional[tuple]]:
    """The chain graph of a seed network and its hand-written layouts (None for the input).

    With `devices` other than the network's own device count, the input
    arrives data parallel over `devices` and there are no hand-written layouts.
    """
    own = net.input_layout.layout.num_devices
    same = devices is None or devices == own
    layout = net.input_layout if same else data_parallel(devices, net.source.shape)
    nodes = [OpNode("x", "input", (), (), net.source.shape, net.source.dtype, layout=layout,
                    source=net.source)]
    hand: list = [None]
    flow = net.flow
    for stage, (shape, _), (out_shape, out_dtype) in zip(net.stages, flow, flow[1:]):
        params = tuple(ParamSpec(p.name, p.source) for p in stage.params)
        nodes.append(OpNode(stage.name, _KIND[stage.kind], (nodes[-1].name,), (shape,), out_shape,
                            out_dtype, params))
        hand.append(Hand((stage.x,), tuple(p.layout for p in stage.params), stage.out, stage.how))
    graph = Graph(net.name, net.title, tuple(nodes), net.batch_dims)
    return graph, (tuple(hand) if same else None)


def _seed(name: str) -> Callable[[int], tuple]:
    def build_seed(devices: int) -> tuple:
        make = SEED_NETWORKS[name]
        try:
            return from_network(make(devices))
        except SpmdsimError:
            # The hand-written strategies need another device count: search the shapes alone.
            return from_network(make(8), devices)
    return build_seed


def _mlp(devices: int) -> tuple:
    """examples/mlp.py: x (24, 96) -> Linear(96, 480) -> GELU -> Linear(480, 96)."""
    (b, h), f, dt = (24, 96), 480, "float32"
    x = OpNode("x", "input", (), (), (b, h), dt, layout=Layout((devices,), ("rep",))(None, None),
               source=SeededTensor((b, h), dt, 0))
    fc1 = OpNode("fc1", "linear", ("x",), ((b, h),), (b, f), dt,
                 (ParamSpec("w", weight((h, f), dt, 1)), ParamSpec("b", SeededTensor((f,), dt, 2))))
    act = OpNode("GELU", "gelu", ("fc1",), ((b, f),), (b, f), dt)
    fc2 = OpNode("fc2", "linear", ("GELU",), ((b, f),), (b, h), dt,
                 (ParamSpec("w", weight((f, h), dt, 3)), ParamSpec("b", SeededTensor((h,), dt, 4))))
    return Graph("mlp", "examples/mlp.py: Linear > GELU > Linear", (x, fc1, act, fc2)), None


def gpt_network(devices: int, cfg: Optional[GPTConfig] = None, sp: bool = False) -> tuple:
    """examples/train_gpt.py's GPT (`spmdsim.models.gpt.GPTConfig`, default: 4 layers, d_model 128, 4 heads,
    seq 64, batch 8, vocabulary 128) and Megatron's layouts when dp x 4 fits the devices."""
    cfg = GPTConfig() if cfg is None else cfg
    graph = gpt_graph(cfg, devices)
    if sp:
        graph = Graph("gpt_sp", graph.title + " (hand-written: sequence parallel)", graph.nodes,
                      graph.batch_dims, graph.fully_use_above)
    return graph, megatron(cfg, graph, devices, sp)


#: Network builders by name: ``NAMES[name](devices) -> (Graph, hand layouts or None)``.
NAMES: dict[str, Callable[[int], tuple]] = {
    **{name: _seed(name) for name in SEED_NETWORKS},
    "mlp": _mlp,
    "attention": lambda devices: (attention(devices), None),
    "chain": lambda devices: (mlp_chain(devices), None),
    "gpt": gpt_network,
    "gpt_sp": lambda devices: gpt_network(devices, sp=True),
}


def build(name: str, devices: int) -> tuple[Graph, Optional[tuple]]:
    """The graph called `name` at `devices` devices and its hand-written layouts (or None)."""
    if name not in NAMES:
        raise OperatorError(f"unknown network {name!r}; expected one of {tuple(NAMES)!r}")
    return NAMES[name](devices)
