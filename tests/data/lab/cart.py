# A 2-D grid: Compute_dims, Create_cart (periodic rows), Shift, Sub, and a halo exchange with sendrecv.
from mpi4py import MPI

comm = MPI.COMM_WORLD
dims = MPI.Compute_dims(comm.size, 2)
cart = comm.Create_cart(dims, periods=[True, False], reorder=False)
coords = cart.Get_coords(cart.rank)
src, dst = cart.Shift(0, 1)
left, right = cart.Shift(1, 1)
val = cart.sendrecv(cart.rank, dest=dst, source=src)
edge = cart.sendrecv(cart.rank, dest=right, source=left)  # MPI.PROC_NULL past the edge: None
row = cart.Sub([False, True])
print(f"rank {cart.rank} dims {dims} coords {coords} shift0 {src},{dst} shift1 {left},{right} got {val} {edge} "
      f"row {row.rank}/{row.size} topo {cart.Get_topo()} cart_rank {cart.Get_cart_rank(coords)} ndim {cart.ndim} "
      f"{isinstance(cart, MPI.Cartcomm)} {cart.topology == MPI.CART}")
