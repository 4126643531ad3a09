"""The one line of an error every simulated rank raised (`every_ranks_line`): --ranks N (spmdsim.runtime.sim.launch)
and spmdsim mpirun end a run with it and exit 2, as the MPI guard ends a job (spmdsim.runtime.guard)."""
from __future__ import annotations

from typing import Optional

from ...base.sizes import out_of_memory
from ...errors import SpmdsimError
from .waiting import ranks_text

__all__ = ["every_ranks_line"]


def every_ranks_line(exc: BaseException, n: int) -> Optional[str]:
    """The one line of an error every one of the `n` ranks raised, each an SpmdsimError or a MemoryError (the
    errors the MPI guard ends a job with in one line and exit 2, whatever their text or class on each rank),
    else None. Rank 0's text, as under MPI, and where the texts differ, the ranks that said it and the next
    text with its ranks: 'TEXT (rank 0; ranks differ: ranks 1,3: TEXT; 1 more text on rank 2)'.

    The texts need not be alike, nor the classes: a shard's size in the message (DTensor.from_local), or a
    ShapeError on one rank and an SpmdsimError on the others, is still the one line and exit 2 (not exit 1 with
    'error on simulated rank 0')."""
    failures = getattr(exc, "simulated_failures", None)
    if failures is None:  # a dry run's: one rank ran for all, its error every rank's (spmdsim.runtime.sim.run._dry_run)
        failures = tuple((rank, type(exc), str(exc)) for rank in getattr(exc, "simulated_ranks", ()))
    if len(failures) != n or not all(issubclass(kind, (SpmdsimError, MemoryError)) for _, kind, _ in failures):
        return None
    texts: dict[str, list[int]] = {}  # text -> the ranks that raised it, in order of their lowest rank
    for rank, kind, text in failures:
        if not issubclass(kind, SpmdsimError):  # a MemoryError: as the guard turns it into an SpmdsimError
            text = out_of_memory(MemoryError(text))
        texts.setdefault(text, []).append(rank)
    (first, ranks), *others = texts.items()
    if not others:
        return first
    (text, theirs), rest = others[0], others[1:]
    more = ""
    if rest:
        left = sorted(r for _, rs in rest for r in rs)
        more = f"; {len(rest)} more {'text' if len(rest) == 1 else 'texts'} on {ranks_text(left)}"
    return f"{first} ({ranks_text(ranks)}; ranks differ: {ranks_text(theirs)}: {text}{more})"
