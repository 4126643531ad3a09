"""The 1F1B pipeline schedule: the order of forward and backward passes on each of p stages."""
from spmdsim.tools.lab.calls import COLLECTIVES, ONE_SIDED, POINT_TO_POINT

TITLE = "The 1F1B pipeline schedule for p stages and m microbatches"
FUNCTION = "one_f_one_b"
SIGNATURE = "one_f_one_b(comm, m)"
STATEMENT = """\
A model is cut into p pipeline stages, one per rank (p = comm.Get_size(); rank r runs stage r), and
a batch into m microbatches 0, 1, ..., m-1. Return the list of passes stage r runs, in order, as
tuples ("F", i) (the forward of microbatch i) and ("B", i) (its backward), following 1F1B
(one forward, one backward; PipeDream-Flush, Megatron's schedule without interleaving):

1. warm-up: min(p - r - 1, m) forwards;
2. steady state: while forwards remain, one forward then one backward;
3. cool-down: the backwards left.

Forwards and backwards each run in microbatch order. The last stage alternates from the start; the
first keeps p - 1 microbatches in flight. Every rank gets the same m (which may be less than p).
No communication is needed: each rank computes its own list, and a communication call fails.
"""
FORBIDDEN = tuple(sorted(COLLECTIVES | POINT_TO_POINT | ONE_SIDED))
HINT = "each rank computes its own schedule from p, r and m"


def _schedule(p, r, m):
    warm = min(p - r - 1, m)
    order = [("F", i) for i in range(warm)]
    forward, backward = warm, 0
    while forward < m:
        order += [("F", forward), ("B", backward)]
        forward, backward = forward + 1, backward + 1
    return order + [("B", i) for i in range(backward, m)]


def case(seed, n):
    m = (2, 5)[seed % 2]
    return {"args": [(m,)] * n, "expected": [_schedule(n, r, m) for r in range(n)], "label": f"m={m}"}


def explain(case, n, rank, got):
    m, want = case["args"][rank][0], case["expected"][rank]
    try:
        passes = [(str(kind), int(i)) for kind, i in got]
    except (TypeError, ValueError):
        return None
    if any(kind == "F" and i >= m for kind, i in passes):
        return f"there is no microbatch {m} (m={m}): the warm-up runs min(p - r - 1, m) forwards, at most m"

    def leading(order):
        return next((k for k, (kind, _) in enumerate(order) if kind != "F"), len(order))

    gpipe, one_more = leading(passes) == m > leading(want), leading(passes) == leading(want) + 1
    if gpipe and one_more:  # m forwards, one more than the warm-up's: either mistake makes this schedule
        return (f"one forward too many before the first backward (stage {rank}'s warm-up is min(p - r - 1, m)), "
                "or every forward before every backward, GPipe's order: here the two look the same")
    if gpipe:
        return "every forward, then every backward, is GPipe's order: 1F1B starts backwards after the warm-up"
    if one_more:
        return f"one forward too many before the first backward: stage {rank}'s warm-up is min(p - r - 1, m)"
    return None


def one_f_one_b(comm, m):
    p, r = comm.Get_size(), comm.Get_rank()
    warm = min(p - r - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", i) for i in range(m - warm, m)]
