"""The lock a training run holds on the directory it saves checkpoints into (spmdsim.models.gpt.checkpoint), so that
two runs saving into one directory at once never mix their files: the second is refused in one line, before it
trains.

One lock per job, not per rank: rank 0 of the run's communicator takes it (`take_save_lock`: flock on
``DIR/.spmdsim-save.lock``, which holds its pid and host; where the system has no flock, the file made with
O_EXCL) and the ranks agree on the outcome by one Allgather, so that every rank raises the same refusal, or none
does. The trainers (spmdsim.models.gpt.train.train, spmdsim.models.gpt.pipeline.train_pipelined) release it when
they return or raise (`releases_save_lock`); a run killed leaves no lock held: the system releases a flock with the
process, and the next run takes the file it left.
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
from typing import Any, Callable, Optional

from ...base.files import reason
from .checkpoint import agreed

try:  # (optional: flock is POSIX's)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK", "take_save_lock", "releases_save_lock"]

#: The lock file in a --save directory (removed when the run that holds it returns).
LOCK = ".spmdsim-save.lock"

#: This thread's trainer's locks (a list while `releases_save_lock`'s call runs): released when it returns.
_HELD = threading.local()


def take_save_lock(directory: str, comm: Any) -> None:
    """Lock `directory` for this run's saves: rank 0 of `comm` takes the lock, and every rank raises alike, in one
    line, where another run holds it (its pid, where known). Collective (one Allgather): every rank calls it
    alike, after the checks every rank makes alone (checkpoint.save_problem made the directory)."""
    problem = None
    if comm.Get_rank() == 0:
        held, problem = _take(directory)
        if held is not None:
            locks = getattr(_HELD, "locks", None)
            if locks is not None:  # (else held until this process ends)
                locks.append(held)
    agreed(comm, problem)  # (rank 0's, if any: it took nothing)


def releases_save_lock(run: Callable) -> Callable:
    """`run` (a trainer) releasing, when it returns or raises, the lock `take_save_lock` took in its call."""

    @functools.wraps(run)
    def releasing(*args: Any, **kwargs: Any) -> Any:
        outer, _HELD.locks = getattr(_HELD, "locks", None), []
        try:
            return run(*args, **kwargs)
        finally:
            for held in _HELD.locks:
                _release(*held)
            _HELD.locks = outer

    return releasing


def _take(directory: str) -> tuple[Optional[tuple], Optional[str]]:
    """(the lock held: (its path, its descriptor or None), None) or (None, why not)."""
    path = os.path.join(directory, LOCK)
    for _ in range(8):  # (a lock file removed as it was locked: its run just ended; again, on the new one)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | (0 if fcntl else os.O_EXCL), 0o644)
        except FileExistsError:  # (no flock: the file is the lock)
            return None, _busy(directory, _holder(path))
        except OSError as e:
            return None, f"--save {directory}: cannot make its lock file {LOCK}: {reason(e)}"
        if fcntl is None:
            return _owned(path, fd), None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(path)
            os.close(fd)
            return None, _busy(directory, holder)
        except OSError:  # a file system without flock (some NFS): the run saves unlocked, as before
            os.close(fd)
            return None, None
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return _owned(path, fd), None
        os.close(fd)
    return None, _busy(directory, _holder(path))


def _owned(path: str, fd: int) -> tuple:
    """The lock at `path` (open as `fd`, locked) marked with this process's pid and host."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    return path, fd


def _release(path: str, fd: int) -> None:
    """Remove the lock file, then unlock it (a run that opened it meanwhile finds it gone and takes a new one)."""
    with contextlib.suppress(OSError):
        os.remove(path)
    with contextlib.suppress(OSError):
        os.close(fd)


def _holder(path: str) -> str:
    """Who holds the lock at `path`, as its file says: "pid 1234", "pid 1234 on node7", or "" where unknown."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            pid, _, host = f.read(200).strip().partition(" ")
    except OSError:
        return ""
    if not pid.isdigit():
        return ""
    return f"pid {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")


def _busy(directory: str, holder: str) -> str:
    """The refusal of a --save into `directory`, which another run (`holder`: `_holder`'s) is saving into."""
    who = f"another run ({holder})" if holder else "another run"
    stale = "" if fcntl else f" (if none is, remove {os.path.join(directory, LOCK)})"
    return (f"--save {directory}: {who} is saving into this directory{stale}; give another directory or wait for it "
            "to finish")
