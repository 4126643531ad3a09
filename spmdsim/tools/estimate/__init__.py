"""At cluster scale: one rank's memory, FLOPs and bytes from the dry run of the real training step,
and its predicted step time on a described machine (docs/howto/estimate.md).

Pure modules: `records` (the ledger's rows), `machine` (machine files), `steptime` (seconds from
the rows); `ledger` runs the dry run that fills them.
"""
from __future__ import annotations

from ..._lazy import modules_by_name

# Its modules by name, loaded on first use: spmdsim.tools.estimate.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
