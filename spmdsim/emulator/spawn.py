"""Dynamic processes on simulated ranks: ``Intracomm.Spawn`` and ``Spawn_multiple`` (docs/reference/emulator.md).

    child = MPI.COMM_SELF.Spawn(sys.executable, args=["worker.py"], maxprocs=4)   # the parents
    parent = MPI.Comm.Get_parent()                                               # in worker.py

A Spawn is collective over the parents' communicator; the root's command, arguments and maxprocs count (the
others' are ignored, as MPI ignores them). The command is a Python program: ``sys.executable`` (or a python on the
PATH) with a script, ``-m module`` or ``-c code``, as spmdsim mpirun takes it (spmdsim.emulator.mpirun_target), or
a Python script itself (``.py``, or a ``#!`` line naming python). Its maxprocs ranks are new simulated ranks of the
same run (spmdsim.runtime.sim.rank_runs), threads of this process numbered after the ranks before them, each
running the program as its own ``__main__`` (spmdsim.emulator.rank_program) with ``sys.argv`` as the command line
gives it and a ``MPI.COMM_WORLD`` of their own. The parents get an intercommunicator whose remote group is the
children; each child's ``MPI.Comm.Get_parent()`` is the same intercommunicator seen from the other side (the
parents the remote group), until its Disconnect or Free. A child that raises, exits or deadlocks is reported as
any rank is, and the run ends once the parents and the children have all ended.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from typing import Any, Callable, Optional

from ..base import context as _local
from ..runtime.sim._mpi import mpi_module, special, named_error as _error
from ..runtime.sim.groups import Group
from ..runtime.sim.run import MAX_RANKS, note_exit
from ..runtime.sim.waiting import ranks_text
from .comm import SimComm
from .handles import initial_errhandler
from .mpirun_target import _target
from .rank_program import run_program
from .unsupported import not_simulated

__all__ = ["spawn", "spawn_multiple", "intercomm_groups", "intercomm_side"]

#: A Python interpreter's name (python, python3, python3.12), as spmdsim mpirun's command line takes it.
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def _argv(args: Any) -> list[str]:
    """mpi4py's reading of a command's arguments: None none, a string one, else a sequence of strings."""
    if args is None:
        return []
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    return [os.fsdecode(a) for a in args]


def _program(command: Any, args: Any) -> tuple[str, str, list[str]]:
    """(kind, what, argv) of the program `command` with `args`, as a rank runs it (rank_program.run_program).
    A program MPI could start and a simulated rank cannot (no Python program, or python with options of its own:
    the rank runs in this interpreter) is refused in one line (not_simulated); one MPI could not start either (no
    such command, a script that does not exist) is MPI.Exception (ERR_SPAWN)."""
    command = os.fsdecode(command)
    words = [command, *_argv(args)]
    python = command == sys.executable or bool(_PYTHON.fullmatch(os.path.basename(command)))
    while python and len(words) > 1 and words[1] in _own_flags():  # (mpi4py.futures passes its own on)
        del words[1]
    if python and len(words) > 1 and words[1].startswith("-") and words[1] not in ("-m", "-c", "-u", "-B"):
        raise not_simulated(f"Spawn of python with option {words[1]!r} (a spawned rank runs in this interpreter, "
                            "with its options)")
    if not python and not _python_script(command):
        if shutil.which(command):
            raise not_simulated(f"Spawn of {command!r}, no Python program (a spawned rank runs python with a "
                                "script, -m module or -c code, or a Python script)")
        raise _error("ERR_SPAWN", f"Spawn: command {command!r} is not found or not executable")
    try:
        kind, what, argv = _target(words)
    except ValueError as exc:
        raise _error("ERR_SPAWN", f"Spawn: {' '.join(words)}: {exc}") from None
    if kind in ("path", "main"):
        what = os.path.abspath(what)
    return kind, what, argv


#: sys.flags' names and the python option that sets each (repeated for a level: -OO).
_FLAGS = (("debug", "d"), ("optimize", "O"), ("dont_write_bytecode", "B"), ("no_user_site", "s"), ("no_site", "S"),
          ("ignore_environment", "E"), ("verbose", "v"), ("bytes_warning", "b"), ("quiet", "q"),
          ("hash_randomization", "R"), ("isolated", "I"), ("safe_path", "P"))


def _own_flags() -> set[str]:
    """The python options this interpreter runs with (-R, -O, -W..., -X...: what mpi4py.futures gives the workers
    it spawns, to run as it does): a spawned rank runs in this interpreter, so they change nothing."""
    flags = {"-" + letter * int(getattr(sys.flags, name, 0)) for name, letter in _FLAGS
             if int(getattr(sys.flags, name, 0)) > 0}
    flags.update("-W" + opt for opt in sys.warnoptions)
    flags.update("-X" + k if v is True else f"-X{k}={v}" for k, v in getattr(sys, "_xoptions", {}).items())
    return flags


def _python_script(path: str) -> bool:
    """Whether `path` is a file python runs as a script: named .py, or its ``#!`` line names python."""
    if not os.path.isfile(path):
        return False
    if path.endswith(".py"):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _count(maxprocs: Any) -> int:
    n = int(maxprocs)
    if n < 1:
        raise _error("ERR_ARG", f"Spawn: maxprocs {maxprocs!r} must be 1 or more")
    return n


def spawn(cls: type, comm: SimComm, command: Any, args: Any = None, maxprocs: Any = 1, info: Any = None,
          root: Any = 0, errcodes: Optional[list] = None) -> Any:
    """Intracomm.Spawn of `comm`: `cls` (the simulated MPI.Intercomm) of the parents and the children."""
    comm._live_handle()
    root = comm._root(root, "Spawn")
    plan = None
    if comm._me == root:
        plan = _or_error(lambda: _copies(_count(maxprocs), command, args))
    inter, counts = _spawned(cls, comm, root, plan, "Spawn")
    if errcodes is not None:
        errcodes[:] = [special("SUCCESS")] * sum(counts)
    return inter


def spawn_multiple(cls: type, comm: SimComm, command: Any, args: Any = None, maxprocs: Any = None,
                   info: Any = None, root: Any = 0, errcodes: Optional[list] = None) -> Any:
    """Intracomm.Spawn_multiple of `comm`: one world of the children of every command, in order."""
    comm._live_handle()
    root = comm._root(root, "Spawn_multiple")
    plan = None
    if comm._me == root:
        commands, argvs, counts = _multiple(command, args, maxprocs, info)  # ValueError: the root's alone
        plan = _or_error(lambda: ([p for n, c, a in zip([_count(n) for n in counts], commands, argvs)
                                   for p in _copies(n, c, a)], counts))
    inter, counts = _spawned(cls, comm, root, plan, "Spawn_multiple")
    if errcodes is not None:
        errcodes[:] = [[special("SUCCESS")] * n for n in counts]
    return inter


def _copies(n: int, command: Any, args: Any) -> list:
    """`n` children's programs: `command` with `args` (the count is checked first)."""
    return [_program(command, args)] * n


def _or_error(make: Callable[[], Any]) -> Any:
    """The root's plan `make` makes, or the MPI error in it, which every parent raises (as MPI's spawn fails on
    each); a call not simulated (NotImplementedError) is raised at once: the run ends."""
    try:
        return make()
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - MPI's error, raised on every parent
        return exc


def _multiple(command: Any, args: Any, maxprocs: Any, info: Any) -> tuple[list, list, list]:
    """Spawn_multiple's commands, arguments and counts as mpi4py reads them: a sequence of commands (a string is
    ValueError), then arguments, counts and infos each one for all or one per command (ValueError otherwise)."""
    if isinstance(command, (str, bytes)):
        raise ValueError("expecting a sequence of strings")
    commands = list(command)
    n = len(commands)

    def each(value: Any, single: Callable[[Any], bool]) -> list:
        if single(value):
            return [value] * n
        value = list(value)
        if len(value) != n:
            raise ValueError(f"expecting {n} items, got {len(value)}")
        return value

    argvs = each(args, lambda v: v is None or isinstance(v, (str, bytes, os.PathLike)))
    counts = each(1 if maxprocs is None else maxprocs, lambda v: isinstance(v, int))
    mpi = mpi_module()
    each(info, lambda v: v is None or isinstance(v, mpi.Info))
    return commands, argvs, [int(c) for c in counts]


def _spawned(cls: type, comm: SimComm, root: int, plan: Any, call: str) -> tuple[Any, list]:
    """The collective of a Spawn over `comm`: the last parent to come starts the root's `plan` (its programs, one
    per child, and with Spawn_multiple the count of each command's; or the exception every parent raises);
    return this parent's intercommunicator and the counts."""
    state = _local.simulated()
    runs = comm._group.world.runs
    if state is None or runs is None:
        raise not_simulated(f"dynamic processes outside a simulated run (Intracomm.{call})")
    runner = state.programs or _run_child
    world, parents = comm._group.world, comm._group.members

    def complete(slot: Any) -> None:  # (the world lock held, by the last parent to come)
        data = slot.calls[root].data
        if isinstance(data, BaseException):
            slot.shared = data
            return
        programs, counts = data if isinstance(data, tuple) else (data, [len(data)])
        children = tuple(range(runs.ranks, runs.ranks + len(programs)))  # what runs.spawn numbers them
        if children[-1] >= MAX_RANKS:
            slot.shared = _error("ERR_SPAWN", f"{call}: {len(programs)} more simulated ranks make more than "
                                              f"{MAX_RANKS} in the run")
            return
        groups = intercomm_groups(world, parents, children, f"the intercommunicator of {ranks_text(parents)} and "
                                                            f"their spawned {ranks_text(children)}")
        try:
            apps = [app for app, n in enumerate(counts) for _ in range(n)]  # each child's command's index
            runs.spawn(len(programs), lambda ranks: [(_child, (cls, p, groups, runner, app), {})
                                                     for p, app in zip(programs, apps)],
                       f"the world of {ranks_text(children)}, spawned by {ranks_text(parents)}")
        except Exception as exc:  # noqa: BLE001 - no thread to be had: every parent raises it
            slot.shared = exc
            return
        slot.shared = (groups, counts)

    slot = comm._enter(call.lower(), (call.lower(), root), plan, complete)
    if isinstance(slot.shared, BaseException):
        raise slot.shared
    groups, counts = slot.shared
    inter = intercomm_side(cls, groups, comm._me, True)
    return comm._inherits(inter), counts


def intercomm_groups(world: Any, first: tuple, second: tuple, text: str) -> tuple:
    """The groups of the intercommunicator of world ranks `first` and `second` (the parents, then the children)
    that a report names `text`, as spmdsim.emulator.intercomm makes them: each side's own, its messages from the
    first, from the second, and its collectives (the first side first)."""
    return (Group(world, first, f"{text} (its group of {ranks_text(first)})"),
            Group(world, second, f"{text} (its group of {ranks_text(second)})"),
            Group(world, first + second, f"{text} (its messages from {ranks_text(first)})"),
            Group(world, second + first, f"{text} (its messages from {ranks_text(second)})"),
            Group(world, first + second, text))


def intercomm_side(cls: type, groups: tuple, me: int, first: bool) -> Any:
    """The intercommunicator (a `cls`) of `groups` (`intercomm_groups`) as member `me` of the `first` side or the
    second sees it: messages out on its own side's then the other's members, in on the other's then its own."""
    one, two, from_first, from_second, union = groups
    local, remote = (one, two) if first else (two, one)
    out, inn = (from_first, from_second) if first else (from_second, from_first)
    before = 0 if first else one.size
    parts = (SimComm(local, me), SimComm(out, me), SimComm(inn, remote.size + me), SimComm(union, before + me))
    return cls._made(parts, remote.members, first)


def _child(cls: type, program: tuple, groups: tuple, runner: Callable[[str, str], Any], app: int = 0) -> None:
    """A spawned rank's function (spmdsim.runtime.sim.rank_runs): its sys.argv, MPI.APPNUM (`app`, its command's
    index) and MPI.Comm.Get_parent() (a `cls`), then its program, as `runner` runs one (spmdsim mpirun's rank, or
    `_run_child`)."""
    kind, what, argv = program
    state = _local.current()
    state.argv, state.appnum = list(argv), app
    if kind in ("path", "main"):  # its own modules beside it, as its python's sys.path[0]
        state.home = os.path.dirname(os.path.abspath(what)) if kind == "path" else os.path.abspath(what)
    parent = intercomm_side(cls, groups, state.comm._me, False)
    parent._h.errhandler = initial_errhandler()
    state.parent = parent
    runner(kind, what)


def _run_child(kind: str, what: str) -> None:
    """A spawned rank's program under simulate() (spmdsim mpirun runs its own way: RankContext.programs): a
    non-zero exit code is noted, as spmdsim mpirun notes a rank's, for a deadlock report to say."""
    code = run_program(kind, what)
    if code:
        note_exit(code)
