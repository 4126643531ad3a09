"""The reference pages' tables against the code they describe: docs/reference/operators.md's signatures and its
list of layout rules, exit-codes.md's commands and networks.md's rank counts and dialects.md's Paddle split table."""
from __future__ import annotations

import ast
import inspect
import re

from docs_commands import ROOT
from spmdsim.layouts import dialects
from spmdsim.models import nets
from spmdsim.nn import ops
from spmdsim.programs import infer
from spmdsim.tools.cli.main import SUBCOMMANDS

REFERENCE = ROOT / "docs" / "reference"


def _table(page: str, heading: str) -> list[list[str]]:
    """The cells of each body row of the first table after the line `heading` of docs/reference/`page`."""
    lines = (REFERENCE / page).read_text().splitlines()
    rows = []
    for line in lines[lines.index(heading) + 1:]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows[1:]  # the header row left out


def _keywords(call: str) -> dict[str, object]:
    """{parameter: documented default (or ... where the page writes `name=` alone)} of a `name(...)` call."""
    arguments = call[call.index("(") + 1:call.rindex(")")]
    found = {}
    for item in arguments.split(","):
        name, _, default = item.strip().partition("=")
        if default.strip():
            found[name.strip()] = ast.literal_eval(default.strip())
        elif item.strip().endswith("="):
            found[name.strip()] = ...
    return found


def _check_call(name: str, call: str) -> list[str]:
    """What the documented `call` of ops.`name` says that its signature does not."""
    parameters = inspect.signature(getattr(ops, name)).parameters
    wrong = []
    for key, default in _keywords(call).items():
        if key not in parameters:
            wrong.append(f"{name}: no parameter {key!r}")
        elif default is not ... and parameters[key].default != default:
            wrong.append(f"{name}: {key}={default!r} documented, {parameters[key].default!r} in the code")
    return wrong


def test_the_operator_tables_calls_have_the_codes_parameters_and_defaults():
    """Every `op(..., key=default)` of operators.md's API table names a parameter of spmdsim.nn.ops.op, with
    that default."""
    wrong, seen = [], 0
    for row in _table("operators.md", "## API"):
        for name, call in re.findall(r"`(\w+)(\([^`]*\))`", row[1]):
            if hasattr(ops, name) and callable(getattr(ops, name)) and "=" in call:
                wrong += _check_call(name, name + call)
                seen += 1
    assert seen >= 10, f"operators.md's API table: only {seen} calls with keywords read"
    assert not wrong, wrong


def test_the_layers_constructors_are_their_signatures():
    """operators.md's "The layers' arguments" table writes each layer's constructor exactly as its signature."""
    rows = _table("operators.md", "### The layers' arguments")
    assert len(rows) == 5, rows
    for layer, constructor, _ in rows:
        name = layer.split()[0].strip("`")
        assert constructor.strip("`") == _starred(inspect.signature(getattr(ops, name))), (name, constructor)


def _starred(signature: inspect.Signature) -> str:
    """`signature` as the page writes it: `(a, b, *, c=True, d="x")`, no annotations."""
    parts, star = [], False
    for p in signature.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        default = "" if p.default is inspect.Parameter.empty else "=" + repr(p.default).replace("'", '"')
        parts.append(p.name + default)
    return "(" + ", ".join(parts) + ")"


def test_the_pure_planning_list_is_spmdsim_programs_infers_rules():
    """The `infer_*` names operators.md lists under "Pure planning" are exactly spmdsim.programs.infer's."""
    text = " ".join((REFERENCE / "operators.md").read_text().split())
    paragraph = text[text.index("Pure planning ("):text.index("MatMulPlan.why()")]
    listed = set(re.findall(r"`(infer_\w+)`", paragraph))
    public = {name for name in infer.__all__ if name.startswith("infer_")}
    assert listed == public, f"listed, not in infer.__all__: {sorted(listed - public)}; " \
                             f"in infer.__all__, not listed: {sorted(public - listed)}"


def test_exit_codes_table_names_every_command_once():
    """exit-codes.md's table has one row for each `spmdsim` command, and no command that does not exist."""
    named = [word.strip() for row in _table("exit-codes.md", "# Exit codes") for word in row[0].split(",")]
    missing, unknown = sorted(set(SUBCOMMANDS) - set(named)), sorted(set(named) - set(SUBCOMMANDS))
    assert sorted(named) == sorted(SUBCOMMANDS), f"not in the table: {missing}; not a command: {unknown}"


def test_networks_rank_counts_are_the_ones_each_network_runs_on():
    """networks.md's "ranks" column is what each network's skip reason lets run, from 1 to 32 ranks."""
    rows = {row[3].split("`")[1]: row[2] for row in _table("networks.md", "# Seed networks end to end")}
    runs = {name: [n for n in range(1, 33) if not needs(n)] for name, needs in
            (("net_mindspore_tutorial", nets.needs_eight), ("net_mindspore_layout", nets.needs_eight),
             ("net_paddle_tp", nets.paddle_needs), ("net_oneflow_2d_sbp", nets.oneflow_needs),
             ("net_oneflow_2d_signature", nets.oneflow_needs))}
    assert sorted(rows) == sorted(runs)
    for name, column in rows.items():
        if column.startswith("exactly 8"):
            assert runs[name] == [8], (name, runs[name])
        elif column.startswith("any even count"):
            assert runs[name] == list(range(2, 33, 2)), (name, runs[name])
        else:
            assert column.startswith("any p dividing 960 and 240"), column
            assert runs[name] == [p for p in range(1, 33) if 960 % p == 0 and 240 % p == 0], (name, runs[name])
            examples = re.findall(r"\d+(?:-\d+)?", column.split("(", 1)[1])
            shown = [n for e in examples for n in (range(int(e.split("-")[0]), int(e.split("-")[1]) + 1)
                                                   if "-" in e else [int(e)])]
            assert shown == runs[name][:len(shown)], f"{name}: the examples {shown} skip counts it runs on"


def test_dialects_paddle_split_table_is_split_layouts():
    """dialects.md's `distributed.split` table: each call's kind, weight map, pending sum and collective are
    split_layouts' for it (4 partitions)."""
    rows = _table("dialects.md", "input_ndim=2)` returns a `PaddleSplit` on the mesh `Layout((p,), (\"mp\",))`:")
    assert len(rows) == 3, rows
    for call, kind, weight, _, before, collective, _ in rows:
        operation, axis = re.fullmatch(r"`(\w+)`, axis (\d)", call).groups()
        plan = dialects.split_layouts((8, 16), operation, int(axis), 4)
        written = tuple(() if entry is None else (entry,) for entry in ast.literal_eval(weight.strip("`")))
        assert (kind.strip("`"), written) == (plan.kind, plan.weight.tensor_map), call
        assert ("partial over mp" in before) == (plan.output_before.partial == ("mp",)), call
        assert collective.split()[0] == plan.collective, call
