"""Names a package loads on first use: the one loader behind the lazy `__getattr__` of spmdsim's packages.

A package's ``_WHERE`` maps each public name to the module that defines it (a
module of the package, or an absolute ``spmdsim.`` one); importing the package
loads none of them, so that ``import spmdsim.runtime`` (or `nets`, `sim`)
stays light until a name is used. A name no table lists may be a module of the
package (`submodule`): ``spmdsim.runtime.debug`` after a bare ``import spmdsim``;
a package with no table gives its modules so with `modules_by_name`.

A name of a table that is also a module of the package keeps meaning the name:
Python binds a module on its package when it is first imported, which would put
the module in the name's place (``spmdsim.runtime.exchange``, the function, would
become the module once anything imported ``spmdsim.runtime.exchange`` or
``spmdsim.runtime.collectives``); a package made lazy here refuses that binding
(`_Package`), as spmdsim.nn.ops binds its functions over their modules' names.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Callable


def lazy(package: str, where: dict, namespace: dict) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """(``__getattr__``, ``__dir__``) for `package`: a name of `where` is imported from its module when
    first asked for, then kept in `namespace` (the package's ``globals()``). A name of `where` that is also a
    module of the package stays the name after that module's import (`_Package`)."""
    _TABLES[package] = where
    if type(sys.modules[package]) is types.ModuleType:
        sys.modules[package].__class__ = _Package

    def get(name: str) -> Any:
        module = where.get(name)
        if module is None:
            found = submodule(package, name)  # a module of the package, by its dotted name
            if found is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            return found
        path = module if module.startswith("spmdsim.") else f"{package}.{module}"
        value = getattr(importlib.import_module(path), name)
        namespace[name] = value
        return value

    def names() -> list:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return get, names


#: package -> its table (`lazy`'s `where`): the names that no module of the package may take the place of.
_TABLES: dict = {}


class _Package(types.ModuleType):
    """A package with a lazy table: the import system does not bind a module of the package over a name of
    the table (``import spmdsim.runtime.exchange`` leaves ``spmdsim.runtime.exchange`` the function; the
    module stays in ``sys.modules``, so ``from spmdsim.runtime.exchange import shifted`` works; as with
    ``spmdsim.nn.ops.matmul``, ``import spmdsim.runtime.exchange as m`` gives the name, not the module). Every
    other attribute is set as on any module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (isinstance(value, types.ModuleType) and name in _TABLES.get(self.__name__, ())
                and value.__name__ == f"{self.__name__}.{name}"):
            return
        super().__setattr__(name, value)


def submodule(package: str, name: str) -> Any:
    """The module `package`.`name` (imported now if need be), or None where the package has no such module.

    So ``spmdsim.nn.autograd.no_grad()`` works after a bare ``import spmdsim``, as the docs write it:
    a package's lazy ``__getattr__`` falls back to this for a name it does not list. Importing the
    package itself loads none of its modules. Dunder names (``__main__``, ``__wrapped__``) are
    never modules here: a tool's probe of one must not run ``python -m spmdsim``.
    """
    if name.startswith("__") or not name.isidentifier():
        return None
    path = f"{package}.{name}"
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as error:
        if error.name == path:
            return None
        raise


def modules_by_name(package: str) -> Callable[[str], Any]:
    """``__getattr__`` for a package with no other lazy names: its modules by name, loaded on first use
    (`submodule`), so ``spmdsim.programs.plan.summary.FOLD_RANKS`` works after a bare ``import spmdsim``."""
    def get(name: str) -> Any:
        found = submodule(package, name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return found

    return get


class _Numpy:
    """numpy, imported on first use: the modules that move a program's buffers (the thread engine, the
    emulator) are on every `spmdsim mpirun` start, and a program that never imports numpy (hello world)
    should not pay for it (about half of that start's CPU time).

    A module says ``np = numpy_on_first_use(globals())``; its first ``np.X`` imports numpy and rebinds
    ``np`` to numpy itself in every module that asked, so later calls cost what a plain import does.
    """

    __slots__ = ("_namespaces",)

    def __init__(self) -> None:
        self._namespaces: list = []

    def __getattr__(self, name: str) -> Any:
        import numpy

        for namespace in self._namespaces:
            if namespace.get("np") is self:
                namespace["np"] = numpy
        return getattr(numpy, name)

    def __repr__(self) -> str:
        return "<numpy, imported on first use>"


_NUMPY = _Numpy()


def numpy_on_first_use(namespace: dict) -> Any:
    """numpy if it is loaded, else the stand-in that loads it on first use (see `_Numpy`) and then puts numpy
    itself as ``np`` in `namespace` (a module's ``globals()``)."""
    import sys

    found = sys.modules.get("numpy")
    if found is not None and not getattr(getattr(found, "__spec__", None), "_initializing", False):
        return found
    _NUMPY._namespaces.append(namespace)
    return _NUMPY
