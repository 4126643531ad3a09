"""Stopping and resuming the GPT trainer (spmdsim.models.gpt.checkpoint; docs/howto/checkpoints.md): a run
resumed from a checkpoint steps as the run that never stopped, bit for bit, on simulated ranks; a checkpoint that
does not fit is refused in one line, alike on every rank; a rank whose own file is wrong stops every rank with one
line. The MPI case: tests/mpi/test_gpt_mpi.py."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import spmdsim
from docs_commands import Quote, assert_prints_quote, quotes, run_example, run_quoted
from spmdsim.errors import SpmdsimError, fold_message
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.checkpoint import META, read_meta, rank_file
from spmdsim.models.gpt import checkpoint
from spmdsim.models.gpt.checkpoint import checkpoint_problem
from spmdsim.models.gpt.train import train
from testkit import unfold

SMALL = GPTConfig(layers=1, d_model=16, heads=2, seq=8, batch=4, dropout=0.2)
TEXT = encode(load_text(20_000))
DOC = "docs/howto/checkpoints.md"
#: How a resume of a checkpoint without regions on another mesh or pipeline ends.
OLDER = ("it records no ranks' regions to reshard from, saved by an older spmdsim: resume with the settings it was "
         "saved with")


def _run(steps, dp=2, tp=2, cfg=SMALL, **kw):
    """(each rank's (StepResults, {name: block}, optimizer state_dict)) of `train` on dp x tp simulated ranks."""
    def body():
        model, results = train(cfg, spmdsim.world(), dp, tp, steps, TEXT, **kw)
        state = {name: t.local.copy() for name, t in model.params.items()}
        return results, state

    return spmdsim.simulate(dp * tp, body)


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_files(one, two, ranks):
    for r in range(ranks):
        with np.load(rank_file(str(one), r)) as x, np.load(rank_file(str(two), r)) as y:
            assert x.files == y.files
            for k in x.files:
                if k != "header":
                    assert _same(x[k], y[k]), (r, k)


@pytest.mark.parametrize("options", [
    {},
    {"zero": 1, "precision": "bf16-mixed", "cfg": dataclasses.replace(SMALL, clip=0.5)},
    {"sp": True, "replay": True},
    {"zero": 2, "sp": True, "replay": True},
    {"sp": True, "precision": "fp8"},  # FP8's scales and amax histories saved and resumed too
])
def test_a_resumed_run_steps_as_the_run_that_never_stopped(tmp_path, options):
    if options.get("precision") in ("bf16-mixed", "fp8"):
        pytest.importorskip("ml_dtypes")
    whole = _run(4, save=str(tmp_path / "whole"), **options)
    _run(2, save=str(tmp_path / "half"), **options)
    resumed = _run(4, resume=str(tmp_path / "half"), save=str(tmp_path / "resumed"), **options)
    for (w_results, w_params), (r_results, r_params) in zip(whole, resumed):
        assert [r.step for r in r_results] == [2, 3]
        assert r_results == w_results[2:]  # losses, the check's differences, traffic
        assert all(r.passed for r in r_results)
        assert all(_same(w_params[k], r_params[k]) for k in w_params)
    _same_files(tmp_path / "whole", tmp_path / "resumed", 4)  # the optimizer's state too
    assert read_meta(str(tmp_path / "resumed"))[0]["step"] == 4
    # the training's first loss, step 0's, carried from checkpoint to checkpoint: a resumed run's trend starts there
    assert [read_meta(str(tmp_path / name))[0]["first loss"] for name in ("whole", "half", "resumed")] == \
        [whole[0][0][0].loss] * 3


def test_save_every_writes_after_every_nth_step_and_the_last(tmp_path):
    where = str(tmp_path / "ck")
    seen = []

    def body():
        def look(r):
            if spmdsim.world().rank == 0:
                seen.append((r.step, read_meta(where)[0]["step"] if os.path.exists(os.path.join(where, META))
                             else None))
        return train(SMALL, spmdsim.world(), 1, 2, 5, TEXT, check=False, save=where, save_every=2, on_step=look)[1]

    def figures(results):
        return [(r.step, r.loss, r.calls, r.bytes_sent) for r in results]

    saving = spmdsim.simulate(2, body)
    # the saves change no step: the same losses and traffic (their barrier is not the step's)
    plain = spmdsim.simulate(2, lambda: train(SMALL, spmdsim.world(), 1, 2, 5, TEXT, check=False)[1])
    assert [figures(r) for r in saving] == [figures(r) for r in plain]
    # on_step runs before the step's save: after steps 0 and 1 none yet, then step 2's, then step 4's
    assert seen == [(0, None), (1, None), (2, 2), (3, 2), (4, 4)]
    assert read_meta(where)[0]["step"] == 5
    assert sorted(os.listdir(where)) == [META, "rank-00000.npz", "rank-00001.npz"]  # nothing left aside


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of 2 steps of SMALL on dp 2 x tp 2."""
    where = tmp_path_factory.mktemp("saved") / "ck"
    _run(2, save=str(where), check=False)
    return str(where)


@pytest.mark.parametrize("change, expected", [
    ({"cfg": dataclasses.replace(SMALL, lr=0.01)},
     "the checkpoint's config has lr 0.003, this run's 0.01 (resume with the settings it was saved with)"),
    # another mesh and another config: the config said (a reshard, tests/test_gpt_reshard.py, does not help)
    ({"dp": 4, "tp": 1, "cfg": dataclasses.replace(SMALL, lr=0.01)}, "the checkpoint's config has lr 0.003"),
    ({"steps": 2}, "the checkpoint is at step 2, at or past --steps 2; give --steps above 2 to train on"),
])
def test_a_checkpoint_of_another_run_is_refused_in_one_line(saved, change, expected):
    args = {"cfg": SMALL, "world": 4, "dp": 2, "tp": 2, "steps": 5}
    args.update(change)
    kw = {k: v for k, v in args.items() if k not in ("cfg", "world", "dp", "tp", "steps")}
    problem = checkpoint_problem(args["cfg"], args["world"], args["dp"], args["tp"], args["steps"], resume=saved,
                                 **kw)
    assert problem.startswith(f"--resume {saved}: ") and expected in problem, problem
    assert checkpoint_problem(SMALL, 4, 2, 2, 3, resume=saved) is None


def test_an_moe_checkpoint_resumed_dense_is_said_by_its_experts(saved, tmp_path):
    meta = json.loads((Path(saved) / META).read_text())
    shutil.copytree(saved, tmp_path / "ck")
    meta["config"]["moe"] = {"experts": 8, "top_k": 2, "every": 2, "capacity_factor": 1.25, "etp": 0}
    (tmp_path / "ck" / META).write_text(json.dumps(meta))
    assert checkpoint_problem(SMALL, 4, 2, 2, 5, resume=str(tmp_path / "ck")) == (
        f"--resume {tmp_path / 'ck'}: the checkpoint's config has moe 8 experts (an MoE GPT), this run's none (a "
        "dense GPT) (resume with the settings it was saved with)")


def test_a_missing_or_damaged_checkpoint_is_refused_in_one_line(saved, tmp_path):
    def problem(where, **kw):
        return checkpoint_problem(SMALL, 4, 2, 2, 5, resume=str(where), **kw)

    assert problem(tmp_path / "none") == (f"--resume {tmp_path / 'none'}: does not exist (expected a checkpoint "
                                          "directory that --save wrote)")
    assert problem(tmp_path) == (f"--resume {tmp_path}: no {META} in it (expected a checkpoint directory that "
                                 "--save wrote)")
    (tmp_path / META).write_text("{not json")
    said = problem(tmp_path)  # json's words, then what it should hold (json's alone named no expectation)
    assert said.startswith(f"--resume {tmp_path}: cannot read {META}: ") and said.endswith(
        " (expected the JSON --save writes)"), said
    (tmp_path / META).write_text(json.dumps({"format": "something else"}))
    assert "is not a checkpoint of this version" in problem(tmp_path)
    meta = json.loads((Path(saved) / META).read_text())
    for key, value, said in (("config", None, "None, expected an object"), ("world size", "4", "'4', expected an "
                             "integer"), ("mesh", ..., "missing, expected an object")):
        (tmp_path / META).write_text(json.dumps({k: v for k, v in {**meta, key: value}.items()
                                                 if v is not ...}))
        assert problem(tmp_path) == f"--resume {tmp_path}: {META}'s {key!r} is {said} as --save writes it"
    assert problem(saved, save_every=2) == "--save-every 2 saves into the directory --save names; give --save DIR " \
                                           "with it"
    assert problem(saved, save=saved, save_every=-1) == ("--save-every -1 must be an integer >= 0 (0: save after the "
                                                         "last step only)")
    assert problem(saved, save=str(tmp_path / META)) == (f"--save {tmp_path / META}: is not a directory (expected a "
                                                         "directory to write the checkpoint into)")


@pytest.mark.parametrize("damage, expected", [
    ("missing", "rank 3's file {d}/rank-00003.npz is missing"),
    ("junk", "rank 3's file {d}/rank-00003.npz is not a .npz file (damaged, or not written by --save)"),
    ("other rank", "rank 3's file {d}/rank-00003.npz holds rank 0's blocks (a file copied or renamed?)"),
])
def test_a_rank_whose_own_file_is_wrong_stops_every_rank_with_one_line(saved, tmp_path, damage, expected):
    where = tmp_path / "ck"
    shutil.copytree(saved, where)
    path = rank_file(str(where), 3)
    os.remove(path)
    if damage == "junk":
        with open(path, "w") as f:
            f.write("junk")
    elif damage == "other rank":
        shutil.copy(rank_file(str(where), 0), path)
    # every rank raises the same line (the ranks agreed on rank 3's problem): no rank waits for another

    def body():
        try:
            train(SMALL, spmdsim.world(), 2, 2, 3, TEXT, resume=str(where))
        except SpmdsimError as e:
            return str(e)
        return None

    said = spmdsim.simulate(4, body)
    assert said == [f"--resume {where}: " + expected.format(d=where)] * 4


@pytest.mark.parametrize("blocked", [2, META])
def test_a_save_a_rank_cannot_write_stops_every_rank_with_one_line_and_no_metadata(tmp_path, blocked):
    # a directory where rank 2's file of step 2 (or the metadata) goes: os.replace cannot put a file there
    where = tmp_path / "ck"
    path = where / (META if blocked == META else f"rank-0000{blocked}.step-2.npz")
    os.makedirs(path)

    def body():
        try:
            train(SMALL, spmdsim.world(), 2, 2, 2, TEXT, save=str(where), check=False)
        except SpmdsimError as e:
            return str(e)
        return None

    said = spmdsim.simulate(4, body)
    assert said == [f"--save {where}: cannot write {path}: Is a directory"] * 4  # every rank, alike
    assert (where / META).is_dir() if blocked == META else not (where / META).exists()  # no metadata claims it
    assert not [f for f in os.listdir(where) if f.endswith(".partial")]  # nothing left beside the files


def _resumed(where, steps, **kw):
    """Each rank's (step, loss) of SMALL resumed from `where` to `steps` on dp 2 x tp 2, or the line it raised."""
    def body():
        try:
            results = train(SMALL, spmdsim.world(), 2, 2, steps, TEXT, resume=str(where), check=False, **kw)[1]
        except SpmdsimError as e:
            return str(e)
        return [(r.step, r.loss) for r in results]

    return spmdsim.simulate(4, body)


def test_a_save_that_stops_before_its_metadata_leaves_the_checkpoint_it_would_replace(tmp_path, monkeypatch):
    where = tmp_path / "ck"
    _run(2, save=str(where), check=False)
    before = _resumed(where, 4)
    given = checkpoint.write_aside
    monkeypatch.setattr(checkpoint, "write_aside", lambda path, write: "No space left on device" if
                        path.endswith(META) else given(path, write))  # rank 0 stops before the metadata
    assert _resumed(where, 4, save=str(where)) == [f"--save {where}: No space left on device"] * 4
    monkeypatch.undo()
    assert _resumed(where, 4) == before and [s for s, _ in before[0]] == [2, 3]  # the step-2 checkpoint, whole


def test_a_save_that_stops_before_renaming_its_files_resumes_from_them(tmp_path):
    # the metadata names step 4; rank 1's step-4 file is still under its step's name, the old one in its place
    _run(2, save=str(tmp_path / "two"), check=False)
    _resumed(tmp_path / "two", 4, save=str(tmp_path / "four"))
    shutil.copytree(tmp_path / "four", tmp_path / "ck")
    os.replace(rank_file(str(tmp_path / "ck"), 1), tmp_path / "ck" / "rank-00001.step-4.npz")
    shutil.copy(rank_file(str(tmp_path / "two"), 1), rank_file(str(tmp_path / "ck"), 1))
    assert _resumed(tmp_path / "ck", 6) == _resumed(tmp_path / "four", 6)
    assert sorted(os.listdir(tmp_path / "four")) == [META] + [f"rank-0000{r}.npz" for r in range(4)]


def test_a_save_on_fewer_ranks_leaves_no_file_of_the_checkpoint_it_replaced(tmp_path):
    # 4 ranks' checkpoint, then a 2-rank run's into the same directory: its files alone beside its metadata
    where = tmp_path / "ck"
    _run(2, save=str(where), check=False)
    (where / "rank-00003.step-9.npz").write_bytes(b"")  # and what a stopped save of rank 3 left aside
    _run(1, dp=1, tp=2, save=str(where), check=False)
    assert sorted(os.listdir(where)) == [META, "rank-00000.npz", "rank-00001.npz"]
    assert read_meta(str(where))[0]["world size"] == 2


def _section():
    """The commands the page quotes, in its order: save, resume, resume on another mesh, under another precision."""
    return quotes(DOC)


def _in(quote, where):
    """The quote with its checkpoint directory `ckpt` in `where`; its resume line as the trainer prints it with
    that longer path: folded within 100 columns."""
    out = tuple(part for line in quote.output
                for part in _folded(line.replace("ckpt", str(where))).split("\n"))
    return Quote(quote.doc, quote.line, quote.command.replace(" ckpt", f" {where}"), out)


def _folded(line):
    return fold_message(line) if line.startswith("resuming from ") else line


def test_the_section_shows_the_commands_this_test_runs():
    shown = _section()
    assert [q.output is not None for q in shown] == [True, True, True, True]
    assert [q.command.split("--steps")[1] for q in shown] == [" 3 --save ckpt"] + [" 6 --resume ckpt"] * 3
    assert [q.command.split("--layers")[0] for q in shown] == ["python examples/train_gpt.py --ranks 4 --tp 2 "] * 2 \
        + ["python examples/train_gpt.py --ranks 2 --tp 2 ",
           "python examples/train_gpt.py --ranks 4 --tp 2 --precision fp32 "]


def test_the_documented_commands_resume_as_the_run_that_never_stopped(tmp_path):
    save, resume, resharded, switched = _section()
    where = tmp_path / "ckpt"
    assert_prints_quote(_in(save, where))
    done = assert_prints_quote(_in(resume, where))
    moved = assert_prints_quote(_in(resharded, where))  # on tp 2 alone: the losses to their digits
    rounded = assert_prints_quote(_in(switched, where))  # under fp32: its losses to their digits too
    refused = run_quoted(resume.command.replace("--tp 2", "--tp 2 --lr 0.01").replace(" ckpt", f" {where}"))
    assert refused.returncode == 2  # the refusal the page quotes
    assert "the checkpoint's config has lr 0.003, this run's 0.01 (" in unfold(refused.stdout + refused.stderr)
    whole = run_quoted(save.command.replace("--steps 3 --save ckpt", "--steps 6"))
    assert whole.returncode == 0, whole.stderr

    def steps(text):
        return [line for line in text.splitlines() if re.match(r" {4}[345] ", line)]

    assert len(steps(done.stdout)) == 3 and steps(done.stdout) == steps(whole.stdout)
    assert [line.split()[:2] for line in steps(moved.stdout)] == [line.split()[:2] for line in steps(whole.stdout)]
    assert [line.split()[:2] for line in steps(rounded.stdout)] == [line.split()[:2] for line in steps(whole.stdout)]
    # the verdict on the loss too: the resumed run's trend starts at step 0's loss, the checkpoint's, as the whole
    # run's does (its own first step, 3, was judged: the docstring's --steps 5, then 10, exited 1, "NOT falling")
    trend = re.compile(r"loss first ([0-9.]+)\b.*last ([0-9.]+) \(falling\)")
    first, last = (trend.search(run.stdout).groups() for run in (whole, done))
    assert done.returncode == 0 and first == last
    assert "loss first " + first[0] + " (step 0, before the checkpoint)" in done.stdout


def test_a_resumed_runs_trend_is_judged_from_the_trainings_first_loss():
    from spmdsim.models.nets.train import loss_trend

    assert loss_trend([3.12, 3.15]) == ("loss first 3.1200000, last 3.1500000 (NOT falling)", False)
    assert loss_trend([3.12, 3.15], first=4.7) == (
        "loss first 4.7000000 (step 0, before the checkpoint), last 3.1500000 (falling)", True)
    assert loss_trend([4.8], first=4.7)[1] is False  # one resumed step is judged too: it has a first loss


@pytest.mark.parametrize("flag", ["--save", "--resume"])
def test_an_empty_checkpoint_directory_is_named_as_empty(flag, capsys):
    """`--save ""` said "--save : cannot make the directory: No such file or directory" after the run's checks,
    and `--resume ""` "--resume : does not exist": the value unseen in both."""
    import argparse

    from spmdsim.models.gpt.options import checkpoint_arguments

    parser = argparse.ArgumentParser(prog="train_gpt.py")
    checkpoint_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([flag, ""])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"train_gpt.py: error: argument {flag}: '' is empty; expected a directory's path")
    assert getattr(parser.parse_args([flag, "ckpt"]), flag[2:]) == "ckpt"


def test_the_example_refuses_a_dry_run_in_one_line(tmp_path):
    common = ("--layers", "1", "--d-model", "16", "--heads", "2", "--seq", "8", "--batch", "4", "--sample", "0")
    done = run_example("examples/train_gpt.py", "--ranks", "4", "--tp", "2", "--dry-run", *common, "--steps", "1",
                       "--resume", str(tmp_path))
    assert done.returncode == 2
    assert unfold(done.stderr).splitlines()[-1] == (  # the flag given ("--save and --resume" it said)
        "spmdsim: error: --resume: a dry run holds shapes, no values; leave out --dry-run to save or resume")


def test_the_examples_refuse_save_every_0_without_save_and_take_it_with_save(tmp_path):
    """--save-every 0 without --save ran and exited 0, saving nothing (0 is the default, so it went unseen); with
    --save DIR it is the default: one checkpoint, after the last step."""
    common = ("--ranks", "2", "--tp", "2", "--layers", "2", "--d-model", "16", "--heads", "2", "--seq", "8",
              "--batch", "4", "--steps", "1", "--no-check")
    for example in ("train_gpt.py", "train_moe_gpt.py"):
        done = run_example(f"examples/{example}", *common, "--save-every", "0")
        assert done.returncode == 2 and "step" not in done.stdout, (example, done.stdout)
        assert unfold(done.stderr).splitlines()[-1] == ("spmdsim: error: --save-every 0 (a checkpoint after the last "
                                                        "step only) is --save's: give --save DIR with it")
    where = str(tmp_path / "ck")
    done = run_example("examples/train_gpt.py", *common, "--sample", "0", "--save", where, "--save-every", "0")
    assert done.returncode == 0, done.stderr
    assert read_meta(where)[0]["step"] == 1 and sorted(os.listdir(where)) == [META, "rank-00000.npz",
                                                                             "rank-00001.npz"]


@pytest.mark.parametrize("schedule, options", [("1f1b", {}), ("gpipe", {"zero": 1, "replay": True}),
                                               ("1f1b", {"zero": 2, "replay": True}), ("1f1b", {"precision": "fp8"})])
def test_a_resumed_pipeline_steps_as_the_pipeline_that_never_stopped(tmp_path, schedule, options):
    from spmdsim.models.gpt.pipeline import train_pipelined

    if options.get("precision") == "fp8":  # each stage's scales and histories saved and resumed
        pytest.importorskip("ml_dtypes")

    cfg = dataclasses.replace(SMALL, layers=2)

    def run(steps, **kw):
        def body():
            run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 2, steps, TEXT, schedule=schedule,
                                           microbatches=2, **options, **kw)
            run.close()
            return [(r.step, r.loss, r.errors) for r in results]
        return spmdsim.simulate(4, body)

    whole = run(3, save=str(tmp_path / "whole"))
    run(1, save=str(tmp_path / "half"))
    resumed = run(3, resume=str(tmp_path / "half"), save=str(tmp_path / "resumed"))
    assert [w[1:] for w in whole] == resumed
    _same_files(tmp_path / "whole", tmp_path / "resumed", 4)
    assert read_meta(str(tmp_path / "resumed"))[0]["first loss"] == whole[0][0][1]  # step 0's, as train's
    assert read_meta(str(tmp_path / "whole"))[0]["pipeline"] == {"schedule": schedule, "microbatches": 2,
                                                                 "virtual": 1, "split": None}
    # another pipeline's checkpoint: resharded (tests/test_gpt_reshard_pipeline.py), FP8's scales too (by key)
    pipeline = {"pp": 2, "schedule": schedule, "microbatches": 4, "virtual": 1, "split": None}
    zero = options.get("zero", 0)
    precision = options.get("precision", "fp64")
    assert checkpoint_problem(cfg, 4, 1, 2, 5, resume=str(tmp_path / "half"), pipeline=pipeline, zero=zero,
                              precision=precision) is None
    # without a pipeline: resharded, under another precision too (fp8's into fp64: tests/test_gpt_reprecision.py)
    plain = checkpoint_problem(cfg, 4, 1, 2, 5, resume=str(tmp_path / "half"), zero=zero)  # train's: no pipeline
    assert plain is None
    if schedule == "1f1b" and not options:  # and the other way: a checkpoint of train's, resumed in a pipeline
        from spmdsim.models.gpt import checkpoint
        from spmdsim.models.gpt.checkpoint import checkpoint_meta

        (tmp_path / "plain").mkdir()
        (tmp_path / "plain" / META).write_text(json.dumps({"format": checkpoint._FORMAT, "version": checkpoint._VERSION,
                                                           "step": 1, **checkpoint_meta(cfg, 4, 2, 2)}))
        assert checkpoint_problem(cfg, 4, 1, 2, 5, resume=str(tmp_path / "plain"), pipeline=pipeline) == (
            f"--resume {tmp_path / 'plain'}: the checkpoint was saved without a pipeline, this run with --pp 2 "
            f"--schedule 1f1b --microbatches 4 ({OLDER})")


def test_an_moe_gpt_resumes_as_the_run_that_never_stopped(tmp_path):
    from spmdsim.models.moe import MoEConfig

    cfg = dataclasses.replace(SMALL, moe=MoEConfig(experts=4, top_k=2, every=1))

    def run(steps, **kw):
        def body():
            _, results = train(cfg, spmdsim.world(), 1, 1, steps, TEXT, ep=2, **kw)
            return results
        return spmdsim.simulate(2, body)

    whole = run(3, save=str(tmp_path / "whole"))
    run(1, save=str(tmp_path / "half"))
    resumed = run(3, resume=str(tmp_path / "half"), save=str(tmp_path / "resumed"))

    def seen(results):
        return [(r.step, r.loss, r.errors) for r in results]

    assert [seen(w[1:]) for w in whole] == [seen(r) for r in resumed]
    assert all(r.passed for r in resumed[0])
    _same_files(tmp_path / "whole", tmp_path / "resumed", 2)


def test_another_layer_split_is_said_against_the_balanced_default(tmp_path):
    # "the checkpoint's pipeline has split [1, 3], this run's none": none is the default split, balanced; both
    # said as typed (--stage-layers)
    from spmdsim.models.gpt import checkpoint
    from spmdsim.models.gpt.checkpoint import checkpoint_meta

    cfg = dataclasses.replace(SMALL, layers=4)
    pipeline = {"pp": 2, "schedule": "1f1b", "microbatches": 2, "virtual": 1, "split": [1, 3]}
    meta = checkpoint_meta(cfg, 4, 1, 2, pipeline=pipeline)
    (tmp_path / META).write_text(json.dumps({"format": checkpoint._FORMAT, "version": checkpoint._VERSION,
                                             "step": 1, **meta}))
    balanced = dict(pipeline, split=None)
    assert checkpoint_problem(cfg, 4, 1, 2, 5, resume=str(tmp_path), pipeline=balanced) == (
        f"--resume {tmp_path}: the checkpoint's pipeline has --stage-layers 1,3, this run's a balanced split (no "
        f"--stage-layers) ({OLDER})")  # (one that records regions: resharded, tests/test_gpt_reshard_pipeline.py)
    assert checkpoint_problem(cfg, 4, 1, 2, 5, resume=str(tmp_path), pipeline=dict(pipeline, split=[3, 1])) == (
        f"--resume {tmp_path}: the checkpoint's pipeline has --stage-layers 1,3, this run's --stage-layers 3,1 "
        f"({OLDER})")


def test_another_moe_setting_is_named_by_its_own_field(tmp_path):
    # "the checkpoint's config has moe.dropless False, this run's True", not the two MoE configs whole
    from spmdsim.models.gpt import checkpoint
    from spmdsim.models.gpt.checkpoint import checkpoint_meta
    from spmdsim.models.moe import MoEConfig

    cfg = dataclasses.replace(SMALL, moe=MoEConfig(experts=4, top_k=2, every=1))
    (tmp_path / META).write_text(json.dumps({"format": checkpoint._FORMAT, "version": checkpoint._VERSION,
                                             "step": 1, **checkpoint_meta(cfg, 2, 1, 1, ep=2)}))
    dropless = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, dropless=True))
    assert checkpoint_problem(dropless, 2, 1, 1, 5, ep=2, resume=str(tmp_path)) == (
        f"--resume {tmp_path}: the checkpoint's config has moe.dropless False, this run's True (resume with the "
        "settings it was saved with)")
    assert "config has moe 4 experts (an MoE GPT), this run's none (a dense GPT)" in checkpoint_problem(
        SMALL, 2, 1, 1, 5, ep=2, resume=str(tmp_path))  # (its experts, not its whole config)


def test_a_checkpoint_of_context_parallel_ranks_is_said_by_its_cp(tmp_path):
    # a resume that leaves out --cp 2 is told cp first, not "the checkpoint's mesh has dp 2, this run's 4" alone
    from spmdsim.models.gpt import checkpoint
    from spmdsim.models.gpt.checkpoint import checkpoint_meta

    (tmp_path / META).write_text(json.dumps({"format": checkpoint._FORMAT, "version": checkpoint._VERSION,
                                             "step": 1, **checkpoint_meta(SMALL, 8, 2, 2, cp=2)}))
    assert checkpoint_problem(SMALL, 8, 2, 2, 5, cp=2, resume=str(tmp_path)) is None
    assert checkpoint_problem(SMALL, 8, 4, 2, 5, resume=str(tmp_path)) == (  # (one with regions: resharded)
        f"--resume {tmp_path}: the checkpoint's mesh has cp 2 and dp 2, this run's cp none and dp 4 ({OLDER})")
    assert "mesh has cp 2 and dp 2, this run's cp 4 and dp 1" in checkpoint_problem(SMALL, 8, 1, 2, 5, cp=4,
                                                                                     resume=str(tmp_path))
