"""`python -m spmdsim` is the `spmdsim` console script."""
from .cli.main import main

raise SystemExit(main())
