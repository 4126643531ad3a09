"""The spmdsim exception family: every user-facing error subclasses SpmdsimError."""
from __future__ import annotations

__all__ = ["SpmdsimError", "LayoutError", "ShapeError", "DTypeError", "RankError", "DialectError", "OperatorError",
           "PlanError", "RuntimeMismatchError", "CheckFailed"]


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
