"""The source documents' networks as pure `Network` values (OneFlow's 2D SBP sample, MindSpore's
operator-level parallel tutorial, Paddle's distributed.split; docs/explanation/semantics.md, "Source documents").

`mindspore_tutorial` (MatMul strategies) and `mindspore_layout` (Layout tuples),
`paddle_tp` (``paddle.distributed.split`` over every rank), `oneflow_2d_sbp` and
`oneflow_2d_signature` (2D SBP on a 2 x n placement). Their choices (data-parallel
input, default strategies, weights uniform in ±sqrt(6 / fan_in)) are in docs/reference/networks.md.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

from ...layouts.datagen import SeededTensor
from ...layouts.dialects.sbp import sbp_to_layout
from ...layouts.dialects.strategy import format_strategy, matmul_layouts, strategy_to_layout
from ...errors import OperatorError
from ...layouts.layout import Layout
from .model import Network, flatten_stage, linear_stage, matmul_stage, paddle_stage, relu_stage

__all__ = [
    "IMAGES", "HIDDEN", "CLASSES", "NO_STRATEGY", "weight", "mindspore_tutorial", "mindspore_layout", "paddle_tp",
    "needs_eight", "paddle_needs", "PADDLE_SIZES", "oneflow_2d_sbp", "oneflow_2d_signature",
    "oneflow_needs", "ONEFLOW_SIZES",
]

#: The tutorial's batch: 32 MNIST images (1, 28, 28); 512-wide layers; 10 classes.
IMAGES = (32, 1, 28, 28)
HIDDEN = 512
CLASSES = 10

#: What a MatMul without a strategy becomes: MindSpore's data-parallel default, or replicated.
NO_STRATEGY = {"data_parallel": None, "replicated": ((1, 1), (1, 1))}

#: Paddle network sizes: ids (batch, seq), vocabulary, hidden, ffn. 960 and 240 share the
#: divisors 1..6, 8, 10, 12, 15, 16, ..., so the network adapts to those world sizes.
PADDLE_SIZES = {"ids": (4, 16), "vocab": 960, "hidden": 64, "ffn": 240}


def needs_eight(world_size: int) -> Optional[str]:
    """Reason to skip the MindSpore networks: their strategies are written for 8 devices."""
    if world_size != 8:
        return f"the MindSpore tutorial's strategies need exactly 8 ranks, not {world_size}"
    return None


def paddle_needs(world_size: int) -> Optional[str]:
    """Reason to skip the Paddle network: the vocabulary and ffn width must divide."""
    v, f = PADDLE_SIZES["vocab"], PADDLE_SIZES["ffn"]
    if v % world_size or f % world_size:
        return f"vocabulary {v} and ffn width {f} do not split over {world_size} ranks"
    return None


#: OneFlow's 2D SBP sample: each rank's x is (1, 2, 8); Linear(8, 4), Linear(4, 2).
ONEFLOW_SIZES = {"local_x": (1, 2, 8), "hidden": 4, "classes": 2}


def oneflow_needs(world_size: int) -> Optional[str]:
    """Reason to skip the OneFlow network: its placement is 2 x n devices."""
    if world_size < 2 or world_size % 2:
        return f"the 2 x n placement needs an even rank count, not {world_size}"
    return None


def weight(shape: tuple[int, int], dtype: str, seed: int) -> SeededTensor:
    """A weight uniform in +-sqrt(6 / fan_in) (fan_in = shape[0]), so activations stay near 1: the seed
    networks' weights, and those of autoshard's own graphs (`spmdsim.tools.autoshard.graph`)."""
    bound = math.sqrt(6.0 / shape[0])
    return SeededTensor(shape, dtype, seed, low=-bound, high=bound)


def _require(needs: Callable[[int], Optional[str]], world_size: int) -> None:
    reason = needs(world_size)
    if reason:
        raise OperatorError(reason)


def _mindspore(name: str, title: str, world_size: int, dtype: str, seed: int, no_strategy: str,
               matmul1: tuple, matmul2: tuple) -> Network:
    """Flatten > MatMul1 > ReLU1 > MatMul2 > ReLU2 > MatMul3; `matmulN` is (how, x layout, w layout).

    The input arrives data parallel over all devices; MatMul3 has no strategy
    (data parallel or replicated, `no_strategy`).
    """
    batch = IMAGES[0]
    images = SeededTensor(IMAGES, dtype, seed)
    dp = (world_size,) + (1,) * (len(IMAGES) - 1)
    x_in = strategy_to_layout(dp, world_size)
    flatten = flatten_stage(x_in, IMAGES, how=f"data parallel {format_strategy(dp)}")
    stages = (
        flatten,
        matmul_stage("MatMul1", *matmul1, flatten.out_shape,
                     weight((flatten.out_shape[1], HIDDEN), dtype, seed + 1)),
        relu_stage("ReLU1", "shard(((4,1),))", strategy_to_layout((4, 1), world_size),
                   (batch, HIDDEN)),
        matmul_stage("MatMul2", *matmul2, (batch, HIDDEN), weight((HIDDEN, HIDDEN), dtype, seed + 2)),
    )
    if no_strategy not in NO_STRATEGY:
        raise OperatorError(f"no_strategy {no_strategy!r} must be one of {tuple(NO_STRATEGY)!r}")
    relu2 = relu_stage("ReLU2", "shard(((8,1),))", strategy_to_layout((8, 1), world_size),
                       (batch, HIDDEN))
    strategy = NO_STRATEGY[no_strategy] or ((world_size, 1), (1, 1))
    m3 = matmul_layouts(strategy, world_size)
    matmul3 = matmul_stage("MatMul3", f"no strategy: {no_strategy} {format_strategy(strategy)}",
                           m3.x, m3.w, (batch, HIDDEN),
                           weight((HIDDEN, CLASSES), dtype, seed + 3))
    return Network(name, title, images, x_in, stages + (relu2, matmul3))


def mindspore_tutorial(world_size: int = 8, dtype: str = "float32", seed: int = 0,
                       no_strategy: str = "data_parallel") -> Network:
    """MindSpore's operator-parallel tutorial network on 32 images of 28*28."""
    _require(needs_eight, world_size)
    m1 = matmul_layouts(((2, 4), (4, 1)), world_size)
    m2 = matmul_layouts(((1, 8), (8, 1)), world_size)
    return _mindspore("net_mindspore_tutorial", "MindSpore operator-parallel tutorial network",
                      world_size, dtype, seed, no_strategy, ("shard(((2,4),(4,1)))", m1.x, m1.w),
                      ("shard(((1,8),(8,1)))", m2.x, m2.w))


def mindspore_layout(world_size: int = 8, dtype: str = "float32", seed: int = 0,
                     no_strategy: str = "data_parallel") -> Network:
    """MindSpore's advanced variant: matmul1 and matmul2 sharded with Layout tuples."""
    _require(needs_eight, world_size)
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
    layout2 = Layout((8,), ("tp",))
    return _mindspore(
        "net_mindspore_layout", "MindSpore advanced operator parallel (Layout tuples)",
        world_size, dtype, seed, no_strategy,
        ('shard((layout("mp",("sp","dp")), layout(("sp","dp"),"None")))', layout("mp", ("sp", "dp")),
         layout(("sp", "dp"), "None")),
        ('shard((layout2("None","tp"), layout2("tp","None")))', layout2("None", "tp"),
         layout2("tp", "None")),
    )


def paddle_tp(world_size: int, dtype: str = "float32", seed: int = 0) -> Network:
    """Paddle's tensor-parallel pattern over every rank: vocab-parallel Embedding -> column -> row Linear.

    The column layer keeps its output split (gather_out=False), which is exactly
    the input split the row layer needs: only the embedding's and the row
    layer's Allreduce communicate.
    """
    _require(paddle_needs, world_size)
    ids_shape, vocab = PADDLE_SIZES["ids"], PADDLE_SIZES["vocab"]
    hidden, ffn = PADDLE_SIZES["hidden"], PADDLE_SIZES["ffn"]
    ids = SeededTensor(ids_shape, "int64", seed, low=0, high=vocab)
    table = SeededTensor((vocab, hidden), dtype, seed + 1)
    emb = paddle_stage("Embedding", "embedding", ids_shape, world_size, table)
    col = paddle_stage("ColumnLinear", "column_linear", emb.out_shape, world_size,
                       weight((hidden, ffn), dtype, seed + 2),
                       SeededTensor((ffn,), dtype, seed + 3))
    row = paddle_stage("RowLinear", "row_linear", col.out_shape, world_size,
                       weight((ffn, hidden), dtype, seed + 4),
                       SeededTensor((hidden,), dtype, seed + 5))
    # The ids arrive replicated, as the embedding wants them (Paddle feeds every mp rank alike).
    return Network("net_paddle_tp", "Paddle split: Embedding -> column Linear -> row Linear",
                   ids, emb.x, (emb, col, row), batch_dims=len(ids_shape))


def oneflow_2d_sbp(world_size: int, dtype: str = "float32", seed: int = 0,
                   weight_sbp: str = "B,B") -> Network:
    """OneFlow's 2D SBP sample model on a 2 x n placement (the sample's is [[0, 1], [2, 3]], n = 2).

    ``model.to_global(placement, sbp=(B, B))`` broadcasts every weight and bias;
    ``x.to_global(placement, sbp=(B, S(0)))`` makes each rank's (1, 2, 8) block
    one slice of an (n, 2, 8) input, the same on both rows of the placement. With
    broadcast weights each Linear is a local product: no communication, and the
    output keeps (B, S(0)). `weight_sbp` "S(1),B" gives the first Linear the
    seed's 2D signature instead (x (B, S(0)) times w (S(1), B) is y (S(1), S(0)),
    here S(2) for the 3-d activations): its output columns are split over axis_0,
    so the second Linear's broadcast weight needs them gathered first.
    """
    _require(oneflow_needs, world_size)
    if weight_sbp not in ("B,B", "S(1),B"):
        raise OperatorError(f"weight_sbp {weight_sbp!r} must be 'B,B' (the seed's model) or 'S(1),B' "
                            "(the seed's 2D MatMul signature)")
    placement = (2, world_size // 2)
    local_x, hidden, classes = ONEFLOW_SIZES["local_x"], ONEFLOW_SIZES["hidden"], ONEFLOW_SIZES["classes"]
    x_shape = (local_x[0] * placement[1],) + local_x[1:]
    features = x_shape[-1]
    x = sbp_to_layout("B,S(0)", placement, len(x_shape))
    broadcast_2d, broadcast_1d = sbp_to_layout("B,B", placement, 2), sbp_to_layout("B,B", placement, 1)
    # The bias is split like the output's last dim: S(0) over axis_0 when the weight's columns are.
    w1 = sbp_to_layout(weight_sbp, placement, 2)
    b1 = broadcast_1d if weight_sbp == "B,B" else sbp_to_layout("S(0),B", placement, 1)
    lin1 = linear_stage("Linear1", f"nn.Linear({features}, {hidden}), w sbp ({weight_sbp})", x, w1,
                        x_shape, weight((features, hidden), dtype, seed + 1), b1,
                        SeededTensor((hidden,), dtype, seed + 2))
    relu = relu_stage("ReLU", "local", lin1.out, lin1.out_shape)
    # Linear2 wants its input as OneFlow's sample has it, (B, S(0)); a redistribution
    # is scheduled when Linear1 left it otherwise.
    lin2 = linear_stage("Linear2", f"nn.Linear({hidden}, {classes}), w sbp (B,B)", x, broadcast_2d,
                        lin1.out_shape, weight((hidden, classes), dtype, seed + 3), broadcast_1d,
                        SeededTensor((classes,), dtype, seed + 4))
    name, title = (("net_oneflow_2d_sbp", "OneFlow 2D SBP sample: Linear > ReLU > Linear")
                   if weight_sbp == "B,B" else
                   ("net_oneflow_2d_signature", "OneFlow 2D SBP: Linear with w (S(1), B) > ReLU > Linear"))
    return Network(name, title, SeededTensor(x_shape, dtype, seed), x, (lin1, relu, lin2), batch_dims=2)


def oneflow_2d_signature(world_size: int, dtype: str = "float32", seed: int = 0) -> Network:
    """`oneflow_2d_sbp` with the seed's 2D MatMul signature on the first Linear (w (S(1), B))."""
    return oneflow_2d_sbp(world_size, dtype, seed, weight_sbp="S(1),B")
