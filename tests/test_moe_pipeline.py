"""The MoE GPT over a pipeline (spmdsim.models.gpt.pipeline with cfg.moe): every step against one numpy process
microbatch by microbatch, the router losses on the stage that holds each MoE layer, the experts' gradients
summed over dp alone, a dry run's ledger against a real step's, and the refusals (docs/howto/experts.md)."""
from __future__ import annotations

import dataclasses

import pytest

import spmdsim
from docs_commands import run_example
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt.train import TOLERANCE

TEXT = encode(load_text(20_000))
SMALL = dict(layers=4, d_model=32, heads=2, seq=16, batch=8, dropout=0.1)


def _moe(dropless=False, **kwargs):
    from spmdsim.models.moe import MoEConfig

    # the router losses' weights raised from Switch's and ST-MoE's so that their gradients count in the check
    return MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless, aux_loss_coeff=0.5,
                     z_loss_coeff=0.1, **kwargs)


def _steps(cfg, pp, dp, ep, tp, steps=2, dry_run=False, **kwargs):
    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), pp, dp, tp, steps, TEXT, ep=ep, **kwargs)
        rows = sorted({(e.op, e.axes) for e in run.trace.entries})
        run.close()
        return results, rows

    return spmdsim.simulate(pp * dp * ep * tp, main, dry_run=dry_run)


@pytest.mark.parametrize("dropless", [False, True])
@pytest.mark.parametrize("pp, dp, ep, tp, schedule, m, v, stages", [
    (2, 1, 2, 2, "1f1b", 4, 1, ({"h1"}, {"h3"})),  # stage 0 holds h0-h1, stage 1 h2-h3
    (2, 2, 2, 1, "interleaved", 2, 2, (set(), {"h1", "h3"})),  # chunks h0, h1, h2, h3 on stages 0, 1, 0, 1
    (2, 2, 2, 1, "gpipe", 2, 1, ({"h1"}, {"h3"})),
])
def test_pipelined_moe_steps_match_one_numpy_process(pp, dp, ep, tp, schedule, m, v, stages, dropless):
    cfg = GPTConfig(**SMALL, moe=_moe(dropless))
    out = _steps(cfg, pp, dp, ep, tp, schedule=schedule, microbatches=m, virtual=v)
    per_stage = dp * ep * tp
    for rank, (results, rows) in enumerate(out):
        assert [r.step for r in results] == [0, 1]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), (rank, [r.errors for r in results])
        stats = results[0].dispatch
        assert {s.layer for s in stats} == stages[rank // per_stage]  # each MoE layer on its own stage
        assert all(s.rank == rank and rank in s.group for s in stats)  # ranks on the whole mesh
        assert len(stats) == m * len(stages[rank // per_stage])  # one dispatch per layer and microbatch
        assert all(s.dropped == 0 for s in stats) or not dropless
        if stages[rank // per_stage] and dp > 1:  # experts' gradients over dp alone, the others' over dp x ep
            assert ("allreduce", ("dp",)) in rows and ("allreduce", ("dp", "ep")) in rows
    assert len({tuple(r.loss for r in results) for results, _ in out}) == 1
    # the step's tokens: every microbatch's k x seq assignments per sequence, counted once per tp group
    layer = "h3"
    assignments = sum(s.assignments for results, _ in out for s in results[0].dispatch
                      if s.layer == layer and s.rank % tp == 0)
    assert assignments == 2 * cfg.seq * cfg.batch
    if not dropless:  # Switch's capacity drops some of a step's assignments at this size
        assert sum(s.dropped for results, _ in out for s in results[0].dispatch) > 0


def test_a_pipelined_dry_runs_expert_bytes_equal_a_real_steps():
    """With a capacity the bytes do not depend on the routing: each stage's ledger (expert memory, dispatch
    buffers, bytes sent by the exchanges) and its step's bytes in the dry run equal a real step's."""
    cfg = GPTConfig(**SMALL, moe=_moe())
    real = _steps(cfg, 2, 1, 2, 2, steps=1, microbatches=4, check=False)
    dry = _steps(cfg, 2, 1, 2, 2, steps=1, microbatches=4, dry_run=True)
    for rank in (0, 4):  # the dry run's representatives: each stage's first rank
        r, d = real[rank][0][0], dry[rank][0][0]
        assert r.experts.routing == "router" and d.experts.routing == "balanced"
        assert dataclasses.replace(d.experts, routing="router") == r.experts
        assert r.experts.layers == 1 and r.experts.calls == 4 * 4  # 4 microbatches x (dispatch, combine) x 2
        assert d.bytes_sent == r.bytes_sent and d.calls == r.calls


@pytest.mark.parametrize("kwargs, message", [
    (dict(microbatches=8), "a microbatch of 1 sample is not divisible by dp 1 x ep 2 = 2"),
])
def test_pipelined_moe_refusals_are_one_line_on_every_rank(kwargs, message):
    cfg = GPTConfig(**SMALL, moe=_moe())

    def main():
        try:
            train_pipelined(cfg, spmdsim.world(), 2, 1, 1, 1, TEXT, ep=2, **kwargs)
        except SpmdsimError as e:
            return str(e)
        return None

    said = spmdsim.simulate(4, main)
    assert len(set(said)) == 1 and message in said[0] and "pp 2 x dp 1 x ep 2 x tp 1" in said[0], said
    assert "\n" not in said[0]


@pytest.mark.parametrize("example, args, said", [
    ("train_moe_gpt", ["--ranks", "8", "--ep", "2", "--pp", "2"],
     "a microbatch of 2 samples is not divisible by dp 2 x ep 2 = 4: expected --microbatches 2 (microbatches of 4 "
     "samples), or --batch 16 (--microbatches 4: the default, 2 x pp)"),
    ("train_moe_gpt", ["--ranks", "16", "--ep", "8", "--pp", "2", "--microbatches", "4"],
     "not divisible by dp 1 x ep 8 = 8: expected --microbatches 1 (one microbatch of 8 samples), or --batch 32"),
    ("train_moe_gpt", ["--ranks", "8", "--pp", "2"],  # each split alike: the way out said once
     "ep 1: a microbatch of 2 samples is not divisible by dp 4): expected --microbatches 2 (microbatches of 4 "
     "samples), or --batch 16 (--microbatches 4: the default, 2 x pp); it runs on 2 or 4 ranks"),
    ("train_gpt", ["--ranks", "8", "--pp", "4", "--dp", "2", "--tp", "1", "--schedule", "interleaved", "--batch", "4",
                   "--microbatches", "4", "--layers", "8"],
     "a microbatch of 1 sample is not divisible by dp 2: expected --batch 8: no --microbatches (a multiple of pp 4) "
     "splits batch 4 into microbatches of a multiple of 2")])
def test_a_microbatch_the_ranks_cannot_split_names_the_flags_that_fix_it(example, args, said) -> None:
    """`train_moe_gpt.py --ranks 8 --ep 2 --pp 2` refused "a microbatch of 2 samples is not divisible by dp 2 x
    ep 2 = 4", naming neither --microbatches nor --batch (the 2 x pp default microbatches were never written)."""
    out = run_example(f"examples/{example}.py", *args, "--steps", "1")  # in this process, as python runs it
    assert out.returncode == 2 and out.stdout.count("\n") <= 1, out.stdout
    error = " ".join(out.stderr.split())
    assert error.count("spmdsim: error:") == 1 and said in error, error
