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

import threading
from typing import Any, Callable, Iterable, Optional

import numpy as np

from ..base import buffers
from .replay_memory import _joined_in_place, _share_memory
from .replay_program import _BINDERS, _call, _program
from .replay_tape import (_ACTIVE, _CAPTURE, ReplayError, _arrays, _copy_all, _copy_dict, _copy_into, _fresh, _inside,
                          _ndarray, _separate, _Tape, _tape, _tls)
from .traced import Traced, _raw_call, _traced

__all__ = ["ReplayError", "Scalar", "Graph", "capture", "kernel", "kernels", "capturing"]


#: The same list, for a hot path outside this module: ``CAPTURES[0] and capturing()`` asks no function while
#: nothing captures (runtime.door.point_to_point, a few calls per microbatch).
CAPTURES = _ACTIVE


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
    """A static input as a user wrote it: a DTensor's global shape, dtype and layout (its block on this rank
    beside), an array's shape and dtype."""
    block = getattr(x, "_local", x)
    if not isinstance(block, _ndarray):
        return repr(x)
    if getattr(x, "layout", None) is None:
        return f"array {block.shape} {block.dtype}"
    return f"global shape {tuple(x.global_shape)} {block.dtype} under {x.layout} (block {block.shape} on this rank)"


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
