"""Argument types shared by the bench scripts: a bad value is refused in argparse.

Every rank parses the same arguments before MPI work starts, so a value refused
here stops every rank alike (exit code 2) with one message, which only rank 0
prints (`ArgumentParser`, the spmdsim command's own parser class). Imported by
the scripts of this folder as a sibling (they put the folder on sys.path).
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Callable

from spmdsim.tools.cli.calibrate import parse_size
from spmdsim.tools.cli.main import OnceParser as ArgumentParser  # usage and errors printed by rank 0 only
from spmdsim.base.threads import launcher_rank

__all__ = ["ArgumentParser", "launcher_rank", "byte_size", "byte_sizes", "int_at_least",
           "positive_float", "existing_file", "output_path"]

MAX_BYTES = 1 << 40  # 1 TiB per rank: far above what these benchmarks can allocate


def byte_size(text: str, minimum: int = 1) -> int:
    """'64K' -> 65536, as `spmdsim calibrate` reads sizes; refuses values below `minimum`."""
    body = text.strip()
    negative = body.startswith("-")  # parse_size refuses these with a message of its own
    try:
        value = parse_size(body[1:] if negative else body)
    except (argparse.ArgumentTypeError, ValueError, OverflowError) as e:  # OverflowError: 'inf'
        what = "not a whole number of bytes; expected" if "whole number" in str(e) else "not"  # '0.5', '1.5'
        raise argparse.ArgumentTypeError(f"size {text!r} is {what} a byte count like 4096, 64K or 4M") from None
    value = -value if negative else value
    if value < minimum:
        raise argparse.ArgumentTypeError(f"size {text!r} is {value} bytes; expected at least {minimum}")
    if value > MAX_BYTES:
        raise argparse.ArgumentTypeError(f"size {text!r} is above 1T; expected at most {MAX_BYTES} bytes")
    return value


def byte_sizes(minimum: int = 1) -> Callable[[str], list[int]]:
    """An argparse type: a comma list of sizes ('64K,1M'), each at least `minimum` bytes."""
    def sizes(text: str) -> list[int]:
        return [byte_size(item, minimum) for item in text.split(",")]
    return sizes


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum`."""
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return value
    return whole


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (float() also takes 'nan' and 'inf')."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def existing_file(text: str) -> str:
    """An argparse type: a file that exists (a named input is never silently replaced by a default)."""
    if not os.path.isfile(text):
        what = "is a folder" if os.path.isdir(text) else "does not exist"
        raise argparse.ArgumentTypeError(f"file {text!r} {what}; expected an existing file")
    return text


def output_path(text: str) -> str:
    """An argparse type: a file to write at the end of a run, checked now so the run is not lost.

    Stricter than the CLI's `check_output_file`: the scripts open the file as
    given, so its folder must exist already.
    """
    folder = os.path.dirname(os.path.abspath(text)) if text else ""
    if not text or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name; expected a file to write")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {folder!r} is not an existing folder")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: folder {folder!r} is not writable")
    return text
