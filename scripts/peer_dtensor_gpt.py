"""spmdsim.models.gpt's GPT in PyTorch (float64) with DTensor's tensor-parallel plan on gloo: bench_gpt's peer.

    timeout -k 5 600 mpiexec -n 8 python scripts/peer_dtensor_gpt.py           # dp 2 x tp 4
    timeout -k 5 600 mpiexec -n 8 python scripts/peer_dtensor_gpt.py --steps 5 --check 3

The same model as spmdsim.models.gpt (token + position embeddings, pre-LN blocks with causal multi-head
attention without a key bias, tanh-GELU MLP, residuals, final LayerNorm, head tied to the token embedding, mean
cross-entropy, AdamW decaying the 2-d weights), started from spmdsim.models.gpt's own initial parameters. The
plan is Megatron's as PyTorch writes it, on the "tp" dim of a (dp, tp) DeviceMesh: vocab-parallel embedding
(RowwiseParallel, output on the sequence), q/k/v and w1 ColwiseParallel, wo and w2 RowwiseParallel
reduce-scattered onto the sequence, LayerNorms SequenceParallel, the tied head ColwiseParallel with
loss_parallel's cross-entropy. The LayerNorms' gradients (Partial over tp) are summed in one Allreduce, and all
gradients averaged over "dp" in one more (what Megatron and DDP do, one bucket each).

First --check steps run with spmdsim's dropout masks (spmdsim.models.gpt.params), and rank 0 compares their
losses with spmdsim.models.gpt.reference's; the timed steps (one warm-up, then --steps) use torch's own dropout,
as a PyTorch user would. Rank 0 prints the figures and a ``RESULT {json}`` line (scripts/bench_gpt.py reads it).
Without torch: one line, exit 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve()
for _folder in (HERE.parent, HERE.parents[1]):  # the shared arguments beside this file, spmdsim above it
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from _gpt_peer_args import add_model_arguments, mesh_problem, refuse_small  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

__all__ = ["MISSING", "missing", "build", "parallelize", "reference_drop", "native_drop", "step",
           "single_process_losses", "main"]

#: What the scripts print when torch (with torch.distributed.tensor.parallel) cannot be imported.
MISSING = ("PyTorch DTensor: not installed (pip install -e '.[bench]' to time its "
           "tensor-parallel plan)")


def missing() -> Optional[str]:
    """MISSING when torch or its tensor-parallel API cannot be imported, else None."""
    try:
        import torch  # noqa: F401
        from torch.distributed.tensor.parallel import loss_parallel  # noqa: F401
    except ImportError:
        return MISSING
    return None


class _Dropper:
    """Holds the dropout every site calls: ``fn(tensor, site)`` (swapped between steps)."""

    def __init__(self) -> None:
        self.fn: Callable[[Any, str], Any] = lambda t, site: t

    def __call__(self, t: Any, site: str) -> Any:
        return self.fn(t, site)


def build(cfg: Any, params: dict) -> Any:
    """The torch GPT of `cfg` (float64) holding copies of `params` (spmdsim.models.gpt.reference.init_params)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    D, Dh, V = cfg.d_model, cfg.head_dim, cfg.vocab
    drop = _Dropper()
    causal = torch.triu(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool), diagonal=1)

    class Attention(nn.Module):
        def __init__(self, site: str) -> None:
            super().__init__()
            self.site = site
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D, bias=(w != "k")) for w in "qkvo")

        def forward(self, a: Any) -> Any:
            B, T = a.shape[0], a.shape[1]

            def heads(linear: Any) -> Any:  # (B, heads here, T, Dh): a rank's heads are its columns
                return linear(a).view(B, T, -1, Dh).transpose(1, 2)

            q, k, v = heads(self.wq), heads(self.wk), heads(self.wv)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(Dh))
            probs = drop(torch.softmax(scores.masked_fill(causal[:T, :T], -math.inf), dim=-1), self.site)
            return self.wo((probs @ v).transpose(1, 2).reshape(B, T, -1))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1, self.w2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x: Any) -> Any:
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self, layer: int) -> None:
            super().__init__()
            self.pre = f"h{layer}"
            self.ln1, self.ln2 = nn.LayerNorm(D, eps=cfg.ln_eps), nn.LayerNorm(D, eps=cfg.ln_eps)
            self.attn, self.mlp = Attention(self.pre + ".attn"), MLP()

        def forward(self, h: Any) -> Any:
            h = h + drop(self.attn(self.ln1(h)), self.pre + ".resid1")
            return h + drop(self.mlp(self.ln2(h)), self.pre + ".resid2")

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = drop
            self.wte = nn.Embedding(V, D)
            self.wpe = nn.Parameter(torch.zeros(cfg.seq, D))
            self.h = nn.ModuleList(Block(layer) for layer in range(cfg.layers))
            self.lnf = nn.LayerNorm(D, eps=cfg.ln_eps)
            self.head = nn.Linear(D, V, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, x: Any, y: Any) -> Any:
            h = drop(self.wte(x) + self.wpe, "emb")
            for block in self.h:
                h = block(h)
            logits = self.head(self.lnf(h))
            return F.cross_entropy(logits.flatten(0, 1), y.flatten(0, 1))

    model = GPT().to(torch.float64)
    with torch.no_grad():
        for name, value in params.items():
            target, value = _torch_name(name), torch.from_numpy(value)
            if target.endswith(".weight") and ".ln" not in target and value.ndim == 2 \
                    and target != "wte.weight":
                value = value.T  # spmdsim multiplies a @ w (in, out); nn.Linear holds (out, in)
            model.get_parameter(target).copy_(value)
    return model


def _torch_name(name: str) -> str:
    """spmdsim.models.gpt's parameter name -> the torch model's: "h0.attn.wq" -> "h.0.attn.wq.weight"."""
    if name in ("wte", "wpe"):
        return "wte.weight" if name == "wte" else "wpe"
    if name.startswith("lnf."):
        return "lnf." + ("weight" if name.endswith(".w") else "bias")
    block, part, leaf = name.split(".")
    if part in ("ln1", "ln2"):
        return f"h.{block[1:]}.{part}." + ("weight" if leaf == "w" else "bias")
    return f"h.{block[1:]}.{part}.w{leaf[1:]}." + ("weight" if leaf[0] == "w" else "bias")


def parallelize(model: Any, tp_mesh: Any) -> Any:
    """Megatron's plan with sequence parallelism, as PyTorch's parallel styles write it, on `tp_mesh`."""
    import torch
    import torch.nn as nn
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    onto_sequence = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    plan = {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),
            "lnf": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}
    for i in range(len(model.h)):
        plan.update({f"h.{i}.ln1": SequenceParallel(), f"h.{i}.ln2": SequenceParallel(),
                     f"h.{i}.attn": gather, f"h.{i}.mlp": gather, f"h.{i}.attn.wo": onto_sequence,
                     f"h.{i}.mlp.w2": onto_sequence})
        plan.update({f"h.{i}.{m}": ColwiseParallel() for m in ("attn.wq", "attn.wk", "attn.wv", "mlp.w1")})
    wpe = model.wpe.detach().clone()
    parallelize_module(model, tp_mesh, plan)
    model.head.weight = model.wte.weight  # tied again: both are (V, D) split on the vocab, Shard(0)
    with torch.no_grad():  # the positions split like the sequence they are added to
        model.wpe = nn.Parameter(distribute_tensor(wpe, tp_mesh, [Shard(0)]))
    return model


def reference_drop(cfg: Any, step_no: int, rows: slice = slice(None), tp_rank: int = 0,
                   tp: int = 1) -> Callable[[Any, str], Any]:
    """Dropout with spmdsim.models.gpt's masks of step `step_no`: this rank's batch `rows`, its share of the
    split dim of a DTensor (its heads for the attention probabilities, a plain local tensor)."""
    import torch

    from spmdsim.models.gpt import dropout_tensor

    q = 1.0 - cfg.dropout

    def fn(t: Any, site: str) -> Any:
        keep = (dropout_tensor(cfg, step_no, site).full()[rows] >= cfg.dropout) / q
        placements = getattr(t, "placements", None)
        if placements is None:  # a local tensor: the attention probabilities, heads split over tp
            if site.endswith(".attn") and keep.shape[1] != t.shape[1]:
                keep = keep[:, tp_rank * t.shape[1]:(tp_rank + 1) * t.shape[1]]
            return t * torch.from_numpy(keep.copy())
        from torch.distributed.tensor import DTensor

        dim = next((p.dim for p in placements if p.is_shard()), None)
        if dim is not None:
            n = keep.shape[dim] // tp
            keep = keep.take(range(tp_rank * n, (tp_rank + 1) * n), axis=dim)
        local = torch.from_numpy(keep.copy())
        return t * DTensor.from_local(local, t.device_mesh, placements, run_check=False)

    return fn


def native_drop(cfg: Any) -> Callable[[Any, str], Any]:
    """torch's own dropout at cfg.dropout (each rank its own generator)."""
    import torch.nn.functional as F

    return lambda t, site: F.dropout(t, cfg.dropout, training=True)


def optimizer(cfg: Any, model: Any) -> Any:
    """torch.optim.AdamW with cfg's settings, decaying the 2-d weights only (spmdsim.models.gpt.params.decays)."""
    import torch

    params = list(model.parameters())  # the tied weight once
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def step(model: Any, opt: Any, x: Any, y: Any, dp_group: Any = None, dp: int = 1) -> float:
    """One training step (forward, backward, gradients averaged over dp, AdamW); the loss here."""
    import contextlib

    import torch

    opt.zero_grad(set_to_none=True)
    tp = hasattr(model.wte.weight, "placements")
    if tp:
        from torch.distributed.tensor.parallel import loss_parallel
    with loss_parallel() if tp else contextlib.nullcontext():
        loss = model(x, y)
        loss.backward()
    if tp:
        _sum_partial_grads(model)
    if dp > 1:
        import torch.distributed as dist

        grads = [p.grad.to_local() if tp else p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=dp_group)
        flat /= dp
        for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
            g.copy_(part.view_as(g))
    opt.step()
    return float((loss.full_tensor() if tp else loss).detach())


def _sum_partial_grads(model: Any) -> None:
    """The sequence-parallel LayerNorms' gradients (Partial over tp) summed in one Allreduce, as
    Megatron does; left Partial, AdamW would Allreduce each of them twice, one op at a time."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate

    pending = [p for p in model.parameters() if any(q.is_partial() for q in p.grad.placements)]
    if not pending:
        return
    locals_ = [p.grad.to_local() for p in pending]
    flat = torch.cat([g.reshape(-1) for g in locals_])
    dist.all_reduce(flat, group=pending[0].grad.device_mesh.get_group())
    for p, g, part in zip(pending, locals_, torch.split(flat, [g.numel() for g in locals_])):
        p.grad = DTensor.from_local(part.view_as(g), p.grad.device_mesh, [Replicate()], run_check=False)


def single_process_losses(cfg: Any, steps: int = 1) -> list[float]:
    """The first `steps` losses of the torch GPT in this process (no torch.distributed), with
    spmdsim's dropout masks: each should equal spmdsim.models.gpt.reference's."""
    import torch

    from spmdsim.models.gpt import batch, encode, load_text
    from spmdsim.models.gpt.reference import init_params

    ids = encode(load_text())
    model = build(cfg, init_params(cfg))
    opt = optimizer(cfg, model)
    losses = []
    for k in range(steps):
        x, y = (torch.from_numpy(a) for a in batch(ids, cfg, k))
        model.drop.fn = reference_drop(cfg, k)
        losses.append(step(model, opt, x, y))
    return losses


def _reference_losses(cfg: Any, steps: int) -> list[float]:
    from spmdsim.base.threads import blas_threads
    from spmdsim.models.gpt import encode, load_text
    from spmdsim.models.gpt.reference import Trainer

    with blas_threads(1):
        trainer = Trainer(cfg, encode(load_text()))
        return [trainer.step()[0] for _ in range(steps)]


def _init_gloo(comm: Any) -> None:
    """torch.distributed on gloo with the rank and size MPI gave this process."""
    import socket

    import torch.distributed as dist

    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=comm.size)


def run(args: argparse.Namespace) -> dict:
    """Build, check and time the step on this process's rank; rank 0's figures (others: {})."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.device_mesh import init_device_mesh

    from spmdsim.models.gpt import GPTConfig, batch, encode, load_text
    from spmdsim.models.gpt.reference import init_params

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    torch.manual_seed(comm.rank)  # torch's dropout: each rank its own masks
    # Dropout on a CPU DTensor runs on each rank's own generator, as wanted here; torch warns once per rank.
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
    cfg = GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, dropout=0.1)
    _init_gloo(comm)
    mesh = init_device_mesh("cpu", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    d, t = comm.rank // args.tp, comm.rank % args.tp  # the mesh is row-major: tp varies fastest
    rows = slice(d * cfg.batch // args.dp, (d + 1) * cfg.batch // args.dp)
    model = parallelize(build(cfg, init_params(cfg)), mesh["tp"])
    opt, ids, dp_group = optimizer(cfg, model), encode(load_text()), mesh["dp"].get_group()

    def one(k: int) -> float:
        x, y = (torch.from_numpy(a[rows]) for a in batch(ids, cfg, k))
        loss = step(model, opt, x, y, dp_group, args.dp)
        return comm.allreduce(loss) / comm.size  # each dp group's mean, averaged: the batch's mean

    losses = []
    for k in range(args.check):
        model.drop.fn = reference_drop(cfg, k, rows, t, args.tp)
        losses.append(one(k))
    model.drop.fn, walls = native_drop(cfg), []
    for k in range(args.check, args.check + args.steps + 1):
        x, y = (torch.from_numpy(a[rows]) for a in batch(ids, cfg, k))  # made before the clock, as
        dist.barrier()  # bench_gpt makes spmdsim's
        t0 = time.perf_counter()
        one_loss = step(model, opt, x, y, dp_group, args.dp)
        walls.append(time.perf_counter() - t0)
    every = comm.gather(walls, root=0)  # per step, the slowest rank's wall time
    dist.destroy_process_group()
    if comm.rank != 0:
        return {}
    slowest = [max(col) for col in zip(*every)]
    reference = _reference_losses(cfg, args.check)
    return {"step": statistics.median(slowest[1:]), "losses": losses, "reference": reference,
            "last_loss": one_loss, "torch": torch.__version__}


def main(argv: Optional[list[str]] = None) -> int:
    """Parse, then without torch one line; under mpiexec, the figures from rank 0."""
    from spmdsim.base.threads import launcher_rank

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap, 2, "first steps run with spmdsim's dropout masks, losses against the reference")
    args = ap.parse_args(argv)
    refuse_small(ap, args)
    size = int(os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    problem = mesh_problem(args, size)  # before any rank starts gloo: every rank stops alike
    if problem:
        if launcher_rank() == 0:
            print(f"peer_dtensor_gpt: {problem}", file=sys.stderr)
        return 2
    text = missing()
    if text is not None:
        if launcher_rank() == 0:
            print(text)
        return 0
    result = run(args)
    if result:
        pairs = list(zip(result["losses"], result["reference"]))
        print(f"torch {result['torch']} gloo, {size} ranks (dp {args.dp} x tp {args.tp}), float64")
        for k, (a, b) in enumerate(pairs):
            print(f"step {k} loss {a:.12f}, one numpy process {b:.12f} (same dropout masks), "
                  f"|diff| {abs(a - b):.1e}")
        print(f"training step {result['step']:.3f} s (median of {args.steps} after a warm-up, slowest rank, "
              f"torch's dropout)")
        print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
