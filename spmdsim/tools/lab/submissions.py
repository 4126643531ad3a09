"""The submissions `lab grade` finds in a folder: .py files side by side, or one folder per student; and the
students it cannot grade, each with why (a row of the grade book, so that a reader of the book sees them)."""
from __future__ import annotations

import os
import sys
from typing import NamedTuple, Union

from .exercise import LabError
from .shown import file_name, shown_path

__all__ = ["NotGraded", "submissions"]

#: Entries of a submission folder that are no student's: a folder Python writes beside the files it runs, and the
#: one a zip made on macOS unpacks beside its files (their ._name.py companions: a learning platform's download).
NO_STUDENT = ("__pycache__", "__MACOSX")
#: How deep in a student's folder its row looks for .py files, to name them where the folder holds none of its own.
NESTED = 3


class NotGraded(NamedTuple):
    """A student `lab grade` finds no file of to check: `label` as the grade book names it (`carol/`), `reason`
    why ("no .py file")."""
    label: str
    reason: str


def submissions(folder: str, starter: str, given: str = "") -> list:
    """The submissions of `folder`, sorted: each a path to check, or a NotGraded. Its .py files, and of each
    folder in it (a learning platform's download, one folder per student) its one .py file, or the one named
    `starter` (the file `lab start` writes); a folder with none, or several and none the starter, is a
    NotGraded. Hidden entries (the ._name.py files a zip made on macOS carries) and other files are named on
    stderr as left out; refused in one line when there is no file to check. `given`: what the user gave (a zip
    unpacked into `folder`), named in a refusal; `folder` by default."""
    given = given or folder
    if not os.path.isdir(folder):
        raise LabError(f"submission folder {folder!r} does not exist")
    entries, skipped = [], []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not name.startswith(".") and name not in NO_STUDENT:
            entries.append(_student(path, file_name(name), starter))
        elif _a_submission(folder, name):
            entries.append(path)
        elif (link := _dangling(path)) and _a_python_name(name):  # (a student's file: a row saying what it is)
            entries.append(NotGraded(file_name(name), link))
        elif not name.startswith(".") and os.path.isfile(path) and (why := _almost_python(name)):
            entries.append(NotGraded(file_name(name), why))  # (a student's work in another form: a row, not
            # only a line on stderr, so the grade book has the student)
        else:
            skipped.append(file_name(name) + ("/" if os.path.isdir(path) else "") + (f" ({link})" if link else ""))
    if skipped:
        print(f"left out (not a .py file, or hidden): {_listed(skipped)}", file=sys.stderr)
    if not any(isinstance(entry, str) for entry in entries):
        unread = [f"{entry.label} ({entry.reason})" for entry in entries]
        raise LabError(f"submission folder {given!r} holds no .py file" + (
            f" to grade: {_listed(unread)}" if unread else ", and no folder holding one") +
            "; expected one file per student, side by side in DIR (alice.py, bob.py) or each in its own folder" +
            (f", named {starter} where it holds several" if unread else ""))
    return entries


def _student(path: str, name: str, starter: str) -> Union[str, NotGraded]:
    """A student's folder `path` (`name`, as said): the path of its one .py file, or of the one named `starter`;
    else a NotGraded saying why."""
    found = _python_files(path)
    pick = found[0] if len(found) == 1 else starter if starter in found else None
    if pick is not None:
        return os.path.join(path, pick)
    links = sorted(f for f in os.listdir(path) if _a_python_name(f) and _dangling(os.path.join(path, f)))
    link = starter if starter in links else links[0] if len(links) == 1 and not found else None
    if link is not None:  # the file it would grade: a link to none
        return NotGraded(f"{name}/{file_name(link)}", _dangling(os.path.join(path, link)))
    if found:
        shown = _listed([file_name(f) for f in found], 4)
        return NotGraded(f"{name}/", f"{len(found)} .py files ({shown}), none named {starter}")
    return NotGraded(f"{name}/", "no .py file" + (
        f" ({_listed([file_name(f) for f in links], 4)}: links to files that do not exist)" if links else
        _held(path)))


def _held(path: str) -> str:
    """What a student's folder with no .py file of its own holds, for its row: the .py files of the folders inside
    it (up to NESTED deep, which a grade does not search), else its entries (`ring_allreduce.py.txt`); "" where it
    holds nothing."""
    nested = []
    for root, folders, files in os.walk(path):
        deep = 0 if root == path else os.path.relpath(root, path).count(os.sep) + 1
        folders[:] = sorted(f for f in folders if _a_student_entry(f)) if deep < NESTED else []
        if deep:
            nested += [shown_path(os.path.relpath(os.path.join(root, f), path)) for f in sorted(files)
                       if _a_python_name(f)]
    if nested:
        return f" at its top (a grade does not search the folders inside it, which hold {_listed(nested, 4)})"
    held = [file_name(f) + ("/" if os.path.isdir(os.path.join(path, f)) else "") for f in sorted(os.listdir(path))
            if _a_student_entry(f)]
    return f"; it holds {_listed(held, 4)}" if held else ""


def _listed(names: list, most: int = 8) -> str:
    """`names` joined by commas, the first `most` of them and how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _python_files(folder: str) -> list:
    """The names of `folder`'s submission files (`_a_submission`), sorted."""
    return sorted(f for f in os.listdir(folder) if _a_submission(folder, f))


def _a_submission(folder: str, name: str) -> bool:
    """Whether `folder`'s entry `name` is a .py file that is not hidden (a folder named x.py is none)."""
    return _a_python_name(name) and os.path.isfile(os.path.join(folder, name))


def _a_student_entry(name: str) -> bool:
    """Whether a folder's entry `name` may be a student's work: not hidden, nor Python's or a zip's own folder."""
    return not name.startswith(".") and name not in NO_STUDENT


def _almost_python(name: str) -> str:
    """Why a file that holds a student's Python in a form grade does not read is not graded (its row's reason):
    `alice.PY`, `alice.py.txt` (saved as text), `alice.ipynb`; "" for any other file (notes.txt: no student's)."""
    lower = name.lower()
    if lower.endswith(".ipynb"):
        return "a Jupyter notebook: export its function as a .py file"
    if lower.endswith(".py") or ".py." in lower:
        return "not a .py file by its name: rename it to end in .py"
    return ""


def _a_python_name(name: str) -> bool:
    return name.endswith(".py") and not name.startswith(".")


def _dangling(path: str) -> str:
    """What `path` is where it is a link that leads to no file (its target named), else ""."""
    if not os.path.islink(path) or os.path.exists(path):
        return ""
    target = shown_path(os.readlink(path))
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"a link to '{target}', which does not exist"
    except OSError as exc:  # (a loop of links, a folder it may not enter)
        return f"a link to '{target}', which cannot be followed: {exc.strerror or exc}"
    return f"a link to '{target}'"
