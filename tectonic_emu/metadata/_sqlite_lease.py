"""The lease on a SQLite metadata file's transactions: a lock that a stopped process loses.

SQLite's own write lock (``BEGIN IMMEDIATE``) is a file lock: a process SIGSTOPped or
stalled while it holds one keeps every other process out until it resumes or dies. So a
transaction here does not hold the file lock while its caller works. It takes a *lease*
instead: one row of the ``lease`` table, naming a random token, the holder's pid and when
the lease ends. Taking, renewing and releasing it are each a short write transaction.

- A transaction takes the lease before its first read (``take``), and its reads then run
  without any lock: every other commit waits for the lease, so nothing changes under them.
  Its writes stay in the transaction object until the commit.
- While it is open, the holder renews the lease every third of its length (``renew``).
- The commit is one short write transaction (``commit``): check that the lease row still
  names this transaction's token, apply the writes, release the lease, commit. A holder that
  was stopped past its lease while another process took the lease finds another token
  there: it commits nothing (``LeaseLostError``). A lease that ran out with nobody else
  wanting it is still the holder's, and its commit goes through: nothing changed meanwhile.
- A transaction that only writes takes no lease beforehand: its commit checks that no live
  lease is held, and clears a dead one, in the same write transaction.
- Every commit by another process leaves a different token (or none) in the row, so a
  holder's reads are those of a serializable transaction exactly when its token is still
  there at commit. Read-only transactions check it too.

The residual window: the file lock is still held for the few statements of each of those
short transactions, so a process stopped in the middle of one holds the others up (they
wait up to ``busy_timeout``) until it resumes. That window is microseconds long, where a
transaction's own may be as long as its caller likes.

Every function here runs on the store's worker thread with a connection in autocommit mode.
Times are wall-clock (``time.time``), which all processes of one host share and which a
reboot does not reset; a lease ending more than ``MAX_LEASE`` seconds ahead (the clock was
stepped back) counts as ended.
"""

from __future__ import annotations

import errno
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")

#: The longest lease a store may ask for, and the bound beyond which an end is not believed.
MAX_LEASE = 600.0

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lease("
    "id INTEGER PRIMARY KEY CHECK (id = 0), holder BLOB, pid INTEGER NOT NULL, "
    "expires REAL NOT NULL)"
)
_RELEASE = "UPDATE lease SET holder = NULL, pid = 0, expires = 0 WHERE id = 0"
_FREE_ROW = "INSERT OR IGNORE INTO lease(id, holder, pid, expires) VALUES (0, NULL, 0, 0)"


class LeaseLostError(OSError):
    """A transaction's lease ran out and another process took it: nothing of it committed."""

    def __init__(self, lease: float, where: str) -> None:
        super().__init__(
            errno.ETIMEDOUT,
            f"metadata transaction lost its lease: it was stopped or stalled for over "
            f"{lease:g} s and another process took the lock; nothing of it committed",
            where,
        )


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a live lease, for the line of an EBUSY."""

    pid: int
    expires: float

    def describe(self) -> str:
        left = max(0.0, self.expires - time.time())
        return f"pid {self.pid} holds the lock (its lease ends in {left:.1f} s unless renewed)"


def set_up(db: sqlite3.Connection) -> None:
    """Create the lease table and its free row (inside the caller's write transaction)."""
    db.execute(SCHEMA)
    db.execute(_FREE_ROW)


def _live(row: tuple[bytes | None, int, float] | None, now: float) -> bool:
    return row is not None and row[0] is not None and now < row[2] <= now + MAX_LEASE


def _row(db: sqlite3.Connection) -> tuple[bytes | None, int, float] | None:
    row = db.execute("SELECT holder, pid, expires FROM lease WHERE id = 0").fetchone()
    return None if row is None else (row[0], int(row[1]), float(row[2]))


def _write(db: sqlite3.Connection, work: Callable[[], _T]) -> _T:
    """``work`` in a write transaction: committed, or rolled back if it raises. (A ``work``
    that found the lease busy wrote nothing, so its commit changes nothing.)"""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = work()
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result


def take(db: sqlite3.Connection, token: bytes, pid: int, lease: float) -> Holder | None:
    """Take the lease for ``lease`` seconds if no live one is held; else who holds it."""

    def work() -> Holder | None:
        row, now = _row(db), time.time()
        if row is not None and _live(row, now):
            return Holder(row[1], row[2])
        db.execute(
            "INSERT OR REPLACE INTO lease(id, holder, pid, expires) VALUES (0, ?, ?, ?)",
            (token, pid, now + lease),
        )
        return None

    return _write(db, work)


def renew(db: sqlite3.Connection, token: bytes, lease: float) -> bool:
    """Extend the lease by ``lease`` seconds from now; False if ``token`` no longer holds it."""
    sql = "UPDATE lease SET expires = ? WHERE id = 0 AND holder = ?"
    return _write(db, lambda: db.execute(sql, (time.time() + lease, token)).rowcount == 1)


def commit(
    db: sqlite3.Connection,
    token: bytes | None,
    apply: Callable[[], None],
    *,
    lease: float,
    where: str,
) -> Holder | None:
    """Commit a transaction's writes (``apply``) and release its lease, in one write
    transaction. With a ``token``, raises LeaseLostError if the row names another (``lease``
    and ``where`` go in its line); without one
    (a transaction that only writes), returns the holder of a live lease, committing
    nothing, or clears a dead lease and commits."""

    def work() -> Holder | None:
        row = _row(db)
        held = row is not None and row[0] is not None
        if token is not None and (row is None or row[0] != token):
            raise LeaseLostError(lease, where)
        if token is None and row is not None and _live(row, time.time()):
            return Holder(row[1], row[2])
        apply()
        if held:
            db.execute(_RELEASE)
        return None

    return _write(db, work)


def release(db: sqlite3.Connection, token: bytes) -> None:
    """Give the lease up, if ``token`` still holds it."""
    _write(db, lambda: db.execute(_RELEASE + " AND holder = ?", (token,)))


__all__ = ["MAX_LEASE", "Holder", "LeaseLostError", "commit", "release", "renew", "set_up", "take"]
