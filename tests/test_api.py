"""The public API: docs/reference/api.md equals the modules' __all__, each line is its name's docstring's first
sentence (the page's rule), and the names the page leaves out are the ones it says; the front door is lazy
and complete."""
from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import re
import subprocess
import sys
from typing import Optional

import spmdsim
from spmdsim import _lazy

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: Values with no docstring and no ``#:`` comment yet, whose lines docs/reference/api.md writes itself (it says so).
#: When one gets a comment in spmdsim/references/forward.py, drop it here: its line is then the comment's.
_NO_COMMENT = {"spmdsim.references.forward.ACTIVATIONS", "spmdsim.references.forward.Region",
               "spmdsim.references.forward.RegionFn"}


def _entries() -> list[tuple[Optional[str], str, str]]:
    """(module, name, text) for each ``| `name` | text |`` row of docs/reference/api.md, in order; module is None for
    the lines under a heading that names no module (the names the page leaves out, written module.name)."""
    out = []
    module = None
    for line in (ROOT / "docs" / "reference" / "api.md").read_text().splitlines():
        if line.startswith("## "):
            heading = re.match(r"^## `([\w.]+)`$", line)
            module = heading.group(1) if heading else None
        elif line.startswith("| `"):
            entry = re.match(r"^\| `([\w.]+)` \| (.+) \|$", line)
            assert entry, f"docs/reference/api.md: not a '| `name` | line |' row: {line!r}"
            out.append((module, entry.group(1), entry.group(2).replace("\\|", "|")))
    return out


def _documented() -> dict[str, list[str]]:
    """Module -> the names docs/reference/api.md lists under its heading, in order."""
    out: dict[str, list[str]] = {}
    for module, name, _ in _entries():
        if module is not None:
            out.setdefault(module, []).append(name)
    return out


def _left_out() -> dict[str, str]:
    """module.name -> why, for the names of listed modules that docs/reference/api.md says it leaves out."""
    return {name: why for module, name, why in _entries() if module is None}


def first_sentence(text: str) -> str:
    """docs/reference/api.md's rule: the first line of `text` (a docstring, or a ``#:`` comment's lines), joined with
    the lines after it up to the first that ends with a period (a blank line ends it too), each run of
    whitespace one space."""
    out: list[str] = []
    for line in inspect.cleandoc(text).splitlines():
        if not line.strip():
            break
        out.append(line.strip())
        if line.rstrip().endswith("."):
            break
    return " ".join(" ".join(out).split())


_ASSIGNED = re.compile(r"^([A-Za-z]\w*)\s*(?::[^=\n]*)?=", re.M)


def _comments() -> dict[str, list[tuple[str, str]]]:
    """Name -> (module, the text of the ``#:`` lines right above its top-level assignment) in spmdsim."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((ROOT / "spmdsim").rglob("*.py")):
        lines = path.read_text().splitlines()
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for i, line in enumerate(lines):
            assigned = _ASSIGNED.match(line)
            if not assigned:
                continue
            j = i
            while j > 0 and lines[j - 1].startswith("#:"):
                j -= 1
            text = "\n".join(c[2:].strip() for c in lines[j:i])
            out.setdefault(assigned.group(1), []).append((module, text))
    return out


def _expected(module: str, name: str, comments: dict) -> tuple[str, Optional[str]]:
    """What docs/reference/api.md's line for module.name must be: ("line", text), ("alias", the name it is: the line
    starts with it in backticks) or ("written", None): a value with no comment, whose line the page writes."""
    obj = getattr(importlib.import_module(module), name)
    if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj):
        mod, own = importlib.import_module(module), obj.__name__.rsplit(".", 1)[-1]
        if own != name and own in mod.__all__ and getattr(mod, own) is obj:  # an alias: its line names the name first
            return "alias", own
        return "line", first_sentence(obj.__doc__ or "")
    inside = [(m, text) for m, text in comments.get(name, ()) if m == module or m.startswith(module + ".")]
    outside = [(m, text) for m, text in comments.get(name, ()) if (m, text) not in inside]
    for where, text in inside + outside:  # the module that binds this very object
        if getattr(importlib.import_module(where), name, None) is obj:
            return ("line", first_sentence(text)) if text else ("written", None)
    return "written", None


def test_api_md_lines_are_their_names_docstrings_first_sentences():
    comments = _comments()
    wrong, written = [], set()
    for module, name, text in _entries():
        if module is None:
            continue
        kind, expected = _expected(module, name, comments)
        if kind == "written":
            written.add(f"{module}.{name}")
        elif kind == "alias":
            if not text.startswith(f"`{expected}`"):
                wrong.append(f"{module}.{name}: page {text!r}, not starting with the name it is, `{expected}`")
        elif text != expected:
            wrong.append(f"{module}.{name}:\n  page:      {text}\n  docstring: {expected}")
    assert not wrong, f"{len(wrong)} lines of docs/reference/api.md are not their docstrings' first sentences:\n" + \
        "\n".join(wrong)
    assert written == _NO_COMMENT, f"values without a docstring or #: comment: {sorted(written)}"


def test_first_sentence_is_the_pages_rule():
    assert first_sentence("One line.\n\n    More.") == "One line."
    assert first_sentence("A first line,\n    its end.  Then more.\n    Not this.") == ("A first line, its "
                                                                                        "end. Then more.")
    assert first_sentence("No period\n\nNext paragraph.") == "No period"
    assert first_sentence("e.g. ``x``, one line.") == "e.g. ``x``, one line."


def test_listed_modules_have_no_other_public_names_than_the_page_says():
    left_out = _left_out()
    for module in _documented():
        mod = importlib.import_module(module)
        source = pathlib.Path(mod.__file__).read_text()
        assigned = {target.id for node in ast.parse(source).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(target, ast.Name)}
        # numpy's lazy stand-in (spmdsim._lazy: a module's ``np`` until numpy is first used) is numpy, no name of its
        own = {name for name, value in vars(mod).items() if not name.startswith("_") and not inspect.ismodule(value)
               and value is not _lazy._NUMPY
               and (name in assigned or re.match(rf"{re.escape(module)}(\.|$)", str(getattr(value, "__module__", ""))))}
        unlisted = own - set(mod.__all__) - {n.rsplit(".", 1)[1] for n in left_out if n.rsplit(".", 1)[0] == module}
        assert not unlisted, f"{module} has public names neither in its __all__ nor in docs/reference/api.md's " \
            f"'Not listed': {sorted(unlisted)}"
    for dotted in left_out:
        module, name = dotted.rsplit(".", 1)
        mod = importlib.import_module(module)
        assert module in _documented() and hasattr(mod, name) and name not in mod.__all__, dotted


def test_api_md_lists_exactly_each_modules_all():
    documented = _documented()
    assert "spmdsim" in documented and len(documented) >= 10
    for module, names in documented.items():
        code = importlib.import_module(module).__all__
        assert len(set(code)) == len(code), f"{module}.__all__ repeats a name"
        assert names == list(code), f"docs/reference/api.md and {module}.__all__ differ: " \
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
            "from spmdsim import Layout, Mesh, DTensor, SeededTensor, redistribute, simulate, world; "
            "from spmdsim.nn import ops, optim\n"
            "import spmdsim.runtime as rt\n"
            "print(lazy, redistribute is rt.redistribute, DTensor.redistribute.__name__, ops.matmul.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "redistribute", "matmul"]


def test_dir_of_the_package_shows_the_api_not_its_imports():
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
        assert "spmdsim.tools.demo" not in path.read_text(), path.name


def test_the_environment_variables_are_the_documented_few():
    code = {m for path in (ROOT / "spmdsim").rglob("*.py")
            for m in re.findall(r"SPMDSIM_[A-Z_]+", path.read_text())}
    table = re.findall(r"^\| `(SPMDSIM_[A-Z_]+)", (ROOT / "docs" / "reference" / "settings.md").read_text(), re.M)
    assert len(table) <= 5, table  # the settings a user sets; docs/reference/settings.md has their one table
    assert code == set(table) | {"SPMDSIM_EXPECT_WORLD"}, sorted(code ^ (set(table) | {"SPMDSIM_EXPECT_WORLD"}))
