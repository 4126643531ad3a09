"""Each simulated rank's own module-level generators of `random` and `numpy.random`, as each MPI process has.

Under mpiexec ``random.seed(rank)`` or ``np.random.seed(rank)`` seeds the calling
process's generator; simulated ranks share one interpreter, so they would seed
and draw from one generator in turn (a Monte Carlo lab's counts came out
different from MPI's, and from run to run). While `own_generators()` is
active, the module-level functions (``random.random``, ``random.seed``,
``np.random.seed``, ``np.random.rand``, ...) act on the calling rank's own
generator (a rank of `spmdsim mpirun`, which `adopt`s them when it starts),
seeded from the OS as a new process's is; every other thread (no rank, or a
rank of a plain `spmdsim.simulate` beside it) uses the modules' own. This is
the one place spmdsim swaps numpy's or random's functions, and only for
`spmdsim mpirun` (users' unmodified mpi4py programs): spmdsim's own runs
touch neither (tests/test_sim_state.py). Explicit generators
(``random.Random(seed)``, ``np.random.default_rng(seed)``) are the program's own anyway.
"""
from __future__ import annotations

import contextlib
import functools
import random
import threading
import weakref
from typing import Any, Callable, Iterator

__all__ = ["own_generators", "adopt"]

# numpy.random's module functions that are not bound methods of its global RandomState.
_NUMPY_ALIASES = {"seed": "seed", "ranf": "random_sample", "sample": "random_sample"}


_LOCK = threading.Lock()
_ACTIVE: list = []  # how many own_generators() blocks are open (the functions are swapped while any is)
_SAVED: list = []  # (module, name, function) swapped out
#: Each adopting rank's (random.Random, numpy.random.RandomState), by its RankContext: gone with the rank.
_OWN: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def own_generators() -> Iterator[None]:
    """Within this block, each simulated rank that called `adopt` draws from its own `random` and
    `numpy.random` generators; every other thread (a rank of another simulation running beside it, or no
    rank) from the modules' own, as before. Blocks may nest and overlap (two `spmdsim mpirun`s in one
    process): the module functions are swapped while any block is open and restored when the last closes."""
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
                for module, name, fn in _SAVED:
                    setattr(module, name, fn)
                _SAVED.clear()


def adopt() -> None:
    """The running simulated rank gets its own generators, made now and seeded from the OS as a new
    process's are (a rank of `spmdsim mpirun`: it runs a program that expects a process of its own)."""
    import numpy as np

    from .. import context

    state = context.simulated()
    if state is not None:
        with _LOCK:
            _OWN.setdefault(state, (random.Random(), np.random.RandomState()))


def _mine(kind: int) -> Any:
    from .. import context

    state = context.simulated()
    pair = None if state is None else _OWN.get(state)
    return None if pair is None else pair[kind]


def _swap() -> None:
    import numpy as np
    from numpy.random import mtrand

    for name in random.__all__:
        fn = getattr(random, name)
        if getattr(fn, "__self__", None) is random._inst:
            _SAVED.append((random, name, fn))
            setattr(random, name, _dispatch(fn, name, _mine, 0))
    for name in mtrand.__all__:
        fn = getattr(np.random, name, None)
        method = name if getattr(fn, "__self__", None) is mtrand._rand else _NUMPY_ALIASES.get(name)
        if fn is not None and method is not None:
            _SAVED.append((np.random, name, fn))
            setattr(np.random, name, _dispatch(fn, method, _mine, 1))


def _dispatch(fn: Callable, method: str, mine: Callable[[int], Any], kind: int) -> Callable:
    """`fn`, called on the calling rank's own generator (`mine(kind)`) where there is one."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        generator = mine(kind)
        return (fn if generator is None else getattr(generator, method))(*args, **kwargs)
    return call
