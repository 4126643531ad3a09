"""A machine file without the peak a precision's products run at (a V100's has fp16 but no bf16, the default
--precision's) is refused before any dry run in one line naming the precision and those the file prices; it
was refused after the dry run, as "gemm dtype 'bf16' has no peak", naming neither the flag nor what to give."""
from __future__ import annotations

import json

import pytest

from spmdsim.tools.cli import estimate_report
from spmdsim.tools.cli.main import main
from spmdsim.tools.estimate import machine as machine_mod

_NO_BF16 = ("--precision bf16-mixed: machine 'v100' has no bf16 peak (peak_flops gives fp16, tf32, fp32, fp64); "
            "give --precision fp16-mixed or fp64, or a machine whose file has one")


def _file(tmp_path, *dtypes: str) -> str:
    data = json.loads((machine_mod._SHIPPED / "a100-dgx.json").read_text())
    data["name"] = "v100"
    for dtype in dtypes:
        del data["peak_flops"][dtype]
    path = tmp_path / "v100.json"
    path.write_text(json.dumps(data))
    return str(path)


def _err(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    return " ".join(captured.err.split())


def test_the_default_precision_without_its_peak_is_refused_before_the_dry_run(tmp_path, capsys, monkeypatch):
    def no_dry_run(*args, **kwargs):
        raise AssertionError("the dry run ran before the refusal")

    monkeypatch.setattr(estimate_report, "gpt_ledger", no_dry_run)
    assert main(["estimate", "gpt", "--machine", _file(tmp_path, "bf16")]) == 2
    assert _err(capsys) == f"spmdsim: error: {_NO_BF16}"


def test_the_search_refuses_it_alike(tmp_path, capsys):
    argv = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=64,heads=4,seq=64,batch=2", "--devices", "2",
            "--machine", _file(tmp_path, "bf16")]
    assert main(argv) == 2
    assert _err(capsys) == f"spmdsim: error: {_NO_BF16}"


@pytest.mark.parametrize("precision", ["fp16-mixed", "fp64"])
def test_a_precision_the_file_prices_runs_on_it(tmp_path, capsys, precision):
    assert main(["estimate", "gpt", "--machine", _file(tmp_path, "bf16"), "--precision", precision]) == 0
    assert "memory: every stage fits the v100's" in capsys.readouterr().out


def test_a_file_with_no_precisions_peak_names_none(tmp_path, capsys):
    assert main(["estimate", "gpt", "--machine", _file(tmp_path, "bf16", "fp16", "fp64"),
                 "--precision", "fp16-mixed"]) == 2
    assert _err(capsys) == ("spmdsim: error: --precision fp16-mixed: machine 'v100' has no fp16 peak (peak_flops "
                            "gives tf32, fp32); give a machine whose file has one")
