"""runtime.executor keeps each compiled redistribution in its mesh's table (`Mesh._moves`, runtime.compiled.keep_move)
keyed by the layout objects' ids, the shape and the dtype: a repeated move runs its program, and a program must never
serve another mesh, shape or dtype (each result is checked against numpy, and its mesh against the caller's); a
mesh's moves go when it is closed, and with it when it goes."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.runtime import executor


def test_a_kept_move_serves_only_its_own_mesh_shape_and_dtype():
    layout = Layout((2, 2), ("dp", "tp"))
    rows, cols = layout("dp", None), layout(None, "tp")  # one object each: every move below has the same ids

    def body():
        meshes = [Mesh(layout), Mesh(layout)]  # two meshes of one Layout: the same layout objects on each
        rank = spmdsim.world().rank
        for mesh in meshes * 2:  # twice each: compiled, then kept
            for shape, dtype in [((4, 6), "float64"), ((8, 6), "float64"), ((8, 6), "float32"), ((8, 6), "int32")]:
                a = (np.arange(np.prod(shape)).reshape(shape) % 7 - 3).astype(dtype)
                x = DTensor.from_global(mesh, a, rows)
                y = executor.redistribute(x, cols)
                assert y.mesh is mesh and y.layout is cols and y.dtype == np.dtype(dtype)
                np.testing.assert_array_equal(y.gather(), a)
                z = executor.redistribute(y, rows)  # and back: the other direction is its own move
                np.testing.assert_array_equal(z.local, x.local)
        kept = [len(mesh._moves) for mesh in meshes]
        meshes[0].close()
        left = len(meshes[0]._moves)
        meshes[1].close()
        return rank, kept, left

    for _, kept, left in spmdsim.simulate(4, body):
        assert kept == [4 * 2] * 2  # per mesh: 4 (shape, dtype) x 2 directions
        assert left == 0


def test_a_mesh_left_unclosed_goes_with_its_moves_once_the_program_drops_it():
    """A program that makes a mesh and moves a tensor on it, run again and again (a notebook's cell), leaves no
    mesh behind: its compiled moves hold it, and they live on it, not in a table of the process (which kept every
    run's meshes, their communicators and their simulation's world: about 300 objects a run)."""
    layout = Layout((2, 2), ("dp", "tp"))
    made = []

    def body():
        mesh = Mesh(layout)
        x = DTensor.from_global(mesh, np.arange(48.0).reshape(8, 6), layout("dp", None))
        executor.redistribute(executor.redistribute(x, layout(None, "tp")), layout("dp", None))
        made.append(weakref.ref(mesh))

    for _ in range(5):
        spmdsim.simulate(4, body)
    gc.collect()
    assert len(made) == 5 * 4 and [ref for ref in made if ref() is not None] == []


@pytest.mark.usefixtures("empty_tables")
def test_a_given_plan_is_checked_and_compiled_once_per_mesh_and_goes_with_it(monkeypatch):
    """A plan the caller gives (a network's hops, `spmdsim redistribute`) is checked against the move and compiled
    at its first use on a mesh, then found again by its ids; a plan that does not fit the move is refused every
    time; the mesh's kept programs go when it closes."""
    from spmdsim.errors import PlanError
    from spmdsim.programs.plan import plan_redistribution

    layout = Layout((2, 2), ("dp", "tp"))
    rows, cols = layout("dp", None), layout(None, "tp")
    compiled = []
    real = executor._compile
    monkeypatch.setattr(executor, "_compile", lambda plan, mesh, cls: compiled.append(plan) or real(plan, mesh, cls))

    def body():
        mesh = Mesh(layout)
        a = np.arange(48.0).reshape(8, 6)
        plan = plan_redistribution(rows, cols, (8, 6), "float64")
        other = plan_redistribution(rows, cols, (4, 6), "float64")  # another shape's plan
        x = DTensor.from_global(mesh, a, rows)
        for _ in range(3):
            np.testing.assert_array_equal(executor.redistribute(x, cols, plan).gather(), a)
            with pytest.raises(PlanError, match="does not fit"):
                executor.redistribute(x, cols, other)
        kept = [key for key in list(mesh._moves) if key[0] == "given"]
        mesh.close()
        return len(kept), len(mesh._moves)

    assert spmdsim.simulate(4, body) == [(1, 0)] * 4
    assert len(compiled) == 4  # once a rank: the later calls found their program
