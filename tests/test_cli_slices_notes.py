"""`spmdsim slices/explain/show` notes from the audit: pending sums, size-1 axes, multi-axis hints."""
from __future__ import annotations

import json

import pytest

from spmdsim.tools.cli.main import main

SBP_P = ["--sbp", "S(0),P", "--placement", "2,4", "--shape", "8,8"]
SEED2_FLAGS = ["--device-matrix", "4,1,1,2,1", "--alias", "a,b,c,d,e", "--tensor-map", "b,d,e,a",
               "--shape", "1,2,1,4"]


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err.replace("\n  ", " ")  # an error folded within 100 columns, joined back


def test_slices_names_the_partial_axes(capsys):
    code, out, _ = _run(["slices", *SBP_P], capsys)
    assert code == 0
    assert out.splitlines()[-1] == (
        ' "partial": {"axes": ["axis_1"], "note": "partial over axis_1: ranks differing only there hold addends, '
        'not copies; the value is their sum"}}'
    )
    data = json.loads(out)
    assert data["partial"]["axes"] == ["axis_1"]
    # Same slices as S(0),B; only the partial line tells them apart.
    code, plain, _ = _run(["slices", "--sbp", "S(0),B", "--placement", "2,4", "--shape", "8,8"], capsys)
    assert json.loads(plain) == {"rank_slices": data["rank_slices"]}
    assert "partial" not in plain


def test_show_and_explain_say_nothing_about_copies_for_size1_axes(capsys):
    code, out, _ = _run(["show", *SEED2_FLAGS], capsys)
    assert code == 0 and "replicated" not in out and "copies" not in out
    code, out, _ = _run(["explain", *SEED2_FLAGS], capsys)
    assert code == 0 and "replica" not in out


def test_explain_partial_demo_and_show_agree(capsys):
    code, out, _ = _run(["explain", *SBP_P], capsys)
    assert "     0      0  (0, 0)         [0:4, 0:8]  0 1 2 3 4 5 6 7 8 9 ... (32 values)" in out
    assert "     1      0  (0, 0)         [0:4, 0:8]  0 0 0 0 0 0 0 0 0 0 ... (32 values)" in out
    code, shown, _ = _run(["show", *SBP_P], capsys)
    assert "  partial over axis_1: ranks differing only there hold addends, not copies; the\n" in shown
    assert "| r0+1+2+3 |" in shown


def test_explain_no_values_reason(capsys):
    code, out, _ = _run(["explain", "--device-matrix", "4", "--alias", "x", "--tensor-map", "x",
                         "--shape", "16", "--no-values"], capsys)
    assert code == 0
    assert out.endswith("Note: values omitted because --no-values was given.\n")


HINT = 'for one dim split over b then a, write "((b,a))" (JSON: [["b", "a"]])'


@pytest.mark.parametrize(
    "argv",
    [
        ["--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", "(b,a)", "--shape", "4"],
        ["--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", "b,a", "--shape", "4"],
        ["--partition-spec", "(b,a)", "--device-matrix", "2,2", "--alias", "a,b", "--shape", "4"],
    ],
)
def test_too_many_entries_for_1d_hints_at_one_multi_axis_entry(argv, capsys):
    code, out, err = _run(["slices", *argv], capsys)
    assert code == 2 and out == ""
    assert "has 2 entries" in err and err.rstrip().endswith(HINT)


def test_multi_axis_hint_only_where_it_fits(capsys):
    # A None entry, or a shape of several dims: no single-entry reading, no hint.
    for tmap, shape in (("b,None", "4"), ("b,a", "4,4,4")):
        code, _, err = _run(["slices", "--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", tmap,
                             "--shape", shape], capsys)
        assert code == 2 and "has 2 entries" in err and "write" not in err
    # The hinted form works: one dim over b then a (b major).
    code, out, _ = _run(["slices", "--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", "((b,a))",
                         "--shape", "4"], capsys)
    assert json.loads(out)["rank_slices"] == {"0": [[0, 1]], "1": [[2, 3]], "2": [[1, 2]], "3": [[3, 4]]}


def test_multi_axis_hint_for_json_case(capsys, monkeypatch):
    import io

    case = {"device_matrix": [2, 2, 2], "alias_name": ["a", "b", "c"], "tensor_map": ["c", "a", "b"],
            "shape": [8]}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(case)))
    code, _, err = _run(["slices"], capsys)
    assert code == 2
    assert 'for one dim split over c then a then b, write "((c,a,b))" (JSON: [["c", "a", "b"]])' in err
