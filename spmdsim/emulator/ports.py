"""Client-server connections on simulated ranks: ``MPI.Open_port``, ``Intracomm.Accept`` and ``Connect``, and the
names ``MPI.Publish_name`` gives ports (docs/reference/emulator.md, "Spawn, Accept and Connect").

    port = MPI.Open_port()                    # a server's root; clients learn it (a message, Lookup_name)
    inter = comm.Accept(port, root=0)         # the server's group: collective over comm
    inter = comm.Connect(port, root=0)        # a client's group: collective over its comm

A port is a name in the run's table of ports (`Ports`, one per simulated world). The root of an Accept and the
root of a Connect on the same open port meet there, whichever comes first waiting for the other (a wait the
deadlock report names: "Accept on port 'spmdsim-port-1' (no Connect has come)"); then each broadcasts the new
intercommunicator's groups over its own communicator, and every member gets the intercommunicator whose remote
group is the other side (the groups made as a Spawn's: spmdsim.emulator.spawn). Published names are the run's
too: Lookup_name finds what any rank published. ``MPI.Comm.Join(fd)`` joins the two ranks at the ends of a
connected socket so.
"""
from __future__ import annotations

import os
from typing import Any

from ..base import context as _local
from ..runtime.sim._mpi import named_error as _error
from ..runtime.sim.waiting import _Waiting, ranks_text
from .comm import SimComm, self_comm
from .spawn import intercomm_groups, intercomm_side

__all__ = ["Ports", "open_port", "close_port", "publish_name", "unpublish_name", "lookup_name", "accept",
           "connect", "join"]


class _Meeting:
    """What a root waits for at a port: the other side's root (`_what` for the deadlock report); once met,
    `groups` (spmdsim.emulator.spawn's `intercomm_groups`, the lower root's side first) and whether its side is
    `first`."""

    __slots__ = ("kind", "group", "call", "port", "rank", "members", "groups", "first")

    def __init__(self, call: str, port: str, rank: int, members: tuple) -> None:
        self.kind, self.group, self.call, self.port = "port", None, call, port
        self.rank, self.members = rank, members
        self.groups: Any = None
        self.first = True

    def _what(self) -> str:
        other = "Connect" if self.call == "Accept" else "Accept"
        return f"{self.call} on port {self.port!r} (no {other} has come)"


class Ports:
    """One simulated run's open ports (name -> the roots waiting there, by call) and published names."""

    def __init__(self) -> None:
        self.opened = 0
        self.waiting: dict[str, dict[str, list]] = {}  # port -> {"Accept": [_Meeting], "Connect": [...]}
        self.names: dict[str, str] = {}  # service -> port


def _ports() -> tuple:
    """(the calling rank's world, its Ports), made on first use."""
    state = _local.simulated()
    world = state.comm._group.world
    with world.lock:
        ports = world.ports
        if ports is None:
            ports = world.ports = Ports()
    return world, ports


def open_port(info: Any = None) -> str:
    """MPI.Open_port: a new port name, open until Close_port."""
    world, ports = _ports()
    with world.lock:
        ports.opened += 1
        name = f"spmdsim-port-{ports.opened}"
        ports.waiting[name] = {"Accept": [], "Connect": []}
    return name


def close_port(port_name: str) -> None:
    world, ports = _ports()
    with world.lock:
        if ports.waiting.pop(str(port_name), None) is None:
            raise _error("ERR_PORT", f"Close_port: port {port_name!r} is not open")


def publish_name(service_name: str, port_name: str, info: Any = None) -> None:
    world, ports = _ports()
    with world.lock:
        if str(service_name) in ports.names:
            raise _error("ERR_SERVICE", f"Publish_name: service {service_name!r} is published already")
        ports.names[str(service_name)] = str(port_name)


def unpublish_name(service_name: str, port_name: str, info: Any = None) -> None:
    world, ports = _ports()
    with world.lock:
        if ports.names.get(str(service_name)) != str(port_name):
            raise _error("ERR_SERVICE", f"Unpublish_name: service {service_name!r} is not published with port "
                                        f"{port_name!r}")
        del ports.names[str(service_name)]


def lookup_name(service_name: str, info: Any = None) -> str:
    world, ports = _ports()
    with world.lock:
        found = ports.names.get(str(service_name))
    if found is None:
        raise _error("ERR_NAME", f"Lookup_name: no service {service_name!r} is published")
    return found


def accept(cls: type, comm: SimComm, port_name: Any, info: Any = None, root: int = 0) -> Any:
    """Intracomm.Accept of `comm`: the intercommunicator to the group that Connects to `port_name` (the root's)."""
    return _joined(cls, comm, "Accept", port_name, root)


def connect(cls: type, comm: SimComm, port_name: Any, info: Any = None, root: int = 0) -> Any:
    """Intracomm.Connect of `comm`: the intercommunicator to the group that Accepts on `port_name` (the root's)."""
    return _joined(cls, comm, "Connect", port_name, root)


def join(cls: type, fd: int) -> Any:
    """MPI.Comm.Join(fd): the intercommunicator of this rank and the rank at the other end of the connected
    socket `fd`, each a group of one. Each writes its world rank to the socket and reads the other's; the lower
    one Accepts and the other Connects at a port of the pair's."""
    state = _local.simulated()
    me = state.comm._group.members[state.comm._me]
    world, ports = _ports()
    got = b""
    with world.stepped_aside(state.rank):  # (blocked on the socket, it computes nothing: its run slot is lent)
        os.write(fd, f"{me}\n".encode())
        while not got.endswith(b"\n"):
            more = os.read(fd, 64)
            if not more:
                raise _error("ERR_OTHER", f"Join: the socket (fd {fd}) closed before the other side wrote its rank")
            got += more
    other = int(got)
    port = f"spmdsim-join-{min(me, other)}-{max(me, other)}"
    with world.lock:
        ports.waiting.setdefault(port, {"Accept": [], "Connect": []})
    return _joined(cls, self_comm(state), "Accept" if me < other else "Connect", port, 0)


def _joined(cls: type, comm: SimComm, call: str, port_name: Any, root: Any) -> Any:
    """The root meets the other side's root at the port (`_meet`), then broadcasts the groups over `comm`; every
    member's side of the intercommunicator."""
    comm._live_handle()
    root = comm._root(root, call)
    found: Any = None
    if comm._me == root:
        try:
            found = _meet(comm, call, str(port_name))
        except Exception as exc:  # noqa: BLE001 - MPI's error: every member raises it
            found = exc

    def complete(slot: Any) -> None:
        slot.shared = slot.calls[root].data

    slot = comm._enter(call.lower(), (call.lower(), root), found, complete)
    if isinstance(slot.shared, BaseException):
        raise slot.shared
    groups, first = slot.shared
    return comm._inherits(intercomm_side(cls, groups, comm._me, first))


def _meet(comm: SimComm, call: str, port: str) -> tuple:
    """The root's part: with another side's root waiting at `port`, make the groups and let it go; else wait
    there until one comes. (groups, whether this side is the first)."""
    world, ports = _ports()
    rank = comm.world_rank
    mine = _Meeting(call, port, rank, comm._group.members)
    with world.lock:
        queues = ports.waiting.get(port)
        if queues is None:
            raise _error("ERR_PORT", f"{call}: port {port!r} is not open (MPI.Open_port gives one)")
        other = queues["Connect" if call == "Accept" else "Accept"]
        if other:
            theirs = other.pop(0)
            first, second = (mine, theirs) if rank < theirs.rank else (theirs, mine)
            text = f"the intercommunicator of {ranks_text(first.members)} and {ranks_text(second.members)}"
            groups = intercomm_groups(world, first.members, second.members, text)
            theirs.groups, theirs.first = groups, theirs is first
            world.release(theirs.rank, theirs)
            return groups, mine is first
        queues[call].append(mine)
        world.check(rank)
        world.wait(rank, _Waiting(mine._what(), None, None, token=mine))
        return mine.groups, mine.first
