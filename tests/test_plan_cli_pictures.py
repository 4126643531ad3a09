"""`spmdsim plan --show/--png`: the step-by-step pictures from the command line."""
from __future__ import annotations

import json
import os

import pytest

from spmdsim import Layout
from spmdsim.tools.cli.main import main
from spmdsim.programs.plan import plan_redistribution
from testkit import unfold

ARGS = ["plan", "--device-matrix", "2,4", "--alias", "a,b", "--from", "(a,b),None",
        "--to", "b,a", "--shape", "8,8"]
MESH = Layout((2, 4), ("a", "b"))
PLAN = plan_redistribution(MESH(("a", "b"), None), MESH("b", "a"), (8, 8), "float32")


def test_show_draws_every_step_in_ascii(capsys):
    assert main(ARGS + ["--show"]) == 0
    out = capsys.readouterr().out
    assert 'Before: (("a", "b"), None) on Layout(a=2, b=4)' in out
    assert len(PLAN.steps) >= 1
    for i, step in enumerate(PLAN.steps, 1):
        assert f"Step {i}. {step}" in out
        assert f"After step {i}: {step.after}" in out
    assert f"Step {len(PLAN.steps) + 1}." not in out
    assert all(len(line) <= 80 for line in out.splitlines() if "|" in line)


def test_png_writes_one_picture_per_step(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # the 'plot' extra (the README's test command installs it)
    assert main(ARGS + ["--png", str(tmp_path)]) == 0
    files = sorted(os.listdir(tmp_path))
    expected = ["step_00_source.png"] + [
        f"step_{i:02d}_{step.op}.png" for i, step in enumerate(PLAN.steps, 1)
    ]
    # Beside the layouts: the pieces each moving step sends (2-D tensors) and the byte matrix.
    moving = [f"moves_{i:02d}.png" for i, step in enumerate(PLAN.steps, 1) if any(step.bytes_received)]
    assert files == sorted(expected + moving + ["bytes.png"])
    assert all(os.path.getsize(tmp_path / f) > 1000 for f in files)
    assert f"wrote {len(files)} pictures" in capsys.readouterr().out


def test_plan_report_says_why_it_is_above_the_bound_and_where_predictions_come_from(capsys, monkeypatch,
                                                                                    tmp_path):
    monkeypatch.setenv("SPMDSIM_COST_FILE", str(tmp_path / "none.json"))  # no calibration: built-in model
    assert main(["plan", "--device-matrix", "2,4", "--alias", "p0,p1", "--from", "p0,None",
                 "--from-partial", "p1", "--to", "p0,None", "--shape", "8,8"]) == 0
    out = " ".join(capsys.readouterr().out.split(" "))  # long lines wrap at 100 columns
    out = out.replace("\n  ", " ")
    assert "lower bound 128 B (above it: with pending sums the bound counts each summed element once" in out
    assert "the whole tensor on every rank (Allreduce and Allgather, then slice) would receive 512 B" in out
    assert "predicted: alpha-beta cost model, built-in model (`spmdsim calibrate`" in out
    assert main(ARGS) == 0
    assert "(meets it on every rank)\n" in capsys.readouterr().out


def test_plan_takes_dtensor_placements(capsys):
    # PyTorch DTensor placements over the device matrix plan the same as the tensor maps they mean.
    base = ["plan", "--device-matrix", "2,4", "--alias", "dp,tp", "--shape", "64,64", "--json"]
    assert main(base + ["--from-placements", "S(0),R", "--to-placements", "R,S(1)"]) == 0
    by_placements = json.loads(capsys.readouterr().out)
    assert main(base + ["--from", "dp,None", "--to", "None,tp"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == by_placements["steps"]
    assert main(base + ["--from", "dp,None", "--from-placements", "S(0),R", "--to", "None,tp"]) == 2
    assert ("--from and --from-placements both give the source layout; expected one of --from, --from-sbp, "
            "--from-placements") in unfold(capsys.readouterr().err)


def test_plan_takes_partition_specs_and_placement(capsys):
    # JAX PartitionSpecs over the mesh's axis names; --placement is --device-matrix's other name.
    base = ["plan", "--placement", "2,4", "--alias", "dp,tp", "--shape", "64,64", "--json"]
    assert main(base + ["--from-partition-spec", "('dp', None)", "--to-partition-spec", "(None, ('tp', 'dp'))"]) == 0
    by_spec = json.loads(capsys.readouterr().out)
    assert main(base + ["--from", "dp,None", "--to", "None,(tp,dp)"]) == 0
    by_map = json.loads(capsys.readouterr().out)
    assert by_spec["steps"] == by_map["steps"] and by_spec["steps"]
    assert main(base + ["--from-sbp", "S(0),B", "--to-partition-spec", "(None, 'tp')"]) == 0
    capsys.readouterr()


def test_strategy_pairs_name_the_target_axes_apart(capsys):
    # Both sides used to print ("axis_0", "axis_1"), so the move read like a no-op.
    assert main(["plan", "--device-matrix", "8", "--from-strategy", "((4,1),)", "--to-strategy",
                 "((1,8),)", "--shape", "32,512"]) == 0
    head = " ".join(line.strip() for line in capsys.readouterr().out.splitlines()[:2])
    assert head == ('redistribute ("axis_0", "axis_1") -> ("to_0", "to_1") on Layout(axis_0=4, axis_1=1, rep=2) -> '
                    'Layout(to_0=1, to_1=8)')
