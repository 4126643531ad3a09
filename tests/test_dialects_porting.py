"""Layouts written as MindSpore, OneFlow and Paddle write them: read, or refused in one line naming the value."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import DialectError, Layout, LayoutError
from spmdsim.layouts.dialects import (
    partition_spec_to_layout,
    placements_to_layout,
    sbp_to_layout,
    strategy_to_layout,
)
from spmdsim.tools.cli.main import main


def _refusal(func, *args, **kwargs) -> str:
    with pytest.raises(DialectError) as info:
        func(*args, **kwargs)
    return str(info.value)


def _blocks(tl, shape=(8, 8)) -> list:
    return [tl.slices(rank, shape) for rank in range(tl.layout.num_devices)]


# -- a mesh written as its ranks ---------------------------------------------------------------------
def test_a_mesh_written_as_its_ranks_reads_as_its_shape():
    """OneFlow writes a placement as its ranks, flow.placement("cpu", ranks=[[0, 1], [2, 3]]) (seed 002),
    Paddle a ProcessMesh([[0, 1], [2, 3]]): the ranks array was refused ("placement shape [[0, 1], [2, 3]]
    must hold positive integers, got [0, 1]"). Read in row-major order, it is the mesh of its shape."""
    tl = sbp_to_layout("broadcast, split(0)", [[0, 1], [2, 3]], 2)
    assert tl == sbp_to_layout("B, S(0)", (2, 2), 2)
    # Seed 002: ranks 0 and 2 hold the same rows, ranks 1 and 3 the others.
    assert _blocks(tl, (4, 4)) == [(slice(0, 2), slice(0, 4)), (slice(2, 4), slice(0, 4))] * 2
    assert sbp_to_layout("S(0)", [0, 1, 2, 3], 2) == sbp_to_layout("S(0)", 4, 2)
    ranks = np.arange(8).reshape(2, 4)
    assert placements_to_layout("S(0), R", ranks, 2, ("dp", "mp")) == Layout((2, 4), ("dp", "mp"))("dp", None)
    assert partition_spec_to_layout(("x", None), ranks.tolist(), 2, ("x", "y")).layout.device_matrix == (2, 4)
    assert strategy_to_layout((2, 1), ranks) == strategy_to_layout((2, 1), 8)


@pytest.mark.parametrize("ranks, said", [
    ([[0, 2], [1, 3]], "placement shape [[0, 2], [1, 3]] numbers its ranks in another order than spmdsim does: "
                       "spmdsim numbers a mesh's ranks row-major (the last axis fastest); expected [[0, 1], [2, 3]] "
                       "(or its shape, (2, 2))"),
    ([[2, 4, 5], [0, 1, 3]], "expected [[0, 1, 2], [3, 4, 5]] (or its shape, (2, 3))"),
    ([0, 2, 1, 3], "placement shape [0, 2, 1, 3] numbers its ranks in another order than spmdsim does"),
    ([[0, 1], [2]], "placement shape [[0, 1], [2]] is not a mesh; expected a mesh shape (a tuple of positive "
                    "integers, or one for a 1-D mesh), a spmdsim Layout or a Mesh, or an array of ranks such as "
                    "[[0, 1], [2, 3]] (rectangular, integers)"),
    ([[0.0, 1], [2, 3]], "is not a mesh; expected"),
    ([[0, True], [2, 3]], "placement shape [[0, True], [2, 3]] is not a mesh; expected"),  # (numpy reads True as 1)
    ((0, 4), "placement shape (0, 4) must hold positive integers, got 0"),  # a shape with a 0 stays a shape
])
def test_ranks_in_another_order_or_not_an_array_are_one_line(ranks, said):
    sbp = "S(0)" if ranks == [0, 2, 1, 3] else "S(0), B"
    assert said in _refusal(sbp_to_layout, sbp, ranks, 2)


def _cli(capsys, argv: list) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


@pytest.mark.parametrize("placement", ["[[0,1],[2,3]]", "[[0, 1], [2, 3]]", "(0,1),(2,3)"])
def test_the_command_line_reads_a_placement_written_as_its_ranks(capsys, placement):
    """`--placement "[[0,1],[2,3]]"`, OneFlow's flow.placement(ranks=...), was refused ("must be comma-separated
    integers such as 2,4") where the Python API reads it: slices, run matmul and plan read it as 2,2."""
    shape_form = _cli(capsys, ["slices", "--sbp", "B, S(0)", "--placement", "2,2", "--shape", "4,4"])
    assert _cli(capsys, ["slices", "--sbp", "B, S(0)", "--placement", placement, "--shape", "4,4"]) == shape_form
    assert '"2": [[0, 2], [0, 4]]' in shape_form[1]  # seed 002: ranks 0 and 2 hold the same rows
    flat = _cli(capsys, ["slices", "--sbp", "S(0)", "--placement", "0,1,2,3", "--shape", "4,4"])
    assert flat == _cli(capsys, ["slices", "--sbp", "S(0)", "--placement", "4", "--shape", "4,4"])
    code, out, _ = _cli(capsys, ["run", "matmul", "--placement", placement, "--x-sbp", "S(0),B", "--w-sbp", "B,S(1)",
                                 "--shape", "4,4,4", "--ranks", "4"])
    assert code == 0 and "PASS" in out
    plan = ["plan", "--from-sbp", "S(0),B", "--to-sbp", "B,B", "--shape", "4,4", "--json"]
    assert _cli(capsys, plan + ["--placement", placement]) == _cli(capsys, plan + ["--placement", "2,2"])
    assert _cli(capsys, plan + ["--placement", placement, "--device-matrix", "2,2"])[0] == 0  # the same mesh


@pytest.mark.parametrize("placement, said", [
    ("[[0,2],[1,3]]", "spmdsim: error: --placement '[[0,2],[1,3]]' numbers its ranks in another order than spmdsim "
                      "does: spmdsim numbers a mesh's ranks row-major (the last axis fastest); expected [[0, 1], "
                      "[2, 3]] (or its shape, (2, 2))"),
    ("[[0,1],[2,x]]", "spmdsim: error: --placement '[[0,1],[2,x]]' is not a mesh; expected sizes such as 2,4, or "
                      "its ranks such as [[0,1],[2,3]] (rectangular, integers)"),
    ("[[0,1],[2]]", "spmdsim: error: --placement '[[0,1],[2]]' is not a mesh; expected"),
    ("0,4", "spmdsim: error: --placement '0,4' must be positive sizes, such as 2,4"),  # a shape with a 0
])
def test_a_placement_whose_ranks_spmdsim_cannot_read_is_one_line(capsys, placement, said):
    code, out, err = _cli(capsys, ["slices", "--sbp", "S(0), B", "--placement", placement, "--shape", "4,4"])
    assert (code, out) == (2, "") and err.startswith(said), err


_MATMUL_SBP = ["run", "matmul", "--placement", "2,2", "--shape", "4,4,4", "--ranks", "4"]
_MATMUL_MAP = ["run", "matmul", "--device-matrix", "2,2", "--alias-name", "a,b", "--shape", "4,4,4", "--ranks", "4"]


@pytest.mark.parametrize("flags, said", [
    (["--x-sbp", "S(0),Q", "--w-sbp", "B,S(1)"], "--x-sbp 'S(0),Q': sbp 'Q' is not valid; expected 'B', 'P' or 'S(d)' "
     "with tensor dim d >= 0"),
    (["--x-sbp", "S(0),B", "--w-sbp", "B,S(3)"], "--w-sbp 'B,S(3)': sbp S(3) on placement axis 1 splits tensor dim 3, "
     "but the tensor has 2 dims"),
    (["--x-sbp", "S(0),B", "--w-sbp", "B"], "--w-sbp 'B': sbp (B) has 1 entry but placement shape (2, 2) has 2 axes; "
     "expected one SBP per placement axis"),
    (["--x-sbp", "S(0),B", "--w-sbp", "B,S(1)", "--out-sbp", "brodcast,B"], "--out-sbp 'brodcast,B': sbp 'brodcast' "
     "is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0; did you mean 'broadcast'?"),
    (["--x-sbp", "Shard(0),B", "--w-sbp", "B,S(1)"], "--x-sbp 'Shard(0),B': sbp 'Shard(0)' is not valid; expected 'B', "
     "'P' or 'S(d)' with tensor dim d >= 0; 'Shard(0)' is DTensor placement syntax: read it with placements_to_layout "
     "(not on run matmul, whose --x-sbp and --w-sbp take an SBP: S(0) for Shard(0), B for Replicate())"),
])
def test_run_matmul_names_the_sbp_flag_whose_value_is_bad(capsys, flags, said):
    """`run matmul --x-sbp "S(0),Q" --w-sbp ...` said only "sbp 'Q' in 'S(0),Q' is not valid": not whose."""
    assert _cli(capsys, _MATMUL_SBP + flags) == (2, "", f"spmdsim: error: {said}")


def test_run_matmul_names_the_map_flag_whose_value_is_bad(capsys):
    code, out, err = _cli(capsys, _MATMUL_MAP + ["--x-map", "a,None", "--w-map", "a,c"])
    assert (code, out, err) == (2, "", "spmdsim: error: --w-map 'a,c': unknown alias 'c' in tensor map (\"a\", \"c\"); "
                                       "expected one of ('a', 'b')")
    code, out, _ = _cli(capsys, _MATMUL_SBP + ["--x-sbp", "S(0),B", "--w-sbp", "B,S(1)"])
    assert code == 0 and "PASS" in out  # good values run as before


@pytest.mark.parametrize("argv, said", [
    (["plan", "--device-matrix", "2,2", "--shape", "4,4", "--from-sbp", "S(0),Q", "--to-sbp", "B,B"],
     "--from-sbp 'S(0),Q': sbp 'Q' is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0"),
    (["plan", "--device-matrix", "2,2", "--shape", "4,4", "--from-sbp", "S(0),B", "--to-sbp", "B,S(3)"],
     "--to-sbp 'B,S(3)': sbp S(3) on placement axis 1 splits tensor dim 3, but the tensor has 2 dims"),
    (["plan", "--device-matrix", "2,2", "--shape", "4,4", "--from-sbp", "Shard(0),B", "--to-sbp", "B,B"],
     "--from-sbp 'Shard(0),B': sbp 'Shard(0)' is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0; "
     "'Shard(0)' is DTensor placement syntax: read it with placements_to_layout (--from-placements)"),
    (["plan", "--device-matrix", "2,2", "--alias", "a,b", "--shape", "4,4", "--from", "a,None", "--to", "a,zz"],
     "--to 'a,zz': unknown alias 'zz' in tensor map (\"a\", \"zz\"); expected one of ('a', 'b')"),
    (["slices", "--placement", "2,2", "--shape", "4,4", "--sbp", "S(0),Q"],
     "--sbp 'S(0),Q' (case key 'sbp'): sbp 'Q' is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0"),
    (["slices", "--placement", "2,2", "--shape", "4,4", "--sbp", "B"],
     "--sbp 'B' (case key 'sbp'): sbp (B) has 1 entry but placement shape (2, 2) has 2 axes; expected one SBP per "
     "placement axis"),
    (["slices", "--placement", "2,0", "--shape", "4,4", "--sbp", "S(0),B"],
     "--placement '2,0' must be positive sizes, such as 2,4"),  # a refusal naming its flag already: as it was
    (["plan", "--device-matrix", "2,2", "--alias", "a,b", "--shape", "4,4", "--from", "a,None", "--from-partial", "zz",
      "--to", "None,None"],
     "--from-partial 'zz': unknown alias 'zz' in tensor map (\"a\", None) partial ('zz',); expected one of ('a', 'b')"),
    (["slices", "--device-matrix", "2,2", "--alias", "a,b", "--shape", "4,4", "--tensor-map", "a,(b,zz)"],
     "--tensor-map 'a,(b,zz)' (case key 'tensor_map'): unknown alias 'zz' in tensor map (\"a\", (\"b\", \"zz\")); "
     "expected one of ('a', 'b')"),
    (["slices", "--device-matrix", "2,2", "--alias", "a,b", "--shape", "4,4", "--tensor-map", "a,None", "--partial",
      "zz"],
     "--partial 'zz' (case key 'partial'): unknown alias 'zz' in tensor map (\"a\", None) partial ('zz',); expected "
     "one of ('a', 'b')"),
])
def test_plan_and_slices_name_the_layout_flag_whose_value_is_bad(capsys, argv, said):
    """`plan --from-sbp "S(0),Q"` and `slices --sbp "S(0),Q"` said only "sbp 'Q' in 'S(0),Q' is not valid": plan
    reads two layouts, and neither said which flag; they now lead with it, as `run matmul --x-sbp` does."""
    assert _cli(capsys, argv) == (2, "", f"spmdsim: error: {said}")


# -- OneFlow SBP text ------------------------------------------------------------------------------------
def test_sbp_text_reads_spmdsims_own_class_spellings():
    """The SBP values are spmdsim's Broadcast(), Split(d), PartialSum() (docs/reference/dialects.md), and their
    reprs print so, but text in those spellings was refused ("sbp 'Split(0)' ... is not valid"), where the
    DTensor reader takes Shard(0), Replicate(): a printed SBP now reads back."""
    from spmdsim.layouts.dialects import Broadcast, PartialSum, Split, parse_sbp

    want = (Broadcast(), Split(0), PartialSum())
    for text in ("Broadcast(), Split(0), PartialSum()", "(Broadcast(), Split(tensor_dim=0), PartialSum())",
                 repr(want), "broadcast, split(0), partial_sum"):
        assert parse_sbp(text) == want, text


@pytest.mark.parametrize("text, meant", [
    ("brodcast, S(0)", "sbp 'brodcast' in 'brodcast, S(0)' is not valid; expected 'B', 'P' or 'S(d)' with tensor dim "
                       "d >= 0; did you mean 'broadcast'?"),
    ("b, S(0)", "did you mean 'B'?"),
    ("B, s(1)", "sbp 's(1)' in 'B, s(1)' is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0; did you "
                "mean 'S(1)'?"),
    ("spilt(0), B", "did you mean 'split(0)'?"),
    ("partial_min, B", "did you mean 'partial_sum'?"),
])
def test_a_mistyped_sbp_names_the_spelling_meant(text, meant):
    assert meant in _refusal(sbp_to_layout, text, (2, 2), 2)


def test_an_sbp_whose_name_is_right_gets_no_guess():
    for text in ("S(-1)", "split(-1)", "xyz"):
        said = _refusal(sbp_to_layout, text, 4, 2)
        assert said == f"sbp {text!r} is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0", said


@pytest.mark.parametrize("convert, args, said", [
    (sbp_to_layout, ("S(0), B", (2, 2)), "ndim is missing: sbp_to_layout needs the number of dims of the tensor (an "
     "SBP cannot tell it); pass it as the third argument, e.g. sbp_to_layout('S(0), B', mesh, 2) for a 2-D tensor"),
    (sbp_to_layout, ("B, split(2)", [[0, 1], [2, 3]]), "e.g. sbp_to_layout('B, S(2)', mesh, 3) for a 3-D tensor"),
    (placements_to_layout, ("Shard(0), Replicate()", (2, 2), None), "ndim is missing: placements_to_layout needs the "
     "number of dims of the tensor (placements cannot tell it); pass it as the third argument, e.g. "
     "placements_to_layout('S(0), R', mesh, 2) for a 2-D tensor"),
    (sbp_to_layout, ("S(0)", 2, "2"), "ndim '2' must be a non-negative integer, the number of dims of the tensor"),
])
def test_a_missing_ndim_says_what_it_is_and_how_to_pass_it(convert, args, said):
    """sbp_to_layout(sbp, mesh) said "ndim None must be a non-negative integer": a value the user never gave."""
    assert said in _refusal(convert, *args)
    ndim = 3 if "(2)" in args[0] else 2
    assert convert(*args[:2], ndim).ndim == ndim  # given, it reads


# -- MindSpore strategies ------------------------------------------------------------------------------------
@pytest.mark.parametrize("side, strategy", [("from", "((8,1,1),)"), ("to", "(1,8,1)")])
def test_plan_names_a_strategy_longer_than_the_shape(capsys, side, strategy):
    """`spmdsim plan --from-strategy "((8,1,1),)" --shape 8,8` said 'tensor map ("axis_0", "axis_1", "axis_2") has
    3 entries but shape (8, 8) has 2 dims', a map the user never wrote; `slices` names the strategy."""
    flags = {"from": "((8,1),)", "to": "((1,8),)", side: strategy}
    argv = ["plan", "--device-matrix", "8", "--from-strategy", flags["from"], "--to-strategy", flags["to"],
            "--shape", "8,8"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and " ".join(err.split()) == (
        f"spmdsim: error: --{side}-strategy {strategy!r} has 3 slice counts but --shape '8,8' has 2 dims; expected "
        "one slice count per tensor dim")


def test_a_strategy_whose_axis_names_take_rep_says_so():
    """Naming an axis "rep" where the strategy uses fewer devices than the ranks said "alias_name ('dp', 'rep',
    'rep') repeats a name", a tuple the user never wrote. Where no repeats are added, "rep" is a name like any."""
    said = _refusal(strategy_to_layout, (2, 1), 8, mesh_axis_names=("dp", "rep"))
    assert said == ("mesh_axis_names ('dp', 'rep') names an axis 'rep', the name of the axis of repeats that strategy "
                    "(2, 1) on 8 ranks adds (4 copies of each shard); expected other names")
    assert strategy_to_layout((2, 4), 8, mesh_axis_names=("dp", "rep")).tensor_map == (("dp",), ("rep",))


def test_a_layout_that_repeats_an_axis_name_names_it():
    with pytest.raises(LayoutError) as info:
        Layout((2, 2, 2), ("dp", "mp", "dp"))
    assert str(info.value) == ("alias_name ('dp', 'mp', 'dp') names two axes 'dp'; expected a different name for each "
                               "axis of the device matrix")


# -- Paddle's auto-parallel placements ---------------------------------------------------------------------------
def test_paddle_placements_read_as_dtensors():
    """dist.shard_tensor(x, mesh, [dist.Shard(0), dist.Replicate()]) places a tensor as DTensor does (one
    placement per mesh dim), but the text was refused as "Paddle's ..., which spmdsim does not read". It reads
    now, on the mesh Paddle writes as its ProcessMesh's ranks, and holds the blocks DTensor's spelling holds."""
    from spmdsim.layouts.dialects import Partial, Replicate, Shard, parse_placements

    mesh = [[0, 1, 2, 3], [4, 5, 6, 7]]
    tl = placements_to_layout("[dist.Shard(0), dist.Replicate()]", mesh, 2, ("x", "y"))
    assert tl == placements_to_layout("S(0), R", (2, 4), 2, ("x", "y"))
    assert _blocks(tl)[5] == (slice(4, 8), slice(0, 8))
    assert parse_placements("[paddle.distributed.Shard(1), paddle.distributed.Partial()]") == (Shard(1), Partial())
    assert parse_placements("dist.Partial(dist.ReduceType.kRedSum), dist.Replicate()") == (Partial(), Replicate())
    assert parse_placements("dist.Partial(reduce_type=dist.ReduceType.kRedMax)") == (Partial("max"),)


@pytest.mark.parametrize("text, said", [
    ("dist.Partial(dist.ReduceType.kRedAny), dist.Replicate()",
     "placement 'dist.Partial(dist.ReduceType.kRedAny)' in 'dist.Partial(dist.ReduceType.kRedAny), dist.Replicate()' "
     "reduces by Paddle's kRedAny, which spmdsim does not model (its partial layouts hold pending sums); expected "
     "dist.Partial() (ReduceType.kRedSum), dist.Shard(d) or dist.Replicate()"),
    ("dist.Partial(dist.ReduceType.kRedMax), dist.Replicate()",
     "partial reduce_op 'max' on mesh dim 0 is not supported; spmdsim partial layouts hold pending sums"),
    ("dist.Shard(0), dist.Shard(0)",
     "placements 'dist.Shard(0), dist.Shard(0)' shard tensor dim 0 on several mesh dims in Paddle's spelling, whose "
     "order over them spmdsim does not read; expected one mesh dim per tensor dim, or a spmdsim Layout whose tensor "
     "map lists the major axis first"),
])
def test_paddle_placements_spmdsim_cannot_hold_are_one_line(text, said):
    assert said in _refusal(placements_to_layout, text, (2, 4), 2)


@pytest.mark.parametrize("text, dim", [
    ("dist.Shard(1), dist.Shard(-1)", 1), ("[dist.Shard(dim=-1), dist.Shard(1)]", 1),
    ("paddle.distributed.Shard(-2), dist.Shard(0)", 0), ("dist.Shard(-1), dist.Shard(-1)", 1),
])
def test_a_paddle_coshard_written_with_a_negative_dim_is_refused(capsys, text, dim):
    """dist.Shard(-1) counts from the end: with dist.Shard(1) on a 2-D tensor it shards dim 1 twice, the co-shard
    whose order Paddle decides, but the check compared the dims as written and gave axes (axis_0, axis_1)."""
    said = (f"placements {text!r} shard tensor dim {dim} on several mesh dims in Paddle's spelling, whose order over "
            "them spmdsim does not read; expected one mesh dim per tensor dim, or a spmdsim Layout whose tensor map "
            "lists the major axis first")
    assert _refusal(placements_to_layout, text, (2, 4), 2) == said
    led = f"--placements {text!r} (case key 'placements'): {said.replace(f' {text!r}', '', 1)}"
    assert _cli(capsys, ["slices", "--placements", text, "--device-matrix", "2,4", "--shape", "8,8"]) == (
        2, "", f"spmdsim: error: {led}")
    # Different dims once counted: each mesh dim shards its own (dim 2 and dim 1 of a 3-D tensor).
    assert placements_to_layout("dist.Shard(-1), dist.Shard(1)", (2, 4), 3).tensor_map == ((), ("axis_1",),
                                                                                          ("axis_0",))
    # DTensor's own spelling reads the same co-shard, the lower mesh dim major (DTensor's default order).
    assert placements_to_layout("Shard(1), Shard(-1)", (2, 4), 2).tensor_map == ((), ("axis_0", "axis_1"))


# -- DTensor placement typos ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, meant", [
    ("Replicat()", "'Replicate()'"), ("Shard0", "'Shard(0)'"), ("Partiall()", "'Partial()'"),
    ("shard(1)", "'Shard(1)'"), ("Shrad(-1)", "'Shard(-1)'"), ("Shard[0]", "'Shard(0)'"), ("S0", "'S(0)'"),
    ("Replicate", "'Replicate()'"), ("Partial", "'Partial()'"), ("Partiall(max)", "'Partial(max)'"),
    ("dist.Replicat()", "'dist.Replicate()'"),  # Paddle's spelling, meant in Paddle's spelling
])
def test_a_mistyped_placement_names_the_spelling_meant(text, meant):
    """SBP's typos had a did-you-mean ('brodcast'); DTensor's ('Replicat()', 'Shard0', 'Partiall()') had none."""
    said = _refusal(placements_to_layout, text, 2, 2)
    assert said == (f"placement {text!r} is not valid; expected 'S(d)', 'R' or 'P' (Shard(d), Replicate(), Partial());"
                    f" did you mean {meant}?")


@pytest.mark.parametrize("text, meant", [("Partial(summ)", " did you mean 'sum'?"), ("P(SUM)", " did you mean 'sum'?"),
                                         ("Partial(xyz)", None)])
def test_a_mistyped_reduce_op_names_the_op_meant(text, meant):
    said = _refusal(placements_to_layout, text, 2, 2)
    assert said.startswith(f"partial reduce_op {text[text.index('(') + 1:-1]!r} is not a reduce op; expected one of "
                           "sum, avg, product, min, max, band, bor, bxor, premul_sum (PyTorch's c10d ReduceOp names)")
    assert said.endswith(meant) if meant else not said.endswith("?")


@pytest.mark.parametrize("text", ["Shard(x)", "xyz", "Shard(0.5)"])
def test_a_placement_whose_name_is_right_or_far_gets_no_guess(text):
    said = _refusal(placements_to_layout, text, 2, 2)
    assert said == f"placement {text!r} is not valid; expected 'S(d)', 'R' or 'P' (Shard(d), Replicate(), Partial())"


# -- SBP and placements, one given for the other ---------------------------------------------------------------
@pytest.mark.parametrize("convert, text, said", [
    (lambda t: placements_to_layout(t, (2, 4), 2), "split(0), broadcast",
     "placement 'split(0)' in 'split(0), broadcast' is not valid; expected 'S(d)', 'R' or 'P' (Shard(d), Replicate(), "
     "Partial()); 'split(0)' is OneFlow SBP syntax: read it with sbp_to_layout (--sbp, over --placement, on the "
     "command line)"),
    (lambda t: placements_to_layout(t, (2, 4), 2), "S(0), B", "'B' is OneFlow SBP syntax: read it with sbp_to_layout"),
    (lambda t: sbp_to_layout(t, (2, 4), 2), "Shard(0), Replicate()",
     "sbp 'Shard(0)' in 'Shard(0), Replicate()' is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0; "
     "'Shard(0)' is DTensor placement syntax: read it with placements_to_layout (--placements on the command line)"),
    (lambda t: sbp_to_layout(t, (2, 4), 2), "S(0), R", "'R' is DTensor placement syntax: read it with placements_to"),
    (lambda t: sbp_to_layout(t, (2, 4), 2), "dist.Shard(0), dist.Replicate()", "'dist.Shard(0)' is DTensor placement"),
])
def test_an_sbp_given_as_placements_or_the_reverse_names_the_reader(convert, text, said):
    """OneFlow's SBP is written per placement (mesh) axis, as DTensor's placements are: a porter who reaches for
    --placements (OneFlow calls its mesh a placement) got only "not valid; expected 'S(d)', 'R' or 'P'"."""
    assert said in _refusal(convert, text)


# -- MindSpore's Layout(device_matrix, alias_name, rank_list=None) ------------------------------------------
def test_a_mindspore_rank_list_in_order_reads_as_the_layout():
    """MindSpore's Layout takes rank_list (default: the ranks 0..n-1); the keyword was Python's TypeError."""
    plain = Layout((2, 4), ("dp", "mp"))
    assert Layout((2, 4), ("dp", "mp"), rank_list=list(range(8))) == plain
    assert Layout((2, 4), ("dp", "mp"), rank_list=np.arange(8)) == plain
    assert Layout((2, 4), ("dp", "mp"), list(range(8))) == plain  # MindSpore's third positional argument
    chunk = Layout((2, 4), ("dp", "mp"), "chunk", rank_list=tuple(range(8)))
    assert (chunk.cut, chunk.device_matrix) == ("chunk", (2, 4))
    assert Layout((2, 4), ("dp", "mp"), rank_list=None).coords(5) == plain.coords(5) == (1, 1)


@pytest.mark.parametrize("rank_list, said", [
    (list(range(8, 16)), "rank_list [8, 9, 10, 11, 12, 13, 14, 15] puts the devices on other ranks than 0..7 in "
                         "order, which spmdsim does not model: it numbers a device matrix's ranks row-major from 0 "
                         "(the last axis fastest); expected list(range(8)) or no rank_list"),
    ([1, 0, 2, 3, 4, 5, 6, 7], "rank_list [1, 0, 2, 3, 4, 5, 6, 7] puts the devices on other ranks"),
    ([0, 1, 2, 3], "rank_list [0, 1, 2, 3] gives 4 ranks but device_matrix (2, 4) has 8 devices; expected one "
                   "rank per device"),
    (5, "rank_list 5 must be a list of integer ranks, one per device of device_matrix (2, 4), such as "
        "list(range(8))"),
    ([0.5] * 8, "rank_list [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5] must be a list of integer ranks"),
])
def test_a_rank_list_spmdsim_cannot_honour_is_one_line(rank_list, said):
    with pytest.raises(LayoutError) as info:
        Layout((2, 4), ("dp", "mp"), rank_list=rank_list)
    assert said in str(info.value) and "\n" not in str(info.value)


def test_a_layout_written_with_the_mindspore_tutorials_name_keyword_is_one_line():
    """MindSpore's operator-parallel tutorial writes ``Layout((2, 2, 2), name = ("dp", "sp", "mp"))`` in its prose;
    MindSpore's Layout and spmdsim's take alias_name, and `name` was Python's TypeError."""
    with pytest.raises(LayoutError) as info:
        Layout((2, 2, 2), name=("dp", "sp", "mp"))
    assert str(info.value) == ("Layout(name=('dp', 'sp', 'mp')): MindSpore's Layout, as spmdsim's, takes the axes' "
                               "names as alias_name (no name keyword); expected Layout(device_matrix, alias_name), "
                               "e.g. Layout((2, 2, 2), ('dp', 'sp', 'mp'))")
    assert Layout((2, 2, 2), alias_name=("dp", "sp", "mp")) == Layout((2, 2, 2), ("dp", "sp", "mp"))


@pytest.mark.parametrize("form", [["--placements", "S(0),R"], ["--partition-spec", "('a', None)", "--alias", "a,b"]])
def test_the_device_matrix_of_placements_reads_as_its_ranks(capsys, form):
    """PyTorch's DeviceMesh("cpu", [[0, 1], [2, 3]]) written on the command line: the mesh (2, 2)."""
    code, by_ranks, _ = _cli(capsys, ["slices", *form, "--device-matrix", "[[0,1],[2,3]]", "--shape", "4,4"])
    assert code == 0 and _cli(capsys,
                              ["slices", *form, "--device-matrix", "2,2", "--shape", "4,4"]) == (0, by_ranks, "")
    code, out, err = _cli(capsys, ["slices", *form, "--device-matrix", "[[0,2],[1,3]]", "--shape", "4,4"])
    assert (code, out) == (2, "") and err.startswith("spmdsim: error: --device-matrix '[[0,2],[1,3]]' numbers its "
                                                     "ranks in another order than spmdsim does")
