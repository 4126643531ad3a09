"""The optimizers' base class: parameters, the step's gradients found, counted and dry-run; subclasses update.

A parameter's ``.grad`` is whole (no pending sum) and laid out like the parameter, so an update is
elementwise on the local block: no communication, and the optimizer state is sharded like the parameters."""
from __future__ import annotations

import functools
import operator
from collections import deque
from itertools import compress as _compress, repeat
from typing import Any, Callable, Iterable

import numpy as np

from .autograd.graph import Leaf, updated, with_partial
from ..base.buffers import CAPTURE
from ..base.context import current
from ..errors import OperatorError
from ..base.flops import any_open, sweep
from ..base.foreign import ForeignName, take_foreign
from .optim_checks import STEP_KEYWORDS, _SETTINGS, _capturing, _learning_rate, _sharded_away, _what
from .optim_state import _Checkpoints
from ..runtime.replay import kernel, ReplayError


#: Per-parameter reads and tests done by `map` (no Python per parameter: `_Optimizer._found_again`).
_AG, _GRAD, _LOCAL, _LAYOUT = (operator.attrgetter(name) for name in ("_ag", "grad", "_local", "_layout"))


_SHAPE, _DTYPE = operator.attrgetter("_local.shape"), operator.attrgetter("_local.dtype")


_is, _is_not = operator.is_, operator.is_not


_NONES, _GRAD_NAMES = repeat(None), repeat("grad")


_drain = deque(maxlen=0).extend  # runs an iterator to its end, keeping nothing


class _Optimizer(_Checkpoints):
    """Parameters and the shared checks; subclasses define `_update`."""

    _moments = 0  # state arrays per parameter element the update reads and writes (spmdsim.base.flops.sweep)

    def __setattr__(self, name: str, value: Any) -> None:
        # A hyperparameter set between steps is read by the next update (the update kernels read them, so a
        # replayed step reads it too: a learning-rate schedule set between a graph's calls); set inside a
        # captured step it would be set once, at capture, and never again: refused in one line (an optimizer
        # made inside the step sets its own once, as any constant of the step).
        check = _SETTINGS.get(name)
        if check is not None:
            if name in self.__dict__ and _capturing():
                raise ReplayError(f"replay: {type(self).__name__}.{name} set to {value!r} inside a captured step: "
                                  "a replay does not run the step's Python, so every replayed step would keep "
                                  "this value; set it between the steps (each update, replayed too, reads it)")
            value = check(value, name)
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:  # (only for a name the class and the instance lack)
        if name in ("param_groups", "add_param_group", "defaults"):
            settings = ", ".join(f"opt.{k}" for k in _SETTINGS if k in self.__dict__)
            raise ForeignName(f"{type(self).__name__}.{name} is torch.optim's: spmdsim's optimizers hold one group "
                               f"of parameters (one optimizer per group); set {settings} between steps, and the "
                               "next update reads them (docs/howto/train.md)")
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __init__(self, params: Iterable[Any], lr: float) -> None:
        if hasattr(params, "_ag") or isinstance(params, (str, bytes, dict)) or not hasattr(params, "__iter__"):
            # (iterated, one DTensor gives its rows: "parameter 0 ... not a leaf")
            one = "; one parameter goes in a list: [p]" if hasattr(params, "_ag") else ""
            raise OperatorError(f"optimizer params: expected an iterable of parameters (a list of leaf DTensors), "
                                f"got {_what(params, leaf=True)}{one}")
        self.params = tuple(params)
        if not self.params:
            raise OperatorError("optimizer got an empty parameter list")
        seen: dict = {}
        for i, p in enumerate(self.params):
            if isinstance(p, dict):
                raise OperatorError(f"optimizer parameter {i} is a dict: parameter groups are not taken; give "
                                    "a list of parameters (one optimizer per group; AdamW's decay= picks those "
                                    "that decay)")
            if not isinstance(getattr(p, "_ag", None), Leaf):
                raise OperatorError(f"optimizer parameter {i} ({_what(p)}) must be a DTensor leaf with "
                                    "requires_grad_() (layers' weights are)")
            if id(p) in seen:  # it would be stepped twice a step
                raise OperatorError(f"optimizer parameter {i} is parameter {seen[id(p)]} again "
                                    f"({_what(p, leaf=True)}); give each parameter once")
            seen[id(p)] = i
            _sharded_away(i, p)
            if not p.local.flags.writeable:
                raise OperatorError(f"optimizer parameter {i}'s local block is read-only")
        self.lr = _learning_rate(lr, "lr")
        self.steps = 0
        self._seen: Any = None  # what the last step's `_found` checked (`_found_again`)
        self._leaves: Any = None  # the parameters' leaves at the last step (zero_grad's, by identity)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's gradient (the next backward starts from zero); PyTorch's
        ``set_to_none=False`` makes each gradient a zero DTensor instead of None."""
        if set_to_none is not True and set_to_none is not False:
            raise OperatorError(f"zero_grad(set_to_none={set_to_none!r}): expected True or False")
        leaves = self._leaves
        if set_to_none and leaves is not None and all(map(_is, map(_AG, self.params), leaves)):
            # The leaves the last step saw (each parameter's own still): their gradients forgotten with no
            # Python per parameter (`map` calls setattr; a Python loop is ~14 opcodes a parameter a step).
            _drain(map(setattr, leaves, _GRAD_NAMES, _NONES))
            return
        for p in self.params:
            leaf = p._ag
            g = leaf.grad
            if set_to_none or g is None:
                leaf.grad = None
            else:  # a new block: the old one may be a view another gradient's buffer holds
                leaf.grad = type(g)._trusted(g.mesh, np.zeros_like(g.local), g.layout, g.global_shape)

    def _no_closure(self, closure: Any) -> None:
        """PyTorch's ``step(closure)``: taken as None only, another value refused in one line (spmdsim.base.foreign);
        every optimizer's step calls it."""
        if closure is not None:
            take_foreign(f"{type(self).__name__}.step", {"closure": closure}, STEP_KEYWORDS)

    def step(self, closure: Any = None) -> None:
        """Update every parameter that has a gradient (local blocks only); nothing when one does not fit.
        PyTorch's `closure` is taken as None only (spmdsim.base.foreign)."""
        self._no_closure(closure)
        plain = not CAPTURE.on  # this thread does not capture: the kernels' functions themselves (no wrapper)
        (_count_step if plain else _kernel(_count_step))(self)
        found = self._found_again() if plain else None
        again = found is not None
        if not again:
            found = self._found()
        indices, blocks, grads, leaves = found
        if indices:  # their blocks change in place: a graph recorded before may no longer be walked
            updated(leaves)
        self._count(blocks, grads)
        context = current()
        if context.dry_run:  # shapes, no values: count what the update would hold, compute nothing
            if indices:
                _dry_count(context.meter, self, self._dry_step(list(zip(indices, blocks, grads))))
            return
        if self._together_now(indices, blocks, grads, again):
            (_run_update if plain else _kernel(_run_update))(self._update_all, indices, blocks, grads)
            return
        update = _run_update if plain else _kernel(_run_update)
        for i, block, grad in zip(indices, blocks, grads):
            update(self._update, i, block, grad)

    def _found(self) -> tuple:
        """(indices, blocks, gradient blocks, leaves) of the parameters that have a gradient, each gradient
        checked to be laid out as its parameter (else the one-line refusal); outside a capture, what was
        checked is remembered for `_found_again`."""
        found = []
        plain = not CAPTURE.on  # the blocks themselves (a captured step reads them as its record's, .local)
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:  # (fully_shard may have replaced it since the optimizer was made)
                _sharded_away(i, p)
                continue
            layout = p._layout  # a parameter's is whole: its gradient's is then the very object (no call)
            whole = layout if not layout.partial else with_partial(layout, ())
            if (g._layout is not whole and g._layout != whole) or g._local.shape != p._local.shape:
                raise OperatorError(f"parameter {i}: gradient laid out {g.layout} does not match {p.layout}")
            found.append((i, p._local, g._local) if plain else (i, p.local, g.local))
        indices, blocks, grads = (tuple(column) for column in zip(*found)) if found else ((), (), ())
        leaves = tuple(self.params[i]._ag for i in indices)
        self._seen = None
        if plain:
            params = self.params
            if all(map(_is_not, map(_AG, params), _NONES)):  # (a leaf made no leaf again: none remembered)
                held = list(map(_GRAD, map(_AG, params)))
                present = list(map(_is_not, held, _NONES))
                gs = tuple(_compress(held, present))
                self._seen = (tuple(map(_AG, params)), tuple(map(_LOCAL, params)), tuple(map(_LAYOUT, params)),
                              present, tuple(map(_LAYOUT, gs)), list(map(_SHAPE, gs)), list(map(_DTYPE, gs)),
                              indices, blocks, leaves)
                self._leaves = self._seen[0]
        return indices, blocks, grads, leaves

    def _found_again(self) -> Any:
        """`_found`'s answer without its Python per parameter, when every parameter's leaf, block and layout
        are the very objects the last `_found` checked, the same parameters have a gradient, and each
        gradient's layout is the very object that one checked (layouts do not change), its block of the
        shape and dtype it had; else None (then `_found` checks them all, and refuses what does not fit)."""
        seen = self._seen
        if seen is None:
            return None
        leaves, blocks, layouts, present, grad_layouts, shapes, dtypes, indices, found_blocks, found_leaves = seen
        params = self.params
        if not (all(map(_is, map(_AG, params), leaves)) and all(map(_is, map(_LOCAL, params), blocks))
                and all(map(_is, map(_LAYOUT, params), layouts))):
            return None
        held = list(map(_GRAD, leaves))
        if list(map(_is_not, held, _NONES)) != present:
            return None
        gs = held if len(indices) == len(held) else list(_compress(held, present))
        if not all(map(_is, map(_LAYOUT, gs), grad_layouts)) or list(map(_SHAPE, gs)) != shapes \
                or list(map(_DTYPE, gs)) != dtypes:
            return None
        return indices, found_blocks, tuple(map(_LOCAL, gs)), found_leaves

    def _count(self, blocks: tuple, grads: tuple) -> None:
        """Count the update's memory traffic (spmdsim.base.flops.sweep, phase "optimizer"), real and dry alike:
        each updated block read and written, its gradient read, its moments read and written."""
        if not any_open():  # no counter open: nothing would be counted
            return
        op, n = type(self).__name__.lower(), self._moments
        for block, grad in zip(blocks, grads):
            sweep(op, (block,), (block,), "params", "optimizer")
            sweep(op, (grad,), (), "grads", "optimizer")
            if n:
                sweep(op, (block,) * n, (block,) * n, "states", "optimizer")

    def _update(self, index: int, param: np.ndarray, grad: np.ndarray) -> None:
        raise NotImplementedError

    def _together(self, found: list) -> bool:
        """Whether `_update_all` updates these (index, block, gradient) in one pass over flat buffers."""
        return False

    def _together_now(self, indices: tuple, blocks: tuple, grads: tuple, again: bool) -> bool:
        """`_together` at a step, on its columns; `again`: `_found_again` found them as the last `_found` did
        (the same blocks, gradients of the same dtypes)."""
        return False

    def _update_all(self, indices: tuple, params: tuple, grads: tuple) -> None:
        raise NotImplementedError

    def _dry_step(self, found: list) -> tuple[int, ...]:
        """A dry run's step on these (index, block, gradient): no state made, nothing computed; the bytes
        the optimizer would hold while it steps, in order (the last: what it holds after)."""
        raise NotImplementedError


def _dry_count(meter: Any, optimizer: Any, held: tuple[int, ...]) -> None:
    """Count on a dry run's meter what `optimizer` holds, each figure in turn (the peak sees the largest)."""
    if meter is None:  # a dry-run context without a meter (none is made so today): nothing to count on
        return
    for nbytes in held:
        meter.count(optimizer, nbytes)


def _run_update(update: Callable, index: int, param: np.ndarray, grad: np.ndarray) -> None:
    update(index, param, grad)


@functools.cache
def _kernel(func: Callable) -> Callable:
    """`func` recorded as one call when a rank captures a step (spmdsim.runtime.replay), so a replay reruns it on
    the arrays it is given now: `_run_update` (an update counts its own steps, Adam's bias correction, as each
    eager step does), `_count_step`, clipping's kernels, spmdsim.nn.distrib_optim's. Made on first use: importing
    the runtime here would make this pure module load it."""
    return kernel(func)


def _count_step(optimizer: Any) -> None:
    """One more step on `optimizer.steps`: a kernel (`_kernel`), so a replayed step counts too (a schedule
    that reads `steps` between a graph's calls sees each replay)."""
    optimizer.steps += 1
