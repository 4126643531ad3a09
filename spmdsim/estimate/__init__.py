"""At cluster scale: one rank's memory, FLOPs and bytes from the dry run of the real training step,
and its predicted step time on a described machine (docs/estimate.md).

Pure modules: `records` (the ledger's rows), `machine` (machine files), `steptime` (seconds from
the rows); `ledger` runs the dry run that fills them.
"""
