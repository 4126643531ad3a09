"""Each simulated rank's own module-level generators of `random` and `numpy.random`, as each MPI process has.

Under mpiexec ``random.seed(rank)`` or ``np.random.seed(rank)`` seeds the calling
process's generator; simulated ranks share one interpreter, so they would seed
and draw from one generator in turn (a Monte Carlo lab's counts came out
different from MPI's, and from run to run). While `own_generators()` is
active, the module-level functions (``random.random``, ``random.seed``,
``np.random.seed``, ``np.random.rand``, ...) act on the calling rank's own
generator, made on its first call and seeded from the OS as a new process's is;
threads that are no rank use the modules' own. Explicit generators
(``random.Random(seed)``, ``np.random.default_rng(seed)``) are the program's own anyway.
"""
from __future__ import annotations

import contextlib
import functools
import random
import threading
from typing import Any, Callable, Iterator

__all__ = ["own_generators"]

# numpy.random's module functions that are not bound methods of its global RandomState.
_NUMPY_ALIASES = {"seed": "seed", "ranf": "random_sample", "sample": "random_sample"}


@contextlib.contextmanager
def own_generators() -> Iterator[None]:
    """Within this block, each simulated rank draws from its own `random` and `numpy.random` generators."""
    import numpy as np
    from numpy.random import mtrand

    from ..sim.run import current_rank

    states: dict[int, tuple] = {}  # rank -> (random.Random, numpy.random.RandomState)
    lock = threading.Lock()

    def mine(kind: int) -> Any:
        rank = current_rank()
        if rank is None:
            return None
        pair = states.get(rank)
        if pair is None:
            with lock:
                pair = states.setdefault(rank, (random.Random(), np.random.RandomState()))
        return pair[kind]

    saved = []
    for name in random.__all__:
        fn = getattr(random, name)
        if getattr(fn, "__self__", None) is random._inst:
            saved.append((random, name, fn))
            setattr(random, name, _dispatch(fn, name, mine, 0))
    for name in mtrand.__all__:
        fn = getattr(np.random, name, None)
        method = name if getattr(fn, "__self__", None) is mtrand._rand else _NUMPY_ALIASES.get(name)
        if fn is not None and method is not None:
            saved.append((np.random, name, fn))
            setattr(np.random, name, _dispatch(fn, method, mine, 1))
    try:
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def _dispatch(fn: Callable, method: str, mine: Callable[[int], Any], kind: int) -> Callable:
    """`fn`, called on the calling rank's own generator (`mine(kind)`) where there is one."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        generator = mine(kind)
        return (fn if generator is None else getattr(generator, method))(*args, **kwargs)
    return call
