"""spmdsim's MoE GPT training step written by hand in numpy and mpi4py: bench_gpt --moe's peer on the same work.

    timeout -k 5 600 mpiexec -n 8 python scripts/peer_mpi4py_moe.py              # dp 2 x ep 2 x tp 2
    timeout -k 5 600 mpiexec -n 8 python scripts/peer_mpi4py_moe.py --check 2 --wait busy

The dense step of scripts/_peer_mpi4py_step.py (Megatron's sequence-parallel
GPT on Split sub-communicators) with every --every-th block's MLP an MoE layer
as spmdsim.models.moe.layer runs it on Layout((dp, ep, tp), ("dp", "ep", "tp")),
rank = (d * ep + e) * tp + t: the batch split over dp x ep (those ranks are the
dense step's dp), each expert on one ep rank's share, column-parallel (w1) and
row-parallel (w2) over tp. Per MoE layer and step, on 2-d activations:

- LayerNorm on the sequence shard, ``Allgather`` over tp; the router's softmax
  on every token of this rank's samples; routing, gates and the capacity's
  slots by spmdsim.models.moe.routing (pure numpy, the reference's too);
- dispatch: the kept tokens packed straight into one (ep, samples, local
  experts, capacity, D) buffer, ``Alltoall`` over ep; the experts as batched
  matmuls (x @ w1 + b1, tanh-GELU, @ w2), ``Allreduce`` over tp, + b2;
  combine: ``Alltoall`` back, each token's rows times the gates summed;
- the load-balancing loss's counts: ``Allreduce`` of E numbers over dp x ep;
  the router losses' sum, one ``Allreduce`` of one number a layer (as
  spmdsim resolves each layer's);
- backward: ``Allgather`` of the output's gradient over tp, the two
  ``Alltoall`` the other way, the experts' and the router's gradients, the
  input's ``Reduce_scatter`` over tp (the router's part added on the shard);
- the experts' gradients summed over dp (the ranks holding the same experts) in
  one more ``Allreduce``, AdamW on their own flat buffers.

That is spmdsim's collective sequence call for call. Checking, timing and the
``RESULT {json}`` line are scripts/peer_mpi4py_gpt.py's (its `run`).
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve()
for _folder in (HERE.parent, HERE.parents[1]):  # the step beside this file, spmdsim above it: from anywhere
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from _peer_adamw import adamw_flat  # noqa: E402
from _peer_mpi4py_step import Replica, _gelu, _gelu_back, _layer_norm, _layer_norm_back, shard  # noqa
from peer_mpi4py_gpt import print_result, run, stopped  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

__all__ = ["MoEReplica", "moe_config", "main"]

#: Each expert parameter's tp-split dim (None: whole on tp); every one is split over ep on dim 0.
_EXPERT_TP = {"w1": 2, "b1": 1, "w2": 1, "b2": None}


def moe_config(args: argparse.Namespace) -> Any:
    """bench_gpt --moe's model: args' sizes, batch 8, experts behind a top-2 router with a capacity."""
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.models.moe import MoEConfig

    moe = MoEConfig(experts=args.experts, top_k=2, every=2, capacity_factor=args.capacity_factor)
    return GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8,
                     dropout=args.dropout, moe=moe)


def _expert(name: str) -> Optional[str]:
    """The expert parameter's leaf ("w1" ...) of an MoE layer's name, None for every other parameter."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf if ".moe." in name and leaf in _EXPERT_TP else None


class MoEReplica(Replica):
    """This rank's shards of the MoE GPT: the dense Replica's, and its experts in flat buffers of their own."""

    def __init__(self, cfg: Any, comms: Any, dp: int, tp: int, params: dict, ep: int) -> None:
        world = comms.world
        self.ep_size, self.moe = ep, cfg.moe
        d, self.e, t = world.rank // (ep * tp), (world.rank // tp) % ep, world.rank % tp
        self.ep = world.Split(d * tp + t, self.e)  # the ranks exchanging tokens, in e order
        self.edp = world.Split(self.e * tp + t, d)  # the ranks holding the same experts, in d order
        dense = {n: v for n, v in params.items() if _expert(n) is None}
        super().__init__(cfg, comms, dp, tp, dense)
        shards = {n: self.shard(n, v) for n, v in params.items() if _expert(n) is not None}
        order = sorted(shards, key=lambda n: _expert(n).startswith("b"))  # the weights first: they decay
        sizes = [shards[n].size for n in order]
        self.n_edecay = sum(s for n, s in zip(order, sizes) if not _expert(n).startswith("b"))
        self.etheta, self.egrad = np.empty(sum(sizes)), np.empty(sum(sizes))
        self.em, self.ev = np.zeros(sum(sizes)), np.zeros(sum(sizes))
        at = 0
        for name, size in zip(order, sizes):
            self.p[name] = self.etheta[at:at + size].reshape(shards[name].shape)
            self.g[name] = self.egrad[at:at + size].reshape(shards[name].shape)
            self.p[name][...] = shards[name]
            at += size
        self.router_losses: list = []

    @property
    def where(self) -> tuple:
        return self.t, self.tp_size, self.e, self.ep_size

    @staticmethod
    def block(where: tuple, name: str, full: np.ndarray) -> np.ndarray:
        t, tp, e, ep = where
        leaf = _expert(name)
        if leaf is None:
            return shard(name, full, t, tp)
        n = full.shape[0] // ep
        out = full[e * n:(e + 1) * n]
        dim = _EXPERT_TP[leaf]
        if dim is not None:
            m = out.shape[dim] // tp
            out = out.take(range(t * m, (t + 1) * m), axis=dim)
        return np.ascontiguousarray(out)

    def summed_over_dp(self, name: str) -> bool:
        return super().summed_over_dp(name) or name.endswith(".moe.router")  # the router's: alike on tp

    def _mlp(self, pre: str, h: np.ndarray, drop: Any) -> tuple:
        if not self.cfg.is_moe(int(pre[1:-1])):
            return super()._mlp(pre, h, drop)
        from spmdsim.models.moe.routing import dispatch_rows, route

        c, p, cfg, moe = self.comms, self.p, self.cfg, self.moe
        T, B, D, Tl = self.T, self.B, self.D, self.Tl
        E, ep, El, C, N = moe.experts, self.ep_size, moe.experts // self.ep_size, moe.capacity(self.T), cfg.batch * T
        a2_l, ln2 = _layer_norm(h, p[pre + "ln2.w"], p[pre + "ln2.b"], cfg.ln_eps)
        a2 = c.allgather(c.tp, a2_l)  # (T * B, D): rows (position, sample)
        logits = a2 @ p[pre + "moe.router"]
        top = logits.max(axis=1, keepdims=True)
        probs = np.exp(logits - top)
        sums = probs.sum(axis=1, keepdims=True)
        probs /= sums
        lse = (np.log(sums) + top)[:, 0]
        routing = route(np.ascontiguousarray(probs.reshape(T, B, E).transpose(1, 0, 2)), moe.top_k, C)
        rows, _, _ = dispatch_rows(routing, False)  # (B, T, k): (b * E + expert) * C + slot, -1 dropped
        kept = rows >= 0
        tok = (np.arange(T)[None, :, None] * B + np.arange(B)[:, None, None] + 0 * rows)[kept]  # row t * B + b
        b, x, slot = rows[kept] // (E * C), (rows[kept] // C) % E, rows[kept] % C
        at = ((x // El * B + b) * El + x % El) * C + slot  # in the (ep, B, El, C) buffer: no packing copy
        gate = routing.gates[kept]
        send = np.zeros((ep * B * El * C, D))
        send[at] = a2[tok]
        xe = self._dispatch(send, (ep, B, El, C, D))  # (El, ep * B * C, D)
        z = xe @ p[pre + "moe.w1"]
        z += p[pre + "moe.b1"][:, None]
        m, th = _gelu(z)
        ye = m @ p[pre + "moe.w2"]
        c.allreduce(c.tp, ye)
        ye += p[pre + "moe.b2"][:, None]
        back = self._combine(ye, (ep, B, El, C, D))  # rows (ep, B, El, C), as `at` numbers them
        out = np.zeros((T * B, D))
        np.add.at(out, tok, gate[:, None] * back[at])
        counts = c.allreduce(c.dp, routing.counts.sum(axis=0).astype(np.float64))
        f = counts / (moe.top_k * N)
        aux = E * float(f @ probs.sum(axis=0)) / N  # this rank's share of E sum_e f_e P_e
        self.router_losses.append(moe.aux_loss_coeff * aux + moe.z_loss_coeff * float(lse @ lse) / N)
        mine = slice(self.t * Tl * B, (self.t + 1) * Tl * B)  # this rank's sequence rows
        h = h + drop(out[mine], pre[:-1] + ".resid2", (Tl, B, D))
        return h, (a2, ln2, probs, lse, routing, tok, at, gate, xe, z, th, m, back, f)

    def _dispatch(self, rows: np.ndarray, shape: tuple) -> np.ndarray:
        """Rows (ep, B, El, C, D) to their experts' ranks (one Alltoall); what arrived, expert-major:
        (El, ep * B * C, D)."""
        got = np.empty(shape)
        self.comms._call(self.ep, "Alltoall", rows, got)
        got = np.ascontiguousarray(got.transpose(2, 0, 1, 3, 4))
        return got.reshape(shape[2], -1, shape[-1])

    def _combine(self, rows: np.ndarray, shape: tuple) -> np.ndarray:
        """`_dispatch` reversed: expert-major rows (El, ep * B * C, D) back to the ranks whose tokens they are;
        rows (ep * B * El * C, D)."""
        ep, B, El, C, D = shape
        send = np.ascontiguousarray(rows.reshape(El, ep, B, C, D).transpose(1, 2, 0, 3, 4))
        got = np.empty(shape)
        self.comms._call(self.ep, "Alltoall", send, got)
        return got.reshape(-1, D)

    def _mlp_back(self, pre: str, dh: np.ndarray, cache: tuple, drop: Any) -> np.ndarray:
        if not self.cfg.is_moe(int(pre[1:-1])):
            return super()._mlp_back(pre, dh, cache, drop)
        from spmdsim.models.moe.routing import gates_backward

        c, p, g, moe = self.comms, self.p, self.g, self.moe
        T, B, D, Tl = self.T, self.B, self.D, self.Tl
        E, ep, El, C, N = moe.experts, self.ep_size, moe.experts // self.ep_size, moe.capacity(T), self.cfg.batch * T
        a2, ln2, probs, lse, routing, tok, at, gate, xe, z, th, m, back, f = cache
        dr = c.allgather(c.tp, drop(dh, pre[:-1] + ".resid2", (Tl, B, D)))  # (T * B, D)
        dys = dr[tok]
        dgates = np.zeros(routing.gates.shape)
        dgates[routing.kept] = np.einsum("nd,nd->n", dys, back[at])
        dback = np.zeros((ep * B * El * C, D))
        dback[at] = gate[:, None] * dys
        dye = self._dispatch(dback, (ep, B, El, C, D))  # the combine's gradient travels as the dispatch
        np.sum(dye, axis=1, out=g[pre + "moe.b2"])
        np.matmul(m.transpose(0, 2, 1), dye, out=g[pre + "moe.w2"])
        dz = _gelu_back(dye @ p[pre + "moe.w2"].transpose(0, 2, 1), z, th)
        np.matmul(xe.transpose(0, 2, 1), dz, out=g[pre + "moe.w1"])
        np.sum(dz, axis=1, out=g[pre + "moe.b1"])
        dsend = self._combine(dz @ p[pre + "moe.w1"].transpose(0, 2, 1), (ep, B, El, C, D))  # and the other way
        dx = np.zeros((T * B, D))
        np.add.at(dx, tok, dsend[at])
        dprobs = gates_backward(probs.reshape(T, B, E).transpose(1, 0, 2), routing, dgates)
        dprobs = dprobs.transpose(1, 0, 2).reshape(T * B, E) + moe.aux_loss_coeff * E * f / N
        dlogits = probs * (dprobs - (dprobs * probs).sum(axis=1, keepdims=True))
        dlogits += (moe.z_loss_coeff * 2.0 / N) * lse[:, None] * probs
        np.matmul(a2.T, dlogits, out=g[pre + "moe.router"])
        mine = slice(self.t * Tl * B, (self.t + 1) * Tl * B)
        dx = c.reduce_scatter(c.tp, dx) + dlogits[mine] @ p[pre + "moe.router"].T  # the router's: alike on tp
        return dh + _layer_norm_back(dx, ln2, g[pre + "ln2.w"], g[pre + "ln2.b"])

    def _extra_loss(self) -> float:
        """The router losses, each layer's summed over dp x ep by its own Allreduce (as spmdsim resolves them)."""
        total = 0.0
        for loss in self.router_losses:
            total += float(self.comms.allreduce(self.comms.dp, np.array([loss]))[0])
        self.router_losses = []
        return total

    def _adamw(self) -> None:
        if self.edp.size > 1:
            self.comms.allreduce(self.edp, self.egrad)
        super()._adamw()
        adamw_flat(self.cfg, self.steps, self.etheta, self.egrad, self.em, self.ev, self.n_edecay)


def _problem(args: argparse.Namespace, size: int) -> Optional[str]:
    """Why the run cannot start on `size` ranks (one line), or None."""
    from spmdsim.errors import SpmdsimError
    from spmdsim.models.gpt.layouts import mesh_problem

    try:
        cfg = moe_config(args)
    except SpmdsimError as e:
        return str(e)
    if cfg.moe.experts % args.ep:
        return f"--experts {args.experts} are not divisible by --ep {args.ep}"
    if cfg.batch % (args.dp * args.ep):
        return f"the batch of {cfg.batch} samples is not divisible by --dp {args.dp} x --ep {args.ep}"
    if args.dp * args.ep * args.tp != size:
        return (f"--dp {args.dp} x --ep {args.ep} x --tp {args.tp} is {args.dp * args.ep * args.tp} ranks; "
                f"mpiexec started {size}")
    return mesh_problem(cfg, args.dp * args.ep, args.tp, sp=True)


def main(argv: Optional[list[str]] = None) -> int:
    """Parse, check the mesh (one line when it cannot run), then run; rank 0 prints the figures."""
    from _gpt_peer_args import add_model_arguments, add_run_arguments, refuse_small

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap, 1, "first steps run with spmdsim's dropout masks, checked against the reference")
    ap.set_defaults(tp=2)
    ap.add_argument("--ep", type=int, default=2, help="expert-parallel ranks (the mesh is dp x ep x tp)")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--capacity-factor", type=float, default=1.0)
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    refuse_small(ap, args)
    if args.ep < 1:
        ap.error(f"--ep {args.ep} must be at least 1")
    from mpi4py import MPI

    from spmdsim.runtime.engines.wait import resolve_wait_mode

    world = MPI.COMM_WORLD
    if stopped(world, "peer_mpi4py_moe", _problem(args, world.size)):
        return 2
    cfg = moe_config(args)
    polite = resolve_wait_mode(args.wait, world) == "polite"
    result = run(args, cfg, polite, args.dp * args.ep, functools.partial(MoEReplica, ep=args.ep))
    if result:
        print_result(args, result, f"numpy + mpi4py, {world.size} ranks (dp {args.dp} x ep {args.ep} x tp {args.tp}, "
                     f"sequence parallel), {cfg.moe.experts} experts, top-2, float64, {result['wait']} wait")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
