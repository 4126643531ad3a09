"""Which block of a tensor does this rank hold? Row-major ranks, several mesh axes on one tensor dim."""
from spmdsim.layouts.layout import Layout
from spmdsim.tools.lab.calls import COLLECTIVES, ONE_SIDED, POINT_TO_POINT

TITLE = "Which block does this rank hold? A layout by hand"
FUNCTION = "my_block"
SIGNATURE = "my_block(comm, device_matrix, alias_names, tensor_map, shape)"
STATEMENT = """\
The ranks form a device matrix, e.g. device_matrix = (2, 2, 2) with alias_names ("dp", "sp", "mp"),
numbered row-major: the last axis varies fastest, rank = sum(coord[i] * stride[i]). A tensor of
`shape` is laid out by tensor_map, one entry per tensor dim: an alias (the dim is split over that
axis), None (not split), or a tuple of aliases (split over several axes, the first listed major:
for ("sp", "dp") the shard index is i_sp * |dp| + i_dp). Splits are even.

Return the block this rank (comm.Get_rank()) holds: one (start, stop) pair per tensor dim,
half-open. No communication is needed, and a communication call fails. spmdsim slices prints the
same table for a layout.
"""
FORBIDDEN = tuple(sorted(COLLECTIVES | POINT_TO_POINT | ONE_SIDED))
HINT = "each rank computes its own block from its rank"
RANKS = (1, 2, 3, 4, 8)
ALIASES = ("dp", "sp", "mp")
#: Each rank count's device matrix.
_DEVICES = {1: (1, 1, 1), 2: (2, 1, 1), 3: (3, 1, 1), 4: (2, 2, 1), 8: (2, 2, 2)}
#: The tensor maps of the two cases.
_MAPS = (("mp", ("sp", "dp")), (("mp", "dp"), None, "sp"))


def case(seed, n):
    devices = _DEVICES[n]
    tensor_map = _MAPS[seed % 2]
    size = dict(zip(ALIASES, devices))
    shape = []
    for k, entry in enumerate(tensor_map):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        parts = 1
        for axis in axes:
            parts *= size[axis]
        shape.append((4, 6, 3)[k] * parts)
    layout = Layout(devices, ALIASES)(*tensor_map)
    blocks = layout.rank_slices(tuple(shape))
    args = (devices, ALIASES, tensor_map, tuple(shape))
    return {"args": [args] * n, "expected": [[tuple(b) for b in blocks[r]] for r in range(n)],
            "label": f"device matrix {devices}, map {tensor_map}, shape {tuple(shape)}"}


def explain(case, n, rank, got):
    devices, aliases, tensor_map, shape = case["args"][rank]
    try:
        pairs = [tuple(int(v) for v in pair) for pair in got]
    except (TypeError, ValueError):
        return None
    swapped = [tuple(reversed(e)) if isinstance(e, tuple) else e for e in tensor_map]
    mirror = Layout(devices, aliases)(*swapped).rank_slices(tuple(shape))[rank]
    last_major = pairs == [tuple(b) for b in mirror]
    sizes = dict(zip(aliases, devices))
    coords, rest = {}, rank
    for name in aliases:  # this rank's coordinates, were the first axis the fastest
        coords[name], rest = rest % sizes[name], rest // sizes[name]
    other = 0
    for name in aliases:
        other = other * sizes[name] + coords[name]
    blocks = Layout(devices, aliases)(*tensor_map).rank_slices(tuple(shape))
    first_fastest = other != rank and pairs == [tuple(b) for b in blocks[other]]
    if last_major and first_fastest:  # either mistake gives this block: name both
        return (f"it is the block with the last-listed axis major, and rank {other}'s (the first axis fastest): "
                "in a tuple of axes the first listed is major; ranks are numbered row-major, the last axis fastest")
    if last_major:
        return "it is the block with the last-listed axis major: in a tuple of axes the first listed is major"
    if first_fastest:
        return (f"it is rank {other}'s block: ranks are numbered row-major, the last axis varying fastest, "
                "not the first")
    return None


def my_block(comm, device_matrix, alias_names, tensor_map, shape):
    rank = comm.Get_rank()
    coords, rest = {}, rank
    for name, size in reversed(list(zip(alias_names, device_matrix))):  # the last axis varies fastest
        coords[name], rest = rest % size, rest // size
    sizes = dict(zip(alias_names, device_matrix))
    block = []
    for length, entry in zip(shape, tensor_map):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        index, parts = 0, 1
        for axis in axes:  # the first listed is major
            index, parts = index * sizes[axis] + coords[axis], parts * sizes[axis]
        step = length // parts
        block.append((index * step, (index + 1) * step))
    return block
