"""spmdsim's lab grader: exercises students solve in code, checked on simulated ranks.

Each exercise is one file (spmdsim/tools/lab/exercises/NN_name.py: statement, signature, case
generator, rules, reference solution). A submission runs in a child process of its own, under limits
of time and memory, on every rank count the exercise allows; the verdict names the first rank and
slice that differ, a deadlock's calls and lines, a forbidden call's line, bytes against the optimum.
The command is `spmdsim lab` (spmdsim.tools.lab.cli); docs/howto/grade-exercises.md shows both sides.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .exercise import Exercise, LabError, find_exercise, load_exercises

__all__ = ["Exercise", "LabError", "find_exercise", "load_exercises"]

# Its modules by name, loaded on first use: spmdsim.tools.lab.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
