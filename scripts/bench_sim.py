"""Simulated ranks against MPI ranks and against peers, on the same cases, in one run.

    python scripts/bench_sim.py                  # simulated, MPI (8 ranks, mpiexec), JAX, DTensor
    python scripts/bench_sim.py --repeat 40 --json bench_sim.json

Cases: four collectives through spmdsim.runtime on an 8-rank mesh, and the
redistribution of a 1024x1024 float32 tensor (S(0),S(1)) -> (S(1),S(0)) on a
2x4 mesh. Each is timed per call (the ranks meet at a barrier first, which
is not timed) and reported as the median over `--repeat` calls of the slowest
rank. The same move is timed in JAX on 8 fake CPU devices and in PyTorch
DTensor under LocalTensorMode when they are installed (the `bench` extra);
each absent peer is one line. The load average is printed: on a shared
machine, compare within one run only.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from spmdsim.tools.cli.main import run_script

HERE = Path(__file__).resolve()
MOVE = "move (S(0),S(1))->(S(1),S(0)) 1024x1024 f32, 2x4"
SIZES = {"allreduce 1 MiB": 1 << 20, "allgather 128 KiB -> 1 MiB": 128 << 10,
         "alltoall 1 MiB": 1 << 20, "reduce_scatter 1 MiB": 1 << 20}


def _cases(comm):
    """name -> a callable that performs the case once on this rank (inputs built here, once)."""
    from spmdsim import Layout, SeededTensor
    from spmdsim.runtime.executor import redistribute
    from spmdsim.runtime import DTensor, Mesh, allgather, allreduce, alltoall, reduce_scatter

    line = Mesh(Layout((comm.Get_size(),), ("x",)), comm)
    arrays = {name: np.ones(n // 4, np.float32) for name, n in SIZES.items()}
    grid = Layout((2, 4), ("a", "b"))
    mesh = Mesh(grid, comm)
    src = DTensor.from_seeded(mesh, grid("a", "b"), SeededTensor((1024, 1024), "float32", seed=0))
    target = grid("b", "a")
    names = list(SIZES)
    return {
        names[0]: lambda: allreduce(line, arrays[names[0]], "x"),
        names[1]: lambda: allgather(line, arrays[names[1]], "x", 0),
        names[2]: lambda: alltoall(line, arrays[names[2]], "x", 0, 0),
        names[3]: lambda: reduce_scatter(line, arrays[names[3]], "x", 0),
        MOVE: lambda: redistribute(src, target),
    }


def run_cases(comm, repeat: int) -> dict:
    """Median seconds per call of each case, slowest rank (a collective call on `comm`)."""
    out = {}
    for name, case in _cases(comm).items():
        for _ in range(3):
            case()
        times = []
        for _ in range(repeat):
            comm.Barrier()
            t0 = time.perf_counter()
            case()
            times.append(time.perf_counter() - t0)
        out[name] = max(comm.allgather(statistics.median(times)))
    return out


def simulated(repeat: int) -> dict:
    import spmdsim

    return spmdsim.simulate(8, lambda: run_cases(spmdsim.world(), repeat))[0]


def _mpi(repeat: int) -> dict | str:
    """The cases on 8 MPI ranks: this script again under the venv's mpiexec."""
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from testkit import MPIEXEC

    if not MPIEXEC:
        return "no mpiexec (pip install -e '.[mpi]')"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mpi.json")
        cmd = ["timeout", "-k", "5", "600", MPIEXEC, "-n", "8", sys.executable, str(HERE), "--engine", "mpi",
               "--repeat", str(repeat), "--out", path]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            return f"mpiexec failed ({run.returncode}): {run.stderr.strip()[-300:]}"
        return json.loads(Path(path).read_text())


def _peer(name: str, repeat: int) -> float | str:
    """Seconds per move in a peer, run in its own process (JAX's device count is fixed at import)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, str(HERE), "--peer", name, "--repeat", str(repeat)],
                         capture_output=True, text=True, env=env, timeout=600)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        return f"failed: {(run.stderr.strip() or 'no output').splitlines()[-1]}"
    value = json.loads(lines[-1])
    return value if isinstance(value, (float, str)) else str(value)


def _time(move, repeat: int) -> float:
    for _ in range(3):
        move()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        move()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def jax_move(repeat: int) -> float | str:
    try:
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
    except ImportError:
        return "jax is not installed (pip install -e '.[bench]')"
    if len(jax.devices()) < 8:
        return f"jax sees {len(jax.devices())} devices, not 8 fake CPU devices"
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    x = jax.device_put(np.random.default_rng(0).random((1024, 1024), np.float32),
                       NamedSharding(mesh, PartitionSpec("a", "b")))
    move = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, PartitionSpec("b", "a")))
    return _time(lambda: move(x).block_until_ready(), repeat)


def dtensor_move(repeat: int) -> float | str:
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed._local_tensor import LocalTensorMode
        from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
    except ImportError as exc:
        return f"torch with DTensor's LocalTensorMode is not installed (pip install -e '.[bench]'): {exc}"
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
    with LocalTensorMode(8):
        mesh = DeviceMesh("cpu", torch.arange(8).reshape(2, 4))
        x = distribute_tensor(torch.rand(1024, 1024), mesh, [Shard(0), Shard(1)])
        return _time(lambda: x.redistribute(mesh, [Shard(1), Shard(0)]), repeat)


def _ms(value) -> str:
    return f"{value * 1e3:9.3f}" if isinstance(value, float) else f"{'-':>9}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40, help="timed calls per case (default 40)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--engine", choices=("mpi",), help=argparse.SUPPRESS)  # the mpiexec leg
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--peer", choices=("jax", "dtensor"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat} must be at least 1")
    if args.peer:
        print(json.dumps((jax_move if args.peer == "jax" else dtensor_move)(args.repeat)))
        return 0
    if args.engine == "mpi":
        from mpi4py import MPI

        figures = run_cases(MPI.COMM_WORLD, args.repeat)
        if MPI.COMM_WORLD.Get_rank() == 0:
            Path(args.out).write_text(json.dumps(figures))
        return 0
    load = os.getloadavg()[0]
    sim = simulated(args.repeat)
    mpi = _mpi(args.repeat)
    # DTensor's move takes ~1 s on 2 cores: a few calls give its median.
    slow = min(args.repeat, 5)
    peers = {"JAX, 8 fake CPU devices": _peer("jax", args.repeat),
             f"DTensor, LocalTensorMode ({slow} calls)": _peer("dtensor", slow)}
    print(f"median ms per call over {args.repeat} calls, slowest rank; load average {load:.1f} "
          f"on {os.cpu_count()} cores at the start (shared machines: compare within this run)")
    print(f"{'case':<46}{'simulated 8':>12}{'MPI 8 ranks':>12}{'MPI/sim':>9}")
    for name, seconds in sim.items():
        other = mpi.get(name) if isinstance(mpi, dict) else None
        ratio = f"{other / seconds:9.2f}" if other else f"{'-':>9}"
        print(f"{name:<46}{_ms(seconds):>12}{_ms(other):>12}{ratio}")
    if not isinstance(mpi, dict):
        print(f"MPI: {mpi}")
    for peer, value in peers.items():
        if isinstance(value, float):
            print(f"{MOVE} in {peer}: {value * 1e3:.3f} ms ({value / sim[MOVE]:.2f}x simulated spmdsim)")
        else:
            print(f"{peer}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "simulated": sim, "mpi": mpi, "peers": peers},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
