"""Context parallelism in training (spmdsim.models.gpt.context): each method and split checked against one
numpy process every step, the Llama options, the bytes each method's attention moves counted from the trace
against its formula (spmdsim.programs.context.methods), and the refusals."""
from __future__ import annotations

import pathlib
import re
import shlex

import pytest
from docs_commands import quotes, run_here

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.context import Context, context_problem
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.programs.context import METHODS, traffic
from spmdsim.tools.cli.main import main
from testkit import unfold

TEXT = encode(load_text(20_000))
SMALL = dict(layers=2, d_model=32, heads=4, seq=16, batch=4, dropout=0.1)


def _run(cfg, dp, cp, tp, sp, context, steps=2):
    def main():
        _, results = train(cfg, spmdsim.world(), dp, tp, steps, TEXT, sp=sp, cp=cp, context=context)
        return results, None
    return spmdsim.simulate(dp * cp * tp, main)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("split", ["balanced", "naive"])
def test_each_method_and_split_trains_as_one_numpy_process(method, split):
    out = _run(GPTConfig(**SMALL), 2, 2, 2, True, Context(method, split))
    for results, _ in out:
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), [r.errors for r in results]
    assert len({tuple(r.loss for r in results) for results, _ in out}) == 1


@pytest.mark.parametrize("method", ["ring", "alltoall"])
@pytest.mark.parametrize("zero", [1, 2])
def test_a_naive_split_trains_under_zero_as_one_numpy_process(method, zero):
    # The learned positions' gradient stays a pending sum over cp, as the ZeRO optimizer sums it once over dp
    def main():
        _, results = train(GPTConfig(**SMALL), spmdsim.world(), 2, 1, 2, TEXT, cp=2, zero=zero,
                           context=Context(method, "naive"))
        return results
    for results in spmdsim.simulate(4, main):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), [r.errors for r in results]


@pytest.mark.parametrize("method", ["ring", "allgather"])
def test_llama_options_train_over_four_context_ranks(method):
    cfg = GPTConfig(**SMALL, positions="rope", norm="rms", mlp="swiglu", kv_heads=2)
    for results, _ in _run(cfg, 1, 4, 2, False, Context(method)):
        assert all(r.passed for r in results), [r.errors for r in results]


def _attention_bytes(method, cp, precision="fp64", kept="graph", **options):
    """(bytes one rank's step sent in attention's traffic over cp, one K block's bytes), dp 1 and tp 1."""
    cfg = GPTConfig(**{**SMALL, "dropout": 0.0, **options})

    def main():
        from spmdsim.runtime.trace import collect_trace

        model, _ = train(cfg, spmdsim.world(), 1, 1, 1, TEXT, cp=cp, context=Context(method), check=False,
                         precision=precision, kept=kept)
        with collect_trace() as trace:
            model.loss(*_batch(model, cfg), 1).backward()
        ops = {"ring": ("send", "recv", "sendrecv"), "allgather": ("allgather", "reduce_scatter"),
               "alltoall": ("alltoall",)}[method]
        return sum(e.bytes_sent for e in trace.entries if e.op in ops and tuple(e.axes) == ("cp",))

    itemsize = 8 if precision == "fp64" else 2
    kv_width = cfg.d_model // cfg.heads * cfg.kv  # grouped-query attention's K and V: kv heads, not heads
    return spmdsim.simulate(cp, main), cfg.batch * (cfg.seq // cp) * kv_width * itemsize


def _batch(model, cfg):
    from spmdsim.models.gpt.data import batch
    from spmdsim.runtime.dtensor import DTensor

    x, y = batch(TEXT, cfg, 0)
    return (DTensor.from_global(model.mesh, x[model.laid], model.ids),
            DTensor.from_global(model.mesh, y[model.laid], model.ids))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cp", [2, 4])
def test_each_methods_bytes_per_rank_are_its_formula(method, cp):
    """Counted from the trace of one forward and backward: ring, 2(cp-1) K/V blocks forward and 2(cp-1) + 2cp
    backward; all-gather, the Allgathers of K and V and the Reduce_scatters of their gradients; all-to-all,
    Q, K, V and the output each way (heads = K/V heads here: q_bytes = kv_bytes)."""
    sent, kv = _attention_bytes(method, cp)
    forward, backward = traffic(method, cp, kv, kv)
    assert set(sent) == {SMALL["layers"] * (forward + backward)}, (sent, forward, backward)


@pytest.mark.parametrize("method", ["ring", "allgather"])
def test_under_bf16_the_gradients_of_keys_and_values_travel_as_float32_sums(method):
    """Under bf16-mixed a K or V block is 2 bytes an element and the sums of their gradients 4 (the ring's dK and
    dV round the ring in float32; a Reduce_scatter adds float32): `traffic`'s grad_bytes."""
    sent, kv = _attention_bytes(method, 2, "bf16-mixed")
    forward, backward = traffic(method, 2, kv, kv, 2 * kv)
    assert set(sent) == {SMALL["layers"] * (forward + backward)}, (sent, forward, backward)


@pytest.mark.parametrize("cp", [2, 4])
def test_grouped_keys_and_values_go_round_the_ring_at_their_own_heads(cp):
    """Grouped-query attention (4 heads, 1 K/V head, Megatron's kept set: K and V built at their own heads) sends
    each K and V block, and its gradients' sums, at the K/V heads' width, never repeated for the query heads
    (as TransformerEngine's ring passes them): a quarter of the bytes of the same ring at 4 K/V heads."""
    grouped, kv = _attention_bytes("ring", cp, "bf16-mixed", kv_heads=1, kept="megatron", positions="rope",
                                   norm="rms", mlp="swiglu")
    assert kv == SMALL["batch"] * (SMALL["seq"] // cp) * (SMALL["d_model"] // SMALL["heads"]) * 2
    forward, backward = traffic("ring", cp, kv, kv, 2 * kv)
    assert set(grouped) == {SMALL["layers"] * (forward + backward)}, (grouped, forward, backward)
    whole, whole_kv = _attention_bytes("ring", cp, "bf16-mixed", kept="megatron", positions="rope", norm="rms",
                                       mlp="swiglu")
    assert whole_kv == 4 * kv and set(whole) == {4 * s for s in grouped}


@pytest.mark.parametrize("kept", ["megatron", "graph"])
def test_a_bf16_grouped_ring_is_checked_at_its_own_rounding_points(kept):
    """The ring reads each K/V head for its group of query heads and sums their gradients in float32, rounded
    once; the reference sums them so too (spmdsim.models.gpt.mixed): every step passes."""
    cfg = GPTConfig(**SMALL, positions="rope", norm="rms", mlp="swiglu", kv_heads=2)

    def main():
        _, results = train(cfg, spmdsim.world(), 1, 1, 4, TEXT, cp=2, context=Context("ring"),
                           precision="bf16-mixed", kept=kept)
        return results

    for results in spmdsim.simulate(2, main):
        assert all(r.passed for r in results), [r.errors for r in results]


@pytest.mark.parametrize("cp, tp, replay", [(2, 1, False), (2, 2, False), (2, 1, True)])
def test_a_bf16_ring_is_checked_at_its_own_rounding_points(cp, tp, replay):
    """The ring under bf16-mixed merges its blocks in float32 and rounds its output once, and the reference rounds
    there too (spmdsim.models.gpt.mixed, `ring`): every step within float32's sum-order differences (1.3e-7
    measured). A ring that merged in bfloat16, checked against the core's rounding points, failed 4 of these 8
    steps (loss up to 7e-5 apart, the tolerance 1.5e-5). Replayed, its gradients of K and V (rounded to bfloat16,
    widened to the gradients' float32 by the autograd) are each replay's own: the widening is recorded (a replay
    read the capture's values, 0.1 apart, before)."""
    def main():
        _, results = train(GPTConfig(**SMALL), spmdsim.world(), 1, tp, 8, TEXT, cp=cp, context=Context("ring"),
                           precision="bf16-mixed", replay=replay)
        return results

    for results in spmdsim.simulate(cp * tp, main):
        assert all(r.passed for r in results), [r.errors for r in results]


def test_a_context_split_the_model_cannot_take_is_one_line():
    with pytest.raises(SpmdsimError, match="splits heads over tp x cp = 8: 4 heads do not divide"):
        _run(GPTConfig(**SMALL), 1, 4, 2, False, Context("alltoall"))
    with pytest.raises(SpmdsimError, match="sequence length 16 does not divide into 2 x cp = 6 chunks"):
        _run(GPTConfig(**SMALL), 1, 3, 1, False, Context("ring"))


@pytest.mark.parametrize("ep, tp, etp, sp, method, replay, capacity", [(2, 1, 0, False, "ring", False, 0.0),
                                                                          (1, 2, 1, True, "alltoall", True, 0.0),
                                                                          (2, 1, 0, False, "ring", True, 0.5),
                                                                          (1, 2, 1, False, "allgather", False, 0.5)])
def test_experts_train_over_context_ranks_as_one_numpy_process(ep, tp, etp, sp, method, replay, capacity):
    """Each rank routes its own share of every sequence (its cp chunks; folded with sp and dropless, tp's share of
    them too): the router's counts and the loss's means summed over cp as over the batch's axes, the experts'
    gradients over dp x cp (their edp), checked every step against one numpy process (which a count or gradient
    not summed over cp fails by 1e-3 and more). With a capacity (0.5: tokens dropped) each chunk has its own, and
    the reference routes each sequence's chunks apart in the ranks' order (spmdsim.models.gpt.context.Laid)."""
    from spmdsim.models.moe import MoEConfig

    moe = dict(dropless=True) if not capacity else dict(capacity_factor=capacity)
    cfg = GPTConfig(**SMALL, moe=MoEConfig(experts=4, top_k=2, every=2, etp=etp, **moe))

    def main():
        _, results = train(cfg, spmdsim.world(), 1, tp, 2, TEXT, sp=sp, cp=2, context=Context(method), ep=ep,
                           replay=replay)
        return results

    out = spmdsim.simulate(ep * 2 * tp, main)
    for results in out:
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), [r.errors for r in results]
    assert len({tuple(r.loss for r in results) for results in out}) == 1
    if capacity:  # tokens dropped at each chunk's capacity, ceil(2 x 8 x 0.5 / 4) = 2 slots an expert
        assert sum(s.dropped for results in out for r in results for s in r.dispatch) > 0


@pytest.mark.parametrize("method, schedule, sp", [("ring", "1f1b", False), ("allgather", "interleaved", True),
                                                  ("alltoall", "gpipe", True)])
def test_context_parallelism_composes_with_a_pipeline(method, schedule, sp):
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = GPTConfig(**{**SMALL, "layers": 4, "batch": 8})

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 2, 2, TEXT, sp=sp, schedule=schedule,
                                       microbatches=4, virtual=2 if schedule == "interleaved" else 1, cp=2,
                                       context=Context(method))
        run.close()
        return results

    for results in spmdsim.simulate(8, main):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), [r.errors for r in results]


def _estimate(*flags):
    import json

    from docs_commands import run_here

    code, out, err = run_here("main", ["estimate", "gpt", "--layers", "4", "--hidden", "1024", "--heads", "16",
                                       "--seq", "4096", "--tp", "2", "--dp", "1", "--global-batch", "4",
                                       "--dropout", "0", "--kept", "megatron", "--attention", "flash", "--json",
                                       *flags])
    assert code == 0, err
    return json.loads(out)


def test_the_estimate_splits_activations_over_cp_and_prices_the_rings_messages():
    """The dry run behind `spmdsim estimate gpt --cp N`: each rank keeps about 1/cp of the activations, the ring's
    messages are sent within the node (one K and one V block a step), and they are a "context" phase the step
    time hides under the products."""
    kept = {cp: _estimate("--cp", str(cp))["stages"][0]["bytes"]["activations"] for cp in (1, 2, 4)}
    assert 0.45 < kept[2] / kept[1] < 0.55 and 0.45 < kept[4] / kept[2] < 0.55, kept
    ring = _estimate("--cp", "2")
    assert ring["stages"][0]["sent"].get("send node", 0) > 0
    assert "ring attention's messages hidden under the products" in ring["assumptions"]
    gathered = _estimate("--cp", "2", "--cp-method", "allgather")["stages"][0]["sent"]
    assert gathered.get("allgather node", 0) > 0 and "send node" not in gathered


def test_the_moe_example_splits_each_sequence_over_cp_and_refuses_what_cannot_be_in_one_line():
    """examples/train_moe_gpt.py --cp: the mesh line names cp and the context line follows; two checked steps
    PASS, as docs/howto/context-parallel.md ("With experts") quotes the command (its lines matched here); a
    capacity beside --cp, and --cp sizes the world does not take, end in one line (exit 2)."""
    from docs_commands import mismatch, quotes
    from test_moe import _example
    from testkit import unfold

    base = ["--ranks", "8", "--steps", "2", "--layers", "2", "--d-model", "32"]
    argv = ["--ranks", "8", "--ep", "2", "--cp", "2", "--tp", "2", "--dropless", "--steps", "2", "--layers", "2",
            "--d-model", "32", "--seq", "16"]
    (quote,) = [q for q in quotes("docs/howto/context-parallel.md") if "train_moe_gpt.py" in q.command]
    assert shlex.split(quote.command) == ["python", "examples/train_moe_gpt.py", *argv]
    out = _example(argv)
    assert out.returncode == 0 and mismatch(quote.output, out.stdout) is None, (out.stderr, out.stdout)
    assert "mesh dp 1 x ep 2 x cp 2 x tp 2: experts 4 per ep rank" in out.stdout, out.stdout
    assert "context parallelism: each sequence split over 2 ranks (balanced), attention by ring" in out.stdout
    assert "check: 2 steps vs one numpy process (loss, 35 gradients and parameters each): PASS" in out.stdout, \
        out.stdout
    for flags, message in ((["--cp", "3", "--dropless"], "--cp 3 must divide the world size 8"),
                           (["--cp", "2", "--tp", "4", "--etp", "1", "--ep", "4", "--dropless", "--seq", "12"],
                            "seq 12 split over cp 2 leaves 6 tokens, not divisible by tp 4 (etp 1, dropless: each "
                            "tp rank routes its share of its cp chunk's tokens)"),
                           (["--cp", "0"], "--cp 0 must be at least 1"),
                           (["--cp-method", "allgather", "--dropless"],  # was ignored: no sequence is split
                            "--cp-method allgather is for a sequence split over context-parallel ranks: give --cp 2 "
                            "or more with it")):
        out = _example(base + flags)
        assert out.returncode == 2 and message in unfold(out.stderr), (flags, out.stderr)
        assert "Traceback" not in out.stderr


def test_train_gpt_refuses_a_context_flag_without_cp_in_one_line():
    """--cp-method and --cp-split without --cp 2 or more ran an unsplit sequence and exited 0, as if not typed."""
    from docs_commands import run_example
    from testkit import unfold

    base = ["--ranks", "2", "--tp", "2", "--steps", "1", "--layers", "1", "--d-model", "16", "--seq", "8",
            "--sample", "0"]
    for flags in (["--cp-split", "naive"], ["--cp", "1", "--cp-method", "alltoall"]):
        out = run_example("examples/train_gpt.py", *base, *flags)
        assert out.returncode == 2 and "step" not in out.stdout, (flags, out.stdout)
        assert unfold(out.stderr).splitlines()[-1] == (
            f"spmdsim: error: {flags[-2]} {flags[-1]} is for a sequence split over context-parallel ranks: give --cp 2 "
            "or more with it")


def test_the_estimate_refuses_a_context_method_without_cp_in_one_line(capsys):
    """`spmdsim estimate gpt --cp-method allgather` without --cp 2 or more printed the plain estimate, exit 0, as
    if the flag were not typed; the trainers refuse it (above)."""
    for argv in (["--cp-method", "allgather"], ["--cp", "1", "--cp-method", "ring"]):
        assert main(["estimate", "gpt", *argv]) == 2, argv
        assert unfold(capsys.readouterr().err).splitlines()[-1] == (
            f"spmdsim: error: --cp-method {argv[-1]} is for a sequence split over context-parallel ranks: give "
            "--cp 2 or more with it")


def test_the_search_leaves_out_folded_experts_whose_cp_chunk_tp_does_not_divide():
    """Folded dropless experts route tp's share of each rank's cp chunk: seq 12 over cp 2 leaves 6 tokens, which
    tp 4 does not divide (cp 2 with tp 2, and cp 2 with tp 4 split over tp, stay)."""
    from dataclasses import replace as replaced

    from spmdsim.models.moe import MoEConfig
    from spmdsim.tools.estimate.configs import configurations

    cfg = GPTConfig(**{**SMALL, "seq": 12, "batch": 8}, moe=MoEConfig(experts=8, top_k=2, dropless=True))
    found = {(c.cp, c.tp, c.etp) for c in configurations(cfg, 8, 8) if c.cp > 1}
    assert (2, 2, 1) in found and (2, 4, 0) in found and (2, 4, 1) not in found
    assert context_problem(replaced(cfg, moe=replaced(cfg.moe, etp=1)), 2, 4, False, Context()) is not None


def test_the_estimate_of_experts_over_cp_sends_each_rank_its_share_of_the_tokens():
    """`spmdsim estimate gpt --experts 4 --ep 2 --dropless --cp 2`: each rank keeps about half the activations and
    sends half the tokens' rows by Alltoallv (its own cp chunk of every sequence), beside the ring's messages."""
    moe = ("--experts", "4", "--ep", "2", "--dropless")
    whole, split = (_estimate(*moe, "--cp", str(cp))["stages"][0] for cp in (1, 2))
    assert 0.45 < split["bytes"]["activations"] / whole["bytes"]["activations"] < 0.55
    assert split["sent"]["alltoallv node"] * 2 == whole["sent"]["alltoallv node"] > 0
    assert split["sent"]["send node"] > 0 and "send node" not in whole["sent"]
    # with a capacity each chunk has its own, ceil(2 x 4,096 / 2 / 4) slots an expert: half a sequence's
    whole, split = (_estimate(*moe[:-1], "--cp", str(cp))["stages"][0] for cp in (1, 2))
    assert split["sent"]["alltoall node"] * 2 == whole["sent"]["alltoall node"] > 0


@pytest.mark.parametrize("method", METHODS)
def test_a_replayed_context_parallel_step_is_checked_as_the_eager_one(method):
    """Step 0 captured, the later steps replayed (spmdsim.runtime.replay): ring attention's blocks and messages
    too, each replay drawing its own step's dropout masks."""
    def main():
        _, results = train(GPTConfig(**SMALL), spmdsim.world(), 2, 2, 3, TEXT, sp=True, cp=2, context=Context(method),
                           replay=True)
        return results

    for results in spmdsim.simulate(8, main):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), [r.errors for r in results]


def test_the_training_example_with_cp_ends_with_a_sample_drawn_from_the_trained_parameters():
    """`--cp 2` trained, checked PASS, then raised drawing the sample (a window of one new token does not split
    over cp) and exited 2; the sample is drawn by one numpy process from the trained parameters."""
    from docs_commands import run_here

    code, out, err = run_here("examples/train_gpt.py", ["--ranks", "4", "--dp", "1", "--cp", "2", "--tp", "2",
                                                        "--steps", "1", "--sample", "12", "--layers", "1"])
    assert code == 0, err
    assert "check: 1 step vs one numpy process" in out and ": PASS" in out, out
    drawn = out.split("sample (temperature 0.8, drawn in one numpy process from the trained parameters):\n", 1)
    assert len(drawn) == 2 and drawn[1].startswith("def ") and len(drawn[1].rstrip("\n")) >= 4 + 1, out


def test_generate_on_a_context_parallel_model_is_one_line():
    """GPT.generate with cp raised numpy's shard error from deep in the forward; it names what to call instead."""
    from spmdsim.models.gpt.train import train as train_gpt

    def body():
        model, _ = train_gpt(GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=2), spmdsim.world(), 1, 1, 1,
                             encode(load_text(2_000)), check=False, cp=2, context=Context())
        with pytest.raises(SpmdsimError, match="^generate: a window of one new token does not split over the "
                                               "context-parallel ranks; .*reference_sample$"):
            model.generate(b"def ", 4)

    spmdsim.simulate(2, body)


def test_the_howto_s_context_command_prints_the_bytes_of_the_train_run_s_blocks():
    """docs/howto/context-parallel.md ("Choose a method") names a `spmdsim context` command for one rank's blocks
    of its train run (d_model 128, 4 heads: head dim 32) and says the ring's backward sends 262,144 B a layer
    more than the gather's, the difference of its table's two first rows over 4 layers. The command left out
    --head-dim 32, and the tool's default 128 printed four times the run's bytes."""
    doc = "docs/howto/context-parallel.md"
    (quote,) = [q for q in quotes(doc) if q.command.startswith("spmdsim context --cp 2 ")]
    code, out, err = run_here("main", shlex.split(quote.command)[1:])
    assert code == 0, err
    sent = {m.group(1): (int(m.group(2).replace(",", "")), int(m.group(3).replace(",", "")))
            for m in re.finditer(r"^  (\w+) +([\d,]+) B +([\d,]+) B$", out, re.M)}
    extra = sent["ring"][1] - sent["allgather"][1]
    text = (pathlib.Path(__file__).resolve().parents[1] / doc).read_text()
    rows = {m.group(1): int(m.group(2).replace(",", "")) for m in re.finditer(r"^\| `(\w+)`[^|]*\|[^|]*\| ([\d,]+) \|",
                                                                                text, re.M)}
    assert f"4 layers x {extra:,} B more here" in text, (extra, sent)
    assert rows["ring"] - rows["allgather"] == 4 * extra, (rows, sent)
    assert sent["allgather"] == sent["alltoall"] and rows["allgather"] == rows["alltoall"], (rows, sent)


def test_the_llama_options_over_four_context_ranks_refuse_the_all_to_all_in_one_line():
    """docs/howto/context-parallel.md ("What composes"): the Llama options with --cp 4 --tp 2 pass by the ring and
    the gather (test_llama_options_train_over_four_context_ranks); the all-to-all splits 4 heads over tp x cp = 8
    and is refused, not run."""
    cfg = GPTConfig(**SMALL, positions="rope", norm="rms", mlp="swiglu", kv_heads=2)
    assert context_problem(cfg, 4, 2, False, Context("ring")) is None
    why = context_problem(cfg, 4, 2, False, Context("alltoall"))
    assert why is not None and "splits heads over tp x cp = 8: 4 heads do not divide" in why, why
