"""`spmdsim convert`: one layout in six dialects, each form read back by `spmdsim slices`."""
from __future__ import annotations

import json
import shlex

import pytest

from spmdsim.tools.cli.main import main

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
        if "another rank numbering" in form["note"]:  # the same cut, numbered otherwise: the blocks must differ
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


def test_the_layout_form_is_python_mindspore_runs(capsys):
    # MindSpore's Layout refuses Python's None in a tensor map ("The axis None is not found in ..."): a dim
    # not split is the string "None"; spmdsim's own keywords are said to be spmdsim's.
    def layout_form(argv):
        assert main(["convert", *argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["forms"][0]

    rows = layout_form(CASES["rows-two-copies"])
    assert rows["text"] == 'Layout((2, 4), ("dp", "mp"))("mp", "None")' and rows["note"] == ""
    pending = layout_form(CASES["pending-sum"])
    assert pending["text"] == 'Layout((2, 4), ("axis_0", "axis_1"))("axis_0", "None", partial=("axis_1",))'
    assert "spmdsim's partial=" in pending["note"] and "no pending sums" in pending["note"]
    uneven = layout_form(["--placements", "S(0),R", "--device-matrix", "2,4", "--shape", "7,8"])
    assert uneven["text"] == 'Layout((2, 4), ("axis_0", "axis_1"), cut=\'chunk\')("axis_0", "None")'
    assert "spmdsim's cut=" in uneven["note"]
    from spmdsim import Layout  # the text is spmdsim's Python too: it builds the layout it names

    assert eval(pending["text"], {"Layout": Layout}) == Layout((2, 4), ("axis_0", "axis_1"))(
        "axis_0", None, partial="axis_1")


def _holdings(tl, shape) -> tuple:
    """Rank by rank: its block, and which ranks hold the same addend of it (copies)."""
    layout = tl.layout
    key = {r: (tl.bounds(r, shape), tuple(layout.coords(r)[layout.axis_index(a)] for a in tl.addend_axes))
           for r in range(layout.num_devices)}
    return tuple((key[r][0], tuple(q for q in key if key[q] == key[r])) for r in key)


def test_every_printed_check_line_reads_back_on_random_layouts(capsys, tmp_path):
    """A map of one multi-axis entry was printed --tensor-map "(a,b)", which slices reads as two entries
    (and refuses), and a 0-d tensor's check line ended in a bare --shape: every check line convert prints,
    text and --json, now goes through the slices parser to the input's blocks rank by rank (or, where
    the form says so, the same blocks numbered otherwise)."""
    import numpy as np

    from spmdsim.tools.cli.cases import case_from_args
    from spmdsim.tools.cli.main import build_parser
    from test_uneven import random_layout, random_map

    parser = build_parser(("slices",))
    rng = np.random.default_rng(29)
    multi = 0
    for case in range(120):
        cut = ("even", "chunk", "balanced")[case % 3]
        layout, tl = random_layout(rng, cut, ndim=int(rng.integers(0, 4)))
        if case % 7 == 0:
            tl = random_map(rng, layout, 1)
        free = [a for a in layout.alias_name if a not in tl.split_axes]
        if case % 4 == 1 and free:
            tl = tl.with_partial(free[-1])
        shape = tuple(int(n) * (12 if cut == "even" else 1) for n in rng.integers(1, 10, size=tl.ndim))
        multi += len(tl.tensor_map) == 1 and len(tl.tensor_map[0] or ()) > 1
        path = tmp_path / f"case{case}.json"
        path.write_text(json.dumps({"device_matrix": list(layout.device_matrix), "alias_name": list(layout.alias_name),
                                    "tensor_map": [list(e) if e else None for e in tl.tensor_map],
                                    "shape": list(shape), "partial": list(tl.partial), "cut": cut}))
        assert main(["convert", str(path), "--json"]) == 0
        forms = json.loads(capsys.readouterr().out)["forms"]
        assert main(["convert", str(path)]) == 0
        text = capsys.readouterr().out.replace(" \\\n", " ")
        checks = [shlex.split(line.split("check: spmdsim ", 1)[1]) for line in text.splitlines() if "check: " in line]
        assert len(checks) == sum(f["flags"] is not None for f in forms)
        want = _holdings(tl, shape)
        for argv, form in zip(checks, [f for f in forms if f["flags"] is not None]):
            assert argv == ["slices", *shlex.split(form["flags"]), "--shape", ",".join(map(str, shape))], form
            assert main(argv) == 0, (argv, capsys.readouterr().err)
            capsys.readouterr()
            back = case_from_args(parser.parse_args(argv))
            got = _holdings(back.tensor_layout, back.shape)
            if form["note"] and form["dialect"] != "MindSpore Layout":  # the same cut, numbered otherwise
                assert "another rank numbering" in form["note"] and got != want
                assert sorted(b for b, _ in got) == sorted(b for b, _ in want), (form, tl, shape)
            else:
                assert got == want, (form, str(tl), shape)
    assert multi >= 3


def test_paddle_form_of_an_uneven_cut_does_not_say_paddle_cuts_every_dim_evenly(capsys):
    # Paddle's own embedding split gives the last rank the remainder (docs/reference/dialects.md): the note said
    # "Paddle's split() cuts every dim evenly".
    assert main(["convert", "--device-matrix", "4", "--alias", "mp", "--tensor-map", "mp,None",
                 "--shape", "10,8", "--cut", "balanced", "--json"]) == 0
    paddle = {f["dialect"]: f for f in json.loads(capsys.readouterr().out)["forms"]}["Paddle split"]
    assert paddle["text"] is None
    assert paddle["note"] == ("spmdsim's split() cuts only evenly, as Paddle's linear split does (Paddle's embedding "
                              "split gives the last rank the remainder, which spmdsim does not model): dim 0 of "
                              "size 10 does not divide into 4 shards")
