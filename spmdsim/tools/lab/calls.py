"""Which MPI calls a submission makes, at which line, and the bytes its sends, collectives and one-sided
operations carry (spmdsim.tools.lab.sent_bytes says what a collective sends).

A profile hook on each simulated rank's thread (`watching`) notes every call from the submission's
own file into the emulator (spmdsim.emulator, spmdsim.runtime.sim): a call on any communicator, whether the
one passed in, MPI.COMM_WORLD or one made by Split or Create_cart; and a call the submission has code outside
spmdsim make for it (text it exec'd, a thread's target, a thread pool's worker), at the submission's line.
Nothing is refused while it runs: the grader judges the notes afterwards (`violation`), so a forbidden call
is named with its line even when it gave the right answer.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import importlib.util
import numbers
import os
import sys
import threading
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ...emulator import comm as _comm
from ...emulator.comm_errors import GUARD_CODE
from ...emulator.persistent import Prequest
from ...emulator.file import SimFile
from ...emulator.window import SimWin
from ...runtime.sim import p2p as _p2p
from ...runtime.sim.waiting import ranks_text as rank_list
from .contents import payload
from .exercise import LabError
from .sent_bytes import collective_sent, message_bytes, object_bytes, persistent_collective_sent

__all__ = ["COLLECTIVES", "BARRIERS", "POINT_TO_POINT", "ONE_SIDED", "FILE_IO", "Notes", "base_call", "family",
           "watching", "violation", "strangers", "missing", "too_many"]

_UPPER_COLLECTIVES = ("Allreduce", "Reduce", "Bcast", "Scatter", "Scatterv", "Gather", "Gatherv", "Allgather",
                      "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw", "Reduce_scatter", "Reduce_scatter_block",
                      "Scan", "Exscan", "Barrier", "Neighbor_allgather", "Neighbor_allgatherv", "Neighbor_alltoall",
                      "Neighbor_alltoallv", "Neighbor_alltoallw")
#: Every collective call, in its buffer (Allreduce), nonblocking (Iallreduce) and object (allreduce) forms.
_EVERY_COLLECTIVE = frozenset(_UPPER_COLLECTIVES
                              + tuple("I" + c.lower() if c == "Barrier" else "I" + c[0].lower() + c[1:]
                                      for c in _UPPER_COLLECTIVES)
                              + ("allreduce", "reduce", "bcast", "scatter", "gather", "allgather", "alltoall",
                                 "barrier", "scan", "exscan", "ibarrier", "neighbor_allgather", "neighbor_alltoall"))
#: The barriers, which move no data: a rule built from COLLECTIVES leaves a student's habitual comm.Barrier()
#: be; an exercise that forbids one names "Barrier" itself.
BARRIERS = frozenset(("Barrier", "Ibarrier", "barrier", "ibarrier"))
#: Every collective call that moves data, in its buffer, nonblocking and object forms: all but BARRIERS.
COLLECTIVES = _EVERY_COLLECTIVE - BARRIERS

_SEND_BUFFER = {"Send": "buf", "Ssend": "buf", "Bsend": "buf", "Rsend": "buf", "Isend": "buf", "Issend": "buf",
                "Ibsend": "buf", "Irsend": "buf", "Sendrecv": "sendbuf", "Isendrecv": "sendbuf",
                "Sendrecv_replace": "buf", "Isendrecv_replace": "buf"}
_SEND_OBJECT = {"send": "obj", "ssend": "obj", "bsend": "obj", "isend": "obj", "issend": "obj", "ibsend": "obj",
                "sendrecv": "sendobj"}
#: Every point-to-point call (sends, receives, probes; MPI 4's partitioned Psend_init and Precv_init, by base_call).
POINT_TO_POINT = frozenset(set(_SEND_BUFFER) | set(_SEND_OBJECT) | {
    "Recv", "Irecv", "recv", "irecv", "Probe", "Iprobe", "probe", "iprobe", "Mprobe", "Improbe", "mprobe",
    "improbe", "Psend", "Precv"})

#: A window's one-sided operations (spmdsim.emulator.window_ops), each with the arguments whose buffers it moves
#: between the caller and the target rank: what a Put writes, what a Get reads, both for Get_accumulate.
_ONE_SIDED = {"Put": ("origin",), "Rput": ("origin",), "Get": ("origin",), "Rget": ("origin",),
              "Accumulate": ("origin",), "Raccumulate": ("origin",), "Get_accumulate": ("origin", "result"),
              "Rget_accumulate": ("origin", "result"), "Fetch_and_op": ("origin", "result"),
              "Compare_and_swap": ("origin", "result")}
#: Every one-sided operation of a window (MPI.Win), a communication call as a send is.
ONE_SIDED = frozenset(_ONE_SIDED)
#: MPI I/O's data calls (MPI.File's reads and writes): data between ranks through a file, communication calls too.
FILE_IO = frozenset(n for n in dir(SimFile) if n.startswith(("Read", "Write", "Iread", "Iwrite")))
#: A file's calls, said fh.Sync: those of MPI.File that a communicator does not have.
_FILE_CALLS = frozenset(n for n in dir(SimFile) if not n.startswith("_")) - frozenset(dir(_comm.SimComm))
#: The one-sided operations that only read their target: a partner's rule (`strangers`) counts writes.
_READS = ("Get", "Rget")

#: The folders of the emulator's code (spmdsim.emulator, and the thread engine's point-to-point and requests
#: under it), found from the modules themselves wherever the package puts them.
_EMULATOR = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep for module in (_comm, _p2p))
#: mpi4py.util.pkl5's file: its communicators' send, sendrecv, bcast ... are pure Python over the emulator's
#: Send, Mprobe, Waitall; a call from the submission into one of them is noted as the call it is, what it sends
#: as the object form does, and the emulator's calls pkl5 makes for it are not noted again.
_MPI4PY = importlib.util.find_spec("mpi4py")
_PKL5 = os.path.join(os.path.dirname(_MPI4PY.origin), "util", "pkl5.py") if _MPI4PY and _MPI4PY.origin else None
#: The code of threading.Thread.run, which calls a thread's target: a call it makes is the submission's where the
#: submission started the thread.
_THREAD_RUN = threading.Thread.run.__code__
#: The folder of spmdsim's own code: a call into the emulator from there is no submission's.
_SPMDSIM = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


#: The persistent sends: each Start of one sends what its nonblocking form (Send_init: Isend) sends; a partitioned
#: send (Psend_init) its whole buffer, all its partitions.
_PERSISTENT_SENDS = ("Send_init", "Bsend_init", "Ssend_init", "Rsend_init", "Psend_init")


@dataclasses.dataclass
class Notes:
    """One rank's calls from the submission: (name, line) in order, and the bytes its sends, collectives and
    one-sided operations carried to other ranks (a send to itself or to MPI.PROC_NULL moves nothing), in all
    (`sent`) and by call (`carried`: (name, line) -> bytes, for the calls that carried some); `persistent`:
    id -> (request, the bytes each Start of it sends), for the persistent sends and collectives it made;
    `sent_to`: (rank, name, line) of each send, persistent send made and one-sided write aimed at another rank
    (numbered as in the world the submission was given); `payloads`: where kept (not None), a copy of the data
    each call that carried bytes sent (spmdsim.tools.lab.contents.payload), a one-sided read's aside."""

    calls: list = dataclasses.field(default_factory=list)
    sent_to: list = dataclasses.field(default_factory=list)
    sent: int = 0
    carried: dict = dataclasses.field(default_factory=dict)
    persistent: dict = dataclasses.field(default_factory=dict)
    payloads: Optional[list] = None

    def heaviest(self) -> Optional[tuple]:
        """(the call as a program writes it, line, bytes) of the call that carried the most of this rank's
        bytes (comm.Bcast, win.Put, request.Start), or None."""
        if not self.carried:
            return None
        (name, line), most = max(self.carried.items(), key=lambda item: item[1])
        return _said(name), line, most


def ranks_text(n: int) -> str:
    """"1 rank", "3 ranks"."""
    return f"{n} rank{'s' if n != 1 else ''}"


def _said(name: str) -> str:
    """Call `name` as a program writes it: win.Put, request.Start, fh.Write_at (a file's) or comm.Bcast."""
    return f"win.{name}" if name in ONE_SIDED else f"request.{name}" if name in ("Start", "Startall") else \
        f"fh.{name}" if name in _FILE_CALLS else f"comm.{name}"


def base_call(name: str) -> str:
    """The call a persistent request's maker stands for (Allreduce_init: Allreduce, Send_init: Send), so that a
    rule on a call holds for its persistent form too; any other name as it is."""
    return name[:-len("_init")] if name.endswith("_init") else name


#: The collectives whose v (or w, or block) form is another call: a rule on the one holds for the other.
_VARIANT_OF = {"Allgatherv": "Allgather", "Alltoallv": "Alltoall", "Alltoallw": "Alltoall", "Gatherv": "Gather",
               "Scatterv": "Scatter", "Reduce_scatter_block": "Reduce_scatter",
               "Neighbor_allgatherv": "Neighbor_allgather", "Neighbor_alltoallv": "Neighbor_alltoall",
               "Neighbor_alltoallw": "Neighbor_alltoall"}


def family(name: str) -> str:
    """The collective a call is a form of, so that an exercise's rule on Allreduce holds for Iallreduce,
    allreduce and Allreduce_init too, and one on Allgather for Allgatherv: the buffer form's name without its
    v, w or _block. A point-to-point or one-sided call is its own family (a persistent one its maker's)."""
    call = base_call(name)
    if call not in _EVERY_COLLECTIVE:
        return call
    upper = call[0].upper() + call[1:]
    if upper not in _UPPER_COLLECTIVES:  # Iallreduce, Ibarrier, Ineighbor_alltoall
        upper = upper[1].upper() + upper[2:]
    return _VARIANT_OF.get(upper, upper)


def _with_forms(name: str) -> str:
    """`name` said with the other forms a rule on it counts: "comm.Allreduce (or Iallreduce, allreduce)"."""
    forms = sorted((c for c in _EVERY_COLLECTIVE if family(c) == family(name) and c != name),
                   key=lambda c: (c[0].islower(), c[0] == "I" and c[1].islower(), len(c), c))
    return f"{_said(name)} (or {', '.join(forms)})" if forms else _said(name)


def _families(rule: Any) -> set:
    """The families a rule's entries name (an entry may be "A|B": any of them)."""
    return {family(option) for entry in rule for option in entry.split("|")}


def _peer(name: str, frame: Any) -> Optional[int]:
    """The other rank a send, a persistent send made or a one-sided operation (the callee's `frame`) is aimed
    at, as a rank of the world the submission was given (a communicator it split in another order numbers its
    ranks otherwise); None for any other call, a send to itself, or to MPI.PROC_NULL."""
    one_sided = name in _ONE_SIDED
    if not (one_sided or name in _SEND_BUFFER or name in _SEND_OBJECT or name in _PERSISTENT_SENDS):
        return None
    local = frame.f_locals
    peer, me = local.get("target_rank" if one_sided else "dest"), local.get("self")
    if not isinstance(peer, numbers.Integral) or isinstance(peer, bool) or peer < 0 or me is None:
        return None  # (a NumPy integer is a rank too: rank ^ d for d in 2 ** np.arange(k))
    peer = int(peer)
    try:
        group = me.Get_group()
        own = group.Translate_ranks([group.Get_rank() if one_sided else me.Get_rank()])[0]
        if not one_sided and me.Is_inter():  # an intercommunicator's dest is a rank of its remote group
            group = me.Get_remote_group()
        peer = group.Translate_ranks([peer])[0]
    except Exception:  # noqa: BLE001 - a freed communicator or window, a rank out of range: the call says so
        return None
    return None if peer == own else peer


def _sent(name: str, frame: Any, peer: Optional[int]) -> int:
    """The bytes a send call (the callee's `frame`) aimed at `peer` (`_peer`'s answer) carries to another rank."""
    if peer is None:
        return 0
    local = frame.f_locals
    if name in _SEND_BUFFER:
        return message_bytes(local.get(_SEND_BUFFER[name]))
    return object_bytes(local.get(_SEND_OBJECT[name]))


def _one_sided(name: str, frame: Any, peer: Optional[int]) -> int:
    """The bytes a one-sided operation (the callee's `frame`) aimed at `peer` (`_peer`'s answer) moves between its
    caller and another rank of the window, counted as the caller's whether it writes them (Put) or reads them
    (Get)."""
    if peer is None:
        return 0
    return sum(message_bytes(frame.f_locals.get(argument)) for argument in _ONE_SIDED[name])


def _carried(name: str, frame: Any, notes: Notes, peer: Optional[int]) -> int:
    """The bytes call `name` (the callee's `frame`; `peer`, `_peer`'s answer for it) carries to other ranks: a
    send's, a collective's, a one-sided operation's, or a Start's of the persistent requests in `notes`."""
    if name in _SEND_BUFFER or name in _SEND_OBJECT:
        return _sent(name, frame, peer)
    if name in _ONE_SIDED:
        return _one_sided(name, frame, peer)
    if name in _EVERY_COLLECTIVE:
        return collective_sent(name, frame.f_locals, frame.f_locals.get("self"))
    if name in ("Start", "Startall"):
        local = frame.f_locals
        started = [local.get("self")] if name == "Start" else list(local.get("requests") or ())
        return sum(notes.persistent.get(id(request), (None, 0))[1] for request in started)
    return 0


def _noted(callee: str, caller: str) -> bool:
    """Whether a call from code in file `caller` into code in file `callee` is one the watch notes: a call into
    the emulator, or into mpi4py.util.pkl5, but not pkl5's own calls (its outermost call was noted)."""
    if caller == _PKL5:
        return False
    return callee == _PKL5 or callee.startswith(_EMULATOR)


def _origin(back: Any, filename: str) -> Optional[int]:
    """The line of the submission (`filename`) that a call into the emulator, from the caller frame `back`, comes
    from: the caller's own line; None for spmdsim's own calls; for code outside spmdsim (text the submission
    exec'd, the standard library calling a target or a callback it was given), the line of the nearest submission
    frame below it, or where the submission started the thread it runs on."""
    if back.f_code.co_filename == filename:
        return back.f_lineno
    if back.f_code.co_filename.startswith(_SPMDSIM):
        return None
    while back is not None:
        if back.f_code.co_filename == filename:
            return back.f_lineno
        if back.f_code is _THREAD_RUN:
            return getattr(back.f_locals.get("self"), "_spmdsim_started_at", None)
        back = back.f_back
    return None


@contextlib.contextmanager
def watching(filename: str, notes: Notes) -> Iterator[Notes]:
    """Within this block, this thread's calls from `filename` into the emulator are noted in `notes`
    (mpi4py's own communicators are compiled code, which a profile hook does not see)."""

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return") or frame.f_code is GUARD_CODE:
            return
        back = frame.f_back
        if back is not None and back.f_code is GUARD_CODE:  # a method guarded once an errhandler was set
            back = back.f_back
        if back is None or not _noted(frame.f_code.co_filename, back.f_code.co_filename):
            return
        line = _origin(back, filename)
        if line is None:
            return
        name = frame.f_code.co_name
        if name == "_start" and event == "call" and isinstance(frame.f_locals.get("thread"), threading.Thread):
            frame.f_locals["thread"]._spmdsim_started_at = line  # (spmdsim.emulator.rank_threads)
        if event == "return":  # a persistent send or collective made: what each Start of it will send
            if arg is not None and name in _PERSISTENT_SENDS:
                notes.persistent[id(arg)] = (arg, _sent("Send", frame, _peer("Send", frame)))
            elif arg is not None and name.endswith("_init") and base_call(name) in _EVERY_COLLECTIVE:
                notes.persistent[id(arg)] = (arg, persistent_collective_sent(name, frame.f_locals))
            return
        notes.calls.append((name, line))
        peer = _peer(name, frame)
        if peer is not None and name not in _READS:
            notes.sent_to.append((peer, name, line))
        carried = _carried(name, frame, notes, peer)
        if carried:
            notes.sent += carried
            notes.carried[name, line] = notes.carried.get((name, line), 0) + carried
            if notes.payloads is not None and name not in _READS:
                notes.payloads.append(payload(frame))

    hook.rank_wide = True  # the rank's threads run under it too (spmdsim.emulator.rank_threads)
    before = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield notes
    finally:
        sys.setprofile(before)


def violation(notes: list, forbidden: tuple, allowed: Optional[tuple]) -> Optional[str]:
    """The first call in `notes` (one Notes per rank) that the rules forbid, with its line, or None: a
    forbidden call, or a communication call (collective, point-to-point, one-sided or a file's) outside `allowed`
    (Barrier, which moves no data, is always allowed unless `forbidden` names it: COLLECTIVES does not)."""
    banned, kept = _families(forbidden), None if allowed is None else _families(allowed) | {"Barrier"}
    for note in notes:
        for name, line in note.calls:
            call = base_call(name)
            if family(name) in banned:
                return f"line {line}: {_said(name)} is not allowed in this exercise"
            if kept is not None and family(name) not in kept and (call in _EVERY_COLLECTIVE or call in POINT_TO_POINT
                                                                  or call in ONE_SIDED or call in FILE_IO):
                return (f"line {line}: {_said(name)} is not one of the calls this exercise allows "
                        f"({', '.join(allowed)})")
    return None


def _partners(partners: Callable[[int, int], Any], rank: int, n: int) -> set:
    """The set of ranks an exercise's `partners(rank, n)` names: a rank, or a collection of ranks (NumPy's
    integers too)."""
    named = partners(rank, n)
    try:
        ranks = [named] if isinstance(named, numbers.Integral) else list(named)
    except TypeError:  # not iterable
        ranks = [None]
    if not all(isinstance(r, numbers.Integral) and not isinstance(r, bool) for r in ranks):
        raise LabError(f"the exercise's partners({rank}, {n}) returned {named!r}: expected a rank or a "
                       "collection of ranks (ints)")
    return {int(r) for r in ranks}


def strangers(notes: list, partners: Callable[[int, int], Any]) -> Optional[str]:
    """The first send (or one-sided operation) in `notes` (one Notes per rank) aimed at a rank the exercise's
    `partners(rank, n)` does not name for its sender, said with its line and the ranks that sender may
    address, or None."""
    n = len(notes)
    for rank, note in enumerate(notes):
        if not note.sent_to:
            continue
        allowed = sorted(_partners(partners, rank, n) - {rank})
        for peer, name, line in note.sent_to:
            if peer not in allowed:
                whom = f"sends to {rank_list(allowed)} only" if allowed else "sends to no rank"
                return (f"line {line}: rank {rank} sent to rank {peer} by {_said(name)} at {ranks_text(n)}; in "
                        f"this exercise's algorithm rank {rank} {whom}")
    return None


def missing(notes: list, required: tuple) -> Optional[str]:
    """The first of the `required` calls (each "A|B": any of them) that no rank made, said, or None."""
    made = {family(name) for note in notes for name, _ in note.calls}
    for need in required:
        options = need.split("|")
        if not made.intersection(_families(options)):
            return f"no rank called {' or '.join(_with_forms(o) for o in options)}: the exercise asks for it"
    return None


def too_many(notes: list, most: dict) -> Optional[str]:
    """The first rank that made more of the calls a `most` entry counts ("Allreduce": 1, each form of it counted)
    than it allows, said with the line of its first extra call, or None."""
    for rank, note in enumerate(notes):
        for need, limit in most.items():
            counted = _families(need.split("|"))
            lines = [line for name, line in note.calls if family(name) in counted]
            if len(lines) > limit:
                name = next(name for name, _ in note.calls if family(name) in counted)
                return (f"rank {rank} called {_said(name)} {len(lines)} times, again at line {lines[limit]}; the "
                        f"exercise allows {limit}")
    return None


@functools.lru_cache(maxsize=1)
def _known() -> frozenset:
    """The calls a rule may name: a communicator's (a topology's too), a window's, a file's, a persistent request's."""
    names = set(_EVERY_COLLECTIVE | POINT_TO_POINT | ONE_SIDED | _FILE_CALLS)
    for kind in (_comm.SimCartComm, _comm.SimGraphComm, _comm.SimDistGraphComm, Prequest):
        names.update(name for name in dir(kind) if not name.startswith("_"))
    names.update(name for name in set(dir(SimWin)) - set(dir(np.ndarray)) if not name.startswith("_"))  # (not an
    # array's methods: a window is one)
    return frozenset(names)


def unknown_rule(rules: dict) -> Optional[str]:
    """The first call an exercise's `rules` ({"FORBIDDEN": names, ...}; an entry may be "A|B") name that no
    communicator, window or request has, said with the nearest known name, or None: a FORBIDDEN "BCast"
    forbade nothing."""
    for rule, entries in rules.items():
        for option in (option for entry in entries for option in entry.split("|")):
            if option not in _known():
                near = difflib.get_close_matches(option, sorted(_known()), n=1)
                return (f"{rule} names {option!r}, which no communicator, window or request has: expected a call's "
                        "name" + (f", such as {near[0]!r}" if near else ""))
    return None
