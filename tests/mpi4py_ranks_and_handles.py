"""mpi4py calls whose arguments and handles a course program meets, compared: simulated ranks against MPICH.

    timeout -k 5 120 mpiexec -n 4 python tests/mpi4py_ranks_and_handles.py OUT.json   # MPICH's results

Each function takes nothing, uses ``MPI.COMM_WORLD`` (4 ranks: a 2 x 2 grid) as an mpi4py program does
and returns a JSON-able value; tests/test_sim_mpi4py_ranks_and_handles.py runs them on simulated ranks,
checks the values MPI's semantics give and compares rank by rank with MPICH's. A refusal is its class
(MPI.Exception with MPICH's text of its error class), as tests/mpi4py_corners.py reports it.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from mpi4py import MPI

from mpi4py_corners import _raises


def _answer(fn):
    """What `fn()` gives, as JSON: its value (a group as its world ranks, a communicator as its class name
    and size), or the class of what it raised."""
    try:
        value = fn()
    except Exception:  # noqa: BLE001 - the class is the answer
        return _raises(fn)
    if isinstance(value, MPI.Group):
        return ["group", MPI.Group.Translate_ranks(value, None, MPI.COMM_WORLD.Get_group())]
    if isinstance(value, MPI.Comm):
        return ["comm", type(value).__name__, value.size]
    return list(value) if isinstance(value, tuple) else value


def base_class_calls():
    """A topology communicator's methods called through mpi4py's base classes (MPI.Topocomm.neighbor_alltoall
    (cart, ...), as the HLRS course writes it), MPI.Topocomm(cart) a copy that knows its neighbours, and
    every duplicate (MPI.Comm.Dup(cart), Dup_with_info, Idup) a topology communicator of the same kind."""
    comm = MPI.COMM_WORLD
    r = comm.rank
    cart = comm.Create_cart([2, 2], periods=[True, False])
    graph = comm.Create_dist_graph_adjacent([(r - 1) % 4], [(r + 1) % 4])
    copy = MPI.Topocomm(cart)
    out = [MPI.Topocomm.neighbor_alltoall(cart, [10 * r + i for i in range(4)]),
           MPI.Topocomm.neighbor_allgather(cart, r), MPI.Topocomm.neighbor_allgather(graph, r),
           isinstance(cart, MPI.Topocomm), isinstance(comm, MPI.Topocomm), MPI.Topocomm.Get_topology(cart) == MPI.CART,
           MPI.Cartcomm.Get_coords(cart, r), MPI.Intracomm.Get_size(cart), MPI.Comm.Get_rank(cart),
           MPI.Topocomm.inoutedges.__get__(cart), copy.neighbor_allgather(r), copy == cart,
           _raises(lambda: MPI.Topocomm(comm)), bool(MPI.Topocomm())]
    data = np.full(4, float(r))
    got = np.zeros(4)
    MPI.Topocomm.Neighbor_alltoall(cart, data, got)
    dup, with_info, (idup, request) = MPI.Comm.Dup(cart), cart.Dup_with_info(MPI.INFO_NULL), graph.Idup()
    request.Wait()
    out += [MPI.Comm.Get_topology(graph) == MPI.DIST_GRAPH, MPI.Comm.Get_topology(comm) == MPI.UNDEFINED]
    out += [[type(c).__name__, c.Get_topology() == t, c.neighbor_allgather(r)]
            for c, t in ((dup, MPI.CART), (with_info, MPI.CART), (idup, MPI.DIST_GRAPH))]
    for c in (dup, with_info, idup):
        c.Free()
    graph.Free()
    cart.Free()  # and with it its copy's handle
    return out + [got.tolist()]


def float_ranks_in_groups():
    """Ranks as mpi4py's C code reads them from a group's arguments: the numbers of a Range_incl / Range_excl
    triple are C ints (a float truncated: (0.0, 2.0, 1) is (0, 2, 1)), a list of ranks is an integer array
    (operator.index: a float is a TypeError); a rank outside the group is MPICH's MPI.ERR_RANK (a range's
    its MPI.ERR_ARG), never a Python index from the end."""
    g = MPI.COMM_WORLD.Get_group()
    calls = [lambda: g.Range_incl([(0.0, 2.0, 1)]), lambda: g.Range_incl([(0.5, 2.7, 1.9)]),
             lambda: g.Range_incl([(np.int64(3), np.float64(0), -2)]), lambda: g.Range_excl([(0.0, 2.0, 1)]),
             lambda: g.Range_incl([("0", 2, 1)]), lambda: g.Range_incl([(0, 2)]), lambda: g.Range_incl([(0, 9, 1)]),
             lambda: g.Range_incl([(0, 2, 0)]), lambda: g.Range_excl([(-1, 2, 1)]),
             lambda: g.Incl([2, 0]), lambda: g.Incl([1.0]), lambda: g.Incl([4]), lambda: g.Incl([-1]),
             lambda: g.Excl([np.int32(1)]), lambda: g.Excl([0.0]), lambda: g.Excl([9]), lambda: g.Excl([-1]),
             lambda: MPI.Group.Translate_ranks(g, [3, MPI.PROC_NULL], g), lambda: MPI.Group.Translate_ranks(g, [1.0]),
             lambda: MPI.Group.Translate_ranks(g, [7], g)]
    return [_answer(call) for call in calls]


def float_ranks_in_grids():
    """A Cartesian grid's numbers as mpi4py reads them: Shift's direction and displacement and Get_coords'
    rank are C ints (a float truncated, the answer ints), dims, periods, coordinates and remain_dims integer
    arrays (a float is a TypeError, and so is a numpy bool where numpy refuses one as an index)."""
    comm = MPI.COMM_WORLD
    cart = comm.Create_cart([2, 2], periods=[True, False])
    calls = [lambda: cart.Shift(0, 1.0), lambda: cart.Shift(1.0, 1), lambda: cart.Shift(np.int32(0), np.float32(1.5)),
             lambda: cart.Shift(0, "1"), lambda: cart.Shift(0, 2 ** 40), lambda: cart.Get_coords(3.0),
             lambda: cart.Get_cart_rank([1.0, 1]), lambda: cart.Get_cart_rank([1]), lambda: cart.Sub([1.0, 0]),
             lambda: cart.Sub([np.bool_(True), False]), lambda: cart.Sub([1]),
             lambda: comm.Create_cart([2.0, 2]), lambda: comm.Create_cart([np.float64(2), 2]),
             lambda: comm.Create_cart(np.array([2, 2])), lambda: comm.Create_cart([2, 2], periods=[1.0, 0.0]),
             lambda: comm.Create_cart([2, 2], periods=1), lambda: comm.Create_cart([2, 2], periods=[2, 0]).periods,
             lambda: comm.Create_cart([2, 2], periods=True).periods, lambda: comm.Cart_map([2.0, 2])]
    shifted = cart.Shift(0, 1.0)
    return [_answer(call) for call in calls] + [[type(v).__name__ for v in shifted]]


def freed_copies_of_predefined():
    """``c = type(MPI.COMM_WORLD)(MPI.COMM_WORLD); c.free()``: the copy becomes MPI.COMM_NULL (mpi4py's free
    nullifies a copy of a predefined handle), MPI.COMM_WORLD stays; the same for MPI.COMM_SELF; the
    predefined objects' own free() does nothing."""
    out = []
    for world in (MPI.COMM_WORLD, MPI.COMM_SELF):
        copy = type(world)(world)
        copy.free()
        world.free()
        out += [bool(copy), copy == MPI.COMM_NULL, bool(world), world.allreduce(1), _raises(copy.Free)]
    copy = MPI.Comm(MPI.COMM_WORLD)
    return out + [_raises(copy.Free), bool(copy)]


ALL = (base_class_calls, float_ranks_in_groups, float_ranks_in_grids, freed_copies_of_predefined)


def run_all():
    out = {}
    for fn in ALL:  # one failing function does not hide the others
        try:
            out[fn.__name__] = fn()
        except Exception as exc:  # noqa: BLE001 - reported as the value
            out[fn.__name__] = f"raised {type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    results = run_all()
    gathered = MPI.COMM_WORLD.gather(results, root=0)
    if MPI.COMM_WORLD.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(gathered, f)
