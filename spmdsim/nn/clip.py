"""Gradient clipping: clip_grad_norm_, the gradients' joint norm over every rank's blocks (one Allreduce)."""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from .autograd.graph import Leaf
from ..errors import OperatorError
from .optim_checks import _capturing, _is_scalar, _what
from .optimizer import _kernel
from ..runtime import debug_calls
from ..runtime.executor import pending, resolve
from ..base import buffers
from ..base.foreign import ANY, take_foreign
from ..base.validate import tolerance_arg

#: torch.nn.utils.clip_grad_norm_'s keywords (spmdsim.base.foreign): the values that ask for what this one
#: does, and what it does instead of the others (foreach chooses a kernel: every value gives these numbers).
_PYTORCH_KEYWORDS = {
    "foreach": (ANY, "each rank sums the squares of its blocks and one Allreduce sums the ranks'"),
    "norm_type": ((2,), "the norm is the 2-norm, PyTorch's default norm_type 2"),
    "error_if_nonfinite": ((False,), "a nan or inf norm is returned and scales the gradients, as PyTorch's "
                                     "default does; test the returned norm with math.isfinite(norm)"),
}


def clip_coefficient(norm: float, max_norm: float, eps: float = 1e-6) -> float:
    """What clipping multiplies every gradient by: max_norm / (norm + eps), at most 1 (PyTorch's formula;
    a non-finite norm gives NaN or 0, as there).

    `eps` is a finite number >= 0 (-1 divided by 0), else one OperatorError line naming it."""
    return _coefficient(norm, max_norm, tolerance_arg(eps, "clip_coefficient: eps", OperatorError))


def _coefficient(norm: float, max_norm: float, eps: float) -> float:
    """`clip_coefficient` of an `eps` checked already: clip_grad_norm_'s, once a call, not again in the kernel
    each replayed step reruns (`_clip_into`)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        coefficient = float(np.float64(max_norm) / (np.float64(norm) + eps))
    return coefficient if not coefficient >= 1.0 else 1.0


def _summed_squares(squares: Any, mesh: Any, across: Any) -> Any:
    """`squares` (this rank's, a 1-element float64 array) summed over `mesh` (its axes of size above 1), the
    stage's total, then once more over `across` = (mesh, axes), the other stages' (collective over that mesh;
    nothing more when `across` is None or its axes are 1)."""
    for stages, (on, over) in enumerate(((mesh, mesh.layout.alias_name), across or (None, ()))):
        over = tuple(a for a in over if on.layout.axis_size(a) > 1)
        if over:
            if stages:  # they made their own numbers of collectives: SPMDSIM_CHECK's call counters agree first
                _kernel(debug_calls.agree)(on.group(over), over, on.polite)  # (a kernel: each replay agrees too)
            squares = resolve(on, squares, pending(on.layout, 1, over), "clip_grad_norm", owned=True)
    return squares


def _clip_bound(max_norm: Any) -> float:
    """The clipping bound: a finite number > 0 (a Scalar's value: spmdsim.runtime.replay, read in a kernel),
    else the one-line error."""
    value = max_norm.value if _is_scalar(max_norm) else max_norm
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or not value > 0:
        raise OperatorError(f"clip_grad_norm_: max_norm {value!r} must be a finite number > 0")
    return float(value)


def _squares(blocks: tuple, max_norm: Any = 1.0) -> np.ndarray:
    """The sum of the squares of `blocks`' elements, in float64, as a 1-element array (`max_norm` checked
    first: a Scalar's value, alike on every rank, refused before the Allreduce). A kernel while capturing
    (spmdsim.runtime.replay): each replayed step sums its own gradients."""
    _clip_bound(max_norm)
    total = 0.0
    for block in blocks:
        flat = block.astype(np.float64, copy=False).reshape(-1)
        total += float(np.dot(flat, flat))
    return np.array([total])


def _norm_of(squares: np.ndarray) -> float:
    return math.sqrt(float(squares[0]))


def _scaled_into(grads: tuple, coefficient: float, outs: tuple) -> None:
    """Each gradient times `coefficient` into its `outs` (of its dtype: the same values as
    ``np.multiply(grad, coefficient)``, a Python float keeping the gradient's dtype)."""
    for grad, out in zip(grads, outs):
        np.multiply(grad, coefficient, out=out)


def _clip_into(squares: np.ndarray, max_norm: Any, eps: float, grads: tuple, outs: tuple, norm: np.ndarray) -> None:
    """The norm from the summed squares into `norm`, and the gradients scaled by clipping's coefficient into
    `outs` (copied when it is 1): a captured step's clipping, one kernel each replay reruns on its own norm."""
    value = _norm_of(squares)
    norm[...] = value
    _scaled_into(grads, _coefficient(value, _clip_bound(max_norm), eps), outs)


def clip_grad_norm_(params: Iterable[Any], max_norm: Any, eps: float = 1e-6, *, across: Any = None,
                    counted: Any = None, **foreign: Any) -> Any:
    """Scale the parameters' gradients together so their joint 2-norm is at most `max_norm`, as PyTorch's
    ``torch.nn.utils.clip_grad_norm_``; returns the norm before clipping (a float, alike on every rank).

    Collective: every rank calls it with the same parameters. Each rank adds up the squares of its
    gradient blocks that it holds first (over the axes a gradient is replicated on, one member counts
    it, as Megatron counts a replicated parameter on one tensor-parallel rank), and one Allreduce
    over the mesh sums them; parameters without a gradient are skipped. Gradients are replaced by
    scaled copies (never scaled in place: two leaves' gradients may share a block).

    A pipeline's stages hold different parameters: `across` = (mesh, axes) sums the stages' squares
    once more over those axes of that mesh (the whole (pp, dp, tp) mesh and ("pp",)), and `counted`
    names the parameters whose squares this rank adds (default all; a tied table both end stages
    hold counts on one of them). Every parameter's gradient is scaled. With SPMDSIM_CHECK the stages, which
    made their own numbers of collectives, agree on their call counters first (spmdsim.runtime.debug_calls.agree).

    In a captured step (spmdsim.runtime.replay) the squares, the norm and the scaling are kernels, so each
    replayed step clips by its own norm, the values the step run eagerly gives; the gradients are always
    replaced (by copies when nothing is clipped), and what it returns is the norm as a 0-d float64 array
    that each replay rewrites (``float(norm)`` after a replay reads that step's; read inside the step it
    would be the capture's, and a replay stops naming both). `max_norm` may be a
    spmdsim.runtime.replay.Scalar, read each replay (a bound that changes between steps). `eps`, added to
    the norm, is a finite number >= 0 (a negative one could turn the gradients' sign; with 0 a zero norm
    leaves them as they are).
    """
    if foreign:  # PyTorch's keywords, by habit: spmdsim's values pass
        take_foreign("clip_grad_norm_", foreign, _PYTORCH_KEYWORDS)
    params = tuple(params)
    captured = _capturing()
    bound = _clip_bound(max_norm)  # a Scalar's value checked now too, read without freezing it
    eps = tolerance_arg(eps, "clip_grad_norm_: eps", OperatorError)  # 0 is sound: a zero norm is not scaled
    if captured and _is_scalar(max_norm):  # read by the kernels, each replay
        bound = max_norm
    if not params:
        raise OperatorError("clip_grad_norm_: no parameters given")
    for i, p in enumerate(params):
        if not isinstance(getattr(p, "_ag", None), Leaf):
            raise OperatorError(f"clip_grad_norm_: parameter {i} ({_what(p)}) must be a DTensor leaf with "
                                "requires_grad_()")
    grads = [(p, p.grad) for p in params if p.grad is not None]
    if not grads:
        return 0.0
    mesh = grads[0][1].mesh
    for i, (p, g) in enumerate(grads):
        if g.layout.layout != mesh.layout:
            raise OperatorError(f"clip_grad_norm_: a gradient is on {g.layout.layout} but the first on "
                                f"{mesh.layout}; clip each mesh's parameters separately")
        if g.layout.partial:
            raise OperatorError(f"clip_grad_norm_: a gradient is a pending sum over {g.layout.partial!r}")
    count = None if counted is None else {id(p) for p in counted}
    mine = []  # the blocks whose squares this rank adds (which ones is the layouts', not the values')
    for p, g in grads:
        if count is not None and id(p) not in count:
            continue
        replicas = g.layout.replicated_axes
        if not replicas or g.layout.layout.group_index(mesh.rank, replicas) == 0:
            mine.append(g.local)
    squares = _summed_squares(_kernel(_squares)(tuple(mine), bound), mesh, across)
    if captured:  # one kernel: the norm and the scaling each replay computes again (copies when not clipped)
        outs = tuple(buffers.empty(g.local.shape, g.local.dtype) for _, g in grads)
        norm = buffers.empty((), np.float64)
        _kernel(_clip_into)(squares, bound, eps, tuple(g.local for _, g in grads), outs, norm)
        for (p, g), out in zip(grads, outs):
            p._ag.grad = type(g)(g.mesh, out, g.layout, g.global_shape)
        return norm
    norm = _norm_of(squares)
    coefficient = _coefficient(norm, bound, eps)
    if coefficient != 1.0:
        outs = tuple(np.empty(g.local.shape, g.local.dtype) for _, g in grads)
        _scaled_into(tuple(g.local for _, g in grads), coefficient, outs)
        for (p, g), out in zip(grads, outs):
            p._ag.grad = type(g)(g.mesh, out, g.layout, g.global_shape)
    return norm
