"""Bad values at the MPI-facing API: every rank raises the same error before any collective.

Each case is raised on every rank alike (the inputs are the same everywhere),
so a failure here aborts the job through conftest instead of hanging. Also the
valid edge the checks must not refuse: zero-size tensors move and come back
zero-size; bool tensors move.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from spmdsim import Layout, OperatorError, PlanError, SeededTensor, ShapeError, SpmdsimError

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _all(ok: bool) -> bool:
    return all(_world().allgather(bool(ok)))


# -- DTensor: shapes, dtypes, gather root, check tolerances ---------------------------
def test_gather_root_must_be_an_integer_mesh_rank(mesh):
    from spmdsim.runtime import DTensor

    size = mesh.size
    x = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((2 * size, 3), seed=1))
    # 1.5 used to pass the range check and hang the job (ranks took different paths).
    for root in (1.5, "0", True, -1, size, np.float64(0)):
        with pytest.raises(ShapeError, match=re.escape(f"gather root {root!r} is not a mesh rank")):
            x.gather(root=root)
    got = x.gather(root=np.int64(size - 1))
    assert _all((got is None) == (mesh.rank != size - 1))
    if got is not None:
        np.testing.assert_array_equal(got, SeededTensor((2 * size, 3), seed=1).full())


def test_global_shape_must_hold_integers_even_after_the_int_shape_was_seen(mesh):
    from spmdsim.runtime import DTensor

    tl = mesh.layout(None, None)
    DTensor(mesh, np.zeros((16, 16)), tl, (16, 16))  # caches the (16, 16) entry
    for shape, bad in (((16.7, 16.2), "16.7"), ((16.0, 16), "16.0"), ((True, 16), "True")):
        with pytest.raises(ShapeError, match=re.escape(f"got {bad} in dim 0")):
            DTensor(mesh, np.zeros((16, 16)), tl, shape)
    assert DTensor(mesh, np.zeros((16, 16)), tl, np.array([16, 16])).global_shape == (16, 16)


@pytest.mark.parametrize("dtype, fragment", [
    (object, "'|O' (object) is not numeric"),
    ("<U1", "'<U1' (str32) is not numeric"),
    (">f4", "'>f4' (float32) is not in native byte order"),
    ("datetime64[s]", "'<M8[s]' (datetime64[s]) is not numeric"),
])
def test_dtensors_hold_numeric_native_dtypes_only(mesh, dtype, fragment):
    from spmdsim.runtime import DTensor

    tl = mesh.layout(None, None)
    data = np.zeros((4, 4), dtype=dtype)
    with pytest.raises(ShapeError, match=re.escape("local shard dtype " + fragment)):
        DTensor.from_local(mesh, data, tl, (4, 4))
    with pytest.raises(ShapeError, match=re.escape("local shard dtype " + fragment)):
        DTensor(mesh, data, tl, (4, 4))
    with pytest.raises(ShapeError, match=re.escape("array dtype " + fragment)):
        DTensor.from_global(mesh, data, tl)


def test_from_local_dtype_and_from_seeded_source_are_checked(mesh):
    from spmdsim.runtime import DTensor

    tl = mesh.layout(None, None)
    with pytest.raises(ShapeError, match=re.escape("dtype 'floaty' is not a numpy dtype")):
        DTensor.from_local(mesh, np.zeros((4, 4)), tl, (4, 4), dtype="floaty")
    with pytest.raises(ShapeError, match=re.escape("from_seeded needs a SeededTensor, got ndarray of shape (4, 4)")):
        DTensor.from_seeded(mesh, tl, np.zeros((4, 4)))


def test_bool_tensors_move_but_never_hold_pending_sums(mesh):
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import DTensor

    size = mesh.size
    full = np.arange(2 * size * size).reshape(2 * size, size) % 3 == 0
    x = DTensor.from_global(mesh, full, mesh.layout("mp", None))
    y = redistribute(x, mesh.layout(None, "mp"))
    assert _all(y.dtype == np.bool_ and np.array_equal(y.gather(), full))
    with pytest.raises(ShapeError, match=re.escape("a bool tensor cannot be a pending sum")):
        DTensor.from_global(mesh, full, mesh.layout(None, None, partial="mp"))
    with pytest.raises(PlanError, match=re.escape("a bool tensor cannot be a pending sum")):
        redistribute(x, mesh.layout(None, None, partial="mp"))


def test_any_and_all_of_a_split_bool_tensor_are_numpys(mesh):
    """x.any() and x.all() reduced the bools by MAX and MIN, which MPI takes for no bool (MPI_C_BOOL: the
    logical ops only), so they raised under mpiexec while simulated ranks summed bools; they travel as uint8."""
    from spmdsim.nn import ops  # noqa: F401 - DTensor's numpy methods (spmdsim.nn.ops.methods)
    from spmdsim.runtime import DTensor

    size = mesh.size
    for full in (np.arange(2 * size * size).reshape(2 * size, size) % 3 == 0, np.ones((2 * size, size), bool)):
        x = DTensor.from_global(mesh, full, mesh.layout("mp", None))
        got = (x.any().item(), x.all().item(), x.any(axis=0).gather(), x.all(axis=1).gather())
        assert _all(got[0] == full.any() and got[1] == full.all() and np.array_equal(got[2], full.any(axis=0))
                    and np.array_equal(got[3], full.all(axis=1)) and got[2].dtype == np.bool_)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(atol=-1), "atol -1 must be a finite number >= 0"),
    (dict(rtol=math.nan), "rtol nan must be a finite number >= 0"),
    (dict(rtol="big"), "rtol 'big' must be a finite number >= 0"),
    (dict(atol=math.inf), "atol inf must be a finite number >= 0"),
])
def test_check_tolerances_are_finite_and_not_negative(mesh, kwargs, fragment):
    from spmdsim.runtime import DTensor

    src = SeededTensor((2 * mesh.size, 4), seed=2)
    x = DTensor.from_seeded(mesh, mesh.layout("mp", None, partial=()), src)
    with pytest.raises(SpmdsimError, match=re.escape(fragment)):
        x.check(src, **kwargs)
    assert x.check(src, rtol=0, atol=0).passed  # exact data passes with zero tolerances


# -- zero-size tensors -------------------------------------------------------------------
def test_zero_size_collectives_along_any_dim(mesh):
    from spmdsim.runtime import allgather, alltoall, reduce_scatter

    g = mesh.size
    for shape, split_dim, concat_dim in (((0, 2 * g), 1, 0), ((2 * g, 0), 0, 1), ((0, g, 3), 1, 2)):
        x = np.zeros(shape, np.float32)
        out = alltoall(mesh, x, "mp", split_dim, concat_dim)
        want = list(shape)
        want[split_dim] //= g
        want[concat_dim] *= g
        assert out.shape == tuple(want)
        assert allgather(mesh, x, "mp", 1).shape == (shape[0], shape[1] * g) + shape[2:]
        if shape[1] % g == 0:
            assert reduce_scatter(mesh, x, "mp", 1).shape == (shape[0], shape[1] // g) + shape[2:]


@pytest.mark.parametrize("shape", [(0, 64), (64, 0)])
def test_zero_size_redistribution_gives_zero_size_shards(shape):
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import DTensor, Mesh

    comm = _world()
    if comm.size % 2:
        pytest.skip("needs an even world size")
    m = Layout((2, comm.size // 2), ("dp", "mp"))
    x1 = Layout((comm.size,), ("x",))
    mesh = Mesh(m, comm)
    for source, target in ((m("dp", "mp"), m("mp", "dp")), (m(("dp", "mp"), None), m(None, ("mp", "dp"))),
                           (m("mp", None), x1(None, "x")), (m(None, None), m(None, "mp", partial="dp"))):
        x = DTensor.from_seeded(mesh, source, SeededTensor(shape, seed=1))
        y = redistribute(x, target)
        assert y.layout == target and y.global_shape == shape
        assert y.local.shape == target.local_shape(shape) and y.local.size == 0
        assert y.gather().shape == shape


# -- operators: argument types, dtypes, layer sizes --------------------------------------------
def test_operators_name_an_argument_that_is_not_a_dtensor(mesh):
    from spmdsim.nn import ops
    from spmdsim.nn.ops.linear import plan_linear
    from spmdsim.nn.ops.matmul import plan_matmul
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import DTensor

    g = mesh.size
    x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, g)))
    w = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((g, 4)))
    arr = np.ones((4, 4))
    hint = "; build one with DTensor.from_local/from_seeded"
    cases = [
        (lambda: ops.matmul(x, arr), f"matmul: w must be a DTensor, got ndarray of shape (4, 4){hint}"),
        (lambda: ops.matmul(arr, w), "matmul: x must be a DTensor, got ndarray of shape (4, 4)"),
        (lambda: ops.relu(arr), "relu: x must be a DTensor, got ndarray of shape (4, 4)"),
        (lambda: ops.gelu([1.0]), "gelu: x must be a DTensor, got list [1.0]"),
        (lambda: ops.add(x, arr), "add: operand ndarray of shape (4, 4) must be a DTensor or a real number"),
        (lambda: ops.add(arr, [1.0]), "add: no operand is a DTensor (got ndarray of shape (4, 4), list [1.0])"),
        (lambda: ops.bias_add(x, arr), "bias_add: bias must be a DTensor"),
        (lambda: ops.linear(x, arr), "linear: weight must be a DTensor"),
        (lambda: ops.linear(x, w, arr[0]), "linear: bias must be a DTensor, got ndarray of shape (4,)"),
        (lambda: ops.embedding(arr, w), "embedding: ids must be a DTensor"),
        (lambda: ops.split(arr, (4, 4), "linear", 1, g), "split: x must be a DTensor"),
        (lambda: plan_matmul(x, "w"), "matmul: w must be a DTensor, got str 'w'"),
        (lambda: plan_linear(None, w), "linear: x must be a DTensor, got None"),
    ]
    for call, fragment in cases:
        with pytest.raises(OperatorError, match=re.escape(fragment)):
            call()
    with pytest.raises(PlanError, match=re.escape("redistribute: x must be a DTensor, got ndarray")):
        redistribute(arr, mesh.layout(None, None))


def test_matmul_and_linear_refuse_bool_operands(mesh):
    from spmdsim.nn import ops
    from spmdsim.runtime import DTensor

    g = mesh.size
    x = DTensor.from_global(mesh, np.ones((4, g), bool), mesh.layout(None, "mp"))
    w = DTensor.from_global(mesh, np.ones((g, 4), bool), mesh.layout("mp", None))
    with pytest.raises(OperatorError,
                       match=re.escape("matmul: the operands have dtype 'bool', but a product sums over K")):
        ops.matmul(x, w)
    with pytest.raises(OperatorError, match=re.escape("linear: the operands have dtype 'bool'")):
        ops.linear(x, w)
    # A bool operand next to a numeric one is promoted by numpy, and sums fine.
    wf = DTensor.from_global(mesh, np.full((g, 4), 2.0), mesh.layout("mp", None))
    assert _all(np.array_equal(ops.matmul(x, wf).gather(), np.full((4, 4), 2.0 * g)))
    table = DTensor.from_global(mesh, np.ones((g, 3), bool), mesh.layout("mp", None))
    ids = DTensor.from_global(mesh, np.zeros((2,), np.int64), mesh.layout(None))
    with pytest.raises(OperatorError, match=re.escape("embedding: the table has dtype 'bool'")):
        ops.embedding(ids, table)


def test_layers_refuse_non_integer_and_empty_sizes(mesh):
    from spmdsim.nn.ops import ColumnParallelLinear, ParallelEmbedding, ParallelMLP, RowParallelLinear
    from spmdsim.nn.ops import VocabParallelEmbedding

    g = mesh.size
    cases = [
        (lambda: ColumnParallelLinear(mesh, 16.5, g), "ColumnParallelLinear input_size 16.5 must be an integer >= 1"),
        (lambda: RowParallelLinear(mesh, g, "8"), "RowParallelLinear output_size '8' must be an integer >= 1"),
        (lambda: ColumnParallelLinear(mesh, g, g, seed=1.5), "ColumnParallelLinear seed 1.5 must be an integer >= 0"),
        (lambda: VocabParallelEmbedding(mesh, 0, 4), "VocabParallelEmbedding num_embeddings 0 must be an integer >= 1"),
        (lambda: ParallelEmbedding(mesh, g, True), "ParallelEmbedding embedding_dim True must be an integer >= 1"),
        (lambda: ParallelMLP(mesh, g, 0), "ParallelMLP ffn_hidden_size 0 must be an integer >= 1"),
    ]
    for call, fragment in cases:
        with pytest.raises(ShapeError, match=re.escape(fragment)):
            call()
    layer = ColumnParallelLinear(mesh, np.int64(g), np.int64(2 * g))
    assert (layer.input_size, layer.output_size) == (g, 2 * g)
    with pytest.raises(OperatorError, match=re.escape("mesh must be a spmdsim Mesh, got None")):
        ColumnParallelLinear(None, g, g)


def test_layer_divisibility_errors_name_the_tensor(mesh):
    from spmdsim.nn.ops import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    g = mesh.size
    over = f"is not divisible by {g} shards over ('mp',)"
    cases = [
        (lambda: ColumnParallelLinear(mesh, 96, 99),
         f"ColumnParallelLinear weight W (96, 99): dim 1 of size 99 {over}"),
        (lambda: RowParallelLinear(mesh, 99, 96), f"RowParallelLinear weight W (99, 96): dim 0 of size 99 {over}"),
        (lambda: VocabParallelEmbedding(mesh, 99, 4), f"VocabParallelEmbedding table (99, 4): dim 0 of size 99 {over}"),
    ]
    for call, fragment in cases:
        with pytest.raises(ShapeError, match=re.escape(fragment)):
            call()


def test_paddle_mesh_checks_num_partitions():
    from spmdsim.nn.ops import paddle_mesh

    with pytest.raises(OperatorError, match=re.escape("num_partitions='8' must be a positive integer")):
        paddle_mesh("8")
    with pytest.raises(OperatorError, match=re.escape("comm 'world' must be an MPI intracommunicator")):
        paddle_mesh(2, "world")


# -- collectives: roots and ranks -------------------------------------------------------------
def test_bcast_root_and_alltoallv_keys_must_be_integer_ranks(mesh):
    from spmdsim.runtime import alltoallv, bcast

    g = mesh.size
    buf = np.zeros(3)
    with pytest.raises(ShapeError, match=re.escape("bcast root 1.5 must be an integer group rank")):
        bcast(mesh, buf, "mp", root=1.5)
    with pytest.raises(ShapeError, match=re.escape(f"bcast root {g} is outside the group of {g} ranks")):
        bcast(mesh, buf, "mp", root=g)
    with pytest.raises(ShapeError, match=re.escape("alltoallv sends key 1.5 is not a mesh rank")):
        alltoallv(mesh, {1.5: np.zeros(2)}, {}, "float64")
    got = bcast(mesh, np.full(3, float(mesh.rank)), "mp", root=np.int64(g - 1))
    assert _all(np.array_equal(got, np.full(3, float(g - 1))))


# -- dtypes MPI cannot move or sum, straight to the collectives ----------------------------
@pytest.mark.parametrize("dtype, ops, fragment", [
    (bool, ("allreduce", "reduce_scatter"), "cannot sum dtype 'bool'"),
    ("<U1", ("allreduce", "reduce_scatter"), "cannot sum dtype 'str32'"),
    (object, ("allreduce", "reduce_scatter", "allgather", "alltoall", "bcast"),
     "MPI cannot send dtype '|O' (object)"),
    (">f4", ("allreduce", "reduce_scatter", "allgather", "alltoall", "bcast"),
     "dtype '>f4' is not in native byte order; convert the array with .astype('float32')"),
])
def test_collectives_name_a_dtype_mpi_cannot_take(mesh, dtype, ops, fragment):
    from spmdsim.runtime import allgather, allreduce, alltoall, bcast, prepare_allreduce, reduce_scatter

    g = mesh.size
    calls = {"allreduce": lambda a: allreduce(mesh, a, "mp"),
             "reduce_scatter": lambda a: reduce_scatter(mesh, a, "mp", 0),
             "allgather": lambda a: allgather(mesh, a, "mp", 0),
             "alltoall": lambda a: alltoall(mesh, a, "mp", 0, 0),
             "bcast": lambda a: bcast(mesh, a, "mp", 0)}
    for op in ops:
        for x in (np.zeros(2 * g, dtype=dtype), np.zeros((2 * g, 2 * g), dtype=dtype)[:, ::2]):
            # Refused before MPI sees the buffer, as on simulated ranks (tests/test_engines.py);
            # strided arrays are copied to a contiguous one before.
            with pytest.raises(ShapeError, match=re.escape(f"{op}: {fragment}")):
                calls[op](x)
    if "allreduce" in ops:
        with pytest.raises(ShapeError, match=re.escape(f"allreduce: {fragment}")):
            prepare_allreduce(mesh, np.zeros(2 * g, dtype=dtype), "mp")
    # The collectives still work afterwards, and bool/str still move.
    x = np.arange(2 * g, dtype=np.float32) + mesh.rank
    assert np.array_equal(allreduce(mesh, x, "mp"), g * np.arange(2 * g) + sum(range(g)))
    flags = np.array([mesh.rank % 2 == 0] * 2)
    assert allgather(mesh, flags, "mp", 0).tolist() == [r % 2 == 0 for r in range(g) for _ in range(2)]


def test_float16_and_complex_sums_are_exact(mesh):
    from spmdsim.runtime import allreduce

    g = mesh.size
    for dtype in (np.float16, np.complex64):
        x = (np.arange(4) + mesh.rank).astype(dtype) * (1 + 1j if dtype == np.complex64 else 1)
        want = (g * np.arange(4) + sum(range(g))).astype(dtype) * (1 + 1j if dtype == np.complex64 else 1)
        got = allreduce(mesh, x, "mp")
        assert got.dtype == dtype and np.array_equal(got, want)


def test_layer_errors_say_what_to_change_in_the_layer():
    # The operator's own hint proposes other weight layouts, which a layer user cannot pick.
    from mpi4py import MPI

    from spmdsim.nn.ops import ColumnParallelLinear, RowParallelLinear
    from spmdsim.runtime import DTensor, Mesh

    size = MPI.COMM_WORLD.size
    if size % 2:
        pytest.skip("needs an even rank count for a (2, n/2) mesh")
    with Mesh(Layout((2, size // 2), ("dp", "mp"))) as mesh:
        layout = mesh.layout
        whole = DTensor.from_seeded(mesh, layout(None, None), SeededTensor((4, 8), seed=1))
        split = ColumnParallelLinear(mesh, 8, 4 * size, axes="mp")(whole)
        with pytest.raises(OperatorError, match=re.escape(
                "ColumnParallelLinear expects x whole on its last dim, but x is (None, \"mp\") (as a "
                "ColumnParallelLinear with gather_output=False leaves it): follow that layer with a "
                "RowParallelLinear(input_is_parallel=True), or give it gather_output=True (linear: ")):
            ColumnParallelLinear(mesh, 4 * size, 8, axes="mp")(split)
        with pytest.raises(OperatorError, match=re.escape(
                "RowParallelLinear(input_is_parallel=True) expects x split on its last dim over ('mp',)")):
            RowParallelLinear(mesh, 8, 4, axes="mp", input_is_parallel=True)(whole)
        by_batch = DTensor.from_seeded(mesh, layout("dp", None), SeededTensor((4, 8), seed=1))
        with pytest.raises(OperatorError, match=re.escape(
                "ColumnParallelLinear splits its weight over axes=('dp', 'mp') (the default is every "
                "mesh axis), but x splits another dim over ('dp',): pass axes=")):
            ColumnParallelLinear(mesh, 8, 4 * size)(by_batch)
        # The fixes the messages name work.
        assert RowParallelLinear(mesh, 4 * size, 8, axes="mp", input_is_parallel=True)(split).global_shape == (4, 8)
        assert ColumnParallelLinear(mesh, 8, 4 * size, axes="mp")(by_batch).layout == layout("dp", "mp")


def test_check_names_a_whole_tensor_reference_of_the_wrong_shape(mesh):
    from spmdsim.runtime import DTensor

    g = mesh.size
    src = SeededTensor((2, 4 * g), seed=3)
    x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), src)
    for wrong in (np.zeros((4 * g, 2)), SeededTensor((4 * g, 2), seed=3)):
        with pytest.raises(ShapeError, match=re.escape(
                f"check: reference of shape {(4 * g, 2)!r} does not match the tensor's global shape "
                f"{(2, 4 * g)!r}")):
            x.check(wrong)
    assert x.check(src.full()).passed and x.check(src).passed


def test_from_global_refuses_arrays_that_differ_between_ranks(mesh):
    """Each rank cuts its block from its own copy: a different copy on one rank is refused on every rank alike
    (one line naming two ranks), the same array on every rank is cut as before."""
    from spmdsim import DTensor, RuntimeMismatchError

    size, rank = mesh.size, _world().Get_rank()
    same = np.arange(2.0 * size * 3).reshape(2 * size, 3)
    x = DTensor.from_global(mesh, same, mesh.layout("mp", None))
    assert _all(np.array_equal(x.gather(), same))
    odd = same + (rank == size - 1)
    with pytest.raises(RuntimeMismatchError, match=re.escape(
            f"DTensor.from_global: ranks 0 and {size - 1} passed different arrays; each rank cuts its block")):
        DTensor.from_global(mesh, odd, mesh.layout("mp", None))
