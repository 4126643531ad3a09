"""A training whose values outgrow their dtype (a huge learning rate or router-loss weight) says where one numpy
process's step first overflowed in one line of the check's, and prints none of numpy's RuntimeWarnings (their
source file paths and code lines); the run ends as it did (the verdict and the exit code)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMALL = ["--d-model", "16", "--seq", "8"]


@pytest.mark.parametrize("example, args, said, code", [
    ("train_gpt", ["--ranks", "8", "--dp", "2", "--tp", "4", "--lr", "1e6", "--precision", "fp32", "--steps", "3",
                   "--sample", "0", "--layers", "1"],
     "overflow: step 1's forward and backward at float32 overflowed in one numpy process", 1),
    ("train_moe_gpt", ["--ranks", "4", "--z-loss-coeff", "1e300", "--steps", "2", "--layers", "2"],
     "overflow: step 0's AdamW update of 'wte' at float64 overflowed in one numpy process", 0),
    ("train_moe_gpt", ["--ranks", "4", "--z-loss-coeff", "1e300", "--steps", "2", "--layers", "2", "--pp", "2"],
     "overflow: step 0's AdamW update of 'wte' at float64 overflowed in one numpy process", 0)])
def test_an_overflow_is_one_line_not_numpys_warnings(example: str, args: list, said: str, code: int) -> None:
    """`train_gpt.py --lr 1e6 --precision fp32` and `train_moe_gpt.py --z-loss-coeff 1e300` printed numpy's
    "RuntimeWarning: overflow encountered in multiply" with spmdsim's source lines above the verdict."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / f"{example}.py"), *args, *SMALL],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stderr
    assert "Warning" not in out.stderr and "encountered" not in out.stderr, out.stderr
    assert out.stdout.count("overflow:") == 1 and said in out.stdout, out.stdout
    assert "check:" in out.stdout and "nan" not in out.stdout
