"""SUMMA: C = A @ B on a q x q grid of ranks, each block by broadcasts along its grid row and column."""
import numpy as np

TITLE = "SUMMA: C = A @ B on a q x q grid by row and column Bcasts"
FUNCTION = "summa"
SIGNATURE = "summa(comm, a, b)"
STATEMENT = """\
The n = q*q ranks form a q x q grid: rank r sits at row i, column j = divmod(r, q). A of shape
(q*m, q*k) and B of shape (q*k, q*p) are cut into q x q blocks; rank r holds a = A[i, j] (shape
(m, k)) and b = B[i, j] (shape (k, p)). Return its block of C = A @ B:
C[i, j] = sum over t of A[i, t] @ B[t, j], of shape (m, p).

SUMMA (van de Geijn and Watts) computes it in q rounds. Split comm into one communicator per grid
row (comm.Split(i, j)) and one per grid column (comm.Split(j, i)). In round t the rank in column t
of each grid row broadcasts its block of A over the row (Bcast, root t), the rank in row t of each
grid column broadcasts its block of B over the column (root t), and every rank adds the product
of the two blocks it received to its C block. Bcast is the only call that may move data; each
rank sends its own two blocks once (the check counts the bytes).
"""
ALLOWED = ("Bcast",)
REQUIRED = ("Split|Create_cart", "Bcast")
HINT = "broadcast A's blocks along the grid rows and B's along the grid columns, one round per t"
RANKS = (1, 4, 9, 16)


def _side(n):
    q = int(round(n ** 0.5))
    if q * q != n:
        raise ValueError(f"SUMMA runs on a square grid; {n} ranks is not a square")
    return q


def _blocks(x, q):
    """x cut into q x q blocks: [[x[i, j] for j] for i]."""
    return [np.hsplit(rows, q) for rows in np.vsplit(x, q)]


def case(seed, n):
    q = _side(n)
    rng = np.random.default_rng(seed)
    m, k, p = (2, 3, 2) if seed % 2 == 0 else (3, 2, 4)
    a, b = rng.standard_normal((q * m, q * k)), rng.standard_normal((q * k, q * p))
    ab, bb, cb = _blocks(a, q), _blocks(b, q), _blocks(a @ b, q)
    args = [(ab[i][j].copy(), bb[i][j].copy()) for i in range(q) for j in range(q)]
    expected = [cb[i][j].copy() for i in range(q) for j in range(q)]
    return {"args": args, "expected": expected, "label": f"grid {q}x{q}, blocks {m}x{k} @ {k}x{p}"}


def optimal_bytes(case, n):
    """Each rank is the root of one row Bcast (its a) and one column Bcast (its b)."""
    a, b = case["args"][0]
    return a.nbytes + b.nbytes if n > 1 else 0


def _wrong(case, n, rank):
    """The blocks a rank returns for the usual mistakes, with what each says."""
    q = _side(n)
    i, j = divmod(rank, q)
    a = [[case["args"][r * q + c][0] for c in range(q)] for r in range(q)]
    b = [[case["args"][r * q + c][1] for c in range(q)] for r in range(q)]
    yield (q * (a[i][j] @ b[i][j]), "this is q times this rank's own a @ b: each round multiplies the blocks the "
           "round's Bcasts gave (A[i, t] from the grid row, B[t, j] from the grid column)")
    for t in range(q):  # one round's product alone: returned inside the loop, or c = in place of c +=
        yield (a[i][t] @ b[t][j], f"this is round t = {t} alone: add the product of every round's blocks, t = 0 "
               "to q-1, into C")
    yield (sum(a[t][j] @ b[i][t] for t in range(q)), "A's blocks went along the grid columns and B's along the "
           "rows: rank (i, j) needs A[i, t], held by its grid row, and B[t, j], held by its grid column")


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if n == 1 or not isinstance(got, np.ndarray) or got.shape != want.shape or np.allclose(got, want):
        return None
    for block, said in _wrong(case, n, rank):
        if block.shape == got.shape and np.allclose(got, block) and not np.allclose(block, want):
            return said
    return None


def summa(comm, a, b):
    q = int(round(comm.Get_size() ** 0.5))
    i, j = divmod(comm.Get_rank(), q)
    row, col = comm.Split(i, j), comm.Split(j, i)  # rank j in its grid row, rank i in its grid column
    c = np.zeros((a.shape[0], b.shape[1]))
    for t in range(q):
        a_t = a.copy() if j == t else np.empty_like(a)
        b_t = b.copy() if i == t else np.empty_like(b)
        row.Bcast(a_t, root=t)
        col.Bcast(b_t, root=t)
        c += a_t @ b_t
    row.Free()
    col.Free()
    return c
