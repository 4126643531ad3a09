"""Pure helpers of `spmdsim calibrate` (no MPI needed)."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from spmdsim.tools.cli import calibrate, collective_timing
from spmdsim.tools.cli.main import build_parser
from spmdsim.errors import SpmdsimError


@pytest.mark.parametrize("text, value", [("100", 100), ("64K", 65536), ("4M", 4 << 20),
                                         ("1.5K", 1536), ("2MiB", 2 << 20), ("1g", 1 << 30)])
def test_parse_size(text, value):
    assert calibrate.parse_size(text) == value


def test_parse_size_errors():
    with pytest.raises(argparse.ArgumentTypeError, match="not a byte count"):
        calibrate.parse_size("lots")


def test_group_sizes():
    assert calibrate._group_sizes(None, 8) == [2, 4, 8]
    assert calibrate._group_sizes(None, 6) == [2, 6]
    assert calibrate._group_sizes("4,2,4", 8) == [2, 4]
    # An SpmdsimError: raised inside calibrate's guard, it is one line on rank 0.
    with pytest.raises(SpmdsimError, match="group size 3"):
        calibrate._group_sizes("3", 8)


def test_too_few_measurements_for_the_fit_are_refused_before_timing():
    # `--ops allreduce --sizes 1K` on 2 ranks timed its one point, then failed in the fit: "fit needs at least 2
    # measurements, got 1". Now refused before any timing, naming the flags; a size given twice is one point.
    args = build_parser().parse_args(["calibrate", "--ops", "allreduce", "--sizes", "1K,1K"])
    with pytest.raises(SpmdsimError, match=r"needs at least 2: --ops 'allreduce', group sizes \[2\] and "
                                           r"--sizes '1K,1K' give 1; expected more --sizes"):
        calibrate._check_points(args, ["allreduce"], [2], [1024, 1024])
    calibrate._check_points(args, ["allreduce"], [2, 4], [1024])  # two group sizes: two points


def test_a_run_of_more_collectives_than_the_bound_is_refused_before_timing():
    # `--repeats 100000000` timed for hours (and kept a float per repeat): refused, naming the bound and the count.
    # 2 ops x 2 group sizes x 2 sizes = 8 cases, and 3 copy timings per size: 14 cases.
    args = build_parser().parse_args(["calibrate", "--warmup", "0", "--repeats", "7143"])
    with pytest.raises(SpmdsimError, match=r"^--warmup 0 and --repeats 7143 time 100,002 collectives \(7,143 runs of "
                                           r"14 cases: --ops x group sizes \[2, 4\] x --sizes, and 6 of the copy\); "
                                           r"expected at most 100,000 "):
        calibrate._check_work(args, ["allreduce", "bcast"], [2, 4], [1024, 2048])
    args.repeats = 7142
    calibrate._check_work(args, ["allreduce", "bcast"], [2, 4], [1024, 2048])  # 99,988: runs


def test_a_fit_with_no_bandwidth_is_not_saved():
    # `--sizes 1K,2K --repeats 1` saved beta 0.0 s/byte ("beta=inf GB/s"), which `spmdsim plan` then used.
    from spmdsim.programs.cost import CostModel
    from spmdsim.programs.cost.terms import OpParams

    args = build_parser().parse_args(["calibrate", "--sizes", "1K,2K", "--repeats", "1"])
    assert calibrate._fit_problem(args, CostModel(alpha_s=1e-5, beta_s_per_byte=0.0)) == (
        "the fit's beta is 0.0 s/byte (infinite bandwidth): the measured times do not grow with the size, too few "
        "sizes or repeats to fit (--sizes '1K,2K', --repeats 1); not saved. Expected sizes further apart and more "
        "repeats, such as --sizes 64K,1M,4M --repeats 7")
    own = (OpParams("bcast", 1e-5, 0.0, group_size=2),)
    assert calibrate._fit_problem(args, CostModel(1e-5, 1e-9, per_op=own)).startswith(
        "the fit's beta of bcast on 2 ranks is 0.0 s/byte (infinite bandwidth)")
    assert calibrate._fit_problem(args, CostModel(0.0, 1e-9, per_op=own[:0])) is None  # alpha 0: sizes >= 64K
    more = build_parser().parse_args(["calibrate", "--sizes", "1K,2K", "--repeats", "9"])  # more than the hint's 7
    assert calibrate._fit_problem(more, CostModel(1e-5, 0.0)).endswith("--sizes 64K,1M,4M --repeats 18")


def test_real_bytes_rounds_to_whole_elements_per_rank():
    assert collective_timing._real_bytes(1 << 20, 8) == 1 << 20
    assert collective_timing._real_bytes(100, 8) == 4 * 24
    assert collective_timing._real_bytes(0, 4) == 16


def test_calibrate_is_registered_and_imports_no_mpi():
    args = build_parser().parse_args(["calibrate", "--dry-run", "--sizes", "1M"])
    assert args.func is calibrate.run and args.dry_run and args.sizes == "1M"
    code = ("import sys; from spmdsim.tools.cli.main import build_parser; build_parser(); "
            "assert 'mpi4py' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_calibrate_on_one_process_is_one_error_line():
    """Outside MPI (one process): one line as every other refusal's, "spmdsim: error: ..." (folded at 100 columns),
    naming the count it got and what it needs."""
    done = subprocess.run([sys.executable, "-m", "spmdsim", "calibrate"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == ("spmdsim: error: calibrate needs at least 2 ranks (it times collectives between them), "
                           "got 1: run it\n  under MPI, e.g. timeout -k 5 300 mpiexec -n 8 spmdsim calibrate\n"), \
        done.stderr
