"""What an eager step's operators decide once per call signature and keep (docs/explanation/performance.md): a
repeated fused piece's product and an einsum rule's kept products run the recipe's function without its test of
a dry run and bfloat16 (`spmdsim.references.contraction.pair_plain`), with `pair`'s bits."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh
from spmdsim.references import contraction
from spmdsim.references.contraction import pair, pair_plain
from spmdsim.runtime.dtensor_methods import _FOREIGN_BY_NAME
from spmdsim.models.gpt import GPTConfig, batch, encode, load_text
from spmdsim.models.gpt.parallel import GPT
from spmdsim.models.gpt.params import param_specs

SMALL = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.2)
CASES = [  # a plain GEMM, a batched one, a reorder (swapped recipe), letters summed alone, an outer product
    ("ij", (3, 4), "jk", (4, 5), "ik"),
    ("tbe", (6, 2, 3), "tbd", (6, 2, 4), "de"),
    ("tbd", (6, 2, 4), "vd", (5, 4), "btv"),
    ("ijz", (3, 4, 2), "jky", (4, 5, 3), "ik"),
    ("i", (3,), "j", (4,), "ij"),
]


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_pair_plain_gives_pairs_bits_without_the_test(dtype):
    rng = np.random.default_rng(0)
    contraction._RUNS.clear()
    contraction._PLAIN.clear()
    for k, (a_word, a_shape, b_word, b_shape, out) in enumerate(CASES):
        a, b = (rng.standard_normal(s).astype(dtype) * 4 for s in (a_shape, b_shape))
        first = pair_plain(a_word, a, b_word, b, out)  # (made by pair_plain: both functions kept)
        want = pair(a_word, a, b_word, b, out)
        again = pair_plain(a_word, a, b_word, b, out)
        for got in (first, again):
            assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), k
            assert got.flags.c_contiguous
        run = contraction._RUNS[(a_word, a_shape, b_word, b_shape, out)]
        plain = contraction._PLAIN[(a_word, a_shape, b_word, b_shape, out)]
        assert plain is run.plain and plain.recipe is run.recipe
        assert "_general" in run.__code__.co_names and "_general" not in plain.__code__.co_names


def _step_products(kept: str = "graph") -> dict:
    """(caller's file, function) -> calls of contraction's `_pair`, and of a recipe's `run`/`plain`, in rank 0's
    third GPT training step on 4 simulated ranks (tp 4)."""
    calls: dict = {}

    def hook(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("_pair", "pair_plain", "run", "plain") \
                and frame.f_code.co_filename in (contraction.__file__, "<string>"):
            back = frame.f_back.f_code
            key = (frame.f_code.co_name, back.co_filename.split("spmdsim/")[-1], back.co_name)
            calls[key] = calls.get(key, 0) + 1

    def body():
        comm = spmdsim.world()
        mesh = Mesh(Layout((1, 4), ("dp", "tp")), comm)
        model = GPT(SMALL, mesh, kept=kept)
        ids = encode(load_text())
        for step in range(3):
            x, y = batch(ids, SMALL, step)
            xd, yd = (DTensor.from_global(mesh, a, mesh.layout(model.batch, None)) for a in (x, y))
            for s in param_specs(SMALL):
                model.params[s.name].grad = None
            if step == 2 and comm.rank == 0:
                sys.setprofile(hook)
            try:
                model.loss(xd, yd, step).backward()
            finally:
                sys.setprofile(None)
        mesh.close()

    spmdsim.simulate(4, body)
    return calls


def test_a_repeated_steps_fused_and_rule_products_skip_the_recipes_test():
    calls = _step_products()
    callers = {(name, where, fn) for (name, where, fn) in calls}
    # The fused pieces' repeats: the recipe's `plain` function, kept in their call signature's entry
    for fn in ("einsum_bias", "reshape_einsum"):
        assert ("plain", "nn/ops/fused.py", fn) in callers, (fn, sorted(callers))
        assert not {c for c in callers if c[1:] == ("nn/ops/fused.py", fn) and c[0] != "plain"}, fn
    # The einsum rule's kept case: the recipe's `plain` function, kept with its dY layout's entry (under the even
    # cut), called without pair_plain's frame; and no general `_pair`
    assert ("plain", "nn/autograd/rules/einsum.py", "__call__") in callers, sorted(callers)
    assert not {c for c in callers if c[1:] == ("nn/autograd/rules/einsum.py", "__call__") and c[0] != "plain"}, \
        sorted(callers)
    assert calls.get(("plain", "references/contraction.py", "pair_plain"), 0) == sum(
        v for (name, _, _), v in calls.items() if name == "pair_plain")


def test_pair_function_is_pairs_kept_function():
    rng = np.random.default_rng(2)
    for k, (a_word, a_shape, b_word, b_shape, out) in enumerate(CASES):
        a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
        run = contraction.pair_function(a_word, a, b_word, b, out)
        assert run is contraction._RUNS[(a_word, a_shape, b_word, b_shape, out)].plain
        assert run(a, b).tobytes() == pair(a_word, a, b_word, b, out).tobytes(), k
    import ml_dtypes

    low = rng.standard_normal((3, 4)).astype(ml_dtypes.bfloat16)
    run = contraction.pair_function("ij", low, "jk", np.ones((4, 5), np.float32), "ik")
    assert run is contraction._RUNS[("ij", (3, 4), "jk", (4, 5), "ik")]  # the tested one: bfloat16 widened


def _frames(f) -> tuple:
    """(the names of the frames `f()` runs, its result)."""
    names: list = []

    def hook(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        result = f()
    finally:
        sys.setprofile(None)
    return names, result


def test_a_repeated_residual_draws_its_mask_and_gelus_node_reads_its_blocks_without_wrappers():
    """A repeated `residual` with dropout calls the mask's kernel itself (not replay.kernel's wrapper, whose test
    it answered: this thread does not capture), and its backward makes a DTensor of dH and dY alone, itself (the
    dropped-out values' gradient stays a block); GELU's node is attached without `record`, and its backward
    reads the blocks without the `local` property; the values are the separate operators' (same bits)."""
    from spmdsim.nn import ops
    from spmdsim.nn.ops.residual import residual

    rng = np.random.default_rng(1)
    gh, gy, gb = rng.standard_normal((4, 2, 8)), rng.standard_normal((4, 2, 8)), rng.standard_normal(8)

    def body():
        mesh = Mesh(Layout((1, 2), ("dp", "tp")), spmdsim.world())
        h = DTensor.from_global(mesh, gh, mesh.layout(None, None, None)).requires_grad_()
        y = DTensor.from_global(mesh, gy, mesh.layout(None, None, None)).requires_grad_()
        bias = DTensor.from_global(mesh, gb, mesh.layout(None)).requires_grad_()
        out = []
        for _ in range(2):
            names, z = _frames(lambda: residual(h, y, bias, 0.3, 7))
            want = h + ops.dropout(y + bias, 0.3, seed=7)
            assert z.local.tobytes() == want.local.tobytes()
            out.append(names)
        node, want_node = z._ag, want._ag
        taken, grads = _frames(lambda: node.backward(z))
        same = [g.local.tobytes() for g in grads] == [g.local.tobytes() for g in _separate_backward(want, z)]
        out.append((taken.count("grad_tensor") + taken.count("_made") + taken.count("gradient_block"), same))
        x = DTensor.from_global(mesh, gy, mesh.layout(None, None, "tp")).requires_grad_()
        made, g = _frames(lambda: ops.gelu(x))
        node = g._ag
        taken, grads = _frames(lambda: node.backward(g))
        mesh.close()
        return out, made, node.reads == (x.layout, g.layout) and node.want is x.layout, taken, grads[0].local

    for (first, second, (made_grads, same)), made, reads, taken, grad in spmdsim.simulate(2, body):
        assert "recorded" in first and "recorded" not in second and "_keep" in second
        # dH's and dY's DTensors built by the rule itself (grad_tensor's usual case written out; dbias: its sum's
        # own DTensor), the dropped-out values' gradient a block of its dtype and order (no `_made` call)
        assert made_grads == 0 and same
        assert "record" not in made and "attach" in made and reads
        assert "local_of" not in taken and grad.dtype == np.float64


def _separate_backward(out, dy):
    """The gradients of h, y and the bias through the separate operators' nodes of `out` (h + dropout(y + bias)),
    for the output gradient `dy`: the walk's order by hand (the residual add, the dropout, the bias add)."""
    gh, g_dropped = out._ag.backward(dy)
    dropped = out._ag.inputs[1]
    (g_biased,) = dropped._ag.backward(g_dropped)[:1]
    g_y, g_b = dropped._ag.inputs[0]._ag.backward(g_biased)
    return gh, g_y, g_b


def test_kept_as_restores_the_kind_at_the_era_now_and_a_node_notes_a_bfloat16_output():
    """`kept_as` blocks restore the kind before them (nested, or around an optimizer step, whose new era stays);
    a node's `low` is its output's dtype when bfloat16, else None."""
    import ml_dtypes

    from spmdsim.nn.autograd import graph, kept_as

    def body():
        mode = graph._Mode
        seen = []
        with kept_as("a"):
            with kept_as("b"):
                seen.append(mode.tag)
            seen.append(mode.tag)
            with kept_as("c"):
                graph.updated([])  # an optimizer step inside: a new era from here on
                era = mode.tag[1]
                with kept_as("d"):
                    seen.append(mode.tag)
                seen.append(mode.tag)
            seen.append(mode.tag)
        seen.append(mode.tag)
        mesh = Mesh(Layout((1, 1), ("dp", "tp")), spmdsim.world())
        lows = []
        for dtype in (ml_dtypes.bfloat16, np.float32, np.float64):
            a = DTensor.from_global(mesh, np.ones((2, 3), dtype), mesh.layout(None, None)).requires_grad_()
            lows.append((a + a)._ag.low)
        mesh.close()
        return seen, era, lows

    [(seen, era, lows)] = spmdsim.simulate(1, body)
    assert era > 0 and seen == [("b", 0), ("a", 0), ("d", era), ("c", era), ("a", era), (None, era)]
    assert lows == [np.dtype(ml_dtypes.bfloat16), None, None]


def test_a_repeated_einsum_bias_keeps_its_biased_product_as_a_block():
    """A repeated `einsum_bias` with a bias and a reshape builds DTensors of the product (its rule's dY is laid out
    by it) and of the result alone: the biased product is kept as its block (the rule reads its shape), as the
    general path's node keeps it; both paths' values and gradients are the same bits."""
    from spmdsim.nn.autograd.kept import kept_bytes
    from spmdsim.nn.ops.fused import einsum_bias

    rng = np.random.default_rng(4)
    gx, gw, gb = rng.standard_normal((4, 2, 8)), rng.standard_normal((8, 6)), rng.standard_normal(6)

    def body():
        mesh = Mesh(Layout((1, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, gx, mesh.layout(None, None, None)).requires_grad_()
        w = DTensor.from_global(mesh, gw, mesh.layout(None, "tp")).requires_grad_()
        b = DTensor.from_global(mesh, gb, mesh.layout("tp")).requires_grad_()
        seen = []
        for _ in range(2):
            z = einsum_bias("tbd,de->tbe", x, w, b, (4, 2, 2, 3))
            kept = kept_bytes([z], exclude=[x, w, b])
            rule = z._ag.backward
            (z * z).sum().backward()
            seen.append((type(rule.biased), z.local.tobytes(), kept,
                         [t.grad.local.tobytes() for t in (x, w, b)]))
            for t in (x, w, b):
                t._ag.grad = None
        mesh.close()
        return seen

    for first, second in spmdsim.simulate(2, body):
        assert first[0] is second[0] is np.ndarray and first[1:] == second[1:]


def test_no_class_of_a_dtensor_defines_getattr():
    """A DTensor's attributes are read thousands of times an eager step (``x._local``, ``x._layout`` ...): where its
    class or a base defines ``__getattr__``, CPython specializes none of those reads (each takes the generic lookup,
    about nine times as long). Other frameworks' names are descriptors of the class (the porting page's lines,
    tests/test_porting.py), and any other missing name is Python's own AttributeError."""
    assert [k.__name__ for k in DTensor.__mro__ if "__getattr__" in vars(k)] == []
    assert DTensor.__getattribute__ is object.__getattribute__
    x = object.__new__(DTensor)
    for name in _FOREIGN_BY_NAME:
        assert not hasattr(x, name) and not hasattr(DTensor, name), name
    with pytest.raises(AttributeError, match="^'DTensor' object has no attribute 'no_such_name'$"):
        x.no_such_name
