"""The Python API as a researcher writing a sharded model misuses it: each mistake refused in one line."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, SeededTensor, ops
from spmdsim.errors import SpmdsimError


def _said(fn, n: int = 4) -> list:
    def body():
        with pytest.raises(SpmdsimError) as caught:
            fn()
        return str(caught.value)

    return spmdsim.simulate(n, body)


@pytest.mark.parametrize("table_map", [("tp", None), (None, None), (None, "tp")])
def test_an_embedding_given_the_table_first_says_the_ids_come_first(table_map):
    """numpy's table[ids] order: the refusal named the float ids' dtype, never the order."""
    def lookup():
        layout = Layout((2, 2), ("dp", "tp"))
        mesh = Mesh(layout)
        table = DTensor.from_seeded(mesh, layout(*table_map), SeededTensor((10, 4), seed=0))
        ids = DTensor.from_global(mesh, np.array([[1, 2], [3, 4]]), layout("dp", None))
        ops.embedding(table, ids)

    assert _said(lookup) == ["embedding: the ids are float32 of global shape (10, 4) and the table integers of "
                             "global shape (2, 2); the ids come first: embedding(ids, table), as PyTorch's "
                             "F.embedding(input, weight)"] * 4


def test_a_check_against_a_dtensor_says_to_gather_it():
    """Two distributed results compared: the refusal was np.asarray's, naming no check."""
    def compare():
        layout = Layout((2, 2), ("dp", "tp"))
        mesh = Mesh(layout)
        seeded = SeededTensor((4, 4), "float64", seed=0)
        x = DTensor.from_seeded(mesh, layout("dp", "tp"), seeded)
        y = DTensor.from_seeded(mesh, layout(None, "tp"), seeded)
        assert x.check(y.gather()).passed
        x.check(y)

    assert _said(compare) == ["check: the reference is a DTensor of global shape (4, 4); expected the whole tensor "
                              "as a numpy array: pass what its gather() returns (a collective: "
                              "every rank calls it)"] * 4


def test_torch_optims_param_groups_say_to_set_the_optimizers_own_settings():
    """A PyTorch learning-rate schedule, ``for g in opt.param_groups: g["lr"] = ...``, was an AttributeError."""
    from spmdsim.nn.optim import SGD, AdamW

    def schedule():
        layout = Layout((2, 2), ("dp", "tp"))
        mesh = Mesh(layout)
        w = DTensor.from_seeded(mesh, layout(None, "tp"), SeededTensor((4, 4), "float64", seed=0)).requires_grad_()
        assert not hasattr(SGD([w], lr=0.1), "param_groups")  # still an AttributeError for hasattr
        for group in AdamW([w], lr=0.1).param_groups:
            group["lr"] = 0.01

    assert _said(schedule) == ["AdamW.param_groups is torch.optim's: spmdsim's optimizers hold one group of "
                               "parameters (one optimizer per group); set opt.lr, opt.eps, opt.weight_decay, "
                               "opt.betas between steps, and the next update reads them (docs/howto/train.md)"] * 4


def test_a_dtensor_of_another_simulated_rank_is_refused_not_combined():
    """Rank 0's DTensor handed to every rank through a global: each added rank 0's block to its own, a silent
    wrong result (the meshes' layouts were equal, which was all the operand check compared)."""
    shared = {}

    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x = DTensor.from_seeded(mesh, mesh.layout("dp", "tp"), SeededTensor((8, 8), seed=0))
        if spmdsim.world().rank == 0:
            shared["x"] = x
        spmdsim.world().Barrier()
        if spmdsim.world().rank == 0:
            return str(x + shared["x"] is not None)
        with pytest.raises(SpmdsimError) as caught:
            x + shared["x"]
        return str(caught.value)

    assert spmdsim.simulate(4, main) == ["True"] + [
        f"add: operands live on different meshes: Layout(dp=2, tp=2) of simulated rank {r} and of rank 0: a "
        "DTensor made on one rank holds that rank's block; let each rank build its own (not pass one through a "
        "global or a closure)" for r in (1, 2, 3)]


def test_one_layout_over_two_orders_of_the_ranks_is_refused_not_combined():
    """A mesh over comm.Split(0, key=-rank) has the same Layout as one over the world, every block cut for
    another rank's coordinates: x + y and matmul added and multiplied unrelated regions without a word."""
    def main():
        world = spmdsim.world()
        layout = Layout((2, 2), ("dp", "tp"))
        mesh, backwards = Mesh(layout, world), Mesh(layout, world.Split(0, world.size - 1 - world.rank))
        x = DTensor.from_seeded(mesh, mesh.layout("dp", "tp"), SeededTensor((8, 8), seed=0))
        y = DTensor.from_seeded(backwards, backwards.layout("dp", "tp"), SeededTensor((8, 8), seed=0))
        z = DTensor.from_seeded(backwards, backwards.layout("tp", None), SeededTensor((8, 8), seed=0))
        said = []
        for call in (lambda: x + y, lambda: ops.matmul(x, z), lambda: ops.concat([x, y], 0)):
            with pytest.raises(SpmdsimError) as caught:
                call()
            said.append(str(caught.value))
        return said

    line = ("operands live on different meshes: Layout(dp=2, tp=2) over two communicators of other ranks or in "
            "another order (this rank is {0} of one and {1} of the other): their blocks are cut for other ranks' "
            "coordinates; build both on one communicator")
    assert spmdsim.simulate(4, main) == [[f"add: {line.format(r, 3 - r)}", line.format(r, 3 - r),
                                          line.format(r, 3 - r)] for r in range(4)]


_MASKED = ("{} is a numpy masked array of shape {} with 1 masked element: a tensor has no mask; expected a plain "
           "array: pass its .filled(value) (masked elements set to value) or its .data (the numbers under the mask)")


@pytest.mark.parametrize("call, said", [
    (lambda mesh, m: DTensor.from_global(mesh, m, mesh.layout("tp")), _MASKED.format("array", "(4,)")),
    (lambda mesh, m: DTensor.from_global(mesh, m), _MASKED.format("array", "(4,)")),
    (lambda mesh, m: DTensor.from_local(mesh, m[:2], mesh.layout("tp")), _MASKED.format("local shard", "(2,)")),
    (lambda mesh, m: DTensor(mesh, m[:2], mesh.layout("tp"), (4,)), _MASKED.format("local shard", "(2,)")),
    (lambda mesh, m: DTensor.from_global(mesh, m.data, mesh.layout("tp")).check(m),
     _MASKED.format("check: reference", "(4,)")),
    (lambda mesh, m: DTensor.from_global(mesh, m.data, mesh.layout("tp")).check(m.data, scale=m),
     _MASKED.format("check: scale", "(4,)"))])
def test_a_masked_array_is_refused_not_read_without_its_mask(call, said):
    """np.asarray keeps a masked array's data and drops its mask: from_global of [0, --, 2, 3] gathered
    [0, 1, 2, 3], and a check against it compared the masked element's number."""
    masked = np.ma.masked_array(np.arange(4.0), mask=[0, 1, 0, 0])
    assert _said(lambda: call(Mesh(Layout((2,), ("tp",))), masked), n=2) == [said] * 2


@pytest.mark.parametrize("call, what, to", [
    (lambda mesh: DTensor.from_global(mesh, np.arange(4, dtype=np.longdouble), mesh.layout("tp")), "array dtype",
     "float64"),
    (lambda mesh: DTensor.from_local(mesh, np.zeros(2, np.clongdouble), mesh.layout("tp")), "local shard dtype",
     "complex128"),
    (lambda mesh: DTensor(mesh, np.zeros(2, np.longdouble), mesh.layout("tp"), (4,)), "local shard dtype", "float64"),
    (lambda mesh: DTensor.zeros(mesh, mesh.layout("tp"), (4,)).astype(np.longdouble), "dtype", "float64")])
def test_a_long_double_is_refused_in_one_line(call, what, to):
    """float128 was taken though the dtype errors list float16..float64: under mpiexec -n 2 from_global of the same
    array refused it as "different arrays" (its padding bytes differ between processes)."""
    name = np.dtype(np.clongdouble if to == "complex128" else np.longdouble)
    said = (f"{what} {name.str!r} ({name.name}) is numpy's long double, whose width and padding bytes differ between "
            "machines and processes; expected one of bool, int8..int64, uint8..uint64, float16..float64, complex64, "
            f"complex128: convert it with .astype({to!r})")
    assert _said(lambda: call(Mesh(Layout((2,), ("tp",)))), n=2) == [said] * 2


@pytest.mark.parametrize("call, what", [
    (lambda mesh, rows: DTensor.from_global(mesh, rows, mesh.layout("tp", None)), "array"),
    (lambda mesh, rows: DTensor.from_global(mesh, rows), "array"),
    (lambda mesh, rows: DTensor.from_local(mesh, rows), "local shard")])
def test_a_ragged_nested_list_is_refused_in_one_line(call, what):
    """Rows of unequal lengths: numpy's "inhomogeneous shape" ValueError came out as a traceback on every rank."""
    said = (f"{what} list [[1.0, 2.0], [3.0]] is not rectangular: its nested sequences differ in length; expected "
            "one length per dim, as an ndarray has")
    assert _said(lambda: call(Mesh(Layout((2,), ("tp",))), [[1.0, 2.0], [3.0]]), n=2) == [said] * 2


@pytest.mark.parametrize("call, said", [
    (lambda mesh: DTensor.zeros(mesh, mesh.layout("tp"), 8), "shape 8 must be a sequence of integers"),
    (lambda mesh: DTensor.ones(mesh, mesh.layout("tp"), None), "shape None must be a sequence of integers"),
    (lambda mesh: DTensor.full(mesh, mesh.layout("tp"), "8", 1.0), "shape '8' must be a sequence of integers")])
def test_full_zeros_ones_refuse_a_shape_that_is_no_sequence(call, said):
    """torch.zeros(8)'s one int: tuple(shape) raised "'int' object is not iterable", a traceback on every rank
    (a string was cut into its characters: "shape ('8',) must hold integers")."""
    assert _said(lambda: call(Mesh(Layout((2,), ("tp",)))), n=2) == [said] * 2


def test_a_trace_name_read_off_collect_trace_says_to_use_with():
    """``trace = collect_trace(); ...; trace.counts()`` ended in "'_Collector' object has no attribute 'counts'"."""
    collector = spmdsim.collect_trace()
    with pytest.raises(SpmdsimError) as caught:
        collector.counts()
    assert str(caught.value) == ("collect_trace().counts: collect_trace() is a context manager, which records only "
                                 "inside a with block: with collect_trace() as trace: ..., then trace.counts")
    assert not hasattr(collector, "no_such_name")
    with collector as trace:
        assert trace.counts() == {}


@pytest.mark.parametrize("call", [lambda mesh, x: DTensor.from_global(mesh, x, mesh.layout("tp", None)),
                                  lambda mesh, x: DTensor.from_local(mesh, x)])
def test_a_dtensor_passed_as_the_array_says_to_gather_it(call):
    """The ragged-list refusal must not take over a DTensor's own (a ValueError too)."""
    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        call(mesh, DTensor.from_global(mesh, np.ones((2, 2)), mesh.layout("tp", None)))

    assert _said(body, n=2) == ["numpy array of a DTensor of global shape (2, 2): its values are spread over the "
                                "ranks; x.gather() makes the whole array on every rank (a collective: every rank "
                                "calls it), x.local is this rank's block"] * 2


def test_item_assignment_says_how_to_make_a_new_tensor():
    """PyTorch's ``x[:, 0] = 0.0`` was "'DTensor' object does not support item assignment", a traceback."""
    def assign():
        mesh = Mesh(Layout((2,), ("tp",)))
        x = DTensor.from_global(mesh, np.ones((2, 4)), mesh.layout(None, "tp"))
        with pytest.raises(TypeError):  # still Python's kind of error
            x[0] = 1.0
        x[:, 0] = 0.0

    assert _said(assign, n=2) == ["x[(slice(None, None, None), 0)] = float: a DTensor is not assigned in place; "
                                  "make a new one: x.masked_fill(mask, value) or ops.where(mask, value, x) with a "
                                  "bool DTensor mask, or ops.concatenate of the pieces"] * 2


def test_a_dtensor_where_a_number_goes_is_quoted_alike_on_every_rank():
    """ops.scale(x, norm) with norm a 0-d DTensor: the refusal quoted repr(norm), whose rank=... differed, so it
    ended as rank 0's text and "ranks differ: rank 1: ...; 2 more texts on ranks 2-3"."""
    def scale_by_a_tensor():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x = DTensor.from_seeded(mesh, mesh.layout("dp", "tp"), SeededTensor((4, 4), "float64", seed=0))
        ops.scale(x, ops.resolved(ops.sum(x)))

    assert _said(scale_by_a_tensor) == ["scale factor DTensor(shape=(), layout=(), dtype=float64, local_shape=()) "
                                        "must be a real number (int or float, not NaN)"] * 4


@pytest.mark.parametrize("call, said", [
    (lambda s: ops.softmax(s, 0), "softmax: dim 0 is out of range for a tensor of 0 dims (it has no dim to name)"),
    (lambda s: ops.mean(s, 0), "mean: dim 0 is out of range for a tensor of 0 dims (it has no dim to name)"),
    (lambda s: s.size(0), "dim 0 is out of range for a tensor of 0 dims (it has no dim to name)"),
    (lambda s: s[0], "index 0 has 1 entry for a tensor of 0 dims")])
def test_a_dim_of_a_0d_tensor_is_refused_without_an_empty_range(call, said):
    """A 0-d tensor's dim refusal said "(expected an integer from 0 to -1)"; x.size(0) raised an IndexError."""
    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        call(DTensor.from_global(mesh, np.float64(2.0)))

    assert _said(body, n=2) == [said] * 2


@pytest.mark.parametrize("call, said", [
    (lambda x: ops.astype(x.gather(), "float32"), "astype: x must be a DTensor, got ndarray of shape (4, 4); build "
     "one with DTensor.from_local/from_seeded"),
    (lambda x: ops.resolved(1.5), "resolved: x must be a DTensor, got float 1.5; build one with "
     "DTensor.from_local/from_seeded"),
    (lambda x: ops.causal_mask(x, (4, 4)), "causal_mask: mesh must be a spmdsim Mesh, got DTensor DTensor(shape=(4, "
     "4), layout=(None, \"tp\"), dtype=float64,...; e.g. ops.causal_mask(x.mesh, (T, T))"),
    (lambda x: ops.einsum(x.gather(), x), "einsum spec ndarray of shape (4, 4) must be a string like 'ij,jk->ik', "
     "given first: einsum(spec, *operands)")])
def test_ops_given_no_dtensor_or_no_mesh_say_so_in_one_line(call, said):
    """AttributeErrors ('numpy.ndarray' object has no attribute 'local', 'float' ... 'layout'), "'TensorLayout'
    object is not callable" and einsum's "unhashable type: 'numpy.ndarray'": tracebacks on every rank."""
    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        call(DTensor.from_seeded(mesh, mesh.layout(None, "tp"), SeededTensor((4, 4), "float64", seed=0)))

    assert _said(body, n=2) == [said] * 2


def test_a_reshape_to_sizes_that_do_not_hash_is_refused_in_one_line():
    """x.view([4], [4]) (a list where a size goes): the reshape cache's key raised "unhashable type: 'list'"."""
    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        x = DTensor.from_seeded(mesh, mesh.layout(None, "tp"), SeededTensor((4, 4), "float64", seed=0))
        x.view([4], [4])

    assert _said(body, n=2) == ["reshape shape ([4], [4]) must hold non-negative integers and at most one -1"] * 2


@pytest.mark.parametrize("call, said", [
    (lambda mesh, x: mesh.group(0), "axes 0 must be a mesh axis name or a tuple of them, e.g. 'tp' or ('dp', 'tp')"),
    (lambda mesh, x: spmdsim.runtime.allreduce(mesh, x.local, None),
     "axes None must be a mesh axis name or a tuple of them, e.g. 'tp' or ('dp', 'tp')"),
    (lambda mesh, x: x.check(x.gather(), scale=[1.0, [2.0]]), "check: scale list [1.0, [2.0]] is not rectangular: its "
     "nested sequences differ in length; expected one length per dim, as an ndarray has")])
def test_axes_and_a_checks_scale_of_the_wrong_kind_are_refused_in_one_line(call, said):
    """mesh.group(0) (PyTorch's get_group(0)) raised "'int' object is not iterable"; a ragged scale numpy's
    "inhomogeneous shape" from np.shape: tracebacks on every rank."""
    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        call(mesh, DTensor.from_seeded(mesh, mesh.layout(None, "tp"), SeededTensor((4, 4), "float64", seed=0)))

    assert _said(body, n=2) == [said] * 2


def test_ops_reductions_take_numpys_and_pytorchs_dim_keywords():
    """ops.sum(x, axis=1), as jnp.sum is written, was Python's "unexpected keyword argument 'axis'" (a
    traceback), while x.sum(axis=1) took it; the ops now read the methods' keywords alike."""
    a = np.arange(16.0).reshape(4, 4)

    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        x = DTensor.from_global(mesh, a, mesh.layout(None, "tp"))
        got = [ops.resolved(ops.sum(x, axis=1)).gather(), ops.mean(x, dim=0, keepdim=True).gather(),
               ops.max(x, axis=(0, 1)).gather(), ops.min(x, dim=1).gather()]
        with pytest.raises(SpmdsimError) as caught:
            ops.sum(x, 0, axis=1)
        return got, str(caught.value)

    (total, mean, biggest, least), said = spmdsim.simulate(2, body)[1]
    assert np.array_equal(total, a.sum(axis=1)) and np.array_equal(mean, a.mean(axis=0, keepdims=True))
    assert biggest == a.max() and np.array_equal(least, a.min(axis=1))
    assert said == "sum: dims given twice (dims 0 and axis=1)"


def test_softmax_argmax_and_joins_take_numpys_and_jaxs_axis():
    """jax.nn.softmax(x, axis=-1), np.argmax(x, axis=1) and np.concatenate(xs, axis=1) ported to ops: Python's
    "unexpected keyword argument 'axis'" with a traceback; now the dim, and both given one line."""
    a = np.arange(16.0).reshape(4, 4) / 7.0

    def body():
        mesh = Mesh(Layout((2,), ("tp",)))
        x = DTensor.from_global(mesh, a, mesh.layout(None, "tp"))
        got = [ops.softmax(x, axis=1).gather(), ops.log_softmax(x, axis=0).gather(),
               ops.argmax(x, axis=1).gather(), ops.argmin(x, axis=0, keepdim=True).gather(),
               ops.concatenate([x, x], axis=1).gather(), ops.stack([x, x], axis=0).gather()]
        with pytest.raises(SpmdsimError) as caught:
            ops.softmax(x, 0, axis=1)
        return got, str(caught.value)

    (soft, logsoft, top, least, joined, stacked), said = spmdsim.simulate(2, body)[1]
    e = np.exp(a - a.max(axis=1, keepdims=True))
    assert np.allclose(soft, e / e.sum(axis=1, keepdims=True), rtol=1e-12, atol=0)
    z = a - a.max(axis=0, keepdims=True)
    assert np.allclose(logsoft, z - np.log(np.exp(z).sum(axis=0, keepdims=True)), rtol=1e-12, atol=1e-15)
    assert np.array_equal(top, a.argmax(axis=1)) and np.array_equal(least, a.argmin(axis=0)[None, :])
    assert np.array_equal(joined, np.concatenate([a, a], axis=1)) and np.array_equal(stacked, np.stack([a, a]))
    assert said == "softmax: dim 0 and axis=1 both given; give one of them"


def test_a_mesh_where_a_number_goes_is_quoted_alike_on_every_rank():
    """ops.scale(x, mesh): the refusal quoted repr(mesh), whose rank=... differed, so it ended as rank 0's text
    and "ranks differ: rank 1: ...; 2 more texts on ranks 2,3", as a DTensor's did."""
    def scale_by_a_mesh():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x = DTensor.from_seeded(mesh, mesh.layout("dp", "tp"), SeededTensor((4, 4), "float64", seed=0))
        ops.scale(x, mesh)

    said = _said(scale_by_a_mesh)
    assert len(set(said)) == 1 and said[0].startswith("scale factor Mesh(Layout(device_matrix=(2, 2), alias_name=("
                                                      "'dp', 'tp')), size=4, wait="), said
