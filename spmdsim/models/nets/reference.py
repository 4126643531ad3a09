"""Single-process training of a seed `Network` in numpy float64: the reference the MPI trainer is checked against.

Pure numpy; never imports mpi4py. `ReferenceTrainer(net)` holds every
parameter whole (from the same SeededTensors the ranks cut their shards
from), runs the stages forward on the global batch, cross-entropy of the
output's last dim against the labels, the backward through `reference_grad`
and the optimizer update (textbook SGD with momentum and Adam, written
independently of `spmdsim.nn.optim`). Each `step` returns the loss, every
parameter's gradient and every parameter after the update, and beside each
the magnitudes that entered it (`ReferenceStep.scales`): the same step
computed on absolute values (|x| @ |W| for a product, the sum of |terms| for a
sum, carried through the backward), the scale a check's tolerance follows
(docs/explanation/tolerances.md, "Tolerances").
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...references import forward as reference
from ...references import backward as rg
from ...errors import OperatorError
from .model import Network
from ...base.once import once
from ..gpt.wholes import assemble

#: numpy's overflow and invalid warnings off in the step: a diverging run's step says it in one line (the
#: run's own stop, spmdsim.models.nets.train, and the check's count of non-finite values).
_QUIET = {"over": "ignore", "invalid": "ignore"}

__all__ = ["ReferenceStep", "ReferenceTrainer", "OPTIMIZERS"]

#: Optimizers both trainers know.
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class ReferenceStep:
    """One training step of the reference: loss, then per parameter (stage order) its gradient and new value.

    `loss_scale`, `grad_scales`, `param_scales`: the magnitudes that entered
    each (elementwise, >= the value's own |value|): a float64 (or float32)
    computation of the same step in another order can differ from the
    reference by at most a few eps per addition times these, not times the
    result, which can be far smaller than its terms (a loss near 0).
    """

    loss: float
    grads: tuple[np.ndarray, ...]
    params: tuple[np.ndarray, ...]
    loss_scale: float = 0.0
    grad_scales: tuple[np.ndarray, ...] = ()
    param_scales: tuple[np.ndarray, ...] = ()


class ReferenceTrainer:
    """``ReferenceTrainer(net, optimizer="sgd", lr=1e-2, momentum=0.0)``: the whole network in one process
    (under MPI, spmdsim.models.nets.shared.SharedReferenceTrainer has rank 0 step it for all ranks)."""

    def __init__(self, net: Network, optimizer: str = "sgd", lr: float = 1e-2, momentum: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        if optimizer not in OPTIMIZERS:
            raise OperatorError(f"optimizer {optimizer!r} must be one of {OPTIMIZERS!r}")
        self.net = net
        self.optimizer, self.lr, self.momentum, self.betas, self.eps = optimizer, lr, momentum, betas, eps
        self.params = [p.source.full().astype(np.float64) for s in net.stages for p in s.params]
        self.state: list = [None] * len(self.params)
        self.steps = 0

    def step(self, x: np.ndarray, labels: np.ndarray, anchor: Any = None) -> ReferenceStep:
        """Forward, cross-entropy, backward and update on the global batch `x` with `labels`.

        `anchor`: the run's step (spmdsim.models.nets.train.Anchor, from ``NetworkTrainer.step(..., anchor=True)``):
        the loss and gradients are computed from the run's parameters at the step's start instead of this
        trainer's own, and the update is this optimizer's on the run's own inputs (its parameters, state and
        gradients), each rank's region from its own blocks; `params` and `param_scales` are then functions of
        that region (DTensor.check takes them so); this trainer's own parameters and state are left as they
        were. Every step is checked at rounding level: the gradients at
        the run's very parameters, the update on the run's very inputs (scaled by that step's terms alone).
        Free-running (no anchor), two trajectories whose gradients differ only in the order of their sums
        drift apart under Adam, which divides each gradient by its history's size (docs/howto/train.md).

        Simulated ranks with equal trainers and batches compute it once
        (`spmdsim.runtime.sim.once`): the step's arrays are then shared, read-only.
        """
        config = (self.net, self.optimizer, self.lr, self.momentum, self.betas, self.eps)
        if anchor is not None:
            with np.errstate(**_QUIET):
                result = self._anchored(config, anchor, x, labels)
            self.steps += 1
            return result
        with np.errstate(**_QUIET):
            result, params, state = self._computed(config, x, labels)
        self.params, self.state = list(params), list(state)
        self.steps += 1
        return result

    def _computed(self, config: tuple, x: np.ndarray, labels: np.ndarray) -> tuple:
        """(ReferenceStep, parameters after the update, optimizer state after it) of this step."""
        return once(("spmdsim.ReferenceTrainer.step", self.steps), _train_step, config, tuple(self.params),
                    tuple(self.state), self.steps, x, labels)

    def _anchored(self, config: tuple, anchor: Any, x: np.ndarray, labels: np.ndarray) -> ReferenceStep:
        """The ReferenceStep from the run's step (`anchor`): its loss and gradients computed once for all the
        ranks (`_shared_anchored`), its update of this rank's region from this rank's blocks."""
        shared = self._shared_anchored(anchor, x, labels)
        blocks, kinds = anchor.blocks, anchor.kinds
        optimizer, lr, momentum, betas, eps = config[1:]
        news, scales = [], []
        for i, (p, g) in enumerate(zip(blocks["params"], blocks["grads"])):
            p, g = np.asarray(p, np.float64), np.asarray(g, np.float64)
            if optimizer == "adam":
                opt = (np.asarray(blocks["m"][i], np.float64), np.asarray(blocks["v"][i], np.float64))
            else:  # SGD's buffer: zeros before the first step (momentum x 0 + g is g, the buffer's first value)
                opt = np.asarray(blocks["buffer"][i], np.float64) if "buffer" in kinds else None
            new, _, scale = _update(optimizer, lr, momentum, betas, eps, self.steps + 1, p, g, (opt, None), None)
            news.append(_Region(new))
            scales.append(_Region(scale))
        return replace(shared, params=tuple(news), param_scales=tuple(scales))

    def _shared_anchored(self, anchor: Any, x: np.ndarray, labels: np.ndarray) -> ReferenceStep:
        """The loss and gradients (and their scales) from the run's parameters, computed once for all."""
        return once(("spmdsim.ReferenceTrainer.anchored", self.steps), _anchored_step, self.net, anchor.where,
                    anchor.rows, x, labels)


class _Region:
    """An anchored step's updated parameter (or its scale) on one rank: its region's block, which
    DTensor.check asks for by that region's slices."""

    __slots__ = ("block",)

    def __init__(self, block: np.ndarray) -> None:
        self.block = block

    def __call__(self, region: tuple) -> np.ndarray:
        shape = tuple(s.stop - s.start for s in region)
        if shape != self.block.shape:
            raise OperatorError(f"an anchored reference step holds this rank's block {self.block.shape!r}, "
                                f"not a region of shape {shape!r}: check it on the rank whose step it anchors")
        return self.block


def _anchored_step(net: Network, where: Any, rows: np.ndarray, x: np.ndarray, labels: np.ndarray) -> ReferenceStep:
    """The loss and gradients (with their scales) of the step from the run's parameters at its start, made whole
    here from every rank's blocks (`where`, `rows`: spmdsim.models.nets.train.Anchor's) by the rank that computes
    for all; no parameters: the update is each rank's own (ReferenceTrainer._anchored)."""
    loss, grads, loss_scale, grad_scales = _gradients(net, tuple(assemble(where, rows)[0].values()), x, labels)
    return ReferenceStep(loss, grads, (), loss_scale, grad_scales, ())


def _train_step(config: tuple, params: tuple, state: tuple, steps: int, x: np.ndarray,
                labels: np.ndarray) -> tuple:
    """(ReferenceStep, parameters after the update, optimizer state after it); changes nothing given."""
    net, optimizer, lr, momentum, betas, eps = config
    loss, grads, loss_scale, grad_scales = _gradients(net, params, x, labels)
    updated = [_update(optimizer, lr, momentum, betas, eps, steps + 1, p, g, st, gs)
               for p, g, st, gs in zip(params, grads, state, grad_scales)]
    new_params = tuple(p for p, _, _ in updated)
    step = ReferenceStep(loss, grads, tuple(p.copy() for p in new_params), loss_scale, grad_scales,
                         tuple(s for _, _, s in updated))
    return step, new_params, tuple(st for _, st, _ in updated)


def _gradients(net: Network, params: tuple, x: np.ndarray, labels: np.ndarray) -> tuple:
    """(loss, gradients, the loss's magnitudes, the gradients') of the step from `params`: forward,
    cross-entropy and backward, each also on magnitudes."""
    saved = []
    it = iter(params)
    value = np.asarray(x, dtype=np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x)
    mag = np.abs(value) if value.dtype.kind == "f" else value  # ids (an embedding's input) stay ids
    carried = iter([np.abs(p) for p in params])
    for stage in net.stages:
        ps = [next(it) for _ in stage.params]
        pms = [next(carried) for _ in stage.params]
        saved.append((value, ps, mag, pms))
        mag = _forward_scale(stage.kind, value, mag, pms, net.batch_dims)
        value = _forward(stage.kind, value, ps, net.batch_dims)
    classes = value.shape[-1]
    loss, grad = rg.cross_entropy(value.reshape(-1, classes), np.asarray(labels).reshape(-1))
    loss_scale, gscale = _cross_entropy_scale(value.reshape(-1, classes), mag.reshape(-1, classes),
                                              np.asarray(labels).reshape(-1))
    grad, gscale = grad.reshape(value.shape), gscale.reshape(value.shape)
    grads: list = []
    grad_scales: list = []
    for index in reversed(range(len(net.stages))):
        inp, ps, inp_mag, pms = saved[index]
        first = not any(s.params for s in net.stages[:index])  # nothing before needs a gradient
        kind = net.stages[index].kind
        new_grad, pgrads = _backward(kind, inp, ps, grad, not first)
        gscale, pscales = _backward_scale(kind, inp, inp_mag, pms, gscale, not first)
        grad = new_grad
        grads = list(pgrads) + grads
        grad_scales = list(pscales) + grad_scales
    return loss, tuple(grads), loss_scale, tuple(grad_scales)


def _forward_scale(kind: str, x: np.ndarray, mag: np.ndarray, pms: list, batch_dims: int) -> np.ndarray:
    """The magnitudes that entered a stage's output, from those of its input `mag` and parameters `pms`.

    A product: |x| @ |W| + |b| (the input's magnitudes in place of |x|, so
    that an error it carries is covered as its rounding is). An
    activation: the input's, times the largest slope (1 for ReLU: a value that
    crosses the kink moves by no more than its input's error).
    """
    if kind == "flatten":
        return mag.reshape(mag.shape[:batch_dims] + (-1,))
    if kind in ("relu", "gelu"):
        return mag * np.maximum(np.abs(rg.ACTIVATION_GRADS[kind](x)), 1.0)
    if kind == "embedding":
        return reference.embedding(x, pms[0])
    return reference.linear(mag, *pms)


def _cross_entropy_scale(z: np.ndarray, mag: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """(magnitude of the mean loss, magnitudes of the logits' gradient) of cross-entropy.

    With p = softmax(z), M the logits' magnitudes and S = sum_k p_k M_k of a
    row: an error dz within M moves p_j by at most p_j (M_j + S - 2 p_j M_j)
    (to first order: dp_j = p_j (dz_j - sum_k p_k dz_k), small where the row
    is saturated), and the row's loss lse(z) - z[t] by S + M_t - 2 p_t M_t;
    beside those, the terms' own sizes (p_j and the one-hot 1; |lse| and
    |z[t]|). Losses and gradients are over the rows.
    """
    rows = np.arange(z.shape[0])
    top = z.max(axis=1)
    lse = np.log(np.exp(z - top[:, None]).sum(axis=1)) + top
    probs = np.exp(z - lse[:, None])
    spread = np.sum(probs * mag, axis=1)
    mt, pt = mag[rows, labels], probs[rows, labels]
    moved_loss = np.maximum(spread + mt - 2 * pt * mt, 0.0)
    loss_scale = float(np.sum(np.abs(lse) + np.abs(z[rows, labels]) + moved_loss) / z.shape[0])
    grad = probs * (1 + np.maximum(mag + spread[:, None] - 2 * probs * mag, 0.0))
    grad[rows, labels] += 1.0
    return loss_scale, grad / z.shape[0]


def _backward_scale(kind: str, x: np.ndarray, mag: np.ndarray, pms: list, dmag: np.ndarray,
                    need_dx: bool) -> tuple:
    """(magnitudes of the input's gradient (None unless `need_dx`), those of the parameters' gradients).

    The backward run on magnitudes: the parameters' |W| (`pms`), the forward's input magnitudes `mag`
    and the output gradient's `dmag` in place of W, x and dy (a product's
    terms); an activation's slope at its largest (ReLU's 1 even where the unit
    is off, so a unit that crosses the kink is covered), GELU's curvature
    (|gelu''| < 1) times the gradient and the input's magnitudes added.
    """
    if kind == "flatten":
        return (dmag.reshape(x.shape) if need_dx else None), ()
    if kind in ("relu", "gelu"):
        if not need_dx:
            return None, ()
        out = dmag * np.maximum(np.abs(rg.ACTIVATION_GRADS[kind](x)), 1.0)
        return (out + dmag * mag if kind == "gelu" else out), ()
    if kind == "embedding":
        return None, (rg.embedding_grad(x, pms[0].shape[0], dmag),)
    dx, dw, db = rg.linear_grads(mag, pms[0], pms[1] if len(pms) > 1 else None, dmag, need_dx)
    return dx, (dw,) if db is None else (dw, db)


def _update(optimizer: str, lr: float, momentum: float, betas: tuple, eps: float, steps: int,
            p: np.ndarray, g: np.ndarray, state: Any, gmag: np.ndarray) -> tuple:
    """(new parameter, new state, its magnitudes): textbook SGD (with momentum) or Adam at step `steps`.

    `state`: None before the first step, else (the optimizer's state, the
    parameter's magnitudes so far). `gmag`: the gradient's. A parameter is
    the sum of its first value and every update since, so its magnitudes are
    |first value| + the sum of |update| (SGD: lr x the gradient's magnitudes,
    which cover an error within them; Adam's update m / (sqrt(v) + eps) is
    taken at its own size: it divides the gradient by its history's size).
    Anchored (magnitudes None: a run's own parameter, state and gradient), the
    update of those very inputs rounds by a few eps of this step's terms: |p|
    plus lr x the terms of the new buffer or first moment (their sums can cancel)
    over Adam's denominator.
    """
    opt, pmag = state if state is not None else (None, np.abs(p))
    anchored = pmag is None  # the run's parameters, state and gradients: this step's terms are the scale
    if anchored:
        pmag = np.abs(p)
    if optimizer == "sgd":
        if momentum:
            if anchored:  # the buffer's sum rounds by its terms' size, not by its gradient's
                gmag = momentum * np.abs(opt) + np.abs(g) if opt is not None else np.abs(g)
            opt = g.copy() if opt is None else momentum * opt + g
            g = opt
            gmag = gmag if anchored else np.maximum(gmag, np.abs(g))
        elif anchored:
            gmag = np.abs(g)
        pmag = pmag + lr * gmag
        return p - lr * g, (opt, pmag), pmag
    b1, b2 = betas
    m, v = opt if opt is not None else (np.zeros_like(p), np.zeros_like(p))
    terms = b1 * np.abs(m) + (1 - b1) * np.abs(g) if anchored else None  # what m's new value rounds by
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**steps), v / (1 - b2**steps)
    update = lr * m_hat / (np.sqrt(v_hat) + eps)
    # Anchored: the update of the run's very inputs, which rounds by a few eps of its terms; free-running,
    # the update at its own size summed over the steps (a parameter is its first value plus every update).
    pmag = pmag + (lr * terms / (1 - b1**steps) / (np.sqrt(v_hat) + eps) if anchored else np.abs(update))
    return p - update, ((m, v), pmag), pmag


def _forward(kind: str, x: np.ndarray, ps: list, batch_dims: int) -> np.ndarray:
    if kind == "flatten":
        return x.reshape(x.shape[:batch_dims] + (-1,))
    if kind in ("relu", "gelu"):
        return reference.activation(kind)(x)
    if kind == "embedding":
        return reference.embedding(x, ps[0])
    return reference.linear(x, *ps)  # matmul, linear, column_linear, row_linear


def _backward(kind: str, x: np.ndarray, ps: list, dy: np.ndarray, need_dx: bool) -> tuple:
    """(gradient of the stage's input (None unless `need_dx`), gradients of its parameters)."""
    if kind == "flatten":
        return (dy.reshape(x.shape) if need_dx else None), ()
    if kind in ("relu", "gelu"):
        return (dy * rg.ACTIVATION_GRADS[kind](x) if need_dx else None), ()
    if kind == "embedding":
        return None, (rg.embedding_grad(x, ps[0].shape[0], dy),)
    dx, dw, db = rg.linear_grads(x, ps[0], ps[1] if len(ps) > 1 else None, dy, need_dx)
    return dx, (dw,) if db is None else (dw, db)
