"""What a dry run's rank holds (spmdsim.runtime.sim.dry): a `Meter` of the bytes it holds now and at most,
released as what held them is freed; and whether the dry run's caller was interrupted (Ctrl-C): the rank then
stops at its next step (`go_on`), as a simulated rank of a real run stops at its next wait."""
from __future__ import annotations

import weakref
from functools import partial
from typing import Any

import numpy as np

from .engine import Aborted

__all__ = ["Meter"]


class Meter:
    """The bytes the dry run's rank holds now and at most, and the per-rank bytes of its exchanges."""

    __slots__ = ("held", "peak", "_live", "_gone", "varied", "stands_for", "notes", "stopped",
                 "__weakref__")

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        # id(owner) -> (nbytes, a weak reference to the owner whose callback releases them when it is freed)
        self._live: dict[int, tuple[int, Any]] = {}
        self._gone = partial(_release, weakref.ref(self))  # the references' callback (a dead meter: nothing)
        # (bytes sent per rank, bytes received per rank) of every exchange run, as the step records say
        self.varied: list[tuple[Any, Any]] = []
        # Set by `differ`: the representative rank of every rank (ranks whose work differs by a mesh axis)
        self.stands_for: Any = None
        self.notes: list[str] = []  # lines the program adds to the report (`note`)
        self.stopped = False  # set by the caller once interrupted (spmdsim.runtime.sim.run._dry_run)

    def go_on(self) -> None:
        """Raise Aborted once the caller was interrupted: the dry run's thread ends at its next step (a
        collective, which holds its buffers here, a local product or kernel), not after the whole program."""
        if self.stopped:
            raise Aborted("the dry run's caller was interrupted")

    def hold(self, *arrays: Any) -> None:
        """Count these arrays' bytes as held until the memory they view is freed; update the peak."""
        if self.stopped:
            self.go_on()
        live = self._live
        for a in arrays:
            if type(a) is not np.ndarray or not a.nbytes:
                continue
            owner = a  # a view lives as long as the array it views (a reshape passed to MPI)
            while type(owner.base) is np.ndarray:
                owner = owner.base
            key = id(owner)
            if key not in live:
                # A weak reference with a callback, not weakref.finalize: a pipeline's dry run holds ~130,000
                # message buffers a step, and a finalizer costs 3x the reference (its registry, its atexit).
                ref = _Held(owner, self._gone)
                ref.key = key
                live[key] = (a.nbytes, ref)
                self.held += a.nbytes
        if self.held > self.peak:
            self.peak = self.held

    def count(self, owner: Any, nbytes: int) -> None:
        """Count `nbytes` as what `owner` holds (in place of what was counted for it before) until `owner`
        is freed; update the peak. For memory a dry run keeps no array of: an optimizer's states
        (spmdsim.nn.optim), worked out from the parameters' sizes."""
        self.go_on()
        key = id(owner)
        known = self._live.get(key)
        if known is not None:
            self.held -= known[0]
            ref = known[1]
        else:
            ref = _Held(owner, self._gone)
            ref.key = key
        self._live[key] = (nbytes, ref)
        self.held += nbytes
        if self.held > self.peak:
            self.peak = self.held


class _Held(weakref.ref):
    """A weak reference to what a Meter counts, knowing its `key` (the owner's id, which the callback pops),
    set after it is made: weakref.ref's own constructor, ~0.3 us, where an __init__ of ours took ~0.9 us."""

    __slots__ = ("key",)


def _release(meter_ref: Any, held: _Held) -> None:
    meter = meter_ref()
    if meter is not None:
        known = meter._live.pop(held.key, None)
        if known is not None:
            meter.held -= known[0]
