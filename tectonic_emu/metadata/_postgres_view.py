"""``PostgresKV.view()``: a read-only view, one REPEATABLE READ transaction on a reader.

A view takes a connection of the store's reader pool and begins ``REPEATABLE READ READ
ONLY`` there: every read in it sees the snapshot of its first statement, without the
transactions' advisory lock, so it neither waits for them nor holds them up (the default
``KVStore.view``, a transaction, would take the lock). It ends with a rollback, which for
a read-only transaction commits as much, and the connection goes back to the pool.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tectonic_emu.metadata._common import check_limit, settled
from tectonic_emu.metadata.kv import View

_T = TypeVar("_T")

_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

Call = Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]


class PostgresView(View):
    """``readers()`` checks the store may be used and returns its reader pool; ``call``
    awaits a job with its failures as OSError; ``statements`` is the table's SQL."""

    def __init__(self, readers: Callable[[], Awaitable[Any]], call: Call, statements: Any) -> None:
        self._readers = readers
        self._call = call
        self._sql = statements
        self._pool: Any = None
        self._conn: Any = None
        self._state = "new"  # -> "open" -> "done"

    async def __aenter__(self) -> PostgresView:
        if self._state != "new":
            raise OSError(errno.EBADF, "a view object can be entered only once")
        pool = await self._readers()
        conn = await self._call(pool.acquire)
        try:
            await self._call(
                lambda: conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            )
        except BaseException:
            await pool.release(conn)
            raise
        self._pool, self._conn, self._state = pool, conn, "open"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pool, conn = self._pool, self._conn
        self._state, self._pool, self._conn = "done", None, None
        try:
            await settled(self._call(lambda: conn.execute("ROLLBACK")))
        except OSError:
            conn.terminate()  # whatever it had open ends with it
        finally:
            await pool.release(conn)

    async def _read(self, job: Callable[[Any], Awaitable[_T]]) -> _T:
        if self._state != "open":
            raise OSError(errno.EBADF, f"view is {self._state}, not open")
        conn = self._conn
        answer: _T = await self._call(lambda: job(conn))
        return answer

    async def get(self, key: bytes) -> bytes | None:
        value = await self._read(lambda c: c.fetchval(self._sql.get, key))
        return None if value is None else bytes(value)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        check_limit(limit)
        rows: list[tuple[bytes, bytes]] = await self._read(
            lambda c: self._sql.scan(c, prefix, start, limit)
        )
        return rows


__all__ = ["PostgresView"]
