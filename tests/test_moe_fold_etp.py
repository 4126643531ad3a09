"""Megatron-Core's parallel folding with the experts' own tp between 1 and tp (spmdsim.models.moe.fold): attention's
tp as the two mesh axes ("tp", "etp"), the experts split over ("ep", "tp") and each over "etp"; the groups, the
layouts, the layer and the GPT's steps against one numpy process, the trace's collectives and the refusals
(docs/howto/experts-folding.md)."""
from __future__ import annotations

import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.layouts.layout import Layout
from spmdsim.models.axes import model_layout, tensor_axes, tensor_entry, tensor_size
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.layouts import DIALECTS, dialect_layouts, megatron_layouts, mesh_problem, written
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.models.moe import MoEConfig
from spmdsim.models.moe.fold import Fold, fold_of, fold_problem, mesh_ep, split_problem

TEXT = encode(load_text(20_000))
SPLIT = ("dp", "ep", "tp", "etp")
SMALL = dict(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.1)


def test_tp_is_two_mesh_axes_only_for_an_etp_between_1_and_tp():
    assert model_layout(4, 1, 2, etp=2) == ((1, 2, 2, 2), SPLIT)
    assert model_layout(4, 1, 2, etp=1) == model_layout(4, 1, 2, etp=4) == model_layout(4, 1, 2) == \
        ((1, 2, 4), ("dp", "ep", "tp"))
    assert model_layout(8, 1, 1, pp=2, etp=2) == ((2, 1, 1, 4, 2), ("pp",) + SPLIT)
    L = Layout((1, 2, 2, 2), SPLIT)
    assert tensor_axes(SPLIT) == tensor_entry(SPLIT) == ("tp", "etp") and tensor_size(L) == 4
    assert tensor_entry(("dp", "tp")) == "tp" and tensor_size(Layout((2, 4), ("dp", "tp"))) == 4
    # the experts' ep (what --ep counts) -> the mesh's "ep" axis: divided by the tp ranks folded in
    assert (mesh_ep(4, 4, 2), mesh_ep(8, 4, 1), mesh_ep(4, 4, 4), mesh_ep(4, 4, 0)) == (2, 2, 4, 4)


def test_the_fold_groups_ranks_as_megatron_cores_expert_rank_generator():
    """16 ranks: attention's tp 4 x dp 4 (tp the 4 consecutive ranks), the experts' etp 2 x ep 4 x edp 2 with
    etp fastest, then ep (Megatron-Core's expert RankGenerator): rank r is etp rank r % 2 of ep rank r // 2 % 4
    of edp rank r // 8."""
    L = Layout((2, 2, 2, 2), SPLIT)
    fold = fold_of(L, 2)
    assert fold == Fold(("ep", "tp"), ("etp",), ("dp",), 4, 2, 2, True)
    for r in range(16):
        assert L.group_members(r, ("tp", "etp")) == tuple(range(r // 4 * 4, r // 4 * 4 + 4))
        assert L.group_members(r, fold.etp_axes) == (r - r % 2, r - r % 2 + 1)
        assert L.group_members(r, fold.ep_axes) == tuple(r // 8 * 8 + r % 2 + 2 * i for i in range(4))
        assert L.group_members(r, fold.edp_axes) == (r % 8, r % 8 + 8)
    # the tokens inside the layer: the batch over every axis but etp (capacity), or tp's share of the sequence
    assert fold.token_map(SPLIT, False) == (None, ("dp", "ep", "tp"), None)
    assert fold.token_map(SPLIT, True) == ("tp", ("dp", "ep"), None)
    # etp 1 and etp = tp on the same mesh: every tp axis folded, or none
    assert fold_of(L, 1)[:2] == (("ep", "tp", "etp"), ()) and fold_of(L, 4)[:2] == (("ep",), ("tp", "etp"))


def test_the_experts_are_split_by_expert_over_ep_and_tp_and_by_column_over_etp():
    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=8, etp=2))
    L = Layout((1, 2, 2, 2), SPLIT)
    layouts = megatron_layouts(cfg, L)
    assert layouts["h1.moe.w1"] == L(("ep", "tp"), None, "etp") and layouts["h1.moe.b1"] == L(("ep", "tp"), "etp")
    assert layouts["h1.moe.w2"] == L(("ep", "tp"), "etp", None) and layouts["h1.moe.b2"] == L(("ep", "tp"), None)
    # attention, the dense MLP and the embedding over both tp axes, "tp" major
    assert layouts["h0.mlp.w1"] == L(None, ("tp", "etp")) and layouts["h1.attn.wo"] == L(("tp", "etp"), None)
    assert layouts["wte"] == L(("tp", "etp"), None) and layouts["h1.moe.router"] == L(None, None)
    for dialect in DIALECTS:  # each dialect writes the plan and reads back the same layouts
        assert dialect_layouts(cfg, L, dialect) == layouts, dialect
    assert written("dtensor", "expert w1", 3, SPLIT, True) == "R,S(0),S(0),S(2)"
    assert written("jax", "columns", 2, SPLIT) == (None, ("tp", "etp"))


@pytest.mark.parametrize("dropless", [False, True])
def test_the_layer_and_its_gradients_match_the_reference(dropless):
    """dp 1 x ep 2 x tp 2 x etp 2: each "tp" rank routes its share of the batch (dropless: of each sequence's
    tokens) to experts over the 4 ranks of ("ep", "tp"), each column- then row-parallel over etp's 2 ranks: the
    output, the losses and every gradient as one numpy process's."""
    from test_moe import _close, _on_ranks, _reference

    moe = MoEConfig(experts=4, top_k=2, capacity_factor=0.75, dropless=dropless, aux_loss_coeff=0.5,
                    z_loss_coeff=0.25, etp=2)
    p, x, g, results = _on_ranks(moe, (1, 2, 2, 2))
    out, loss, grads, dx, cache = _reference(moe, p, x, g)
    assert dropless or cache["routing"].dropped > 0
    for rank, (got_out, got_loss, got_grads, got_dx, stats, names) in enumerate(results):
        assert _close(got_out, out) and abs(got_loss - loss) <= 1e-12 * abs(loss)
        assert _close(got_dx, dx)
        for name in grads:
            assert _close(got_grads[name], grads[name]), name
        assert stats[0].group == tuple(rank % 2 + 2 * i for i in range(4))  # ("ep", "tp"), etp's copies apart
        assert {"allgather", "allreduce", "alltoall"} <= set(names) and ("alltoallv" in names) == dropless


def test_every_byte_of_the_layer_leaves_through_a_traced_step_on_the_experts_groups():
    """The dispatch and combine: Alltoalls over the 4 ranks of ("ep", "tp"), each way and back; fc2's product
    summed over etp's 2 ranks (an Allreduce); the output gathered over "tp"'s 2 ranks, and in the backward the
    tokens' gradient, pending over etp (fc1's input gradient: the conjugate of fc2's sum), gathered alike and
    summed over etp with the input's other gradients (here the leaf's own Allreduce)."""
    from test_moe import D, T
    from test_moe_fold import _trace_rows

    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, etp=2)
    rows = _trace_rows(moe, (1, 2, 2, 2))
    exchanges = [r for r in rows if r[1].startswith(("h1 dispatch", "h1 combine"))]
    assert [r[0] for r in exchanges] == ["alltoall"] * 4 and {r[2] for r in exchanges} == {4}
    sums = [r for r in rows if "experts fc2" in r[1]]
    assert [(r[0], r[2]) for r in sums] == [("allreduce", 2)]
    gathers = [r for r in rows if r[0] == "allgather"]
    assert [(r[2], r[3]) for r in gathers] == [(2, T * D * 8)] * 2  # its one sequence's output, its gradient
    assert [r[2] for r in rows if r[1].startswith("gradient bucket")] == [4, 2]  # the router's; the input's


@pytest.mark.parametrize("dp, ep, dropless, sp, zero", [(1, 2, False, False, 1), (1, 2, True, True, 2),
                                                         (2, 1, False, True, 0)])
def test_moe_gpt_steps_with_etp_2_beside_tp_4_match_one_numpy_process(dp, ep, dropless, sp, zero):
    """`ep` is the mesh's "ep" axis: the experts' expert-parallel size is ep x tp / etp = 2 ep. Each rank holds
    8 / (2 ep) experts, half of each one's columns; ZeRO shards their states over edp = dp alone."""
    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=8, top_k=2, capacity_factor=1.0, dropless=dropless, etp=2))
    results = spmdsim.simulate(dp * ep * 4, lambda: train(cfg, spmdsim.world(), dp, 4, 2, TEXT, ep=ep, sp=sp,
                                                          zero=zero)[1])
    for steps in results:
        assert [r.step for r in steps] == [0, 1]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    assert len({tuple(r.loss for r in steps) for steps in results}) == 1
    mine = results[0][0].experts
    held, Dm, F = 8 // (2 * ep), 32, 128
    assert (mine.held, mine.tp) == (held, 2) and mine.params == held * (Dm * F + F + F * Dm + 2 * Dm) // 2 * 8
    assert mine.states == 2 * mine.params // (dp if zero else 1)
    assert results[0][0].dispatch[0].group == tuple(range(0, 2 * ep * 2, 2))[:2 * ep]


def test_pipelined_steps_with_etp_2_match_one_numpy_process():
    """pp 2 x (dp 1 x ep 1 x tp 4): each stage's experts over its ("ep", "tp") ranks 2 apart, etp 2."""
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = GPTConfig(**dict(SMALL, layers=4), moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, etp=2))

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 4, 2, TEXT, ep=1, microbatches=2)
        run.close()
        return results

    out = spmdsim.simulate(8, main)
    for rank, results in enumerate(out):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), (rank, [r.errors for r in results])
        first = rank // 4 * 4 + rank % 2
        assert {s.group for s in results[0].dispatch} == {(first, first + 2)}


def test_a_checkpoint_of_etp_2_resumes_bit_for_bit_and_on_another_etp_resharded(tmp_path):
    """Saved after step 1 on dp 2 x ep 1 x tp 4 with etp 2, resumed for step 2: the loss of the run that never
    stopped; resumed with the experts over tp (no "etp" axis): resharded, each step checked
    (tests/test_gpt_reshard.py); with another number of experts too: one line naming the field."""
    from spmdsim.models.gpt.checkpoint import checkpoint_problem

    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, etp=2))
    run = lambda steps, **kw: spmdsim.simulate(8, lambda: [r.loss for r in train(  # noqa: E731
        cfg, spmdsim.world(), 2, 4, steps, TEXT, ep=1, **kw)[1]])[0]
    whole = run(2)
    assert run(1, save=str(tmp_path)) == whole[:1] and run(2, resume=str(tmp_path)) == whole[1:]
    split_over_tp = GPTConfig(**SMALL, moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0))
    assert checkpoint_problem(split_over_tp, 8, 2, 4, 2, ep=1, resume=str(tmp_path)) is None
    more = GPTConfig(**SMALL, moe=MoEConfig(experts=8, top_k=2, capacity_factor=1.0))
    assert checkpoint_problem(more, 8, 2, 4, 2, ep=1, resume=str(tmp_path)) == (
        f"--resume {tmp_path}: the checkpoint's config has moe.experts 4, this run's 8 (resume with the settings "
        "it was saved with)")


def test_sizes_that_do_not_fold_are_refused_in_one_line():
    assert fold_problem(4, 3) == ("etp 3 with tp 4: the experts' tensor-parallel size must divide tp (4): "
                                  "attention's tp ranks split into the experts' etp and a part folded into their ep "
                                  "(Megatron-Core's parallel folding)")
    assert fold_problem(4, 8) is not None and fold_problem(8, 2, 8) is None
    assert fold_problem(8, 2, 6) == ("etp 2 folds attention's tp 8 ranks into the experts' ep: ep 6 must be a "
                                     "multiple of tp / etp = 4")
    cfg = GPTConfig(**dict(SMALL, batch=4), moe=MoEConfig(experts=8, etp=2))
    assert mesh_problem(cfg, 1, 4, False, 4) == ("batch 4 is not divisible by edp 1 x ep 8 = 8 (etp 2: each tp "
                                                 "rank routes its own share)")
    assert mesh_problem(GPTConfig(**SMALL, moe=MoEConfig(experts=6, etp=2)), 1, 4, False, 2) == \
        "experts 6 are not divisible by ep 4 (experts are split over ep)"
    assert mesh_problem(GPTConfig(**SMALL, moe=MoEConfig(experts=8, hidden=6, etp=4)), 1, 8, False, 1) == \
        "the experts' hidden width 6 is not divisible by etp 4"
    sizes = {"dp": 1, "ep": 2, "tp": 4}
    assert split_problem(("dp", "ep", "tp"), sizes, 2) == (
        "etp 2 with tp 4 needs attention's tp as two mesh axes, 'tp' 2 and 'etp' 2 "
        "(spmdsim.models.axes.model_layout); got the axes ('dp', 'ep', 'tp') of sizes (1, 2, 4)")
    assert split_problem(SPLIT, dict(sizes, tp=2, etp=2), 1) is not None
    assert split_problem(SPLIT, dict(sizes, tp=2, etp=2), 2) is None


def test_a_mesh_whose_tp_is_one_axis_is_refused_for_etp_2_before_any_collective():
    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=8, etp=2))

    def main():
        mesh = spmdsim.Mesh(Layout((1, 2, 4), ("dp", "ep", "tp")), spmdsim.world())
        try:
            train(cfg, spmdsim.world(), 1, 4, 1, TEXT, ep=2, mesh=mesh)
        except SpmdsimError as e:
            return str(e)

    said = set(spmdsim.simulate(8, main))
    assert len(said) == 1 and "needs attention's tp as two mesh axes, 'tp' 2 and 'etp' 2" in said.pop()


@pytest.mark.parametrize("flags, message", [
    (["--tp", "4", "--etp", "3", "--ep", "2"], "--etp 3: etp 3 with tp 4: the experts' tensor-parallel size must "
                                               "divide tp (4)"),
    (["--tp", "4", "--etp", "2", "--ep", "1"], "--etp 2: etp 2 folds attention's tp 4 ranks into the experts' ep: "
                                               "ep 1 must be a multiple of tp / etp = 2"),
])
def test_the_examples_bad_foldings_are_refused_in_one_line(flags, message):
    from test_moe import _example
    from testkit import unfold

    out = _example(["--ranks", "8", "--steps", "1"] + flags)
    assert out.returncode == 2 and message in unfold(out.stderr).strip().splitlines()[-1], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("flags, division", [
    (["--tp", "4", "--etp", "2", "--ep", "4", "--pp", "2"],
     "--ep 4 must divide the 2 ranks left (world size 8 / pp 2 x etp 2)"),
    (["--tp", "2", "--etp", "1", "--ep", "8", "--pp", "2"],
     "--ep 8 must divide the 4 ranks left (world size 8 / pp 2)"),
    (["--tp", "2", "--ep", "3", "--pp", "2"], "--ep 3 must divide the 2 ranks left (world size 8 / pp 2 x tp 2)"),
])
def test_an_ep_the_stage_cannot_take_says_a_division_that_holds(flags, division):
    """The experts' groups take a stage's ranks over their own tp (etp), not attention's: the line said "the 2 ranks
    of world size 8 / pp 2 x tp 4" (which is 1) for --etp 2 --tp 4, "/ pp 2 x tp 2" for --etp 1."""
    from test_moe import _example
    from testkit import unfold

    out = _example(["--ranks", "8", "--steps", "1"] + flags)
    assert out.returncode == 2 and unfold(out.stderr).strip().splitlines()[-1].endswith(division), out.stderr
