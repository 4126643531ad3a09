"""The Plan value: steps plus their per-rank byte counts and the lower bound."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ...layouts.layout import TensorLayout
from .steps import Step

__all__ = ["Plan"]


@dataclass(frozen=True)
class Plan:
    """Steps that turn `source` into `target` for one global shape and dtype.

    Attributes:
        steps: the steps in order (on the common refined mesh when the meshes differ), between the layouts
            without their mesh axes of size 1 (the same blocks; none on those axes alone).
        lower_bound: per rank, the fewest bytes any plan must deliver to it.
    """

    source: TensorLayout
    target: TensorLayout
    shape: tuple[int, ...]
    dtype: str
    steps: tuple[Step, ...]
    lower_bound: tuple[int, ...]

    @property
    def num_ranks(self) -> int:
        return self.source.layout.num_devices

    @cached_property
    def bytes_received(self) -> tuple[int, ...]:
        """Per rank, the bytes received over all steps."""
        return _per_rank([s.bytes_received for s in self.steps], self.num_ranks)

    @cached_property
    def bytes_sent(self) -> tuple[int, ...]:
        return _per_rank([s.bytes_sent for s in self.steps], self.num_ranks)

    @property
    def max_bytes_received(self) -> int:
        return max(self.bytes_received, default=0)

    @property
    def max_lower_bound(self) -> int:
        return max(self.lower_bound, default=0)

    @property
    def meets_lower_bound(self) -> bool:
        """Whether every rank receives exactly its lower bound."""
        return self.bytes_received == self.lower_bound

    def to_json(self) -> dict:
        """The `spmdsim plan --json` object (per-rank figures are maxima over ranks)."""
        return {
            "source": str(self.source),
            "target": str(self.target),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "steps": [{"op": s.op, "label": str(s), "axes": list(s.axes), "bytes_sent_per_rank": s.max_bytes_sent,
                       "bytes_received_per_rank": s.max_bytes_received} for s in self.steps],
            "bytes_received_per_rank": self.max_bytes_received,
            "lower_bound_bytes_received_per_rank": self.max_lower_bound,
        }

    def __str__(self) -> str:
        lines = [f"{self.source} -> {self.target}, shape {self.shape} {self.dtype}"]
        lines += [f"  {i}. {s}" for i, s in enumerate(self.steps, 1)]
        return "\n".join(lines)


def _per_rank(columns: list, num_ranks: int) -> tuple[int, ...]:
    """Per rank, the sum of its entry in every column (exact Python ints)."""
    if not columns:
        return (0,) * num_ranks
    return tuple(map(sum, zip(*columns))) if len(columns) > 1 else tuple(columns[0])
