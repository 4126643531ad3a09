"""Operator graphs for the strategy search: nodes with shapes and edges, no layouts yet.

Pure (never imports mpi4py). A `Graph` is a tuple of `OpNode`s in topological
order; node 0 is the network input, whose layout is given. Each other node
names the nodes whose outputs it consumes (its activation inputs, in order)
and carries its weights as `ParamSpec`s (weights are placed where the chosen
strategy wants them, for free: only activations move between operators).

A graph states no network twice: the seed networks' graphs are made from their
`spmdsim.models.nets.Network` (`networks.from_network`), the GPT's from `spmdsim.models.gpt`'s
parameters (`gpt.gpt_graph`). Here: `mlp_chain` (a chain of MatMul / ReLU of any
length) and `attention` (single-head self-attention: three branches that join),
autoshard's own, with the seed networks' weights (`spmdsim.models.nets.seeds.weight`).
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from ...layouts.datagen import SeededTensor
from ...errors import OperatorError
from ...layouts.layout import Layout, TensorLayout
from ...models.nets.seeds import weight
from ...models.axes import DATA

__all__ = ["KINDS", "Constant", "ParamSpec", "OpNode", "Hand", "Graph", "mlp_chain", "attention", "data_parallel"]

#: Up to this many operators an unknown name's error lists them all; past it, the likely ones.
_LISTED = 12

#: Operator kinds a node may have ("input" is the network input, its layout fixed).
KINDS = ("input", "flatten", "matmul", "linear", "bmm", "relu", "gelu", "softmax", "embedding",
         "einsum", "pointwise", "layernorm", "reshape", "cross_entropy")

#: Kinds that take one activation and keep its layout (no communication).
ELEMENTWISE = ("relu", "gelu", "softmax")


@dataclass(frozen=True)
class Constant:
    """A global tensor whose every element is `value`: a weight that starts as ones or zeros (the
    GPT's layer norms and biases, `spmdsim.models.gpt.params`), where others are a `SeededTensor`."""

    shape: tuple[int, ...]
    dtype: str
    value: float

    def full(self) -> np.ndarray:
        """The whole tensor (references and small runs)."""
        return np.full(self.shape, self.value, dtype=self.dtype)


@dataclass(frozen=True)
class ParamSpec:
    """A weight or bias: its global values (a SeededTensor, or a Constant), hence its shape and dtype."""

    name: str
    source: Union[SeededTensor, Constant]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.source.shape


@dataclass(frozen=True)
class OpNode:
    """One operator: what it consumes, what it produces, its weights.

    Attributes:
        name: "MatMul1", ...
        kind: one of KINDS.
        inputs: names of the nodes whose outputs this one consumes, in order.
        in_shapes: global shape of each activation input.
        out_shape: global shape of the output.
        dtype: dtype of the output.
        params: weights (matmul: w; linear: w, b; embedding: the table).
        transpose_b: bmm only: the second input is stored (..., N, K).
        spec: einsum: its subscripts ("btd,de->bte"); pointwise: the op ("add", "mul"). Their
            operands are the activation inputs, then the weights, in that order. Embedding:
            "scatter" also offers a split vocabulary's Reduce_scatter into an output dim.
            Softmax: "causal" first sets the keys after each query to -inf (the GPT's mask).
        layout: input only: the layout the network input arrives in.
        source: input: the global input values; cross_entropy: the class of each row (int64).
        constant: pointwise with one operand: the number it applies (the scores' 1/sqrt(head_dim)).
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    in_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    dtype: str
    params: tuple[ParamSpec, ...] = ()
    transpose_b: bool = False
    spec: str = ""
    layout: Optional[TensorLayout] = None
    source: Optional[SeededTensor] = None
    constant: Optional[float] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OperatorError(f"operator kind {self.kind!r} is not one of {KINDS!r}")
        if len(self.inputs) != len(self.in_shapes):
            raise OperatorError(f"{self.name}: {len(self.inputs)} inputs but "
                                f"{len(self.in_shapes)} input shapes")
        if (self.kind == "input") != (self.layout is not None):
            raise OperatorError(f"{self.name}: only the input node has a fixed layout")
        if self.kind != "input" and not self.inputs:
            raise OperatorError(f"{self.name}: an operator consumes at least one earlier output")


@dataclass(frozen=True)
class Hand:
    """Hand-written layouts of one operator: activation inputs, weights, output (a seed network's
    stage's, Megatron's for the GPT)."""

    inputs: tuple[TensorLayout, ...]
    params: tuple[TensorLayout, ...]
    out: TensorLayout
    how: str


@dataclass(frozen=True)
class Graph:
    """Operators in topological order; node 0 is the input.

    `batch_dims` leading dims are rows the network treats independently (the
    network runner's reference uses it). Above `fully_use_above` devices only
    strategies that use every device are candidates, for operators that have
    any (MindSpore's ``fully_use_devices``); None: every strategy at any count.
    """

    name: str
    title: str
    nodes: tuple[OpNode, ...]
    batch_dims: int = 1
    fully_use_above: Optional[int] = None

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise OperatorError(f"operator names must be unique, got {names!r}")
        if not self.nodes or self.nodes[0].kind != "input":
            raise OperatorError("a graph starts with its input node")
        seen: set = set()
        for node in self.nodes:
            missing = [i for i in node.inputs if i not in seen]
            if missing:
                raise OperatorError(f"{node.name} consumes {missing!r}, which no earlier node produces")
            seen.add(node.name)

    def index(self, name: str) -> int:
        """Position of the node called `name`; OperatorError naming the known ones otherwise."""
        for i, node in enumerate(self.nodes):
            if node.name == name:
                return i
        names = tuple(n.name for n in self.nodes[1:])
        if len(names) <= _LISTED:
            raise OperatorError(f"no operator {name!r} in {self.name}; expected one of {names!r}")
        close = difflib.get_close_matches(str(name), names, n=3)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise OperatorError(f"no operator {name!r} in {self.name}; {hint}its {len(names)} operators are "
                            f"{', '.join(names[:4])}, ..., {', '.join(names[-2:])} (spmdsim autoshard "
                            f"--network {self.name} lists them all)")

    @property
    def edges(self) -> tuple[tuple[int, int, int], ...]:
        """(producer, consumer, input position) of every activation edge."""
        return tuple((self.index(src), c, pos) for c, node in enumerate(self.nodes)
                     for pos, src in enumerate(node.inputs))

    def is_tree(self) -> bool:
        """Whether the undirected graph (parallel edges merged) has no cycle."""
        pairs = {tuple(sorted((p, c))) for p, c, _ in self.edges}
        return len(pairs) == len(self.nodes) - 1

    def is_chain(self) -> bool:
        """Whether every operator consumes exactly the one before it."""
        return all(node.inputs == (self.nodes[i].name,) for i, node in enumerate(self.nodes[1:]))


def data_parallel(devices: int, shape: Sequence[int]) -> TensorLayout:
    """Dim 0 split over as many devices as divide it, the rest repeating (MindSpore's default)."""
    split = math.gcd(devices, shape[0])
    return Layout((split, devices // split), (DATA, "rep"))(DATA, *([None] * (len(shape) - 1)))


def _input(shape: Sequence[int], dtype: str, devices: int, seed: int) -> OpNode:
    """The network input, data parallel."""
    shape = tuple(shape)
    return OpNode("x", "input", (), (), shape, dtype, layout=data_parallel(devices, shape),
                  source=SeededTensor(shape, dtype, seed))


def mlp_chain(devices: int, layers: int = 50, batch: int = 64, width: int = 256,
              dtype: str = "float32", seed: int = 0) -> Graph:
    """`layers` x (MatMul (width, width) -> ReLU): a chain of 2 * layers operators."""
    nodes = [_input((batch, width), dtype, devices, seed)]
    for i in range(1, layers + 1):
        nodes.append(OpNode(f"MatMul{i}", "matmul", (nodes[-1].name,), ((batch, width),),
                            (batch, width), dtype, (ParamSpec("w", weight((width, width), dtype, seed + i)),)))
        nodes.append(OpNode(f"ReLU{i}", "relu", (nodes[-1].name,), ((batch, width),), (batch, width), dtype))
    return Graph("chain", f"MatMul/ReLU chain of {2 * layers} operators", tuple(nodes))


def attention(devices: int, seq: int = 16, d_model: int = 32, dtype: str = "float32",
              seed: int = 0) -> Graph:
    """Single-head self-attention: Q, K, V branch off x and join in the scores and the output.

    S = Q K^T, P = softmax(S) along the keys, O = P V, Y = O Wo: the graph has
    cycles (x -> Q -> S and x -> K -> S), so the search is branch and bound.
    """
    sd = (seq, d_model)
    nodes = [_input(sd, dtype, devices, seed)]
    for i, name in enumerate(("Q", "K", "V"), 1):
        nodes.append(OpNode(name, "matmul", ("x",), (sd,), sd, dtype,
                            (ParamSpec("w", weight((d_model, d_model), dtype, seed + i)),)))
    nodes += [
        OpNode("Scores", "bmm", ("Q", "K"), (sd, sd), (seq, seq), dtype, transpose_b=True),
        OpNode("Softmax", "softmax", ("Scores",), ((seq, seq),), (seq, seq), dtype),
        OpNode("Context", "bmm", ("Softmax", "V"), ((seq, seq), sd), sd, dtype),
        OpNode("Out", "matmul", ("Context",), (sd,), sd, dtype,
               (ParamSpec("w", weight((d_model, d_model), dtype, seed + 4)),)),
    ]
    return Graph("attention", "single-head self-attention: Q, K, V branches join", tuple(nodes))
