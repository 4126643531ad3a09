"""Where a simulated rank's GPT step spends its interpreter: spmdsim against the same step by hand.

    python scripts/calls_gpt.py                 # the GPT of bench_gpt.py (4 layers, d_model 128, seq 64)
    python scripts/calls_gpt.py --layers 2

Runs one training step (after three warm-up steps) of spmdsim's GPT (dp 2 x tp 4,
sequence parallel: forward, backward with buckets, AdamW) and of the hand-written
numpy + mpi4py peer (scripts/_peer_mpi4py_step.py, blocking calls) on 8 simulated
ranks, and counts, on rank 0 with a profile hook, the calls the rank makes:
Python functions outside numpy (spmdsim's and the program's own, the simulator's
collectives included), numpy functions and ndarray methods called by name (each
once, not what numpy calls inside), and other builtins (dict lookups,
isinstance, len). Python's profile hook does not see a ufunc called as an
object (np.add(a, b), np.exp(x)) or an array operator (a + b, a *= c): those
kernels run on both sides uncounted. On 8 ranks through one interpreter lock
every call is paid 8 times a step: docs/explanation/performance.md, "A GPT training step".
Its last line captures one more step (spmdsim.runtime.replay) and gives the
record's calls and the memory its arrays hold on rank 0, the intermediates
sharing memory by lifetime and each on its own, and the bytes of the gradient
buckets' joins the capture writes in place (docs/howto/replay.md, "Memory").
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

import numpy as np
from spmdsim.tools.cli.main import run_script

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
NUMPY = os.path.dirname(np.__file__)
KINDS = ("Python functions", "numpy functions", "other builtins")


def _numpy_c(function: object) -> bool:
    owner = getattr(function, "__self__", None)
    return (isinstance(function, np.ufunc) or (getattr(function, "__module__", None) or "").startswith("numpy")
            or isinstance(owner, (np.ndarray, np.generic)) or type(owner).__module__.startswith("numpy"))


def _counting(counts: collections.Counter):
    def hook(frame, event, arg):
        inside = frame.f_code.co_filename.startswith(NUMPY)
        if event == "call":
            if not inside:
                counts[KINDS[0]] += 1
            elif frame.f_back is None or not frame.f_back.f_code.co_filename.startswith(NUMPY):
                counts[KINDS[1]] += 1  # numpy's API written in Python (np.sum, np.where...), once
        elif event == "c_call" and not inside:
            counts[KINDS[1] if _numpy_c(arg) else KINDS[2]] += 1
    return hook


def _spmdsim_step(cfg, counts: collections.Counter, phases: dict, replayed: dict) -> None:
    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.models.gpt.params import decays, param_specs
    from spmdsim.nn.optim import AdamW
    from spmdsim.runtime.replay import Scalar, capture

    comm = spmdsim.world()
    ids = encode(load_text())
    mesh = Mesh(Layout((2, 4), ("dp", "tp")), comm)
    model = GPT(cfg, mesh, sp=True)
    specs = param_specs(cfg)
    opt = AdamW([model.params[s.name] for s in specs], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                weight_decay=cfg.weight_decay, decay=[model.params[s.name] for s in specs if decays(s)])

    def train_step(xd, yd, step, phase=lambda name: None):
        """One step; `phase(name)` as each of its phases starts, phase(None) after the last."""
        opt.zero_grad()
        phase("forward")
        loss = model.loss(xd, yd, step)
        phase("backward")
        loss.backward(bucket=True)
        phase("AdamW")
        opt.step()
        phase(None)
        return loss

    def count(name):
        sys.setprofile(None if name is None else _counting(phases[name]))

    for step in range(4):
        x, y = batch(ids, cfg, step)
        xd, yd = (DTensor.from_global(mesh, a, mesh.layout("dp", None)) for a in (x, y))
        comm.Barrier()
        if step == 3 and comm.rank == 0:  # the counted step
            train_step(xd, yd, step, count)
            for part in phases.values():
                counts.update(part)
        else:
            train_step(xd, yd, step)

    x, y = batch(ids, cfg, 4)
    xd, yd = (DTensor.from_global(mesh, a, mesh.layout("dp", None)) for a in (x, y))
    # Every rank's counted step over before any captures (a capture on one thread once sent the others'
    # optimizer down its capturing path, 860 calls, not 80; spmdsim.base.buffers.CAPTURE is each thread's now).
    comm.Barrier()
    graph = capture(train_step, xd, yd, Scalar(4), state=[model.params[s.name] for s in specs])
    if comm.rank == 0:
        replayed.update(calls=graph.operations, held=graph.held_bytes, shared=graph.shared_bytes,
                        joined=graph.joined_bytes)
    mesh.close()


def _peer_step(cfg, counts: collections.Counter) -> None:
    import spmdsim
    from _peer_mpi4py_step import Comms, Dropout, Replica
    from peer_mpi4py_gpt import _own_masks
    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim.models.gpt.reference import init_params

    world, dp, tp = spmdsim.world(), 2, 4
    comms = Comms(world, dp, tp, False)
    d = world.rank // tp
    model = Replica(cfg, comms, dp, tp, init_params(cfg))
    ids, rows = encode(load_text()), slice(d * model.B, (d + 1) * model.B)
    for step in range(4):
        x, y = (a[rows] for a in batch(ids, cfg, step))
        drop = Dropout(cfg.dropout, _own_masks(cfg, step, world.rank))
        world.Barrier()
        counting = step == 3 and world.rank == 0
        if counting:
            sys.setprofile(_counting(counts))
        model.step(x, y, drop)
        if counting:
            sys.setprofile(None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    import spmdsim
    from spmdsim.errors import SpmdsimError
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.models.gpt.parallel import mesh_problem

    try:
        cfg = GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, dropout=0.1)
    except SpmdsimError as e:
        ap.error(str(e))
    problem = mesh_problem(cfg, 2, 4, True)
    if problem:
        ap.error(f"the GPT cannot run on dp 2 x tp 4: {problem}")
    ours, theirs = collections.Counter(), collections.Counter()
    phases = {name: collections.Counter() for name in ("forward", "backward", "AdamW")}
    replayed: dict = {}
    spmdsim.simulate(8, _spmdsim_step, cfg, ours, phases, replayed)
    spmdsim.simulate(8, _peer_step, cfg, theirs)
    print(f"GPT {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch 8, dp 2 x tp 4 (sequence "
          "parallel)")
    print("one training step: the calls simulated rank 0 makes")
    print(f"{'calls':24} {'spmdsim':>9} {'by hand':>9} {'ratio':>7}")
    for kind in KINDS + ("all",):
        a = sum(ours.values()) if kind == "all" else ours[kind]
        b = sum(theirs.values()) if kind == "all" else theirs[kind]
        print(f"{kind:24} {a:9,} {b:9,} {a / max(b, 1):6.1f}x")
    print(f"{'spmdsim by phase':24} {'all':>9} {'numpy fn':>9}")
    for name, part in phases.items():
        print(f"{name:24} {sum(part.values()):9,} {part[KINDS[1]]:9,}")
    held, shared = replayed["held"], replayed["shared"]
    print(f"captured step: {replayed['calls']:,} recorded calls, arrays {held / 2**20:.1f} MiB "
          f"({(held + shared) / 2**20:.1f} MiB each on its own memory)")
    print(f"gradient buckets written in place, their joins dropped: {replayed['joined'] / 1024:,.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
