"""``SQLiteKV``: the durable one-host backend of the metadata seam, a single SQLite file.

Every sqlite3 call runs on a worker thread, so the event loop never waits on the disk or on
another process's lock. Transactions run one at a time on one connection and thread.

A transaction does not hold SQLite's write lock while its caller works: it takes a lease (a
record in ``PATH-lease``) with its first read, renews it while open, and sends its writes
with the commit, which checks that the lease is still its own (``_sqlite_lease``). So a
process stopped inside a transaction holds the others up for at most the lease (5 s by
default), and, resumed after another took the lease, commits nothing.
Reads inside a transaction lay its kept writes over what they find. A transaction costs one
thread hop per read that misses its own writes, plus one to commit.

Reads outside a transaction (``get``, ``scan``, ``iter_prefix``) run on a second connection
and thread, and see the last committed state: WAL mode lets them read while a transaction
writes. They used to queue behind the transactions, each of which commits with an fsync: a
writer's token check waited 12 ms (median) behind the block commits of the other writers
while a checkpoint streamed (docs/performance.md).

Group commit (``synchronous="full"``). A transaction commits into the WAL without an fsync,
releases the store, and then waits for an fsync of the WAL that began after its commit; one
fsync, on a third thread, covers every commit made before it began. SQLite's own FULL mode
fsyncs inside each COMMIT, with the store held: block commits of 8 files streaming at once
queued one fsync (5-13 ms) each behind the other, about 80 commits (640 MB of 8 MiB blocks)
a second for the whole process. The promise is the same: a transaction returns once it is
durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar, cast

from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.localfile import make_private
from tectonic_emu.metadata._common import (
    BufferedTransaction,
    DurableStore,
    GroupCommit,
    Writes,
    check_limit,
    overlay,
    pending_in_range,
    settled,
)
from tectonic_emu.metadata._sqlite_lease import MAX_LEASE, Holder, LeaseFile, LeaseLostError
from tectonic_emu.metadata.kv import prefix_end

Synchronous = Literal["full", "normal", "off"]

_T = TypeVar("_T")

#: Seconds a transaction's lease on the file runs without renewal (``_sqlite_lease``).
DEFAULT_LEASE = 5.0

_SCHEMA = "CREATE TABLE IF NOT EXISTS kv(k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID"

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


class SQLiteKV(DurableStore):
    """An ordered key-value store in one SQLite file (WAL mode), shareable between processes.

    Transactions hold the file's lease (module docstring) from their first read to their
    end, so read-modify-write is serializable across processes too. A process that finds it
    taken waits up to ``busy_timeout`` seconds, then fails with ``OSError(EBUSY)`` naming the
    holder's pid. A transaction stopped or stalled for over ``lease`` seconds (renewed every
    third of it while its event loop runs) loses it to the next process that asks, and then
    fails with ``OSError(ETIMEDOUT)``, nothing of it committed. Reads outside a transaction
    (``get``, ``scan``, ``iter_prefix``) take no lease.

    ``synchronous``: ``"full"`` makes every commit durable before it returns (by group commit,
    see the module docstring); ``"normal"`` may lose the last commits on power loss (never on a
    process crash) and never corrupts the file; ``"off"`` is for throwaway stores.

    The file is opened on first use; ``await SQLiteKV.open(...)`` opens it at once instead, so a
    bad path fails there. Errors: every sqlite3 error becomes an ``OSError`` with an errno
    (``EBUSY``, ``ENOSPC``, ``EROFS``, ``ENOENT``, ``EACCES``, else ``EIO``);
    ``OSError(EDEADLK)`` for a transaction (or ``get``/``scan``) started by a task that already
    holds one on this store; ``OSError(EBADF)`` after ``close``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "full",
        busy_timeout: float = 30.0,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        if synchronous not in ("full", "normal", "off"):
            raise InvalidArgumentError("synchronous must be 'full', 'normal' or 'off'", synchronous)
        if not 0 < lease <= MAX_LEASE:
            raise InvalidArgumentError(
                f"lease must be over 0 and at most {MAX_LEASE:g} s", str(lease)
            )
        super().__init__()
        self.path = os.fspath(path)
        self._where = self.path
        self.synchronous: Synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.lease = lease
        # Touched only on the transactions' worker thread, as _db.
        named = self.path != ":memory:" and not self.path.startswith("file:")
        self._lease = LeaseFile(self.path if named else None, busy_timeout)
        self._holder: _SQLiteTransaction | None = None  # the open transaction, leased
        self._ticker: asyncio.TimerHandle | None = None  # renews the holder's lease
        # Transactions' sqlite3 calls happen on this one thread; _db is touched only there.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlitekv")
        self._db: sqlite3.Connection | None = None
        # Reads outside transactions: their own connection, touched only on this thread.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlitekv-read")
        self._read_db: sqlite3.Connection | None = None
        # Group commit: commits counted on the loop; one fsync of the WAL at a time, on a
        # thread of its own, covers every commit before it.
        self._group = synchronous == "full"
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlitekv-sync")
        self._log = GroupCommit(
            lambda: asyncio.get_running_loop().run_in_executor(self._syncer, self._sync_wal)
        )

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "full",
        busy_timeout: float = 30.0,
        lease: float = DEFAULT_LEASE,
    ) -> SQLiteKV:
        """A store whose file is already open (created if missing)."""
        store = cls(path, synchronous=synchronous, busy_timeout=busy_timeout, lease=lease)
        try:
            await store._run(lambda db: None)
        except BaseException:
            await store.close()
            raise
        return store

    def transaction(self, *, durable: bool = True) -> _SQLiteTransaction:
        return _SQLiteTransaction(self, durable)

    async def get(self, key: bytes) -> bytes | None:
        # Autocommit read on the reader: sees committed data only; no lock, no wait for the
        # transactions (WAL readers do not block on the writer).
        return await self._read_only(lambda db: _select(db, key))

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        check_limit(limit)
        return await self._read_only(lambda db: _scan(db, prefix, start, limit))

    async def _read_only(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        self._check_not_owner()  # it would not see the caller's own transaction
        if self._closed:
            raise self._closed_error()
        return await asyncio.get_running_loop().run_in_executor(
            self._reader, self._in_worker, job, True
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._check_not_owner()
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._ticker is not None:
                self._ticker.cancel()
                self._ticker = None
            loop = asyncio.get_running_loop()
            try:
                await self._log.settle()
                await loop.run_in_executor(self._executor, self._close_in_worker, False)
                await loop.run_in_executor(self._reader, self._close_in_worker, True)
            finally:
                self._executor.shutdown(wait=False)
                self._reader.shutdown(wait=False)
                self._syncer.shutdown(wait=False)

    # -- event-loop side ---------------------------------------------------------------------
    async def _run(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``job`` on the worker thread. If the caller is cancelled, a job that already
        started still runs to its end; one still queued is dropped."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._in_worker, job)

    async def _settle(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """``_run`` to the job's end, even if the caller is cancelled: for what changes the
        file (a commit, the lease), whose outcome this store must know."""
        loop = asyncio.get_running_loop()  # the executor's future itself: no task
        return await settled(loop.run_in_executor(self._executor, self._in_worker, job))

    def _holding(self, txn: _SQLiteTransaction | None) -> None:
        """``txn`` holds the lease now (None: no transaction does). One timer per store,
        not per transaction, renews the open one's lease every third of the lease; it stops
        once it finds no transaction open, and the next lease taken starts it again."""
        self._holder = txn
        if txn is not None and self._ticker is None:
            self._ticker = asyncio.get_running_loop().call_later(self.lease / 3, self._tick)

    def _tick(self) -> None:
        self._ticker = None
        txn = self._holder
        if txn is None or self._closed:
            return
        txn._renew()  # at most a third of the lease after it was taken or last renewed
        self._ticker = asyncio.get_running_loop().call_later(self.lease / 3, self._tick)

    async def _until_free(
        self, job: Callable[[sqlite3.Connection], Holder | None], *, settle: bool
    ) -> None:
        """Run ``job`` (it takes the lease, or commits) until it finds the lease free,
        polling with backoff; ``OSError(EBUSY)`` after ``busy_timeout``. ``settle``: run it to
        its end even if the caller is cancelled (``_settle``)."""
        deadline = time.monotonic() + self.busy_timeout
        pause = 0.0005
        while (holder := await (self._settle(job) if settle else self._run(job))) is not None:
            if time.monotonic() + pause > deadline:
                raise OSError(
                    errno.EBUSY,
                    f"metadata store: {holder.describe()}; waited {self.busy_timeout:g} s",
                    self.path,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)

    # -- worker-thread side ------------------------------------------------------------------
    def _sync_wal(self) -> None:
        """fdatasync the WAL: the commits in it are durable (SQLite syncs it again before a
        checkpoint copies it into the database file, and the file after)."""
        try:
            fd = os.open(self.path + "-wal", os.O_RDONLY)
        except FileNotFoundError:
            return  # no log: every commit is in the database file, synced at its checkpoint
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise OSError(
                exc.errno, f"metadata store: a commit may not be durable: {exc.strerror}", self.path
            ) from exc
        finally:
            os.close(fd)

    def _connect(self) -> sqlite3.Connection:
        _make_private(self.path)
        db = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            # Switching to WAL and creating the table can fail at once with "database is
            # locked" (SQLite skips the busy handler where waiting could deadlock), e.g. when
            # several processes open a new file together: retry until busy_timeout instead.
            deadline = time.monotonic() + self.busy_timeout
            pause = 0.001
            while True:
                try:
                    self._set_up(db)
                    break
                except sqlite3.OperationalError as exc:
                    busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF in (5, 6)
                    if not busy or time.monotonic() + pause > deadline:
                        raise
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
        except BaseException:
            db.close()
            raise
        return db

    def _set_up(self, db: sqlite3.Connection) -> None:
        if db.in_transaction:
            db.execute("ROLLBACK")
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise OSError(errno.EIO, f"could not switch to WAL mode (got {mode})", self.path)
        # "full" is group commit: SQLite commits without an fsync, _durable adds a shared one.
        db.execute(f"PRAGMA synchronous={'NORMAL' if self._group else self.synchronous.upper()}")
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'kv'").fetchone() is None:
            db.execute("BEGIN IMMEDIATE")
            db.execute(_SCHEMA)
            db.execute("COMMIT")

    def _in_worker(self, job: Callable[[sqlite3.Connection], _T], reader: bool = False) -> _T:
        """``job`` on the transactions' connection, or with ``reader`` the reads' one (each
        opened on first use, on its own thread). A write transaction the job left open, by
        failing, is rolled back."""
        try:
            if reader:
                if self._read_db is None:
                    self._read_db = self._connect()
                return job(self._read_db)
            if self._db is None:
                self._db = self._connect()
            try:
                return job(self._db)
            except BaseException:
                self._rollback_in_worker()
                raise
        except sqlite3.Error as exc:
            raise self._os_error(exc) from exc

    def _commit_in_worker(
        self, db: sqlite3.Connection, token: bytes | None, writes: Writes
    ) -> Holder | None:
        """Apply ``writes`` and commit, releasing the lease ``token`` holds; see
        ``LeaseFile.commit`` (a transaction that only writes may find the lease held)."""

        def apply() -> None:
            if writes:
                db.execute("BEGIN IMMEDIATE")
                _apply(db, writes)
                db.execute("COMMIT")

        return self._lease.commit(token, apply, lease=self.lease, where=self.path)

    def _rollback_in_worker(self) -> None:
        db = self._db
        if db is None or not db.in_transaction:
            return
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            # Closing a connection rolls back what it had open; the next call reopens.
            self._db = None
            with contextlib.suppress(sqlite3.Error):
                db.close()

    def _close_in_worker(self, reader: bool) -> None:
        if reader:
            db, self._read_db = self._read_db, None
        else:
            db, self._db = self._db, None
            self._lease.close()
        if db is not None:
            try:
                db.close()
            except sqlite3.Error as exc:
                raise self._os_error(exc) from exc

    def _os_error(self, exc: sqlite3.Error) -> OSError:
        code = getattr(exc, "sqlite_errorcode", None)
        err = errno.EIO if code is None else _ERRNO.get(code & 0xFF, errno.EIO)
        message = f"metadata store: {exc}"
        if err == errno.EBUSY:
            message += f" (waited up to {self.busy_timeout:g} s for other users of the file)"
        return OSError(err, message, self.path)


class _SQLiteTransaction(BufferedTransaction):
    """Takes the lease before its first read, renews it while open, and sends every write
    with the commit (``_sqlite_lease``); reads lay the kept writes over what they find."""

    _store: SQLiteKV

    def __init__(self, store: SQLiteKV, durable: bool = True) -> None:
        super().__init__(store, durable)
        self._token: bytes | None = None  # this transaction's lease, once a take was sent
        self._renewer: asyncio.Future[None] | None = None  # a renewal under way
        self._lost = False  # a renewal found the lease taken

    @property
    def _started(self) -> bool:
        return self._token is not None

    async def _read(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """``job`` on the worker, after taking the lease with the first read (in the same
        thread hop), and renewing it from then on."""
        store = self._store
        try:
            if self._token is None:
                token = self._token = os.urandom(16)
                return await self._take_then(token, job)
            if self._lost:
                raise LeaseLostError(store.lease, store.path)
            return await store._run(job)
        except BaseException:
            self._state = "broken"  # nothing more of this transaction may commit
            raise

    async def _take_then(self, token: bytes, job: Callable[[sqlite3.Connection], _T]) -> _T:
        store, pid = self._store, os.getpid()
        answer: list[_T] = []

        def take_then_read(db: sqlite3.Connection) -> Holder | None:
            busy = store._lease.take(token, pid, store.lease)
            if busy is None:
                answer.append(job(db))
            return busy

        # Not settled: cancelled, the transaction releases the lease if the take got it.
        await store._until_free(take_then_read, settle=False)
        store._holding(self)
        return answer[0]

    def _renew(self) -> None:
        """Renew the lease (the store's timer, every third of the lease): a task, which
        marks the transaction lost if another process took it."""
        store, token = self._store, self._token
        assert token is not None

        async def renewal() -> None:
            try:
                held = await store._run(lambda db: store._lease.renew(token, store.lease))
            except OSError:
                held = True  # the file is busy or failing: the commit's check decides
            if not held:
                self._lost = True

        self._renewer = asyncio.ensure_future(renewal())

    def _stop_renewing(self) -> None:
        self._store._holding(None)
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None

    async def _commit(self, writes: Writes) -> None:
        self._stop_renewing()
        store, token = self._store, self._token
        await store._until_free(lambda db: store._commit_in_worker(db, token, writes), settle=True)

    async def _abandon(self) -> None:
        self._stop_renewing()
        store, token = self._store, self._token
        if token is not None:  # free the lease if still ours, committing nothing
            with contextlib.suppress(OSError):  # lost, or failing: it runs out by itself
                await store._settle(
                    lambda db: store._lease.commit(
                        token, lambda: None, lease=store.lease, where=store.path
                    )
                )

    async def _fetch(self, key: bytes) -> bytes | None:
        return await self._read(lambda db: _select(db, key))

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        self._check_open()
        check_limit(limit)
        if limit == 0:
            return []
        pending = pending_in_range(self._writes, prefix, start)
        ask = None if limit is None else limit + sum(v is None for _, v in pending)
        rows = await self._read(lambda db: _scan(db, prefix, start, ask))
        return overlay(rows, pending, limit, cut=ask is not None and len(rows) == ask)


# -- statements (worker thread) --------------------------------------------------------------
def _apply(db: sqlite3.Connection, writes: Writes) -> None:
    puts = [(k, v) for k, v in writes.items() if v is not None]
    if puts:
        db.executemany("INSERT OR REPLACE INTO kv(k, v) VALUES (?, ?)", puts)
    if len(puts) < len(writes):
        dels = [(k,) for k, v in writes.items() if v is None]
        db.executemany("DELETE FROM kv WHERE k = ?", dels)


def _select(db: sqlite3.Connection, key: bytes) -> bytes | None:
    row = db.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
    return None if row is None else cast(bytes, row[0])


def _scan(
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


__all__ = ["SQLiteKV"]
