"""Command-line interface: one module per subcommand, wired in `main.py`."""
from __future__ import annotations

from ..._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.tools.cli.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
