"""MPI I/O's corners: MODE_APPEND's pointers, Iread past the end, views, seeks, split collectives, a closed file
and MODE_SEQUENTIAL, each as MPICH answers."""
import os
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
r = comm.rank
path = "edges.bin"
if r == 0 and os.path.exists(path):
    os.remove(path)
comm.Barrier()
out = []


def tryit(what, f, *a):
    try:
        res = f(*a)
        out.append(f"{what}: ok {res!r}" if res is not None else f"{what}: ok")
    except MPI.Exception as e:
        out.append(f"{what}: MPI {MPI.Get_error_string(e.Get_error_class()).split(',')[0].strip()}")
    except Exception as e:
        out.append(f"{what}: {type(e).__name__}")


fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
fh.Write_at_all(4 * r, np.array([r], dtype="i"))
fh.Close()
fh = MPI.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_APPEND)
out.append(f"append: pos {fh.Get_position()} shared {fh.Get_position_shared()} size {fh.Get_size()}")
fh.Close()
fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
tryit("zero count", fh.Read_at, 0, [np.zeros(2, dtype="i"), 0, MPI.INT])
tryit("typecode spec", fh.Read_at, 0, [np.zeros(2, dtype="i"), "i"])
tryit("seek bad whence", fh.Seek, 0, 99)
tryit("seek negative", fh.Seek, -1, MPI.SEEK_SET)
tryit("view negative disp", fh.Set_view, -4, MPI.INT)
st = MPI.Status()
buf = np.zeros(3, dtype="i")
req = fh.Iread(buf)
req.Wait(st)
out.append(f"iread count {st.Get_count(MPI.INT)} {buf.tolist()} pos {fh.Get_position()}")
tryit("byte offset", fh.Get_byte_offset, 3)
tryit("type extent", fh.Get_type_extent, MPI.DOUBLE)
tryit("group size", lambda: (fh.group_size, fh.group_rank))
tryit("split twice", lambda: (fh.Read_all_begin(np.zeros(1, dtype="i")), fh.Read_all_begin(np.zeros(1, dtype="i"))))
fh.Close()
tryit("close twice", fh.Close)
tryit("bool after close", lambda: bool(fh))
tryit("eq null", lambda: fh == MPI.FILE_NULL)
tryit("sequential rdwr", MPI.File.Open, comm, path, MPI.MODE_RDWR | MPI.MODE_SEQUENTIAL)
fs = MPI.File.Open(comm, path, MPI.MODE_WRONLY | MPI.MODE_SEQUENTIAL)
tryit("sequential write_at", fs.Write_at, 0, np.zeros(1, dtype="i"))
tryit("sequential iwrite", lambda: fs.Iwrite(np.zeros(1, dtype="i")).Wait())
tryit("sequential write_shared", fs.Write_shared, np.zeros(1, dtype="i"))
fs.Close()
comm.Barrier()
if r == 0:
    os.remove(path)
for line in out:
    print(f"{r}: {line}")
