"""One warning for names and argument orders kept one release after a rename; standard library only."""
from __future__ import annotations

import warnings


def deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn (DeprecationWarning) that `old` goes in the next release and `new` replaces it."""
    warnings.warn(f"{old} is deprecated and goes in the next release; use {new}",
                  DeprecationWarning, stacklevel=stacklevel)
