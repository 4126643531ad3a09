"""What `spmdsim mpirun`'s command line asks it to run (spmdsim.emulator.mpirun runs it): ``python script.py``,
a folder or zip file's __main__, ``-m module``, ``-c program``, mpi4py's runner ``python -m mpi4py ...``; each
refused in one line where python itself would refuse it before running a line (a script it cannot decode); and
the run's -n and --eager-limit, and a run that mpiexec started several times (`_refused`).
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Sequence

from ..base.source import SourceDecodeError, decode_source
from ..errors import fold_message
from ..runtime.sim.run import MAX_RANKS
from .mpirun_report import _NotRunnable, under_mpiexec

__all__ = ["_target", "_main_spec", "_refused"]

#: A Python interpreter's name as a command line gives it: python, python3, python3.12 (or a path to one).
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
#: Python's options that change nothing a simulated rank runs: -u (unbuffered output, which `mpiexec -n 4 python
#: -u` users give for prompt output: a rank's print reaches the output at once here anyway, rank_streams) and -B
#: (no bytecode written).
_PYTHON_FLAGS = ("-u", "-B")


def _target(command: Sequence[str]) -> tuple[str, str, list[str]]:
    """('path' | 'main' | 'module' | 'code', what, argv) of a command line; raises ValueError for one it
    cannot run. 'main': a folder or zip file, whose __main__ module runs (`_main_spec`), as python runs it.

    ``python -m mpi4py script.py`` (mpi4py's runner, which aborts the job when a rank
    raises) runs the script itself: the simulated ranks stop on an error anyway.
    """
    words = list(command)
    if words[:1] == ["--"]:  # `spmdsim mpirun -n 4 -- python ...`, as `spmdsim launch` takes its command
        words = words[1:]
    if words and (_PYTHON.fullmatch(os.path.basename(words[0])) or words[0] == sys.executable):
        words = words[1:]
        while words and words[0] in _PYTHON_FLAGS:
            words = words[1:]
    if words[:2] in (["-m", "mpi4py"], ["-m", "mpi4py.run"]):
        words = _mpi4py_run(words[2:])
    if not words:
        raise ValueError("no program given: expected `[python] script.py ARGS...` or `[python] -m module`")
    if words[0] in ("-m", "-c"):
        if len(words) < 2:
            raise ValueError(f"{words[0]} needs a {'module name' if words[0] == '-m' else 'program'}")
        if words[0] == "-c":  # python -c CMD ARGS: sys.argv is ['-c', ARGS...]
            return "code", words[1], ["-c", *words[2:]]
        return "module", words[1], [words[1], *words[2:]]
    if words[0].startswith("-"):
        raise ValueError(f"python option {words[0]!r} is not supported (the simulated ranks run in this interpreter, "
                         f"as it was started; {' and '.join(_PYTHON_FLAGS)} are taken); give a script, -m module or "
                         "-c program")
    if os.path.isdir(words[0]) or (os.path.isfile(words[0]) and _main_spec(words[0], must=False) is not None):
        _main_spec(words[0])  # refused here, once, where it has none
        return "main", words[0], words
    if not os.path.isfile(words[0]):
        raise ValueError(f"script {words[0]!r} does not exist" + _meant(words))
    _check_decodes(words[0])
    return "path", words[0], words


def _meant(words: list) -> str:
    """What a missing script's command line most likely meant: a launcher's command pasted after `mpirun -n N`
    (`mpiexec -n 4 python prog.py`), or a script named without its `.py`; else ""."""
    if os.path.basename(words[0]) in ("mpiexec", "mpirun", "srun", "mpiexec.hydra"):
        rest, n = words[1:], "N"
        while rest and rest[0].startswith("-"):  # the launcher's options: its -n N taken as the count meant
            if rest[0] in ("-n", "-np", "--np", "--ntasks") and len(rest) > 1:
                n, rest = rest[1], rest[1:]
            rest = rest[1:]
        return (f": spmdsim mpirun takes the command {words[0]} runs, not {words[0]} itself: spmdsim mpirun -n {n} "
                f"{' '.join(rest)}")
    if os.path.isfile(words[0] + ".py"):
        return f" (the file is {words[0] + '.py'!r})"
    return ""


def _main_spec(path: str, must: bool = True) -> Any:
    """The spec of the __main__ module of folder or zip file `path` (what ``python path`` runs, through the
    importer sys.path[0] gets: a FileFinder or a zipimporter). None for a plain file (not a zip); where a folder
    or zip has no __main__, without `must` None, else _NotRunnable in Python's words."""
    import zipimport  # frozen in the interpreter: no file read to load it

    path = os.path.abspath(path)
    if os.path.isdir(path):
        from importlib.machinery import FileFinder, SOURCE_SUFFIXES, SourceFileLoader

        importer: Any = FileFinder(path, (SourceFileLoader, SOURCE_SUFFIXES))
    else:
        try:
            importer = zipimport.zipimporter(path)
        except zipimport.ZipImportError:
            return None
    spec = importer.find_spec("__main__")
    if spec is None and must:
        raise _NotRunnable(f"can't find '__main__' module in {path!r}")
    return spec


def _mpi4py_run(words: list[str]) -> list[str]:
    """The command `python -m mpi4py [-rc ...] ...` runs, without mpi4py's options: its -rc
    settings configure MPI's initialization, which simulated ranks do not do."""
    while words and words[0].startswith("-") and words[0] not in ("-m", "-c"):
        if words[0] in ("-rc", "--rc") and len(words) > 1:
            words = words[2:]
        elif words[0].startswith("--rc="):
            words = words[1:]
        elif words[0] == "-":
            raise ValueError("python -m mpi4py - (the program from stdin) is not supported: "
                             "every simulated rank would read it; give a script")
        else:
            raise ValueError(f"mpi4py option {words[0]!r} is not supported under spmdsim mpirun; "
                             f"give a script, -m module or -c program")
    return words


def _check_decodes(path: str) -> None:
    """_NotRunnable in Python's words where ``python path`` refuses the script's bytes (PEP 263: UTF-8 unless its
    first two lines declare another coding). compile() of the bytes, which runs the ranks' copies, takes a
    non-UTF-8 byte in a comment; python refuses the script (an import or ``-m`` of the same file runs)."""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError:
        return  # (opening it again on the ranks says why, as python would)
    try:
        decode_source(source)
    except SourceDecodeError as exc:
        where = f"in file {os.path.abspath(path)}"
        if exc.declaration:
            raise _NotRunnable(f"{exc.declaration} {where}") from None
        byte, where = f"'\\x{exc.byte:02x}'", f"{where} on line {exc.line}"
        raise _NotRunnable(f"Non-UTF-8 code starting with {byte} {where}, but no encoding declared; see "
                           "https://peps.python.org/pep-0263/ for details" if exc.coding == "utf-8" else
                           f"'{exc.coding}' codec can't decode byte {byte} {where}") from None


def _refused(n: Any, command: Sequence[str], eager_limit: Any) -> int:
    """0 when `spmdsim mpirun -n N [--eager-limit B] COMMAND` may run, else 2, the reason said in one line:
    mpiexec started this process among several (each would run every simulated rank: rank 0 says it, first), -n
    missing or out of range, a negative --eager-limit."""
    if under_mpiexec():
        return 2
    if n is None:  # mpiexec's own place for it: `mpiexec ring.py -n 4` runs ring.py with the argument -n 4
        late = next((a for a in command if a.split("=")[0] in ("-n", "-np", "--np")), None)
        print(fold_message("spmdsim mpirun: error: "
                           + (f"{late.split('=')[0]} N goes before the program, not after it (there it is "
              "the program's own argument): spmdsim mpirun -n 4 python prog.py" if late else
              "-n N is missing: the number of simulated ranks, as in spmdsim mpirun -n 4 python prog.py")),
              file=sys.stderr)
        return 2
    if type(n) is not int or not 1 <= n <= MAX_RANKS:
        print(f"spmdsim mpirun: error: -n {n!r} must be a number of ranks from 1 to {MAX_RANKS}", file=sys.stderr)
        return 2
    if eager_limit is not None and eager_limit < 0:
        print(f"spmdsim mpirun: error: --eager-limit {eager_limit} must be a number of bytes, 0 or more",
              file=sys.stderr)
        return 2
    return 0
