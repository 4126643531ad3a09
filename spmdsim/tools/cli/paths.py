"""Check that an output file or directory can be written before any work is done.

A command that measures for minutes or prints a picture first should not
fail on the last line with an OSError traceback (or, under MPI, leave the
other ranks waiting): `check_output_file` and `check_output_dir` raise one
SpmdsimError naming the flag and the path instead. Pure: never imports mpi4py.
"""
from __future__ import annotations

import os
import tempfile

from ...errors import SpmdsimError

__all__ = ["check_output_file", "check_output_dir"]


def _existing_ancestor(path: str) -> str:
    """The nearest existing path at or above `path` ('.' for a bare relative name)."""
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _probe_dir(directory: str, flag: str, path: str) -> None:
    """Raise unless a file can be created in the existing `directory`.

    Creating (and removing) a probe file is the only dependable test: as root
    os.access says yes to read-only mounts and to /proc.
    """
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".spmdsim-probe-"):
            pass
    except OSError as exc:
        raise SpmdsimError(
            f"{flag} {path!r} cannot be written: {directory!r} refuses new files "
            f"({exc.strerror or exc}); expected a path in a writable directory"
        ) from None


def _check_parent(path: str, flag: str, make_parents: bool = False) -> None:
    """The parent directory exists and is writable (a missing one is not made: a typo in a
    directory name would otherwise leave a new tree behind and the file where nobody looks).

    `make_parents`: missing parents may be made under a writable ancestor (a default path such
    as ~/.cache/spmdsim/cost.json, which nobody typed).
    """
    parent = os.path.dirname(os.path.abspath(path))
    base = _existing_ancestor(parent)
    if not os.path.isdir(base):
        raise SpmdsimError(
            f"{flag} {path!r} cannot be written: {base!r} is a file, not a directory"
        )
    if base != parent and not make_parents:
        raise SpmdsimError(
            f"{flag} {path!r} cannot be written: directory {parent!r} does not exist; "
            "expected a path in an existing directory"
        )
    _probe_dir(base, flag, path)


def check_output_file(path: str | os.PathLike, flag: str, make_parents: bool = False) -> str:
    """Raise SpmdsimError unless `path` can be written as a file in an existing directory
    (or, with `make_parents`, one that can be made)."""
    path = os.fspath(path)
    if not path:
        raise SpmdsimError(f"{flag} {path!r} is empty; expected a file path")
    if os.path.isdir(path):
        raise SpmdsimError(f"{flag} {path!r} is a directory; expected a file path")
    _check_parent(path, flag, make_parents)
    if os.path.lexists(path) and not os.access(path, os.W_OK):
        raise SpmdsimError(f"{flag} {path!r} exists and is not writable")
    return path


def check_output_dir(path: str | os.PathLike, flag: str) -> str:
    """Raise SpmdsimError unless files can be written into directory `path` (made if missing,
    in an existing parent)."""
    path = os.fspath(path)
    if not path:
        raise SpmdsimError(f"{flag} {path!r} is empty; expected a directory")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise SpmdsimError(f"{flag} {path!r} is a file; expected a directory")
    if os.path.isdir(path):
        _probe_dir(path, flag, path)
    else:
        _check_parent(path, flag)
    return path
