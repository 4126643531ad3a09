"""A machine file's figures in another unit (spmdsim.tools.estimate.machine_units): a datasheet's GB/s, TFLOP/s,
GB or microseconds written where the file takes bytes/s, FLOP/s, bytes or seconds is refused naming the unit it
was probably written in, where before it priced a step at hours or years and exited 0."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from spmdsim.errors import SpmdsimError
from spmdsim.tools.cli.main import main
from spmdsim.tools.estimate import machine as machine_mod
from spmdsim.tools.estimate.machine import load_machine, machine_from_dict
from spmdsim.tools.estimate.machine_units import UNIT_RANGES, _short

_F = "machine file 'x.json': "


def _a100() -> dict:
    return json.loads((machine_mod._SHIPPED / "a100-dgx.json").read_text())


def _with(dotted: str, value) -> dict:
    data = copy.deepcopy(_a100())
    *path, last = dotted.split(".")
    node = data
    for key in path:
        node = node[key]
    node[last] = value
    return data


@pytest.mark.parametrize("key, value, line", [
    ("links.node.bandwidth", 300, "key 'links.node.bandwidth' is 300; expected bytes/s per GPU per direction, "
                                  "from 1e6 to 1e14 (if 300 means GB/s, write 300e9)"),
    ("links.cluster.bandwidth", 25000, "key 'links.cluster.bandwidth' is 25000; expected bytes/s per GPU per "
                                       "direction, from 1e6 to 1e14 (if 25000 means MB/s, write 25000e6)"),
    ("peak_flops.bf16", 312, "key 'peak_flops.bf16' is 312; expected FLOP/s, from 1e8 to 1e17 (if 312 means "
                             "TFLOP/s, write 312e12)"),
    ("peak_flops.fp64", 19.5, "key 'peak_flops.fp64' is 19.5; expected FLOP/s, from 1e8 to 1e17 (if 19.5 means "
                              "TFLOP/s, write 19.5e12)"),
    ("peak_flops.bf16", 312e18, "key 'peak_flops.bf16' is 3.12e+20; expected FLOP/s, from 1e8 to 1e17"),
    ("links.node.latency", 2, "key 'links.node.latency' is 2; expected seconds per message, from 0 to 0.1 (if 2 "
                              "means microseconds, write 2e-6)"),
    ("links.cluster.latency", 5000, "key 'links.cluster.latency' is 5000; expected seconds per message, from 0 "
                                    "to 0.1 (if 5000 means nanoseconds, write 5000e-9)"),
    ("memory_bytes", 80, "key 'memory_bytes' is 80; expected bytes per GPU, from 1e5 to 1e15 (if 80 means GB, "
                         "write 80e9)"),
    ("hbm_bandwidth", 2039, "key 'hbm_bandwidth' is 2039; expected bytes/s, from 1e8 to 1e15 (if 2039 means GB/s, "
                            "write 2039e9)"),
    ("reduction_rate", 5, "key 'reduction_rate' is 5; expected bytes/s reduced, from 1e6 to 1e15 (if 5 means "
                          "TB/s, write 5e12)"),
])
def test_a_figure_in_another_unit_is_refused_naming_the_unit_it_was_written_in(key, value, line):
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_with(key, value), "machine file 'x.json'")
    assert str(info.value) == _F + line


@pytest.mark.parametrize("key, value, line", [
    ("memory_bytes", "80GB", "key 'memory_bytes' is '80GB'; expected an integer >= 1 (bytes per GPU), a JSON number "
                             "without quotes (if '80GB' means 80 GB, write 80e9)"),
    ("memory_bytes", "80 GiB", "key 'memory_bytes' is '80 GiB'; expected an integer >= 1 (bytes per GPU), a JSON "
                               "number without quotes (if '80 GiB' means 80 GiB, write 85899345920)"),
    ("links.cluster.bandwidth", "400 Gb/s", "key 'links.cluster.bandwidth' is '400 Gb/s'; expected a number > 0 "
                                            "(bytes/s per GPU per direction), a JSON number without quotes (if "
                                            "'400 Gb/s' means 400 Gbit/s, write 50e9 bytes/s)"),
    ("links.node.latency", "2us", "key 'links.node.latency' is '2us'; expected a number >= 0 (seconds), a JSON "
                                  "number without quotes (if '2us' means 2 us, write 2e-6)"),
    ("peak_flops.bf16", "312 TFLOP/s", "key 'peak_flops.bf16' is '312 TFLOP/s'; expected a number > 0 (FLOP/s), a "
                                       "JSON number without quotes (if '312 TFLOP/s' means 312 TFLOP/s, write "
                                       "312e12)"),
    ("hbm_bandwidth", "2.039e12", "key 'hbm_bandwidth' is '2.039e12'; expected a number > 0 (bytes/s), a JSON "
                                  "number without quotes (write 2.039e12)"),
    ("gpus_per_node", "eight", "key 'gpus_per_node' is 'eight'; expected an integer >= 1, a JSON number without "
                               "quotes"),
])
def test_a_figure_written_as_text_with_its_unit_is_refused_saying_the_number_to_write(key, value, line):
    """"memory_bytes": "80GB" was refused as "expected an integer >= 1 (bytes per GPU)", leaving the user to work
    out that the file wants 80e9 (and for "80 GiB" 85899345920, for a NIC's "400 Gb/s" 50e9)."""
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_with(key, value), "machine file 'x.json'")
    assert str(info.value) == _F + line


@pytest.mark.parametrize("key, value", [
    ("links.node.latency", 0), ("links.node.latency", 0.1), ("links.cluster.bandwidth", 1.25e8),  # gigabit Ethernet
    ("memory_bytes", 128 << 10), ("peak_flops.fp64", 2e9), ("hbm_bandwidth", 8e12), ("peak_flops.bf16", 2.5e15),
])
def test_the_ranges_hold_every_real_device_from_a_laptop_to_a_rack(key, value):
    """The ends and real figures pass: a link of zero latency, gigabit Ethernet (125 MB/s), a toy device of
    128 KiB (the search's own tests), one CPU core's 2 GFLOP/s, an 8 TB/s HBM3e, a 2.5 PFLOP/s bf16 peak."""
    machine_from_dict(_with(key, value), "machine file 'x.json'")


def test_memory_written_with_an_exponent_is_read_as_bytes():
    """JSON's 80e9 is a float; a whole one is the integer it writes (was refused as not an integer)."""
    machine = machine_from_dict(_with("memory_bytes", 80e9), "machine file 'x.json'")
    assert machine.memory_bytes == 80_000_000_000 and isinstance(machine.memory_bytes, int)
    with pytest.raises(SpmdsimError, match="key 'memory_bytes' is 80000000000.5; expected an integer >= 1"):
        machine_from_dict(_with("memory_bytes", 80e9 + 0.5), "machine file 'x.json'")


def test_every_unit_range_holds_its_typical_value_and_the_shipped_machines():
    for what, low, high, typical, _ in UNIT_RANGES.values():
        assert low <= typical <= high, what
    for name in machine_mod.machines():
        load_machine(name)


def _page_command() -> tuple[list[str], str]:
    """docs/howto/add-machine-file.md's `$ spmdsim estimate ...` command (its arguments) and the error it shows."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "add-machine-file.md").read_text()
    (block,) = re.findall(r"^\$ spmdsim (estimate .*?)\n(.*?)^```", page, re.M | re.S)
    return block[0].split(), " ".join(block[1].split())


def test_the_how_to_pages_command_gives_its_error_then_runs_with_the_file_fixed(tmp_path, capsys):
    """`spmdsim estimate --machine` with bandwidth 300 (GB/s meant) priced a step at hours and exited 0; the page's
    command had --heads 2 beside --tp 8, so with the file fixed as the page says it still failed."""
    argv, shown = _page_command()
    path = tmp_path / "gb.json"
    argv = [str(path) if word == "gb.json" else word for word in argv]
    path.write_text(json.dumps(_with("links.node.bandwidth", 300)))
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and " ".join(err.split()) == shown.replace("'gb.json'", repr(str(path)))
    assert err.count("error") == 1
    path.write_text(json.dumps(_with("links.node.bandwidth", 300e9)))
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "" and "memory: every stage fits the a100-dgx's 80.00 GiB per GPU at its peak" in out


def test_the_how_to_pages_copy_command_writes_a_shipped_file_that_loads_back_equal(tmp_path, monkeypatch):
    """The page said "a copy of a100-dgx" without saying where a shipped file is or how to get one: a user who
    installed the package had no file to copy. Its command writes one in the current folder."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "add-machine-file.md").read_text()
    (code,) = re.findall(r'^python -c "(.*save_machine.*)"$', page, re.M)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "add-machine-file.md", "exec"), {})
    assert load_machine(tmp_path / "mine.json") == load_machine("a100-dgx")


def test_the_how_to_pages_range_table_is_the_checks():
    """docs/howto/add-machine-file.md's table of accepted ranges says what UNIT_RANGES refuses."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "add-machine-file.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_.*]+)` \| (\S+ to \S+) ", page, re.M))
    keys = {"memory_bytes": "memory_bytes", "peak_flops.*": "peak_flops", "hbm_bandwidth": "hbm_bandwidth",
            "reduction_rate": "reduction_rate", "links.*.bandwidth": "bandwidth", "links.*.latency": "latency"}
    for row, kind in keys.items():
        _, low, high, _, _ = UNIT_RANGES[kind]
        assert rows[row] == f"{_short(low)} to {_short(high)}", row


def test_a_long_value_is_cut_with_an_ellipsis_not_mid_entry():
    """A third link level copied from "node" was quoted as "{'bandwidth': ..., 'efficiency': {'fraction': 0.775;
    expected ...": cut at 80 characters with no mark, so the line read as a malformed value."""
    data = _with("links.rack", copy.deepcopy(_a100()["links"]["node"]))
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(data, "machine file 'x.json'")
    shown = str(info.value).split(" is ", 1)[1].split("; expected", 1)[0]
    assert shown.endswith("...") and len(shown) == 80 and shown.startswith("{'bandwidth': 300000000000.0")
    assert str(info.value).endswith("; expected a level among ('node', 'cluster')")


@pytest.mark.parametrize("name, key, value, line", [
    ("h100-dgx", "peak_flops.fp8", 3958e12, "key 'peak_flops.fp8' is 3958000000000000.0; expected a dense peak, at "
     "most 2 times peak_flops.bf16 (989e12); 3.958e15 looks like a figure with sparsity, twice the dense one (write "
     "1.979e15)"),
    ("a100-dgx", "peak_flops.tf32", 312e12, "key 'peak_flops.tf32' is 312000000000000.0; expected a dense peak, at "
     "most 0.5 times peak_flops.bf16 (312e12); 312e12 looks like a figure with sparsity, twice the dense one (write "
     "156e12)"),
])
def test_a_peak_with_sparsity_is_refused_naming_the_dense_one(name, key, value, line):
    """An H100's fp8 peak copied "with sparsity" (3,958 TFLOP/s, four times its dense bf16 989) priced FP8 products at
    twice their rate and printed an MFU above 100%; the shipped files' dense ratios (fp8 twice bf16, tf32 half) pass."""
    data = json.loads((machine_mod._SHIPPED / f"{name}.json").read_text())
    data["peak_flops"][key.split(".")[1]] = value
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(data, "machine file 'x.json'")
    assert str(info.value) == _F + line
    page = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "add-machine-file.md").read_text()
    if name == "h100-dgx":  # the how-to page quotes the refusal
        assert f"`{line}`" in " ".join(page.split())
