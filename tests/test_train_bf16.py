

def test_a_pending_gradient_is_summed_before_it_is_rounded(monkeypatch):
    """Without sp an activation's gradient is a pending sum over tp (each rank's column-parallel products
    gave their part): a bfloat16 node rounds it only whole, summed first (one Allreduce, Megatron's), as the
    reference rounds the whole value; moves (their backward sums it) and a parameter's views (its gradient
    stays float32) pass it on."""
    from spmdsim.autograd import engine
    from spmdsim.autograd.graph import _passed

    real, seen = engine._prepared, []

    def prepared(node, dy, run=None, inputs=()):
        out = real(node, dy, run, inputs)
        if node.low is not None and run is not _passed and not engine._of_parameters(inputs):
            seen.append((bool(dy.layout.partial), bool(out.layout.partial)))
        return out

    monkeypatch.setattr(engine, "_prepared", prepared)
    steps = _steps(4, 1, 4, False, steps=1)
    assert steps[0].passed
    assert any(came for came, _ in seen)  # pending sums reached bfloat16 nodes
    assert not any(left for _, left in seen)  # and none was handed on unsummed (unrounded)
