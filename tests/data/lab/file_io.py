"""MPI I/O on 4 ranks: interleaved views, every way to place data, the pointers, a read past the end, errors."""
import numpy as np

from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
say = []

# Rank r owns ints r, r + n, r + 2n, ... of the file: a vector view (one int, every n-th), written collectively.
fh = MPI.File.Open(comm, "ints.bin", MPI.MODE_CREATE | MPI.MODE_RDWR | MPI.MODE_DELETE_ON_CLOSE)
every = MPI.INT.Create_vector(1, 1, n).Create_resized(0, 4 * n).Commit()
fh.Set_view(4 * r, MPI.INT, every)
fh.Write_all(np.arange(5, dtype="i") * n + r)
offset, etype, ftype, rep = fh.Get_view()
say.append(f"view at {offset}, etype {etype.Get_size()} bytes, filetype extent {ftype.Get_extent()[1]}, {rep}")
say.append(f"position {fh.Get_position()}, byte offset of etype 2: {fh.Get_byte_offset(2)}")
fh.Set_view(0, MPI.INT)
whole = np.full(4 * n + 2, -1, dtype="i")
status = MPI.Status()
fh.Read_at_all(0, whole, status)  # 4n + 2 asked for, 5n in the file
say.append(f"read {status.Get_count(MPI.INT)} ints: {whole.tolist()}")

# Past the end: a read from 2 before it gets 2, the status says so, the rest of the buffer is untouched.
fh.Seek(-2, MPI.SEEK_END)
tail = np.full(4, -1, dtype="i")
fh.Read(tail, status)
say.append(f"from 2 before the end: {tail.tolist()}, count {status.Get_count(MPI.INT)}, size {fh.Get_size()}")

# Rank order from the shared pointer, then nonblocking reads at explicit offsets.
fh.Seek_shared(0, MPI.SEEK_END)
fh.Write_ordered(np.full(r + 1, 100 + r, dtype="i"))
fh.Sync()  # the others' writes are seen after sync, barrier, sync (MPI's nonatomic mode)
comm.Barrier()
fh.Sync()
req = fh.Iread_at(5 * n, np.empty(0, dtype="i"))
req.Wait()
mine = np.full(2, -1, dtype="i")
fh.Iread_at(5 * n + r * (r + 1) // 2, mine).Wait(status)
shared = fh.Get_position_shared()
say.append(f"ordered: mine begin {mine.tolist()}, shared at {shared}, count {status.Get_count(MPI.INT)}")
fh.Preallocate(4)
fh.Set_atomicity(True)
say.append(f"size {fh.Get_size()}, atomic {fh.Get_atomicity()}, amode {fh.Get_amode()}")
fh.Close()
every.Free()

# Errors, in MPI's classes.
for what, call in (("missing file", lambda: MPI.File.Open(comm, "missing.bin", MPI.MODE_RDONLY)),
                   ("two access modes", lambda: MPI.File.Open(comm, "x.bin", MPI.MODE_RDONLY | MPI.MODE_WRONLY)),
                   ("delete a missing file", lambda: MPI.File.Delete("missing.bin"))):
    try:
        call()
        say.append(f"{what}: no error")
    except MPI.Exception as exc:
        say.append(f"{what}: {MPI.Get_error_string(exc.Get_error_class()).split(',')[0]}")
made = MPI.File.Open(comm, "made.bin", MPI.MODE_CREATE | MPI.MODE_WRONLY)
made.Close()
ro = MPI.File.Open(comm, "made.bin", MPI.MODE_RDONLY)
try:
    ro.Write_at(0, np.zeros(1))
except MPI.Exception as exc:
    say.append(f"a write to a read-only file: {MPI.Get_error_string(exc.Get_error_class()).split(',')[0]}")
ro.Close()
comm.Barrier()
if r == 0:
    MPI.File.Delete("made.bin")
for line in say:
    print(f"rank {r}: {line}")
