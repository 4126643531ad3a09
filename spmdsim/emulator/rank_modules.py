"""Each simulated rank's own copy of the program's own modules, as each MPI process imports its own.

A lab's helper module often reads its rank when imported (``mpi_utils.py``:
``comm = MPI.COMM_WORLD; rank = comm.Get_rank()``). Simulated ranks share one
interpreter, so the module would run once, in whichever rank imported it
first, and every rank would read that rank's number. While `own_modules(root)`
is active, a module not yet imported whose file lies under `root` (the
script's folder) is imported as a stand-in in ``sys.modules``; each rank that
reads from it gets its own copy, run in that rank's thread the first time it
does (threads that are no rank share one more copy). Objects of the module's
classes pickle by name, so a receiving rank gets instances of its own copy's
class, as under MPI. Modules imported before (spmdsim, numpy, site-packages)
are shared as they are, but for the packages of `PER_RANK_PACKAGES` (mpi4py.futures),
which each rank imports as its own; a script runpy runs as __main__ on a rank
(``python -m mpi4py.futures prog.py``) is that rank's own __main__ (`own_main`).
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import importlib.util
import os
import runpy
import sys
import sysconfig
import threading
import types
from typing import Any, Iterator, Optional

from ..base.context import simulated
from ..runtime.sim.run import current_rank

__all__ = ["own_modules", "own_main", "rank_main", "rank_builtins"]

#: Installed packages each rank imports its own copy of, as the program's own modules: mpi4py.futures keeps
#: its pool in module globals (``_core.SharedPool``), one per MPI process.
PER_RANK_PACKAGES = ("mpi4py.futures.", "mpi4py.futures")


class _RankModule(types.ModuleType):
    """The stand-in in sys.modules: attribute access goes to the calling rank's own copy.

    Each rank's copy runs where that rank first imports the module, as each MPI process runs it at its own
    import statement (its prints then, its errors raised there): the first importing rank's through the
    loader (`_Finder.exec_module`), every other rank's by the ``__import__`` its program and its modules'
    copies run with (`rank_builtins`); an import from elsewhere (``importlib.import_module``) runs it at the
    rank's first use of the module."""

    def __getattr__(self, name: str) -> Any:
        if name == "__all__":  # `from module import *`: the copy's names, as its own __dict__ would give
            copy = _copy(self)
            return getattr(copy, "__all__", [n for n in vars(copy) if not n.startswith("_")])
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(_copy(self), name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The import system's own attributes, and submodules, stay on the stand-in (every rank's).
        if (name.startswith("__") and name.endswith("__")) or isinstance(value, _RankModule):
            super().__setattr__(name, value)
        else:
            setattr(_copy(self), name, value)

    def __dir__(self) -> list:
        return dir(_copy(self))


def _copy(standin: _RankModule) -> types.ModuleType:
    """The calling rank's copy of `standin`'s module, made and run on first use."""
    state = object.__getattribute__(standin, "__dict__")
    copies = state["__spmdsim_copies__"]
    rank = current_rank()
    module = copies.get(rank)
    if module is None:
        with state["__spmdsim_lock__"]:  # briefly: each rank's own lock, so that ranks run their copies at once
            lock = state["__spmdsim_locks__"].setdefault(rank, threading.RLock())
        with lock:  # one copy per rank, even if its threads race (threads a rank starts are the rank's)
            module = copies.get(rank)
            if module is None:
                spec = _home_spec(state["__spmdsim_spec__"].name) or state["__spmdsim_spec__"]
                module = importlib.util.module_from_spec(spec)
                module.__dict__["__builtins__"] = rank_builtins()  # its own import statements as the program's
                copies[rank] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del copies[rank]
                    raise
                if spec.name == "mpi4py.futures._core":
                    module.import_main = _import_main
    return module


def _import_main(mod_name: Any, mod_path: Any, init_globals: Any, run_name: str) -> None:
    """mpi4py.futures' worker's import of the pool's main script or module (`run_name` "__worker__", so its
    ``if __name__ == "__main__"`` block does not run), as the rank's own __main__: mpi4py's own sets
    sys.modules["__main__"], every rank's, where a rank's pickles of the script's functions then found another
    rank's (`own_main`)."""
    module = types.ModuleType(run_name)
    module.__dict__.update(init_globals or {}, __name__=run_name, __builtins__=rank_builtins())
    standin = sys.modules.get("__main__")
    if isinstance(standin, _RankMain):
        object.__getattribute__(standin, "__dict__")["__spmdsim_mains__"][current_rank()] = module
    if mod_name:
        module.__dict__.update(runpy.run_module(mod_name, dict(module.__dict__), run_name))
    elif mod_path:
        module.__file__ = mod_path
        with open(mod_path, "rb") as f:
            exec(compile(f.read(), mod_path, "exec"), module.__dict__)


class _Finder:
    """Finds the program's own modules (under `root`) and loads each as a `_RankModule` stand-in (a meta path
    finder and loader as the import system calls them; importlib.abc's base classes would load
    importlib.resources on every `spmdsim mpirun` start)."""

    def __init__(self, root: str, shared: frozenset) -> None:
        self._root = os.path.abspath(root) + os.sep
        self._shared = shared  # top-level names imported before: never copied
        self._skip = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()[k] for k in
                                                                 ("purelib", "platlib", "stdlib")})
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[Any]:
        own = fullname.startswith(PER_RANK_PACKAGES)
        if not own and fullname.partition(".")[0] in self._shared or getattr(self._busy, "on", False):
            return None
        home = _home_spec(fullname) if path is None else None  # a spawned rank's own module beside its program
        self._busy.on = True  # the other finders answer where the module is
        try:
            spec = home or (importlib.util.find_spec(fullname) if path is None else _find(fullname, path))
        except (ImportError, ValueError):
            return None
        finally:
            self._busy.on = False
        origin = getattr(spec, "origin", None)
        if spec is None or not origin or not origin.endswith(".py") or spec.loader is None:
            return None
        if not own and not home and (not origin.startswith(self._root) or origin.startswith(self._skip)):
            return None
        standin = importlib.util.spec_from_loader(fullname, self, origin=origin,
                                                  is_package=spec.submodule_search_locations is not None)
        if spec.submodule_search_locations is not None:
            standin.submodule_search_locations = list(spec.submodule_search_locations)
        standin.has_location = True
        standin.loader_state = spec
        return standin

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _RankModule(spec.name)
        state = object.__getattribute__(module, "__dict__")
        state.update(__spmdsim_copies__={}, __spmdsim_lock__=threading.Lock(), __spmdsim_locks__={},
                     __spmdsim_spec__=spec.loader_state)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Run the importing rank's copy now (its error raised at its import statement, as Python raises it;
        the import system then takes the stand-in out of sys.modules, and the next rank's import loads
        again); the other ranks' copies run at their own imports (`rank_builtins`)."""
        _copy(module)

    def _real(self, fullname: str) -> Any:
        standin = self.find_spec(fullname)
        if standin is None:
            raise ImportError(f"no module named {fullname!r} under {self._root}", name=fullname)
        return standin.loader_state

    def get_code(self, fullname: str) -> Any:
        """The module's code, as runpy asks a loader for it (``spmdsim mpirun ... -m pkg.main``: the module
        runs as the rank's __main__, and the package it imports is each rank's own)."""
        return self._real(fullname).loader.get_code(fullname)

    def is_package(self, fullname: str) -> bool:
        return self._real(fullname).submodule_search_locations is not None


@functools.cache
def rank_builtins() -> dict:
    """The builtins a rank's program and its own modules' copies run with: Python's, but for an ``__import__``
    that runs the importing rank's copy of each of the program's own modules the statement names, there, as
    the statement runs in an MPI process (`_importing`). The program's import statements alone pay for it;
    numpy's, mpi4py's and spmdsim's run Python's own."""
    return _Builtins(__import__=_importing, open=_open)


class _Builtins(dict):
    """A program's builtins: ``__import__`` its own (`_importing`), every other name read from the builtins module
    when asked (a program that sets ``builtins.print`` sees its own print, as it would)."""

    # The builtins module's own dict lookup, in C: every builtin a program names (len, range, print) is
    # looked up here, and a Python method with an import statement made each such lookup ~15x slower. A
    # name it lacks raises KeyError, which the interpreter reports as Python does (NameError).
    __missing__ = staticmethod(builtins.__dict__.__getitem__)


def _open(*args: Any, **kwargs: Any) -> Any:
    """The builtins module's ``open`` as it is when called (a program's mock of it too). C code reads "open" from
    its caller's builtins with a plain dict lookup, which `_Builtins.__missing__` does not answer: numpy's
    ``tofile`` and ``fromfile`` of a path failed with "SystemError: ... returned NULL without setting an
    exception"."""
    return builtins.open(*args, **kwargs)


_IMPORT = __import__


def _importing(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    """``__import__`` for a rank's program (`rank_builtins`): Python's, then the calling rank's copy of every own
    module the statement names (``import a.b`` names a and a.b; ``from a import b``, a and a.b if b is a
    module) is run now if it was not (an error it raises, raised here): a rank importing while another rank
    loaded the module found it loaded, and its copy waited for its first use."""
    module = _IMPORT(name, globals, locals, fromlist, level)
    full = name
    if level:
        package = (globals or {}).get("__package__") or ""
        try:
            full = importlib.util.resolve_name("." * level + name, package)
        except (ImportError, ValueError):
            return module
    names = [full[:i] for i, c in enumerate(full + ".") if c == "."] if full else []
    names += [f"{full}.{item}" for item in fromlist or () if item != "*"]
    for found in names:
        standin = sys.modules.get(found)
        if isinstance(standin, _RankModule):
            _copy(standin)
    return module


def _home_spec(name: str) -> Optional[Any]:
    """The spec of top-level module `name` in the calling rank's own folder (RankContext.home: a spawned program's,
    which its python would put first on sys.path), or None: none there, or no such folder."""
    state = simulated()
    home = None if state is None or "." in name else state.home
    spec = None if home is None else _find(name, [home])
    return spec if spec is not None and str(spec.origin or "").endswith(".py") else None


def _find(fullname: str, path: Any) -> Optional[Any]:
    """The spec the path-based finder gives a submodule `fullname` in `path`."""
    from importlib.machinery import PathFinder

    return PathFinder.find_spec(fullname, path)


@contextlib.contextmanager
def own_modules(root: str, active: bool = True) -> Iterator[None]:
    """Within this block, the modules under `root` imported from now on are each rank's own (see above);
    without `active`, nothing changes."""
    if not active:
        yield
        return
    finder = _Finder(root, frozenset(name.partition(".")[0] for name in list(sys.modules)))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name, module in list(sys.modules.items()):
            if isinstance(module, _RankModule):
                del sys.modules[name]


class _RankMain(types.ModuleType):
    """sys.modules['__main__'] while the ranks run: the calling rank's own script module (`rank_main`);
    threads that are no rank see the process's own __main__."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_main_of(self), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(_main_of(self), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(_main_of(self), name)

    def __dir__(self) -> list:
        return dir(_main_of(self))


def _main_of(standin: _RankMain) -> types.ModuleType:
    state = object.__getattribute__(standin, "__dict__")
    return state["__spmdsim_mains__"].get(current_rank(), state["__spmdsim_process_main__"])


@contextlib.contextmanager
def own_main() -> Iterator[None]:
    """Within this block sys.modules['__main__'] is each rank's own script module (made by `rank_main`),
    as each MPI process runs the script as __main__: ``unittest.main()`` finds the script's tests, and
    objects of classes the script defines pickle by name (a receiving rank gets its own class's)."""
    before = sys.modules.get("__main__")
    standin = _RankMain("__main__")
    state = object.__getattribute__(standin, "__dict__")
    state.update(__spmdsim_mains__={}, __spmdsim_process_main__=before)
    sys.modules["__main__"] = standin
    runpy_own, runpy._TempModule = runpy._TempModule, _RankTempModule
    try:
        yield
    finally:
        runpy._TempModule = runpy_own
        if sys.modules.get("__main__") is standin:
            sys.modules["__main__"] = before


class _RankTempModule(runpy._TempModule):
    """runpy's module of a script it runs as __main__ (``runpy.run_path(path, run_name="__main__")``, as
    mpi4py's runner under ``python -m mpi4py.futures script.py`` calls it): on a rank, within `own_main`,
    the rank's own __main__ while it runs, not every rank's (sys.modules's)."""

    def __enter__(self) -> Any:
        standin, rank = sys.modules.get("__main__"), current_rank()
        if self.mod_name != "__main__" or rank is None or not isinstance(standin, _RankMain):
            return super().__enter__()
        mains = object.__getattribute__(standin, "__dict__")["__spmdsim_mains__"]
        self._saved_module = [(mains, rank, mains.get(rank))]
        mains[rank] = self.module
        return self

    def __exit__(self, *args: Any) -> None:
        if not self._saved_module or type(self._saved_module[0]) is not tuple:
            return super().__exit__(*args)
        mains, rank, before = self._saved_module.pop()
        if before is None:
            mains.pop(rank, None)
        else:
            mains[rank] = before


def rank_main() -> types.ModuleType:
    """A new module named __main__ for the calling rank's program, what sys.modules['__main__'] gives that
    rank inside `own_main()` (its globals are the module's __dict__)."""
    module = types.ModuleType("__main__")
    standin = sys.modules.get("__main__")
    if isinstance(standin, _RankMain):
        object.__getattribute__(standin, "__dict__")["__spmdsim_mains__"][current_rank()] = module
    return module
