"""AdamW's update (adamw_update, element by element) and the flat buffers it steps parameters in.

AdamW steps its parameters a group at a time (`_GROUP_ELEMENTS`): a group's gradients read where they lie
when they lie end to end (a gradient bucket's summed buffer), else gathered into one group's buffer; the
moments and step sizes computed over flat buffers laid out in the gradients' memory order."""
from __future__ import annotations

import math
import operator
from itertools import repeat
from typing import Any, Callable

import numpy as np

from ..base.buffers import owner as _owner
from ..errors import OperatorError
from .optimizer import _is


def _picker(positions: list) -> Callable:
    """``column -> tuple(column[k] for k in positions)`` (operator.itemgetter's, a tuple for one too)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    k = positions[0]
    return lambda column: (column[k],)


def _gather_elements(total: int) -> int:
    """The elements of the buffer AdamW gathers a group's gradients into, and of its update's scratch, for flat
    buffers of `total` elements: one group's (the gradients that lie end to end, a bucket's, are read in place;
    Megatron keeps none)."""
    return min(total, _GROUP_ELEMENTS)


def _memory_order(grads: tuple) -> list:
    """Positions of `grads`, those viewing one buffer together (by address), the buffers in order of first use."""
    buffer_of: dict = {}
    keys = []
    for k, grad in enumerate(grads):
        root = _owner(grad)
        keys.append((buffer_of.setdefault(id(root), len(buffer_of)), _address(grad), k))
    return [k for _, _, k in sorted(keys)]


def _runs(grads: tuple, order: list) -> list:
    """Per position of `order`: the number of the run of gradients lying end to end it belongs to (two or
    more, contiguous, of one buffer), or None."""
    out: list = [None] * len(order)
    run = 0
    for n in range(len(order) - 1):
        a, b = grads[order[n]], grads[order[n + 1]]
        if _end_to_end((a, b), a.dtype) is not None:  # as the update will find them
            if out[n] is None:
                run += 1
                out[n] = run
            out[n + 1] = out[n]
    return out


def _end_to_end(grads: Any, dtype: Any) -> Any:
    """The gradients as one flat array viewing them where they lie, if they are of `dtype`, contiguous and
    end to end in one buffer in this order; else None. (Each test over the gradients is a `map`: no Python
    per gradient, at every step.)"""
    first = grads[0]
    if first.dtype != dtype or not first.flags.c_contiguous:
        return None
    if len(grads) == 1:
        return first.reshape(-1)
    root = first.base  # numpy names the array that owns a view's memory (a bucket's summed buffer)
    if root is None or type(root) is not np.ndarray or root.dtype != dtype or not root.flags.c_contiguous:
        return None
    if not (all(map(_is, map(_BASE, grads), repeat(root))) and all(map(operator.eq, map(_DTYPE_OF, grads),
                                                                       repeat(dtype)))
            and all(map(_CONTIGUOUS, grads))):
        return None
    starts = list(map(_FIRST, map(_DATA, map(_INTERFACE, grads))))  # each one's `_address`
    ends = list(map(operator.add, starts, map(_NBYTES, grads)))
    if starts[1:] != ends[:-1]:
        return None
    offset, rest = divmod(starts[0] - _address(root), dtype.itemsize)
    return None if rest else root.reshape(-1)[offset:offset + (ends[-1] - starts[0]) // dtype.itemsize]


def _groups(grads: tuple, order: list, starts: list, ends: list) -> list:
    """(start, end, members) of each group of the flat buffers: neighbours together up to _GROUP_ELEMENTS (a
    larger block alone), a run of gradients that lie end to end not mixed with others (those are gathered,
    these read in place)."""
    runs = _runs(grads, order)
    groups, first = [], 0
    for n, k in enumerate(order):
        nxt = n + 1
        if nxt == len(order) or ends[nxt] - starts[first] > _GROUP_ELEMENTS or runs[nxt] != runs[n]:
            groups.append((starts[first], ends[n], tuple(order[first:nxt])))
            first = nxt
    return groups


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


_BASE, _DTYPE_OF, _NBYTES = operator.attrgetter("base"), operator.attrgetter("dtype"), operator.attrgetter("nbytes")


_CONTIGUOUS = operator.attrgetter("flags.c_contiguous")


_INTERFACE, _DATA, _FIRST = (operator.attrgetter("__array_interface__"), operator.itemgetter("data"),
                             operator.itemgetter(0))


#: AdamW's flat update takes the parameters in groups of about this many elements (512 KiB a float64
#: buffer): the dozen passes of a group's moments and steps stay nearer the core (rank 0 of the MoE GPT's
#: replayed step on 8 MPI ranks on 2 cores, 543,232 parameters a rank: 4.7-5.0 -> 4.5 ms an update).
_GROUP_ELEMENTS = 1 << 16


def adamw_update(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, *,
                 lr: float, betas: tuple, eps: float, weight_decay: float) -> None:
    """One AdamW step in place on numpy arrays (param, m, v); `t` is this parameter's step, from 1.

    p -= lr * wd * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
    """
    scratch = np.empty(min(param.size, _GROUP_ELEMENTS), _scratch_dtype(grad, betas))
    _step_pieces(param, grad, m, v, t, scratch, 1 - lr * weight_decay if weight_decay else None, lr=lr,
                 betas=betas, eps=eps)


def _scratch_dtype(grad: np.ndarray, betas: tuple) -> np.dtype:
    """The dtype of `_step_sizes`' intermediates: ``grad * (1 - beta1)``'s, as a new array would have it."""
    return (np.empty(0, grad.dtype) * (1 - betas[0])).dtype


def _step_pieces(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, scratch: np.ndarray,
                 decay: Any, *, lr: float, betas: tuple, eps: float) -> None:
    """One AdamW step of `param` (m and v shaped as it, `grad` too), a piece of at most ``scratch.size``
    elements at a time (`_pieces`): each piece decayed (`decay`: the factor, None for none), its moments and
    step sizes into `scratch`, then stepped. Elementwise: the values of one pass over the whole block, with
    no scratch of the block's size (Megatron's fused Adam holds none)."""
    for at in _pieces(param.shape, scratch.size):
        piece = param[at]
        tmp = scratch[:piece.size].reshape(piece.shape)
        _step_sizes(grad[at], m[at], v[at], t, tmp, lr=lr, betas=betas, eps=eps)
        if decay is not None:
            piece *= decay
        piece -= tmp


def _pieces(shape: tuple, limit: int) -> list:
    """Index tuples cutting an array of `shape` into views of at most `limit` elements each, in C order: whole
    rows of the first axis together, or one row cut likewise when a row is larger."""
    if math.prod(shape) <= limit:
        return [(Ellipsis,)]
    row = math.prod(shape[1:])
    if row <= limit:
        step = limit // row
        return [(slice(r, min(r + step, shape[0])),) for r in range(0, shape[0], step)]
    return [(r,) + rest for r in range(shape[0]) for rest in _pieces(shape[1:], limit)]


def _step_sizes(grad: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, tmp: np.ndarray | None, *, lr: float,
                betas: tuple, eps: float) -> np.ndarray:
    """Adam's moments updated in place, and lr * m_hat / (sqrt(v_hat) + eps) into `tmp` (None: a new array)."""
    b1, b2 = betas
    # One scratch block for every intermediate (was six temporaries of the parameter's size: on the GPT's
    # 817,408 parameters in one process, 9.2 -> 4.4 ms a step; scripts/bench_gpt.py's one-process row).
    tmp = np.multiply(grad, 1 - b1, out=tmp)
    m *= b1
    m += tmp
    np.multiply(grad, grad, out=tmp)
    tmp *= 1 - b2
    v *= b2
    v += tmp
    np.multiply(v, 1 / (1 - b2**t), out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / (1 - b1**t)
    return tmp


def _decay_flags(params: tuple, decay: Any) -> tuple[bool, ...]:
    """Whether each parameter decays, from AdamW's `decay` argument."""
    if decay is None:
        return tuple(len(p.global_shape) >= 2 for p in params)
    if callable(decay):
        flags = tuple(decay(p) for p in params)
        for i, flag in enumerate(flags):
            if not isinstance(flag, (bool, np.bool_)):
                raise OperatorError(f"decay predicate returned {flag!r} for parameter {i}; expected True or False")
        return tuple(bool(f) for f in flags)
    if isinstance(decay, (str, bytes)) or not hasattr(decay, "__iter__"):
        raise OperatorError(f"decay {decay!r} must be None, a predicate or an iterable of parameters")
    chosen = {id(p) for p in decay}
    known = {id(p) for p in params}
    if not chosen <= known:
        raise OperatorError(f"decay names {len(chosen - known)} object(s) that are not among the optimizer's "
                            "parameters")
    return tuple(id(p) in chosen for p in params)
