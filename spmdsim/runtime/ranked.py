"""Print each rank's lines in rank order, on one rank, with identical ones folded.

Under ``mpiexec`` every rank's ``print`` races to the terminal and lines
interleave ("30 1check passed"). Here every rank hands its lines to the
communicator's lower-case ``gather`` (pickled objects), and the root prints
them rank by rank; ranks that printed the same lines share one entry:

    print_ranked(comm, y.check(ref))        # ranks 0-7: check passed: ...

    with rank_ordered(comm) as out:         # print-like, printed when the block ends
        out.print("rank", comm.rank, "holds", x.local.shape)

No mpi4py import: any object with ``gather``, ``Get_rank``/``rank`` works
(mpi4py's communicators and the simulated ranks' alike), and a Mesh stands for its ``comm``. Every rank of the
communicator must call it, as any collective.
"""
from __future__ import annotations

import sys
from typing import IO, Any, Sequence

from ..base.validate import as_int, describe
from ..errors import RankError, SpmdsimError
from ..programs.viz.model import compact_ranks
from ..programs.viz.table import WIDTH, nbytes, wrap_lines
from . import door
from .mesh import Mesh

__all__ = ["print_ranked", "gather_ranked", "fold_ranked", "rank_ordered", "trace_lines"]


class NotACommunicator(SpmdsimError, TypeError):
    """A `comm` argument that is no communicator nor Mesh (None, a number): a TypeError, as Python's."""


def fold_ranked(per_rank: Sequence[Sequence[str]], fold: bool = True) -> list[str]:
    """Lines of every rank in rank order; with `fold`, ranks with the same lines share one entry.

    A one-line entry reads ``ranks 0-3: text``; a longer one puts ``ranks 0-3:``
    on its own line and indents the lines under it. Ranks with no lines are left out.

    Args:
        per_rank: the lines of rank 0, 1, ... (as `gather` returns them).
        fold: group ranks whose lines are identical (False: one entry per rank).
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank, lines in enumerate(per_rank):
        key = tuple(lines)
        if key:
            groups.setdefault(key if fold else key + (f"\0{rank}",), []).append(rank)
    out = []
    for key, ranks in sorted(groups.items(), key=lambda item: item[1][0]):
        lines = [line for line in key if not line.startswith("\0")]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compact_ranks(ranks)}"
        if len(lines) == 1 and "\n" not in lines[0]:
            out.append(f"{who}: {lines[0]}")
        else:
            out.append(f"{who}:")
            out.extend("  " + part for line in lines for part in line.split("\n"))
    return out


def trace_lines(trace: Any) -> list[str]:
    """This rank's communicating collectives (a Trace or its entries), one line each, no timings.

    Without timings the lines of ranks that moved the same bytes are identical,
    so `print_ranked` folds them: ``ranks 0-7: allreduce over ('k',) (group of 4): ...``.
    """
    entries = getattr(trace, "entries", trace)
    return [f"{e.op} over {e.axes!r} (group of {e.group_size}): sent {nbytes(e.bytes_sent)}, "
            f"received {nbytes(e.bytes_received)}" for e in entries if e.group_size > 1] or [
        "no communication"]


def _rank(comm: Any) -> int:
    get = getattr(comm, "Get_rank", None)
    return int(get() if get else comm.rank)


def _size(comm: Any) -> int | None:
    """The number of ranks of `comm`, None where it says none (an object with ``gather`` alone)."""
    get = getattr(comm, "Get_size", None)
    return as_int(get() if callable(get) else getattr(comm, "size", None))


def gather_ranked(comm: Any, lines: Sequence[Any], root: int = 0, fold: bool = True,
                  width: int | None = WIDTH) -> list[str] | None:
    """Gather every rank's `lines` to `root`: the folded lines there (wrapped to `width`), else None.

    `comm`: a communicator, or a Mesh (its ``comm``: ``print_ranked(mesh, ...)`` works as with ``mesh.comm``)."""
    return _gathered(comm, lines, root, fold, width, "gather_ranked")


def print_ranked(comm: Any, *lines: Any, root: int = 0, fold: bool = True,
                 width: int | None = WIDTH, file: IO[str] | None = None) -> None:
    """Print every rank's `lines` on `root`, in rank order, identical ones folded (a collective).

    A line longer than `width` columns (an integer >= 1) wraps (None: never).
    """
    text = _gathered(comm, lines, root, fold, width, "print_ranked")
    if text is not None:
        print("\n".join(text), file=file or sys.stdout, flush=True)


def _gathered(comm: Any, lines: Sequence[Any], root: Any, fold: bool, width: Any, what: str) -> list[str] | None:
    """`gather_ranked`'s lines, its arguments checked first (one line naming `what` and the bad value, before the
    gather): `comm` a communicator or a Mesh, `root` one of its ranks, `width` an integer >= 1 or None."""
    if isinstance(comm, Mesh):
        comm = comm.comm
    if not hasattr(comm, "spmdsim_engine") and not callable(getattr(comm, "gather", None)):
        raise NotACommunicator(f"{what}: comm must be a communicator (mpi4py's or a simulated one) or a Mesh, "
                               f"got {describe(comm)}")
    size = _size(comm)
    at = as_int(root)
    if at is None or at < 0 or (size is not None and at >= size):
        raise RankError(f"{what}: root {root!r} is not a rank of the communicator; expected an integer "
                        + (f"0 <= root < {size}" if size is not None else ">= 0"))
    if width is not None and (as_int(width) is None or width < 1):
        raise SpmdsimError(f"{what}: width {width!r} must be an integer >= 1 (columns), or None (never wrap)")
    per_rank = door.gather_object(comm, [str(line) for line in lines], at)
    if _rank(comm) != at:
        return None
    text = fold_ranked(per_rank, fold)
    return wrap_lines(text, width) if width is not None else text


class rank_ordered:  # noqa: N801 - used like a function: ``with rank_ordered(comm) as out``
    """Collect this rank's ``out.print(...)`` lines; print all ranks' in order when the block ends.

    The gather runs at the end of the block on every rank, so every rank must
    reach it: an exception inside the block skips it (the job's guard ends the run).
    """

    def __init__(self, comm: Any, root: int = 0, fold: bool = True, width: int | None = WIDTH,
                 file: IO[str] | None = None) -> None:
        self.comm, self.root, self.fold, self.width, self.file = comm, root, fold, width, file
        self.lines: list[str] = []

    def print(self, *values: Any, sep: str = " ") -> None:
        """Keep one line, as ``print`` would write it."""
        self.lines.append(sep.join(str(v) for v in values))

    def __enter__(self) -> "rank_ordered":
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            print_ranked(self.comm, *self.lines, root=self.root, fold=self.fold, width=self.width,
                         file=self.file)
