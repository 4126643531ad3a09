# One-sided communication on 4 ranks: fences, locks, post/start/complete/wait, every operation, derived
# datatypes on both sides, the four kinds of window, and MPI's errors. Each rank prints what it sees.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size

# Fence epochs on memory the ranks own: each rank puts its number into every rank's slot for it.
mem = np.full(n, -1, dtype="i")
win = MPI.Win.Create(mem, mem.itemsize, MPI.INFO_NULL, comm)
print(r, "flavor create", win.flavor == MPI.WIN_FLAVOR_CREATE, "model unified", win.model == MPI.WIN_UNIFIED,
      "attrs", win.attrs[1:], "base ok", win.Get_attr(MPI.WIN_BASE) == MPI.Get_address(mem))
win.Fence()
for t in range(n):
    win.Put(np.array([100 * r + t], "i"), t, r)
win.Fence()
print(r, "put", mem.tolist())
got = np.zeros(n, "i")
win.Get(got, (r + 1) % n)
win.Fence()
print(r, "get from", (r + 1) % n, got.tolist())
win.Accumulate(np.ones(n, "i"), 0, op=MPI.SUM)
win.Accumulate(np.full(n, 10 * r, "i"), 1, op=MPI.MAX)
win.Fence()
print(r, "accumulated", mem.tolist())
comm.Barrier()  # every rank has read its memory before the next epoch writes it
# A strided target (every other int of rank 0's, from the second) from a contiguous origin, and back.
vector = MPI.INT.Create_vector(2, 1, 2).Commit()
if r == 1:
    win.Put(np.array([7, 9], "i"), 0, [1, 1, vector])
win.Fence()
back = np.zeros(4, "i")
win.Get([back, 1, vector], 0, [0, 1, vector])  # rank 0's ints 0 and 2 into back[0] and back[2]
win.Fence(MPI.MODE_NOSUCCEED)
print(r, "vector", mem.tolist() if r == 0 else "", back.tolist())
vector.Free()
try:
    win.Put(np.zeros(1, "i"), 0)
except MPI.Exception as exc:
    print(r, "put outside an epoch:", exc.Get_error_class() == MPI.ERR_RMA_SYNC)
win.Free()
print(r, "freed", win == MPI.WIN_NULL)

# Passive target: a counter on rank 0 under exclusive locks; Compare_and_swap and Get_accumulate.
win = MPI.Win.Allocate(2 * 8 if r == 0 else 0, 8, MPI.INFO_NULL, comm)
if r == 0:
    np.frombuffer(win.tomemory(), "q")[:] = 0
comm.Barrier()
taken = []
for _ in range(3):
    old = np.zeros(1, "q")
    win.Lock(0)
    win.Fetch_and_op(np.ones(1, "q"), old, 0, 0, MPI.SUM)
    win.Unlock(0)
    taken.append(int(old[0]))
print(r, "counter values", sorted(sum(comm.allgather(taken), [])))
old = np.zeros(1, "q")
win.Lock(0, MPI.LOCK_EXCLUSIVE)
win.Compare_and_swap(np.array([r + 1], "q"), np.zeros(1, "q"), old, 0, 1)
win.Unlock(0)
winners = comm.allgather(int(old[0]) == 0)
print(r, "one swap wins", winners.count(True) == 1)
win.Lock_all()
result = np.zeros(2, "q")
win.Get_accumulate(np.zeros(2, "q"), result, 0, op=MPI.NO_OP)
win.Flush(0)
win.Unlock_all()
print(r, "counter and swapped", result.tolist()[0], result.tolist()[1] == 1 + winners.index(True))
win.Free()

# Post/Start/Complete/Wait: rank 0 exposes its window to the others, who each write their slot.
win = MPI.Win.Allocate(n * 4, 4, MPI.INFO_NULL, comm)
memory = np.frombuffer(win.tomemory(), "i")
memory[:] = 0
comm.Barrier()
group = comm.Get_group()
if r == 0:
    others = group.Excl([0])
    win.Post(others)
    win.Wait()
    print(r, "exposed, then", memory.tolist())
    others.Free()
else:
    zero = group.Incl([0])
    win.Start(zero)
    win.Put(np.array([r * r], "i"), 0, r)
    win.Complete()
    zero.Free()
group.Free()
win.Free()

# A shared window: every rank reads every other rank's part directly.
win = MPI.Win.Allocate_shared(8, 8, MPI.INFO_NULL, comm)
np.frombuffer(win.tomemory(), "d")[:] = r + 0.5
win.Fence()
parts = [float(np.frombuffer(win.Shared_query(q)[0], "d")[0]) for q in range(n)]
print(r, "shared parts", parts, "unit", win.Shared_query(0)[1])
win.Fence()
win.Free()

# A dynamic window: memory attached after creation, addressed by its absolute address.
win = MPI.Win.Create_dynamic(MPI.INFO_NULL, comm)
region = np.zeros(2, "d")
win.Attach(region)
addresses = comm.allgather(MPI.Get_address(region))
win.Fence()
win.Put(np.array([r + 0.25]), (r + 1) % n, addresses[(r + 1) % n] + 8)
win.Fence()
print(r, "dynamic", region.tolist())
win.Detach(region)
win.Free()
