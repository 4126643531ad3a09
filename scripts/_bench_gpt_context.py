"""`python scripts/bench_gpt.py --context`: ring attention's point-to-point messages, spmdsim's against raw mpi4py.

    python scripts/bench_gpt.py --context                 # cp 4 on 4 MPI ranks, 3 launches
    python scripts/bench_gpt.py --context --launches 5 --layers 2 --seq 128

A GPT step with context parallelism (cp 4 x dp 1 x tp 1 on 4 MPI ranks, the balanced causal split, ring
attention: spmdsim.nn.ops.ring_attention) sends, in every layer's attention, the blocks of keys and values
round the ring (forward: cp - 1 groups; backward: the keys and values again and their gradients one step
behind, cp + 1 groups), each group a `Messages` step record the executor posts through
spmdsim.runtime.door.point_to_point: to the next rank of the ring, from the previous one, receives posted
first. `ring_groups` works out each rank's groups of one step (the forward rings of layers 0 .. L-1, then
the backward rings of layers L-1 .. 0) from the program the model runs (spmdsim.programs.context.ring_program);
each launch first trains one real step (spmdsim.models.gpt.train.train with cp 4, ring attention) under a
trace and checks its point-to-point rows, in order, are those groups' (the same bytes each way, group by
group), then times the groups alone, no compute between, on the same buffers, ROUNDS rounds, each round
every way once in an order that turns by one:

- raw: mpi4py Irecv then Isend of each group's buffers, to and from the same peers with the same tags,
  completed by the wait spmdsim uses (a polite mesh's Test() polling, else Wait); raw2 the same again,
  the A/A control;
- door: spmdsim's runtime.door.point_to_point of each group, as the ring calls it (a trace open);
- replayed: the step's door calls captured (spmdsim.runtime.replay, as a replayed step captures the ring's)
  and replayed: each group started again on the requests bound to its buffers at the capture;
- rawbound: mpi4py's Recv_init/Send_init bound once, each group started by Prequest.Startall and
  completed by the same wait: what the replay's MPI calls are, without spmdsim.

A way's time in a round is the sum of its groups' spans (from before the first post to after the last
wait), the slowest rank's; each ratio is the median over rounds of the way's time over raw's in the same
round, then the median over launches. Exit 1 when the step's rows are not the planned groups.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
for _folder in (HERE.parent, HERE.parents[1]):  # bench_gpt's parts beside this file, spmdsim above it
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import _bench_gpt_shared as bench  # noqa: E402
CP = 4  # context-parallel ranks, one MPI rank each
ROUNDS = 30
WAYS = ("raw", "door", "raw2", "replayed", "rawbound")
P2P = bench.P2P
_LABEL = "ring attention"  # the ring's trace label (spmdsim.nn.ops.ring_attention)


def context_config(args):
    """The GPT of bench_gpt.py's cases (4 heads, batch 8): its layers, width and sequence."""
    from spmdsim.models.gpt import GPTConfig

    return GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, dropout=0.1)


def ring_groups(cfg, cp: int, rank: int) -> list:
    """`rank`'s ring groups of one step, in the order the model posts them: (receives, sends), each a list of
    (bytes, peer, tag); every layer's forward ring, then every layer's backward ring in reverse order. A block
    of keys or values (or their gradients) is a rank's (seq / cp, batch, heads, head_dim) float64."""
    from spmdsim.models.axes import CONTEXT
    from spmdsim.programs.context.ring import Pass, ring_program

    program = ring_program(rank, cp, cfg.seq // cp * cfg.batch * cfg.d_model * 8, (CONTEXT,), seq=cfg.seq)

    def groups(actions) -> list:
        return [([(n, peer, tag) for peer, tag, n in a.messages.receives],
                 [(n, peer, tag) for peer, tag, n in a.messages.sends]) for a in actions if isinstance(a, Pass)]

    return groups(program.forward) * cfg.layers + groups(program.backward) * cfg.layers


def _rows(plan: list) -> list:
    """The trace rows (op, bytes sent, bytes received) the door writes for `plan`'s groups, in order."""
    return [("sendrecv" if r and s else "recv" if r else "send", sum(n for n, *_ in s), sum(n for n, *_ in r))
            for r, s in plan]


def _step_rows(args, comm) -> list:
    """This rank's point-to-point trace rows (op, bytes sent, bytes received) of one real training step of
    the GPT with context parallelism cp = the world (ring attention), in order."""
    from spmdsim import collect_trace
    from spmdsim.models.gpt import encode, load_text
    from spmdsim.models.gpt.context import Context
    from spmdsim.models.gpt.train import train

    with collect_trace() as trace:
        train(context_config(args), comm, 1, 1, 1, encode(load_text()), check=False, cp=comm.size,
              context=Context("ring"))
    return [(e.op, e.bytes_sent, e.bytes_received) for e in trace.entries if e.op in P2P]


def _timed(args, comm) -> dict:
    """The worker: one real step's rows checked against `ring_groups`, then the ways of the module docstring
    timed on those groups; rank 0's result (every figure the slowest rank's or summed over the ranks)."""
    from _peer_mpi4py_step import _tight_timer_slack
    from spmdsim import Layout, Mesh
    from spmdsim.models.axes import CONTEXT

    plan = ring_groups(context_config(args), comm.size, comm.rank)
    stepped = _step_rows(args, comm)
    clock, axes = time.perf_counter, (CONTEXT,)
    mesh = Mesh(Layout((comm.size,), axes), comm)
    if mesh.polite:
        _tight_timer_slack()
    msgs = bench.MessageGroups(mesh, mesh.group(CONTEXT), axes, plan, _LABEL, clock)  # as the executor posts it
    raw = msgs.raw
    ways = {"raw": raw, "door": msgs.door, "raw2": raw, "rawbound": lambda: raw(persistent=True)}
    out, rows, _ = msgs.timed_rounds(comm, ways, WAYS, ROUNDS)
    msgs.free()
    mesh.close()
    planned = _rows(plan)
    same = stepped == planned == rows["door"] == rows["replayed"]
    out.update(step_groups=comm.allreduce(len(stepped)), step_bytes=comm.allreduce(sum(s for _, s, _ in stepped)),
               groups=comm.allreduce(len(planned)), bytes=comm.allreduce(sum(s for _, s, _ in planned)),
               messages=comm.allreduce(sum(len(s) for _, s in plan)), same=comm.allreduce(int(not same)) == 0,
               wait="polite" if msgs.polite else "busy", rounds=ROUNDS)
    return out


def _command(args, worker: str = "ring", check: int = 0) -> tuple[list, dict]:
    """A launch: this file's worker on CP MPI ranks, its command line and environment (as bench_gpt.py's)."""
    from spmdsim.base.malloc import glibc_env

    env = glibc_env(dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1])))
    cmd = ["timeout", "-k", "5", "900", bench._mpiexec() or "mpiexec", "-n", str(CP), sys.executable, str(HERE),
           "--layers", str(args.layers), "--d-model", str(args.d_model), "--seq", str(args.seq), "--worker", worker]
    return cmd, env


def _result(worker: str, code: int, out: str, err: str) -> dict | None:
    """bench_gpt's parse of a launch's RESULT line (tests/testkit.bench_launches reads it here too)."""
    return bench._result(worker, code, out, err, " --context")


def _launch(args) -> dict | None:
    cmd, env = _command(args)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=960)
    return _result("ring", done.returncode, done.stdout, done.stderr)


def context_case(args) -> int:
    """--context: the launches, then their rows; 1 when a launch failed or the step's rows are not the
    planned groups."""
    if not bench._mpiexec():
        print(f"bench_gpt --context: no mpiexec beside python or on PATH (pip install mpich); the context case runs "
              f"on {CP} MPI ranks", file=sys.stderr)
        return 1
    if args.seq % (2 * CP):
        print(f"bench_gpt --context: --seq {args.seq} must be a multiple of {2 * CP} (the balanced causal split "
              f"over cp {CP})", file=sys.stderr)
        return 1
    print(f"GPT {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch 8; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"context parallel cp {CP} x dp 1 x tp 1 on {CP} MPI ranks, ring attention (balanced causal split)")
    runs = [_launch(args) for _ in range(args.launches)]
    if not all(runs):
        return 1
    first = runs[0]
    n = len(runs)
    print(f"the ring's messages of a step (forward and backward, every layer), no compute, {first['rounds']} rounds "
          f"a launch,\n{first['wait']} wait; median of {n} launch{'es' if n > 1 else ''} (spread):")
    bench.message_rows(runs, ("raw2", "door", "replayed", "rawbound"))
    same = all(r["same"] for r in runs)
    verdict = "equal" if same else "DIFFERENT"
    print(f"ring groups a step, all ranks: spmdsim's step {first['step_groups']}, planned {first['groups']} "
          f"({first['messages']} messages), timed alike ({verdict})")
    print(f"ring bytes a step, all ranks: spmdsim's step {first['step_bytes']}, planned {first['bytes']} ({verdict})")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if not same:
        print("bench_gpt --context: the step's ring rows are not the planned groups", file=sys.stderr)
    return 0 if same else 1


def main() -> int:
    """This file as a worker (bench_gpt.py --context launches it on CP MPI ranks)."""
    ap = argparse.ArgumentParser(description="bench_gpt.py --context's worker")
    for name in ("--layers", "--d-model", "--seq"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--worker", choices=("ring",), required=True)
    args = ap.parse_args()
    from mpi4py import MPI

    from spmdsim.runtime.process import tune_mpi_process

    tune_mpi_process()  # as the guard does for spmdsim's commands: BLAS threads, heap, memory watch
    result = _timed(args, MPI.COMM_WORLD)
    if MPI.COMM_WORLD.rank == 0:
        print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    from spmdsim.tools.cli.main import run_script

    sys.exit(run_script(main))
