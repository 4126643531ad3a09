"""2-D halo exchange on a periodic Cartesian grid of ranks."""
import numpy as np

from spmdsim.tools.lab.calls import COLLECTIVES

TITLE = "2-D halo exchange on a periodic Cartesian grid"
FUNCTION = "halo_exchange"
SIGNATURE = "halo_exchange(comm, block)"
STATEMENT = """\
The ranks form a periodic 2-D grid: dims = MPI.Compute_dims(n, 2) and
cart = comm.Create_cart(dims, periods=[True, True]). Rank r sits at cart.Get_coords(r) = (i, j)
(row-major: r = i * dims[1] + j) and holds a float64 block of shape (h, w) of a global array.

Return the block with a halo one cell wide: an array of shape (h + 2, w + 2) whose inside
[1:-1, 1:-1] is the block; row 0 (columns 1..w) the last row of the neighbour above (i - 1, j);
row h + 1 the first row of the neighbour below (i + 1, j); column 0 (rows 1..h) the last column
of the neighbour on the left (i, j - 1); column w + 1 the first column of the neighbour on the
right (i, j + 1). Neighbours wrap around the grid; the four corners stay 0.

cart.Shift(0, 1) gives (above, below), cart.Shift(1, 1) gives (left, right); exchange with
cart.Sendrecv (a column needs a contiguous copy). Collectives are not allowed (a Barrier is).
"""
FORBIDDEN = tuple(sorted(COLLECTIVES))
REQUIRED = ("Create_cart",)
HINT = "exchange the edges with the four neighbours by Sendrecv (cart.Shift names them)"


def _dims(n):
    """MPI.Compute_dims(n, 2): the most balanced two factors, the larger first."""
    b = max(d for d in range(1, int(n ** 0.5) + 1) if n % d == 0)
    return n // b, b


def case(seed, n):
    rng = np.random.default_rng(seed)
    rows, cols = _dims(n)
    h, w = (3, 4) if seed % 2 == 0 else (5, 2)
    whole = rng.standard_normal((rows * h, cols * w))
    wrapped = np.pad(whole, 1, mode="wrap")
    args, expected = [], []
    for r in range(n):
        i, j = divmod(r, cols)
        args.append((whole[i * h:(i + 1) * h, j * w:(j + 1) * w].copy(),))
        padded = wrapped[i * h:(i + 1) * h + 2, j * w:(j + 1) * w + 2].copy()
        padded[[0, 0, -1, -1], [0, -1, 0, -1]] = 0.0
        expected.append(padded)
    return {"args": args, "expected": expected, "label": f"grid {rows}x{cols}, blocks {h}x{w}"}


def optimal_bytes(case, n):
    rows, cols = _dims(n)
    h, w = case["args"][0][0].shape
    return (2 * w * 8 if rows > 1 else 0) + (2 * h * 8 if cols > 1 else 0)


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        return None
    corners = np.zeros(want.shape, dtype=bool)
    corners[[0, 0, -1, -1], [0, -1, 0, -1]] = True
    if np.allclose(got[~corners], want[~corners]) and not np.allclose(got[corners], 0):
        return ("only the four corners differ: they stay 0 (a rank exchanges its edges with the four neighbours "
                "above, below, left and right, not the diagonal ones)")
    if np.allclose(got[1:-1, 1:-1], want[1:-1, 1:-1]) and np.allclose(got[0, 1:-1], want[-1, 1:-1]) \
            and not np.allclose(got[0, 1:-1], want[0, 1:-1]):
        return "row 0 holds what row h + 1 should: the rows above and below are swapped"
    rows_right = np.allclose(got[[0, -1], 1:-1], want[[0, -1], 1:-1])
    if rows_right and np.allclose(got[1:-1, [0, -1]], 0) and not np.allclose(want[1:-1, [0, -1]], 0):
        return "columns 0 and w + 1 are still 0: exchange with the left and right neighbours too"
    edges = {"top": (got[0, 1:-1], want[0, 1:-1]), "bottom": (got[-1, 1:-1], want[-1, 1:-1]),
             "left": (got[1:-1, 0], want[1:-1, 0]), "right": (got[1:-1, -1], want[1:-1, -1])}
    zero = [side for side, (g, w) in edges.items() if np.allclose(g, 0) and not np.allclose(w, 0)]
    if 0 < len(zero) < 4:
        return (f"the {' and '.join(zero)} halo is 0 where the grid ends: the neighbours wrap around "
                "(periods=[True, True])")
    if len(zero) == 4 and np.allclose(got[1:-1, 1:-1], want[1:-1, 1:-1]):
        return ("the whole halo is still 0: no neighbour's edge arrived (the grid wraps around, "
                "periods=[True, True]: on a 1-wide side a rank is its own neighbour)")
    return None


def halo_exchange(comm, block):
    dims = _dims(comm.Get_size())  # MPI.Compute_dims(n, 2)
    cart = comm.Create_cart(dims, periods=[True, True])
    h, w = block.shape
    out = np.zeros((h + 2, w + 2))
    out[1:-1, 1:-1] = block
    above, below = cart.Shift(0, 1)
    left, right = cart.Shift(1, 1)
    row = np.empty(w)
    cart.Sendrecv(block[-1].copy(), dest=below, recvbuf=row, source=above)
    out[0, 1:-1] = row
    cart.Sendrecv(block[0].copy(), dest=above, recvbuf=row, source=below)
    out[-1, 1:-1] = row
    col = np.empty(h)
    cart.Sendrecv(block[:, -1].copy(), dest=right, recvbuf=col, source=left)
    out[1:-1, 0] = col
    cart.Sendrecv(block[:, 0].copy(), dest=left, recvbuf=col, source=right)
    out[1:-1, -1] = col
    return out
