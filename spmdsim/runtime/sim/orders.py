"""The association MPICH 5 gives a reduction of floating-point values, so that simulated ranks print its digits.

Sums of floating-point values depend on their association: MPICH's ``cpi`` on 4 ranks
prints pi as 3.1415926535981167, the members added in rank order 3.1415926535981171.
MPICH 5 reduces a commutative predefined op (MPI.SUM, PROD, MAX, MIN) on one node
as measured with mpi4py 4.1.2 at 3, 4, 5 and 6 ranks, bit for bit, at 512 bytes and
at 256 KiB (tests/test_sim_mpi4py_orders.py compares with ``mpiexec``):

* ``Reduce``: a binomial tree over the ranks relative to the root: at each step
  ``mask`` (1, 2, 4, ...) a relative rank without that bit takes the one ``mask``
  above it: (0+1)+2 at 3 ranks, ((0+1)+(2+3))+4 at 5;
* ``Allreduce``: recursive doubling, the ranks past the largest power of two
  first folded into their even neighbours: (0+1)+2 at 3 ranks, ((0+1)+2)+(3+4) at 5.

Each is a tree of nested pairs of member indices (`fold` in spmdsim.runtime.sim._reductions
evaluates it); the emulator's Reduce and Allreduce pass them (spmdsim's own meshes
keep adding in member order).
"""
from __future__ import annotations

import functools
from typing import Any

__all__ = ["reduce_tree", "allreduce_tree"]


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


@functools.lru_cache(maxsize=None)
def allreduce_tree(size: int) -> Any:
    """MPICH's recursive-doubling Allreduce over `size` members, as nested pairs of member indices."""
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    nodes: list = [(2 * i, 2 * i + 1) for i in range(rem)] + list(range(2 * rem, size))
    while len(nodes) > 1:
        nodes = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes), 2)]
    return nodes[0]
