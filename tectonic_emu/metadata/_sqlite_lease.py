"""The lease on a SQLite metadata file's transactions: a lock that a stopped process loses.

SQLite's own write lock (``BEGIN IMMEDIATE``) is a file lock: a process SIGSTOPped or
stalled while it holds one keeps every other process out until it resumes or dies. So a
transaction here does not hold the file lock while its caller works. It takes a *lease*
instead: a 32-byte record in ``PATH-lease`` beside the database, naming a random token, the
holder's pid and when the lease ends. Each step reads and writes that record under
``flock``, held for microseconds:

- A transaction takes the lease before its first read (``take``), and its reads then run
  without any lock: every other commit waits for the lease, so nothing changes under them.
  Its writes stay in the transaction object until the commit.
- While it is open, the holder renews the lease every third of its length (``renew``).
- The commit (``commit``), under the flock: check that the record still names this
  transaction's token, commit the writes to SQLite, free the record. A holder that was
  stopped past its lease while another process took the lease finds another token there:
  it commits nothing (``LeaseLostError``). A lease that ran out with nobody else asking is
  still the holder's, and its commit goes through: nothing changed meanwhile.
- A transaction that only writes takes no lease beforehand: its commit checks that no live
  lease is held, and clears a dead one, under the same flock.
- Every commit by another process leaves a different token (or none) in the record, so a
  holder's reads are those of a serializable transaction exactly when its token is still
  there at commit. Read-only transactions check it too.

Why a file of its own and not a row of the database: a row costs a SQLite write
transaction (a WAL frame) to take and another to free, about 30 us each here; a read-only
transaction went from 15 to 73 us of work on the store's thread. The flock and a 32-byte
``pread``/``pwrite`` cost about 4 us. The record needs no durability: after a crash its
holders are gone, and it runs out.

The residual window: the flock is held across SQLite's commit, so a process stopped in the
middle of a commit holds the others up (they poll up to ``busy_timeout``, then EBUSY) until
it resumes. That window is a commit long; a transaction's own may be as long as its caller
likes.

Every step here is a few microseconds unless it must wait: the store runs it on the event
loop's thread with ``wait=False``, where a flock held elsewhere (or SQLite's own lock) raises
``Busy`` at once, and then runs it again on its worker thread, which may wait. Times are
wall-clock (``time.time``), which all processes of one host share and which a reboot does not
reset; a lease ending more than ``MAX_LEASE`` seconds ahead (the clock was stepped back)
counts as ended.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

#: The longest lease a store may ask for, and the bound beyond which an end is not believed.
MAX_LEASE = 600.0

_RECORD = struct.Struct("<16sQd")  # token (zeros: free), pid, expires
_FREE = bytes(_RECORD.size)


class LeaseLostError(OSError):
    """A transaction's lease ran out and another process took it: nothing of it committed."""

    def __init__(self, lease: float, where: str) -> None:
        super().__init__(
            errno.ETIMEDOUT,
            f"metadata transaction lost its lease: it was stopped or stalled for over "
            f"{lease:g} s and another process took the lock; nothing of it committed",
            where,
        )


class Busy(Exception):
    """A step that was not to wait found a lock held: nothing changed; run it again where
    waiting is allowed."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a live lease, for the line of an EBUSY."""

    pid: int
    expires: float

    def describe(self) -> str:
        left = max(0.0, self.expires - time.time())
        return f"pid {self.pid} holds the lock (its lease ends in {left:.1f} s unless renewed)"


_Record = tuple[bytes, int, float]  # token, pid, expires


def _live(row: _Record, now: float) -> bool:
    return now < row[2] <= now + MAX_LEASE


class LeaseFile:
    """The lease record of one store (module docstring), opened on first use. ``path`` is
    the database's; ``None`` (a database with no file of its own) keeps the record in an
    unnamed file, which only this store sees. ``busy_timeout``: how long to wait for the
    flock, held for microseconds unless its holder was stopped inside a commit."""

    def __init__(self, path: str | None, busy_timeout: float) -> None:
        self.path = None if path is None else path + "-lease"
        self.busy_timeout = busy_timeout
        self._fd: int | None = None
        self._pid = 0  # the process that opened _fd (a forked child opens its own)

    def take(self, token: bytes, pid: int, lease: float, *, wait: bool = True) -> Holder | None:
        """Take the lease for ``lease`` seconds if no live one is held; else who holds it.
        ``wait=False``: ``Busy`` if the record is locked (``_lock``)."""
        fd = self._lock(wait)
        try:
            row, now = _read(fd), time.time()
            if row is not None and _live(row, now):
                return Holder(row[1], row[2])
            os.pwrite(fd, _RECORD.pack(token, pid, now + lease), 0)
            return None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def renew(self, token: bytes, lease: float) -> bool:
        """Extend the lease by ``lease`` seconds from now; False if ``token`` lost it."""
        fd = self._lock()
        try:
            row = _read(fd)
            if row is None or row[0] != token:
                return False
            os.pwrite(fd, _RECORD.pack(token, row[1], time.time() + lease), 0)
            return True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def commit(
        self,
        token: bytes | None,
        apply: Callable[[], None],
        *,
        lease: float,
        where: str,
        wait: bool = True,
    ) -> Holder | None:
        """Run ``apply`` (the SQLite commit) if the lease allows it, and free the record.
        With a ``token``: raises LeaseLostError, running nothing, if the record names
        another (``lease`` and ``where`` go in its line). Without one (a transaction that
        only writes): returns the holder of a live lease, running nothing, or clears a dead
        one. The lease is freed whether ``apply`` succeeds or fails (the transaction is over),
        unless it raises ``Busy``: it changed nothing, and the caller runs the commit again.
        ``wait=False``: ``Busy`` if the record is locked (``_lock``)."""
        fd = self._lock(wait)
        try:
            row = _read(fd)
            if token is not None and (row is None or row[0] != token):
                raise LeaseLostError(lease, where)
            if token is None and row is not None and _live(row, time.time()):
                return Holder(row[1], row[2])
            try:
                apply()
            except Busy:
                raise
            except BaseException:
                if row is not None:
                    os.pwrite(fd, _FREE, 0)
                raise
            if row is not None:
                os.pwrite(fd, _FREE, 0)
            return None
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            os.close(fd)

    def _lock(self, wait: bool = True) -> int:
        """The record's descriptor, flocked: the caller unlocks it. ``wait=False``: ``Busy``
        at once if another process has it locked."""
        fd = self._open()
        deadline, pause = None, 0.00005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if not wait:
                    raise Busy from None
            if deadline is None:
                deadline = time.monotonic() + self.busy_timeout
            elif time.monotonic() + pause > deadline:
                raise OSError(
                    errno.EBUSY,
                    f"metadata store: the lease file stayed locked for "
                    f"{self.busy_timeout:g} s (a process stopped inside a commit?)",
                    self.path,
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def _open(self) -> int:
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        if self.path is None:
            fd, name = tempfile.mkstemp(prefix="sqlitekv-lease-")
            os.unlink(name)
        else:
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(self.path, flags, 0o600)
        self._fd, self._pid = fd, os.getpid()
        return fd


def _read(fd: int) -> _Record | None:
    """The record, or None when the lease is free (a new, empty or freed file)."""
    data = os.pread(fd, _RECORD.size, 0)
    if len(data) < _RECORD.size or data == _FREE:
        return None
    return cast(_Record, _RECORD.unpack(data))


__all__ = ["MAX_LEASE", "Busy", "Holder", "LeaseFile", "LeaseLostError"]
