"""Helpers shared by test modules (pure and MPI; tests/ is on the path, setup.cfg)."""
from __future__ import annotations

import os
import shutil
import sys

__all__ = ["MPIEXEC", "factorizations"]

# The venv's mpiexec (the pip `mpich` wheel) first, else the one on PATH, else "".
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
if not os.access(MPIEXEC, os.X_OK):
    MPIEXEC = shutil.which("mpiexec") or ""


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way to write n as a product of `parts` positive integers."""
    if parts == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0
            for rest in factorizations(n // d, parts - 1)]
