"""Helpers shared by test modules (pure and MPI; tests/ is on the path, setup.cfg)."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from types import ModuleType

__all__ = ["MPIEXEC", "factorizations", "load_script"]

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


def load_script(path: str | os.PathLike, name: str) -> ModuleType:
    """Import a file that is not in a package (scripts/, a test module) as module `name`.

    Registered in sys.modules first: dataclasses look their module up there.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
