"""Every ``spmdsim.x.y`` spelling in the docs and examples works after a bare ``import spmdsim``.

docs/tutorials/porting.md writes ``with spmdsim.nn.autograd.no_grad():``; that spelling must not depend on some
other module having imported `spmdsim.nn.autograd` first. The check runs in this process, whatever it
imported before: each step from a package to a name must be one that a fresh ``import spmdsim``
would take too: the package's lazy ``__getattr__`` gives it (asked directly), or the package's own
``__init__`` binds it (its source read with `ast`), or it is a plain (non-module) name the package has.
"""
from __future__ import annotations

import ast
import json
import pathlib
import re
import subprocess
import sys
import types
from functools import lru_cache

import spmdsim

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: A dotted name from spmdsim, not inside a path or a longer name; an import statement's or
#: ``python -m``'s module is a module to import, not an attribute spelling.
_SPELLING = re.compile(r"(?<![\w./-])(?<!import )(?<!from )(?<!-m )spmdsim(?:\.[A-Za-z_]\w*)+")


def _spellings() -> dict[str, str]:
    """spelling -> the first file that writes it (docs/*.md, README.md, examples/*.py)."""
    found: dict[str, str] = {}
    files = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", *sorted((ROOT / "examples").glob("*.py"))]
    for path in files:
        for match in _SPELLING.finditer(path.read_text()):
            found.setdefault(match.group(0), str(path.relative_to(ROOT)))
    return found


@lru_cache(maxsize=None)
def _bound_by_init(package: types.ModuleType) -> frozenset:
    """The submodule names `package`'s own ``__init__`` binds at import (``from . import a``,
    ``from .a import x``, ``import package.a``)."""
    tree = ast.parse(pathlib.Path(package.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            prefix = package.__name__ + "."
            names.update(a.name[len(prefix):].split(".")[0] for a in node.names if a.name.startswith(prefix))
    return frozenset(names)


class _Unsure(Exception):
    """A step to a module that the package's __init__ may bind through another module it imports."""


def _step(obj: object, name: str) -> object:
    """`obj`.`name` as a fresh ``import spmdsim`` gets it; AttributeError (saying why) where it would not."""
    if not isinstance(obj, types.ModuleType):
        return getattr(obj, name)
    namespace = vars(obj)
    hook = namespace.get("__getattr__")
    if name not in namespace:
        if hook is None:
            raise AttributeError(f"{obj.__name__} has no {name!r} and no __getattr__ that loads it")
        return hook(name)
    value = namespace[name]
    if isinstance(value, types.ModuleType) and name not in _bound_by_init(obj):
        if hook is None:
            raise _Unsure(obj.__name__, name)
        if hook(name) is not value:
            raise AttributeError(f"{obj.__name__}'s __getattr__ gives no {name!r}")
    return value


def _bound_after_import(package: str, names: list[str]) -> set[str]:
    """Which of `names` are modules on `package` once a fresh process has imported it (the import of a
    module it imports may bind one); one subprocess."""
    code = ("import importlib, sys, types\n"
            f"m = importlib.import_module({package!r})\n"
            f"print(*[n for n in {names!r} if isinstance(vars(m).get(n), types.ModuleType)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_every_documented_spmdsim_spelling_resolves_after_a_bare_import():
    spellings = _spellings()
    assert len(spellings) > 150 and "spmdsim.nn.autograd.no_grad" in spellings  # the scan sees the docs
    failed, unsure = [], {}
    for spelling, where in sorted(spellings.items()):
        obj = spmdsim
        try:
            for name in spelling.split(".")[1:]:
                obj = _step(obj, name)
        except _Unsure as step:
            unsure.setdefault(step.args[0], {}).setdefault(step.args[1], []).append(f"{where}: {spelling}")
        except AttributeError as error:
            failed.append(f"{where}: {spelling}: {error}")
    for package, names in unsure.items():
        bound = _bound_after_import(package, sorted(names))
        failed += [f"{line}: {package}.{name} is there only once something imports it: {package}'s "
                   f"__init__ does not load it and has no __getattr__ that does"
                   for name, lines in names.items() if name not in bound for line in lines]
    assert not failed, ("spellings that fail after a bare `import spmdsim` (a package whose modules the docs "
                        "name gets `__getattr__ = modules_by_name(__name__)`, spmdsim/_lazy.py):\n"
                        + "\n".join(failed))


def test_the_documented_no_grad_spelling_in_a_fresh_process():
    code = ("import sys, spmdsim\n"
            "with spmdsim.nn.autograd.no_grad():\n"
            "    on = spmdsim.nn.autograd.is_grad_enabled()\n"
            "print(on, spmdsim.models.gpt.train.__name__, 'mpi4py' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "spmdsim.models.gpt.train", "False"]


def test_a_name_that_is_no_module_is_still_an_attribute_error():
    """The packages' __getattr__, asked directly (whatever this process imported): no module, no name."""
    for package, name in ((spmdsim, "no_such_name"), (spmdsim, "__main__"), (spmdsim, "runtime.mesh"),
                          (spmdsim.programs.plan, "no_such"), (spmdsim.runtime, "no_such"),
                          (spmdsim.models.gpt, "no_such")):
        try:
            vars(package)["__getattr__"](name)
        except AttributeError as error:
            assert repr(name) in str(error)
        else:
            raise AssertionError(f"{package.__name__}.{name} resolved")


#: ``spmdsim.runtime.exchange`` in a fresh process that imports the module of that name first (and
#: spmdsim.runtime.collectives, which imports it), against what the package's ``__getattr__`` gives for it
#: (what the spelling is after a bare ``import spmdsim``).
_EXCHANGE = """
import sys, spmdsim
import spmdsim.runtime.exchange, spmdsim.runtime.collectives
spelled = spmdsim.runtime.exchange
bare = vars(spmdsim.runtime)["__getattr__"]("exchange")  # (asked after: it keeps what it gives)
from spmdsim.runtime import exchange
from spmdsim.runtime.exchange import group_alltoallv  # the module's import path still works
module = sys.modules["spmdsim.runtime.exchange"]
print(spelled is bare is exchange is spmdsim.runtime.collectives.exchange is module.exchange, callable(spelled),
      type(module).__name__, group_alltoallv is module.group_alltoallv, "mpi4py" in sys.modules)
"""


def test_spmdsim_runtime_exchange_is_the_function_whatever_was_imported_first():
    """docs/explanation/runtime.md's ``exchange``: the one function before and after ``import spmdsim.runtime.exchange``
    (the function's module, which Python would bind on its package when first imported: spmdsim/_lazy.py)."""
    out = subprocess.run([sys.executable, "-c", _EXCHANGE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "module", "True", "False"], out.stdout


#: The whole package tree in a fresh process that cannot import mpi4py (so no MPI starts): for each package
#: and each of its modules, (1) the package's name for it means one thing whether or not the module has been
#: imported, (2) the name resolves after a bare ``import spmdsim``. Prints one JSON object.
_TREE = r"""
import ast, importlib, json, pathlib, pkgutil, sys, types
sys.modules["mpi4py"] = None  # an import of mpi4py fails here
import spmdsim

def packages(package):
    yield package
    for found in pkgutil.iter_modules(package.__path__):
        if found.ispkg:
            yield from packages(importlib.import_module(f"{package.__name__}.{found.name}"))

def bound_by_init(package):
    # (names the __init__ binds to something of its own: def, class, assignment, `from .m import name`;
    #  submodules it imports: `from . import m`, `from .m import x`)
    own, modules = set(), set()
    for node in ast.parse(pathlib.Path(package.__file__).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                own.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module:
            modules.update(a.name for a in node.names)  # bound as its name (and its asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            modules.add(node.module.split(".")[0])
            for a in node.names:
                if a.name == "*":
                    own.update(importlib.import_module(f"{package.__name__}.{node.module}").__all__)
                else:
                    own.add(a.asname or a.name)
    return own, modules

clashes, unreached, checked = [], {}, 0
for package in list(packages(spmdsim)):
    ns, own_and_modules = vars(package), bound_by_init(package)
    own, modules = own_and_modules
    hook = ns.get("__getattr__")
    for found in pkgutil.iter_modules(package.__path__):
        name, full = found.name, f"{package.__name__}.{found.name}"
        if name.startswith("__"):
            continue
        try:
            module = importlib.import_module(full)
        except ImportError as error:
            clashes.append(f"{full}: import failed ({error})")
            continue
        checked += 1
        after = getattr(package, name)
        if name in own:
            if after is module:
                clashes.append(f"{full}: {package.__name__}'s __init__ binds {name!r}, but importing the module "
                               f"puts the module there")
            continue
        if hook is not None:  # asked after reading `after`: a lazy table keeps what it gives
            try:
                before = hook(name)
            except AttributeError as error:
                before = f"AttributeError: {error}"
        elif name in modules:
            continue  # the __init__ imports it: the module, always
        else:
            if not name.startswith("_"):
                unreached.setdefault(package.__name__, []).append(name)
            continue
        if before is not after:
            what = before if isinstance(before, str) else type(before).__name__
            clashes.append(f"{package.__name__}.{name} is {what} after a bare import, but "
                           f"{type(after).__name__} {getattr(after, '__name__', after)!r} once {full} is imported")
print(json.dumps({"checked": checked, "clashes": clashes, "unreached": unreached,
                  "mpi4py": sys.modules.get("mpi4py") is not None}))
"""


@lru_cache(maxsize=None)
def _tree() -> dict:
    out = subprocess.run([sys.executable, "-c", _TREE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_no_package_name_changes_meaning_when_its_module_is_imported():
    """A package's name that is also one of its modules' names is one object whatever was imported: a
    function bound by the package's __init__ after importing its module (spmdsim.nn.ops.matmul), or a lazy name
    the package keeps (spmdsim.runtime.exchange, spmdsim/_lazy.py), or the module itself."""
    tree = _tree()
    assert tree["checked"] > 200 and not tree["mpi4py"], tree
    assert not tree["clashes"], "names that mean another object once a module is imported:\n" + \
        "\n".join(tree["clashes"])


#: Packages whose modules are attributes only once imported (no lazy ``__getattr__`` yet; their files are
#: being changed elsewhere): give each ``__getattr__ = modules_by_name(__name__)`` and drop it here.
_NO_GETATTR_YET: set = set()


def test_every_package_gives_its_modules_after_a_bare_import():
    """``spmdsim.<package>.<module>`` works after a bare ``import spmdsim`` for every package and module, as
    the docs write them (test above for the documented ones)."""
    unreached = _tree()["unreached"]
    assert set(unreached) == _NO_GETATTR_YET, (
        "packages whose modules resolve only once something imports them (give the package "
        "`__getattr__ = modules_by_name(__name__)`, spmdsim/_lazy.py): "
        + "; ".join(f"{p}: {', '.join(names)}" for p, names in sorted(unreached.items()) if p not in _NO_GETATTR_YET))


#: ``ops/matmul.plan_matmul``: a module by its path under spmdsim/ (or a folder of it), then a name it defines.
_PATH_NAME = re.compile(r"`((?:[a-z_]+/)+[a-z_]+)\.([A-Za-z_]\w*)`")
_SUFFIXES = {"py", "md", "sh", "json", "toml", "cfg", "txt"}


def _defines(path: pathlib.Path, name: str) -> bool:
    """Whether the module at `path` binds `name` at its top level (a def, a class, an assignment, an import)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and name in {a.asname or a.name for a in node.names}:
            return True
    return False


def test_every_module_path_and_name_in_the_explanations_exists():
    """architecture.md walked a MatMul through `ops/_common.operands_mesh`, moved to `ops/_operands` since."""
    missing = []
    for page in ("docs/explanation/architecture.md", "docs/howto/add-operator.md"):
        for folder, name in _PATH_NAME.findall((ROOT / page).read_text()):
            if name in _SUFFIXES:  # a file's name: the pages' other tests check those
                continue
            files = [p for p in (ROOT / "spmdsim").rglob(folder.rsplit("/", 1)[-1] + ".py")
                     if str(p.with_suffix("")).endswith(folder)]
            if not any(_defines(f, name) for f in files):
                missing.append(f"{page}: {folder}.{name}")
    assert missing == []
