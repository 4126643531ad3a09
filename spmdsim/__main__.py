"""`python -m spmdsim` is the `spmdsim` console script."""
from .tools.cli.console import console

if __name__ == "__main__":  # not when a worker process (multiprocessing's "spawn") imports this module again
    raise SystemExit(console())
