"""An unmodified mpi4py program on N simulated ranks in this process: ``spmdsim mpirun -n 8 python script.py``.

    spmdsim mpirun -n 8 python script.py ARGS...
    spmdsim mpirun -n 4 python -m package.module ARGS...
    python -m spmdsim.sim.mpirun -n 8 script.py ARGS...

Every rank runs the script in its own thread with its own globals
(``__name__ == "__main__"``); inside it ``from mpi4py import MPI; MPI.COMM_WORLD``
is that rank's simulated world (spmdsim.sim.mpi4py_world). Modules the script
imports are loaded once and shared by the ranks, unlike separate MPI
processes. The exit code is the largest of the ranks' ``sys.exit`` codes; an
exception on a rank stops every rank and is printed with the rank that
raised it (exit 1). Nothing is printed besides the program's own output.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from typing import Optional, Sequence

__all__ = ["main", "add_arguments", "run"]

_PYTHONS = ("python", "python3")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "-np", "--np", dest="ranks", type=int, required=True, metavar="N",
                        help="number of simulated ranks")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="[python] script.py ARGS... or [python] -m module ARGS...")


def _target(command: Sequence[str]) -> tuple[str, str, list[str]]:
    """('path' | 'module', what, argv) of a command line; raises ValueError for one it cannot run."""
    words = list(command)
    if words and (os.path.basename(words[0]) in _PYTHONS or words[0] == sys.executable):
        words = words[1:]
    if not words:
        raise ValueError("no program given: expected `[python] script.py ARGS...` or `[python] -m module`")
    if words[0] == "-m":
        if len(words) < 2:
            raise ValueError("-m needs a module name")
        return "module", words[1], [words[1], *words[2:]]
    if words[0].startswith("-"):
        raise ValueError(f"python option {words[0]!r} is not supported; give a script or -m module")
    if not os.path.isfile(words[0]):
        raise ValueError(f"script {words[0]!r} does not exist")
    return "path", words[0], words


def _rank(kind: str, what: str) -> int:
    """Run the program on this simulated rank; return its exit code."""
    try:
        if kind == "module":
            runpy.run_module(what, run_name="__main__", alter_sys=False)
        else:
            with open(what, "rb") as f:
                code = compile(f.read(), what, "exec")
            # Its own globals, and sys.modules['__main__'] left alone: the ranks run at once.
            exec(code, {"__name__": "__main__", "__file__": what, "__builtins__": __builtins__,
                        "__spec__": None, "__package__": None, "__cached__": None})
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return int(code or 0)
        print(code, file=sys.stderr)
        return 1
    return 0


def run(n: int, command: Sequence[str]) -> int:
    """Run `command` (see _target) on `n` simulated ranks; return the exit code."""
    from .engine import ranks_text
    from .mpi4py_world import swapped
    from .run import MAX_RANKS, simulate

    if type(n) is not int or not 1 <= n <= MAX_RANKS:
        print(f"spmdsim mpirun: error: -n {n!r} must be a number of ranks from 1 to {MAX_RANKS}", file=sys.stderr)
        return 2
    try:
        kind, what, argv = _target(command)
    except ValueError as exc:
        print(f"spmdsim mpirun: error: {exc}", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv[:] = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(what)) if kind == "path" else os.getcwd())
    try:
        with swapped():
            codes = simulate(n, _rank, kind, what)
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as a shell tool does on SIGPIPE
        from .launch import _quiet_stdout

        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        print("spmdsim mpirun: interrupted (Ctrl-C): the simulated ranks were stopped", file=sys.stderr)
        return 130
    except BaseException as exc:  # noqa: BLE001 - reported as mpiexec reports a failed rank
        ranks = getattr(exc, "simulated_ranks", ())
        where = f"simulated {ranks_text(ranks)}" if ranks else "a simulated rank"
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        print(f"spmdsim mpirun: error on {where}: {type(exc).__name__}: {exc}\n{detail}", file=sys.stderr, end="")
        return 1
    finally:
        sys.argv[:], sys.path[:] = saved_argv, saved_path
    return max(codes)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spmdsim.sim.mpirun", description=__doc__.splitlines()[0])
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 2 and argv[0] in ("-n", "-np", "--np") and argv[2] == "-m":
        argv.insert(2, "python")  # argparse takes a leading -m for an option of its own
    args = parser.parse_args(argv)
    return run(args.ranks, args.command)


if __name__ == "__main__":
    sys.exit(main())
