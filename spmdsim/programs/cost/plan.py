"""Plan predictions: seconds per step of a redistribution plan (duck-typed on its steps).

Pure (never imports mpi4py); turns each planner step into one collective call
of `spmdsim.programs.cost.model` and prices it.
"""
from __future__ import annotations

import math
from fractions import Fraction
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import SpmdsimError
from ..plan.steps import KINDS
from .model import DEFAULT_MODEL, CostModel, normalize_op
from ..plan.volume import rank_boxes

__all__ = ["predict_plan", "StepPrediction"]

# The cost model's name of a collective -> the plan step kind that owns its bytes.
_STEP_OF = {"alltoallv": "exchange"}
# Planner steps that move nothing between ranks (matched with and without underscores).
_LOCAL_OPS = frozenset({"localslice", "slice", "local", "noop", "identity", "zero", "localzero", "keep", "b_to_p"})


@dataclass(frozen=True)
class StepPrediction:
    """Predicted time of one plan step (0 for local steps)."""

    index: int
    op: str
    group_size: int
    bytes_per_rank: int
    seconds: float
    bytes_copied: int = 0  # local packing/unpacking, priced with the model's copy rate


def predict_plan(plan: Any, model: CostModel | None = None) -> tuple[StepPrediction, ...]:
    """Predicted seconds per step of a redistribution plan (duck-typed on its steps).

    `plan` is a plan with ``.steps`` or an iterable of steps. Each step needs an
    op name (``op``, else its class name), a group size (``group_size``, or
    ``axes`` with a layout) and the bytes one rank moves (``bytes_received`` /
    ``bytes_sent``: an int or one int per rank; the busiest rank counts). Those
    bytes are turned into the collective's buffer ``n`` with spmdsim.programs.plan's
    conventions (Allgather (g-1)n_in, Allreduce 2(g-1)/g n, others (g-1)/g n).
    An Exchange with ``transfers`` (or a trace entry with ``peers``) is costed
    with the peers it really has.
    A step (or trace entry) with ``bytes_copied`` also pays that local packing
    at the model's copy rate (``CostModel.predict_copy``).
    """
    model = DEFAULT_MODEL if model is None else model
    steps = getattr(plan, "steps", plan)
    out = []
    for index, step in enumerate(steps):
        name = _step_op(step)
        key = name.strip().lower().replace("-", "_")
        if key in _LOCAL_OPS or key.replace("_", "") in _LOCAL_OPS:
            out.append(StepPrediction(index, key, 1, 0, 0.0))
            continue
        op = normalize_op(name)
        moved = _step_bytes(step)
        g = _exchange_peers(step) + 1 if op == "alltoallv" else _step_group_size(step, plan)
        if g <= 1 or moved == 0:
            out.append(StepPrediction(index, op, g, 0, 0.0))
            continue
        n = _buffer_bytes(op, g, moved)
        copied = _step_copied(step, plan, op, g)
        seconds = model.predict(op, g, float(n)) + model.predict_copy(copied)
        out.append(StepPrediction(index, op, g, round(n), seconds, copied))
    return tuple(out)


def _step_copied(step: Any, plan: Any, op: str, g: int) -> int:
    """Bytes the step packs or unpacks locally on the busiest rank.

    ``bytes_copied`` when the step has it (trace entries do); for the planner's
    steps, worked out as the runtime's collectives do it: blocks along a tensor
    dim with a larger-than-one product of the dims before it are packed (send
    side) or unpacked (receive side); an Exchange packs everything it sends,
    except a rank's whole block going to one peer (sent as it lies).
    """
    given = _as_max(getattr(step, "bytes_copied", None))
    if given is not None:
        return int(given)
    if op == "alltoallv":
        return _exchange_copied(step, plan)
    shape, before = getattr(plan, "shape", None), getattr(step, "before", None)
    if shape is None or not hasattr(before, "local_shape"):
        return 0
    try:
        # The busiest rank's block where an uneven cut (Layout.cut) makes them differ.
        local = tuple(before.max_local_shape(shape) if hasattr(before, "max_local_shape")
                      else before.local_shape(shape))
        item = np.dtype(getattr(plan, "dtype", "float32")).itemsize  # as the planner sizes steps
    except Exception:  # noqa: BLE001 - a duck-typed step we cannot size costs no packing
        return 0
    n = math.prod(local) * item

    def strided(dims: tuple, d: int) -> bool:
        return math.prod(dims[:d]) > 1
    if op == "allgather":
        return n * g if strided(local, getattr(step, "tensor_dim", 0)) else 0
    if op == "reduce_scatter":
        return n if strided(local, getattr(step, "tensor_dim", 0)) else 0
    if op == "alltoall":
        s, c = getattr(step, "split_dim", 0), getattr(step, "concat_dim", 0)
        block = local[:s] + (local[s] // g,) + local[s + 1:]
        return (n if strided(local, s) else 0) + (n if strided(block, c) else 0)
    return 0


def _exchange_copied(step: Any, plan: Any) -> int:
    """The most bytes a rank packs for an Exchange: all it sends, unless that is its whole block."""
    sent = getattr(step, "bytes_sent", 0)
    transfers, shape = getattr(step, "transfers", None), getattr(plan, "shape", None)
    if not transfers or shape is None or not hasattr(step, "before"):
        return int(_as_max(sent) or 0)

    held = rank_boxes(step.before, tuple(shape))
    boxes: dict = {}
    for src, _, box, _, _ in transfers:
        boxes.setdefault(src, []).append(box)
    whole = {r for r, sends in boxes.items() if len(sends) == 1 and sends[0] == held[r]}
    return max((n for r, n in enumerate(sent) if r not in whole), default=0)


def _step_op(step: Any) -> str:
    for attr in ("op", "kind", "collective"):
        value = getattr(step, attr, None)
        if isinstance(value, str):
            return value
    return type(step).__name__


def _step_group_size(step: Any, plan: Any) -> int:
    for attr in ("group_size", "size", "num_ranks"):
        value = getattr(step, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    axes = getattr(step, "axes", None)
    layout = getattr(step, "before", None) or getattr(step, "layout", None) \
        or getattr(plan, "layout", None)
    layout = getattr(layout, "layout", layout)  # a TensorLayout carries its Layout
    if axes is not None and layout is not None and hasattr(layout, "group_size"):
        return layout.group_size(tuple(axes))
    raise SpmdsimError(f"plan step {step!r:.80} has no group size (group_size or axes)")


def _as_max(value: Any) -> int | float | None:
    """A byte count, or the largest of one per rank; ints stay exact Python ints at any size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, (tuple, list)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return max(value, default=0)
    return None


def _step_bytes(step: Any) -> int | float:
    """Bytes the busiest rank receives (or sends, if more) in this step."""
    found = [v for v in (_as_max(getattr(step, attr, None)) for attr in (
        "bytes_received", "bytes_sent", "bytes_per_rank", "recv_bytes", "send_bytes"))
        if v is not None]
    if not found:
        raise SpmdsimError(f"plan step {step!r:.80} has no byte count (bytes_received)")
    return max(found)


def _exchange_peers(step: Any) -> int:
    """Most distinct peers any rank talks to in an exchange (else the group size - 1).

    A trace entry says it (``peers``, this rank's); a planner step has its
    ``transfers``.
    """
    peers = getattr(step, "peers", None)
    if isinstance(peers, int) and not isinstance(peers, bool) and peers > 0:
        return peers
    transfers = getattr(step, "transfers", None)
    if transfers:
        peers: dict[int, set] = {}
        for src, dst, *_ in transfers:
            if src != dst:
                peers.setdefault(src, set()).add(dst)
                peers.setdefault(dst, set()).add(src)
        if peers:
            return max(len(p) for p in peers.values())
    try:
        return max(1, _step_group_size(step, None) - 1)
    except SpmdsimError:
        return 1


def _buffer_bytes(op: str, g: int, moved: int | float) -> Fraction:
    """Turn the bytes one rank moves into the collective buffer ``n`` of the formulas.

    A Fraction: exact at any size (a float quotient loses bytes past 2**53).
    """
    if isinstance(moved, float) and not math.isfinite(moved):
        raise SpmdsimError(f"byte count {moved!r} must be a finite number")
    moved = Fraction(moved)
    if op == "bcast":  # not a plan step: the root's buffer is what every member receives
        return moved
    return KINDS[_STEP_OF.get(op, op)].buffer_bytes(g, moved)
