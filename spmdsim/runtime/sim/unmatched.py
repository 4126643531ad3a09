"""Why a waiting point-to-point request finds no message, as a deadlock report says it (Request.why_stuck in
spmdsim.runtime.sim.requests, which sits above this module; read with the world lock held).

A receive that waits does not take any message pending for its rank: were one of its source and tag on its
communicator pending, the two would have matched as the later was posted (spmdsim.runtime.sim.p2p). So each
pending send to the rank is a mismatch, said with what differs: 'rank 0's send to rank 1 has tag 1, not 2',
'the message pending for rank 1 is from rank 0 (tag 0), not from rank 2', 'rank 0's send to rank 1 (tag 0) is
on a Dup of the world, not the world'; with none, 'no rank has sent to rank 1'. A send that waits is said so when
its destination waits in a receive that does not take it (a Sendrecv's, whose send part a report names): no
amount of MPI buffering helps those, unlike Sends that wait for receives their ranks post later
(spmdsim.runtime.sim.landing.sends_wait). A `send` or `recv` here is one of the requests' Requests, a `group`
their communicator's Group (spmdsim.runtime.sim.groups)."""
from __future__ import annotations

from typing import Any

from ._mpi import special
from .landing import rank_name

__all__ = ["MISMATCH", "NO_MATCH", "recv_unmatched", "send_unmatched"]

#: How a waiting call's clause ends where it names messages that do not match it.
NO_MATCH = "no message matches"

#: The report's advice where a waiting call's messages do not match (said once, after the calls).
MISMATCH = ("a receive takes only a message of its source and tag on its own communicator: check the tags, sources "
            "and communicators named, and the order the messages are sent in")

#: At most this many messages a waiting call does not take are named, the others counted.
SHOWN = 3


def _said(found: list) -> str:
    """'; A; B: no message matches' of the mismatches `found` (the first SHOWN, then how many more)."""
    shown = found[:SHOWN] + ([f"and {len(found) - SHOWN} more"] if len(found) > SHOWN else [])
    return "; " + "; ".join(shown) + f": {NO_MATCH}"


def _from(group: Any, peer: int) -> str:
    return "any rank" if peer == special("ANY_SOURCE") else rank_name(group, peer)


def _pending(send: Any, recv: Any) -> str:
    """How pending `send`, to `recv`'s rank on its communicator, differs from what `recv` takes."""
    group = recv.group
    if recv.peer in (send.me, special("ANY_SOURCE")):  # the source fits: the tag does not
        return f"{rank_name(group, send.me)}'s send to {rank_name(group, recv.me)} has tag {send.tag}, not {recv.tag}"
    return (f"the message pending for {rank_name(group, recv.me)} is from {rank_name(group, send.me)} (tag "
            f"{send.tag}), not from {rank_name(group, recv.peer)}")


def _elsewhere(send: Any, group: Any) -> str:
    """`send`, to the rank of a receive on `group`, is on another communicator."""
    other = send.group
    on = other.label()
    on = f"{on}, not {group.label()}" if on != group.label() else f"another communicator ({on})"
    return f"{rank_name(other, send.me)}'s send to {rank_name(other, send.peer)} (tag {send.tag}) is on {on}"


def recv_unmatched(world: Any, recv: Any) -> tuple[str, str]:
    """What a report adds to waiting receive (or probe) `recv`, and its advice ('' for none): the messages
    pending for its rank, which it does not take (its communicator's, then those of other communicators to
    the same world rank, in the order sent), or that no rank has sent to it."""
    group, me = recv.group, recv.me
    found = [_pending(s, recv) for s in group.sends if s.peer == me]
    rank = group.members[me]
    others = [s for other in list(world.groups) if other is not group
              for s in other.sends if other.members[s.peer] == rank]
    found += [_elsewhere(s, group) for s in sorted(others, key=lambda s: s.seq or 0)]
    if not found:
        return f"; no rank has sent to {rank_name(group, me)}", ""
    return _said(found), MISMATCH


def _refused(recv: Any, send: Any) -> str:
    """How the receive `recv` that `send`'s destination waits in differs from `send`."""
    group = recv.group
    if recv.peer in (send.me, special("ANY_SOURCE")):  # the source fits: the tag does not
        return (f"{rank_name(group, recv.me)}'s receive from {_from(group, recv.peer)} has tag {recv.tag}, not "
                f"{send.tag}")
    tag = "any tag" if recv.tag == special("ANY_TAG") else f"tag {recv.tag}"
    return (f"{rank_name(group, recv.me)}'s receive is from {rank_name(group, recv.peer)} ({tag}), not from "
            f"{rank_name(group, send.me)}")


def send_unmatched(world: Any, send: Any) -> tuple[str, str]:
    """What a report adds to waiting `send`, and its advice: the receives its destination waits in that do not
    take it (('', '') for none). A receive counts that its rank waits in now: a blocking Recv's or Sendrecv's,
    or a nonblocking one the rank waits for (not deferring: spmdsim.runtime.sim.landing.let_land), other than
    the request the destination's own clause names (which says the mismatch from its side). A receive posted
    early (an Irecv not yet waited for) is no mismatch: a later receive of the rank may take the send."""
    group, dest = send.group, send.peer
    waits = world.waiting.get(group.members[dest]) if 0 <= dest < group.size else None
    named = getattr(waits, "token", None)
    found = [_refused(r, send) for r in group.recvs if r.me == dest and not r.defer and r is not named]
    return (_said(found), MISMATCH) if found else ("", "")
