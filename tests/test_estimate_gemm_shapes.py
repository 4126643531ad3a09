"""The GEMM efficiency model "shape" (spmdsim.tools.estimate.gemm_shapes): batched products capped by what products
of their smallest dimension were measured to achieve, as the a100-dgx file gives it, single FP8 products scaled by
the measured curve of their contraction length, as the h100-dgx file gives it, and every bad value refused in one
line."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from spmdsim.errors import SpmdsimError
from spmdsim.tools.estimate.gemm_shapes import BatchedShapes, UnbatchedShapes, interpolate
from spmdsim.tools.estimate.machine import load_machine, machine_from_dict, machine_to_dict
from spmdsim.tools.estimate.machine_records import GemmEfficiency
from test_estimate_machine import _DELETE, _a100, _edit  # the shipped A100 file, edited one key at a time
from test_estimate_machine import _h100  # the shipped H100 file

#: Anthony et al. 2024, Fig. 7 (A100), read off the plot: TFLOP/s by head dimension, (a) the scores, (b) the context.
SCORES = {32: 40, 64: 59, 96: 92, 128: 105, 160: 104, 192: 136, 256: 151, 384: 190, 512: 202, 1024: 215}
CONTEXT = {32: 43, 64: 80, 96: 111, 128: 138, 160: 149, 192: 166, 256: 217, 384: 187, 512: 228, 1024: 224}


def test_the_a100_table_is_its_figures_read_off_the_plot_over_the_fp16_peak():
    eff = load_machine("a100-dgx").gemm_efficiency
    table = eff.batched
    assert eff.model == "shape" and table.dtypes == ("fp16", "bf16")
    assert [d for d, _ in table.contraction] == list(SCORES) and [d for d, _ in table.output] == list(CONTEXT)
    for (d, f), (_, g) in zip(table.contraction, table.output):
        assert math.isclose(f, SCORES[d] / 312, abs_tol=5e-4) and math.isclose(g, CONTEXT[d] / 312, abs_tol=5e-4)
    assert "arXiv:2401.14489" in table.source and "Fig. 7" in table.source and "read off" in table.source
    assert "215" in table.source and "224" in table.source  # the values read, as given
    # H100 has no such measurement cited: its batched products keep the roofline
    assert load_machine("h100-dgx").gemm_efficiency.batched is None


#: DeepGEMM's README (its last table), FP8 on an H800 SXM5, M = 4,096: TFLOP/s by contraction K (the larger N's row).
FP8_BY_K = {512: 775, 1536: 1212, 2048: 1168, 7168: 1410, 16384: 1520}


def test_the_h100_fp8_curve_is_deepgemms_figures_over_the_fp8_peak():
    eff = load_machine("h100-dgx").gemm_efficiency
    curve = eff.unbatched
    assert eff.model == "shape" and curve.dtypes == ("fp8",)
    assert [k for k, _ in curve.contraction] == list(FP8_BY_K)
    for k, f in curve.contraction:
        assert math.isclose(f, FP8_BY_K[k] / 1979, abs_tol=5e-4)
    assert "deepseek-ai/DeepGEMM" in curve.source and "a9967bc" in curve.source
    assert all(f"{v:,}" in curve.source for v in FP8_BY_K.values())


def test_a_single_fp8_product_reaches_the_cap_times_its_contractions_share_of_the_best():
    m = load_machine("h100-dgx")
    cap = m.gemm_efficiency.cap("fp8")
    best = FP8_BY_K[16384]
    # 8192 x 8192 outputs fill the waves (32 x 64 tiles of 256 x 128, 2048 = 15.5 waves of 132: not quite):
    waves = m.gemm_efficiency.waves.fraction(1, 8192, 8192)
    # Llama 2 7B's QKV product, K = 4,096: 2/5 of the way from 2,048 to 7,168.
    share = (1168 + (1410 - 1168) * 2048 / 5120) / best
    assert m.gemm_efficiency_of("fp8", 1, 8192, 8192, 4096) == pytest.approx(cap * waves * share, rel=1e-3)
    # At and beyond the best point: the cap itself (the curve flat beyond its ends).
    assert m.gemm_efficiency_of("fp8", 1, 8192, 8192, 16384) == pytest.approx(cap * waves)
    assert m.gemm_efficiency_of("fp8", 1, 8192, 8192, 65536) == pytest.approx(cap * waves)
    # Below the first point: the first's share (the roofline above it: 8192 x 256 operands are few bytes).
    assert m.gemm_efficiency_of("fp8", 1, 8192, 8192, 256) == pytest.approx(cap * waves * 0.392 / 0.768)
    # Not priced by it: bf16 products (not measured) and batched ones.
    flat = replace(m, gemm_efficiency=replace(m.gemm_efficiency, model="roofline", unbatched=None))
    assert m.gemm_efficiency_of("bf16", 1, 8192, 8192, 4096) == flat.gemm_efficiency_of("bf16", 1, 8192, 8192, 4096)
    assert m.gemm_efficiency_of("fp8", 4, 8192, 8192, 4096) == flat.gemm_efficiency_of("fp8", 4, 8192, 8192, 4096)
    assert m.gemm_efficiency_of("fp8", 1, 8192, 8192, 4096) < flat.gemm_efficiency_of("fp8", 1, 8192, 8192, 4096)
    assert UnbatchedShapes(("fp8",), ((64, 0.2), (128, 0.4)), "y").factor("fp8", 1, 96) == pytest.approx(0.75)


def test_a_batched_product_is_capped_by_its_smallest_dimension_and_which_one_it_is():
    m = load_machine("a100-dgx")
    # The 1.7B model's scores: 16 x 24 heads of (2048 x 96) @ (96 x 2048): the contraction is the head dimension.
    assert m.gemm_efficiency_of("fp16", 384, 2048, 2048, 96) == pytest.approx(92 / 312, abs=5e-4)
    # Its context, (2048 x 2048) @ (2048 x 96): the result's columns are.
    assert m.gemm_efficiency_of("fp16", 384, 2048, 96, 2048) == pytest.approx(111 / 312, abs=5e-4)
    # Between two points, linear: 112 is halfway from 96 to 128.
    assert m.gemm_efficiency_of("bf16", 64, 2048, 2048, 112) == pytest.approx((92 + 105) / 2 / 312, abs=5e-4)
    # Beyond the last point the measured curve is flat: the last point's fraction.
    assert m.gemm_efficiency_of("bf16", 16, 4096, 4096, 2048) == pytest.approx(215 / 312, abs=5e-4)
    # Not priced by the table: one GEMM of all the rows (a linear layer), and a dtype the table was not measured in.
    roofline = replace(m, gemm_efficiency=replace(m.gemm_efficiency, model="roofline", batched=None))
    assert m.gemm_efficiency_of("fp16", 1, 32768, 2304, 96) == roofline.gemm_efficiency_of("fp16", 1, 32768, 2304, 96)
    assert m.gemm_efficiency_of("fp32", 384, 2048, 2048, 96) == roofline.gemm_efficiency_of("fp32", 384, 2048, 2048,
                                                                                              96)
    # The roofline still binds where it is lower: a batch of matrix-vector products.
    assert m.gemm_efficiency_of("fp16", 8, 1, 4096, 4096) == roofline.gemm_efficiency_of("fp16", 8, 1, 4096, 4096)
    assert m.gemm_efficiency_of("fp16", 384, 2048, 2048, 96) < roofline.gemm_efficiency_of("fp16", 384, 2048, 2048, 96)


def test_interpolation_holds_the_ends():
    points = ((64, 0.2), (128, 0.4), (256, 0.5))
    assert [interpolate(points, d) for d in (1, 64, 96, 128, 192, 256, 10**6)] == pytest.approx(
        [0.2, 0.2, 0.3, 0.4, 0.45, 0.5, 0.5])


def test_the_table_round_trips_and_a_roofline_file_still_loads():
    m = load_machine("a100-dgx")
    data = machine_to_dict(m)
    assert data["gemm_efficiency"]["batched"]["contraction"][2] == [96, 0.295] and machine_from_dict(data) == m
    old = _edit(_a100(), "gemm_efficiency.model", "roofline")
    del old["gemm_efficiency"]["batched"]
    assert machine_from_dict(old).gemm_efficiency.batched is None


_B = "gemm_efficiency.batched"


@pytest.mark.parametrize("key, value, line", [
    (_B, _DELETE, f"key '{_B}' is missing; expected present with model 'shape', or 'unbatched' (its measured "
                  "tables, docs/howto/add-machine-file.md)"),
    (_B, [1], f"key '{_B}' is [1]; expected an object with ('dtypes', 'contraction', 'output', 'source')"),
    (f"{_B}.source", _DELETE, f"key '{_B}.source' is missing; expected a citation string (title, URL, which figure)"),
    (f"{_B}.source", " ", f"key '{_B}.source' is ' '; expected a citation string (title, URL, which figure)"),
    (f"{_B}.output", _DELETE, f"key '{_B}.output' is missing; expected present"),
    (f"{_B}.speed", 1, f"key '{_B}.speed' is 1; expected no such key; a machine file's {_B} has ('dtypes', "
                       "'contraction', 'output', 'source')"),
    (f"{_B}.dtypes", ["int4"], f"key '{_B}.dtypes' is ['int4']; expected a non-empty list of dtypes among ('fp64', "
                               "'fp32', 'tf32', 'bf16', 'fp16', 'fp8')"),
    (f"{_B}.contraction", [[64, 0.2], [32, 0.1]], f"key '{_B}.contraction' is [[64, 0.2], [32, 0.1]]; expected a list "
                                                  "of [dimension, fraction] pairs, dimensions integers >= 1 rising, "
                                                  "fractions in (0, 1]"),
    (f"{_B}.output", [[64, 1.5]], f"key '{_B}.output' is [[64, 1.5]]; expected a list of [dimension, fraction] pairs, "
                                  "dimensions integers >= 1 rising, fractions in (0, 1]"),
    (f"{_B}.output", [], f"key '{_B}.output' is []; expected a list of [dimension, fraction] pairs, dimensions "
                         "integers >= 1 rising, fractions in (0, 1]"),
])
def test_every_bad_table_value_is_one_line_naming_the_key(key, value, line):
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_edit(_a100(), key, value), "machine file 'x.json'")
    assert str(info.value) == "machine file 'x.json': " + line


_U = "gemm_efficiency.unbatched"


@pytest.mark.parametrize("key, value, line", [
    (_U, [1], f"key '{_U}' is [1]; expected an object with ('dtypes', 'contraction', 'source')"),
    (f"{_U}.source", _DELETE, f"key '{_U}.source' is missing; expected a citation string (title, URL, which figure)"),
    (f"{_U}.output", [[64, 0.2]], f"key '{_U}.output' is [[64, 0.2]]; expected no such key; a machine file's {_U} "
                                  "has ('dtypes', 'contraction', 'source')"),
    (f"{_U}.dtypes", "fp8", f"key '{_U}.dtypes' is 'fp8'; expected a non-empty list of dtypes among ('fp64', "
                            "'fp32', 'tf32', 'bf16', 'fp16', 'fp8')"),
    (f"{_U}.contraction", [[512, 0]], f"key '{_U}.contraction' is [[512, 0]]; expected a list of [dimension, "
                                      "fraction] pairs, dimensions integers >= 1 rising, fractions in (0, 1]"),
])
def test_every_bad_curve_value_is_one_line_naming_the_key(key, value, line):
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_edit(_h100(), key, value), "machine file 'x.json'")
    assert str(info.value) == "machine file 'x.json': " + line


def test_the_curve_round_trips_and_needs_model_shape():
    m = load_machine("h100-dgx")
    data = machine_to_dict(m)
    assert data["gemm_efficiency"]["unbatched"]["contraction"][0] == [512, 0.392] and machine_from_dict(data) == m
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_edit(_h100(), "gemm_efficiency.model", "roofline"), "machine file 'x.json'")
    assert str(info.value).startswith("machine file 'x.json': key 'gemm_efficiency.unbatched' is {'dtypes': ")
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_edit(_h100(), _U, _DELETE), "machine file 'x.json'")
    assert str(info.value) == ("machine file 'x.json': key 'gemm_efficiency.batched' is missing; expected present "
                               "with model 'shape', or 'unbatched' (its measured tables, "
                               "docs/howto/add-machine-file.md)")


def test_a_table_needs_model_shape_and_model_shape_needs_a_table():
    with pytest.raises(SpmdsimError) as info:
        machine_from_dict(_edit(_a100(), "gemm_efficiency.model", "roofline"), "machine file 'x.json'")
    assert str(info.value).startswith("machine file 'x.json': key 'gemm_efficiency.batched' is {'dtypes': ")
    assert str(info.value).endswith("expected no such key with model 'roofline' (model 'shape' reads it)")
    with pytest.raises(SpmdsimError, match=r"^GemmEfficiency: key 'batched' is None; expected a BatchedShapes or an "
                                           r"UnbatchedShapes with model 'shape'$"):
        GemmEfficiency(0.8, "x", model="shape")
    with pytest.raises(SpmdsimError, match=r"^GemmEfficiency: key 'unbatched' is .*; expected a UnbatchedShapes with "
                                           r"model 'shape', None with model 'roofline'$"):
        GemmEfficiency(0.8, "x", unbatched=UnbatchedShapes(("fp8",), ((64, 0.2),), "y"))
    with pytest.raises(SpmdsimError, match=r"^GemmEfficiency: key 'batched\.dtypes' is 'int4'; expected dtypes among "):
        GemmEfficiency(0.8, "x", model="shape", batched=BatchedShapes(("int4",), ((64, 0.2),), ((64, 0.2),), "y"))
    with pytest.raises(SpmdsimError, match=r"^BatchedShapes: key 'source' is ''; expected a citation string"):
        BatchedShapes(("fp16",), ((64, 0.2),), ((64, 0.2),), "")
