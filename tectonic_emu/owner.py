"""One owner per cluster: an exclusive lock with liveness on ``DIR/owner.lock``.

The process that owns a cluster holds ``fcntl.flock(LOCK_EX)`` on the lock file for as long
as it owns it: an embedded ``Cluster.open`` for the life of its ``async with`` block, the
``tectonic-emu serve`` supervisor for its life. The kernel drops the lock when the process
dies, even by SIGKILL, so a dead owner never holds a cluster (a stale ``serve.json`` no longer
decides anything). The holder writes who it is into the file (pid, host, since when, mode),
and a process refused the lock reads that to say who holds the cluster.

Within one process the lock is re-entrant: nested or concurrent opens of one cluster share
the hold (one process is one owner). The file descriptor is close-on-exec, so node processes
started by the supervisor do not inherit the hold. Served *clients* take no lock: they reach
the nodes the owner serves.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from tectonic_emu.config import ClusterConfig
from tectonic_emu.errors import ClusterBusyError
from tectonic_emu.nodectl import is_served

OWNER_FILE = "owner.lock"
Mode = Literal["embedded", "served"]


@dataclass(frozen=True, slots=True)
class Holder:
    """Who owns a cluster."""

    pid: int
    hostname: str
    since: float
    mode: str  # "embedded" or "served"

    def describe(self) -> str:
        """``pid 1234 on host (embedded, since 2026-12-01 23:15:02 UTC)``."""
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on {self.hostname} ({self.mode}, since {since})"


class Ownership:
    """A hold on a cluster's lock; ``release`` once per ``claim`` that returned it."""

    def __init__(self, path: Path, fd: int, holder: Holder) -> None:
        self.path = path
        self.fd = fd
        self.holder = holder
        self.count = 1

    @property
    def mode(self) -> str:
        return self.holder.mode

    def release(self) -> None:
        """Give up this hold; the lock goes when the last hold of the process does."""
        with _registry_lock:
            self.count -= 1
            if self.count > 0:
                return
            _held.pop(str(self.path), None)
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the descriptor drops the flock


_registry_lock = threading.Lock()
_held: dict[str, Ownership] = {}  # lock path -> this process's hold


def _lock_path(root: Path) -> Path:
    return Path(os.path.realpath(root)) / OWNER_FILE


def read_holder(root: Path, *, wait: float = 2.0) -> Holder | None:
    """Who the lock file names (whether or not it is still held), or None when it names
    nobody. Waits up to ``wait`` seconds for a holder that has just taken the lock to write
    its name."""
    deadline = time.monotonic() + wait
    while True:
        try:
            data = json.loads(_lock_path(root).read_text())
            return Holder(
                int(data["pid"]), str(data["hostname"]), float(data["since"]), data["mode"]
            )
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)


def claim(root: Path, mode: Mode) -> Ownership | Holder:
    """Take the lock of the cluster at ``root`` for this process, as ``mode``.

    Returns the hold, or the ``Holder`` when another process owns the cluster (or this one
    does as a supervisor and an embedded open asks: the caller is then a served client).
    Raises ClusterBusyError when this process already owns it in the other mode as an
    embedded owner (a supervisor cannot start under it), OSError when the file cannot be
    opened."""
    path = _lock_path(root)
    with _registry_lock:
        mine = _held.get(str(path))
        if mine is not None and mine.holder.pid == os.getpid():
            if mine.mode == mode:
                mine.count += 1
                return mine
            if mine.mode == "served":
                return mine.holder
            raise ClusterBusyError(
                f"this process owns the cluster embedded ({mine.holder.describe()}): "
                "close it before serving",
                str(root),
            )
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return read_holder(root) or Holder(0, "?", 0.0, "unknown")
        except BaseException:
            os.close(fd)
            raise
        holder = Holder(os.getpid(), socket.gethostname(), time.time(), mode)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(asdict(holder)) + "\n").encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        own = Ownership(path, fd, holder)
        _held[str(path)] = own
        return own


def live_holder(root: Path) -> Holder | None:
    """Who owns the cluster at ``root`` now, or None when nobody does (the lock is free; a
    probe that takes and drops it at once). A process's own hold counts too."""
    path = _lock_path(root)
    with _registry_lock:
        mine = _held.get(str(path))
        if mine is not None and mine.holder.pid == os.getpid():
            return mine.holder
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_holder(root) or Holder(0, "?", 0.0, "unknown")
    finally:
        os.close(fd)  # drops the probe's shared lock, if it got one
    return None


def busy_error(root: Path, holder: Holder) -> ClusterBusyError:
    """The one-line refusal of a second owner, naming the holder and what to do."""
    if holder.mode == "served":
        return ClusterBusyError(
            f"the cluster is already served by {holder.describe()}: use it as a client, or "
            "stop it first (`tectonic-emu serve --stop`)",
            str(root),
        )
    who = holder.describe() if holder.mode == "embedded" else "another process"
    return ClusterBusyError(
        f"the cluster is owned by {who}; one process owns a cluster: wait for it, or "
        "serve the cluster (`tectonic-emu serve`) for many processes to share it",
        str(root),
    )


def take_ownership(root: Path, config: ClusterConfig) -> tuple[Ownership | None, bool]:
    """For ``Cluster.open``: this process's hold (None for a served client) and whether the
    cluster is served.

    A ``serve`` holding the lock makes this process its client; an embedded owner elsewhere
    is ClusterBusyError. With the lock free, node processes still alive (started by hand, or
    a killed supervisor's, which die with it in a moment) make it a client too: they own the
    node directories until they exit. A cluster whose nodes have configured addresses runs
    them on their own hosts: no process here owns it."""
    if config.node_addresses:
        return None, True
    got = claim(root, "embedded")
    if not isinstance(got, Ownership):
        if got.mode != "served":
            raise busy_error(root, got)
        return None, True
    if is_served(root, config.nodes):
        got.release()
        return None, True
    return got, False


__all__ = [
    "OWNER_FILE",
    "Holder",
    "Ownership",
    "busy_error",
    "claim",
    "live_holder",
    "read_holder",
    "take_ownership",
]
