"""The GPT on DTensors (spmdsim.models.gpt.parallel) on simulated ranks: every step equal to one numpy process.

A small model trains a few steps on several meshes, with and without
sequence parallelism; each step's loss, gradients and updated parameters
must match the reference step within 1e-10 (spmdsim.models.gpt.train). The
examples that README quotes run as a user runs them.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.parallel import mesh_problem
from spmdsim.models.gpt.train import TOLERANCE, train
from docs_commands import run_example
from testkit import unfold

ROOT = Path(__file__).resolve().parents[1]
SMALL = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.2)
TEXT = encode(load_text(20_000))


@pytest.mark.parametrize("ranks, dp, tp, sp", [(8, 2, 4, True), (8, 2, 4, False), (4, 2, 2, True),
                                               (2, 2, 1, False)])
def test_each_step_matches_one_numpy_process(ranks, dp, tp, sp):
    results = spmdsim.simulate(ranks, lambda: train(SMALL, spmdsim.world(), dp, tp, 3, TEXT, sp=sp)[1])
    steps = results[0]
    assert all(r == steps for r in results)  # every rank reports the same
    assert [r.step for r in steps] == [0, 1, 2]
    for r in steps:
        assert r.passed and max(r.errors) <= TOLERANCE, r
        assert r.calls > 0 if ranks > 1 else True
    assert steps[-1].loss < steps[0].loss


def test_clipped_gradients_match_one_numpy_process():
    """With cfg.clip the gradients' joint norm (one Allreduce over the mesh, each block counted once) is
    clipped before AdamW, on the ranks and in the reference alike; a clip this small changes the run."""
    import dataclasses

    import numpy as np

    from spmdsim.models.gpt.reference import Trainer, clip_grads

    clipped = dataclasses.replace(SMALL, clip=0.05)
    steps = spmdsim.simulate(8, lambda: train(clipped, spmdsim.world(), 2, 4, 3, TEXT, sp=True)[1])[0]
    assert all(r.passed for r in steps), steps
    plain, short = Trainer(SMALL, TEXT), Trainer(clipped, TEXT)
    for _ in range(3):
        plain.step()
        norm = clip_grads(short.step()[1], 1e9)[0]  # the returned gradients are the clipped ones
        assert abs(norm - 0.05) < 1e-6  # max_norm * norm / (norm + 1e-6), as PyTorch
    assert any(not np.allclose(plain.params[k], short.params[k], rtol=1e-6, atol=0) for k in plain.params)


def test_a_wrong_gradient_is_caught():
    """The check can fail: a model whose key projection's gradient is doubled differs from the reference."""
    from spmdsim.models.gpt import parallel

    original = parallel.GPT.loss

    def tampered(self, ids, targets, step, train=True):
        loss = original(self, ids, targets, step, train)
        self.params["h0.attn.wk"]._ag.grad = None
        return loss * 1.0000001  # every gradient off by 1e-7 relative

    parallel.GPT.loss = tampered
    try:
        results = spmdsim.simulate(4, lambda: train(SMALL, spmdsim.world(), 1, 4, 1, TEXT)[1])
    finally:
        parallel.GPT.loss = original
    assert not results[0][0].passed and results[0][0].errors[1] > 1e-8


@pytest.mark.parametrize("sp", [False, True])
def test_every_dialect_writes_megatrons_layouts(sp):
    from spmdsim import Layout
    from spmdsim.models.gpt.parallel import DIALECTS, dialect_layouts, megatron_layouts

    layout = Layout((2, 4), ("dp", "tp"))
    want = megatron_layouts(SMALL, layout, sp)
    assert want["h0.attn.wq"] == layout(None, "tp") and want["h0.mlp.w2"] == layout("tp", None)
    assert want["wpe"] == (layout("tp", None) if sp else layout(None, None))
    for dialect in DIALECTS:
        assert dialect_layouts(SMALL, layout, dialect, sp) == want, dialect
    with pytest.raises(SpmdsimError, match=r"dialect 'mxnet' is not one of"):
        dialect_layouts(SMALL, layout, "mxnet")


@pytest.mark.parametrize("sp", [False, True])
def test_every_dialect_writes_the_moe_gpts_layouts_on_a_dp_ep_tp_mesh(sp):
    """The experts' layouts and the dense ones on the MoE mesh (dp, ep, tp), each written as its dialect writes
    it (`written`: DTensor's and OneFlow's with a placement per mesh axis) and read back by spmdsim.layouts.dialects:
    Megatron's plan; on (dp, tp) `written` gives the DIALECTS table's texts."""
    import dataclasses

    from spmdsim import Layout
    from spmdsim.models.gpt.layouts import written
    from spmdsim.models.gpt.parallel import DIALECTS, dialect_layouts, megatron_layouts
    from spmdsim.models.moe import MoEConfig

    cfg = dataclasses.replace(SMALL, layers=2, moe=MoEConfig(experts=4, top_k=2))
    layout = Layout((2, 2, 2), ("dp", "ep", "tp"))
    want = megatron_layouts(cfg, layout, sp)
    assert want["h1.moe.w1"] == layout("ep", None, "tp") and want["h1.moe.b2"] == layout("ep", None)
    for dialect in DIALECTS:
        assert dialect_layouts(cfg, layout, dialect, sp) == want, dialect
    assert written("dtensor", "expert w1", 3, layout.alias_name) == "R,S(0),S(2)"
    assert written("oneflow", "rows", 2, layout.alias_name) == "B,B,S(0)"
    for dialect, roles in DIALECTS.items():
        for role, text in roles.items():
            ndim = 1 if role == "vector" else len(text) if dialect in ("mindspore", "jax") else 2
            assert written(dialect, role, ndim, ("dp", "tp")) == (tuple(text) if isinstance(text, tuple) else text)


def test_mesh_problems_are_one_line():
    assert mesh_problem(SMALL, 3, 1, False) == "batch 4 is not divisible by dp 3"
    assert "heads 4 is not divisible by tp 8" in mesh_problem(SMALL, 1, 8, False)
    assert "seq 16 is not divisible by tp 32" in mesh_problem(GPTConfig(heads=32, d_model=64, seq=16), 1, 32, True)
    assert mesh_problem(SMALL, 2, 4, True) is None
    with pytest.raises(SpmdsimError, match=r"the GPT cannot run on dp 1 x tp 8: heads 4"):
        spmdsim.simulate(8, lambda: train(SMALL, spmdsim.world(), 1, 8, 1, TEXT))


def test_dry_run_counts_the_same_collectives_as_a_real_run():
    real = spmdsim.simulate(8, lambda: train(SMALL, spmdsim.world(), 2, 4, 1, TEXT, sp=True, check=False)[1])
    dry = spmdsim.simulate(8, lambda: train(SMALL, spmdsim.world(), 2, 4, 1, TEXT, sp=True)[1], dry_run=True)
    assert dry[0][0].calls == real[0][0].calls and dry[0][0].bytes_sent == real[0][0].bytes_sent


@pytest.mark.parametrize("precision, labels", [("fp64", ["check.params"]), ("fp32", ["check.grads", "check.start"])])
def test_simulated_ranks_share_one_gathered_table_per_call(monkeypatch, precision, labels):
    """The check's table of every rank's blocks is one array the 8 simulated ranks all read (an Allgather gave
    each rank its own table of p rows: p^2 rows in one process), each row that rank's blocks, and the step passes."""
    import numpy as np

    from spmdsim.models.gpt import train as module

    real, seen = module._table, []

    def spy(model, tables, label, width):
        rows = real(model, tables, label, width)
        own = np.concatenate([np.asarray(t[name], np.float64).reshape(-1) for t in tables for name in model.params])
        assert np.array_equal(np.reshape(rows, (model.mesh.size, -1))[model.mesh.rank], own)
        seen.append((label, rows))
        return rows

    monkeypatch.setattr(module, "_table", spy)
    steps = spmdsim.simulate(8, lambda: train(SMALL, spmdsim.world(), 2, 4, 1, TEXT, sp=True,
                                              precision=precision)[1])[0]
    assert steps[0].passed, steps[0]
    assert sorted({label for label, _ in seen}) == labels
    for label in labels:
        tables = [rows for seen_label, rows in seen if seen_label == label]
        assert len(tables) == 8 and all(t is tables[0] for t in tables), label


def _run(*args: str) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository's root; an example on `--ranks N` in this process (run_example)."""
    return run_example(*args)


def test_train_gpt_example_as_a_user_runs_it():
    out = _run("examples/train_gpt.py", "--ranks", "8", "--dp", "2", "--tp", "4", "--sp", "--layers", "1",
               "--d-model", "32", "--seq", "16", "--batch", "4", "--steps", "3", "--every", "1", "--sample", "8")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1] == "GPT: 1 layer, d_model 32, 4 heads, seq 16, batch 4, dropout 0.1"
    assert lines[2].startswith("text: 200,000 characters of Python's standard library sources")
    assert "mesh dp 2 x tp 4 with sequence parallelism" in lines[3]
    assert lines[4] == "layouts in mindspore: column-parallel ('None', 'tp'), row-parallel ('tp', 'None')"
    steps = [line.split() for line in lines[6:9]]
    assert [s[0] for s in steps] == ["0", "1", "2"] and all(float(s[-2]) <= 1e-10 for s in steps)
    assert "check: 3 steps vs one numpy process (loss, 19 gradients and parameters each): PASS" in lines
    at = lines.index("sample (temperature 0.8, as one numpy process):")
    assert lines[at + 1].startswith("def ")
    assert max(len(line) for line in lines) <= 100


def test_readmes_replay_command_prints_the_losses_of_the_steps_run_one_by_one():
    quoted = [line for line in (ROOT / "docs/howto/train-gpt.md").read_text().splitlines()
              if line.startswith("python examples/train_gpt.py") and line.endswith("--replay")]
    assert len(quoted) == 1, quoted
    words = quoted[0].split()[1:]
    # The eager run is the comparison only: the replayed one is checked against numpy every step.
    replayed, eager = _run(*words), _run(*words[:-1], "--no-check", "--sample", "0")
    assert replayed.returncode == 0 and eager.returncode == 0, replayed.stderr + eager.stderr
    assert "check: 20 steps vs one numpy process (loss, 34 gradients and parameters each): PASS" in replayed.stdout
    rows = [[line.split()[:4] for line in out.stdout.splitlines() if line[:5].strip().isdigit()]
            for out in (replayed, eager)]
    assert len(rows[0]) == 5 and rows[0] == rows[1]  # step, loss, collectives, bytes alike
    assert max(len(line) for line in replayed.stdout.splitlines()) <= 100  # (test_classroom_docs runs it not)


def test_train_gpt_refuses_a_mesh_in_one_line():
    out = _run("examples/train_gpt.py", "--ranks", "8", "--tp", "8", "--steps", "1")
    assert out.returncode == 2, out.stderr
    assert unfold(out.stderr).strip().splitlines() == [
        "spmdsim: error: the GPT cannot run on 8 ranks: heads 4 is not divisible by tp 8 (heads are split over tp)"]


def test_train_gpt_replays_clipped_steps():
    """--replay with --clip (was refused in one line: the norm was read into Python): the replayed steps pass their
    check against one numpy process clipping alike (tests/test_optim_replay.py: their norms are the eager steps')."""
    out = _run("examples/train_gpt.py", "--ranks", "2", "--tp", "2", "--replay", "--clip", "1.0", "--steps", "2",
               "--sample", "0")
    assert out.returncode == 0, out.stderr
    assert "check: 2 steps vs one numpy process (loss, 64 gradients and parameters each): PASS" in out.stdout
    assert "; clipped to 1.0 at 2 of 2 steps" in out.stdout


@pytest.mark.parametrize("flags, said", [(["--sample", "5"], True), (["--temperature", "0.5"], True),
                                         (["--sample", "0"], False), ([], False)])
def test_a_dry_run_says_it_draws_no_sample_asked_for(flags, said):
    """A dry run has no trained weights: a sample asked for (--sample N, --temperature) was skipped without a word.
    It runs (the same command with --dry-run added) and its report says none was drawn; the default's is not."""
    out = _run("examples/train_gpt.py", "--ranks", "4", "--tp", "2", "--layers", "1", "--d-model", "16", "--seq", "8",
               "--steps", "1", "--dry-run", *flags)
    assert out.returncode == 0, out.stderr
    asked = flags[1] if flags[:1] == ["--sample"] else "120"  # --temperature alone: the default's 120 characters
    expected = [f"--sample {asked}: no sample drawn (a dry run has shapes, not trained weights)"] if said else []
    assert [line for line in out.stdout.splitlines() if "no sample drawn" in line] == expected, out.stdout


@pytest.mark.parametrize("ranks, said", [(64, True), (8, False)])
def test_a_sample_on_many_ranks_is_said_before_it_runs(ranks, said):
    """A sample is a forward pass of the whole model a character on every rank: the default 120 took 17 minutes on
    1,024 simulated ranks, after the check's last line, without a word. From 64 ranks a line on stderr says what
    runs and how to skip it, before it runs."""
    out = _run("examples/train_gpt.py", "--ranks", str(ranks), "--tp", "4", "--batch", str(ranks // 4), "--layers",
               "1", "--d-model", "16", "--seq", "8", "--steps", "1", "--sample", "2")
    assert out.returncode == 0, out.stderr
    assert "sample (temperature 0.8, as one numpy process):" in out.stdout.splitlines()
    expected = [f"drawing 2 characters: 2 forward passes on {ranks} ranks (--sample 0 skips them)"] if said else []
    assert [line for line in out.stderr.splitlines() if "forward passes" in line] == expected, out.stderr


@pytest.mark.parametrize("args, message", [
    (["examples/train_gpt.py", "--every", "0"], "--every 0 must be at least 1 (print every N steps)"),
    (["examples/train_gpt.py", "--every", "-1"], "--every -1 must be at least 1 (print every N steps)"),
    (["examples/train_moe_gpt.py", "--every", "0"], "--every 0 must be at least 1 (print every N steps)"),
    (["examples/train_gpt.py", "--sample", "-5"],
     "--sample -5 must be an integer from 0 to 2,000 (characters to generate, each a forward pass of the model; 0: "
     "none)"),
    (["examples/train_gpt.py", "--temperature", "nan"], "--temperature nan must be a finite number >= 0 (0: greedy)"),
    (["examples/train_gpt.py", "--temperature", "-1"], "--temperature -1 must be a finite number >= 0 (0: greedy)"),
    # --sample 0 draws nothing: a temperature typed beside it did nothing and the run exited 0
    (["examples/train_gpt.py", "--temperature", "2", "--sample", "0"],
     "--temperature 2 is the sample's: give --sample N above 0 with it"),
    # a step drew id 121 and refused it after the table's header; the text's ids are checked whole first now
    (["examples/train_gpt.py", "--vocab", "102"], "the text's token ids run from 10 to 126, outside the vocabulary "
                                                 "[0, 102); expected vocab 127 or more (--vocab)"),
    # (was said as "the MoE GPT cannot run on 4 ranks: the text's token ids ...": not the ranks' problem)
    (["examples/train_moe_gpt.py", "--vocab", "100", "--moe-every", "1"], "the text's token ids run from 10 to 126, "
                                                     "outside the vocabulary [0, 100); expected vocab 127 or more "
                                                     "(--vocab)"),
    (["examples/train_moe_gpt.py", "--precision", "bf16", "--moe-every", "1"],
     "precision 'bf16' must be one of fp64, fp32, bf16-mixed, fp8, fp8-current"),
])
def test_the_gpt_examples_refuse_what_they_print_or_sample_with_in_one_line_before_training(args, message):
    """--every 0 raised ZeroDivisionError after the first step, --every -1 printed every step, --temperature nan
    raised numpy's ValueError after training: refused now before the first step, naming the flag."""
    out = _run(*args, "--ranks", "4", "--tp", "2", "--layers", "1", "--d-model", "16", "--seq", "8", "--steps", "2")
    assert out.returncode == 2, out.stderr
    assert unfold(out.stderr).strip().splitlines() == [f"spmdsim: error: {message}"]
    assert "step" not in out.stdout  # nothing trained


@pytest.mark.parametrize("args, message", [
    (["examples/train_gpt.py", "--lr", "-1"], "--lr -1 must be a finite number >= 0"),
    (["examples/train_gpt.py", "--lr", "1e400"], "--lr 1e400 (read as inf) must be a finite number >= 0"),
    (["examples/train_gpt.py", "--dropout", "2"], "--dropout 2 must be a finite number in [0, 1)"),
    (["examples/train_gpt.py", "--dropout", "0.99999999999999999999"],
     "--dropout 0.99999999999999999999 (read as 1.0) must be a finite number in [0, 1)"),
    (["examples/train_gpt.py", "--clip", "-1"], "--clip -1 must be a finite number >= 0 (0: no clipping)"),
    (["examples/train_gpt.py", "--temperature", "-1e0"], "--temperature -1e0 must be a finite number >= 0 (0: greedy)"),
    (["examples/train_moe_gpt.py", "--lr", "-1"], "--lr -1 must be a finite number >= 0"),
    (["examples/train_moe_gpt.py", "--dropout", "-0.5"], "--dropout -0.5 must be a finite number in [0, 1)"),
    (["examples/train_moe_gpt.py", "--capacity-factor", "1e400"],
     "--capacity-factor 1e400 (read as inf) must be a finite number > 0 (or --dropless)"),
    (["examples/train_moe_gpt.py", "--aux-loss-coeff", "-1.50"], "--aux-loss-coeff -1.50 must be a finite number >= 0"),
    (["examples/train_moe_gpt.py", "--z-loss-coeff", "-1"], "--z-loss-coeff -1 must be a finite number >= 0"),
    # the optimizer refused these naming its argument: "lr -1.0 must be a finite number >= 0"
    (["examples/train_seed_networks.py", "--lr", "-1"], "--lr -1 must be a finite number >= 0"),
    (["examples/train_megatron_block.py", "--lr", "-1"], "--lr -1 must be a finite number >= 0"),
    (["examples/train_mindspore_tutorial.py", "--lr", "nan"], "--lr nan must be a finite number >= 0"),
])
def test_the_training_examples_name_a_float_flag_as_typed(args, message):
    """type=float kept only the number: `--lr -1` was refused as "--lr -1.0", `--capacity-factor 1e400` as "inf"
    (a value the user never typed). The examples' float flags remember the text now (spmdsim.base.typed_numbers), as
    `spmdsim estimate`'s and `spmdsim launch`'s do: one line, no traceback."""
    out = _run(*args, "--ranks", "8")
    assert out.returncode == 2, out.stderr
    assert unfold(out.stderr).strip().splitlines() == [f"spmdsim: error: {message}"]
    assert "Traceback" not in out.stderr and "step" not in out.stdout


@pytest.mark.parametrize("argv, problem", [
    ([], None),  # the defaults: ring, balanced, --save-every 0, without --cp or --save
    (["--cp", "2", "--cp-method", "allgather", "--cp-split", "naive"], None),
    (["--save", "ckpt", "--save-every", "0"], None),  # with --save, 0 is the default: after the last step only
    (["--cp-method", "allgather"], "--cp-method allgather is for a sequence split over context-parallel ranks: give "
                                   "--cp 2 or more with it"),
    (["--cp", "1", "--cp-split", "balanced"], "--cp-split balanced is for a sequence split over context-parallel "
                                              "ranks: give --cp 2 or more with it"),  # typed: the default's value too
    (["--save-every", "0"], "--save-every 0 (a checkpoint after the last step only) is --save's: give --save DIR "
                            "with it"),
    (["--resume", "ckpt", "--save-every", "0"], "--save-every 0 (a checkpoint after the last step only) is --save's: "
                                                "give --save DIR with it"),
    (["--save-every", "2"], None),  # checkpoint_problem's: "--save-every 2 saves into the directory --save names"
])
def test_a_context_or_checkpoint_flag_typed_where_it_does_nothing_is_named(argv, problem):
    """--cp-method and --cp-split without --cp 2 or more, --save-every 0 without --save: the examples ran and
    exited 0 as if they had not been typed. A flag typed is told apart from its default (spmdsim.base.typed_numbers
    .given_flags), so the defaults still run."""
    import argparse

    from spmdsim.models.gpt.options import checkpoint_arguments, context_arguments, unused_flags_problem

    parser = argparse.ArgumentParser()
    context_arguments(parser)
    checkpoint_arguments(parser)
    assert unused_flags_problem(parser.parse_args(argv)) == problem


@pytest.mark.parametrize("argv, problem", [
    ([], None),
    (["--pp", "2", "--schedule", "gpipe"], None),
    (["--microbatches", "2", "--schedule", "GPipe"], None),  # one stage's two microbatches, in GPipe's order
    (["--schedule", "interleaved"], None),  # its chunks' own refusal: "expected --pp 2 or more, got --pp 1"
    (["--schedule", "1f1b"], "--schedule 1f1b orders a pipeline's microbatches: give --pp 2 or more (or "
                             "--microbatches 2 or more) with it"),
    (["--schedule", "GPipe", "--microbatches", "1"], "--schedule gpipe orders a pipeline's microbatches: give --pp 2 "
                                                     "or more (or --microbatches 2 or more) with it"),
])
def test_a_schedule_typed_without_a_pipeline_is_named(argv, problem):
    """`train_gpt.py --schedule 1f1b` (--pp forgotten) ran the plain step, exit 0, as if the flag had not been
    typed, and `--schedule gpipe` a pipeline of one stage and one microbatch."""
    import argparse

    from spmdsim.models.gpt.options import checkpoint_arguments, context_arguments, unused_flags_problem
    from spmdsim.programs.pipeline.options import pipeline_arguments

    parser = argparse.ArgumentParser()
    for arguments in (context_arguments, checkpoint_arguments, pipeline_arguments):
        arguments(parser)
    assert unused_flags_problem(parser.parse_args(argv)) == problem


def test_a_pipeline_of_one_microbatch_is_said_in_the_singular():
    """`--pp 2 --microbatches 1` printed "pipeline: 1f1b schedule, 1 microbatches of 8"."""
    for example in ("examples/train_gpt.py", "examples/train_moe_gpt.py"):
        out = _run(example, "--ranks", "2", "--pp", "2", "--microbatches", "1", "--layers", "2", "--d-model", "16",
                   "--seq", "8", "--steps", "1", "--no-check", *(["--sample", "0"] if "moe" not in example else []))
        assert out.returncode == 0, out.stderr
        assert "pipeline: 1f1b schedule, 1 microbatch of 8" in out.stdout, out.stdout


def test_the_examples_refuse_a_schedule_without_a_pipeline_in_one_line():
    for example in ("examples/train_gpt.py", "examples/train_moe_gpt.py"):
        out = _run(example, "--schedule", "1f1b", "--ranks", "8")
        assert out.returncode == 2, out.stderr
        assert unfold(out.stderr).strip().splitlines() == [
            "spmdsim: error: --schedule 1f1b orders a pipeline's microbatches: give --pp 2 or more (or --microbatches "
            "2 or more) with it"]


@pytest.mark.parametrize("args, message", [
    # each size flag below 1 is refused as given (was: "dp -8 x tp -1 must multiply to the world size 8")
    (["examples/train_gpt.py", "--dp", "-8"], "--dp -8 must be at least 1"),
    (["examples/train_gpt.py", "--tp", "-4"], "--tp -4 must be at least 1"),  # was "dp -2 x tp -4"
    (["examples/train_gpt.py", "--pp", "-2"], "--pp -2 must be at least 1"),
    (["examples/train_moe_gpt.py", "--tp", "2", "--dp", "-1"], "--dp -1 must be at least 1"),  # was "ep -4"
    (["examples/train_moe_gpt.py", "--ep", "-2"], "--ep -2 must be at least 1"),
    # 0 is a size given, not "use the default" (--dp 0 ran as dp 2 x tp 4, --ep 0 as dp 1 x ep 8, and
    # --microbatches 0 or --virtual-stages 0 without --pp as an unpipelined step)
    (["examples/train_gpt.py", "--dp", "0"], "--dp 0 must be at least 1"),
    (["examples/train_gpt.py", "--tp", "0"], "--tp 0 must be at least 1"),
    (["examples/train_moe_gpt.py", "--ep", "0"], "--ep 0 must be at least 1"),
    (["examples/train_moe_gpt.py", "--dp", "0"], "--dp 0 must be at least 1"),
    (["examples/train_gpt.py", "--microbatches", "0"], "--microbatches 0 must be at least 1"),
    (["examples/train_gpt.py", "--virtual-stages", "0"], "--virtual-stages 0 must be at least 1"),
    # a size that does not divide the ranks left is named as given, no derived size 0 beside it
    (["examples/train_moe_gpt.py", "--ep", "16"], "the MoE GPT cannot run on 8 ranks: --ep 16 must divide the "
                                                  "world size 8"),  # was "dp 0 x ep 16"
    (["examples/train_gpt.py", "--tp", "16"], "the GPT cannot run on 8 ranks: --tp 16 must divide the world size 8"),
    (["examples/train_gpt.py", "--pp", "2", "--dp", "3"], "the GPT cannot run on 8 ranks: --dp 3 must divide the "
                                                          "4 ranks of a stage (world size 8 / pp 2)"),
    # with --cp alone, a stage's ranks too (was "--tp 3 must divide the world size 8")
    (["examples/train_gpt.py", "--cp", "2", "--tp", "3"], "the GPT cannot run on 8 ranks: --tp 3 must divide the "
                                                          "4 ranks left (world size 8 / cp 2)"),
    (["examples/train_moe_gpt.py", "--tp", "2", "--ep", "2", "--dp", "1"],
     "the MoE GPT cannot run on 8 ranks: dp 1 x ep 2 x tp 2 must multiply to the world size 8: e.g. --dp 2 --ep 2"),
    # both given: the dp that fits named (was "set --dp and --tp")
    (["examples/train_gpt.py", "--dp", "2", "--tp", "2"],
     "the GPT cannot run on 8 ranks: dp 2 x tp 2 must multiply to the world size 8: e.g. --dp 4 --tp 2"),
    (["examples/train_gpt.py", "--pp", "2", "--dp", "1", "--tp", "2"],
     "the GPT cannot run on 8 ranks: pp 2 x dp 1 x tp 2 must multiply to the world size 8: e.g. --dp 2 --tp 2"),
])
def test_the_gpt_examples_refuse_a_size_in_one_line_naming_it_as_given(args, message):
    out = _run(*args, "--ranks", "8", "--layers", "2", "--d-model", "16", "--seq", "8", "--steps", "1")
    assert out.returncode == 2, out.stderr
    assert unfold(out.stderr).strip().splitlines()[-1] == f"spmdsim: error: {message}"
    assert "step" not in out.stdout  # nothing trained


def test_train_gpt_refuses_a_trace_it_cannot_write_in_one_line(tmp_path):
    """--trace-out with --dry-run exited 0 and wrote nothing, saying nothing: a dry run times no cell. Refused
    now, as --trace-out without a pipeline is; no file is written."""
    trace = tmp_path / "d.json"
    small = ["--ranks", "4", "--tp", "2", "--steps", "1", "--sample", "0", "--layers", "2", "--d-model", "32",
             "--seq", "16", "--trace-out", str(trace)]
    for extra, message in (
            (["--pp", "2", "--dry-run"], "--trace-out writes the last step's cells as they ran and took time; a dry "
                                         "run computes nothing to time: leave out --trace-out or --dry-run"),
            ([], "--trace-out writes a pipeline's last step; give --pp (or --microbatches) with it")):
        out = _run("examples/train_gpt.py", *small, *extra)
        assert out.returncode == 2, out.stderr
        assert unfold(out.stderr).strip().splitlines() == [f"spmdsim: error: {message}"]
        assert not trace.exists()


def test_train_gpt_refuses_an_unwritable_trace_path_before_it_trains(tmp_path):
    """A missing directory was found only when the trace was written, after the whole run: "spmdsim: error on
    simulated rank 0: cannot write the trace ...", exit 1. Now checked first, as `spmdsim run`'s --trace-out."""
    missing = tmp_path / "nonexist" / "t.json"
    out = _run("examples/train_gpt.py", "--ranks", "2", "--pp", "2", "--steps", "2", "--sample", "0", "--layers",
               "2", "--d-model", "32", "--seq", "16", "--trace-out", str(missing))
    assert out.returncode == 2, out.stderr
    assert unfold(out.stderr).strip().splitlines()[-1] == (
        f"spmdsim: error: --trace-out {str(missing)!r} cannot be written: directory {str(missing.parent)!r} "
        "does not exist; expected a path in an existing directory")
    assert "GPT:" not in out.stdout and "step" not in out.stdout  # nothing printed, nothing trained


def test_the_parallel_generate_checks_its_sampling_as_the_reference_does():
    from spmdsim import Layout, Mesh
    from spmdsim.models.gpt.parallel import GPT

    cfg = GPTConfig(layers=1, d_model=16, heads=2, seq=8, batch=2)

    def rank(n, temperature):
        model = GPT(cfg, Mesh(Layout((1, 2), ("dp", "tp")), spmdsim.world()))
        return model.generate(b"def ", n, temperature)

    with pytest.raises(SpmdsimError, match=r"^temperature nan must be a finite number >= 0\n.*every simulated rank"):
        spmdsim.simulate(2, rank, 3, float("nan"))
    with pytest.raises(SpmdsimError, match=r"^n -1 must be an integer >= 0\n.*every simulated rank"):
        spmdsim.simulate(2, rank, -1, 0.5)
    assert [len(ids) for ids in spmdsim.simulate(2, rank, 3, 0.5)] == [3, 3]


@pytest.mark.parametrize("script", ["examples/mlp_layernorm.py", "examples/causal_attention.py",
                                    "examples/padded_batch.py"])
def test_general_operator_examples_pass(script):
    out = _run(script, "--ranks", "4")
    assert out.returncode == 0, out.stderr
    assert "vs numpy: PASS" in out.stdout
    program = [line for line in (ROOT / script).read_text().splitlines()[:40]
               if line and not line.startswith(("#", '"""', "import", "from")) and ".local" not in line]
    assert ".local" not in (ROOT / script).read_text()
    assert len(program) > 5


@pytest.mark.parametrize("extra", [{}, dict(norm="rms", mlp="swiglu", heads=4, kv_heads=2, positions="rope",
                                            bias=False, tied=False)])
def test_a_block_reads_its_names_and_sizes_made_once_a_model(extra):
    """A block's parameter and dropout-site names and the config's sizes are made at its first forward and
    read again by the next (~20 strings a block a forward); each name of a parameter is one the
    model holds, or an optional bias it has none of; the forwards' losses are the same values."""
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.models.gpt import batch
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.models.gpt.params import param_specs

    cfg = GPTConfig(**{**dict(layers=2, d_model=16, heads=4, seq=8, batch=4, dropout=0.2), **extra})

    def main():
        mesh = Mesh(Layout((2, 1), ("dp", "tp")))
        model = GPT(cfg, mesh)
        x, y = (DTensor.from_global(mesh, a, mesh.layout(model.batch, None)) for a in batch(TEXT, cfg, 0))
        first = float(model.loss(x, y, 0).gather())
        layers = dict(model._layers)
        second = float(model.loss(x, y, 0).gather())
        return first, second, layers, model._layers, set(model.params)

    names = {s.name for s in param_specs(cfg)}
    for first, second, layers, again, held in spmdsim.simulate(2, main):
        assert first == second and held == names
        assert sorted(layers) == [0, 1] and all(again[k] is layers[k] for k in layers)
        for k, n in layers.items():
            wanted = {n.ln1w, n.wq, n.wk, n.wv, n.wo, n.ln2w, n.w1, n.w2} | ({n.w3} if n.swiglu else set())
            optional = {n.ln1b, n.ln2b, n.bq, n.bv, n.bo, n.b1, n.b2} | ({n.b3} if n.swiglu else set())
            assert wanted <= held and all(name.startswith(f"h{k}.") for name in wanted | optional)
            assert (optional & held) == {name for name in held if name.startswith(f"h{k}.")} - wanted
            assert [c.kind for c in (n.norm, n.attention, n.core, n.mlp)] == [
                "layer norm", "attention", "attention core", "mlp"]  # (the kept_as contexts its parts enter)
            assert (n.rope, n.grouped, n.swiglu, n.kv, n.head_dim) == (
                cfg.positions == "rope", cfg.kv != cfg.heads, cfg.mlp == "swiglu", cfg.kv, cfg.head_dim)


def test_sequence_parallelism_on_tp_1_is_said_to_split_nothing():
    """--sp at tp 1 runs the step without it (Megatron turns it off there, with a warning): the header says so."""
    out = _run("examples/train_gpt.py", "--ranks", "2", "--dp", "2", "--tp", "1", "--sp", "--layers", "1",
               "--d-model", "16", "--seq", "8", "--batch", "2", "--steps", "1", "--sample", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[3] == ("mesh dp 2 x tp 1 with sequence parallelism (a no-op: tp 1 splits nothing); "
                                          "AdamW lr 0.003")
    # the MoE example's header said "with sequence parallelism" alone
    out = _run("examples/train_moe_gpt.py", "--ranks", "2", "--ep", "2", "--tp", "1", "--sp", "--layers", "2",
               "--d-model", "16", "--seq", "8", "--batch", "2", "--steps", "1")
    assert out.returncode == 0, out.stderr
    assert "mesh dp 1 x ep 2 x tp 1 with sequence parallelism (a no-op: tp 1 splits nothing):\n" in out.stdout, \
        out.stdout
