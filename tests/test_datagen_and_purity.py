"""Counter-based data and the pure/MPI dividing line (docs/explanation/architecture.md, "Imports")."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import importkit
import spmdsim.layouts.counters as counters
import spmdsim.layouts.datagen as datagen
from spmdsim import Layout, SeededTensor, SpmdsimError


def test_any_region_equals_slice_of_full():
    t = SeededTensor((6, 10, 7), "float32", seed=3)
    full = t.full()
    assert full.dtype == np.float32 and full.shape == (6, 10, 7)
    assert np.array_equal(full[2:5, 3:9, 1:4], t.region([slice(2, 5), (3, 9), (1, 4)]))
    assert (full >= -1).all() and (full < 1).all()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32"])
def test_shards_are_bit_identical_for_any_layout(dtype):
    t = SeededTensor((8, 12), dtype, seed=11, low=0, high=100)
    full = t.full()
    for layout, tensor_map in [
        (Layout((8,), ("x",)), ("x", None)),
        (Layout((2, 4), ("a", "b")), ("b", "a")),
        (Layout((2, 2, 2), ("a", "b", "c")), (("c", "a"), "b")),
        (Layout((4,), ("x",)), (None, "x")),
    ]:
        tl = layout(*tensor_map)
        for rank in range(layout.num_devices):
            region = tl.slices(rank, t.shape)
            assert np.array_equal(t.region(region), full[region])


def test_chunking_does_not_change_values(monkeypatch):
    t = SeededTensor((5, 9, 3), "float64", seed=5)
    before = t.full()
    monkeypatch.setattr(datagen, "_CHUNK_ELEMENTS", 7)
    assert np.array_equal(before, t.full())


@pytest.mark.parametrize("shape", [(), (5,), (4, 7), (3, 5, 6)])
def test_at_least_is_region_compared(shape, monkeypatch):
    """A dropout's keep mask from the generator's bits equals comparing the floats, at every threshold
    (values themselves and their neighbours, both ends, NaN), on regions and in chunks."""
    monkeypatch.setattr(datagen, "_CHUNK_ELEMENTS", 7)
    t = SeededTensor(shape, "float64", seed=12345, low=0.0, high=1.0)
    region = tuple(slice(1, s) if s > 1 else slice(0, s) for s in shape)
    values = t.region(region)
    some = values.reshape(-1)[:6]
    thresholds = [0.0, -1.0, 0.1, 0.5, 1.0, 2.0, float("nan"), 2.0**-60, 1 - 2.0**-53]
    thresholds += [float(v) for v in some] + [float(np.nextafter(v, 2.0)) for v in some]
    for p in thresholds:
        keep = t.at_least(region, p)
        assert keep.dtype == bool and keep.shape == values.shape
        np.testing.assert_array_equal(keep, values >= p, err_msg=f"threshold {p!r}")
    other = SeededTensor(shape, "float32", seed=3, low=-2.0, high=2.0)  # not [0, 1) float64: the floats compared
    np.testing.assert_array_equal(other.at_least(region, 0.25), other.region(region) >= 0.25)


@pytest.mark.usefixtures("empty_tables")  # (datagen keeps a block's counters only while its regions' tables have
# bytes to spare: earlier tests could have left too few, and the block's would not be kept)
def test_a_mask_drawn_again_with_new_seeds_is_the_region_compared():
    """A mask drawn at the same block step after step makes its counters from the block's kept
    (seed-independent) ones and its seed's key on Python integers: the same bits as the floats'."""
    shape, region = (6, 5, 9), (slice(2, 5), slice(1, 4), slice(None))
    for seed in (0, 1, 7, 2**40 + 3, 2**63 - 1):
        key = counters._mix(np.array([seed], dtype=np.uint64) + counters._GOLDEN)[0]
        assert counters._key(seed) == key
        t = SeededTensor(shape, "float64", seed=seed, low=0.0, high=1.0)
        for _ in range(2):  # the first draw keeps the block's counters, the second uses them
            np.testing.assert_array_equal(t.at_least(region, 0.3), t.region(region) >= 0.3)
    assert (shape, ((2, 5), (1, 4), (0, 9))) in counters._BASES


@pytest.mark.usefixtures("empty_tables")  # (counters._PLANS starts over when full, or when its regions' tables
# reach their bytes: filled by earlier tests, it could start over between a draw and the look at what it kept)
def test_a_mask_kept_per_region_object_serves_only_that_mask():
    """What `at_least` keeps per region object (counters._PLANS: bounds, block shape, threshold's edge, kept
    counters) serves a draw of the same shape, range and threshold alone: another seed, threshold, shape,
    dtype or range, a dry run, or a region that can change, is worked out as the floats compared say."""
    import spmdsim

    region = (slice(1, 3), slice(0, 4))
    t = SeededTensor((4, 4), "float64", seed=5, low=0.0, high=1.0)
    first = t.at_least(region, 0.3)
    assert counters._PLANS[id(region)][0] is region  # kept: the next draws at `region` start from it
    for other, p in [(t, 0.3), (t.with_seed(6), 0.3), (t, 0.7), (t.with_seed(9), 0.0),
                     (SeededTensor((4, 6), "float64", seed=5, low=0.0, high=1.0), 0.3),
                     (SeededTensor((4, 4), "float32", seed=5, low=0.0, high=1.0), 0.3),
                     (SeededTensor((4, 4), "int64", seed=5, low=0, high=1), 0.3),
                     (SeededTensor((4, 4), "float64", seed=5, low=0.0, high=2.0), 0.3),
                     (SeededTensor((4, 4), "float64", seed=5, low=0.5, high=1.0), 0.3), (t, 0.3)]:
        np.testing.assert_array_equal(t.at_least(region, 0.3), first)  # kept for (4, 4) and 0.3 again
        assert counters._PLANS[id(region)][1:3] == ((4, 4), 0.3)
        expected = other.region(region) >= p
        np.testing.assert_array_equal(other.at_least(region, p), expected, err_msg=f"{other!r} at {p}")
        out = np.empty((2, 4), dtype=bool)
        assert other.at_least(region, p, out) is out
        np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(first, t.region(region) >= 0.3)
    assert first.any() and not first.all()
    changing = [[1, 3], [0, 4]]  # a list can change between draws: never kept
    np.testing.assert_array_equal(t.at_least(changing, 0.3), first)
    changing[0][1] = 4
    np.testing.assert_array_equal(t.at_least(changing, 0.3), t.region(changing) >= 0.3)
    assert id(changing) not in counters._PLANS
    dry = spmdsim.simulate(1, lambda: (t.at_least(region, 0.3), t.region(region) >= 0.3), dry_run=True)[0]
    np.testing.assert_array_equal(dry[0], dry[1])  # a dry run's stand-in values, not the kept mask
    assert not np.array_equal(dry[0], first)


def test_seeds_and_dtypes_differ_and_ints_cover_range():
    a = SeededTensor((100,), "float32", seed=1).full()
    b = SeededTensor((100,), "float32", seed=2).full()
    assert not np.array_equal(a, b)
    ids = SeededTensor((5000,), "int64", seed=1, low=0, high=50).full()
    assert ids.min() == 0 and ids.max() == 49
    assert len(np.unique(ids)) == 50


def test_known_values_are_stable():
    # Pins the generator: changing it would silently change every seeded test.
    t = SeededTensor((2, 2), "float64", seed=0)
    again = SeededTensor((2, 2), "float64", seed=0).full()
    assert np.array_equal(t.full(), again)
    assert np.array_equal(SeededTensor((4,), "int64", seed=7, low=0, high=1000).full(),
                          SeededTensor((4,), "int64", seed=7, low=0, high=1000).region([(0, 4)]))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(shape=(2, -1)), "negative sizes"),
        (dict(shape=(2,), dtype="complex64"), "dtype 'complex64' is not supported"),
        (dict(shape=(2,), dtype="bfloat16"), r"not supported; .*\.astype\('bfloat16'\)"),
        (dict(shape=(2,), dtype="bf16"), r"dtype 'bf16' .*: draw it in float32 and convert"),
        (dict(shape=(2,), dtype="float16"), r"\.astype\('float16'\)"),
        (dict(shape=(2,), seed=-1), "seed -1"),
        (dict(shape=(2,), low=1.0, high=1.0), "is empty"),
        (dict(shape=(2,), dtype="int64", low=0, high=0.5), "integer bounds"),
    ],
)
def test_seeded_tensor_errors(kwargs, fragment):
    with pytest.raises(SpmdsimError, match=fragment):
        SeededTensor(**kwargs)


def test_region_errors():
    t = SeededTensor((4, 4))
    with pytest.raises(SpmdsimError, match="outside size 4"):
        t.region([(0, 5), (0, 4)])
    with pytest.raises(SpmdsimError, match="has 1 dim but"):
        t.region([(0, 4)])


def test_a_seeded_tensor_is_not_read_as_an_array_by_numpy():
    """reference.matmul(xs, ws) on SeededTensors read each as a 0-d object array: "matmul needs 2-d or batched
    operands, got shapes () and ()". numpy's reading is refused, naming the whole tensor's and a block's calls."""
    from spmdsim import reference
    xs, ws = SeededTensor((4, 3), seed=0), SeededTensor((3, 2), seed=1)
    with pytest.raises(SpmdsimError, match=r"SeededTensor of shape \(4, 3\).*xs.full\(\).*matmul_region"):
        reference.matmul(xs, ws)
    with pytest.raises(SpmdsimError, match="numpy array of a SeededTensor"):
        np.asarray(ws)
    assert np.allclose(reference.matmul(xs.full(), ws.full()), xs.full().astype(float) @ ws.full(), rtol=1e-6)


#: The floors that decide (layouts, data, planning, cost, references, explanation, pictures) and the
#: ground floor below them: importing none of their modules loads mpi4py or spmdsim.runtime, and none
#: of their functions imports them, directly or through the modules it imports
#: (test_pure_modules_never_reach_...). Every module of these floors, found on disk.
PURE_FLOORS = ("spmdsim.base", "spmdsim.layouts", "spmdsim.references", "spmdsim.programs")
PURE_MODULES = ["spmdsim", "spmdsim.errors"] + sorted(
    m for m in importkit.module_paths() if m.startswith(tuple(f + "." for f in PURE_FLOORS)) or m in PURE_FLOORS)

#: Above the runtime, but deciding only (gradient rules, model descriptions, the autoshard search, the
#: CLI's pure commands): they load the engines' interface (local work, a dry run's zeros) and no other
#: module of the runtime, nor mpi4py.
DECIDING_ABOVE = [
    "spmdsim.nn.autograd.graph",
    "spmdsim.nn.autograd.rules",
    "spmdsim.nn.autograd.function",
    "spmdsim.models.nets.reference",
    "spmdsim.models.nets",
    "spmdsim.models.nets.digits",
    "spmdsim.models.nets.model",
    "spmdsim.models.gpt",
    "spmdsim.tools.cli.cases",
    "spmdsim.tools.cli.convert",
    "spmdsim.tools.cli.plan_explain",
    "spmdsim.tools.autoshard",
    "spmdsim.tools.autoshard.backward",
    "spmdsim.tools.autoshard.volume",
    "spmdsim.tools.autoshard.evaluate",
    "spmdsim.tools.autoshard.runnable",
    "spmdsim.tools.autoshard.report",
    "spmdsim.tools.autoshard.graph",
    "spmdsim.tools.autoshard.gpt",
    "spmdsim.tools.autoshard.networks",
    "spmdsim.tools.autoshard.choose",
    "spmdsim.models.nets.seeds",
    "spmdsim.models.gpt.params",
    "spmdsim.models.gpt.layouts",
    "spmdsim.models.gpt.mixed",
    "spmdsim.tools.cli.pipeline",
]

#: Importing these loads no mpi4py, but they are not pure: calling them runs
#: programs on ranks or reaches a module that does. Why, per module.
LIGHT_MODULES = {
    "spmdsim.nn.autograd": "its `backward` is the backward walk (autograd.engine)",
    "spmdsim.nn.autograd.engine": "the backward walk: resolves pending sums and redistributes gradients (collectives)",
    "spmdsim.nn.optim": "steps DTensors' shards: resolves pending gradients and replays its kernels (the runtime); "
                     "its numpy AdamW math (adamw_update, clip_coefficient) belongs in a pure module",
    "spmdsim.models.gpt.reference": "takes AdamW's numpy math from spmdsim.nn.optim, which reaches the runtime",
    "spmdsim.models.gpt.train": "trains the parallel GPT on ranks",
    "spmdsim.tools.cli.main": "dispatches to every subcommand, which run programs under MPI or on simulated ranks",
    "spmdsim.tools.cli.autoshard": "--run executes the choice on ranks",
    "spmdsim.tools.cli.collective": "runs and compares collective algorithms on ranks",
    # The engines of simulated ranks: they run programs (which use the runtime) and read mpi4py's
    # datatypes when a program passes them.
    "spmdsim.runtime.sim": "its names start simulations",
    "spmdsim.runtime.sim.run": "runs a program on simulated ranks",
    "spmdsim.emulator.comm": "reads mpi4py's datatypes when a program passes them (sim._datatypes)",
    "spmdsim.runtime.sim.dry": "runs a program on one rank for all",
    "spmdsim.runtime.sim.launch": "launches scripts on simulated ranks under the runtime's excepthook",
}

#: Below the runtime, the engines meet mpi4py only when a program runs under MPI (MpiEngine's
#: transfers, `engines.world`); what a pure module asks of them is local work (`engines.local`,
#: `matmul`, `once`). Their imports inside functions are not followed; their module-level ones are.
ENGINES = "spmdsim.runtime.engines"


#: The operators and the runtime package load spmdsim.runtime (lazily, names on first
#: use) but still no mpi4py until a program runs.
MPI_FREE_MODULES = ["spmdsim.nn.ops", "spmdsim.nn.ops.losses", "spmdsim.nn.ops.local", "spmdsim.nn.ops.einsum",
                    "spmdsim.nn.ops.pointwise", "spmdsim.nn.ops.reduce", "spmdsim.nn.ops.norms",
                    "spmdsim.models.gpt.parallel", "spmdsim.runtime", "spmdsim.tools.autoshard.execute",
                    "spmdsim.tools.autoshard.dag", "spmdsim.models.nets.run"]


def _loaded_after_import(modules: list[str], prefixes: tuple[str, ...]) -> str:
    """Import `modules` in a fresh interpreter; the loaded modules starting with `prefixes`."""
    code = (
        "import importlib, importlib.util, sys\n"
        f"for name in {modules!r}:\n"
        "    if importlib.util.find_spec(name) is None:\n"
        "        raise SystemExit('missing module ' + name)\n"
        "    importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({prefixes!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout.strip()


def test_pure_modules_import_neither_the_runtime_nor_mpi4py():
    assert len(PURE_MODULES) > 80  # the floors were found on disk
    loaded = _loaded_after_import(PURE_MODULES, ("mpi4py", "spmdsim.runtime"))
    assert loaded == "", f"pure modules imported {loaded}"


def test_deciding_modules_load_the_engines_interface_at_most():
    loaded = _loaded_after_import(DECIDING_ABOVE, ("mpi4py", "spmdsim.runtime"))
    beyond = [m for m in loaded.split(",") if m and m != "spmdsim.runtime" and not _engines(m)]
    assert beyond == [], f"deciding modules imported {beyond}"


def test_light_modules_do_not_import_mpi4py():
    loaded = _loaded_after_import(list(LIGHT_MODULES), ("mpi4py",))
    assert loaded == "", f"light modules imported {loaded}"


def _engines(module: str) -> bool:
    return module == ENGINES or module.startswith(ENGINES + ".")


def _bad(target: str) -> bool:
    return target == "mpi4py" or target == "spmdsim.runtime" or target.startswith("spmdsim.runtime.")


def _bad_above(target: str) -> bool:
    """What a deciding module above the runtime never reaches: mpi4py, or the runtime beyond the engines
    (its package's __init__, which loads its names on first use, is on the way to them)."""
    return target == "mpi4py" or (_bad(target) and not _engines(target) and target != "spmdsim.runtime")


def _follow(module: str, imp: importkit.Import) -> bool:
    """Every import, except those inside the engines' functions (ENGINES)."""
    return imp.at_import or not _engines(module)


def test_pure_modules_never_reach_the_runtime_or_mpi4py_when_they_run():
    """Every import statement of a pure module, inside its functions too, and those of the modules it
    imports in turn (the engines' module-level ones only: ENGINES) stay clear of spmdsim.runtime and
    mpi4py. A name of the front door or of a package that loads names on first use counts as the
    module that defines it: ``from .. import DTensor`` is an import of spmdsim.runtime.dtensor."""
    imports = importkit.scan()
    reached = {m: importkit.path_to(m, _bad, imports) for m in PURE_MODULES}
    reached.update({m: importkit.path_to(m, _bad_above, imports, _follow) for m in DECIDING_ABOVE})
    bad = {m: chain for m, chain in reached.items() if chain}
    assert not bad, "pure modules reach the runtime or mpi4py:\n" + "\n".join(
        f"{m}:\n{importkit.describe(chain)}" for m, chain in bad.items())
    assert not set(PURE_MODULES + DECIDING_ABOVE) & set(LIGHT_MODULES)


def test_the_reach_check_sees_what_runs():
    """The check above on modules that do reach the runtime or mpi4py: it names the statements, those
    inside functions too; the references reach neither even through every function they call."""
    imports = importkit.scan()
    chain = importkit.path_to("spmdsim.nn.autograd", _bad_above, imports, _follow)
    assert [(m, i.at_import) for m, i in chain][-1] == ("spmdsim.nn.autograd.leaves", False)
    chain = importkit.path_to("spmdsim.tools.cli.autoshard", _bad_above, imports, _follow)
    assert [(m, i.target, i.at_import, i.statement) for m, i in chain] == [  # an import inside a function
        ("spmdsim.tools.cli.autoshard", "spmdsim.runtime.mpi_library", False,
         "from ...runtime.mpi_library import load_mpi")]
    assert importkit.path_to("spmdsim.tools.autoshard.dag", _bad_above, imports, _follow)[0][1].at_import
    assert importkit.path_to("spmdsim.references.forward", _bad, imports) == []
    assert importkit.path_to("spmdsim.runtime.engines", _bad, imports)[0][1].target.startswith("spmdsim.runtime")


def test_operators_and_runtime_package_do_not_import_mpi4py():
    loaded = _loaded_after_import(MPI_FREE_MODULES, ("mpi4py",))
    assert loaded == "", f"importing the operators loaded {loaded}"
