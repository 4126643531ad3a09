"""`spmdsim autoshard`: the table fits 100 columns, --json has the documented keys, bad input exits 2."""
from __future__ import annotations

import json

import pytest

from spmdsim.tools.cli.autoshard_machine import _limit
from spmdsim.tools.cli.main import main
from testkit import unfold

TUTORIAL = ["autoshard", "--network", "net_mindspore_tutorial", "--flops", "1e10"]


def test_table_against_the_hand_written_strategies(capsys):
    assert main(TUTORIAL + ["--fix", "MatMul1=((2,4),(4,1))"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines())
    assert "total 58,560 B/rank; hand-written 179,392 B/rank; saves 120,832 B (67.4%)" in out
    assert "tree DP, proven optimal" in out
    row = next(line for line in out.splitlines() if line.startswith("MatMul1"))
    assert "((2, 4), (4, 1))" in row and "9,408" in row and "49,152" in row and row.endswith("fixed")


def test_json_has_operators_and_integer_totals(capsys):
    assert main(TUTORIAL + ["--json", "--memory-limit", "1M"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert isinstance(record["total_bytes_per_rank"], int)
    assert record["hand_written_total_bytes_per_rank"] == 179_392
    for op in record["operators"]:
        assert {"name", "strategy", "bytes_per_rank"} <= set(op) and isinstance(op["bytes_per_rank"], int)
    assert sum(op["bytes_per_rank"] for op in record["operators"]) == record["total_bytes_per_rank"]


def test_branching_network_reports_branch_and_bound(capsys):
    assert main(["autoshard", "--network", "attention", "--devices", "4", "--flops", "1e10",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["method"] == "branch and bound" and record["proven_optimal"] is True
    assert record["hand_written_total_bytes_per_rank"] is None


@pytest.mark.parametrize("extra, needle", [
    (["--fix", "MatMul1"], "--fix 'MatMul1' must read OP=STRATEGY"),
    (["--fix", "Nope=((8,1),(1,1))"], "no operator 'Nope'"),
    (["--fix", "MatMul1=((2,4)"], "is not a tuple of positive integers"),
    (["--memory-limit", "10"], "fits the memory limit of 10 bytes"),
    (["--devices", "0"], "--devices 0 must be >= 1"),
    (["--flops", "-1"], "--flops -1 must be a finite number > 0"),
    (["--objective", "time", "--devices", "64"], "expected at most 16 (or --objective bytes)"),
    # the parts after a second 'out' were dropped: MatMul1 ran without its out strategy, exit 0
    (["--fix", "MatMul1=((2,4),(4,1)) out ((8,1),) out ((1,8),)"],
     "--fix MatMul1=((2,4),(4,1)) out ((8,1),) out ((1,8),) has 2 'out' parts; expected STRATEGY or"),
    # a fixed strategy over the limit said "no strategy of MatMul1 fits", though 36 of 40 do
    (["--fix", "MatMul1=((1,1),(1,1))", "--memory-limit", "1M"],
     "--fix MatMul1=((1,1),(1,1)) needs 1,771,520 bytes per rank, over the memory limit of 1,048,576; "
     "36 of its 40 candidates fit, the smallest needs 258,560"),
    # taken and ignored: propagation runs no branch and bound
    (["--method", "propagate", "--node-limit", "10"],
     "--node-limit 10 bounds the search's branch and bound; --method propagate searches nothing"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, extra, needle):
    assert main(TUTORIAL[:3] + extra) == 2
    out, err = capsys.readouterr()
    err = unfold(err)
    assert out == "" and len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("limit", ["-5", "0"])
def test_a_memory_limit_below_one_byte_is_refused_alike(capsys, limit):
    """A limit below 1 byte is refused by the flag itself, in the same words for -5 and 0."""
    with pytest.raises(SystemExit) as stop:
        main(TUTORIAL[:3] + ["--memory-limit", limit])
    err = unfold(capsys.readouterr().err)
    assert stop.value.code == 2 and len(err.splitlines()) == 1
    assert f"argument --memory-limit: size '{limit}' must be at least 1 byte, such as 1M or 80G" in err, err


def test_the_search_header_says_a_small_memory_limit_as_it_is(capsys):
    """`--machine` searches said a limit under ~50 KiB as "memory limit 0.0 MiB per rank", no memory at all; from
    1 MiB the header says MiB, as the table's peaks."""
    main(["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64", "--devices", "4", "--machine", "a100-dgx",
          "--memory-limit", "10K"])
    out = capsys.readouterr().out
    assert "4 devices on a100-dgx, memory limit 10 KiB per rank, " in out, out
    assert (_limit(80 << 30), _limit(1 << 20)) == ("81,920.0 MiB", "1.0 MiB")


def test_run_on_simulated_ranks_moves_the_predicted_bytes(capsys):
    # Vocabulary or dims split (the whole table, 245,760 B, is over the limit), 4 ranks in-process.
    assert main(["autoshard", "--network", "net_paddle_tp", "--memory-limit", "100K", "--run",
                 "--ranks", "4", "--flops", "1e10", "--repeat", "1", "--json"]) == 0
    out = capsys.readouterr().out
    record = json.loads(out[out.index("{"):])  # after the simulator's one-line banner
    assert record["passed"] is True
    assert [m["bytes_received_per_rank"] for m in record["measured"]] == \
        [op["bytes_per_rank"] for op in record["operators"]]
    assert record["total_bytes_per_rank"] > 0


def test_run_executes_the_mlp_with_its_gelu(capsys):
    # Column -> GELU -> row on 8 simulated ranks: the GELU stage runs shard by shard and checks.
    assert main(["autoshard", "--network", "mlp", "--run", "--ranks", "8", "--flops", "1e10",
                 "--repeat", "1", "--json"]) == 0
    out = capsys.readouterr().out
    record = json.loads(out[out.index("{"):])
    assert record["passed"] is True
    assert [m["name"] for m in record["measured"]][1:] == ["fc1", "GELU", "fc2"]
    assert [m["bytes_received_per_rank"] for m in record["measured"]] == \
        [op["bytes_per_rank"] for op in record["operators"]]


def test_training_run_of_a_chain_says_the_backward_did_not_run(capsys):
    """A chain's --training --run printed PASS after the forward alone, the backward unmentioned."""
    args = TUTORIAL + ["--training", "--run", "--ranks", "8", "--repeat", "1"]
    assert main(args) == 0
    assert "backward not run (forward only): chains run through the network runner, forward only\nPASS\n" \
        in capsys.readouterr().out
    assert main(args + ["--json"]) == 0
    out = capsys.readouterr().out
    record = json.loads(out[out.index("{"):])
    assert record["backward_measured"] is None and record["passed"] is True


def test_ranks_needs_run(capsys):
    assert main(TUTORIAL + ["--ranks", "4"]) == 2
    assert "--ranks N simulates the ranks of --run; add --run" in capsys.readouterr().err


def test_conflicting_flags_are_refused_naming_both(capsys):
    """--repeat without --run was accepted and dropped, and one operator fixed twice kept the last strategy:
    each is refused in one line now; the same strategy twice (spaced otherwise) is still one fix."""
    assert main(TUTORIAL + ["--repeat", "5"]) == 2
    assert unfold(capsys.readouterr().err) == ("spmdsim: error: --repeat 5 counts the forward passes of "
                                               "--run; add --run\n")
    # --run --repeat 0 printed a table and PASS after no forward pass at all
    assert main(TUTORIAL + ["--run", "--repeat", "0"]) == 2
    assert unfold(capsys.readouterr().err) == ("spmdsim: error: --repeat 0 must be at least 1 (forward "
                                               "passes of --run)\n")
    # --run --repeat 10**30 ran forward passes till killed
    assert main(TUTORIAL + ["--run", "--repeat", "1001"]) == 2
    assert unfold(capsys.readouterr().err) == (
        "spmdsim: error: --repeat 1,001 is too many; expected at most 1,000 (forward passes of --run, each of the "
        "whole network on every rank: the median of a few is the measure)\n")
    assert main(TUTORIAL + ["--fix", "MatMul1=((2,4),(4,1))", "--fix", "MatMul1=((8,1),(1,1))"]) == 2
    assert unfold(capsys.readouterr().err) == (
        "spmdsim: error: --fix MatMul1=((2,4),(4,1)) and --fix MatMul1=((8,1),(1,1)) hold MatMul1 two ways; "
        "give one\n")
    assert main(TUTORIAL + ["--fix", "MatMul1=((2,4),(4,1))", "--json"]) == 0
    once = json.loads(capsys.readouterr().out)
    assert main(TUTORIAL + ["--fix", "MatMul1=((2,4),(4,1))", "--fix", "MatMul1=((2, 4), (4, 1))", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == once


def test_a_slow_choice_says_it_is_still_working(capsys, monkeypatch):
    import time

    from spmdsim.tools.cli import autoshard as cli
    from spmdsim.tools.cli import autoshard_common

    real = cli._choose
    monkeypatch.setattr(autoshard_common, "PATIENCE_S", 0.02)
    monkeypatch.setattr(cli, "_choose", lambda *a: (time.sleep(0.1), real(*a))[1])
    assert main(TUTORIAL) == 0
    out, err = capsys.readouterr()
    assert "spmdsim: still pricing net_mindspore_tutorial on 8 devices after 0 s" in err
    assert "total" in out  # the choice itself still goes to stdout


def test_a_quick_choice_prints_nothing_on_stderr(capsys):
    assert main(TUTORIAL) == 0
    assert capsys.readouterr().err == ""


def test_dropout_is_the_machine_searchs_and_its_estimate_command_carries_it(capsys):
    """--dropout 0 (Llama trains without dropout: no masks kept) prices every configuration without dropout's
    kernels and masks, and the chosen one's `spmdsim estimate` command says it, so it prints the same step;
    without --machine, or out of [0, 1), one line."""
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=64,vocab=128,batch=4",
            "--devices", "4", "--fix", "cp=1", "--fix", "pp=1", "--machine", "h100-dgx", "--json"]
    assert main(argv) == 0
    with_dropout = json.loads(capsys.readouterr().out)
    assert main(argv + ["--dropout", "0"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert "--dropout" not in with_dropout["estimate_command"]
    command = without["estimate_command"]
    assert " --dropout 0 " in command and without["chosen"]["peak"] < with_dropout["chosen"]["peak"]
    assert main(command.split()[1:]) == 0
    step_ms = without["chosen"]["step_s"] * 1e3
    assert f"predicted step time: {step_ms:.3f} ms" in capsys.readouterr().out
    for extra, message in ((["--dropout", "0"], "--dropout 0 is an option of the search by predicted step time: "
                                                "give --machine NAME|PATH too"),
                           (["--machine", "h100-dgx", "--dropout", "1.5"],
                            "--dropout 1.5 must be a finite number in [0, 1)")):
        assert main(argv[:7] + extra) == 2
        assert unfold(capsys.readouterr().err).rstrip("\n") == f"spmdsim: error: {message}"
