"""The spmdsim exception family: every user-facing error subclasses SpmdsimError."""
from __future__ import annotations

__all__ = ["fold_message", "SpmdsimError", "LayoutError", "ShapeError", "DTypeError", "RankError", "DialectError", "OperatorError",
           "PlanError", "RuntimeMismatchError", "CheckFailed"]


#: Columns of a printed error line (spmdsim.viz.table.WIDTH: every default output).
WIDTH = 100


def fold_message(text: str, width: int = WIDTH) -> str:
    """`text` with each line longer than `width` folded at spaces onto lines indented two more.

    An error stays one message: its first line still starts with what it names, and
    joining each continuation line onto the one before (one space) gives it back.
    """
    import textwrap

    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        out.extend(textwrap.wrap(line.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ",
                                 break_on_hyphens=False, break_long_words=True, drop_whitespace=True))
    return "\n".join(out)


class SpmdsimError(Exception):
    """Base of every error spmdsim raises on purpose."""


class LayoutError(SpmdsimError, ValueError):
    """A device matrix, alias or tensor map is invalid."""


class ShapeError(SpmdsimError, ValueError):
    """A shape does not fit a layout (length, divisibility, local shard shape)."""


# DTypeError and RankError subclass ShapeError, which spmdsim raised for them before:
# code that catches ShapeError keeps working.
class DTypeError(ShapeError):
    """A dtype the operation cannot take (not sendable, not summable, mismatched)."""


class RankError(ShapeError):
    """A rank argument (a bcast or gather root, an exchange peer) outside its group."""


class DialectError(SpmdsimError, ValueError):
    """A strategy, SBP, placement or PartitionSpec is malformed or not expressible."""


class OperatorError(SpmdsimError, ValueError):
    """Operator inputs are inconsistent (layouts, ids, dtypes)."""


class PlanError(SpmdsimError, ValueError):
    """A redistribution cannot be planned between the given layouts."""


class RuntimeMismatchError(SpmdsimError, RuntimeError):
    """The MPI world does not match what the program needs (size, divergence)."""


class CheckFailed(SpmdsimError, AssertionError):
    """A distributed result differs from its reference beyond tolerance."""
