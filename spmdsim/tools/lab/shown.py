"""Text a verdict says about a submission, as a terminal and a UTF-8 grade book take it: a file name whose bytes
are not UTF-8 (os.listdir gives them as lone surrogates), a message of the submission's holding a lone surrogate,
each printed or written failed with UnicodeEncodeError (a traceback, a grade book cut short)."""
from __future__ import annotations

import os
import re

__all__ = ["printable", "file_name", "shown_path", "shortened", "shortened_apart"]

#: A lone surrogate: a byte of a file name that is not UTF-8 (os.listdir's surrogateescape), or one a submission's
#: message holds; a terminal or a UTF-8 grade book refuses it (UnicodeEncodeError, the grade book cut short).
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xdc00:02x}" if 0xdc80 <= code <= 0xdcff else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with each byte of a file name that is not UTF-8 said as \\xNN (as Python writes a byte), and any
    other lone surrogate as \\uNNNN: text any terminal and a UTF-8 grade book take."""
    return _SURROGATE.sub(_escaped, text)


def file_name(path: str) -> str:
    """The submission's file name as a verdict says it: printable, its control characters (a newline) escaped."""
    return shown_path(os.path.basename(path))


def shown_path(path: str) -> str:
    """`path` printable (`printable`), its control characters (a newline) escaped as Python writes them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in printable(path))


def shortened(name: str, width: int) -> str:
    """`name` within `width` characters: where longer, its start and its end with "..." between them (the end
    holds ".py", the start a student's name), so that what follows it on a line stays in view."""
    if len(name) <= width:
        return name
    head = (width - 3 + 1) // 2
    return name[:head] + "..." + name[len(name) - (width - 3 - head):]


def shortened_apart(names: list, width: int) -> list:
    """Each of `names` as `shortened` cuts it, but where two would read alike (the same start and end, their
    difference in the middle cut out) each shows the part where it differs from the others in place of its start:
    a table's rows are then told apart without the grade book."""
    cut = [shortened(name, width) for name in names]
    alike: dict = {}
    for i, text in enumerate(cut):
        alike.setdefault(text, []).append(i)
    for rows in alike.values():
        for i in rows if len(rows) > 1 else ():
            differ = min(_first_difference(names[i], names[j]) for j in rows if names[j] != names[i])
            cut[i] = _around(names[i], differ, width)
    return cut


def _first_difference(a: str, b: str) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _around(name: str, at: int, width: int) -> str:
    """`name` within `width`: the part from a little before `at`, then its end as `shortened` keeps it."""
    end = width - 3 - (width - 3 + 1) // 2
    start = max(0, at - 8)
    middle = width - end - 3 - (3 if start else 0)
    if start + middle >= len(name) - end:  # the part reaches the end: the end of the name, whole
        return "..." + name[len(name) - (width - 3):]
    return ("..." if start else "") + name[start:start + middle] + "..." + name[len(name) - end:]
