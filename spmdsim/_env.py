"""Settings read from the environment at import time; standard library only.

A setting read while ``import spmdsim`` runs cannot raise (a traceback before
any command starts, on every rank). A value these helpers do not understand
gets one warning line on the first rank, naming the variable, its value and
what is accepted, and the default is used. Settings read later, when a
command runs (SPMDSIM_WAIT, SPMDSIM_WATCHDOG, SPMDSIM_CHECK), raise an
SpmdsimError instead.
"""
from __future__ import annotations

import math
import os
import sys

__all__ = ["SWITCH_VALUES", "launcher_rank", "warn", "env_switch", "env_number"]

#: Accepted spellings of a switch (as runtime.debug reads SPMDSIM_CHECK).
SWITCH_VALUES = {"1": True, "true": True, "yes": True, "on": True,
                 "0": False, "false": False, "no": False, "off": False}

#: Where launchers put a process's rank (MPICH/Hydra and Slurm's PMI, Open MPI, PMIx).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launcher_rank() -> int:
    """This process's rank as the MPI launcher set it in the environment (0 when not launched)."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


_WARNED: set[str] = set()


def warn(message: str) -> None:
    """``spmdsim: warning: <message>`` on stderr once, from the first rank only (every rank reads the same)."""
    if launcher_rank() == 0 and message not in _WARNED:
        _WARNED.add(message)
        print(f"spmdsim: warning: {message}", file=sys.stderr, flush=True)


def env_switch(name: str, default: bool) -> bool:
    """The on/off setting `name`; unset or empty gives `default`, an unknown value warns and gives it."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if value.lower() in SWITCH_VALUES:
        return SWITCH_VALUES[value.lower()]
    warn(f"{name}={value!r} is not a switch; expected 1/0, true/false, yes/no or on/off; "
         f"using {int(default)} ({'on' if default else 'off'})")
    return default


def env_number(name: str, default: float, unit: str) -> float:
    """The finite number >= 0 `name` (in `unit`); unset gives `default`, a bad value warns and gives it."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if 0 <= number < math.inf:
        return number
    warn(f"{name}={value!r} is not a finite number of {unit} >= 0; using {default:g}")
    return default
