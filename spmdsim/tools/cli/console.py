"""The `spmdsim` console script and `python -m spmdsim`: main() where a Ctrl-C at any moment is one line and
exit 130, its imports included (the first second of `spmdsim demo --ranks 8` is mostly importing, and a Ctrl-C
there printed a 66-line KeyboardInterrupt traceback). This module imports nothing else, so that the window
before its handler is as short as the interpreter's own start allows."""
from __future__ import annotations

import sys
from typing import Sequence

__all__ = ["console", "INTERRUPTED"]

#: What a Ctrl-C that reaches the command itself prints (a run on simulated ranks says more: which were stopped).
INTERRUPTED = "spmdsim: interrupted (Ctrl-C)"


def console(argv: Sequence[str] | None = None) -> int:
    """spmdsim.tools.cli.main.main(argv), with KeyboardInterrupt as one line on stderr and exit 130."""
    try:
        from .main import main  # here, not at the top: a Ctrl-C while importing is caught too

        return main(argv)
    except KeyboardInterrupt:
        try:
            print(INTERRUPTED, file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr gone as well
            pass
        return 130
