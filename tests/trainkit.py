"""Finite-difference harness the training MPI tests share (not a test module)."""
from __future__ import annotations

import numpy as np

EPS = 1e-6
FD_RTOL, FD_ATOL = 1e-6, 1e-8


def dt(mesh, array, layout, grad=False):
    """A DTensor cut from a global array every rank has (optionally requiring grad)."""
    from spmdsim.runtime import DTensor

    t = DTensor.from_global(mesh, np.asarray(array), layout)
    return t.requires_grad_() if grad else t


def central_differences(fn, arrays, index):
    """d fn / d arrays[index] by central differences (fn returns a float)."""
    base = [np.array(a, dtype=np.float64, copy=True) for a in arrays]
    x = base[index]
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        keep = x[i]
        x[i] = keep + EPS
        up = fn(*base)
        x[i] = keep - EPS
        down = fn(*base)
        x[i] = keep
        out[i] = (up - down) / (2 * EPS)
    return out


def mse_ref(ref, target):
    """The numpy loss mean((ref(...) - target)^2) as a function of the global inputs."""
    return lambda *arrays: float(np.mean((ref(*arrays) - target) ** 2))


def check_grads(tensors, arrays, loss_ref, loss):
    """Backward from `loss`; every tensor requiring grad against central differences; loss against its reference.

    Returns the verdicts (all ranks agree on each).
    """
    verdicts = [loss.check(np.asarray(loss_ref(*arrays)), rtol=1e-12, atol=1e-14)]
    loss.backward()
    for i, t in enumerate(tensors):
        if t.requires_grad:
            assert t.grad is not None, f"input {i} got no gradient"
            assert t.grad.layout == t.layout.with_partial(()), (t.grad.layout, t.layout)
            fd = central_differences(loss_ref, arrays, i)
            verdicts.append(t.grad.check(fd, rtol=FD_RTOL, atol=FD_ATOL))
    return verdicts


def mse_check(mesh, tensors, arrays, y, ref, seed=7):
    """mse_loss(y, seeded target) backward, checked against central differences of `ref`."""
    from spmdsim.nn.ops import mse_loss

    target = np.random.default_rng(seed).standard_normal(y.global_shape)
    loss = mse_loss(y, dt(y.mesh, target, y.layout))
    return check_grads(tensors, arrays, mse_ref(ref, target), loss)
