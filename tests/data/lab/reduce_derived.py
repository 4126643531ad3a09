# Reductions over derived datatypes: MPI's predefined ops take predefined datatypes (MPICH raises MPI.ERR_OP on
# a derived one, a contiguous one too); a user-defined op takes a contiguous one.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r = comm.rank
NAMES = {MPI.ERR_OP: "ERR_OP"}


def attempt(what, call):
    try:
        call()
        print(r, what, "ok")
    except MPI.Exception as exc:
        print(r, what, NAMES.get(MPI.Get_error_class(exc.Get_error_code()), exc.Get_error_code()))


triple = MPI.DOUBLE.Create_contiguous(3).Commit()
column = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
a, b = np.arange(6.0) + r, np.zeros(6)
attempt("Allreduce SUM of a contiguous type", lambda: comm.Allreduce([a, 2, triple], [b, 2, triple], op=MPI.SUM))
attempt("Allreduce MAX of a vector type", lambda: comm.Allreduce([a, 1, column], [b, 1, column], op=MPI.MAX))
attempt("Reduce REPLACE of a vector type", lambda: comm.Reduce([a, 1, column], [b, 1, column], op=MPI.REPLACE))
attempt("Scan SUM of a vector type", lambda: comm.Scan([a, 1, column], [b, 1, column], op=MPI.SUM))
attempt("Allreduce in place of a contiguous type", lambda: comm.Allreduce(MPI.IN_PLACE, [b, 2, triple]))


def add(x, y, datatype):  # y += x, as doubles
    np.frombuffer(y, np.float64)[:] += np.frombuffer(x, np.float64)


plus = MPI.Op.Create(add, commute=True)
b[:] = 0
attempt("Allreduce of a contiguous type with a user op", lambda: comm.Allreduce([a, 2, triple], [b, 2, triple], op=plus))
print(r, "user op sum", b.tolist())
for t in (triple, column, plus):
    t.Free()
