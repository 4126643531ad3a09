"""Lists of ranks in words (``0-3,8``), for messages and pictures, and the command-line word that asks for
simulated ranks (``--ranks``); standard library only, so that a rank's error or a watchdog's report names
ranks without loading numpy."""
from __future__ import annotations

from typing import Sequence

__all__ = ["compact_ranks", "is_ranks_flag"]


def compact_ranks(ranks: Sequence[int], run: int = 3) -> str:
    """0,1 / 0-3 / 0,2,4: runs of `run` or more consecutive ranks become a-b."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i + 1 >= run:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i : j + 1])
        i = j + 1
    return ",".join(parts)


def is_ranks_flag(arg: str) -> bool:
    """Whether a command-line word names ``--ranks`` (``--ranks 8``, ``--ranks=8``): the flag or a prefix of it
    from ``--ra``, as argparse reads the CLI's (``--rank 8`` must not run one process silently)."""
    flag = arg.partition("=")[0]
    return len(flag) >= len("--ra") and "--ranks".startswith(flag)
