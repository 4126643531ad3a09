from mpi4py import MPI

counter = 0

def work(comm):
    global counter
    counter += 1
    return comm.allreduce(comm.rank)

def main():
    comm = MPI.COMM_WORLD
    total = work(comm)
    print(f"rank {comm.rank}: total {total} counter {counter} name {__name__}")

if __name__ == "__main__":
    main()
