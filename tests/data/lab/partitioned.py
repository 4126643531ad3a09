# Partitioned point-to-point (MPI 4.0) on 4 ranks: each rank sends to the next in a ring, partition by partition,
# with the receiver's partitions counted otherwise than the sender's; MPI's errors. Each rank prints what it sees.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
right, left = (r + 1) % n, (r - 1) % n

# Four partitions of 3 doubles each way, three rounds on the same two requests.
send = np.zeros(12)
recv = np.full(12, -1.0)
sreq = comm.Psend_init(send, 4, right, tag=7)
rreq = comm.Precv_init(recv, 4, left, tag=7)
print(r, "inactive", bool(sreq), sreq != MPI.REQUEST_NULL, rreq.Parrived(0), rreq.Test())
for round_ in range(3):
    rreq.Start()
    before = [rreq.Parrived(i) for i in range(4)]
    comm.Barrier()
    sreq.Start()
    send[:] = 100 * r + 10 * round_ + np.arange(12) // 3
    for i in (2, 0, 3, 1):  # any order
        sreq.Pready(i)
    comm.Barrier()
    arrived = []
    for i in range(4):
        while not rreq.Parrived(i):
            pass
        arrived.append(rreq.Parrived(i))
    status = MPI.Status()
    rreq.Wait(status)
    sreq.Wait()
    print(r, "round", round_, "before", before, "arrived", arrived, "got", recv.tolist(),
          "source", status.Get_source(), "tag", status.Get_tag(), "count", status.Get_count(MPI.DOUBLE))
    comm.Barrier()
sreq.Free()
rreq.Free()
print(r, "freed", sreq == MPI.REQUEST_NULL, rreq == MPI.REQUEST_NULL)

# The sender's 2 partitions against the receiver's 4 (and the other way round): a receive partition has
# arrived when the send partitions that cover it are ready.
send = np.arange(8, dtype="i") + 10 * r
recv = np.full(8, -1, dtype="i")
sreq = comm.Psend_init(send, 2 if r % 2 == 0 else 4, right, tag=1)
rreq = comm.Precv_init(recv, 4 if left % 2 == 0 else 2, left, tag=1)
rreq.Start()
sreq.Start()
sreq.Pready(0)
sreq.Pready_range(1, (2 if r % 2 == 0 else 4) - 1)
parts = 4 if left % 2 == 0 else 2
for i in reversed(range(parts)):
    while not rreq.Parrived(i):
        pass
MPI.Request.Waitall([rreq, sreq])
print(r, "sends in", 2 if r % 2 == 0 else 4, "partitions, receives in", parts, "what", left, "sends in",
      2 if left % 2 == 0 else 4, "got", recv.tolist())
sreq.Free()
rreq.Free()

# Pready_list, and a ring of requests started together with Startall.
send = np.full(6, r, dtype="i8")
recv = np.zeros(6, dtype="i8")
reqs = [comm.Precv_init(recv, 3, left, tag=2), comm.Psend_init(send, 3, right, tag=2)]
MPI.Prequest.Startall(reqs)
reqs[1].Pready_list([2, 1])
reqs[1].Pready_list([0])
MPI.Request.Waitall(reqs)
print(r, "pready_list", recv.tolist())

# MPI's errors (MPICH's classes): a partition out of range, Pready on a receive, Parrived on a send, a
# partitioned receive from MPI.ANY_SOURCE, zero partitions.
NAMES = {MPI.ERR_OTHER: "ERR_OTHER", MPI.ERR_REQUEST: "ERR_REQUEST", MPI.ERR_RANK: "ERR_RANK", MPI.ERR_ARG: "ERR_ARG"}
MPI.Prequest.Startall(reqs)
for what, call in (("Pready(3) of 3", lambda: reqs[1].Pready(3)), ("Pready(-1)", lambda: reqs[1].Pready(-1)),
                   ("Pready_range(1, 5)", lambda: reqs[1].Pready_range(1, 5)),
                   ("Pready on a receive", lambda: reqs[0].Pready(0)), ("Parrived on a send", lambda: reqs[1].Parrived(0)),
                   ("Precv_init from ANY_SOURCE", lambda: comm.Precv_init(recv, 3, MPI.ANY_SOURCE, 2)),
                   ("Psend_init in 0 partitions", lambda: comm.Psend_init(send, 0, right, 2))):
    try:
        call()
        print(r, what, "no error")
    except MPI.Exception as exc:
        print(r, what, NAMES.get(MPI.Get_error_class(exc.Get_error_code()), exc.Get_error_code()))
reqs[1].Pready_range(0, 2)
MPI.Request.Waitall(reqs)
for req in reqs:
    req.Free()
comm.Barrier()
print(r, "done")
