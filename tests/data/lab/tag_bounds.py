# Tags past MPI.TAG_UB: MPICH refuses them on both sides (Invalid tag), mpi4py past a C int (OverflowError).
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
ub = comm.Get_attr(MPI.TAG_UB)
for name, call in [("send", lambda: comm.send(1, dest=comm.rank ^ 1, tag=ub + 1)),
                   ("Isend", lambda: comm.Isend(np.ones(1), dest=comm.rank ^ 1, tag=ub + 1)),
                   ("recv", lambda: comm.recv(source=comm.rank ^ 1, tag=ub + 1)),
                   ("Sendrecv", lambda: comm.Sendrecv(np.ones(1), dest=MPI.PROC_NULL, sendtag=2**40,
                                                      recvbuf=np.ones(1), source=MPI.PROC_NULL)),
                   ("Iprobe", lambda: comm.Iprobe(source=0, tag=ub + 1))]:
    try:
        call()
        print(comm.rank, name, "ran")
    except MPI.Exception as e:
        print(comm.rank, name, "MPI.Exception", e.Get_error_class() == MPI.ERR_TAG)
    except OverflowError as e:
        print(comm.rank, name, "OverflowError")
r = comm.isend(comm.rank, dest=comm.rank ^ 1, tag=ub)
print(comm.rank, "ub", comm.recv(source=comm.rank ^ 1, tag=ub))
r.wait()
