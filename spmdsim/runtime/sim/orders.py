"""The association MPICH 5 gives a reduction of floating-point values, so that simulated ranks print its digits.

Sums of floating-point values depend on their association: MPICH's ``cpi`` on 4 ranks
prints pi as 3.1415926535981167, the members added in rank order 3.1415926535981171.
MPICH 5 reduces a commutative predefined op (MPI.SUM, PROD, MAX, MIN) on one node
as measured with mpi4py 4.1.2 at 3, 4, 5 and 6 ranks, bit for bit, at 512 bytes and
at 256 KiB (tests/test_sim_mpi4py_orders.py compares with ``mpiexec``):

* ``Reduce`` of 2 KiB or less, or of fewer items than the largest power of two of ranks: a
  binomial tree over the ranks relative to the root: at each step ``mask`` (1, 2, 4, ...) a
  relative rank without that bit takes the one ``mask`` above it: (0+1)+2 at 3 ranks,
  ((0+1)+(2+3))+4 at 5; a longer one: a reduce-scatter and gather, associated as ``Allreduce``,
  whatever the root (`reduce_order`);
* ``Allreduce``: recursive doubling, the ranks past the largest power of two
  first folded into their even neighbours: (0+1)+2 at 3 ranks, ((0+1)+2)+(3+4) at 5;
* ``Scan`` and ``Exscan``: recursive doubling, as mpi4py's ``scan`` below (`scan_trees`);
* ``Reduce_scatter`` and ``Reduce_scatter_block`` (`reduce_scatter_order`): under 512 KiB in
  all, recursive halving, the ranks past the largest power of two first folded into their odd
  neighbours, then the partners from the farthest in: ((0+2)+(1+3)) at 4 ranks; from 512 KiB,
  pairwise, each rank adding the others' blocks from the one before it down: ((3+2)+1)+0 on rank 3.

Each is a tree of nested pairs of member indices (`fold` in spmdsim.runtime.sim._reductions
evaluates it); the emulator's Reduce, Allreduce, Scan and Exscan pass them (spmdsim's own
meshes keep adding in member order).

mpi4py's object reductions (lowercase ``reduce``, ``allreduce``, ``scan``, ``exscan``) apply the op
to Python objects in mpi4py's own point-to-point trees, whatever the MPI library:

* ``reduce`` to any root and ``allreduce``: the binomial tree to rank 0 above (`reduce_tree`), the
  result then sent to the root or broadcast;
* ``scan`` and ``exscan``: recursive doubling, each rank taking its partner's partial sum at each
  ``mask`` (`scan_trees`): rank 3 of 4 gets (0+1)+(2+3), not ((0+1)+2)+3.

`evaluate` applies an op in a tree's association, to arrays (`fold` in spmdsim.runtime.sim._reductions)
or to objects.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["evaluate", "reduce_tree", "allreduce_tree", "reduce_order", "scan_trees", "reduce_scatter_order",
           "REDSCAT_LONG_BYTES", "REDUCE_SHORT_BYTES"]

#: MPICH's MPIR_CVAR_REDUCE_SHORT_MSG_SIZE: a Reduce of more bytes than this, and of at least as many items as the
#: largest power of two of ranks, runs as a reduce-scatter and gather (Rabenseifner's).
REDUCE_SHORT_BYTES = 2048

#: MPICH's MPIR_CVAR_REDSCAT_COMMUTATIVE_LONG_MSG_SIZE: a Reduce_scatter of this many bytes or more (every block
#: together) runs pairwise, a shorter one by recursive halving.
REDSCAT_LONG_BYTES = 524288


def evaluate(op: Callable[[Any, Any], Any], items: list, tree: Any) -> Any:
    """`op` applied to `items` in `tree`'s association (nested pairs of indices into `items`)."""
    if type(tree) is int:
        return items[tree]
    return op(evaluate(op, items, tree[0]), evaluate(op, items, tree[1]))


@functools.lru_cache(maxsize=None)
def reduce_tree(size: int, root: int = 0) -> Any:
    """MPICH's binomial Reduce to `root` over `size` members, as nested pairs of member indices."""
    trees: list = [(rel + root) % size for rel in range(size)]
    mask = 1
    while mask < size:
        for rel in range(0, size, 2 * mask):
            if rel + mask < size:
                trees[rel] = (trees[rel], trees[rel + mask])
        mask *= 2
    return trees[0]


def reduce_order(size: int, root: int, count: int, nbytes: int) -> Any:
    """MPICH's association of a Reduce to `root` of `count` items (`nbytes`) over `size` members: `reduce_tree`, or
    for a long one `allreduce_tree` (its reduce-scatter halves from the nearest partner out, as Allreduce's)."""
    if nbytes > REDUCE_SHORT_BYTES and count >= 1 << (size.bit_length() - 1):
        return allreduce_tree(size)
    return reduce_tree(size, root)


@functools.lru_cache(maxsize=None)
def allreduce_tree(size: int) -> Any:
    """MPICH's recursive-doubling Allreduce over `size` members, as nested pairs of member indices."""
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    nodes: list = [(2 * i, 2 * i + 1) for i in range(rem)] + list(range(2 * rem, size))
    while len(nodes) > 1:
        nodes = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes), 2)]
    return nodes[0]


@functools.lru_cache(maxsize=None)
def scan_trees(size: int, exclusive: bool = False) -> tuple:
    """mpi4py's recursive-doubling scan (exscan if `exclusive`) over `size` members: each member's result as
    nested pairs of member indices (None for member 0's exscan)."""
    partial: list = list(range(size))
    result: list = [None] * size if exclusive else list(range(size))
    mask = 1
    while mask < size:
        before = list(partial)
        for me in range(size):
            other = me ^ mask
            if other >= size:
                continue
            if me > other:
                partial[me] = (before[other], before[me])
                result[me] = before[other] if result[me] is None else (before[other], result[me])
            else:
                partial[me] = (before[me], before[other])
        mask *= 2
    return tuple(result)


def reduce_scatter_order(size: int, me: int, nbytes: int) -> tuple:
    """(order, tree): how MPICH's Reduce_scatter of `nbytes` in all over `size` members folds member `me`'s block:
    the members' parts taken in `order`, associated as `tree` (nested pairs of indices into `order`; None: left to
    right, as the pairwise exchange adds them one at a time)."""
    if nbytes >= REDSCAT_LONG_BYTES:
        return [(me - i) % size for i in range(size)], None
    return list(range(size)), _halving_trees(size)[me]


@functools.lru_cache(maxsize=None)
def _halving_trees(size: int) -> tuple:
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    nodes: list = [(2 * i, 2 * i + 1) for i in range(rem)] + list(range(2 * rem, size))
    mask = pof2 // 2
    while mask:
        nodes = [(nodes[j], nodes[j ^ mask]) for j in range(pof2)]
        mask //= 2
    return tuple(nodes[me // 2 if me < 2 * rem else me - rem] for me in range(size))
