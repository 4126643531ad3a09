"""`spmdsim slices / explain / show`: case parsing (JSON file, stdin, flags), output schema, errors."""
from __future__ import annotations

import io
import json

import pytest

from spmdsim.tools.cli.cases import case_from_dict, parse_tensor_map
from spmdsim.tools.cli.main import main
from spmdsim.errors import SpmdsimError

DESIGN_CASE = {
    "device_matrix": [2, 2, 2],
    "alias_name": ["dp", "sp", "mp"],
    "tensor_map": ["mp", ["sp", "dp"]],
    "shape": [32, 784],
}
DESIGN_SLICES = {
    "0": [[0, 16], [0, 196]],
    "1": [[16, 32], [0, 196]],
    "2": [[0, 16], [392, 588]],
    "3": [[16, 32], [392, 588]],
    "4": [[0, 16], [196, 392]],
    "5": [[16, 32], [196, 392]],
    "6": [[0, 16], [588, 784]],
    "7": [[16, 32], [588, 784]],
}
SEED1_FLAGS = ["--device-matrix", "2,1,2,2,1", "--alias", "a,b,c,d,e",
               "--tensor-map", "b,d,e,c,a", "--shape", "1,2,1,2,2"]


def _run(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err.replace("\n  ", " ")  # an error folded within 100 columns, joined back


def _check_schema(data, world, ndim):
    assert set(data) == {"rank_slices"}
    slices = data["rank_slices"]
    assert list(slices) == [str(r) for r in range(world)]
    for bounds in slices.values():
        assert len(bounds) == ndim
        for pair in bounds:
            assert len(pair) == 2 and all(isinstance(v, int) for v in pair)
            assert 0 <= pair[0] <= pair[1]


def test_slices_from_file(tmp_path, capsys):
    path = tmp_path / "case.json"
    path.write_text(json.dumps(DESIGN_CASE))
    code, out, _ = _run(["slices", str(path)], capsys)
    assert code == 0
    data = json.loads(out)
    _check_schema(data, 8, 2)
    assert data["rank_slices"] == DESIGN_SLICES


def test_slices_from_stdin(capsys, monkeypatch):
    code, out, _ = _run(["slices"], capsys, json.dumps(DESIGN_CASE), monkeypatch)
    assert code == 0 and json.loads(out)["rank_slices"] == DESIGN_SLICES
    code, out, _ = _run(["slices", "-"], capsys, json.dumps(DESIGN_CASE), monkeypatch)
    assert json.loads(out)["rank_slices"] == DESIGN_SLICES


def test_slices_from_flags_and_flags_override_file(tmp_path, capsys):
    code, out, _ = _run(["slices", "--device-matrix", "2,2,2", "--alias", "dp,sp,mp",
                         "--tensor-map", "mp,(sp,dp)", "--shape", "32,784"], capsys)
    assert json.loads(out)["rank_slices"] == DESIGN_SLICES
    path = tmp_path / "case.json"
    path.write_text(json.dumps(DESIGN_CASE))
    code, out, _ = _run(["slices", str(path), "--shape", "4,8"], capsys)
    assert json.loads(out)["rank_slices"]["4"] == [[0, 2], [2, 4]]


def test_slices_strategy_form(capsys, monkeypatch):
    case = {"strategy": [[2, 1, 2, 2, 1]], "world_size": 8, "shape": [2, 2, 2, 2, 2]}
    code, out, _ = _run(["slices"], capsys, json.dumps(case), monkeypatch)
    data = json.loads(out)
    _check_schema(data, 8, 5)
    assert data["rank_slices"]["5"] == [[1, 2], [0, 2], [0, 1], [1, 2], [0, 2]]
    # Fewer devices than ranks: neighbouring ranks repeat (MindSpore's default).
    case = {"strategy": "((2, 2),)", "world_size": 8, "shape": [4, 4]}
    code, out, _ = _run(["slices"], capsys, json.dumps(case), monkeypatch)
    slices = json.loads(out)["rank_slices"]
    assert slices["0"] == slices["1"] == [[0, 2], [0, 2]]
    assert slices["2"] == [[0, 2], [2, 4]]


def test_slices_sbp_form(capsys, monkeypatch):
    case = {"sbp": ["S(0)", "S(1)"], "placement": [2, 4], "shape": [4, 8]}
    code, out, _ = _run(["slices"], capsys, json.dumps(case), monkeypatch)
    slices = json.loads(out)["rank_slices"]
    assert slices["5"] == [[2, 4], [2, 4]]
    case = {"sbp": "S(0), S(0)", "placement": [2, 2], "shape": [4, 6]}
    code, out, _ = _run(["slices"], capsys, json.dumps(case), monkeypatch)
    assert json.loads(out)["rank_slices"]["2"] == [[2, 3], [0, 6]]


def test_slices_dtensor_and_jax_forms(tmp_path, capsys, monkeypatch):
    # PyTorch DTensor: Shard(0) on mesh dim 0 (size 2), Replicate on dim 1 (size 4).
    case = {"placements": "S(0), R", "device_matrix": [2, 4], "shape": [4, 8]}
    code, out, _ = _run(["slices"], capsys, json.dumps(case), monkeypatch)
    assert code == 0 and json.loads(out)["rank_slices"]["5"] == [[2, 4], [0, 8]]
    code, out, _ = _run(["slices", "--placements", "(Replicate(), Shard(1))", "--device-matrix", "2,4",
                         "--shape", "4,8"], capsys)
    assert json.loads(out)["rank_slices"]["5"] == [[0, 4], [2, 4]]
    # JAX: the same as a tensor map over named axes; a short spec is padded with None.
    code, out, _ = _run(["slices", "--partition-spec", "('y',)", "--device-matrix", "2,4", "--alias", "x,y",
                         "--shape", "8,6"], capsys)
    assert json.loads(out)["rank_slices"]["6"] == [[4, 6], [0, 6]]
    # --device-matrix on the command line gives the file's DTensor case a new mesh.
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    code, out, _ = _run(["slices", str(path), "--device-matrix", "4,2"], capsys)
    assert json.loads(out)["rank_slices"]["2"] == [[1, 2], [0, 8]]
    code, out, err = _run(["slices", "--partition-spec", "x", "--device-matrix", "8", "--shape", "8"], capsys)
    assert code == 2 and "--alias is missing (case key 'alias_name'), needed by the JAX PartitionSpec form" in err


@pytest.mark.parametrize(
    "case, words",
    [
        ({"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["x"]}, ["'shape'"]),
        ({"placements": "S(2)", "device_matrix": [2], "shape": [4]}, ["S(2)", "1 dim"]),
        ({"placements": "S(0)", "device_matrix": [2], "tensor_map": ["x"], "shape": [4]}, ["mixes"]),
        ({"device_matrix": [2], "tensor_map": ["x"], "shape": [4]}, ["'alias_name'"]),
        ({"device_matrix": "2x2", "alias_name": ["x"], "tensor_map": ["x"], "shape": [4]},
         ["'device_matrix'", "comma-separated integers"]),
        ({"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["x"], "shape": [4.5]},
         ["'shape'", "non-negative integers", "4.5"]),
        ({"device_matrix": [2], "alias_name": ["x"], "tensor_map": [3], "shape": [4]},
         ["'tensor_map'", "3"]),
        ({"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["x"], "shape": [4], "shpe": 1},
         ["unknown key 'shpe'"]),
        ({"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["x"], "shape": [4],
          "strategy": [[2]]}, ["mixes"]),
        ({"shape": [4]}, ["no layout"]),
        ({"strategy": 2, "shape": [4]}, ["'strategy'"]),
        ({"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["y"], "shape": [4]},
         ["unknown alias 'y'"]),
        ({"device_matrix": [2], "alias_name": ["x"], "tensor_map": ["x"], "shape": [3]},
         ["not divisible"]),
        ([1, 2], ["json object"]),
    ],
)
def test_bad_cases_name_the_key(case, words):
    with pytest.raises(SpmdsimError) as info:
        case_from_dict(case)
    for word in words:
        assert word in str(info.value).lower() or word in str(info.value)


def test_cli_error_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    code, out, err = _run(["slices"], capsys, '{"device_matrix": [2]}', monkeypatch)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("spmdsim: error: ")
    code, _, err = _run(["slices", str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "cannot read case file" in err
    code, _, err = _run(["slices"], capsys, "{not json", monkeypatch)
    assert code == 2 and "stdin is not valid JSON" in err


def test_a_word_parted_from_its_flag_by_a_space_is_said_to_be_one(capsys):
    # `--tensor-map mp None` (or `--placements S(0), R`) read the stray word as a case file:
    # "cannot read case file 'None': No such file or directory", no word of the flag it belonged to.
    for argv, word in ((["--device-matrix", "2,4", "--alias", "dp,mp", "--tensor-map", "mp", "None"], "None"),
                       (["--placements", "S(0),", "R", "--device-matrix", "2,4"], "R")):
        code, out, err = _run(["slices", *argv, "--shape", "8,8"], capsys)
        assert (code, out) == (2, "") and err.replace("\n  ", " ") == (
            f"spmdsim: error: cannot read case file {word!r}: No such file or directory; beside the flags, a word "
            "that no flag takes is read as a case file: write a flag's value as one word, its entries parted by "
            "commas (--tensor-map mp,None), or quote it (--placements \"S(0), R\")\n")


def test_parse_tensor_map_forms():
    assert parse_tensor_map("b,d,e,c,a") == ("b", "d", "e", "c", "a")
    assert parse_tensor_map('("mp", ("sp", "dp"), None)') == ("mp", ("sp", "dp"), None)
    assert parse_tensor_map("mp,[sp,dp],None") == ("mp", ("sp", "dp"), None)
    assert parse_tensor_map("(sp,dp),") == (("sp", "dp"),)
    assert parse_tensor_map("(x)") == ("x",)
    with pytest.raises(SpmdsimError, match=r"tensor map 'a,,b' has an empty entry for tensor dim 1; write None"):
        parse_tensor_map("a,,b")


def test_explain_cli_text_and_json(capsys):
    code, out, _ = _run(["explain", *SEED1_FLAGS], capsys)
    assert code == 0 and "Step 3." in out
    assert "0*8 + 1*4 + 0*4 + 0*2 + 0*1 = 4" in out
    code, out, _ = _run(["explain", "--json", *SEED1_FLAGS], capsys)
    data = json.loads(out)
    assert [r["values"] for r in data["ranks"]] == [[v] for v in [0, 4, 2, 6, 1, 5, 3, 7]]


def test_explain_cli_strategy(capsys):
    code, out, _ = _run(["explain", "--strategy", "((2,1,1,2,1),)", "--world-size", "8",
                         "--shape", "2,1,1,2,1", "--json"], capsys)
    data = json.loads(out)
    assert data["strategy"] == [2, 1, 1, 2, 1]
    assert [r["shard_number"] for r in data["ranks"]] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_show_cli_ascii_and_png(tmp_path, capsys):
    code, out, _ = _run(["show", *SEED1_FLAGS], capsys)
    assert code == 0 and "x[:, 1:2, :, :, :]" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    pytest.importorskip("matplotlib")
    target = tmp_path / "seed.png"
    code, out, _ = _run(["show", *SEED1_FLAGS, "--png", str(target)], capsys)
    assert code == 0 and out.rstrip().endswith(f"wrote {target}")
    assert target.read_bytes()[:4] == b"\x89PNG"


def test_show_rejects_unknown_picture_type_before_printing(tmp_path, capsys):
    code, out, err = _run(["show", *SEED1_FLAGS, "--png", str(tmp_path / "a.jpg")], capsys)
    assert code == 2 and out == ""
    assert "must end in one of ('.png', '.svg', '.pdf')" in err


def test_matmul_strategy_operands_show_seed_001(capsys):
    # Seed 001: MatMul.shard(((2, 1), (1, 4))) on 8 devices: devices 0-3 hold X0, 4-7 X1;
    # device r holds W's column block r % 4; the output is (m, n)-split, no pending sum.
    base = ["slices", "--strategy", "((2,1),(1,4))", "--world-size", "8"]
    code, out, _ = _run(base + ["--operand", "x", "--shape", "4,6"], capsys)
    assert code == 0
    x = json.loads(out)["rank_slices"]
    assert [x[str(r)][0] for r in range(8)] == [[0, 2]] * 4 + [[2, 4]] * 4
    code, out, _ = _run(base + ["--operand", "w", "--shape", "6,8"], capsys)
    w = json.loads(out)["rank_slices"]
    assert [w[str(r)][1] for r in range(8)] == [[2 * (r % 4), 2 * (r % 4) + 2] for r in range(8)]
    code, out, _ = _run(base + ["--operand", "out", "--shape", "4,8"], capsys)
    assert code == 0 and "partial" not in json.loads(out)
    # A split K makes the output a pending sum over k, which slices names.
    code, out, _ = _run(["slices", "--strategy", "((2,4),(4,1))", "--operand", "out", "--shape", "4,8"], capsys)
    assert json.loads(out)["partial"]["axes"] == ["k"]
    # Without --operand a two-tensor strategy says what to add; --operand needs a MatMul strategy.
    code, _, err = _run(["slices", "--strategy", "((2,1),(1,4))", "--shape", "4,8"], capsys)
    assert code == 2 and "for a MatMul strategy add --operand x, w or out" in err
    # Named as typed, the flag first (it said "case key 'strategy'" alone, to a user of the flag), with an
    # example of this shape's length (it showed a 5-dim [[2, 1, 2, 2, 1]] for a 2-dim tensor).
    assert " ".join(err.split()).startswith(
        "spmdsim: error: --strategy '((2,1),(1,4))' (case key 'strategy') gives 2 tensors; expected one tensor's "
        "strategy such as '((2, 1),)';")
    code, _, err = _run(["slices", "--strategy", "((2,4),)", "--operand", "x", "--shape", "4,8"], capsys)
    assert code == 2 and "operand 'x' goes with a MatMul strategy of two tensors" in err


def test_cases_without_alias_name_the_axes_axis_0_axis_1(capsys, monkeypatch):
    """docs/reference/dialects.md: mesh axes not named are axis_0, axis_1, ... everywhere; the layout and JAX forms
    of a case still required --alias (`plan` did not). Now they take the default names, and refuse a
    map that names other axes, naming it."""
    want = {"0": [[0, 4], [0, 8]], "3": [[0, 4], [0, 8]], "4": [[4, 8], [0, 8]]}
    layout_case = {"device_matrix": [2, 4], "tensor_map": ["axis_0", None], "shape": [8, 8]}
    for argv, stdin in [(["slices"], json.dumps(layout_case)),
                        (["slices", "--partition-spec", "('axis_0', None)", "--device-matrix", "2,4",
                          "--shape", "8,8"], None),
                        (["slices", "--tensor-map", "axis_0,None", "--device-matrix", "2,4", "--shape", "8,8"],
                         None)]:
        code, out, err = _run(argv, capsys, stdin, monkeypatch)
        assert code == 0, err
        assert {r: s for r, s in json.loads(out)["rank_slices"].items() if r in want} == want
    for command in ("explain", "show", "convert"):
        code, out, err = _run([command], capsys, json.dumps(layout_case), monkeypatch)
        assert code == 0, err
        assert ('Layout((2, 4), ("axis_0", "axis_1"))' if command != "show" else "on Layout(axis_0=2, axis_1=4)") in out
    code, out, err = _run(["slices", "--tensor-map", "axis_1,None", "--device-matrix", "2,4", "--shape", "8,8",
                           "--partial", "dp"], capsys)
    assert code == 2 and " ".join(err.split()) == (
        "spmdsim: error: --alias is missing (case key 'alias_name'), needed by the layout form: axis 'dp' is "
        "none of the default names axis_0, axis_1")
    code, out, err = _run(["slices", "--partition-spec", "(None, 'mp')", "--device-matrix", "2,4",
                           "--shape", "8,8"], capsys)
    assert code == 2 and " ".join(err.split()) == (
        "spmdsim: error: --alias is missing (case key 'alias_name'), needed by the JAX PartitionSpec form: axis "
        "'mp' is none of the default names axis_0, axis_1")


def test_an_integer_tensor_map_gets_mindspore_s_hint_and_the_map_by_name(capsys, monkeypatch):
    """MindSpore's tensor_map numbers the device matrix's axes from the right (-1: none); spmdsim reads
    names only. Without --alias the refusal said only that '1' is no default name; now it says what the
    number is and writes the map by the default names (axis_0 is the left axis: number 1 of 2)."""
    code, _, err = _run(["slices", "--tensor-map=1,-1", "--device-matrix", "2,4", "--shape", "8,8"], capsys)
    assert code == 2 and " ".join(err.split()) == (
        "spmdsim: error: --alias is missing (case key 'alias_name'), needed by the layout form: axis '1' is "
        "none of the default names axis_0, axis_1 (an axis number? MindSpore's integer tensor_map is not read: "
        "write the axis's name; this map by name is --tensor-map axis_0,None)")
    code, out, err = _run(["slices", "--tensor-map", "axis_0,None", "--device-matrix", "2,4", "--shape", "8,8"],
                          capsys)
    assert code == 0 and json.loads(out)["rank_slices"]["4"] == [[4, 8], [0, 8]], err  # the map it wrote
    case = {"device_matrix": [2, 4], "alias_name": ["dp", "mp"], "tensor_map": [0, 1], "shape": [8, 8]}
    code, _, err = _run(["slices"], capsys, json.dumps(case), monkeypatch)
    assert code == 2 and " ".join(err.split()) == (
        "spmdsim: error: case key 'tensor_map' entry 0 must be an axis name, null or a list of axis names (an "
        "axis number? MindSpore's integer tensor_map is not read: write the axis's name; this map by name is "
        '["mp", "dp"])')
    # A number no axis has: the hint without a map.
    code, _, err = _run(["slices", "--tensor-map", "2,0", "--device-matrix", "2,4", "--shape", "8,8"], capsys)
    assert code == 2 and err.rstrip().endswith("(an axis number? MindSpore's integer tensor_map is not read: "
                                               "write the axis's name)")


def test_slices_takes_json_as_the_commands_that_print_json_do(capsys):
    """`spmdsim slices --json` was 'unrecognized arguments: --json', where explain, convert and plan take it;
    its output is JSON with or without the flag."""
    from spmdsim.tools.cli.main import main

    argv = ["slices", "--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", "a,None", "--shape", "4,4"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv + ["--json"]) == 0
    assert capsys.readouterr().out == plain and json.loads(plain)["rank_slices"]["3"] == [[2, 4], [0, 4]]


def test_the_commands_slices_json_help_names_take_json():
    """slices' --json help names the commands it takes the flag as; each of them does (it said every command,
    which show, pipeline and context are not: they draw text and refuse --json)."""
    from spmdsim.tools.cli.main import SUBCOMMANDS, build_parser

    subparsers = build_parser()._subparsers._group_actions[0].choices
    said = next(a.help for a in subparsers["slices"]._actions if "--json" in a.option_strings)
    named = [name for name in SUBCOMMANDS if "every command" in said or f" {name}" in said]
    takes = [name for name in named if any("--json" in a.option_strings for a in subparsers[name]._actions)]
    assert named and takes == named, said


@pytest.mark.parametrize("flags, words", [
    (["--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", "a,None", "--operand", "w"],
     "--operand 'w' (case key 'operand') picks a tensor of a MatMul --strategy"),
    (["--sbp", "S(0),B", "--placement", "2,2", "--operand", "x"], "the sbp form gives one tensor's layout"),
    (["--placements", "S(0),R", "--device-matrix", "2,2", "--world-size", "16"],
     "--world-size 16 (case key 'world_size') does not match --device-matrix '2,2'"),
    (["--partition-spec", "('x', None)", "--device-matrix", "2,2", "--alias", "x,y", "--world-size", "8"],
     "which has 4 devices; expected 4"),
])
def test_an_option_the_form_does_not_read_is_refused_not_ignored(flags, words, capsys):
    """--operand outside a MatMul strategy, and --world-size beside DTensor placements or a JAX spec, were
    ignored: the slices printed were another layout's than the one the options asked for."""
    code, out, err = _run(["slices", *flags, "--shape", "4,2"], capsys)
    assert code == 2 and out == "" and words in err


@pytest.mark.parametrize("argv, words", [
    (["slices", "--device-matrix", "2", "--alias", "a", "--tensor-map", "a,None", "--shape", "4,,2"],
     "--shape '4,,2' has an empty entry"),
    (["slices", "--device-matrix", "2,,2", "--alias", "a,b", "--tensor-map", "a,None", "--shape", "4,2"],
     "--device-matrix '2,,2' has an empty entry"),
    (["slices", "--device-matrix", "2,2", "--alias", "a,,b", "--tensor-map", "a,None", "--shape", "4,2"],
     "--alias 'a,,b' must be comma-separated axis names"),
    (["run", "matmul", "--strategy", "((2,1),(1,4))", "--shape", "8,,8,8", "--ranks", "8"],
     "--shape '8,,8,8' has an empty entry"),
    (["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x", "--shape", "64,,64"],
     "--shape '64,,64' has an empty entry"),
])
def test_an_empty_entry_in_a_list_of_sizes_or_names_is_refused(argv, words, capsys):
    """'4,,2' (a size left out) was read as 4,2: the command answered for a tensor of another rank
    (`run matmul --shape 8,,8,8` ran an unbatched 8x8x8 MatMul and said PASS)."""
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == "" and words in err
    assert _run(["slices", "--device-matrix", "2,", "--alias", "a,", "--tensor-map", "a,", "--shape", "4,"],
                capsys)[0] == 0  # a trailing comma, as in Python's (4,), is still fine


def test_partial_beside_a_dialect_form_is_refused_in_that_form_s_terms(capsys):
    """--partial over an axis the placements (a PartitionSpec, an SBP, a strategy) already split was refused
    naming the tensor map the form became, ("axis_0", None), which the user never wrote."""
    code, _, err = _run(["slices", "--placements", "S(0),R", "--device-matrix", "2,2", "--shape", "4,2",
                         "--partial", "axis_0"], capsys)
    assert code == 2 and " ".join(err.split()) == (
        "spmdsim: error: --partial 'axis_0' (case key 'partial'): --placements 'S(0),R' (case key 'placements') "
        "splits tensor dim 0 over mesh axis 'axis_0', which cannot also hold pending sums; expected an axis the "
        "tensor is not split over: axis_1")
    code, _, err = _run(["slices", "--sbp", "S(0),B", "--placement", "2,2", "--shape", "4,2", "--partial", "zz"],
                        capsys)
    assert code == 2 and " ".join(err.split()) == (
        "spmdsim: error: --partial 'zz' (case key 'partial') is no mesh axis of --sbp 'S(0),B' (case key 'sbp'); "
        "expected one of axis_0, axis_1")
    code, out, err = _run(["slices", "--placements", "S(0),R", "--device-matrix", "2,2", "--shape", "4,2",
                           "--partial", "axis_1"], capsys)
    assert code == 0 and json.loads(out)["partial"]["axes"] == ["axis_1"], err
    # `plan` read its --from-partial/--to-partial the same way
    code, _, err = _run(["plan", "--device-matrix", "2,2", "--from-placements", "S(0),R", "--from-partial", "axis_0",
                         "--to", "None,None", "--shape", "4,4"], capsys)
    assert code == 2 and " ".join(err.split()) == (
        "spmdsim: error: --from-partial 'axis_0': --from-placements 'S(0),R' splits tensor dim 0 over mesh axis "
        "'axis_0', which cannot also hold pending sums; expected an axis the tensor is not split over: axis_1")
