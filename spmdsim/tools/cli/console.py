"""The `spmdsim` console script and `python -m spmdsim`: main() where a Ctrl-C at any moment is one line and
exit 130, its imports included (the first second of `spmdsim demo --ranks 8` is mostly importing, and a Ctrl-C
there printed a 66-line KeyboardInterrupt traceback). This module imports nothing else but the collector's
thresholds (spmdsim.base.collector: gc, contextlib and typing, loaded already), so that the window before its
handler is as short as the interpreter's own start allows (gc and importlib are the interpreter's own)."""
from __future__ import annotations

import gc
import importlib
import sys
from typing import Sequence

from ...base.collector import collect_less

__all__ = ["console", "INTERRUPTED", "DRY_RUN_COMMANDS"]

#: What a Ctrl-C that reaches the command itself prints (a run on simulated ranks says more: which were stopped).
INTERRUPTED = "spmdsim: interrupted (Ctrl-C)"


#: The commands whose work is dry runs (a search prices hundreds): millions of small records and dicts, most of
#: them kept to the end, which Python's cyclic garbage collector walked again and again (the estimate of
#: docs/explanation/estimate-published.md's 1T model, 128 layers on 3,072 ranks: 6 full collections, 1.1 of 6.3 CPU-s).
DRY_RUN_COMMANDS = ("estimate", "autoshard")


def console(argv: Sequence[str] | None = None) -> int:
    """spmdsim.tools.cli.main.main(argv), with KeyboardInterrupt as one line on stderr and exit 130."""
    try:
        from .main import main  # here, not at the top: a Ctrl-C while importing is caught too

        words = sys.argv[1:] if argv is None else list(argv)
        if words[:1] and words[0] in DRY_RUN_COMMANDS:
            _collect_less_often(words[0])
        return main(argv)
    except KeyboardInterrupt:
        try:
            print(INTERRUPTED, file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr gone as well
            pass
        return 130


def _collect_less_often(command: str) -> None:
    """For a dry-run command (a process of its own: console() is the console script's entry, which main() called
    in a test or a notebook is not): its module imported, everything imported so far left out of the garbage
    collector's passes (gc.freeze: modules, functions and classes are never garbage), and the collector run less
    often (spmdsim.base.collector.THRESHOLDS, in place of Python's (700, 10, 10): cycles are still collected,
    later). CPU-s without and with, the collector's share of each: that estimate 6.31 (23%) and 5.26 (4%); the
    3,072-device search of docs/howto/choose-configuration.md 5.67 (5%) and 5.46 (2%); its `--moe-cells` search
    of a 2-layer MoE GPT 4.56 (9%) and 4.35 (3%)."""
    importlib.import_module(f"{__package__}.{command}")
    gc.freeze()
    collect_less()
