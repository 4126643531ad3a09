"""OneFlow SBP, DTensor placements and JAX PartitionSpec: worked examples and every error."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from spmdsim import DialectError, Layout
from spmdsim.layouts.dialects import (
    Broadcast,
    Partial,
    PartialSum,
    Replicate,
    Shard,
    Split,
    format_partition_spec,
    format_placements,
    format_sbp,
    layout_to_partition_spec,
    layout_to_placements,
    layout_to_sbp,
    parse_placements,
    parse_sbp,
    partition_spec_to_layout,
    placements_to_layout,
    sbp_to_layout,
    strategy_to_layout,
)


def _errors_with(fragment: str, func, *args, **kwargs) -> str:
    with pytest.raises(DialectError) as info:
        func(*args, **kwargs)
    assert fragment in str(info.value), str(info.value)
    return str(info.value)


# -- SBP values and parsing ------------------------------------------------------
def test_sbp_values_are_short_hashable_and_repr_round_trips():
    assert [str(s) for s in (Broadcast(), Split(0), PartialSum())] == ["B", "S(0)", "P"]
    assert eval(repr(Split(2))) == Split(2)
    assert len({Split(1), Split(1), Broadcast()}) == 2


@pytest.mark.parametrize(
    "value",
    [
        ("B", "S(0)"),
        "B, S(0)",
        "(B, S(0))",
        "[broadcast, split(0)]",
        "(flow.sbp.broadcast, oneflow.sbp.split( 0 ))",
        (Broadcast(), "S(0)"),
        [Broadcast(), Split(0)],
    ],
)
def test_parse_sbp_forms(value):
    assert parse_sbp(value) == (Broadcast(), Split(0))


def test_parse_sbp_reads_what_oneflow_prints():
    # A global tensor prints sbp=(oneflow.sbp.split(dim=0),); older OneFlow printed split(axis=0), and
    # flow.sbp.broadcast() / partial_sum() are called in user code.
    assert parse_sbp("(oneflow.sbp.split(dim=0), oneflow.sbp.broadcast)") == (Split(0), Broadcast())
    assert parse_sbp("flow.sbp.split(axis=1), flow.sbp.partial_sum()") == (Split(1), PartialSum())
    assert parse_sbp("broadcast(), S(0)") == (Broadcast(), Split(0))
    _errors_with("sbp 'split(dim=-1)' is not valid", parse_sbp, "split(dim=-1)")


def test_parse_sbp_single_entries():
    assert parse_sbp("(S(1), P)") == (Split(1), PartialSum())
    assert parse_sbp("S(3)") == (Split(3),)
    assert parse_sbp("(S(0),)") == (Split(0),)
    assert parse_sbp(PartialSum()) == (PartialSum(),)
    assert parse_sbp("partial_sum") == (PartialSum(),)
    assert format_sbp("B,S(1)") == "(B, S(1))"


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("S(x)", "sbp 'S(x)' is not valid; expected 'B', 'P' or 'S(d)'"),
        ("Q", "sbp 'Q' is not valid"),
        ("S(-1)", "sbp 'S(-1)' is not valid"),
        ("B, R", "sbp 'R' in 'B, R' is not valid"),
        ("(B, S(0)", "sbp '(B, S(0)' has unbalanced brackets"),
        ("B,,P", "sbp 'B,,P' has an empty entry"),
        ("", "sbp '' has an empty entry"),
        ((), "sbp () is empty"),
        (("B", 3), "sbp entry 3 in ('B', 3) is not an SBP"),
        (7, "sbp 7 must be text or a sequence"),
    ],
)
def test_parse_sbp_errors(value, fragment):
    _errors_with(fragment, parse_sbp, value)


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0"])
def test_split_rejects_bad_tensor_dim(bad):
    _errors_with(f"split tensor_dim {bad!r} must be a non-negative integer", Split, bad)


# -- SBP <-> layout ---------------------------------------------------------------
def test_seed_002_broadcast_then_split():
    # placement [[0, 1], [2, 3]], sbp (broadcast, split(0)): ranks 0 and 2 hold the same
    # rows, ranks 1 and 3 the other rows (the seed's printed cpu:0 == cpu:2, cpu:1 == cpu:3).
    tl = sbp_to_layout("(B, S(0))", (2, 2), 2)
    assert tl.layout == Layout((2, 2), ("axis_0", "axis_1"))
    assert tl.tensor_map == (("axis_1",), ())
    a = np.array([[1, 2], [3, 4]])
    held = [a[tl.slices(r, a.shape)].tolist() for r in range(4)]
    assert held == [[[1, 2]], [[3, 4]], [[1, 2]], [[3, 4]]]
    assert tl.replica_groups() == ((0, 2), (1, 3))


def test_seed_002_matmul_2d_signature():
    # x (B, S(0)) times w (S(1), B) gives y (S(1), S(0)): each rank's local product is
    # exactly its slice of the global product.
    placement = (2, 2)
    x_tl = sbp_to_layout("B, S(0)", placement, 2)
    w_tl = sbp_to_layout("S(1), B", placement, 2)
    y_tl = sbp_to_layout("S(1), S(0)", placement, 2)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 6)), rng.standard_normal((6, 8))
    y = x @ w
    for r in range(4):
        local = x[x_tl.slices(r, x.shape)] @ w[w_tl.slices(r, w.shape)]
        np.testing.assert_allclose(local, y[y_tl.slices(r, y.shape)])


def test_sbp_split_on_several_axes_lower_axis_major():
    tl = sbp_to_layout("S(0), B, S(0)", (2, 3, 2), 1)
    assert tl.tensor_map == (("axis_0", "axis_2"),)
    # shard index = i_axis_0 * 2 + i_axis_2
    assert [tl.shard_index(r)[0] for r in range(12)] == [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]


def test_sbp_partial_and_custom_names():
    tl = sbp_to_layout((PartialSum(), Split(1)), (2, 4), 2, mesh_axis_names=("dp", "mp"))
    assert tl.partial == ("dp",) and tl.tensor_map == ((), ("mp",))
    assert layout_to_sbp(tl) == (PartialSum(), Split(1))


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("S(2)", (4,), 2), "sbp S(2) on placement axis 0 splits tensor dim 2, but the tensor has 2"),
        (("B, S(0)", (2, 2, 2), 2), "(B, S(0)) has 2 entries but placement shape (2, 2, 2) has 3 axes"),
        # A count of 1 read "has 1 entries", "has 1 axes".
        (("S(0)", (2, 2), 2), "sbp (S(0)) has 1 entry but placement shape (2, 2) has 2 axes"),
        (("S(0), B", (4,), 2), "sbp (S(0), B) has 2 entries but placement shape (4,) has 1 axis"),
        (("B", (0,), 2), "placement shape (0,) must hold positive integers, got 0"),
        (("B", (), 2), "placement shape () must be a non-empty sequence"),
        (("B", (2,), -1), "ndim -1 must be a non-negative integer"),
        (("B, B", (2, 2), 1), ""),
    ],
)
def test_sbp_to_layout_errors(args, fragment):
    if not fragment:  # the valid control case
        assert sbp_to_layout(*args).tensor_map == ((),)
        return
    _errors_with(fragment, sbp_to_layout, *args)


def test_sbp_to_layout_mesh_names_must_match_axes():
    _errors_with("mesh_axis_names ('a',) must give one name per mesh axis (2 axes)",
                 sbp_to_layout, "B, B", (2, 2), 1, mesh_axis_names=("a",))
    _errors_with("mesh_axis_names ('a', 'b') must give one name per mesh axis (1 axis)",  # read "(1 axes)"
                 sbp_to_layout, "B", (2,), 1, mesh_axis_names=("a", "b"))


def test_layout_to_sbp_rejects_descending_multi_axis_order():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))
    msg = _errors_with(
        "tensor dim 1 is split over ('sp', 'dp') with 'sp' major", layout_to_sbp, tl
    )
    assert "in nD SBP the lower mesh axis is always major" in msg
    assert "('dp', 'sp')" in msg
    assert layout_to_sbp(tl.with_map("mp", ("dp", "sp"))) == (Split(1), Split(1), Split(0))
    _errors_with("expected a TensorLayout, got", layout_to_sbp, "B")


# -- DTensor placements ---------------------------------------------------------
def test_placement_values_and_parsing():
    assert [str(p) for p in (Shard(0), Replicate(), Partial(), Partial("avg"))] == [
        "S(0)", "R", "P", "P(avg)"]
    assert parse_placements("S(0), R, P") == (Shard(0), Replicate(), Partial())
    assert parse_placements("(Shard(-1), Replicate(), Partial('max'))") == (
        Shard(-1), Replicate(), Partial("max"))
    assert parse_placements([Shard(1), "R"]) == (Shard(1), Replicate())
    assert format_placements([Shard(1), Replicate()]) == "(S(1), R)"


def test_parse_placements_reads_what_pytorch_prints():
    # print(dt.placements) shows the reprs: (Shard(dim=0), Replicate(), Partial(sum)).
    assert parse_placements("(Shard(dim=0), Replicate(), Partial(sum))") == (Shard(0), Replicate(), Partial())
    assert parse_placements("Shard(dim=-1), Partial(reduce_op='avg')") == (Shard(-1), Partial("avg"))
    assert parse_placements(repr((Shard(1), Partial()))) == (Shard(1), Partial())
    msg = _errors_with("placement '_StridedShard(dim=0, sf=2)' in '(_StridedShard(dim=0, sf=2), Shard(dim=0))' "
                       "is DTensor's _StridedShard", parse_placements, "(_StridedShard(dim=0, sf=2), Shard(dim=0))")
    assert "not model" in msg and "\n" not in msg
    _errors_with("placement '_S(0, 2)' is DTensor's _StridedShard", parse_placements, "_S(0, 2)")


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("S(0), B", "placement 'B' in 'S(0), B' is not valid; expected 'S(d)', 'R' or 'P'"),
        ("Shard(x)", "placement 'Shard(x)' is not valid"),
        ("(R", "placements '(R' have unbalanced brackets"),
        ("R,,R", "placements 'R,,R' have an empty entry"),
        ([], "placements [] are empty"),
        ([Shard(0), 2], "placement 2 in [Shard(dim=0), 2] is not a placement"),
        (3, "placements 3 must be text or a sequence of placements"),
    ],
)
def test_parse_placements_errors(value, fragment):
    _errors_with(fragment, parse_placements, value)


def test_placement_value_errors():
    _errors_with("shard dim 'x' must be an integer", Shard, "x")
    _errors_with("partial reduce_op 3 must be a name", Partial, 3)
    _errors_with("partial reduce_op 'bogus' is not a reduce op; expected one of sum, avg, product, min, max, band, "
                 "bor, bxor, premul_sum (PyTorch's c10d ReduceOp names)", Partial, "bogus")
    _errors_with("partial reduce_op 'bogus' is not a reduce op", parse_placements, "S(0), P(bogus)")


def test_placements_to_layout_examples():
    tl = placements_to_layout([Shard(0), Replicate()], (2, 4), 2)
    assert tl.layout == Layout((2, 4), ("axis_0", "axis_1"))
    assert tl.tensor_map == (("axis_0",), ())
    tl = placements_to_layout("S(-1), S(1), P", (2, 2, 2), 2, mesh_axis_names=("dp", "tp", "cp"))
    assert tl.tensor_map == ((), ("dp", "tp")) and tl.partial == ("cp",)
    assert layout_to_placements(tl) == (Shard(1), Shard(1), Partial())


@pytest.mark.parametrize(
    "args, kwargs, fragment",
    [
        (([Partial("avg")], (4,), 1), {}, "reduce_op 'avg' on mesh dim 0 is not supported"),
        (([Shard(2)], (4,), 2), {}, "S(2) on mesh dim 0 shards tensor dim 2, but the tensor has 2 dims"),
        (([Shard(-3)], (4,), 2), {}, "shards tensor dim -3, but the tensor has 2 dims"),
        (([Shard(0)], (2, 2), 2), {}, "(S(0)) have 1 entry but mesh shape (2, 2) has 2 dims"),
        (([Shard(0)], (4,), 1.5), {}, "ndim 1.5 must be a non-negative integer"),
        (([Shard(0)], (4,), 1), {"mesh_axis_names": ("a", "b")},
         "mesh_axis_names ('a', 'b') must give one name"),
        (([Shard(0)], "4", 1), {}, "mesh shape '4' is not a mesh; expected a mesh shape"),
    ],
)
def test_placements_to_layout_errors(args, kwargs, fragment):
    _errors_with(fragment, placements_to_layout, *args, **kwargs)


def test_layout_to_placements_rejects_descending_order():
    tl = Layout((2, 4), ("dp", "mp"))(("mp", "dp"))
    msg = _errors_with(
        "tensor dim 0 is split over ('mp', 'dp') with 'mp' major", layout_to_placements, tl
    )
    assert "_StridedShard" in msg
    assert "in DTensor placements the lower mesh axis is always major" in msg  # not "placements ... makes"


@pytest.mark.parametrize("convert, args", [
    (placements_to_layout, ("R,R", (2, 4), 2)),
    (sbp_to_layout, ("B,B", (2, 4), 2)),
    (partition_spec_to_layout, ((None, None), (2, 4), 2)),
    (strategy_to_layout, ("((2,4),)", 8)),
])
def test_repeated_or_empty_mesh_axis_names_are_refused_as_mesh_axis_names(convert, args):
    # The Layout's own refusal named its field ("alias_name ('a', 'a') repeats a name"), a LayoutError: the
    # converter's caller passed mesh_axis_names.
    _errors_with("mesh_axis_names ('a', 'a') names two mesh axes 'a'; expected a different name for each",
                 convert, *args, mesh_axis_names=("a", "a"))
    _errors_with("mesh_axis_names ('a', '') holds the name ''", convert, *args, mesh_axis_names=("a", ""))
    assert convert(*args, mesh_axis_names=("a", "b")).layout.alias_name == ("a", "b")


# -- JAX PartitionSpec --------------------------------------------------------------
def test_partition_spec_design_example():
    # docs/explanation/semantics.md: mesh (dp, sp, mp) = (2, 2, 2), x (32, 784) mapped ("mp", ("sp", "dp")).
    tl = partition_spec_to_layout(("mp", ("sp", "dp")), (2, 2, 2), 2, ("dp", "sp", "mp"))
    shape = (32, 784)
    assert tl.slices(tl.layout.rank_of((0, 1, 0)), shape) == (slice(0, 16), slice(392, 588))
    assert tl.slices(tl.layout.rank_of((1, 0, 0)), shape) == (slice(0, 16), slice(196, 392))
    assert layout_to_partition_spec(tl) == ("mp", ("sp", "dp"))
    assert format_partition_spec(("mp", ("sp", "dp"))) == "PartitionSpec('mp', ('sp', 'dp'))"


@pytest.mark.parametrize("spec, said", [
    (5, "partition spec 5 must be a tuple with one entry per tensor dim (None, a mesh axis name or a tuple of "
        "mesh axis names), e.g. ('dp', None)"),
    ((("a", 5),), "partition spec (('a', 5),) has entry ('a', 5); expected None, a mesh axis name or a tuple of "
                  "mesh axis names"),
    (("a", ("b", "a")), "partition spec ('a', ('b', 'a')) uses mesh axis 'a' more than once; each mesh axis may "
                        "shard at most one tensor dim"),
])
def test_format_partition_spec_refuses_what_the_reader_refuses(spec, said):
    with pytest.raises(DialectError) as info:
        format_partition_spec(spec)
    assert str(info.value) == said
    assert format_partition_spec("mp,(sp,dp)") == "PartitionSpec('mp', ('sp', 'dp'))"  # text, as the reader's


def test_partition_spec_padding_and_entry_forms():
    tl = partition_spec_to_layout(["dp"], [2, 4], 3, ["dp", "mp"])
    assert tl.tensor_map == (("dp",), (), ())
    assert layout_to_partition_spec(tl) == ("dp", None, None)
    tl = partition_spec_to_layout((("mp",), (), None), (2, 4), mesh_axis_names=("dp", "mp"))
    assert layout_to_partition_spec(tl) == ("mp", None, None)
    assert partition_spec_to_layout((), (8,), 0, ("x",)).ndim == 0


@pytest.mark.parametrize("text", ["P('dp', None)", "PartitionSpec('dp', None)", "('dp', None)", "dp,None", "dp"])
def test_partition_spec_as_text_reads_as_the_cli_reads_it(text):
    # "P('dp', None)" was refused ("must be a tuple") though `--partition-spec "P('dp', None)"` read it: one parser
    from spmdsim.tools.cli.cases import parse_partition_spec

    tl = partition_spec_to_layout(text, (2, 4), 2, ("dp", "mp"))
    assert layout_to_partition_spec(tl) == ("dp", None)
    assert tl == partition_spec_to_layout(parse_partition_spec(text), (2, 4), 2, ("dp", "mp"))


@pytest.mark.parametrize(
    "args, kwargs, fragment",
    [
        ((5, (2,), None, ("dp",)), {}, "partition spec 5 must be a tuple with one entry per"),
        (("P('dp',,)", (2,), None, ("dp",)), {}, "partition spec \"P('dp',,)\" has an empty entry for tensor dim 1"),
        ((("z",), (2, 4), None, ("dp", "mp")), {},
         "partition spec ('z',) names mesh axis 'z', which is not one of the mesh axes ('dp', 'mp')"),
        ((("dp", ("mp", "dp")), (2, 4), None, ("dp", "mp")), {}, "uses mesh axis 'dp' more than once"),
        (((5,), (2,), None, ("dp",)), {}, "partition spec (5,) has entry 5; expected None, a mesh"),
        ((("dp", None, None), (2,), 2, ("dp",)), {}, "has 3 entries but the tensor has 2 dims"),
        ((("dp",), (2,), -1, ("dp",)), {}, "ndim -1 must be a non-negative integer"),
        ((("dp",), (2,), None, ("dp", "mp")), {},
         "mesh_axis_names ('dp', 'mp') must give one name per mesh axis (1 axis)"),
        ((("dp",), (2,), None, "dp"), {}, "mesh_axis_names 'dp' must give one name"),
    ],
)
def test_partition_spec_errors(args, kwargs, fragment):
    _errors_with(fragment, partition_spec_to_layout, *args, **kwargs)


def test_partition_spec_cannot_express_partial():
    tl = Layout((2, 4), ("dp", "mp"))("dp", None, partial=("mp",))
    _errors_with(
        "PartitionSpec cannot express partial sums over ('mp',)", layout_to_partition_spec, tl
    )
    _errors_with("expected a TensorLayout, got", layout_to_partition_spec, ("dp",))


# -- the mesh every converter takes --------------------------------------------------
#: Each converter that takes a mesh, given one: rows split over "dp" (the first of (2, 4)), copies over "mp".
CONVERTERS = {
    "sbp": lambda mesh, **kw: sbp_to_layout("S(0), B", mesh, 2, **kw),
    "placements": lambda mesh, **kw: placements_to_layout("S(0), R", mesh, 2, **kw),
    "partition_spec": lambda mesh, **kw: partition_spec_to_layout(("dp", None), mesh, 2, **kw),
    "strategy": lambda mesh, **kw: strategy_to_layout((2, 1), mesh, 2, **kw),
}


def _blocks(tl) -> list:
    return [tl.slices(rank, (8, 8)) for rank in range(tl.layout.num_devices)]


@pytest.mark.parametrize("name", sorted(CONVERTERS))
def test_every_converter_takes_a_layout_a_mesh_or_a_shape_and_refuses_the_rest_alike(name):
    """sbp_to_layout and strategy_to_layout refused a Layout ("placement shape Layout(...) must be a non-empty
    sequence of positive integers", "world_size Layout(...) must be a positive integer") where
    placements_to_layout and partition_spec_to_layout took one: all four take a shape (with names), a bare
    count (a 1-D mesh), a Layout or a Mesh now, the last two giving a layout on that very Layout; anything
    else, or names beside a mesh that names its axes, is one line, the same for all four."""
    import types

    convert = CONVERTERS[name]
    mesh = Layout((2, 4), ("dp", "mp"), cut="chunk")
    want = _blocks(mesh("dp", None))
    for given in (mesh, types.SimpleNamespace(layout=mesh)):  # a Mesh is read by its .layout
        tl = convert(given)
        assert tl == mesh("dp", None) and tl.layout is mesh, tl
    assert _blocks(convert((2, 4), mesh_axis_names=("dp", "mp"))) == want
    one_d = {"sbp": lambda: sbp_to_layout("S(0)", 8, 2), "placements": lambda: placements_to_layout("S(0)", 8, 2),
             "partition_spec": lambda: partition_spec_to_layout(("x",), 8, 2, ("x",)),
             "strategy": lambda: strategy_to_layout((8, 1), 8, 2)}[name]()
    assert _blocks(one_d) == [(slice(r, r + 1), slice(0, 8)) for r in range(8)]
    what = "placement shape" if name == "sbp" else "mesh shape"
    for bad, said in (("8", f"{what} '8' is not a mesh; expected a mesh shape (a tuple of positive integers, or "
                            "one for a 1-D mesh), a spmdsim Layout or a Mesh"),
                      ({"dp": 2}, f"{what} {{'dp': 2}} is not a mesh; expected a mesh shape"),
                      (0, f"{what} 0 must be a positive integer")):
        _errors_with(said, convert, bad)
    _errors_with("mesh_axis_names ('a', 'b'): a Layout or Mesh names its own axes ('dp', 'mp'); leave them out",
                 convert, mesh, mesh_axis_names=("a", "b"))


@pytest.mark.parametrize("counts", [(1, 1), (2, 1), (1, 2), (2, 4), (8, 1), (1, 8), (4, 1), (2, 2), (1, 4)])
def test_a_strategy_on_a_mesh_holds_what_it_holds_on_its_own_device_matrix(counts):
    """MindSpore numbers the devices row-major over the strategy, then "rep": on a Layout whose axes group into
    the counts the same rank holds the same block, written on the mesh's axes (an axis of size 1 cuts nothing)."""
    mesh = Layout((2, 1, 2, 2), ("a", "one", "b", "c"))
    on_mesh, own = strategy_to_layout(counts, mesh), strategy_to_layout(counts, 8)
    assert on_mesh.layout is mesh and _blocks(on_mesh) == _blocks(own), (on_mesh, own)
    assert "one" not in [axis for axes in on_mesh.tensor_map for axis in axes]
    assert strategy_to_layout((2, 2), mesh).tensor_map == (("a",), ("b",))


def test_a_strategy_that_does_not_group_the_mesh_axes_is_one_line():
    mesh = Layout((2, 4), ("dp", "mp"))
    _errors_with("strategy (4, 2) does not lie on the mesh Layout(device_matrix=(2, 4), alias_name=('dp', 'mp')): "
                 "its slice count 4 is not the product of the next mesh axes in order",
                 strategy_to_layout, (4, 2), mesh)
    _errors_with("or the number of ranks (8) for the strategy's own device matrix", strategy_to_layout, (4, 2), mesh)
    _errors_with("strategy (3, 1) uses 3 devices, which does not divide the world size 8", strategy_to_layout,
                 (3, 1), mesh)
    _errors_with("strategy (4, 4) needs 16 devices but the world size is 8", strategy_to_layout, (4, 4), mesh)


# -- what no dialect reads ------------------------------------------------------------
def test_a_mesh_where_a_count_goes_is_one_line_with_the_count_to_pass():
    """matmul_layouts takes a number of ranks and split_layouts Paddle's num_partitions; a Layout, Mesh or
    mesh shape there said only "must be a positive integer" (printing a Layout). Now the line says it is
    a mesh and which number to pass for it."""
    from spmdsim import Mesh, simulate, world
    from spmdsim.layouts.dialects import matmul_layouts, split_layouts

    mesh = Layout((2, 4), ("dp", "mp"))
    takes = ("matmul_layouts takes the number of ranks (MindSpore lays a strategy over a flat device list; the "
             "layouts come on the strategy's own device matrix: m, k, n and rep): pass 8 for this mesh")
    for given, said in ((mesh, f"world_size {mesh!r} is a mesh"), ((2, 4), "world_size (2, 4) is a mesh shape")):
        with pytest.raises(DialectError) as error:
            matmul_layouts("((2,1),(1,4))", given)
        assert str(error.value) == f"{said}, not a count; {takes}"

    def rank() -> str:  # a Mesh: the same line on every rank (its repr names the rank)
        with pytest.raises(DialectError) as error:
            matmul_layouts("((2,1),(1,4))", Mesh(Layout((2, 4), ("dp", "mp")), world()))
        return str(error.value)

    assert simulate(8, rank) == [f"world_size is a Mesh (on {mesh!r}), not a count; {takes}"] * 8
    with pytest.raises(DialectError) as error:
        split_layouts((8, 8), "linear", 1, mesh)
    assert str(error.value) == (
        f"num_partitions {mesh!r} is a mesh, not a count; split_layouts takes Paddle's num_partitions, the size "
        "of the model-parallel group (the layouts come on Layout((num_partitions,), ('mp',))): pass 4 for this mesh")
    with pytest.raises(DialectError,
                       match=r"^num_partitions \(8,\) is a mesh shape, not a count; .*: pass that number$"):
        split_layouts((8, 8), "linear", 1, (8,))
    # The counts still work, numpy's too.
    assert matmul_layouts("((2,1),(1,4))", np.int64(8)).layout.device_matrix == (2, 1, 4)
    assert split_layouts((8, 8), "linear", 1, 4).layout.device_matrix == (4,)


def test_what_spmdsim_does_not_read_is_one_line_naming_it_and_the_way_out():
    """JAX's P.UNCONSTRAINED read as a mesh axis name ("names mesh axis 'UNCONSTRAINED', which is not one of the
    mesh axes"); MindSpore's integer tensor map said only "must be an axis name"; Layout took MindSpore's
    "interleaved_parallel" as a real axis (16 ranks for a layout MindSpore runs on 8, silently); Paddle's
    ProcessMesh was "not a mesh". Each names itself now, and what to write instead (Paddle's dist.Shard
    placements are read now: tests/test_dialects_porting.py);
    docs/reference/dialects.md lists them under "Not supported"."""
    from pathlib import Path

    from spmdsim import LayoutError

    mesh = Layout((2, 4), ("dp", "mp"))
    for spec in (("dp", "UNCONSTRAINED"), ("dp", "P.UNCONSTRAINED")):
        said = _errors_with(f"has entry {spec[1]}: JAX's 'let the compiler choose' (with_sharding_constraint), "
                            "which spmdsim does not model", partition_spec_to_layout, spec, mesh)
        assert said.endswith("expected None, a mesh axis name or a tuple of mesh axis names for that dim")
    named = Layout((2,), ("UNCONSTRAINED",))  # an axis of that name is an axis
    assert partition_spec_to_layout(("UNCONSTRAINED",), named).tensor_map == (("UNCONSTRAINED",),)
    for call, said in ((lambda: mesh(1, 0), "tensor map entry 1 is an axis number (MindSpore's integer tensor_map, "
                        "counted from the right, -1 for none), which spmdsim does not read; expected an axis name"),
                       (lambda: mesh((-1, "dp")), "got -1 (an axis number, MindSpore's integer tensor_map: write "
                        "the axis's name)"),
                       (lambda: mesh("1", None), "unknown alias '1' in tensor map (\"1\", None); expected one of "
                        "('dp', 'mp') (an axis number? MindSpore's integer tensor_map is not read"),
                       (lambda: Layout((2, 4, 2), ("dp", "mp", "interleaved_parallel")),
                        "alias name 'interleaved_parallel' in ('dp', 'mp', 'interleaved_parallel') is MindSpore's "
                        "micro-interleaving (a tensor cut into slices that one device computes in turn), which "
                        "spmdsim does not model; expected the device matrix of the real axes: leave that axis and "
                        "its size out")):
        with pytest.raises(LayoutError) as info:
            call()
        assert said in str(info.value), str(info.value)
    process_mesh = type("ProcessMesh", (), {"__module__": "paddle.distributed.auto_parallel.process_mesh",
                                            "__repr__": lambda self: "ProcessMesh([[0, 1], [2, 3]])"})()
    for convert in CONVERTERS.values():
        _errors_with("ProcessMesh([[0, 1], [2, 3]]) is not a mesh (a paddle ProcessMesh, which spmdsim does not "
                     "read: pass Layout(mesh.shape, mesh.dim_names) instead)", convert, process_mesh)
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "reference" / "dialects.md").read_text().split())
    section = doc[doc.index("## Not supported"):]
    for name in ("P.UNCONSTRAINED", "integer tensor map", "interleaved_parallel", "ProcessMesh"):
        assert name in section, name


def test_jaxs_unreduced_and_reduced_axes_in_a_spec_are_one_line_each():
    """A spec as JAX prints one with unreduced axes, "P('dp', None, unreduced={'tp'})", read its keyword as a third
    entry: 'partition spec ('dp', None, "unreduced={'tp'}") has 3 entries but the tensor has 2 dims'. Each keyword
    now names itself and what to write; the layout it points to holds the pending sum."""
    from pathlib import Path

    mesh = Layout((2, 4), ("dp", "tp"))
    said = _errors_with("has JAX's unreduced= axes, whose devices hold addends of a pending sum: spmdsim's partial "
                        "axes", partition_spec_to_layout, "P('dp', None, unreduced={'tp'})", mesh, 2)
    assert said.endswith("e.g. mesh.layout('dp', None, partial=('tp',))")
    assert mesh("dp", None, partial=("tp",)).partial == ("tp",)
    said = _errors_with("has JAX's reduced= axes, over which the tensor is replicated", partition_spec_to_layout,
                        "PartitionSpec('dp', reduced={'tp'})", mesh, 2)
    _errors_with("has a keyword foo=; expected only entries", partition_spec_to_layout, "P('dp', foo=1)", mesh, 2)
    assert partition_spec_to_layout("P('dp', None)", mesh, 2).tensor_map == (("dp",), ())  # no keyword: as before
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "reference" / "dialects.md").read_text().split())
    assert "`unreduced=` and `reduced=`" in doc[doc.index("## Not supported"):]


def test_dialects_import_no_mpi4py():
    code = (
        "import sys, spmdsim.layouts.dialects\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mpi4py', 'torch', 'jax', 'oneflow', 'paddle', 'mindspore')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_old_names_and_orders_warn_and_still_work():
    new = partition_spec_to_layout(("mp", None), (2, 4), 2, ("dp", "mp"))
    with pytest.warns(DeprecationWarning, match="partition_spec_to_layout"):
        assert partition_spec_to_layout(("mp", None), ("dp", "mp"), (2, 4), 2) == new
    with pytest.warns(DeprecationWarning, match="mesh_dim_names"):
        old = placements_to_layout("S(0), R", (2, 4), 2, mesh_dim_names=("dp", "mp"))
    assert old == placements_to_layout("S(0), R", (2, 4), 2, ("dp", "mp"))
    with pytest.warns(DeprecationWarning, match="placement_shape"):
        assert sbp_to_layout("B, S(0)", placement_shape=(2, 4), ndim=1) == sbp_to_layout("B, S(0)", (2, 4), 1)
    with pytest.raises(TypeError, match="mesh_dim"):
        placements_to_layout("S(0)", (2,), 1, mesh_dims=("a",))


def test_every_dialect_names_unnamed_axes_the_same_way():
    expected = ("axis_0", "axis_1")
    assert sbp_to_layout("B, S(0)", (2, 4), 1).layout.alias_name == expected
    assert placements_to_layout("R, S(0)", (2, 4), 1).layout.alias_name == expected
    assert partition_spec_to_layout(("axis_1",), (2, 4), 1).layout.alias_name == expected
