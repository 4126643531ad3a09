"""OnceParser: the ArgumentParser of spmdsim's commands (the CLI, python -m spmdsim.nets, the scripts).

A module of its own, below the packages: spmdsim.nets uses it without importing spmdsim.cli,
which imports spmdsim.nets (docs/architecture.md: packages import downwards).
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import IO

from ._threads import launcher_rank
from .errors import fold_message

class OnceParser(argparse.ArgumentParser):
    """An ArgumentParser that prints usage, help and errors on rank 0 only.

    Every rank parses the same command line, so each would print the same
    message: under ``mpiexec -n 8`` a typo gave eight usage blocks. The other
    ranks still exit with the same code, without MPI (nothing has started).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # `--shape -8,8` and `--flops -1e9`: a value that starts with a minus and a digit is a
        # value (then refused by its own check, which names it), not an unknown option.
        self._negative_number_matcher = re.compile(r"^-\d[\d,.eE+-]*$|^-\.\d")

    def _print_message(self, message: str, file: IO[str] | None = None) -> None:
        if launcher_rank() == 0:
            super()._print_message(message, file)

    def error(self, message: str):  # type: ignore[override]
        """Usage, then the error folded within 100 columns (its first line names the value)."""
        self.print_usage(sys.stderr)
        self.exit(2, fold_message(f"{self.prog}: error: {message}") + "\n")
