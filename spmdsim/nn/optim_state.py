"""Optimizers' checkpoints: state_dict and load_state_dict, torch.optim's, of this rank's state alone.

Every optimizer's `state_dict()` and `load_state_dict(sd)` hold this rank's state (its blocks' moments,
ZeRO-1's slices), copied both ways; a resumed run steps as the uninterrupted one, bit for bit
(docs/howto/checkpoints.md, "In a program")."""
from __future__ import annotations

import numbers
from typing import Any, Optional

import numpy as np

from ..base.context import current
from ..errors import OperatorError
from .optim_checks import _SETTINGS, _capturing, _count
from ..runtime.replay import ReplayError
from ..base.validate import describe

__all__ = ["STATE_WORDS"]

#: The state arrays `nonfinite_state` looks at, by their state_dict field, and what a refusal calls each.
STATE_WORDS = {"exp_avg_sq": "second moment", "momentum_buffer": "momentum"}


class _Checkpoints:
    """The optimizers' checkpoints: state_dict / load_state_dict (torch.optim's names), this rank's state
    alone; a subclass says what its state holds (`_state_items`, `_entry_spec`, `_load`)."""

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

    def nonfinite_state(self, fields: tuple = tuple(STATE_WORDS)) -> Optional[tuple]:
        """(field, parameter) of the first of this rank's state arrays of `fields` (state_dict's names, those of
        `STATE_WORDS` by default: AdamW's second moment, which a gradient's square past its dtype's range makes
        inf, and any NaN or inf in the first moment makes so too; SGD's momentum) that holds an inf or a NaN;
        the parameter None where the state is per bucket (DistributedAdamW's). None where all are finite, or in
        a dry run. No copies, no collective: a trainer asks it after each step (a diverged run's parameters stop
        moving), and names the field in `STATE_WORDS`' words."""
        if current().dry_run or getattr(self, "_dry", False):
            return None
        for key, entry in self._state_items().items():
            for field in fields:
                value = entry.get(field)
                if isinstance(value, np.ndarray) and value.size and not np.isfinite(
                        value.astype(np.float32) if value.dtype.kind == "V" else value).all():
                    return field, self.params[key] if self._unit == "parameter" else None
        return None

    def _refuse_state(self, what: str) -> None:
        """state_dict / load_state_dict: not inside a captured step (the replays would not run it), not in a
        dry run (no values)."""
        if _capturing():
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


def _describe(value: Any) -> str:
    return describe(value)


def _same_keys(name: str, where: str, given: dict, known: tuple, required: Any = None) -> None:
    """One line for a key `given` has that `known` does not, or one it lacks of `required` (default all)."""
    for key in given:
        if key not in known:
            raise OperatorError(f"{name}: {where} has an unknown key {key!r}; expected the keys "
                                f"{', '.join(map(repr, known))}")
    for key in known if required is None else required:
        if key not in given:
            raise OperatorError(f"{name}: {where} lacks the key {key!r}")


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
