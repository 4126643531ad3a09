"""`spmdsim collective` without MPI ranks: bad input, the rounds table and states, pictures, the report."""
from __future__ import annotations

import re
import sys

import pytest

from docs_commands import ROOT
from spmdsim.programs.algorithms import NAMES, build, elements_for, parse_name, schedule
from spmdsim.programs.algorithms.formulas import busiest_bytes_sent, predict_seconds
from spmdsim.programs.algorithms.table import format_rounds, format_states
from spmdsim.programs.cost import DEFAULT_MODEL
from spmdsim.tools.cli.collective import report, to_json
from spmdsim.tools.cli.main import main
from testkit import unfold


def _fails(capsys, argv, needle):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = unfold(err).splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("spmdsim: error: "), (out, err)
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("argv, needle", [
    (["ring-alltoall"], "unknown collective algorithm 'ring-alltoall' (did you mean 'bruck-alltoall', "
                        "'ring-allgather' or 'pairwise-alltoall'?); expected one of ring-allreduce"),
    (["ring-allredcue"], "unknown collective algorithm 'ring-allredcue' (did you mean 'ring-allreduce', "
                         "'ring-allgather' or 'recursive-doubling-allreduce'?); expected one of ring-allreduce, "),
    (["ring_allreduce", "--ranks", "4"], "unknown collective algorithm 'ring_allreduce' (did you mean "
                                         "'ring-allreduce'?); expected one of ring-allreduce, "),
    (["ring-allreduce", "--size", "1X"], "--size: size '1X' is not a byte count like 64K or 4M"),
    (["ring-allreduce", "--size", "0"], "--size '0' must be between 1 byte and 64M"),
    (["ring-allreduce", "--size", "-4"], "--size '-4' must be between 1 byte and 64M"),  # was "must be >= 0"
    (["ring-allreduce", "--size=-1K"], "--size '-1K' must be between 1 byte and 64M"),
    (["ring-allreduce", "--size", "1G"], "must be between 1 byte and 64M, such as 64K or 1M"),
    # argparse took "-1K" for a flag: "argument --size: expected one argument", the value unnamed
    (["ring-allreduce", "--size", "-1K"], "--size '-1K' must be between 1 byte and 64M, such as 64K or 1M"),
    (["ring-allreduce", "--size", "1.5"], "--size: size '1.5' is not a whole number of bytes"),  # was 1 byte
    (["ring-allreduce", "--repeat", "0"], "--repeat 0 must be at least 1"),
    # Given options a run would not use were dropped silently: --root of an algorithm with none, --show with --json.
    (["ring-allreduce", "--root", "2"], "--root 2 applies only to the bcast algorithms (binomial-bcast, "
                                        "scatter-allgather-bcast); ring-allreduce has no root: leave out --root"),
    (["ring-allreduce", "--root", "0"], "--root 0 applies only to the bcast algorithms"),
    (["ring-allreduce", "--show", "--json"], "--show prints the rounds as tables, which --json replaces (its "
                                             "record lists each round's transfers): give one of them"),
    (["ring-allreduce", "--size", "64K"], "needs at least 2 ranks: mpiexec -n N, or --ranks N"),
])
def test_bad_input_is_one_line(capsys, argv, needle):
    _fails(capsys, ["collective"] + argv, needle)


def test_png_without_matplotlib_says_how_to_install(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    _fails(capsys, ["collective", "ring-allreduce", "--png", str(tmp_path)], "pictures need matplotlib: pip install")


@pytest.mark.parametrize("name", NAMES)
def test_tables_fit_100_columns(name):
    collective, _ = parse_name(name)
    for p in (2, 3, 4, 6, 8, 12, 16):
        s = schedule(name, p, 64 * p, 4)
        text = format_rounds(s, [0.001] * len(s.rounds)) + "\n" + format_states(s)
        assert max(len(line) for line in text.splitlines()) <= 100, (name, p)
        assert len(format_rounds(s).splitlines()) >= len(s.rounds) + 1


def test_ring_table_folds_the_ranks_into_one_line_per_round():
    lines = format_rounds(schedule("ring-allreduce", 8, 1 << 18, 4)).splitlines()
    assert len(lines) == 15
    assert lines[1].split() == ["1", "reduce-scatter", "r->r+1", "(0-7),", "slot", "r-1", "131,072"]
    assert lines[8].split()[:4] == ["8", "allgather", "r->r+1", "(0-7),"]
    rd = format_rounds(schedule("recursive-doubling-allreduce", 4, 8)).splitlines()
    assert "r<->r^2 (0-3), slot 0" in rd[2]


def test_states_show_the_sum_growing_round_by_round():
    text = format_states(schedule("ring-allreduce", 4, 16))
    blocks = text.split("after round ")
    assert blocks[0].splitlines()[2].split() == ["0", "0", "0", "0", "0"]
    assert blocks[3].startswith("3 (reduce-scatter)")
    assert blocks[3].splitlines()[2].split() == ["0", "0-3", "0,2,3", "0,3", "0"]  # rank 0 holds slot 0 whole
    assert all(row.split()[1:] == ["0-3"] * 4 for row in blocks[6].splitlines()[2:])


def test_pictures_of_every_round(tmp_path):
    pytest.importorskip("matplotlib")
    from spmdsim.programs.algorithms.picture import render_rounds_png

    paths = render_rounds_png(schedule("bruck-allgather", 3, 4, 4), tmp_path / "pics")
    assert [p.rsplit("/", 1)[1] for p in paths] == ["round_00.png", "round_01.png", "round_02.png", "rounds.png"]
    assert all((tmp_path / "pics" / p.rsplit("/", 1)[1]).stat().st_size > 1000 for p in paths)


def test_pictures_without_matplotlib_make_no_folder(tmp_path, monkeypatch):
    # It made the folder, then refused: an empty folder left behind by a call that did nothing.
    from spmdsim.programs.algorithms.picture import render_rounds_png
    from spmdsim.errors import SpmdsimError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    with pytest.raises(SpmdsimError, match="^pictures need matplotlib"):
        render_rounds_png(schedule("ring-allreduce", 2, 8, 4), tmp_path / "pics")
    assert not (tmp_path / "pics").exists()


def test_picture_titles_count_one_rank(tmp_path, monkeypatch):
    # A schedule on one rank (the library builds it: nothing to send) was titled "ring-allreduce on 1 ranks".
    pytest.importorskip("matplotlib")
    import spmdsim.programs.algorithms.picture as picture
    from spmdsim.programs.algorithms.picture import render_rounds_png

    titles = []
    monkeypatch.setattr(picture, "save_figure", lambda fig, path, dpi: titles.append(fig._suptitle.get_text()) or path)
    render_rounds_png(schedule("ring-allreduce", 1, 4, 4), tmp_path)
    assert titles and all(t.startswith("ring-allreduce on 1 rank") and "1 ranks" not in t for t in titles)


def test_pictures_of_too_many_ranks_are_refused_before_the_run(capsys, tmp_path):
    """--png on 64 ranks drew for hours (70 panels of 4,096 boxes) into a billion-pixel overview: refused
    in one line before the ranks start, and by the function itself; 16 ranks still draw."""
    pytest.importorskip("matplotlib")
    from spmdsim.programs.algorithms.picture import MAX_PICTURE_RANKS, render_rounds_png
    from spmdsim.errors import SpmdsimError

    assert MAX_PICTURE_RANKS == 16
    _fails(capsys, ["collective", "ring-allreduce", "--ranks", "17", "--size", "68", "--png", str(tmp_path / "p")],
           "the pictures draw the rounds of up to 16 ranks, not 17: leave it out")
    with pytest.raises(SpmdsimError, match="up to 16 ranks, not 64"):
        render_rounds_png(schedule("scatter-allgather-bcast", 64, 64, 4), tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_report_and_json_from_a_run():
    s = schedule("ring-allreduce", 4, 1 << 14, 4)
    result = {"matches_mpi": True, "max_abs_difference": 2e-7, "seconds_emulated": 2e-3, "seconds_mpi": 1e-3,
              "round_seconds": [1e-4] * 6, "wait_mode": "polite"}
    text = report(s, result, show=True)
    assert "bytes sent by the busiest rank: 98,304 B; textbook 98,304 B (equal)" in text
    assert "  formula: 2(p-1)/p n (n: bytes from each rank)" in text
    assert "result: matches MPI's Allreduce" in text and "emulated 2.000 ms, MPI 1.000 ms" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    record = to_json(s, result)
    assert record["bytes_sent_per_rank"] == 98304 and type(record["bytes_sent_per_rank"]) is int
    assert len(record["rounds"]) == 6 and record["rounds"][0]["transfers"][0] == {
        "src": 0, "dst": 1, "slots": [3], "reduce": True, "bytes": 16384}
    assert record["matches_mpi"] is True and record["formula_bytes"] == 98304


def test_bench_script_arguments(capsys):
    from pathlib import Path

    from testkit import load_script

    bench = load_script(Path(__file__).resolve().parents[1] / "scripts" / "bench_algorithms.py",
                        "spmdsim_script_bench_algorithms")
    args = bench.parse_args([])
    assert args.sizes == [64 << 10, 1 << 20, 8 << 20] and args.names == list(NAMES)
    assert bench.parse_args(["--algorithms", "bruck-alltoall,ring-allreduce"]).names == [
        "bruck-alltoall", "ring-allreduce"]
    for argv, needle in ((["--algorithms", "ring-alltoall"], "unknown algorithm 'ring-alltoall'"),
                         (["--sizes", "0"], "size '0' is 0 bytes"), (["--repeats", "0"], "got '0'")):
        with pytest.raises(SystemExit) as info:
            bench.parse_args(argv)
        assert info.value.code == 2 and needle in capsys.readouterr().err
    row = {"algorithm": "ring-allreduce", "size": 1 << 20, "ranks": 8, "rounds": 14,
           "bytes_sent_per_rank": 1835008, "formula_bytes": 1835008, "seconds_emulated": 0.004,
           "seconds_mpi": 0.002, "seconds_model": 0.003, "matches_mpi": True, "wait_mode": "polite"}
    text = bench.table([row])
    assert text.splitlines()[2].split() == ["ring-allreduce", "1M", "14", "1,835,008", "yes", "4.000",
                                            "2.000", "3.000", "yes"]
    assert max(len(line) for line in text.splitlines()) <= 100


def test_the_pages_benchmark_table_has_the_schedules_rounds_bytes_and_model():
    """docs/explanation/algorithms.md's table from scripts/bench_algorithms.py on 8 ranks: its rounds, bytes sent
    by the busiest rank, "=formula" and "model" columns are the schedules' and the built-in cost model's, whatever
    the load (the timed columns are not compared)."""
    text = (ROOT / "docs" / "explanation" / "algorithms.md").read_text()
    rows = re.findall(r"^([a-z-]+) +(64K|1M|8M) +(\d+) +([\d,]+) +(yes|NO) +[\d.]+ +[\d.]+ +([\d.]+) +yes$", text,
                      re.M)
    assert len(rows) == 3 * len(NAMES)
    for name, size, *quoted in rows:
        collective, algorithm = parse_name(name)
        count = elements_for(collective, 8, {"64K": 64 << 10, "1M": 1 << 20, "8M": 8 << 20}[size], 4)
        built = build(collective, algorithm, 8, count, 4)
        sent = max(built.bytes_sent())
        formula = "yes" if sent == busiest_bytes_sent(name, 8, count * 4) else "NO"
        model = f"{predict_seconds(built, DEFAULT_MODEL) * 1e3:.3f}"
        assert [str(len(built.rounds)), f"{sent:,}", formula, model] == quoted, (name, size)


def test_report_fits_100_columns_and_counts_one_element():
    """A Reduce_scatter_block's result line ran to 110 columns; one element was "1 elements"."""
    result = {"matches_mpi": True, "max_abs_difference": 2.38e-7, "seconds_emulated": 2e-3, "seconds_mpi": 1e-3,
              "round_seconds": [1e-4] * 4, "wait_mode": "busy", "simulated": True}
    text = report(schedule("ring-reduce-scatter", 5, 5 * 8, 4), result)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "result: matches the simulated ranks' Reduce_scatter_block (max abs difference 2.38e-07: sums in" in text
    one = report(schedule("ring-allreduce", 3, 1, 4), dict(result, round_seconds=[1e-4] * 4))
    assert "  1 element of 4 B, cut into 3 slots" in one.splitlines()


def test_report_says_a_whole_buffer_is_not_cut():
    """Recursive doubling sends the whole buffer each round: the report said "cut into 1 slots"
    (docs/tutorials/lab.md, exercise 12 (d)); a ring still says how many slots it cuts."""
    result = {"matches_mpi": True, "max_abs_difference": 2e-7, "seconds_emulated": 2e-3, "seconds_mpi": 1e-3,
              "round_seconds": [1e-4] * 2, "wait_mode": "polite"}
    text = report(schedule("recursive-doubling-allreduce", 4, 1 << 14, 4), result)
    assert "16,384 elements of 4 B, sent whole (one slot, not cut)" in text and "1 slots" not in text
    ring = report(schedule("ring-allreduce", 4, 1 << 14, 4), dict(result, round_seconds=[1e-4] * 6))
    assert "16,384 elements of 4 B, cut into 4 slots" in ring
