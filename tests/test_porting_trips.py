"""What a PyTorch DTensor or JAX user writes first, ported as written: PyTorch's keywords on from_local and
redistribute, JAX's short PartitionSpecs; each either does what the other framework does or ends in one line."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from spmdsim import DTensor, Layout, LayoutError, Mesh, OperatorError, PlanError, ShapeError, simulate
from spmdsim.layouts.dialects import Replicate, Shard, placements_to_layout

A = np.arange(32.0).reshape(8, 4)


def _on_4(call):
    """`call(mesh, x)` on 4 simulated ranks of a dp 2 x tp 2 mesh, x = A split on its rows over dp."""
    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        return call(mesh, DTensor.from_global(mesh, A, mesh.layout("dp", None)))
    return simulate(4, main)


def test_pytorchs_redistribute_keywords_are_one_line():
    """x.redistribute(device_mesh=mesh, placements=[...]) and async_op=True ended in a TypeError traceback."""
    said = ("redistribute takes the target TensorLayout alone, not PyTorch's (device_mesh, placements): "
            "x.redistribute(placements_to_layout(placements, x.mesh, x.ndim)), from spmdsim.layouts.dialects")
    for keywords in ({"placements": [Replicate(), Replicate()]},
                     {"device_mesh": None, "placements": [Replicate(), Replicate()]}):
        with pytest.raises(PlanError) as caught:
            _on_4(lambda mesh, x: x.redistribute(**keywords))
        assert str(caught.value) == said
    with pytest.raises(OperatorError, match=r"^redistribute\(async_op=True\): spmdsim does not do this; the move "
                                            r"is done when redistribute returns"):
        _on_4(lambda mesh, x: x.redistribute(mesh.layout(None, None), async_op=True))
    moved = _on_4(lambda mesh, x: x.redistribute(mesh.layout(None, "tp"), async_op=False).gather())
    assert all(np.array_equal(m, A) for m in moved)


def test_pytorchs_from_local_keywords_shape_and_run_check():
    """DTensor.from_local(..., shape=(8, 4), run_check=False), PyTorch's keywords, ended in a TypeError traceback:
    shape= is global_shape, run_check=False and stride=None are what spmdsim does, other values one line."""
    def build(**keywords):
        def call(mesh, x):
            return DTensor.from_local(mesh, x.local, x.layout, **keywords).gather()
        return _on_4(call)

    for keywords in ({"shape": (8, 4)}, {"shape": [8, 4], "run_check": False, "stride": None}, {"run_check": False}):
        assert all(np.array_equal(g, A) for g in build(**keywords)), keywords
    with pytest.raises(OperatorError, match=r"^from_local\(run_check=True\): spmdsim does not do this; each "
                                            r"rank's block is checked against the global shape; SPMDSIM_CHECK=1"):
        build(run_check=True)
    with pytest.raises(OperatorError, match=r"^from_local\(stride=\(4, 1\)\): spmdsim does not do this"):
        build(stride=(4, 1))
    with pytest.raises(ShapeError) as caught:
        build(shape=(8, 4), global_shape=(8, 4))
    assert str(caught.value) == ("from_local got shape=(8, 4) and global_shape=(8, 4); expected one: shape= is "
                                 "PyTorch's name for global_shape")
    with pytest.raises(ShapeError, match=r"^local shard shape \(4, 4\) does not match \(2, 4\)"):
        build(shape=(4, 4))  # the shape is checked as global_shape is


def test_a_partition_spec_shorter_than_the_tensor_says_how_to_pad_it():
    """JAX pads a short PartitionSpec with None; partition_spec_to_layout(("dp",), mesh) without ndim made a 1-dim
    layout, and from_global of a 2-d array said only 'tensor map ("dp",) has 1 entry but shape (8, 4) has 2 dims'."""
    from spmdsim.layouts.dialects import partition_spec_to_layout

    pad = ("; expected one entry per dim, None where not split (mesh.layout({})); a dialect's converter takes the "
           "number of dims: placements_to_layout(placements, mesh, 2) (a negative Shard dim counts from the last of "
           "them), sbp_to_layout(sbp, mesh, 2) or partition_spec_to_layout(spec, mesh, 2) (which pads a shorter JAX "
           "PartitionSpec with None, as JAX does)")
    cases = [
        (lambda mesh, x: DTensor.from_global(mesh, A, partition_spec_to_layout(("dp",), mesh)),
         'tensor map ("dp",) has 1 entry but shape (8, 4) has 2 dims' + pad.format("'dp', None")),
        (lambda mesh, x: x.redistribute(partition_spec_to_layout((("dp", "tp"),), mesh)),
         'source ("dp", None) has 2 dims but target (("dp", "tp"),) has 1' + pad.format("('dp', 'tp'), None")),
        (lambda mesh, x: DTensor.from_local(mesh, x.local, mesh.layout(partial=("tp",))),
         'local shard of shape (4, 4) has 2 dims but the layout () partial (\'tp\',) maps 0'
         + pad.format("None, None, partial=('tp',)")),
    ]
    for call, said in cases:
        with pytest.raises((ShapeError, PlanError)) as caught:
            _on_4(call)
        assert str(caught.value) == said
    done = _on_4(lambda mesh, x: DTensor.from_global(mesh, A, partition_spec_to_layout(("dp",), mesh, 2)).slices)
    assert done == [(slice(0, 4), slice(0, 4))] * 2 + [(slice(4, 8), slice(0, 4))] * 2


def test_placements_made_for_fewer_dims_name_their_own_converter():
    """DTensor placements made for 2 dims and used on a 3-d tensor (Shard(-1) then lands on dim 1) were told only
    "partition_spec_to_layout(spec, mesh, 3) pads a shorter JAX PartitionSpec": a JAX hint for a PyTorch user.
    The line names the converter a DTensor user has, with the number of dims to pass."""
    B = np.zeros((2, 4, 4))
    with pytest.raises(ShapeError) as caught:
        _on_4(lambda mesh, x: DTensor.from_global(mesh, B, placements_to_layout([Replicate(), Shard(-1)], mesh, 2)))
    assert str(caught.value).startswith('tensor map (None, "tp") has 2 entries but shape (2, 4, 4) has 3 dims; '
                                        "expected one entry per dim, None where not split (mesh.layout(None, 'tp', "
                                        "None)); a dialect's converter takes the number of dims: "
                                        "placements_to_layout(placements, mesh, 3) (a negative Shard dim counts")
    done = _on_4(lambda mesh, x: DTensor.from_global(mesh, B, placements_to_layout([Replicate(), Shard(-1)], mesh,
                                                                                   3)).slices)
    assert done == [(slice(0, 2), slice(0, 4), slice(0, 2)), (slice(0, 2), slice(0, 4), slice(2, 4))] * 2


def test_placements_without_ndim_is_the_documented_line():
    """placements_to_layout(placements, mesh) (distribute_tensor needs no ndim) ended in Python's 'missing 1
    required positional argument' traceback; docs/reference/dialects.md promises the 'ndim is missing' line."""
    from spmdsim import DialectError

    with pytest.raises(DialectError) as caught:
        placements_to_layout([Shard(0), Replicate()], Layout((2, 4), ("dp", "tp")))
    assert str(caught.value) == ("ndim is missing: placements_to_layout needs the number of dims of the tensor "
                                 "(placements cannot tell it); pass it as the third argument, e.g. "
                                 "placements_to_layout('S(0), R', mesh, 2) for a 2-D tensor")
    assert placements_to_layout([Shard(0), Replicate()], Layout((2, 4), ("dp", "tp")), 2).tensor_map == (("dp",), ())


def test_devicemesh_and_jax_mesh_names_on_a_mesh():
    """mesh.size(1), mesh["tp"], mesh.get_coordinate(), mesh.shape, mesh.axis_names, ... (DeviceMesh's and JAX
    Mesh's names) ended in "'int' object is not callable", "'Mesh' object is not subscriptable" or a bare
    AttributeError. mesh.size still is the number of ranks, an int; called, it is PyTorch's size(mesh_dim); the
    others are one line (an AttributeError: hasattr stays False) naming spmdsim's."""
    from spmdsim.runtime.mesh import _FOREIGN

    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        said = {}
        for spelled in _FOREIGN:
            try:
                getattr(mesh, spelled.rstrip("()"))
            except OperatorError as e:
                said[spelled] = (isinstance(e, AttributeError), hasattr(mesh, spelled.rstrip("()")), str(e))
        try:
            mesh["tp"]
        except OperatorError as e:
            said["[]"] = str(e)
        sizes = (mesh.size, mesh.size(), mesh.size(0), mesh.size(-1), mesh.size("tp"), mesh.size == 4)
        return said, sizes, mesh.coords

    (said, sizes, coords), *_ = simulate(4, main)
    assert sizes == (4, 4, 2, 2, 2, True) and coords == (0, 0)
    assert len(said) == len(_FOREIGN) + 1
    assert all(is_attribute_error and not has for is_attribute_error, has, _ in
               (v for k, v in said.items() if k != "[]"))
    assert said["get_coordinate()"][2] == ("mesh.get_coordinate() is PyTorch DeviceMesh's; spmdsim's is mesh.coords, "
                                           "this rank's index along every axis (docs/tutorials/porting.md)")
    assert said["device_type"][2] == ("mesh.device_type is PyTorch DeviceMesh's; spmdsim's is none: every rank is a "
                                      "CPU process (an MPI rank or a simulated one), its arrays numpy's "
                                      "(docs/tutorials/porting.md)")
    assert said["axis_names"][2] == ("mesh.axis_names is JAX Mesh's; spmdsim's is mesh.layout.alias_name "
                                     "(docs/tutorials/porting.md)")
    assert said["[]"].startswith("mesh['tp'] is PyTorch DeviceMesh's sub-mesh; spmdsim has none: name the axes")
    with pytest.raises(LayoutError, match=r"^mesh.size\(2\): expected a mesh dim, an index from -2 to 1 or a name "
                                          r"in \('dp', 'tp'\)"):
        simulate(4, lambda: Mesh(Layout((2, 2), ("dp", "tp"))).size(2))


def test_an_uneven_sum_is_planned_alike_in_every_process():
    """(P, P) -> (S(0), S(0)) of 1 row on a 2 x 2 mesh cut "chunk" summed over ('b', 'a') in some processes
    and ('a', 'b') in others (the order of a frozenset of names, which PYTHONHASHSEED sets per process):
    under mpiexec the ranks built different groups and the program hung in MPI_Comm_create_group."""
    code = ("from spmdsim import Layout; from spmdsim.programs.plan.planner import plan_redistribution as p; "
            "from spmdsim.layouts.dialects import placements_to_layout as pl; "
            "m = Layout((2, 2), ('a', 'b'), cut='chunk'); "
            "print([s.axes for s in p(pl('P, P', m, 1), pl('S(0), S(0)', m, 1), (1,), 'float32').steps])")
    said = set()
    for seed in range(8):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        said.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout.strip())
    assert said == {"[('a', 'b'), ('a', 'b')]"}, said


def test_a_mesh_over_some_of_the_ranks_is_a_mesh_of_a_sub_communicator():
    """docs/tutorials/porting.md: DeviceMesh("cpu", [0, 1, 2, 3]) in a world of 8 (JAX: a Mesh of some devices) is
    Mesh(layout, spmdsim.world().Split(rank // 4, rank)); a Layout of 4 over the 8 is one line."""
    import spmdsim
    from spmdsim import RuntimeMismatchError

    def main():
        rank = spmdsim.world().Get_rank()
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world().Split(rank // 4, rank))
        x = DTensor.from_global(mesh, np.arange(16.0).reshape(4, 4) + 100 * (rank // 4), mesh.layout("dp", "tp"))
        return mesh.rank, x.redistribute(mesh.layout(None, None)).local.sum()

    assert simulate(8, main) == [(r % 4, 120.0 + 1600 * (r // 4)) for r in range(8)]
    with pytest.raises(RuntimeMismatchError, match=r"^device matrix \(2, 2\) needs 4 ranks but the communicator "
                                                   r"has 8"):
        simulate(8, lambda: Mesh(Layout((2, 2), ("dp", "tp"))))


def test_a_placement_class_for_its_instance_names_the_call():
    """[Shard(0), Replicate] (the class, not Replicate()) said "placement <class 'spmdsim.layouts.dialects.dtensor.
    Replicate'> in [Shard(dim=0), <class '...'>] is not a placement"; it now names the call meant."""
    from spmdsim import DialectError
    from spmdsim.layouts.dialects import Partial

    mesh = Layout((2, 4), ("dp", "tp"))
    for placements, said in (
            ([Shard(0), Replicate], "placement Replicate (the class) in [Shard(dim=0), Replicate] is not a "
                                    "placement; expected Replicate(), an instance"),
            ((Shard, Replicate()), "placement Shard (the class) in (Shard, Replicate()) is not a placement; "
                                   "expected Shard(d), an instance"),
            ([Partial, np.zeros(2)], "placement Partial (the class) in [Partial, array([0., 0.])] is not a "
                                     "placement; expected Partial(), an instance")):
        with pytest.raises(DialectError) as caught:
            placements_to_layout(placements, mesh, 2)
        assert str(caught.value) == said


def test_from_local_and_from_global_without_a_layout_replicate():
    """DTensor.from_local(mesh, block) and from_global(mesh, array), PyTorch's from_local and distribute_tensor
    without placements (Replicate on every mesh dim), ended in "missing 1 required positional argument"."""
    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x, y = DTensor.from_global(mesh, A), DTensor.from_local(mesh, A)
        s = DTensor.from_local(mesh, np.float64(2.0))
        return x.placements, y.layout == mesh.layout(None, None), np.array_equal(y.local, A), s.shape, x.shape

    assert simulate(4, main) == [((Replicate(), Replicate()), True, True, (), (8, 4))] * 4
    with pytest.raises(LayoutError, match=r"^mesh must be a spmdsim Mesh, got ndarray of shape \(8, 4\); make one "
                                          r"with Mesh\(Layout\(\(2, 4\), \('dp', 'tp'\)\)\), and pass it first"):
        simulate(4, lambda: DTensor.from_local(A, Mesh(Layout((2, 2), ("dp", "tp")))))  # PyTorch's order


def test_operands_on_a_mesh_of_default_names_say_where_it_came_from():
    """A redistribution onto placements_to_layout("R, S(1)", (2, 2), 2) (a mesh shape, not the mesh) moves the
    tensor onto a mesh named axis_0, axis_1; the next operator said "operands live on different meshes" naming
    both Layouts but not why: it now says how to build the layout on the tensor's mesh."""
    from spmdsim import ops

    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x = DTensor.from_global(mesh, A, mesh.layout("dp", None))
        y = x.redistribute(placements_to_layout("R, S(1)", (2, 2), 2))
        for pair in ((y, x), (x, y)):
            with pytest.raises(OperatorError) as raised:
                ops.add(*pair)
            assert "differ only in their axis names: a layout built from a mesh shape rather than the mesh names " \
                   "them axis_0, axis_1, ... (build it on the tensor's mesh: placements_to_layout(p, x.mesh, " \
                   "x.ndim)" in str(raised.value)
        named = Mesh(Layout((2, 2), ("a", "b")))
        other = DTensor.from_global(named, A, named.layout("a", None))
        with pytest.raises(OperatorError) as raised:  # both named by the user: no word of default names
            ops.add(x, other)
        return str(raised.value)

    assert simulate(4, main) == ["add: operands live on different meshes: Layout(dp=2, tp=2) and "
                                 "Layout(a=2, b=2); move one onto the other's mesh first (both have 4 devices): "
                                 "y = y.redistribute(x.mesh.layout(...))"] * 4


@pytest.mark.parametrize("other", [Layout((4, 1), ("dp", "tp")), Layout((2, 2), ("dp", "tp"), cut="chunk")])
def test_operands_on_meshes_of_as_many_devices_say_how_to_meet(other):
    """Operands on two meshes of as many devices (another device matrix, another cut) were refused naming both
    Layouts and nothing more, though a redistribution moves either onto the other's mesh. The line says so, and
    following it gives the sum."""
    from spmdsim import ops

    def main():
        mesh, there = Mesh(Layout((2, 2), ("dp", "tp"))), Mesh(other)
        x = DTensor.from_global(mesh, A, mesh.layout("dp", None))
        y = DTensor.from_global(there, A, there.layout("dp", "tp"))
        with pytest.raises(OperatorError) as raised:
            ops.add(x, y)
        y = y.redistribute(x.mesh.layout(None, "tp"))
        return str(raised.value), bool((x + y).check(2 * A))

    said, passed = simulate(4, main)[0]
    assert said.endswith("; move one onto the other's mesh first (both have 4 devices): "
                         "y = y.redistribute(x.mesh.layout(...))") and passed
