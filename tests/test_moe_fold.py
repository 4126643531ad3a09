"""Megatron-Core's parallel folding (spmdsim.models.moe.fold): experts with their own tensor-parallel size, etp 1
beside attention's tp, their ep over ep x tp ranks; the layer and the GPT's steps against one numpy process, the
token moves in the trace, the experts' gradient and optimizer groups, and the refusals
(docs/howto/experts-folding.md)."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.layouts.layout import Layout
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.layouts import DIALECTS, dialect_layouts, megatron_layouts, mesh_problem, written
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.models.moe import MoEConfig
from spmdsim.models.moe.fold import fold_of, fold_problem, mesh_ep

TEXT = encode(load_text(20_000))


def test_the_fold_names_the_experts_axes_as_megatron_core_groups_its_ranks():
    """Megatron-Core's expert RankGenerator (tp=etp, ep, dp=edp; tp fastest) over the ranks attention's (tp, dp)
    uses: with etp 1 rank r is expert-parallel rank r % ep of expert-data-parallel group r // ep."""
    L = Layout((2, 2, 2), ("dp", "ep", "tp"))
    fold = fold_of(L, 1)
    assert fold.ep_axes == ("ep", "tp") and fold.etp_axes == () and fold.edp_axes == ("dp",)
    assert (fold.ep, fold.etp, fold.edp, fold.folded) == (4, 1, 2, True)
    for r in range(8):
        assert L.group_members(r, fold.ep_axes).index(r) == r % 4
        assert L.group_members(r, fold.edp_axes) == (r % 4, r % 4 + 4)
    same = fold_of(L, 0)
    assert same == fold_of(L, 2) and (same.ep_axes, same.etp_axes, same.ep, same.etp) == (("ep",), ("tp",), 2, 2)
    assert not same.folded and mesh_ep(4, 2, 1) == 2 and mesh_ep(4, 2, 2) == 4


def test_the_experts_weights_are_split_by_expert_over_ep_and_tp_each_whole():
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=8, moe=MoEConfig(experts=8, etp=1))
    L = Layout((2, 2, 2), ("dp", "ep", "tp"))
    layouts = megatron_layouts(cfg, L)
    assert layouts["h1.moe.w1"] == L(("ep", "tp"), None, None)
    assert layouts["h1.moe.w2"] == L(("ep", "tp"), None, None)
    assert layouts["h1.moe.b1"] == L(("ep", "tp"), None) and layouts["h1.moe.b2"] == L(("ep", "tp"), None)
    assert layouts["h0.mlp.w1"] == L(None, "tp") and layouts["h1.moe.router"] == L(None, None)
    unfolded = megatron_layouts(GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=8, moe=MoEConfig(experts=8)), L)
    assert unfolded["h1.moe.w1"] == L("ep", None, "tp")
    for dialect in DIALECTS:  # each dialect writes the folded plan and reads back the same layouts
        assert dialect_layouts(cfg, L, dialect) == layouts, dialect
    assert written("dtensor", "expert w1", 3, ("dp", "ep", "tp"), True) == "R,S(0),S(0)"


@pytest.mark.parametrize("mesh_shape, dropless", [((1, 2, 2), False), ((2, 1, 2), False), ((1, 1, 2), False),
                                                   ((1, 1, 4), False), ((1, 2, 2), True), ((2, 1, 2), True),
                                                   ((1, 1, 2), True)])
def test_the_folded_layer_and_its_gradients_match_the_reference(mesh_shape, dropless):
    """Each tp rank routes its own share of the batch (dropless: of each sequence's tokens) to experts spread
    over ep x tp ranks: the output, the losses and every gradient as one numpy process's; the tokens' moves are
    an Allgather over tp (the output, and in the backward the tokens' gradient) and no Allreduce over tp of the
    experts' fc2 output."""
    from test_moe import _close, _on_ranks, _reference

    moe = MoEConfig(experts=4, top_k=2, capacity_factor=0.75, dropless=dropless, aux_loss_coeff=0.5,
                    z_loss_coeff=0.25, etp=1)
    p, x, g, results = _on_ranks(moe, mesh_shape)
    out, loss, grads, dx, cache = _reference(moe, p, x, g)
    assert dropless or cache["routing"].dropped > 0
    for got_out, got_loss, got_grads, got_dx, stats, names in results:
        assert _close(got_out, out) and abs(got_loss - loss) <= 1e-12 * abs(loss)
        assert _close(got_dx, dx)
        for name in grads:
            assert _close(got_grads[name], grads[name]), name
        assert len(stats[0].group) == mesh_shape[1] * mesh_shape[2]  # the dispatch's group: ep x tp ranks
        assert "allgather" in names and "alltoall" in names and ("alltoallv" in names) == dropless


def _trace_rows(moe, mesh_shape):
    """Rank 0's trace rows (op, label, group size, bytes sent) of the folded layer's forward and backward on a
    (dp, ep, tp) mesh, or with four sizes a (dp, ep, tp, etp) one (the experts' columns over "etp")."""
    from test_moe import _params
    from spmdsim.nn import ops
    from spmdsim.models.moe.layer import moe_layer
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.trace import collect_trace
    from test_moe import B, D, T

    p, x, _ = _params(moe)
    inner = "etp" if len(mesh_shape) == 4 else None
    maps = {"router": (None, None), "w1": (("ep", "tp"), None, inner), "b1": (("ep", "tp"), inner),
            "w2": (("ep", "tp"), inner, None), "b2": (("ep", "tp"), None)}

    def run():
        mesh = spmdsim.Mesh(spmdsim.Layout(mesh_shape, ("dp", "ep", "tp", "etp")[:len(mesh_shape)]), spmdsim.world())
        L = mesh.layout
        params = {n: DTensor.from_global(mesh, v, L(*maps[n.split(".")[-1]])).requires_grad_() for n, v in p.items()}
        xd = DTensor.from_global(mesh, x.reshape(B, T, D).transpose(1, 0, 2), L(None, ("dp", "ep"), None))
        with collect_trace() as trace:
            y, losses = moe_layer(xd.requires_grad_(), params, "h1.", moe)
            ops.resolved(ops.sum(y) + losses).backward()
        return [(e.op, e.label or "", e.group_size, e.bytes_sent) for e in trace.entries]

    return spmdsim.simulate(int(np.prod(mesh_shape)), run)[0]


def test_every_byte_of_the_folded_layer_leaves_through_a_traced_step_on_the_expert_groups():
    """On dp 1 x ep 2 x tp 2 with etp 1: the dispatch and combine are Alltoalls over the 4 ranks of ep x tp,
    each way and back; the output gathered over tp's 2 ranks (forward), the tokens' gradient alike
    (backward); no collective over tp sums an expert's product."""
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, etp=1)
    rows = _trace_rows(moe, (1, 2, 2))
    exchanges = [r for r in rows if r[1].startswith(("h1 dispatch", "h1 combine"))]
    assert [r[0] for r in exchanges] == ["alltoall"] * 4 and {r[2] for r in exchanges} == {4}
    gathers = [r for r in rows if r[0] == "allgather"]
    assert len(gathers) == 2 and {r[2] for r in gathers} == {2}
    assert not [r for r in rows if "experts fc" in r[1]]
    from test_moe import D, T

    assert gathers[0][3] == T * D * 8  # each rank sends its one sequence (of its tp group's two): T x D float64s


SMALL = dict(layers=2, d_model=16, heads=4, seq=8, batch=8, dropout=0.1)


@pytest.mark.parametrize("dp, ep, tp, dropless, zero", [(2, 2, 2, False, 1), (1, 2, 4, True, 0),
                                                         (2, 1, 2, False, 0), (1, 2, 2, True, 2)])
def test_folded_moe_gpt_steps_match_one_numpy_process(dp, ep, tp, dropless, zero):
    """`ep` is the mesh's "ep" axis: the experts' expert-parallel size is ep x tp. ZeRO shards the experts'
    states over their expert-data-parallel group dp alone, the dense layers' over dp x ep."""
    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=8, top_k=2, capacity_factor=1.0, dropless=dropless, etp=1))
    results = spmdsim.simulate(dp * ep * tp, lambda: train(cfg, spmdsim.world(), dp, tp, 2, TEXT, ep=ep,
                                                           zero=zero)[1])
    for steps in results:
        assert [r.step for r in steps] == [0, 1]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    assert len({tuple(r.loss for r in steps) for steps in results}) == 1
    mine = results[0][0].experts  # rank 0's experts: 8 / (ep x tp) of them, each whole (etp 1)
    held, Dm, F = 8 // (ep * tp), 16, 64
    assert (mine.held, mine.tp) == (held, 1) and mine.params == held * (Dm * F + F + F * Dm + Dm) * 8
    assert mine.states == 2 * mine.params // (dp if zero else 1)  # AdamW's two moments, sharded over edp = dp
    # (at ep 1 the experts and the dense layers share ZeRO's group, dp: one bucket, its slices across both)


@pytest.mark.parametrize("flags, message", [
    (["--tp", "4", "--etp", "3", "--ep", "2"], "--etp 3: etp 3 with tp 4: the experts' tensor-parallel "
                                               "size must divide tp (4)"),
    (["--tp", "4", "--etp", "1", "--ep", "2"], "--etp 1: etp 1 folds attention's tp 4 ranks into the experts' ep: ep 2 "
                                               "must be a multiple of tp 4"),
    (["--tp", "2", "--etp", "0"], "--etp 0 must be at least 1"),
])
def test_bad_foldings_are_refused_in_one_line_before_any_collective(flags, message):
    from test_moe import _example
    from testkit import unfold

    out = _example(["--ranks", "8", "--steps", "1"] + flags)
    assert out.returncode == 2 and message in unfold(out.stderr).strip().splitlines()[-1], out.stderr
    assert "Traceback" not in out.stderr


def test_a_folded_mesh_the_model_does_not_fit_is_refused_in_one_line():
    moe = MoEConfig(experts=8, etp=1)
    cfg = GPTConfig(**dict(SMALL, batch=4), moe=moe)
    assert mesh_problem(cfg, 2, 2, False, 2) == ("batch 4 is not divisible by edp 2 x ep 4 = 8 (etp 1: each tp "
                                                 "rank routes its own share)")
    assert mesh_problem(GPTConfig(**SMALL, moe=MoEConfig(experts=6, etp=1)), 1, 2, False, 2) == \
        "experts 6 are not divisible by ep 4 (experts are split over ep)"
    assert fold_problem(4, 3) is not None and fold_problem(4, 4) is None and fold_problem(2, 1, 3) is not None
    with pytest.raises(SpmdsimError, match="MoEConfig etp -1 must be an integer >= 0"):
        MoEConfig(etp=-1)


def test_folded_dropless_experts_take_sequence_parallel_tokens_as_they_are():
    """With sp the tokens reach the MoE layer split over tp on the sequence: folded dropless experts route them
    so (no Allgather before, none after, as Megatron's dispatcher meets them); with a capacity, or unfolded, the
    layer takes them whole on tp. The GPT's steps with sp pass their check either way."""
    from spmdsim.models.moe.tokens import takes
    from spmdsim.runtime.dtensor import DTensor

    mesh_layout = Layout((1, 2, 2), ("dp", "ep", "tp"))

    def answers():
        mesh = spmdsim.Mesh(mesh_layout, spmdsim.world())
        sp = DTensor.from_global(mesh, np.zeros((8, 4, 16)), mesh.layout("tp", "ep", None))
        whole = DTensor.from_global(mesh, np.zeros((8, 4, 16)), mesh.layout(None, "ep", None))
        moe = MoEConfig(experts=8, dropless=True, etp=1)
        return (takes(sp, moe), takes(whole, moe), takes(sp, MoEConfig(experts=8, etp=1)),
                takes(sp, MoEConfig(experts=8, dropless=True)))

    assert set(spmdsim.simulate(4, answers)) == {(True, False, False, False)}
    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=8, top_k=2, dropless=True, etp=1))
    results = spmdsim.simulate(8, lambda: train(cfg, spmdsim.world(), 1, 4, 2, TEXT, sp=True, ep=2)[1])
    assert all(r.passed and max(r.errors) <= TOLERANCE for steps in results for r in steps)


@pytest.mark.parametrize("dropless, schedule, m, v", [(False, "1f1b", 2, 1), (True, "interleaved", 2, 2)])
def test_folded_pipelined_moe_steps_match_one_numpy_process(dropless, schedule, m, v):
    """pp 2 x (dp 1 x ep 2 x tp 2): each stage folds its tp into its experts' ep (4 ranks), the experts' Alltoalls
    over the stage's own ("ep", "tp") group; every step as one numpy process's."""
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=8 if not dropless else 4, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless, etp=1))

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 2, 2, TEXT, ep=2, schedule=schedule,
                                       microbatches=m, virtual=v)
        run.close()
        return results

    out = spmdsim.simulate(8, main)
    for rank, results in enumerate(out):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), (rank, [r.errors for r in results])
        for s in results[0].dispatch:  # the stage's 4 ranks, attention's tp among them
            assert s.group == tuple(range(rank // 4 * 4, rank // 4 * 4 + 4))
    assert len({tuple(r.loss for r in results) for results in out}) == 1


def test_a_folded_microbatch_the_tp_ranks_cannot_share_is_refused_before_any_collective():
    """With a capacity each tp rank routes whole sequences of its own: a microbatch of 2 samples over edp 1 x ep
    4 was refused by the layer, inside the pipeline's first forward; now by the trainer, on every rank alike."""
    from spmdsim.models.gpt.pipeline import train_pipelined
    from spmdsim.models.gpt.pipeline_problems import pipeline_layout_problem

    cfg = GPTConfig(layers=4, d_model=32, heads=2, seq=16, batch=4, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, etp=1))
    said = "a microbatch of 2 samples is not divisible by edp 1 x ep 4 = 4 (etp 1: each tp rank routes its own share)"
    assert pipeline_layout_problem(cfg, 2, 1, 2, False, 2, ep=2) == said

    def main():
        try:
            train_pipelined(cfg, spmdsim.world(), 2, 1, 2, 1, TEXT, ep=2, microbatches=2)
        except SpmdsimError as e:
            return str(e)

    assert set(spmdsim.simulate(8, main)) == {f"the GPT cannot train on pp 2 x dp 1 x ep 2 x tp 2: {said}"}
