"""Run a Schedule on symbols instead of numbers: what each slot holds after each round.

Pure. A slot holds None (nothing yet) or a term: a leaf ``(rank, piece)``
(input piece `piece` of rank `rank`) or a sum ``("+", a, b)`` of two terms
(`a` what the receiver held, `b` what arrived). `check` proves a schedule
delivers every piece exactly where its collective must put it, each
contribution summed exactly once; `sum_order` prints the order an output
piece was summed in.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from ...errors import SpmdsimError
from .schedule import Schedule

__all__ = ["states", "final_outputs", "expected_outputs", "check", "leaves", "sum_order"]

Term = Any  # (rank, piece) | ("+", Term, Term)


def leaves(term: Term) -> list[tuple[int, int]]:
    """The (rank, piece) contributions of a term, in summation order."""
    if term is None:
        return []
    if term[0] == "+":
        return leaves(term[1]) + leaves(term[2])
    return [term]


def _initial(schedule: Schedule) -> list[list[Term]]:
    work = [[None] * len(schedule.slot_counts) for _ in range(schedule.group_size)]
    for rank, slots in enumerate(schedule.input_slots):
        for piece, slot in enumerate(slots):
            work[rank][slot] = (rank, piece)
    return work


def states(schedule: Schedule) -> list[list[list[Term]]]:
    """Work slots of every rank before the first round and after each round (len(rounds) + 1 states).

    Raises SpmdsimError when a rank sends a slot it holds nothing in, or adds
    into an empty slot: a broken schedule.
    """
    work = _initial(schedule)
    out = [[list(w) for w in work]]
    for number, rnd in enumerate(schedule.rounds, 1):
        before = [list(w) for w in work]
        for t in rnd.transfers:
            for a, b in zip(t.piece, t.landing):
                sent = before[t.src][a]
                if sent is None:
                    raise SpmdsimError(f"round {number}: rank {t.src} sends slot {a}, which holds nothing")
                if t.reduce:
                    if work[t.dst][b] is None:
                        raise SpmdsimError(f"round {number}: rank {t.dst} adds into empty slot {b}")
                    work[t.dst][b] = ("+", work[t.dst][b], sent)
                else:
                    work[t.dst][b] = sent
        out.append([list(w) for w in work])
    return out


def final_outputs(schedule: Schedule) -> list[list[Term]]:
    """Each rank's output pieces (terms) after the last round."""
    last = states(schedule)[-1]
    return [[last[rank][s] for s in slots] for rank, slots in enumerate(schedule.output_slots)]


def expected_outputs(schedule: Schedule) -> list[list[list[tuple[int, int]]]]:
    """What the collective's definition puts in each output piece: the contributions, sorted."""
    p, root = schedule.group_size, schedule.root
    everyone = range(p)
    out = []
    for rank in everyone:
        pieces = len(schedule.output_slots[rank])
        if schedule.collective == "allreduce":
            out.append([[(q, k) for q in everyone] for k in range(pieces)])
        elif schedule.collective == "reduce_scatter":
            out.append([[(q, rank) for q in everyone]])
        elif schedule.collective == "allgather":
            out.append([[(j, 0)] for j in everyone])
        elif schedule.collective == "alltoall":
            out.append([[(j, rank)] for j in everyone])
        elif schedule.collective == "bcast":
            out.append([[(root, k)] for k in range(pieces)])
        else:
            raise SpmdsimError(f"unknown collective {schedule.collective!r}")
    return out


def check(schedule: Schedule) -> None:
    """Raise SpmdsimError unless every output piece holds exactly the contributions it must."""
    got = final_outputs(schedule)
    for rank, (mine, want) in enumerate(zip(got, expected_outputs(schedule))):
        if len(mine) != len(want):
            raise SpmdsimError(f"{schedule.name}: rank {rank} outputs {len(mine)} pieces, expected {len(want)}")
        for k, (term, need) in enumerate(zip(mine, want)):
            have = leaves(term)
            if Counter(have) != Counter(need):
                raise SpmdsimError(f"{schedule.name} on {schedule.group_size} ranks: rank {rank} output piece "
                                   f"{k} holds {sorted(have)!r}, expected {sorted(need)!r}")
    for rank, slots in enumerate(schedule.output_slots):
        if sum(schedule.slot_counts[s] for s in slots) != _output_count(schedule, rank):
            raise SpmdsimError(f"{schedule.name}: rank {rank}'s output has the wrong size")


def _output_count(schedule: Schedule, rank: int) -> int:
    c, p = schedule.collective, schedule.group_size
    whole = max(schedule.input_count(r) for r in range(p))
    if c == "allgather":
        return whole * p
    if c == "reduce_scatter":
        return whole // p
    return whole


def sum_order(term: Term) -> str:
    """A term as a sum with parentheses, ranks as r0, r1, ...: "((r1+r2)+r3)"."""
    if term is None:
        return "-"
    if term[0] == "+":
        return f"({sum_order(term[1])}+{sum_order(term[2])})"
    return f"r{term[0]}"
