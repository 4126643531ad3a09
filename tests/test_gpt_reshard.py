"""Resuming the GPT trainer on another mesh (spmdsim.models.gpt.reshard; docs/howto/checkpoints.md, "Resume on
another mesh, pipeline, ZeRO stage or experts"): a checkpoint saved on one (dp, tp, sp) mesh resumes on another,
each rank reading the pieces of the saved blocks that overlap its own from the files it needs; the resumed steps
pass the check and end at the uninterrupted run's loss within the check's tolerance (the sums over tp run in
another order: not bit for bit), with ZeRO, FSDP, context parallelism or experts (their ep and etp) too. A
checkpoint that records no regions is refused in one line, alike on every rank; the resume line says the mesh it
was saved on. Over a pipeline and with FP8's scales: tests/test_gpt_reshard_pipeline.py. The documented commands:
tests/test_gpt_checkpoint.py."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random

import numpy as np
import pytest

import spmdsim
from reshardkit import AGAIN, PIPE, TEXT, TINY, error_line, steps_as_whole, train_on, written_meta
from spmdsim.models.gpt import checkpoint, reshard
from spmdsim.models.gpt.checkpoint import META, checkpoint_problem, rank_file, read_meta
from spmdsim.models.axes import model_layout, roles_of
from spmdsim.models.gpt.mesh import zero_cut
from spmdsim.models.gpt.train import train


@pytest.mark.parametrize("saved_on, resumed_on, precision", [
    ((4, 2, 2, False), (4, 1, 4, False), "fp64"),  # tp 2 dp 2 -> tp 4
    ((4, 2, 2, False), (2, 2, 1, False), "fp64"),  # tp 2 dp 2 -> dp 2 on 2 ranks
    ((2, 1, 2, False), (4, 2, 2, True), "fp64"),  # tp 2 -> tp 2 dp 2 with sp
    ((4, 2, 2, True), (2, 1, 2, False), "bf16-mixed"),  # bf16 parameters, float32 masters and moments
])
def test_a_run_resumed_on_another_mesh_steps_as_the_run_that_never_stopped(tmp_path, saved_on, resumed_on,
                                                                           precision):
    if precision == "bf16-mixed":
        pytest.importorskip("ml_dtypes")
    steps_as_whole(train_on, tmp_path, saved_on, resumed_on, {"precision": precision}, {"precision": precision},
                   share="train_on")


@pytest.mark.parametrize("saved_on, saved_zero, resumed_on, resumed_zero, precision", [
    ((4, 2, 2, False), 1, (4, 1, 4, False), 1, "fp64"),  # ZeRO-1 dp 2 x tp 2 -> ZeRO-1 tp 4 (no dp: whole slices)
    ((4, 4, 1, False), 1, (4, 2, 2, False), 2, "fp64"),  # ZeRO-1 dp 4 -> ZeRO-2 dp 2 x tp 2
    ((4, 2, 2, False), 1, (2, 1, 2, False), 0, "fp64"),  # ZeRO-1 -> no ZeRO on another mesh
    ((2, 1, 2, False), 0, (4, 2, 2, True), 2, "fp64"),  # no ZeRO -> ZeRO-2 dp 2 x tp 2 with sp
    ((4, 2, 2, False), 0, (4, 2, 2, False), 1, "fp64"),  # no ZeRO -> ZeRO-1 on the same mesh
    ((4, 2, 2, True), 2, (4, 4, 1, False), 1, "bf16-mixed"),  # the float32 master slices
    ((4, 4, 1, False), 1, (2, 1, 2, False), 0, "bf16-mixed"),  # ZeRO's masters -> AdamW's
])
def test_a_zero_run_resumed_on_another_mesh_steps_as_the_run_that_never_stopped(tmp_path, saved_on, saved_zero,
                                                                                 resumed_on, resumed_zero, precision):
    if precision == "bf16-mixed":
        pytest.importorskip("ml_dtypes")
    # (the moments read wrong by a tenth move step 3's loss by 1e-3)
    steps_as_whole(train_on, tmp_path, saved_on, resumed_on, {"precision": precision, "zero": saved_zero},
                   {"precision": precision, "zero": resumed_zero}, share="train_on")


def test_a_zero_checkpoint_records_each_ranks_slice_of_every_parameter(tmp_path):
    train_on((4, 4, 1, False), 1, zero=1, save=str(tmp_path / "ck"), check=False)
    saved = read_meta(str(tmp_path / "ck"))[0]["regions"]
    # one bucket of 17,344 elements, 4,336 a rank: wte's 4,096 on rank 0, wpe's 512 straddle ranks 0 and 1
    # (rank, [bucket, start, stop in the flattened block, where in the rank's slice])
    assert saved["wte"]["slices"] == [[0, 0, 4096, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert saved["wpe"]["slices"] == [[0, 0, 240, 4096], [0, 240, 512, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_each_zero_rank_reads_only_the_files_whose_slices_it_needs(tmp_path, monkeypatch):
    # ZeRO-1 dp 4 -> ZeRO-1 dp 2: rank 0's slices are saved ranks 0 and 1's, rank 1's ranks 2 and 3's; each
    # rank's (replicated) parameters come from one of those files
    train_on((4, 4, 1, False), 2, zero=1, save=str(tmp_path / "ck"), check=False)
    opened, given = [], reshard._open
    monkeypatch.setattr(reshard, "_open", lambda files, path, r, saved: (
        opened.append((spmdsim.world().rank, r)), given(files, path, r, saved))[1])
    resumed = train_on((2, 2, 1, False), 3, zero=1, resume=str(tmp_path / "ck"))
    assert sorted(opened) == [(0, 0), (0, 1), (1, 2), (1, 3)] and resumed[0][0].passed


@pytest.mark.parametrize("saved_on, saved_kw, resumed_on, resumed_kw", [
    ((4, 4, 1), {"zero": 3}, (4, 2, 2), {"zero": 3}),  # FSDP's shards over dp 4 -> over dp 2, tp 2
    ((4, 2, 2), {"zero": 3}, (2, 1, 2), {}),  # FSDP -> none
    ((2, 2, 1), {}, (4, 4, 1), {"zero": 3}),  # none -> FSDP
    ((4, 2, 2), {"zero": 3}, (4, 2, 2), {"zero": 1}),  # FSDP -> ZeRO-1 on the same mesh
    ((4, 2, 1), {"cp": 2}, (4, 2, 2), {}),  # cp 2 -> tp 2
    ((4, 2, 2), {}, (4, 1, 2), {"cp": 2}),  # dp 2 -> cp 2
    ((4, 1, 2), {"cp": 2, "zero": 1}, (4, 4, 1), {"zero": 3}),  # ZeRO-1 over cp x dp -> FSDP
])
def test_fsdp_and_cp_resumed_on_another_mesh_step_as_the_run_that_never_stopped(tmp_path, saved_on, saved_kw,
                                                                                resumed_on, resumed_kw):
    cfg = dataclasses.replace(TINY, dropout=0.0)  # (cp draws other dropout masks than a run without: none here)

    def run(mesh, steps, **kw):
        ranks, dp, tp = mesh
        return spmdsim.simulate(ranks, lambda: train(cfg, spmdsim.world(), dp, tp, steps, TEXT, **kw)[1])

    steps_as_whole(run, tmp_path, saved_on, resumed_on, saved_kw, resumed_kw, share="fsdp and cp")


def _fsdp_run(mesh, steps, **kw):
    """Each rank's StepResults of a ZeRO-3 `train` on `mesh` (ranks, dp, tp, fs[, cp]) of simulated ranks: HSDP's
    (dp / fs, fs, [cp,] tp) mesh where 0 < fs < dp (examples/train_gpt.py's --shard-group), else over all of dp."""
    ranks, dp, tp, fs, *rest = mesh
    cp = rest[0] if rest else 1
    shape, names = model_layout(tp, dp // fs, fs=fs, cp=cp if cp > 1 else None) if 0 < fs < dp else (None, None)

    def body():
        hsdp = None if shape is None else spmdsim.Mesh(spmdsim.Layout(shape, names, zero_cut(3)), spmdsim.world(),
                                                       roles=roles_of(names))
        return train(TINY, spmdsim.world(), dp, tp, steps, TEXT, zero=3, mesh=hsdp, cp=cp, **kw)[1]
    return spmdsim.simulate(ranks, body)


@pytest.mark.parametrize("saved_on, resumed_on", [
    ((4, 4, 1, 2), (4, 4, 1, 2)),  # HSDP, the same groups
    ((4, 4, 1, 2), (4, 4, 1, 0)),  # HSDP -> ZeRO-3 over all of dp
    ((4, 4, 1, 0), (4, 4, 1, 2)),  # ZeRO-3 -> HSDP
    ((8, 4, 2, 2), (4, 4, 1, 1)),  # shard groups of 2 on tp 2 -> of 1 (replicated) on 4 ranks
    ((8, 2, 1, 1, 4), (8, 2, 1, 0, 4)),  # HSDP beside cp 4 (over fs x cp) -> ZeRO-3 over dp x cp
    ((8, 2, 2, 0, 2), (8, 4, 1, 0, 2)),  # ZeRO-3 over dp x cp -> another dp and tp (cp 2 kept: the same masks)
])
def test_hybrid_sharding_resumed_steps_as_the_run_that_never_stopped(tmp_path, saved_on, resumed_on):
    steps_as_whole(_fsdp_run, tmp_path, saved_on, resumed_on, share="_fsdp_run")


def test_a_hybrid_sharding_checkpoint_records_its_shard_group_and_says_it_on_resume(tmp_path):
    _fsdp_run((4, 4, 1, 2), 2, save=str(tmp_path / "ck"), check=False)
    saved = read_meta(str(tmp_path / "ck"))[0]
    assert saved["mesh"] == {"dp": 2, "fs": 2, "tp": 1} and saved["layouts"]["wpe"] == '("fs", None)'
    assert saved["regions"]["wpe"]["blocks"] == [[[0, 8], [0, 32]], [[8, 16], [0, 32]]] * 2  # replicated over dp
    line = checkpoint.resume_line(str(tmp_path / "ck"), 4, 1, False, zero=3)
    assert line.endswith(", resharded from dp 2 x fs 2 x tp 1 with FSDP (ZeRO-3) (4 ranks)")
    assert checkpoint.resume_line(str(tmp_path / "ck"), 4, 1, False, zero=3, fs=2).endswith("at step 2")


def test_a_resharded_run_saves_a_checkpoint_of_its_own_mesh_and_the_trainings_first_loss(tmp_path):
    first = train_on((4, 2, 2, False), 2, save=str(tmp_path / "a"), check=False)[0]  # (the check changes no byte)
    train_on((2, 1, 2, False), 3, resume=str(tmp_path / "a"), save=str(tmp_path / "b"), check=False)
    meta = read_meta(str(tmp_path / "b"))[0]
    assert (meta["step"], meta["world size"], meta["mesh"], meta["first loss"]) == (3, 2, {"dp": 1, "tp": 2},
                                                                                    first[0].loss)
    assert meta["regions"]["wte"]["blocks"] == [[[0, 64], [0, 32]], [[64, 128], [0, 32]]]  # 128 rows over tp 2
    resumed = train_on((4, 1, 4, False), 4, resume=str(tmp_path / "b"))[0]  # and on again: tp 2 -> tp 4
    assert [r.step for r in resumed] == [3] and resumed[0].passed


def test_each_rank_reads_only_the_files_it_needs(tmp_path):
    # dp 2 x tp 2 -> tp 2 on 2 ranks: rank r's block of every parameter is saved rank r's (dp 0's), so the
    # files of ranks 2 and 3 are never opened
    train_on((4, 2, 2, False), 2, save=str(tmp_path / "ck"), check=False)
    for r in (2, 3):
        os.remove(rank_file(str(tmp_path / "ck"), r))
    resumed = train_on((2, 1, 2, False), 3, resume=str(tmp_path / "ck"))
    assert [[r.step for r in one] for one in resumed] == [[2], [2]] and resumed[0][0].passed


def test_a_missing_file_a_rank_needs_stops_every_rank_with_one_line(tmp_path):
    where = tmp_path / "ck"
    train_on((4, 2, 2, False), 2, save=str(where), check=False)
    os.remove(rank_file(str(where), 1))  # tp rank 1's blocks of dp 0, which rank 1 of tp 2 reads

    # (rank 0 reads its blocks from file 0; rank 1 from file 1: the ranks agree on rank 1's problem)
    said = spmdsim.simulate(2, lambda: error_line(lambda: train(TINY, spmdsim.world(), 1, 2, 3, TEXT,
                                                                resume=str(where))))
    assert said == [f"--resume {where}: rank 1's file {rank_file(str(where), 1)} is missing"] * 2


MOE = dataclasses.replace(TINY, dropout=0.0)


@pytest.mark.parametrize("saved_on, saved_kw, resumed_on, resumed_kw", [
    ((4, 1, 2, 2), {}, (4, 1, 1, 4), {}),  # ep 2 x tp 2 -> ep 4
    ((4, 2, 1, 2), {"zero": 1}, (4, 1, 1, 4), {"zero": 1}),  # ZeRO-1 over dp 2 x ep 2 -> over ep 4
    ((4, 1, 4, 1), {"etp": 2}, (4, 1, 2, 2), {"etp": 1}),  # the experts' tp 2 of tp 4 -> ep 2, etp 1
    ((4, 1, 2, 2), {}, (4, 1, 4, 1), {"etp": 2, "zero": 2}),  # -> folded: etp 2 of tp 4, ZeRO-2
    ((4, 2, 1, 2), {"zero": 3}, (2, 1, 1, 2), {}),  # FSDP: the dense parameters over dp x ep -> none
    ((2, 1, 1, 2), {}, (4, 2, 2, 1), {"zero": 1}),  # ep 2 -> dp 2 x tp 2, one expert group
])
def test_an_moe_gpt_resumed_on_another_mesh_steps_as_the_run_that_never_stopped(tmp_path, saved_on, saved_kw,
                                                                                resumed_on, resumed_kw):
    from spmdsim.models.moe import MoEConfig

    def run(mesh, steps, etp=0, **kw):
        ranks, dp, tp, ep = mesh
        cfg = dataclasses.replace(MOE, moe=MoEConfig(experts=4, top_k=2, every=1, etp=etp))
        return spmdsim.simulate(ranks, lambda: train(cfg, spmdsim.world(), dp, tp, steps, TEXT, ep=ep, **kw)[1])

    steps_as_whole(run, tmp_path, saved_on, resumed_on, saved_kw, resumed_kw, share="moe")


def test_experts_of_another_config_on_another_mesh_are_refused_in_one_line(tmp_path):
    from spmdsim.models.moe import MoEConfig

    cfg = dataclasses.replace(TINY, moe=MoEConfig(experts=4, top_k=2, every=1))
    where = written_meta(tmp_path / "ck", cfg=cfg, world=2, dp=1, tp=1, ep=2)
    assert checkpoint_problem(cfg, 4, 1, 1, 5, ep=4, resume=where) is None  # resharded
    other = dataclasses.replace(TINY, moe=MoEConfig(experts=8, top_k=2, every=1, etp=2))
    assert checkpoint_problem(other, 4, 1, 2, 5, ep=2, resume=where) == (
        f"--resume {where}: the checkpoint's config has moe.experts 4, this run's 8 ({AGAIN})")  # (not etp: resharded)
    assert checkpoint.resume_line(where, 1, 1, False, ep=4) == (
        f"resuming from {where} at step 2, resharded from dp 1 x ep 2 x tp 1 (2 ranks)")


@pytest.mark.parametrize("zero", [0, 1])
def test_a_checkpoint_that_records_no_regions_resumes_on_its_own_mesh_only(tmp_path, zero):
    """A checkpoint saved before checkpoint.json recorded each rank's regions (under ZeRO, its slices)."""
    where = tmp_path / "ck"
    train_on((4, 2, 2, False), 2, save=str(where), check=False, zero=zero)
    meta = read_meta(str(where))[0]
    if zero:
        for one in meta["regions"].values():
            del one["slices"]
    else:
        del meta["regions"]
    (where / META).write_text(json.dumps(meta))
    assert checkpoint_problem(TINY, 4, 2, 2, 3, resume=str(where), zero=zero) is None
    said = spmdsim.simulate(2, lambda: error_line(lambda: train(TINY, spmdsim.world(), 1, 2, 3, TEXT, zero=zero,
                                                                resume=str(where))))
    assert said == [f"--resume {where}: the checkpoint's world size is 4, this run's 2 (it records no ranks' "
                    f"regions to reshard from, saved by an older spmdsim: {AGAIN})"] * 2


@pytest.mark.parametrize("saved, run, said", [
    ({}, {}, ""),  # the same mesh: the plain line
    ({"zero": 1}, {"zero": 2}, ", resharded from dp 2 x tp 2 with ZeRO-1 (4 ranks)"),  # the stage alone
    ({"world": 8, "pipeline": PIPE, "zero": 1}, {"world": 8, "dp": 4},
     ", resharded from pp 2 x dp 2 x tp 2 with ZeRO-1 (8 ranks)"),  # the pipeline and ZeRO
    ({"dp": 1, "cp": 2}, {}, ", resharded from dp 1 x cp 2 x tp 2 (4 ranks)"),  # cp alone
    ({"sp": True, "zero": 3}, {"sp": True}, ", resharded from dp 2 x tp 2 with sequence parallelism and FSDP "
     "(ZeRO-3) (4 ranks)"),
    ({"zero": 2, "older": True}, {}, ", resharded from dp 2 x tp 2 with ZeRO-1 or 2 (4 ranks)"),  # no stage kept
    ({"zero": 2, "older": True}, {"zero": 1}, ""),
    # what the checkpoint lacks and the run has: said too (it printed the run's own mesh, nothing differing)
    ({}, {"zero": 1}, ", resharded from dp 2 x tp 2 without ZeRO (4 ranks)"),
    ({}, {"sp": True}, ", resharded from dp 2 x tp 2 without sequence parallelism (4 ranks)"),
    ({"zero": 1}, {"sp": True, "zero": 3}, ", resharded from dp 2 x tp 2 with ZeRO-1, without sequence "
     "parallelism (4 ranks)"),
])
def test_the_resume_line_says_the_mesh_pipeline_and_zero_stage_it_was_saved_with(tmp_path, saved, run, said):
    older = saved.pop("older", False)
    where = written_meta(tmp_path / "ck", step=3, **saved)
    if older:  # saved before checkpoint.json recorded the ZeRO stage
        meta = json.loads((tmp_path / "ck" / META).read_text())
        del meta["zero"]
        (tmp_path / "ck" / META).write_text(json.dumps(meta))
    run = {"dp": 2, "tp": 2, "sp": False, **run}
    run.pop("world", None)
    if "pipeline" in saved:
        run["pp"] = None  # (the run without a pipeline)
    assert checkpoint.resume_line(where, **run) == f"resuming from {where} at step 3{said}"


def test_simulated_ranks_read_their_checkpoint_arrays_one_at_a_time(tmp_path, monkeypatch):
    """numpy parses each .npz array's header with ast.literal_eval, which CPython 3.11 and 3.12 cannot run in two
    threads at once (its AST recursion depth is per interpreter: 'SystemError: AST constructor recursion depth
    mismatch', seen resuming on 4 simulated ranks): the loaders read through checkpoint_files.Arrays, one array at
    a time. A header parse made slow (2 ms of busy waiting, threads switched every 0.2 ms: another computing rank runs)
    never meets another, on the same mesh or resharded."""
    import sys
    import threading
    import time

    try:  # where numpy.lib.format.read_array finds _read_array_header: a private module numpy.lib.format re-exports
        import numpy.lib._format_impl as npy_format
    except ImportError:  # numpy 2.0: numpy.lib.format itself
        import numpy.lib.format as npy_format

    real, inside, most, lock = npy_format._read_array_header, [0], [0], threading.Lock()

    def slow(*args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        until = time.perf_counter() + 0.002  # (not a sleep: a simulated rank's sleep gives its run slot away)
        while time.perf_counter() < until:
            pass
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    train_on((4, 2, 2, False), 1, save=str(tmp_path / "ck"), check=False)
    monkeypatch.setattr(npy_format, "_read_array_header", slow)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        for mesh in ((4, 2, 2, False), (4, 1, 4, False)):  # its own files, then resharded
            assert [r.step for r in train_on(mesh, 2, resume=str(tmp_path / "ck"))[0]] == [1]
    finally:
        sys.setswitchinterval(interval)
    assert most[0] == 1


def _masked(region, overlap, mine, need):
    """The range `reshard.wanted_range` gives, as it was worked out before: a mask the size of this rank's block."""
    held = np.zeros(math.prod(b - a for a, b in mine), bool)
    held[slice(*need) if need is not True else slice(None)] = True
    within = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(overlap, mine))
    at = np.nonzero(held.reshape(tuple(b - a for a, b in mine))[within])
    if not at[0].size:
        return []
    shape = tuple(b - a for a, b in region)
    flat = np.ravel_multi_index(tuple(i + lo - a for i, (lo, _), (a, _) in zip(at, overlap, region)), shape)
    return [(int(flat.min()), int(flat.max()) + 1)]


def test_a_zero_slices_range_of_a_saved_region_is_the_masks_without_a_mask():
    rng = random.Random(0)
    for _ in range(3000):  # random blocks of up to 4 dims, their overlaps and slices (True: every element)
        ndim = rng.randint(1, 4)
        shape = [rng.randint(1, 6) for _ in range(ndim)]
        bounds = [[tuple(sorted(rng.sample(range(n + 1), 2))) for n in shape] for _ in range(2)]
        region, mine = (tuple(b) for b in bounds)
        overlap = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(region, mine))
        if any(lo >= hi for lo, hi in overlap):
            continue
        size = math.prod(b - a for a, b in mine)
        need = True if rng.random() < 0.1 else sorted(rng.randint(0, size + 1) for _ in range(2))
        assert reshard.wanted_range(region, overlap, mine, need) == _masked(region, overlap, mine, need), \
            (region, overlap, mine, need)
    # a block of 2**40 elements (the mask: 1 TiB): the range from its bounds alone
    mine = ((0, 1 << 20), (0, 1 << 20))
    region, overlap = ((0, 1 << 20), (1 << 19, 1 << 20)), ((0, 1 << 20), (1 << 19, 1 << 20))
    # rows 3 and 4 of this rank's block: of the region's (its last 2**19 columns), rows 3 and 4 whole
    assert reshard.wanted_range(region, overlap, mine, [3 << 20, 5 << 20]) == [(3 << 19, 5 << 19)]
