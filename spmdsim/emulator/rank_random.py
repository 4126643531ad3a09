"""Each simulated rank's own module-level generators of `random` and `numpy.random`, as each MPI process has.

Under mpiexec ``random.seed(rank)`` or ``np.random.seed(rank)`` seeds the calling
process's generator; simulated ranks share one interpreter, so they would seed
and draw from one generator in turn (a Monte Carlo lab's counts came out
different from MPI's, and from run to run). While `own_generators()` is
active, the module-level functions (``random.random``, ``random.seed``,
``np.random.seed``, ``np.random.rand``, ...) act on the calling rank's own
generator (a rank of `spmdsim mpirun` or of a `spmdsim lab` check, which
`adopt`s them when it starts), seeded from the OS as a new process's is; every
other thread (no rank, or a rank of a plain `spmdsim.simulate` beside it) uses
the modules' own. This is the one place spmdsim swaps numpy's or random's
functions, and only for `spmdsim mpirun` and `spmdsim lab` (users' unmodified
mpi4py code): spmdsim's own runs touch neither (tests/test_sim_state.py). Explicit generators
(``random.Random(seed)``, ``np.random.default_rng(seed)``) are the program's own anyway.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import random
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

from ..base import context
from ..base.context import _THREAD  # the running thread's context (context.simulated's read, without its call)

__all__ = ["own_generators", "adopt"]

# numpy.random's module functions that are not bound methods of its global RandomState.
_NUMPY_ALIASES = {"seed": "seed", "ranf": "random_sample", "sample": "random_sample"}


_LOCK = threading.Lock()
_ACTIVE: list = []  # how many own_generators() blocks are open (the functions are swapped while any is)
_SAVED: list = []  # (module, name, function) swapped out
_HOOK: list = []  # the finder that swaps numpy.random's functions when it loads, while it is not loaded
#: Each adopting rank's [random.Random, numpy.random.RandomState (made on first use)], by its RankContext:
#: gone with the rank.
_OWN: "weakref.WeakKeyDictionary[Any, list]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def own_generators() -> Iterator[None]:
    """Within this block, each simulated rank that called `adopt` draws from its own `random` and
    `numpy.random` generators; every other thread (a rank of another simulation running beside it, or no
    rank) from the modules' own, as before. Blocks may nest and overlap (two `spmdsim mpirun`s in one
    process): the module functions are swapped while any block is open and restored when the last closes.
    numpy.random's are swapped when it loads, if it is not loaded yet: a program without numpy loads none."""
    with _LOCK:
        if not _ACTIVE:
            _swap()
        _ACTIVE.append(True)
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE.pop()
            if not _ACTIVE:
                if _HOOK:
                    sys.meta_path.remove(_HOOK.pop())
                for module, name, fn in _SAVED:
                    setattr(module, name, fn)
                _SAVED.clear()


def adopt() -> None:
    """The running simulated rank gets its own generators, made now (numpy's when it first draws) and seeded
    from the OS as a new process's are (a rank of `spmdsim mpirun`: it runs a program that expects a process
    of its own)."""
    state = context.simulated()
    if state is not None:
        with _LOCK:
            _OWN.setdefault(state, [random.Random(), None])


def _mine(kind: int) -> Any:
    state = context.simulated()
    pair = None if state is None else _OWN.get(state)
    if pair is None:
        return None
    if pair[kind] is None:  # numpy's, on the rank's first draw
        from numpy.random import RandomState

        with _LOCK:
            if pair[kind] is None:
                pair[kind] = RandomState()
    return pair[kind]


def _swap() -> None:
    for name in random.__all__:
        fn = getattr(random, name)
        if getattr(fn, "__self__", None) is random._inst:
            _SAVED.append((random, name, fn))
            setattr(random, name, _dispatch(fn, name, _mine, 0))
    loaded = sys.modules.get("numpy.random")
    if loaded is not None and not getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        _swap_numpy(loaded)
    else:
        _HOOK.append(_WhenNumpyRandomLoads())
        sys.meta_path.insert(0, _HOOK[0])


def _swap_numpy(module: Any) -> None:
    """Swap the module functions of `module` (numpy.random) for the calling rank's own generator's."""
    from numpy.random import mtrand

    for name in mtrand.__all__:
        fn = getattr(module, name, None)
        method = name if getattr(fn, "__self__", None) is mtrand._rand else _NUMPY_ALIASES.get(name)
        if fn is not None and method is not None:
            _SAVED.append((module, name, fn))
            setattr(module, name, _dispatch(fn, method, _mine, 1))


class _WhenNumpyRandomLoads:
    """Finds numpy.random as the path finder does, with a loader that swaps its functions once it has run
    (if the `own_generators` block that put this finder in sys.meta_path is still open)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "numpy.random":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            with _LOCK:
                if self in _HOOK:
                    _swap_numpy(module)
                    sys.meta_path.remove(self)
                    _HOOK.remove(self)

        spec.loader.exec_module = exec_module
        return spec


#: Each thread's (its rank's context, {(kind, method): that rank's bound method, or None: the module's}): a
#: call looks its method up here, not through the weak dictionary (a random.random() cost 0.9 us, 12x Python's).
_FAST = threading.local()


def _dispatch(fn: Callable, method: str, mine: Callable[[int], Any], kind: int) -> Callable:
    """`fn`, called on the calling rank's own generator (`mine(kind)`) where there is one."""
    key = (kind, method)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        state = _THREAD.context
        cached = getattr(_FAST, "cached", None)
        if cached is None or cached[0] is not state:  # (a thread's first call, or another rank's context)
            cached = _FAST.cached = (state, {})
        bound = cached[1].get(key, fn)
        if bound is fn:
            generator = mine(kind)
            bound = cached[1][key] = None if generator is None else getattr(generator, method)
        return (fn if bound is None else bound)(*args, **kwargs)
    return call
