"""Parallel I/O: a 2-D array's blocks written into one file through subarray views, read back by rows."""
import numpy as np

TITLE = "Parallel I/O: blocks into one file by views, rows read back"
FUNCTION = "blocks_to_rows"
SIGNATURE = "blocks_to_rows(comm, block, path)"
STATEMENT = """\
The ranks form a grid: rows, cols = MPI.Compute_dims(n, 2), and rank r sits at (i, j) =
divmod(r, cols). It holds the float64 block of shape (h, w) at block row i, block column j of an
array A of shape (H, W) = (rows*h, cols*w). Write A into the file `path` as one row-major array of
doubles (the bytes A.tofile(path) writes), then return rank r's rows of A read back from the file:
A[r*H//n:(r+1)*H//n, :], of shape (k, W).

Open the file on comm with MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR |
MPI.MODE_DELETE_ON_CLOSE). Place your block with a view, fh.Set_view(0, MPI.DOUBLE, sub), where
sub = MPI.DOUBLE.Create_subarray([H, W], [h, w], [i*h, j*w]).Commit(), and write it with one
collective fh.Write_all(block). Your rows were written by other ranks: MPI shows them to your read
after fh.Sync(), comm.Barrier(), fh.Sync(). Then set the plain view fh.Set_view(0, MPI.DOUBLE),
read your rows at their offset in doubles with fh.Read_at_all, and close the file. The data go
through the file alone, by its collective reads and writes: no other call that moves data is
allowed (a Barrier is).
"""
ALLOWED = ("Write_all", "Write_at_all", "Read_all", "Read_at_all")  # a file's collective writes and reads
REQUIRED = ("Set_view", "Write_all|Write_at_all", "Sync")
HINT = "one collective write through a subarray view puts each block's rows where they belong in the file"


def _dims(n):
    """MPI.Compute_dims(n, 2): the most balanced two factors, the larger first."""
    b = max(d for d in range(1, int(n ** 0.5) + 1) if n % d == 0)
    return n // b, b


def _rows(n, r, height):
    return r * height // n, (r + 1) * height // n


def case(seed, n):
    rng = np.random.default_rng(seed)
    rows, cols = _dims(n)
    h, w = (2, 3) if seed % 2 == 0 else (3, 2)
    a = rng.standard_normal((rows * h, cols * w))
    path = f"blocks-{seed}-{n}.bin"  # (each check runs in a folder of its own)
    args, expected = [], []
    for r in range(n):
        i, j = divmod(r, cols)
        args.append((a[i * h:(i + 1) * h, j * w:(j + 1) * w].copy(), path))
        first, last = _rows(n, r, rows * h)
        expected.append(a[first:last].copy())
    return {"args": args, "expected": expected, "label": f"grid {rows}x{cols}, blocks {h}x{w}"}


def _whole(case, n):
    """A, and the array a file holds where each rank wrote its block whole after the ranks before it."""
    rows, cols = _dims(n)
    blocks = [args[0] for args in case["args"]]
    a = np.block([[blocks[i * cols + j] for j in range(cols)] for i in range(rows)])
    return a, np.concatenate([b.ravel() for b in blocks]).reshape(a.shape)


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if not isinstance(got, np.ndarray):
        return None
    block = case["args"][rank][0]
    if got.shape == block.shape and np.allclose(got, block) and not (want.shape == block.shape
                                                                      and np.allclose(want, block)):
        return "this is the rank's own block: return the rows r*H//n to (r+1)*H//n of A, read back from the file"
    a, piled = _whole(case, n)
    first, last = _rows(n, rank, a.shape[0])
    if got.shape == want.shape and np.allclose(got, piled[first:last]) and not np.allclose(want, got):
        return ("the file holds the blocks one after another: write through the subarray view, which puts each "
                "of a block's rows into its row of A")
    if got.shape == want.shape and np.allclose(got, a.T.ravel().reshape(a.shape)[first:last]):
        return "the file holds A column by column: a row-major file is the subarray's default, MPI.ORDER_C"
    return None


def blocks_to_rows(comm, block, path):
    from mpi4py import MPI  # (here: `spmdsim lab list` loads every exercise, and needs no MPI)

    rows, cols = MPI.Compute_dims(comm.Get_size(), 2)
    i, j = divmod(comm.Get_rank(), cols)
    h, w = block.shape
    height, width = rows * h, cols * w
    fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_RDWR | MPI.MODE_DELETE_ON_CLOSE)
    sub = MPI.DOUBLE.Create_subarray([height, width], [h, w], [i * h, j * w]).Commit()
    fh.Set_view(0, MPI.DOUBLE, sub)
    fh.Write_all(np.ascontiguousarray(block))
    fh.Sync()
    comm.Barrier()
    fh.Sync()
    fh.Set_view(0, MPI.DOUBLE)
    first, last = _rows(comm.Get_size(), comm.Get_rank(), height)
    mine = np.empty((last - first, width))
    fh.Read_at_all(first * width, mine)
    fh.Close()
    sub.Free()
    return mine
