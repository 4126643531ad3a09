"""`spmdsim convert`: one layout in six dialects, each form read back by `spmdsim slices`."""
from __future__ import annotations

import json
import shlex

import pytest

from spmdsim.cli.main import main

CASES = {
    "rows-two-copies": ["--device-matrix", "2,4", "--alias", "dp,mp", "--tensor-map", "mp,None",
                        "--shape", "8,6"],
    "sp-dp-major": ["--device-matrix", "2,2,2", "--alias", "dp,sp,mp", "--tensor-map", "mp,(sp,dp)",
                    "--shape", "32,784"],
    "pending-sum": ["--sbp", "S(0),P", "--placement", "2,4", "--shape", "8,8"],
    "columns": ["--placements", "S(1)", "--device-matrix", "8", "--shape", "8,16"],
}


def _slices(capsys, argv):
    assert main(["slices", *argv]) == 0, argv
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", CASES)
def test_every_form_reads_back_to_the_same_blocks_or_says_why_not(capsys, name):
    argv = CASES[name]
    assert main(["convert", *argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    forms = {f["dialect"]: f for f in record["forms"]}
    assert list(forms) == ["MindSpore Layout", "MindSpore .shard", "OneFlow SBP", "PyTorch DTensor",
                           "JAX PartitionSpec", "Paddle split"]
    want = _slices(capsys, argv)
    for form in forms.values():
        if form["text"] is None:
            assert form["note"] and form["flags"] is None  # says why it cannot
            continue
        if form["flags"] is None:
            continue  # Paddle's split() is an operator call, not a `slices` form
        got = _slices(capsys, shlex.split(form["flags"]) + ["--shape", ",".join(map(str, record["shape"]))])
        if form["note"]:  # the same cut, numbered otherwise: the blocks must differ
            assert got["rank_slices"] != want["rank_slices"], form
        else:
            assert got == want, form


def test_what_each_dialect_can_and_cannot_say(capsys):
    def forms(name):
        assert main(["convert", *CASES[name], "--json"]) == 0
        return {f["dialect"]: f for f in json.loads(capsys.readouterr().out)["forms"]}

    rows = forms("rows-two-copies")
    assert rows["OneFlow SBP"]["text"] == "(B, S(0))" and rows["PyTorch DTensor"]["text"] == "(R, S(0))"
    assert rows["MindSpore .shard"]["text"] == "((4, 1),)"
    assert "rank 1 would hold [0:2, 0:6] instead of [2:4, 0:6]" in rows["MindSpore .shard"]["note"]
    assert rows["Paddle split"]["text"] is None
    major = forms("sp-dp-major")
    assert major["OneFlow SBP"]["text"] is None and "_StridedShard" in major["PyTorch DTensor"]["note"]
    assert major["JAX PartitionSpec"]["text"] == "PartitionSpec('mp', ('sp', 'dp'))"
    pending = forms("pending-sum")
    assert pending["JAX PartitionSpec"]["text"] is None and pending["MindSpore .shard"]["text"] is None
    assert pending["PyTorch DTensor"]["text"] == "(S(0), P)"
    columns = forms("columns")
    assert columns["Paddle split"]["text"] == (
        'split(x, (8, 16), operation="linear", axis=1, num_partitions=8)')
    assert main(["convert", *CASES["rows-two-copies"]]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "  check: spmdsim slices --sbp \"B, S(0)\" --placement 2,4 --shape 8,6\n" in text
