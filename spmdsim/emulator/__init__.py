"""The mpi4py emulator: users' own mpi4py programs on simulated ranks, in one process (docs/howto/simulate.md).

    import spmdsim
    comm = spmdsim.world()        # inside spmdsim.simulate(n, main): this rank's MPI.COMM_WORLD
    comm.Allreduce(x, y)          # mpi4py's methods and arguments

    spmdsim mpirun -n 8 python my_mpi4py_program.py   # an unmodified program, mpi4py swapped

`SimComm` (comm.py, its handle and identity queries in comm_identity.py,
its end and the calls not simulated in comm_lifetime.py, with its buffer collectives, object collectives and
point-to-point methods in collectives.py (their checks in collective_checks.py,
their nonblocking forms in nonblocking.py), objects.py, p2p.py; groups,
Cartesian grids, matched-probe messages, error handlers and attributes in
group.py, topology.py (graphs in graphs.py, their neighbour collectives in
neighbours.py), message.py, handles.py; windows for one-sided
communication in window.py; intercommunicators in intercomm.py, those of a Spawn in spawn.py and of an
Accept and a Connect in ports.py) reads mpi4py's buffer
specifications and arguments, raises mpi4py's errors, and runs each call on
the thread engine's primitives (spmdsim.runtime.sim.thread_engine's one body per
transfer, spmdsim.runtime.sim.p2p's message matching, spmdsim.runtime.sim.engine's
rendezvous). `mpi4py_world` swaps mpi4py's MPI module for the simulated
ranks (and `pkl5` mpi4py.util.pkl5; `rank_threads` makes the threads a rank starts
the rank's), `mpirun` runs a program once per rank as its own __main__ (`rank_program`), with its own
modules (`rank_modules`) and random generators (`rank_random`). spmdsim's runtime
never imports this package: its meshes run on the thread engine directly.
"""
from __future__ import annotations

from .._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.emulator.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
