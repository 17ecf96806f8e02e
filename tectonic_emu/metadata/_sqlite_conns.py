"""Where ``SQLiteKV``'s SQLite calls run: the event loop's own connections, and the threads
that do what must wait (the store's module docstring says why).

- **The loop's connections**: one for transactions (``_loop_db``), and up to
  ``VIEW_CONNECTIONS`` for views (``_view_db``). Each is opened on the worker thread and
  handed to the loop; until then the caller goes to the worker. They have no busy handler
  and never checkpoint: ``_here`` runs a job on one and raises ``Busy`` where SQLite would
  have waited, so that the caller runs it on a thread instead.
- **Checkpoints**: every ``CHECKPOINT_EVERY`` commits on the loop's connection, a
  ``RESTART`` checkpoint on the worker, holding the store's lock so that no commit runs
  beside it (``_committed_here``). Passive ones, running beside the loop's commits, never
  caught up with them: the WAL grew without end (2,000 commits: 17 MB), and a commit that
  grows the file pays twice the fdatasync (300 against 150 us here). ``RESTART`` makes the
  next commit write the log from its start.
- **The worker thread** (``_run``, ``_settle``): transactions that must wait, openings,
  checkpoints and closing, on its connection ``_db``. **The reader thread**
  (``_read_job``): views that must wait, on ``_read_db``.
- **Other threads' connections** (``_thread_db``): up to ``THREAD_CONNECTIONS``, for the
  thread views of other threads than the loop's (``offloop``: a FUSE thread's stat), each
  used by one thread at a time, opened by the first thread that needs it. Like the loop's,
  they never wait: a thread beyond them, or a lock held elsewhere, is ``WouldWait``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tectonic_emu.errors import retrieved
from tectonic_emu.metadata import _sqlite_sql as sql
from tectonic_emu.metadata import offloop
from tectonic_emu.metadata._common import DurableStore, settled
from tectonic_emu.metadata._sqlite_lease import Busy

_T = TypeVar("_T")

#: Commits on the loop's connection between two checkpoints of the WAL (on the worker). A
#: metadata commit writes two or three pages: near SQLite's own default of a checkpoint per
#: 1,000 pages of log.
CHECKPOINT_EVERY = 256

#: Connections the loop's views may open; a view beyond them reads on the reader thread.
VIEW_CONNECTIONS = 4

#: Connections other threads' views may open (``_thread_db``); a view beyond them goes to
#: the loop.
THREAD_CONNECTIONS = 8


class Gone(OSError):
    """A job on a loop connection failed and the connection could not even roll back: it
    was closed (``SQLiteThreads._here``)."""


class SQLiteThreads(DurableStore):
    """The connections and threads of one SQLite store (module docstring). ``pragma`` is
    SQLite's ``synchronous`` for every connection."""

    def __init__(self, path: str, pragma: str, busy_timeout: float) -> None:
        super().__init__()
        self.path = path
        self._where = path
        self.busy_timeout = busy_timeout
        self._pragma = pragma
        self._ldb: sqlite3.Connection | None = None
        self._ldb_opening = False
        self._views: list[sqlite3.Connection] = []  # not in use
        self._view_count = 0  # view connections open or being opened
        self._jobs: set[asyncio.Future[Any]] = set()  # openings on the worker
        self._commits = 0  # on the loop's connection since the last checkpoint
        self._checkpoint: asyncio.Task[None] | None = None  # queued for the lock, or running
        self._loop: asyncio.AbstractEventLoop | None = None  # the one the above belong to
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlitekv")
        self._db: sqlite3.Connection | None = None  # touched only on the worker
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlitekv-read")
        self._read_db: sqlite3.Connection | None = None  # touched only on the reader
        self._read_lock = asyncio.Lock()  # one view at a time on the reader
        self._threads_lock = threading.Lock()  # guards the two below
        self._thread_free: list[sqlite3.Connection] = []  # other threads', not in use
        self._thread_count = 0  # other threads' connections open or being opened

    async def _close_connections(self) -> None:
        """Close every connection (on the worker: the last to close checkpoints the WAL)
        once the jobs under way end, then stop the threads."""
        loop = asyncio.get_running_loop()
        try:
            await self._settle_jobs()
            with self._threads_lock:  # one in use is closed when given back (_closed)
                theirs, self._thread_free = self._thread_free, []
            mine = [self._ldb, *self._views, *theirs]
            self._ldb, self._views = None, []
            await loop.run_in_executor(self._executor, _close_all, mine)
            await loop.run_in_executor(self._executor, self._close_in_worker, False)
            await loop.run_in_executor(self._reader, self._close_in_worker, True)
        finally:
            self._executor.shutdown(wait=False)
            self._reader.shutdown(wait=False)

    def _close_in_worker(self, reader: bool) -> None:
        if reader:
            db, self._read_db = self._read_db, None
        else:
            db, self._db = self._db, None
        if db is not None:
            try:
                db.close()
            except sqlite3.Error as exc:
                raise self._os_error(exc) from exc

    def _bind_loop(self) -> None:
        """What is under way belongs to the event loop that started it: used from another
        loop (one ``asyncio.run`` after another), the store forgets it. The connections
        themselves carry over: they belong to no loop."""
        offloop.refuse_here()  # the loop's connections: a thread off it has thread views
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._loop is not None:
            self._jobs.clear()
            self._ldb_opening, self._checkpoint = False, None
            self._view_count = len(self._views)
            self._lock, self._owner = asyncio.Lock(), None
            self._read_lock = asyncio.Lock()
            self._forget_loop()
        self._loop = loop

    def _forget_loop(self) -> None:
        """What a subclass keeps of the event loop before this one (``_bind_loop``)."""

    async def _acquire(self) -> None:
        self._bind_loop()
        # A checkpoint that is due goes first, even where the transactions never yield
        # to the loop (commits without fsyncs, back to back): it could not start otherwise.
        if (ckpt := self._checkpoint) is not None and not ckpt.done():
            self._check_not_owner()  # EDEADLK, not a wait for a lock this task holds
            await asyncio.wait([ckpt])
        await super()._acquire()

    def _loop_db(self) -> sqlite3.Connection | None:
        """The loop's connection for transactions, or None while it is being opened (on the
        worker: opening may wait for other processes); the first call starts that."""
        if self._ldb is None and not self._ldb_opening and not self._closed:
            self._ldb_opening = True

            def opened(db: sqlite3.Connection | None) -> None:
                self._ldb_opening = False
                self._ldb = db

            self._open_later(opened)
        return self._ldb

    def _view_db(self) -> sqlite3.Connection | None:
        """A view connection of the loop's, or None (none free: one is opened if fewer than
        ``VIEW_CONNECTIONS`` are, for the next view)."""
        if self._views:
            return self._views.pop()
        if self._view_count < VIEW_CONNECTIONS and not self._closed:
            self._view_count += 1

            def opened(db: sqlite3.Connection | None) -> None:
                if db is None:
                    self._view_count -= 1
                else:
                    self._views.append(db)

            self._open_later(opened)
        return None

    def _open_later(self, use: Callable[[sqlite3.Connection | None], None]) -> None:
        """Open a loop connection on the worker, then hand it to ``use`` on the loop; None
        if it failed (the call that needs it opens its own on the worker and says why). Once
        the store is closed, the connection is closed instead."""

        def landed(fut: asyncio.Future[sqlite3.Connection]) -> None:
            self._jobs.discard(fut)
            failed = fut.cancelled() or fut.exception() is not None
            if failed or self._closed:
                retrieved(fut)
                if not failed:
                    self._close_later(fut.result())
                use(None)
            else:
                use(fut.result())

        fut = asyncio.get_running_loop().run_in_executor(
            self._executor,
            lambda: sql.connect(self.path, self._pragma, self.busy_timeout, loop=True),
        )
        self._jobs.add(fut)  # close waits for it
        fut.add_done_callback(landed)

    async def _settle_jobs(self) -> None:
        """Wait for the openings under way on the worker."""
        while self._jobs:
            await asyncio.wait(list(self._jobs))

    def _here(self, db: sqlite3.Connection, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """``job`` on a loop connection: its result, or ``Busy`` (rolled back, the connection
        as good as before) where SQLite would have waited for a lock. A connection that
        cannot even roll back is dropped, and the job's error raised as ``Gone``, so that
        a view holding it lets go of it."""
        try:
            return job(db)
        except sqlite3.Error as exc:
            err = self._os_error(exc)
            if not sql.rollback(db):
                self._drop(db)
                raise Gone(err.errno, err.strerror, err.filename) from exc
            if sql.is_busy(exc):
                raise Busy from exc
            raise err from exc

    def _drop(self, db: sqlite3.Connection) -> None:
        """Close a loop connection that failed (on the worker); the next call opens another."""
        if db is self._ldb:
            self._ldb = None
        else:
            self._view_count -= 1
        self._close_later(db)

    def _close_later(self, db: sqlite3.Connection) -> None:
        """Close a loop connection on the worker, or here once the store is closed (a view
        that ends after ``close``): the worker is gone then."""
        try:
            self._executor.submit(_close_all, [db])
        except RuntimeError:  # cannot schedule new futures after shutdown
            _close_all([db])

    def _committed_here(self) -> None:
        """Count a commit on the loop's connection; every ``CHECKPOINT_EVERY``, start a
        restart checkpoint that holds the store's lock, so that no commit runs beside it
        (unless one is under way). Run beside back-to-back commits, a checkpoint lost the
        race for SQLite's write lock to them and the log grew (35 MB after 10,000 commits).
        The next transaction waits for it (``_acquire``), as SQLite's own automatic
        checkpoint holds up the commit that crosses its mark."""
        self._commits += 1
        if self._commits < CHECKPOINT_EVERY or (
            self._checkpoint is not None and not self._checkpoint.done()
        ):
            return
        self._commits = 0
        self._checkpoint = asyncio.ensure_future(self._checkpoint_holding_the_store())
        self._checkpoint.add_done_callback(retrieved)

    async def _checkpoint_holding_the_store(self) -> None:
        async with self._lock:
            if not self._closed:
                # Its failure is not the commits' (they are in the log): next time.
                with contextlib.suppress(OSError):
                    await self._settle(_checkpoint)

    # -- other threads' connections ----------------------------------------------------------
    def _thread_db(self) -> sqlite3.Connection:
        """A connection for the calling thread, not the loop's, to use and give back
        (``_thread_db_back``); ``WouldWait`` if the store is closed, ``THREAD_CONNECTIONS``
        are in use, or one cannot be opened at once."""
        with self._threads_lock:
            if self._closed:
                raise offloop.WouldWait  # the loop's way says so
            if self._thread_free:
                return self._thread_free.pop()
            if self._thread_count >= THREAD_CONNECTIONS:
                raise offloop.WouldWait
            self._thread_count += 1
        try:
            return sql.connect(self.path, self._pragma, self.busy_timeout, loop=True)
        except (sqlite3.Error, OSError) as exc:
            with self._threads_lock:
                self._thread_count -= 1
            raise offloop.WouldWait from exc

    def _thread_db_back(self, db: sqlite3.Connection, *, good: bool) -> None:
        """Give back a connection of ``_thread_db``'s: its read transaction ended, kept for
        the next thread; closed if it failed (``good`` False) or the store is closed."""
        keep = good and sql.rollback(db)
        with self._threads_lock:
            if keep and not self._closed:
                self._thread_free.append(db)
                return
            self._thread_count -= 1
        _close_all([db])

    # -- the worker threads ------------------------------------------------------------------
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

    async def _read_job(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``job`` on the reader thread's connection (a view's fallback)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, self._in_worker, job, True)

    def _in_worker(self, job: Callable[[sqlite3.Connection], _T], reader: bool = False) -> _T:
        """``job`` on the worker's connection, or with ``reader`` the reader's (each opened
        on first use, on its own thread). A write transaction the job left open, by
        failing, is rolled back."""
        try:
            if reader:
                if self._read_db is None:
                    self._read_db = sql.connect(self.path, self._pragma, self.busy_timeout)
                return job(self._read_db)
            if self._db is None:
                self._db = sql.connect(self.path, self._pragma, self.busy_timeout)
            try:
                return job(self._db)
            except BaseException:
                if not sql.rollback(self._db):
                    # Closing a connection rolls back what it had open; the next call reopens.
                    db, self._db = self._db, None
                    _close_all([db])
                raise
        except sqlite3.Error as exc:
            raise self._os_error(exc) from exc

    def _os_error(self, exc: sqlite3.Error) -> OSError:
        return sql.os_error(exc, self.path, self.busy_timeout)


def _checkpoint(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()


def _close_all(dbs: list[sqlite3.Connection | None]) -> None:
    """Close connections (on the worker: the last one to close checkpoints the WAL)."""
    for db in dbs:
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()


__all__ = ["CHECKPOINT_EVERY", "THREAD_CONNECTIONS", "VIEW_CONNECTIONS", "Gone", "SQLiteThreads"]
