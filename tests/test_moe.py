"""Mixture of experts (spmdsim.models.moe): routing, the layer on simulated ranks against the numpy reference,
the MoE GPT's steps against one numpy process, and the refusals (docs/howto/experts.md)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.layouts import mesh_problem
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.models.moe import MoEConfig, dispatch_rows, gates_backward, route
from spmdsim.models.moe.reference import moe_backward, moe_forward

TEXT = encode(load_text(20_000))


def _example(argv: list) -> subprocess.CompletedProcess:
    """`python examples/train_moe_gpt.py ARGV` on simulated ranks (`--ranks N`), in this process as
    docs_commands.run_example runs it: exit code, stdout and stderr as the command's (a fresh interpreter per
    command cost a Python start and spmdsim's imports, ~0.5 CPU-s, for the same run)."""
    from docs_commands import run_example

    assert "--ranks" in argv, argv  # simulated ranks: no MPI in this process
    return run_example("examples/train_moe_gpt.py", *argv)


#: {argv: the run} for a command two tests run alike (the --capacity-factor 4 run both huge factors compare with).
_RUNS: dict = {}


def _example_once(argv: list):
    key = tuple(argv)
    if key not in _RUNS:
        _RUNS[key] = _example(argv)
    return _RUNS[key]


# ---- routing (pure) ----

def test_an_experts_capacity_stops_at_the_tokens_of_a_sequence():
    """A token's k choices are k different experts, so slots past T stay empty: C = min(T, ceil(k T F / E)). A
    huge factor asked numpy for buffers no machine holds (1e17) or an int too large for C (1e300, 1.7e308: k T F
    overflows to inf)."""
    def capacity(factor, experts=8, top_k=2):
        return MoEConfig(experts=experts, top_k=top_k, capacity_factor=factor).capacity(16)

    assert [capacity(f) for f in (0.01, 1.0, 1.25, 3.99)] == [1, 4, 5, 16]
    assert [capacity(f) for f in (4.0, 5.0, 1e17, 1e300, 1.7e308)] == [16] * 5  # E / k = 4 or more: no drops
    assert capacity(1.25, experts=2) == 16  # every token to both experts: 20 slots would stay empty
    assert MoEConfig(experts=8, capacity_factor=1e300, dropless=True).capacity(16) == 32  # dropless: k T


def test_ties_go_to_the_lower_expert_and_first_choices_fill_slots_first():
    probs = np.full((1, 4, 4), 0.25)  # every token ties between all experts
    r = route(probs, 2, capacity=3)
    assert r.experts[0].tolist() == [[0, 1]] * 4
    # expert 0: first choices of tokens 0..2 take its 3 slots; token 3's first choice is dropped
    assert r.slots[0, :, 0].tolist() == [0, 1, 2, -1]
    # expert 1: only second choices, in position order
    assert r.slots[0, :, 1].tolist() == [0, 1, 2, -1]
    assert r.dropped == 2 and r.counts.tolist() == [[4, 4, 0, 0]]
    assert np.allclose(r.gates, 0.5)


def test_second_choices_wait_for_every_first_choice():
    # token 0 picks (1, 0); tokens 1, 2 pick expert 0 first: their first choices come before token 0's second
    probs = np.array([[[0.3, 0.6, 0.05, 0.05], [0.7, 0.1, 0.1, 0.1], [0.8, 0.1, 0.05, 0.05]]])
    r = route(probs, 2, capacity=2)
    assert r.experts[0, 0].tolist() == [1, 0]
    assert r.slots[0, 1, 0] == 0 and r.slots[0, 2, 0] == 1 and r.slots[0, 0, 1] == -1


@pytest.mark.parametrize("top_k, capacity, message", [
    (1, 2.5, "route: capacity 2.5 must be an integer >= 1"),
    (1, 2.0, "route: capacity 2.0 must be an integer >= 1"),
    (1, None, "route: capacity None must be an integer >= 1"),
    (2.0, 2, "route: top_k 2.0 must be the integer 1 or 2 and at most the 4 experts"),
    (True, 2, "route: top_k True must be the integer 1 or 2"),
])
def test_route_refuses_a_capacity_or_top_k_that_is_not_an_integer_in_one_line(top_k, capacity, message):
    """A capacity of 2.5 kept three slots (0, 1, 2: the test is slot >= capacity) in a Routing of capacity 2,
    so dispatch_rows put an expert's third slot on the next expert's first: two assignments on one row of the
    send buffer, a silently wrong dispatch. top_k 2.0 (== 2) failed later as a slice index, None and True
    as numpy or comparison tracebacks. planned (a dry run's) checks the same."""
    from spmdsim.models.moe.routing import planned

    probs = np.random.default_rng(0).dirichlet(np.ones(4), size=(1, 8))
    for call in (lambda: route(probs, top_k, capacity), lambda: planned(1, 8, 4, top_k, capacity, "balanced")):
        with pytest.raises(SpmdsimError) as info:
            call()
        assert str(info.value).startswith(message) and "\n" not in str(info.value)
    r = route(probs, np.int64(1), np.int64(2))  # numpy integers are integers
    assert r.capacity == 2 and type(r.capacity) is int and r.slots.max() == 1


def test_dispatch_rows_are_a_permutation_of_the_kept_assignments():
    rng = np.random.default_rng(1)
    p = rng.random((3, 10, 4))
    p /= p.sum(-1, keepdims=True)
    for dropless in (False, True):
        r = route(p, 2, 20 if dropless else 4)
        rows, total, per = dispatch_rows(r, dropless)
        kept = rows[r.kept]
        assert len(set(kept.tolist())) == kept.size and kept.max() < total
        assert per.sum() == (total if dropless else 3 * 4 * 4)
        if dropless:  # sorted by expert: each expert's rows are one block of its count
            starts = np.cumsum(per) - per
            assert all(starts[e] <= row < starts[e] + per[e] for e, row in zip(r.experts[r.kept], kept))


def test_capacity_slots_are_destination_major_so_the_send_buffer_leaves_as_it_is():
    """With a capacity, the slots are (ep, S, E / ep, C): each ep rank's share (its experts' slots, sequence
    by sequence) is one block of the buffer, in the order the dispatch's Alltoall delivers; ep 1 is (S, E, C)."""
    rng = np.random.default_rng(3)
    p = rng.random((3, 10, 4))
    r = route(p / p.sum(-1, keepdims=True), 2, 4)
    S, C, E = 3, 4, 4
    seq = np.broadcast_to(np.arange(S)[:, None, None], r.slots.shape)[r.kept]
    e, slot = r.experts[r.kept], r.slots[r.kept]
    for ep in (1, 2, 4):
        rows, total, _ = dispatch_rows(r, False, ep)
        El = E // ep
        at = rows[r.kept]
        assert total == S * E * C and (rows[~r.kept] == -1).all()
        assert (at // (S * El * C) == e // El).all()  # in its destination's block
        assert (at % (S * El * C) == ((seq * El + e % El) * C + slot)).all()  # (S, El, C) inside it
    assert (dispatch_rows(r, False, 1)[0][r.kept] == (seq * E + e) * C + slot).all()
    with pytest.raises(SpmdsimError, match="ep 3 must be a positive divisor of the 4 experts"):
        dispatch_rows(r, False, 3)


def test_gate_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    p = rng.random((2, 5, 4)) + 0.1
    dg = rng.standard_normal((2, 5, 2))
    r = route(p, 2, 10)
    d = gates_backward(p, r, dg)
    for idx in [(0, 1, r.experts[0, 1, 0]), (1, 3, r.experts[1, 3, 1])]:
        q = p.copy()
        q[idx] += 1e-7
        up = (route(q, 2, 10).gates * dg).sum()
        q[idx] -= 2e-7
        down = (route(q, 2, 10).gates * dg).sum()
        assert abs((up - down) / 2e-7 - d[idx]) < 1e-6


def test_a_reference_follows_another_routing_only_where_rounding_can_explain_it():
    """followed: token 0's experts 0 and 1 tie within their margins, so the ranks' 1 is taken; token 1's
    expert 1 trails by more than the margins, so the reference keeps its own 0 (a wrong choice still fails the
    check); token 2 asks for an expert out of range. Top-2: the order within the choice is held to the same."""
    from spmdsim.models.moe.routing import followed

    logits = np.array([[[1.0, 1.0 - 1e-12, 0.0, -1.0], [1.0, 0.5, 0.0, -1.0], [1.0, 0.5, 0.0, -1.0]]])
    margin = np.full(logits.shape, 1e-11)
    own = np.zeros((1, 3, 1), dtype=np.int64)
    assert followed(logits, margin, own, np.array([[[1], [1], [7]]])).tolist() == [[[1], [0], [0]]]
    own2 = np.array([[[0, 1], [0, 1], [0, 1]]])
    follow2 = np.array([[[1, 0], [1, 0], [0, 2]]])
    assert followed(logits, margin, own2, follow2).tolist() == [[[1, 0], [0, 1], [0, 1]]]
    with pytest.raises(SpmdsimError, match="must be"):
        followed(logits, margin, own, np.zeros((1, 2, 1)))


def test_a_crafted_near_tie_in_the_router_does_not_fail_a_correct_moe_gpt_step(monkeypatch):
    """Every MoE layer's router with expert 1's weights one unit in the last place from expert 0's: each token's
    two scores tie to rounding, and the ranks' sums (their blocks) and the reference's (whole rows) decided
    some of them otherwise, so a correct step failed its check by 1e-2 in the gradients (fp64, 1e-10 allowed).
    The reference now follows the ranks' experts where rounding alone can explain them (followed)."""
    import spmdsim.models.gpt.parallel as parallel

    class Tied(parallel.GPT):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for name, t in self.params.items():
                if name.endswith("moe.router"):
                    w0 = t.local[:, 0].copy()
                    t.local[:, 1] = np.nextafter(w0, np.where(np.arange(len(w0)) % 2, np.inf, -np.inf))
                    t.local[:, 2:] = w0[:, None] * 0.5

    monkeypatch.setattr(parallel, "GPT", Tied)
    for top_k, dropless in ((1, True), (2, False)):
        cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=8, dropout=0.1,
                        moe=MoEConfig(experts=8, top_k=top_k, dropless=dropless, capacity_factor=1.0))

        def run():
            model, results = train(cfg, spmdsim.world(), 1, 1, 1, TEXT, ep=4)
            model.mesh.close()
            return results[0]

        for r in spmdsim.simulate(4, run):
            assert r.passed and max(r.errors) <= TOLERANCE, (top_k, r.errors)


# ---- bad inputs: one line each, before any collective ----

@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": 3}, "top_k 3 must be 1 or 2"),
    ({"capacity_factor": 0}, "capacity_factor 0 must be a finite number > 0"),
    ({"capacity_factor": -0.5}, "capacity_factor -0.5 must be"),
    ({"experts": 0}, "experts 0 must be an integer >= 1"),
    ({"experts": 1, "top_k": 2}, "top_k 2 must not exceed experts 1"),
])
def test_bad_moe_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(SpmdsimError, match=message) as info:
        MoEConfig(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("flags, message", [
    (["--top-k", "3"], "--top-k 3 must be 1 or 2 (experts per token)"),
    (["--experts", "1", "--top-k", "2"], "--top-k 2 must not exceed --experts 1"),
    (["--capacity-factor", "0"], "--capacity-factor 0 must be a finite number > 0 (or --dropless)"),
    (["--moe-every", "0"], "--moe-every 0 must be at least 1"),
    # --dropless has no capacity: a factor typed beside it was ignored, exit 0 (its default is not refused)
    (["--dropless", "--capacity-factor", "2"], "--capacity-factor 2 sets the experts' capacity, which --dropless "
                                               "removes: give one of them, not both"),
])
def test_the_examples_moe_flags_are_refused_by_their_names(flags, message):
    # "MoEConfig top_k 3 must be 1 or 2", "MoEConfig capacity_factor 0.0 ...": fields, where a flag was typed
    from testkit import unfold

    out = _example(["--ranks", "2", "--steps", "1"] + flags)
    assert out.returncode == 2 and unfold(out.stderr).strip().splitlines()[-1] == f"spmdsim: error: {message}", \
        out.stderr


def test_a_moe_every_past_the_layers_is_refused_not_run_as_a_dense_gpt_that_reports_experts():
    """MoEConfig(every=3) on a 2-layer GPTConfig made no block an MoE layer: the example trained a dense GPT and
    printed its experts, capacity and mesh of experts (--moe-every 3 --layers 2); every <= layers runs."""
    from testkit import unfold

    with pytest.raises(SpmdsimError) as info:
        GPTConfig(layers=2, d_model=16, heads=4, moe=MoEConfig(every=3))
    assert str(info.value) == ("GPTConfig moe every 3 makes none of the 2 layers an MoE layer (the first would be "
                               "block 2, counted from 0); expected every at most layers 2, or moe=None for a dense "
                               "GPT")
    assert GPTConfig(layers=3, d_model=16, heads=4, moe=MoEConfig(every=3)).is_moe(2)
    out = _example(["--ranks", "4", "--ep", "2", "--steps", "1", "--layers", "2", "--d-model", "16", "--seq",
                    "8", "--moe-every", "3", "--dispatch"])
    assert out.returncode == 2 and "MoE GPT" not in out.stdout and "experts" not in out.stdout, out.stdout
    assert unfold(out.stderr).strip().splitlines()[-1] == (
        "spmdsim: error: --moe-every 3 makes none of the 2 blocks an MoE layer (the first would be h2); expected "
        "at most --layers 2"), out.stderr


def test_too_large_moe_every_on_one_layer_says_the_only_block():
    """--layers 1 with --moe-every 2 said "makes none of the 1 blocks an MoE layer"."""
    from testkit import unfold

    out = _example(["--ranks", "2", "--steps", "1", "--layers", "1", "--d-model", "16", "--seq", "8",
                    "--moe-every", "2"])
    assert out.returncode == 2 and unfold(out.stderr).strip().splitlines()[-1] == (
        "spmdsim: error: --moe-every 2 makes no MoE layer of the only block (the first would be h1); expected at "
        "most --layers 1"), out.stderr
    with pytest.raises(SpmdsimError, match="makes no MoE layer of the only layer"):
        GPTConfig(layers=1, d_model=16, heads=4, moe=MoEConfig(every=2))


def test_a_bad_zero_stage_is_refused_before_the_example_prints_its_model():
    """--zero 2 (once not a stage it ran) printed the model, its experts and mesh and the steps' header, then
    train's refusal."""
    out = _example(["--ranks", "4", "--steps", "1", "--layers", "2", "--d-model", "16", "--seq", "8",
                    "--zero", "4"])
    assert out.returncode == 2 and "MoE GPT" not in out.stdout and " step" not in out.stdout, out.stdout
    from testkit import unfold

    assert unfold(out.stderr).strip().splitlines()[-1].startswith("spmdsim: error: --zero 4 is not 0, 1, 2 or 3"), \
        out.stderr


@pytest.mark.parametrize("flags, message", [
    (["--pp", "2", "--virtual-stages", "2"], "the 1f1b schedule holds one chunk per stage, got virtual stages 2"),
    (["--pp", "3", "--ranks", "6", "--layers", "3"],
     "batch 8 is not divisible by 6 microbatches (the default at --pp 3: 2 x pp)"),
    (["--pp", "3", "--ranks", "6"], "--layers 2 cannot fill --pp 3 stages: each stage needs a layer at least"),
    (["--schedule", "interleaved"], "--schedule interleaved interleaves 2 model chunks a stage (the default "
                                    "--virtual-stages) over the pipeline's stages: expected --pp 2 or "
                                    "more, got --pp 1")])
def test_a_schedule_the_sizes_do_not_fit_is_refused_before_the_example_prints_its_model(flags, message):
    """--pp 2 --virtual-stages 2 (1f1b takes one chunk a stage) printed the model, its experts and the pipeline's
    line, then the schedule's refusal; the default microbatches' (2 x pp) was named as if the user gave it."""
    from testkit import unfold

    ranks = [] if "--ranks" in flags else ["--ranks", "4"]
    layers = [] if "--layers" in flags else ["--layers", "2"]
    out = _example(ranks + layers + ["--ep", "2", "--steps", "1", "--d-model", "16", "--seq", "8"] + flags)
    assert out.returncode == 2 and "MoE GPT" not in out.stdout and "pipeline" not in out.stdout, out.stdout
    assert message in unfold(out.stderr), out.stderr


def test_experts_not_divisible_by_ep_are_refused_on_every_rank_before_a_collective():
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=8, moe=MoEConfig(experts=6))
    assert mesh_problem(cfg, 2, 1, False, 4) == "experts 6 are not divisible by ep 4 (experts are split over ep)"

    def run():
        try:
            train(cfg, spmdsim.world(), 2, 1, 1, TEXT, ep=4)
        except SpmdsimError as e:
            return str(e)
    errors = spmdsim.simulate(8, run)
    assert len(set(errors)) == 1 and "experts 6 are not divisible by ep 4" in errors[0]


# ---- the layer on simulated ranks ----

D, T, B = 8, 6, 4
LAYER = MoEConfig(experts=4, top_k=1, capacity_factor=1.0, aux_loss_coeff=0.5, z_loss_coeff=0.25)


def _params(moe, zero_router=False, seed=0):
    rng = np.random.default_rng(seed)
    E, F = moe.experts, 2 * D
    p = {"h1.moe.router": np.zeros((D, E)) if zero_router else rng.standard_normal((D, E)),
         "h1.moe.w1": rng.standard_normal((E, D, F)) * 0.3, "h1.moe.b1": rng.standard_normal((E, F)) * 0.1,
         "h1.moe.w2": rng.standard_normal((E, F, D)) * 0.3, "h1.moe.b2": rng.standard_normal((E, D)) * 0.1}
    x = rng.standard_normal((B * T, D))
    g = rng.standard_normal((B * T, D))
    return p, x, g


def _on_ranks(moe, mesh_shape, zero_router=False, algorithm=None, algorithms=None):
    """Each rank: (output block, loss value, every gradient whole, its MoEStats) of loss = sum(y * g) +
    router losses, with x batch-first rows in the reference; plus the trace's op names (testkit's)."""
    from testkit import moe_layer_on_ranks

    p, x, g = _params(moe, zero_router)
    algorithms = algorithms or ({"alltoall": algorithm} if algorithm else None)
    return p, x, g, moe_layer_on_ranks(moe, mesh_shape, p, x, g, B, algorithms)


def _reference(moe, p, x, g):
    out, cache = moe_forward(p, "h1.", x, B, moe)
    loss = float((out * g).sum()) + moe.aux_loss_coeff * cache["aux"] + moe.z_loss_coeff * cache["z"]
    grads = {}
    dx = moe_backward(p, "h1.", g, cache, moe, grads)
    return out, loss, grads, dx, cache


def _close(a, b):
    return float(np.max(np.abs(a - b))) <= 1e-12 * max(1.0, float(np.max(np.abs(b))))


@pytest.mark.parametrize("x_map, mesh_shape", [
    ((None, "dp", None), (2, 2, 1)),  # the batch copied over ep: the aux loss counted each token twice
    ((None, None, None), (1, 2, 1)),  # the whole batch on every ep rank: the same
    (("tp", "ep", None), (1, 2, 2)),  # each sequence split over tp: halves routed and capped as sequences
    ((None, "ep", "tp"), (1, 2, 2)),  # features split over tp: a numpy ValueError from the experts' product
])
def test_an_input_not_laid_out_as_the_layer_needs_is_refused_in_one_line(x_map, mesh_shape):
    """moe_layer routes each rank's block sequence by sequence and sums the aux loss's counts over the axes
    other than tp, so its input must have its batch split over exactly those axes and be whole otherwise.
    Before, the first two ran and returned the load-balancing loss doubled (2.049 for the reference's 1.024),
    the third a wrong output (1.37 off) and smaller losses, the fourth a numpy traceback."""
    from spmdsim.nn import ops
    from spmdsim.models.moe.layer import moe_layer
    from spmdsim.runtime.dtensor import DTensor

    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, aux_loss_coeff=1.0, z_loss_coeff=0.0)
    p, x, _ = _params(moe)
    maps = {"router": (None, None), "w1": ("ep", None, "tp"), "b1": ("ep", "tp"), "w2": ("ep", "tp", None),
            "b2": ("ep", None)}

    def run(tensor_map):
        mesh = spmdsim.Mesh(spmdsim.Layout(mesh_shape, ("dp", "ep", "tp")), spmdsim.world())
        L = mesh.layout
        params = {n: DTensor.from_global(mesh, v, L(*maps[n.split(".")[-1]])) for n, v in p.items()}
        xd = DTensor.from_global(mesh, x.reshape(B, T, D).transpose(1, 0, 2), L(*tensor_map))
        try:
            return float(ops.resolved(moe_layer(xd, params, "h1.", moe)[1]).local)
        except SpmdsimError as e:
            return str(e)

    aux = _reference(moe, p, x, np.zeros_like(x))[4]["aux"]
    assert all(abs(a - aux) <= 1e-12 for a in spmdsim.simulate(int(np.prod(mesh_shape)),
                                                                lambda: run((None, ("dp", "ep"), None))))
    errors = spmdsim.simulate(int(np.prod(mesh_shape)), lambda: run(x_map))
    assert len(set(errors)) == 1 and isinstance(errors[0], str), errors
    assert "\n" not in errors[0] and "the MoE layer's input (tokens, batch, features) is laid out" in errors[0]
    want = '("dp", "ep")' if mesh_shape[0] > 1 else '"ep"'
    assert errors[0].endswith(f"nothing else split or pending: (None, {want}, None)"), errors[0]
    if x_map == (None, "dp", None):  # the line docs/howto/experts.md quotes
        import pathlib

        doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "howto" / "experts.md").read_text()
        assert "\n" + errors[0] + "\n" in doc, errors[0]


@pytest.mark.parametrize("mesh_shape", [(1, 4, 1), (2, 2, 1), (1, 2, 2), (1, 1, 2)])
@pytest.mark.parametrize("dropless", [False, True])
def test_the_layer_and_its_gradients_match_the_reference(mesh_shape, dropless):
    """At ep 1 (every expert on each tp rank) the dispatch and combine exchange nothing: no Alltoall(v), not
    even on a group of one rank (the dropless layer's Alltoallv was made there, traced with group size 1)."""
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=0.75, dropless=dropless, aux_loss_coeff=0.5,
                    z_loss_coeff=0.25)
    p, x, g, results = _on_ranks(moe, mesh_shape)
    out, loss, grads, dx, cache = _reference(moe, p, x, g)
    assert dropless or cache["routing"].dropped > 0  # the capacity really drops
    for got_out, got_loss, got_grads, got_dx, _, names in results:
        assert _close(got_out, out) and abs(got_loss - loss) <= 1e-12 * abs(loss)
        assert _close(got_dx, dx)
        for name in grads:  # the router's gradient carries the aux loss's and z-loss's
            assert _close(got_grads[name], grads[name]), name
        assert ("alltoallv" in names) == (dropless and mesh_shape[1] > 1)
        assert ("alltoall" in names) == (mesh_shape[1] > 1)


def test_a_router_sending_every_token_to_one_expert_drops_and_shows_the_imbalance():
    """A zero router ties every expert: every token's first choice is expert 0 (the lower index). With a
    capacity of ceil(6 / 4) = 2 slots per sequence, 4 of each sequence's 6 tokens are dropped, and every
    rank's tokens go to rank 0 (expert 0's); dropless keeps them all and still equals one process."""
    from spmdsim.models.moe.report import dispatch_lines, token_matrix

    p, x, g, results = _on_ranks(LAYER, (1, 4, 1), zero_router=True)
    out, loss, _, _, cache = _reference(LAYER, p, x, g)
    assert cache["routing"].dropped == B * (T - 2)
    stats = [r[4] for r in results]
    assert sum(s.dropped for per in stats for s in per) == B * (T - 2)
    assert token_matrix(stats, "h1", 4) == [[2, 0, 0, 0]] * 4  # one sequence per rank, 2 slots kept
    lines = dispatch_lines(stats, "h1", 4, 1)
    assert "  tokens per expert: e0:8 e1:0 e2:0 e3:0" in lines
    assert any(line.startswith("  dropped: 16 of 24 assignments (66.7%)") for line in lines)
    assert all(len(line) <= 100 for line in lines)
    assert all(_close(r[0], out) and abs(r[1] - loss) <= 1e-12 * abs(loss) for r in results)
    dropless = MoEConfig(experts=4, top_k=1, dropless=True, aux_loss_coeff=0.5, z_loss_coeff=0.25)
    p, x, g, results = _on_ranks(dropless, (1, 4, 1), zero_router=True)
    out, loss, _, _, cache = _reference(dropless, p, x, g)
    assert cache["routing"].dropped == 0
    assert token_matrix([r[4] for r in results], "h1", 4) == [[T, 0, 0, 0]] * 4
    assert all(_close(r[0], out) and abs(r[1] - loss) <= 1e-12 * abs(loss) for r in results)


@pytest.mark.parametrize("algorithm", ["pairwise", "bruck"])
def test_dispatch_and_combine_run_as_an_emulated_algorithm(algorithm):
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0)
    p, x, g, results = _on_ranks(moe, (1, 4, 1), algorithm=algorithm)
    out, loss, grads, dx, _ = _reference(moe, p, x, g)
    for got_out, got_loss, got_grads, got_dx, _, names in results:
        assert f"alltoall[{algorithm}]" in names
        assert _close(got_out, out) and _close(got_dx, dx) and _close(got_grads["h1.moe.w1"], grads["h1.moe.w1"])


@pytest.mark.parametrize("mesh_shape", [(1, 4, 1), (2, 2, 2)])
def test_a_dropless_dispatch_as_the_pairwise_alltoallv_equals_the_engines_bit_for_bit(mesh_shape):
    """Dropless, the counts' Alltoall and the tokens' Alltoallv (dispatch, combine and their backward) run
    as the pairwise exchange: the output, loss and every gradient are the engine's, bit for bit."""
    moe = MoEConfig(experts=4, top_k=2, dropless=True, aux_loss_coeff=0.5, z_loss_coeff=0.25)
    engine = _on_ranks(moe, mesh_shape)[3]
    pairwise = _on_ranks(moe, mesh_shape, algorithms={"alltoall": "pairwise", "alltoallv": "pairwise"})[3]
    for (out, loss, grads, dx, _, _), (p_out, p_loss, p_grads, p_dx, _, names) in zip(engine, pairwise):
        assert "alltoallv[pairwise]" in names and "alltoall[pairwise]" in names and "alltoallv" not in names
        assert p_out.tobytes() == out.tobytes() and p_loss == loss and p_dx.tobytes() == dx.tobytes()
        assert all(p_grads[n].tobytes() == grads[n].tobytes() for n in grads)


# ---- the MoE GPT, each step against one numpy process ----

SMALL = dict(layers=2, d_model=16, heads=4, seq=8, batch=4, dropout=0.1)


@pytest.mark.parametrize("dp, ep, tp, sp, dropless", [(1, 4, 1, False, False), (2, 2, 2, False, True),
                                                     (1, 2, 2, True, False), (1, 2, 2, False, True)])
def test_moe_gpt_steps_match_one_numpy_process(dp, ep, tp, sp, dropless):
    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless))
    results = spmdsim.simulate(dp * ep * tp, lambda: train(cfg, spmdsim.world(), dp, tp, 2, TEXT, sp=sp, ep=ep)[1])
    for steps in results:
        assert [r.step for r in steps] == [0, 1]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    assert len({tuple(r.loss for r in steps) for steps in results}) == 1
    dropped = sum(s.dropped for steps in results for s in steps[0].dispatch)
    assert (dropped == 0) == dropless


def test_expert_gradients_are_summed_over_dp_only():
    """On dp 2 x ep 2 x tp 2 the experts' gradients are one Allreduce over dp (2 ranks); the other layers'
    over dp x ep (4 ranks): the trace's gradient Allreduces have both group sizes."""
    from spmdsim.runtime.trace import collect_trace

    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=4, top_k=2))

    def run():
        from spmdsim.models.gpt.parallel import GPT
        from spmdsim.runtime.dtensor import DTensor
        from spmdsim.models.gpt import batch

        mesh = spmdsim.Mesh(spmdsim.Layout((2, 2, 2), ("dp", "ep", "tp")), spmdsim.world())
        model = GPT(cfg, mesh)
        x, y = batch(TEXT, cfg, 0)
        L = mesh.layout(("dp", "ep"), None)
        loss = model.loss(DTensor.from_global(mesh, x, L), DTensor.from_global(mesh, y, L), 0)
        with collect_trace() as trace:
            loss.backward(bucket=True)
        return sorted({(e.op, e.axes) for e in trace.entries if e.op == "allreduce"})
    seen = spmdsim.simulate(8, run)[0]
    assert ("allreduce", ("dp",)) in seen and ("allreduce", ("dp", "ep")) in seen


# ---- the dry run: routing by rule, the experts' bytes (spmdsim.models.moe.ledger) ----

def test_planned_routings_balance_or_pile_onto_the_first_experts():
    from spmdsim.models.moe.routing import planned

    balanced = planned(2, 8, 4, 2, capacity=4, how="balanced")
    assert balanced.counts.tolist() == [[4, 4, 4, 4]] * 2 and balanced.dropped == 0  # T k / E each
    assert (balanced.experts[..., 0] != balanced.experts[..., 1]).all()
    worst = planned(2, 8, 4, 2, capacity=4, how="worst")
    assert worst.counts.tolist() == [[8, 8, 0, 0]] * 2 and worst.dropped == 2 * 2 * 4
    assert np.allclose(worst.gates, 0.5)
    with pytest.raises(SpmdsimError, match="planned routing 'even' is not one of 'balanced', 'worst'"):
        planned(1, 4, 4, 1, 4, "even")
    with pytest.raises(SpmdsimError, match="MoEConfig dry_routing 'even' is not one of"):
        MoEConfig(dry_routing="even")


def _layer_bytes(moe, mesh_shape, p, x, dry):
    """Rank 0's MoEStats and its dispatch and combine trace rows (op, label, bytes sent, received) of the
    layer's forward and backward on `x` (B * T, D), for real or in a dry run."""
    from spmdsim.nn import ops
    from spmdsim.models.moe.layer import moe_layer
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.trace import collect_trace

    maps = {"router": (None, None), "w1": ("ep", None, "tp"), "b1": ("ep", "tp"), "w2": ("ep", "tp", None),
            "b2": ("ep", None)}

    def run():
        mesh = spmdsim.Mesh(spmdsim.Layout(mesh_shape, ("dp", "ep", "tp")), spmdsim.world())
        L = mesh.layout
        params = {n: DTensor.from_global(mesh, v, L(*maps[n.split(".")[-1]])).requires_grad_() for n, v in p.items()}
        xd = DTensor.from_global(mesh, x.reshape(B, T, D).transpose(1, 0, 2), L(None, ("dp", "ep"), None))
        stats = []
        with collect_trace() as trace:
            y, losses = moe_layer(xd.requires_grad_(), params, "h1.", moe, stats)
            ops.resolved(ops.sum(y) + losses).backward()
        rows = [(e.op, e.label, e.bytes_sent, e.bytes_received) for e in trace.entries
                if e.label and e.label.startswith(("h1 dispatch", "h1 combine"))]
        return stats, rows

    return spmdsim.simulate(int(np.prod(mesh_shape)), run, dry_run=dry)[0]


@pytest.mark.parametrize("dropless", [False, True])
@pytest.mark.parametrize("mesh_shape", [(1, 4, 1), (2, 2, 2)])
def test_a_dry_runs_dispatch_bytes_equal_a_real_runs_routed_alike(dropless, mesh_shape):
    """The dry run's planned routings against real runs whose router routes the same way: a zero router
    (every tie to the lower experts: "worst"), and tokens whose features pick expert (t k + j) mod E
    through an identity router ("balanced"). Rank 0's buffers, per-peer bytes and trace rows agree."""
    for how in ("worst", "balanced"):
        moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless, dry_routing=how)
        p, _, _ = _params(moe, zero_router=True)
        x = np.zeros((B * T, D))
        if how == "balanced":
            p["h1.moe.router"] = np.eye(D, moe.experts) * 4.0
            t = np.arange(B * T) % T  # the position in the sequence, as planned counts it
            x[np.arange(B * T), (2 * t) % 4] = 2.0
            x[np.arange(B * T), (2 * t + 1) % 4] += 1.0
        real_stats, real_rows = _layer_bytes(moe, mesh_shape, p, x, dry=False)
        dry_stats, dry_rows = _layer_bytes(moe, mesh_shape, p, x, dry=True)
        assert dry_stats == real_stats, how
        assert dry_rows == real_rows and len(real_rows) == 4 + dropless, how
    assert real_stats[0].per_expert == (2 * T * B // 4 // mesh_shape[1] // mesh_shape[0],) * 4


SMALL_DRY = dict(layers=2, d_model=16, heads=4, seq=8, batch=8, dropout=0.1)


@pytest.mark.parametrize("dp, ep, tp", [(1, 4, 1), (2, 2, 2)])
def test_a_dry_runs_expert_bytes_equal_a_real_runs(dp, ep, tp):
    """With a capacity the experts' memory and the dispatch's buffers and bytes do not depend on the
    routing: one real step's ledger on rank 0 equals the dry run's, and its figures are the blocks'."""
    import dataclasses

    cfg = GPTConfig(**SMALL_DRY, moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.25))

    def step():
        return train(cfg, spmdsim.world(), dp, tp, 1, TEXT, ep=ep, check=False)[1][0].experts

    real = spmdsim.simulate(dp * ep * tp, step)[0]
    dry = spmdsim.simulate(dp * ep * tp, step, dry_run=True)[0]
    assert real.routing == "router" and dry.routing == "balanced"
    assert dataclasses.replace(dry, routing="router") == real
    Dm, F, held = 16, 64, 4 // ep
    assert real.params == held * (Dm * F + F + F * Dm) * 8 // tp + held * Dm * 8
    assert real.grads == real.params and real.states == 2 * real.params  # AdamW's two moments
    C = 5  # ceil(2 x 8 x 1.25 / 4)
    assert real.send == real.received == (8 // (dp * ep)) * 4 * C * Dm * 8
    assert real.calls == 4 and all(len(line) <= 100 for line in real.lines())


@pytest.mark.parametrize("factor", ["1e17", "1e300"])
def test_the_example_runs_a_huge_capacity_factor_as_the_factor_that_drops_nothing(factor):
    """--capacity-factor 1e17 ended in numpy's ValueError (array is too big), 1e300 in OverflowError, on every
    rank: each is one slot per token of a sequence now, the steps of --capacity-factor 4 (E / k) to the bit."""
    small = ["--ranks", "4", "--ep", "2", "--tp", "2", "--steps", "2", "--layers", "2", "--d-model", "16",
             "--seq", "8", "--every", "1"]
    huge, four = _example(small + ["--capacity-factor", factor]), _example_once(small + ["--capacity-factor", "4"])
    assert huge.returncode == 0 and four.returncode == 0, huge.stderr + four.stderr
    assert (f"capacity: 8 slots per expert per sequence, one per token (factor {float(factor):g} >= 8 / 2): "
            "none dropped") in huge.stdout.splitlines()
    rows = [[line for line in out.stdout.splitlines() if line[:5].strip().isdigit()] for out in (huge, four)]
    assert len(rows[0]) == 2 and rows[0] == rows[1]
    assert "check: 2 steps vs one numpy process" in huge.stdout


@pytest.mark.parametrize("seq, factor, line", [
    ("8", "1.99", "capacity: 8 slots per expert per sequence, one per token (ceil(2 x 8 x 1.99 / 4) = 8): "
                  "none dropped"),
    ("1", "1.25", "capacity: 1 slot per expert per sequence, one per token (ceil(2 x 1 x 1.25 / 4) = 1): "
                  "none dropped"),
    ("8", "0.01", "capacity: 1 slot per expert per sequence (ceil(2 x 8 x 0.01 / 4)), the rest dropped"),
])
def test_the_examples_capacity_line_says_none_dropped_when_a_slot_per_token_is_reached_below_e_over_k(
        seq, factor, line):
    """A capacity of one slot per token drops nothing, whether the factor reached E / k or the ceiling reached
    T below it: the example said "8 slots ... (ceil(2 x 8 x 1.99 / 4)), the rest dropped" over a picture of
    0 dropped, and "1 slots" at seq 1."""
    out = _example(["--ranks", "4", "--ep", "4", "--steps", "1", "--layers", "2", "--d-model", "16", "--seq",
                    seq, "--batch", "4", "--experts", "4", "--capacity-factor", factor, "--dispatch"])
    assert out.returncode == 0, out.stderr
    assert line in out.stdout.splitlines(), out.stdout
    dropped = [ln for ln in out.stdout.splitlines() if ln.startswith("  dropped: ")]
    assert dropped and dropped[0].startswith("  dropped: 0 of") == ("none dropped" in line), dropped


def test_a_dropless_dry_run_needs_a_routing_and_a_real_run_refuses_one():
    from testkit import unfold

    small = ["--steps", "1", "--layers", "2", "--d-model", "16", "--seq", "8", "--heads", "4", "--dropless"]
    out = _example(["--ranks", "4", "--dry-run"] + small)
    assert out.returncode == 2 and unfold(out.stderr).strip() == "spmdsim: error: " + (
        "--dry-run with --dropless needs --routing balanced or --routing worst: the dry run has no values to "
        "route by, and the bytes depend on it"), out.stderr
    out = _example(["--ranks", "4", "--routing", "worst"] + small)
    assert out.returncode == 2 and "--routing worst sets a dry run's routing" in unfold(out.stderr), out.stderr


def test_a_dry_run_refuses_dispatch_whose_lines_it_does_not_show():
    out = _example(["--ranks", "4", "--dry-run", "--dispatch", "--steps", "1", "--layers", "2", "--d-model", "16",
                    "--seq", "8", "--heads", "4"])
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and said.startswith("spmdsim: error: --dispatch prints each reported step"), out.stderr
    assert "Traceback" not in out.stderr, out.stderr


DRY_64 = ["--ranks", "1024", "--dry-run", "--steps", "1", "--experts", "64", "--ep", "64", "--tp", "8",
          "--layers", "4", "--d-model", "1024", "--heads", "16", "--seq", "1024", "--batch", "128",
          "--dropless", "--routing", "worst"]


def test_a_64_expert_dry_run_on_1024_ranks_reports_the_experts_bytes():
    """64 experts of GPT-2 medium's width on 1,024 ranks (ep 64 x tp 8 x dp 2), every token to experts 0
    and 1: rank 0 holds expert 0 of each of 2 MoE layers and receives every ep peer's first choices."""
    from testkit import run_train_gpt

    out = run_train_gpt(DRY_64, script="train_moe_gpt.py",
                        after="from spmdsim.programs.memory import peak_rss\nprint('peak', peak_rss(), code)\n")
    lines = out.stdout.splitlines()
    peak = [line.split() for line in lines if line.startswith("peak ")]
    assert peak and peak[0][2] == "0", out.stdout[-2000:] + out.stderr[-2000:]
    ledger = lines[lines.index("experts on rank 0: 2 MoE layers x 1 of 64 experts, each split over tp 8; "
                               "bytes per step"):]
    Dm, F, T, k, ep, layers = 1024, 4096, 1024, 2, 64, 2
    params = layers * (Dm * F // 8 + F // 8 + F // 8 * Dm + Dm) * 8  # one expert, its hidden split over tp 8
    assert ledger[2] == f"  expert parameters {params:,}, their gradients {params:,}, optimizer states {2 * params:,}"
    send, received = layers * T * k * Dm * 8, layers * ep * T * Dm * 8  # one sequence per rank
    assert ledger[3] == f"  dispatch buffers: send {send:,}, receive {received:,}"
    assert all(len(line) <= 100 for line in ledger)
    assert int(peak[0][1]) < 1 << 30, f"peak RSS {int(peak[0][1]) >> 20} MiB"


def test_selective_and_full_recomputation_with_moe_layers_match_one_process_and_keep_less():
    """The attention core recomputed in the backward (Korthikanti et al.'s selective recomputation) beside
    MoE layers: each step still equals one numpy process, and the graph keeps no attention core's
    probabilities. Full recomputation keeps each block's input only and recomputes the block in the backward,
    routing its tokens and exchanging them again (as Megatron's does): the same losses and gradients, its router
    losses differentiated once (their gradient rides on the block's output), the dispatch figures counted once,
    the MoE layer's exchanges twice in the forward's direction."""
    from spmdsim.runtime.trace import collect_trace

    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, aux_loss_coeff=0.5,
                                           z_loss_coeff=0.1))

    def run(recompute):
        with collect_trace() as trace:
            results = train(cfg, spmdsim.world(), 1, 2, 2, TEXT, ep=2, recompute=recompute, memory=True)[1]
        return results, sum(1 for e in trace.entries if e.label == "h1 dispatch")

    (plain, sent), (selective, _), (full, again) = (spmdsim.simulate(4, run, r)[0] for r in ("none", "selective",
                                                                                             "full"))
    assert all(r.passed for r in selective) and [r.loss for r in selective] == [r.loss for r in plain]
    core = [r.memory.kept_of("attention core") for r in (plain[-1], selective[-1])]
    assert core[0] > 0 and core[1] < core[0], core
    assert all(r.passed for r in full) and [(r.loss, r.errors) for r in full] == [(r.loss, r.errors) for r in plain]
    assert [r.dispatch for r in full] == [r.dispatch for r in plain]
    assert full[-1].memory.kept_total < plain[-1].memory.kept_total / 4
    assert again == 2 * sent  # each step's dispatch, then its recomputation


def _refused(fn):
    try:
        fn()
    except SpmdsimError as e:
        return str(e)


# ---- replay (spmdsim.runtime.replay): routing, packing and unpacking as kernels ----

@pytest.mark.parametrize("dp, ep, tp, sp, dropless", [(1, 2, 2, True, False), (2, 2, 2, False, False),
                                                     (1, 4, 1, False, True), (2, 2, 2, True, True)])
def test_a_replayed_moe_gpt_step_equals_the_eager_step_bit_for_bit(dp, ep, tp, sp, dropless):
    """Step 0 is captured and steps 1-2 replay it, each checked against one numpy process as the eager steps
    are, and equal to them bit for bit (loss, calls, bytes, parameters, gradients); the dispatch figures are
    read again from each replayed step's routing. With a capacity every MoE array has a fixed shape;
    dropless, the captured arrays that receive tokens have room for the most that can come."""
    cfg = GPTConfig(**dict(SMALL, batch=2 * dp * ep), moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0,
                                                                    dropless=dropless))

    def both():
        comm = spmdsim.world()
        runs = [train(cfg, comm, dp, tp, 3, TEXT, sp=sp, ep=ep, replay=replay) for replay in (False, True)]
        (eager_model, eager), (model, replayed) = runs
        blocks = [(t.local.tobytes(), t.grad.local.tobytes()) for t in model.params.values()]
        eager_blocks = [(t.local.tobytes(), t.grad.local.tobytes()) for t in eager_model.params.values()]
        return eager, replayed, blocks == eager_blocks

    for eager, replayed, same in spmdsim.simulate(dp * ep * tp, both):
        assert same
        assert [(r.loss, r.calls, r.bytes_sent) for r in replayed] == [(r.loss, r.calls, r.bytes_sent) for r in eager]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in replayed), replayed
        assert [r.dispatch for r in replayed] == [r.dispatch for r in eager]
    # the routing changed between steps (a replay that froze step 0's would repeat its figures)
    assert len({tuple(s.per_expert for s in r.dispatch) for r in replayed}) > 1


@pytest.mark.parametrize("dropless", [False, True])
def test_at_ep_1_no_step_calls_a_collective_on_a_group_of_one(dropless):
    """dp 1 x ep 1 x tp 2: the MoE layers' dispatch and combine are the local permutation alone in eager,
    replayed and dry steps (the dropless ones made an Alltoallv over ep, a group of one rank, four a layer and
    step: traced with group size 1, numbered, its rows copied); the replayed steps equal the eager ones bit for
    bit and pass their checks."""
    from spmdsim.runtime.trace import collect_trace

    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless,
                                           dry_routing="balanced"))

    def main(replay, check=True):
        with collect_trace() as trace:
            model, results = train(cfg, spmdsim.world(), 1, 2, 2, TEXT, ep=1, replay=replay, check=check)
        alone = [(e.op, e.label) for e in trace.entries if e.group_size == 1]
        return [(r.loss, r.passed, r.calls, r.bytes_sent) for r in results], alone

    eager, replayed = (spmdsim.simulate(2, lambda: main(replay)) for replay in (False, True))
    dry = spmdsim.simulate(2, lambda: main(False, check=False), dry_run=True)
    assert eager == replayed
    assert all(passed for steps, _ in eager for _, passed, _, _ in steps)
    assert [alone for _, alone in eager + replayed + dry] == [[]] * 6


@pytest.mark.parametrize("dropless", [False, True])
def test_a_replayed_pipelined_moe_step_is_the_eager_one(dropless):
    """The router losses of each microbatch are scalar DTensors read when the step ends (GPT.chunk_blocks), so a
    replayed pipelined step (1F1B, 2 stages of ep 2) passes its check and equals the eager one bit for bit:
    losses, errors and each step's own dispatch figures (the routing changes between steps)."""
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = GPTConfig(**dict(SMALL, layers=4), moe=MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless,
                                                           aux_loss_coeff=0.5, z_loss_coeff=0.1))

    def main(replay):
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 1, 3, TEXT, microbatches=2, ep=2, replay=replay)
        run.close()
        return [(r.loss, r.passed, tuple(r.errors), tuple(r.dispatch)) for r in results]

    eager, replayed = (spmdsim.simulate(4, lambda: main(replay)) for replay in (False, True))
    assert eager == replayed
    assert all(passed for rank in replayed for _, passed, _, _ in rank)
    routed = [dispatch for rank in replayed for *_, dispatch in rank if dispatch]
    assert len({tuple(s.per_expert for s in d) for d in routed}) > 1


def test_the_pipelined_moe_example_replays_as_docs_experts_md_shows(monkeypatch):
    """train_moe_gpt.py --pp --replay passed `replay` to the unpipelined train() alone: it printed a PASS and ran
    every step eagerly. The command docs/howto/experts.md quotes runs each stage's program at step 0 alone (8 ranks, 3
    steps: 8 runs, not 24) and prints what the page quotes."""
    import spmdsim.models.gpt.pipeline as p
    from docs_commands import mismatch, quotes

    quoted = [q for q in quotes("docs/howto/experts.md") if "train_moe_gpt.py" in q.command and "--pp" in q.command
              and "--replay" in q.command]
    assert len(quoted) == 1, quoted
    words = quoted[0].command.split()[2:]
    runs, run = [], p._run_program
    monkeypatch.setattr(p, "_run_program", lambda *a, **k: runs.append(1) or run(*a, **k))
    out = _example(words)
    assert out.returncode == 0, out.stderr
    assert len(runs) == 8, out.stdout[-500:]
    assert mismatch(quoted[0].output, out.stdout) is None, out.stdout


@pytest.mark.parametrize("dropless", [False, True])
def test_generation_with_moe_layers_replays_its_first_forward_and_samples_what_one_process_samples(dropless):
    """GPT.generate captures the first character's forward with its MoE layers too (their routing, packing
    and exchanges are replay kernels) and replays it for the others: each window routes anew (capacity 0.5
    drops tokens; dropless moves that window's counts), and greedy and sampled characters equal one numpy
    process's (weights scaled up, so the characters differ and depend on the routing)."""
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.models.gpt.reference import generate, init_params
    from spmdsim.runtime import Mesh

    cfg = GPTConfig(vocab=131, vocab_pad_to=64, layers=2, d_model=16, heads=4, seq=8, batch=4,
                    moe=MoEConfig(experts=4, top_k=2, every=2, dropless=dropless, capacity_factor=0.5))
    scaled = lambda name: not name.endswith(".b")  # noqa: E731  (the biases stay zero)

    def body():
        model = GPT(cfg, Mesh(spmdsim.Layout((1, 2, 2), ("dp", "ep", "tp"))), sp=True)
        for name, t in model.params.items():
            if scaled(name):
                t.local[...] *= 20
        calls, logits = [], model.logits
        model.logits = lambda *a, **k: calls.append(1) or logits(*a, **k)
        return [model.generate(b"def ", 12, t, seed=3) for t in (0.0, 1.5)], len(calls)

    drawn, forwards = spmdsim.simulate(4, body)[0]
    params = {name: p * 20 if scaled(name) else p for name, p in init_params(cfg).items()}
    assert forwards == 2  # one captured forward per call; the other 11 characters replayed
    for ids, t in zip(drawn, (0.0, 1.5)):
        assert (ids == generate(params, cfg, b"def ", 12, t, seed=3)).all()
    assert len(set(drawn[0].tolist())) > 3  # greedy characters that differ


@pytest.mark.parametrize("precision", ["fp64", "bf16-mixed"])
def test_megatrons_kept_set_with_moe_layers_passes_and_keeps_less(precision):
    """kept="megatron" blocks with an MoE layer in place of the MLP (the layer norm's output gathered over tp with
    sp, the MoE node keeping what its backward reads, the dropout's mask one byte): every step passes its check,
    with the graph's losses, and the step keeps less for backward than kept="graph"."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, aux_loss_coeff=0.5, z_loss_coeff=0.1)
    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=8, dropout=0.1, moe=moe)

    def main(kept):
        model, results = train(cfg, spmdsim.world(), 2, 2, 2, TEXT, ep=2, sp=True, kept=kept, memory=True,
                               precision=precision)
        model.mesh.close()
        return results

    graph, megatron = (spmdsim.simulate(8, lambda: main(kept))[0] for kept in ("graph", "megatron"))
    assert all(r.passed for r in megatron), [r.errors for r in megatron]
    assert megatron[0].loss == graph[0].loss  # the same values at step 0 (after it, sums in another order)
    assert all(m.memory.kept_total < 0.7 * g.memory.kept_total for g, m in zip(graph, megatron))


def test_a_capacity_layers_plan_is_kept_per_signature_by_its_mesh_and_a_dropless_ones_is_made_each_call():
    """spmdsim.models.moe.exchange._plan: with a capacity, one _Plan (and its _Exchange, made once) per layer, tokens,
    sequences and config on a mesh, freed when the mesh closes; dropless, a new one each call (its exchange
    follows the step's counts)."""
    import dataclasses

    from spmdsim import Layout, Mesh
    from spmdsim.models.moe.exchange import _plan

    def body():
        mesh = Mesh(Layout((1, 2, 1), ("dp", "ep", "tp")), spmdsim.world())
        moe = MoEConfig(experts=4, top_k=2)
        a, again = _plan(mesh, moe, 8, 2, 2, "h1"), _plan(mesh, moe, 8, 2, 2, "h1")
        others = (_plan(mesh, moe, 8, 2, 2, "h3"), _plan(mesh, moe, 16, 2, 2, "h1"), _plan(mesh, moe, 8, 1, 2, "h1"),
                  _plan(mesh, dataclasses.replace(moe, capacity_factor=2.0), 8, 2, 2, "h1"))
        counts = np.array([4, 4, 4, 4])
        kept = a.exchange(counts, None) is again.exchange(counts * 2, None)  # (nothing depends on the counts)
        dropless = dataclasses.replace(moe, dropless=True)
        once, twice = _plan(mesh, dropless, 8, 2, 2, "h1"), _plan(mesh, dropless, 8, 2, 2, "h1")
        mesh.close()
        after = Mesh(Layout((1, 2, 1), ("dp", "ep", "tp")), spmdsim.world())
        fresh = _plan(after, moe, 8, 2, 2, "h1")
        after.close()
        return (a is again, kept, len({id(p) for p in (a,) + others}), (a.capacity, others[1].capacity),
                once is not twice and once.capacity == 16, fresh is not a and fresh.mesh is after, not mesh._plans)

    for same, kept, distinct, capacities, dropless_new, fresh, freed in spmdsim.simulate(2, body):
        assert same and kept and distinct == 5 and capacities == (4, 8) and dropless_new and fresh and freed
