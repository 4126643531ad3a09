#!/usr/bin/env python
"""Summarize several bench.py runs: per case the median ratio over launches, and the targets.

On a shared or oversubscribed machine one launch's ratios move by up to +-0.15
(typically +-0.1) at 1 MiB, and part of that is fixed for the whole launch (where each rank's
buffers landed, how the scheduler interleaves the ranks), so more repeats in
one launch do not remove it. The estimate here is the median over launches
of each case's ratio. Runs of ``bench.py --aa`` passed with ``--aa`` add the
A/A control: the same statistic for two copies of the raw code.

    for i in 1 2 3 4 5; do timeout -k 5 900 mpiexec -n 8 python scripts/bench.py --json b$i.json; done
    for i in 1 2 3; do timeout -k 5 900 mpiexec -n 8 python scripts/bench.py --aa --json aa$i.json; done
    python scripts/bench_summary.py b*.json --aa aa*.json

Targets, over cases moving at least --min-bytes per rank:
comm  <= 1.05x raw mpi4py (time inside collectives), or no more than the A/A control's largest
ratio for that case where --aa runs are given (the machine's own noise); model: the cost model's
prediction within 2x of the raw comm time, or of its time after the last rank
arrived (`rawarr`, no wait for late ranks).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Iterable, NoReturn, Optional

# The shared argument types live beside this file (on sys.path when the script runs;
# added for imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import byte_size  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

COMM_TARGET = 1.05
MODEL_FACTOR = 2.0
_EXPECTED = "expected bench.py's JSON list"
_REQUIRED = ("name", "bytes_per_rank", "spmdsim_comm_s", "raw_comm_s")
#: The keys of a timed record read here: the types their values may take, in words.
_TYPES = {"name": ((str,), "a string"), "bytes_per_rank": ((int,), "a whole number"),
          **{key: ((int, float, type(None)), "a number or null") for key in
             ("spmdsim_comm_s", "raw_comm_s", "spmdsim_comm_after_arrival_s",
              "raw_comm_after_arrival_s", "predicted_comm_s")}}


def _fail(path: str, what: str) -> NoReturn:
    raise SystemExit(f"bench_summary: {path}: {what}")


def _read(path: str) -> Any:
    """The JSON in `path`; any way it cannot be read ends the run with one line."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        _fail(path, f"cannot read it ({exc.strerror}); {_EXPECTED}")
    except UnicodeDecodeError:
        _fail(path, f"is not UTF-8 text; {_EXPECTED}")
    if not text.strip():
        _fail(path, f"is empty; {_EXPECTED}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(path, f"is not JSON ({exc.msg}, line {exc.lineno} column {exc.colno}); {_EXPECTED}")


def _is_timed(path: str, i: int, record: Any) -> bool:
    """True for a timed record, False for an overhead one; anything else ends the run."""
    if not isinstance(record, dict):
        _fail(path, f"record {i} is {record!r:.60}; expected an object with a bench.py record's keys")
    if record.get("suite") == "overhead":
        return False
    missing = [key for key in _REQUIRED if key not in record]
    if missing:
        _fail(path, f"record {i} lacks {', '.join(map(repr, missing))}; expected the keys of "
                    "bench.py's timed records")
    for key, (types, what) in _TYPES.items():
        value = record.get(key)
        if key in record and (isinstance(value, bool) or not isinstance(value, types)):
            _fail(path, f"record {i}: {key} is {value!r:.60}; expected {what}")
    return True


def load(paths: Iterable[str]) -> list[list[dict]]:
    """One list of timed records per file (the overhead suite's records are left out)."""
    runs = []
    for path in paths:
        records = _read(path)
        if not isinstance(records, list):
            _fail(path, f"holds {type(records).__name__}, {_EXPECTED}")
        timed = [r for i, r in enumerate(records) if _is_timed(path, i, r)]
        if not timed:
            _fail(path, "has no timed records; expected records of bench.py's collectives, "
                        "redistribute or ops suites")
        runs.append(timed)
    return runs


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if num is not None and den else None


def case_ratios(record: dict) -> dict:
    """The ratios one record gives: comm, after-arrival, model vs comm and vs after-arrival."""
    raw_comm, raw_arr = record.get("raw_comm_s"), record.get("raw_comm_after_arrival_s")
    return {
        "comm": _ratio(record.get("spmdsim_comm_s"), raw_comm),
        "arrival": _ratio(record.get("spmdsim_comm_after_arrival_s"), raw_arr),
        "model": _ratio(record.get("predicted_comm_s"), raw_comm),
        "model_arrival": _ratio(record.get("predicted_comm_s"), raw_arr),
    }


def summarize(runs: list[list[dict]], min_bytes: int) -> list[dict]:
    """Per case (first-seen order): median and range over launches of each ratio."""
    names: list[str] = []
    per_case: dict[str, list[dict]] = {}
    for records in runs:
        for r in records:
            if r["bytes_per_rank"] < min_bytes or not r.get("raw_comm_s"):
                continue  # below the size the targets speak of, or no communication
            if r["name"] not in per_case:
                names.append(r["name"])
                per_case[r["name"]] = []
            per_case[r["name"]].append(case_ratios(r))
    rows = []
    for name in names:
        row: dict = {"name": name, "launches": len(per_case[name])}
        for key in ("comm", "arrival", "model", "model_arrival"):
            values = [v[key] for v in per_case[name] if v[key] is not None]
            row[key] = statistics.median(values) if values else None
            row[key + "_range"] = (min(values), max(values)) if values else None
        rows.append(row)
    return rows


def check_counted(rows: list[dict], runs: list[list[dict]], min_bytes: int, what: str) -> None:
    """End the run with one line when no case of `runs` reaches --min-bytes.

    Every case below it is left out, so runs of `bench.py --quick` (16 KiB a rank) summarized at the default
    1 MiB printed an empty table and a count of "0 of 0" with exit 0, as if nothing had been measured.
    """
    if rows:
        return
    moved = [r["bytes_per_rank"] for records in runs for r in records if r.get("raw_comm_s")]
    if not moved:
        raise SystemExit(f"bench_summary: the {what} hold no case with time inside collectives "
                         "(raw_comm_s); expected records of bench.py's collectives, redistribute or ops suites")
    raise SystemExit(f"bench_summary: no case of the {what} moves --min-bytes {min_bytes} bytes per rank or more "
                     f"(the largest moves {max(moved)}: a --quick run?); pass --min-bytes {max(moved)} or less "
                     "to count them")


def within(ratio: Optional[float], factor: float) -> bool:
    return ratio is not None and 1.0 / factor <= ratio <= factor


def comm_bound(name: str, aa: dict) -> float:
    """The comm ratio case `name` must not exceed: COMM_TARGET, or the A/A control's largest ratio over
    its launches where that is larger (two copies of the same raw code differed by that much)."""
    spread = (aa.get(name) or {}).get("comm_range")
    return max(COMM_TARGET, spread[1]) if spread else COMM_TARGET


def targets(rows: list[dict], aa_rows: Optional[list[dict]] = None) -> dict:
    """Counts of cases meeting each target, and the names of those that miss."""
    aa = {r["name"]: r for r in aa_rows or []}
    comm_miss = [r["name"] for r in rows if r["comm"] is None or r["comm"] > comm_bound(r["name"], aa)]
    model_miss = [r["name"] for r in rows if not within(r["model"], MODEL_FACTOR)]
    model_arr_miss = [r["name"] for r in rows if not within(r["model"], MODEL_FACTOR)
                      and not within(r["model_arrival"], MODEL_FACTOR)]
    return {"cases": len(rows), "comm_met": len(rows) - len(comm_miss), "comm_miss": comm_miss,
            "model_met": len(rows) - len(model_miss), "model_miss": model_miss,
            "model_or_arrival_met": len(rows) - len(model_arr_miss), "model_or_arrival_miss": model_arr_miss}


def _fmt(v: Optional[float]) -> str:
    return "   -" if v is None else f"{v:4.2f}"


def _span(r: Optional[tuple]) -> str:
    return "-" if r is None else f"{r[0]:.2f}-{r[1]:.2f}"


def table(rows: list[dict], aa_rows: Optional[list[dict]]) -> str:
    aa = {r["name"]: r for r in aa_rows or []}
    head = f"{'case':<46}{'n':>3}{'comm':>6}{'range':>11}{'arr':>6}{'model':>7}{'m/arr':>7}"
    if aa_rows is not None:
        head += f"{'A/A':>6}{'A/A range':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['name'][:45]:<46}{r['launches']:>3}{_fmt(r['comm']):>6}{_span(r['comm_range']):>11}"
                f"{_fmt(r['arrival']):>6}{_fmt(r['model']):>7}{_fmt(r['model_arrival']):>7}")
        if aa_rows is not None:
            a = aa.get(r["name"], {})
            line += f"{_fmt(a.get('comm')):>6}{_span(a.get('comm_range')):>11}"
        lines.append(line)
    lines.append("comm, arr: spmdsim/raw time inside collectives (arr: after the last rank arrived); "
                 "model, m/arr: predicted/measured raw comm (and its after-arrival time); "
                 "medians over n launches, range = min-max")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("runs", nargs="+", help="bench.py --json files, one per launch")
    p.add_argument("--aa", nargs="+", default=None, help="bench.py --aa --json files (the A/A control)")
    p.add_argument("--min-bytes", type=lambda text: byte_size(text, 0), default=1 << 20,
                   help="smallest bytes/rank counted, e.g. 1 or 64K (default 1M)")
    p.add_argument("--json", action="store_true", help="print the rows and target counts as JSON")
    args = p.parse_args(argv)
    runs = load(args.runs)
    rows = summarize(runs, args.min_bytes)
    check_counted(rows, runs, args.min_bytes, "runs")
    aa_rows = None
    if args.aa:
        aa_runs = load(args.aa)
        aa_rows = summarize(aa_runs, args.min_bytes)
        check_counted(aa_rows, aa_runs, args.min_bytes, "--aa runs")
    result = targets(rows, aa_rows)
    if args.json:
        print(json.dumps({"rows": rows, "aa_rows": aa_rows, "targets": result}, indent=1))
        return 0
    print(table(rows, aa_rows))
    bound = f"{COMM_TARGET}x raw" + (" or the A/A's largest" if aa_rows is not None else "")
    print(f"\ncomm <= {bound}: {result['comm_met']} of {result['cases']}"
          + (f" (misses: {', '.join(result['comm_miss'])})" if result["comm_miss"] else ""))
    print(f"model within {MODEL_FACTOR:g}x of raw comm: {result['model_met']} of {result['cases']}; "
          f"of raw comm or its after-arrival time: {result['model_or_arrival_met']} of {result['cases']}"
          + (f" (misses: {', '.join(result['model_or_arrival_miss'])})" if result["model_or_arrival_miss"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
