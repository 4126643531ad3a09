"""PyTorch's keywords that users pass by habit to spmdsim's namesakes (checkpoint, the optimizers,
clip_grad_norm_): a value that asks for what spmdsim does runs unchanged; a value asking for something
spmdsim does not do is refused in one line naming the keyword, its value, what spmdsim does instead and
the values it takes. Other keywords stay Python's TypeError."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.base.foreign import ForeignKeyword
from spmdsim.errors import OperatorError
from spmdsim.nn.autograd import checkpoint
from spmdsim.nn.optim import SGD, Adam, AdamW, DistributedAdamW, clip_grad_norm_

REFUSED = [
    (lambda m, x, w: checkpoint(lambda a: a @ w, x, use_reentrant=True),
     "checkpoint(use_reentrant=True): spmdsim does not do this; the region is one node whose backward runs it "
     "again and walks that graph, as use_reentrant=False does; use_reentrant may be False or left out"),
    (lambda m, x, w: checkpoint(lambda a: a @ w, x, preserve_rng_state=False),
     "checkpoint(preserve_rng_state=False): spmdsim does not do this; a dropout draws its mask from its seed, "
     "so the recomputed masks are always the forward's; preserve_rng_state may be True or left out"),
    (lambda m, x, w: checkpoint(lambda a: a @ w, x, determinism_check="none"),
     "checkpoint(determinism_check='none'): spmdsim does not do this; the recomputed output's global shape"),
    (lambda m, x, w: AdamW([w], lr=0.1, maximize=True),
     "AdamW(maximize=True): spmdsim does not do this; it minimizes; negate the loss instead; maximize may be "
     "False or left out"),
    (lambda m, x, w: AdamW([w], lr=0.1, fused="yes"),
     "AdamW(fused='yes'): spmdsim does not do this; an update is numpy on this rank's blocks (AdamW's over "
     "flat groups of them); fused may be None, False or True or left out"),
    (lambda m, x, w: SGD([w], lr=0.1, differentiable=True),
     "SGD(differentiable=True): spmdsim does not do this; an update is never recorded for autograd"),
    (lambda m, x, w: SGD([w], lr=0.1, nesterov=True), "SGD(nesterov=True): spmdsim does not do this; SGD's"),
    (lambda m, x, w: Adam([w], weight_decay=0.1),
     "Adam(weight_decay=0.1): spmdsim does not do this; SGD and Adam decay nothing; AdamW(weight_decay=...) "
     "decays apart from the gradient; weight_decay may be 0 or left out"),
    (lambda m, x, w: Adam([w], amsgrad=1), "Adam(amsgrad=1): spmdsim does not do this; Adam and AdamW"),
    (lambda m, x, w: DistributedAdamW([w], m, maximize=True), "DistributedAdamW(maximize=True): spmdsim does not"),
    (lambda m, x, w: clip_grad_norm_([w], 1.0, norm_type=float("inf")),
     "clip_grad_norm_(norm_type=inf): spmdsim does not do this; the norm is the 2-norm, PyTorch's default "
     "norm_type 2; norm_type may be 2 or left out"),
    (lambda m, x, w: clip_grad_norm_([w], 1.0, foreach=None, error_if_nonfinite=True),
     "clip_grad_norm_(error_if_nonfinite=True): spmdsim does not do this; a nan or inf norm is returned"),
]


def _run(call, step=False):
    """What `call(mesh, x, w)` gave on each rank of 2 (one entry when every rank gave alike): the error's kind
    and message, or with `step` w's values after one backward of sum(x @ w) and the call."""
    def body():
        layout = Layout((2,), ("dp",))
        mesh = Mesh(layout)
        x = DTensor.from_global(mesh, np.arange(12.0).reshape(4, 3), layout("dp", None)).requires_grad_()
        w = DTensor.from_global(mesh, np.ones((3, 2)), layout(None, None)).requires_grad_()
        try:
            out = call(mesh, x, w)
        except Exception as e:  # noqa: BLE001 - the kind is what is asserted
            return type(e), str(e)
        if not step:
            return None
        y = out if isinstance(out, DTensor) else x @ w
        y.sum().backward(keep_pending=out.params if isinstance(out, DistributedAdamW) else ())
        if hasattr(out, "step"):
            out.step()
        else:
            clip_grad_norm_([w], 1.0)
        return w.gather().tobytes()

    return set(spmdsim.simulate(2, body))


@pytest.mark.parametrize("call, start", REFUSED, ids=[c[1].split(":")[0] for c in REFUSED])
def test_a_value_spmdsim_does_not_do_is_refused_in_one_line_saying_what_it_does(call, start):
    ((kind, message),) = _run(call)
    assert issubclass(kind, ForeignKeyword) and issubclass(kind, TypeError) and issubclass(kind, OperatorError)
    assert message.startswith(start) and "\n" not in message, message


ACCEPTED = [
    ("checkpoint", lambda m, x, w, **k: checkpoint(lambda a, b: a @ b, x, w, **k),
     dict(use_reentrant=False, preserve_rng_state=True, determinism_check="default")),
    ("AdamW", lambda m, x, w, **k: AdamW([w], lr=0.1, **k),
     dict(fused=True, foreach=False, capturable=None, differentiable=False, maximize=False, amsgrad=False)),
    ("AdamW-fused-none", lambda m, x, w, **k: AdamW([w], lr=0.1, **k), dict(fused=None, foreach=True)),
    ("SGD", lambda m, x, w, **k: SGD([w], lr=0.1, momentum=0.9, **k),
     dict(nesterov=False, dampening=0, weight_decay=0.0, foreach=True, maximize=np.False_)),
    ("Adam", lambda m, x, w, **k: Adam([w], lr=0.1, **k), dict(weight_decay=0, fused=False, capturable=True)),
    ("DistributedAdamW", lambda m, x, w, **k: DistributedAdamW([w], m, lr=0.1, **k), dict(fused=True)),
    ("clip_grad_norm_", lambda m, x, w, **k: clip_grad_norm_([w], 1.0, **k) if w.grad is not None else None,
     dict(norm_type=2.0, error_if_nonfinite=False, foreach=None)),
]


@pytest.mark.parametrize("call, keywords", [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_a_value_asking_for_what_spmdsim_does_runs_unchanged(call, keywords):
    with_keywords = _run(lambda m, x, w: call(m, x, w, **keywords), step=True)
    assert len(with_keywords) == 1 and isinstance(next(iter(with_keywords)), bytes), with_keywords
    assert with_keywords == _run(lambda m, x, w: call(m, x, w), step=True)


def test_norm_type_2_clips_as_without_it():
    def clipped(**k):
        def body():
            mesh = Mesh(Layout((2,), ("dp",)))
            w = DTensor.from_global(mesh, np.ones((3, 2)), mesh.layout(None, None)).requires_grad_()
            (w * 4.0).sum().backward()
            return clip_grad_norm_([w], 1.0, **k), w.grad.gather().tobytes()
        return set(spmdsim.simulate(2, body))

    assert clipped(norm_type=2) == clipped(norm_type=2.0) == clipped() and len(clipped()) == 1


def test_a_keyword_no_framework_has_stays_pythons_type_error():
    ((kind, message),) = _run(lambda m, x, w: AdamW([w], lr=0.1, fusde=True))
    assert kind is TypeError and message == "AdamW() got an unexpected keyword argument 'fusde'"
