"""spmdsim.programs.pipeline: the records, the three builders against Megatron's structure, the check (every error
message), unit-cost timelines against the papers' bubble formulas, in-flight counts, parse, render and plot."""
from __future__ import annotations

import re
from collections import defaultdict
from fractions import Fraction

import pytest

from spmdsim.errors import PipelineError, SpmdsimError
from spmdsim.programs.pipeline import (MAX_PAIRS, Compute, Post, Recv, Schedule, Send, Timeline, build,
                                       bubble_formula, check, gpipe, in_flight, interleaved, one_f_one_b, parse,
                                       plot, render, timeline)
from spmdsim.programs.pipeline.check import message_ops

BUILT = ([("gpipe", p, m, 1) for p in range(1, 9) for m in range(1, 4 * p + 1)]
         + [("1f1b", p, m, 1) for p in range(1, 9) for m in range(1, 4 * p + 1)]
         + [("interleaved", p, m, v) for p in range(1, 9) for m in range(p, 4 * p + 1, p) for v in (2, 3)])


def _error(fragment: str):
    return pytest.raises(PipelineError, match=re.escape(fragment))


# --- records -------------------------------------------------------------------------------------------------


def test_records_are_small_hashable_values_with_short_text():
    f, b = Compute("F", 3, 5), Compute("B", 3, 1)
    send, recv = Send("act", 3, 1, 2), Recv("grad", 0, 0, 1)
    assert (str(f), str(b), str(send), str(recv)) == ("F3", "B3", "send act 3 -> 2", "recv grad 0 <- 1")
    assert (f.label(), f.label(2), send.label(2)) == ("F3", "F3.5", "send act 3.1 -> stage 2")
    assert (send.token(), recv.token(3)) == ("send-act3", "recv-grad0.0")
    post = Post([send, recv])
    assert post.ops == (send, recv) and str(post) == "[send act 3 -> 2, recv grad 0 <- 1]"
    assert post.token() == "[send-act3 recv-grad0]"
    for record in (f, send, recv, post):
        assert eval(repr(record)) == record and hash(eval(repr(record))) == hash(record)
    assert Send("act", 3, 1, 2) != Recv("act", 3, 1, 2)
    # A send and the receive it meets name the same message.
    assert Send("act", 3, 1, 2).message == Recv("act", 3, 2, 1).message == ("act", 3, 1)
    assert Send("grad", 3, 2, 1).message == Recv("grad", 3, 1, 2).message == ("grad", 3, 2)


@pytest.mark.parametrize("make, fragment", [
    (lambda: Compute("W", 0, 0), "compute kind 'W' must be 'F' or 'B'"),
    (lambda: Compute("F", -1, 0), "microbatch -1 must be an int >= 0"),
    (lambda: Compute("F", 0, True), "chunk True must be an int >= 0"),
    (lambda: Send("data", 0, 0, 1), "message kind 'data' must be 'act' or 'grad'"),
    (lambda: Recv("act", 0, 1, 1.0), "peer stage 1.0 must be an int >= 0"),
    (lambda: Post(()), "a post needs at least one send or receive, got ()"),
    (lambda: Post((Compute("F", 0, 0),)), "a post holds sends and receives, got Compute("),
    (lambda: Post((Send("act", 0, 0, 1), Send("act", 0, 0, 1))), "names a message twice"),
    (lambda: Schedule("s", 2, 1, 1, ((),)), "schedule 's' has 1 programs for 2 stages; expected one per stage"),
    (lambda: Schedule("s", 1, 1, 1, (("F0",),)), "stage 0 of schedule 's' holds 'F0'; expected Compute"),
    (lambda: Schedule("s", 0, 1, 1, ()), "stages 0 must be an int >= 1"),
])
def test_record_errors(make, fragment):
    with _error(fragment):
        make()


# --- builders ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, p, m, v", BUILT)
def test_every_built_schedule_passes_the_check_and_its_bubble_is_the_formula(name, p, m, v):
    schedule = build(name, p, m, v)
    check(schedule)
    assert (schedule.stages, schedule.microbatches, schedule.virtual, schedule.name) == (p, m, v, name)
    t = timeline(schedule)
    assert t.bubble == bubble_formula(name, p, m, v)
    # Every stage idles 2(p-1) units of the flushed pipeline, whatever the schedule.
    assert t.length == 2 * m * v + 2 * (p - 1) and t.busy == 2 * p * m * v
    if p == 1:
        assert not any(message_ops(a) for a in schedule.programs[0])


@pytest.mark.parametrize("name, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("times", [1, 2, 4])
def test_measured_bubble_equals_the_papers_formula_exactly(name, v, p, times):
    m = times * p
    expected = Fraction(p - 1, m + p - 1) if name != "interleaved" else Fraction(p - 1, v * m + p - 1)
    assert bubble_formula(name, p, m, v) == expected
    assert timeline(build(name, p, m, v)).bubble == expected


def test_in_flight_names_one_function():
    """spmdsim.programs.pipeline.schedule.in_flight (the most pairs, an int from the sizes) and
    spmdsim.programs.pipeline.in_flight (per stage, a tuple from a built schedule) shared a name: the first is
    most_in_flight now."""
    from spmdsim.programs.pipeline import schedule as schedule_module

    assert getattr(schedule_module, "in_flight", in_flight) is in_flight
    assert "in_flight" not in schedule_module.__all__
    assert schedule_module.most_in_flight("interleaved", 4, 8, 2) == max(in_flight(interleaved(4, 8, 2))) == 11


def test_in_flight_counts():
    for p in range(1, 9):
        for m in range(1, 4 * p + 1):
            assert in_flight(gpipe(p, m)) == (m,) * p
            assert in_flight(one_f_one_b(p, m)) == tuple(min(p - s, m) for s in range(p))
    # Interleaved: (microbatch, chunk) pairs, Megatron's warmup plus one, at most all of a stage's pairs.
    for p, m, v in ((2, 2, 2), (4, 8, 2), (4, 4, 3), (8, 16, 2), (8, 32, 4)):
        want = tuple(min(2 * (p - s - 1) + (v - 1) * p + 1, m * v) for s in range(p))
        assert in_flight(interleaved(p, m, v)) == want
    assert in_flight(interleaved(4, 8, 2)) == (11, 9, 7, 5)
    assert in_flight(timeline(one_f_one_b(4, 8))) == (4, 3, 2, 1)  # a timeline has the same orders


def test_one_f_one_b_is_megatrons_program():
    f, b = (lambda mb: Compute("F", mb, 0)), (lambda mb: Compute("B", mb, 0))
    assert one_f_one_b(2, 3).programs[0] == (
        f(0), Send("act", 0, 0, 1), f(1), Post((Send("act", 1, 0, 1), Recv("grad", 0, 0, 1))), b(0),
        f(2), Post((Send("act", 2, 0, 1), Recv("grad", 1, 0, 1))), b(1), Recv("grad", 2, 0, 1), b(2))
    f1, b1 = (lambda mb: Compute("F", mb, 1)), (lambda mb: Compute("B", mb, 1))
    assert one_f_one_b(2, 3).programs[1] == (
        Recv("act", 0, 1, 0), f1(0), b1(0), Post((Send("grad", 0, 1, 0), Recv("act", 1, 1, 0))), f1(1), b1(1),
        Post((Send("grad", 1, 1, 0), Recv("act", 2, 1, 0))), f1(2), b1(2), Send("grad", 2, 1, 0))
    # GPipe: every forward, then the backwards in reverse microbatch order (GPipe's Figure 2(c)).
    assert [a.label() for a in gpipe(1, 3).programs[0]] == ["F0", "F1", "F2", "B2", "B1", "B0"]


def test_interleaved_follows_megatrons_table_and_warmup():
    p, m, v = 4, 8, 2
    schedule = interleaved(p, m, v)
    for s, order in enumerate(schedule.orders):
        forwards = [c for c in order if c.kind == "F"]
        # Groups of p microbatches per chunk: chunk s for mb 0..3, chunk s+p for 0..3, then 4..7.
        assert [(c.microbatch, c.chunk) for c in forwards[:8]] == (
            [(mb, s) for mb in range(4)] + [(mb, s + p) for mb in range(4)])
        warmup = min(2 * (p - s - 1) + (v - 1) * p, m * v)
        first_b = next(i for i, c in enumerate(order) if c.kind == "B")
        assert first_b == (warmup + 1 if warmup < m * v else warmup)  # steady steps run F, then B
        backwards = [c for c in order if c.kind == "B"]
        assert (backwards[0].microbatch, backwards[0].chunk) == (0, s + p)  # the last chunk first
    # After every step one Post: on stage 1 the first steady step sends F's output and B's gradient,
    # and receives the next forward's input and the next backward's gradient.
    program = schedule.programs[1]
    first_b = next(i for i, a in enumerate(program) if isinstance(a, Compute) and a.kind == "B")
    assert program[first_b - 1:first_b + 2] == (Compute("F", 4, 1), Compute("B", 0, 5), Post((
        Send("act", 4, 1, 2), Send("grad", 0, 5, 0), Recv("act", 5, 1, 0), Recv("grad", 1, 5, 2))))


def test_sends_of_each_kind_come_in_the_order_their_receives_are_posted():
    """An executor may match messages by order between two stages (one tag per kind)."""
    for name, p, m, v in BUILT[::3]:
        sends, recvs = defaultdict(list), defaultdict(list)
        for s, program in enumerate(build(name, p, m, v).programs):
            for action in program:
                for op in message_ops(action):
                    if isinstance(op, Send):
                        sends[(s, op.peer, op.what)].append(op.message)
                    else:
                        recvs[(op.peer, s, op.what)].append(op.message)
        assert sends == recvs, (name, p, m, v)


def test_a_large_schedule_checks():
    schedule = build("interleaved", 64, 256, 2)  # the size the check is kept fast for (well under 1 s)
    assert timeline(schedule).bubble == Fraction(63, 2 * 256 + 63)


@pytest.mark.parametrize("call, fragment", [
    (lambda: build("zb", 2, 2), "unknown schedule 'zb'; expected one of ('gpipe', '1f1b', 'interleaved')"),
    (lambda: build("1f1b", 0, 2), "stages 0 must be an int >= 1"),
    (lambda: build("1f1b", 2, True), "microbatches True must be an int >= 1"),
    (lambda: build("gpipe", 2, 2, 2), "the gpipe schedule holds one chunk per stage, got virtual stages 2"),
    (lambda: build("interleaved", 2, 2, 1), "the interleaved schedule needs virtual stages >= 2, got 1"),
    (lambda: build("interleaved", 4, 6, 2), "needs microbatches divisible by stages (as Megatron), got 6 "
                                           "microbatches for 4 stages"),
    (lambda: build("1f1b", 256, 512), f"256 stages x 512 microbatches x 1 virtual stages = 131,072 "
                                      f"(microbatch, chunk) pairs is too many; expected at most {MAX_PAIRS:,}"),
    (lambda: bubble_formula("zb", 2, 2), "unknown schedule 'zb'"),
    # a name as the docs and papers spell it: the refusal says the spelling here (the CLI takes any case)
    (lambda: build("1F1B", 2, 2), "unknown schedule '1F1B'; expected one of ('gpipe', '1f1b', 'interleaved') "
                                  "(lower-case: '1f1b')"),
    (lambda: bubble_formula("GPipe", 2, 2), "(lower-case: 'gpipe')"),
])
def test_builder_errors(call, fragment):
    with _error(fragment):
        call()


def test_pipeline_error_is_a_value_error_of_the_family():
    assert issubclass(PipelineError, SpmdsimError) and issubclass(PipelineError, ValueError)


# --- parse and check -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 3, 4, 1), ("1f1b", 4, 6, 1), ("interleaved", 2, 4, 3),
                                           ("interleaved", 4, 8, 2), ("1f1b", 1, 2, 1)])
def test_parse_reads_what_text_writes(name, p, m, v):
    schedule = build(name, p, m, v)
    again = parse(schedule.text(), p, m, v, name=name)
    assert again == schedule


WRONG = """# 1F1B with blocking calls
stage 0: F0 send-act0 F1 send-act1 recv-grad0 B0 F2 send-act2 recv-grad1 B1 recv-grad2 B2
stage 1: recv-act0 F0 B0 send-grad0 recv-act1 F1 B1 send-grad1 recv-act2 F2 B2 send-grad2
"""


def test_the_classic_wrong_1f1b_deadlocks_with_one_line_naming_both_stages():
    with pytest.raises(PipelineError) as info:
        parse(WRONG, 2, 3, name="mine")
    assert str(info.value) == (
        "schedule 'mine' deadlocks: stage 0 waits in send act 1 -> stage 1 while stage 1 waits in send grad "
        "0 -> stage 0; post each send with the receive it meets (as [send-act1 recv-grad0])")
    fixed = WRONG.replace("send-act1 recv-grad0", "[send-act1 recv-grad0]").replace(
        "send-act2 recv-grad1", "[send-act2 recv-grad1]")
    assert parse(fixed, 2, 3).programs[0] == build("1f1b", 2, 3).programs[0]
    # One side fixed is enough here; both fixed is Megatron's 1F1B.
    both = fixed.replace("send-grad0 recv-act1", "[send-grad0 recv-act1]").replace(
        "send-grad1 recv-act2", "[send-grad1 recv-act2]")
    assert parse(both, 2, 3).programs == build("1f1b", 2, 3).programs


def test_two_stages_waiting_in_receives_get_the_other_hint():
    with _error("schedule 'hand-written' deadlocks: stage 0 waits in recv grad 0 <- stage 1 while stage 1 "
                "waits in recv act 0 <- stage 0; each waits for a message its peer sends only later; let one "
                "of them send before it receives"):
        parse("stage 0: F0 recv-grad0 send-act0 B0\nstage 1: recv-act0 F0 B0 send-grad0", 2, 1)


def _split(schedule: Schedule, recv_first: bool = False) -> Schedule:
    """`schedule` with every Post split into blocking calls (receives first, or in the Post's order)."""
    programs = []
    for program in schedule.programs:
        split = []
        for action in program:
            ops = message_ops(action)
            if recv_first:
                ops = sorted(ops, key=lambda op: isinstance(op, Send))
            split.extend(ops or (action,))
        programs.append(split)
    return Schedule("split", schedule.stages, schedule.microbatches, schedule.virtual, programs)


def test_a_ring_of_waits_over_interleaved_stages_names_every_stage():
    # Interleaved, the last stage sends to the first: blocking calls can wait all the way round.
    with _error("schedule 'split' deadlocks: stage 0 waits in send act 2.0 -> stage 1, stage 1 waits in send "
                "act 1.1 -> stage 2 and stage 2 waits in send act 0.2 -> stage 0; post each send with the "
                "receive it meets (as [send-act2.0 recv-act0.3])"):
        check(_split(interleaved(3, 3, 2)))
    with _error("schedule 'split' deadlocks: stage 0 waits in recv act 0.4 <- stage 3, stage 3 waits in recv "
                "act 1.3 <- stage 2, stage 2 waits in recv act 2.2 <- stage 1 and stage 1 waits in recv act "
                "3.1 <- stage 0; each waits for a message its peer sends only later"):
        check(_split(interleaved(4, 4, 2), recv_first=True))


@pytest.mark.parametrize("text, fragment", [
    ("stage 0: F0 send-act0 recv-grad0 B0\nstage 1: F0 recv-act0 B0 send-grad0",
     "stage 1 runs F0 before it receives its input (act 0); expected it after"),
    ("stage 0: F0 send-act0 recv-grad0 B0\nstage 1: recv-act0 F0 send-grad0 B0",
     "stage 1 has send grad 0 -> stage 0 before B0 computes it"),
    ("stage 0: F0 send-act0 B0 recv-grad0\nstage 1: recv-act0 F0 B0 send-grad0",
     "stage 0 runs B0 before it receives its output gradient (grad 0); expected it after"),
    ("stage 0: F0 send-act0 B0\nstage 1: recv-act0 F0 B0 send-grad0",
     "stage 1 has send grad 0 -> stage 0, but stage 0 never posts the matching receive"),
    ("stage 0: F0 send-act0 recv-grad0 B0\nstage 1: recv-act0 F0 B0",
     "stage 0 has recv grad 0 <- stage 1, but stage 1 never posts the matching send"),
    ("stage 0: F0 send-act0 recv-grad0 B0 F0\nstage 1: recv-act0 F0 B0 send-grad0",
     "stage 0 runs F0 a second time; expected once"),
    ("stage 0: F0 send-act0 recv-grad0\nstage 1: recv-act0 F0 B0 send-grad0",
     "stage 0 never runs B0; expected one F and one B per microbatch and chunk"),
    ("stage 0: F0 send-act0 send-act0 recv-grad0 B0\nstage 1: recv-act0 F0 B0 send-grad0",
     "stage 0 has send act 0 -> stage 1 a second time; expected each message once"),
    ("stage 0: F3", "stage 0 runs F3, but microbatch 3 is outside 0..0"),
    ("stage 0: F0 send-act0 B0", "has send act 0 -> stage 0, a message to the stage itself; expected none: the "
                                 "schedule has 1 stage"),
    ("stage 0: F0 send-grad0 recv-grad0 B0\nstage 1: recv-act0 F0 B0 send-grad0",
     "stage 0 has send grad 0 -> stage 1, a message to chunk -1, which does not exist"),
])
def test_check_errors(text, fragment):
    stages = text.count("stage ")
    with _error(fragment):
        parse(text, stages, 1)


def test_check_errors_of_records_built_by_hand():
    with _error("schedule 'x': stage 0 runs F0.1, but chunk 1 lives on stage 1"):
        check(Schedule("x", 2, 1, 2, ((Compute("F", 0, 1),), ())))
    with _error("schedule 'x': stage 0 runs F0.9, but chunk 9 is outside 0..3 (2 stages x 2 chunks)"):
        check(Schedule("x", 2, 1, 2, ((Compute("F", 0, 9),), ())))
    bad_peer = (Compute("F", 0, 0), Send("act", 0, 0, 2))
    with _error("stage 0 has send act 0 -> stage 2, but chunk 1 lives on stage 1; expected peer 1"):
        check(Schedule("x", 3, 1, 1, (bad_peer, (), ())))


@pytest.mark.parametrize("text, v, fragment", [
    ("stage 0: X3", 1, "stage 0 of 'hand-written' has token 'X3'; expected F<mb>, B<mb>, send-act<mb>"),
    ("stage 0: F0.0", 1, "has token 'F0.0', but with one chunk per stage the chunk is the stage's; "
                         "expected 'F0'"),
    ("stage 0: F0", 2, "has token 'F0' without its chunk; expected F0.c with c one of the stage's chunks (0, 2)"),
    ("stage 0: [send-act0 F0]", 1, "has 'F0' inside a post; expected only send-... and recv-... there"),
    ("stage 0: [send-act0 [recv-act0]]", 1, "opens '[' inside a post; expected ']' first"),
    ("stage 0: send-act0]", 1, "closes ']' with no post open; expected '[' first"),
    ("stage 0: []", 1, "has an empty post '[]'; expected messages in it"),
    ("stage 0: [send-act0", 1, "opens a post '[' that never closes; expected ']'"),
    ("stage 0: F0\nstge 1: F0", 1, "line 2 of 'hand-written' is 'stge 1: F0'; expected 'stage N: tokens'"),
    ("stage 0: F0\nstage 5: F0", 1, "line 2 of 'hand-written' is for stage 5; expected stages 0..1"),
    ("stage 0: F0", 1, "schedule 'hand-written' has no line for stage 1; expected one 'stage N: ...' line"),
    # numbers of over 4,300 digits were int()'s ValueError (a traceback), other scripts' digits read as ASCII ones
    ("stage 0: F" + "9" * 5000, 1, "stage 0 of 'hand-written' has token 'F99999999999999999999999999999999999"
                                   "9...', a number of more than 9 digits; expected a microbatch below 65,536"),
    ("stage 0: F0." + "9" * 5000, 2, "has token 'F0." + "9" * 34 + "...', a number of more "
                                     "than 9 digits; expected one of the stage's chunks (0, 2)"),
    ("stage " + "9" * 5000 + ": F0", 1, "line 1 of 'hand-written' is for stage 9999999999999999999999999999999999"
                                        "999...; expected stages 0..1"),
    ("stage \u0661: F0", 1, "line 1 of 'hand-written' is 'stage \u0661: F0'; expected 'stage N: tokens'"),
    ("stage 0: F\u0660", 1, "stage 0 of 'hand-written' has token 'F\u0660'; expected F<mb>"),
])
def test_parse_errors(text, v, fragment):
    with _error(fragment):
        parse(text, 2, 1, v)


def test_parse_takes_comments_and_continued_lines():
    text = ("# GPipe on one stage\nstage 0: F0 F1  # forwards\n\nstage 0: B1 B0\n")
    assert parse(text, 1, 2).programs == gpipe(1, 2).programs
    assert parse("stage 0000: F0 F" + "0" * 5000 + "1 B1 B0", 1, 2).programs == gpipe(1, 2).programs  # leading 0s
    with _error("a schedule text must be a str, got bytes"):
        parse(b"stage 0: F0", 1, 1)
    with _error("characters; expected at most 4,000,000"):
        parse("#" * 4_000_001, 1, 1)


# --- timelines -----------------------------------------------------------------------------------------------


def test_timeline_of_orders_is_the_schedules():
    schedule = one_f_one_b(3, 4)
    from_orders = timeline(3, [list(row) for row in schedule.orders])
    assert from_orders.cells == timeline(schedule).cells and from_orders.name == ""
    t = timeline(schedule)
    assert t.grid()[2][:4] == (None, None, Compute("F", 0, 2), Compute("B", 0, 2))
    assert (t.length, t.busy, t.idle, t.bubble) == (12, 24, 12, Fraction(1, 3))
    assert timeline(2, [[], []]).bubble == 0


@pytest.mark.parametrize("args, fragment", [
    ((2, [[]]), "timeline got 1 orders for 2 stages; expected one per stage"),
    ((1, [["F0"]]), "stage 0's order holds 'F0'; expected Compute records"),
    ((2, [[Compute("F", 0, 1)], []]), "stage 0's order runs F0.1, but chunk 1 does not live there"),
    ((1, [[Compute("F", 0, 0), Compute("F", 0, 0)]]), "stage 0's order runs F0.0 twice; expected once"),
    ((2, [[], [Compute("F", 0, 1)]]), "the orders cannot run: stage 1 runs F0.1 after F0.0, which no stage runs"),
    ((2, [[Compute("B", 0, 0), Compute("F", 0, 0)], [Compute("F", 0, 1), Compute("B", 0, 1)]]),
     "stage 0 runs B0.0 after F0.0, which never finishes (the orders wait on each other)"),
    ((0, []), "stages 0 must be an int >= 1"),
    ((2, None), "timeline(stages, orders) needs the orders (or pass a Schedule)"),
])
def test_timeline_errors(args, fragment):
    with _error(fragment):
        timeline(*args)


# --- pictures ------------------------------------------------------------------------------------------------


def test_render_fits_the_width_and_folds_long_time_axes_into_bands():
    text = render(build("interleaved", 4, 8, 2))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert sum(line.startswith("time ") for line in lines) == 3  # 38 units in bands of 18
    assert "stage 0  F0.0 F1.0 F2.0 F3.0 F0.4" in text
    assert "bubble 24/152 = 3/19 = 15.8% idle; formula (p-1)/(v*m+p-1) = 3/19 = 15.8%" in text
    assert "(microbatch, chunk) pairs forward but not yet backward: 11 9 7 5" in text
    narrow = render(build("1f1b", 8, 32), width=60)
    assert max(len(line) for line in narrow.splitlines()) <= 60
    assert "in flight per stage" in narrow
    one = render(build("gpipe", 1, 1))
    assert "gpipe (1 stage, 1 microbatch)" in one and "stage 0  F0 B0" in one


def test_render_of_a_timeline_without_a_name_compares_with_the_flushed_formula():
    t = timeline(2, one_f_one_b(2, 2).orders)
    assert "formula (p-1)/(m+p-1) = 1/3 = 33.3% (as 1f1b)" in render(t)


def test_render_walks_the_cells_a_few_times_not_once_a_band():
    """Timeline.length walked every cell each time it was asked, and render asks once a band of columns: at the
    largest schedule (64 x 256 x 4) 292 walks of 131,072 cells, 16 of render's 18 s. It is worked out once."""
    class Rows(tuple):
        walks = 0

        def __iter__(self):
            Rows.walks += 1
            return super().__iter__()

    t = timeline(build("1f1b", 8, 64))
    counted = Timeline(t.stages, t.virtual, t.microbatches, Rows(t.cells), t.name)
    text = render(counted, width=40)
    assert text == render(t, width=40) and text.count("\ntime ") == 18  # 142 units in bands of 8
    assert Rows.walks <= 8


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = plot(build("interleaved", 2, 4, 2), tmp_path / "grid.png")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot(timeline(build("gpipe", 2, 2)), tmp_path / "grid.svg").endswith("grid.svg")
    with pytest.raises(SpmdsimError, match=r"picture file '.*grid.txt' must end in one of"):
        plot(build("gpipe", 2, 2), tmp_path / "grid.txt")


def test_plot_draws_one_collection_per_stage_and_kind(monkeypatch):
    """A broken_barh call per cell made one collection per cell: 131,072 at the largest schedule `spmdsim
    pipeline --png` takes (64 x 256 x 4), over 10 minutes of matplotlib. Now two per stage, the same cells."""
    pytest.importorskip("matplotlib")
    import spmdsim.programs.pipeline.picture as picture

    drawn = []
    monkeypatch.setattr(picture, "save_figure", lambda fig, path, dpi: drawn.append(fig.axes[0]) or str(path))
    schedule = build("interleaved", 3, 6, 2)
    plot(schedule, "grid.png")  # (nothing written: save_figure replaced)
    bars = drawn[0].collections
    assert len(bars) == 2 * 3
    boxes = sorted((round(p[0][0]), round(p[0][1] + 0.4)) for bar in bars for p in
                   (path.vertices for path in bar.get_paths()))
    assert boxes == sorted((start, s) for s, row in enumerate(timeline(schedule).cells) for start, _ in row)


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(SpmdsimError, match=r"^pictures need matplotlib: pip install"):
        plot(build("gpipe", 2, 2), tmp_path / "grid.png")


@pytest.mark.parametrize("schedule", [build("1f1b", 1, 1), build("gpipe", 2, 1), build("interleaved", 3, 3, 3)])
def test_plot_keeps_its_title_legend_and_axis_label_inside_the_figure(monkeypatch, schedule):
    """A one-stage schedule's figure was 2.7 inches wide: its title ("1f1b (1 stage, 1 microbatch); bu") and the
    time axis's label were cut off at the figure's edge, and the legend sat on the title."""
    pytest.importorskip("matplotlib")
    import spmdsim.programs.pipeline.picture as picture

    drawn = []
    monkeypatch.setattr(picture, "save_figure", lambda fig, path, dpi: drawn.append(fig) or str(path))
    plot(schedule, "grid.png")  # (nothing written: save_figure replaced)
    fig = drawn[0]
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    width = fig.bbox.width
    boxes = {what: artist.get_window_extent(renderer) for what, artist in (
        ("title", ax._left_title), ("label", ax.xaxis.label), ("legend", ax.get_legend()))}
    for what, box in boxes.items():
        assert 0 <= box.x0 and box.x1 <= width, (what, box.x0, box.x1, width)
    title, legend = boxes["title"], boxes["legend"]
    assert title.x1 <= legend.x0 or title.y1 <= legend.y0 or legend.y1 <= title.y0, (title, legend)
