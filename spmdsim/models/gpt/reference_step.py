"""The check's reference step of the GPT's trainers (spmdsim.models.gpt.train, .pipeline): the same step in one
numpy process, at float64 or under the run's precision policy, microbatch by microbatch."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional
import numpy as np
from .config import GPTConfig
from .params import decays, param_specs
from .wholes import Regions, assemble, peaks
from ...nn.optim import adamw_update
from ...runtime.dtensor import DTensor
from .mixed import loss_and_grads as mixed_loss_and_grads
from ...base.precision import precision
from .reference import _masks, clip_grads, loss_and_grads as reference_loss_and_grads
from ..moe.fold import fold_of

#: The policy one precision wider than bfloat16's and FP8's (`_wider_grads`).
_FP32 = precision("fp32")


class Overflows:
    """The first floating-point overflow (or NaN made of finite numbers) numpy meets in a step: `first`, where it
    happened (the `at` it met it in: a part of one numpy process's step, or a run's own step number), and
    `kind`, "overflowed" or "made a NaN"; `said()` in words ("forward and backward at float32 overflowed").
    np.errstate's "call" mode records it where numpy's warnings would print its own source lines above the run's
    verdict, nothing paid while none happens. Each `at(where)` watches a part; code that sets its own
    np.errstate inside keeps it."""

    def __init__(self) -> None:
        self.first: Any = None
        self.kind = ""
        self.where: Any = "step"

    def __call__(self, kind: str, flag: int) -> None:
        if self.first is None:
            self.first, self.kind = self.where, "overflowed" if kind == "overflow" else "made a NaN"

    def said(self) -> Optional[str]:
        """Where the first overflow happened and what it did, in words; None where none happened."""
        return None if self.first is None else f"{self.first} {self.kind}"

    @contextmanager
    def at(self, where: Any) -> Iterator[None]:
        self.where = where
        with np.errstate(over="call", invalid="call", call=self):
            yield


def _mixed_step(start: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: int, policy: Any,
                grads: dict, microbatches: int = 1, routes: Optional[dict] = None, kept: str = "graph",
                laid: Optional[tuple] = None, fp8: Optional[dict] = None, ring: bool = False,
                watch: Optional[Overflows] = None) -> tuple:
    """The references of a step under a low-precision policy (spmdsim.models.gpt.mixed): (loss, gradients) of the
    same policy from the run's parameters at the step's start (its master copies), and the updated master
    copies of AdamW in float32 on the run's own gradients `grads` and moments (`start`: "params", "m", "v",
    each name -> whole array; the moments zeros before the first step). `microbatches` > 1: gradient
    accumulation as `_reference_step`'s (each microbatch its own dropout masks; losses and gradients averaged,
    the gradients in float32). `routes`: the ranks' experts (`_routes`), followed at near-ties. `kept`: the
    model's kept set (the rounding points of Megatron's fused kernels under "megatron": spmdsim.models.gpt.mixed).
    `fp8`: under an FP8 policy the run's scales at the step's start (spmdsim.models.gpt.mixed_fp8). `ring`: the
    run's attention core is ring attention (its rounding points: spmdsim.models.gpt.mixed.loss_and_grads).
    `watch`: records the step's first overflow (`Overflows`)."""
    watch = watch or Overflows()
    with watch.at(f"forward and backward at {policy.activation}"):
        loss, ref_grads = _policy_grads(start["params"], x, y, cfg, step, policy, microbatches, routes, kept, laid,
                                        fp8, ring)
    state = policy.dtype("optimizer")
    updated = {}
    for spec in param_specs(cfg):
        name = spec.name
        p, m, v = (start[k][name].astype(state) for k in ("params", "m", "v"))
        with watch.at(f"AdamW update of {name!r} at {np.dtype(state).name}"):
            adamw_update(p, grads[name].astype(state), m, v, step + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                         weight_decay=cfg.weight_decay if decays(spec) else 0.0)
        updated[name] = p
    return loss, ref_grads, updated


def _reference_step(moments: dict, params: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig,
                    step: int, microbatches: int = 1, routes: Optional[dict] = None,
                    laid: Optional[tuple] = None, watch: Optional[Overflows] = None) -> tuple:
    """(new moments, loss, grads, updated params) of one reference step; nothing given is changed in place.

    `microbatches` > 1: the batch's rows in that many equal microbatches, each with its own dropout masks
    (spmdsim.models.gpt.params.dropout_seed), their losses and gradients averaged: gradient accumulation.
    `routes`: MoE layer -> the ranks' (B, T, k) experts (`_routes`), which the reference follows at near-ties.
    `watch`: records the step's first overflow (`Overflows`).
    """
    watch = watch or Overflows()
    with watch.at("forward and backward at float64"):
        loss, grads = _float64_grads(params, x, y, cfg, step, microbatches, routes, laid)
    new_moments, updated = {"m": {}, "v": {}}, {}
    for spec in param_specs(cfg):
        name = spec.name
        p, m, v = params[name].copy(), moments["m"][name].copy(), moments["v"][name].copy()
        with watch.at(f"AdamW update of {name!r} at float64"):
            adamw_update(p, grads[name], m, v, step + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                         weight_decay=cfg.weight_decay if decays(spec) else 0.0)
        new_moments["m"][name], new_moments["v"][name], updated[name] = m, v, p
    return new_moments, loss, grads, updated


def _policy_grads(params: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: int, policy: Any,
                  microbatches: int, routes: Optional[dict], kept: str, laid: Optional[tuple], fp8: Optional[dict],
                  ring: bool) -> tuple:
    """(loss, gradients, clipped as the run clips them) of a step under `policy` (spmdsim.models.gpt.mixed), its
    arguments as `_mixed_step`'s: each microbatch's gradients of its loss scaled by 1 / microbatches before the
    backward, as the pipeline's ranks scale it (FP8's casts see the scaled values), summed (`scaled`)."""
    loss, grads = _microbatched(x.shape[0], microbatches, lambda rows, i: mixed_loss_and_grads(
        params, x[rows], y[rows], cfg, step, policy, _masks(cfg, step, True, x[rows].shape[0], i, laid),
        _rows(routes, rows), kept, fp8, laid, ring, 1.0 / microbatches), scaled=True)
    return loss, clip_grads(grads, cfg.clip)[1] if cfg.clip else grads


def _float64_grads(params: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: int, microbatches: int,
                   routes: Optional[dict], laid: Optional[tuple]) -> tuple:
    """(loss, gradients, clipped as the run clips them) of the float64 reference step
    (spmdsim.models.gpt.reference), its arguments as `_reference_step`'s; microbatches averaged."""
    loss, grads = _microbatched(x.shape[0], microbatches, lambda rows, i: reference_loss_and_grads(
        params, x[rows], y[rows], cfg, step, micro=i, routes=_rows(routes, rows), laid=laid))
    return loss, clip_grads(grads, cfg.clip)[1] if cfg.clip else grads


def _rows(routes: Optional[dict], rows: slice) -> Optional[dict]:
    """`routes` (MoE layer -> (B, T, k) experts) of the batch's `rows` (a microbatch's); None stays None."""
    return None if routes is None else {name: chosen[rows] for name, chosen in routes.items()}


def _routes(model: Any, cfg: GPTConfig) -> Optional[dict]:
    """MoE layer ("h1") -> every rank's tokens' experts of the step's forward, whole (B, T, k): one Allgather
    of each layer's (its batch rows split as the tokens are, copies over tp); None without MoE
    layers. The check's reference follows them where rounding alone can explain them (the ranks' and its own
    router logits differ by a unit in the last place here and there: spmdsim.models.moe.routing.followed)."""
    if cfg.moe is None or not model.moe_stats:
        return None
    mesh = model.mesh
    fold = fold_of(mesh.layout, cfg.moe.etp)  # folded (etp below tp): each tp rank routed its own share of tokens
    T, rows, _ = fold.token_map(tuple(mesh.layout.alias_name), cfg.moe.dropless)
    batch = mesh.layout(rows if fold.folded else model.batch, T, None)
    routes = {}
    for s in model.moe_stats:
        k = s.chosen.shape[-1]
        mine = DTensor(mesh, s.chosen, batch, (cfg.batch, cfg.seq, k))
        routes[s.layer] = mine.redistribute(mesh.layout(None, None, None)).local
    return routes


def _microbatched(batch: int, microbatches: int, one: Callable[[slice, Optional[int]], tuple],
                  scaled: bool = False) -> tuple:
    """(loss, gradients) of a batch of `batch` rows in `microbatches` equal microbatches, `one(rows, micro)` each
    (micro None: the whole batch at once), their losses and gradients averaged (in the gradients' own dtype):
    gradient accumulation, as a pipeline makes it. `scaled`: `one`'s gradients are of its loss scaled by
    1 / microbatches already, and are summed."""
    if microbatches == 1:
        return one(slice(None), None)
    size = batch // microbatches
    loss, grads = 0.0, {}
    for i in range(microbatches):
        part, g = one(slice(i * size, (i + 1) * size), i)
        loss += part / microbatches
        for name, value in g.items():
            value = value if scaled else value / microbatches
            grads[name] = value if i == 0 else grads[name] + value
    return loss, grads


def _zero_moments(cfg: GPTConfig) -> dict:
    zeros = {s.name: np.zeros(s.shape) for s in param_specs(cfg)}
    return {"m": zeros, "v": dict(zeros)}


def _checked_reference(where: Regions, start: np.ndarray, moments: dict, x: np.ndarray, y: np.ndarray,
                       cfg: GPTConfig, step: int, microbatches: int = 1, routes: Optional[dict] = None,
                       laid: Optional[tuple] = None) -> tuple:
    """`_reference_step` from the step's start as gathered (`_table`'s rows that `where.used` keeps), and the peaks
    (spmdsim.models.gpt.wholes.peaks) of its gradients and updated parameters: the work the ranks share
    (spmdsim.runtime.shared_reference.shared_once; spmdsim.models.gpt.pipeline's too, with its `microbatches`);
    the peaks' "overflow": where the step first overflowed (`Overflows`), or None."""
    watch = Overflows()
    moments, loss, grads, updated = _reference_step(moments, assemble(where, start)[0], x, y, cfg, step, microbatches,
                                                    routes, laid, watch)
    return moments, loss, grads, updated, {"grads": peaks(grads), "updated": peaks(updated), "overflow": watch.said()}


def _checked_mixed(where: Regions, start: np.ndarray, grads: np.ndarray, x: np.ndarray, y: np.ndarray,
                   cfg: GPTConfig, step: int, policy: Any, microbatches: int = 1,
                   routes: Optional[dict] = None, kept: str = "graph", laid: Optional[tuple] = None,
                   fp8: Optional[dict] = None, ring: bool = False) -> tuple:
    """`_mixed_step` from the step's start and the run's gradients as gathered (`_run_start`'s and `_table`'s rows
    that `where.used` keeps), and the peaks of its gradients and updated master copies: the work the ranks share
    (spmdsim.models.gpt.pipeline's too, with its `microbatches`); the peaks' "overflow": where the step first
    overflowed (`Overflows`), or None."""
    start_wholes = dict(zip(("params", "m", "v"), assemble(where, start, 3)))
    watch = Overflows()
    loss, ref_grads, updated = _mixed_step(start_wholes, x, y, cfg, step, policy, assemble(where, grads)[0],
                                           microbatches, routes, kept=kept, laid=laid, fp8=fp8, ring=ring, watch=watch)
    with watch.at("forward and backward one precision wider"):
        wider = _wider_grads(start_wholes["params"], x, y, cfg, step, policy, microbatches, routes, kept, laid, ring)
        rounding = {name: float(np.max(np.abs(g - wider[name]), initial=0.0)) for name, g in ref_grads.items()}
    return loss, ref_grads, updated, {"grads": peaks(ref_grads), "updated": peaks(updated), "rounding": rounding,
                                      "overflow": watch.said()}


def _wider_grads(params: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: int, policy: Any,
                 microbatches: int = 1, routes: Optional[dict] = None, kept: str = "graph",
                 laid: Optional[tuple] = None, ring: bool = False) -> dict:
    """The gradients of `_mixed_step`'s reference one precision wider, from the same parameters as the policy
    holds them (rounded to its parameter dtype), masks and routes: under bfloat16 and FP8 the same step under
    the fp32 policy (the same rounding points, each at float32), under fp32 the float64 reference. How far the
    policy's reference lies from them is what its own rounding does to each gradient (the check's rounding
    ratio: spmdsim.models.gpt.step_check.rounding_ratio)."""
    params = {name: np.asarray(value).astype(policy.dtype("param")).astype(np.float64)
              for name, value in params.items()}
    if policy.activation == "float32" and policy.fp8 is None:
        return _float64_grads(params, x, y, cfg, step, microbatches, routes, laid)[1]
    return _policy_grads(params, x, y, cfg, step, _FP32, microbatches, routes, kept, laid, None, ring)[1]


def _resumed_moments(where: Regions, start: np.ndarray) -> dict:
    """The reference's moments at a resumed run's first step: the run's (`_run_start`'s rows), whole."""
    _, m, v = assemble(where, start, 3)
    return {"m": m, "v": v}
