"""Read a hand-written pipeline schedule (for labs): one line per stage, then `check` it.

    # 2 stages, 2 microbatches: Megatron's 1F1B
    stage 0: F0 send-act0 F1 [send-act1 recv-grad0] B0 recv-grad1 B1
    stage 1: recv-act0 F0 B0 [send-grad0 recv-act1] F1 B1 send-grad1

Tokens: F<mb> and B<mb> (a forward, a backward), send-act<mb>, recv-act<mb>, send-grad<mb>,
recv-grad<mb>, each with a `.c` suffix naming the global chunk when stages hold several
(F3.5); peers follow from the chunk (chunk c lives on stage c % p). Messages inside `[...]` are
posted together and then waited for; a lone message is a blocking call. `#` starts a comment;
several lines for one stage continue its program.
"""
from __future__ import annotations

import re
from typing import Optional

from ...errors import PipelineError
from .records import MAX_PAIRS, Compute, Post, Recv, Schedule, Send, check_sizes
from .check import check

__all__ = ["parse", "sizes", "TOKENS", "MAX_TEXT"]

#: What a token may be, for messages.
TOKENS = "F<mb>, B<mb>, send-act<mb>, recv-act<mb>, send-grad<mb>, recv-grad<mb> or [ ... ]"

#: Longest schedule text `parse` reads, in characters.
MAX_TEXT = 4_000_000

# ASCII digits only: `\d` also takes other scripts' digits ('stage \u0663' read as stage 3).
_LINE = re.compile(r"^\s*stage\s+([0-9]+)\s*:(.*)$")
_TOKEN = re.compile(r"^(F|B|send-act|recv-act|send-grad|recv-grad)([0-9]+)(?:\.([0-9]+))?$")

#: Most significant digits a stage, microbatch or chunk number may have (MAX_PAIRS bounds them all far below):
#: Python refuses int() of over 4,300 digits with a ValueError, and a message would quote them all.
_DIGITS = 9


def _number(digits: str) -> int:
    """`digits` (ASCII) as an int; -1 where they are more than _DIGITS significant ones (out of any range)."""
    significant = digits.lstrip("0") or "0"
    return int(significant) if len(significant) <= _DIGITS else -1


def _shown(text: str) -> str:
    """`text` for a message: at most 40 characters."""
    return text if len(text) <= 40 else text[:37] + "..."


def parse(text: str, stages: int, microbatches: int, virtual: int = 1, name: str = "hand-written") -> Schedule:
    """The schedule `text` describes, checked (spmdsim.programs.pipeline.check).

    Args:
        text: one `stage N: token token ...` line per stage (see the module's docstring).
        stages, microbatches, virtual: p, m and chunks per stage.
        name: the schedule's name in messages and pictures.
    """
    check_sizes(stages, microbatches, virtual)
    if not isinstance(text, str):
        raise PipelineError(f"a schedule text must be a str, got {type(text).__name__}")
    if len(text) > MAX_TEXT:
        raise PipelineError(f"schedule {name!r} has {len(text):,} characters; expected at most {MAX_TEXT:,}")
    programs: list[list] = [[] for _ in range(stages)]
    seen = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0]
        if not line.strip():
            continue
        match = _LINE.match(line)
        if not match:
            raise PipelineError(f"line {number} of {name!r} is {_shown(line.strip())!r}; expected 'stage N: tokens'")
        stage = _number(match.group(1))
        if not 0 <= stage < stages:
            raise PipelineError(f"line {number} of {name!r} is for stage {_shown(match.group(1))}; expected stages "
                                f"0..{stages - 1}")
        seen.add(stage)
        programs[stage].extend(_actions(match.group(2), stage, stages, virtual, name))
    missing = [s for s in range(stages) if s not in seen]
    if missing:
        raise PipelineError(f"schedule {name!r} has no line for stage {missing[0]}; expected one "
                            f"'stage N: ...' line per stage 0..{stages - 1}")
    schedule = Schedule(name, stages, microbatches, virtual, programs)

    check(schedule)
    return schedule


def sizes(text: str, name: str = "hand-written") -> tuple[int, int, int]:
    """(stages, microbatches, chunks per stage) that schedule `text` names, for `parse`: one more than its
    largest stage number, one more than its largest microbatch number, and its largest chunk number + 1 over
    the stages, rounded up (1 where no token names a chunk). What it cannot read (a line that is no
    ``stage N:``, a token outside TOKENS) is left to `parse`, which names it; sizes past MAX_PAIRS
    (microbatch, chunk) pairs are refused here, before `parse` makes a program a stage."""
    stages = microbatches = chunks = 0
    for raw in text.splitlines():
        match = _LINE.match(raw.split("#", 1)[0])
        if not match:
            continue
        stages = max(stages, _number(match.group(1)) + 1)
        for word in match.group(2).replace("[", " ").replace("]", " ").split():
            token = _TOKEN.match(word)
            if token:  # (a number of over _DIGITS digits, -1, names a microbatch too: `parse` refuses it by name)
                microbatches = max(microbatches, _number(token.group(2)) + 1, 1)
                chunks = max(chunks, _number(token.group(3)) + 1 if token.group(3) else 0)
    if not stages or not microbatches:
        missing = "'stage N: tokens' line" if not stages else "token naming a microbatch"
        raise PipelineError(f"schedule {name!r} has no {missing}; expected one line per stage, as "
                            f"'stage 0: F0 send-act0' (or give --stages and --microbatches)")
    virtual = max(1, -(-chunks // stages))
    if stages * microbatches * virtual > MAX_PAIRS:
        raise PipelineError(f"schedule {name!r} names stages 0..{stages - 1}, microbatches 0..{microbatches - 1} "
                            f"and chunks 0..{stages * virtual - 1}: {stages * microbatches * virtual:,} (microbatch, "
                            f"chunk) pairs is too many; expected at most {MAX_PAIRS:,}")
    return stages, microbatches, virtual


def _actions(body: str, stage: int, stages: int, virtual: int, name: str) -> list:
    """The records of one line's tokens; `[ ... ]` groups messages into one Post."""
    actions: list = []
    group: Optional[list] = None
    for word in body.replace("[", " [ ").replace("]", " ] ").split():
        if word == "[":
            if group is not None:
                raise PipelineError(f"stage {stage} of {name!r} opens '[' inside a post; expected ']' first")
            group = []
        elif word == "]":
            if group is None:
                raise PipelineError(f"stage {stage} of {name!r} closes ']' with no post open; expected '[' first")
            if not group:
                raise PipelineError(f"stage {stage} of {name!r} has an empty post '[]'; expected messages in it")
            actions.append(Post(tuple(group)))
            group = None
        else:
            record = _record(word, stage, stages, virtual, name)
            if group is None:
                actions.append(record)
            elif isinstance(record, Compute):
                raise PipelineError(f"stage {stage} of {name!r} has {word!r} inside a post; "
                                    f"expected only send-... and recv-... there")
            else:
                group.append(record)
    if group is not None:
        raise PipelineError(f"stage {stage} of {name!r} opens a post '[' that never closes; expected ']'")
    return actions


def _record(word: str, stage: int, stages: int, virtual: int, name: str):
    """One token as a Compute, Send or Recv of `stage`."""
    match = _TOKEN.match(word)
    if not match:
        raise PipelineError(f"stage {stage} of {name!r} has token {word!r}; expected {TOKENS}"
                            + (" with a .chunk suffix" if virtual > 1 else ""))
    kind, mb, chunk = match.group(1), _number(match.group(2)), match.group(3)
    if mb < 0 or (chunk is not None and _number(chunk) < 0):
        what = (f"a microbatch below {MAX_PAIRS:,}" if mb < 0 else
                f"one of the stage's chunks {tuple(range(stage, stages * virtual, stages))!r}")
        raise PipelineError(f"stage {stage} of {name!r} has token {_shown(word)!r}, a number of more than "
                            f"{_DIGITS} digits; expected {what}")
    if virtual == 1 and chunk is not None:
        raise PipelineError(f"stage {stage} of {name!r} has token {word!r}, but with one chunk per stage "
                            f"the chunk is the stage's; expected {word.split('.')[0]!r}")
    if virtual > 1 and chunk is None:
        raise PipelineError(f"stage {stage} of {name!r} has token {word!r} without its chunk; expected "
                            f"{word}.c with c one of the stage's chunks "
                            f"{tuple(range(stage, stages * virtual, stages))!r}")
    c = stage if chunk is None else _number(chunk)
    if kind in ("F", "B"):
        return Compute(kind, mb, c)
    verb, what = kind.split("-")
    step = 1 if (what == "act") == (verb == "send") else -1
    peer = (c + step) % stages
    return Send(what, mb, c, peer) if verb == "send" else Recv(what, mb, c, peer)
