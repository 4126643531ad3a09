"""What a deadlock report says: who waits in what, where in the program, and where the others are.

Read with the world lock held, once, when a World finds that no rank can go on
(spmdsim.runtime.sim.engine). A rank's program line is the innermost frame of its
thread outside spmdsim (``prog.py:13``), read from the waiting threads' frames;
a point-to-point request adds what it knows (Request.why_stuck: the peer that
finished, the messages that do not match a receive and why, or that no rank has sent to it,
sends that wait for each other), and its advice once, after the calls.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
from typing import Any, Optional

from ...errors import fold_message
from .rank_threads import THREAD_KEYS
from .waiting import _Waiting, ranks_text

__all__ = ["explain", "timed_out", "unfold", "program_lines", "whereabouts", "places"]

#: At most this many waiting calls are described one by one; the others are counted.
MAX_CLAUSES = 6

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # spmdsim/
_SKIPPED = (_PACKAGE + os.sep, os.path.abspath(threading.__file__))


def explain(world: Any, polling: Optional[tuple] = None,
            head: str = "simulated ranks deadlock (every live rank waits, none can go on)",
            first: Optional[int] = None) -> str:
    """Who waits in what, where in their program, and for each waited-on call where the others are
    (`polling`: (key, request, why: '' for "no rank left can complete it", call) of a rank, or a thread a rank
    started, that polls in vain), after `head`; `first`: the key whose call `head` names (described first)."""
    by_call: dict[tuple, tuple[Any, list[int]]] = {}
    if first is not None:
        by_call[world.waiting[first].key()] = (world.waiting[first], [])
    for key, what in sorted(world.waiting.items()):  # a rank's own threads wait under keys of their own
        by_call.setdefault(what.key(), (what, []))[1].append(key)
    clauses, hints, rest = [], [], []
    if polling is not None:
        key, token, why, call = polling
        more, hint = token.why_stuck(world)
        hints += [hint] if hint else []
        why = why or "and no rank left can complete it"
        clauses.append(f"{_Waiting(token._what(), token.group, None).text()}: {_threads_text(world, [key])} polls "
                       f"it ({call}), {why}{more}{program_lines(world, [key])}")
        if why == "while every other live rank waits or polls in vain":  # every poller, each on its own line
            for other, request, how in world.idle_polls():
                if other != key:
                    more, hint = request.why_stuck(world)
                    hints += [hint] if hint and hint not in hints else []
                    clauses.append(f"{_Waiting(request._what(), request.group, None).text()}: "
                                   f"{_threads_text(world, [other])} polls it ({how}) in vain{more}"
                                   f"{program_lines(world, [other])}")
    for what, keys in by_call.values():
        ranks = sorted({world.rank_of(k) for k in keys})
        if len(clauses) == MAX_CLAUSES:  # a ring of 64 blocked sends: the first few say it
            rest += ranks
            continue
        who = ranks_text(ranks) if len(keys) == len(ranks) and keys == ranks else _threads_text(world, keys)
        clause = f"{who} {'waits' if len(keys) == 1 else 'wait'} in it"
        if first is None or clauses:  # the call `first` waits in is the head's: not said twice
            clause = f"{what.text()}: {clause}"
        if what.group is not None and what.token is None:
            clause += places(world, [m for m in what.group.members if m not in ranks])
        more, hint = _why_stuck(world, what.token)
        clause += more
        if hint and hint not in hints:
            hints.append(hint)
        clause += program_lines(world, keys)
        clauses.append(clause)
    if rest:
        clauses.append(f"and {len(by_call) - MAX_CLAUSES + (polling is not None)} more calls, where "
                       f"{ranks_text(rest)} wait")
    # One call (or hint) a line, each folded within 100 columns: at 4 ranks the report on one line
    # is 465 columns. unfold() gives back the one-line form. The call the head names is the
    # first line after it, not on the head's line: a printer that puts "spmdsim: error on rank 0: " before
    # the head folds that line again, which would cut the call's clause in two ("ranks 0,2,3 wait in\n  it;").
    return fold_message(head + ":" + "".join(f"\n  {clause}" for clause in clauses + hints))


def _why_stuck(world: Any, token: Any) -> tuple[str, str]:
    """What a report adds to a waiting call of point-to-point requests (Request.why_stuck), and its hint: of a
    Waitany's or Waitsome's tuple, those of the requests its call names (the first three), each said once, as
    a Recv's ('; no rank has sent to rank 1', more than which requests it waits for); ('', '') for none."""
    if type(token) is not tuple:
        stuck = getattr(token, "why_stuck", None)  # a point-to-point request (spmdsim.runtime.sim.requests)
        return ("", "") if stuck is None else stuck(world)
    said: list[str] = []
    hint = ""
    for request in token[:3]:
        more, why = _why_stuck(world, request)
        said += [part for part in more.split("; ")[1:] if part not in said]  # two requests' peer: said once
        hint = hint or why
    return "".join(f"; {part}" for part in said), hint


def timed_out(world: Any, key: int, what: Any, limit: float) -> str:
    """The watchdog's report (SPMDSIM_WATCHDOG) of waiter `key` (a rank, or a thread a rank started), still
    waiting in `what` after `limit` seconds: what it waits in, then who waits where and where the others are,
    as a deadlock report says it (world lock held, `key` still waiting)."""
    rank = world.rank_of(key)
    who = f"[rank {rank}]" if key == rank else f"[rank {rank}, a thread it started]"
    shown = f"{limit:.1f}" if limit >= 1 else f"{limit:g}"
    return explain(world, head=f"{who} spmdsim: {what.text()} did not complete within {shown} s", first=key)


def unfold(report: str) -> str:
    """The report on one line, its calls separated by " | " (what it printed before it folded)."""
    head, _, body = report.replace("\n    ", " ").partition(":\n  ")
    return f"{head}: {body.replace(chr(10) + '  ', ' | ')}" if body else head


def current_frames() -> dict:
    """``sys._current_frames()`` with the garbage collector held off while it runs. On Python 3.11 it makes
    frame objects while it holds the interpreter's thread-list lock; a collection those allocations start
    that frees a ``threading.local`` takes that lock again, and the thread deadlocks holding the interpreter
    lock, every thread with it (CPython gh-106883, fixed in 3.12; a test's deadlock report hung that way)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if enabled:
            gc.enable()


def program_lines(world: Any, ranks: list[int]) -> str:
    """'; at prog.py:12' (or per line: '; at prog.py:12 (ranks 0,1), prog.py:15 (rank 3)'): the line of
    the program (the innermost frame outside spmdsim) where each of `ranks` is now."""
    frames = current_frames()
    lines: dict[str, list[int]] = {}
    for key in ranks:  # a rank, or the key of a thread a rank started
        line = _program_line(frames.get(world.threads.get(key, -1)))
        if line:
            lines.setdefault(line, []).append(world.rank_of(key))
    if not lines:
        return ""
    if len(lines) == 1:
        return f"; at {next(iter(lines))}"
    return "; at " + ", ".join(f"{line} ({ranks_text(sorted(set(rs)))})" for line, rs in lines.items())


def _threads_text(world: Any, keys: list) -> str:
    """'rank 0 and a thread of rank 0' (a rank's own thread is the rank; the others are its threads)."""
    own = [k for k in keys if k < THREAD_KEYS]
    started = sorted(world.rank_of(k) for k in keys if k >= THREAD_KEYS)
    parts = [ranks_text(own)] if own else []
    parts += [f"a thread of rank {r}" for r in started]
    return " and ".join(parts)


def whereabouts(world: Any, rank: int) -> str:
    """Where `rank` is: 'rank 3 finished', 'rank 3 is elsewhere, in barrier on the world', ..."""
    what = world.waiting.get(rank)
    if what is not None:
        return f"rank {rank} is elsewhere, in {what.text()}"
    ended = _ended(world, rank)
    if ended:
        return f"rank {rank} {ended}"
    call = world.polling().get(rank)
    if call:
        return f"rank {rank} polls ({call}) in vain"
    line = _program_line(current_frames().get(world.threads.get(rank, -1)))
    return f"rank {rank} is computing" + (f" (at {line})" if line else "")


def _ended(world: Any, rank: int) -> str:
    """How `rank` ended: 'failed', 'exited (sys.exit(3))', 'finished'; '' while it runs."""
    if rank in world.failed:
        return "failed"
    if rank in world.exits:
        return f"exited ({world.exits[rank]})"
    return "finished" if rank in world.finished else ""


def places(world: Any, ranks: list, most: int = 8) -> str:
    """'; rank 1 is elsewhere, in barrier on the world; ranks 2-7 finished': where each of `ranks` is
    (whereabouts), those that finished, failed or exited alike said together as the report says ranks, the first
    `most` places, then how many ranks more."""
    alike: dict = {}  # how ranks alike ended ("finished", "exited (sys.exit(3))"), or a rank's own place: its ranks
    for rank in ranks:
        ended = "" if rank in world.waiting else _ended(world, rank)
        alike.setdefault((True, ended) if ended else (False, whereabouts(world, rank)), []).append(rank)
    said = [f"{ranks_text(group)} {text}" if done else text for (done, text), group in alike.items()]
    left = sum(len(group) for group in list(alike.values())[most:])
    return "".join(f"; {part}" for part in said[:most]) + (f"; and {left} more" if left else "")


def _program_line(frame: Any) -> str:
    """'prog.py:12' of the innermost frame outside spmdsim (and threading), or ''."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIPPED) and not name.startswith("<frozen"):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""
