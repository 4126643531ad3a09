"""The classroom helpers (pure): folding tables, rank-ordered lines, step reasons, byte matrices."""
from __future__ import annotations

import json
import pathlib
import sys

import pytest

import spmdsim
from spmdsim import Layout, Mesh
from spmdsim.errors import RankError, SpmdsimError
from spmdsim.tools.cli.main import main
from spmdsim.programs.plan import plan_redistribution
from spmdsim.runtime.ranked import fold_ranked, gather_ranked, print_ranked, rank_ordered
from spmdsim.programs.viz.table import fold_cell, fold_table, nbytes, wrap_lines
from spmdsim.programs.viz.why import byte_matrix, format_byte_matrix, step_text, step_why
from testkit import unfold


def test_fold_cell_breaks_at_separators_and_keeps_every_character():
    assert fold_cell("Flatten>MatMul1>ReLU1>MatMul2", 16) == ["Flatten>MatMul1", ">ReLU1>MatMul2"]
    assert fold_cell("allreduce x2, alltoall x1, alltoallv x1", 20) == [
        "allreduce x2,", "alltoall x1,", "alltoallv x1"]
    assert fold_cell("abcdefghij", 4) == ["abcd", "efgh", "ij"]  # no separator: a hard cut
    assert fold_cell("short", 10) == ["short"]


def test_fold_table_fits_the_width_and_folds_where_it_costs_fewest_lines():
    rows = [("net", "Flatten>MatMul1>ReLU1>MatMul2>ReLU2>MatMul3", "allreduce x2, alltoall x1", "9 B"),
            ("mm", "MatMul ((2, 4), (4, 1))", "allreduce x1", "49,152 B")]
    lines = fold_table(("scenario", "op", "collectives", "sent"), rows, width=60, right=(3,), keep=(0,))
    assert max(map(len, lines)) <= 60
    assert lines[0].startswith("scenario  op")
    assert lines[-1].split()[0] == "mm" and lines[-1].endswith("49,152 B")  # the short row stays one line
    joined = " ".join(" ".join(lines).split())
    for word in ("Flatten>MatMul1", ">MatMul3", "alltoall x1"):
        assert word in joined
    assert fold_table(("a", "b"), [("x", "y" * 200)], width=None)[1] == "x  " + "y" * 200


def test_wrap_lines_and_the_byte_format():
    out = wrap_lines(["  " + "word " * 40, "short"], 50)
    assert all(len(line) <= 50 for line in out) and out[-1] == "short"
    assert out[1].startswith("    word")  # continuation: the indent plus two
    assert nbytes(1234) == "1,234 B" and nbytes(0) == "0 B"


def test_fold_ranked_groups_identical_ranks_in_rank_order():
    same = ["check passed"]
    assert fold_ranked([same] * 8) == ["ranks 0-7: check passed"]
    assert fold_ranked([["a"], ["b"], ["a"], ["a"]]) == ["ranks 0,2,3: a", "rank 1: b"]
    assert fold_ranked([["x", "y"], ["x", "y"]]) == ["ranks 0,1:", "  x", "  y"]
    assert fold_ranked([["a"], ["a"]], fold=False) == ["rank 0: a", "rank 1: a"]
    assert fold_ranked([[], ["a"]]) == ["rank 1: a"]  # a rank with nothing to say is left out


class _FakeComm:
    """Rank 0 of a pretend 3-rank communicator (lower-case gather, as mpi4py and simulated ranks)."""

    rank = 0

    def gather(self, value, root=0):
        return [["rank zero's line"], value, value] if root == 0 else None


def test_print_ranked_on_any_communicator_with_lowercase_gather(capsys):
    comm = _FakeComm()
    print_ranked(comm, "same")
    assert capsys.readouterr().out == "rank 0: rank zero's line\nranks 1,2: same\n"
    with rank_ordered(comm) as out:
        out.print("n =", 3)
    assert capsys.readouterr().out.splitlines()[-1] == "ranks 1,2: n = 3"
    wrapped = gather_ranked(comm, ["x" * 150])  # wrapped at 100 columns
    assert [len(line) for line in wrapped[1:]] == [100, 63] and wrapped[2] == "  " + "x" * 61


def test_print_ranked_refuses_a_bad_comm_root_or_width_in_one_line():
    """None for the communicator was an AttributeError deep in the MPI engine (then a RuntimeMismatchError, for
    a value of the wrong type: now a TypeError), a root past the ranks the collective's ShapeError, width=-5
    textwrap's ValueError and width=0 taken as "never wrap"."""
    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "mp")))
        said = []
        for comm, kwargs, kind in ((None, {}, TypeError), (mesh.comm, {"root": 99}, RankError),
                                   (mesh, {"root": "0"}, RankError), (mesh, {"width": -5}, SpmdsimError),
                                   (mesh, {"width": 0}, SpmdsimError)):
            with pytest.raises(kind) as caught:
                print_ranked(comm, "x", **kwargs)
            assert isinstance(caught.value, SpmdsimError)  # spmdsim's own refusal (exit 2 from a script)
            said.append(str(caught.value))
        return said

    assert spmdsim.simulate(8, body)[0] == [
        "print_ranked: comm must be a communicator (mpi4py's or a simulated one) or a Mesh, got None",
        "print_ranked: root 99 is not a rank of the communicator; expected an integer 0 <= root < 8",
        "print_ranked: root '0' is not a rank of the communicator; expected an integer 0 <= root < 8",
        "print_ranked: width -5 must be an integer >= 1 (columns), or None (never wrap)",
        "print_ranked: width 0 must be an integer >= 1 (columns), or None (never wrap)"]
    with pytest.raises(RankError, match=r"^gather_ranked: root -1 .* expected an integer >= 0$"):
        gather_ranked(_FakeComm(), ["x"], root=-1)  # a communicator that says no size


def test_step_reasons_text_in_the_input_dialect_and_the_byte_matrix():
    m = Layout((2, 4), ("dp", "tp"))
    plan = plan_redistribution(m("dp", None, partial=("tp",)), m(None, "tp"), (64, 64))
    scatter, gather = plan.steps
    assert step_text(scatter, "dtensor") == "Partial()->Shard(1) via Reduce_scatter on ('tp',)"
    assert step_text(gather, "dtensor") == "Shard(0)->Replicate() via Allgather on ('dp',)"
    assert step_text(gather) == str(gather)
    assert "receives the other piece of its group of 2" in step_why(gather)
    matrix = byte_matrix(plan.steps, 8)
    # Reduce_scatter over tp (groups 0-3, 4-7): 6,144 B in 3 parts; Allgather over dp: 2,048 B to r+4.
    assert matrix[0][1:4] == [2048, 2048, 2048] and matrix[0][4] == 2048 and matrix[0][5] == 0
    for rank in range(8):
        assert sum(matrix[rank]) == scatter.bytes_sent[rank] + gather.bytes_sent[rank]
        assert sum(row[rank] for row in matrix) == scatter.bytes_received[rank] + gather.bytes_received[rank]
    text = format_byte_matrix(matrix)
    assert text[0].split() == ["from", "\\", "to"] + [f"r{r}" for r in range(8)] + ["sent"]
    assert text[1].split()[-2:] == ["8,192", "B"]


def test_byte_matrix_of_an_exchange_matches_its_transfers():
    a, b = Layout((2, 2, 2), ("a", "b", "c")), Layout((8,), ("x",))
    plan = plan_redistribution(a("a", ("b", "c")), b(None, "x"), (16, 16))
    matrix = byte_matrix(plan.steps, 8)
    for rank in range(8):
        assert sum(matrix[rank]) == sum(s.bytes_sent[rank] for s in plan.steps)
    assert max(len(line) for line in format_byte_matrix([[0] * 64] * 64)) <= 100


def test_plan_explain_prints_the_reasons_the_blocks_and_the_matrix(capsys):
    argv = ["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None", "--to", "None,x",
            "--shape", "64,64"]
    assert main(argv + ["--explain"]) == 0
    out = capsys.readouterr().out
    assert "why: the split moves from dim 0 to dim 1 over 'x': each rank keeps 1/8" in out
    assert "  rank 3 (3,): [24:32, 0:64] -> [0:64, 24:32]" in out
    assert "  r0            .   256   256   256   256   256   256   256 1,792 B" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert main(argv + ["--explain", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["bytes_matrix"][0] == [0] + [256] * 7


def test_a_subcommand_error_names_the_subcommands_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["show", "--device-matrix", "4", "--bogus"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == ("spmdsim show: error: unrecognized arguments: --bogus; see: "
                                           "spmdsim show --help\n")
    with pytest.raises(SystemExit):
        main(["run", "redistribute", "--device-matrix", "8", "--shape", "8", "--bogus"])
    assert unfold(capsys.readouterr().err).endswith("; see: spmdsim run redistribute --help\n")


SCHEMA = pathlib.Path(__file__).parent / "data" / "chrome_trace_event.schema.json"


def _validate(obj: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")  # in the `test` extra
    jsonschema.validate(obj, json.loads(SCHEMA.read_text()))


def test_chrome_trace_of_two_ranks_has_a_track_each_with_compute_and_collectives():
    from spmdsim.runtime.trace import TraceEntry
    from spmdsim.runtime.trace_export import chrome_events, chrome_trace

    def entry(ended: float, seconds: float, sent: int) -> TraceEntry:
        return TraceEntry("allreduce", ("k",), 4, sent, sent, seconds, "matmul", ended_at=ended)

    rank0 = chrome_events([entry(10.5, 0.25, 96)], 0, start=10.0, end=11.0, spans=[("mm", 10.0, 11.0)])
    rank1 = chrome_events([entry(10.5, 0.1, 96)], 1, start=10.2, end=10.6)
    obj = chrome_trace([rank0, rank1])
    _validate(obj)
    timed = [e for e in obj["traceEvents"] if e["ph"] == "X"]
    track0 = [(e["name"], e["ts"], e["dur"]) for e in timed if e["pid"] == 0 and e["tid"] == 0]
    # Rank 0: compute 10.0-10.25, the Allreduce 10.25-10.5, compute 10.5-11.0 (microseconds from 10.0).
    assert track0 == [("local compute", 0.0, 250000.0), ("allreduce(k) 96 B", 250000.0, 250000.0),
                      ("local compute", 500000.0, 500000.0)]
    coll = next(e for e in timed if e["pid"] == 1 and e["cat"] == "collective")
    assert coll["args"] == {"bytes_sent": 96, "bytes_received": 96, "group_size": 4, "axes": ["k"],
                            "label": "matmul"}
    assert coll["ts"] == pytest.approx(400000.0)
    names = {(e["pid"], e["args"]["name"]) for e in obj["traceEvents"] if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    assert [e["name"] for e in timed if e["tid"] == 1] == ["mm"]
    bad = dict(obj, traceEvents=obj["traceEvents"] + [{"name": "x", "ph": "X", "tid": 0, "ts": 0, "dur": 1}])
    with pytest.raises(Exception, match="'pid' is a required property"):
        _validate(bad)


def test_chrome_trace_names_a_message_row_by_the_bytes_it_moved():
    # A receive's row was named by its bytes sent: "recv(pp) 0 B" beside bytes_received 4096.
    from spmdsim.runtime.trace import TraceEntry
    from spmdsim.runtime.trace_export import chrome_events

    rows = [TraceEntry(op, ("pp",), 4, sent, received, 0.1, "pipeline", ended_at=10.0 + i, peers=1)
            for i, (op, sent, received) in enumerate([("recv", 0, 4096), ("send", 2048, 0),
                                                      ("sendrecv", 1024, 4096)])]
    timed = [e for e in chrome_events(rows, 0) if e["ph"] == "X" and e["cat"] == "collective"]
    assert [e["name"] for e in timed] == ["recv(pp) 4,096 B", "send(pp) 2,048 B",
                                          "sendrecv(pp) 1,024 B sent, 4,096 B received"]
    assert timed[0]["args"] == {"bytes_sent": 0, "bytes_received": 4096, "group_size": 4, "axes": ["pp"],
                                "label": "pipeline", "peers": 1}


def test_png_without_matplotlib_fails_first_with_the_install_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after README's first install
    for argv in (["show", "--device-matrix", "4", "--alias", "x", "--tensor-map", "x", "--shape", "8",
                  "--png", str(tmp_path / "x.png")],
                 ["plan", "--device-matrix", "4", "--alias", "x", "--from", "x", "--to", "None",
                  "--shape", "8", "--png", str(tmp_path / "steps")]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == ""  # no picture or report printed before the error
        assert unfold(err) == ('spmdsim: error: pictures need matplotlib: pip install -e ".[plot]" in the '
                       "spmdsim checkout (or pip install matplotlib)\n")


def test_small_frictions(capsys):
    assert main(["show", "--device-matrix", "2,4", "--tensor-map", "mp,None", "--shape", "8,6"]) == 2
    assert "--alias is missing (case key 'alias_name'), needed by the layout form" in capsys.readouterr().err
    assert main(["show", "--shape", "8,6"]) == 2  # a shape and no layout: said in flags, not in a JSON case's keys
    assert unfold(capsys.readouterr().err) == (
        "spmdsim: error: the flags give no layout: expected --device-matrix, --alias and --tensor-map (e.g. "
        "--device-matrix 2,4 --alias dp,mp --tensor-map mp,None), --strategy (+ --world-size), --sbp + "
        "--placement, --placements + --device-matrix (PyTorch DTensor) or --partition-spec + --device-matrix "
        "(JAX)\n")
    assert main(["show", "--device-matrix", "1", "--alias", "x", "--tensor-map", "x", "--shape", "4"]) == 0
    out = capsys.readouterr().out
    assert "on Layout(x=1), 1 rank\n" in out and "#k" not in out
    # `show --operand` takes the M,K,N shape `run matmul` takes.
    argv = ["slices", "--strategy", "((2,4),(4,1))", "--world-size", "8", "--operand", "w"]
    assert main(argv + ["--shape", "256,128,192"]) == 0
    by_mkn = capsys.readouterr().out
    assert main(argv + ["--shape", "128,192"]) == 0
    assert capsys.readouterr().out == by_mkn


def _volume(box):
    size = 1
    for lo, hi in box:
        size *= hi - lo
    return size


@pytest.mark.parametrize("source, target", [(("x", None), (None, "x")), (("x", None), (None, None)),
                                            ((("x", "y"), None), ("y", "x"))])
def test_step_moves_deliver_exactly_what_each_rank_receives(source, target):
    from spmdsim.programs.viz.moves import step_moves

    mesh = Layout((2, 4), ("x", "y"))
    if source == ("x", None) and target == (None, "x"):
        mesh = Layout((8,), ("x",))
    plan = plan_redistribution(mesh(*source), mesh(*target), (16, 24))
    for step in plan.steps:
        got = [0] * 8
        for move in step_moves(step, plan.shape):
            assert not move.summed and move.dst not in move.sources
            got[move.dst] += _volume(move.box) * 4
        assert tuple(got) == step.bytes_received, step


def test_summed_moves_name_every_addend():
    from spmdsim.programs.viz.moves import step_moves

    m = Layout((2, 4), ("dp", "tp"))
    plan = plan_redistribution(m("dp", None, partial=("tp",)), m(None, "tp"), (8, 8))
    moves = step_moves(plan.steps[0], plan.shape)  # Reduce_scatter over tp
    assert {(mv.dst, mv.sources, mv.box) for mv in moves if mv.dst == 1} == {
        (1, (0, 2, 3), ((0, 4), (2, 4)))}
    assert all(mv.summed for mv in moves) and len(moves) == 8


def test_show_matmul_prints_each_ranks_addend_and_the_sum(capsys):
    import numpy as np

    from spmdsim.layouts.dialects.strategy import matmul_layouts
    from spmdsim.programs.viz.matmul import matmul_sum_lines

    lines = matmul_sum_lines(matmul_layouts("((2,2),(2,1))", 4), (4, 4, 2))
    x, w = np.arange(16).reshape(4, 4), np.arange(8).reshape(4, 2)
    assert f"  r2      x[2:4, 0:2] @ w[0:2, 0:2] = {(x[2:4, :2] @ w[:2]).tolist()}".replace(" ", "") in [
        line.replace(" ", "") for line in lines]
    sums = [line for line in lines if line.lstrip().startswith("sum")]
    assert len(sums) == 2 and str((x[:2] @ w).tolist()) in sums[0]
    # No pending sum when K is whole: one addend per block, no sum line.
    whole = matmul_sum_lines(matmul_layouts("((2,1),(1,2))", 4), (2, 3, 2))
    assert not any(line.lstrip().startswith("sum") for line in whole)
    assert main(["show", "--strategy", "((2,2),(2,1))", "--matmul", "--shape", "4,4,2"]) == 0
    out = capsys.readouterr().out
    assert "out[0:2, 0:2] is a pending sum over k:" in out and max(map(len, out.splitlines())) <= 80
    assert main(["show", "--strategy", "((2,1),)", "--matmul", "--shape", "4,4,2"]) == 2
    assert "--matmul needs a MatMul --strategy of two tensors" in capsys.readouterr().err


def test_show_matmul_builds_only_the_numbers_it_prints(capsys):
    import tracemalloc

    from spmdsim.layouts.dialects.strategy import matmul_layouts
    from spmdsim.programs.viz.matmul import matmul_sum_lines

    # --shape 2**70,4,2 raised numpy's "Maximum allowed size exceeded"; 20000,20000,2 built 3.2 GB of inputs.
    assert main(["show", "--strategy", "((1,2),(2,1))", "--matmul", "--shape", f"{2 ** 70},4,2"]) == 0
    out = capsys.readouterr().out
    assert f"x = arange({2 ** 72}) as ({2 ** 70}, 4), w = arange(8) as (4, 2):" in out
    assert "(1 output block(s) larger than 16 elements or K over 16: numbers left out; try --shape 2,4,2)" in out
    tracemalloc.start()
    try:
        lines = matmul_sum_lines(matmul_layouts("((1,2),(2,1))", 2), (2000, 2000, 2))  # 32 MB of inputs before
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines[-1].endswith("numbers left out; try --shape 2,4,2)") and peak < 1_000_000


def test_rank_order_and_trace_export_on_simulated_ranks(capsys, tmp_path):
    import numpy as np

    import spmdsim
    from spmdsim.runtime import Mesh, collect_trace
    from spmdsim.runtime.collectives import allreduce
    from spmdsim.runtime.trace_export import write_chrome_trace

    path = tmp_path / "sim.json"

    def main_():
        comm = spmdsim.world()
        mesh = Mesh(Layout((4,), ("x",)), comm)
        with collect_trace() as trace:
            allreduce(mesh, np.ones(6, dtype="float32"), ("x",))
        print_ranked(comm, "done", f"half {comm.rank // 2}")
        write_chrome_trace(comm, trace, path)

    spmdsim.simulate(4, main_)
    assert capsys.readouterr().out == "ranks 0,1:\n  done\n  half 0\nranks 2,3:\n  done\n  half 1\n"
    obj = json.loads(path.read_text())
    _validate(obj)
    colls = [e for e in obj["traceEvents"] if e.get("cat") == "collective"]
    assert sorted(e["pid"] for e in colls) == [0, 1, 2, 3]
    assert {e["args"]["bytes_sent"] for e in colls} == {2 * 3 * 24 // 4}


def test_local_zeroing_says_what_it_does_on_split_and_copied_axes():
    """S -> P gave B -> P's reason ("one copy keeps the values and the others hold zeros"): on an axis
    that split a dim every rank pads its own block with zeros instead (docs/explanation/redistribution.md)."""
    m = Layout((2, 4), ("a", "b"))

    def why(source, target):
        plan = plan_redistribution(source, target, (8, 8))
        zero, = [s for s in plan.steps if s.op == "local_zero"]
        return step_why(zero)

    assert why(m("a", None), m(None, None, partial="a")) == (
        "the target is a pending sum over 'a', which split dim 0: each rank puts its own block inside a "
        "zero block the size of its new one, so the sum over 'a' is the value; no communication")
    assert why(m(None, None), m(None, None, partial="b")) == (
        "the target is a pending sum over 'b', whose ranks hold copies: one copy keeps the values and the "
        "others hold zeros; no communication")
    assert why(m("a", None), m(None, None, partial=("a", "b"))) == (
        "the target is a pending sum over ('a', 'b'): over 'a', which split dim 0, each rank puts its own "
        "block inside a zero block the size of its new one, so the sum over 'a' is the value; over 'b', "
        "whose ranks hold copies, one copy keeps the values and the others hold zeros; no communication")
    assert why(m(("a", "b"), None), m(None, None, partial=("b", "a"))).startswith(
        "the target is a pending sum over ('b', 'a'), which split dim 0: each rank puts its own block")


def test_plan_explain_of_shard_to_partial_says_each_rank_pads_its_block(capsys):
    assert main(["plan", "--device-matrix", "2,4", "--from-placements", "R,P", "--to-placements", "P,R",
                 "--shape", "8,8", "--explain"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("step 3, Shard(0)->Partial() via local zeroing on ('axis_0',): why: the target is a pending sum "
            "over 'axis_0', which split dim 0: each rank puts its own block inside a zero block the size of "
            "its new one, so the sum over 'axis_0' is the value; no communication") in out
