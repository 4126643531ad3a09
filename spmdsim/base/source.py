"""A Python source file's bytes decoded as ``python file.py`` reads them (PEP 263), for those who run a file
themselves: the grader (spmdsim.tools.lab.harness) and `spmdsim mpirun` (spmdsim.emulator.mpirun_target).

compile() of the bytes is not enough: it takes a non-UTF-8 byte in a comment, which ``python file.py`` refuses
(an import or ``python -m`` of the same file takes it too). `decode_source` refuses what python refuses, with
what each caller words its refusal from.
"""
from __future__ import annotations

import tokenize
from typing import Optional

__all__ = ["SourceDecodeError", "decode_source"]


class SourceDecodeError(ValueError):
    """Source python would not run: `declaration` (the coding line's own problem: an unknown coding, a BOM
    beside another coding; None otherwise), else a byte that does not decode: `coding` (the declared one, or
    "utf-8"), `codec` (the codec's name for it, as a UnicodeDecodeError gives it), `byte` and its `line`."""

    def __init__(self, declaration: Optional[str] = None, coding: str = "utf-8", codec: str = "utf-8",
                 byte: int = 0, line: int = 0) -> None:
        super().__init__(declaration or f"byte {byte:#04x} at line {line} is not {codec}")
        self.declaration, self.coding, self.codec, self.byte, self.line = declaration, coding, codec, byte, line


def decode_source(source: bytes) -> str:
    """`source` as text, in the coding its first two lines declare, else UTF-8; SourceDecodeError where python
    would refuse it."""
    lines = iter(source.splitlines(keepends=True))
    try:
        coding = tokenize.detect_encoding(lambda: next(lines, b""))[0]
    except SyntaxError as exc:  # a coding python does not know, a BOM beside another, or non-UTF-8 first lines
        if "invalid or missing" not in str(exc):
            raise SourceDecodeError(str(exc)) from None
        coding = "utf-8"
    try:
        return source.decode(coding)
    except UnicodeDecodeError as exc:
        raise SourceDecodeError(None, coding, exc.encoding, source[exc.start],
                                source[:exc.start].count(b"\n") + 1) from None
