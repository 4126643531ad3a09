"""Names a package loads on first use: the one loader behind the lazy `__getattr__` of spmdsim's packages.

A package's ``_WHERE`` maps each public name to the module that defines it (a
module of the package, or an absolute ``spmdsim.`` one); importing the package
loads none of them, so that ``import spmdsim.runtime`` (or `nets`, `sim`)
stays light until a name is used.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy(package: str, where: dict, namespace: dict) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """(``__getattr__``, ``__dir__``) for `package`: a name of `where` is imported from its module when
    first asked for, then kept in `namespace` (the package's ``globals()``)."""
    def get(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        path = module if module.startswith("spmdsim.") else f"{package}.{module}"
        value = getattr(importlib.import_module(path), name)
        namespace[name] = value
        return value

    def names() -> list:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return get, names
