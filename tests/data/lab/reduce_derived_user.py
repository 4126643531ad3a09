# User-defined ops (MPI.Op.Create) on derived datatypes other than contiguous ones: MPI calls the function with
# the memory of count items laid out as the type lays them (count extents: the gaps between the data too) and the
# datatype itself, in every reduction; the gaps of the receive buffer are left as they were.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, g = comm.rank, comm.size
column = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()  # doubles 0 and 2 of an extent of 3
pair = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, MPI.DOUBLE]).Commit()  # (int32, gap, double)
indexed = MPI.DOUBLE.Create_indexed([1, 2], [0, 3])
spread = indexed.Create_resized(0, 48).Commit()  # doubles 0, 3 and 4 of an extent of 6
seen = set()  # what the functions saw: (memory type, count extents of it, the datatype the program made)


def saw(x, y, datatype):
    name = next((n for n, t in (("column", column), ("pair", pair), ("spread", spread)) if t == datatype), "another")
    seen.add((type(x).__name__, len(x) == len(y) and len(x) % datatype.extent == 0, name))
    return len(x) // datatype.extent


def add(x, y, datatype):  # y += x at the type's doubles (ints: max)
    n = saw(x, y, datatype)
    if datatype == pair:
        for k in range(n):
            xi, yi = np.frombuffer(x, np.int32, 1, 16 * k), np.frombuffer(y, np.int32, 1, 16 * k)
            yi[0] = max(xi[0], yi[0])
            np.frombuffer(y, np.float64, 1, 16 * k + 8)[0] += np.frombuffer(x, np.float64, 1, 16 * k + 8)[0]
        return
    at = [0, 2] if datatype == column else [0, 3, 4]
    step = 3 if datatype == column else 6
    xs, ys = np.frombuffer(x, np.float64), np.frombuffer(y, np.float64)
    for k in range(n):
        ys[[step * k + i for i in at]] += xs[[step * k + i for i in at]]


def then(x, y, datatype):  # affine maps t -> m*t + c as (m, c) at a column's doubles: y = y after x (not commutative)
    n = saw(x, y, datatype)
    xs, ys = np.frombuffer(x, np.float64), np.frombuffer(y, np.float64)
    for k in range(n):
        m, c = ys[3 * k], ys[3 * k + 2]
        ys[3 * k], ys[3 * k + 2] = xs[3 * k] * m, xs[3 * k + 2] * m + c


plus, compose = MPI.Op.Create(add, commute=True), MPI.Op.Create(then, commute=False)
a = np.arange(3.0 * g) + 10 * r


def fresh(n=3 * g):
    return np.full(n, -1.0)


def show(what, b):
    print(r, what, b.tolist())


b = fresh()
comm.Allreduce([a, g, column], [b, g, column], op=plus)
show("Allreduce", b)
b = fresh()
comm.Reduce([a, g, column], [b, g, column], op=plus, root=1)
show("Reduce to 1", b)
b = a.copy()
comm.Scan(MPI.IN_PLACE, [b, 2, column], op=plus)
show("Scan in place", b)
b = fresh()
comm.Exscan([a, 2, column], [b, 2, column], op=plus)
show("Exscan", b)
b = fresh(3)
comm.Reduce_scatter_block([a, 1, column], [b, 1, column], op=plus)  # counts per rank
show("Reduce_scatter_block", b)
b = fresh(3)
comm.Reduce_scatter([a, g, column], [b, 1, column], [1] * g, op=plus)
show("Reduce_scatter", b)
b = fresh()
comm.Iallreduce([a, g, column], [b, g, column], op=plus).Wait()
show("Iallreduce", b)
b = a.copy()
comm.Allreduce(MPI.IN_PLACE, [b, g, column], op=plus)
show("Allreduce in place", b)
affine = np.array([r + 1.0, -1.0, r, 2.0, -1.0, -r])  # two maps: t -> (r+1) t + r, t -> 2 t - r
b = fresh(6)
comm.Allreduce([affine, 2, column], [b, 2, column], op=compose)
show("Allreduce of a non-commutative op", b)
b = fresh(6)
plus.Reduce_local([a, 2, column], [b, 2, column])
show("Reduce_local", b)
records = np.zeros(2, [("i", np.int32), ("pad", np.int32), ("x", np.float64)])
records["i"], records["pad"], records["x"] = [r, 3 - r], -7, [r / 2, 1.5]
got = np.zeros_like(records)
got["pad"] = -9
comm.Allreduce([records, 2, pair], [got, 2, pair], op=plus)
print(r, "struct", got["i"].tolist(), got["pad"].tolist(), got["x"].tolist())
wide = np.arange(12.0) + r
b = fresh(12)
comm.Allreduce([wide, 2, spread], [b, 2, spread], op=plus)
show("resized indexed", b)
try:
    comm.Allreduce([a, g, column], [b, 2 * g, MPI.DOUBLE], op=plus)
except ValueError as exc:
    print(r, "column sent, doubles received:", "mismatch in send and receive MPI datatypes" in str(exc))
everything = set().union(*comm.allgather(seen))
for found in sorted(everything) if r == 0 else ():
    print("the function saw", *found)
for t in (column, pair, indexed, spread, plus, compose):
    t.Free()
