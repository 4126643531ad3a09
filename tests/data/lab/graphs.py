# Graph and distributed-graph topologies on 4 ranks: queries and neighbour collectives. MPI: each rank prints.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
# A general graph of 3 nodes (rank 3 is left out): 0 - 1 twice (a multigraph), 1 - 2, 2 - 0.
index, edges = [3, 6, 8], [1, 2, 1, 0, 2, 0, 1, 0]
print(r, "graph_map", comm.Graph_map(index, edges) == MPI.UNDEFINED or comm.Graph_map(index, edges))
graph = comm.Create_graph(index, edges)
if graph == MPI.COMM_NULL:
    print(r, "graph: none")
else:
    g = graph.rank
    print(r, "graph", graph.topology == MPI.GRAPH, graph.Get_dims(), graph.Get_topo(), graph.neighbors,
          [graph.Get_neighbors_count(i) for i in range(3)], graph.inoutedges)
    k = graph.nneighbors
    got = np.full(k, -1.0)
    graph.Neighbor_allgather(np.array([float(g)]), got)
    print(r, "graph allgather", got.tolist())
    got = np.full(k, -1.0)
    graph.Neighbor_alltoall(np.arange(k, dtype=float) + 10 * g, got)  # block i goes to neighbors[i]
    print(r, "graph alltoall", got.tolist())
    counts = [i + 1 for i in range(k)]
    send = np.arange(sum(counts), dtype=np.int64) + 100 * g
    # From the k-th edge to s, s's block for its k-th edge to this rank: 1 + that block's position among its own.
    rcounts = [1 + [j for j, e in enumerate(graph.Get_neighbors(s)) if e == g][graph.neighbors[:i].count(s)]
               for i, s in enumerate(graph.neighbors)]
    got = np.full(sum(rcounts), -1, dtype=np.int64)
    graph.Neighbor_alltoallv([send, counts, list(np.cumsum([0] + counts[:-1])), MPI.INT64_T],
                             [got, rcounts, list(np.cumsum([0] + rcounts[:-1])), MPI.INT64_T])
    print(r, "graph alltoallv", got.tolist())
    print(r, "graph objects", graph.neighbor_allgather(g), graph.neighbor_alltoall([f"{g}>{i}" for i in range(k)]))
    graph.Free()
# A directed ring of distances 1 and 2, weighted.
sources, destinations = [(r - 1) % n, (r - 2) % n], [(r + 1) % n, (r + 2) % n]
dist = comm.Create_dist_graph_adjacent(sources, destinations, [1, 2], [3, 4])
print(r, "adjacent", dist.topology == MPI.DIST_GRAPH, dist.Get_dist_neighbors_count(), dist.Get_dist_neighbors())
got = np.full(2, -1.0)
dist.Neighbor_alltoall(np.array([100.0 * r + 1, 100.0 * r + 2]), got)
print(r, "adjacent alltoall", got.tolist())
got = np.full(2, -1)
dist.Ineighbor_allgather(np.array([r]), got).Wait()
print(r, "adjacent iallgather", got.tolist())
print(r, "adjacent objects", dist.neighbor_alltoall([(r, "to", d) for d in destinations]))
dist.Free()
# Edges given by other ranks: rank r gives r+1 -> r and r -> r+3, and rank 0 also 2 -> 2.
if r == 0:
    dist = comm.Create_dist_graph([(r + 1) % n, r, 2], [1, 1, 1], [r, (r + 3) % n, 2])
else:
    dist = comm.Create_dist_graph([(r + 1) % n, r], [1, 1], [r, (r + 3) % n])
# The order of a rank's neighbours here is not the standard's to say (MPICH takes them as they arrive): sorted.
ins, outs, _ = dist.Get_dist_neighbors()
print(r, "dist", dist.Get_dist_neighbors_count(), sorted(ins), sorted(outs))
got = np.full(len(ins), -1)
dist.Neighbor_alltoall(np.array([1000 * r + d for d in outs], dtype=np.int64), got)  # from s to d: 1000 s + d
print(r, "dist alltoall", sorted(got.tolist()))
dist.Free()
empty = comm.Create_dist_graph_adjacent([], [], MPI.WEIGHTS_EMPTY, MPI.WEIGHTS_EMPTY)
print(r, "empty", empty.Get_dist_neighbors_count(), empty.Get_dist_neighbors(), empty.neighbor_allgather(r))
empty.Free()
