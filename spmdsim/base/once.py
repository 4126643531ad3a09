"""Local work every simulated rank would repeat on equal inputs, done once per simulation.

Simulated ranks (spmdsim.simulate) are threads of one process. Checking a
training step against the single-process reference makes every rank run the
whole network in numpy: p ranks do p times the same work, which grows as p^2
where the widths grow with the ranks (the Megatron block example spent about
30 s a step on it at 128 ranks). ``once(key, fn, *args)`` runs ``fn(*args)``
for the first rank that asks with `key`; a rank that asks later with the same
key and equal arguments (compared exactly: arrays value by value, NaN equal
to NaN) gets that result instead of computing it. Unequal arguments, or a key
not asked before, compute as usual, so a program whose ranks disagree gets
each rank's own answer, never another rank's. Outside a simulation (under MPI
a rank is a process) and on one rank it is just ``fn(*args)``.

`fn` must be local work (no collectives): a rank that asks while another
computes the same key and arguments waits for that result, without its run
slot (local work always finishes, so the wait cannot deadlock); if that
computation raises, each waiting rank computes its own and raises its own error. The
first asker's arguments are kept (not copied) to compare the others' with, so
they must not change in place while other ranks may still ask: replace them
(``p = p - lr * g``), as `ReferenceTrainer` does. The
shared arrays are made read-only, so changing one in place raises numpy's
error instead of changing the other ranks' copy; lists, tuples and dicts in
the result are copied for each caller. An entry is dropped once every rank
took it (or with its simulation).

Pure: imports numpy, spmdsim.errors and the running rank's context only.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from ..errors import SpmdsimError
from .context import simulated
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["once"]

_LOCK = threading.Lock()


def once(key: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, computed once per simulation for a hashable `key` and equal `args` (module doc)."""
    try:  # checked under MPI too: a program must not work there and fail simulated
        hash(key)
    except TypeError:
        raise SpmdsimError(f"once: key {key!r:.80} must be hashable (a str, int or tuple of them), "
                           f"not {type(key).__name__}") from None
    state = simulated()
    if state is None or state.size == 1:
        return fn(*args)
    if state.dry_run:  # one rank runs for all; what it makes here is no rank's bytes held
        own, state.meter = state.meter, type(state.meter)()
        try:
            return fn(*args)
        finally:
            state.meter = own
    table = state.shared
    while True:
        with _LOCK:
            entries = list(table.get(key, ()))
        entry = next((e for e in entries if _equal(e[0], args)), None)
        if entry is None:
            with _LOCK:  # another rank may have registered the same arguments meanwhile
                known = [e for e in table.get(key, ()) if not any(e is k for k in entries)]
                entry = next((e for e in known if _equal(e[0], args)), None)
                if entry is None:
                    entry = [args, _PENDING, 0, threading.Event()]
                    table.setdefault(key, []).append(entry)
                    break
        _wait(state, entry[3])
        if entry[1] is not _PENDING:
            return _take(table, key, entry, state.size)
        # Its computation raised and left the table: look again, and compute if no one else does.
    try:
        result = fn(*args)
        _freeze(result)
        entry[1] = result
    finally:
        if entry[1] is _PENDING:  # fn raised: the waiters compute their own; later askers too
            with _LOCK:
                _drop(table, key, entry)
        entry[3].set()
    return _take(table, key, entry, state.size)


def _wait(state: Any, done: threading.Event) -> None:
    """Wait for `done` without this rank's run slot (the thread engine's World.stepped_aside): the rank that
    computes may need one back, after a ``time.sleep`` in `fn` gave its own away."""
    world = getattr(getattr(state.comm, "_group", None), "world", None)
    if world is None:
        done.wait()
        return
    with world.stepped_aside(state.rank):
        done.wait()


#: An entry's result while its first asker computes it.
_PENDING = object()


def _take(table: dict, key: Any, entry: list, size: int) -> Any:
    """`entry`'s result for one more rank; the entry goes once every rank took it."""
    with _LOCK:
        entry[2] += 1
        if entry[2] >= size:
            _drop(table, key, entry)
    return _copy(entry[1])


def _drop(table: dict, key: Any, entry: list) -> None:
    """Remove `entry` from `key`'s entries (with _LOCK held)."""
    # By identity: `==` on entries would compare their arrays.
    rest = [e for e in table.get(key, []) if e is not entry]
    if rest:
        table[key] = rest
    else:
        table.pop(key, None)


def _equal(a: Any, b: Any) -> bool:
    """Exact equality of two argument structures (arrays by value, NaN equal to NaN)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        # One pass (==) first; NaN equal to NaN only asked of arrays that differ there (equal_nan's passes
        # cost several times more: an anchored training check compares megabytes a step).
        return bool(np.array_equal(a, b)) or (a.dtype.kind in "fc" and bool(np.array_equal(a, b, equal_nan=True)))
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # an object that cannot say: not known equal
        return False


def _freeze(value: Any) -> None:
    """Clear the writeable flag of every array in `value` (lists, tuples, dicts, dataclass fields)."""
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _freeze(item)
    elif isinstance(value, dict):
        for item in value.values():
            _freeze(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _freeze(getattr(value, name))


def _copy(value: Any) -> Any:
    """`value` with its lists, tuples and dicts copied (arrays and other objects shared)."""
    if isinstance(value, list):
        return [_copy(item) for item in value]
    if type(value) is tuple:
        return tuple(_copy(item) for item in value)
    if isinstance(value, dict):
        return {k: _copy(item) for k, item in value.items()}
    return value
