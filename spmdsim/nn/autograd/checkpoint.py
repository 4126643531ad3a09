"""``checkpoint(fn, *inputs)``: run a region without keeping its activations, run it again in the backward.

Full activation recomputation (Chen et al. 2016; Megatron's ``--recompute-granularity full``, PyTorch's
``torch.utils.checkpoint``): the forward runs `fn` under `no_grad`, so nothing inside it is kept for
backward; the one node it records keeps only its inputs. Its backward runs `fn` again on the same
inputs, now recording, and walks that graph with the output's gradient (`spmdsim.nn.autograd.engine.
gradients`): every collective of the region's forward runs again, then its backward's. Values are
the same because every operator is deterministic given its inputs; a dropout inside draws its mask
from its seed (the GPT's are seeded by step, site and microbatch), so the recomputed masks are the
forward's. The inputs' gradients are handed to the outer walk as they come, pending sums included,
so a parameter's data-parallel sum still happens once, at its leaf (bucketed as without recomputation).
"""
from __future__ import annotations

from typing import Any, Callable

from ...base.context import current
from ...base.foreign import take_foreign
from ...errors import OperatorError
from .graph import Detached, Leaf, enable_grad, is_grad_enabled, kept_as, no_grad, record
from .engine import gradients

__all__ = ["checkpoint"]

#: torch.utils.checkpoint's keywords (spmdsim.base.foreign): the values that ask for what this checkpoint
#: does, and what it does instead of the others.
_PYTORCH_KEYWORDS = {
    "use_reentrant": ((False,), "the region is one node whose backward runs it again and walks that graph, as "
                                "use_reentrant=False does"),
    "preserve_rng_state": ((True,), "a dropout draws its mask from its seed, so the recomputed masks are always "
                                    "the forward's"),
    "determinism_check": (("default",), "the recomputed output's global shape and layout are always checked "
                                        "against the forward's"),
}


def checkpoint(fn: Callable[..., Any], *inputs: Any, kind: str = "block input", **foreign: Any) -> Any:
    """``fn(*inputs)``, its activations recomputed in the backward instead of kept.

    Args:
        fn: the region: a function of `inputs` returning one DTensor, deterministic (seeded dropout).
        inputs: every DTensor that needs a gradient and that `fn` reads: its activations and the
            parameters it uses (the leaves are read as they are; parameters `fn` reads from elsewhere
            must be among them, or the backward refuses: their gradient would be lost). Other arguments
            (numbers, flags, a seed) are passed to `fn` as they are, in the recomputation too.
        kind: what the node keeps (its inputs), for the memory tracker (`spmdsim.nn.autograd.kept_bytes`).
    """
    if foreign:  # PyTorch's keywords, by habit: spmdsim's values pass
        take_foreign("checkpoint", foreign, _PYTORCH_KEYWORDS)
    tensors = tuple(t if _is_dtensor(t) else None for t in inputs)  # the node's inputs: None for the others
    if not is_grad_enabled() or all(t is None or t._ag is None for t in tensors):
        return fn(*inputs)
    with no_grad():
        out = fn(*inputs)
    if not _is_dtensor(out):
        raise OperatorError(f"checkpoint: the region returned a {type(out).__name__}; expected one DTensor")
    shape, layout = tuple(out.global_shape), out.layout

    def backward(dy: Any) -> tuple:
        # The activations as new leaves on the same blocks (their gradients come back pending, as the
        # walk left them); the parameters as they are (their leaves are the outer graph's).
        again = tuple(a if t is None else _detached(t) for a, t in zip(inputs, tensors))
        context = current()
        was, context.phase = context.phase, "recompute"  # the region's products, for spmdsim.base.flops
        try:
            with enable_grad():
                redo = fn(*again)
        finally:
            context.phase = was
        if not _is_dtensor(redo) or tuple(redo.global_shape) != shape or redo.layout != layout:
            got = f"{tuple(redo.global_shape)!r} {redo.layout}" if _is_dtensor(redo) else f"a {type(redo).__name__}"
            raise OperatorError(f"checkpoint: the recomputed region returned {got}, its forward {shape!r} {layout}; "
                                "the region must be deterministic")
        if redo._ag is None:
            return (None,) * len(inputs)
        return gradients(redo, dy, tuple(a if t is not None else None for a, t in zip(again, tensors)))

    with kept_as(kind):
        return record(out, "checkpoint", tensors, backward)


def _is_dtensor(value: Any) -> bool:
    return hasattr(value, "_ag") and hasattr(value, "layout")


def _detached(t: Any) -> Any:
    """A leaf input as it is; an activation as a new leaf on its block (None: no gradient wanted)."""
    if t._ag is None or isinstance(t._ag, Leaf):
        return t
    leaf = type(t)._trusted(t.mesh, t.local, t.layout, t.global_shape)
    leaf._ag = Detached()
    return leaf
