"""mpi4py's own test files, run against simulated ranks (MPI.COMM_WORLD swapped per rank).

    python tests/mpi4py_suite.py --ranks 1,2,3,4,8            # every in-scope test file
    python tests/mpi4py_suite.py --ranks 4 --only testAlltoall --verbose

The test files are those of the installed mpi4py's sdist (``test/``, not in the
wheel): from $SPMDSIM_MPI4PY_TESTS, else from ~/.cache/spmdsim/mpi4py-<version>/test,
which ``--fetch`` fills with ``pip download --no-binary mpi4py mpi4py==<version>`` (the sdist;
its build tools come as wheels: ``:all:`` built Cython from source, ~4 minutes on 2 cores).
Each test method runs in its own ``spmdsim.simulate(n, ...)``: every rank runs
the method on its own TestCase, as ``mpiexec -n N python -m mpi4py`` would.
A test counts as passed when it passes on every rank. OUT_OF_SCOPE lists what
the emulator does not do, with why; tests/test_sim_mpi4py_suite.py fails on any
other failure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import unittest
from pathlib import Path

#: The test files run: every file of mpi4py's suite whose subject a simulated rank has (communicators, point to
#: point (partitioned too), collectives, one-sided communication, groups, requests, statuses, errors, attributes,
#: topologies, pkl5, threads, buffers, datatypes and packing, MPI I/O, intercommunicators, Spawn, Accept and
#: Connect); the files left out, and why, are NOT_RUN.
FILES = ("test_cco_buf", "test_cco_nb_buf", "test_cco_obj", "test_cco_vec", "test_cco_nb_vec", "test_comm",
         "test_p2p_buf", "test_p2p_obj",
         "test_p2p_buf_matched", "test_p2p_obj_matched", "test_cco_ngh_buf", "test_cco_ngh_obj", "test_comm_topo",
         "test_group", "test_request", "test_status", "test_exceptions", "test_errhandler", "test_attributes",
         "test_util_pkl5", "test_threads", "test_environ", "test_msgspec", "test_msgzero", "test_op", "test_pickle",
         "test_buffer", "test_address", "test_errorcode", "test_info", "test_mpimem", "test_grequest",
         "test_cco_pr_buf", "test_cco_pr_vec", "test_cco_pr_ngh_buf", "test_win", "test_rma", "test_rma_nb",
         "test_util_sync", "test_p2p_buf_part", "test_datatype", "test_util_dtlib", "test_pack", "test_file", "test_io",
         "test_comm_inter", "test_cco_buf_inter", "test_cco_obj_inter", "test_cco_vec_inter", "test_spawn",
         "test_dynproc")

#: mpi4py's test files not run, and why (docs/howto/simulate.md's table).
NOT_RUN = {
    "mpi4py.util.pool's tests share a pool their class makes in setUpClass, which this runner (one method per "
    "simulate) does not call": ("test_util_pool",),
    "sessions and fault tolerance": ("test_session", "test_ulfm"),
    "mpi4py's packaging, C API, ABI and docs": ("test_cffi", "test_ctypes", "test_mpiabi", "test_mpiapi",
                                                "test_package", "test_toplevel", "test_doc"),
    "MPI handles as C objects (.handle, fromhandle, the C API), subclasses of the real classes": (
        "test_handle", "test_objmodel", "test_subclass"),
}

#: Test names (regular expressions on "module.Class.method") that are out of scope, and why.
OUT_OF_SCOPE = {
    r"test_comm\.TestComm\w*\.testCreateFromGroup": "MPI sessions (Intracomm.Create_from_group)",
    r"test_p2p_buf\.\w+\.testConstructor": "MPI handles as C objects (MPI.Prequest.fromhandle(request.handle))",
    r"\.testCommLock": "mpi4py's private lock table of a real MPI communicator (MPI._comm_lock_table)",
    r"test_threads\.TestMPIThreads\.testIsThreadMain(InThread)?$": "threads' names: a simulated rank's own thread "
                                                                "is its MPI main thread (MPI.Is_thread_main()), "
                                                                "named 'spmdsim rank N', where the test takes "
                                                                "'MainThread' alone for the main thread",
    r"test_io\.TestDatarep\.testRegister$": "MPI's process-wide table of data representations (MPI.Register_datarep: "
                                          "the simulated ranks register one name into one table)",
    r"ErrhandlerSession": "MPI sessions (MPI.Session's error handlers: a process-wide table of 32)",
    r"DLPackGPUBuf": "device (GPU) memory: only host memory is simulated",
    r"test_msgspec\.TestMessage(CAIBuf|DLPackCPUBuf)\.test(DataValue|Descr\w+|Mask|ShapeValue|Typestr\w+|Dtype\w+)$":
        "mpi4py's checks of malformed __cuda_array_interface__ and DLPack descriptors (well-formed host ones are read)",
    r"test_op\.TestOp\.(testCreateMany|testPickleUserDefined)$": "mpi4py's process-wide table of user-defined ops "
                                                                  "(every simulated rank's Op.Create takes a slot of "
                                                                  "one process's)",
    r"test_errorcode\.TestErrorCode\.testAddErrorClassCodeString$": "MPI's process-wide table of error classes "
                                                                    "(MPI.Add_error_class): the simulated ranks add "
                                                                    "to one table at once",
    r"test_pack\.TestPack(Self|World)\.test(PackSize|PackUnpack)$": "MPI's Datatype.Pack, Unpack and Pack_size of a "
                                                                 "simulated communicator (mpi4py's C code takes a "
                                                                 "real MPI.Comm; Pack_external runs)",
    r"test_p2p_obj\.\w+\.testRecvObjArg$": "Python's warning filters, one per process: a rank's simplefilter inside "
                                           "warnings.catch_warnings changes every simulated rank's filters",
    r"test_grequest\.\w+\.testConstructor$": "generalized requests are MPI's own (MPI.Request(grequest) on a rank "
                                              "makes a simulated request)",
}


def out_of_scope(test_id: str) -> str | None:
    for pattern, why in OUT_OF_SCOPE.items():
        if re.search(pattern, test_id):
            return why
    return None


def cache_dir() -> Path:
    import mpi4py

    return Path.home() / ".cache" / "spmdsim" / f"mpi4py-{mpi4py.__version__}"


def find_tests() -> Path | None:
    """The directory of mpi4py's test files, or None."""
    env = os.environ.get("SPMDSIM_MPI4PY_TESTS")
    if env:
        return Path(env)
    found = cache_dir() / "test"
    return found if (found / "mpiunittest.py").exists() else None


def fetch() -> Path:
    """Download the installed mpi4py's sdist with pip and keep its test/ and demo/ in the cache (the test/)."""
    import mpi4py

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "mpi4py",
                        f"mpi4py=={mpi4py.__version__}", "-d", tmp], check=True, capture_output=True)
        sdist = next(Path(tmp).glob("mpi4py-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tops = (f"mpi4py-{mpi4py.__version__}/test/", f"mpi4py-{mpi4py.__version__}/demo/")
            members = [m for m in tar.getmembers() if m.name.startswith(tops) and m.isfile()]
            for m in members:
                m.name = m.name[len(f"mpi4py-{mpi4py.__version__}/"):]
            cache_dir().mkdir(parents=True, exist_ok=True)
            tar.extractall(cache_dir(), members=members, filter="data")
    return cache_dir() / "test"


class _PerRank:
    """A TestCase class attribute read from its module when a rank reads it (COMM = MPI.COMM_WORLD, CommType =
    pkl5.Intracomm, ...): each simulated rank's own, as each MPI process has its own."""

    def __init__(self, module: object, name: str) -> None:
        self.module, self.name = module, name

    def __get__(self, obj: object, cls: type) -> object:
        return getattr(self.module, self.name)


#: The names whose values differ per simulated rank (what spmdsim.emulator swaps), by module.
_PER_RANK = {"mpi4py.MPI": ("COMM_WORLD", "COMM_SELF", "Comm", "Intracomm", "Cartcomm", "Request", "Group", "Message"),
             "mpi4py.util.pkl5": ("Comm", "Intracomm", "Request", "Message")}


class _ThreadLoop(threading.local):
    """arrayimpl.loop with its attributes (loop.array, loop.typecode) per thread, as per process under MPI."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def load(test_dir: Path, files=FILES) -> dict:
    """test id -> (module, TestCase class, method name), with COMM made per rank."""
    sys.path.insert(0, str(test_dir))
    import arrayimpl

    if not isinstance(arrayimpl.loop, _ThreadLoop):
        arrayimpl.loop = _ThreadLoop(arrayimpl.loop)
    import importlib

    per_rank = {}  # id(the value a test file bound at import) -> (its module, its name)
    for module_name, names in _PER_RANK.items():
        module = importlib.import_module(module_name)
        per_rank.update({id(module.__dict__[n]): (module, n) for n in names if n in module.__dict__})
    cases = {}
    for name in files:
        module = __import__(name)
        for cls in vars(module).values():
            if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
                continue
            for klass in cls.__mro__:
                if vars(klass).get("__unittest_skip_why__") == _TWO_RANKS:  # decided at import, by 1 process
                    klass.__unittest_skip__, klass.spmdsim_needs_two = False, True
                for attr, value in list(vars(klass).items()):
                    found = per_rank.get(id(value))
                    if found is not None and not attr.startswith("__") and found[0].__dict__[found[1]] is value:
                        setattr(klass, attr, _PerRank(*found))
            for method in unittest.TestLoader().getTestCaseNames(cls):
                cases[f"{name}.{cls.__name__}.{method}"] = (cls, method)
    return cases


#: The reason of mpi4py's skip of a class at import in a world of one process (MPI.COMM_WORLD.Get_size() < 2):
#: decided again on each simulated rank, by the simulated world's size.
_TWO_RANKS = "mpi-world-size<2"


def _rank_body(cls: type, method: str) -> tuple[str, str]:
    if getattr(cls, "spmdsim_needs_two", False):
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() < 2:
            return "skip", _TWO_RANKS
    result = unittest.TestResult()
    cls(method).run(result)
    problems = result.errors + result.failures
    if problems:
        return "fail", problems[0][1][-1500:]
    if result.skipped and not result.testsRun - len(result.skipped):
        return "skip", result.skipped[0][1]
    return "pass", ""


def run_one(cls: type, method: str, n: int) -> tuple[str, str]:
    """('pass' | 'fail' | 'skip', detail) of one test method on n simulated ranks."""
    import spmdsim

    try:
        outcomes = spmdsim.simulate(n, _rank_body, cls, method)
    except BaseException as exc:  # noqa: BLE001 - a test that broke the simulation fails
        return "fail", "".join(traceback.format_exception_only(type(exc), exc))[-1500:]
    bad = [(r, d) for r, (v, d) in enumerate(outcomes) if v == "fail"]
    if bad:
        return "fail", f"rank {bad[0][0]}: {bad[0][1]}"
    if all(v == "skip" for v, _ in outcomes):
        return "skip", outcomes[0][1]
    return "pass", ""


def run(test_dir: Path, ranks: list[int], only: str | None = None, files=FILES) -> dict:
    """{ranks: {test id: [outcome, detail, out-of-scope reason or None, seconds]}}."""
    from spmdsim.emulator.mpi4py_world import swapped

    cases = load(test_dir, files)
    results: dict = {}
    with swapped():
        for n in ranks:
            table = results[str(n)] = {}
            for test_id, (cls, method) in cases.items():
                if only and not re.search(only, test_id):
                    continue
                t0 = time.perf_counter()
                outcome, detail = run_one(cls, method, n)
                table[test_id] = [outcome, detail, out_of_scope(test_id), round(time.perf_counter() - t0, 3)]
    return results


def summary(results: dict) -> list[str]:
    lines = []
    for n, table in results.items():
        scope = [v for v in table.values() if v[2] is None and v[0] != "skip"]
        passed = sum(v[0] == "pass" for v in scope)
        outside = sum(v[2] is not None for v in table.values())
        lines.append(f"{n} ranks: {passed} of {len(scope)} in-scope tests pass; "
                     f"{outside} out of scope; {sum(v[0] == 'skip' for v in table.values())} skipped")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,3,4,8")
    parser.add_argument("--only", help="a regular expression on the test ids")
    parser.add_argument("--files", help="comma-separated test files to run instead of FILES (test_group,...)")
    parser.add_argument("--fetch", action="store_true", help="download mpi4py's test files first")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    test_dir = find_tests()
    if test_dir is None and args.fetch:
        test_dir = fetch()
    if test_dir is None:
        print("mpi4py's test files are not here: run with --fetch, or set SPMDSIM_MPI4PY_TESTS", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    files = tuple(args.files.split(",")) if args.files else FILES
    results = run(test_dir, [int(n) for n in args.ranks.split(",")], args.only, files)
    for line in summary(results):
        print(line)
    for n, table in results.items():
        for test_id, (outcome, detail, why, _) in table.items():
            if outcome == "fail" and (why is None or args.verbose):
                print(f"FAIL {n} {test_id}{' (out of scope: ' + why + ')' if why else ''}")
                if args.verbose:
                    print("   " + detail.strip().replace("\n", "\n   "))
    print(f"{time.perf_counter() - t0:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
