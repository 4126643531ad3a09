"""A dry run at scale: the MLP and attention layers on a (dp, mp) mesh of simulated ranks, in one process.

    python scripts/dry_scale.py                  # (8, 128): 1,024 ranks
    python scripts/dry_scale.py --mesh 2,4 --json

Shapes and dtypes only (spmdsim.runtime.sim.dry): prints the per-rank table folded
over equal ranks, the seconds and the process's peak RSS, and checks every
rank's bytes sent and received against the cost model's ring formulas
(spmdsim/programs/cost/model.py): exit 1 if any rank differs.
"""
from __future__ import annotations

import argparse
import sys
import time

import spmdsim
from spmdsim import Layout, SeededTensor
from spmdsim.programs.cost.model import CostModel
from spmdsim.programs.memory import peak_rss
from spmdsim.programs.viz.table import wrap_lines
from spmdsim.runtime.sim.run import MAX_DRY_RANKS
from spmdsim.tools.cli.main import run_script

SEQ, WIDTH, D_MODEL, HIDDEN_PER_MP = 16, 4, 16, 8  # rows per rank, head width, model width, MLP units per rank


def mlp(mesh):
    """ParallelMLP over "mp", rows split over "dp": one Allreduce of the (rows/dp, hidden) output."""
    from spmdsim.nn.ops import ParallelMLP
    from spmdsim import DTensor

    dp, mp = mesh.layout.device_matrix
    hidden = 2 * mp
    x = DTensor.from_seeded(mesh, mesh.layout("dp", None), SeededTensor((SEQ * dp, hidden), "float32", seed=0))
    return ParallelMLP(mesh, hidden, HIDDEN_PER_MP * mp, axes="mp", seed=1)(x)


def attention(mesh):
    """examples/attention.py on every dp replica: heads split over "mp", one Allreduce of (SEQ, D_MODEL)."""
    from spmdsim.nn.ops import matmul, reshape, scale, softmax, transpose
    from spmdsim import DTensor

    mp = mesh.layout.device_matrix[1]
    seq, heads, d_model, L = SEQ, 2 * mp, D_MODEL, mesh.layout
    x = DTensor.from_seeded(mesh, L(None, None), SeededTensor((seq, d_model), "float32", seed=1))
    wq, wk, wv = (DTensor.from_seeded(mesh, L(None, "mp"), SeededTensor((d_model, heads * WIDTH), "float32",
                                                                         seed=s)) for s in (2, 3, 4))
    wo = DTensor.from_seeded(mesh, L("mp", None), SeededTensor((heads * WIDTH, d_model), "float32", seed=5))
    q, k, v = (transpose(reshape(matmul(x, w), (seq, heads, WIDTH)), (1, 0, 2)) for w in (wq, wk, wv))
    scores = scale(matmul(q, k, transpose_b=True), WIDTH ** -0.5)
    ctx = matmul(softmax(scores), v)
    return matmul(reshape(transpose(ctx, (1, 0, 2)), (seq, heads * WIDTH)), wo)


def program(shape):
    """What every simulated rank runs: both layers on one mesh; returns the trace rows."""
    from spmdsim import Mesh, collect_trace

    mesh = Mesh(Layout(shape, ("dp", "mp")))
    with collect_trace() as trace:
        mlp(mesh)
        attention(mesh)
    return [(e.op, e.group_size, e.bytes_sent, e.bytes_received) for e in trace.entries if e.group_size > 1]


def expected(shape) -> list:
    """Each rank's collectives from the shapes alone: the MLP's and the attention's Allreduce over mp,
    bytes by the cost model's ring formula (its beta term: what one rank sends and receives)."""
    mp = shape[1]
    model = CostModel(alpha_s=0.0, beta_s_per_byte=1.0)
    rows = []
    for buffer_bytes in (SEQ * 2 * mp * 4, SEQ * D_MODEL * 4):  # float32 (rows, hidden) and (seq, d_model)
        moved = round(model.predict("allreduce", mp, buffer_bytes))
        rows.append(("allreduce", mp, moved, moved))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="8,128", help="DP,MP (default 8,128: 1,024 ranks)")
    parser.add_argument("--json", action="store_true", help="print the per-rank report as JSON")
    args = parser.parse_args(argv)
    try:
        shape = tuple(int(n) for n in args.mesh.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        parser.error(f"--mesh {args.mesh!r} must be two whole numbers >= 1, DP,MP (e.g. 8,128)")
    ranks = shape[0] * shape[1]
    if ranks > MAX_DRY_RANKS:
        parser.error(f"--mesh {args.mesh!r} is {ranks:,} ranks; expected at most {MAX_DRY_RANKS:,} (the most a dry run "
                     f"steps)")
    start = time.perf_counter()
    results = spmdsim.simulate(ranks, program, shape, dry_run=True)
    seconds = time.perf_counter() - start
    report = results.report
    print(report.to_json() if args.json else report.table())
    rss = peak_rss() / 2**20
    print(f"{ranks} simulated ranks on a {shape} mesh: {seconds:.1f} s, peak RSS {rss:.0f} MiB")
    want = expected(shape)
    wrong = [r for r, rows in enumerate(results) if rows != want]
    verdict = ("all ranks equal" if not wrong else
               f"{len(wrong)} ranks differ, e.g. rank {wrong[0]}: {results[wrong[0]]}")
    # Within 100 columns: the verdict first, then the formulas' rows folded under it.
    print("\n".join(wrap_lines([f"collectives and bytes per rank vs the cost model's ring formulas: {verdict}",
                                f"  expected on every rank: {want}"])))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(run_script(main))
