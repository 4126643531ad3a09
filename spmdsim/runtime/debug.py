"""Debug mode for collectives: the settings of a divergence guard and a watchdog, and the running rank's
call counter (docs/explanation/reliability.md); spmdsim.runtime.debug_calls does their work at each collective.

Divergence guard: ``SPMDSIM_CHECK=1`` or ``configure(check=True)``; each collective's call is compared
across its group first. Watchdog: ``SPMDSIM_WATCHDOG=seconds`` or ``configure(watchdog=...)`` (under the
guard, CHECK_WATCHDOG_S unless set); a collective waited on past it ends the job, naming who is missing.

The settings are the running rank's (`Hooks`, ``current().hooks``): an MPI
rank's are its process's (`HOOKS`); a simulated rank starts from a copy of
the process's made when simulate() starts, and configure() on it changes that
rank's alone, so a simulation beside it (another thread's simulate()) and the
process keep theirs.

The sequence number (`next_seq`, ``current().seq``) counts the collectives this rank issued; the guard
compares it (spmdsim.runtime.debug_calls).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ..errors import SpmdsimError
from ..base.context import PROCESS, current as _context

__all__ = ["Hooks", "HOOKS", "configure", "check_enabled", "watchdog_seconds", "quiet", "next_seq", "current_seq",
           "CHECK_WATCHDOG_S", "add_cli_arguments", "configure_from_args", "MIN_WATCHDOG_S", "MAX_WATCHDOG_S",
           "watchdog_setting"]

#: The shortest watchdog: it reports a collective that never completes, and a healthy one on
#: oversubscribed ranks (8 on 2 cores) can take a good part of a second; a shorter limit would
#: abort correct programs naming a rank as missing that is only on its way.
MIN_WATCHDOG_S = 1.0
#: The longest watchdog: a week (a wait past threading.TIMEOUT_MAX, ~292 years, overflows the platform's time_t).
MAX_WATCHDOG_S = 7 * 24 * 3600.0


class Hooks:
    """One rank's debug settings: whether the divergence guard and the watchdog are on.

    The process has its own (`HOOKS`, the settings of an MPI rank or of a plain
    process); each simulated rank gets a copy of the process's when simulate()
    starts (spmdsim.runtime.sim.run), so configure() on a simulated rank changes that
    rank's and nothing beside it, as configure() on an MPI rank changes that
    process's. The running rank's are ``current().hooks`` (spmdsim.base.context).

    ``quiet``: True when neither hook is on, and ``watched``: True when the watchdog alone is (no
    guard), each one attribute read for hot paths (worked out on first read and after configure());
    the rest are the settings (None: read the environment on first use). The collectives' call
    counter is the running rank's (``current().seq``).
    """

    __slots__ = ("check", "watchdog", "watchdog_read", "watchdog_set", "quiet", "watched", "world")

    def __init__(self, like: Optional["Hooks"] = None) -> None:
        """Settings read from the environment on first use, or, given `like`, a copy of its settings."""
        self.check: Optional[bool] = None if like is None else like.check
        self.watchdog: Optional[float] = None if like is None else like.watchdog
        self.watchdog_read = False if like is None else like.watchdog_read
        # configure() chose the watchdog: the environment and the default step aside
        self.watchdog_set = False if like is None else like.watchdog_set
        # A simulated rank's: its simulation's World (spmdsim.runtime.sim.engine), whose waits the watchdog then
        # times (`World.watched`, set by configure()); None for the process's and a copy (_reset keeps it)
        self.world: Any = getattr(self, "world", None) if like is None else None
        # `quiet` and `watched` stay unset until first read (__getattr__)

    def __getattr__(self, name: str) -> Any:
        # Reached only for an unset slot: `quiet` and `watched` are worked out once, then plain reads.
        if name == "quiet":
            self.quiet = not self.check_enabled() and self.watchdog_seconds() is None
            return self.quiet
        if name == "watched":
            self.watched = not self.check_enabled() and self.watchdog_seconds() is not None
            return self.watched
        raise AttributeError(name)

    def check_enabled(self) -> bool:
        """Whether collectives compare fingerprints first (SPMDSIM_CHECK)."""
        if self.check is None:
            self.check = _flag("SPMDSIM_CHECK")
        return self.check

    def watchdog_seconds(self) -> Optional[float]:
        """The watchdog's timeout in seconds, or None when it is off (SPMDSIM_WATCHDOG)."""
        if not self.watchdog_read:
            raw = os.environ.get("SPMDSIM_WATCHDOG")
            if raw is None or not raw.strip():
                self.watchdog = CHECK_WATCHDOG_S if self.check_enabled() else None
            else:
                self.watchdog = watchdog_setting(raw, "SPMDSIM_WATCHDOG=")
            self.watchdog_read = True
        return self.watchdog

    def configure(self, check: Optional[bool], watchdog: Any) -> None:
        """configure()'s work on these settings (its arguments as it takes them)."""
        if check is not None:
            self.check = bool(check)
            if not self.watchdog_set:
                self.watchdog_read = False  # its default follows the guard
        if watchdog != "keep":
            self.watchdog = watchdog_setting(watchdog, "watchdog=")
            self.watchdog_read = self.watchdog_set = True
        if self.world is not None:
            self.world.watched = True  # its waits read this rank's watchdog from now on
        self.forget_quiet()

    def forget_quiet(self) -> None:
        """Work `quiet` and `watched` out again on their next read (the settings changed)."""
        for name in ("quiet", "watched"):
            try:
                delattr(self, name)
            except AttributeError:
                pass


#: The process's settings (an MPI rank's, or a plain process's); a simulated rank has its own.
HOOKS = PROCESS.hooks = Hooks()


def _reset() -> None:
    """The running rank's settings back to 'read the environment on first use', its counter to 0 (tests)."""
    context = _context()
    context.hooks.__init__()
    context.seq = 0
    context.hooks.forget_quiet()


#: The watchdog the divergence guard turns on when SPMDSIM_WATCHDOG is unset (a rank that skips a
#: call would leave the others waiting forever); long enough for a slow local step on a loaded laptop.
CHECK_WATCHDOG_S = 300.0


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise SpmdsimError(f"{name}={raw!r} is not a switch; expected 1/0, true/false, yes/no or on/off")


def watchdog_setting(value: Any, what: str) -> Optional[float]:
    """The watchdog's seconds from a setting named `what` (None, "", "0" and "off": no watchdog): an
    option ("--watchdog"), or a variable or keyword said with its value ("SPMDSIM_WATCHDOG=").

    Raises SpmdsimError for anything else that is not a number of seconds from MIN_WATCHDOG_S to
    MAX_WATCHDOG_S.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "none")):
        return None
    expected = f"expected seconds from {MIN_WATCHDOG_S:g} to {MAX_WATCHDOG_S:,.0f}, or 0 for off"
    what = f"{what}{value!r}" if what.endswith("=") else f"{what} {value!r}"
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SpmdsimError(f"{what} is not a number of seconds; {expected}") from None
    if seconds == 0:
        return None
    if not 0 < seconds < float("inf"):
        raise SpmdsimError(f"{what} must be a positive, finite number of seconds; {expected}")
    if seconds < MIN_WATCHDOG_S:
        raise SpmdsimError(f"{what} is below the watchdog's minimum of {MIN_WATCHDOG_S:g} s (a healthy "
                           "collective on oversubscribed ranks can take most of a second); expected seconds "
                           f">= {MIN_WATCHDOG_S:g}, or 0 for off")
    if seconds > MAX_WATCHDOG_S:
        raise SpmdsimError(f"{what} is above the watchdog's maximum of {MAX_WATCHDOG_S:,.0f} s (a week); "
                           f"{expected}")
    return seconds


def configure(check: Optional[bool] = None, watchdog: Any = "keep") -> None:
    """Turn the divergence guard on/off and set the watchdog (seconds; None or 0 = off), on every rank alike.

    Arguments left out keep the current setting (the environment's until first changed).
    Called on a simulated rank it sets that rank's settings (every rank of the
    simulation calls it, as every MPI rank would), else the process's: a
    simulation beside it, or started later from its copy, is not changed.
    """
    _context().hooks.configure(check, watchdog)


def add_cli_arguments(parser: Any) -> None:
    """Add ``--check`` and ``--watchdog SECONDS`` to an argparse parser (MPI subcommands)."""
    parser.add_argument("--check", action="store_true",
                        help="before each collective, compare the call across its group and stop "
                             "with a message naming the rank that differs (SPMDSIM_CHECK=1)")
    parser.add_argument("--watchdog", metavar="SECONDS", default=None,
                        help="abort the job when a collective has not completed after SECONDS "
                             "(SPMDSIM_WATCHDOG; default off, 300 with --check; 0 = off)")


def configure_from_args(args: Any) -> None:
    """Apply ``--check``/``--watchdog``; call it on every rank inside the guard (a bad value
    then raises the same SpmdsimError everywhere and prints once)."""
    watchdog = getattr(args, "watchdog", None)
    configure(check=True if getattr(args, "check", False) else None,
              watchdog="keep" if watchdog is None else watchdog_setting(watchdog, "--watchdog"))


def check_enabled() -> bool:
    """Whether the running rank's collectives compare fingerprints first (SPMDSIM_CHECK)."""
    return _context().hooks.check_enabled()


def watchdog_seconds() -> Optional[float]:
    """The running rank's watchdog timeout in seconds, or None when it is off (SPMDSIM_WATCHDOG).

    Unset: off, or CHECK_WATCHDOG_S with the divergence guard; 0 turns it off even then.
    """
    return _context().hooks.watchdog_seconds()


def quiet() -> bool:
    """True when neither the divergence guard nor the watchdog is on for the running rank (its ``hooks.quiet``)."""
    return _context().hooks.quiet


def next_seq() -> int:
    """Count one more collective and return its sequence number (1-based)."""
    context = _context()
    context.seq += 1
    return context.seq


def current_seq() -> int:
    return _context().seq
