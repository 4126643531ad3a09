"""The GPT trained over a pipeline on simulated ranks (spmdsim.models.gpt.pipeline), checked against one process.

Each run compares every step's loss, gradients and updated parameters with the single-process reference
(microbatch by microbatch) on every rank; the executed schedule's unit-cost bubble and the activations each
stage held are compared with the published formulas (docs/howto/pipelines.md).
"""
from __future__ import annotations

import dataclasses
import time
from fractions import Fraction

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.programs.pipeline.timeline import bubble_formula

IDS = encode(load_text(20_000))
SMALL = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=8, dropout=0.1)


def _pipelined(cfg, pp, dp, tp, steps=2, **kwargs):
    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), pp, dp, tp, steps, IDS, **kwargs)
        line, held = run.timeline(), run.held()
        run.close()
        return results, line, held

    return spmdsim.simulate(pp * dp * tp, main)[0]


@pytest.mark.parametrize("pp, dp, tp, sp, schedule, m, v, layers", [
    (2, 2, 2, True, "1f1b", 4, 1, 4),
    (2, 2, 2, True, "gpipe", 4, 1, 4),
    (2, 1, 2, True, "interleaved", 4, 2, 4),
    (4, 1, 2, False, "1f1b", 4, 1, 4),
    (8, 1, 1, False, "1f1b", 8, 1, 8),
])
def test_pipelined_training_agrees_with_one_process_every_step(pp, dp, tp, sp, schedule, m, v, layers):
    cfg = GPTConfig(layers=layers, d_model=32, heads=2, seq=16, batch=8, dropout=0.1)
    results, line, held = _pipelined(cfg, pp, dp, tp, sp=sp, schedule=schedule, microbatches=m, virtual=v)
    assert len(results) == 2 and all(r.passed for r in results), [r.errors for r in results]
    assert max(max(r.errors) for r in results) <= TOLERANCE
    assert results[1].loss < results[0].loss + 0.5  # trained, not diverged
    assert line.bubble == bubble_formula(schedule, pp, m, v)
    assert all(r.bytes_sent > 0 for r in results)


@pytest.mark.parametrize("sp, seq, scattered", [(False, 16, True), (True, 16, False), (False, 15, False)])
def test_a_stage_boundary_moves_the_sequence_tp_th_per_rank(sp, seq, scattered):
    """Megatron's scatter/gather: without sp each rank sends its tp-th of the replicated (T, b, h) block over
    pp and the receiving stage all-gathers it over tp, so a boundary moves s*b*h/tp per rank, as with sp (whose
    blocks are already the sequence's tp-th). Where tp does not divide the sequence the block goes whole."""
    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=seq, batch=8, dropout=0.1)
    pp, tp, m = 2, 2, 4

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), pp, 1, tp, 1, IDS, sp=sp, microbatches=m)
        rows = [(e.op, e.axes, e.bytes_sent, e.bytes_received, e.label) for e in run.trace.entries]
        run.close()
        return results[0].passed, rows

    for passed, rows in spmdsim.simulate(pp * tp, main):
        assert passed
        block = seq * (cfg.batch // m) * cfg.d_model * 8  # one microbatch's (T, b, h) float64 block
        wire = block // tp if sp or scattered else block
        moved = [sent + received for op, axes, sent, received, label in rows if label == "pipeline"]
        assert sum(moved) == 2 * m * wire  # each microbatch's activation one way, its gradient back
        if not sp:  # (sp's blocks gather the sequence inside every layer too)
            gathers = [r for r in rows if r[0] == "allgather" and r[1] == ("tp",) and r[3] == block // tp]
            assert len(gathers) == (m if scattered else 0)  # one per received activation or gradient


def test_each_message_group_is_counted_once_a_run_and_every_steps_rows_are_the_schedules(monkeypatch):
    """The pipeline makes a group's step record (a Messages: op, peers, bytes each way) the first time it posts
    such a group (the same sends and receives, peers and tags: every microbatch's of one kind between two stages)
    and hands the executor that record from then on: three steps make one record a kind of group, and the last
    step's rows are what the schedule says (its sends and receives, a wire block each)."""
    from spmdsim.programs.pipeline.records import Post, Send
    from spmdsim.programs.plan.messages import Messages

    cfg, pp, m = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=8, dropout=0.1), 4, 4
    counted: dict = {}
    made = Messages.of
    monkeypatch.setattr(Messages, "of", classmethod(lambda cls, *a: counted.setdefault(
        spmdsim.world().rank, []).append(1) or made(*a)))

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), pp, 1, 1, 3, IDS, microbatches=m)
        rows = [(e.op, e.axes, e.group_size, e.bytes_sent, e.bytes_received, e.peers, e.label)
                for e in run.trace.entries if e.label in ("pipeline", "embedding group")]
        program = run.schedule.programs[run.stage]
        run.close()
        return [(r.calls, r.bytes_sent) for r in results], rows, program

    wire = cfg.seq * (cfg.batch // m) * cfg.d_model * 8
    table = cfg.vocab * cfg.d_model * 8
    for rank, (totals, rows, program) in enumerate(spmdsim.simulate(pp, main)):
        assert totals[0] == totals[1] == totals[2]
        expected, kinds = [], set()
        for action in program:
            ops = action.ops if isinstance(action, Post) else (action,) if hasattr(action, "peer") else ()
            if ops:  # (one chunk a stage: a message's tag follows from its kind and peer)
                kinds.add(tuple((isinstance(op, Send), op.what, op.peer) for op in ops))
                sends = sum(isinstance(op, Send) for op in ops)
                op = "sendrecv" if 0 < sends < len(ops) else ("send" if sends else "recv")
                expected.append((op, ("pp",), pp, sends * wire, (len(ops) - sends) * wire,
                                 len({op.peer for op in ops}), "pipeline"))
        if rank in (0, pp - 1):  # the tied table's gradients between the ends
            expected.append(("sendrecv", ("pp",), pp, table, table, 1, "embedding group"))
            kinds.add("tied")
        assert rows == expected and len(counted[rank]) == len(kinds) < len(expected)


def test_the_doors_point_to_point_refuses_a_description_its_messages_do_not_fit_under_check():
    """`known` (runtime.door.messages of the group) makes the trace row without counting; with the divergence
    check on, the door counts anyway and refuses a description that does not fit, in one line."""
    from spmdsim import Layout, Mesh, collect_trace
    from spmdsim.runtime import debug
    from spmdsim.runtime.door import messages, point_to_point

    def main(check, wrong):
        debug.configure(check=check)
        mesh = Mesh(Layout((2,), ("pp",)), spmdsim.world())
        comm, other = mesh.group("pp"), 1 - mesh.rank
        receives, sends = [(np.empty(4), other, 7)], [(np.full(4, float(mesh.rank)), other, 7)]
        known = messages(comm, "pp", receives, sends)
        assert known == ("sendrecv", ("pp",), 2, 32, 32, 1, ((other, 32, 32),))
        if wrong:
            known = known[:3] + (64,) + known[4:]
        with collect_trace() as trace:
            point_to_point(mesh, comm, ("pp",), receives, sends, "x", known)
            point_to_point(mesh, comm, ("pp",), receives, sends, "x")
        a, b = trace.entries
        assert receives[0][0][0] == other
        return [(e.op, e.axes, e.group_size, e.bytes_sent, e.bytes_received, e.peers, e.partners) for e in (a, b)]

    for check in (False, True):
        for rank, rows in enumerate(spmdsim.simulate(2, lambda: main(check, False))):
            assert rows == [("sendrecv", ("pp",), 2, 32, 32, 1, ((1 - rank, 32, 32),))] * 2
    with pytest.raises(SpmdsimError, match=r"^point_to_point: known \('sendrecv', \('pp',\), 2, 64, 32, 1, "
                       r"\(\((\d), 32, 32\),\)\) does not describe the messages posted; expected "
                       r"\('sendrecv', \('pp',\), 2, 32, 32, 1, \(\(\1, 32, 32\),\)\)\n"):
        spmdsim.simulate(2, lambda: main(True, True))


def test_one_microbatch_pipeline_is_the_unpipelined_step():
    """pp 2 with one microbatch draws the unpipelined step's masks: the same losses to rounding."""
    def plain():
        model, results = train(SMALL, spmdsim.world(), 1, 2, 2, IDS, sp=True)
        model.mesh.close()
        return [r.loss for r in results]

    flat = spmdsim.simulate(2, plain)[0]
    results, _, _ = _pipelined(SMALL, 2, 1, 2, sp=True, schedule="gpipe", microbatches=1)
    assert np.allclose([r.loss for r in results], flat, rtol=1e-12, atol=0)


def test_gradient_accumulation_without_stages():
    """pp 1 with 4 microbatches: gradient accumulation, one dp reduction per step, checked the same way."""
    results, line, held = _pipelined(SMALL, 1, 2, 2, sp=True, schedule="1f1b", microbatches=4)
    assert all(r.passed for r in results)
    assert line.bubble == 0 and held == (1,)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_executed_bubble_and_held_activations_follow_the_formulas(schedule, p):
    """A tiny GPT (one layer per chunk) run for one step, unchecked: the executed cells' unit-cost bubble is
    the formula's; a stage holds m microbatches under GPipe and min(p - s, m) under 1F1B."""
    v = 2 if schedule == "interleaved" else 1
    # m = 4p at p 2 and 4 covers the regime m > 2p; at p 8 it costs half the test's CPU and adds none.
    for m in (p, 2 * p, 4 * p) if p < 8 else (p, 2 * p):
        cfg = GPTConfig(layers=p * v, d_model=4, heads=1, seq=2, batch=m, dropout=0.0, vocab=128)
        results, line, held = _pipelined(cfg, p, 1, 1, steps=1, schedule=schedule, microbatches=m, virtual=v,
                                         check=False)
        assert line.bubble == bubble_formula(schedule, p, m, v) == (
            Fraction(p - 1, v * m + p - 1)), (schedule, p, m)
        if schedule == "gpipe":
            assert held == (m,) * p
        elif schedule == "1f1b":
            assert held == tuple(min(p - s, m) for s in range(p))


@pytest.mark.parametrize("kwargs, message", [
    (dict(microbatches=3), "batch 8 is not divisible by 3 microbatches"),
    (dict(microbatches=8), "a microbatch of 1 sample is not divisible by dp 2"),
    (dict(pp=4, virtual=2, microbatches=4, schedule="interleaved"), "4 layers cannot fill 8 pipeline chunks"),
    # the schedule's own refusals (build's), before any mesh is made
    (dict(virtual=2, microbatches=4), "the 1f1b schedule holds one chunk per stage, got virtual stages 2"),
    # a KeyError from the walk of chunks at pp 1 before (and `spmdsim estimate gpt --virtual-stages 2` its traceback)
    (dict(pp=1, virtual=2, microbatches=2, schedule="interleaved"),
     "virtual stages 2 interleave the layers over the pipeline's stages .*: they need pp 2 or more, got pp 1"),
])
def test_refusals_are_one_line_on_every_rank(kwargs, message):
    pp = kwargs.pop("pp", 2)

    def main():
        train_pipelined(SMALL, spmdsim.world(), pp, 2, 1, 1, IDS, **kwargs)

    with pytest.raises(SpmdsimError, match=message):
        spmdsim.simulate(pp * 2, main)


@pytest.mark.parametrize("schedule, m, v, message", [
    ("1f1b", 4, 2, "the 1f1b schedule holds one chunk per stage, got virtual stages 2; several chunks per stage "
                   "is --schedule interleaved"),
    ("gpipe", 4, 3, "the gpipe schedule holds one chunk per stage, got virtual stages 3; several chunks per stage "
                    "is --schedule interleaved"),
    ("interleaved", 2, 2, "the interleaved schedule needs microbatches divisible by stages (as Megatron), got 2 "
                          "microbatches for 4 stages"),
    ("interleaved", 4, 1, "the interleaved schedule needs virtual stages >= 2, got 1; one chunk per stage is "
                          "--schedule 1f1b"),
    ("1f1b", 4, 1, None),
])
def test_the_layout_problem_names_what_the_schedule_cannot_take(schedule, m, v, message):
    """pipeline_layout_problem(..., schedule=) says what build would refuse (a trainer asks it before printing
    anything); without a schedule it asks nothing of one (spmdsim estimate's search names none)."""
    from spmdsim.models.gpt.pipeline_problems import pipeline_layout_problem

    cfg = GPTConfig(layers=24, d_model=32, heads=2, seq=16, batch=8)
    assert pipeline_layout_problem(cfg, 4, 1, 1, False, m, v, schedule=schedule) == message
    assert pipeline_layout_problem(cfg, 4, 1, 1, False, m, v) is None


#: (train_gpt.py's pipeline arguments, the refusal it prints)
REFUSED_PIPELINES = [
    (["--pp", "2", "--virtual-stages", "2"],
     "the 1f1b schedule holds one chunk per stage, got virtual stages 2; several chunks per stage is --schedule "
     "interleaved"),
    (["--pp", "3"],
     "batch 8 is not divisible by 6 microbatches (the default at --pp 3: 2 x pp); expected --microbatches dividing "
     "the batch, or a --batch that 6 divides"),
    (["--microbatches", "2", "--schedule", "interleaved"],
     "--schedule interleaved interleaves 2 model chunks a stage (the default --virtual-stages) over the pipeline's "
     "stages: expected --pp 2 or more, got --pp 1"),
]


@pytest.fixture(scope="module")
def refused_pipelines(tmp_path_factory) -> list:
    """`python examples/train_gpt.py --ranks PP ... ARGV` of each REFUSED_PIPELINES case, as a fresh interpreter
    runs it: both in ONE fresh interpreter (testkit.run_scripts: a Python start and the example's imports less)."""
    from pathlib import Path

    from testkit import run_scripts

    path = Path(__file__).resolve().parents[1] / "examples" / "train_gpt.py"
    return run_scripts([(path, ["--ranks", argv[1], "--layers", "4", "--d-model", "32", "--seq", "16", "--steps", "1",
                                "--sample", "0", *argv]) for argv, _ in REFUSED_PIPELINES],
                       tmp_path_factory.mktemp("refused"))


@pytest.mark.parametrize("case", range(len(REFUSED_PIPELINES)))
def test_train_gpt_refuses_a_pipelines_sizes_in_one_line_before_any_output(case, refused_pipelines):
    """`train_gpt.py --pp 2 --virtual-stages 2` (the 1f1b schedule) printed the run's header, "pipeline: 1f1b
    schedule, 4 microbatches" and the table's head, then refused at the schedule's build; now one line first.
    `--pp 3` alone refused "6 microbatches" the user never wrote: the line says they are the default; so does
    `--schedule interleaved` without a pipeline of the "virtual stages 2" it named."""
    argv, message = REFUSED_PIPELINES[case]
    done = refused_pipelines[case]
    assert done.returncode == 2, done
    assert done.stdout == "", done  # before the banner too: run_main's checks of the command line
    assert " ".join(done.stderr.split()) == f"spmdsim: error: the GPT cannot run on {argv[1]} ranks: {message}", \
        done.stderr


def test_dry_run_runs_a_representative_per_stage_and_repeats_measured_cells(monkeypatch):
    """A dry run of pp 4: one rank per stage runs; later microbatches' cells repeat the first's measured
    rows, so the calls and bytes equal those of running every cell (the peak is the first cell's kept bytes
    times those in flight: see docs/howto/pipelines.md)."""
    from spmdsim.models.gpt import stage_memory

    cfg = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=16, dropout=0.1)

    def main():
        run, _ = train_pipelined(cfg, spmdsim.world(), 4, 2, 2, 1, IDS, sp=True, schedule="1f1b", microbatches=8)
        run.close()

    def lines():
        report = spmdsim.simulate(16, main, dry_run=True).report
        return [(r.calls, r.bytes_sent, r.bytes_received, r.counts) for r in report.ranks]

    repeated = lines()
    monkeypatch.setattr(stage_memory._DryCells, "again", lambda self, key: False)  # every cell runs
    assert lines() == repeated
    stages = [repeated[4 * s] for s in range(4)]
    assert all(repeated[r] == stages[r // 4] for r in range(16))
    # The middle stages send the same bytes (their warm-ups post them in different groups); the ends
    # hold the embedding and the head.
    assert stages[1][1] == stages[2][1] and stages[0][:2] != stages[1][:2] != stages[3][:2]
    counts = dict(stages[1][3])
    assert counts.get("send", 0) + counts.get("sendrecv", 0) >= 8  # every microbatch crossed both boundaries


@pytest.mark.parametrize("recompute, zero, schedule, v", [
    ("none", 0, "1f1b", 1), ("selective", 1, "interleaved", 2), ("full", 1, "gpipe", 1)])
def test_recomputation_and_zero1_compose_with_the_pipeline_and_a_dry_run_measures_the_same(recompute, zero,
                                                                                           schedule, v):
    """Each stage recomputes and shards its optimizer as the unpipelined trainer does: every step agrees
    with one numpy process; a dry run (one representative per stage, later cells repeated) keeps the same
    bytes for backward at the moment the schedule holds the most, the same optimizer bytes, calls and
    bytes sent, on every rank. A real run's parameters and gradients are placed in page-rounded buffers
    for MPI (spmdsim.base.buffers), a dry run's are their exact sizes: those differ by less than a page each.
    SMALL's sizes (d_model 32, seq 16): what is kept and where does not depend on them."""
    cfg = SMALL

    def main():
        run, steps = train_pipelined(cfg, spmdsim.world(), 2, 2, 2, 2, IDS, sp=True, schedule=schedule, virtual=v,
                                     microbatches=4, recompute=recompute, zero=zero, memory=True,
                                     check=not spmdsim.runtime.sim.dry_run_active())
        run.close()
        return steps

    real, dry = spmdsim.simulate(8, main), spmdsim.simulate(8, main, dry_run=True)
    assert all(s.passed and max(s.errors) <= TOLERANCE for steps in real for s in steps), real[0]
    for rank in range(8):
        a, b = real[rank][-1], dry[rank][-1]
        assert (a.calls, a.bytes_sent) == (b.calls, b.bytes_sent)
        assert (a.memory.kept, a.memory.master, a.memory.states, a.memory.buffers) == \
            (b.memory.kept, b.memory.master, b.memory.states, b.memory.buffers), rank
        pages = 4096 * 40  # at most 40 parameter blocks (and their gradients) per stage here
        assert 0 <= a.memory.params - b.memory.params < pages and 0 <= a.memory.grads - b.memory.grads < pages
    kinds = [dict(dry[r][-1].memory.kept) for r in (0, 4)]
    assert "embedding" in kinds[0] and "head" in kinds[1] and "head" not in kinds[0]  # the stages' own ends
    assert ("attention core" in kinds[0]) == (recompute == "none")
    assert (recompute == "full") == ("block input" in kinds[0] and "mlp" not in kinds[0])
    assert (dry[0][-1].memory.master > 0) == bool(zero)


@pytest.mark.parametrize("pp, dp, tp, schedule, v, zero", [
    (2, 2, 2, "1f1b", 1, 0), (2, 1, 2, "interleaved", 2, 0), (4, 1, 2, "gpipe", 1, 0), (1, 2, 4, "1f1b", 1, 1),
    (2, 2, 2, "1f1b", 1, 1), (2, 2, 1, "interleaved", 2, 1), (4, 2, 1, "gpipe", 1, 1)])
def test_clipping_takes_the_joint_norm_over_every_stage(pp, dp, tp, schedule, v, zero):
    """clip 0.05 clips every step here (the norms are about 1): the stages sum their squares over pp (the tied
    table counted once; with ZeRO-1 each stage's squares are those of its dp ranks' slices), and each step still
    agrees with one numpy process clipping the whole model."""
    cfg = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, clip=0.05)

    def main():
        run, steps = train_pipelined(cfg, spmdsim.world(), pp, dp, tp, 3, IDS, sp=True, schedule=schedule,
                                     virtual=v, microbatches=4, zero=zero)
        run.close()
        return steps

    steps = spmdsim.simulate(pp * dp * tp, main)[0]
    assert all(s.passed and max(s.errors) <= TOLERANCE for s in steps), steps
    assert all(s.norm > 4 * cfg.clip for s in steps), [s.norm for s in steps]  # every step clipped
    unclipped = spmdsim.simulate(pp * dp * tp, lambda: train_pipelined(
        GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8), spmdsim.world(), pp, dp, tp, 2, IDS, sp=True,
        schedule=schedule, virtual=v, microbatches=4, zero=zero, check=False)[1])[0]
    assert steps[1].loss != unclipped[1].loss  # clipping changed the first update


@pytest.mark.parametrize("pp, dp, tp, sp, schedule, v, zero", [
    (2, 2, 2, True, "1f1b", 1, 0), (2, 1, 2, False, "gpipe", 1, 1), (2, 1, 2, True, "interleaved", 2, 0)])
def test_replayed_pipeline_steps_equal_the_eager_ones_bit_for_bit(pp, dp, tp, sp, schedule, v, zero, monkeypatch):
    """Step 0 captured with its point-to-point messages (spmdsim.runtime.replay), steps 1-3 replayed: the
    stage's program runs once (the replays run none of its Python), and the losses, calls, bytes, parameters
    and gradients equal those of the same steps run eagerly, bit for bit, and so do the memory reports; every
    step passes the check. Without
    sp (gpipe here) the boundaries scatter and gather over tp; with ZeRO-1 the optimizer's slices replay too."""
    from spmdsim.models.gpt import pipeline

    programs = []
    run_program = pipeline._run_program
    monkeypatch.setattr(pipeline, "_run_program", lambda *a, **k: programs.append(1) or run_program(*a, **k))

    def both():
        out = []
        for replay in (False, True):
            ends = []  # when each step ended on this rank
            run, steps = train_pipelined(SMALL, spmdsim.world(), pp, dp, tp, 4, IDS, sp=sp, schedule=schedule,
                                         microbatches=4, virtual=v, zero=zero, replay=replay, memory=True,
                                         on_step=lambda r: ends.append(time.perf_counter()))
            # (ZeRO-1: `.grad` is None after a step, eager and replayed: its buffer took the gathered parameters)
            out.append((steps, [(t.local.tobytes(), t.grad if t.grad is None else t.grad.local.tobytes())
                                for t in run.params.values()],
                        [name for name, _, _ in run.cells], min(start for _, start, _ in run.cells) > ends[-2]))
            run.close()
        return out

    ranks = pp * dp * tp
    for (eager, eager_blocks, eager_cells, _), (replayed, blocks, cells, timed) in spmdsim.simulate(ranks, both):
        assert [r.loss for r in replayed] == [r.loss for r in eager]
        assert [(r.calls, r.bytes_sent) for r in replayed] == [(r.calls, r.bytes_sent) for r in eager]
        # The memory looks: a replayed step's were the captured step's (no optimizer states yet at its peak).
        assert [r.memory for r in replayed] == [r.memory for r in eager]
        assert blocks == eager_blocks and cells == eager_cells
        assert timed  # the last step's cells were stamped by its replay, not left from the capture
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in replayed), replayed
    assert len(programs) == ranks * (4 + 1)  # eager: every step; replayed: the captured step alone


def test_a_text_beyond_the_vocabulary_is_refused_before_the_first_step():
    """The text's ids are checked whole, alike on every rank, before any collective (a step drew one and
    refused it at that step before)."""
    small = dataclasses.replace(SMALL, vocab=100)

    def main():
        train_pipelined(small, spmdsim.world(), 2, 1, 1, 1, IDS)

    with pytest.raises(SpmdsimError, match=r"the text's token ids run from \d+ to \d+, outside the vocabulary "
                                           r"\[0, 100\); expected vocab \d+ or more"):
        spmdsim.simulate(2, main)


def test_a_pipelined_dry_runs_table_counts_what_the_real_steps_row_counts():
    """`train_gpt.py --pp 2 ... --dry-run` listed 26 calls and 8 bytes more for rank 0 than the real step's row
    (25): the loss sent to every stage after the step (for the check and the row) was counted by the dry run's
    table, not by the row. It is reporting, not the step's (Megatron's stages keep their loss): neither counts
    it now, and the table's rank 0 is the row's."""
    def main():
        run, steps = train_pipelined(SMALL, spmdsim.world(), 2, 1, 2, 1, IDS, sp=True, microbatches=2,
                                     check=not spmdsim.runtime.sim.dry_run_active())
        run.close()
        return steps

    real, dry = spmdsim.simulate(4, main), spmdsim.simulate(4, main, dry_run=True)
    assert [(r.calls, r.bytes_sent) for r in dry.report.ranks] == [(s[0].calls, s[0].bytes_sent) for s in real]
    assert all(s[0].passed for s in real)


def test_simulated_ranks_share_one_gathered_table_in_the_pipelined_check(monkeypatch):
    """The pipelined check's table of every rank's blocks is one array the 4 simulated ranks read (an Allgather
    gave each its own table of p rows, as train's did: tests/test_gpt_parallel.py), and the steps pass."""
    from spmdsim.models.gpt import stage_check as module

    real, seen = module._tables, []

    def spy(run, cfg, where, tables, label):
        rows = real(run, cfg, where, tables, label)
        seen.append((label, rows))
        return rows

    monkeypatch.setattr(module, "_tables", spy)
    results = spmdsim.simulate(4, lambda: train_pipelined(SMALL, spmdsim.world(), 2, 1, 2, 1, IDS)[1])[0]
    assert results[0].passed, results[0]
    labels = {label for label, _ in seen}
    assert labels, seen
    for label in labels:
        tables = [rows for seen_label, rows in seen if seen_label == label]
        where = {rows.__array_interface__["data"][0] for rows in tables}  # the memory each call's table lies in
        assert len(tables) % 4 == 0 and len(where) <= len(tables) // 4, (label, len(tables), len(where))


@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (2, True)])
def test_a_gradient_a_stage_receives_takes_its_outputs_layout_object(monkeypatch, tp, sp):
    """A gradient a stage receives comes laid out by its chunk's output's very layout object (the one the
    output's node wants), not by an equal one of the model's: the backward's layout tests stop at `is`, as
    between the layers of one chunk (an equal object cost comparisons and moves each microbatch).
    Every step checked against one process; without sp at tp 2 the boundaries scatter and gather over tp."""
    from spmdsim.nn.autograd import engine

    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=4, dropout=0.1)
    same = []
    backward = engine.backward_kept  # (each microbatch's backward: the pipeline's entry)

    def spied(loss, gradient, kept, reduce_with=None):
        if gradient is not None:
            same.append(gradient._layout is loss._layout)
        backward(loss, gradient, kept, reduce_with)

    monkeypatch.setattr(engine, "backward_kept", spied)

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, tp, 2, IDS, sp=sp, microbatches=2)
        run.close()
        return [r.passed for r in results]

    assert all(all(p) for p in spmdsim.simulate(2 * tp, main))
    assert len(same) == 2 * 2 * tp and all(same)  # stage 0's ranks: 2 microbatches x 2 steps each


def test_a_step_checks_the_parameters_its_microbatches_keep_pending_once(monkeypatch):
    """Every microbatch's backward keeps the stage's parameters pending; a step checks them once
    (engine.kept_leaves), not once per microbatch, and still agrees with one process."""
    from spmdsim.nn.autograd import engine

    checked = []
    kept_leaves = engine.kept_leaves
    monkeypatch.setattr(engine, "kept_leaves", lambda params: checked.append(len(params)) or kept_leaves(params))
    cfg = GPTConfig(layers=2, d_model=16, heads=2, seq=8, batch=4, dropout=0.0)

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 1, 2, IDS, microbatches=4)
        run.close()
        return [r.passed for r in results]

    assert all(all(p) for p in spmdsim.simulate(2, main))
    assert len(checked) == 2 * 2  # 2 ranks x 2 steps, of 4 microbatches each


def test_an_eager_pipelined_step_stamps_and_reads_its_sent_blocks_without_the_replay_wrappers():
    """Outside a capture a stage's program stamps its cells with the clock's function itself (no replay.kernel
    wrapper: that thread does not capture) and reads the blocks it sends as ``_local`` (no DTensor.local call);
    a captured step still records them (test_replayed_pipeline_steps_equal_the_eager_ones_bit_for_bit)."""
    import sys

    cfg = GPTConfig(layers=2, d_model=16, heads=2, seq=8, batch=4, dropout=0.1)

    def main():
        comm, seen, n = spmdsim.world(), [], [0]

        def hook(frame, event, arg):
            if event == "call" and frame.f_code.co_name in ("recorded", "local_of", "_stamp"):
                caller = frame.f_back.f_code
                if caller.co_filename.endswith("stage_program.py") and caller.co_name in ("_run_program", "forward",
                                                                                     "backward"):
                    seen.append((frame.f_code.co_name, caller.co_name))

        def on_step(result):
            n[0] += 1
            sys.setprofile(hook if n[0] == 1 else None)  # the second step watched

        run, results = train_pipelined(cfg, comm, 2, 1, 1, 2, IDS, microbatches=2, check=False, on_step=on_step)
        sys.setprofile(None)
        run.close()
        return seen

    for seen in spmdsim.simulate(2, main):
        assert set(seen) == {("_stamp", "_run_program")} and len(seen) == 8, seen  # 4 cells, 2 stamps each
