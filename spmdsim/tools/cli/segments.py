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

__all__ = ["SHM", "MPI_SEGMENT_PREFIXES", "held", "left_since", "main"]

SHM = "/dev/shm"
#: The names MPI gives its node segments (MPICH's, Open MPI's).
MPI_SEGMENT_PREFIXES = ("mpich_shm_", "sm_segment.")


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
    for name in sorted(left_since(since)):
        try:
            os.unlink(os.path.join(SHM, name))
        except OSError:
            continue  # gone already
        if args.verbose:
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
