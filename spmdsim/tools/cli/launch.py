"""`spmdsim launch -n N [--timeout S] -- COMMAND...`: mpiexec with dependable settings.

Runs the mpiexec that belongs to this Python's mpi4py under a timeout and
returns its exit code (124 on timeout, like coreutils `timeout`; 128 + N when
a signal N killed mpiexec itself, as a shell says; 143 or 129 when launch itself
gets SIGTERM or SIGHUP, which stop the job first). For the
child it sets, unless already set:

* ``SPMDSIM_WAIT`` (``--wait``; default auto = polite wait when ranks outnumber cores);
* ``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS``/``MKL_NUM_THREADS`` to
  cores // N (at least 1): BLAS thread pools of 8 oversubscribed ranks made a
  measured job 20x slower (docs/explanation/oversubscription.md);
* ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``/``MALLOC_TOP_PAD_`` (unless any
  glibc malloc variable is set): freed result buffers stay in the heap (spmdsim.base.malloc);
* ``SPMDSIM_EXPECT_WORLD=N``, so a Mesh fails loudly under a foreign mpiexec.

A job killed from outside (a rank's SIGKILL, the timeout) leaves its MPI
shared-memory segment in /dev/shm (MPICH: ``mpich_shm_*``, 8 MB). While the job
runs, launch notes the /dev/shm files its processes map; when it has ended it
removes those that still exist and did not exist before it started, and also
the MPI segments (``mpich_shm_*``, ``sm_segment.*``) made while it ran that no
process holds open or mapped any more (a rank killed within one poll of its
MPI_Init is never seen mapping its segment), and says so in one line. Nothing
else in /dev/shm is touched (older files, other live jobs' segments).

A leading ``python``/``python3`` in COMMAND becomes this interpreter. This
module never imports mpi4py (it asks ``python -m mpi4py --mpi-library``).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import NoReturn, Sequence

from ...base.interrupts import Terminated, terminations_raise
from ...base.malloc import glibc_env
from ...base.threads import THREAD_VARS, launcher_size, thread_cap, thread_count, user_thread_count
from ...errors import RuntimeMismatchError, SpmdsimError, fold_message
from ...runtime.debug import add_cli_arguments, watchdog_setting
from ...runtime.mpi_library import INSTALL_MPI
from ...base.validate import counted
from ...base.typed_numbers import flag_float, typed
from .segments import WATCH_INTERVAL_S as _WATCH_INTERVAL_S, SegmentWatch as _SegmentWatch, descendants, started

__all__ = ["register", "run", "launch_env", "find_mpiexec", "build_command"]

_KILL_GRACE_S = 5.0

#: Words an MPI launcher's --version output contains (MPICH/Hydra, Open MPI/PRRTE,
#: Intel MPI, Slurm's srun, Cray's aprun, IBM's jsrun, Flux); anything else is not one.
_LAUNCHER_WORDS = ("mpi", "hydra", "prte", "pmix", "orte", "slurm", "aprun", "alps", "jsrun", "flux")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch",
        help="run a command under mpiexec with oversubscription-safe settings and a timeout",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("-n", "-np", "--np", dest="ranks", type=int, help="number of MPI ranks (required)")
    p.add_argument("--timeout", type=flag_float, default=600.0, help="seconds before the job is killed (default 600)")
    p.add_argument("--wait", choices=("auto", "busy", "polite"), default=None,
                   help="collective wait mode (default: $SPMDSIM_WAIT or auto)")
    p.add_argument("--mpiexec", default=None, help="mpiexec to use (default: the one beside this Python)")
    # Not --no-check: --check is the divergence guard, as in `spmdsim run`.
    p.add_argument("--no-mpi-check", action="store_true", help="skip the mpiexec/mpi4py MPI match check")
    add_cli_arguments(p)
    p.add_argument(*PLACEMENT, dest="placement", nargs=1, action=_Placement, help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command each rank runs")
    p.set_defaults(func=run)


#: mpiexec's options that place ranks on other hosts (MPICH's and Open MPI's): launch starts every rank on this
#: machine (its thread cap, its segment watch), so they are refused saying what to run (argparse alone says
#: "unrecognized arguments: -f", and never that a hostfile does not exist).
PLACEMENT = ("-f", "-hostfile", "--hostfile", "-machinefile", "--machinefile", "-host", "--host", "-hosts", "-ppn")


class _Placement(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        value = shlex.quote(values[0])  # as a shell takes it: `-f ""` said "-f  places", the value unseen
        parser.error(f"{option_string} {value} places ranks on other hosts; spmdsim launch starts every rank on "
                     f"this machine: run your site's launcher, e.g. timeout -k 5 600 mpiexec {option_string} "
                     f"{value} -n 8 python prog.py (each rank tunes itself: docs/howto/cluster-mpi.md)")


def find_mpiexec(explicit: str | None = None) -> str:
    """`explicit` (--mpiexec) found on PATH; else the venv's mpiexec (beside sys.executable), else the first on PATH.
    An empty --mpiexec "" is refused like any name that is no program, not taken as none given."""
    if explicit is not None:
        found = shutil.which(explicit)
        if not found:
            raise SpmdsimError(f"--mpiexec {explicit!r} is not an executable program "
                               "(a path, or a name on PATH); expected an MPI launcher such as mpiexec")
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise RuntimeMismatchError(f"no mpiexec found beside this Python or on PATH; install {INSTALL_MPI} (its "
                                   "mpiexec on PATH, or --mpiexec PATH)")
    return found


def _family(text: str) -> str | None:
    text = text.lower()
    if "open mpi" in text or "openrte" in text or "libmpi.so.4" in text or "open-mpi" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel(r) mpi" in text or "libmpi.so.12" in text:
        return "mpich"
    return None


#: Open MPI counts one slot per core and refuses more ranks unless told to
#: oversubscribe; these ask for it without a command-line flag (Open MPI 5's
#: PRRTE reads the first, 4.x the second). A value the user set wins.
OPENMPI_OVERSUBSCRIBE = {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
                         "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def check_same_mpi(mpiexec: str) -> str | None:
    """Raise RuntimeMismatchError when mpiexec and mpi4py's library clearly differ in family.

    Returns the launcher's family ("mpich", "openmpi") or None when it cannot tell.
    """
    # Both probes at once: each is a process start-up (~0.2-1 s on a loaded machine).
    probes: list[subprocess.Popen] = []
    try:
        probes.append(subprocess.Popen([sys.executable, "-m", "mpi4py", "--mpi-library"],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        probes.append(subprocess.Popen([mpiexec, "--version"], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
        lib = probes[0].communicate(timeout=30)[0].strip()
        ver = probes[1].communicate(timeout=30)[0]
    except (OSError, subprocess.TimeoutExpired):
        for proc in probes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return None  # cannot tell; SPMDSIM_EXPECT_WORLD still catches a mismatch at run time
    if not any(word in ver.lower() for word in _LAUNCHER_WORDS):
        # Every MPI launcher names itself on --version; another program (e.g.
        # /bin/true) would "run" the job without starting a rank and exit 0.
        first = (ver.strip().splitlines() or [""])[0][:60]
        raise RuntimeMismatchError(
            f"mpiexec {mpiexec!r} is not an MPI launcher: its --version output "
            f"{first!r} names no MPI; pass --mpiexec with mpiexec or mpirun "
            "(or --no-mpi-check to skip this check)"
        )
    lib_family, exec_family = _family(os.path.basename(lib)), _family(ver)
    if lib_family and exec_family and lib_family != exec_family:
        raise RuntimeMismatchError(
            f"mpiexec {mpiexec!r} is {exec_family} but mpi4py uses {lib!r} ({lib_family}); "
            "pass --mpiexec or activate the matching environment"
        )
    return exec_family


def launch_env(ranks: int, wait: str | None, base: dict | None = None) -> dict:
    """The child environment: wait mode, BLAS thread caps, glibc heap thresholds, expected world size."""
    env = dict(os.environ if base is None else base)
    if wait is not None:
        env["SPMDSIM_WAIT"] = wait
    else:
        env.setdefault("SPMDSIM_WAIT", "auto")
    # The count the user asked for in any of them (OpenBLAS reads its own variable first: OMP_NUM_THREADS=4 beside
    # a capped OPENBLAS_NUM_THREADS would be lost), else the cap; a value that is no count (abc, 0) asks for none.
    threads = str(user_thread_count(env) or thread_cap(ranks))
    for var in THREAD_VARS:
        if thread_count(env.get(var)) is None:
            env[var] = threads
    env["SPMDSIM_EXPECT_WORLD"] = str(ranks)
    return glibc_env(env)


def build_command(mpiexec: str, ranks: int, command: Sequence[str]) -> list[str]:
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SpmdsimError("launch needs a command after '--', e.g. spmdsim launch -n 8 -- python prog.py")
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
        script = command[1] if len(command) > 1 else "-"
        if not script.startswith("-") and not os.path.exists(script):  # else Python says so once per rank
            raise SpmdsimError(f"launch: script {script!r} does not exist (in {os.getcwd()}); "
                               "expected e.g. spmdsim launch -n 8 -- python prog.py")
        if script.endswith(".py"):
            _check_compiles(script)
    elif shutil.which(command[0]) is None:  # else mpiexec prints its own failure once per rank
        # A program of this venv (`spmdsim` itself) where the venv is not activated: the one beside this Python,
        # as `python` is this Python and mpiexec the one beside it (`find_mpiexec`).
        beside = None if os.sep in command[0] else shutil.which(command[0], path=os.path.dirname(sys.executable))
        if beside is None:
            where = "file" if os.sep in command[0] else "program on PATH or beside this Python"
            raise SpmdsimError(f"launch: command {command[0]!r} is not an executable {where}; "
                               "expected e.g. spmdsim launch -n 8 -- python prog.py")
        command[0] = beside
    return [mpiexec, "-n", str(ranks), *command]


def _check_compiles(script: str) -> None:
    """Refuse, once, a script this Python cannot compile: every rank printed the same SyntaxError (8 at -n 8).
    A .py file that cannot be read is left for Python to say."""
    try:
        with open(script, "rb") as fh:
            source = fh.read()
        compile(source, script, "exec", dont_inherit=True)
    except (OSError, ValueError):
        return
    except SyntaxError as exc:
        where = f", line {exc.lineno}" if exc.lineno else ""
        raise SpmdsimError(f"launch: script {script!r}{where}: {type(exc).__name__}: {exc.msg}; expected a "
                           "Python program this Python compiles (each rank would stop there)") from None


#: Most ranks `spmdsim launch` starts: the mpiexec it runs starts every rank as a process of this machine (as
#: many as --ranks simulates as threads: spmdsim.runtime.sim.run.MAX_RANKS).
MAX_LAUNCH_RANKS = 4096


def _refuse_without_ranks(command: Sequence[str]) -> NoReturn:
    """Refuse a launch without -n: saying where it went when the command holds it (launch's own flags go before
    the command; after it they are the program's)."""
    given = next((i for i, word in enumerate(command) if word in ("-n", "-np", "--np")), None)
    if given is not None and given + 1 < len(command):
        program = " ".join(word for i, word in enumerate(command) if word != "--" and i not in (given, given + 1))
        raise SpmdsimError(f"launch's -n goes before the command, which takes what follows it as its own: spmdsim "
                           f"launch {command[given]} {command[given + 1]} -- {program}")
    raise SpmdsimError("launch needs -n N, the number of ranks: spmdsim launch -n 8 -- python prog.py")


def run(args: argparse.Namespace) -> int:
    if args.ranks is None:
        _refuse_without_ranks(args.command)
    if not 1 <= args.ranks <= MAX_LAUNCH_RANKS:  # -n 99999 started mpiexec, which forked until out of files
        raise SpmdsimError(f"-n {args.ranks} must be a number of ranks from 1 to {MAX_LAUNCH_RANKS:,} "
                           "(each one a process of this machine)")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise SpmdsimError(f"--timeout {typed(args.timeout)} must be a positive, finite number of seconds")
    if launcher_size() > 1:  # each process of that job would start a job of its own
        raise SpmdsimError(f"launch starts its own mpiexec job, but mpiexec started {launcher_size()} processes, "
                           f"each of which would start one: run spmdsim launch -n {args.ranks} without mpiexec")
    if args.watchdog is not None:  # refused here, not in N ranks after the launch
        watchdog_setting(args.watchdog, "--watchdog")
    mpiexec = find_mpiexec(args.mpiexec)
    cmd = build_command(mpiexec, args.ranks, args.command)
    family = None if args.no_mpi_check else check_same_mpi(mpiexec)
    env = launch_env(args.ranks, args.wait)
    if family == "openmpi" and args.ranks > (os.cpu_count() or 1):
        for var, value in OPENMPI_OVERSUBSCRIBE.items():
            env.setdefault(var, value)
    # The debug flags reach every rank through the environment the runtime reads.
    if args.check:
        env["SPMDSIM_CHECK"] = "1"
    if args.watchdog is not None:
        env["SPMDSIM_WATCHDOG"] = str(args.watchdog)
    return run_with_timeout(cmd, env, args.timeout)


def run_with_timeout(cmd: list[str], env: dict, timeout: float) -> int:
    """Run cmd in its own process group; on timeout SIGTERM the group, then SIGKILL; 124.

    Shared-memory segments the job left behind are removed afterwards (`_SegmentWatch`).
    """
    watch = _SegmentWatch()
    try:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    except OSError as exc:
        raise SpmdsimError(f"cannot start {cmd[0]!r}: {exc.strerror or exc}") from None
    try:
        with terminations_raise():  # the job is a session of its own: a SIGTERM for launch alone left it running
            return _wait(proc, timeout, watch, _hint(cmd, env))
    finally:
        _say_removed(watch.remove_left(), watch.seen)


def _say_removed(removed: list, seen: set) -> None:
    """Name the segments removed: those the job's processes were seen to map as the job's, the others (new since
    it started, held by no process) as what they may be: a rank's that died at its start, or another job's."""
    others = "made since the job started that no process holds (a rank's that died at its start, or another job's)"
    for names, whose in (([n for n in removed if n in seen], "the job left"),
                         ([n for n in removed if n not in seen], others)):
        if names:
            print(fold_message(f"spmdsim: removed {counted(len(names), 'shared-memory segment')} {whose}: "
                               f"{', '.join(names)}"), file=sys.stderr)


def _hint(cmd: list[str], env: dict) -> str:
    """What the timeout's line adds: with no watchdog, a job that timed out may be ranks waiting in a collective one
    skipped (the watchdog names them); a Python program's ranks waiting in point-to-point calls, which the watchdog
    does not watch, are named call by call on simulated ranks (`spmdsim mpirun`)."""
    hint = "" if env.get("SPMDSIM_WATCHDOG") else (
        "; ranks waiting in a collective another rank skipped? --watchdog SECONDS names them")
    ranks, program = cmd[2], cmd[3:]
    if program[:1] == [sys.executable] and len(program) > 1 and program[1].endswith(".py"):
        hint += (f"; in Send/Recv? `spmdsim mpirun -n {ranks} {shlex.join(program[1:])}` runs it on simulated "
                 "ranks and names each waiting rank's call and line")
    return hint


def _wait(proc: subprocess.Popen, timeout: float, watch: "_SegmentWatch", hint: str = "") -> int:
    deadline = time.monotonic() + timeout
    try:
        while True:
            watch.note(proc.pid)
            left = deadline - time.monotonic()
            try:
                return _exit_status(proc.wait(timeout=max(0.0, min(left, _WATCH_INTERVAL_S))))
            except subprocess.TimeoutExpired:
                if left <= _WATCH_INTERVAL_S:
                    raise
    except subprocess.TimeoutExpired:
        _stop(proc, signal.SIGTERM)
        # Said once the job is gone, after MPICH's banner on the kill ("BAD TERMINATION ... signal 15"): the last line.
        print(fold_message(f"spmdsim: error: job exceeded the {timeout:g} s timeout; stopped it (any banner above "
                           f"is mpiexec's on the kill){hint}"), file=sys.stderr)
        return 124
    except KeyboardInterrupt:
        _stop(proc, signal.SIGINT)
        return 130
    except Terminated as exc:  # a batch system's time limit, `timeout`, a closed terminal
        _stop(proc, signal.SIGTERM)
        _say(f"spmdsim: launch got {signal.Signals(exc.signum).name}; stopped the job")
        return 128 + exc.signum


def _say(line: str) -> None:
    """`line` on stderr, which a closed terminal (SIGHUP) may have taken away."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _stop(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the job's process group, give it _KILL_GRACE_S to end, then SIGKILL the group and reap it;
    then SIGKILL the processes that were below mpiexec when the stop began and still run. Open MPI's prterun
    puts each rank in a process group of its own: killed while it ignored SIGTERM, it left its ranks running."""
    below = [(pid, started(pid)) for pid in descendants(proc.pid)[1:]]  # (Linux /proc; none elsewhere)
    _kill_group(proc, sig)
    try:
        proc.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        proc.wait()
    for pid, start in below:
        if start is not None and started(pid) == start:  # the same process, not a later one given its pid
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass  # ended meanwhile


def _exit_status(returncode: int) -> int:
    """mpiexec's exit code, or 128 + N when a signal N ended it, as a shell and coreutils `timeout` report it.

    Popen gives -N for a signal: returned as is, it became exit status 256 - N (247 for an mpiexec killed with
    SIGKILL, which no shell convention reads as a signal).
    """
    return 128 - returncode if returncode < 0 else returncode


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
