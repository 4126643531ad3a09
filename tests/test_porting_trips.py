"""What a PyTorch DTensor or JAX user writes first, ported as written: PyTorch's keywords on from_local and
redistribute, JAX's short PartitionSpecs; each either does what the other framework does or ends in one line."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import DTensor, Layout, Mesh, OperatorError, PlanError, simulate
from spmdsim.layouts.dialects import Replicate

A = np.arange(32.0).reshape(8, 4)


def _on_4(call):
    """`call(mesh, x)` on 4 simulated ranks of a dp 2 x tp 2 mesh, x = A split on its rows over dp."""
    def main():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        return call(mesh, DTensor.from_global(mesh, A, mesh.layout("dp", None)))
    return simulate(4, main)


def test_pytorchs_redistribute_keywords_are_one_line():
    """x.redistribute(device_mesh=mesh, placements=[...]) and async_op=True ended in a TypeError traceback."""
    said = ("redistribute takes the target TensorLayout alone, not PyTorch's (device_mesh, placements): "
            "x.redistribute(placements_to_layout(placements, x.mesh, x.ndim)), from spmdsim.layouts.dialects")
    for keywords in ({"placements": [Replicate(), Replicate()]},
                     {"device_mesh": None, "placements": [Replicate(), Replicate()]}):
        with pytest.raises(PlanError) as caught:
            _on_4(lambda mesh, x: x.redistribute(**keywords))
        assert str(caught.value) == said
    with pytest.raises(OperatorError, match=r"^redistribute\(async_op=True\): spmdsim does not do this; the move "
                                            r"is done when redistribute returns"):
        _on_4(lambda mesh, x: x.redistribute(mesh.layout(None, None), async_op=True))
    moved = _on_4(lambda mesh, x: x.redistribute(mesh.layout(None, "tp"), async_op=False).gather())
    assert all(np.array_equal(m, A) for m in moved)

