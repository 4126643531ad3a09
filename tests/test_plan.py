"""Planner unit tests: chosen steps, byte counts, strings, errors, caching, purity, CLI."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from spmdsim import Layout, PlanError, ShapeError
from spmdsim.tools.cli.main import main
from spmdsim.programs.plan import (
    Allgather,
    Allreduce,
    Alltoall,
    Exchange,
    LocalSlice,
    LocalZero,
    ReduceScatter,
    emulate,
    partial_addends,
    plan_redistribution,
    shards_of,
    sum_partials,
)
from spmdsim.programs.plan.meshes import common_refinement

X8 = Layout((8,), ("x",))
DM = Layout((2, 4), ("dp", "mp"))
CUBE = Layout((2, 2, 2), ("dp", "sp", "mp"))


def _kinds(plan):
    return [type(s) for s in plan.steps]


def _emulated(source, target, shape=(16, 32), dtype="float64"):
    plan = plan_redistribution(source, target, shape, dtype)
    full = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    out = emulate(plan, partial_addends(source, full))
    return plan, out, full


def test_shard0_to_shard1_on_8_ranks_is_one_alltoall_an_eighth_of_allgather():
    plan = plan_redistribution(X8("x", None), X8(None, "x"), (1024, 1024), "float32")
    assert _kinds(plan) == [Alltoall]
    step = plan.steps[0]
    assert str(step) == "S(0)->S(1) via Alltoall on ('x',)"
    assert (step.split_dim, step.concat_dim) == (1, 0)
    shard = 1024 * 1024 * 4 // 8
    assert plan.max_bytes_received == 7 * shard // 8 == plan.max_lower_bound
    # Allgather then slice would receive 7 whole shards: 8x more.
    assert 7 * shard == 8 * plan.max_bytes_received


@pytest.mark.parametrize(
    "source, target, kinds, text",
    [
        (DM("mp", None), DM(None, None), [Allgather], "S(0)->B via Allgather on ('mp',)"),
        (DM(None, None), DM(None, "mp"), [LocalSlice], "B->S(1) via local slice on ('mp',)"),
        (DM(None, None, partial=("mp",)), DM(None, None), [Allreduce], "P->B via Allreduce on ('mp',)"),
        (DM(None, None, partial=("mp",)), DM(None, "mp"), [ReduceScatter],
         "P->S(1) via Reduce_scatter on ('mp',)"),
        (DM(None, None), DM(None, None, partial=("dp",)), [LocalZero], "B->P via local zeroing on ('dp',)"),
        (DM("dp", None), DM(None, None, partial=("dp",)), [LocalZero], "S(0)->P via local zeroing on ('dp',)"),
        (DM(("dp", "mp"), None), DM(("mp", "dp"), None), [Exchange], None),
    ],
)
def test_each_transition_uses_its_collective(source, target, kinds, text):
    plan, out, full = _emulated(source, target)
    assert _kinds(plan) == kinds
    if text:
        assert str(plan.steps[0]) == text
    for r, block in shards_of(target.with_partial(()), full).items():
        assert np.array_equal(sum_partials(target, out)[r], block)


def test_slice_before_gather_keeps_the_lower_bound():
    plan = plan_redistribution(DM("dp", None), DM(None, "mp"), (16, 32), "float32")
    assert _kinds(plan) == [LocalSlice, Allgather]
    assert plan.meets_lower_bound


def test_reduce_scatter_onto_a_multi_axis_dim():
    plan, out, full = _emulated(CUBE(None, None, partial=("sp", "mp")), CUBE(("sp", "mp"), None))
    assert _kinds(plan) == [ReduceScatter]
    assert plan.steps[0].axes == ("sp", "mp")
    for r, block in shards_of(CUBE(("sp", "mp"), None), full).items():
        assert np.array_equal(out[r], block)


def test_cross_mesh_same_sharding_needs_no_step():
    plan = plan_redistribution(CUBE(("dp", "sp", "mp"), None), X8("x", None), (16, 8))
    assert plan.steps == () and plan.max_lower_bound == 0


def test_cross_mesh_plans_on_the_common_refinement():
    mesh, first, second = common_refinement(DM, Layout((4, 2), ("p", "q")))
    assert mesh.device_matrix == (2, 2, 2)
    assert first["mp"] == (mesh.alias_name[1], "q") and second["p"] == ("dp", mesh.alias_name[1])
    assert common_refinement(Layout((2, 3), ("a", "b")), Layout((3, 2), ("c", "d"))) is None


def test_meshes_without_common_refinement_use_the_exchange():
    src = Layout((2, 3), ("a", "b"))("a", "b")
    tgt = Layout((3, 2), ("c", "d"))("d", "c")
    plan, out, full = _emulated(src, tgt, shape=(6, 6))
    assert _kinds(plan) == [Exchange] and plan.meets_lower_bound
    for r, block in shards_of(tgt, full).items():
        assert np.array_equal(out[r], block)


def test_identity_plan_is_empty():
    assert plan_redistribution(DM("dp", "mp"), DM("dp", "mp"), (4, 8)).steps == ()


def test_plans_are_cached_values():
    a = plan_redistribution(DM("mp", None), DM(None, "mp"), (8, 8), "float32")
    b = plan_redistribution(DM("mp", None), DM(None, "mp"), [8, 8], np.float32)
    assert a is b
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.steps[0].axes = ("dp",)
    hash(a)


def test_exchange_bytes_are_per_rank():
    plan = plan_redistribution(DM(("dp", "mp"), None), DM(("mp", "dp"), None), (8, 4), "float64")
    # shard index i_dp*4+i_mp vs i_mp*2+i_dp: equal only for ranks 0 and 7.
    assert plan.bytes_received[0] == plan.bytes_received[7] == 0
    assert plan.bytes_received == plan.lower_bound


@pytest.mark.parametrize(
    "source, target, shape, message",
    [
        (DM("dp", None), X8(None, None), (4, 4), None),
        (DM("dp", None), Layout((4,), ("x",))("x", None), (4, 4), "devices"),
        (DM("dp", None), DM("dp", None, None), (4, 4), "dims"),
        ("dp", DM("dp", None), (4, 4), "must be a TensorLayout"),
    ],
)
def test_errors(source, target, shape, message):
    if message is None:
        plan_redistribution(source, target, shape)
        return
    with pytest.raises(PlanError, match=message):
        plan_redistribution(source, target, shape)


def test_indivisible_shape_is_a_shape_error():
    with pytest.raises(ShapeError, match="not divisible"):
        plan_redistribution(X8("x", None), X8(None, "x"), (8, 12))


def test_planning_imports_no_mpi4py():
    code = ("import sys, spmdsim.programs.plan, spmdsim.runtime.executor, spmdsim.tools.cli.plan; "
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_plan_text(capsys):
    assert main(["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None",
                 "--to", "None,x", "--shape", "1024,1024", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "S(0)->S(1) via Alltoall on ('x',)" in out
    assert "lower bound 458,752 B" in out and "8.0x this plan" in out


def test_cli_plan_table_keeps_each_row_whole(capsys):
    """A step too long for its row wraps inside the step column, its figures on its first line: the row
    was wrapped whole at 100 columns ("received/rank  predicted" and "B     0.207 ms" on lines of their own)."""
    assert main(["plan", "--device-matrix", "2,2,2", "--alias", "a,b,c", "--from", "(a,b),None",
                 "--from-partial", "c", "--to-device-matrix", "8", "--to-alias", "x", "--to", "None,x",
                 "--shape", "64,64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["#", "step"])
    assert lines[head].split()[-3:] == ["sent/rank", "received/rank", "predicted"]
    assert lines[head + 1].split()[-6:-2] == ["2,048", "B", "2,048", "B"]
    assert lines[head + 2].split()[:2] == ["2.", '(("a",'] and lines[head + 2].split()[-6:-2] == [
        "2,048", "B", "2,048", "B"]
    assert lines[head + 3].strip() == "Alltoallv exchange" and lines[head + 4].startswith("total received")
    assert max(map(len, lines)) <= 100


def test_cli_plan_json_cross_mesh_and_partial(capsys):
    assert main(["plan", "--device-matrix", "2,2,2", "--alias", "a,b,c", "--from", "(a,b),None",
                 "--from-partial", "c", "--to-device-matrix", "8", "--to-alias", "x",
                 "--to", "None,x", "--shape", "16,16", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {"steps", "bytes_received_per_rank", "lower_bound_bytes_received_per_rank"} <= set(record)
    ops = [s["op"] for s in record["steps"]]
    assert "reduce_scatter" in ops and "allreduce" not in ops
    assert record["bytes_received_per_rank"] == sum(
        s["bytes_received_per_rank"] for s in record["steps"])


def test_cli_plan_sbp_and_errors(capsys):
    assert main(["plan", "--device-matrix", "2,4", "--from-sbp", "S(0),S(0)", "--to-sbp", "B,S(1)",
                 "--shape", "16,16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"]
    assert main(["plan", "--device-matrix", "8", "--alias", "x", "--from", "x,None",
                 "--shape", "16,16"]) == 2
    assert "no target layout given; expected one of --to" in capsys.readouterr().err


@pytest.mark.parametrize(
    "source, target, shape",
    [
        # Reduce-scattering a1 onto dim 0 first would need 4 shards of a size-2 dim.
        (Layout((2, 2), ("a0", "a1"))("a0", partial=("a1",)), Layout((2, 2), ("a0", "a1"))("a1"), (2,)),
        # Zero-padding in place would need ("b", "a") on a size-2 dim.
        (Layout((2, 2), ("a", "b"))("a"), Layout((2, 2), ("a", "b"))("b", partial=("a",)), (2,)),
        # One device on both sides.
        (Layout((1,), ("a0",))(None), Layout((1,), ("b0",))(None), (2,)),
        (Layout((1, 1), ("a", "b"))("a", partial=("b",)), Layout((1,), ("c",))("c"), (3,)),
    ],
)
def test_small_dims_and_single_devices(source, target, shape):
    plan, out, full = _emulated(source, target, shape)
    for r, block in shards_of(target.with_partial(()), full).items():
        assert np.array_equal(sum_partials(target, out)[r], block)


def test_device_matrix_and_placement_give_one_mesh(capsys):
    """--placement is another name for --device-matrix (docs/explanation/redistribution.md): `--device-matrix 8
    --placement 2,4` planned on (2, 4) without a word; two different meshes are refused, naming both."""
    rest = ["--alias", "a,b", "--from", "a,None", "--to", "None,b", "--shape", "8,8", "--json"]
    assert main(["plan", "--device-matrix", "8", "--placement", "2,4", *rest]) == 2
    out, err = capsys.readouterr()
    assert out == "" and " ".join(err.split()) == (
        "spmdsim: error: --device-matrix '8' and --placement '2,4' give two device matrices (--placement is "
        "another name for --device-matrix); give one")
    assert main(["plan", "--placement", "2,4", "--device-matrix", "4,2", *rest]) == 2
    assert "--placement '2,4' and --device-matrix '4,2' give two device matrices" in " ".join(
        capsys.readouterr().err.split())
    assert main(["plan", "--device-matrix", "2,4", *rest]) == 0
    once = json.loads(capsys.readouterr().out)
    for twice in (["--device-matrix", "2,4", "--placement", "2, 4"], ["--placement", "2,4"]):
        assert main(["plan", *twice, *rest]) == 0
        assert json.loads(capsys.readouterr().out) == once


def test_a_bfloat16_pending_sum_is_planned_as_the_float32_it_is_sent_as():
    """MPI has no bfloat16 sum: a bfloat16 tensor's Allreduce and Reduce_scatter send float32 (4 bytes an
    element; spmdsim.base.precision.sent_itemsize), its other steps 2. The plan counts what the trace and the dry run
    count, rank by rank, on even and uneven cuts (it counted 2 bytes for the sums: half the trace's); the lower
    bound stays a bound (each summed element arrives at least once, at least 2 bytes)."""
    pytest.importorskip("ml_dtypes")
    import spmdsim
    from spmdsim import DTensor, Mesh, TensorLayout, collect_trace
    from spmdsim.base.precision import bfloat16, sent_itemsize
    from spmdsim.runtime.executor import redistribute

    bf16 = bfloat16()
    assert [sent_itemsize(bf16, True), sent_itemsize(bf16, False), sent_itemsize("float16", True),
            sent_itemsize("float64", True), sent_itemsize("int8", False)] == [4, 2, 2, 8, 1]
    assert Allreduce.sums and ReduceScatter.sums and not (Allgather.sums or Alltoall.sums or Exchange.sums)

    def body(layout, source, target, shape):
        mesh = Mesh(layout)
        x = DTensor.from_local(mesh, np.ones(source.local_shape(shape, mesh.rank), bf16), source, shape)
        with collect_trace() as trace:
            redistribute(x, target)
        return sum(e.bytes_received for e in trace.entries), sum(e.bytes_sent for e in trace.entries)

    for cut, shape in (("even", (8, 8)), ("balanced", (7, 5))):
        layout = Layout((2, 2), ("a", "b"), cut=cut)
        for source, target, kinds in (
                (TensorLayout(layout, ((), ()), ("b",)), TensorLayout(layout, ((), ())), ["allreduce"]),
                (TensorLayout(layout, ((), ()), ("a", "b")), TensorLayout(layout, (("a", "b"), ())),
                 ["reduce_scatter"]),
                (TensorLayout(layout, (("a",), ()), ("b",)), TensorLayout(layout, (("b",), ("a",))),
                 ["reduce_scatter", "exchange"])):
            plan = plan_redistribution(source, target, shape, "bfloat16")
            wide = plan_redistribution(source, target, shape, "float32")
            assert [s.op for s in plan.steps] == [s.op for s in wide.steps] == kinds
            for step, twin in zip(plan.steps, wide.steps):  # sums as float32's; an exchange moves 2-byte words
                assert step.bytes_received == tuple(n // (1 if step.sums else 2) for n in twin.bytes_received)
            for dry in (False, True):
                ran = spmdsim.simulate(4, body, layout, source, target, shape, dry_run=dry)
                got = [(r.bytes_received, r.bytes_sent) for r in ran.report.ranks] if dry else list(ran)
                assert got == list(zip(plan.bytes_received, plan.bytes_sent)), (cut, source, target, dry)
            assert all(b <= r for b, r in zip(plan.lower_bound, plan.bytes_received))
