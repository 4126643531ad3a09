"""The seed networks as pure `Network` values (seed 003: MindSpore; seed 004: Paddle).

* `mindspore_tutorial`: flatten -> MatMul.shard(((2,4),(4,1))) -> ReLU.shard(((4,1),))
  -> MatMul.shard(((1,8),(8,1))) -> ReLU.shard(((8,1),)) -> MatMul (no strategy);
* `mindspore_layout`: the same network with matmul1 / matmul2 sharded by Layout
  tuples (Layout((2,2,2), ("dp","sp","mp")) and Layout((8,), ("tp",)));
* `paddle_tp`: Embedding -> column Linear -> row Linear with
  ``paddle.distributed.split`` over every rank.

Choices (docs/networks.md): the images arrive data parallel (MindSpore's
default ``dataset_strategy``: batch split over all devices); Flatten and the
MatMul without a strategy get MindSpore's default data-parallel strategy
(batch dim over all devices, weight replicated). Weights are uniform in
±sqrt(6 / fan_in) so activations stay near 1 through the layers.
"""
from __future__ import annotations

import math
from typing import Optional

from ..datagen import SeededTensor
from ..dialects.strategy import format_strategy, matmul_layouts, strategy_layout
from ..errors import OperatorError
from ..layout import Layout
from .model import Network, flatten_stage, matmul_stage, paddle_stage, relu_stage

__all__ = [
    "IMAGES",
    "HIDDEN",
    "CLASSES",
    "NO_STRATEGY",
    "mindspore_tutorial",
    "mindspore_layout",
    "paddle_tp",
    "needs_eight",
    "paddle_needs",
    "PADDLE_SIZES",
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
        return f"the tutorial's strategies and Layout((2,2,2)) need exactly 8 ranks, not {world_size}"
    return None


def paddle_needs(world_size: int) -> Optional[str]:
    """Reason to skip the Paddle network: the vocabulary and ffn width must divide."""
    v, f = PADDLE_SIZES["vocab"], PADDLE_SIZES["ffn"]
    if v % world_size or f % world_size:
        return f"vocabulary {v} and ffn width {f} do not split over {world_size} ranks"
    return None


def _weight(shape: tuple[int, int], dtype: str, seed: int) -> SeededTensor:
    bound = math.sqrt(6.0 / shape[0])
    return SeededTensor(shape, dtype, seed, low=-bound, high=bound)


def _check_world(world_size: int) -> None:
    reason = needs_eight(world_size)
    if reason:
        raise OperatorError(reason)


def _head(world_size: int, dtype: str, seed: int) -> tuple:
    """Input (data parallel over all devices) and Flatten, shared by both MindSpore networks."""
    images = SeededTensor(IMAGES, dtype, seed)
    dp = (world_size,) + (1,) * (len(IMAGES) - 1)
    x_in = strategy_layout(dp, world_size)
    return images, x_in, flatten_stage(x_in, IMAGES, how=f"data parallel {format_strategy(dp)}")


def _tail(world_size: int, dtype: str, seed: int, no_strategy: str) -> tuple:
    """ReLU2 ((8,1),) and MatMul3 without a strategy (data parallel or replicated)."""
    batch = IMAGES[0]
    if no_strategy not in NO_STRATEGY:
        raise OperatorError(f"no_strategy {no_strategy!r} must be one of {tuple(NO_STRATEGY)!r}")
    relu2 = relu_stage("ReLU2", "shard(((8,1),))", strategy_layout((8, 1), world_size),
                       (batch, HIDDEN))
    strategy = NO_STRATEGY[no_strategy] or ((world_size, 1), (1, 1))
    m3 = matmul_layouts(strategy, world_size)
    matmul3 = matmul_stage("MatMul3", f"no strategy: {no_strategy} {format_strategy(strategy)}",
                           m3.x, m3.w, (batch, HIDDEN),
                           _weight((HIDDEN, CLASSES), dtype, seed + 3))
    return relu2, matmul3


def mindspore_tutorial(world_size: int = 8, dtype: str = "float32", seed: int = 0,
                       no_strategy: str = "data_parallel") -> Network:
    """Seed 003's operator-parallel sample network on 32 images of 28*28."""
    _check_world(world_size)
    batch = IMAGES[0]
    images, x_in, flatten = _head(world_size, dtype, seed)
    m1 = matmul_layouts(((2, 4), (4, 1)), world_size)
    m2 = matmul_layouts(((1, 8), (8, 1)), world_size)
    stages = (
        flatten,
        matmul_stage("MatMul1", "shard(((2,4),(4,1)))", m1.x, m1.w, flatten.out_shape,
                     _weight((flatten.out_shape[1], HIDDEN), dtype, seed + 1)),
        relu_stage("ReLU1", "shard(((4,1),))", strategy_layout((4, 1), world_size),
                   (batch, HIDDEN)),
        matmul_stage("MatMul2", "shard(((1,8),(8,1)))", m2.x, m2.w, (batch, HIDDEN),
                     _weight((HIDDEN, HIDDEN), dtype, seed + 2)),
    ) + _tail(world_size, dtype, seed, no_strategy)
    return Network("net_mindspore_tutorial", "MindSpore operator-parallel tutorial network",
                   images, x_in, stages)


def mindspore_layout(world_size: int = 8, dtype: str = "float32", seed: int = 0,
                     no_strategy: str = "data_parallel") -> Network:
    """Seed 003's advanced variant: matmul1 and matmul2 sharded with Layout tuples."""
    _check_world(world_size)
    batch = IMAGES[0]
    images, x_in, flatten = _head(world_size, dtype, seed)
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
    layout2 = Layout((8,), ("tp",))
    stages = (
        flatten,
        matmul_stage("MatMul1", 'shard((layout("mp",("sp","dp")), layout(("sp","dp"),"None")))',
                     layout("mp", ("sp", "dp")), layout(("sp", "dp"), "None"),
                     flatten.out_shape, _weight((flatten.out_shape[1], HIDDEN), dtype, seed + 1)),
        relu_stage("ReLU1", "shard(((4,1),))", strategy_layout((4, 1), world_size),
                   (batch, HIDDEN)),
        matmul_stage("MatMul2", 'shard((layout2("None","tp"), layout2("tp","None")))',
                     layout2("None", "tp"), layout2("tp", "None"), (batch, HIDDEN),
                     _weight((HIDDEN, HIDDEN), dtype, seed + 2)),
    ) + _tail(world_size, dtype, seed, no_strategy)
    return Network("net_mindspore_layout", "MindSpore advanced operator parallel (Layout tuples)",
                   images, x_in, stages)


def paddle_tp(world_size: int, dtype: str = "float32", seed: int = 0) -> Network:
    """Seed 004's pattern over every rank: vocab-parallel Embedding -> column -> row Linear.

    The column layer keeps its output split (gather_out=False), which is exactly
    the input split the row layer needs: only the embedding's and the row
    layer's Allreduce communicate.
    """
    reason = paddle_needs(world_size)
    if reason:
        raise OperatorError(reason)
    ids_shape, vocab = PADDLE_SIZES["ids"], PADDLE_SIZES["vocab"]
    hidden, ffn = PADDLE_SIZES["hidden"], PADDLE_SIZES["ffn"]
    ids = SeededTensor(ids_shape, "int64", seed, low=0, high=vocab)
    table = SeededTensor((vocab, hidden), dtype, seed + 1)
    emb = paddle_stage("Embedding", "embedding", ids_shape, world_size, table)
    col = paddle_stage("ColumnLinear", "column_linear", emb.out_shape, world_size,
                       _weight((hidden, ffn), dtype, seed + 2),
                       SeededTensor((ffn,), dtype, seed + 3))
    row = paddle_stage("RowLinear", "row_linear", col.out_shape, world_size,
                       _weight((ffn, hidden), dtype, seed + 4),
                       SeededTensor((hidden,), dtype, seed + 5))
    # The ids arrive replicated, as the embedding wants them (Paddle feeds every mp rank alike).
    return Network("net_paddle_tp", "Paddle split: Embedding -> column Linear -> row Linear",
                   ids, emb.x, (emb, col, row), batch_dims=len(ids_shape))
