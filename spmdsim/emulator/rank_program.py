"""A program as one simulated rank runs it (`run_program`): a script, a folder or zip file's __main__, ``-m module``
or ``-c program``, as ``python`` would run it, in the rank's own module __main__. spmdsim mpirun runs each rank's so
(spmdsim.emulator.mpirun), and so does each rank a Spawn starts (spmdsim.emulator.spawn).
"""
from __future__ import annotations

import os
import runpy
import shlex
import sys

from .mpirun_report import _NotRunnable
from .mpirun_target import _main_spec
from .rank_modules import rank_builtins, rank_main

__all__ = ["run_program"]


def run_program(kind: str, what: str) -> int:
    """Run the program on this simulated rank, as its own module __main__ (rank_modules.rank_main); return its
    exit code (a SystemExit's; a text one printed to stderr, code 1, as Python does). `kind`, `what`: as
    spmdsim.emulator.mpirun_target's `_target` gives them ('path', 'main', 'module' or 'code')."""
    module = rank_main()
    scope = module.__dict__
    try:
        if kind == "module":
            # what run_module runs, in our module; a module not found: one line naming the command, in Python's
            # words after it, and Python's exit status (1), which mpiexec passes on
            try:
                name, spec, code = runpy._get_module_details(what, _NotRunnable)
            except _NotRunnable as exc:
                raise _NotRunnable(f"python -m {shlex.quote(what)}: {exc}") from None
            scope.update(__name__="__main__", __file__=spec.origin, __cached__=spec.cached, __doc__=None,
                         __loader__=spec.loader, __package__=name.rpartition(".")[0], __spec__=spec,
                         __builtins__=rank_builtins())
        elif kind == "main":  # a folder or zip file: its __main__ module, as python sets it up
            spec = _main_spec(what)
            code = spec.loader.get_code("__main__")
            scope.update(__name__="__main__", __file__=spec.origin, __cached__=spec.cached, __doc__=None,
                         __loader__=spec.loader, __package__="", __spec__=spec, __builtins__=rank_builtins())
        else:
            if kind == "code":
                code, path = compile(what, "<string>", "exec"), None
            else:
                path = os.path.abspath(what)  # as `python script.py` sets __file__ (Python 3.9+)
                with open(path, "rb") as f:
                    code = compile(f.read(), path, "exec")
            scope.update({"__name__": "__main__", "__builtins__": rank_builtins(), "__spec__": None,
                          "__package__": None})
            if path is not None:
                scope.update(__file__=path, __cached__=None)
        exec(code, scope)
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return int(code or 0)
        print(code, file=sys.stderr)
        return 1
    return 0
