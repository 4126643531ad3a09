"""Pipeline parallelism, the pure half: schedules as per-stage programs, their check, unit-cost timelines,
bubble and in-flight figures, and pictures (docs/howto/pipelines.md).

    >>> from spmdsim.programs.pipeline import build, timeline
    >>> timeline(build("1f1b", 4, 8)).bubble
    Fraction(3, 11)
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from ...errors import PipelineError
from .check import check
from .parse import parse
from .picture import plot, render
from .records import MAX_PAIRS, Compute, Post, Recv, Schedule, Send
from .schedule import SCHEDULES, build, gpipe, interleaved, one_f_one_b
from .timeline import Timeline, bubble_formula, in_flight, timeline

__all__ = ["Compute", "Send", "Recv", "Post", "Schedule", "PipelineError", "SCHEDULES", "MAX_PAIRS",
           "build", "gpipe", "one_f_one_b", "interleaved", "parse", "check",
           "Timeline", "timeline", "bubble_formula", "in_flight", "render", "plot"]

# Its modules by name, loaded on first use: spmdsim.programs.pipeline.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
