"""Sizes in words, the one error a block too large to map raises, and the one line for a MemoryError that
the memory check did not prevent; numpy's dtype only."""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ..errors import ResourceError

__all__ = ["UnmappableError", "format_size", "out_of_memory", "ENV_VAR"]

#: What a rank may use (spmdsim.programs.memory reads it).
ENV_VAR = "SPMDSIM_MEMORY"


def format_size(n: int) -> str:
    """1610612736 -> '1.5 GiB' (binary units, 3 significant digits, never more than 999 of a unit
    but the last; exact below 1 KiB)."""
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    power = min((n.bit_length() - 1) // 10, len(units))
    if float(f"{n / 1024 ** power:.3g}") >= 1000 and power < len(units):
        power += 1  # 1000-1023 units would read "1e+03": say it in the next unit
    value = n / 1024 ** power
    return f"{value:.3g} {units[power - 1]}" if value < 1000 else f"{value:,.0f} {units[power - 1]}"


class UnmappableError(ResourceError):
    """A dry run's block this machine cannot map even as pages never written: more than its address space has
    left (a dry run costs no memory for its blocks, but still their addresses). `shape`, `dtype`, `nbytes`:
    the block's; the modelled rank would hold it, which `spmdsim estimate` and its search compare with a
    GPU's memory."""

    def __init__(self, shape: tuple, dtype: Any, nbytes: int) -> None:
        self.shape, self.dtype, self.nbytes = shape, dtype, nbytes
        super().__init__(f"the dry run cannot map a block of shape {shape} {dtype} ({format_size(nbytes)}): more "
                         "than this machine's address space has left (a dry run's blocks cost no memory, but "
                         "still their addresses)")


def out_of_memory(exc: MemoryError, env: Optional[Mapping[str, str]] = None) -> str:
    """One line for a MemoryError the estimate did not prevent (numpy's own, with the check off or short)."""
    env = os.environ if env is None else env
    value = env.get(ENV_VAR, "").strip()
    if value.lower() in ("off", "none"):
        why = f"the memory check is off ({ENV_VAR}={value}): unset it to have such a run refused before it starts"
    else:
        why = f"{ENV_VAR} sets what a rank may use"
    return f"out of memory: {exc}; {why}"
