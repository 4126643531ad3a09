"""Text a verdict says about a submission, as a terminal and a UTF-8 grade book take it: a file name whose bytes
are not UTF-8 (os.listdir gives them as lone surrogates), a message of the submission's holding a lone surrogate,
each printed or written failed with UnicodeEncodeError (a traceback, a grade book cut short)."""
from __future__ import annotations

import os
import re

__all__ = ["printable", "file_name", "shortened"]

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
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in printable(os.path.basename(path)))


def shortened(name: str, width: int) -> str:
    """`name` within `width` characters: where longer, its start and its end with "..." between them (the end
    holds ".py", the start a student's name), so that what follows it on a line stays in view."""
    if len(name) <= width:
        return name
    head = (width - 3 + 1) // 2
    return name[:head] + "..." + name[len(name) - (width - 3 - head):]
