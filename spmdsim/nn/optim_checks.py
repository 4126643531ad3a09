"""The optimizers' argument checks (hyperparameters, step counts) and what they ask of a running capture."""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

from ..errors import OperatorError
from .autograd.graph import Leaf
from ..base.validate import describe, tolerance_arg


#: torch.optim's keywords (spmdsim.base.foreign): the values that ask for what spmdsim's optimizers do, and
#: what they do instead of the others. fused and foreach choose a kernel and give the same numbers either
#: way, so every value of theirs is a request spmdsim meets; a step of every optimizer can be captured.
_KERNEL = "an update is numpy on this rank's blocks (AdamW's over flat groups of them)"
PYTORCH_KEYWORDS = {
    "fused": ((None, False, True), _KERNEL),
    "foreach": ((None, False, True), _KERNEL),
    "capturable": ((None, False, True), "a step is captured and replayed as it is (spmdsim.runtime.replay)"),
    "differentiable": ((None, False), "an update is never recorded for autograd"),
    "maximize": ((False,), "it minimizes; negate the loss instead"),
    "amsgrad": ((False,), "Adam and AdamW have no AMSGrad variant"),
    "nesterov": ((False,), "SGD's momentum is heavy-ball, PyTorch's default (buffer = momentum * buffer + g)"),
    "dampening": ((0,), "SGD's momentum adds the whole gradient, PyTorch's default dampening 0"),
    "weight_decay": ((0,), "SGD and Adam decay nothing; AdamW(weight_decay=...) decays apart from the gradient"),
}

#: torch.optim's Optimizer.step keyword: a closure that evaluates the loss again (spmdsim.base.foreign).
STEP_KEYWORDS = {
    "closure": ((None,), "a step updates from the gradients .grad holds and evaluates nothing; call the closure "
                         "(its forward and backward) first, then step()"),
}


def _sharded_away(i: int, p: Any, where: str = "optimizer") -> None:
    """Refuse parameter `i` where fully_shard replaced it by its shards (its leaf's ``sharded_away``), in one line:
    an optimizer stepping it would step a tensor the units never read (the training would stand still)."""
    name = getattr(p._ag, "sharded_away", None)
    if name is not None:
        raise OperatorError(f"{where} parameter {i} ({_what(p, leaf=True)}) is parameter {name!r} as it was before "
                            "fully_shard: the units read its shards, so it never gets a gradient; give the "
                            "optimizer the shards, list(fs.params.values()), made by fully_shard first")


def _count(name: str, where: str, value: Any) -> int:
    """A step count: an integer >= 0."""
    if type(value) is bool or not isinstance(value, numbers.Integral) or value < 0:
        raise OperatorError(f"{name}: {where} {value!r} must be an integer >= 0 (a step count)")
    return int(value)


def _capturing() -> bool:
    """Whether this thread captures a step now (spmdsim.runtime.replay), outside a kernel; no import while
    nothing captures."""
    replay = sys.modules.get("spmdsim.runtime.replay")
    return replay is not None and replay.capturing()


def _is_scalar(value: Any) -> bool:
    """Whether `value` is a spmdsim.runtime.replay.Scalar (none exists before that module is loaded)."""
    replay = sys.modules.get("spmdsim.runtime.replay")
    return replay is not None and isinstance(value, replay.Scalar)


def _positive(value: Any, name: str) -> float:
    """A finite number > 0 (eps), one message for every bad value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise OperatorError(f"{name} {value!r} must be a finite number > 0")
    return float(value)


def _learning_rate(value: Any, name: str) -> float:
    """A finite number >= 0, as torch.optim allows (lr 0: a warm-up's first step, a frozen run)."""
    return tolerance_arg(value, name, OperatorError)


def _momentum(value: Any, name: str) -> float:
    out = tolerance_arg(value, name, OperatorError)
    if out >= 1:
        raise OperatorError(f"{name} {value!r} must be in [0, 1)")
    return out


def _betas(value: Any, name: str) -> tuple:
    return _adam_args(value, 1.0)[0]


def _at_least_zero(value: Any, name: str) -> float:
    return tolerance_arg(value, name, OperatorError)


#: The optimizers' hyperparameters (attribute -> its check): set between steps, the next update reads them
#: (a replayed one too); set inside a captured step, refused (`_Optimizer.__setattr__`).
_SETTINGS: dict = {"lr": _learning_rate, "eps": _positive, "weight_decay": _at_least_zero, "clip_grad": _at_least_zero,
                   "momentum": _momentum, "betas": _betas}


def _adam_args(betas: Any, eps: Any) -> tuple[tuple[float, float], float]:
    """Adam's and AdamW's (betas, eps), checked: a pair in [0, 1) and a positive number."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise OperatorError(f"betas {betas!r} must be a pair (beta1, beta2)")
    pair = tuple(tolerance_arg(b, "beta", OperatorError) for b in betas)
    if not all(b < 1 for b in pair):
        raise OperatorError(f"betas {betas!r} must be in [0, 1)")
    return pair, _positive(eps, "eps")  # type: ignore[return-value]


def _into(live: Any, loaded: np.ndarray) -> np.ndarray:
    """`loaded` (a checked copy) written into `live`, the array the next step reads (AdamW's flat buffers are
    viewed per parameter; a captured step's kernels hold ZeRO-1's slices), when it is one alike; else `loaded`."""
    if isinstance(live, np.ndarray) and live.shape == loaded.shape and live.dtype == loaded.dtype:
        np.copyto(live, loaded)
        return live
    return loaded


def _what(value: Any, leaf: bool = False) -> str:
    """A parameter as every rank describes it alike (a DTensor's repr names this rank and its block); `leaf`:
    `value` may be a leaf (said so), not only a tensor refused for not being one."""
    if hasattr(value, "layout") and hasattr(value, "global_shape"):
        node = getattr(value, "_ag", None)
        kind = "a leaf" if leaf and isinstance(node, Leaf) else _computed(node) if value.requires_grad else \
            "without requires_grad_()"
        return f"a DTensor of global shape {tuple(value.global_shape)!r}, layout {value.layout}, {kind}"
    return describe(value)


def _computed(node: Any) -> str:
    """What a non-leaf parameter is: computed by an op, or a cast of a leaf (x.astype records the cast, as PyTorch's
    p.to(dtype) does), with how to make its own leaf."""
    if str(getattr(node, "name", "")).startswith("astype "):
        return ("not a leaf: a cast by x.astype, which records it for the gradient; cast inside "
                "spmdsim.nn.autograd.no_grad(), then requires_grad_() (PyTorch's p.detach().to(dtype))")
    return "not a leaf: computed by an op"
