"""The public API: docs/api.md equals the modules' __all__; the front door is lazy and complete."""
from __future__ import annotations

import importlib
import pathlib
import re
import subprocess
import sys

import spmdsim

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _documented() -> dict[str, list[str]]:
    """Module -> the names docs/api.md lists under its heading, in order."""
    out: dict[str, list[str]] = {}
    module = None
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        heading = re.match(r"^## `([\w.]+)`$", line)
        if heading:
            module = heading.group(1)
            out[module] = []
        elif line.startswith("- `") and module:
            out[module].append(re.match(r"^- `(\w+)`", line).group(1))
    return out


def test_api_md_lists_exactly_each_modules_all():
    documented = _documented()
    assert "spmdsim" in documented and len(documented) >= 10
    for module, names in documented.items():
        code = importlib.import_module(module).__all__
        assert len(set(code)) == len(code), f"{module}.__all__ repeats a name"
        assert names == list(code), f"docs/api.md and {module}.__all__ differ: " \
            f"only in docs {sorted(set(names) - set(code))}, only in code {sorted(set(code) - set(names))}"


def test_every_public_name_resolves_and_private_modules_have_no_all():
    for module, names in _documented().items():
        mod = importlib.import_module(module)
        for name in names:
            assert getattr(mod, name) is not None, f"{module}.{name}"
    for path in (ROOT / "spmdsim").rglob("_*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            assert not re.search(r"^__all__", path.read_text(), re.M), f"{path} is private but has __all__"


def test_front_door_is_lazy_and_gives_what_the_examples_use():
    code = ("import sys, spmdsim; lazy = 'mpi4py' in sys.modules\n"
            "from spmdsim import Layout, Mesh, DTensor, SeededTensor, redistribute, ops, simulate, world, optim\n"
            "import spmdsim.runtime as rt\n"
            "print(lazy, redistribute is rt.redistribute, DTensor.redistribute.__name__, ops.matmul.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "redistribute", "matmul"]


def test_dir_of_the_package_shows_the_api_not_its_imports():
    import spmdsim

    names = dir(spmdsim)
    assert set(spmdsim.__all__) <= set(names)
    assert not {"Any", "annotations", "importlib"} & set(names)


def test_front_door_runs_a_redistribution_on_simulated_ranks():
    from spmdsim import DTensor, Layout, Mesh, SeededTensor, redistribute, simulate, world

    source = SeededTensor((4, 6), "float64", seed=3)

    def rank() -> tuple[bool, bool]:
        mesh = Mesh(Layout((2,), ("x",)), world())
        x = DTensor.from_seeded(mesh, mesh.layout("x", None), source)
        y = x.redistribute(mesh.layout(None, "x"))
        same = (redistribute(x, y.layout).local == y.local).all()
        return bool(y.check(source).passed), bool(same)

    assert simulate(2, rank) == [(True, True), (True, True)]


def test_no_example_imports_the_demo_package():
    for path in sorted((ROOT / "examples").glob("*.py")):
        assert "spmdsim.demo" not in path.read_text(), path.name


def test_the_environment_variables_are_the_documented_few():
    code = {m for path in (ROOT / "spmdsim").rglob("*.py")
            for m in re.findall(r"SPMDSIM_[A-Z_]+", path.read_text())}
    table = re.findall(r"^\| `(SPMDSIM_[A-Z_]+)", (ROOT / "docs" / "runtime.md").read_text(), re.M)
    assert len(table) <= 5, table  # the settings a user sets; docs/runtime.md has their one table
    assert code == set(table) | {"SPMDSIM_EXPECT_WORLD"}, sorted(code ^ (set(table) | {"SPMDSIM_EXPECT_WORLD"}))
