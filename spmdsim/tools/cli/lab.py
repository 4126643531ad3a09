"""`spmdsim lab`: its parser and code live in spmdsim.tools.lab.cli."""
from __future__ import annotations

from ..lab.cli import register

__all__ = ["register"]
