"""A zip of submissions (a learning platform's "download all" gives one), graded as the folder it unpacks to."""
from __future__ import annotations

import contextlib
import os
import tempfile
import zipfile
from typing import Iterator

from .exercise import LabError
from .submissions import NO_STUDENT

__all__ = ["unpacked", "a_zip", "MOST_BYTES"]

#: The most a zip may unpack to: submissions are code, and a larger one (a zip bomb, a folder of data sets)
#: is refused before anything is written.
MOST_BYTES = 1 << 30


def a_zip(path: str) -> bool:
    """Whether `path` is a zip file (by its contents, not its name)."""
    return os.path.isfile(path) and zipfile.is_zipfile(path)


@contextlib.contextmanager
def unpacked(path: str) -> Iterator[str]:
    """The folder to grade for `path`: `path` itself, or for a zip file a temporary folder it is unpacked into
    (removed after), entering the one folder that holds everything (a zip made of a folder) as often as there
    is one. Refused in one line before anything is written: a zip that is damaged, encrypted, or unpacks to
    more than MOST_BYTES."""
    if not a_zip(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="spmdsim-lab-") as folder:
        _extract(path, folder)
        yield _inner(folder)


def _extract(path: str, folder: str) -> None:
    """Unpack the zip `path` into `folder` (zipfile keeps every member inside it: '..' and leading slashes are
    dropped from members' names)."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            locked = [m.filename for m in members if m.flag_bits & 0x1]
            if locked:
                raise LabError(f"{path!r} holds encrypted files ({locked[0]!r} and {len(locked) - 1} more); "
                               "expected a zip without a password, or its folder unpacked")
            size = sum(m.file_size for m in members)
            if size > MOST_BYTES:
                raise LabError(f"{path!r} unpacks to {size / (1 << 20):,.0f} MiB; expected at most "
                               f"{MOST_BYTES >> 20:,} MiB of submissions (unpack it yourself and grade the folder)")
            archive.extractall(folder)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise LabError(f"{path!r} cannot be unpacked ({exc}); expected a zip of the submissions, or their "
                       "folder") from None
    except OSError as exc:  # (a full disk under the temporary folder)
        raise LabError(f"{path!r} cannot be unpacked into {folder!r}: {exc.strerror or exc}") from None


def _inner(folder: str) -> str:
    """`folder`, or while it holds one folder and nothing else a student's could be, that folder."""
    while True:
        names = [n for n in os.listdir(folder) if not n.startswith(".") and n not in NO_STUDENT]
        if len(names) != 1 or not os.path.isdir(os.path.join(folder, names[0])):
            return folder
        folder = os.path.join(folder, names[0])
