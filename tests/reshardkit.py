"""What the tests of resuming the GPT trainer on another mesh share (tests/test_gpt_reshard.py: meshes, ZeRO,
FSDP, context parallelism and experts; tests/test_gpt_reshard_pipeline.py: pipelines and FP8's scales); not a
test module."""
from __future__ import annotations

import json

import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt import checkpoint
from spmdsim.models.gpt.checkpoint import META, checkpoint_meta
from spmdsim.models.gpt.train import train

#: The GPT both modules train (dropout 0.1: its masks alike on any mesh).
TINY = GPTConfig(layers=1, d_model=32, heads=4, seq=16, batch=4)
TEXT = encode(load_text(20_000))
#: How a refusal of a resume that no reshard helps ends.
AGAIN = "resume with the settings it was saved with"
#: A pipeline's record in checkpoint.json (checkpoint_meta's `pipeline`): pp 2, 1F1B over 2 microbatches.
PIPE = {"pp": 2, "schedule": "1f1b", "microbatches": 2, "virtual": 1, "split": None}


def train_on(mesh, steps, cfg=TINY, **kw):
    """Each rank's StepResults of `train` on `mesh` (ranks, dp, tp, sp) of simulated ranks."""
    ranks, dp, tp, sp = mesh
    return spmdsim.simulate(ranks, lambda: train(cfg, spmdsim.world(), dp, tp, steps, TEXT, sp=sp, **kw)[1])


#: {(share, saved_on, saved_kw): (the whole run's first rank's StepResults, its 2-step checkpoint's directory)}:
#: the runs on `saved_on` that steps_as_whole made for an earlier case of the same `share` (a resume only reads
#: the checkpoint; the 4 whole and 2 saved steps are 3/4 of a case's steps). The directories are the first case's
#: tmp_path's, kept for the session.
_SAVED: dict = {}


def steps_as_whole(run, tmp_path, saved_on, resumed_on, saved_kw=None, resumed_kw=None, slack=1, share=None):
    """4 steps whole on `saved_on`, and 2 saved there then resumed on `resumed_on` to 4 (`run(mesh, steps, **kw)`:
    the ranks' StepResults, each rank's list): every resumed rank's steps 2 and 3 pass the check, each loss within
    the check's tolerance of the whole run's (the sums run in another order: not bit for bit; step 3's within
    `slack` times it: one update on the other mesh), and trained on (not the first step's loss). `share` names
    what `run` trains (the same for every case given it): a case saved on the same mesh with the same settings
    (zero 0, train's default, as none) as an earlier case of that name resumes from that case's runs (_SAVED).
    The whole run and the saved one run unchecked: the resumed steps' verdicts are the claim, and the check
    changes neither a loss nor a byte of the checkpoint (the same losses and files with FP8, ZeRO and pipelines)
    while it is 40% of a run's CPU."""
    saved_kw, resumed_kw = saved_kw or {}, resumed_kw or {}
    key = None if share is None else (
        share, saved_on, repr(sorted((k, v) for k, v in saved_kw.items() if (k, v) != ("zero", 0))))
    if key in _SAVED:
        whole, half = _SAVED[key]
    else:
        whole, half = run(saved_on, 4, check=False, **saved_kw)[0], str(tmp_path / "half")
        run(saved_on, 2, save=half, check=False, **saved_kw)
        if key is not None:
            _SAVED[key] = whole, half
    for resumed in run(resumed_on, 4, resume=half, **resumed_kw):
        assert [r.step for r in resumed] == [2, 3]
        assert all(r.passed for r in resumed), [(r.errors, r.tolerances) for r in resumed]
        for w, r, k in zip(whole[2:], resumed, (1, slack)):
            assert abs(r.loss - w.loss) <= k * r.tolerances[0] * abs(w.loss), (r.step, r.loss, w.loss)
            assert r.loss != pytest.approx(whole[0].loss, rel=1e-3)


def error_line(run):
    """The SpmdsimError's line `run()` raised, or None."""
    try:
        run()
    except SpmdsimError as e:
        return str(e)
    return None


def written_meta(where, step=2, **kw):
    """A checkpoint.json of checkpoint_meta(**kw) at `step` in `where` (its metadata alone: what a refusal reads)."""
    where.mkdir(exist_ok=True)
    args = {"cfg": TINY, "world": 4, "dp": 2, "tp": 2, **kw}
    meta = checkpoint_meta(args.pop("cfg"), args.pop("world"), args.pop("dp"), args.pop("tp"), **args)
    (where / META).write_text(json.dumps({"format": checkpoint._FORMAT, "version": checkpoint._VERSION,
                                          "step": step, **meta, "regions": {}}))
    return str(where)
