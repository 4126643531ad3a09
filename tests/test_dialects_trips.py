"""What a MindSpore, OneFlow or Paddle user porting a sharding writes next, with the slips they make: read as
their framework means it, or refused in one line that names the value and says what to write instead."""
from __future__ import annotations

import pytest

from spmdsim import Layout, LayoutError
from spmdsim.tools.cli.main import main


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


# -- MindSpore's integer tensor_map over named axes ------------------------------------------------------
@pytest.mark.parametrize("entries, by_name", [
    ((1, 0), '("dp", "mp")'), (("dp", -1), '("dp", None)'), (("1", None), '("dp", None)'),
    ((-1, 0), '(None, "mp")'),
])
def test_an_integer_tensor_map_over_named_axes_is_written_by_name(entries, by_name):
    """MindSpore's tensor_map (1, 0) over alias_name ("dp", "mp") is ("dp", "mp") (seed 000: numbered from the
    right, -1 for none). Only a map over the default names axis_0, axis_1 ... got it written by name; with the
    axes named, the refusal said "write the axis's name" and left the user to count from the right."""
    with pytest.raises(LayoutError) as info:
        Layout((2, 4), ("dp", "mp"))(*entries)
    assert str(info.value).endswith(f"this map by name is {by_name}" + (")" if "1" in entries else "")), info.value


def test_an_integer_map_whose_names_would_repeat_an_axis_gets_no_map():
    """("mp", 0) numbers mp twice: a map written by name would name it twice, itself refused."""
    with pytest.raises(LayoutError) as info:
        Layout((2, 4), ("dp", "mp"))("mp", 0)
    assert "this map by name" not in str(info.value) and "write the name of the axis it numbers" in str(info.value)


def test_run_matmul_writes_an_integer_map_by_its_alias_names(capsys):
    code, _, err = _run(["run", "matmul", "--device-matrix", "2,4", "--alias", "dp,mp", "--x-map", "1,0",
                         "--w-map", "0,-1", "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 2 and err == (
        "spmdsim: error: --x-map '1,0': unknown alias '1' in tensor map (\"1\", \"0\"); expected one of ('dp', "
        "'mp') (an axis number? MindSpore's integer tensor_map is not read: write the axis's name; this map by "
        "name is (\"dp\", \"mp\"))"), err
    code, _, err = _run(["run", "matmul", "--device-matrix", "2,4", "--alias", "dp,mp", "--x-map", "dp,mp",
                         "--w-map", "mp,None", "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 0, err  # the map it wrote runs


# -- a MindSpore MatMul strategy with a dim too many for --shape ------------------------------------------
@pytest.mark.parametrize("strategy, said", [
    ("((2,4,1),(4,1))", "matmul shape (64, 32, 48) has no batch dim but strategy ((2, 4, 1), (4, 1)) gives x 3 "
                        "dims (1 batch dim); expected 4 sizes, B,M,K,N"),
    ("((2,4),(4,1,1))", "matmul shape (64, 32, 48) has no batch dim but strategy ((2, 4), (4, 1, 1)) gives w 3 "
                        "dims (1 batch dim); expected w's strategy with at most 2 slice counts, as many as x's"),
])
@pytest.mark.parametrize("ranks", [["--ranks", "8"], []])
def test_a_matmul_strategy_with_a_dim_too_many_says_so(capsys, strategy, said, ranks):
    """A slip of one count, ((2,4,1),(4,1)) for ((2,4),(4,1)) on M,K,N = 64,32,48, read x's last two counts as
    (m, k) = (4, 1) and was refused as "contraction dim of x is split 1 way but of w 4 ways": true of the
    batched reading, no word of the dim too many. The shape's dims are now checked first (on simulated ranks
    and on one MPI rank alike)."""
    from spmdsim.tools.demo.jobs import strategy_matmul_job

    if ranks:
        code, _, err = _run(["run", "matmul", "--strategy", strategy, "--shape", "64,32,48", *ranks], capsys)
        assert code == 2 and err == f"spmdsim: error: {said}", err
        return
    comm = type("Comm", (), {"Get_size": lambda self: 8})()
    with pytest.raises(ValueError) as info:
        strategy_matmul_job(comm, strategy, (64, 32, 48))
    assert str(info.value) == said


# -- OneFlow: an output SBP that keeps P -------------------------------------------------------------------
@pytest.mark.parametrize("out_sbp, axes", [("P,P", "axes 0 and 1"), ("partial_sum,B", "axis 0")])
def test_an_out_sbp_that_keeps_a_pending_sum_is_refused_in_sbp_terms(capsys, out_sbp, axes):
    """OneFlow lets S(1) x S(0) end as P, unsummed; run matmul checks the summed output. --out-sbp P was refused
    in Layout words an SBP user never wrote: "requested output (None, None) partial ('axis_0', 'axis_1') must be
    a non-partial layout with 2 dims"."""
    code, _, err = _run(["run", "matmul", "--placement", "2,4", "--x-sbp", "S(1),S(1)", "--w-sbp", "S(0),S(0)",
                         "--out-sbp", out_sbp, "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 2 and err == (
        f"spmdsim: error: --out-sbp {out_sbp!r} keeps P (a pending sum) on placement {axes}; run matmul checks the "
        "summed output: expected B (Allreduce) or S(d) (Reduce_scatter) there, or no --out-sbp"), err
    code, _, err = _run(["run", "matmul", "--placement", "2,4", "--x-sbp", "S(1),B", "--w-sbp", "S(0),B",
                         "--out-sbp", "S(0),B", "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 0, err


# -- a framework's mesh object copied onto a mesh flag -----------------------------------------------------
@pytest.mark.parametrize("argv, said", [
    (["slices", "--placements", "[dist.Shard(0), dist.Shard(1)]", "--device-matrix",
      "dist.ProcessMesh([[0,1,2,3],[4,5,6,7]], dim_names=['dp','mp'])", "--shape", "8,8"],
     "--device-matrix \"dist.ProcessMesh([[0,1,2,3],[4,5,6,7]], dim_names=['dp','mp'])\" is Paddle's ProcessMesh, "
     "which spmdsim does not read; expected its shape, --device-matrix 2,4, with its names as --alias dp,mp"),
    (["run", "matmul", "--placement", "flow.placement('cuda', ranks=[[0, 1], [2, 3]])", "--x-sbp", "S(0),B",
      "--w-sbp", "B,S(1)", "--shape", "8,8,8", "--ranks", "4"],
     "--placement \"flow.placement('cuda', ranks=[[0, 1], [2, 3]])\" is OneFlow's flow.placement, which spmdsim "
     "does not read; expected its shape, --placement 2,2"),
    (["plan", "--device-matrix", "init_device_mesh('cpu', (2, 4), mesh_dim_names=('dp', 'tp'))", "--from",
      "dp,None", "--to", "None,tp", "--shape", "8,8"],
     "--device-matrix \"init_device_mesh('cpu', (2, 4), mesh_dim_names=('dp', 'tp'))\" is PyTorch's "
     "init_device_mesh, which spmdsim does not read; expected its shape, --device-matrix 2,4, with its names as "
     "--alias dp,tp"),
])
def test_a_framework_mesh_on_a_mesh_flag_names_the_flags_that_say_it(capsys, argv, said):
    """A Paddle user copies dist.ProcessMesh(..., dim_names=[...]) onto --device-matrix: it was "must be
    comma-separated integers such as 2,4", no word of the ranks or names it holds (OneFlow's flow.placement(...) on
    --placement: "is not a mesh")."""
    code, _, err = _run(argv, capsys)
    assert code == 2 and err == f"spmdsim: error: {said}", err


# -- OneFlow SBP text as a OneFlow script writes it --------------------------------------------------------
def test_sbp_prefixed_as_after_from_oneflow_import_sbp_reads():
    """`from oneflow import sbp` writes sbp.split(0), sbp.broadcast: refused with "did you mean 'split(0)'?",
    where flow.sbp.split(0) read."""
    from spmdsim.layouts.dialects import sbp_to_layout

    tl = sbp_to_layout("sbp.split(axis=0), sbp.partial_sum", (2, 2), 2)
    assert tl == sbp_to_layout("S(0), P", (2, 2), 2)


@pytest.mark.parametrize("text, commas", [("S(0) B", "'S(0), B'"), ("split(0) broadcast", "'split(0), broadcast'")])
def test_sbp_entries_parted_by_spaces_ask_for_commas(text, commas):
    """'S(0) B' was "sbp 'S(0) B' is not valid; expected 'B', 'P' or 'S(d)'": both entries are valid."""
    from spmdsim import DialectError
    from spmdsim.layouts.dialects import sbp_to_layout

    with pytest.raises(DialectError) as info:
        sbp_to_layout(text, (2, 2), 2)
    assert str(info.value) == (f"sbp {text!r} is not valid; expected 'B', 'P' or 'S(d)' with tensor dim d >= 0; "
                               f"separate the entries with commas: {commas}")


# -- another framework's keyword on a converter ------------------------------------------------------------
@pytest.mark.parametrize("call, said", [
    (lambda d: d.placements_to_layout("[dist.Shard(0), dist.Replicate()]", [[0, 1], [2, 3]], 2,
                                      dim_names=["dp", "mp"]),
     "(dim_names= is Paddle's ProcessMesh name for mesh_axis_names)"),
    (lambda d: d.sbp_to_layout("S(0), B", ndim=2, placement=[[0, 1], [2, 3]]),
     "(placement= is OneFlow's name for the mesh: pass its shape or ranks as mesh_shape)"),
    (lambda d: d.strategy_to_layout((2, 1), 8, alias_name=("dp", "mp")),
     "(alias_name= is MindSpore's Layout name for mesh_axis_names)"),
    (lambda d: d.partition_spec_to_layout(("x", None), (2, 4), axis_names=("x", "y")),
     "(axis_names= is JAX's Mesh name for mesh_axis_names)"),
])
def test_a_framework_keyword_on_a_converter_says_which_one_to_use(call, said):
    """Paddle names a mesh's axes dim_names, MindSpore alias_name: placements_to_layout(..., dim_names=...) said
    only "got unexpected keyword arguments ['dim_names']" (strategy_to_layout: Python's own line), not that
    mesh_axis_names is the same."""
    import spmdsim.layouts.dialects as dialects

    with pytest.raises(TypeError) as info:
        call(dialects)
    assert str(info.value).endswith(said), info.value


# -- a MindSpore strategy that does not fit --world-size ---------------------------------------------------
@pytest.mark.parametrize("argv, expected", [
    (["slices", "--strategy", "(2,4)", "--world-size", "6"], "expected --world-size 8 (case key 'world_size')"),
    (["explain", "--strategy", "(3,1)", "--world-size", "8"],
     "expected --world-size 3 or a multiple of it (case key 'world_size')"),
    (["slices", "--strategy", "((2,1),(1,4))", "--operand", "w", "--world-size", "4"],
     "expected --world-size 8 (case key 'world_size')"),
])
def test_a_strategy_that_does_not_fit_the_world_size_names_the_sizes_that_do(capsys, argv, expected):
    """run matmul says "expected --ranks 8" for a strategy its ranks cannot hold; slices, explain and show said
    only "the product of the slice counts must divide the number of ranks", no world size that would do."""
    code, _, err = _run([*argv, "--shape", "9,8" if "(3,1)" in argv else "8,8"], capsys)
    assert code == 2 and err.endswith(f"; {expected}, or no --world-size"), err


# -- a Paddle network skipped at this rank count -----------------------------------------------------------
def test_a_skipped_demo_names_the_rank_count_nearest_this_one(capsys):
    """Paddle's split network runs on any p dividing 960 and 240; at 7 ranks the demo said "1 run them all
    (mpiexec -n 1, or --ranks 1)": the smallest count, one rank, where nothing is split and no collective runs."""
    code, _, err = _run(["demo", "--only", "net_paddle_tp", "--ranks", "7"], capsys)
    assert code == 3 and err == ("spmdsim demo: every scenario was skipped (0 of 1 ran on 7 ranks); 8 run them all "
                                 "(mpiexec -n 8, or --ranks 8)"), err


# -- a MindSpore strategy as the script writes it ----------------------------------------------------------
@pytest.mark.parametrize("text", ["ops.MatMul().shard(((2,4),(4,1)))", "in_strategy=((2, 4), (4, 1))",
                                  "self.matmul.shard(in_strategy=((2, 4), (4, 1)))", ".shard(((2,4),(4,1)))"])
def test_a_strategy_copied_with_its_shard_call_reads(text):
    """MindSpore writes ops.MatMul().shard(((2, 4), (4, 1))), or shard(in_strategy=...): pasted onto --strategy
    it was "is not a tuple of positive integers or a tuple of such tuples"."""
    from spmdsim.layouts.dialects import parse_strategy

    assert parse_strategy(text) == ((2, 4), (4, 1))


def test_a_shard_call_with_an_out_strategy_says_where_that_goes(capsys):
    code, _, err = _run(["run", "matmul", "--strategy", "shard(in_strategy=((2,4),(4,1)), out_strategy=((8,1),))",
                         "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 2 and err == (
        "spmdsim: error: strategy 'shard(in_strategy=((2,4),(4,1)), out_strategy=((8,1),))' gives 2 arguments; "
        "expected the in_strategy alone (an out_strategy is given on its own: --out-strategy on the command line)")
    code, _, err = _run(["run", "matmul", "--strategy", "in_strategy=((2,4),(4,1))", "--out-strategy",
                         "out_strategy=((8,1),)", "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 0, err


# -- OneFlow's target placement on run redistribute --------------------------------------------------------
def test_to_placement_is_the_target_device_matrix_as_placement_is_the_source(capsys):
    """--placement is --device-matrix's other name, but the target had none: --to-placement 4 was taken by
    argparse as an abbreviation of --to-placements (DTensor's), and refused as "--to-sbp and --to-placements both
    give the target layout", a flag the user never typed. The source's flag is also named as typed."""
    code, out, err = _run(["run", "redistribute", "--placement", "2,2", "--from-sbp", "S(0),B", "--to-sbp", "S(1)",
                           "--to-placement", "4", "--shape", "8,8", "--ranks", "4"], capsys)
    assert code == 0 and "PASS" in out, err
    code, _, err = _run(["run", "redistribute", "--placement", "2,2", "--from-sbp", "S(0),B", "--to-sbp", "B,S(1)",
                         "--shape", "8,8", "--ranks", "8"], capsys)
    assert code == 2 and err == "spmdsim: error: --placement '2,2' has 4 devices but --ranks is 8; expected --ranks 4"


@pytest.mark.parametrize("strategy, said", [("((1,2,1),(2,1))", "x 3 slice counts"),
                                            ("((1,2),(2,1,1))", "w 3 slice counts")])
def test_show_matmul_names_a_strategy_with_a_count_too_many(capsys, strategy, said):
    """show --matmul draws M,K,N; ((1,2,1),(2,1)) read x's counts as batched and said "contraction dim of x is
    split 1 way but of w 2 ways"."""
    code, _, err = _run(["show", "--matmul", "--strategy", strategy, "--shape", "2,4,2"], capsys)
    assert code == 2 and err == (f"spmdsim: error: --matmul draws 2-D x and w (--shape M,K,N), but --strategy "
                                 f"{strategy!r} gives {said}; expected 2 per tensor"), err


# -- OneFlow's names on a DTensor --------------------------------------------------------------------------
def _on_one_rank(body):
    import numpy as np

    import spmdsim
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.mesh import Mesh

    def main():
        body(DTensor.from_global(Mesh(Layout((1,), ("dp",)), spmdsim.world()), np.ones((2, 2))))

    spmdsim.simulate(1, main)


def test_a_dtensor_s_sbp_names_a_module_that_exists():
    """x.sbp (OneFlow's) was refused naming spmdsim.dialects.layout_to_sbp: no such module (ModuleNotFoundError
    for whoever typed it); the function is spmdsim.layouts.dialects.layout_to_sbp."""
    import importlib

    with pytest.raises(AttributeError) as info:
        _on_one_rank(lambda x: x.sbp)
    said = str(info.value)
    module = said.split("as SBP ")[1].split(".layout_to_sbp")[0]
    assert hasattr(importlib.import_module(module), "layout_to_sbp"), said


def test_redistribute_with_oneflow_s_sbp_keyword_names_the_layout_to_pass():
    """x.redistribute(sbp=...) (OneFlow's to_global(placement, sbp)) was Python's "unexpected keyword argument
    'sbp'" with a traceback, where PyTorch's placements= was one line naming the layout to pass."""
    from spmdsim import SpmdsimError

    with pytest.raises(SpmdsimError) as info:
        _on_one_rank(lambda x: x.redistribute(sbp="S(0), B"))
    assert "x.redistribute(sbp_to_layout(sbp, x.mesh, x.ndim)), from spmdsim.layouts.dialects" in str(info.value)


def test_a_strategy_of_layouts_names_the_layout_form_with_its_maps(capsys):
    """MindSpore's advanced form, shard((layout("mp", ("sp", "dp")), layout(("sp", "dp"), "None"))), on --strategy
    was "is not a tuple of positive integers", no word of the Layout form that takes the same maps."""
    code, _, err = _run(["run", "matmul", "--strategy", "(layout('mp', ('sp', 'dp')), layout(('sp', 'dp'), 'None'))",
                         "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 2 and err.endswith(
        "; a strategy of Layouts is the Layout form, a tensor map per input: Layout(device_matrix, alias_name)(*map) "
        "(--x-map 'mp,(sp,dp)' --w-map '(sp,dp),None' with --device-matrix and --alias on the command line)"), err
    code, _, err = _run(["run", "matmul", "--device-matrix", "2,2,2", "--alias", "dp,sp,mp", "--x-map", "mp,(sp,dp)",
                         "--w-map", "(sp,dp),None", "--shape", "64,32,48", "--ranks", "8"], capsys)
    assert code == 0, err  # the flags it names run
