"""DTensor: shards equal the generator's slices, gather, and agreed checks."""
from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

from spmdsim import CheckFailed, Layout, SeededTensor, ShapeError
from spmdsim.runtime import DTensor, Mesh, collect_trace

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
if WORLD.size == 8:
    LAYOUT = Layout((2, 2, 2), ("dp", "sp", "mp"))
    MAPS = [("mp", ("sp", "dp")), (("dp", "mp"), "None"), ("None", "sp"), ("dp", "None")]
    PARTIAL = [("mp", "None", ("sp",)), ("None", "None", ("dp", "mp"))]
elif WORLD.size == 4:
    LAYOUT = Layout((2, 2), ("dp", "mp"))
    MAPS = [("mp", "dp"), (("dp", "mp"), "None"), ("None", "None")]
    PARTIAL = [("mp", "None", ("dp",)), ("None", "None", ("dp", "mp"))]
else:
    LAYOUT = Layout((WORLD.size,), ("x",))
    MAPS = [("x", "None")]
    PARTIAL = [("None", "None", ("x",))]

SHAPE = (16, 24)
_MESH = []


def _mesh() -> Mesh:
    if not _MESH:
        _MESH.append(Mesh(LAYOUT))
    return _MESH[0]


def _same_everywhere(value) -> bool:
    return len(set(WORLD.allgather(value))) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_from_seeded_shards_are_the_generator_slices_and_gather(dtype):
    mesh = _mesh()
    seeded = SeededTensor(SHAPE, dtype, seed=7)
    full = seeded.full()
    for tensor_map in MAPS:
        tl = LAYOUT(*tensor_map)
        x = DTensor.from_seeded(mesh, tl, seeded)
        region = tl.slices(mesh.rank, SHAPE)
        np.testing.assert_array_equal(x.local, full[region])
        assert x.local.shape == tl.local_shape(SHAPE) and x.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(x.gather(), full)
        root = mesh.size - 1
        got = x.gather(root=root)
        assert (got is None) == (mesh.rank != root)
        if got is not None:
            np.testing.assert_array_equal(got, full)
        y = DTensor.from_global(mesh, full, tl)
        np.testing.assert_array_equal(y.local, x.local)


def test_partial_layouts_sum_to_the_global_value():
    mesh = _mesh()
    seeded = SeededTensor(SHAPE, "float64", seed=3)
    for *tensor_map, partial in PARTIAL:
        tl = LAYOUT(*tensor_map, partial=partial)
        x = DTensor.from_seeded(mesh, tl, seeded)
        np.testing.assert_array_equal(x.gather(), seeded.full())
        with collect_trace() as tr:
            verdict = x.check(seeded)
        assert verdict.passed, str(verdict)
        assert tr.counts() == {"allreduce": 1} and tr.entries[0].label == "check"
        np.testing.assert_array_equal(x.local, DTensor.from_seeded(mesh, tl, seeded).local)  # unchanged


def test_check_passes_on_right_data_for_every_reference_kind():
    mesh = _mesh()
    seeded = SeededTensor(SHAPE, "float32", seed=11)
    tl = LAYOUT(*MAPS[0])
    x = DTensor.from_seeded(mesh, tl, seeded)
    for reference in (seeded, seeded.full(), seeded.region):
        verdict = x.check(reference)
        assert verdict.passed and verdict.max_abs_error == 0.0 and verdict.nonfinite == 0
        assert verdict.elements == SHAPE[0] * SHAPE[1]
        assert (verdict.rtol, verdict.atol) == (1e-4, 1e-5)
    assert x.check(SeededTensor(SHAPE, "float64", seed=11).full()).passed  # float32 tolerance applies
    # Within tolerance: a relative perturbation of 1e-6 still passes.
    y = DTensor.from_local(mesh, x.local * np.float32(1 + 1e-6), tl, SHAPE)
    assert y.check(seeded).passed


def test_check_fails_on_wrong_data_on_every_rank():
    mesh = _mesh()
    seeded = SeededTensor(SHAPE, "float64", seed=5)
    tl = LAYOUT(*MAPS[0])
    local = DTensor.from_seeded(mesh, tl, seeded).local.copy()
    bad_rank = mesh.size - 1
    if mesh.rank == bad_rank:
        local[0, 0] += 0.5
    verdict = DTensor.from_local(mesh, local, tl, SHAPE).check(seeded)
    assert not verdict.passed and verdict.worst_rank == bad_rank
    assert verdict.failed_ranks == (bad_rank,)
    assert verdict.max_abs_error == pytest.approx(0.5)
    assert _same_everywhere(str(verdict)) and "FAILED" in str(verdict)
    with pytest.raises(CheckFailed, match="FAILED"):
        verdict.raise_if_failed()


def test_nonfinite_values_fail_and_are_reported():
    mesh = _mesh()
    seeded = SeededTensor(SHAPE, "float32", seed=5)
    tl = LAYOUT(*MAPS[0])
    local = DTensor.from_seeded(mesh, tl, seeded).local.copy()
    if mesh.rank == 0:
        local[0, 0] = np.nan
        local[0, 1] = np.inf
    verdict = DTensor.from_local(mesh, local, tl, SHAPE).check(seeded)
    assert not verdict.passed and verdict.nonfinite == 2 and verdict.worst_rank == 0
    assert "2 non-finite" in str(verdict) and _same_everywhere(str(verdict))


def test_wrong_reference_shape_fails_instead_of_hanging():
    mesh = _mesh()
    tl = LAYOUT(*MAPS[0])
    x = DTensor.from_seeded(mesh, tl, SeededTensor(SHAPE, "float64"))
    verdict = x.check(lambda region: np.zeros(3) if mesh.rank == 1 else SeededTensor(SHAPE, "float64").region(region))
    assert not verdict.passed and verdict.failed_ranks == (1,)


def test_from_local_checks_shape_and_dtype():
    mesh = _mesh()
    tl = LAYOUT(*MAPS[0])
    expected = tl.local_shape(SHAPE)
    with pytest.raises(ShapeError, match=re.escape(f"local shard shape (3, 3) does not match {expected!r}")):
        DTensor.from_local(mesh, np.zeros((3, 3)), tl, SHAPE)
    with pytest.raises(ShapeError, match="dtype 'float64' does not match 'float32'"):
        DTensor.from_local(mesh, np.zeros(expected), tl, SHAPE, dtype="float32")
