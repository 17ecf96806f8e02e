"""Who may use a cluster's node directories: a lock with liveness on ``DIR/owner.lock``.

Owners hold ``fcntl.flock`` on the lock file for as long as they own the cluster, and the
kernel drops it when the process dies, even by SIGKILL: a dead owner never holds a cluster,
and a stale ``serve.json`` no longer decides anything. Three modes:

- ``served``: the ``tectonic-emu serve`` supervisor, for its life, exclusively. Its node
  processes use the directories; everyone else is its client over TCP and takes no lock.
- ``embedded``: an embedded ``Cluster.open``, for its ``async with`` block, *shared* with
  other embedded processes of this host (ranks of one job, a mount beside the command line:
  SQLite arbitrates the metadata, chunk ids never collide), never with a ``serve``.
- ``exclusive``: an embedded open that must have the cluster to itself (``meta restore``,
  ``meta load``: they replace the metadata under everyone).

Each holder writes who it is (pid, host, since when, mode) to ``DIR/owners/HOST-PID.json``, and
a process refused the lock reads those to say who holds the cluster. Within one process the
hold is re-entrant. The descriptor is close-on-exec, so node processes started by the
supervisor do not inherit it.
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
from tectonic_emu.nodectl import is_local, is_served, pid_alive

OWNER_FILE = "owner.lock"
OWNERS_DIR = "owners"
Mode = Literal["embedded", "exclusive", "served"]


@dataclass(frozen=True, slots=True)
class Holder:
    """One process that holds a cluster."""

    pid: int
    hostname: str
    since: float
    mode: str  # "embedded", "exclusive" or "served"

    def describe(self) -> str:
        """``pid 1234 on host (embedded, since 2026-12-01 23:15:02 UTC)``."""
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on {self.hostname} ({self.mode}, since {since})"


class Ownership:
    """This process's hold on a cluster; ``release`` once per ``claim`` that returned it."""

    def __init__(self, root: Path, fd: int, holder: Holder) -> None:
        self.root = root
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
            _held.pop(str(self.root), None)
            with contextlib.suppress(OSError):
                _record(self.root, self.holder).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the descriptor drops the flock


_registry_lock = threading.Lock()
_held: dict[str, Ownership] = {}  # real cluster path -> this process's hold


def _record(root: Path, holder: Holder) -> Path:
    return root / OWNERS_DIR / f"{holder.hostname}-{holder.pid}.json"


def _alive(h: Holder) -> bool:
    return not is_local(h.hostname) or pid_alive(h.pid)


def holders(root: Path, *, wait: float = 2.0) -> list[Holder]:
    """The live processes the owner records of ``root`` name, oldest first. Waits up to
    ``wait`` seconds for one when there is none yet (a holder that has just taken the lock
    writes its record next)."""
    root = Path(os.path.realpath(root))
    deadline = time.monotonic() + wait
    while True:
        found = []
        with contextlib.suppress(OSError):
            for path in (root / OWNERS_DIR).glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    d = json.loads(path.read_text())
                    h = Holder(int(d["pid"]), str(d["hostname"]), float(d["since"]), d["mode"])
                    if _alive(h):
                        found.append(h)
        if found or time.monotonic() >= deadline:
            return sorted(found, key=lambda h: h.since)
        time.sleep(0.01)


def _same_process(mine: Ownership, mode: Mode, root: Path) -> Ownership | list[Holder]:
    if mine.mode == mode or (mine.mode == "exclusive" and mode == "embedded"):
        mine.count += 1
        return mine
    if mine.mode == "served" and mode == "embedded":
        return [mine.holder]  # the supervisor's own opens are its clients
    raise ClusterBusyError(
        f"this process holds the cluster ({mine.holder.describe()}): close it before "
        f"opening it {mode}",
        str(root),
    )


def claim(root: Path, mode: Mode) -> Ownership | list[Holder]:
    """Take the lock of the cluster at ``root`` for this process, as ``mode`` (shared for
    ``embedded``, exclusive otherwise).

    Returns the hold, or the holders that keep this process from it (an embedded open then
    is a served client if they are a ``serve``). Raises ClusterBusyError when this process
    holds the cluster in a mode that excludes ``mode``, OSError when the lock file cannot be
    opened."""
    root = Path(os.path.realpath(root))
    with _registry_lock:
        mine = _held.get(str(root))
        if mine is not None and mine.holder.pid == os.getpid():
            return _same_process(mine, mode, root)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(root / OWNER_FILE, flags, 0o644)
        try:
            kind = fcntl.LOCK_SH if mode == "embedded" else fcntl.LOCK_EX
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return holders(root) or [Holder(0, "?", 0.0, "unknown")]
        except BaseException:
            os.close(fd)
            raise
        holder = Holder(os.getpid(), socket.gethostname(), time.time(), mode)
        try:
            _write_record(root, holder, clear_others=mode != "embedded")
        except BaseException:
            os.close(fd)
            raise
        own = Ownership(root, fd, holder)
        _held[str(root)] = own
        return own


def _write_record(root: Path, holder: Holder, *, clear_others: bool) -> None:
    folder = root / OWNERS_DIR
    folder.mkdir(exist_ok=True)
    for stale in folder.glob("*.json"):
        # An exclusive holder is alone, so every other record is a dead process's; a shared
        # one clears only those whose process is gone.
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if not clear_others:
                d = json.loads(stale.read_text())
                if _alive(Holder(int(d["pid"]), str(d["hostname"]), 0.0, "")):
                    continue
            stale.unlink()
    path = _record(root, holder)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(holder)) + "\n")
    os.replace(tmp, path)


def live_holders(root: Path) -> list[Holder]:
    """Who holds the cluster at ``root`` now (empty when nobody does: a probe that takes
    the lock exclusively and drops it at once). This process's own hold counts too."""
    real = Path(os.path.realpath(root))
    with _registry_lock:
        mine = _held.get(str(real))
        if mine is not None and mine.holder.pid == os.getpid():
            return [mine.holder]
    try:
        fd = os.open(real / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return holders(real) or [Holder(0, "?", 0.0, "unknown")]
    finally:
        os.close(fd)  # drops the probe's lock, if it got it
    return []


def busy_error(root: Path, found: list[Holder]) -> ClusterBusyError:
    """The one-line refusal, naming the (first) holder and what to do."""
    first = found[0]
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    if first.mode == "served":
        return ClusterBusyError(
            f"the cluster is already served by {first.describe()}: use it as a client, or "
            "stop it first (`tectonic-emu serve --stop`)",
            str(root),
        )
    who = first.describe() if first.mode != "unknown" else "another process"
    if first.mode == "exclusive":
        return ClusterBusyError(
            f"the cluster is held exclusively by {who} (a metadata restore or load): wait for it",
            str(root),
        )
    return ClusterBusyError(
        f"the cluster is open embedded in {who}{more}: close it there first, or use the "
        "cluster through `tectonic-emu serve` for both",
        str(root),
    )


def take_ownership(
    root: Path, config: ClusterConfig, *, exclusive: bool = False
) -> tuple[Ownership | None, bool]:
    """For ``Cluster.open``: this process's hold (None for a served client) and whether the
    cluster is served.

    A ``serve`` holding the lock makes this process its client (``exclusive``: refused); an
    exclusive holder elsewhere, or with ``exclusive`` any embedded one, is ClusterBusyError.
    With the lock taken, node processes still alive (started by hand, or a killed
    supervisor's, which die with it in a moment) make this process their client too: they
    use the node directories until they exit. A cluster whose nodes have configured
    addresses runs them on their own hosts: no process here owns it."""
    if config.node_addresses:
        return None, True
    got = claim(root, "exclusive" if exclusive else "embedded")
    if not isinstance(got, Ownership):
        if exclusive or any(h.mode != "served" for h in got):
            raise busy_error(root, got)
        return None, True
    if is_served(root, config.nodes):
        got.release()
        return None, True
    return got, False


__all__ = [
    "OWNERS_DIR",
    "OWNER_FILE",
    "Holder",
    "Mode",
    "Ownership",
    "busy_error",
    "claim",
    "holders",
    "live_holders",
    "take_ownership",
]
