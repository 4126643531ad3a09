"""docs/tutorials/porting.md and its two examples: they run, pass their checks, print what the page quotes, and
refuse bad input in one line; the names the page maps onto exist."""
from __future__ import annotations

import importlib
import re
import subprocess

import numpy as np
import pytest

from docs_commands import ROOT, mismatch, quotes, run_example
from testkit import unfold

DOC = "docs/tutorials/porting.md"
EXAMPLES = {"dtensor": "examples/port_dtensor_mlp.py", "jax": "examples/port_jax_mlp.py"}
VERDICT = re.compile(r"^loss \d\.\d{7}; output, loss, gradients, updated weights vs numpy: PASS "
                     r"\(max error \d\.\de-\d\d\)$")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` from the repository's root; on `--ranks N` in this process (docs_commands.run_example)."""
    return run_example(script, *args)


@pytest.fixture(scope="module")
def on_8_ranks() -> dict:
    """Each example's run on 8 simulated ranks (one run each for every test here)."""
    return {name: _run(script, "--ranks", "8") for name, script in EXAMPLES.items()}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_passes_every_check_on_8_simulated_ranks(name, on_8_ranks):
    done = on_8_ranks[name]
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "spmdsim: running on 8 simulated ranks in one process (--ranks 8), no mpiexec"
    assert VERDICT.match(lines[-1]), lines[-1]
    assert max(len(line) for line in lines) <= 100
    # The same layouts, the same collectives: the forward's y sum and loss mean, the backward's dp sums.
    assert "collectives: forward {'allreduce': 2}, backward {'allreduce': 2}" in done.stdout
    if name == "dtensor":
        assert "placements: x (S(0), R), w1 (R, S(1)), w2 (R, S(0)), y (S(0), P), then (S(0), R)" in lines
        assert "rank 0 to_local(): x (4, 8), w1 (8, 4), w2 (4, 8); full_tensor() (8, 8)" in lines
        assert lines[4].endswith(", step {}")  # the optimizer step is local
    else:
        assert ("specs: x P('dp', None), w1 P(None, 'tp'), w2 P('tp', None), y P('dp', None), "
                "grad w1 P(None, 'tp')") in lines
        assert "device 0's shard_map blocks: x (4, 8), w1 (8, 4), w2 (4, 8)" in lines


def test_both_ports_compute_the_same_step(on_8_ranks):
    losses = {name: done.stdout.splitlines()[-1].split(";")[0] for name, done in on_8_ranks.items()}
    assert losses["dtensor"] == losses["jax"], losses


def test_the_page_quotes_what_the_examples_print(on_8_ranks):
    quoted = [q for q in quotes(DOC) if q.output]
    assert sorted(q.command for q in quoted) == sorted(f"python {s} --ranks 8" for s in EXAMPLES.values())
    for quote in quoted:
        name = next(n for n, s in EXAMPLES.items() if s in quote.command)
        why = mismatch(quote.output, on_8_ranks[name].stdout)
        assert why is None, f"{quote.where()}: {why}\n{on_8_ranks[name].stdout}"
        assert len(quote.output) == len(on_8_ranks[name].stdout.splitlines()), quote.where()  # all of it
    launched = [q.command for q in quotes(DOC) if "mpiexec" in q.command]
    assert sorted(launched) == sorted(f"timeout -k 5 120 mpiexec -n 8 python {s}" for s in EXAMPLES.values())


@pytest.mark.parametrize("script", sorted(EXAMPLES.values()))
def test_bad_input_is_one_line_and_exit_2(script):
    """An odd rank count is one line (the mesh is dp 2 x tp N/2); an unknown argument is refused by the parser
    before any rank starts, as in every example (tests/test_sim_cli.py checks --help and --bogus for all)."""
    done = _run(script, "--ranks", "3")
    assert done.returncode == 2
    assert unfold(done.stderr) == ("spmdsim: error: dp 2 x tp N/2 needs an even number of ranks, not 3 (simulate 8 "
                                   "ranks with `--ranks 8` / spmdsim.simulate(8, main), or launch them with `mpiexec "
                                   "-n 8 ...`)\n")
    done = _run(script, "--ranks", "4", "--lr", "0.1")
    name = script.rsplit("/", 1)[-1]
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"{name}: error: unrecognized arguments: --lr 0.1; see: {name} --help\n"
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("script", sorted(EXAMPLES.values()))
def test_the_examples_stay_short_and_name_what_they_replace(script):
    text = (ROOT / script).read_text()
    assert len(text.splitlines()) < 60
    assert ".local" in text and "spmdsim.script(__file__)" in text
    replaced = (["distribute_tensor", "DTensor.from_local", "full_tensor", "to_local", "redistribute",
                 "ColwiseParallel", "RowwiseParallel", "loss.backward", "torch.optim.SGD"] if "dtensor" in script else
                ["jax.make_mesh", "NamedSharding", "jax.device_put", "with_sharding_constraint", "value_and_grad",
                 "shard_map", "jax.tree.map"])
    comments = " ".join(line.partition("#")[2] for line in text.splitlines())
    assert [name for name in replaced if name not in comments] == []


def test_every_spmdsim_name_the_page_maps_to_exists():
    text = (ROOT / DOC).read_text()
    for module, pattern in (("spmdsim.nn.ops", r"\bops\.(\w+)"), ("spmdsim.nn.optim", r"\boptim\.(\w+)"),
                            ("spmdsim.runtime", r"spmdsim\.runtime\.(\w+)"),
                            ("spmdsim.nn.autograd", r"spmdsim\.nn\.autograd\.(\w+)")):
        names = set(re.findall(pattern, text))
        assert names, module
        missing = sorted(n for n in names if not hasattr(importlib.import_module(module), n))
        assert missing == [], f"{DOC} names {module}.{missing}"
    import spmdsim.layouts.dialects as dialects
    from spmdsim import DTensor

    for name in ("placements_to_layout", "layout_to_placements", "format_placements", "partition_spec_to_layout",
                 "layout_to_partition_spec", "format_partition_spec", "Shard", "Replicate", "Partial"):
        assert f"`{name}" in text and hasattr(dialects, name), name
    spmdsim_side = " ".join(line.split(" | ")[1] for line in text.splitlines() if line.startswith("| `"))
    methods = set(re.findall(r"`(?:dt|x|y|p|loss)\.(\w+)", spmdsim_side))
    assert {"local", "gather", "redistribute", "backward", "grad"} <= methods
    assert sorted(m for m in methods if not hasattr(DTensor, m)) == []


def test_the_page_maps_every_concept_a_port_needs():
    text = (ROOT / DOC).read_text()
    torch = ["init_device_mesh", "DeviceMesh", "Shard(0)", "Replicate()", "Partial()", "distribute_tensor",
             "DTensor.from_local", "to_local()", "full_tensor()", "redistribute(mesh, placements)",
             "parallelize_module", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "loss.backward()",
             "torch.optim.SGD"]
    jax = ["jax.make_mesh", "P(\"dp\", None)", "PartitionSpec", "NamedSharding", "jax.device_put",
           "with_sharding_constraint", "shard_map", "jax.grad"]
    table = [line for line in text.splitlines() if line.startswith("| `")]
    assert [c for c in torch + jax if not any(c in row.split(" | ")[0] for row in table)] == []
    assert text.count("no equivalent") >= 2  # said plainly where spmdsim has none


def test_pytorch_and_jax_spellings_on_a_dtensor_and_a_mesh():
    """``DTensor.from_local`` without a global shape (even shards, as PyTorch assumes), ``.placements``,
    ``.partition_spec`` and ``Mesh.coord``, on 8 simulated ranks; bad input in one line."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, LayoutError, Mesh, ShapeError
    from spmdsim.layouts.dialects import Replicate, Shard, format_placements

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "tp")))
        L = mesh.layout
        whole = np.arange(8 * 12, dtype=np.float64).reshape(8, 12)
        layout = L("dp", "tp")
        block = whole[layout.slices(mesh.rank, whole.shape)]
        x = DTensor.from_local(mesh, block, layout)
        from spmdsim.layouts.dialects import partition_spec_to_layout, placements_to_layout

        same = [placements_to_layout("S(0), S(1)", mesh, 2), placements_to_layout("S(0), S(1)", mesh.layout, 2),
                partition_spec_to_layout(("dp", "tp"), mesh)]
        assert all(t == layout and t.layout is mesh.layout for t in same)  # the mesh's own Layout, named axes
        summed = DTensor.from_local(mesh, np.ones((4, 12)), L("dp", None, partial=("tp",)))
        said = []
        for call in (lambda: DTensor.from_local(mesh, np.ones(3), layout), lambda: mesh.coord("pp"),
                     lambda: summed.partition_spec, lambda: placements_to_layout("R, R", mesh, 2, ("a", "b"))):
            try:
                call()
            except (ShapeError, LayoutError, spmdsim.DialectError) as e:
                said.append(type(e).__name__ + ": " + str(e).splitlines()[0])
        return (x.shape, np.array_equal(x.gather(), whole), x.placements, format_placements(summed.placements),
                x.partition_spec, (mesh.coord("dp"), mesh.coord("tp")), summed.shape, said)

    results = spmdsim.simulate(8, body)
    shape, same, placements, partial, spec, coords, summed_shape, said = results[5]
    assert shape == (8, 12) and same and summed_shape == (8, 12)
    assert placements == (Shard(0), Shard(1)) and partial == "(S(0), P)" and spec == ("dp", "tp")
    assert coords == (1, 1) and [r[5] for r in results] == [(r // 4, r % 4) for r in range(8)]
    assert said[0] == "ShapeError: local shard of shape (3,) has 1 dim but the layout (\"dp\", \"tp\") maps 2"
    assert said[1] == "LayoutError: axis 'pp' is not one of the mesh's ('dp', 'tp')"
    assert said[2].startswith("DialectError: PartitionSpec cannot express partial sums over ('tp',)")
    assert said[3] == ("DialectError: mesh_axis_names ('a', 'b'): a Layout or Mesh names its own axes ('dp', 'tp'); "
                       "leave them out")
    assert Replicate() not in placements


def test_a_dialect_value_where_a_layout_goes_says_how_to_make_one():
    """A PyTorch or JAX user passes placements or a PartitionSpec tuple where a TensorLayout goes: it said only
    "layout ('dp', None) must be a TensorLayout"; an array passed as the mesh printed the array's whole repr
    over many lines. Each is one line saying what was given and how to make the right thing."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, LayoutError, Mesh
    from spmdsim.layouts.dialects import Replicate, Shard

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        a = np.ones((4, 4))
        said = []
        for call in (lambda: DTensor.from_global(mesh, a, ("dp", None)),
                     lambda: DTensor.from_global(mesh, a, [Shard(0), Replicate()]),
                     lambda: DTensor.from_local(mesh, a, mesh.layout),
                     lambda: DTensor.from_global(a, mesh, mesh.layout("dp", None)),
                     lambda: DTensor.from_local(a, mesh, mesh.layout("dp", None)),
                     lambda: Mesh((2, 2))):
            try:
                call()
            except LayoutError as e:
                said.append(str(e))
        return said

    said = spmdsim.simulate(4, body)[0]
    make = ("make one with mesh.layout('dp', None) (a mesh axis or None per tensor dim), or from a dialect with "
            "spmdsim.layouts.dialects' placements_to_layout(placements, mesh, ndim) or "
            "partition_spec_to_layout(spec, mesh, ndim)")
    assert said == [
        "layout must be a TensorLayout, got tuple ('dp', None); " + make,
        "layout must be a TensorLayout, got list [Shard(dim=0), Replicate()]; " + make,
        "layout must be a TensorLayout, got Layout Layout(device_matrix=(2, 2), alias_name=('dp', 'tp')); a Layout "
        "is the device matrix alone; call it with each tensor dim's mesh axis (or None): layout('dp', None)",
        "mesh must be a spmdsim Mesh, got ndarray of shape (4, 4); make one with "
        "Mesh(Layout((2, 4), ('dp', 'tp'))), and pass it first",
        "mesh must be a spmdsim Mesh, got ndarray of shape (4, 4); make one with "
        "Mesh(Layout((2, 4), ('dp', 'tp'))), and pass it first",
        "layout must be a spmdsim Layout (device matrix and axis names), got tuple (2, 2); "
        "e.g. Mesh(Layout((2, 4), ('dp', 'tp')))"]


def test_zeros_ones_full_make_only_each_ranks_block():
    """DTensor.zeros / ones / full (PyTorch's torch.distributed.tensor.zeros, ...): each rank's block of the
    layout, a pending sum held by its first member; a fill value its dtype cannot hold, one line."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, DTypeError, Layout, Mesh

    def body():
        mesh = Mesh(Layout((2, 2), ("a", "b")))
        L = mesh.layout
        z = DTensor.zeros(mesh, L("a", None), (4, 6))
        o = DTensor.ones(mesh, L(None, ("a", "b")), (3, 8), "float32")
        f = DTensor.full(mesh, L("a", None, partial=("b",)), (4, 2), 2.5)
        n = DTensor.full(mesh, L(None), (4,), 7, "int64")
        said = []
        for value, dtype in ((2.5, "int64"), (300, "int8"), (float("nan"), "int32"), (-1, "uint8"),
                             (float("inf"), "int64"), (1e10, "float16"), (float("nan"), "bool")):
            try:
                DTensor.full(mesh, L(None), (4,), value, dtype)
            except DTypeError as e:
                said.append(str(e))
        return (z.local.shape, z.gather(), o.local.shape, o.dtype, o.gather(), f.local, f.gather(), n.gather(), said)

    results = spmdsim.simulate(4, body)
    z_block, z, o_block, o_dtype, o, f_local, f, n, said = results[1]
    assert z_block == (2, 6) and not z.any() and z.shape == (4, 6)
    assert o_block == (3, 2) and o_dtype == np.float32 and (o == 1).all() and o.shape == (3, 8)
    assert (f == 2.5).all() and (f_local == 0).all()  # rank 1 is the second member over "b": zeros
    assert (results[0][5] == 2.5).all()  # rank 0 holds the value
    assert n.tolist() == [7, 7, 7, 7]
    assert said == ["fill value 2.5 must be a number that dtype 'int64' holds "
                    "(an integer in -9223372036854775808..9223372036854775807)",
                    "fill value 300 must be a number that dtype 'int8' holds (an integer in -128..127)",
                    "fill value nan must be a number that dtype 'int32' holds (an integer in -2147483648..2147483647)",
                    "fill value -1 must be a number that dtype 'uint8' holds (an integer in 0..255)",
                    "fill value inf must be a number that dtype 'int64' holds "
                    "(an integer in -9223372036854775808..9223372036854775807)",
                    "fill value 10000000000.0 must be a number that dtype 'float16' holds (at most 65504 in magnitude)",
                    "fill value nan must be a number that dtype 'bool' holds"]


def _fills(made: tuple, refused: tuple) -> tuple:
    """On 2 simulated ranks: (the gathered DTensor.full of each (value, dtype) of `made`, the DTypeError lines of
    each of `refused`)."""
    import spmdsim
    from spmdsim import DTensor, DTypeError, Layout, Mesh

    def body():
        mesh = Mesh(Layout((2,), ("a",)))
        values = [DTensor.full(mesh, mesh.layout("a"), (4,), value, dtype).gather() for value, dtype in made]
        said = []
        for value, dtype in refused:
            try:
                DTensor.full(mesh, mesh.layout("a"), (4,), value, dtype)
            except DTypeError as e:
                said.append(str(e))
        return values, said

    return spmdsim.simulate(2, body)[0]


def test_full_takes_a_complex_value_for_a_complex_dtype():
    """DTensor.full(..., 1j, "complex128") was refused as a value "dtype 'complex128'" cannot hold, and a huge
    integer for a complex dtype ended in numpy's OverflowError; now a complex dtype takes a complex value (each part
    within its float's range), and a real dtype refuses one naming "a real number"."""
    import numpy as np

    made, said = _fills(((1j, "complex128"), (np.complex64(2 - 3j), "complex64")),
                        ((1j, "float64"), (1e39 + 0j, "complex64"), (10 ** 400, "complex128")))
    assert made[0].dtype == np.complex128 and made[0].tolist() == [1j] * 4
    assert made[1].dtype == np.complex64 and made[1].tolist() == [2 - 3j] * 4
    assert said == ["fill value 1j must be a number that dtype 'float64' holds (a real number)",
                    "fill value (1e+39+0j) must be a number that dtype 'complex64' holds "
                    "(at most 3.40282e+38 in magnitude in each part)",
                    "fill value of 401 digits must be a number that dtype 'complex128' holds "
                    "(at most 1.79769e+308 in magnitude in each part)"]


def test_full_takes_a_0d_array_as_its_scalar():
    """DTensor.full(..., np.array(2.0)) was refused ("fill value array(2.) must be a number that dtype 'float64'
    holds") while np.float64(2.0) was taken: a 0-d array is its scalar now, held to the same limits; an array of
    one element and more dims is still no fill value."""
    import numpy as np

    made, said = _fills(((np.array(2.0), "float64"), (np.array(3), "int8"), (np.array(1j), "complex128")),
                        ((np.array(300), "int8"), (np.array([2.0]), "float64"), (np.array(1j), "float64")))
    assert [(m.dtype.name, m.tolist()) for m in made] == [("float64", [2.0] * 4), ("int8", [3] * 4),
                                                          ("complex128", [1j] * 4)]
    assert said == ["fill value 300 must be a number that dtype 'int8' holds (an integer in -128..127)",
                    "fill value array([2.]) must be a number that dtype 'float64' holds",
                    "fill value 1j must be a number that dtype 'float64' holds (a real number)"]


def test_full_called_on_a_tensor_names_gather():
    """``y.full()`` (a SeededTensor's whole tensor) on a DTensor called the class's constructor: a TypeError
    "missing 4 required positional arguments". Without arguments it names gather; with them it still makes one."""
    import spmdsim
    from spmdsim import DTensor, Layout, Mesh, OperatorError

    def body():
        mesh = Mesh(Layout((2,), ("a",)))
        x = DTensor.zeros(mesh, mesh.layout("a"), (4,))
        try:
            x.full()
        except OperatorError as e:
            said = str(e)
        return said, x.full(mesh, mesh.layout(None), (3,), 2.0).gather().tolist()

    said, made = spmdsim.simulate(2, body)[1]
    assert said.startswith("x.full() takes the arguments of DTensor.full(mesh, layout, shape, value), a new tensor;")
    assert "x.gather()" in said
    assert made == [2.0, 2.0, 2.0]


def test_pytorch_and_numpy_method_spellings():
    """.T, permute, swapaxes (PyTorch's transpose(a, b)), len() and abs() on a DTensor, values and gradient
    against numpy; x.transpose(0, 1) of a 2-d tensor (numpy keeps it, PyTorch swaps) and a bad dim: one line."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh, OperatorError
    from spmdsim.nn import ops

    a = np.arange(64.0).reshape(2, 4, 8) - 20

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, a, mesh.layout("dp", None, "tp")).requires_grad_()
        m = DTensor.from_global(mesh, a[0], mesh.layout(None, "tp"))
        got = [x.T.gather(), x.permute(2, 0, 1).gather(), x.swapaxes(0, 2).gather(), x.swapaxes(-1, 1).layout,
               len(x), abs(x).gather(), m.transpose(1, 0).gather(), m.t().gather()]
        ops.sum(abs(x)).backward()
        got.append(x.grad.gather())
        for bad in (lambda: x.swapaxes(0, 3), lambda: len(ops.sum(x)), lambda: x.transpose(0, 2),
                    lambda: m.transpose(0, 1)):
            try:
                bad()
            except (OperatorError, TypeError) as e:
                got.append(f"{type(e).__name__}: {e}")
        return got

    (t, permuted, swapped, layout, n, absolute, swapped_2d, torch_t, grad, bad_dim, bad_len,
     torch_swap, ambiguous) = spmdsim.simulate(4, body)[3]
    assert np.array_equal(t, a.T) and np.array_equal(permuted, a.transpose(2, 0, 1))
    assert np.array_equal(swapped, a.swapaxes(0, 2)) and layout == Layout((2, 2), ("dp", "tp"))("dp", "tp", None)
    assert n == 2 and np.array_equal(absolute, abs(a)) and np.array_equal(swapped_2d, a[0].T)
    assert np.array_equal(torch_t, a[0].T)  # PyTorch's 2-d transpose
    assert np.array_equal(grad, np.sign(a))
    assert bad_dim == "OperatorError: swapaxes: dim 3 is out of range for a tensor of 3 dims (expected an integer " \
                      "from -3 to 2)"
    assert bad_len == ("_Unsized: len() of a 0-d DTensor: it has no dims (global shape ()), as numpy's 0-d array; "
                       "x.size counts its elements")  # an OperatorError (one line) and a TypeError, as numpy's
    assert torch_swap == ('OperatorError: transpose perm (0, 2) must be a permutation of 0..2 (one entry per dim of '
                          '("dp", None, "tp")) (PyTorch\'s transpose(a, b), two dims swapped, is x.swapaxes(a, b))')
    assert ambiguous == ("OperatorError: x.transpose(0, 1) of a 2-d DTensor: numpy keeps it as it is, PyTorch swaps "
                         "the two dims; write x.T (or x.swapaxes(0, 1), x.t()) to swap them, nothing to keep them")


def test_numpy_functions_on_a_dtensor_follow_spmdsims_rules():
    """np.exp(x), np.maximum(x, 1.0), np.float64(2) * x, np.matmul, np.sum(x, axis=1), x.sum(dim=1,
    keepdim=True): numpy's and PyTorch's spellings run spmdsim's rules (values and gradient against numpy);
    np.asarray(x), a ufunc without a rule, a reduction ufunc and out= each get one line."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops

    a = np.linspace(0.5, 3.0, 32).reshape(4, 8)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, a, mesh.layout("dp", "tp")).requires_grad_()
        w = DTensor.from_global(mesh, np.ones((8, 3)), mesh.layout("tp", None))
        y = np.exp(x) + np.maximum(x, 1.0) * np.float64(2) - np.sqrt(x) / np.float32(3)
        got = [y.gather(), np.greater(x, 1.0).gather(), np.matmul(x, w).gather(),
               ops.resolved(np.sum(x, axis=1)).gather(), ops.resolved(x.sum(dim=1, keepdim=True)).gather(),
               np.max(x).item()]
        ops.sum(y).backward()
        got.append(x.grad.gather())
        for bad in (lambda: np.asarray(x), lambda: np.arctan(x), lambda: np.add.reduce(x),
                    lambda: np.add(x, x, out=x), lambda: np.sum(x, dtype=np.float32)):
            try:
                bad()
            except spmdsim.OperatorError as e:
                got.append(str(e))
        return got

    y, mask, product, rows, kept, top, grad, *said = spmdsim.simulate(4, body)[2]
    assert np.allclose(y, np.exp(a) + np.maximum(a, 1.0) * 2 - np.sqrt(a) / 3, atol=1e-15)
    assert np.array_equal(mask, a > 1.0) and np.allclose(product, a @ np.ones((8, 3)))
    assert np.allclose(rows, a.sum(1)) and np.allclose(kept, a.sum(1, keepdims=True)) and top == a.max()
    assert np.allclose(grad, np.exp(a) + 2 * (a > 1.0) + (a == 1.0) - 0.5 / np.sqrt(a) / 3)
    assert said == [
        "numpy array of a DTensor of global shape (4, 8): its values are spread over the ranks; x.gather() makes "
        "the whole array on every rank (a collective: every rank calls it), x.local is this rank's block",
        "numpy.arctan of a DTensor: spmdsim has no rule for it; use spmdsim.nn.ops (ops.sum, ops.exp, ops.where, ...) "
        "or the block x.local",
        "numpy.add.reduce of a DTensor: spmdsim has no rule for it; use spmdsim.nn.ops (ops.sum, ops.exp, ops.where, "
        "...) or the block x.local",
        "numpy.add of a DTensor: its out argument; use spmdsim.nn.ops (ops.sum, ops.exp, ops.where, ...) or the block "
        "x.local",
        "sum: dtype=<class 'numpy.float32'> is not taken; a DTensor reduction takes dims (axis=, dim=) and "
        "keepdims (keepdim=)"]


def test_pytorch_method_spellings_of_spmdsims_operators():
    """x.view, size, numel, dim, unsqueeze, squeeze, flatten, contiguous, detach, softmax, log_softmax,
    masked_fill, exp: PyTorch's spellings run spmdsim's operators (values against numpy); detach leaves the
    graph; a bad dim, one line."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops

    a = np.linspace(0.5, 3.0, 64).reshape(2, 4, 8)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, a, mesh.layout("dp", None, "tp")).requires_grad_()
        got = [x.size(), x.size(-1), x.numel(), x.dim(), x.view(2, 4, 2, 4).gather(), x.unsqueeze(1).layout,
               x.unsqueeze(-1).squeeze().global_shape, x.unsqueeze(0).squeeze(0).global_shape,
               x.flatten(0, 1).gather(), x.contiguous() is x, x.softmax(-1).gather(), x.log_softmax(dim=-1).gather(),
               x.masked_fill(x > 2.0, 0.0).gather(), x.exp().gather()]
        (ops.sum(x.exp()) + ops.sum(x.detach() * 5.0)).backward()
        got.append(x.grad.gather())
        got.append([p.gather() for p in x.split(3, dim=2)] + [p.global_shape for p in x.split([1, 3], 1)])
        for bad in (lambda: x.unsqueeze(4), lambda: x.split([1, 2], 1)):
            try:
                bad()
            except spmdsim.OperatorError as e:
                got.append(str(e))
        return got

    (size, last, numel, ndim, view, unsqueezed, back, front, flat, same, soft, logsoft, filled, exp, grad,
     pieces, said, said_split) = spmdsim.simulate(4, body)[1]
    e = np.exp(a)
    assert (size, last, numel, ndim) == ((2, 4, 8), 8, 64, 3) and same
    assert np.array_equal(view, a.reshape(2, 4, 2, 4)) and np.array_equal(flat, a.reshape(8, 8))
    assert unsqueezed == Layout((2, 2), ("dp", "tp"))("dp", None, None, "tp") and back == front == (2, 4, 8)
    assert np.allclose(soft, e / e.sum(-1, keepdims=True)) and np.allclose(logsoft, np.log(soft))
    assert np.array_equal(filled, np.where(a > 2.0, 0.0, a)) and np.allclose(exp, e)
    assert np.allclose(grad, e)  # the detached product adds nothing
    assert said == "dim 4 is out of range for a tensor of 3 dims (expected an integer from -4 to 3)"
    # PyTorch's split: pieces of 3 along the last dim (split over tp), the last one smaller; or given sizes
    assert [p.shape for p in pieces[:3]] == [(2, 4, 3), (2, 4, 3), (2, 4, 2)] and pieces[3:] == [(2, 1, 8), (2, 3, 8)]
    assert all(np.array_equal(p, a[..., 3 * k:3 * k + 3]) for k, p in enumerate(pieces[:3]))
    assert said_split == "split: [1, 2] must be a positive size or sizes adding up to dim 1's 4"


def test_numpy_array_functions_on_a_dtensor_run_spmdsims_operators():
    """np.where, np.concatenate, np.stack, np.clip, np.dot, np.einsum, np.transpose, np.reshape, np.swapaxes,
    np.sum/mean/amax/amin, np.any/all, np.var/std, np.argmax, np.round, np.copy, np.zeros_like/ones_like/
    full_like, np.shape/ndim/size (numpy's __array_function__ protocol): numpy's values; a function without a rule
    (np.cumsum) one line naming spmdsim.nn.ops and gather."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops

    a = np.arange(1.0, 33.0).reshape(4, 8)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, a, mesh.layout("dp", "tp"))
        w = DTensor.from_global(mesh, a.T.copy(), mesh.layout("tp", None))
        m = x > 9.0
        got = [np.where(m, x, 0.0), np.concatenate([x, x]), np.concatenate([x, x], axis=1), np.stack([x, x], 1),
               np.clip(x, 2.0, 5.0), np.dot(x, w), np.einsum("ij,ij->i", x, x), np.reshape(x, (4, 8)),
               np.swapaxes(x, 0, 1), np.sum(x, axis=1), np.mean(x, axis=0, keepdims=True), np.amin(x, 1),
               np.any(m, axis=1), np.var(x, axis=0), np.std(x, axis=1, ddof=1), np.argmax(x, axis=1),
               np.round(x / 7.0, 2), np.copy(x), np.zeros_like(x), np.ones_like(x), np.full_like(x, 7.0)]
        got = [t.gather() for t in got] + [ops.resolved(np.amax(x)).item(), ops.resolved(np.all(m)).item(),
                                          np.shape(x), np.ndim(x), np.size(x)]
        try:
            np.cumsum(x)
        except spmdsim.OperatorError as e:
            got.append(str(e))
        return got

    got = spmdsim.simulate(4, body)[0]
    M = a > 9.0
    want = [np.where(M, a, 0.0), np.concatenate([a, a]), np.concatenate([a, a], 1), np.stack([a, a], 1),
            np.clip(a, 2.0, 5.0), a @ a.T, np.einsum("ij,ij->i", a, a), a, a.T, a.sum(1), a.mean(0, keepdims=True),
            a.min(1), M.any(1), a.var(0), a.std(1, ddof=1), a.argmax(1), np.round(a / 7.0, 2), a, np.zeros_like(a),
            np.ones_like(a), np.full_like(a, 7.0), a.max(), M.all(), (4, 8), 2, 32]
    for g, w in zip(got, want):
        assert np.allclose(g, w) and np.shape(g) == np.shape(w), (g, w)
    assert got[-1].startswith("numpy.cumsum of a DTensor: spmdsim has no rule for it; use spmdsim.nn.ops")


def test_norm_and_expand_spellings():
    """x.norm(), x.norm(dim=1), np.linalg.norm(x), np.linalg.norm(x, axis=0) (the 2-norm, Frobenius over every
    dim) with the gradient x / |x|; v.expand(4, -1), np.broadcast_to(v, shape); another ord, one line."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops

    a = np.arange(1.0, 33.0).reshape(4, 8)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_global(mesh, a, mesh.layout("dp", "tp")).requires_grad_()
        v = DTensor.from_global(mesh, np.arange(8.0), mesh.layout("tp"))
        got = [ops.resolved(x.norm()).item(), x.norm(dim=1).gather(), ops.resolved(np.linalg.norm(x)).item(),
               np.linalg.norm(x, axis=0).gather(), v.expand(4, -1).gather(), np.broadcast_to(v, (3, 4, 8)).gather()]
        ops.resolved(x.norm()).backward()
        got.append(x.grad.gather())
        try:
            np.linalg.norm(x, 1)
        except spmdsim.OperatorError as e:
            got.append(str(e))
        return got

    got = spmdsim.simulate(4, body)[0]
    want = [np.linalg.norm(a), np.linalg.norm(a, axis=1), np.linalg.norm(a), np.linalg.norm(a, axis=0),
            np.broadcast_to(np.arange(8.0), (4, 8)), np.broadcast_to(np.arange(8.0), (3, 4, 8)), a / np.linalg.norm(a)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-14)
    assert got[-1].startswith("norm of a DTensor: ord 1 is not taken")


@pytest.mark.parametrize("ranks", ["1", "3"])
def test_nanogpt_attention_runs_at_odd_rank_counts_with_tp_1(ranks):
    # tp 1 leaves c_proj on L("tp", None) against a y whose K is whole: an axis of size 1 splits nothing.
    # The batch grows with dp by design (2 sequences a replica, weak scaling): the run says so, as the docstring does.
    done = _run("examples/port_nanogpt_attention.py", "--ranks", ranks)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert f"nanoGPT attention: mesh dp {ranks} x tp 1, 2 heads, batch {2 * int(ranks)} (2 a dp replica)" in done.stdout
    assert "weak scaling" in (ROOT / "examples/port_nanogpt_attention.py").read_text()
    assert "output and 2 weight gradients vs numpy: PASS" in done.stdout


def test_nanogpt_attention_makes_its_global_arrays_once_for_all_simulated_ranks(monkeypatch):
    """Every simulated rank made x and both weights whole (and the output's reference): once for all now
    (spmdsim.runtime.sim.once; each MPI rank still makes its own), the same output."""
    from spmdsim import SeededTensor

    made = []
    full = SeededTensor.full
    monkeypatch.setattr(SeededTensor, "full", lambda self: made.append(self.shape) or full(self))
    done = _run("examples/port_nanogpt_attention.py", "--ranks", "2")
    assert done.returncode == 0 and "output and 2 weight gradients vs numpy: PASS (max error" in done.stdout, done
    assert made == [(2, 8, 16), (16, 48), (16, 16)]  # x, c_attn, c_proj: once each, not once a rank


def test_nanogpt_attentions_dry_run_makes_no_reference(monkeypatch):
    """A dry run has no values to check: it computed every central difference on its one rank (36 s at 256
    ranks, whose batch grows with dp); now it makes no reference."""
    from spmdsim.references import backward as reference_grad

    def refused(*args, **kwargs):
        raise AssertionError("a dry run computed central differences")

    monkeypatch.setattr(reference_grad, "numeric_grads", refused)
    done = _run("examples/port_nanogpt_attention.py", "--ranks", "8", "--dry-run")
    assert done.returncode == 0 and "ranks 0-7      9  18,432      18,432" in done.stdout, done


def test_einsum_of_bools_that_sums_is_refused_in_one_line():
    """np.einsum("ij->j", mask) gives numpy's bool (the or of each column); spmdsim's blocks' sum gave the count,
    int64 [1, 0, 2], a silently different value and dtype. Bools that sum over a letter are refused in one line,
    every time (the plan is not kept); a bool einsum that sums nothing runs, and bools beside a float promote."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh

    b = np.array([[True, False, True], [False, False, True]])

    def body():
        mesh = Mesh(Layout((2,), ("x",)), spmdsim.world())
        m = DTensor.from_global(mesh, b, mesh.layout(None, None))
        got = [np.einsum("ij->ji", m).gather(), np.einsum("ij,ij->ij", m, m).gather(),
               np.einsum("ij,j->i", m, m[0].astype(float)).gather()]
        for _ in range(2):
            for spec, xs in (("ij->j", (m,)), ("ij,kj->ik", (m, m))):
                try:
                    np.einsum(spec, *xs)
                    got.append(None)
                except spmdsim.OperatorError as e:
                    got.append(str(e))
        return got

    got = spmdsim.simulate(2, body)[0]
    for g, w in zip(got, [b.T, b & b, np.einsum("ij,j->i", b, b[0].astype(float))]):
        assert g.dtype == w.dtype and np.array_equal(g, w), (g, w)
    assert got[3] == got[5] == ("einsum 'ij->j': the operands have dtype 'bool', but it sums over 'i' (numpy's bool "
                                "einsum is a logical or of ands, a sum would count); convert them first, e.g. "
                                "x.astype('int64'), or reduce a bool with x.any(axis)")
    assert got[4] == got[6] and got[4].startswith("einsum 'ij,kj->ik': the operands have dtype 'bool', but it sums "
                                                  "over 'j'")


def test_round_to_places_keeps_integers_as_numpy_does():
    """x.round(2), np.round(x, 1) and ops.round(x, 3) of an integer DTensor: numpy gives the integers back with
    their dtype; spmdsim scaled them by 10.0**decimals and gave float64. Floats still round to the places (float32
    stays float32)."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops

    ints = np.arange(-6, 6).reshape(3, 4)
    f32 = (np.arange(12.0).reshape(3, 4) / 7).astype(np.float32)

    def body():
        mesh = Mesh(Layout((2,), ("x",), cut="chunk"), spmdsim.world())
        out = []
        for a in (ints, ints.astype(np.int32), ints.astype(np.uint8), f32):
            x = DTensor.from_global(mesh, a, mesh.layout("x", None))
            out += [x.round(2).gather(), np.round(x, 1).gather(), ops.round(x, 3).gather(), x.round().gather()]
        return out

    got = spmdsim.simulate(2, body)[0]
    want = [f(a) for a in (ints, ints.astype(np.int32), ints.astype(np.uint8), f32)
            for f in (lambda a: a.round(2), lambda a: np.round(a, 1), lambda a: np.round(a, 3), np.round)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.allclose(g, w, rtol=1e-6, atol=0), (g, w)


def test_a_numpy_scalar_on_the_left_of_a_comparison_and_0d_arrays_are_numbers():
    """``np.float64(0.5) < x`` (numpy's scalar compares first, and hands its ufunc a 0-d array), ``x + np.array(1)``
    and ``np.maximum(x, np.array(0.5))``: numpy's values and dtypes (a 0-d array typed as its scalar, NEP 50); they
    were refused ("operand ndarray of shape () must be a DTensor or a real number") while ``np.float64(0.5) + x``
    ran. An array of more dims is still refused in one line."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh

    a = np.arange(-6, 6).reshape(3, 4)
    f = (a / 4).astype(np.float32)
    t = np.float64(0.5)

    def body():
        mesh = Mesh(Layout((2, 2), ("x", "y"), cut="chunk"), spmdsim.world())
        out = []
        for g in (a, f):
            x = DTensor.from_global(mesh, g, mesh.layout("x", "y"))
            out += [(t < x).gather(), (np.int64(2) >= x).gather(), (np.float32(0.5) == x).gather(),
                    (x + np.array(1)).gather(), (np.array(0.5, np.float32) * x).gather(),
                    np.maximum(x, np.array(0.5)).gather(), (np.array(2) != x).gather()]
        try:
            x + np.ones(4)
        except spmdsim.OperatorError as e:
            out.append(str(e))
        return out

    got = spmdsim.simulate(4, body)[0]
    want = [w for g in (a, f) for w in (t < g, np.int64(2) >= g, np.float32(0.5) == g, g + np.array(1),
                                        np.array(0.5, np.float32) * g, np.maximum(g, np.array(0.5)), np.array(2) != g)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), (g, w)
    assert got[-1].startswith("add: operand ndarray of shape (4,) must be a DTensor or a real number")


def test_size_is_numpys_element_count_and_pytorchs_call():
    """numpy's ``x.size`` is the global element count, an int (``x.size == 24``, ``x.sum() / x.size``); it was
    PyTorch's bound method, which compared unequal to every number silently. PyTorch's ``x.size()`` and
    ``x.size(-1)`` still give the global shape and one dim's size. It pickles as the int (it held the tensor,
    whose mesh holds locks: comm.gather(x.size) under MPI raised "cannot pickle '_thread.lock' object")."""
    import pickle

    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh, OperatorError
    from spmdsim.nn import ops

    a = np.arange(24.0).reshape(4, 6)

    def body():
        mesh = Mesh(Layout((2, 2), ("x", "y")), spmdsim.world())
        x = DTensor.from_global(mesh, a, mesh.layout("x", "y"))
        try:
            x.size(2)
        except OperatorError as e:
            refused = str(e)
        sent = pickle.loads(pickle.dumps(x.size))  # as comm.gather(x.size) sends it under MPI
        return (x.size == 24, int(x.size), x.size * 2, ops.resolved(x.sum() / x.size).item(), x.size(),
                x.size(-1), x.size(0), x[0].size, np.size(x), (type(sent), sent), refused)

    got = spmdsim.simulate(4, body)[0]
    assert got[:-1] == (True, 24, 48, a.mean(), (4, 6), 6, 4, 6, 24, (int, 24))
    assert got[-1].startswith("dim 2 is out of range for a tensor of 2 dims")


def test_clip_of_a_bool_by_one_bound_takes_numpys_dtype():
    """mask.clip(0, None), np.clip(mask, None, 1) and mask.clip(None, 0.5): numpy's dtypes (int64, int64, float64)
    and values; the missing bound was -inf or inf, which made every one float64."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh

    b = np.array([[True, False, True, True], [False, False, True, False]])

    def body():
        mesh = Mesh(Layout((2,), ("x",)), spmdsim.world())
        m = DTensor.from_global(mesh, b, mesh.layout(None, "x"))
        return [m.clip(0, None).gather(), np.clip(m, None, 1).gather(), m.clip(None, 0.5).gather(),
                m.clip(None, -2).gather(), m.clip(1, None).gather()]

    got = spmdsim.simulate(2, body)[0]
    want = [b.clip(0, None), np.clip(b, None, 1), b.clip(None, 0.5), b.clip(None, -2), b.clip(1, None)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), (g, w)


def test_a_row_of_a_split_dim_broadcast_back_over_it_has_a_gradient():
    """``x * x[0]`` with x's dim 0 split: the row's gradient is a pending sum over the axis that splits dim 0 (the
    broadcast summed it there), and the slice's backward put that pending sum into x's map, which splits dim 0
    over the same axis ("axis 'x' is used more than once in tensor map ("x", None) partial ('x',)", a layout
    error from inside the backward). The gradient is summed over the axes x uses first; the value is numpy's."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops

    a = np.random.default_rng(3).standard_normal((4, 6))

    def body():
        grads = []
        for cut, tensor_map in (("even", ("x", None)), ("chunk", ("x", "y")), ("even", ("x", "y"))):
            mesh = Mesh(Layout((2, 2), ("x", "y"), cut=cut), spmdsim.world())
            x = DTensor.from_global(mesh, a, mesh.layout(*tensor_map)).requires_grad_()
            ops.resolved((x * x[0] + x * x[1:2, :]).sum()).backward()
            grads.append(x.grad.gather())
        return grads

    want = a[0] + a[1] + np.eye(4)[:, :1] * a.sum(0) + np.eye(4)[:, 1:2] * a.sum(0)
    for g in spmdsim.simulate(4, body)[0]:
        np.testing.assert_allclose(g, want, rtol=1e-13, atol=1e-13)


def test_max_and_min_of_a_bool_over_a_split_dim_are_numpys():
    """mask.max(), mask.min(axis=0), np.max(mask, axis=1) and ops.min with a dim of mask split over the
    reduced dim: numpy's bools; they were refused as if summed ("allreduce: cannot sum dtype 'bool'") though
    mask.any() and mask.all(), the same reductions, ran."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.nn import ops

    b = np.array([[True, False, True, False, False], [False, False, True, False, True],
                  [True, False, True] + [False] * 2])

    def body():
        mesh = Mesh(Layout((2, 2), ("x", "y"), cut="chunk"), spmdsim.world())
        m = DTensor.from_global(mesh, b, mesh.layout("x", "y"))
        return [ops.resolved(m.max()).item(), ops.resolved(m.min()).item(), m.min(axis=0).gather(),
                np.max(m, axis=1).gather(), ops.min(m, 1, True).gather(), m.max(axis=-1, keepdims=True).gather()]

    got = spmdsim.simulate(4, body)[0]
    want = [b.max(), b.min(), b.min(0), b.max(1), b.min(1, keepdims=True), b.max(-1, keepdims=True)]
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == np.asarray(w).dtype and np.array_equal(g, w), (g, w)


def test_int_of_a_scalar_dtensor_is_numpys():
    """int(x.sum()) raised a bare TypeError (no __int__) where float() worked; now numpy's: the value truncated
    toward zero, and item()'s one-line refusals for a tensor of more elements or a pending sum."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh, OperatorError
    from spmdsim.nn import ops

    g = np.arange(6.0).reshape(2, 3) - 2.6

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        x = DTensor.from_global(mesh, g, mesh.layout("x", None))
        out = [int(ops.resolved(x.sum())), int(ops.resolved(x.max())), float(ops.resolved(x.min()))]
        for bad in (x, x.sum()):
            try:
                int(bad)
            except OperatorError as e:
                out.append(str(e).split(";")[0])
        return out

    got = spmdsim.simulate(2, body)
    assert got[0] == got[1] == [int(g.sum()), int(g.max()), float(g.min()),
                                "int(x) needs a 0-d DTensor (a scalar such as a loss), got global shape (2, 3)",
                                "int(x): the scalar is a pending sum over ('x',)"]


def test_another_frameworks_tensor_attribute_names_spmdsims_in_one_line(tmp_path):
    """``x.full_tensor()``, ``x.to_local()``, ``x.sharding``, ``x.sbp``, ... (a program ported as written): an
    AttributeError (``hasattr`` stays False) that is one line naming spmdsim's, whose first name exists; a
    program that calls one ends in that line; any other missing name is Python's own AttributeError."""
    import numpy as np

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh, OperatorError
    from spmdsim.runtime.dtensor_methods import _FOREIGN

    def body():
        mesh = Mesh(Layout((2,), ("dp",)))
        x = DTensor.from_global(mesh, np.arange(8.0).reshape(4, 2), mesh.layout("dp", None))
        said = {}
        for spelled in _FOREIGN:
            name = spelled.rstrip("()")
            try:
                getattr(x, name)
            except OperatorError as e:
                said[spelled] = (isinstance(e, AttributeError), hasattr(x, name), str(e))
        try:
            x.no_such_name
        except AttributeError as e:
            said["other"] = (type(e) is AttributeError, str(e))
        named = {s: said[s][2].split("spmdsim's is ")[1].split(",")[0].split(" ")[0].split("(")[0] for s in _FOREIGN}
        ours = {spelled: eval(name, {"x": x, "spmdsim": spmdsim}) for spelled, name in named.items()}  # they exist
        return said, ours["full_tensor()"](), ours["to_local()"]

    said, whole, block = spmdsim.simulate(2, body)[1]
    assert set(said) == set(_FOREIGN) | {"other"}
    assert said["other"] == (True, "'DTensor' object has no attribute 'no_such_name'")
    for spelled, (is_attribute_error, has, text) in ((s, said[s]) for s in _FOREIGN):
        # PyTorch's and JAX's names: the porting tutorial; OneFlow's and Paddle's alone: the dialects' reference
        # (x.sbp sent the reader to porting.md, which has no OneFlow)
        page = "tutorials/porting" if "PyTorch" in _FOREIGN[spelled][0] or "JAX" in _FOREIGN[spelled][0] else \
            "reference/dialects"
        assert is_attribute_error and not has and "\n" not in text and text.endswith(f"(docs/{page}.md)")
        assert text.startswith(f"x.{spelled} is {_FOREIGN[spelled][0]}; spmdsim's is ")
    assert said["sbp"][2].endswith("layout_to_sbp(x.layout) (docs/reference/dialects.md)")
    assert said["full_tensor()"][2] == ("x.full_tensor() is PyTorch DTensor's; spmdsim's is x.gather(), the whole "
                                        "tensor on every rank, a collective every rank calls "
                                        "(docs/tutorials/porting.md)")
    assert said["long()"][2] == "x.long() is PyTorch's; spmdsim's is x.astype('int64') (docs/tutorials/porting.md)"
    assert {"float()", "double()", "half()", "int()", "to()", "cuda()", "cpu()"} <= set(said)
    assert np.array_equal(whole, np.arange(8.0).reshape(4, 2)) and np.array_equal(block, whole[2:])
    program = tmp_path / "ported.py"
    program.write_text("import numpy as np\nimport spmdsim\nfrom spmdsim import DTensor, Layout, Mesh\n"
                       "spmdsim.script(__file__)\nmesh = Mesh(Layout((2,), ('dp',)))\n"
                       "x = DTensor.from_global(mesh, np.ones((4, 2)), mesh.layout('dp', None))\n"
                       "print(x.to_local().shape)\n")
    done = _run(str(program), "--ranks", "2")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert unfold(done.stderr).splitlines() == [
        "spmdsim: error: x.to_local() is PyTorch DTensor's and OneFlow's; spmdsim's is x.local, this rank's "
        "block, a numpy array (docs/tutorials/porting.md)"], done.stderr


def test_pytorchs_redistribute_spellings_say_how_to_write_the_target():
    """y.redistribute(mesh, [Shard(0), Replicate()]) (PyTorch's signature) ended in a TypeError traceback, and
    y.redistribute([Shard(0), Replicate()]) said only that a TensorLayout was wanted: both now say how to make one."""
    from spmdsim import DTensor, Layout, Mesh, PlanError, simulate
    from spmdsim.layouts.dialects import Replicate, Shard, placements_to_layout

    def main(call):
        mesh = Mesh(Layout((2, 2), ("dp", "tp")))
        x = DTensor.from_global(mesh, np.arange(16.0).reshape(4, 4), mesh.layout("dp", None))
        return call(x).gather()

    with pytest.raises(PlanError) as caught:
        simulate(4, main, lambda x: x.redistribute(x.mesh, [Shard(0), Replicate()]))
    assert str(caught.value) == ("redistribute takes the target TensorLayout alone, not PyTorch's (device_mesh, "
                                 "placements): x.redistribute(placements_to_layout(placements, x.mesh, x.ndim)), "
                                 "from spmdsim.layouts.dialects")
    make = ("make one with mesh.layout('dp', None) (a mesh axis or None per tensor dim), or from a dialect with "
            "spmdsim.layouts.dialects' placements_to_layout(placements, mesh, ndim) or "
            "partition_spec_to_layout(spec, mesh, ndim)")  # as from_global's refusal of a layout (above)
    for target, got in (([Shard(0), Replicate()], "list [Shard(dim=0), Replicate()]"), ("S(0), R", "str 'S(0), R'"),
                        (3, "int 3")):
        with pytest.raises(PlanError) as caught:
            simulate(4, main, lambda x: x.redistribute(target))
        assert str(caught.value) == f"target must be a TensorLayout, got {got}; {make}"
    moved = simulate(4, main, lambda x: x.redistribute(placements_to_layout([Replicate(), Shard(1)], x.mesh, x.ndim)))
    assert all(np.array_equal(m, np.arange(16.0).reshape(4, 4)) for m in moved)


def test_the_attention_row_writes_calls_pytorch_takes_and_spmdsims_joins_both_masks():
    """The PyTorch column wrote ``F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=True)``, which
    PyTorch refuses ("Explicit attn_mask should not be set when is_causal=True"). Each SDPA call the page writes
    now sets one of the two; spmdsim's ``causal=True, mask=keep`` gives what PyTorch's one attn_mask holding both
    masks gives (numpy here)."""
    from spmdsim import Layout, Mesh, ops, simulate
    from spmdsim.runtime import DTensor

    text = (ROOT / DOC).read_text()
    calls = re.findall(r"F\.scaled_dot_product_attention\(([^`]*)\)`", text)
    assert calls and [c for c in calls if "attn_mask=" in c and "is_causal=True" in c] == []
    assert "`ops.attention(q, k, v, causal=True, mask=keep)`" in text
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 2, 3)) for _ in range(3))
    keep = np.array([[True, True, False, True], [True, False, True, True]])
    allowed = np.tril(np.ones((4, 4), bool))[None, None] & keep[:, None, None, :]  # PyTorch's attn_mask, (B,1,L,S)
    scores = np.where(allowed, np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(3), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bhqk,bkhd->bqhd", weights / weights.sum(-1, keepdims=True), v)

    def body():
        mesh = Mesh(Layout((2,), ("dp",)))
        spread = lambda a: DTensor.from_global(mesh, a, mesh.layout("dp", *[None] * (a.ndim - 1)))  # noqa: E731
        return ops.attention(spread(q), spread(k), spread(v), causal=True, mask=spread(keep)).check(want).passed

    assert simulate(2, body) == [True, True]


def test_the_jax_collectives_row_names_the_tiled_forms_spmdsims_are():
    """spmdsim's reduce_scatter and alltoall keep the block's dims, as JAX's psum_scatter and all_to_all do with
    tiled=True; the row named them bare, whose JAX default (tiled=False) drops or stacks a dim of the group's size.
    Each JAX collective the row maps says tiled=True, and spmdsim's give the tiled results (numpy here)."""
    from spmdsim import Layout, Mesh, simulate
    from spmdsim.runtime import allgather, alltoall, reduce_scatter

    row = next(line for line in (ROOT / DOC).read_text().splitlines() if line.startswith("| `jax.lax.psum(block"))
    jax_side = row.split(" | ")[0]
    for name in ("all_gather", "psum_scatter", "all_to_all"):
        call = re.search(rf"`{name}\(([^`]*)\)`", jax_side)
        assert call and "tiled=True" in call.group(1), name
    blocks = [np.arange(24.0).reshape(4, 6) + 100 * r for r in range(4)]

    def body():
        mesh = Mesh(Layout((4,), ("tp",)))
        mine = blocks[mesh.rank]
        return (allgather(mesh, mine, "tp", 1).shape, reduce_scatter(mesh, mine, "tp", 0),
                alltoall(mesh, mine, "tp", 0, 1))

    for r, (gathered, scattered, exchanged) in enumerate(simulate(4, body)):
        assert gathered == (4, 24)
        assert np.array_equal(scattered, sum(blocks)[r:r + 1])  # psum_scatter(tiled=True): row r of the sum
        assert np.array_equal(exchanged, np.concatenate([b[r:r + 1] for b in blocks], 1))  # (1, 24)


def test_the_device_put_row_says_who_refuses_uneven_shards_and_how_to_cut_them():
    """The row's "even shards only" read as spmdsim's limit, which the PyTorch table's uneven cut contradicts; it is
    JAX's (device_put: "should be divisible by"). The row says so and names the cut, which then splits 7 rows."""
    from spmdsim import Layout, Mesh, simulate
    from spmdsim.layouts.dialects import partition_spec_to_layout
    from spmdsim.runtime import DTensor

    row = next(line for line in (ROOT / DOC).read_text().splitlines() if line.startswith("| `jax.device_put("))
    assert "even shards only" not in row and "JAX refuses a dim its shards do not divide" in row
    assert 'a mesh of `Layout(..., cut="chunk")`' in row, row
    rows = np.arange(14.0).reshape(7, 2)

    def body():
        mesh = Mesh(Layout((4,), ("x",), cut="chunk"))
        layout = partition_spec_to_layout(("x", None), mesh, 2)
        return DTensor.from_global(mesh, rows, layout).local.shape

    assert simulate(4, body) == [(2, 2), (2, 2), (2, 2), (1, 2)]  # torch.chunk's pieces, as the PyTorch row says
