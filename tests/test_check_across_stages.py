"""SPMDSIM_CHECK across a pipeline's stages (spmdsim.runtime.debug_calls.agree).

The divergence guard compares a call number that counts every collective a rank issued: it must agree among
ranks that run one program, not among a pipeline's stages, which make their own numbers of collectives on their
own groups. Before a collective the stages share inside a step (clipping's Allreduce over pp) their counters
agree on the largest, so the guard no longer refuses a correct pipeline (it did: pp 2 x tp 2 eagerly, pp 2 x dp 2
replayed), and a rank that skips a call inside its stage is still named.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.nn import ops
from spmdsim.errors import RuntimeMismatchError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.nn.optim import clip_grad_norm_
from spmdsim.runtime import debug, debug_calls
from spmdsim.runtime.collectives import allreduce


@pytest.fixture(autouse=True)
def _settings():
    debug._reset()
    yield
    debug._reset()


@pytest.mark.parametrize("pp, dp, tp, zero, replay, steps", [(2, 1, 2, 0, False, 1), (2, 2, 1, 1, True, 2)])
def test_a_clipped_pipeline_passes_the_divergence_guard(pp, dp, tp, zero, replay, steps):
    """Stage 1 makes more collectives than stage 0 before the clip's Allreduce over pp (its loss's sums): the guard
    refused the correct step ("rank 2 calls allreduce on ('pp',) ... (seq 34) but rank 0 ... (seq 32)"), eagerly
    and in a replayed step (where the stages' Python checks do not run again)."""
    cfg = GPTConfig(layers=2, d_model=16, heads=2, seq=8, batch=4, dropout=0.0, clip=0.05)

    def main():
        debug.configure(check=True)
        run, results = train_pipelined(cfg, spmdsim.world(), pp, dp, tp, steps, encode(load_text(20_000)),
                                       microbatches=2, zero=zero, replay=replay)
        run.close()
        return [r.passed for r in results]

    assert spmdsim.simulate(pp * dp * tp, main) == [[True] * steps] * (pp * dp * tp)


def _stages(skip: bool) -> list:
    """A (pp 2, dp 2) mesh, each stage's (dp 2, tp 1): stage 0 makes one collective on its group of one (tp),
    stage 1 three (with `skip`, its second rank two: a rank that took another path), then each clips its
    parameter's gradient by the joint norm over both stages (an Allreduce over dp, then one over pp)."""
    def main():
        debug.configure(check=True)
        mesh = Mesh(Layout((2, 2), ("pp", "dp")), spmdsim.world())
        stage = Mesh(Layout((2, 1), ("dp", "tp")), mesh.group("dp"))
        p = DTensor.from_global(stage, np.full(4, 1.0 + mesh.coords[0]), stage.layout(None)).requires_grad_()
        ops.sum(ops.mul(p, p)).backward()
        calls = 1 if mesh.coords[0] == 0 else 3 - (skip and mesh.coords[1] == 1)
        for _ in range(calls):
            allreduce(stage, np.ones(1), "tp")  # numbered, nothing sent
        norm = clip_grad_norm_([p], 1.0, across=(mesh, ("pp",)))
        mesh.close()
        return norm

    return spmdsim.simulate(4, main)


def test_stages_that_made_different_numbers_of_calls_clip_together():
    # The gradients 2 and 4 on four elements each: the joint norm sqrt(4 * 4 + 4 * 16). It was refused: "rank 2
    # calls allreduce on ('pp',) float64 (1,) (seq 5) but rank 0 calls allreduce on ('pp',) float64 (1,) (seq 3)".
    assert _stages(False) == [pytest.approx(np.sqrt(80.0))] * 4


def test_a_rank_that_skips_a_call_inside_its_stage_is_still_named():
    # Rank 3's Allreduce over dp (the clip's, within its stage) is its call one number behind rank 2's.
    with pytest.raises(RuntimeMismatchError, match=r"collectives diverge: rank 3 calls allreduce on \('dp',\) "
                                                   r"float64 \(1,\) \(seq 3\) but rank 2 calls allreduce on "
                                                   r"\('dp',\) float64 \(1,\) \(seq 4\)"):
        _stages(True)


def test_the_stages_counters_agree_with_the_watchdog_alone_and_nothing_runs_with_neither_hook():
    """The watchdog's report groups the ranks waiting in one call by its number, so the stages' counters agree
    with the watchdog on and the check off too (debug_calls.agree did nothing then); with neither hook on, no
    collective runs, unless `always` (a pipelined step's end, which evens them every step as its own inline
    Allreduce did)."""
    from spmdsim.base.context import current

    def main(watchdog, always):
        if watchdog:
            debug.configure(watchdog=60)
        current().seq = 3 * spmdsim.world().rank  # the stages' own counts
        debug_calls.agree(spmdsim.world(), ("pp",), False, always)
        return current().seq

    assert spmdsim.simulate(2, main, True, False) == [3, 3]
    assert spmdsim.simulate(2, main, False, False) == [0, 3]
    assert spmdsim.simulate(2, main, False, True) == [3, 3]
