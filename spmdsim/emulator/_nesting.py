"""A swap of something process-wide that nests: made when the first block enters, undone when the last
leaves, under one lock (simulations may start and end in several threads at once)."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator


class Nesting:
    """``with nesting(install, restore):`` calls `install()` on the first entry and `restore()` on the
    last exit of this object's blocks, however they nest or overlap."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0

    @contextlib.contextmanager
    def __call__(self, install: Callable[[], None], restore: Callable[[], None]) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                install()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    restore()
