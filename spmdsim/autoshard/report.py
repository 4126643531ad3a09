"""The text table and the JSON object of an autoshard `Result` (pure)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..validate import counted

if TYPE_CHECKING:
    from .choose import Result

__all__ = ["format_result", "result_json", "WIDTH"]

#: Columns the default output fits in.
WIDTH = 100


def _b(n: int) -> str:
    return f"{n:,}"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def format_result(result: "Result") -> str:
    """Per operator: candidates, choice, bytes in and own, why; then the totals."""
    g, out = result.graph, result.outcome
    proof = "proven optimal" if out.proven else f"best found, not proven ({out.explored:,} nodes)"
    if out.method == "propagation":
        proof = "greedy from the fixed operators and the input"
    lines = [_fit(f"{g.name}: {g.title}", WIDTH),
             f"{counted(result.devices, 'device')}, objective {result.objective.kind}: {out.method}, {proof}",
             "in B: bytes the busiest rank receives redistributing inputs; own B: in own collectives"]
    back = result.backward
    if back:
        lines.append("bwd B: in the backward (gradients' reverse moves, weight gradients' sums)")
    head = ("op", "cands", "strategy", "in B", "own B") + (("bwd B",) if back else ()) + ("why",)
    rows = []
    for i, op in enumerate(result.ops):
        cands = f"{op.considered}" + (f"-{op.ruled_out}" if op.ruled_out else "")
        rows.append((op.name, cands, op.candidate.text, _b(op.in_bytes), _b(op.own_bytes))
                    + ((_b(back[i].bytes_per_rank),) if back else ()) + (op.why,))
    n = len(head) - 1
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(n)]
    widths[2] = min(widths[2], 30)
    room = WIDTH - sum(widths) - 2 * n
    for r in [head] + rows:
        cells = [_fit(c, w).rjust(w) if i not in (0, 2) else _fit(c, w).ljust(w)
                 for i, (c, w) in enumerate(zip(r[:n], widths))]
        lines.append("  ".join(cells + [_fit(r[n], max(room, 10))]).rstrip())
    lines += _totals(result)
    return "\n".join(lines)


def _totals(result: "Result") -> list[str]:
    total, hand = result.total_bytes_per_rank, result.hand_written_total_bytes_per_rank
    line = f"total {_b(total)} B/rank" + (" forward" if result.backward else "")
    lines = []
    if hand is not None:
        saved = hand - total
        share = f" ({100 * saved / hand:.1f}%)" if hand else ""
        line += f"; hand-written {_b(hand)} B/rank; saves {_b(saved)} B{share}"
    lines.append(line)
    if result.backward:
        bwd, hand_bwd = result.backward_bytes_per_rank, result.hand_written_backward_bytes_per_rank
        line = f"training {_b(total + bwd)} B/rank = fwd {_b(total)} + bwd {_b(bwd)}"
        head = [line]
        if hand is not None and hand_bwd is not None:
            theirs = f"hand-written {_b(hand + hand_bwd)} = {_b(hand)} + {_b(hand_bwd)}"
            both = f"{line}; {theirs}"
            head = [both] if len(both) <= WIDTH else [line, f"{theirs} B/rank"]
        lines = [_fit(text, WIDTH) for text in head] + lines
    lines.append(f"propagation (MindSpore's) from the input and fixed operators: "
                 f"{_b(result.propagation_bytes)} B/rank" + (" forward" if result.backward else ""))
    comm = sum(op.comm_seconds for op in result.ops)
    compute = sum(op.compute_seconds for op in result.ops)
    lines.append(f"modelled time {1e3 * (comm + compute):.3g} ms: communication {1e3 * comm:.3g} ms "
                 f"+ compute {1e3 * compute:.3g} ms at {result.objective.flops_per_s / 1e9:.3g} GFLOP/s")
    if any(op.ruled_out for op in result.ops):
        lines.append("cands N-M: N enumerated, M over the memory limit")
    for k, (nbytes, value, changes) in enumerate(result.runners_up, 1):
        what = f"{_b(int(value))} B/rank training (search's price)" if result.backward else \
            f"{_b(nbytes)} B/rank"
        lines.append(_fit(f"runner-up {k}: {what} with " + ("; ".join(changes) or "-"), WIDTH))
    return lines


def result_json(result: "Result") -> dict:
    """The `spmdsim autoshard --json` object."""
    def ops(reports) -> list:
        return [{
            "name": op.name,
            "kind": op.kind,
            "strategy": op.candidate.text,
            "candidates": op.considered,
            "ruled_out_by_memory": op.ruled_out,
            "bytes_per_rank": op.bytes_per_rank,
            "redistribution_bytes_per_rank": op.in_bytes,
            "own_bytes_per_rank": op.own_bytes,
            "own_collectives": list(op.candidate.collectives()),
            "inputs": [str(t) for t in op.candidate.inputs],
            "out": str(op.candidate.out),
            "memory_bytes_per_rank": op.candidate.memory,
            "seconds": op.seconds,
            "why": op.why,
            "hops": [p.to_json() for p in op.hops],
        } for op in reports]

    def with_backward(rows: list, back) -> list:
        for row, b in zip(rows, back or ()):
            row["backward_bytes_per_rank"] = b.bytes_per_rank
        return rows

    out = result.outcome
    return {
        "network": result.graph.name,
        "devices": result.devices,
        "objective": result.objective.kind,
        "method": out.method,
        "proven_optimal": out.proven,
        "explored": out.explored,
        "training": result.objective.training,
        "operators": with_backward(ops(result.ops), result.backward),
        "total_bytes_per_rank": result.total_bytes_per_rank,
        "hand_written_total_bytes_per_rank": result.hand_written_total_bytes_per_rank,
        "hand_written": None if result.hand_ops is None else with_backward(ops(result.hand_ops),
                                                                           result.hand_backward),
        "backward_bytes_per_rank": result.backward_bytes_per_rank if result.backward else None,
        "hand_written_backward_bytes_per_rank": result.hand_written_backward_bytes_per_rank,
        "propagation_total_bytes_per_rank": result.propagation_bytes,
        "total_seconds": result.total_seconds,
        "flops_per_s": result.objective.flops_per_s,
        "runners_up": [{"total_bytes_per_rank": b, "objective_value": v, "changes": list(c)}
                       for b, v, c in result.runners_up],
    }
