"""What a simulated rank waits in, as a report names it (spmdsim.runtime.sim.report, the engine's
deadlock and timeout messages). A `group` here is a communicator's (spmdsim.runtime.sim.groups.Group, which
builds on this module), or None: it is asked only for its ``label()``."""
from __future__ import annotations

from typing import Any, Optional

from ...base.ranks import compact_ranks

__all__ = ["ranks_text", "after_the_end"]


def ranks_text(ranks: Any) -> str:
    """'rank 3' or 'ranks 0-2,5' (runs of three or more folded)."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compact_ranks(ranks)}"


def after_the_end(what: "_Waiting", rank: int) -> str:
    """Why rank `rank`'s wait in `what` cannot be: its simulation ended (a DTensor or communicator that simulate
    returned, used in a later cell), not a deadlock report of ranks that 'finished', nor a wait for good."""
    return (f"{what.text()}: a collective on simulated rank {rank}'s communicator after its simulation ended "
            "(simulate returned it, in a DTensor or as it is); collectives run inside simulate's fn, on every rank: "
            "return what you need from there (x.local, the array a gather gives, a check's verdict)")


class _Waiting:
    """What a rank waits in: a collective (group, call number) or a point-to-point request (`op` None: the
    request's own words, ``token._what()``, or the first three of a Waitany's tuple of requests, made only
    for a report: a Recv waits once per message)."""

    __slots__ = ("_op", "group", "seq", "token")

    def __init__(self, op: Optional[str], group: Any, seq: Optional[int], token: Any = None) -> None:
        self._op, self.group, self.seq, self.token = op, group, seq, token

    @property
    def op(self) -> str:
        if self._op is not None:
            return self._op
        token = self.token
        if type(token) is tuple:
            return " | ".join(p._what() for p in token[:3])
        return token._what()

    def key(self) -> tuple:
        return (self.op, id(self.group), self.seq, id(self.token) if self.token is not None else None)

    def text(self) -> str:
        token = self.token
        if self._op is None and token is not None:  # requests: each on its own communicator (a Waitall's or a
            # Waitany's may be on several: the group the wait began with need not be the one of the request named)
            shown = token[:3] if type(token) is tuple else (token,)
            groups = {id(r.group) for r in shown}
            if len(groups) == 1:
                return f"{self.op}{_on(shown[0].group)}"
            return " | ".join(f"{r._what()}{_on(r.group)}" for r in shown)
        number = "" if self.seq is None else f" (call {self.seq})"
        return f"{self.op}{_on(self.group)}{number}"


def _on(group: Any) -> str:
    return "" if group is None else f" on {group.label()}"
