"""Demo scenarios: named operator runs on generated data, checked against references.

`registry` holds the scenario registry and runner; `jobs` the builders shared
with `spmdsim run`; every other public module (``ops``, ``networks``, ``training``)
registers scenarios with ``@scenario(...)`` and is found automatically.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .registry import Context, Job, Outcome, Scenario, run_job, run_scenario, scenario, scenarios

__all__ = ["Context", "Job", "Outcome", "Scenario", "scenario", "scenarios", "run_job",
           "run_scenario"]

# Its modules by name, loaded on first use: spmdsim.tools.demo.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
