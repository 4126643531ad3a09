"""Time `spmdsim lab grade` over a folder of mixed submissions of the ring Allreduce exercise (5).

    python scripts/bench_lab_grade.py [--count 30] [--jobs 2] [--keep DIR]

Writes `--count` submissions, cycling through ten kinds (right twice, forbidden Allreduce, a deadlock,
more bytes than the ring, a block assumed divisible, an endless loop, a memory bomb, sys.exit, a
crash), grades them with the exercise's own limits, checks that every row has its kind's verdict,
and prints the rows' verdicts by kind and the wall time of the whole grade.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import sys
import tempfile
import time

from spmdsim.tools.cli.main import main as spmdsim_main
from spmdsim.tools.cli.main import run_script

_RING = '''import numpy as np
def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    chunks = [c.copy() for c in np.array_split(x, n)]
    for phase in (0, 1):
        for step in range(n - 1):
            send, recv = (r - step + phase) % n, (r - step - 1 + phase) % n
            buf = np.empty_like(chunks[recv])
            comm.Sendrecv(chunks[send], dest=(r + 1) % n, recvbuf=buf, source=(r - 1) % n)
            chunks[recv] = chunks[recv] + buf if phase == 0 else buf
    return np.concatenate(chunks)
'''

#: kind -> (source, the verdict word and the start of the reason its row must have)
KINDS = {
    "right": (_RING, ("PASS", "")),
    "right_again": (_RING.replace("chunks[recv] + buf", "buf + chunks[recv]"), ("PASS", "")),
    "forbidden": ("import numpy as np\ndef ring_allreduce(comm, x):\n    out = np.empty_like(x)\n"
                  "    comm.Allreduce(x, out)\n    return out\n", ("FAIL", "line 4: comm.Allreduce is not allowed")),
    "deadlock": ("import numpy as np\ndef ring_allreduce(comm, x):\n    n, r = comm.Get_size(), comm.Get_rank()\n"
                 "    total = x.copy()\n    for _ in range(n - 1):\n        buf = np.empty_like(x)\n"
                 "        comm.Recv(buf, source=(r - 1) % n)\n        comm.Send(x, dest=(r + 1) % n)\n"
                 "        total += buf\n    return total\n", ("FAIL", "deadlock at 2 ranks")),
    "bytes": ("import numpy as np\ndef ring_allreduce(comm, x):\n    n, r = comm.Get_size(), comm.Get_rank()\n"
              "    if r:\n        comm.Send(x, dest=0)\n        comm.Recv(x, source=0)\n        return x\n"
              "    for src in range(1, n):\n        buf = np.empty_like(x)\n        comm.Recv(buf, source=src)\n"
              "        x = x + buf\n    for dst in range(1, n):\n        comm.Send(x, dest=dst)\n    return x\n",
              ("FAIL", "rank 0 sent")),
    "divisible": (_RING.replace("np.array_split(x, n)", "x.reshape(n, -1)"),
                  ("FAIL", "every rank raised ValueError")),
    "endless": ("def ring_allreduce(comm, x):\n    while True:\n        pass\n", ("FAIL", "ran past the time limit")),
    "memory": ("import numpy as np\ndef ring_allreduce(comm, x):\n    keep = []\n    while True:\n"
               "        keep.append(np.ones(1 << 24))\n", ("FAIL", "rank 0 ran out of memory")),
    "exiting": ("import sys\ndef ring_allreduce(comm, x):\n    sys.exit(1)\n", ("FAIL", "rank 0 called sys.exit(1)")),
    "crash": ("def ring_allreduce(comm, x):\n    return x / undefined_name\n", ("FAIL", "rank 0 raised NameError")),
}


def _write(folder: str, count: int) -> dict:
    """`count` submissions in `folder`, cycling through KINDS; file name -> kind."""
    names = {}
    for index in range(count):
        kind = list(KINDS)[index % len(KINDS)]
        name = f"{index:02d}_{kind}.py"
        with open(os.path.join(folder, name), "w") as f:
            f.write(KINDS[kind][0])
        names[name] = kind
    return names


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=30, help="submissions to grade (default 30)")
    parser.add_argument("--jobs", type=int, default=2, help="submissions checked at once (default 2)")
    parser.add_argument("--keep", metavar="DIR",
                        help="write the submissions (in DIR/submissions) and grades.csv here, and keep them")
    args = parser.parse_args(argv)
    if args.count < 1 or args.jobs < 1:
        parser.error(f"--count {args.count!r} and --jobs {args.jobs!r} must be at least 1")
    with tempfile.TemporaryDirectory(prefix="spmdsim-lab-bench-") as tmp:
        # The grade book beside the submissions' folder: `lab grade` refuses one inside it (it would be graded).
        folder = os.path.join(args.keep or tmp, "submissions")
        os.makedirs(folder, exist_ok=True)
        names = _write(folder, args.count)
        book = os.path.join(args.keep or tmp, "grades.csv")
        began = time.monotonic()
        code = spmdsim_main(["lab", "grade", "5", folder, "--csv", book, "--jobs", str(args.jobs)])
        seconds = time.monotonic() - began
        with open(book) as f:
            rows = list(csv.DictReader(f))
    wrong = [row["file"] for row in rows
             if (row["verdict"], row["reason"][:len(KINDS[names[row["file"]]][1][1])]) != KINDS[names[row["file"]]][1]]
    by_kind = collections.Counter((names[row["file"]], row["verdict"]) for row in rows)
    for (kind, verdict), count in sorted(by_kind.items()):
        print(f"{kind:<12} {verdict:<5} x{count}")
    print(f"{len(rows)} submissions graded in {seconds:.1f} s with --jobs {args.jobs} on {os.cpu_count()} cores; "
          f"rows with an unexpected verdict: {len(wrong)}" + (f" ({', '.join(wrong)})" if wrong else ""))
    return 1 if code or wrong or len(rows) != args.count else 0


if __name__ == "__main__":
    sys.exit(run_script(main))
