"""spmdsim's fully sharded GPT step (ZeRO-3) written by hand in numpy and mpi4py: bench_gpt --fsdp's peer.

    timeout -k 5 600 mpiexec -n 8 python scripts/peer_mpi4py_fsdp.py                # dp 8, fully sharded
    timeout -k 5 600 mpiexec -n 8 python scripts/peer_mpi4py_fsdp.py --check 2 --wait busy

The dense step of scripts/_peer_mpi4py_step.py on dp ranks (tp 1: each rank its
samples, every parameter whole in its forward) with each parameter sharded over
dp as spmdsim.nn.fsdp.fully_shard shards it: rank d keeps rows d*n/dp..(d+1)*n/dp
of dim 0, in flat buffers (parameters, gradients, AdamW's moments). The units
are spmdsim.models.gpt.parallel.GPT's: each layer, and the root (the embedding,
the final LayerNorm, the tied head). Per step:

- the root's parameters gathered once (their shards packed into one buffer,
  one ``Allgather``, each parameter's rows copied out of the gathered packs
  into its whole buffer) and kept to the end of the backward;
- per layer, before its forward: its parameters gathered so, one ``Allgather``;
  again before its backward (resharded after forward, FSDP's default); after
  its backward its gradients packed rank-major and reduce-scattered onto the
  shards (one ``Reduce_scatter_block``); the root's gradients at the end;
- the loss summed over dp (one ``Allreduce``); AdamW on the shards.

That is spmdsim's collective sequence call for call (one gather and one
reduce-scatter per unit, as spmdsim.nn.fsdp_flat makes them, PyTorch FSDP2's
flat collectives; spmdsim makes no call on a group of one rank, so neither
does this). The gathered parameters live in one buffer the
step overwrites (a hand-written program's choice: memory is not what the bench
times). Checking, timing and the ``RESULT {json}`` line are
scripts/peer_mpi4py_gpt.py's (its `run`); the check compares the shards.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve()
for _folder in (HERE.parent, HERE.parents[1]):  # the step beside this file, spmdsim above it: from anywhere
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from _gpt_peer_args import add_model_arguments, add_run_arguments, refuse_small  # noqa: E402
from _peer_adamw import adamw_flat, flat_state  # noqa: E402
from _peer_mpi4py_step import Replica, _layer_norm, _layer_norm_back  # noqa: E402
from peer_mpi4py_gpt import print_result, run, stopped  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

__all__ = ["FsdpReplica", "fsdp_config", "main"]


def fsdp_config(args: argparse.Namespace) -> Any:
    """bench_gpt --fsdp's model: args' sizes, batch 8, 4 heads."""
    from spmdsim.models.gpt import GPTConfig

    return GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, dropout=args.dropout)


class _Alone:
    """The step's Comms, where a group of one rank makes no call (nothing leaves the rank; spmdsim makes
    none): the call's result is its input."""

    def __init__(self, comms: Any) -> None:
        self.inner, self.tp, self.dp, self.world = comms, comms.tp, comms.dp, comms.world

    def allgather(self, comm: Any, x: np.ndarray) -> np.ndarray:
        return x if comm.size == 1 else self.inner.allgather(comm, x)

    def reduce_scatter(self, comm: Any, x: np.ndarray) -> np.ndarray:
        return x if comm.size == 1 else self.inner.reduce_scatter(comm, x)

    def allreduce(self, comm: Any, x: np.ndarray, op: Any = None) -> np.ndarray:
        return x if comm.size == 1 else self.inner.allreduce(comm, x, op)


class FsdpReplica(Replica):
    """This rank's shards of the GPT over dp, the buffers its units are gathered into, and its training step."""

    def __init__(self, cfg: Any, comms: Any, dp: int, tp: int, params: dict) -> None:
        super().__init__(cfg, comms, dp, tp, params)  # self.p, self.g: the whole parameters and their gradients
        self.comms, self.d, self.dp_size = _Alone(comms), comms.world.rank // tp, dp
        units: dict = {}
        for name in params:  # spmdsim's units, each in param_specs order (GPT._unit)
            pre = name.split(".", 1)[0] + "." if name[0] == "h" and name[1:2].isdigit() else None
            units.setdefault(pre, []).append(name)
        self.units = units
        self.flats: dict = {}  # a unit's names -> its flat buffers (`_flat`)
        shards = {n: self.block(self.where, n, v) for n, v in params.items()}
        order = sorted(shards, key=lambda n: shards[n].ndim < 2)  # the 2-d weights first: they decay
        sizes = [shards[n].size for n in order]
        self.n_decay = sum(s for n, s in zip(order, sizes) if shards[n].ndim >= 2)
        self.theta, self.grad, self.m, self.v, self.sp, self.sg = flat_state(shards, order)  # the shards: AdamW's

    @property
    def where(self) -> tuple:
        """This rank's place, as `block` reads it: (d, dp)."""
        return self.d, self.dp_size

    @staticmethod
    def block(where: tuple, name: str, full: np.ndarray) -> np.ndarray:
        """The shard of parameter `name` that the rank at `where` keeps: its rows of dim 0 (a copy)."""
        d, dp = where
        n = full.shape[0] // dp
        return full[d * n:(d + 1) * n].copy()

    def shard(self, name: str, full: np.ndarray) -> np.ndarray:
        """Parameter `name` whole (a copy): the buffer its unit is gathered into (tp 1)."""
        return full.copy()

    def held(self) -> tuple:
        """(gradients, parameters) as this rank keeps them, name -> its shard (peer_mpi4py_gpt's check reads)."""
        return self.sg, self.sp

    def _flat(self, names: list) -> tuple:
        """The unit's buffers, made at its first gather: (offsets, this rank's pack of shards, the gathered packs
        (dp of them, rank-major), the packed gradients (rank-major), their summed shards)."""
        key = tuple(names)
        made = self.flats.get(key)
        if made is None:
            at, offsets = 0, []
            for name in names:
                offsets.append((name, at, at + self.sp[name].size))
                at += self.sp[name].size
            made = self.flats[key] = (offsets, np.empty(at), np.empty((self.dp_size, at)),
                                      np.empty((self.dp_size, at)), np.empty(at))
        return made

    def _gather(self, names: list) -> None:
        """The unit gathered as spmdsim gathers it: its shards packed, one Allgather, each parameter copied out."""
        c = self.comms.inner
        offsets, pack, got, _, _ = self._flat(names)
        for name, a, z in offsets:
            pack[a:z] = self.sp[name].reshape(-1)
        c._call(c.dp, "Allgather", pack, got)
        for name, a, z in offsets:
            self.p[name].reshape((self.dp_size, z - a))[...] = got[:, a:z]

    def _scatter(self, names: list) -> None:
        """The unit's gradients packed rank-major, one Reduce_scatter_block, each shard copied out."""
        c = self.comms.inner
        offsets, _, _, packed, summed = self._flat(names)
        for name, a, z in offsets:
            packed[:, a:z] = self.g[name].reshape((self.dp_size, z - a))
        c._call(c.dp, "Reduce_scatter_block", packed, summed)
        for name, a, z in offsets:
            self.sg[name].reshape(-1)[...] = summed[a:z]

    def _block(self, pre: str, h: np.ndarray, drop: Any) -> tuple:
        self._gather(self.units[pre])
        return super()._block(pre, h, drop)

    def _block_back(self, pre: str, dh: np.ndarray, cache: tuple, drop: Any) -> np.ndarray:
        self._gather(self.units[pre])  # again: resharded after its forward
        dh = super()._block_back(pre, dh, cache, drop)
        self._scatter(self.units[pre])
        return dh

    def step(self, x: np.ndarray, y: np.ndarray, drop: Any) -> float:
        """One training step on this rank's ids x, y (B/dp, T); the loss of the whole batch."""
        p, g, cfg, root = self.p, self.g, self.cfg, self.units[None]
        act = (self.T, self.B, self.D)
        self._gather(root)
        ids = x.T.reshape(-1)  # rows (position, sample)
        h = p["wte"][ids]
        h.reshape(act)[...] += p["wpe"][:, None]
        h = drop(h, "emb", act)
        caches = []
        for layer in range(cfg.layers):
            h, cache = self._block(f"h{layer}.", h, drop)
            caches.append(cache)
        out, lnf = _layer_norm(h, p["lnf.w"], p["lnf.b"], cfg.ln_eps)
        loss, dz = self._cross_entropy(out @ p["wte"].T, y.T.reshape(-1))
        np.matmul(dz.T, out, out=g["wte"])  # the tied head; the embedding's rows add in below
        dh = _layer_norm_back(dz @ p["wte"], lnf, g["lnf.w"], g["lnf.b"])
        for layer in reversed(range(cfg.layers)):
            dh = self._block_back(f"h{layer}.", dh, caches[layer], drop)
        dh = drop(dh, "emb", act)
        np.sum(dh.reshape(act), axis=1, out=g["wpe"])
        np.add.at(g["wte"], ids, dh)
        self._scatter(root)
        self.steps += 1
        adamw_flat(cfg, self.steps, self.theta, self.grad, self.m, self.v, self.n_decay)
        return loss


def _problem(args: argparse.Namespace, size: int) -> Optional[str]:
    """Why the run cannot start on `size` ranks (one line), or None."""
    from spmdsim.errors import SpmdsimError
    from spmdsim.models.gpt.layouts import mesh_problem
    from spmdsim.models.gpt.params import param_specs

    if args.tp != 1:
        return f"--tp {args.tp}: this peer shards over dp alone (tp 1)"
    try:
        cfg = fsdp_config(args)
    except SpmdsimError as e:
        return str(e)
    for spec in param_specs(cfg):
        if spec.shape[0] % args.dp:
            return f"parameter {spec.name!r} dim 0 of size {spec.shape[0]} is not divisible by --dp {args.dp}"
    if args.dp != size:
        return f"--dp {args.dp} is {args.dp} ranks; mpiexec started {size}"
    return mesh_problem(cfg, args.dp, 1, sp=False)


def main(argv: Optional[list[str]] = None) -> int:
    """Parse, check the mesh (one line when it cannot run), then run; rank 0 prints the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap, 1, "first steps run with spmdsim's dropout masks, checked against the reference")
    ap.set_defaults(dp=8, tp=1)
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    refuse_small(ap, args)
    from mpi4py import MPI

    from spmdsim.runtime.engines.wait import resolve_wait_mode

    world = MPI.COMM_WORLD
    if stopped(world, "peer_mpi4py_fsdp", _problem(args, world.size)):
        return 2
    cfg = fsdp_config(args)
    polite = resolve_wait_mode(args.wait, world) == "polite"
    result = run(args, cfg, polite, make=FsdpReplica)
    if result:
        print_result(args, result, f"numpy + mpi4py, {world.size} ranks (dp {args.dp}, fully sharded), float64, "
                     f"{result['wait']} wait")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
