"""``SQLiteKV.view()``: a read-only view, one SQLite read transaction on the loop's thread.

A view takes a view connection of the store's (``SQLiteKV._view_db``), begins a read
transaction with its first read and ends it on exit: every read in it sees one committed
state, that of its first read, without the lease, while transactions commit beside it (WAL
mode). Where no view connection is free, or SQLite is busy at the first read (a process
recovering the WAL, a checkpoint restarting it), the view reads on the store's reader
thread instead, in one read transaction there, one such view at a time.

``SQLiteKV.thread_view()``: the same, for another thread than the loop's (``offloop``): one
read transaction on a connection of that thread's (``SQLiteThreads._thread_db``), every read
answered at once; where SQLite would wait, or fails, ``WouldWait`` sends the caller to the
loop.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable
from typing import TypeVar

from tectonic_emu.metadata import _sqlite_sql as sql
from tectonic_emu.metadata import offloop
from tectonic_emu.metadata._common import check_limit, settled
from tectonic_emu.metadata._sqlite_conns import Gone, SQLiteThreads
from tectonic_emu.metadata._sqlite_lease import Busy
from tectonic_emu.metadata.kv import View

_T = TypeVar("_T")


class SQLiteView(View):
    """A read-only view (``KVStore.view``): one read transaction, on a view connection of
    the loop's, or, if none is free or SQLite is busy at its first read, on the reader
    thread (one such view at a time)."""

    def __init__(self, store: SQLiteThreads) -> None:
        self._store = store
        self._state = "new"  # -> "open" -> "done"
        self._db: sqlite3.Connection | None = None  # a loop connection, in a read transaction
        self._began = False  # a read on _db went through: its snapshot is set
        self._reading = False  # on the reader thread instead (holding the store's _read_lock)

    async def __aenter__(self) -> SQLiteView:
        store = self._store
        if self._state != "new":
            raise OSError(errno.EBADF, "a view object can be entered only once")
        store._bind_loop()
        store._check_not_owner()  # it would not see the caller's own transaction
        if store._closed:
            raise store._closed_error()
        self._db = store._view_db()
        self._state = "open"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        store, db = self._store, self._db
        self._state, self._db = "done", None
        if db is not None:
            if not sql.rollback(db) or store._closed:
                store._drop(db)
            else:
                store._views.append(db)
        if self._reading:
            try:
                await settled(store._read_job(sql.rollback))
            finally:
                store._read_lock.release()

    async def _read(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._state != "open":
            raise OSError(errno.EBADF, f"view is {self._state}, not open")
        store = self._store
        if (db := self._db) is not None:
            try:
                answer = store._here(db, job if self._began else _begun(job))
                self._began = True
                return answer
            except Busy:
                if self._began:  # not seen from SQLite in WAL mode once a read went through
                    raise OSError(errno.EBUSY, "metadata store: busy", store.path) from None
                self._db = None
                store._views.append(db)  # _here rolled it back
            except Gone:
                self._db = None  # _here closed it
                raise
        if not self._reading:
            await store._read_lock.acquire()
            self._reading = True
            return await store._read_job(_begun(job))
        return await store._read_job(job)

    async def get(self, key: bytes) -> bytes | None:
        db = self._db
        if db is not None and self._began and self._state == "open":
            # The common case, a read after the first on a loop connection, without the
            # layers (a stat is four of them: about 1.5 us each, of 45).
            try:
                return sql.select(db, key)
            except sqlite3.Error:
                pass  # the general way, which knows what to make of it: a retry there
        return await self._read(lambda db: sql.select(db, key))

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        check_limit(limit)
        return await self._read(lambda db: sql.scan(db, prefix, start, limit))


class SQLiteThreadView(View):
    """A thread view (``KVStore.thread_view``, module docstring): entered and read only on
    the thread that made it, inside ``offloop.run_here``."""

    def __init__(self, store: SQLiteThreads) -> None:
        self._store = store
        self._db: sqlite3.Connection | None = None
        self._good = True  # no read failed: the connection may serve the next view

    async def __aenter__(self) -> SQLiteThreadView:
        if self._db is not None or not self._good:
            raise OSError(errno.EBADF, "a view object can be entered only once")
        db = self._store._thread_db()
        try:
            db.execute("BEGIN")
        except sqlite3.Error as exc:
            self._store._thread_db_back(db, good=False)
            raise offloop.WouldWait from exc
        self._db = db
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        db, self._db = self._db, None
        if db is not None:
            self._store._thread_db_back(db, good=self._good)

    def _read(self, job: Callable[[sqlite3.Connection], _T]) -> _T:
        if (db := self._db) is None:
            raise OSError(errno.EBADF, "view is not open")
        try:
            return job(db)
        except sqlite3.Error as exc:  # busy, or failing: the loop's way knows what to do
            self._good = False
            raise offloop.WouldWait from exc

    async def get(self, key: bytes) -> bytes | None:
        return self._read(lambda db: sql.select(db, key))

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        check_limit(limit)
        return self._read(lambda db: sql.scan(db, prefix, start, limit))


def _begun(job: Callable[[sqlite3.Connection], _T]) -> Callable[[sqlite3.Connection], _T]:
    """``job`` as a view's first read: in a read transaction begun with it."""

    def first(db: sqlite3.Connection) -> _T:
        db.execute("BEGIN")
        return job(db)

    return first


__all__ = ["SQLiteThreadView", "SQLiteView"]
