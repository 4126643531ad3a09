"""The MPI shared-memory segments jobs leave in /dev/shm, and which of them no process holds (Linux /proc).

MPICH's ``mpich_shm_*`` and Open MPI's ``sm_segment.*`` outlive a job that was aborted or killed. A segment no
process holds open or mapped can never be attached again (MPI opens it by name only while its creator maps it),
so removing it takes nothing from a live job; one that a process holds is another job's, still running.
`spmdsim launch` removes those its own job left (spmdsim.tools.cli.launch); scripts/test.sh, after its runs,
those of this user's made since it started that no process holds::

    python -m spmdsim.tools.cli.segments --newer FILE

(stdlib only: it runs wherever the tests run).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Iterable, Optional, Sequence

__all__ = ["SHM", "MPI_SEGMENT_PREFIXES", "WATCH_INTERVAL_S", "SegmentWatch", "descendants", "started", "held",
           "left_since", "remove_left_since", "main"]

SHM = "/dev/shm"
#: The names MPI gives its node segments (MPICH's, Open MPI's).
MPI_SEGMENT_PREFIXES = ("mpich_shm_", "sm_segment.")


#: How often the job's maps are read: MPI creates its segment at MPI_Init and
#: keeps it mapped for the job's life, so a job alive this long is seen.
WATCH_INTERVAL_S = 0.2


class SegmentWatch:
    """The /dev/shm files a job's processes map, noted while it runs (Linux /proc; else nothing): what `spmdsim
    launch` removes once its job has ended (spmdsim.tools.cli.launch)."""

    def __init__(self) -> None:
        self.before = self._names()
        self.seen: set[str] = set()

    @staticmethod
    def _names() -> set[str]:
        try:
            return set(os.listdir(SHM))
        except OSError:
            return set()

    def note(self, root: int) -> None:
        """Add the /dev/shm files mapped by `root` and its descendants now."""
        for pid in descendants(root):
            try:
                with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        at = line.find(SHM + "/")
                        if at >= 0:
                            name = line[at + len(SHM) + 1:].split()[0]
                            if "/" not in name and name not in self.before:
                                self.seen.add(name)
            except OSError:
                continue  # the process ended meanwhile

    def orphans(self) -> set[str]:
        """MPI segments new since the job started that no process on this machine holds open or mapped.

        The maps are read every WATCH_INTERVAL_S, so a rank that dies within one poll of its MPI_Init (a
        crash at start-up, a SIGKILL) is never seen mapping its segment: three of three such jobs left
        MPICH's 2 MB segment behind. A segment no process holds can never be attached again (MPI opens it
        by name only while its creator maps it), so removing it takes nothing from a live job.
        """
        new = {name for name in self._names() - self.before - self.seen
               if name.startswith(MPI_SEGMENT_PREFIXES)}
        return new - held(new) if new else set()

    def remove_left(self) -> list[str]:
        """Remove the noted files and the orphaned new MPI segments that still exist and are this user's."""
        removed = []
        for name in sorted(self.seen | self.orphans()):
            path = os.path.join(SHM, name)
            try:
                if os.stat(path).st_uid == os.getuid():
                    os.unlink(path)
                    removed.append(name)
            except OSError:
                continue  # gone already: the job ended normally and removed it
        return removed


def descendants(root: int) -> list[int]:
    """`root` and every process below it (/proc/PID/task/TID/children), root first."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return out


def started(pid: int) -> Optional[int]:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat's 22nd field), or None where it is gone
    or cannot be read: with its pid, what tells a process from a later one given the same pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2:].split()  # after the command's name, which may hold spaces
        return None if fields[0] == b"Z" else int(fields[19])  # (a zombie has ended)
    except (OSError, ValueError, IndexError):
        return None


def held(names: Iterable[str]) -> set[str]:
    """Those of `names` (in /dev/shm) that some process has open or mapped (/proc/PID/fd and maps)."""
    paths = {os.path.join(SHM, name): name for name in names}
    found: set[str] = set()
    try:
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit()]
    except OSError:
        return set(paths.values())  # cannot tell: keep them all
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    at = line.find(SHM + "/")
                    if at >= 0 and line[at:].split()[0] in paths:
                        found.add(paths[line[at:].split()[0]])
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # ended meanwhile, or another user's process (its files are not ours to remove)
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile
            if target in paths:
                found.add(paths[target])
    return found


def left_since(newer: float) -> set[str]:
    """This user's MPI segments in /dev/shm modified after `newer` (seconds since the epoch, as find's -newer
    compares) that no process holds."""
    try:
        names = [name for name in os.listdir(SHM) if name.startswith(MPI_SEGMENT_PREFIXES)]
    except OSError:
        return set()
    mine = set()
    for name in names:
        try:
            st = os.stat(os.path.join(SHM, name))
        except OSError:
            continue  # removed meanwhile
        if st.st_uid == os.getuid() and st.st_mtime > newer:
            mine.add(name)
    return mine - held(mine) if mine else set()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Remove `left_since` the time FILE (--newer) was last modified; the names removed go to stdout with
    --verbose. Exit 0, or 2 with one line where FILE cannot be read."""
    parser = argparse.ArgumentParser(prog="python -m spmdsim.tools.cli.segments",
                                     description="Remove this user's MPI shared-memory segments in /dev/shm made "
                                                 "after FILE was that no process holds open or mapped.")
    parser.add_argument("--newer", required=True, metavar="FILE", help="only segments modified after FILE was")
    parser.add_argument("--verbose", action="store_true", help="print each segment removed")
    args = parser.parse_args(argv)
    try:
        since = os.stat(args.newer).st_mtime
    except OSError as e:
        print(f"segments: error: --newer {args.newer!r} cannot be read ({e.strerror}); expected an existing file",
              file=sys.stderr)
        return 2
    for name in remove_left_since(since):
        if args.verbose:
            print(name)
    return 0


def remove_left_since(newer: float) -> list[str]:
    """Remove `left_since(newer)`; return the names removed, in order (one gone meanwhile is not among them)."""
    removed = []
    for name in sorted(left_since(newer)):
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            continue  # gone already
        removed.append(name)
    return removed


if __name__ == "__main__":
    sys.exit(main())
