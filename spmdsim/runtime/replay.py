"""Capture a rank's step once, replay its arrays' work without the Python that decided it (docs/howto/replay.md).

``graph = capture(step, *args, state=params)`` runs ``step(*args)`` once, as
always, and records on this rank every numpy operation that wrote an array
and every collective, in order, with the arrays each read and wrote.
``graph(*new_args)`` copies the new inputs into the captured ones and runs
that record again: the same numpy calls, writing the same arrays (the
capture's results, kept), and the same collectives; none of the layout
inference, planning, autograd bookkeeping or checks that chose them. It is
CUDA graphs' contract on numpy arrays:

- the inputs are static: DTensors and arrays given to capture are rewritten in
  place by each call (same shape, layout and dtype); a number that changes
  between steps is a `Scalar`, read only by kernels (a dropout's seed);
- Python side effects happen once, at capture: attributes set then (a
  parameter's ``.grad``) keep pointing at arrays each replay rewrites;
- the parameters (`state`) are updated in place (spmdsim's optimizers do).

How it records: while capturing, DTensors' blocks are seen as `Traced`
arrays (a numpy subclass that records each ufunc and numpy function applied
to it, and the methods that copy or write; `DTensor.local` is `local_of`,
which asks the calling thread); functions marked `kernel` (the
collectives, a dropout's mask, an optimizer's update) are recorded as one
call each and rerun whole. Nothing outside spmdsim is swapped: memory a step
makes comes from an allocator that hands it to the capture (spmdsim.base.buffers:
``FRESH`` is `fresh` while any thread captures) or from numpy's ``*_like`` of a
traced array, and a recorded write into a plain array (memory numpy made out
of the capture's sight) raises ReplayError (docs/howto/replay.md, "Your own step").
A Python value read off an array while capturing (``bool(x)``, ``float(x)``,
``x.item()``) is recorded as a guard: a replay that reads a different value
stops with an error naming the capture's value.
"""
from __future__ import annotations

import sys
import threading
from keyword import iskeyword
from typing import Any, Callable, Iterable, Optional

import numpy as np

from ..base import buffers
from ..base.buffers import owner as _owner
from ..errors import SpmdsimError

__all__ = ["ReplayError", "Scalar", "Graph", "capture", "kernel", "kernels", "capturing"]


class ReplayError(SpmdsimError):
    """A step that cannot be captured, or a replay that would not repeat its capture."""


_ndarray = np.ndarray
_tls = threading.local()
_ACTIVE = buffers.CAPTURING  # threads capturing now (simulated ranks capture together)
#: The same list, for a hot path outside this module: ``CAPTURES[0] and capturing()`` asks no function while
#: nothing captures (runtime.door.point_to_point, a few calls per microbatch).
CAPTURES = _ACTIVE
_CAPTURE = buffers.CAPTURE  # this thread's flag: 0 in a thread that does not capture, every hook one test


def _tape() -> Optional["_Tape"]:
    tape = getattr(_tls, "tape", None)
    return None if tape is None or tape.depth else tape


def capturing() -> bool:
    """Whether this thread is capturing now, outside a kernel."""
    return bool(_CAPTURE.on) and _tape() is not None


def unrecorded(what: str) -> None:
    """Refuse `what` (a transfer no kernel records: DTensor.gather, a prepared collective) while this thread
    captures outside a kernel: a replay would not repeat it."""
    if _CAPTURE.on and _tape() is not None:
        raise ReplayError(f"replay: {what} while capturing is not recorded (no kernel runs it), so a replay would "
                          "not repeat it; do it outside the captured step, or inside a function marked with "
                          "spmdsim.runtime.replay.kernel")


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


class _Tape:
    """One rank's record: (callable, args, kwargs) per array-writing operation, in order."""

    __slots__ = ("entries", "depth")

    def __init__(self) -> None:
        self.entries: list = []
        self.depth = 0  # inside a kernel: its own numpy work is the kernel's

    def add(self, func: Callable, args: tuple, kwargs: dict) -> None:
        self.entries.append((func, args, kwargs))


def kernel(func: Callable, bind: Optional[Callable] = None) -> Callable:
    """`func` recorded as one call while capturing (and rerun whole by a replay), its own work unrecorded.

    For functions whose work a replay must redo with Python: collectives (they meet other ranks), a
    mask drawn from a seed a `Scalar` gives, an optimizer's update counting its steps. Arrays it
    returns that are not views of its arguments are rewritten by the rerun (``out=`` when `func`
    takes one, else copied in). A tuple of arrays, each new memory, from a `func` that takes ``out``:
    the rerun is handed ``out=`` that tuple and writes into its arrays (an MoE layer's experts).

    `bind`: ``bind(func, args, kwargs)``, called once a graph for each recorded call ``func(*args,
    **kwargs)`` (its arguments as the replay passes them), may return a function of no argument that a
    replay calls in its place (what the call worked out bound once: a collective's kept plan), or None.
    """
    code = getattr(func, "__code__", None)
    if bind is not None:
        _BINDERS[id(func)] = (func, bind)
    takes_out = code is not None and "out" in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]

    def recorded(*args: Any, **kwargs: Any) -> Any:
        if not _CAPTURE.on:
            return func(*args, **kwargs)
        tape = _tape()
        if tape is None:
            return func(*args, **kwargs)
        raw_args, raw_kwargs = _raw_call(args, kwargs)
        result = _inside(tape, func, raw_args, raw_kwargs)
        if isinstance(result, _ndarray) and raw_kwargs.get("out") is None \
                and _fresh(result, (raw_args, tuple(raw_kwargs.values()))):
            if takes_out:
                tape.add(func, raw_args, dict(raw_kwargs, out=result))
            else:
                tape.add(_copy_into, (result, func, raw_args, raw_kwargs), {})
        elif type(result) is tuple and any(isinstance(r, _ndarray) for r in result):
            inputs = (raw_args, tuple(raw_kwargs.values()))
            if takes_out and raw_kwargs.get("out") is None and _separate(result, inputs):
                tape.add(func, raw_args, dict(raw_kwargs, out=result))
            else:
                tape.add(_copy_all, (result, func, raw_args, raw_kwargs), {})
        elif type(result) is dict and any(isinstance(r, _ndarray) for r in result.values()):
            tape.add(_copy_dict, (result, func, raw_args, raw_kwargs), {})
            return {k: _traced(v) for k, v in result.items()}
        else:
            tape.add(func, raw_args, raw_kwargs)
        return _traced(result)

    recorded.__wrapped__ = func  # type: ignore[attr-defined]
    recorded.__name__ = getattr(func, "__name__", "kernel")
    recorded.__doc__ = func.__doc__
    return recorded


class _Kernels(threading.local):
    """`kernels`' namespace: in each thread, its attributes are the kernels' own functions, or their recorded
    wrappers while that thread captures (`_begin` and `_end` switch them in the capturing thread alone)."""

    def __init__(self, plain: dict, recorded: dict) -> None:  # once in each thread, on its first use there
        self.__dict__.update(recorded if _CAPTURE.on else plain)  # (a namespace made while this thread captures)


#: Every `kernels` namespace: (it, {name: the function}, {name: its recorded wrapper}).
_SPACES: list = []


def kernels(*recorded: Callable, **named: Callable) -> Any:
    """A namespace of kernels (each a function `kernel` returned), by name (their functions' names, or the
    keywords' for `named`), for hot paths: ``K.f(...)`` is a call of f's own function in a thread that does not
    capture (no wrapper's frame, no test), and of its recorded wrapper in a thread that does. Each thread sees
    its own: a thread that captures changes what no other thread calls."""
    wrapped = {f.__name__: f for f in recorded}
    if len(wrapped) != len(recorded) or set(wrapped) & set(named):
        raise ValueError(f"kernels: two kernels of one name in {sorted(f.__name__ for f in recorded)} "
                         f"and {sorted(named)}")
    wrapped.update(named)
    plain = {name: f.__wrapped__ for name, f in wrapped.items()}  # type: ignore[attr-defined]
    space = _Kernels(plain, wrapped)
    with _lock:
        _SPACES.append((space, plain, wrapped))
    return space


def _switch(recording: bool) -> None:
    """This thread's `kernels` namespaces: their recorded wrappers (`recording`) or the functions themselves."""
    with _lock:
        spaces = tuple(_SPACES)
    for space, plain, wrapped in spaces:
        space.__dict__.update(wrapped if recording else plain)


def fresh(array: np.ndarray) -> np.ndarray:
    """`array`, new memory this thread just allocated: a Traced view while capturing (so writes into it
    are recorded), else itself. spmdsim.base.buffers returns its arrays through it."""
    return array.view(Traced) if capturing() else array


class Scalar:
    """A number that changes between replays (a step count that seeds dropout, a learning rate), read inside
    kernels.

    ``int(s)``, ``float(s)`` or ``s`` as an index outside a kernel while capturing would freeze the capture's
    value: it raises. Each conversion is the value's own: ``float(Scalar(0.5))`` is 0.5 (without
    ``__float__`` Python would take ``__index__``'s integer, 0, and a learning rate would silently be
    zero), ``int()`` truncates as ``int(0.5)`` does, and an index must be an integer (``Scalar(2.5)``
    as an index is refused, as ``operator.index(2.5)`` is).
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = _number(value)

    def _checked(self, what: str) -> Any:
        if capturing():
            raise ReplayError(f"Scalar({self.value!r}) was read outside a kernel while capturing ({what}): its "
                              "value would be frozen into the replay; read it inside a "
                              "spmdsim.runtime.replay.kernel")
        return self.value

    def __index__(self) -> int:
        value = self.value
        if _CAPTURE.on and _tape() is not None:  # capturing(), without its call (a replayed mask's seed reads
            self._checked("as an index")  # its step's Scalar as an index, a few times a step)
        if type(value) is int:
            return value
        if isinstance(value, (float, np.floating)) and not float(value).is_integer():
            raise ReplayError(f"Scalar({value!r}) used as an index: its value is not an integer; use "
                              "int(s) to truncate it or float(s) for its value")
        return int(value)

    def __int__(self) -> int:
        return int(self._checked("int()"))

    def __float__(self) -> float:
        return float(self._checked("float()"))

    def __repr__(self) -> str:
        return f"Scalar({self.value!r})"


def _number(value: Any) -> Any:
    """`value` if it is a real number a Scalar can hold (an int, a float, a numpy number), else the one-line
    error: a replay hands it to kernels that convert it with int() or float()."""
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise ReplayError(f"Scalar({value!r}): a Scalar holds a real number (an int or a float), got "
                          f"{type(value).__name__}")
    return value


_lock = threading.Lock()


def _begin(tape: "_Tape") -> None:
    with _lock:
        if _ACTIVE[0] == 0:
            buffers.FRESH = fresh
        _ACTIVE[0] += 1
    _tls.tape = tape
    _CAPTURE.on = 1  # (first: a `kernels` namespace this thread first uses from now on starts recorded)
    _switch(True)


def _end() -> None:
    _tls.tape = None
    _CAPTURE.on = 0
    _switch(False)
    with _lock:
        _ACTIVE[0] -= 1
        if _ACTIVE[0] == 0:
            buffers.FRESH = None


def local_of(tensor: Any) -> Any:
    """``DTensor.local``: the block, as a Traced view while this thread captures (a DTensor that
    capture() was not given is read like one it was), else the block itself. One property for every
    thread, never swapped: a simulation that captures leaves the DTensors of another alone."""
    local = tensor._local
    if _CAPTURE.on and type(local) is _ndarray and _tape() is not None:
        return local.view(Traced)
    return local


class Graph:
    """A captured step: call it with new inputs to replay it (see the module's docstring)."""

    def __init__(self, func: Callable, args: tuple, result: Any, tape: _Tape) -> None:
        self.func, self.args, self.result = func, args, result
        entries = tuple(tape.entries)
        tape.entries.clear()  # `entries` alone holds the record: each pass counts references against it
        entries, self.joined_bytes = _joined_in_place(entries) if SHARE_MEMORY else (entries, 0)
        self._entries, self.shared_bytes = _share_memory(entries) if SHARE_MEMORY else (entries, 0)
        self._calls = tuple(_call(*entry) for entry in self._entries)
        self._runs = _program(self._calls)

    @property
    def operations(self) -> int:
        """How many recorded calls a replay makes."""
        return len(self._entries)

    @property
    def held_bytes(self) -> int:
        """The bytes of the memory the recorded calls name (each array's owner once): what the record holds
        beside the step's inputs and state, with its intermediates sharing memory (`shared_bytes` less
        than each on its own)."""
        named: list = []
        for func, args, kwargs in self._entries:  # kwargs and a _copy_dict's results: dicts of arrays
            _arrays((getattr(func, "__self__", None), args, kwargs), named)
        return buffers.owned_bytes(named)

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.args):
            raise ReplayError(f"replay: got {len(args)} argument(s); the step was captured with {len(self.args)}")
        for i, (new, old) in enumerate(zip(args, self.args)):
            _rebind(i, old, new)
        for run in self._runs:
            run()
        return self.result


#: Whether a capture lets the step's intermediates share memory by lifetime (`_share_memory`) and writes a
#: join's parts where the join puts them (`_joined_in_place`); False: each keeps its own, as before (to
#: measure what that saves, or to rule it out).
SHARE_MEMORY = True


def _share_memory(entries: tuple) -> tuple[tuple, int]:
    """The recorded calls with the step's intermediates sharing memory where their lifetimes allow, and the
    bytes that saved: (entries, bytes).

    A capture keeps every array the step made, each its own memory, so a replay writes each intermediate
    into memory it last touched a step ago, not into what the eager step's allocator handed back warm
    (docs/howto/replay.md, "Memory"). Here an array the step made whose only references are the record's (its
    views' too: no DTensor, gradient, result, cache or request holds it), whose first recorded use writes
    it whole and whose last use ends before another such array of the same size is first written, takes
    that array's memory. The calls, their order and their values are the capture's; only where the
    intermediates live changes.
    """
    objects, first, last, whole, barred = _uses(entries)
    sizes = _shareable(objects, first, whole, barred)
    # Lifetimes to memory: in order of first use, each takes a free host of its size, else hosts itself.
    starts: dict = {}
    for r in sizes:
        starts.setdefault(first[r], []).append(r)
    ends: dict = {}
    free: dict = {}  # nbytes -> ids of hosts free now
    host_of: dict = {}  # id(root) -> id of the root whose memory it takes
    for i in range(len(entries)):
        for r in starts.get(i, ()):
            pool = free.get(sizes[r])
            host_of[r] = pool.pop() if pool else r
            ends.setdefault(last[r], []).append(r)
        for r in ends.pop(i, ()):
            free.setdefault(sizes[r], []).append(host_of[r])
    moved = {r: (objects[h], 0) for r, h in host_of.items() if h != r}
    if not moved:
        return entries, 0
    return _rehomed(entries, objects, moved, ()), sum(sizes[r] for r in moved)


def _joined_in_place(entries: tuple) -> tuple[tuple, int]:
    """The recorded calls with each join written in place, and the bytes no longer copied a replay:
    (entries, bytes).

    A gradient bucket joins its gradients into one flat buffer (``np.concatenate``, of flat views or with
    ``axis=None``) for one Allreduce. Where
    every part is the whole of an array the step made for the join alone (only the record names it, its
    first use writes it whole, the join is its last use) and the flat buffer is first used by the join,
    the parts' arrays become views of their places in the flat buffer and the join goes: the step writes
    each gradient where the bucket reads it (PyTorch DDP's gradient_as_bucket_view, Megatron's grad
    buffer). The values each call computes are the capture's.
    """
    objects, first, last, whole, barred = _uses(entries)
    placed: dict = {}  # id(root) -> (the flat buffer, the byte offset its part starts at)
    hosts: set = set()  # ids of the flat buffers' roots: each keeps its own memory (a join of joins copies)
    dropped: set = set()
    saved = 0
    for i, (func, args, kwargs) in enumerate(entries):
        axis = kwargs.get("axis", 0)  # (None: the parts flattened, each in C order: its bytes as they lie)
        if func is not np.concatenate or len(args) != 1 or set(kwargs) - {"out", "axis"} \
                or axis not in (0, -1, None):
            continue
        flat, parts = kwargs.get("out"), args[0]
        if type(flat) is not _ndarray or flat.ndim != 1 or not flat.flags.c_contiguous \
                or first.get(id(_owner(flat))) != i or type(parts) not in (list, tuple) or len(parts) < 2:
            continue
        roots = [_owner(part) if type(part) is _ndarray else None for part in parts]
        keys = {id(root) for root in roots}
        if len(keys) != len(parts) or id(_owner(flat)) in keys or not all(
                root is not None and part.dtype == flat.dtype and (part.ndim == 1 or axis is None)
                and _whole(part, root)
                and id(root) not in barred and id(root) not in placed and id(root) not in hosts
                and whole.get(id(root))
                and first[id(root)] != i and last[id(root)] == i and root.flags.c_contiguous
                for part, root in zip(parts, roots)):
            continue
        at = 0
        for part, root in zip(parts, roots):
            placed[id(root)] = (flat, at)
            at += part.nbytes
        hosts.add(id(_owner(flat)))
        dropped.add(i)
        saved += flat.nbytes
    if not dropped:
        return entries, 0
    return _rehomed(entries, objects, placed, dropped), saved


def _uses(entries: tuple) -> tuple:
    """What `_share_memory` and `_joined_in_place` decide from: (objects, first, last, whole, barred).

    `objects`: id -> every array the record names, and the arrays their memory is a view of; `first`,
    `last`: id(root) -> the calls that use it first and last; `whole`: id(root) -> whether every use by its
    first call writes it whole; `barred`: ids of roots held by anything but the record (Python's reference
    count less the record's and its views'), whose memory stays their own.
    """
    objects: dict = {}
    counted: dict = {}  # id -> references from the record's containers
    first: dict = {}
    last: dict = {}
    whole: dict = {}
    barred: set = set()
    seen: set = set()  # ids of containers counted

    def use(x: Any, i: int, written: bool, count: bool) -> None:
        if type(x) is _ndarray:
            key = id(x)
            if count:
                counted[key] = counted.get(key, 0) + 1
            root = x
            while isinstance(root.base, _ndarray):
                objects.setdefault(id(root), root)
                root = root.base
            objects.setdefault(key, x)
            objects.setdefault(id(root), root)
            r = id(root)
            if r not in first:
                first[r], whole[r] = i, written and _whole(x, root)
            elif first[r] == i:
                whole[r] = whole[r] and written and _whole(x, root)
            last[r] = i
        elif type(x) in (tuple, list, dict):
            again = id(x) in seen
            seen.add(id(x))
            for v in (x.values() if type(x) is dict else x):
                use(v, i, written, count and not again)

    def walk() -> None:  # its own frame: no name of ours holds an array when the references are counted
        for i, (func, args, kwargs) in enumerate(entries):
            outs = _written_args(func, args, kwargs)
            owner = getattr(func, "__self__", None)
            if type(owner) is _ndarray:  # a bound method (ndarray.fill: it writes its array whole)
                fill = getattr(func, "__name__", "") == "fill"
                use(owner, i, fill, id(func) not in seen)
                seen.add(id(func))
                if not fill:
                    barred.add(id(_owner(owner)))
            for container in (args, kwargs):
                again = id(container) in seen
                seen.add(id(container))
                for k, v in (container.items() if type(container) is dict else enumerate(container)):
                    use(v, i, k in outs, not again)

    walk()
    del use, walk  # `use` names itself (a cycle): its cell emptied, no later count sees these arrays held twice
    # What else holds each array (Python's count less ours, the record's and its views'): anything, and its
    # memory stays its own.
    base = _refcounts({0: np.zeros(1)})[0]
    children = _children(objects)
    for key, n in _refcounts(objects).items():
        if n > base + counted.get(key, 0) + children.get(key, 0):
            barred.add(id(_owner(objects[key])))
    return objects, first, last, whole, barred


def _rehomed(entries: tuple, objects: dict, homes: dict, dropped: Any) -> tuple:
    """The recorded calls but those at `dropped` positions, each array whose root is in `homes` (id(root) ->
    (an array, a byte offset)) replaced by the same view at that offset of that array's memory."""
    new: dict = {}  # id(array) -> the same array in its new home
    for key, obj in objects.items():
        root = _owner(obj)
        home = homes.get(id(root))
        if home is not None and type(obj) is _ndarray:
            host, at = home
            memory = host.view(_ndarray).reshape(-1).view(np.uint8)
            offset = at + obj.__array_interface__["data"][0] - root.__array_interface__["data"][0]
            view = _ndarray(obj.shape, obj.dtype, buffer=memory, offset=offset, strides=obj.strides)
            if not obj.flags.writeable:
                view.flags.writeable = False
            new[key] = view
    remade: dict = {}

    def remake(x: Any) -> Any:
        if type(x) is _ndarray:
            return new.get(id(x), x)
        if type(x) in (tuple, list, dict):
            done = remade.get(id(x))
            if done is None:
                made = {k: remake(v) for k, v in x.items()} if type(x) is dict else type(x)(remake(v) for v in x)
                done = remade[id(x)] = (x, made)  # the old one kept: its id is not reused meanwhile
            return done[1]
        return x

    out = []
    for i, (func, args, kwargs) in enumerate(entries):
        if i in dropped:
            continue
        owner = getattr(func, "__self__", None)
        if type(owner) is _ndarray and id(owner) in new:
            func = getattr(new[id(owner)], func.__name__)
        out.append((func, remake(args), remake(kwargs)))
    del remake  # it names itself (a cycle holding `remade`): the old record goes now, not at a collection
    return tuple(out)


def _children(objects: dict) -> dict:
    """id -> how many of `objects` are views naming it as their base."""
    out: dict = {}
    for obj in objects.values():
        if isinstance(obj.base, _ndarray):
            out[id(obj.base)] = out.get(id(obj.base), 0) + 1
    return out


def _shareable(objects: dict, first: dict, whole: dict, barred: set) -> dict:
    """id(root) -> bytes, of the roots that may share memory: not barred, written whole by their first use,
    contiguous, writeable, of numbers (no Python objects), 16-byte aligned, at least _SHARED_MIN_BYTES,
    their views of plain strides."""
    sizes: dict = {}
    for r in first:
        root = objects[r]
        if r not in barred and whole[r] and root.flags.c_contiguous and root.flags.writeable \
                and not root.dtype.hasobject and root.nbytes >= _SHARED_MIN_BYTES \
                and not root.__array_interface__["data"][0] % 16:
            sizes[r] = root.nbytes
    for obj in objects.values():
        r = id(_owner(obj))
        if r in sizes and min(obj.strides, default=0) < 0:
            del sizes[r]
    return sizes


def _refcounts(objects: dict) -> dict:
    """id -> sys.getrefcount of each of `objects` (the same frame for the probe and the arrays)."""
    return {key: sys.getrefcount(obj) for key, obj in objects.items()}


#: Arrays smaller than this keep their own memory (sharing a few bytes saves nothing).
_SHARED_MIN_BYTES = 4096


def _whole(x: np.ndarray, root: np.ndarray) -> bool:
    """Whether writing `x` writes every byte of `root`."""
    return x is root or (x.nbytes == root.nbytes and x.flags.c_contiguous
                         and x.__array_interface__["data"][0] == root.__array_interface__["data"][0])


def _written_args(func: Callable, args: tuple, kwargs: dict) -> frozenset:
    """Which of a recorded call's arguments (positions, keyword names) it writes whole: its ``out``, the
    destination of a copy. A ufunc's ``where=`` or ``np.copyto``'s writes part: none then."""
    if "where" in kwargs and kwargs["where"] is not True:
        return frozenset()
    if func is _copy_into or func is _copy_all or func is _copy_dict or func is _take_into \
            or func is np.copyto:
        return frozenset({0})
    if getattr(func, "__name__", None) == "at" and type(getattr(func, "__self__", None)) is np.ufunc:
        return frozenset()
    return frozenset({"out"}) if "out" in kwargs else frozenset()


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


def _rebind(i: int, old: Any, new: Any) -> None:
    if new is old:
        return
    if isinstance(old, Scalar):
        if not isinstance(new, (Scalar, int, float, np.integer, np.floating)):
            raise ReplayError(f"replay: argument {i} was captured as {old!r} and is {new!r} now; a Scalar's place "
                              "takes a real number (an int or a float) or a Scalar")
        old.value = new.value if isinstance(new, Scalar) else new
        return
    block = getattr(old, "_local", old)
    if isinstance(block, _ndarray):
        src = getattr(new, "_local", new)
        if getattr(new, "layout", None) != getattr(old, "layout", None) or not isinstance(src, _ndarray) \
                or src.shape != block.shape or src.dtype != block.dtype:
            raise ReplayError(f"replay: argument {i} must match the captured one: "
                              f"{_describe(old)}, got {_describe(new)}")
        np.copyto(block, src)
        return
    if new != old:
        raise ReplayError(f"replay: argument {i} was {old!r} when captured and is {new!r} now; a value that "
                          "changes between steps must be a spmdsim.runtime.replay.Scalar (read by kernels)")


def _describe(x: Any) -> str:
    block = getattr(x, "_local", x)
    if isinstance(block, _ndarray):
        layout = getattr(x, "layout", None)
        return f"block {block.shape} {block.dtype}" + (f" under {layout}" if layout is not None else "")
    return repr(x)


def capture(func: Callable, *args: Any, state: Iterable[Any] = ()) -> Graph:
    """Run ``func(*args)`` once on this rank, recording it; returns the Graph that replays it.

    Collective when `func` is: every rank captures the same step. `args`: DTensors or arrays (static
    inputs: a replay copies its own into them), Scalars, or values that must not change. `state`:
    DTensors the step reads and updates in place (the parameters).
    """
    state = tuple(state)
    tape = _Tape()
    held = []
    for x in args + state:
        block = getattr(x, "_local", None)
        if type(block) is _ndarray:
            held.append((x, block))
            x._local = block.view(Traced)
    _begin(tape)
    try:
        result = func(*(a.view(Traced) if type(a) is _ndarray else a for a in args))
    finally:
        _end()
        for x, block in held:
            x._local = block
    _plain_results(result)
    for x in state:  # the parameters' gradients, set while capturing
        _plain_results(getattr(x, "grad", None))
    return Graph(func, tuple(args), result, tape)


def _plain_results(result: Any) -> None:
    """Results keep plain arrays (the same memory): outside a capture Traced is only slower."""
    if type(result) in (tuple, list):
        for r in result:
            _plain_results(r)
    elif type(getattr(result, "_local", None)) is Traced:
        result._local = result._local.view(_ndarray)
