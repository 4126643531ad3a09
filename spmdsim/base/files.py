"""Writing a file so that no reader sees half of it: `write_aside` writes beside the path and renames onto it (a
GPT checkpoint's files, spmdsim.models.gpt.checkpoint_files; the lab's grade book, spmdsim.tools.lab.cli), and
`reason` says an exception as a refusal's line does."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Optional

__all__ = ["reason", "write_aside"]


def reason(e: BaseException) -> str:
    """An exception as a refusal says it: an OSError's strerror, else its text, else its type's name."""
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__


def write_aside(path: str, write: Callable[[Any], Any], *, text: bool = False) -> Optional[str]:
    """`write(file)` into a file beside `path` (binary; `text`: UTF-8 text, newlines as written), renamed onto it:
    a reader, a crash or a second writer finishing at once never leaves half a file. A link is followed (the file
    it names replaced, the link kept); a file replaced keeps its mode bits; a device or a pipe (/dev/stdout) is
    written in place. None, or why not (`reason`: an OSError's), the file beside it then removed; another
    exception of `write` is raised, the file beside it removed too."""
    target = os.path.realpath(path)
    in_place = os.path.exists(target) and not os.path.isfile(target)
    aside = target if in_place else f"{target}.{os.getpid()}.partial"
    try:
        with open(aside, *(("w",) if text else ("wb",)), **({"newline": "", "encoding": "utf-8"} if text else {})) as f:
            write(f)
        if not in_place:
            with contextlib.suppress(OSError):  # (a file written before keeps who may read it)
                os.chmod(aside, os.stat(target).st_mode & 0o7777)
            os.replace(aside, target)
    except BaseException as e:
        if not in_place and os.path.isfile(aside):
            with contextlib.suppress(OSError):
                os.remove(aside)
        if isinstance(e, OSError):
            return reason(e)
        raise
    return None
