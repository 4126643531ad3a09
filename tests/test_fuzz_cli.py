"""Fuzzed CLI: every flag of `slices`, `explain`, `show`, `convert` and `plan` with hostile values.

Each call runs `spmdsim.tools.cli.main.main(argv)` in this process (stdin, stdout and
stderr replaced) and must end with exit 0 and valid output, or exit 2 and one
error line: never a traceback, never a negative count. Values: integers up to
2**80 (and negative ones), random text, random device matrices, maps, SBPs,
placements, partition specs and strategies, often coherent enough to plan.
The profile is derandomized, so CI sees the same examples every run.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmdsim.tools.cli.main import main

settings.register_profile(
    "spmdsim-fuzz", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FUZZ = settings.get_profile("spmdsim-fuzz")
# Per command: 100 by default (500 in all, the same derandomized examples every run); set
# SPMDSIM_FUZZ_EXAMPLES=400 for the long run (2,000 in all).
EXAMPLES = int(os.environ.get("SPMDSIM_FUZZ_EXAMPLES", "100"))
COUNTED: dict[str, int] = {}

# -- values ------------------------------------------------------------------------
HUGE = [2 ** 31, 2 ** 32, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 2 ** 80, 10 ** 11]
ints = st.one_of(st.integers(0, 8), st.integers(-3, 2 ** 80), st.sampled_from(HUGE),
                 st.sampled_from([-1, -(2 ** 63), -(2 ** 80)]))
text = st.text(alphabet=string.printable + "é∑\u0000\u202e", max_size=16)
NAMES = ["a", "b", "c", "x", "dp", "mp", "None", "s0", "t0"]
names = st.one_of(st.sampled_from(NAMES), text)


def _join(items: list, brackets: bool) -> str:
    body = ",".join(str(i) for i in items)
    return f"({body})" if brackets else body


int_list = st.builds(_join, st.lists(ints, max_size=4), st.booleans())
# Shapes: often large multiples of 2 and 3, so splits divide and plans run at huge sizes.
big_dim = st.builds(lambda k, e: k * 2 ** e, st.sampled_from([1, 2, 3, 6, 12]), st.integers(0, 80))
shape_list = st.one_of(int_list, st.builds(_join, st.lists(big_dim, min_size=1, max_size=3), st.booleans()))
name_list = st.builds(_join, st.lists(names, max_size=4), st.booleans())
entry = st.one_of(st.sampled_from(NAMES[:6] + ["None"]),
                  st.builds(lambda xs: "(" + ",".join(xs) + ")", st.lists(st.sampled_from(NAMES[:6]), max_size=3)))
tensor_map = st.one_of(st.builds(_join, st.lists(entry, max_size=4), st.booleans()), text)
sbp = st.one_of(st.builds(",".join, st.lists(st.sampled_from(["B", "P", "S(0)", "S(1)", "S(2)", "S(-1)", "S(x)"]),
                                              min_size=1, max_size=3)), text)
placements = st.one_of(st.builds(",".join, st.lists(st.sampled_from(["R", "P", "S(0)", "S(1)", "Shard(0)",
                                                                     "Replicate()", "Partial()"]),
                                                    min_size=1, max_size=3)), text)
spec = st.one_of(st.builds(lambda xs: "(" + ", ".join(xs) + ")",
                           st.lists(st.sampled_from(["'a'", "'b'", "None", "('a', 'b')", "'zz'"]), max_size=3)), text)
strategy = st.one_of(st.builds(lambda rows: "(" + ",".join(_join(r, True) for r in rows) + ",)",
                               st.lists(st.lists(st.one_of(st.integers(1, 4), ints), min_size=1, max_size=3),
                                        min_size=1, max_size=2)), text)
# Refused before anything is written (a missing directory would be made: never one here).
OUT_PATHS = ["/proc/x.png", "/proc/spmdsim-fuzz/x.png", "/etc/hostname/x.png", "", "/"]

CASE_FLAGS = {
    "--device-matrix": int_list, "--alias": name_list, "--tensor-map": tensor_map, "--shape": shape_list,
    "--partial": name_list, "--strategy": strategy, "--world-size": st.one_of(ints.map(str), text),
    "--operand": st.one_of(st.sampled_from(["x", "w", "out"]), text), "--sbp": sbp, "--placement": int_list,
    "--placements": placements, "--partition-spec": spec,
}
PLAN_FLAGS = {
    "--device-matrix": int_list, "--alias": name_list, "--from": tensor_map, "--to": tensor_map,
    "--from-partial": name_list, "--to-partial": name_list, "--from-sbp": sbp, "--to-sbp": sbp,
    "--from-placements": placements, "--to-placements": placements, "--from-partition-spec": spec,
    "--to-partition-spec": spec, "--from-strategy": strategy, "--to-strategy": strategy,
    "--to-device-matrix": int_list, "--to-alias": name_list, "--shape": shape_list,
    "--dtype": st.one_of(st.sampled_from(["float32", "float64", "int32", "int64"]), text),
}
SWITCHES = {"explain": ["--json", "--no-values"], "plan": ["--json", "--show"], "slices": [], "show": [],
            "convert": ["--json"]}
EXTRA = {"show": {"--width": st.one_of(ints.map(str), text), "--name": text,
                  "--png": st.sampled_from(OUT_PATHS)},
         "plan": {"--png": st.sampled_from(OUT_PATHS)}}


# -- coherent cases: a mesh, layouts over its axes in every dialect, divisible huge shapes ---
@st.composite
def _layout_flags(draw, dims: list, axes: list, ndim: int, prefix: str, command: str) -> list[str]:
    """One layout over the mesh: a tensor map, nD SBP, DTensor placements or a PartitionSpec."""
    form = draw(st.sampled_from(["map", "map", "sbp", "placements", "spec"]))
    if form == "sbp":
        per_axis = [draw(st.sampled_from(["B", "P"] + [f"S({d})" for d in range(ndim)])) for _ in dims]
        flags = ["--sbp" if command != "plan" else f"--{prefix}-sbp", ",".join(per_axis)]
        return flags + (["--placement", ",".join(map(str, dims))] if command != "plan" else [])
    if form == "placements":
        per_axis = [draw(st.sampled_from(["R", "P"] + [f"S({d})" for d in range(ndim)])) for _ in dims]
        return ["--placements" if command != "plan" else f"--{prefix}-placements", ",".join(per_axis)]
    free, out = list(axes), []
    for _ in range(ndim):
        k = draw(st.integers(0, min(2, len(free))))
        take, free[:] = free[:k], free[k:]
        out.append(take)
    partial = [a for a in free if draw(st.booleans())] if draw(st.integers(0, 3)) == 0 else []
    if form == "spec":
        text = "(" + ", ".join("None" if not t else repr(t[0]) if len(t) == 1 else repr(tuple(t))
                               for t in out) + ")"
        flags = ["--partition-spec" if command != "plan" else f"--{prefix}-partition-spec", text]
    else:
        text = ",".join("None" if not t else t[0] if len(t) == 1 else "(" + ",".join(t) + ")" for t in out)
        flags = ["--tensor-map" if command != "plan" else f"--{prefix}", text]
    if partial:
        flags += ["--partial" if command != "plan" else f"--{prefix}-partial", ",".join(partial)]
    return flags


@st.composite
def _coherent(draw, command: str) -> list[str]:
    dims = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3))
    axes = ["a", "b", "c"][:len(dims)]
    ndim = draw(st.integers(1, 3))
    shape = ",".join(str(draw(big_dim) * 12) for _ in range(ndim))
    if command != "plan" and draw(st.integers(0, 4)) == 0:
        cuts = [draw(st.sampled_from([1, 2, 3, 4])) for _ in range(ndim)]
        return [command, "--strategy", "(" + _join(cuts, True) + ",)", "--shape", shape]
    mesh = ["--device-matrix", ",".join(map(str, dims)), "--alias", ",".join(axes), "--shape", shape]
    if command != "plan":
        return [command, *mesh, *draw(_layout_flags(dims, axes, ndim, "", command))]
    return ["plan", *mesh, *draw(_layout_flags(dims, axes, ndim, "from", command)),
            *draw(_layout_flags(dims, axes, ndim, "to", command))]


@st.composite
def argv_for(draw, command: str) -> tuple[list[str], str]:
    """(argv, stdin text) for one call of `command`."""
    flags = dict(PLAN_FLAGS if command == "plan" else CASE_FLAGS, **EXTRA.get(command, {}))
    if draw(st.booleans()):
        argv = draw(_coherent(command))
        chosen = draw(st.lists(st.sampled_from(sorted(flags)), max_size=1, unique=True)) \
            if draw(st.integers(0, 3)) == 0 else []
    else:
        # `plan` requires --device-matrix and --shape: give them, random, most of the time.
        argv = [command] + (["--device-matrix", draw(int_list), "--shape", draw(shape_list)]
                            if command == "plan" and draw(st.integers(0, 5)) else [])
        chosen = draw(st.lists(st.sampled_from(sorted(flags)), max_size=5, unique=True))
    for flag in chosen:
        argv.append(f"{flag}={draw(flags[flag])}")  # "=": a value may start with "-"
    if SWITCHES[command]:
        argv += draw(st.lists(st.sampled_from(SWITCHES[command]), max_size=2, unique=True))
    stdin = ""
    if command != "plan" and draw(st.integers(0, 4)) == 0:
        argv.insert(1, "-")
        case = {"device_matrix": draw(st.lists(ints, max_size=3)), "alias_name": draw(st.lists(names, max_size=3)),
                "tensor_map": draw(st.lists(st.one_of(st.none(), names), max_size=3)),
                "shape": draw(st.lists(st.one_of(ints, big_dim), max_size=3))}
        stdin = draw(st.one_of(st.just(json.dumps(case)), text))
    return argv, stdin


# -- the check ----------------------------------------------------------------------------
_NEGATIVE_BYTES = re.compile(r"(?<![\w.])-\d[\d,]* B\b")


def _call(argv: list[str], stdin: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            _stdin(stdin):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _stdin(text: str):
    import sys

    saved, sys.stdin = sys.stdin, io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = saved


def _non_negative(value) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return value >= 0
    if isinstance(value, dict):
        return all(_non_negative(v) for v in value.values())
    if isinstance(value, list):
        return all(_non_negative(v) for v in value)
    return True


def _check(argv: list[str], stdin: str) -> None:
    code, out, err = _call(argv, stdin)
    where = f"argv={argv!r} stdin={stdin[:80]!r}\nstdout={out[-400:]!r}\nstderr={err[-600:]!r}"
    assert "Traceback" not in out + err, where
    assert code in (0, 2), where
    COUNTED[argv[0]] = COUNTED.get(argv[0], 0) + 1
    if code == 2:
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1 and errors[0].startswith("spmdsim"), where
        assert not out, where
        return
    assert out and not _NEGATIVE_BYTES.search(out), where
    if argv[0] == "slices" or "--json" in argv:
        assert _non_negative(json.loads(out)), where


COMMANDS = ("plan", "slices", "explain", "show", "convert")


@pytest.mark.parametrize("command", COMMANDS)
@settings(FUZZ, max_examples=EXAMPLES)
@given(data=st.data())
def test_fuzz_command(command, data):
    _check(*data.draw(argv_for(command), label="argv, stdin"))


def test_fuzz_ran_every_example():
    """Each command's fuzz test above ran all its examples (pytest runs a module in order)."""
    if len(COUNTED) == len(COMMANDS):  # skipped when a -k selection ran only some of them
        assert min(COUNTED.values()) >= EXAMPLES
