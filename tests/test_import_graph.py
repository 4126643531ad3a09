"""No import cycle among spmdsim's modules (docs/explanation/architecture.md, "Imports").

The graph: every module of the package (a package's ``__init__`` is a module) and, for each, the spmdsim
modules its module-level imports load (tests/importkit.py reads them with `ast`; imports inside functions
and under ``if TYPE_CHECKING:`` do not count). Acyclic, a module is always whole before the modules that
import it use it: none sees another half-imported, whichever is imported first.
"""
from __future__ import annotations

import textwrap

import pytest

import importkit
from importkit import cycles, describe, module_level_graph, names_from_above, one_cycle, path_to, scan


def test_no_module_level_import_cycle():
    graph = module_level_graph()
    found = cycles(graph)
    lines = []
    for members in found:
        ring = one_cycle(graph, members)
        hops = [next(i for i in scan()[a] if i.target == b and i.at_import) for a, b in zip(ring, ring[1:])]
        lines.append(f"{len(members)} modules on a cycle: {', '.join(members)}; for instance\n"
                     + describe(list(zip(ring, hops))))
    assert not found, "module-level import cycles:\n" + "\n".join(lines)


def test_names_come_from_their_own_module_not_a_package_above():
    """A module imports a name from the module that defines it, never through the __init__ of a package it
    sits in (which may import it back, half done): ``from .. import DTensor`` inside the package is
    ``from ..runtime.dtensor import DTensor``. Submodules and names the __init__ defines itself are fine."""
    found = names_from_above()
    assert not found, "names taken from a package above:\n" + "\n".join(
        f"  {module}:{line} {name} from {package}: {text}" for module, line, package, name, text in found)


def test_the_graph_sees_the_packages_imports():
    """Spot checks against the source, so an empty graph cannot pass the test above."""
    graph = module_level_graph()
    assert len(graph) == len(importkit.module_paths()) > 150
    assert "spmdsim.runtime.executor" in graph["spmdsim.nn.ops.matmul"]  # from ..runtime.executor import execute
    assert "spmdsim.tools.autoshard.volume" in graph["spmdsim.tools.autoshard.backward"]
    assert "spmdsim.tools.autoshard.backward" in graph["spmdsim.tools.autoshard.cost"]
    # the cycle broken in volume.py
    assert "spmdsim.tools.autoshard.cost" not in graph["spmdsim.tools.autoshard.backward"]
    assert "spmdsim.tools.autoshard.dag" not in graph["spmdsim.tools.autoshard.report"]  # under TYPE_CHECKING
    # from . import moving, reducing
    assert "spmdsim.programs.algorithms.moving" in graph["spmdsim.programs.algorithms"]
    # A function-level import is in the scan, not in the graph.
    assert "spmdsim.runtime.executor" not in graph["spmdsim.nn.autograd.moves"]
    assert any(i.target == "spmdsim.runtime.executor" and not i.at_import for i in scan()["spmdsim.nn.autograd.moves"])


def _package(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def toy(tmp_path):
    """A package `toy` shaped like spmdsim: a front door with lazy names, a runtime, an operator package."""
    _package(tmp_path, {
        "toy/__init__.py": """
            from .errors import Error
            _LAZY = {"Mesh": ("toy.runtime.mesh", "Mesh"), "ops": ("toy.ops", None)}
            def __getattr__(name): ...
            """,
        "toy/errors.py": "class Error(Exception): ...\n",
        "toy/runtime/__init__.py": """
            _WHERE = {name: module for module, names in {"mesh": ("Mesh",)}.items() for name in names}
            """,
        "toy/runtime/mesh.py": "import mpi4py\nfrom ..errors import Error\n",
        "toy/ops/__init__.py": "from .matmul import matmul\n",
        "toy/ops/matmul.py": "from .. import errors\nfrom ..runtime import mesh\ndef matmul(): ...\n",
        "toy/plan/__init__.py": "from .steps import Step\n",
        "toy/plan/steps.py": """
            from typing import TYPE_CHECKING
            from . import kinds
            if TYPE_CHECKING:
                from ..ops import matmul
            class Step:
                from ..errors import Error  # a class body runs at import
            def run():
                from .. import Mesh
            """,
        "toy/plan/kinds.py": "from . import Step  # a name of the package's __init__, which imports this\n",
    })
    return tmp_path


def test_the_rules_on_a_toy_package(toy):
    imports = scan(toy, "toy")
    graph = module_level_graph(toy, "toy")
    assert graph["toy.ops.matmul"] == {"toy.errors", "toy.runtime", "toy.runtime.mesh"}  # submodules, not toy
    assert graph["toy.plan.steps"] == {"toy.plan.kinds", "toy.errors"}  # TYPE_CHECKING's left out
    assert graph["toy.plan.kinds"] == {"toy.plan"}
    assert {i.target for i in imports["toy.runtime.mesh"]} == {"mpi4py", "toy.errors"}
    # Inside a function, and a lazy name of the front door: its module (and the operators it loads with it).
    assert {(i.target, i.at_import) for i in imports["toy.plan.steps"] if i.line == 9} == {
        ("toy", False), ("toy.runtime.mesh", False), ("toy.runtime", False), ("toy.ops", False)}
    assert cycles(graph) == [["toy.plan", "toy.plan.kinds", "toy.plan.steps"]]
    assert one_cycle(graph, cycles(graph)[0]) == ["toy.plan", "toy.plan.steps", "toy.plan.kinds", "toy.plan"]
    assert [(m, p, n) for m, _, p, n, _ in names_from_above(toy, "toy")] == [
        ("toy.plan.kinds", "toy.plan", "Step"), ("toy.plan.steps", "toy", "Mesh")]
    chain = path_to("toy.plan.steps", lambda m: m == "mpi4py", imports)
    assert [(m, i.target) for m, i in chain] == [("toy.plan.steps", "toy.runtime.mesh"), ("toy.runtime.mesh", "mpi4py")]
    assert describe(chain).splitlines()[0] == "  toy.plan.steps:9 (in a function) from .. import Mesh"


def test_cycles_finds_every_strongly_connected_part():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"f"}, "g": {"a"}}
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert cycles({"a": {"b"}, "b": set()}) == []
