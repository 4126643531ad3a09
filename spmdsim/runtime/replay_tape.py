"""A capture's record and the running thread's part in it (spmdsim.runtime.replay): the tape each
capturing thread writes (`_Tape`), and the calls a replay makes to copy a recomputed result back into
the captured array (`_copy_into`, ...). Below the traced arrays, the memory plan and the program."""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import numpy as np

from ..base import buffers
from ..errors import SpmdsimError


class ReplayError(SpmdsimError):
    """A step that cannot be captured, or a replay that would not repeat its capture."""


_ndarray = np.ndarray
_tls = threading.local()
_ACTIVE = buffers.CAPTURING  # threads capturing now (simulated ranks capture together)
_CAPTURE = buffers.CAPTURE  # this thread's flag: 0 in a thread that does not capture, every hook one test


def _tape() -> Optional["_Tape"]:
    tape = getattr(_tls, "tape", None)
    return None if tape is None or tape.depth else tape


def _arrays(x: Any, out: list) -> list:
    """The arrays in `x` (an array, or tuples, lists and dicts' values of them), appended to `out`."""
    if isinstance(x, _ndarray):
        out.append(x)
    elif type(x) in (tuple, list, dict):
        for v in (x.values() if type(x) is dict else x):
            _arrays(v, out)
    return out


def _fresh(result: Any, inputs: Any) -> bool:
    """Whether numpy's `result` array is new memory (not a view of any input)."""
    for a in _arrays(inputs, []):
        if np.may_share_memory(result, a):
            return False
    return True


def _separate(results: tuple, inputs: Any) -> bool:
    """Whether every one of `results` is an array of new memory, none sharing any with another or an input."""
    for i, r in enumerate(results):
        if not isinstance(r, _ndarray) or not _fresh(r, (inputs, results[:i])):
            return False
    return True


def _inside(tape: "_Tape", func: Callable, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` with the tape paused: numpy's own calls inside it are its own."""
    tape.depth += 1
    try:
        return func(*args, **kwargs)
    finally:
        tape.depth -= 1


def _copy_into(out: np.ndarray, func: Callable, args: tuple, kwargs: dict) -> None:
    np.copyto(out, func(*args, **kwargs), casting="unsafe")


def _copy_all(results: tuple, func: Callable, args: tuple, kwargs: dict) -> None:
    for out, new in zip(results, func(*args, **kwargs)):
        if out is not new:
            np.copyto(out, new, casting="unsafe")


def _copy_dict(results: dict, func: Callable, args: tuple, kwargs: dict) -> None:
    new = func(*args, **kwargs)
    for key, out in results.items():
        if out is not new[key]:
            np.copyto(out, new[key], casting="unsafe")


def _take_into(out: np.ndarray, raw: np.ndarray, index: Any) -> None:
    out[...] = raw[index]


def _setitem(raw: np.ndarray, index: Any, value: Any) -> None:
    raw[index] = value


class _Tape:
    """One rank's record: (callable, args, kwargs) per array-writing operation, in order."""

    __slots__ = ("entries", "depth")

    def __init__(self) -> None:
        self.entries: list = []
        self.depth = 0  # inside a kernel: its own numpy work is the kernel's

    def add(self, func: Callable, args: tuple, kwargs: dict) -> None:
        self.entries.append((func, args, kwargs))
