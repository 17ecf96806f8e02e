"""``SQLiteKV``: the durable one-host backend of the metadata seam, a single SQLite file.

**Where the SQLite calls run** (``_sqlite_conns``). On the event loop's thread, each on a
connection of the loop's own, as long as they need not wait; otherwise on a worker thread. A
read or a commit costs a few to a few tens of microseconds of CPU, and a hop to a thread and
back about 110 us here with two wake-ups: when every call hopped, a stat made four hops, and
the event loop's CPU and wake-ups took 72% of a create. Nothing on the loop's thread may
wait, so its connections have no busy handler (where another process holds a lock SQLite
needs, the call fails at once and runs again on the worker thread, whose connection waits
up to ``busy_timeout``); the lease's flock is tried without waiting, with the same fallback
(``_sqlite_lease.Busy``); they never checkpoint the WAL (the worker does, every
``CHECKPOINT_EVERY`` commits) and never fsync (the group commit's fsync has a thread of its
own, below). Connections are opened and closed on the worker too.

**Transactions** run one at a time per store object. A transaction does not hold SQLite's
write lock while its caller works: it takes a lease (a record in ``PATH-lease``) with its
first read, renews it while open, and sends its writes with the commit, which checks that
the lease is still its own (``_sqlite_lease``). So a process stopped inside a transaction
holds the others up for at most the lease (5 s by default), and, resumed after another took
the lease, commits nothing. Reads inside a transaction lay its kept writes over what they
find.

**Views** (``view()``, and ``get``, ``scan``, ``iter_prefix``) read in a read transaction
of their own on one of the loop's view connections, without the lease: WAL mode lets them
read while a transaction writes, and they see the last commit. A view that finds SQLite
busy on its first read goes on, in one read transaction, on a reader thread.

**Group commit** (``synchronous="full"``). A transaction commits into the WAL without an
fsync, releases the store, and then waits for an fsync of the WAL that began after its
commit; one fsync, on a thread of its own, covers every commit made before it began.
SQLite's own FULL mode fsyncs inside each COMMIT, with the store held: block commits of 8
files streaming at once queued one fsync (5-13 ms) each behind the other, about 80 commits
(640 MB of 8 MiB blocks) a second for the whole process. The promise is the same: a durable
transaction returns once it is durable.
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
from typing import Literal, TypeVar

from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.metadata import _sqlite_sql as sql
from tectonic_emu.metadata._common import (
    BufferedTransaction,
    GroupCommit,
    Writes,
    check_limit,
    overlay,
    pending_in_range,
)
from tectonic_emu.metadata._sqlite_conns import SQLiteThreads
from tectonic_emu.metadata._sqlite_lease import (
    MAX_LEASE,
    Busy,
    Holder,
    LeaseFile,
    LeaseLostError,
)
from tectonic_emu.metadata._sqlite_view import SQLiteThreadView, SQLiteView

Synchronous = Literal["full", "normal", "off"]

_T = TypeVar("_T")

#: Seconds a transaction's lease on the file runs without renewal (``_sqlite_lease``).
DEFAULT_LEASE = 5.0


class SQLiteKV(SQLiteThreads):
    """An ordered key-value store in one SQLite file (WAL mode), shareable between processes.

    Transactions hold the file's lease (module docstring) from their first read to their
    end, so read-modify-write is serializable across processes too. A process that finds it
    taken waits up to ``busy_timeout`` seconds, then fails with ``OSError(EBUSY)`` naming the
    holder's pid. A transaction stopped or stalled for over ``lease`` seconds (renewed every
    third of it while its event loop runs) loses it to the next process that asks, and then
    fails with ``OSError(ETIMEDOUT)``, nothing of it committed. Views and reads outside a
    transaction (``get``, ``scan``, ``iter_prefix``) take no lease.

    ``synchronous``: ``"full"`` makes every commit durable before it returns (by group commit,
    see the module docstring); ``"normal"`` may lose the last commits on power loss (never on a
    process crash) and never corrupts the file; ``"off"`` is for throwaway stores.

    The file is opened on first use; ``await SQLiteKV.open(...)`` opens it at once instead, so a
    bad path fails there. Errors: every sqlite3 error becomes an ``OSError`` with an errno
    (``EBUSY``, ``ENOSPC``, ``EROFS``, ``ENOENT``, ``EACCES``, else ``EIO``);
    ``OSError(EDEADLK)`` for a transaction, view, ``get`` or ``scan`` started by a task that
    already holds a transaction on this store; ``OSError(EBADF)`` after ``close``.
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
        # Group commit: SQLite commits without an fsync; one fsync of the WAL at a time, on
        # a thread of its own, covers every commit before it.
        self._group = synchronous == "full"
        super().__init__(
            os.fspath(path), "NORMAL" if self._group else synchronous.upper(), busy_timeout
        )
        self.synchronous: Synchronous = synchronous
        self.lease = lease
        named = self.path != ":memory:" and not self.path.startswith("file:")
        self._lease = LeaseFile(self.path if named else None, busy_timeout)
        self._holder: _SQLiteTransaction | None = None  # the open transaction, leased
        self._ticker: asyncio.TimerHandle | None = None  # renews the holder's lease
        self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlitekv-sync")
        self._log = GroupCommit(
            lambda: asyncio.get_running_loop().run_in_executor(self._syncer, self._sync_wal),
            flush_here=lambda: self._sync_wal(),
            alone=lambda: self._waiting == 0,
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
            store._bind_loop()
            store._loop_db()  # the loop's connections, opened on the worker
            store._view_db()
            await store._settle_jobs()
        except BaseException:
            await store.close()
            raise
        return store

    def transaction(self, *, durable: bool = True) -> _SQLiteTransaction:
        return _SQLiteTransaction(self, durable)

    def view(self) -> SQLiteView:
        return SQLiteView(self)

    def thread_view(self) -> SQLiteThreadView:
        return SQLiteThreadView(self)

    async def get(self, key: bytes) -> bytes | None:
        async with self.view() as v:
            return await v.get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        async with self.view() as v:
            return await v.scan(prefix, start=start, limit=limit)

    async def close(self) -> None:
        if self._closed:
            return
        self._bind_loop()
        self._check_not_owner()
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._ticker is not None:
                self._ticker.cancel()
                self._ticker = None
            try:
                await self._log.settle()
                await self._close_connections()
            finally:
                self._syncer.shutdown(wait=False)
                self._lease.close()

    def _forget_loop(self) -> None:
        self._log.forget()
        self._holder, self._ticker = None, None

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
        """Run ``job`` (it takes the lease, or commits) on the worker until it finds the
        lease free, polling with backoff; ``OSError(EBUSY)`` after ``busy_timeout``.
        ``settle``: run it to its end even if the caller is cancelled (``_settle``)."""
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

    def _lease_commit(
        self, db: sqlite3.Connection, token: bytes | None, writes: Writes, *, here: bool = False
    ) -> Holder | None:
        """Apply ``writes`` (none: only free the lease) and commit, releasing the lease
        ``token`` holds; see ``LeaseFile.commit`` (a transaction that only writes may find
        the lease held). ``here``: on a loop connection, ``Busy`` where it would wait."""

        def apply() -> None:
            if here:
                self._here(db, lambda d: sql.apply(d, writes))
            else:
                sql.apply(db, writes)

        return self._lease.commit(token, apply, lease=self.lease, where=self.path, wait=not here)


class _SQLiteTransaction(BufferedTransaction):
    """Takes the lease before its first read, renews it while open, and sends every write
    with the commit (``_sqlite_lease``); reads lay the kept writes over what they find.
    Each step runs on the loop's connection unless it would wait (module docstring)."""

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
        """``job``, after taking the lease with the first read, and renewing it from then
        on: on the loop's connection, or where it must wait, on the worker."""
        store = self._store
        try:
            db = store._loop_db()
            if self._token is None:
                token = self._token = os.urandom(16)
                if db is None or not self._take_here(token):
                    return await self._take_then(token, job)
                store._holding(self)
            elif self._lost:
                raise LeaseLostError(store.lease, store.path)
            if db is not None:
                with contextlib.suppress(Busy):
                    return store._here(db, job)
            return await store._run(job)
        except BaseException:
            self._state = "broken"  # nothing more of this transaction may commit
            raise

    def _take_here(self, token: bytes) -> bool:
        """Take the lease on the loop's thread if that needs no wait."""
        store = self._store
        try:
            return store._lease.take(token, os.getpid(), store.lease, wait=False) is None
        except Busy:
            return False

    async def _take_then(self, token: bytes, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Take the lease on the worker, waiting for it, then ``job`` in the same hop."""
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
        await self._send(writes)

    async def _abandon(self) -> None:
        self._stop_renewing()
        if self._token is not None:  # free the lease if still ours, committing nothing
            with contextlib.suppress(OSError):  # lost, or failing: it runs out by itself
                await self._send({})

    async def _send(self, writes: Writes) -> None:
        """Commit ``writes`` and release the lease: on the loop's connection, or where that
        would wait, on the worker (to the end, even if the caller is cancelled)."""
        store, token = self._store, self._token
        if (db := store._loop_db()) is not None:
            with contextlib.suppress(Busy):
                if store._lease_commit(db, token, writes, here=True) is None:
                    if writes:
                        store._committed_here()
                    return
        await store._until_free(lambda db: store._lease_commit(db, token, writes), settle=True)

    async def _fetch(self, key: bytes) -> bytes | None:
        return await self._read(lambda db: sql.select(db, key))

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        self._check_open()
        check_limit(limit)
        if limit == 0:
            return []
        pending = pending_in_range(self._writes, prefix, start)
        ask = None if limit is None else limit + sum(v is None for _, v in pending)
        rows = await self._read(lambda db: sql.scan(db, prefix, start, ask))
        return overlay(rows, pending, limit, cut=ask is not None and len(rows) == ask)


__all__ = ["SQLiteKV"]
