"""What ``SQLiteKV``'s threads share: opening a connection, the statements, and its errors.

Every function here runs on whichever thread owns the connection it is given; nothing here
waits on the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from typing import cast

from tectonic_emu.localfile import make_private
from tectonic_emu.metadata._common import Writes
from tectonic_emu.metadata.kv import prefix_end

_SCHEMA = "CREATE TABLE IF NOT EXISTS kv(k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID"

#: Bytes of the database file a connection maps (``PRAGMA mmap_size``): a read after another
#: connection's commit finds the pages without a system call per page.
MMAP_SIZE = 1 << 28

# sqlite3 primary result codes -> errno; anything else is EIO.
_ERRNO = {
    3: errno.EACCES,  # SQLITE_PERM
    5: errno.EBUSY,  # SQLITE_BUSY
    6: errno.EBUSY,  # SQLITE_LOCKED
    7: errno.ENOMEM,  # SQLITE_NOMEM
    8: errno.EROFS,  # SQLITE_READONLY
    13: errno.ENOSPC,  # SQLITE_FULL
    14: errno.ENOENT,  # SQLITE_CANTOPEN (usually a missing directory)
    23: errno.EACCES,  # SQLITE_AUTH
}


def is_busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds what this one needs."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF in (5, 6)


def os_error(exc: sqlite3.Error, path: str, busy_timeout: float) -> OSError:
    """A sqlite3 error as the ``OSError`` the store raises (errno from ``_ERRNO``)."""
    code = getattr(exc, "sqlite_errorcode", None)
    err = errno.EIO if code is None else _ERRNO.get(code & 0xFF, errno.EIO)
    message = f"metadata store: {exc}"
    if err == errno.EBUSY:
        message += f" (waited up to {busy_timeout:g} s for other users of the file)"
    return OSError(err, message, path)


def _make_private(path: str) -> None:
    """Create the database file 0600 if missing, and take group and other access away from it
    and its -wal/-shm (SQLite makes those with the database file's mode). A file that is not
    ours to chmod is left as it is: SQLite reports what it cannot open."""
    if path == ":memory:" or path.startswith("file:"):
        return
    with contextlib.suppress(FileExistsError, FileNotFoundError, PermissionError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    for p in (path, path + "-wal", path + "-shm"):
        make_private(p, 0o600)


def connect(
    path: str, synchronous: str, busy_timeout: float, *, loop: bool = False
) -> sqlite3.Connection:
    """A connection in WAL mode with the table made. ``synchronous`` is SQLite's pragma
    (``NORMAL``, ``FULL``, ``OFF``). ``loop``: for the event loop's thread, where nothing may
    wait: no busy handler (a lock held elsewhere is SQLITE_BUSY at once, and the caller goes
    to a worker thread) and no automatic checkpoint (the store runs them on its worker)."""
    _make_private(path)
    db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        # Switching to WAL and creating the table can fail at once with "database is
        # locked" (SQLite skips the busy handler where waiting could deadlock), e.g. when
        # several processes open a new file together: retry until busy_timeout instead.
        deadline = time.monotonic() + busy_timeout
        pause = 0.001
        while True:
            try:
                _set_up(db, path, synchronous)
                break
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        db.execute(f"PRAGMA mmap_size={MMAP_SIZE}")
        if loop:
            db.execute("PRAGMA busy_timeout=0")
            db.execute("PRAGMA wal_autocheckpoint=0")
    except BaseException:
        db.close()
        raise
    return db


def _set_up(db: sqlite3.Connection, path: str, synchronous: str) -> None:
    if db.in_transaction:
        db.execute("ROLLBACK")
    mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    if str(mode).lower() != "wal":
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise OSError(errno.EIO, f"could not switch to WAL mode (got {mode})", path)
    db.execute(f"PRAGMA synchronous={synchronous}")
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'kv'").fetchone() is None:
        db.execute("BEGIN IMMEDIATE")
        db.execute(_SCHEMA)
        db.execute("COMMIT")


def rollback(db: sqlite3.Connection) -> bool:
    """End what ``db`` has open; False if even that failed (close the connection then)."""
    if not db.in_transaction:
        return True
    try:
        db.execute("ROLLBACK")
        return True
    except sqlite3.Error:
        return False


# -- statements --------------------------------------------------------------------------------
def apply(db: sqlite3.Connection, writes: Writes) -> None:
    """Commit ``writes`` in one write transaction of their own."""
    if not writes:
        return
    db.execute("BEGIN IMMEDIATE")
    puts = [(k, v) for k, v in writes.items() if v is not None]
    if puts:
        db.executemany("INSERT OR REPLACE INTO kv(k, v) VALUES (?, ?)", puts)
    if len(puts) < len(writes):
        dels = [(k,) for k, v in writes.items() if v is None]
        db.executemany("DELETE FROM kv WHERE k = ?", dels)
    db.execute("COMMIT")


def select(db: sqlite3.Connection, key: bytes) -> bytes | None:
    row = db.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
    return None if row is None else cast(bytes, row[0])


def scan(
    db: sqlite3.Connection, prefix: bytes, start: bytes | None, limit: int | None
) -> list[tuple[bytes, bytes]]:
    low = prefix if start is None or start < prefix else start
    end = prefix_end(prefix)
    n = -1 if limit is None else limit  # LIMIT -1: no limit
    if end is None:
        cur = db.execute("SELECT k, v FROM kv WHERE k >= ? ORDER BY k LIMIT ?", (low, n))
    else:
        cur = db.execute(
            "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT ?", (low, end, n)
        )
    return cast(list[tuple[bytes, bytes]], cur.fetchall())


__all__ = ["MMAP_SIZE", "apply", "connect", "is_busy", "os_error", "rollback", "scan", "select"]
