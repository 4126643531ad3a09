"""A captured step's calls made into one program (spmdsim.runtime.replay.Graph): each call as a replay
makes it (`_call`), written out as Python functions whose closures name the arrays (`_program`)."""
from __future__ import annotations

from keyword import iskeyword
from typing import Callable, Optional

import numpy as np

from .replay_tape import _copy_into, _ndarray


_METHOD_WRAPPER = type(np.add.__call__)
#: A ufunc.reduce keyword left out of a replayed call when it has this, numpy's default value.
_REDUCE_DEFAULTS = {"dtype": None, "keepdims": False, "where": True}
#: Ufuncs whose output numpy 2 wants by keyword (a third positional argument is deprecated for them).
_OUT_BY_NAME = (np.maximum, np.minimum)
#: id(a kernel's function) -> (the function, its `bind`): kernel(func, bind=...).
_BINDERS: dict = {}


def _call(func: Callable, args: tuple, kwargs: dict) -> tuple:
    """A recorded call as the replay makes it: (func, args, kwargs or None), the same call in numpy's fastest
    spelling: a ufunc called itself, not through its __call__ wrapper, with its outputs passed by position
    (``np.add(a, b, out)``); a reduction without the keywords that say numpy's defaults; no empty ``**{}``;
    a kernel's call bound once where its `bind` binds it."""
    binder = _BINDERS.get(id(func))
    if binder is not None and binder[0] is func:
        bound = binder[1](func, args, kwargs)
        if bound is not None:
            return bound, (), None
    if type(func) is _METHOD_WRAPPER and type(func.__self__) is np.ufunc and func.__name__ == "__call__":
        ufunc = func.__self__
        out = kwargs.get("out")
        if len(kwargs) == 1 and type(out) is tuple and len(out) == ufunc.nout and len(args) == ufunc.nin \
                and all(type(o) is _ndarray for o in out) and ufunc not in _OUT_BY_NAME:
            return ufunc, args + out, None
        return ufunc, args, kwargs or None
    if getattr(func, "__name__", None) == "reduce" and type(getattr(func, "__self__", None)) is np.ufunc:
        kwargs = {k: v for k, v in kwargs.items() if not (k in _REDUCE_DEFAULTS and v is _REDUCE_DEFAULTS[k])}
    return func, args, kwargs or None


#: The most objects one function of `_program` names (each a cell of its closure): up to 256, a name is read by
#: one opcode (no EXTENDED_ARG).
_NAMES_MAX = 256


def _program(calls: tuple) -> tuple:
    """The recorded calls as straight-line Python: functions of no argument that make them in order, each a
    run of calls naming at most about _NAMES_MAX objects.

    ``f(a, b, out)`` compiled once a graph costs a replay the call alone (a name read per object); a loop over
    (func, args, kwargs) paid ~14 opcodes a call beside it (unpacking, a test of kwargs, ``func(*a, **k)``,
    which also makes a dict of keywords a call). The calls, their arguments (the same objects, keywords by
    name) and their order are the record's; a `_copy_into` is written as its body
    (``np.copyto(result, func(*args, **kwargs), casting="unsafe")``)."""
    runs: list = []
    lines: list = []
    names: dict = {}  # id(object) -> its name in this run
    objects: list = []

    def close() -> None:
        made: dict = {}
        exec(f"def make({', '.join(names.values())}):\n    def run():\n"
             + "".join(f"        {line}\n" for line in lines) + "    return run", {}, made)
        runs.append(made["make"](*objects))
        lines.clear()
        names.clear()
        objects.clear()

    for func, args, kwargs in calls:
        if func is _copy_into and not kwargs and len(args) == 4 and type(args[3]) is dict:
            result, inner, inner_args, inner_kwargs = args
            line = _line(inner, inner_args, inner_kwargs or None)
            line = ((np.copyto,), "(", (result,), ", ") + line + (", casting='unsafe')",)
        else:
            line = _line(func, args, kwargs)
        new = {id(x[0]) for x in line if type(x) is tuple} - names.keys()
        if lines and len(names) + len(new) > _NAMES_MAX:
            close()
        text = []
        for x in line:
            if type(x) is str:
                text.append(x)
                continue
            found = names.get(id(x[0]))
            if found is None:
                found = names[id(x[0])] = f"k{len(objects)}"
                objects.append(x[0])
            text.append(found)
        lines.append("".join(text))
    if lines:
        close()
    return tuple(runs)


def _line(func: Callable, args: tuple, kwargs: Optional[dict]) -> tuple:
    """``func(*args, **kwargs)`` as a tuple of source text (a str) and the objects it names (each in a tuple of
    one), in order."""
    line: list = [(func,), "("]
    for a in args:
        line += [(a,), ", "]
    if kwargs and _identifiers(kwargs):
        for k, v in kwargs.items():
            line += [f"{k}=", (v,), ", "]
    elif kwargs:
        line += ["**", (kwargs,), ", "]
    if line[-1] == ", ":
        line.pop()
    return tuple(line) + (")",)


def _identifiers(kwargs: dict) -> bool:
    """Whether every key of `kwargs` can be written as a keyword argument (``name=value``)."""
    return all(type(k) is str and k.isidentifier() and not iskeyword(k) for k in kwargs)
