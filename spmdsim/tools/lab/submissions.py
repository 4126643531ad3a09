"""The submissions `lab grade` finds in a folder: .py files side by side, or one folder per student."""
from __future__ import annotations

import os
import sys

from .exercise import LabError
from .shown import file_name

__all__ = ["submissions"]


def submissions(folder: str, starter: str) -> list:
    """The submissions of `folder`: its .py files, and of each folder in it (a learning platform's download,
    one folder per student) its one .py file, or the one named `starter` (the file `lab start` writes), sorted;
    hidden ones (the ._name.py files a zip made on macOS carries) left out. Each entry left out is named on
    stderr (a folder with its "/" and why); refused in one line when there is none."""
    if not os.path.isdir(folder):
        raise LabError(f"submission folder {folder!r} does not exist")
    names = sorted(os.listdir(folder))
    files, skipped = [], []
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not name.startswith("."):
            found = _python_files(path)
            pick = found[0] if len(found) == 1 else starter if starter in found else None
            if pick is None:
                why = f"{len(found)} .py files, none named {starter}" if found else "no .py file"
                skipped.append(f"{file_name(name)}/ ({why})")
            else:
                files.append(os.path.join(path, pick))
        elif _a_submission(folder, name):
            files.append(path)
        else:
            skipped.append(file_name(name) + ("/" if os.path.isdir(path) else ""))
    if skipped:
        shown = ", ".join(skipped[:8]) + (f" and {len(skipped) - 8} more" if len(skipped) > 8 else "")
        print(f"not graded (not a .py file, or hidden): {shown}", file=sys.stderr)
    if not files:
        raise LabError(f"submission folder {folder!r} holds no .py file, and no folder holding one; expected one "
                       "file per student, side by side in DIR (alice.py, bob.py) or each in its own folder")
    return files


def _python_files(folder: str) -> list:
    """The names of `folder`'s submission files (`_a_submission`), sorted."""
    return sorted(f for f in os.listdir(folder) if _a_submission(folder, f))


def _a_submission(folder: str, name: str) -> bool:
    """Whether `folder`'s entry `name` is a .py file that is not hidden (a folder named x.py is none)."""
    return name.endswith(".py") and not name.startswith(".") and os.path.isfile(os.path.join(folder, name))
