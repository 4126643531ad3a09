"""Who is where when the watchdog fires: the side channel behind its message (runtime.debug_calls).

Past its deadline a rank asks the other ranks of the collective's group (else
the world) where they are, with small point-to-point messages. Ranks answer
between the watchdog's polls once a wait has lasted `SERVE_S`, so a call that
completes sooner costs nothing more; a rank that is not waiting never answers.

Side channel: the guard's private duplicate of COMM_WORLD (process.world_channel),
else the collective's own communicator (point-to-point messages never match a
collective). Nothing here blocks; errors (a peer gone) mean "no answer".
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Optional

from ..base.ranks import compact_ranks
from .engines import engine_of, world
from . import process

SERVE_S = 0.1  # a waiting rank looks for questions this often, after waiting this long
_QUERY_TAG = 0x7351
_ANSWER_TAG = 0x7352
_SENDS: list[Any] = []  # pending Isend requests: they hold the pickled message until sent
_TOKENS = itertools.count(1)

State = tuple  # (op, axes, seq): what a rank waits in

_HINTS = {
    "check": ("; DTensor.check is collective: call it on every rank and print on one "
              "(verdict = y.check(ref); if rank == 0: print(verdict))"),
    "gather": "; DTensor.gather is collective: call it on every rank, not only on the root",
}
_GENERIC = (": a rank of its group is not in it: did one skip this collective (inside an `if` "
            "on the rank?) or call a different one (SPMDSIM_CHECK=1 names it), or is it still "
            "computing or stuck?")


def channel(comm: Any) -> Optional[tuple[Any, bool]]:
    """(side channel, whether it spans the world), or None when there is none."""
    side = process.world_channel()  # looked up there each time: a test replaces it
    if side is not None:
        return side, True
    return None if comm is None else (comm, False)


def _send(side: Any, message: Any, dest: int, tag: int) -> None:
    _SENDS[:] = [r for r in _SENDS if not r.Test()]
    _SENDS.append(engine_of(side).post_object(side, message, dest, tag))


def _me() -> int:
    return world().Get_rank()


def serve(side: Any, state: State) -> None:
    """Answer every question waiting on `side` with this rank's `state` (errors: no answer)."""
    try:
        me = _me()
        while True:
            got = engine_of(side).take_object(side, _QUERY_TAG)
            if got is None:
                return
            source, token = got
            _send(side, (token, me, state), source, _ANSWER_TAG)
    except Exception:  # noqa: BLE001 - a peer gone: the asking rank reports without this answer
        return


def survey(comm: Any, state: State, grace: float) -> Optional[dict[int, Optional[State]]]:
    """Ask the ranks of `comm` (None: of the world) where they wait; {world rank: state or None}.

    Answers questions meanwhile, for up to `grace` seconds; None without a side channel or on an MPI error.
    """
    found = channel(comm)
    if found is None:
        return None
    side, spans_world = found
    try:
        me = _me()
        if comm is None:
            names = list(range(world().Get_size()))
            dests = names
        else:
            names = engine_of(comm).world_ranks(comm)
            dests = names if spans_world else list(range(len(names)))
        token = (me, next(_TOKENS))
        for name, dest in zip(names, dests):
            if name != me:
                _send(side, token, dest, _QUERY_TAG)
        answers: dict[int, Optional[State]] = {me: state}
        deadline = time.monotonic() + grace
        while len(answers) < len(names) and time.monotonic() < deadline:
            serve(side, state)
            message = engine_of(side).take_object(side, _ANSWER_TAG)
            if message is None:
                time.sleep(0.002)
                continue
            got = message[1]
            if got[0] == token and got[1] in names:  # else a late answer to an earlier question
                answers[got[1]] = tuple(got[2])
        return {name: answers.get(name) for name in names}
    except Exception:  # noqa: BLE001 - a peer gone or an MPI error: report without the roster
        return None


def linger(comm: Any, state: State, seconds: float) -> None:
    """Keep answering questions for `seconds` (while another rank reports)."""
    found = channel(comm)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if found is not None:
            serve(found[0], state)
        time.sleep(0.005)


def drain(side: Any) -> None:
    """Drop every question and answer waiting on `side` (tests that survive a timeout)."""
    for tag in (_QUERY_TAG, _ANSWER_TAG):
        while engine_of(side).take_object(side, tag) is not None:
            pass


def ranks_text(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2,4-7`` (sorted world ranks; two in a row fold too: ``0-1``)."""
    return ("rank " if len(ranks) == 1 else "ranks ") + compact_ranks(ranks, run=2)


def on_axes(axes: Any) -> str:
    """``on ('mp',)``, or for a call on its communicator as a whole (no mesh axes named: DTensor.gather,
    DTensor.check, mpi4py's own calls) ``on its whole communicator``, not ``on ()``."""
    return f"on {tuple(axes)!r}" if len(axes) else "on its whole communicator"


def _where(state: State) -> str:
    op, axes, seq = state
    return f"{op} {on_axes(axes)} (seq {seq})"


def explain(state: State, answers: Optional[dict[int, Optional[State]]], group_known: bool,
            check_on: bool = False) -> str:
    """What the watchdog adds after "did not complete within N s": who waits where, who is missing."""
    hint = _HINTS.get(state[0], "")
    if not answers:
        return _GENERIC + hint
    same = [r for r, s in answers.items() if s == state]
    silent = [r for r, s in answers.items() if s is None]
    elsewhere: dict[State, list[int]] = {}
    for rank, where in answers.items():
        if where is not None and where != state:
            elsewhere.setdefault(where, []).append(rank)
    verb = lambda ranks: "waits" if len(ranks) == 1 else "wait"  # noqa: E731
    parts = [f"{ranks_text(same)} {verb(same)} in it"]
    for where, ranks in sorted(elsewhere.items(), key=lambda item: min(item[1])):
        parts.append(f"{ranks_text(ranks)} {verb(ranks)} in {_where(where)}")
    if silent:
        # Without the group, silent ranks may belong to other groups: "skipped one", not "this one".
        parts.append(f"{ranks_text(silent)} {'is' if len(silent) == 1 else 'are'} in no "
                     f"collective: skipped {'this one' if group_known else 'one'} (inside an `if` on "
                     "the rank?), or still computing, stuck or finished")
    elif not elsewhere:
        parts.append(f"every rank{' of its group' if group_known else ''} waits in it" + (
            " (an MPI problem?)" if check_on else
            ": do they pass different shapes or dtypes? (SPMDSIM_CHECK=1 compares the calls)"))
    text = ": " + "; ".join(parts)
    if elsewhere and group_known:
        text += " (held up elsewhere, or collectives called in different orders)"
    return text + hint
