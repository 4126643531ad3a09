"""`spmdsim autoshard --run` on graphs with branches (the GPT, attention): node by node, simulated ranks."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import spmdsim
from spmdsim.tools.autoshard import autoshard
from spmdsim.tools.autoshard.dag import run_dag
from spmdsim.tools.autoshard.evaluate import evaluate
from spmdsim.tools.autoshard.networks import gpt_network
from spmdsim.tools.autoshard.runnable import is_chain
from spmdsim.tools.cli.main import main
from spmdsim.models.gpt.config import GPTConfig
from testkit import unfold

RATE = 1e10  # stated, so the choice does not depend on a measured rate
SMALL = GPTConfig(layers=2, d_model=64)
GPT = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64", "--flops", "1e10"]
#: --run's flags here: one forward pass (--repeat goes with --run only).
RUN = ["--run", "--repeat", "1"]


def _gpt(devices: int, fix_all_hand: bool = False, sp: bool = False):
    graph, hand = gpt_network(devices, SMALL, sp=sp)
    fix = {n.name: "hand" for n in graph.nodes[1:]} if fix_all_hand else None
    return autoshard(graph, devices, hand=hand, fix=fix, flops_per_s=RATE)


def _run(result, ranks: int, train: bool = False):
    reports = spmdsim.simulate(ranks, lambda: run_dag(result, spmdsim.world(), repeats=1, train=train))
    return reports[0]


@pytest.fixture
def perturb(monkeypatch):
    """perturb(name, rank): that rank's shard of weight `name` gets 1.0 added to its first element."""
    from spmdsim.tools.autoshard.dag import DagRunner

    made = DagRunner._weight

    def set_up(name: str, rank: int) -> None:
        def weight(self, spec, layout):
            fresh = (spec.name, spec.source, layout) not in self._weights
            p = made(self, spec, layout)
            if fresh and spec.name == name and self.comm.Get_rank() == rank:
                p.local.reshape(-1)[0] += 1.0
            return p

        monkeypatch.setattr(DagRunner, "_weight", weight)

    return set_up


def _bytes_as_predicted(result, report) -> None:
    assert [m.bytes_received for m in report.measured] == [op.bytes_per_rank for op in result.ops]


def test_the_numpy_evaluation_is_the_gpt_reference_at_the_models_initial_weights():
    # The graph's nodes, evaluated one by one, give spmdsim.models.gpt.reference's logits and loss from the
    # parameters the model starts from (init_params): the graph's weights are the GPT's own.
    from spmdsim.models.gpt import reference

    graph, _ = gpt_network(8, SMALL)
    cfg = GPTConfig(layers=2, d_model=64, dropout=0.0)
    params = reference.init_params(cfg)
    ids, targets = graph.nodes[0].source.full(), graph.nodes[-1].source.full()
    values = evaluate(graph)
    logits = reference.logits(params, ids, cfg)
    np.testing.assert_allclose(values["head"], logits, rtol=1e-12, atol=1e-12)
    loss, _ = reference.loss_and_grads(params, ids, targets.reshape(ids.shape), cfg, None, train=False)
    assert values["loss"] == pytest.approx(loss, rel=1e-12)


@pytest.mark.parametrize("ranks", [8, 4])
def test_the_gpt_choice_runs_checks_and_moves_the_predicted_bytes(ranks):
    result = _gpt(ranks)
    assert not is_chain(result)
    report = _run(result, ranks)
    assert report.passed and len(report.verdicts) == len(result.graph.nodes) - 1
    _bytes_as_predicted(result, report)
    ours, numpy_loss = report.loss
    assert ours == pytest.approx(numpy_loss, rel=1e-12) and np.isfinite(ours)


@pytest.mark.parametrize("sp", [False, True])
def test_megatrons_layouts_run_with_their_collectives_as_predicted(sp):
    # Every node fixed to Megatron's layouts (dp 2 x tp 4): vocab-parallel embedding, column- and
    # row-parallel products (Allreduce, or Reduce_scatter onto the sequence with sp), split heads.
    result = _gpt(8, fix_all_hand=True, sp=sp)
    report = _run(result, 8)
    assert report.passed
    _bytes_as_predicted(result, report)
    moved = {op.name for op, m in zip(result.ops, report.measured) if m.bytes_received}
    assert {"wte", "h0.proj", "h0.fc2", "loss"} <= moved
    assert ("h0.qkv_in" in moved) == sp  # sequence parallel: one Allgather before Q, K and V


def test_a_wrong_weight_shard_on_one_rank_fails_the_check(perturb):
    # 1.0 added to one element of h0's query weight on rank 3: everything before h0.q still matches,
    # h0.q is the first node to differ, and the loss differs from numpy's.
    result = _gpt(8, fix_all_hand=True)
    perturb("h0.attn.wq", 3)
    report = _run(result, 8)
    assert not report.passed
    names = [n.name for n in result.graph.nodes[1:]]
    failed = [name for name in names if not report.verdicts[name]]
    assert failed[0] == "h0.q" and "loss" in failed
    assert all(report.verdicts[name] for name in names[:names.index("h0.q")])
    assert report.loss[0] != pytest.approx(report.loss[1], rel=1e-9)


def test_attention_runs_node_by_node():
    result = autoshard("attention", 8, flops_per_s=RATE)
    report = _run(result, 8)
    assert report.passed and report.loss is None
    _bytes_as_predicted(result, report)


def test_cli_runs_the_gpt_on_simulated_ranks_and_says_pass(capsys):
    assert main(GPT + RUN + ["--devices", "8", "--ranks", "8"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert re.search(r"^loss +28 +28 ", out, re.M), out
    assert re.search(r"^values: 56 of 56 operators' outputs match numpy \(one process\); "
                     r"loss 4\.87344, numpy 4\.87344$", out, re.M), out
    assert out.rstrip().endswith("PASS") and "note:" not in out


def test_cli_json_has_the_checks_and_the_loss(capsys):
    assert main(GPT + RUN + ["--ranks", "4", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["passed"] is True and len(record["checked"]) == 56 and all(record["checked"].values())
    assert record["loss"]["ranks"] == pytest.approx(record["loss"]["numpy"], rel=1e-12)
    assert [m["bytes_received_per_rank"] for m in record["measured"]] == \
        [op["bytes_per_rank"] for op in record["operators"]]


def test_fix_every_operator_by_hand_runs_megatrons_plan(capsys):
    """``--fix "*=hand"`` is one --fix NODE=hand per node: Megatron's layouts, run and checked; a name given
    on its own still wins, and '*' takes nothing but 'hand'."""
    spelled = _gpt(8, fix_all_hand=True)
    assert main(GPT + ["--devices", "8", "--fix", "*=hand", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [op["strategy"] for op in record["operators"]] == [op.candidate.text for op in spelled.ops]
    assert all(op["why"] == "fixed" for op in record["operators"][1:])
    assert record["total_bytes_per_rank"] == record["hand_written_total_bytes_per_rank"] > 100_000
    assert main(GPT + ["--devices", "8", "--fix", "*=hand", "--fix", "lnf=((8, 1, 1), (1,), (1,))", "--json"]) == 0
    ops = {op["name"]: op for op in json.loads(capsys.readouterr().out)["operators"]}
    assert ops["lnf"]["strategy"] == "((8, 1, 1), (1,), (1,))" and ops["head"]["why"] == "fixed"
    assert main(GPT + RUN + ["--devices", "8", "--fix", "*=hand", "--ranks", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^values: 56 of 56 operators' outputs match numpy", out, re.M) and out.rstrip().endswith("PASS")
    for argv, line in ((["--network", "gpt", "--fix", "*=((8,1),)"],
                        "--fix '*=((8,1),)': '*' fixes every operator and takes 'hand' only"),
                       (["--network", "mlp", "--fix", "*=hand"], "--fix '*=hand': mlp has no hand-written "
                                                                "strategies at 8 devices")):
        assert main(["autoshard", *argv]) == 2
        err = unfold(capsys.readouterr().err)
        assert len(err.splitlines()) == 1 and line in err, err


def test_an_unknown_operator_of_a_large_graph_is_a_short_line(capsys):
    """The GPT's 56 operators are not listed in the error: the likely ones and where to see them all."""
    assert main(GPT + ["--fix", "h0.ln=hand"]) == 2
    err = unfold(capsys.readouterr().err).strip()
    assert err == ("spmdsim: error: no operator 'h0.ln' in gpt; did you mean 'h0.ln2', 'h0.ln1', 'h1.ln2'? its 56 "
                   "operators are wte, wpe, h0.ln1, h0.qkv_in, ..., flatten, loss (spmdsim autoshard --network gpt "
                   "lists them all)")


def test_cli_run_with_a_device_count_that_is_not_the_launchs_is_one_line(capsys):
    assert main(GPT + RUN + ["--devices", "8", "--ranks", "4"]) == 2
    out, err = capsys.readouterr()
    assert out.count("\n") <= 1 and len(err.splitlines()) == 1, err
    assert "--run uses the 4 ranks of the launch; --devices 8 differs (launch with --ranks 8)" in err


@pytest.mark.parametrize("ranks, sp, nbytes", [(8, False, 1_267_456), (8, True, 1_218_304),
                                                (4, False, 2_025_984)])
def test_training_runs_the_backward_with_the_predicted_bytes_and_the_references_gradients(ranks, sp, nbytes):
    # Megatron's layouts priced with --training: the backward's Allreduces (or, with sp, its
    # Reduce_scatters and Allgathers) and the weights' sums over dp receive exactly the replayed bytes.
    graph, hand = gpt_network(ranks, SMALL, sp=sp)
    fix = {n.name: "hand" for n in graph.nodes[1:]}
    result = autoshard(graph, ranks, hand=hand, fix=fix, flops_per_s=RATE, training=True)
    report = _run(result, ranks, train=True)
    assert report.passed and report.backward is not None
    assert report.backward.bytes_received == result.backward_bytes_per_rank == nbytes
    assert len(report.backward.verdicts) == 34 and all(report.backward.verdicts.values())


def test_a_wrong_weight_shard_fails_the_gradients_too(perturb):
    graph, hand = gpt_network(4, SMALL)
    fix = {n.name: "hand" for n in graph.nodes[1:]}
    result = autoshard(graph, 4, hand=hand, fix=fix, flops_per_s=RATE, training=True)
    perturb("h1.mlp.w2", 2)
    report = _run(result, 4, train=True)
    assert not report.passed
    wrong = {name for name, v in report.backward.verdicts.items() if not v}
    assert "h1.mlp.w2" in wrong and "wte" in wrong  # the loss moved: every gradient moves with it
    assert [name for name, v in report.verdicts.items() if not v][0] == "h1.fc2"


def test_training_on_a_graph_without_a_numpy_backward_runs_forward_and_says_so(capsys):
    assert main(["autoshard", "--network", "attention", "--training", "--run", "--ranks", "8",
                 "--flops", "1e10", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "\nvalues: 7 of 7 operators' outputs match numpy (one process)\n" in out
    assert "\nbackward not run (forward only): attention ends in Out (matmul), not a loss\nPASS" in out


@pytest.mark.parametrize("seed", [1, 2])
def test_random_candidates_of_every_node_run_as_predicted(seed):
    # Any choice, not only the search's: each node fixed to a random one of its candidates (layer
    # norms and softmax split or not, Reduce_scatter outputs, heads or sequence split, ...).
    import random

    from spmdsim.tools.autoshard.candidates import candidates

    graph, _ = gpt_network(8, GPTConfig(layers=1, d_model=32, seq=16, vocab=32, batch=4))
    rng = random.Random(seed)
    fix = {n.name: rng.choice(candidates(n, 8)).text for n in graph.nodes[1:]}
    result = autoshard(graph, 8, fix=fix, flops_per_s=RATE, training=True)
    report = _run(result, 8, train=True)
    assert report.passed and all(report.backward.verdicts.values())
    _bytes_as_predicted(result, report)
    assert sum(op.bytes_per_rank for op in result.ops) > 0
    # The pass's busiest rank receives at most the sum of each node's busiest.
    assert 0 < report.backward.bytes_received <= result.backward_bytes_per_rank


def test_the_docs_quote_what_the_gpt_run_prints(capsys):
    # docs/howto/autoshard.md, "Running the GPT's choice": each quoted command's lines appear in order in what
    # it prints ("..." any lines); numbers with a decimal point (times, ratios) and column widths
    # (which follow the times) may differ.
    import shlex

    from docs_commands import quotes

    quoted = [q for q in quotes("docs/howto/autoshard.md")
              if q.output and q.command.startswith("spmdsim autoshard --network gpt") and "--run" in q.command]
    assert len(quoted) == 3
    for quote in quoted:
        code = main(shlex.split(quote.command)[1:] + ["--flops", "1e11", "--repeat", "1"])
        out = capsys.readouterr().out
        assert code == 0, out
        lines, at, skip = out.splitlines(), 0, False
        for want in quote.output:
            if want.strip() == "...":
                skip = True
                continue
            pattern = re.compile(r" +".join(re.sub(r"\d+\\\.\d+", "[0-9.]+", re.escape(word))
                                            for word in want.split()) + r"\Z")
            while at < len(lines) and not pattern.match(lines[at]):
                assert skip, f"{quote.where()}: expected {want!r}, got {lines[at]!r}"
                at += 1
            assert at < len(lines), f"{quote.where()}: {want!r} is not in the output\n{out}"
            at, skip = at + 1, False


def test_a_node_that_moves_other_bytes_than_predicted_gets_a_note_line():
    # The runner measures what the operators move; where the model priced another number, one line says so.
    from dataclasses import replace

    from spmdsim.tools.autoshard.report import format_checks

    result = _gpt(4)
    report = _run(result, 4)
    k = [op.name for op in result.ops].index("h0.scores")
    ops = list(result.ops)
    ops[k] = replace(ops[k], in_bytes=ops[k].in_bytes + 4096)
    text = format_checks(replace(result, ops=tuple(ops)), report)
    assert text.splitlines()[0] == ("note: h0.scores (einsum) moved 0 B/rank where the model predicted 4,096: "
                                    "the operator ran another plan than its candidate's")
    assert "note:" not in format_checks(result, report)
