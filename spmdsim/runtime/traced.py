"""Traced arrays (spmdsim.runtime.replay): a numpy subclass that records, while a thread captures, each
ufunc and numpy function applied to it and the methods that copy or write, on the thread's tape."""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from .replay_tape import (ReplayError, _copy_all, _copy_into, _fresh, _inside, _ndarray, _setitem, _take_into,
                          _tape)


def _raw(x: Any, seen: Optional[dict] = None) -> Any:
    """`x` with Traced arrays as plain views of the same memory; one view per Traced object (`seen`), so a
    callee that tests ``out is x`` (an in-place Allreduce) sees the same object twice."""
    if type(x) is Traced:
        if seen is None:
            return x.view(_ndarray)
        view = seen.get(id(x))
        if view is None:
            view = seen[id(x)] = x.view(_ndarray)
        return view
    if type(x) in (tuple, list):
        return type(x)(_raw(v, seen) for v in x)
    return x


def _raw_call(args: tuple, kwargs: dict) -> tuple:
    seen: dict = {}
    return _raw(args, seen), {k: _raw(v, seen) for k, v in kwargs.items()}


def _traced(x: Any) -> Any:
    if type(x) is _ndarray:
        return x.view(Traced)
    if type(x) is tuple:
        return tuple(_traced(v) for v in x)
    return x


def _guard(func: Callable, raw: np.ndarray, captured: Any, what: str) -> None:
    now = func(raw)
    if now != captured and not (now != now and captured != captured):
        raise ReplayError(f"replay: {what} read {captured!r} from an array while capturing and {now!r} now; "
                          "a step whose Python depends on values cannot be replayed (capture it again, or "
                          "compute the value in a kernel)")


class Traced(np.ndarray):
    """An array whose operations are recorded while its thread captures (else a plain ndarray's)."""

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        seen: dict = {}
        raw_in = tuple(_raw(x, seen) for x in inputs)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_raw(o, seen) for o in out)
        func = getattr(ufunc, method)
        tape = _tape()
        if tape is None:
            return func(*raw_in, **kwargs)
        if method == "at":  # in place on its first operand
            _written(inputs[0], ufunc.__name__ + ".at")
        elif out is not None:
            for o in out:
                _written(o, ufunc.__name__)
        result = _inside(tape, func, raw_in, kwargs)
        if method == "at":
            tape.add(func, raw_in, kwargs)
            return None
        if out is not None:
            tape.add(func, raw_in, kwargs)
            return _traced(kwargs["out"][0]) if len(out) == 1 else _traced(kwargs["out"])
        if type(result) is tuple:
            result = tuple(np.asarray(r) for r in result)
        elif type(result) is not _ndarray:  # a numpy scalar: kept as a 0-d array the replay rewrites
            result = np.asarray(result)
        kwargs["out"] = result if type(result) is tuple else (result,)
        tape.add(func, raw_in, kwargs)
        return _traced(result)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        raw_args, raw_kwargs = _raw_call(args, kwargs)
        tape = _tape()
        if tape is None:
            return func(*raw_args, **raw_kwargs)
        fill = _FILLS.get(func)
        if fill is not None:  # np.zeros_like(traced) and its kin: new memory the replay fills again
            result = _inside(tape, func, raw_args, raw_kwargs)
            value = fill(raw_args, raw_kwargs)
            if value is not None:
                tape.add(result.fill, (value,), {})
            return _traced(result)
        if kwargs.get("out") is not None:
            _written(kwargs["out"], func.__name__)
        result = _inside(tape, func, raw_args, raw_kwargs)
        if result is None:  # wrote into an argument (np.copyto, np.put): its first
            _written(args[0] if args else next(iter(kwargs.values()), None), func.__name__)
            tape.add(func, raw_args, raw_kwargs)
            return None
        if isinstance(result, _ndarray):
            if "out" in raw_kwargs and raw_kwargs["out"] is not None:
                tape.add(func, raw_args, raw_kwargs)
                return _traced(result)
            if not _fresh(result, (raw_args, tuple(raw_kwargs.values()))):
                return _traced(result)
            if func in _OUT_FUNCS and result.flags.c_contiguous:
                tape.add(func, raw_args, dict(raw_kwargs, out=result))
            else:
                tape.add(_copy_into, (result, func, raw_args, raw_kwargs), {})
            return _traced(result)
        if type(result) in (tuple, list) and all(isinstance(r, _ndarray) for r in result):
            inputs = (raw_args, tuple(raw_kwargs.values()))
            if any(_fresh(r, inputs) for r in result):
                tape.add(_copy_all, (result, func, raw_args, raw_kwargs), {})
            return type(result)(_traced(r) for r in result)
        if isinstance(result, np.generic):
            held = np.asarray(result)
            tape.add(_copy_into, (held, func, raw_args, raw_kwargs), {})
            return held.view(Traced)
        if func in _METADATA or not isinstance(result, (bool, int, float, complex)):
            return result  # no values read (np.shape, np.ndim, np.result_type)
        tape.add(_guard, (lambda a: func(*a, **raw_kwargs), raw_args, result, f"np.{func.__name__}"), {})
        return result  # a number read off values (np.count_nonzero): the replay checks it again

    # Methods numpy runs without its dispatch: those that copy, write or read values out.
    def __getitem__(self, index: Any) -> Any:
        raw, idx = self.view(_ndarray), _raw(index)
        result = raw[idx]
        tape = _tape()
        if tape is None:
            return result
        if isinstance(result, _ndarray):
            if np.may_share_memory(result, raw):
                return result.view(Traced)
        else:
            result = np.asarray(result)
        tape.add(_take_into, (result, raw, idx), {})
        return result.view(Traced)

    def __setitem__(self, index: Any, value: Any) -> None:
        raw, idx, val = self.view(_ndarray), _raw(index), _raw(value)
        raw[idx] = val
        tape = _tape()
        if tape is not None:
            tape.add(_setitem, (raw, idx, val), {})

    def _copying(self, name: str, *args: Any, **kwargs: Any) -> Any:
        raw = self.view(_ndarray)
        method = getattr(_ndarray, name)
        result = method(raw, *args, **kwargs)
        tape = _tape()
        if tape is None:
            return result
        if not isinstance(result, _ndarray):
            result = np.asarray(result)
        elif not _fresh(result, raw):
            return result.view(Traced)
        if name in _STRAIGHT:  # its values are raw's, converted: copied straight in (no new array a replay)
            tape.add(np.copyto, (result, raw), _UNSAFE)
        else:
            tape.add(_copy_into, (result, method, (raw,) + _raw(args), kwargs), {})
        return result.view(Traced)

    def fill(self, value: Any) -> None:
        raw = self.view(_ndarray)
        raw.fill(value)
        tape = _tape()
        if tape is not None:
            tape.add(raw.fill, (value,), {})

    def _read(self, func: Callable, what: str) -> Any:
        raw = self.view(_ndarray)
        value = func(raw)
        tape = _tape()
        if tape is not None:
            tape.add(_guard, (func, raw, value, what), {})
        return value

    def __bool__(self) -> bool:
        return self._read(_ndarray.__bool__, "bool()")

    def __float__(self) -> float:
        return self._read(_ndarray.__float__, "float()")

    def __int__(self) -> int:
        return self._read(_ndarray.__int__, "int()")

    def __index__(self) -> int:
        return self._read(_ndarray.__index__, "an index")

    def item(self, *args: Any) -> Any:
        return self._read(lambda raw: raw.item(*args), "item()")

    def tolist(self) -> Any:
        return self._read(_ndarray.tolist, "tolist()")

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))


def _copying_method(name: str) -> Callable:
    def method(self: Traced, *args: Any, **kwargs: Any) -> Any:
        return self._copying(name, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(_ndarray, name).__doc__
    return method


# ndarray's methods that may make new memory without numpy's dispatch: recorded when they do.
for _name in ("copy", "astype", "reshape", "ravel", "flatten", "argmax", "argmin", "dot", "take", "repeat",
              "cumsum"):
    setattr(Traced, _name, _copying_method(_name))


# Traced's copying methods whose result is its array's values converted to the result's dtype (the cast
# np.copyto makes with casting="unsafe", as astype's): a replay copies into the result in one pass.
_STRAIGHT = frozenset({"copy", "astype"})
_UNSAFE = {"casting": "unsafe"}


def _written(target: Any, what: str) -> None:
    """Refuse a recorded write into a plain array: memory the capture did not hand out, whose zeroing or
    fill (made before the write, unrecorded) a replay would not repeat."""
    if type(target) is tuple:
        for t in target:
            _written(t, what)
    elif type(target) is _ndarray:
        raise ReplayError(
            f"replay: np.{what} wrote into a plain array {target.shape} {target.dtype.name} while capturing: numpy "
            "made it out of the capture's sight, so a replay would not zero or fill it again; make it with "
            "spmdsim.base.buffers.zeros(...) or np.zeros_like(<a traced array>), and read traced arrays with "
            "np.asanyarray, not np.asarray")


def _fill_arg(args: tuple, kwargs: dict) -> Any:
    return kwargs["fill_value"] if "fill_value" in kwargs else args[1]


# numpy's creators that take a prototype: their result is filled again by a replay (np.empty_like's is not).
_FILLS = {np.empty_like: lambda args, kwargs: None, np.zeros_like: lambda args, kwargs: 0,
          np.ones_like: lambda args, kwargs: 1, np.full_like: _fill_arg}
_METADATA = frozenset({np.shape, np.ndim, np.size, np.result_type, np.may_share_memory, np.shares_memory,
                       np.iscomplexobj, np.isrealobj, np.min_scalar_type, np.can_cast})
# numpy functions a replay calls with out= the captured result (the others compute a new array and copy it in).
_OUT_FUNCS = frozenset({np.einsum, np.dot, np.concatenate, np.take, np.sum, np.mean, np.prod, np.max, np.min,
                        np.amax, np.amin, np.clip})
