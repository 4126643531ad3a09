"""Resuming the GPT trainer under another precision (spmdsim.models.gpt.reprecision; docs/howto/checkpoints.md,
"Resume under another precision"): a checkpoint saved under one preset resumes under another, on the same mesh or
another. No run that never stopped exists to compare with: the switched resume must step exactly as a resume,
under the new preset, of the same checkpoint converted by hand (`_by_hand`: bf16-mixed and fp8 hold the same
arrays, fp64 and fp32's rounded or widened, FP8's tables fresh or dropped), every resumed step's check passing;
moments lost in the switch are caught.
"""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import spmdsim
from spmdsim.base.fp8 import CURRENT, DELAYED
from spmdsim.base.precision import PRESETS, bfloat16
from spmdsim.models.gpt import GPTConfig, encode as encode_text, load_text
from spmdsim.models.gpt import checkpoint, reshard
from spmdsim.models.gpt.checkpoint import META, checkpoint_problem, rank_file
from spmdsim.models.gpt.checkpoint_files import decode, encode
from spmdsim.models.gpt.reprecision import switch_words
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import train

pytest.importorskip("ml_dtypes")

CFG = GPTConfig(layers=1, d_model=32, heads=4, seq=16, batch=4, dropout=0.0)
TEXT = encode_text(load_text(20_000))
HISTORY = {"fp8": DELAYED.history, "fp8-current": CURRENT.history}


def _run(mesh, steps, **kw):
    """Each rank's StepResults of `train` of CFG on `mesh` (ranks, dp, tp) of simulated ranks."""
    ranks, dp, tp = mesh
    return spmdsim.simulate(ranks, lambda: train(CFG, spmdsim.world(), dp, tp, steps, TEXT, **kw)[1])


def _by_hand(src, dst, precision):
    """The checkpoint in `src` (saved without ZeRO) copied into `dst` as if saved under `precision`: its
    metadata's precision, each rank file's arrays in its dtypes (`_converted`), and its FP8 tables: one fresh (no
    keys) into FP8, none out of it."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / META).read_text())
    there, meta["precision"] = PRESETS[meta["precision"]], precision
    here = PRESETS[precision]
    (dst / META).write_text(json.dumps(meta))
    for r in range(meta["world size"]):
        with np.load(rank_file(str(dst), r)) as f:
            arrays = {k: f[k] for k in f.files if not k.startswith("fp8.")}
        header = json.loads(str(arrays["header"]))
        if (there.param, there.optimizer) != (here.param, here.optimizer):  # (bf16-mixed and fp8's are alike)
            arrays = _converted(arrays, header, here)
        header["fp8"] = [[]] if precision in HISTORY else []
        if precision in HISTORY:
            arrays["fp8.0.scales"] = np.zeros(0, np.float32)
            arrays["fp8.0.history"] = np.zeros((0, HISTORY[precision]), np.float32)
        arrays["header"] = np.array(json.dumps(header))
        np.savez(rank_file(str(dst), r), **arrays)
    return str(dst)


def _converted(arrays, header, policy):
    """A rank file's `arrays` (`header` its header, changed in place) with its parameters and AdamW state in the
    dtypes of `policy`, as a load into a module of those dtypes copies them: the weights (the master copy where
    one was saved) as the master copy and the parameter cast from it, or as the parameter; the moments cast."""
    state = decode(header["optimizer"], arrays)
    for i, name in enumerate(header["params"]):
        block = arrays[f"param.{name}"]
        entry = state["state"].get(i)
        weights = entry.pop("master") if entry and "master" in entry else \
            block.view(bfloat16()) if header["dtypes"][name] == "bfloat16" else block
        if entry:
            entry.update({f: entry[f].astype(policy.optimizer) for f in ("exp_avg", "exp_avg_sq")})
            entry.update({"master": weights.astype(policy.master)} if policy.master else {})
        block = weights.astype(policy.master or policy.param).astype(policy.dtype("param"))
        header["dtypes"][name] = block.dtype.name
        arrays[f"param.{name}"] = block.view(np.uint16) if policy.master else block
    out = {k: v for k, v in arrays.items() if not k.startswith("optimizer.")}
    header["optimizer"] = encode(state, out)
    return out


def _switched(tmp_path, saved_on, there, resumed_on, here, saved_kw=None, resumed_kw=None, hand_on=False):
    """2 steps saved on `saved_on` under `there`, resumed to 4 on `resumed_on` under `here`: (each rank's
    StepResults of the switched resume, of the resume of the checkpoint converted by hand: on `resumed_on`, or
    with `hand_on` on the mesh and settings it was saved with)."""
    saved_kw, resumed_kw = saved_kw or {}, resumed_kw or {}
    _run(saved_on, 2, precision=there, save=str(tmp_path / "half"), **saved_kw)
    hand = _by_hand(tmp_path / "half", tmp_path / "hand", here)
    return [_run(on, 4, precision=here, resume=where, **kw) for on, where, kw in (
        (resumed_on, str(tmp_path / "half"), resumed_kw),
        (saved_on, hand, saved_kw) if hand_on else (resumed_on, hand, resumed_kw))]


def _said(results):
    """Each rank's (step, loss, passed) of `results`."""
    return [[(r.step, r.loss, r.passed) for r in rank] for rank in results]


@pytest.mark.parametrize("saved_on, there, resumed_on, here, kw", [
    ((4, 2, 2), "bf16-mixed", (4, 2, 2), "fp8", {}),  # the same mesh: FP8's tables start fresh
    ((4, 2, 2), "fp8", (2, 1, 2), "bf16-mixed", {}),  # another mesh: FP8's tables dropped
    ((4, 4, 1), "fp8-current", (4, 2, 2), "bf16-mixed", {"zero": 1}),  # ZeRO-1's float32 master slices
    ((4, 4, 1), "fp8", (4, 4, 1), "fp8-current", {"zero": 1}),  # another recipe: FP8's tables start fresh
    ((4, 2, 2), "fp64", (4, 2, 2), "bf16-mixed", {}),  # rounded to the float32 master, bfloat16 cast from it
    ((4, 2, 2), "bf16-mixed", (2, 1, 2), "fp64", {}),  # the float32 master and moments widened
    ((2, 1, 2), "fp32", (2, 1, 2), "fp8", {}),  # the weights as the master: FP8's tables start fresh
    ((2, 1, 2), "fp8", (4, 2, 2), "fp32", {}),  # the master as the weights: FP8's tables dropped
    ((4, 2, 2), "fp64", (4, 2, 2), "fp32", {}),  # rounded
    ((4, 2, 2), "fp32", (2, 2, 1), "fp64", {}),  # widened
])
def test_a_run_resumed_under_another_mixed_precision_steps_as_its_checkpoint_converted_by_hand(
        tmp_path, saved_on, there, resumed_on, here, kw):
    switched, hand = map(_said, _switched(tmp_path, saved_on, there, resumed_on, here, kw, kw))
    assert switched == hand  # bit for bit, every rank
    assert [s for s, _, _ in switched[0]] == [2, 3] and all(p for rank in switched for _, _, p in rank)


@pytest.mark.parametrize("saved_on, there, resumed_on, here, saved_kw, resumed_kw", [
    ((4, 2, 2), "bf16-mixed", (2, 1, 2), "fp8", {}, {}),  # dp 2 x tp 2 -> tp 2
    ((4, 4, 1), "bf16-mixed", (4, 2, 2), "fp8", {"zero": 1}, {}),  # ZeRO-1 dp 4 -> dp 2 x tp 2
    ((4, 2, 2), "fp64", (4, 4, 1), "bf16-mixed", {}, {"zero": 1}),  # into ZeRO-1's float32 master slices
    ((4, 2, 2), "bf16-mixed", (4, 4, 1), "fp64", {}, {"zero": 2}),  # into ZeRO-2's float64 slices
])
def test_a_run_resumed_under_another_precision_on_another_mesh_steps_as_its_checkpoint_converted_by_hand(
        tmp_path, saved_on, there, resumed_on, here, saved_kw, resumed_kw):
    # a checkpoint with fresh (keyless) FP8 tables resumes only on its own mesh: the switched resume on another
    # mesh is compared with the converted one's on the mesh it was saved on, within the check's tolerance (the
    # sums run in another order)
    switched, hand = _switched(tmp_path, saved_on, there, resumed_on, here, saved_kw, resumed_kw, hand_on=True)
    for rank in switched:
        assert [r.step for r in rank] == [2, 3] and all(r.passed for r in rank)
        for r, h in zip(rank, hand[0]):
            assert abs(r.loss - h.loss) <= r.tolerances[0] * abs(h.loss), (r.step, r.loss, h.loss)


@pytest.mark.parametrize("there, here, resumed_kw", [
    ("bf16-mixed", "fp64", {"zero": 1}),  # the whole float32 master of each block read, widened, then sliced
    ("fp64", "bf16-mixed", {"zero": 2}),
])
def test_a_zero_checkpoint_resumed_under_another_precision_takes_its_whole_master(tmp_path, there, here,
                                                                                    resumed_kw):
    # ZeRO-1's checkpoint holds each master in slices: resumed under ZeRO (each rank's slice only) and under
    # AdamW (the whole block), the weights are alike: step 2's forward bit for bit, then within the tolerance
    _run((4, 4, 1), 2, precision=there, zero=1, save=str(tmp_path / "ck"))
    zero, plain = (_run((4, 4, 1), 4, precision=here, resume=str(tmp_path / "ck"), **kw) for kw in (resumed_kw, {}))
    for z, p in zip(zero, plain):
        assert z[0].loss == p[0].loss and all(r.passed for r in z + p)
        assert abs(z[1].loss - p[1].loss) <= z[1].tolerances[0] * abs(p[1].loss)


def _older(src, dst):
    """The checkpoint in `src` copied into `dst` as an older spmdsim saved it: no ranks' regions recorded."""
    shutil.copytree(src, dst)
    meta = json.loads((dst / META).read_text())
    (dst / META).write_text(json.dumps({k: v for k, v in meta.items() if k != "regions"}))
    return str(dst)


@pytest.mark.parametrize("there, here, zero", [
    ("bf16-mixed", "fp8", 0),  # FP8's tables fresh
    ("fp64", "bf16-mixed", 0),  # rounded, bfloat16 cast from the master
    ("bf16-mixed", "fp32", 1),  # ZeRO-1: each block's whole master, from the slices of its dp group
    ("fp32", "fp64", 3),  # FSDP's shards widened
])
def test_an_older_checkpoint_resumed_on_its_own_mesh_under_another_precision_steps_as_a_newer_one(
        tmp_path, there, here, zero):
    # saved before checkpoint.json recorded each rank's regions: on its own mesh they are this run's own
    _run((4, 2, 2), 2, precision=there, zero=zero, save=str(tmp_path / "ck"), check=False)
    older = _older(tmp_path / "ck", tmp_path / "older")
    assert checkpoint_problem(CFG, 4, 2, 2, 4, resume=older, precision=here, zero=zero) is None
    newer, old = (_said(_run((4, 2, 2), 4, precision=here, zero=zero, resume=where))
                  for where in (str(tmp_path / "ck"), older))
    assert old == newer and [s for s, _, _ in old[0]] == [2, 3] and all(p for rank in old for _, _, p in rank)


@pytest.mark.parametrize("zero, said", [
    (0, "optimizer is 'DistributedAdamW', this run's 'AdamW'"),  # what needs the regions, not the precision
    (3, """layouts has wte '("tp", None)' and 18 more, this run's wte '(("tp", "dp"), None)' and 18 more"""),
])
def test_an_older_checkpoint_refused_under_another_precision_names_what_needs_its_regions(tmp_path, zero, said):
    _run((4, 2, 2), 1, precision="bf16-mixed", zero=1, save=str(tmp_path / "ck"), check=False)
    older = _older(tmp_path / "ck", tmp_path / "older")
    assert checkpoint_problem(CFG, 4, 2, 2, 3, resume=older, precision="fp32", zero=zero) == (
        f"--resume {older}: the checkpoint's {said} (it records no ranks' regions to reshard from, saved by an "
        "older spmdsim: resume with the settings it was saved with)")


def test_an_older_pipeline_checkpoint_under_another_precision_is_refused_in_one_line(tmp_path):
    _staged(2, 1, precision="bf16-mixed", save=str(tmp_path / "ck"), check=False)
    older = _older(tmp_path / "ck", tmp_path / "older")
    pipeline = {"pp": 2, "schedule": "1f1b", "microbatches": 2, "virtual": 1, "split": None}
    assert checkpoint_problem(DEEP, 4, 1, 2, 3, resume=older, precision="fp8", pipeline=pipeline) == (
        f"--resume {older}: the checkpoint's precision is 'bf16-mixed', this run's 'fp8' (it records no ranks' "
        "regions to convert a pipeline's state from, saved by an older spmdsim: resume with the settings it was "
        "saved with)")


def test_moments_lost_in_a_switch_are_caught(tmp_path, monkeypatch):
    # the check's reference starts each step from the run's own state, so it passes; the resume of the same
    # checkpoint converted by hand does not step alike (step 2's forward, of the weights, is the same)
    given = reshard._moments

    def zeroed(*args):
        state = given(*args)
        return state and {f: v * 0 if f.startswith("exp_avg") else v for f, v in state.items()}

    monkeypatch.setattr(reshard, "_moments", zeroed)
    switched, hand = map(_said, _switched(tmp_path, (2, 1, 2), "bf16-mixed", (2, 1, 2), "fp8"))
    assert switched[0][0] == hand[0][0] and switched[0][1][1] != hand[0][1][1]


@pytest.mark.parametrize("there, here, said", [
    ("bf16-mixed", "fp8", ", from bf16-mixed: FP8's scales start fresh"),
    ("fp8", "bf16-mixed", ", from fp8: its FP8 scales dropped"),
    ("fp8", "fp8-current", ", from fp8: FP8's scales start fresh"),
    ("fp8", "fp8", ""),
    ("fp64", "bf16-mixed", ", from fp64: the weights and moments rounded to float32, the bfloat16 parameters cast "
     "from the float32 master"),
    ("fp8", "fp32", ", from fp8: the float32 master as the weights, its FP8 scales dropped"),
    ("bf16-mixed", "fp64", ", from bf16-mixed: the master weights and moments widened to float64"),
    ("fp32", "fp64", ", from fp32: the weights and moments widened to float64"),
])
def test_the_resume_line_says_the_precision_it_was_saved_under_and_what_converted(there, here, said):
    assert switch_words(there, here) == said


def test_the_resume_line_says_the_switch_after_the_mesh(tmp_path):
    _run((2, 1, 2), 1, precision="fp8", save=str(tmp_path / "ck"), check=False)
    where = str(tmp_path / "ck")
    assert checkpoint.resume_line(where, 1, 2, False, precision="bf16-mixed") == (
        f"resuming from {where} at step 1, from fp8: its FP8 scales dropped")
    assert checkpoint.resume_line(where, 2, 2, False, precision="bf16-mixed") == (
        f"resuming from {where} at step 1, resharded from dp 1 x tp 2 (2 ranks), from fp8: its FP8 scales dropped")
    assert checkpoint_problem(CFG, 4, 2, 2, 3, resume=where, precision="fp8-current") is None


def test_a_precision_this_spmdsim_does_not_train_is_refused_in_one_line(tmp_path):
    _run((2, 1, 2), 1, precision="bf16-mixed", save=str(tmp_path / "ck"), check=False)
    meta = json.loads((tmp_path / "ck" / META).read_text())
    (tmp_path / "ck" / META).write_text(json.dumps({**meta, "precision": "fp16-mixed"}))
    assert checkpoint_problem(CFG, 2, 1, 2, 3, resume=str(tmp_path / "ck"), precision="bf16-mixed") == (
        f"--resume {tmp_path / 'ck'}: the checkpoint's precision is 'fp16-mixed', this run's 'bf16-mixed' "
        "(resume with the settings it was saved with)")


DEEP = dataclasses.replace(CFG, layers=2)


def _staged(pp, steps, **kw):
    """Rank 0's StepResults of DEEP on 4 ranks: `train_pipelined` over pp 2 x tp 2 (2 microbatches), or with
    `pp` None `train` over dp 2 x tp 2."""
    if pp is None:
        return spmdsim.simulate(4, lambda: train(DEEP, spmdsim.world(), 2, 2, steps, TEXT, **kw)[1])[0]
    return spmdsim.simulate(4, lambda: train_pipelined(DEEP, spmdsim.world(), pp, 1, 2, steps, TEXT,
                                                       microbatches=2, **kw)[1])[0]


@pytest.mark.parametrize("there, here, resumed_pp", [
    ("bf16-mixed", "fp8", 2),  # each chunk's table fresh
    ("fp8", "fp64", None),  # each stage's tables dropped, off the pipeline
])
def test_a_pipeline_resumed_under_another_precision_steps_as_its_checkpoint_converted_by_hand(
        tmp_path, there, here, resumed_pp):
    _staged(2, 2, precision=there, save=str(tmp_path / "half"))
    hand = _staged(2, 4, precision=here, resume=_by_hand(tmp_path / "half", tmp_path / "hand", here))
    switched = _staged(resumed_pp, 4, precision=here, resume=str(tmp_path / "half"))
    assert [r.step for r in switched] == [2, 3] and all(r.passed for r in switched + hand)
    for r, h in zip(switched, hand):
        assert abs(r.loss - h.loss) <= (0 if resumed_pp else r.tolerances[0] * abs(h.loss)), (r.step, r.loss, h.loss)
