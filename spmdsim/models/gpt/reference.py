"""The GPT trained in one numpy process: forward, hand-written backward, AdamW, sampling.

The distributed model is checked against this at every step (loss, gradients,
parameters), so both follow one description operation by operation: float64, the
parameters and dropout masks of spmdsim/models/gpt/params.py taken whole (``SeededTensor.full()``),
the blocks of spmdsim/models/gpt/_blocks.py.
The reference is the unpadded model: given a config with vocabulary padding (GPTConfig.vocab_pad_to)
and the padded model's parameters, it drops wte's padded rows and computes without them (the padded
rows' gradients are zero: they are never looked up and their logits are masked out of the softmax).
``python -m spmdsim.models.gpt.reference --steps 200`` trains the default model and prints a sample.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
import zlib
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np

from ...base.threads import blas_threads, loaded_blas_threads
from ...errors import SpmdsimError
from ...nn.optim import adamw_update, clip_coefficient
from ...base.validate import as_int
from . import _blocks as blk
from ...base.typed_numbers import add_noted, flag_float, said_fields, typed
from .config import GPTConfig, said_as
from .data import batch, decode, encode, load_text, next_id, sample_problem
from .params import (decays, dropout_sites, dropout_tensor, initial_value, padded_params, param_specs,
                     unpadded_params)

__all__ = ["init_params", "logits", "loss_and_grads", "router_loss", "clip_grads", "AdamW", "Trainer", "train",
           "generate", "main"]

Params = dict[str, np.ndarray]


def init_params(cfg: GPTConfig) -> Params:
    """Every parameter's initial value, whole, in param_specs order."""
    return {spec.name: initial_value(cfg, spec) for spec in param_specs(cfg)}


def logits(params: Params, x: Any, cfg: GPTConfig, step: Optional[int] = None, train: bool = False) -> np.ndarray:
    """The logits (B, T, V) of ids x (B, T), V the unpadded vocabulary; dropout only when `train` (at `step`)."""
    params, cfg = unpadded_params(params, cfg), cfg.unpadded()
    ids = _ids(x, cfg, "x")
    out, _ = _forward(params, ids, cfg, step, train)
    return out.reshape(ids.shape + (cfg.vocab,))


def router_loss(cfg: GPTConfig, cache: dict) -> float:
    """The MoE layers' router losses, weighted and summed (0.0 without MoE layers): the sum over MoE
    layers of aux_loss_coeff * load-balancing loss + z_loss_coeff * z-loss (spmdsim.models.moe.reference)."""
    if cfg.moe is None:
        return 0.0
    moe = [b["moe"] for b in cache["blocks"] if b is not None and "moe" in b]
    return sum(cfg.moe.aux_loss_coeff * m["aux"] + cfg.moe.z_loss_coeff * m["z"] for m in moe)


def loss_and_grads(params: Params, x: Any, y: Any, cfg: GPTConfig, step: Optional[int],
                   train: bool = True, micro: Optional[int] = None,
                   routes: Optional[dict] = None, laid: Optional[tuple] = None) -> tuple[float, Params]:
    """Mean cross-entropy of targets y given ids x (plus the MoE layers' router losses, weighted:
    `router_loss`), and its gradient for every parameter.

    Args:
        step: the 0-based training step; it picks the dropout masks (ignored when not train).
        micro: x's microbatch number in a step that accumulates over several (its own masks,
            spmdsim.models.gpt.params.dropout_seed); None: the step's whole batch.
        routes: MoE layer ("h1") -> the ranks' (B, T, k) experts of x's tokens, which the MoE layers
            follow where rounding alone can explain them (spmdsim.models.moe.routing.followed); None: their own.
        laid: the order a context-parallel run laid its sequences out in (`_masks`); None: the positions'.

    With vocabulary padding (cfg.vocab_pad_to) `params` are the padded model's; the loss and gradients
    are the unpadded model's, wte's padded rows' gradients zero.
    """
    if cfg.unpadded() is not cfg:
        loss, grads = loss_and_grads(unpadded_params(params, cfg), x, y, cfg.unpadded(), step, train, micro, routes,
                                     laid)
        return loss, padded_params(grads, cfg)
    ids, targets = _ids(x, cfg, "x"), _ids(y, cfg, "y")
    if ids.shape != targets.shape:
        raise SpmdsimError(f"y of shape {targets.shape} must have the shape of x {ids.shape}")
    out, cache = _forward(params, ids, cfg, step, train, micro=micro, routes=routes, laid=laid)
    n = out.shape[0]
    rows, flat_y = np.arange(n), targets.reshape(-1)
    top = out.max(axis=1, keepdims=True)
    lse = top + np.log(np.exp(out - top).sum(axis=1, keepdims=True))
    loss = float(np.mean(lse[:, 0] - out[rows, flat_y])) + router_loss(cfg, cache)
    dlogits = np.exp(out - lse)
    dlogits[rows, flat_y] -= 1.0
    dlogits /= n
    return loss, _backward(params, ids, dlogits, cache, cfg)


class AdamW:
    """AdamW over a dict of numpy parameters (torch.optim.AdamW's semantics), state per name.

    Args:
        decay: which names decay: None (arrays of 2 or more dims), a predicate
            ``decay(name) -> bool``, or an iterable of names.
    """

    def __init__(self, lr: float = 3e-3, betas: tuple = (0.9, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.1, decay: Union[None, Callable[[str], bool], Iterable[str]] = None) -> None:
        try:  # GPTConfig checks these fields; its message, said of AdamW
            cfg = GPTConfig(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        except SpmdsimError as e:
            raise SpmdsimError(str(e).replace("GPTConfig ", "AdamW ", 1)) from None
        self.lr, self.betas, self.eps, self.weight_decay = cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay
        if decay is None or callable(decay):
            self._decay = decay
        elif isinstance(decay, (str, bytes)) or not hasattr(decay, "__iter__"):
            raise SpmdsimError(f"decay {decay!r} must be None, a predicate or an iterable of names")
        else:
            self._decay = frozenset(decay).__contains__
        self.state: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}

    @classmethod
    def from_config(cls, cfg: GPTConfig) -> AdamW:
        """The optimizer of cfg: its lr, betas, eps, weight decay, decaying the 2-d weights."""
        names = [spec.name for spec in param_specs(cfg) if decays(spec)]
        return cls(cfg.lr, cfg.betas, cfg.eps, cfg.weight_decay, decay=names)

    def step(self, params: Params, grads: Params) -> None:
        """Update, in place and in params' order, every parameter that has a gradient."""
        for name, param in params.items():
            grad = grads.get(name)
            if grad is None:
                continue
            if grad.shape != param.shape:
                raise SpmdsimError(f"gradient of {name!r} has shape {grad.shape}; expected {param.shape}")
            t, m, v = self.state.get(name) or (0, np.zeros_like(param), np.zeros_like(param))
            self.state[name] = (t + 1, m, v)
            decay = param.ndim >= 2 if self._decay is None else bool(self._decay(name))
            adamw_update(param, grad, m, v, t + 1, lr=self.lr, betas=self.betas, eps=self.eps,
                         weight_decay=self.weight_decay if decay else 0.0)


def clip_grads(grads: Params, max_norm: float) -> tuple[float, Params]:
    """(the gradients' joint 2-norm, the gradients scaled so it is at most `max_norm`), as PyTorch's
    clip_grad_norm_ (spmdsim.nn.optim.clip_coefficient); the given arrays are not changed."""
    norm = math.sqrt(sum(float(np.dot(g.reshape(-1), g.reshape(-1))) for g in grads.values()))
    coefficient = clip_coefficient(norm, max_norm)
    if coefficient == 1.0:
        return norm, grads
    return norm, {name: g * coefficient for name, g in grads.items()}


class Trainer:
    """The reference training one step at a time, to walk beside a distributed run.

    ``t = Trainer(cfg, text_ids); loss, grads = t.step()``: init_params, AdamW.from_config,
    step k trains on ``batch(text_ids, cfg, k)``; ``t.params`` are updated in place.
    """

    def __init__(self, cfg: GPTConfig, text_ids: Any) -> None:
        self.cfg = cfg
        self.text_ids = encode(text_ids) if isinstance(text_ids, (bytes, bytearray, str)) else text_ids
        self.params = init_params(cfg)
        self.optimizer = AdamW.from_config(cfg)
        self.steps = 0

    def step(self) -> tuple[float, Params]:
        """One training step: the loss and gradients at the parameters before the update (clipped, with
        cfg.clip)."""
        x, y = batch(self.text_ids, self.cfg, self.steps)
        loss, grads = loss_and_grads(self.params, x, y, self.cfg, self.steps)
        if self.cfg.clip:
            grads = clip_grads(grads, self.cfg.clip)[1]
        self.optimizer.step(self.params, grads)
        self.steps += 1
        return loss, grads


def train(cfg: GPTConfig, steps: int, text_ids: Any,
          on_step: Optional[Callable[[int, float, Params, Params], Any]] = None) -> tuple[Params, list[float]]:
    """Train from init_params for `steps` steps of `batch(text_ids, cfg, step)` with AdamW.

    After each step's update calls ``on_step(step, loss, grads, params)`` (params updated).
    Returns the final parameters and the losses.
    """
    n = as_int(steps)
    if n is None or n < 0:
        raise SpmdsimError(f"steps {steps!r} must be an integer >= 0")
    trainer, losses = Trainer(cfg, text_ids), []
    for step in range(n):
        loss, grads = trainer.step()
        losses.append(loss)
        if on_step is not None:
            on_step(step, loss, grads, trainer.params)
    return trainer.params, losses


def sampling(n: Any, temperature: Any) -> int:
    """`n` as an int, after checking `n` (an integer >= 0) and `temperature` (a finite number >= 0) as
    both generators take them; else the one-line error."""
    count = as_int(n)
    if count is None or count < 0:
        raise SpmdsimError(f"n {n!r} must be an integer >= 0")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise SpmdsimError(f"temperature {temperature!r} must be a finite number >= 0")
    return count


def generate(params: Params, cfg: GPTConfig, prompt_ids: Any, n: int, temperature: float = 0.0,
             seed: Optional[int] = None) -> np.ndarray:
    """`n` new token ids after the prompt (eval mode: no dropout).

    Each token sees the last T tokens, left-padded with spaces (id 32; id 0 where the
    vocabulary is smaller) when shorter. Temperature 0 is greedy; above it, sampling
    from softmax(logits / temperature) with a generator seeded by `seed` (default cfg.seed).
    """
    params, cfg = unpadded_params(params, cfg), cfg.unpadded()
    count = sampling(n, temperature)
    prompt = encode(prompt_ids) if isinstance(prompt_ids, (bytes, bytearray, str)) \
        else np.asarray(prompt_ids).reshape(-1)
    if prompt.size and prompt.dtype.kind not in "iu":
        raise SpmdsimError(f"prompt ids of dtype {prompt.dtype} must be integers in [0, {cfg.vocab})")
    if prompt.size and (prompt.min() < 0 or prompt.max() >= cfg.vocab):
        bad = int(prompt.min()) if prompt.min() < 0 else int(prompt.max())
        raise SpmdsimError(f"prompt ids must be integers in [0, {cfg.vocab}), got {bad!r}")
    base = cfg.seed if seed is None else seed
    rng = np.random.default_rng(zlib.crc32(f"{base}:generate".encode()))
    T, pad = cfg.seq, 32 if cfg.vocab > 32 else 0
    ids = [int(i) for i in prompt]
    for _ in range(count):
        context = ids[-T:]
        window = np.array([[pad] * (T - len(context)) + context], dtype=np.int64)
        with np.errstate(over="ignore", invalid="ignore"):  # diverged parameters: next_id's one line
            last = _forward(params, window, cfg, None, False, need_cache=False)[0][-1]
        ids.append(next_id(rng, last, temperature))
    return np.array(ids[len(ids) - count:], dtype=np.int64)


def _ids(x: Any, cfg: GPTConfig, what: str) -> np.ndarray:
    ids = np.asarray(x)
    if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.shape[1] != cfg.seq or ids.shape[0] < 1:
        raise SpmdsimError(f"{what} of shape {ids.shape} and dtype {ids.dtype} must be integer ids of shape "
                           f"(batch, {cfg.seq})")
    if ids.min() < 0 or ids.max() >= cfg.vocab:
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise SpmdsimError(f"{what} holds id {bad!r} outside the vocabulary [0, {cfg.vocab})")
    return ids.astype(np.int64, copy=False)


def _check_params(params: Params, cfg: GPTConfig) -> None:
    if not isinstance(params, dict):
        raise SpmdsimError(f"params {type(params).__name__} must be a dict of name -> array (init_params)")
    for spec in param_specs(cfg):
        value = params.get(spec.name)
        if value is None:
            raise SpmdsimError(f"params lack {spec.name!r} (of shape {spec.shape})")
        if getattr(value, "shape", None) != spec.shape or value.dtype != np.float64:
            raise SpmdsimError(f"params[{spec.name!r}] must be float64 of shape {spec.shape}, got "
                               f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}")


def _masks(cfg: GPTConfig, step: Optional[int], train: bool, batch_size: int,
           micro: Optional[int] = None, laid: Optional[tuple] = None) -> Optional[dict[str, np.ndarray]]:
    """Each site's keep mask (1.0 kept, 0.0 dropped), or None where dropout is the identity. `laid`: a context-
    parallel run's order of the sequence (it drew masks by index): position laid[i] reads what index i drew."""
    if not train or cfg.dropout == 0:
        return None
    if step is None:
        raise SpmdsimError("step is None in training mode; dropout masks need the 0-based step")
    masks = {}
    for site in dropout_sites(cfg):
        t = dropout_tensor(cfg, step, site, batch_size, micro)
        mask = t.at_least(tuple(slice(None) for _ in t.shape), cfg.dropout).astype(np.float64)
        if laid is not None:  # (back: position -> the index it was laid at)
            back = np.argsort(laid)
            mask = mask[:, :, back][..., back] if site.endswith(".attn") else mask[:, back]
        masks[site] = mask
    return masks


def _forward(params: Params, x: np.ndarray, cfg: GPTConfig, step: Optional[int], train: bool,
             need_cache: bool = True, micro: Optional[int] = None,
             routes: Optional[dict] = None, laid: Optional[tuple] = None) -> tuple[np.ndarray, dict]:
    """Logits (B*T, V) of ids x (B, T) and what the backward needs."""
    _check_params(params, cfg)
    B, T = x.shape
    keep = _masks(cfg, step, train, B, micro, laid)
    q = 1.0 - cfg.dropout
    drop = (lambda a, site: a) if keep is None else (lambda a, site: a * keep[site].reshape(a.shape) / q)
    h = params["wte"][x] if cfg.positions == "rope" else params["wte"][x] + params["wpe"][None]
    h = drop(h, "emb").reshape(B * T, cfg.d_model)
    blocks = []
    for layer in range(cfg.layers):
        h, block = blk.block_forward(params, f"h{layer}.", h, B, cfg, drop, (routes or {}).get(f"h{layer}"), laid)
        blocks.append(block if need_cache else None)
    hf, lnf = blk.norm(params, "lnf", h, cfg)
    out = hf @ params["wte" if cfg.tied else "head.w"].T
    return out, {"keep": keep, "blocks": blocks, "hf": hf, "lnf": lnf}


def _backward(params: Params, x: np.ndarray, dlogits: np.ndarray, cache: dict, cfg: GPTConfig) -> Params:
    """Every parameter's gradient from the logits' gradient (B*T, V), in param_specs order."""
    keep, q = cache["keep"], 1.0 - cfg.dropout
    undrop = (lambda g, site: g) if keep is None else (lambda g, site: g * keep[site].reshape(g.shape) / q)
    grads: Params = {}
    head = "wte" if cfg.tied else "head.w"
    d_head = dlogits.T @ cache["hf"]  # the head; a tied one's, the embedding's rows add in below
    dh = blk.norm_backward(dlogits @ params[head], cache["lnf"], "lnf", cfg, grads)
    if cfg.tied:
        d_wte = d_head
    else:
        grads["head.w"], d_wte = d_head, np.zeros_like(params["wte"])
    for layer in reversed(range(cfg.layers)):
        dh = blk.block_backward(params, f"h{layer}.", dh, cache["blocks"][layer], cfg, undrop, grads)
    B, T = x.shape
    dh0 = undrop(dh, "emb").reshape(B, T, cfg.d_model)
    np.add.at(d_wte, x.reshape(-1), dh0.reshape(B * T, cfg.d_model))
    grads["wte"] = d_wte
    if cfg.positions == "learned":
        grads["wpe"] = dh0.sum(axis=0)
    return {spec.name: grads[spec.name] for spec in param_specs(cfg)}


def main(argv: Optional[list[str]] = None) -> int:
    """Train the default GPT in one process, print the loss every --every steps and a sample."""
    ap = argparse.ArgumentParser(prog="python -m spmdsim.models.gpt.reference", description=main.__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=20, help="print the loss every this many steps")
    add_noted(ap, "--layers", type=int, default=GPTConfig.layers)
    add_noted(ap, "--d-model", type=int, default=GPTConfig.d_model)
    add_noted(ap, "--heads", type=int, default=GPTConfig.heads)
    add_noted(ap, "--seq", type=int, default=GPTConfig.seq)
    add_noted(ap, "--batch", type=int, default=GPTConfig.batch)
    add_noted(ap, "--dropout", type=flag_float, default=GPTConfig.dropout)
    add_noted(ap, "--seed", type=int, default=GPTConfig.seed)
    ap.add_argument("--clip", type=flag_float, default=GPTConfig.clip, help="clip the gradients' joint norm to this "
                    "(0: no clipping)")
    ap.add_argument("--prompt", default="def ", help="text the sample starts from")
    ap.add_argument("--sample", type=int, default=300, help="characters to generate (at most 2,000)")
    ap.add_argument("--temperature", type=flag_float, default=0.0, help="0: greedy")
    ap.add_argument("--threads", type=int, default=None, help="BLAS threads (default: numpy's own)")
    args = ap.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        print(f"error: --threads {args.threads!r} must be an integer >= 1", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.threads is not None:
            stack.enter_context(blas_threads(args.threads))
        return _main(args)


#: GPTConfig's fields -> the flag of `main` that sets each: its refusals name the flag typed ("--dropout 2 ...").
_SAID = {"layers": "--layers", "d_model": "--d-model", "heads": "--heads", "seq": "--seq", "batch": "--batch",
         "dropout": "--dropout", "seed": "--seed", "clip": "--clip"}


def _main(args: argparse.Namespace) -> int:
    try:
        with said_as(*said_fields(args, _SAID)):  # a size left alone said as the default
            cfg = GPTConfig(layers=args.layers, d_model=args.d_model, heads=args.heads, seq=args.seq,
                            batch=args.batch, dropout=args.dropout, seed=args.seed, clip=args.clip)
        if args.every < 1:
            raise SpmdsimError(f"--every {args.every!r} must be an integer >= 1")
        # the sample's flags before the training, not after it (generate's own refusal names its arguments)
        if sample_problem(args.sample):
            raise SpmdsimError(sample_problem(args.sample))
        if not (math.isfinite(args.temperature) and args.temperature >= 0):
            raise SpmdsimError(f"--temperature {typed(args.temperature)} must be a finite number >= 0 (0: greedy)")
        text = load_text()
        print(f"GPT {cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, seq {cfg.seq}, batch "
              f"{cfg.batch}, dropout {cfg.dropout}")
        print(f"{len(text):,} characters of stdlib source; BLAS threads {loaded_blas_threads()}")
        start = [time.perf_counter()]

        def report(step: int, loss: float, grads: Params, params: Params) -> None:
            if (step + 1) % args.every == 0 or step == 0 or step + 1 == args.steps:
                now = time.perf_counter()
                print(f"step {step + 1:5d}  loss {loss:.4f}  ({now - start[0]:.2f} s)")

        params, _ = train(cfg, args.steps, text, on_step=report)
        per_step = (time.perf_counter() - start[0]) / max(1, args.steps)
        print(f"{per_step:.3f} s per step")
        ids = generate(params, cfg, args.prompt, args.sample, temperature=args.temperature)
    except SpmdsimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"sample (temperature {args.temperature}):")
    for line in (args.prompt + decode(ids)).replace("\t", " ").split("\n"):
        print("  " + line[:98])
    return 0


if __name__ == "__main__":
    sys.exit(main())
