"""Mesh axes have roles: a mesh is told which axis plays which, the models name their axes in one table."""
from __future__ import annotations

import ast
import pathlib

import pytest

import importkit
import spmdsim
from spmdsim import Layout, Mesh
from spmdsim.errors import LayoutError, SpmdsimError
from spmdsim.models.axes import DATA, EXPERT, PIPELINE, ROLES, TENSOR, axis_of, model_layout, roles_of
from spmdsim.runtime.mesh import AXIS_ROLES

PACKAGE = pathlib.Path(spmdsim.__file__).parent
AXIS_NAMES = {"tp", "dp", "pp", "ep"}
#: The modules that may spell an axis name: the models' one table of axis names and roles, and the
#: modules whose names are someone else's (a MindSpore tutorial's network and demo, Paddle's dialect).
ALLOWED = {"models/axes.py", "models/nets/seeds.py", "tools/demo/ops.py", "layouts/dialects/paddle.py",
           # below the models' floor, so it cannot read their table: ZeRO's default data-parallel axes
           "nn/distrib_optim.py"}
#: Folders of data, not code of the package: the lab's exercises are students' programs with their layouts.
ALLOWED_FOLDERS = ("tools/lab/exercises/",)


def _axis_literals(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> list[str]:
    """`path`'s string constants that are an axis name, outside docstrings and __slots__ (attribute names); a
    module of the package from the syntax tree the other tests that read it share (importkit.tree_of)."""
    tree = importkit.tree_of(path) if root == PACKAGE else ast.parse(path.read_text())
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            skipped.add(id(node.body[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            skipped.update(id(n) for n in ast.walk(node.value))
    return [f"{path.relative_to(root)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in AXIS_NAMES and id(node) not in skipped]


def test_no_module_spells_an_axis_name_outside_the_table():
    assert [m for m in sorted(ALLOWED) if not (PACKAGE / m).is_file()] == []  # the list names modules that exist
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if str(path.relative_to(PACKAGE)) not in ALLOWED
             and not str(path.relative_to(PACKAGE)).startswith(ALLOWED_FOLDERS) for hit in _axis_literals(path)]
    assert found == []


def test_the_check_finds_a_spelled_axis(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Doc "tp"."""\nclass A:\n    __slots__ = ("ep",)\nx = mesh.group("tp")\n')
    assert _axis_literals(module, tmp_path) == ["m.py:4: 'tp'"]


def test_the_table_names_each_role_once():
    assert set(ROLES) <= set(AXIS_ROLES)
    assert len(set(ROLES.values())) == len(ROLES)
    assert (DATA, TENSOR, PIPELINE, EXPERT) == ("dp", "tp", "pp", "ep")
    assert model_layout(4, 2) == ((2, 4), ("dp", "tp"))
    assert model_layout(2, 2, 2, 3) == ((3, 2, 2, 2), ("pp", "dp", "ep", "tp"))
    assert roles_of(("dp", "tp")) == {"data": "dp", "tensor": "tp"}


def _roles_seen(roles):
    mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world(), roles=roles)
    try:
        return mesh.roles, mesh.axis("tensor"), mesh.axis("context"), axis_of(mesh, "tensor"), axis_of(mesh, "expert")
    finally:
        mesh.close()


def test_a_mesh_answers_the_axis_of_a_role():
    given = spmdsim.simulate(4, lambda: _roles_seen({"data": "dp", "tensor": "tp"}))
    assert given == [({"data": "dp", "tensor": "tp"}, "tp", None, "tp", None)] * 4
    # a mesh made without roles: none of its own; the models read their table for the axes it has
    assert spmdsim.simulate(4, lambda: _roles_seen(None)) == [({}, None, None, "tp", None)] * 4


def _refusal(roles):
    try:
        Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world(), roles=roles)
    except LayoutError as e:
        return str(e)
    return None


@pytest.mark.parametrize("roles, message", [
    ({"tensr": "tp"}, "axis role 'tensr' is not one of ('data', 'tensor', 'pipeline', 'expert', 'context', "
                      "'shard')"),
    ({"tensor": "mp"}, "the tensor axis 'mp' is not one of the mesh's ('dp', 'tp')"),
    ({"tensor": "tp", "context": "tp"}, "axis 'tp' plays more than one role in {'tensor': 'tp', 'context': 'tp'}; "
                                        "give each axis one role"),
    (["tp"], "roles must be a dict of role -> axis name, got ['tp']; e.g. {'tensor': 'tp'}"),
])
def test_a_mesh_refuses_bad_roles(roles, message):
    assert spmdsim.simulate(4, lambda: _refusal(roles)) == [message] * 4


def _asked(role):
    with Mesh(Layout((4,), ("tp",)), spmdsim.world(), roles={"tensor": "tp"}) as mesh:
        try:
            return mesh.axis(role)
        except LayoutError as e:
            return str(e)


def test_an_unknown_role_is_refused_by_name():
    assert spmdsim.simulate(4, lambda: _asked("sequence")) == [
        "axis role 'sequence' is not one of ('data', 'tensor', 'pipeline', 'expert', 'context', 'shard')"] * 4


def _gpt_on(roles):
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.models.gpt.parallel import GPT

    cfg = GPTConfig(vocab=16, layers=1, d_model=8, heads=2, seq=4, batch=2)
    with Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world(), roles=roles) as mesh:
        try:
            GPT(cfg, mesh)
        except SpmdsimError as e:
            return str(e)
        return "ran"


def test_the_gpt_refuses_a_mesh_whose_roles_differ_from_its_table():
    assert spmdsim.simulate(4, lambda: _gpt_on({"data": "dp", "tensor": "tp"})) == ["ran"] * 4
    assert spmdsim.simulate(4, lambda: _gpt_on({"data": "tp", "tensor": "dp"})) == [
        "the GPT's mesh axes play the roles {'data': 'dp', 'tensor': 'tp'}, but the mesh was given the roles "
        "{'data': 'tp', 'tensor': 'dp'}"] * 4
