"""Resuming the GPT trainer on other pipeline stages and with FP8's scales (spmdsim.models.gpt.reshard,
spmdsim.models.gpt.reshard_fp8; docs/howto/checkpoints.md, "Resume on another mesh, pipeline, ZeRO stage or
experts"): a checkpoint of a pipeline resumes on other stages, another split or schedule, or without one (and one
without on a pipeline), each rank reading the pieces of its stage's blocks from the files that hold them; FP8's
tables of scales and amax histories resume on another mesh, and over a pipeline each chunk's table is built by
key from the saved tables of its layers. The resumed steps pass the check and end at the uninterrupted run's loss
within the check's tolerance. FP8 rows a resumed table cannot take are refused in one line, alike on every rank.
Meshes, ZeRO, FSDP, context parallelism and experts: tests/test_gpt_reshard.py."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import spmdsim
from reshardkit import AGAIN, PIPE, TEXT, TINY, error_line, steps_as_whole, train_on, written_meta
from spmdsim.models.gpt.checkpoint import checkpoint_problem, rank_file, read_meta
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import train


DEEP = dataclasses.replace(TINY, layers=4, dropout=0.0)  # (a microbatch's dropout masks are its own: none here)


def _staged(mesh, steps, **kw):
    """Rank 0's StepResults of `train` (pp None) or `train_pipelined` of DEEP on `mesh` (ranks, pp, dp, tp)."""
    ranks, pp, dp, tp = mesh
    if pp is None:
        return spmdsim.simulate(ranks, lambda: train(DEEP, spmdsim.world(), dp, tp, steps, TEXT, **kw)[1])[0]
    return spmdsim.simulate(ranks, lambda: train_pipelined(DEEP, spmdsim.world(), pp, dp, tp, steps, TEXT,
                                                           **kw)[1])[0]


@pytest.mark.parametrize("saved_on, saved_kw, resumed_on, resumed_kw", [
    ((4, 2, 1, 2), {"microbatches": 2}, (4, None, 2, 2), {}),  # a pipeline -> none
    ((2, None, 1, 2), {}, (4, 2, 1, 2), {"microbatches": 2, "split": (1, 3)}),  # none -> an uneven split
    ((4, 2, 2, 1), {"microbatches": 2, "schedule": "gpipe"}, (4, 4, 1, 1), {"microbatches": 4}),  # pp 2 -> pp 4
    ((4, 2, 1, 2), {"microbatches": 2, "schedule": "interleaved", "virtual": 2}, (4, 2, 2, 1),
     {"microbatches": 1}),  # two chunks a stage -> one; tp 2 -> dp 2
    ((4, 2, 2, 1), {"microbatches": 2, "zero": 1}, (4, 4, 1, 1), {"microbatches": 4, "zero": 2}),  # ZeRO's slices
    ((4, 4, 1, 1), {"microbatches": 4, "zero": 1}, (4, None, 4, 1), {"zero": 1}),  # the tied table's two ends
])
def test_a_pipeline_resumed_on_other_stages_steps_as_the_run_that_never_stopped(tmp_path, saved_on, saved_kw,
                                                                                 resumed_on, resumed_kw):
    steps_as_whole(lambda *a, **kw: [_staged(*a, **kw)], tmp_path, saved_on, resumed_on, saved_kw, resumed_kw)


FP8 = {"precision": "fp8"}


@pytest.mark.parametrize("saved_on, saved_kw, resumed_on, resumed_kw", [
    ((4, 2, 1, 2), {"microbatches": 2, **FP8}, (4, None, 2, 2), FP8),  # each stage's table -> one
    ((2, None, 1, 2), FP8, (4, 2, 1, 2), {"microbatches": 1, **FP8}),  # one table -> each stage's layers'
    ((4, 2, 2, 1), {"microbatches": 2, "schedule": "interleaved", "virtual": 2, **FP8}, (4, 4, 1, 1),
     {"microbatches": 2, **FP8}),  # pp 2, chunks of layers 0, 2 and 1, 3 -> pp 4
])
def test_fp8_over_a_pipeline_resumed_on_other_stages_steps_as_the_run_that_never_stopped(tmp_path, saved_on,
                                                                                         saved_kw, resumed_on,
                                                                                         resumed_kw):
    # each resumed chunk's table built by key from the saved tables of its layers (the keys name the layer).
    # Step 2's loss is the whole run's to 5e-8 (fresh tables, scale 1: 9e-5 to 1.2e-4, 6 to 8 tolerances off);
    # step 3's within 2 tolerances: an update over a pipeline rounds its bfloat16 sums otherwise than one without
    # (the unstopped pp 2 and none runs differ by 2.7e-5 of the loss after one step, bf16-mixed's by 2.5e-5)
    pytest.importorskip("ml_dtypes")
    steps_as_whole(lambda *a, **kw: [_staged(*a, **kw)], tmp_path, saved_on, resumed_on, saved_kw, resumed_kw,
                   slack=2)


def test_a_pipeline_checkpoint_records_each_stages_blocks_and_none_for_the_others(tmp_path):
    _staged((4, 2, 1, 2), 1, save=str(tmp_path / "ck"), microbatches=2, check=False)
    saved = read_meta(str(tmp_path / "ck"))[0]["regions"]
    # ranks 0, 1: stage 0 (layers 0, 1, the table), ranks 2, 3: stage 1 (layers 2, 3, lnf and the tied table)
    assert saved["h0.attn.wq"]["blocks"] == [[[0, 32], [0, 16]], [[0, 32], [16, 32]], None, None]
    assert saved["h3.attn.wq"]["blocks"] == [None, None, [[0, 32], [0, 16]], [[0, 32], [16, 32]]]
    assert saved["wte"]["blocks"] == [[[0, 64], [0, 32]], [[64, 128], [0, 32]]] * 2


@pytest.mark.parametrize("saved_on, saved_zero, resumed_on, resumed_zero", [
    ((4, 2, 2, False), 0, (4, 1, 4, False), 0),  # dp 2 x tp 2 -> tp 4
    ((2, 1, 2, False), 0, (4, 2, 2, True), 1),  # tp 2 -> ZeRO-1 dp 2 x tp 2 with sp
    ((4, 4, 1, False), 1, (2, 1, 2, False), 0),  # ZeRO-1 dp 4 -> tp 2
])
def test_fp8_resumed_on_another_mesh_steps_as_the_run_that_never_stopped(tmp_path, saved_on, saved_zero,
                                                                          resumed_on, resumed_zero):
    # each rank's table of amax histories and scales is the same (the amaxes agreed by an Allreduce(MAX) over
    # the whole mesh: each tensor's amax whatever its pieces), so any saved rank's is every resumed rank's
    pytest.importorskip("ml_dtypes")
    cfg = dataclasses.replace(TINY, dropout=0.0)
    steps_as_whole(train_on, tmp_path, saved_on, resumed_on, {"cfg": cfg, "precision": "fp8", "zero": saved_zero},
                   {"cfg": cfg, "precision": "fp8", "zero": resumed_zero})


@pytest.mark.parametrize("saved, run, said", [
    ({"precision": "fp8", "world": 8, "pipeline": PIPE}, {"precision": "fp8", "world": 8, "tp": 4, "dp": 1,
                                                         "pipeline": PIPE}, None),  # FP8's tables: by key
    ({"precision": "fp8", "world": 8, "pipeline": PIPE}, {"precision": "fp8"}, None),  # and onto no pipeline
    ({"precision": "fp8", "world": 8, "pipeline": PIPE}, {"precision": "fp32"}, None),  # converted: reprecision
    ({}, {"tp": 4, "dp": 1, "cfg": dataclasses.replace(TINY, lr=0.01)},  # what no reshard helps: said, not the mesh
     f"the checkpoint's config has lr 0.003, this run's 0.01 ({AGAIN})"),
])
def test_another_mesh_with_fp8_is_resharded_and_another_config_refused_in_one_line(tmp_path, saved, run, said):
    where = written_meta(tmp_path / "ck", **saved)
    args = {"cfg": TINY, "world": 4, "dp": 2, "tp": 2, **run}
    problem = checkpoint_problem(args.pop("cfg"), args.pop("world"), args.pop("dp"), args.pop("tp"), 5,
                                 resume=where, **args)
    assert problem == (said and f"--resume {where}: {said}")
    if not saved:  # the same mesh, or another of dp, tp and sp alone: nothing to refuse
        assert checkpoint_problem(TINY, 2, 1, 2, 5, resume=where, sp=True) is None


def _rewritten(path, change):
    """Rank file `path` with `change(header, arrays)` made to its header and arrays."""
    with np.load(path) as f:
        arrays = dict(f)
    header = json.loads(str(arrays["header"]))
    change(header, arrays)
    arrays["header"] = np.array(json.dumps(header))
    np.savez(path, **arrays)


def _no_layer_3(header, arrays):
    for i, keys in enumerate(header["fp8"]):
        kept = [j for j, (key, _) in enumerate(keys) if not key.startswith("h3.")]
        header["fp8"][i] = [keys[j] for j in kept]
        arrays[f"fp8.{i}.scales"], arrays[f"fp8.{i}.history"] = (arrays[f"fp8.{i}.scales"][kept],
                                                                 arrays[f"fp8.{i}.history"][kept])


def _short_histories(header, arrays):
    for i in range(len(header["fp8"])):
        arrays[f"fp8.{i}.history"] = arrays[f"fp8.{i}.history"][:, :8]


def _a_key_of_no_layer(header, arrays):
    for keys in header["fp8"]:
        keys[0][0] = "head:x"


@pytest.fixture(scope="module")
def fp8_pipeline_checkpoint(tmp_path_factory) -> str:
    """pp 2's FP8 checkpoint at step 2, saved once for the module: each case rewrites its own copy."""
    pytest.importorskip("ml_dtypes")
    where = str(tmp_path_factory.mktemp("fp8_pipeline") / "ck")
    _staged((4, 2, 1, 2), 2, save=where, microbatches=2, precision="fp8", check=False)
    return where


@pytest.mark.parametrize("change, said", [
    (_no_layer_3, "rank 2's file holds no FP8 scales of layer 3 (keys h3.*), which this run's table needs"),
    (_short_histories, "rank 0's file holds FP8 amax histories of shape ({n}, 8), this run's recipe keeps 1024 "
                       "steps of each key's"),
    (_a_key_of_no_layer, "rank 0's file holds the FP8 key 'head:x', which names no layer (h<n>.)"),
])
def test_fp8_rows_a_resharded_run_cannot_take_stop_every_rank_with_one_line(tmp_path, change, said,
                                                                           fp8_pipeline_checkpoint):
    where = str(tmp_path / "ck")  # pp 2: ranks 0, 1 hold layers 0, 1 and their keys, ranks 2, 3 layers 2, 3
    shutil.copytree(fp8_pipeline_checkpoint, where)
    for r in range(4):
        _rewritten(rank_file(where, r), change)
    with np.load(rank_file(where, 0)) as f:
        n = len(f["fp8.0.scales"])
    said = said.format(n=n)
    found = spmdsim.simulate(4, lambda: error_line(lambda: train(DEEP, spmdsim.world(), 2, 2, 4, TEXT,
                                                                 precision="fp8", resume=where)))
    assert found == [f"--resume {where}: {said}"] * 4
