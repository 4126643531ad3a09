"""Optimizers over DTensor parameters: SGD (with momentum), Adam and AdamW; each rank updates its own shards.
Also `clip_grad_norm_`, the gradients' joint norm over every rank's blocks (one Allreduce).

A parameter's ``.grad`` is whole (no pending sum) and laid out like the
parameter, so an update is elementwise on the local block: no communication,
and the optimizer state (momentum, Adam's moments) is sharded like the
parameters. Updates write the parameters' blocks in place (a layer holding a
view of them, such as the padded vocabulary table, sees the new values).

In a dry run (spmdsim.runtime.sim.dry: shapes, no values) a step computes nothing and
allocates no state: the parameters stay as they are, and what the optimizer
would hold after the step (momentum buffers, moments, AdamW's flat buffers),
worked out from the blocks' sizes, is counted on the run's Meter for as long
as the optimizer lives, so the report's peak bytes held includes it.

`DistributedAdamW` (spmdsim.nn.distrib_optim) is AdamW with its states and a master copy sharded over
the data-parallel axes (ZeRO-1, Megatron's distributed optimizer); it counts 1/dp of them.

Checkpoints: every optimizer's `state_dict()` and `load_state_dict(sd)`, torch.optim's, hold this rank's
state alone (its blocks' moments, ZeRO-1's slices), copied both ways; a resumed run steps as the
uninterrupted one, bit for bit (docs/howto/train-gpt.md, "Checkpoints").
"""
from __future__ import annotations

import functools
import math
import numbers
import operator
import sys
from collections import deque
from itertools import compress as _compress
from itertools import repeat
from typing import TYPE_CHECKING, Any, Callable, Iterable, Union

import numpy as np

from .autograd.graph import Leaf, updated, with_partial
from ..base.buffers import CAPTURE, owned_bytes
from ..base.buffers import owner as _owner
from ..base.context import current
from ..errors import OperatorError
from ..base.flops import any_open, sweep
from ..base.precision import is_low
from ..base.validate import tolerance_arg

if TYPE_CHECKING:  # loaded on first use (`__getattr__`, below): it builds on this module's helpers
    from .distrib_optim import DistributedAdamW

#: Per-parameter reads and tests done by `map` (no Python per parameter: `_Optimizer._found_again`).
_AG, _GRAD, _LOCAL, _LAYOUT = (operator.attrgetter(name) for name in ("_ag", "grad", "_local", "_layout"))
_SHAPE, _DTYPE = operator.attrgetter("_local.shape"), operator.attrgetter("_local.dtype")
_is, _is_not = operator.is_, operator.is_not
_NONES, _GRAD_NAMES = repeat(None), repeat("grad")
_drain = deque(maxlen=0).extend  # runs an iterator to its end, keeping nothing

__all__ = ["SGD", "Adam", "AdamW", "DistributedAdamW", "adamw_update", "clip_grad_norm_", "clip_coefficient"]


class _Optimizer:
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
                from ..runtime.replay import ReplayError

                raise ReplayError(f"replay: {type(self).__name__}.{name} set to {value!r} inside a captured step: "
                                  "a replay does not run the step's Python, so every replayed step would keep "
                                  "this value; set it between the steps (each update, replayed too, reads it)")
            value = check(value, name)
        object.__setattr__(self, name, value)

    def __init__(self, params: Iterable[Any], lr: float) -> None:
        if hasattr(params, "_ag") or isinstance(params, (str, bytes, dict)) or not hasattr(params, "__iter__"):
            # (one DTensor was iterated by rows: "parameter 0 ... not a leaf")
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
            # Python per parameter (`map` calls setattr; this loop was ~14 opcodes a parameter a step).
            _drain(map(setattr, leaves, _GRAD_NAMES, _NONES))
            return
        for p in self.params:
            leaf = p._ag
            g = leaf.grad
            if set_to_none or g is None:
                leaf.grad = None
            else:  # a new block: the old one may be a view another gradient's buffer holds
                leaf.grad = type(g)._trusted(g.mesh, np.zeros_like(g.local), g.layout, g.global_shape)

    def step(self) -> None:
        """Update every parameter that has a gradient (local blocks only); nothing when one does not fit."""
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
            if g is None:
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

    # -- checkpoints: state_dict / load_state_dict (torch.optim's names), this rank's state alone --

    #: The hyperparameters a state_dict carries in its one param group (beside "params"); a load sets them.
    _hyper: tuple = ("lr",)
    #: What the keys of a state_dict's "state" index (DistributedAdamW's: its buckets).
    _unit = "parameter"

    def state_dict(self) -> dict:
        """This rank's optimizer state, as ``torch.optim.Optimizer.state_dict()`` lays it out: a new dict of copies
        (a later step writes none of it). Per rank, as PyTorch's sharded optimizers' (FSDP's sharded state,
        ZeroRedundancyOptimizer before consolidation): each rank holds the state of its own shards, so each
        rank saves its own and loads it back (`load_state_dict`), on as many ranks laid out alike.

        Keys: "optimizer" (the class's name), "steps" (`steps`), "state" (index -> that parameter's state, only
        those that have stepped: SGD's "momentum_buffer"; Adam's and AdamW's "step", "exp_avg", "exp_avg_sq",
        and AdamW's float32 "master" of a bfloat16 parameter; each array this rank's block's),
        "param_groups" (one dict: the hyperparameters and "params", the indices 0, 1, ...), and "blocks"
        (each parameter's global shape and the [start, stop) per dim of this rank's block, so a load refuses
        another rank's state). DistributedAdamW's "state" is per bucket, this rank's slice (its "buckets").
        """
        self._refuse_state("state_dict")
        state = {k: {name: value.copy() if isinstance(value, np.ndarray) else value for name, value in entry.items()}
                 for k, entry in self._state_items().items()}
        group = {h: getattr(self, h) for h in self._hyper}
        group["params"] = list(range(len(self.params)))
        return {"optimizer": type(self).__name__, "steps": self.steps, "state": state, "param_groups": [group],
                **self._placement()}

    def load_state_dict(self, state_dict: Any) -> None:
        """Take a `state_dict()` of this rank's (saved by an optimizer of this type over parameters laid out
        alike): its moments, step counts and hyperparameters become this optimizer's, copied (the dict stays
        the caller's: no later step writes into it), into the arrays the next step reads (AdamW's flat buffers,
        ZeRO-1's slices; a captured step's replay reads them too). Anything else is refused in one line before
        anything changes: another optimizer's type, another number of parameters, another rank's blocks,
        moments of another shape or dtype, keys it does not know. Load the parameters' values too
        (``p.local[...] = saved``): the optimizer holds the parameters, not their values (but for bfloat16
        ones' float32 master copies)."""
        self._refuse_state("load_state_dict")
        me = type(self).__name__
        name = f"{me}.load_state_dict"
        sd = state_dict
        if not isinstance(sd, dict):
            raise OperatorError(f"{name}: expected the dict an optimizer's state_dict() returns, got {_describe(sd)}")
        if sd.get("optimizer", me) != me:  # first: another type's keys differ too
            raise OperatorError(f"{name}: the state_dict is of optimizer {sd['optimizer']!r}, this optimizer is "
                                f"{me}; load a state an optimizer of this type saved")
        placement = self._placement()
        _same_keys(name, "the state_dict", sd, ("optimizer", "steps", "state", "param_groups") + tuple(placement))
        groups = sd["param_groups"]
        if not isinstance(groups, (list, tuple)) or len(groups) != 1 or not isinstance(groups[0], dict):
            raise OperatorError(f"{name}: param_groups {_describe(groups)} must be a list of one dict (spmdsim's "
                                "optimizers take one group)")
        group = groups[0]
        _same_keys(name, "param_groups[0]", group, self._hyper + ("params",))
        ids = group["params"]
        if not isinstance(ids, (list, tuple)) or any(type(k) is bool or not isinstance(k, numbers.Integral)
                                                     or k != n for n, k in enumerate(ids)):
            raise OperatorError(f"{name}: param_groups[0]['params'] {_describe(ids)} must be the indices 0, 1, ... "
                                "of the parameters")
        if len(ids) != len(self.params):
            raise OperatorError(f"{name}: the state_dict has {len(ids)} parameter(s), this optimizer "
                                f"{len(self.params)}")
        steps = _count(name, "steps", sd["steps"])
        hyper = {}
        for h in self._hyper:
            try:
                hyper[h] = _SETTINGS[h](group[h], h)
            except OperatorError as e:
                raise OperatorError(f"{name}: param_groups[0]: {e}") from None
        for key, here in placement.items():
            _same_placement(name, key, sd[key], here)
        state = sd["state"]
        if not isinstance(state, dict):
            raise OperatorError(f"{name}: state {_describe(state)} must be a dict (index -> that {self._unit}'s "
                                "state)")
        entries = {int(k): self._checked_entry(name, k, entry) for k, entry in state.items()}
        missing = [k for k in self._required() if k not in entries]
        if missing:
            raise OperatorError(f"{name}: state lacks {self._unit} {missing[0]} (every {self._unit} has a state)")
        for h, value in hyper.items():  # nothing changed before this line
            setattr(self, h, value)
        self.steps = steps
        self._load(entries)

    def _refuse_state(self, what: str) -> None:
        """state_dict / load_state_dict: not inside a captured step (the replays would not run it), not in a
        dry run (no values)."""
        if _capturing():
            from ..runtime.replay import ReplayError

            raise ReplayError(f"replay: {type(self).__name__}.{what}() called inside a captured step: a replay "
                              "does not run the step's Python; call it between the steps (each replay reads the "
                              "state loaded before it)")
        if current().dry_run or getattr(self, "_dry", False):
            raise OperatorError(f"{type(self).__name__}.{what}() in a dry run: a dry run holds shapes, no values; "
                                "save and load a real run's state")

    def _placement(self) -> dict:
        """What a state_dict's arrays belong to: each parameter's global shape and this rank's block's bounds."""
        blocks = []
        for p in self.params:
            shape = tuple(int(n) for n in p.global_shape)
            blocks.append((shape, tuple((int(a), int(b)) for a, b in p.layout.bounds(p.mesh.rank, shape))))
        return {"blocks": tuple(blocks)}

    def _state_items(self) -> dict:
        """index -> {field: value}: the live state (state_dict copies it)."""
        return {}

    def _entry_spec(self, key: int) -> dict:
        """field -> int (a step count) or (shape, dtypes allowed) (an array), (shape, dtypes, "optional") for an
        array it may lack: what state[key] holds."""
        raise NotImplementedError

    def _state_slots(self) -> int:
        """How many keys "state" may have (0 .. this - 1)."""
        return len(self.params)

    def _checked_entry(self, name: str, key: Any, entry: Any) -> dict:
        """state[key] checked against this rank's blocks, its arrays copied; else the one-line refusal."""
        slots = self._state_slots()
        if type(key) is bool or not isinstance(key, numbers.Integral) or not 0 <= key < slots:
            raise OperatorError(f"{name}: state key {key!r} is not a {self._unit} index (0 to {slots - 1})")
        spec = self._entry_spec(int(key))
        where = f"state[{key!r}]"
        if not isinstance(entry, dict):
            raise OperatorError(f"{name}: {where} {_describe(entry)} must be a dict")
        required = tuple(f for f, want in spec.items() if want is int or len(want) < 3)
        _same_keys(name, where, entry, tuple(spec), required)
        out = {}
        for field, want in spec.items():
            if field not in entry:
                continue
            value = entry[field]
            if want is int:
                out[field] = _count(name, f"{where}[{field!r}]", value)
                continue
            shape, dtypes = want[:2]
            if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype not in dtypes:
                got = f"{value.dtype} of shape {value.shape}" if isinstance(value, np.ndarray) else _describe(value)
                raise OperatorError(f"{name}: {where}[{field!r}] is {got}, expected "
                                    f"{' or '.join(np.dtype(d).name for d in dtypes)} of shape {shape} (this "
                                    f"rank's {self._whose(int(key))})")
            out[field] = value.copy()
        return out

    def _required(self) -> range:
        """The keys every state_dict of this optimizer has (DistributedAdamW: every bucket)."""
        return range(0)

    def _whose(self, key: int) -> str:
        return f"block of parameter {key}"

    def _load(self, entries: dict) -> None:
        """Install checked copies: index -> {field: value}."""
        raise NotImplementedError


def _dry_count(meter: Any, optimizer: Any, held: tuple[int, ...]) -> None:
    """Count on a dry run's meter what `optimizer` holds, each figure in turn (the peak sees the largest)."""
    if meter is None:  # a dry-run context without a meter (none is made so today): nothing to count on
        return
    for nbytes in held:
        meter.count(optimizer, nbytes)


def _describe(value: Any) -> str:
    from ..base.validate import describe

    return describe(value)


def _into(live: Any, loaded: np.ndarray) -> np.ndarray:
    """`loaded` (a checked copy) written into `live`, the array the next step reads (AdamW's flat buffers are
    viewed per parameter; a captured step's kernels hold ZeRO-1's slices), when it is one alike; else `loaded`."""
    if isinstance(live, np.ndarray) and live.shape == loaded.shape and live.dtype == loaded.dtype:
        np.copyto(live, loaded)
        return live
    return loaded


def _same_keys(name: str, where: str, given: dict, known: tuple, required: Any = None) -> None:
    """One line for a key `given` has that `known` does not, or one it lacks of `required` (default all)."""
    for key in given:
        if key not in known:
            raise OperatorError(f"{name}: {where} has an unknown key {key!r}; expected the keys "
                                f"{', '.join(map(repr, known))}")
    for key in known if required is None else required:
        if key not in given:
            raise OperatorError(f"{name}: {where} lacks the key {key!r}")


def _count(name: str, where: str, value: Any) -> int:
    """A step count: an integer >= 0."""
    if type(value) is bool or not isinstance(value, numbers.Integral) or value < 0:
        raise OperatorError(f"{name}: {where} {value!r} must be an integer >= 0 (a step count)")
    return int(value)


def _tupled(value: Any) -> Any:
    """Lists as tuples and numpy integers as ints, all the way down (a state_dict saved through another format)."""
    if isinstance(value, (list, tuple)):
        return tuple(_tupled(v) for v in value)
    if isinstance(value, numbers.Integral) and type(value) is not bool:
        return int(value)
    return value


def _same_placement(name: str, key: str, given: Any, here: tuple) -> None:
    """The state_dict's `key` ("blocks": each parameter's global shape and this rank's bounds; "buckets": each
    ZeRO-1 bucket's dtype, dp axes, members and this rank's slice) equals this rank's, else one line naming the
    first that differs."""
    given = _tupled(given)
    if given == here:
        return
    ranks = "a state_dict holds one rank's shards; load into each rank the state it saved, on ranks laid out alike"
    if isinstance(given, tuple) and len(given) == len(here):
        for i, (theirs, mine) in enumerate(zip(given, here)):
            if theirs == mine:
                continue
            whole = isinstance(theirs, tuple) and len(theirs) == len(mine)
            if key == "blocks" and whole and theirs[0] == mine[0]:
                raise OperatorError(f"{name}: parameter {i}'s block on this rank is {_region(mine[1])} of "
                                    f"{mine[0]!r}, the state_dict's {_region(theirs[1])}: {ranks}")
            if key == "buckets" and whole and theirs[:3] == mine[:3]:
                raise OperatorError(f"{name}: bucket {i}'s slice on this rank is {_region((mine[3],))}, the "
                                    f"state_dict's {_region((theirs[3],))} (another dp rank's): {ranks}")
            what = "global shape and block" if key == "blocks" else "dtype, dp axes, members and slice"
            unit, other = ("parameter", "") if key == "blocks" else ("bucket", " or buckets (bucket=)")
            raise OperatorError(f"{name}: {unit} {i} ({what}) is {mine!r} on this rank, {theirs!r} in the "
                                f"state_dict: a state of other parameters{other}")
    raise OperatorError(f"{name}: {key} {_describe(given)} does not match this rank's {len(here)} {key[:-1]}(s)")


def _region(bounds: Any) -> str:
    """[start, stop) per dim as slices: "[0:5, 2:4]"."""
    try:
        return "[" + ", ".join(f"{a}:{b}" for a, b in bounds) + "]"
    except (TypeError, ValueError):
        return repr(bounds)


def _run_update(update: Callable, index: int, param: np.ndarray, grad: np.ndarray) -> None:
    update(index, param, grad)


@functools.cache
def _kernel(func: Callable) -> Callable:
    """`func` recorded as one call when a rank captures a step (spmdsim.runtime.replay), so a replay reruns it on
    the arrays it is given now: `_run_update` (an update counts its own steps, Adam's bias correction, as each
    eager step does), `_count_step`, clipping's kernels, spmdsim.nn.distrib_optim's. Made on first use: importing
    the runtime here would make this pure module load it."""
    from ..runtime.replay import kernel

    return kernel(func)


def _count_step(optimizer: Any) -> None:
    """One more step on `optimizer.steps`: a kernel (`_kernel`), so a replayed step counts too (a schedule
    that reads `steps` between a graph's calls sees each replay)."""
    optimizer.steps += 1


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


class SGD(_Optimizer):
    """PyTorch's SGD: buffer = momentum * buffer + g (g itself at the first step), then p -= lr * buffer; without
    momentum, p -= lr * g."""

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0) -> None:
        super().__init__(params, lr)
        self.momentum = momentum  # checked by _momentum
        self._moments = 1 if self.momentum else 0
        self.buffers: dict[int, np.ndarray] = {}
        self._dry_buffers: dict[int, int] = {}  # a dry run's `buffers`: index -> its bytes

    def _dry_step(self, found: list) -> tuple[int, ...]:
        if self.momentum:  # a buffer per parameter, a copy of its first gradient
            for i, _, grad in found:
                self._dry_buffers.setdefault(i, grad.nbytes)
        return (sum(self._dry_buffers.values()),)

    _hyper = ("lr", "momentum")

    def _state_items(self) -> dict:
        return {i: {"momentum_buffer": buf} for i, buf in sorted(self.buffers.items())}

    def _entry_spec(self, key: int) -> dict:
        block = self.params[key].local  # the buffer is the first gradient's copy: float32 under bf16-mixed
        dtypes = (block.dtype, np.dtype(np.float32)) if is_low(block.dtype) else (block.dtype,)
        return {"momentum_buffer": (block.shape, dtypes)}

    def _load(self, entries: dict) -> None:
        loaded = {i: _into(self.buffers.get(i), e["momentum_buffer"]) for i, e in entries.items()}
        self.buffers.clear()
        self.buffers.update(loaded)

    def _update(self, index: int, param: np.ndarray, grad: np.ndarray) -> None:
        if self.momentum:
            buf = self.buffers.get(index)
            buf = grad.copy() if buf is None else np.add(buf * self.momentum, grad, out=buf)
            self.buffers[index] = buf
            grad = buf
        param -= np.asarray(self.lr, param.dtype) * grad


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


class Adam(_Optimizer):
    """Adam (Kingma and Ba; PyTorch's defaults): moments per shard, bias-corrected step."""

    _moments = 2  # m and v

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        super().__init__(params, lr)
        self.betas, self.eps = _adam_args(betas, eps)
        self.moments: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
        self._dry_moments: dict[int, int] = {}  # a dry run's `moments`: index -> the bytes of both

    def _dry_step(self, found: list) -> tuple[int, ...]:
        for i, param, _ in found:  # two arrays like the parameter
            self._dry_moments.setdefault(i, 2 * param.nbytes)
        return (sum(self._dry_moments.values()),)

    _hyper = ("lr", "betas", "eps")

    def _state_items(self) -> dict:
        return {i: {"step": t, "exp_avg": m, "exp_avg_sq": v} for i, (m, v, t) in sorted(self.moments.items())}

    def _entry_spec(self, key: int) -> dict:
        block = self.params[key].local
        return {"step": int, "exp_avg": (block.shape, (block.dtype,)), "exp_avg_sq": (block.shape, (block.dtype,))}

    def _load(self, entries: dict) -> None:
        loaded = {}
        for i, e in entries.items():
            m, v, _ = self.moments.get(i) or (None, None, 0)
            loaded[i] = (_into(m, e["exp_avg"]), _into(v, e["exp_avg_sq"]), e["step"])
        self.moments.clear()
        self.moments.update(loaded)

    def _update(self, index: int, param: np.ndarray, grad: np.ndarray) -> None:
        b1, b2 = self.betas
        m, v, t = self.moments.get(index) or (np.zeros_like(param), np.zeros_like(param), 0)
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        t += 1  # this parameter's steps (as AdamW counts them): a replayed update counts its own
        self.moments[index] = (m, v, t)
        step = self.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        param -= (step * m / (np.sqrt(v) + self.eps * math.sqrt(1 - b2**t))).astype(param.dtype)


class AdamW(_Optimizer):
    """AdamW (Loshchilov and Hutter; torch.optim.AdamW's semantics): decay decoupled from the moments.

    Args:
        decay: which parameters decay: None (those of 2 or more dims), a predicate
            ``decay(param) -> bool``, or an iterable of the parameters that decay.
    """

    _moments = 2  # m and v

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2,
                 decay: Union[None, Callable[[Any], bool], Iterable[Any]] = None) -> None:
        super().__init__(params, lr)
        self.betas, self.eps = _adam_args(betas, eps)
        self.weight_decay = tolerance_arg(weight_decay, "weight_decay", OperatorError)
        self.decays = _decay_flags(self.params, decay)
        # Per parameter, as PyTorch keeps it: (steps taken, first moment, second moment).
        self.state: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        self.master: dict[int, np.ndarray] = {}  # float32 copies of bfloat16 parameters, made at their first step
        # The parameters last updated together: the buffer a group's gradients are gathered into (one group's
        # size at most, _GROUP_ELEMENTS), their moments and scratch in flat buffers, their spans and groups.
        self._flat: tuple = ((), None)
        # Parameters known to have taken the same number of steps (`_in_lockstep`), and those whose blocks and
        # gradients were last found of one dtype (`_together_now`): tuples of indices, or None.
        self._steady: Any = None
        self._typed: Any = None
        # A dry run's `state` and `_flat`, by size: per parameter its steps, its block's bytes and where its
        # moments live (None: a pair of its own; else the indices of the flat buffers they view), and the
        # indices of the flat buffers last made.
        self._dry_steps: dict[int, int] = {}
        self._dry_sizes: dict[int, int] = {}
        self._dry_homes: dict[int, Any] = {}
        self._dry_flat: tuple = ()
        self._dry_itemsize = 8  # the flat buffers' element size (the parameters' dtype)
        self._dry_master: dict[int, int] = {}

    _hyper = ("lr", "betas", "eps", "weight_decay")

    def _state_items(self) -> dict:
        out = {}
        for i, (t, m, v) in sorted(self.state.items()):
            out[i] = {"step": t, "exp_avg": m, "exp_avg_sq": v}
            if i in self.master:
                out[i]["master"] = self.master[i]
        return out

    def _entry_spec(self, key: int) -> dict:
        block = self.params[key].local
        if not is_low(block.dtype):
            return {"step": int, "exp_avg": (block.shape, (block.dtype,)), "exp_avg_sq": (block.shape, (block.dtype,))}
        # A bfloat16 one: float32 moments and master copy (its gradients float32, bf16-mixed's); gradients of
        # its own dtype, set by hand, step it in bfloat16 with the others, without a master copy.
        wide = (block.shape, (np.dtype(np.float32), block.dtype))
        return {"step": int, "exp_avg": wide, "exp_avg_sq": wide, "master": (block.shape, (np.dtype(np.float32),),
                                                                            "optional")}

    def _load(self, entries: dict) -> None:
        # Into the live moments where a parameter has them (views of the flat buffers `_update_all` reads); a
        # parameter that gains or loses its state: the flat buffers are made again at the next step, from `state`.
        # A loaded moment that is not copied into the live one (another dtype: a bfloat16 parameter's float32
        # moments) is no longer a view of the flat buffers: those are made again too. The steps loaded may
        # differ: nothing is known in lockstep any more (`_in_lockstep` looks again).
        remake = set(entries) != set(self.state)
        self._steady = None
        for i in [i for i in self.state if i not in entries]:
            del self.state[i]
            self.master.pop(i, None)
        for i, e in entries.items():
            _, m, v = self.state.get(i) or (0, None, None)
            self.state[i] = (e["step"], _into(m, e["exp_avg"]), _into(v, e["exp_avg_sq"]))
            remake = remake or self.state[i][1] is not m or self.state[i][2] is not v
            if "master" in e:
                self.master[i] = _into(self.master.get(i), e["master"])
        if remake:
            self._flat = ((), None)

    def _update(self, index: int, param: np.ndarray, grad: np.ndarray) -> None:
        # A bfloat16 parameter (spmdsim.base.precision's bf16-mixed): a float32 master copy and float32 moments
        # take the update, and the parameter is the master rounded once (Megatron's mixed precision).
        # (The master made once: `setdefault`'s default was a float32 copy of the block made at every step.)
        target = param if not is_low(param.dtype) else self.master.get(index)
        if target is None:
            target = self.master[index] = param.astype(np.float32)
        t, m, v = self.state.get(index) or (0, np.zeros_like(target), np.zeros_like(target))
        self.state[index] = (t + 1, m, v)
        self._steady = None  # a parameter stepped alone: its steps may differ from the others' now
        adamw_update(target, grad, m, v, t + 1, lr=self.lr, betas=self.betas, eps=self.eps,
                     weight_decay=self.weight_decay if self.decays[index] else 0.0)
        if target is not param:  # rounded once, as astype rounds it, with no block-sized temporary
            np.copyto(param, target, casting="unsafe")

    def _together(self, found: list, taken: Any = None) -> bool:
        # One dtype, and every parameter at the same step (each counts its own): then the moments are one
        # pass each over flat buffers (PyTorch's foreach AdamW), not ~12 numpy calls per parameter.
        # `taken`: index -> steps taken (a dry run's); default `state`'s.
        if len(found) < 2:
            return False
        dtype = found[0][1].dtype
        if taken is None:
            steps = {self.state[i][0] if i in self.state else 0 for i, _, _ in found}
        else:
            steps = {taken.get(i, 0) for i, _, _ in found}
        return len(steps) == 1 and all(b.dtype == dtype and g.dtype == dtype for _, b, g in found)

    def _together_now(self, indices: tuple, blocks: tuple, grads: tuple, again: bool) -> bool:
        # `_together` without its Python per parameter at a step like the last: the same blocks, gradients
        # of the dtypes found last time (`again`), and parameters known to be in lockstep.
        if not (again and indices is self._typed):
            dtype = blocks[0].dtype if blocks else None
            self._typed = indices if len(indices) >= 2 and all(b.dtype == dtype for b in blocks) \
                and all(g.dtype == dtype for g in grads) else None
            if self._typed is None:
                return False
        return self._in_lockstep(indices)

    def _in_lockstep(self, indices: tuple) -> bool:
        """Whether these parameters have all taken the same number of steps: looked up once, then known
        (`_steady`) while they step together (`_update_all`), until one steps alone (`_update`) or a state
        is loaded (`_load`)."""
        steady = self._steady
        if steady is not None and (indices is steady or indices == steady):
            return True
        state = self.state
        if len({state[i][0] if i in state else 0 for i in indices}) != 1:
            return False
        self._steady = indices
        return True

    def _dry_step(self, found: list) -> tuple[int, ...]:
        """`step`'s choices on sizes: the same parameters go together, the flat buffers are made when
        `_flatten` makes them (while the old ones still live), moments never made twice."""
        held = []
        for i, block, _ in found:  # a bfloat16 block: float32 moments (and a float32 master copy)
            self._dry_sizes[i] = block.size * 4 if is_low(block.dtype) else block.nbytes
            if is_low(block.dtype):
                self._dry_master[i] = block.size * 4
        if self._together(found, self._dry_steps):
            indices = tuple(i for i, _, _ in found)
            if indices != self._dry_flat:  # m, v, the scratch and the gather made, the old ones not yet freed
                old = self._dry_held()  # by the old buffers' element size
                self._dry_itemsize = found[0][1].dtype.itemsize
                new = sum(self._dry_sizes[i] for i in indices)
                held.append(old + 2 * new + 2 * self._dry_gather(new))
                self._dry_flat = indices
                for i in indices:
                    self._dry_homes[i] = indices
        for i, _, _ in found:
            self._dry_homes.setdefault(i, None)  # alone: a pair of its own, made at its first step
            self._dry_steps[i] = self._dry_steps.get(i, 0) + 1
        return tuple(held) + (self._dry_held(),)

    def _dry_held(self) -> int:
        """The bytes `state` and `_flat` hold: each own pair; the moments' flat buffers that a parameter's
        moments still view (the whole buffers); the last flat scratch and gather buffers."""
        own = sum(2 * self._dry_sizes[i] for i, home in self._dry_homes.items() if home is None)
        viewed = {home for home in self._dry_homes.values() if home is not None}  # the last flat set among them
        flats = sum(2 * sum(self._dry_sizes[i] for i in indices) for indices in viewed)
        return own + flats + self._dry_buffers()

    def _dry_buffers(self) -> int:
        """The bytes of the last scratch and gather buffers a dry run's `_flatten` would have made."""
        total = sum(self._dry_sizes[i] for i in self._dry_flat)
        return 2 * self._dry_gather(total) if total else 0

    def _dry_gather(self, total: int) -> int:
        """The bytes of the scratch (and of the gather buffer) `_flatten` makes for flat buffers of `total`
        bytes: one group's (`_GROUP_ELEMENTS`)."""
        return _gather_elements(total // self._dry_itemsize) * self._dry_itemsize

    def memory(self) -> dict:
        """This rank's bytes: "optimizer states" (the moments), "master copy" (the float32 copies of bfloat16
        parameters; none otherwise: the parameters are their own), "buffers" (the update's scratch and the
        buffer a group's gradients are gathered into, one group's each: `_GROUP_ELEMENTS`); each buffer
        counted once."""
        if self._dry_sizes:  # a dry run's: what `_dry_held` counts, by kind
            scratch = self._dry_buffers()
            return {"optimizer states": self._dry_held() - scratch, "master copy": sum(self._dry_master.values()),
                    "buffers": scratch}
        moments = owned_bytes(a for _, m, v in self.state.values() for a in (m, v))
        flat = self._flat[1]
        scratch = (flat[0].nbytes + flat[3].nbytes) if flat is not None else 0
        return {"optimizer states": moments, "master copy": sum(a.nbytes for a in self.master.values()),
                "buffers": scratch}

    def states_of(self, params: Iterable[Any]) -> int:
        """The bytes of the moments of these parameters (of this optimizer's; none before their first
        step): both moments' blocks each, views of the flat buffers counted by their own size; a dry run's
        alike from the blocks' sizes. A part of `memory`'s "optimizer states": one kind of parameter's
        (an MoE layer's experts, spmdsim.models.moe.ledger)."""
        wanted = {id(p) for p in params}
        indices = [i for i, p in enumerate(self.params) if id(p) in wanted]
        if self._dry_sizes:
            return sum(2 * self._dry_sizes[i] for i in indices if i in self._dry_steps)
        return sum(self.state[i][1].nbytes + self.state[i][2].nbytes for i in indices if i in self.state)

    def _update_all(self, indices: tuple, params: tuple, grads: tuple) -> None:
        """The same step as `_update` on each parameter, bit for bit: the moments and the step sizes over
        flat buffers, then each block decayed and stepped."""
        if not self._in_lockstep(indices):
            # A replay (the capture found them at one step) after a state_dict loaded with these parameters at
            # different steps: each its own update, as the step run eagerly now would take them.
            for k, i in enumerate(indices):
                self._update(i, params[k], grads[k])
            return
        # Other parameters than last time: new buffers, from the moments as they are now (kept in `state`).
        flat = self._flat
        if flat[0] is not indices and flat[0] != indices:
            self._flatten(indices, params, grads)
            flat = self._flat
        g, m, v, tmp, spans, groups, moments, decays = flat[1]
        if decays is not self.decays:  # (set anew since the buffers were made: each group's flags again)
            groups = self._grouped(indices, params, tmp, spans, groups)
            self._flat = (indices, flat[1][:5] + (groups, moments, self.decays))
        t = self.state[indices[0]][0] + 1
        self.state.update(zip(indices, zip(repeat(t), *moments)))  # (t, m, v): each one's moments, views of m, v
        wd = bool(self.weight_decay)
        decay = 1 - self.lr * self.weight_decay
        # A group of parameters at a time (_GROUP_ELEMENTS): its gradients read where they lie when they lie
        # end to end (a gradient bucket's summed buffer, Megatron's grad buffer), else gathered into `g` (a
        # larger block alone and not contiguous: copied by reshape); its moments and steps, its blocks
        # stepped while that part of the buffers is still in cache; elementwise, so the same values as one
        # pass over the whole buffers.
        # The step sizes go into one group's scratch (`tmp`), as Megatron's fused Adam holds none of the
        # parameters' size; a block larger than a group alone is stepped a piece at a time (`_pieces`).
        hyper = {"lr": self.lr, "betas": self.betas, "eps": self.eps}
        for a, b, members, pick, steps, decaying in groups:
            if b - a > tmp.size:  # one block alone, larger than a group
                (k,) = members
                param, (pa, pb) = params[k], spans[k]
                _step_pieces(param, grads[k], m[pa:pb].reshape(param.shape), v[pa:pb].reshape(param.shape), t,
                             tmp, decay if self.weight_decay and self.decays[indices[k]] else None, **hyper)
                continue
            ours = pick(grads)
            grad = _end_to_end(ours, g.dtype)
            if grad is None:
                grad = np.concatenate([x.reshape(-1) for x in ours], out=g[:b - a])
            _step_sizes(grad, m[a:b], v[a:b], t, tmp[:b - a], **hyper)
            # The decaying blocks decayed (``param *= decay``), then every block stepped by its step sizes, its
            # view of `tmp` (``param -= step``): `map` makes those calls, no Python per parameter (the blocks
            # are apart: each one's values are those of its own two calls in turn).
            if wd and decaying is not None:
                _drain(map(operator.imul, decaying(params), repeat(decay)))
            _drain(map(operator.isub, pick(params), steps))

    def _flatten(self, indices: tuple, params: tuple, grads: tuple) -> tuple:
        """Flat buffers for these parameters, laid out in the order their gradients lie in memory (a bucket's
        members end to end, so a group of them is read in place); each one's moments become views of them
        (values kept), so a later update of one alone (`_update`) writes into them."""
        order = _memory_order(grads)
        ends = np.cumsum([params[k].size for k in order]).tolist()
        starts = [0] + ends[:-1]
        spans: list = [None] * len(params)
        for k, a, b in zip(order, starts, ends):
            spans[k] = (a, b)
        dtype = params[0].dtype
        m, v = (np.zeros(ends[-1], dtype) for _ in range(2))
        g, tmp = (np.zeros(_gather_elements(ends[-1]), dtype) for _ in range(2))
        for k, (a, b) in enumerate(spans):
            i, param = indices[k], params[k]
            t, m_i, v_i = self.state.get(i) or (0, None, None)
            if m_i is not None:
                m[a:b], v[a:b] = m_i.reshape(-1), v_i.reshape(-1)
            self.state[i] = (t, m[a:b].reshape(param.shape), v[a:b].reshape(param.shape))
        # Neighbours together up to _GROUP_ELEMENTS (a larger block alone), a run of gradients that lie end to
        # end not mixed with others (those are gathered, these read in place).
        runs = _runs(grads, order)
        groups, first = [], 0
        for n, k in enumerate(order):
            nxt = n + 1
            if nxt == len(order) or ends[nxt] - starts[first] > _GROUP_ELEMENTS or runs[nxt] != runs[n]:
                groups.append((starts[first], ends[n], tuple(order[first:nxt])))
                first = nxt
        # What `_update_all` reads at every step, made once with the buffers (`_grouped`); each parameter's
        # moments, the views `state` holds.
        moments = tuple(tuple(self.state[i][n] for i in indices) for n in (1, 2))
        self._flat = (indices, (g, m, v, tmp, tuple(spans), self._grouped(indices, params, tmp, spans, groups),
                                moments, self.decays))

    def _grouped(self, indices: tuple, params: tuple, tmp: np.ndarray, spans: tuple, groups: Any) -> tuple:
        """Each group (a, b, members: positions in the step's columns) with what `_update_all` reads of it at
        every step: `pick` (a tuple of the members' from a column), their step sizes (views of the scratch
        `tmp`; none for a block larger than a group, stepped a piece at a time) and `decaying` (a tuple of the
        members that decay, `decays`' now, from a column; None for none)."""
        out = []
        for a, b, members, *_ in groups:
            steps = tuple(tmp[spans[k][0] - a:spans[k][1] - a].reshape(params[k].shape) for k in members) \
                if b - a <= tmp.size else ()
            decaying = [k for k in members if self.decays[indices[k]]]
            out.append((a, b, members, _picker(members), steps, _picker(decaying) if decaying else None))
        return tuple(out)


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


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


_BASE, _DTYPE_OF, _NBYTES = operator.attrgetter("base"), operator.attrgetter("dtype"), operator.attrgetter("nbytes")
_CONTIGUOUS = operator.attrgetter("flags.c_contiguous")
_INTERFACE, _DATA, _FIRST = operator.attrgetter("__array_interface__"), operator.itemgetter("data"), operator.itemgetter(0)


#: AdamW's flat update takes the parameters in groups of about this many elements (512 KiB a float64
#: buffer): the dozen passes of a group's moments and steps stay nearer the core (rank 0 of the MoE GPT's
#: replayed step on 8 MPI ranks on 2 cores, 543,232 parameters a rank: 4.7-5.0 -> 4.5 ms an update).
_GROUP_ELEMENTS = 1 << 16


def _what(value: Any, leaf: bool = False) -> str:
    """A parameter as every rank describes it alike (a DTensor's repr names this rank and its block); `leaf`:
    `value` may be a leaf (said so), not only a tensor refused for not being one."""
    if hasattr(value, "layout") and hasattr(value, "global_shape"):
        kind = "a leaf" if leaf and isinstance(getattr(value, "_ag", None), Leaf) else \
            "not a leaf: computed by an op" if value.requires_grad else "without requires_grad_()"
        return f"a DTensor of global shape {tuple(value.global_shape)!r}, layout {value.layout}, {kind}"
    from ..base.validate import describe

    return describe(value)


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


def clip_coefficient(norm: float, max_norm: float, eps: float = 1e-6) -> float:
    """What clipping multiplies every gradient by: max_norm / (norm + eps), at most 1 (PyTorch's formula;
    a non-finite norm gives NaN or 0, as there)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        coefficient = float(np.float64(max_norm) / (np.float64(norm) + eps))
    return coefficient if not coefficient >= 1.0 else 1.0


def _summed_squares(squares: Any, mesh: Any, across: Any) -> Any:
    """`squares` (this rank's, a 1-element float64 array) summed over `mesh` (its axes of size above 1), the
    stage's total, then once more over `across` = (mesh, axes), the other stages' (collective over that mesh;
    nothing more when `across` is None or its axes are 1)."""
    from ..runtime import debug
    from ..runtime.executor import pending, resolve

    for stages, (on, over) in enumerate(((mesh, mesh.layout.alias_name), across or (None, ()))):
        over = tuple(a for a in over if on.layout.axis_size(a) > 1)
        if over:
            if stages:  # they made their own numbers of collectives: SPMDSIM_CHECK's call counters agree first
                _kernel(debug.agree)(on.group(over), over, on.polite)  # (a kernel: each replay agrees too)
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
    _scaled_into(grads, clip_coefficient(value, _clip_bound(max_norm), eps), outs)


def clip_grad_norm_(params: Iterable[Any], max_norm: Any, eps: float = 1e-6, *, across: Any = None,
                    counted: Any = None) -> Any:
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
    made their own numbers of collectives, agree on their call counters first (spmdsim.runtime.debug.agree).

    In a captured step (spmdsim.runtime.replay) the squares, the norm and the scaling are kernels, so each
    replayed step clips by its own norm, the values the step run eagerly gives; the gradients are always
    replaced (by copies when nothing is clipped), and what it returns is the norm as a 0-d float64 array
    that each replay rewrites (``float(norm)`` after a replay reads that step's; read inside the step it
    would be the capture's, and a replay stops naming both). `max_norm` may be a
    spmdsim.runtime.replay.Scalar, read each replay (a bound that changes between steps).
    """
    params = tuple(params)
    captured = _capturing()
    bound = _clip_bound(max_norm)  # a Scalar's value checked now too, read without freezing it
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
        from ..base import buffers

        outs = tuple(buffers.empty(g.local.shape, g.local.dtype) for _, g in grads)
        norm = buffers.empty((), np.float64)
        _kernel(_clip_into)(squares, bound, eps, tuple(g.local for _, g in grads), outs, norm)
        for (p, g), out in zip(grads, outs):
            p._ag.grad = type(g)(g.mesh, out, g.layout, g.global_shape)
        return norm
    norm = _norm_of(squares)
    coefficient = clip_coefficient(norm, bound, eps)
    if coefficient != 1.0:
        outs = tuple(np.empty(g.local.shape, g.local.dtype) for _, g in grads)
        _scaled_into(tuple(g.local for _, g in grads), coefficient, outs)
        for (p, g), out in zip(grads, outs):
            p._ag.grad = type(g)(g.mesh, out, g.layout, g.global_shape)
    return norm


def __getattr__(name: str) -> Any:
    # DistributedAdamW lives in spmdsim.nn.distrib_optim, which builds on this module's helpers: loaded on
    # first use, so neither module imports the other at import time.
    if name == "DistributedAdamW":
        from .distrib_optim import DistributedAdamW

        return DistributedAdamW
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
