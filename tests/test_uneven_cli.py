"""Uneven shards in the teaching commands and the dialects: slices, explain, show, convert, refusals."""
from __future__ import annotations

import json

import pytest

from spmdsim import Layout
from spmdsim.tools.cli.main import main
from spmdsim.layouts.dialects import partition_spec_to_layout, placements_to_layout
from spmdsim.errors import DialectError, ShapeError

ROWS = ["--device-matrix", "4", "--alias", "mp", "--tensor-map", "mp,None", "--shape", "10,3"]


def _slices(capsys, *args: str) -> list:
    assert main(["slices", *args]) == 0
    table = json.loads(capsys.readouterr().out)["rank_slices"]
    return [table[str(r)][0] for r in range(len(table))]


def test_slices_show_the_pieces_of_each_rule(capsys):
    assert _slices(capsys, *ROWS, "--cut", "chunk") == [[0, 3], [3, 6], [6, 9], [9, 10]]
    assert _slices(capsys, *ROWS, "--cut", "balanced") == [[0, 3], [3, 6], [6, 8], [8, 10]]
    # DTensor placements cut a dim that does not divide by torch.chunk's rule, unasked.
    assert _slices(capsys, "--placements", "S(0)", "--device-matrix", "4", "--shape", "10,3") == \
        [[0, 3], [3, 6], [6, 9], [9, 10]]


def test_even_and_the_even_only_dialects_refuse_with_one_line(capsys):
    for args, message in [
        (ROWS,
         "spmdsim: error: tensor (10, 3): dim 0 of size 10 is not divisible by 4 shards over ('mp',); name a rule with "
         "\"cut\": \"chunk\" or \"balanced\" (--cut) to cut unevenly"),
        (["--strategy", "((4,1),)", "--shape", "10,3"],  # said nothing of the way out, as the SBP line did
         "spmdsim: error: tensor (10, 3): dim 0 of size 10 is not divisible by 4 shards over ('axis_0',); MindSpore "
         "cuts every dim evenly: write it in the layout form (--device-matrix, --alias, --tensor-map) with --cut "
         "chunk or balanced"),
        (["--sbp", "S(0)", "--placement", "4", "--shape", "10,3"],
         "spmdsim: error: tensor (10, 3): dim 0 of size 10 is not divisible by 4 shards over "
         "('axis_0',); spmdsim reads OneFlow SBP with even cuts only (OneFlow itself cuts a dim that does not divide "
         "by its BalancedSplitter, the first pieces one longer: on a 1-D placement, a layout's cut 'balanced'): write "
         "it in the layout form (--device-matrix, --alias, --tensor-map) with --cut balanced"),
        (["--strategy", "((4,1),)", "--shape", "10,3", "--cut", "chunk"],
         "spmdsim: error: cut 'chunk' cannot go with the strategy form: MindSpore cuts every dim evenly; use the "
         "layout, placements or partition_spec form for an uneven cut"),
        (["--partition-spec", "('x', None)", "--device-matrix", "4", "--alias", "x", "--shape", "10,3"],
         "spmdsim: error: tensor (10, 3): dim 0 of size 10 is not divisible by 4 shards over ('x',); JAX requires "
         "divisible dims: name a rule with \"cut\": \"chunk\" or \"balanced\" (--cut) to cut unevenly"),
    ]:
        assert main(["slices", *args]) == 2
        err = capsys.readouterr().err
        assert " ".join(err.split()) == message


def test_a_partition_spec_cuts_unevenly_only_with_a_rule_named(capsys):
    spec = ["--partition-spec", "('x', None)", "--device-matrix", "4", "--alias", "x", "--shape", "10,3"]
    assert _slices(capsys, *spec, "--cut", "balanced") == [[0, 3], [3, 6], [6, 8], [8, 10]]
    with pytest.raises(ShapeError, match="not divisible"):
        partition_spec_to_layout(("x", None), (4,), 2, ("x",)).check_shape((10, 3))
    tl = partition_spec_to_layout(("x", None), (4,), 2, ("x",), cut="balanced")
    assert tl.bounds(3, (10, 3)) == ((8, 10), (0, 3))
    assert placements_to_layout("S(0), R", Layout((4, 2), ("a", "b"), "chunk"), 2).layout.cut == "chunk"


def test_dtensor_nested_chunk_cuts_as_dtensor_and_balanced_is_refused(capsys):
    """6 rows on (S(0), S(0)) over 2 x 2: spmdsim cut them once into 4 (2, 2, 2, 0 rows) and `slices` refused the
    placements; now the chunk rule cuts mesh dim by mesh dim as DTensor does (3 then 2 + 1, 2 + 1). A balanced
    cut of a dim on two mesh dims still differs from DTensor's and is refused in one line."""
    from spmdsim.layouts.dialects.dtensor import check_uneven_shards

    nested = placements_to_layout("S(0), S(0)", (2, 2), 1, cut="chunk")
    for size in (6, 7):
        check_uneven_shards(nested, (size,))
    assert _slices(capsys, "--placements", "S(0),S(0)", "--device-matrix", "2,2", "--shape", "6") == \
        [[0, 2], [2, 3], [3, 5], [5, 6]]
    balanced = nested.layout.with_cut("balanced")(("axis_0", "axis_1"))
    with pytest.raises(DialectError, match=r"^tensor dim 0 of size 6 sharded on mesh dims \('axis_0', 'axis_1'\): "
                       r"DTensor would cut it piece by piece \(\[\(0, 2\), \(2, 3\), \(3, 5\), \(5, 6\)\]\), spmdsim "
                       r"cuts it once \(\[\(0, 2\), \(2, 4\), \(4, 5\), \(5, 6\)\]\) by rule 'balanced'"):
        check_uneven_shards(balanced, (6,))
    assert main(["explain", "--placements", "S(0),S(0)", "--device-matrix", "2,4", "--shape", "5"]) == 0
    assert "ceil(5/2) = 3, the last ones short or empty, each cut again the same way into 4 (sizes by shard: " \
           "1 1 1 0 1 1 0 0)" in " ".join(capsys.readouterr().out.split())


def test_explain_and_show_draw_the_unequal_pieces(capsys):
    assert main(["explain", *ROWS, "--cut", "balanced"]) == 0
    out = capsys.readouterr().out
    assert 'Layout((4,), ("mp",), cut=\'balanced\')' in out
    assert "cut 'balanced' gives 2 pieces of 3, then pieces of 2 (sizes by shard: 3 3 2 2)" in " ".join(out.split())
    assert "[8:10, 0:3]" in out
    assert main(["show", *ROWS, "--cut", "chunk"]) == 0
    out = capsys.readouterr().out
    assert "on Layout(mp=4, cut=chunk)" in out
    assert [line.split("|")[0].strip() for line in out.splitlines() if "|  r" in line][:4] == \
        ["0:3", "3:6", "6:9", "9:10"]


def test_convert_says_which_dialects_can_cut_unevenly(capsys):
    assert main(["convert", *ROWS, "--cut", "chunk", "--json"]) == 0
    forms = {f["dialect"]: f for f in json.loads(capsys.readouterr().out)["forms"]}
    assert forms["PyTorch DTensor"]["text"] == "(S(0))" and forms["PyTorch DTensor"]["note"] == ""
    assert forms["JAX PartitionSpec"]["flags"].endswith("--cut chunk")
    for dialect in ("MindSpore .shard", "OneFlow SBP", "Paddle split"):
        assert forms[dialect]["text"] is None and "even" in forms[dialect]["note"]
    assert forms["OneFlow SBP"]["note"].startswith("spmdsim reads OneFlow SBP with even cuts only (OneFlow itself "
                                                   "cuts a dim that does not divide by its BalancedSplitter")
    assert main(["convert", *ROWS, "--cut", "balanced", "--json"]) == 0
    forms = {f["dialect"]: f for f in json.loads(capsys.readouterr().out)["forms"]}
    assert forms["PyTorch DTensor"]["text"] is None and "torch.chunk" in forms["PyTorch DTensor"]["note"]


def test_holdings_and_plan_flags_on_uneven_cuts(capsys):
    from spmdsim.layouts.holdings import holdings_lines

    tl = Layout((2, 2), ("dp", "tp"), "chunk")("tp", None)
    assert holdings_lines({"x": (tl, (3, 4))}) == ["rank 0 (0, 0): x[0:2, 0:4]", "rank 1 (0, 1): x[2:3, 0:4]",
                                                   "rank 2 (1, 0): x[0:2, 0:4]", "rank 3 (1, 1): x[2:3, 0:4]"]
    assert main(["plan", "--device-matrix", "4", "--from-strategy", "((4,1),)", "--to", "None,axis_0",
                 "--shape", "10,3", "--cut", "chunk"]) == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        "spmdsim: error: --from-strategy cannot take cut 'chunk': MindSpore cuts every dim evenly; write that "
        "side as --from, --from-placements or --from-partition-spec")
    # an even layout that cannot cut a dim names the rules that can; a strategy or an SBP, which cut evenly only,
    # the forms that can (they said no more than the dim's size)
    even = ["plan", "--device-matrix", "4", "--from", "axis_0,None", "--to", "None,axis_0", "--shape", "10,4"]
    assert main(even) == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        "spmdsim: error: tensor (10, 4): dim 0 of size 10 is not divisible by 4 shards over ('axis_0',); "
        "--cut chunk or balanced cuts it unevenly (--to-cut for the target alone)")
    assert main(even + ["--cut", "chunk"]) == 0
    capsys.readouterr()
    assert main(["plan", "--device-matrix", "4", "--from-strategy", "((4,1),)", "--to", "None,axis_0",
                 "--shape", "10,4"]) == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        "spmdsim: error: tensor (10, 4): dim 0 of size 10 is not divisible by 4 shards over ('axis_0',); MindSpore "
        "cuts every dim evenly: write that side as --from, --from-placements or --from-partition-spec and --cut chunk "
        "or balanced")
    assert main(["plan", "--device-matrix", "2,4", "--alias", "dp,tp", "--from-placements", "S(0),S(1)", "--to-sbp",
                 "B, S(0)", "--shape", "63,64"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("spmdsim: error: tensor (63, 64): dim 0 of size 63 is not divisible by 4 shards over "
                          "('tp',); spmdsim reads OneFlow SBP with even cuts only") and err.endswith(
        "write that side as --to, --to-placements or --to-partition-spec and --to-cut chunk or balanced"), err
    assert main(["plan", "--device-matrix", "2,4", "--alias", "dp,tp", "--from-placements", "S(0),S(1)", "--to",
                 "tp,None", "--shape", "63,64", "--to-cut", "chunk"]) == 0  # B, S(0) as a tensor map, as it says
    capsys.readouterr()


def test_plan_explain_past_64_ranks_names_the_unequal_blocks(capsys):
    assert main(["plan", "--device-matrix", "128", "--alias", "x", "--from", "x,None", "--to", "None,x",
                 "--shape", "1001,300", "--cut", "balanced", "--explain"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "dim 0: 128 blocks of 8 to 7 (cut 'balanced'), block x" in out
    assert "others in its group 75 B on average (the busiest rank's)" in out
    assert "lower bound 11,916 B (meets it on every rank)" in out


def test_plan_reads_placements_as_slices_does_cutting_by_torch_chunk_unasked(capsys):
    """`spmdsim slices --placements` cut a dim that does not divide as DTensor does; `spmdsim plan
    --from-placements` refused it (an even cut) unless given --cut chunk: now both read placements alike."""
    assert main(["plan", "--device-matrix", "4", "--from-placements", "S(0)", "--to-placements", "R",
                 "--shape", "7,2", "--json"]) == 0
    asked = json.loads(capsys.readouterr().out)
    assert main(["plan", "--device-matrix", "4", "--from-placements", "S(0)", "--to-placements", "R",
                 "--shape", "7,2", "--cut", "chunk", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == asked
    # a dim on two mesh dims, cut mesh dim by mesh dim as DTensor does (rows 2, 1, 2, 1; was refused): one
    # Allgather over each mesh dim's pieces, received 6 rows less the rank's own, at the bound
    assert main(["plan", "--device-matrix", "2,2", "--from-placements", "S(0),S(0)", "--to-placements", "R,R",
                 "--shape", "6,2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["bytes_received_per_rank"] == record["lower_bound_bytes_received_per_rank"] == 5 * 2 * 4


def _matrix_sums_are_the_plans(plan, matrix) -> None:
    n = plan.num_ranks
    assert tuple(sum(row) for row in matrix) == plan.bytes_sent, (str(plan.source), str(plan.target), plan.shape)
    assert tuple(sum(matrix[s][d] for s in range(n)) for d in range(n)) == plan.bytes_received, \
        (str(plan.source), str(plan.target), plan.shape)


def test_byte_matrix_sums_to_each_ranks_bytes_on_uneven_cuts():
    """The rank -> rank matrix counted a local slice's or zeroing's boxes as sent (a rank's old
    block against the others' new ones) and shared an Allreduce's bytes out in floored parts; its
    row and column sums are now each rank's bytes sent and received in the step table."""
    import numpy as np

    from spmdsim.errors import SpmdsimError
    from spmdsim.programs.plan import plan_redistribution
    from spmdsim.programs.viz.why import byte_matrix
    from test_uneven import random_layout, random_map, random_shape

    rng = np.random.default_rng(83)
    kinds: set = set()
    for case in range(300):
        cut = ("chunk", "balanced", "even")[case % 3]
        layout, source = random_layout(rng, cut)
        target = random_map(rng, layout, source.ndim)
        free = [a for a in layout.alias_name if a not in source.split_axes]
        if case % 4 == 1 and free:
            source = source.with_partial(free[0])
        free = [a for a in layout.alias_name if a not in target.split_axes]
        if case % 5 == 2 and free:
            target = target.with_partial(free[0])
        shape = random_shape(rng, source.ndim)
        try:
            plan = plan_redistribution(source, target, shape, ("float64", "float32", "int8")[case % 3])
        except SpmdsimError:
            continue  # an even cut of a size that does not divide
        _matrix_sums_are_the_plans(plan, byte_matrix(plan.steps, plan.num_ranks, plan.shape,
                                                     np.dtype(plan.dtype).itemsize))
        kinds.update(type(s).__name__ for s in plan.steps)
    assert {"LocalSlice", "LocalZero", "Allgather", "Alltoall", "Allreduce", "ReduceScatter", "Exchange"} <= kinds


@pytest.mark.parametrize("args, sent, received", [
    (["--device-matrix", "2,3", "--alias", "a,b", "--shape", "5", "--cut", "chunk", "--from", "None",
      "--to", "((a,b))", "--dtype", "float64"], [0] * 6, [0] * 6),
    (["--device-matrix", "2,2", "--alias", "a,b", "--shape", "5,4", "--cut", "balanced", "--from", "None,None",
      "--to", "a,None"], [0] * 4, [0] * 4),
    # a local slice, then an Allgather over b: rows [0:5) (60 B of float32) and [5:9) (48 B) of 3 columns
    (["--device-matrix", "2,2,2", "--alias", "a,b,c", "--shape", "9,12", "--cut", "chunk", "--from", "b,None",
      "--to", "None,(c,a)"], [60, 60, 48, 48, 60, 60, 48, 48], [48, 48, 60, 60, 48, 48, 60, 60]),
])
def test_plan_explain_byte_matrix_of_uneven_local_steps(capsys, args, sent, received):
    assert main(["plan", *args, "--explain", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    matrix = record["bytes_matrix"]
    assert [sum(row) for row in matrix] == sent
    assert [sum(row[d] for row in matrix) for d in range(len(matrix))] == received
    assert record["bytes_received_per_rank"] == max(received)
    assert main(["plan", *args, "--explain"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].split() == ["received", *map(str, received)]


def test_convert_gives_placements_for_a_nested_chunk_cut(capsys):
    """6 over 2 x 2 by chunk: spmdsim cut it once, DTensor mesh dim by mesh dim, so convert could give no
    placements; the chunk rule now cuts as DTensor does, and 6, 7 and 8 all convert."""
    nested = ["--device-matrix", "2,2", "--alias", "a,b", "--tensor-map", "((a,b))", "--cut", "chunk"]
    for size in (6, 7, 8):
        assert main(["convert", *nested, "--shape", str(size), "--json"]) == 0
        dtensor = {f["dialect"]: f for f in json.loads(capsys.readouterr().out)["forms"]}["PyTorch DTensor"]
        assert (dtensor["text"], dtensor["note"]) == ("(S(0), S(0))", "")
        assert dtensor["flags"] == "--placements \"S(0), S(0)\" --device-matrix 2,2 --alias a,b"


@pytest.mark.parametrize("args, message", [
    (["--tensor-map", "dp,None", "--shape", "8", "--cut", "chunk"],
     "tensor map (\"dp\", None) has 2 entries but shape (8,) has 1 dim"),
    (["--tensor-map", "dp,None", "--shape", "8"], "tensor map (\"dp\", None) has 2 entries but shape (8,) has 1 dim"),
    (["--tensor-map", "dp,None", "--shape", ""], "tensor map (\"dp\", None) has 2 entries but shape () has 0 dims"),
    (["--tensor-map", "dp,None", "--shape", "8,8,8"],
     "tensor map (\"dp\", None) has 2 entries but shape (8, 8, 8) has 3 dims"),
    (["--tensor-map", "", "--shape", "8"], "tensor map () has 0 entries but shape (8,) has 1 dim"),
    (["--partition-spec", "('dp', None)", "--shape", "8", "--cut", "balanced"],
     "--partition-spec \"('dp', None)\" (case key 'partition_spec'): partition spec ('dp', None) has 2 entries but "
     "the tensor has 1 dim"),
    # where a rule would cut it, the hint stays
    (["--tensor-map", "dp,None", "--shape", "7,8"], "tensor (7, 8): dim 0 of size 7 is not divisible by 2 shards over "
     "('dp',); name a rule with \"cut\": \"chunk\" or \"balanced\" (--cut) to cut unevenly"),
])
def test_a_count_of_dims_gets_no_cut_hint(capsys, args, message):
    """A map and a shape of different dim counts were told to name a cut rule (even with --cut given),
    which cannot fix them: the hint is now given only for a size the even cut cannot divide."""
    assert main(["slices", "--device-matrix", "2,4", "--alias", "dp,mp", *args]) == 2
    assert " ".join(capsys.readouterr().err.split()) == f"spmdsim: error: {message}"


def test_an_uneven_sbp_is_refused_without_saying_oneflow_cuts_evenly(capsys):
    """OneFlow cuts a dim that does not divide (its BalancedSplitter: 7 rows on 2 ranks are 4 and 3); the
    refusals said "OneFlow cuts every dim evenly", and the SBP form's gave no way out."""
    assert main(["slices", "--sbp", "S(0)", "--placement", "2", "--shape", "7,8"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.endswith("spmdsim reads OneFlow SBP with even cuts only (OneFlow itself cuts a dim that does not "
                        "divide by its BalancedSplitter, the first pieces one longer: on a 1-D placement, a "
                        "layout's cut 'balanced'): write it in the layout form (--device-matrix, --alias, "
                        "--tensor-map) with --cut balanced")
    assert main(["slices", "--sbp", "S(0)", "--placement", "2", "--shape", "7,8", "--cut", "balanced"]) == 2
    assert "OneFlow cuts every dim evenly" not in capsys.readouterr().err
    # the way out the line names gives OneFlow's cut
    assert main(["slices", "--device-matrix", "2", "--alias", "x", "--tensor-map", "x,None", "--shape", "7,8",
                 "--cut", "balanced"]) == 0
    assert json.loads(capsys.readouterr().out)["rank_slices"] == {"0": [[0, 4], [0, 8]], "1": [[4, 7], [0, 8]]}
