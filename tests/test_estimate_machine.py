"""Machine files (spmdsim.tools.estimate.machine): the shipped ones, every refusal's line, calibrate's round trip."""
from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
import math
import os
import subprocess
import sys

import pytest
from dataclasses import replace

from spmdsim.tools.cli import calibrate
from spmdsim.tools.cli.main import build_parser
from spmdsim.programs.cost import CostModel
from spmdsim.programs.cost.terms import ALGORITHMS as COST_ALGORITHMS
from spmdsim.base.validate import MAX_JSON_TEXT, read_bounded
from spmdsim.errors import SpmdsimError
from spmdsim.tools.estimate import machine as machine_mod
from spmdsim.tools.estimate import machine_records
from spmdsim.tools.estimate.machine import load_machine, machine_from_dict, machine_to_dict, machines, save_machine
from spmdsim.tools.estimate.machine_records import Link, normalize_dtype
from testkit import MPIEXEC

#: A calibrated machine's measured GEMM rates (FLOP/s).
RATES = {"fp32": 1e11, "fp64": 5e10}


def test_shipped_machines_load_with_their_datasheet_figures():
    assert machines() == ("a100-dgx", "h100-dgx")
    a100, h100 = load_machine("a100-dgx"), load_machine("h100-dgx")
    assert a100.gpus_per_node == h100.gpus_per_node == 8
    assert a100.memory_bytes == h100.memory_bytes == 80 << 30
    assert dict(a100.peak_flops) == {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12,
                                     "fp64": 19.5e12}
    assert dict(h100.peak_flops) == {"bf16": 989e12, "fp16": 989e12, "tf32": 494.5e12, "fp32": 67e12,
                                     "fp64": 67e12, "fp8": 1979e12}  # the datasheet's 3,958 with sparsity, halved
    assert (a100.hbm_bandwidth, h100.hbm_bandwidth) == (2039e9, 3.35e12)
    assert (a100.node.bandwidth, a100.cluster.bandwidth) == (300e9, 25e9)
    assert (h100.node.bandwidth, h100.cluster.bandwidth) == (450e9, 50e9)
    for m in (a100, h100):
        assert m.algorithm == "ring" and m.reduction_rate is None
        assert m.gemm_efficiency.model == "shape"
        assert not any(s.startswith("assumption: gemm") for s in m.sources)
        assert any("datasheet" in s and "https://" in s for s in m.sources)
        assert any(s.startswith("assumption: link latencies") for s in m.sources)
        assert machine_from_dict(machine_to_dict(m)) == m
    assert machine_records.ALGORITHMS == COST_ALGORITHMS


def test_lookup_by_dtype_and_level():
    m = load_machine("h100-dgx")
    assert m.peak("bfloat16") == m.peak("bf16") == 989e12
    assert m.peak("float8_e4m3fn") == m.peak("float8_e5m2") == m.peak("fp8") == 1979e12  # numpy's (ml_dtypes') names
    assert normalize_dtype("float32") == "fp32" and normalize_dtype("BF16") == "bf16"
    assert (m.link("cluster").bandwidth, m.link("cluster").latency) == (50e9, 5e-6)
    # the achieved fractions, each with its cited source: NCCL's bus bandwidth, a measured HBM rate
    assert (m.node.achieved, m.cluster.achieved, m.hbm_achieved) == (450e9 * 0.822, 50e9 * 0.94, 3.35e12 * 0.84)
    a100 = load_machine("a100-dgx")
    assert (a100.node.efficiency.fraction, a100.cluster.efficiency.fraction, a100.hbm_efficiency.fraction) == \
        (0.775, 0.96, 0.88)
    assert "nccl-tests/issues/175" in a100.node.efficiency.source and "232.54 GB/s" in a100.node.efficiency.source
    assert Link(1.0, 0.0).achieved == 1.0  # no efficiency: all of it
    with pytest.raises(SpmdsimError, match=r"^dtype 'int8' has no peak in machine 'h100-dgx'; expected one of "
                                           r"\('bf16', 'fp16', 'tf32', 'fp32', 'fp64', 'fp8'\)$"):
        m.peak("int8")
    with pytest.raises(SpmdsimError, match=r"^level 'rack' is unknown; expected one of \('node', 'cluster'\)$"):
        m.link("rack")


def test_the_shipped_gemm_caps_are_their_sources_figures():
    a100, h100 = load_machine("a100-dgx").gemm_efficiency, load_machine("h100-dgx").gemm_efficiency
    # A100: the fastest BF16 matmul found, 271.2 TFLOPS, at the 1305 MHz it sustains of its 1410 MHz boost.
    assert math.isclose(a100.max_fraction, 271.2 * 1305 / 1410 / 312, abs_tol=5e-5) and a100.dtypes == ()
    assert "271.2 TFLOPS" in a100.source and "1305 MHz" in a100.source and "1410 MHz" in a100.source
    # H100 (an H200's sustained figures, the same compute): BF16 708.5 of 989, FP8 1288.7 of 1979.
    assert math.isclose(h100.max_fraction, 708.5 / 989, abs_tol=5e-4) and "708.5 TFLOPS" in h100.source
    (dtype, fp8), = h100.dtypes
    assert dtype == "fp8" and math.isclose(fp8.fraction, 1288.7 / 1979, abs_tol=5e-4)
    assert "1288.7 TFLOPS" in fp8.source
    assert h100.cap("float8_e4m3fn") == fp8.fraction and h100.cap("bfloat16") == h100.cap("tf32") == 0.716


def test_a_dtype_of_its_own_is_capped_at_its_own_fraction():
    h100 = load_machine("h100-dgx")
    m = replace(h100, gemm_efficiency=replace(h100.gemm_efficiency, waves=None))
    assert m.gemm_efficiency_of("fp8", 1, 8192, 8192, 16384) == 0.651  # the fp8 curve's best contraction
    assert m.gemm_efficiency_of("bf16", 1, 8192, 8192, 8192) == 0.716
    data = machine_to_dict(h100)
    assert data["gemm_efficiency"]["dtypes"]["fp8"]["fraction"] == 0.651 and machine_from_dict(data) == h100
    assert "dtypes" not in machine_to_dict(load_machine("a100-dgx"))["gemm_efficiency"]
    with pytest.raises(SpmdsimError, match=r"^GemmEfficiency: key 'dtypes\.int4' is .*; expected a dtype among "):
        machine_records.GemmEfficiency(0.8, "x", dtypes=(("int4", machine_records.Achieved(0.5, "y")),))
    with pytest.raises(SpmdsimError, match=r"^GemmEfficiency: key 'dtypes\.fp8' is 0\.5; expected an "
                                           r"Achieved\(fraction, source\)$"):
        machine_records.GemmEfficiency(0.8, "x", dtypes=(("fp8", 0.5),))


def test_gemm_efficiency_is_the_capped_roofline():
    shipped = load_machine("a100-dgx")
    m = replace(shipped, gemm_efficiency=replace(shipped.gemm_efficiency, waves=None))
    # Large: capped at max_fraction.
    assert m.gemm_efficiency_of("bf16", 1, 8192, 8192, 8192) == 0.8045
    # A matrix-vector product: 2*m*n*k FLOPs over 2*(m*k + k*n + m*n) bytes, times bandwidth / peak.
    flops, traffic = 2 * 1 * 4096 * 4096, 2 * (4096 + 4096 * 4096 + 4096)
    assert math.isclose(m.gemm_efficiency_of("bf16", 1, 1, 4096, 4096), flops / traffic * 2039e9 / 312e12,
                        rel_tol=1e-12)
    # The batch reads its operands once per product: the same intensity.
    assert m.gemm_efficiency_of("bf16", 7, 1, 4096, 4096) == m.gemm_efficiency_of("bf16", 1, 1, 4096, 4096)


def test_the_waves_take_what_a_partial_last_wave_and_tiles_past_the_edge_leave_idle():
    m = load_machine("a100-dgx")
    waves = m.gemm_efficiency.waves
    assert (waves.sms, waves.tile) == (108, (256, 128)) and "108 SMs" in waves.source
    assert load_machine("h100-dgx").gemm_efficiency.waves.sms == 132
    # 8192 x 8192 in 256 x 128 tiles: 32 x 64 = 2,048 tiles, 19 waves of 108 (2,052 slots): 2,048 / 2,052 of the cap.
    assert math.isclose(m.gemm_efficiency_of("bf16", 1, 8192, 8192, 8192), 0.8045 * 2048 / 2052, rel_tol=1e-12)
    # 108 whole tiles fill one wave exactly.
    assert waves.fraction(1, 256 * 12, 128 * 9) == 1.0
    # One row past the tiles: 2 x 54 tiles, one wave, the second row of tiles computing 1 row of its 256.
    assert math.isclose(waves.fraction(1, 257, 128 * 54), 257 / 512, rel_tol=1e-12)
    # A batch's tiles share the waves: 4 heads of 2048 x 2048 (512 tiles) in 5 waves (540 slots).
    assert math.isclose(waves.fraction(4, 2048, 2048), 512 / 540, rel_tol=1e-12)
    # A head dimension of 96 fills 96 of a tile's 128 columns: 16 x 2048 rows, 128 tiles in 2 waves.
    assert math.isclose(waves.fraction(16, 2048, 96), 16 * 2048 * 96 / (216 * 256 * 128), rel_tol=1e-12)
    data = machine_to_dict(m)
    assert data["gemm_efficiency"]["waves"]["tile"] == [256, 128] and machine_from_dict(data) == m
    bad = dict(data, gemm_efficiency=dict(data["gemm_efficiency"], waves={"sms": 0, "tile": [256, 128], "source": "x"}))
    with pytest.raises(SpmdsimError, match=r"key 'gemm_efficiency\.waves\.sms' is 0; expected an integer >= 1"):
        machine_from_dict(bad)


def _a100() -> dict:
    return json.loads((machine_mod._SHIPPED / "a100-dgx.json").read_text())


def _h100() -> dict:
    return json.loads((machine_mod._SHIPPED / "h100-dgx.json").read_text())


def _edit(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    *path, last = dotted.split(".")
    node = data
    for key in path:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()
_F = "machine file 'x.json': "


@pytest.mark.parametrize("key, value, line", [
    ("format", "v2", "key 'format' is 'v2'; expected 'spmdsim machine 1'"),
    ("name", "", "key 'name' is ''; expected a non-empty string"),
    ("hbm_bandwidth", _DELETE, "key 'hbm_bandwidth' is missing; expected a number > 0 (bytes/s)"),
    ("hbm_bandwidth", -1, "key 'hbm_bandwidth' is -1; expected a number > 0 (bytes/s)"),
    ("hbm_bandwidth", "2TB/s", "key 'hbm_bandwidth' is '2TB/s'; expected a number > 0 (bytes/s), a JSON number "
                               "without quotes (if '2TB/s' means 2 TB/s, write 2e12)"),
    ("gpus_per_node", 0, "key 'gpus_per_node' is 0; expected an integer >= 1"),
    ("gpus_per_node", 8.0, "key 'gpus_per_node' is 8.0; expected an integer >= 1"),
    ("memory_bytes", True, "key 'memory_bytes' is True; expected an integer >= 1 (bytes per GPU)"),
    ("sources", [], "key 'sources' is []; expected a non-empty list of citation strings"),
    ("peak_flops.int8", 1e16, "key 'peak_flops.int8' is 1e+16; expected a dtype among "
                              "('fp64', 'fp32', 'tf32', 'bf16', 'fp16', 'fp8')"),
    ("peak_flops.bf16", 0, "key 'peak_flops.bf16' is 0; expected a number > 0 (FLOP/s)"),
    ("links.node.bandwidth", -300e9, "key 'links.node.bandwidth' is -300000000000.0; expected a number > 0 "
                                     "(bytes/s per GPU per direction)"),
    ("links.cluster.latency", -1e-6, "key 'links.cluster.latency' is -1e-06; expected a number >= 0 (seconds)"),
    ("links.cluster", _DELETE, "key 'links.cluster' is missing; expected an object with 'bandwidth' and "
                               "'latency'"),
    ("links.rack", {"bandwidth": 1, "latency": 0}, "key 'links.rack' is {'bandwidth': 1, 'latency': 0}; "
                                                   "expected a level among ('node', 'cluster')"),
    ("links.node.speed", 1, "key 'links.node.speed' is 1; expected no such key; a machine file's links.node has "
                            "('bandwidth', 'latency', 'efficiency')"),
    ("links.node.bandwith", 1, "key 'links.node.bandwith' is 1; expected no such key (did you mean 'bandwidth'?); "
                               "a machine file's links.node has ('bandwidth', 'latency', 'efficiency')"),
    ("gemm_efficiency.waves.sm", 1, "key 'gemm_efficiency.waves.sm' is 1; expected no such key (did you mean "
                                    "'sms'?); a machine file's gemm_efficiency.waves has ('sms', 'tile', 'source')"),
    ("links.node.efficiency", 0.9, "key 'links.node.efficiency' is 0.9; expected an object with 'fraction' and "
                                   "'source'"),
    ("links.node.efficiency.fraction", 1.2, "key 'links.node.efficiency.fraction' is 1.2; expected a number in "
                                            "(0, 1] (fraction achieved)"),
    ("hbm_efficiency.source", _DELETE, "key 'hbm_efficiency.source' is missing; expected a citation string, or "
                                       "'assumption: ...'"),
    ("hbm_efficiency.rate", 1, "key 'hbm_efficiency.rate' is 1; expected no such key; a machine file's "
                               "hbm_efficiency has ('fraction', 'source')"),
    ("algorithm", "butterfly", "key 'algorithm' is 'butterfly'; expected one of ('ring', 'tree')"),
    ("reduction_rate", 0, "key 'reduction_rate' is 0; expected a number > 0 (bytes/s reduced) or null"),
    ("gemm_efficiency.max_fraction", 1.5, "key 'gemm_efficiency.max_fraction' is 1.5; expected a number in "
                                          "(0, 1] (fraction of peak)"),
    ("gemm_efficiency.model", "tiles", "key 'gemm_efficiency.model' is 'tiles'; expected one of ('roofline', 'shape')"),
    ("gemm_efficiency.source", _DELETE, "key 'gemm_efficiency.source' is missing; expected present "
                                        "(see docs/howto/add-machine-file.md)"),
    ("gemm_efficiency.dtypes", [0.7], "key 'gemm_efficiency.dtypes' is [0.7]; expected an object of "
                                      "{'fraction', 'source'} per dtype"),
    ("gemm_efficiency.dtypes", {"int8": {"fraction": 0.7, "source": "x"}},
     "key 'gemm_efficiency.dtypes.int8' is {'fraction': 0.7, 'source': 'x'}; expected a dtype among "
     "('fp64', 'fp32', 'tf32', 'bf16', 'fp16', 'fp8')"),
    ("gemm_efficiency.dtypes", {"bf16": 0.7}, "key 'gemm_efficiency.dtypes.bf16' is 0.7; expected an object "
                                              "with 'fraction' and 'source'"),
    ("gemm_efficiency.dtypes", {"bf16": {"fraction": 0, "source": "x"}},
     "key 'gemm_efficiency.dtypes.bf16.fraction' is 0; expected a number in (0, 1] (fraction achieved)"),
    ("gemm_efficiency.dtypes", {"bf16": {"fraction": 0.7}},
     "key 'gemm_efficiency.dtypes.bf16.source' is missing; expected a citation string, or 'assumption: ...'"),
])
def test_every_bad_value_is_one_line_naming_file_key_value_and_expectation(key, value, line):
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_edit(_a100(), key, value), "machine file 'x.json'")
    assert str(info.value) == _F + line


def test_an_unknown_top_level_key_is_refused():
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(dict(_a100(), hbm_bandwith=1), "machine file 'x.json'")
    assert str(info.value).startswith(_F + "key 'hbm_bandwith' is 1; expected no such key (did you mean "
                                      "'hbm_bandwidth'?); a machine file has ('format', ")


def test_files_that_cannot_be_read(tmp_path):
    with pytest.raises(SpmdsimError, match=r"^machine 'b200' is neither a shipped machine nor a file; expected "
                                           r"one of \('a100-dgx', 'h100-dgx'\) or a path to a machine file$"):
        load_machine("b200")
    with pytest.raises(SpmdsimError, match=r"^machine name is empty; expected one of \('a100-dgx', 'h100-dgx'\) or "
                                           r"a path to a machine file$"):
        load_machine("")  # `--machine ''` was read as the directory '.'
    missing = tmp_path / "none.json"
    with pytest.raises(SpmdsimError, match=rf"^machine file '{missing}': cannot be read \(No such file or "
                                           r"directory\); expected a machine file$"):
        load_machine(missing)
    big = tmp_path / "big.json"
    big.write_text(" " * MAX_JSON_TEXT + "{}")  # read up to the bound, as /dev/zero (which never ends)
    with pytest.raises(SpmdsimError, match=rf"^machine file '{big}': is longer than 4,000,000 characters; "
                                           r"expected a JSON machine file$"):
        load_machine(big)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SpmdsimError, match=rf"^machine file '{bad}': is not JSON \(Expecting property name "
                                           r"enclosed in double quotes at line 1 column 2\); expected a JSON "
                                           r"machine file$"):
        load_machine(bad)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # past the parser's recursion limit
    with pytest.raises(SpmdsimError, match=rf"^machine file '{deep}': nests too deeply; expected a JSON machine "
                                           r"file$"):
        load_machine(deep)
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(SpmdsimError, match=rf"^machine file '{listed}': is a JSON list; expected an object"):
        load_machine(listed)


def test_a_key_given_twice_is_refused_not_read_as_its_last_value(tmp_path):
    """A copied file edited by adding a line beside the old one (`"gpus_per_node": 8, "gpus_per_node": 4`) was
    read as its last value, silently: the estimate priced 4 GPUs a node where the user may have meant 8."""
    text = json.dumps(_a100(), indent=1)
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"gpus_per_node": 8', '"gpus_per_node": 8, "gpus_per_node": 4'))
    with pytest.raises(SpmdsimError) as info:
        load_machine(twice)
    assert str(info.value) == (f"machine file {str(twice)!r}: key 'gpus_per_node' is given twice in one object (8, "
                               "then 4); expected each key once (JSON would keep the last silently)")
    nested = tmp_path / "nested.json"
    nested.write_text(text.replace('"latency": 2e-06', '"latency": 2e-06, "latency": 5e-06', 1))
    with pytest.raises(SpmdsimError, match=r"key 'latency' is given twice in one object \(2e-06, then 5e-06\)"):
        load_machine(nested)


def test_a_cost_model_given_as_the_machine_file_says_which_file_to_give(tmp_path):
    """`spmdsim calibrate --output cost.json --machine-out machine.json`, then `--machine cost.json`: "key 'version'
    is 1; expected no such key; a machine file has (...)", which named neither file."""
    cost = CostModel(20e-6, 2.0 ** -32).save(tmp_path / "cost.json")
    with pytest.raises(SpmdsimError) as info:
        load_machine(cost)
    assert str(info.value) == (
        f"machine file {str(cost)!r}: is a cost model (spmdsim calibrate --output's alpha_s, beta_s_per_byte), not a "
        "machine file; expected the file spmdsim calibrate --machine-out PATH writes")


def test_a_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    """Windows Notepad saves UTF-8 with a BOM: such a file was refused "is not JSON (Unexpected UTF-8 BOM ...)".
    Every file spmdsim reads through read_bounded (cost models, cases, schedules) drops it, a stream's too."""
    path = tmp_path / "notepad.json"
    path.write_text(json.dumps(_a100()), encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    assert load_machine(path) == machine_from_dict(_a100(), "machine file")
    stream = io.StringIO("\ufeff{}")
    assert read_bounded(stream, 10, "stdin", "a JSON case") == "{}"


def test_a_file_path_round_trips(tmp_path):
    m = load_machine("h100-dgx")
    path = save_machine(m, tmp_path / "mine.json")
    assert load_machine(path) == load_machine(str(path)) == m


def test_calibrated_machine_round_trips_through_load_machine(tmp_path):
    model = CostModel(alpha_s=20e-6, beta_s_per_byte=2.0 ** -32, gamma_s_per_byte=2.0 ** -31, algorithm="tree",
                      source="fit")
    m = calibrate.calibrated_machine(model, RATES, 2e10, 4, 64 << 30, "box")
    assert m.name == "calibrated-box" and m.gpus_per_node == 4 and m.memory_bytes == 64 << 30
    assert m.node == m.cluster == Link(bandwidth=2.0 ** 32, latency=20e-6)
    # fp64 and fp32 measured; bf16 and fp16 (which numpy cannot multiply in) fp32's, as the sources say
    assert dict(m.peak_flops) == {"fp64": 5e10, "fp32": 1e11, "bf16": 1e11, "fp16": 1e11} and m.hbm_bandwidth == 2e10
    assert any(line.startswith("peak_flops.bf16 and fp16: fp32's, not measured") for line in m.sources)
    assert calibrate.peaks_line(m) == ("peak FLOP/s: fp64 5e+10, fp32 1e+11 measured; bf16 1e+11 (=fp32's), fp16 "
                                       "1e+11 (=fp32's), not measured: numpy has no bf16 and no BLAS fp16 product, "
                                       "spmdsim multiplies both in float32")
    assert m.algorithm == "tree" and m.reduction_rate == 2.0 ** 31 and m.gemm_efficiency.max_fraction == 1.0
    path = save_machine(m, tmp_path / "box.json")
    assert load_machine(path) == m
    free = calibrate.calibrated_machine(CostModel(1e-6, 1e-9), RATES, 2e10, 1, 1 << 30, "box")
    assert free.reduction_rate is None and "reduction_rate" not in json.loads(save_machine(free, path).read_text())
    with pytest.raises(SpmdsimError, match=r"^the fit's beta 0.0 s/byte gives no bandwidth for --machine-out"):
        calibrate.calibrated_machine(CostModel(1e-6, 0.0), RATES, 2e10, 1, 1 << 30, "box")


def test_a_calibrated_machine_outside_any_devices_range_is_not_written():
    """A fit whose beta is next to nothing (a noisy run) gave a bandwidth no link has; the file it wrote was then
    refused by load_machine (spmdsim.tools.estimate.machine_units): calibrate says so instead of writing it."""
    good = calibrate.calibrated_machine(CostModel(20e-6, 2.0 ** -32), RATES, 2e10, 4, 64 << 30, "box")
    assert calibrate.implausible(good) is None
    off = calibrate.calibrated_machine(CostModel(20e-6, 1e-16), RATES, 2e10, 4, 64 << 30, "box")
    assert calibrate.implausible(off) == (
        "--machine-out: key 'links.node.bandwidth' is 1e+16; expected bytes/s per GPU per direction, from 1e6 to "
        "1e14: the measurement is off; measure again (larger --sizes, a quieter machine)")


@pytest.mark.parametrize("precision", ["fp64", "bf16-mixed", "fp16-mixed"])
def test_a_calibrated_machine_file_prices_every_precision_in_estimate_and_the_search(tmp_path, precision, capsys):
    """`spmdsim calibrate --machine-out`'s file is what --machine takes (docs/howto/estimate.md): it gave only fp32, and
    every precision's GEMMs (fp64, bf16, fp16) were refused, in `estimate` and in `autoshard --machine` alike."""
    from spmdsim.tools.cli.main import main

    model = CostModel(alpha_s=20e-6, beta_s_per_byte=2.0 ** -32, source="fit")
    path = save_machine(calibrate.calibrated_machine(model, RATES, 2e10, 2, 64 << 30, "box"), tmp_path / "m.json")
    assert main(["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "256", "--vocab",
                 "128", "--global-batch", "4", "--precision", precision, "--machine", str(path), "--json"]) == 0
    seconds = json.loads(capsys.readouterr().out)["step_time_s"]
    # (recomputation held: the search prices its layer cells and its dry run at `precision` all the same, a third
    # of the cells)
    assert main(["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=2,seq=64,batch=4",
                 "--devices", "2", "--machine", str(path), "--precision", precision, "--max-dry-runs", "1",
                 "--fix", "recompute=none"]) == 0
    assert "devices on calibrated-box" in capsys.readouterr().out and seconds > 0


def test_a_calibrated_cpus_mfu_line_gives_its_rate_in_digits_that_show(tmp_path, capsys):
    """On a CPU's calibrated file (peaks of 1e11 FLOP/s) the rate printed with one decimal read "MFU 32.5%: 0.0
    TFLOP/s per GPU of the bf16 peak 0.1029": a rate of nothing at a third of the peak."""
    from spmdsim.tools.cli.main import main

    model = CostModel(alpha_s=20e-6, beta_s_per_byte=2.0 ** -32, source="fit")
    path = save_machine(calibrate.calibrated_machine(model, RATES, 2e10, 2, 64 << 30, "box"), tmp_path / "m.json")
    argv = ["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--tp", "2", "--machine", str(path)]
    assert main([*argv, "--json"]) == 0
    use = json.loads(capsys.readouterr().out)["utilization"]
    assert 0 < use["tflops_per_gpu"] < 0.1
    assert main(argv) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("MFU "))
    assert line.startswith(f"MFU {use['mfu']:.1%}: {use['tflops_per_gpu']:.4g} TFLOP/s per GPU of the bf16 peak 0.1,")


def test_machine_out_is_checked_before_measuring(tmp_path):
    args = build_parser().parse_args(["calibrate", "--dry-run", "--machine-out", "m.json"])
    with pytest.raises(SpmdsimError, match=r"^--machine-out 'm.json' has no effect with --dry-run"):
        calibrate._check_counts(args)
    blocked = tmp_path / "file"
    blocked.write_text("")
    args = build_parser().parse_args(["calibrate", "--output", str(tmp_path / "c.json"),
                                      "--machine-out", str(blocked / "m.json")])
    assert calibrate._output_problem(args).startswith(f"--machine-out '{blocked}/m.json' cannot be written")


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_calibrate_writes_a_machine_file_load_machine_reads(tmp_path):
    out = tmp_path / "machine.json"
    # 16 MiB against 64 KiB, the median of 3 after a warm-up: under load (~8) one cold 4 MiB call against one
    # 64 KiB call timed no slower per byte now and then, and the fit then has no bandwidth term (below).
    cmd = ["timeout", "-k", "5", "90", MPIEXEC, "-n", "2", sys.executable, "-m", "spmdsim", "calibrate",
           "--sizes", "64K,16M", "--ops", "allreduce,allgather", "--repeats", "3", "--warmup", "1",
           "--output", str(tmp_path / "cost.json"), "--machine-out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0 and ("gives no bandwidth for --machine-out" in done.stderr
                                 or "(infinite bandwidth)" in " ".join(done.stderr.split())):
        # A loaded machine can time the 16 MiB calls no slower per byte than the 64 KiB ones: then the fit (or
        # one collective's) has no bandwidth term and calibrate refuses to save it in one line, as it must (seen
        # under load ~8, and with the pure tests' workers beside it on 2 cores).
        # (Open MPI's launcher adds its own lines about the exit: a banner, and a PMIx error line now and then)
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower() and "PMIX" not in line]
        assert len(errors) == 1 and "Traceback" not in done.stderr and "Abort" not in done.stderr, done.stderr
        pytest.skip("the fit on this loaded machine had no bandwidth term; --machine-out refused it")
    assert done.returncode == 0, done.stderr
    assert f"machine file saved to {out}" in done.stdout
    m = load_machine(out)
    model = CostModel.load(tmp_path / "cost.json")
    assert m.gpus_per_node == 2 and m.node == m.cluster
    assert m.node == Link(1 / model.beta_s_per_byte, model.alpha_s) and m.algorithm == model.algorithm
    assert m.dtypes == ("fp64", "fp32", "bf16", "fp16") and m.peak("fp32") == m.peak("bf16") > 0 < m.peak("fp64")
    assert m.hbm_bandwidth > 0 and "peak FLOP/s: fp64 " in done.stdout
    from spmdsim.tools.cli.main import main  # the file is what --machine takes, at the default precision (bf16-mixed)

    assert main(["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "256", "--vocab",
                 "128", "--global-batch", "4", "--machine", str(out)]) == 0


@pytest.mark.parametrize("name", ["a100-dgx", "h100-dgx"])
def test_every_constant_of_a_shipped_machine_carries_its_source(name):
    """Each figure a shipped machine file gives is named in its `sources` (a citation, or "assumption: ..."), and
    each achieved fraction and the GEMM model carry a source of their own: no constant without one."""
    import spmdsim.tools.estimate as estimate_pkg

    data = json.loads((Path(estimate_pkg.__file__).parent / "machines" / f"{name}.json").read_text())
    cited = " ".join(data["sources"])
    named = ["gpus_per_node", "memory_bytes", "hbm_bandwidth", "gemm_efficiency.max_fraction"]
    named += [f"links.{level}.{key}" for level in ("node", "cluster") for key in ("bandwidth", "latency")]
    assert [key for key in named if key not in cited] == []
    peaks = re.search(r"peak_flops([^;]*)", cited)
    assert peaks and [d for d in data["peak_flops"] if d not in cited] == []
    own = [data["gemm_efficiency"], data["gemm_efficiency"]["waves"], data["hbm_efficiency"],
           data["links"]["node"]["efficiency"], data["links"]["cluster"]["efficiency"]]
    own += [data["gemm_efficiency"]["batched"]] if "batched" in data["gemm_efficiency"] else []
    assert all(isinstance(o.get("source"), str) and "http" in o["source"] for o in own)
