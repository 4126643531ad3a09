"""PyTorch's keywords that users pass by habit to spmdsim's namesakes (checkpoint, the optimizers,
clip_grad_norm_): one line each naming the keyword, its value and what spmdsim does instead, where
Python's TypeError said only "unexpected keyword argument". Other keywords stay Python's TypeError."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.base.foreign import ForeignKeyword
from spmdsim.errors import OperatorError
from spmdsim.nn.autograd import checkpoint
from spmdsim.nn.optim import SGD, Adam, AdamW, DistributedAdamW, clip_grad_norm_

CASES = [
    ("checkpoint", lambda m, x, w: checkpoint(lambda a: a @ w, x, use_reentrant=False),
     "checkpoint(use_reentrant=False): spmdsim does not take PyTorch's use_reentrant; the region is one node "
     "whose backward runs it again and walks that graph, as use_reentrant=False does; drop the keyword"),
    ("checkpoint", lambda m, x, w: checkpoint(lambda a: a @ w, x, preserve_rng_state=True),
     "checkpoint(preserve_rng_state=True): spmdsim does not take PyTorch's preserve_rng_state; a dropout draws "
     "its mask from its seed"),
    ("AdamW", lambda m, x, w: AdamW([w], lr=0.1, fused=True),
     "AdamW(fused=True): spmdsim does not take PyTorch's fused; an update is numpy on this rank's blocks, with "
     "no kernel to choose"),
    ("SGD", lambda m, x, w: SGD([w], lr=0.1, foreach=False),
     "SGD(foreach=False): spmdsim does not take PyTorch's foreach; an update is numpy"),
    ("Adam", lambda m, x, w: Adam([w], weight_decay=0.1),
     "Adam(weight_decay=0.1): spmdsim does not take PyTorch's weight_decay; SGD and Adam decay nothing; "
     "AdamW(weight_decay=...) decays apart from the gradient"),
    ("DistributedAdamW", lambda m, x, w: DistributedAdamW([w], m, fused=True),
     "DistributedAdamW(fused=True): spmdsim does not take PyTorch's fused"),
    ("clip_grad_norm_", lambda m, x, w: clip_grad_norm_([w], 1.0, foreach=True),
     "clip_grad_norm_(foreach=True): spmdsim does not take PyTorch's foreach; each rank sums the squares"),
    ("clip_grad_norm_", lambda m, x, w: clip_grad_norm_([w], 1.0, norm_type=2.0),
     "clip_grad_norm_(norm_type=2.0): spmdsim does not take PyTorch's norm_type; the norm is the 2-norm"),
]


def _run(call):
    """The message `call(mesh, x, w)` raised on each rank of 2 (one entry when every rank raised alike)."""
    def body():
        layout = Layout((2,), ("dp",))
        mesh = Mesh(layout)
        x = DTensor.from_global(mesh, np.ones((4, 3)), layout("dp", None)).requires_grad_()
        w = DTensor.from_global(mesh, np.ones((3, 2)), layout(None, None)).requires_grad_()
        try:
            call(mesh, x, w)
        except Exception as e:  # noqa: BLE001 - the kind is what is asserted
            return type(e), str(e)
        return None

    return set(spmdsim.simulate(2, body))


@pytest.mark.parametrize("name, call, start", CASES, ids=[c[2].split(":")[0] for c in CASES])
def test_a_pytorch_keyword_is_refused_in_one_line_saying_what_spmdsim_does(name, call, start):
    ((kind, message),) = _run(call)
    assert issubclass(kind, ForeignKeyword) and issubclass(kind, TypeError) and issubclass(kind, OperatorError)
    assert message.startswith(start) and "\n" not in message, message


def test_a_keyword_no_framework_has_stays_pythons_type_error():
    ((kind, message),) = _run(lambda m, x, w: AdamW([w], lr=0.1, fusde=True))
    assert kind is TypeError and message == "AdamW() got an unexpected keyword argument 'fusde'"
