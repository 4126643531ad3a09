"""scripts/bench_summary.py: medians over launches and the issue-6 target counts (pure, no MPI)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from testkit import load_script

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_summary.py"


@pytest.fixture(scope="module")
def summary():
    return load_script(_SCRIPT, "spmdsim_bench_summary")


def _rec(name, comm, raw_comm=1e-3, *, nbytes=1 << 20, arrival=None, predicted=1e-3, suite="collectives"):
    """A bench.py record whose comm ratio is `comm` (raw comm 1 ms unless given)."""
    raw_arr = 0.5e-3
    return {"name": name, "bytes_per_rank": nbytes, "suite": suite,
            "spmdsim_comm_s": comm * raw_comm, "raw_comm_s": raw_comm,
            "spmdsim_comm_after_arrival_s": (arrival or comm) * raw_arr,
            "raw_comm_after_arrival_s": raw_arr, "predicted_comm_s": predicted}


def _write(tmp_path, name, records):
    path = tmp_path / name
    path.write_text(json.dumps(records))
    return str(path)


def test_median_over_launches_and_targets(summary, tmp_path):
    runs = [
        [_rec("steady", 1.0), _rec("noisy", 1.3), _rec("slow", 1.2, predicted=2.5e-3),
         _rec("tiny", 3.0, nbytes=64 << 10), _rec("local", 1.0, raw_comm=0.0),
         {"name": "overhead x", "suite": "overhead", "bytes_per_rank": 0}],
        [_rec("steady", 1.04), _rec("noisy", 1.02), _rec("slow", 1.25, predicted=2.5e-3)],
        [_rec("steady", 1.08), _rec("noisy", 1.05), _rec("slow", 1.15, predicted=2.5e-3)],
    ]
    paths = [_write(tmp_path, f"b{i}.json", recs) for i, recs in enumerate(runs)]
    rows = summary.summarize(summary.load(paths), 1 << 20)
    by = {r["name"]: r for r in rows}
    assert list(by) == ["steady", "noisy", "slow"]  # below 1 MiB, no comm and overhead records left out
    assert by["noisy"]["comm"] == pytest.approx(1.05) and by["noisy"]["comm_range"] == pytest.approx((1.02, 1.3))
    assert by["slow"]["launches"] == 3 and by["slow"]["comm"] == pytest.approx(1.2)
    # 2.5 ms predicted: 2.5x the raw comm time, but 5x its 0.5 ms after-arrival time.
    assert by["slow"]["model"] == pytest.approx(2.5) and by["slow"]["model_arrival"] == pytest.approx(5.0)
    t = summary.targets(rows)
    assert (t["cases"], t["comm_met"], t["comm_miss"]) == (3, 2, ["slow"])
    assert (t["model_met"], t["model_or_arrival_met"]) == (2, 2)
    # With an A/A control, a case also meets the comm target within that control's largest ratio: "noisy"
    # (1.05) and "slow" (1.2) against A/A launches up to 1.04 and 1.22.
    aa_paths = [_write(tmp_path, f"aa{i}.json", [_rec("noisy", v), _rec("slow", w)])
                for i, (v, w) in enumerate([(0.98, 1.22), (1.04, 0.9)])]
    aa_rows = summary.summarize(summary.load(aa_paths), 1 << 20)
    t = summary.targets(rows, aa_rows)
    assert (t["comm_met"], t["comm_miss"]) == (3, [])
    assert summary.targets(rows, aa_rows[:1])["comm_miss"] == ["slow"]  # no control for it: 1.05x


def test_model_counts_when_within_2x_of_the_after_arrival_time(summary, tmp_path):
    # Predicted 0.4 ms: 0.4x the 1 ms raw comm (a miss) but 0.8x its 0.5 ms after-arrival time.
    path = _write(tmp_path, "b.json", [_rec("waits", 1.0, predicted=0.4e-3)])
    t = summary.targets(summary.summarize(summary.load([path]), 1 << 20))
    assert (t["model_met"], t["model_or_arrival_met"], t["model_or_arrival_miss"]) == (0, 1, [])


def test_main_prints_table_targets_and_aa_column(summary, tmp_path, capsys):
    plain = _write(tmp_path, "b.json", [_rec("case one", 1.05)])
    aa = _write(tmp_path, "aa.json", [_rec("case one", 0.97)])
    assert summary.main([plain, "--aa", aa]) == 0
    out = capsys.readouterr().out
    assert "case one" in out and "A/A" in out and "0.97" in out
    assert "comm <= 1.05x raw or the A/A's largest: 1 of 1" in out
    assert summary.main([plain, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["targets"]["comm_met"] == 1 and data["aa_rows"] is None


def test_a_file_that_is_not_a_record_list_is_refused(summary, tmp_path):
    path = _write(tmp_path, "bad.json", {"name": "x"})
    with pytest.raises(SystemExit, match="expected bench.py's JSON list"):
        summary.load([path])


_GOOD = _rec("case", 1.0)
BAD_FILES = {  # name -> (bytes written, text the message must contain)
    "empty.json": (b"", "is empty; expected bench.py's JSON list"),
    "blank.json": (b" \n", "is empty"),
    "latin1.json": (b'[{"name": "\xe9"}]', "is not UTF-8 text"),
    "broken.json": (b'[{"name": ', "is not JSON (Expecting value, line 1 column 11)"),
    "ints.json": (b"[1, 2]", "record 0 is 1; expected an object"),
    "none.json": (b"[]", "has no timed records"),
    "overhead.json": (json.dumps([{"name": "x", "suite": "overhead"}]).encode(), "has no timed records"),
    "missing.json": (json.dumps([_GOOD, {"name": "x", "raw_comm_s": 1.0}]).encode(),
                     "record 1 lacks 'bytes_per_rank', 'spmdsim_comm_s'"),
    "name.json": (json.dumps([{**_GOOD, "name": 7}]).encode(), "record 0: name is 7; expected a string"),
    "bytes.json": (json.dumps([{**_GOOD, "bytes_per_rank": "1M"}]).encode(),
                   "bytes_per_rank is '1M'; expected a whole number"),
    "seconds.json": (json.dumps([{**_GOOD, "predicted_comm_s": "fast"}]).encode(),
                     "predicted_comm_s is 'fast'; expected a number or null"),
    "bool.json": (json.dumps([{**_GOOD, "raw_comm_s": True}]).encode(), "raw_comm_s is True"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_a_bad_file_is_one_line_naming_it(summary, tmp_path, name):
    data, expected = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(SystemExit) as info:
        summary.main([str(path)])
    message = str(info.value.code)
    assert message.startswith(f"bench_summary: {path}: ") and expected in message, message
    assert "\n" not in message


@pytest.mark.parametrize("what", ["missing", "folder"])
def test_an_unreadable_path_is_one_line_naming_it(summary, tmp_path, what):
    path = tmp_path / "nothing.json" if what == "missing" else tmp_path
    with pytest.raises(SystemExit, match=re.escape(f"bench_summary: {path}: cannot read it")):
        summary.main([str(path)])


def test_aa_without_files_is_an_argument_error(summary, tmp_path, capsys):
    plain = _write(tmp_path, "b.json", [_GOOD])
    with pytest.raises(SystemExit) as info:
        summary.main([plain, "--aa"])
    assert info.value.code == 2 and "--aa: expected at least one argument" in capsys.readouterr().err


def test_runs_with_no_case_at_min_bytes_are_one_line_not_an_empty_table(summary, tmp_path, capsys):
    """bench.py --quick's collectives move 16 KiB a rank: at the default --min-bytes of 1 MiB every case was left
    out, and the summary printed an empty table and a count of "0 of 0" with exit 0."""
    quick = _write(tmp_path, "q.json", [_rec("allreduce 16K", 1.0, nbytes=16 << 10),
                                        _rec("allgather 8K", 1.0, nbytes=8 << 10)])
    with pytest.raises(SystemExit) as info:
        summary.main([quick])
    assert str(info.value.code) == ("bench_summary: no case of the runs moves --min-bytes 1048576 bytes per rank or "
                                    "more (the largest moves 16384: a --quick run?); pass --min-bytes 16384 or less "
                                    "to count them")
    big = _write(tmp_path, "b.json", [_rec("allreduce 1M", 1.0)])
    with pytest.raises(SystemExit, match=r"^bench_summary: no case of the --aa runs moves --min-bytes 1048576 "):
        summary.main([big, "--aa", quick])
    no_comm = _write(tmp_path, "local.json", [_rec("local", 1.0, raw_comm=0.0)])
    with pytest.raises(SystemExit, match=r"^bench_summary: the runs hold no case with time inside collectives"):
        summary.main([no_comm, "--min-bytes", "0"])
    capsys.readouterr()
    assert summary.main([quick, "--min-bytes", "16K"]) == 0  # a size as bench.py's --sizes reads it
    assert "comm <= 1.05x raw: 1 of 1" in capsys.readouterr().out


@pytest.mark.parametrize("text, expected", [("-1", "size '-1' is -1 bytes; expected at least 0"),
                                            ("1Q", "size '1Q' is not a byte count like 4096, 64K or 4M")])
def test_a_bad_min_bytes_is_one_argument_error(summary, tmp_path, capsys, text, expected):
    """--min-bytes -1 was taken (every case counted, as with 0); 64K was 'invalid int value'."""
    plain = _write(tmp_path, "b.json", [_GOOD])
    with pytest.raises(SystemExit) as info:
        summary.main([plain, "--min-bytes", text])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err[-1].endswith(f": error: argument --min-bytes: {expected}"), err
