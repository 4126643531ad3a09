"""Check a pipeline schedule before anything runs: placement, data dependencies, matching, no deadlock.

The deadlock check runs every stage's program under rendezvous semantics: a blocking Send
or Recv, or a Post, completes only when each of its messages meets the peer's counterpart
while the peer stands at the action holding it (a Post's messages are all posted before it
waits, so a message met early stays met). When no stage can move, the schedule deadlocks;
the error names a cycle of stages waiting on each other and what each waits in.
"""
from __future__ import annotations

from typing import Union

from ...errors import PipelineError
from .records import Compute, Post, Recv, Schedule, Send

__all__ = ["check", "message_ops"]


def message_ops(action: object) -> tuple[Union[Send, Recv], ...]:
    """The messages of an action: a Post's ops, a lone Send or Recv, nothing for a Compute."""
    kind = type(action)  # the records' own types first: a check of 64 x 512 1F1B asks ~540,000 times
    if kind is Compute:
        return ()
    if kind is Post:
        return action.ops
    if kind is Send or kind is Recv:
        return (action,)
    if isinstance(action, Post):
        return action.ops
    if isinstance(action, (Send, Recv)):
        return (action,)
    return ()


def check(schedule: Schedule) -> None:
    """Raise PipelineError (one line) unless `schedule` is complete, well ordered and free of deadlock.

    (a) each (microbatch, chunk) gets one F and one B, on the stage holding the chunk, and each
    compute follows what it needs (its input received or its forward run; a B its output's gradient);
    each Send follows the compute that produced it; (b) each Send meets exactly one Recv on its peer
    and each Recv one Send; (c) the stages do not deadlock under rendezvous semantics.
    """
    # Each action's messages, worked out once for the four passes (a 64 x 512 1F1B holds ~134,000 actions).
    ops = [[message_ops(action) for action in program] for program in schedule.programs]
    _placement(schedule, ops)
    _computes(schedule)
    keys = _matching(schedule, ops)
    _dependencies(schedule, ops)
    _deadlock(schedule, keys)


def _where(schedule: Schedule, stage: int) -> str:
    return f"schedule {schedule.name!r}: stage {stage}"


def _placement(schedule: Schedule, ops: list) -> None:
    """Every record's microbatch and chunk exist, the chunk lives on its stage, peers follow the chunk rule.
    `ops`: each action's message_ops, per stage."""
    p, m, chunks = schedule.stages, schedule.microbatches, schedule.chunks
    for s, program in enumerate(schedule.programs):
        for action, messages in zip(program, ops[s]):
            for record in messages or (action,):
                c = record.chunk
                if record.microbatch >= m or c >= chunks or c % p != s:
                    _misplaced(schedule, s, record)
                if not messages:  # a Compute
                    continue
                neighbour = c + (1 if (record.what == "act") == isinstance(record, Send) else -1)
                if p == 1 or not 0 <= neighbour < chunks or record.peer != neighbour % p:
                    _misaddressed(schedule, s, record, neighbour)


def _misplaced(schedule: Schedule, s: int, record: object) -> None:
    p, v, m, chunks = schedule.stages, schedule.virtual, schedule.microbatches, schedule.chunks
    what = record.label(v)
    if record.microbatch >= m:
        raise PipelineError(f"{_where(schedule, s)} runs {what}, but microbatch {record.microbatch} "
                            f"is outside 0..{m - 1}")
    if record.chunk >= chunks:
        raise PipelineError(f"{_where(schedule, s)} runs {what}, but chunk {record.chunk} "
                            f"is outside 0..{chunks - 1} ({p} stages x {v} chunks)")
    raise PipelineError(f"{_where(schedule, s)} runs {what}, but chunk {record.chunk} "
                        f"lives on stage {record.chunk % p}")


def _misaddressed(schedule: Schedule, s: int, record: Union[Send, Recv], neighbour: int) -> None:
    p, chunks, what = schedule.stages, schedule.chunks, record.label(schedule.virtual)
    if p == 1:  # (a file whose lines all say `stage 0:`, one meant `stage 1:`, read as 1 stage)
        raise PipelineError(f"{_where(schedule, s)} has {what}, a message to the stage itself; expected none: the "
                            "schedule has 1 stage (each other stage's line starts 'stage 1:', 'stage 2:', ...)")
    if not 0 <= neighbour < chunks:
        raise PipelineError(f"{_where(schedule, s)} has {what}, a message to chunk {neighbour}, which does not "
                            f"exist; expected none (chunks 0..{chunks - 1})")
    raise PipelineError(f"{_where(schedule, s)} has {what}, but chunk {neighbour} lives "
                        f"on stage {neighbour % p}; expected peer {neighbour % p}")


def _computes(schedule: Schedule) -> None:
    """Each (microbatch, chunk) runs F once and B once."""
    seen: set = set()
    for s, program in enumerate(schedule.programs):
        for action in program:
            if isinstance(action, Compute):
                key = (action.kind, action.microbatch, action.chunk)
                if key in seen:
                    raise PipelineError(f"{_where(schedule, s)} runs {action.label(schedule.virtual)} "
                                        f"a second time; expected once")
                seen.add(key)
    if len(seen) == 2 * schedule.microbatches * schedule.chunks:
        return  # all in range (placement) and none twice: every one is there
    for mb in range(schedule.microbatches):
        for c in range(schedule.chunks):
            for kind in ("F", "B"):
                if (kind, mb, c) not in seen:
                    label = Compute(kind, mb, c).label(schedule.virtual)
                    raise PipelineError(f"{_where(schedule, c % schedule.stages)} never runs {label}; "
                                        f"expected one F and one B per microbatch and chunk")


def _matching(schedule: Schedule, ops: list) -> list:
    """Every Send meets exactly one Recv on its peer, and every Recv one Send. Returns each action's messages
    as their `_key`s, per stage (what `_deadlock` runs)."""
    chunks = schedule.chunks
    sends: dict[int, Send] = {}  # _key(op) -> op; its stage is its chunk's (placement passed)
    recvs: dict[int, Recv] = {}
    programs = []
    for s, messages in enumerate(ops):
        keyed = []
        for action_ops in messages:
            keys = []
            for op in action_ops:
                table = sends if isinstance(op, Send) else recvs
                key = _key(op, chunks)
                if key in table:
                    raise PipelineError(f"{_where(schedule, s)} has {op.label(schedule.virtual)} a second "
                                        f"time; expected each message once")
                table[key] = op
                keys.append(key)
            keyed.append(tuple(keys))
        programs.append(keyed)
    if len(sends) == len(recvs) and sends.keys() == recvs.keys():
        return programs
    for mine, theirs, missing in ((sends, recvs, "receive"), (recvs, sends, "send")):
        for key, op in mine.items():
            s = op.chunk % schedule.stages
            if key not in theirs:
                raise PipelineError(f"{_where(schedule, s)} has {op.label(schedule.virtual)}, but stage "
                                    f"{op.peer} never posts the matching {missing}")
    return programs  # not reached: key sets that differ have a key one of them lacks


def _dependencies(schedule: Schedule, ops: list) -> None:
    """Each compute follows what it needs in its stage's program; each Send follows its compute."""
    last, alone = schedule.chunks - 1, schedule.stages == 1
    for s, program in enumerate(schedule.programs):
        have: set = set()  # ("F"|"B", mb, chunk) run and ("act"|"grad", mb, chunk) received, so far
        for action, messages in zip(program, ops[s]):
            if not messages:  # a Compute
                kind, mb, c = action.kind, action.microbatch, action.chunk
                if kind == "F":
                    needs = () if c == 0 else (("F", mb, c - 1) if alone else ("act", mb, c),)
                elif c < last:
                    needs = (("F", mb, c), ("B", mb, c + 1) if alone else ("grad", mb, c))
                else:
                    needs = (("F", mb, c),)
                for need in needs:
                    if need not in have:
                        raise PipelineError(f"{_where(schedule, s)} runs {action.label(schedule.virtual)} "
                                            f"before {_need(need, schedule.virtual)}; expected it after")
                have.add((kind, mb, c))
                continue
            for op in messages:
                if isinstance(op, Send):
                    made = ("F" if op.what == "act" else "B", op.microbatch, op.chunk)
                    if made not in have:
                        raise PipelineError(f"{_where(schedule, s)} has {op.label(schedule.virtual)} before "
                                            f"{Compute(*made).label(schedule.virtual)} computes it")
            for op in messages:
                if isinstance(op, Recv):
                    have.add((op.what, op.microbatch, op.chunk))


def _key(op: Union[Send, Recv], chunks: int) -> int:
    """`op.message` as one int, equal for a Send and the Recv that meets it (placement has passed: the
    producing chunk is in 0..chunks-1): a dict of ints where tuples cost a hash each look-up."""
    what, c = op.what, op.chunk
    if type(op) is Recv or (type(op) is not Send and isinstance(op, Recv)):
        c = c - 1 if what == "act" else c + 1
    return (op.microbatch * chunks + c) * 2 + (what == "grad")


def _need(need: tuple, virtual: int) -> str:
    what, mb, c = need
    if what in ("F", "B"):
        return Compute(what, mb, c).label(virtual)
    suffix = f".{c}" if virtual > 1 else ""
    return f"it receives {'its input' if what == 'act' else 'its output gradient'} ({what} {mb}{suffix})"


def _deadlock(schedule: Schedule, programs: list) -> None:
    """Run all programs under rendezvous semantics; raise naming a waiting cycle if they stick. `programs`:
    each action's messages as `_key`s (`_matching`'s)."""
    pc = [0] * schedule.stages
    unmet = [0] * schedule.stages  # messages of the action a waiting stage stands at, not met yet
    posted: dict = {}              # message -> the stage that posted it, waiting for the counterpart
    ready = list(range(schedule.stages))
    while ready:
        s = ready.pop()
        program = programs[s]
        while pc[s] < len(program):
            messages = program[pc[s]]
            for message in messages:
                peer = posted.pop(message, None)
                if peer is None:
                    posted[message] = s
                    unmet[s] += 1
                    continue
                unmet[peer] -= 1
                if unmet[peer] == 0:  # the peer's action is complete: it moves on
                    pc[peer] += 1
                    ready.append(peer)
            if unmet[s]:
                break  # waits here until its peers meet the rest
            pc[s] += 1
    stuck = [s for s in range(schedule.stages) if pc[s] < len(programs[s])]
    if stuck:
        raise PipelineError(_deadlock_message(schedule, stuck[0], pc, posted))


def _waiting_op(schedule: Schedule, stage: int, pc: list, posted: dict) -> Union[Send, Recv]:
    """The first message of the stage's current action that no peer has met."""
    action = schedule.programs[stage][pc[stage]]
    return next(op for op in message_ops(action) if posted.get(_key(op, schedule.chunks)) == stage)


def _deadlock_message(schedule: Schedule, start: int, pc: list, posted: dict) -> str:
    """One line: the cycle of stages that wait on each other, what each waits in, and how to fix it."""
    v = schedule.virtual
    order, s = [], start
    while s not in order:  # every waiting stage waits on a waiting stage: the walk closes a cycle
        order.append(s)
        s = _waiting_op(schedule, s, pc, posted).peer
    cycle = order[order.index(s):]
    ops = [_waiting_op(schedule, s, pc, posted) for s in cycle]
    parts = [f"stage {s} waits in {op.label(v)}" for s, op in zip(cycle, ops)]
    waits = " while ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"schedule {schedule.name!r} deadlocks: {waits}; {_hint(schedule, cycle, ops, pc)}"


def _hint(schedule: Schedule, cycle: list, ops: list, pc: list) -> str:
    """How to untie the cycle: post a waiting send with the receive that meets the send waiting on it."""
    v = schedule.virtual
    for i, (s, op) in enumerate(zip(cycle, ops)):
        before = ops[i - 1]  # the previous stage on the cycle waits on this one
        if not (isinstance(op, Send) and isinstance(before, Send) and before.peer == s):
            continue
        for action in schedule.programs[s][pc[s]:]:
            meets = [r for r in message_ops(action) if isinstance(r, Recv) and r.message == before.message]
            if meets:
                return (f"post each send with the receive it meets "
                        f"(as [{op.token(v)} {meets[0].token(v)}])")
    return "each waits for a message its peer sends only later; let one of them send before it receives"
