"""``PostgresKV``: the metadata seam in a PostgreSQL table, for clusters that span hosts.

One table, ``k bytea PRIMARY KEY, v bytea``: PostgreSQL compares ``bytea`` bytewise, so its
primary-key index is the ordered key space the seam promises, and a prefix scan is one index
range scan. Every client host reaches the same database through asyncpg.

Isolation: serializable, by running transactions one at a time, as SQLite does. A
transaction takes one transaction-scoped advisory lock (``pg_advisory_xact_lock``, keyed by
the table) with its first read or write, the counterpart of SQLite's lease (``_sqlite_lease``), and
holds it until it commits or rolls back; its statements run at READ COMMITTED, which under
that lock sees every transaction committed before it. PostgreSQL's own SERIALIZABLE level
would let transactions overlap, but it ends a conflicting one with a serialization failure
that its caller must retry from the start, and a block of Python code cannot be replayed
here. Reads outside transactions (``get``, ``scan``, ``iter_prefix``) take no lock and see
the last commit.

Group commit (``synchronous="full"``). A transaction commits with ``synchronous_commit =
off``: its commit is visible at once and the lock goes to the next transaction, without
waiting for the WAL to reach the disk. A durable transaction then waits for a flush that
began after its commit: a tiny transaction on a connection of its own that does commit
synchronously. Its commit record comes after every commit before it in the WAL, so its flush
covers them all. One flush serves every commit made while the previous one ran, as in
``SQLiteKV``. Commits are durable in commit order. ``"normal"`` never waits for the flush: a
server crash may lose the last commits, never half of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import ipaddress
import os
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from tectonic_emu.config import redact
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.metadata import offloop
from tectonic_emu.metadata._common import (
    BufferedTransaction,
    DurableStore,
    GroupCommit,
    Writes,
    check_limit,
    settled,
)
from tectonic_emu.metadata._postgres_view import PostgresView
from tectonic_emu.metadata.kv import prefix_end

Synchronous = Literal["full", "normal"]

_T = TypeVar("_T")

_TABLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
READERS = 4  # connections for reads outside transactions

# SQLSTATE (or its class, the first two characters) -> errno; anything else is EIO.
_ERRNO = {
    "55P03": errno.EBUSY,  # lock_not_available: lock_timeout ran out
    "40P01": errno.EBUSY,  # deadlock_detected
    "53100": errno.ENOSPC,  # disk_full
    "25006": errno.EROFS,  # read_only_sql_transaction (a standby)
    "42501": errno.EACCES,  # insufficient_privilege
    "28": errno.EACCES,  # invalid authorization (role, password)
    "3D000": errno.ENOENT,  # invalid_catalog_name: no such database
    "57014": errno.ETIMEDOUT,  # query_canceled (statement_timeout)
    "25P03": errno.ETIMEDOUT,  # idle_in_transaction_session_timeout: the lease ran out
    "57P": errno.ECONNRESET,  # the server shutting down or restarting
    "08": errno.ECONNRESET,  # connection exceptions
    "53": errno.ENOMEM,  # insufficient resources (but disk_full above)
}


# A transaction that holds the lock and sends nothing for this long (its process paused,
# stalled or dead) is ended by the server, which rolls it back and frees the lock for the
# others: nobody waits behind a stopped client for longer than this.
DEFAULT_LEASE = 5.0


def _lock_key(table: str) -> int:
    """The advisory lock of ``table``: a signed 64-bit number from its name."""
    return int.from_bytes(hashlib.blake2b(table.encode(), digest_size=8).digest(), signed=True)


def _is_local_host(host: str) -> bool:
    host = urllib.parse.unquote(host).strip("[]")
    if host in ("", "localhost") or host.startswith("/"):  # a Unix socket directory
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def with_ssl_default(dsn: str) -> str:
    """``dsn`` with ``sslmode=require`` added when it names a host other than this one (not
    a loopback address or a Unix socket directory) and sets no ``sslmode`` of its own, in the
    URL or in ``PGSSLMODE``: metadata never crosses a network in plain text by default.
    Any ``sslmode`` given is passed to asyncpg as it is: ``verify-full`` (with
    ``sslrootcert``) checks the server's certificate and name, ``disable`` turns TLS off."""
    parts = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qs(parts.query)
    if "sslmode" in query or os.environ.get("PGSSLMODE"):
        return dsn
    hosts = query.get("host") or [
        re.sub(r":\d*$", "", h) for h in parts.netloc.rpartition("@")[2].split(",")
    ]
    if all(_is_local_host(h) for h in hosts):
        return dsn
    extra = f"{parts.query}&sslmode=require" if parts.query else "sslmode=require"
    return urllib.parse.urlunsplit(parts._replace(query=extra))


class PostgresKV(DurableStore):
    """An ordered key-value store in the table ``table`` of the PostgreSQL database at ``dsn``
    (``postgresql://user@host:port/db``; a password from ``PGPASSWORD`` or ``~/.pgpass``).

    Transactions from every process and host run one at a time (see the module docstring);
    one that waits longer than ``busy_timeout`` seconds for its turn fails with
    ``OSError(EBUSY)``. ``synchronous``: ``"full"`` makes every commit durable before it
    returns (by group commit), ``"normal"`` may lose the last commits if the server crashes.
    ``lease``: a transaction that holds the lock and sends nothing for this many seconds (its
    process stopped, stalled or dead) is ended by the server (``idle_in_transaction_session_
    timeout``), which rolls it back and frees the lock; its own commit then fails with
    ``OSError(ECONNRESET)`` saying nothing of it committed. A transaction never continues on
    another connection than the one it began on.

    Connections open on first use; ``await PostgresKV.open(...)`` opens them at once, so an
    unreachable server or a missing database fails there. Errors: every failure is an
    ``OSError`` with an errno (``ECONNREFUSED`` or ``ECONNRESET`` for the network, ``EACCES``,
    ``ENOENT`` for a missing database, ``EBUSY``, ``ENOSPC``, ``EROFS``, ``ETIMEDOUT``, else
    ``EIO``); ``OSError(EDEADLK)`` for a transaction (or ``get``/``scan``) started by a task
    that already holds one on this store; ``OSError(EBADF)`` after ``close``. A connection
    that failed is dropped and the next call opens a new one.
    """

    def __init__(
        self,
        dsn: str,
        *,
        table: str = "tectonic_kv",
        synchronous: Synchronous = "full",
        busy_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        if not lease > 0:
            raise InvalidArgumentError(
                f"a transaction lease must be more than 0 seconds, not {lease!r}"
            )
        if synchronous not in ("full", "normal"):
            raise InvalidArgumentError("synchronous must be 'full' or 'normal'", synchronous)
        if not _TABLE.fullmatch(table):
            raise InvalidArgumentError(
                "a table name is lower-case letters, digits and _, at most 63", table
            )
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise InvalidArgumentError("not a postgresql:// URL", redact(dsn))
        super().__init__()
        self.dsn = with_ssl_default(dsn)
        self._where = redact(dsn)  # errors name the database, never its password
        self.table = table
        self.synchronous: Synchronous = synchronous
        self.busy_timeout = busy_timeout
        self.connect_timeout = connect_timeout
        self.lease = lease
        self._key = _lock_key(table)
        self._conn: Any = None  # transactions' connection (asyncpg.Connection)
        self._pool: asyncio.Future[Any] | None = None  # reads outside transactions: a Pool
        self._sync_conn: Any = None  # group commit's flushes
        self._ready = False  # the table exists (made by whichever connection came first)
        self._loop: asyncio.AbstractEventLoop | None = None  # the connections' loop
        self._group = synchronous == "full"
        self._log = GroupCommit(lambda: self._flush())
        self._sql = _Statements(table)

    @classmethod
    async def open(cls, dsn: str, **kwargs: Any) -> PostgresKV:
        """A store whose connections are open and whose table exists (created if missing)."""
        store = cls(dsn, **kwargs)
        try:
            await store._acquire()
            try:
                await store._connection()
            finally:
                store._release()
            await store._readers()
        except BaseException:
            await store.close()
            raise
        return store

    def transaction(self, *, durable: bool = True) -> _PostgresTransaction:
        return _PostgresTransaction(self, durable)

    def view(self) -> PostgresView:
        return PostgresView(self._view_readers, self._call, self._sql)

    async def _view_readers(self) -> Any:
        """The reader pool, for a view (``_postgres_view``) that may begin now."""
        self._bind_loop()
        self._check_not_owner()  # it would not see the caller's own transaction
        if self._closed:
            raise self._closed_error()
        return await self._readers()

    async def sync(self) -> None:
        self._bind_loop()
        await super().sync()

    async def get(self, key: bytes) -> bytes | None:
        value = await self._read_only(lambda c: c.fetchval(self._sql.get, key))
        return None if value is None else bytes(value)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        check_limit(limit)
        return await self._read_only(lambda c: self._sql.scan(c, prefix, start, limit))

    async def count(self) -> int:
        """How many keys the table holds."""
        return int(await self._read_only(lambda c: c.fetchval(self._sql.count)))

    async def close(self) -> None:
        if self._closed:
            return
        self._bind_loop()
        self._check_not_owner()
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            await self._log.settle()
            for conn in (self._conn, self._sync_conn):
                if conn is not None:
                    await _close_quietly(conn)
            self._conn = self._sync_conn = None
            if self._pool is not None:
                starting, self._pool = self._pool, None
                await asyncio.wait([starting])
                if not starting.cancelled() and starting.exception() is None:
                    pool = starting.result()
                    try:
                        await asyncio.wait_for(pool.close(), self.connect_timeout)
                    except (TimeoutError, Exception):
                        pool.terminate()

    # -- connections ---------------------------------------------------------------------
    async def _connect(self, **settings: str) -> Any:
        import asyncpg

        server_settings = {"application_name": "tectonic-emu", **settings}
        return await self._call(
            lambda: asyncpg.connect(
                self.dsn, timeout=self.connect_timeout, server_settings=server_settings
            )
        )

    async def _connection(self) -> Any:
        """The transactions' connection (lock held), the table created on first use."""
        if self._conn is None or self._conn.is_closed():
            self._conn = await self._connect()
            try:
                await self._ensure_table(self._conn)
            except BaseException:
                await self._drop_connection()
                raise
        return self._conn

    async def _ensure_table(self, conn: Any) -> None:
        """Create the table if it is missing, under the lock (two processes creating it at
        once would clash in the catalog)."""
        if not self._ready:
            script = f"{self._sql.begin(self.busy_timeout, self._key)}; {self._sql.create}; COMMIT"
            await self._call(lambda: conn.execute(script))
            self._ready = True

    async def _drop_connection(self) -> None:
        """Forget the transactions' connection; the server rolls back what it had open."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def _readers(self) -> Any:
        """The pool of connections for reads outside transactions, made once."""
        if self._pool is None:
            self._pool = asyncio.ensure_future(self._make_pool())
        try:
            return await asyncio.shield(self._pool)
        except BaseException:
            if self._pool.done():
                self._pool = None  # a failed start: the next call tries again
            raise

    async def _make_pool(self) -> Any:
        import asyncpg

        pool = await self._call(
            lambda: asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=READERS,
                timeout=self.connect_timeout,
                server_settings={"application_name": "tectonic-emu"},
            )
        )
        try:
            async with pool.acquire() as conn:
                await self._ensure_table(conn)
        except BaseException:
            pool.terminate()
            raise
        return pool

    async def _read_only(self, job: Callable[[Any], Awaitable[_T]]) -> _T:
        self._bind_loop()
        self._check_not_owner()  # it would not see the caller's own transaction
        if self._closed:
            raise self._closed_error()
        pool = await self._readers()

        async def pooled() -> _T:
            async with pool.acquire() as conn:
                return await job(conn)

        return await self._call(pooled)

    async def _call(self, make: Callable[[], Awaitable[_T]]) -> _T:
        """Await ``make()``, its failures as OSError."""
        try:
            return await make()
        except OSError as exc:  # refused, unreachable, reset: asyncio's own
            raise OSError(exc.errno or errno.EIO, f"metadata store: {exc}", self._where) from exc
        except TimeoutError as exc:
            raise OSError(errno.ETIMEDOUT, "metadata store: timed out", self._where) from exc
        except Exception as exc:
            mapped = self._os_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def _os_error(self, exc: Exception) -> OSError | None:
        import asyncpg

        if isinstance(exc, asyncpg.PostgresError):
            state = str(getattr(exc, "sqlstate", "") or "")
            err = next(
                (e for s, e in _ERRNO.items() if state.startswith(s)),
                errno.EIO,
            )
            message = f"metadata store: {exc}"
            if state == "55P03":
                message += f" (waited {self.busy_timeout:g} s for other transactions)"
            elif state == "25P03":
                message = (
                    f"metadata store: this transaction sat idle past its {self.lease:g} s "
                    "lease holding the lock; the server ended it and nothing of it committed"
                )
            return OSError(err, message, self._where)
        if isinstance(exc, asyncpg.InterfaceError):
            return OSError(errno.ECONNRESET, f"metadata store: {exc}", self._where)
        return None

    # -- the loop's lock, as in SQLiteKV ---------------------------------------------------
    def _bind_loop(self) -> None:
        """Connections belong to the event loop that made them: used from another loop (one
        ``asyncio.run`` after another), the store forgets them and opens new ones there."""
        offloop.refuse_here()  # asyncpg is the loop's: no thread views
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._loop is not None:
            old = [c for c in (self._conn, self._sync_conn) if c is not None]
            for conn in old:
                with contextlib.suppress(Exception):
                    conn.terminate()
            self._conn = self._sync_conn = None
            self._pool = None
            self._log.forget()
            self._lock = asyncio.Lock()
            self._owner = None
        self._loop = loop

    async def _acquire(self) -> None:
        self._bind_loop()
        await super()._acquire()

    # -- group commit ------------------------------------------------------------------------
    async def _flush(self) -> None:
        """A transaction that commits synchronously: an xid, so a commit record to flush."""
        try:
            if self._sync_conn is None or self._sync_conn.is_closed():
                self._sync_conn = await self._connect(synchronous_commit="on")
            conn = self._sync_conn
            await self._call(lambda: conn.execute(_FLUSH))
        except OSError as exc:
            if self._sync_conn is not None:
                self._sync_conn.terminate()
                self._sync_conn = None
            raise OSError(
                exc.errno, f"metadata store: a commit may not be durable: {exc}", self._where
            ) from exc


_FLUSH = "BEGIN; SELECT txid_current(); COMMIT"


class _Statements:
    """The SQL for one table."""

    def __init__(self, table: str) -> None:
        t = table
        self.create = f"CREATE TABLE IF NOT EXISTS {t} (k bytea PRIMARY KEY, v bytea NOT NULL)"
        self.get = f"SELECT v FROM {t} WHERE k = $1"
        self.count = f"SELECT count(*) FROM {t}"
        self.upsert = (
            f"INSERT INTO {t} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) "
            "ON CONFLICT (k) DO UPDATE SET v = excluded.v"
        )
        self.delete = f"DELETE FROM {t} WHERE k = ANY($1::bytea[])"
        self.scan_to = f"SELECT k, v FROM {t} WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3"
        self.scan_all = f"SELECT k, v FROM {t} WHERE k >= $1 ORDER BY k LIMIT $2"

    @staticmethod
    def begin(
        busy_timeout: float, key: int, asynchronous: bool = False, lease: float | None = None
    ) -> str:
        """One round trip: begin, bound the wait for the lock and the holder's idle time
        (the lease), take it."""
        sync = "SET LOCAL synchronous_commit = off; " if asynchronous else ""
        idle = (
            f"SET LOCAL idle_in_transaction_session_timeout = {max(1, int(lease * 1000))}; "
            if lease is not None
            else ""
        )
        return (
            "BEGIN ISOLATION LEVEL READ COMMITTED; "
            f"SET LOCAL lock_timeout = {max(1, int(busy_timeout * 1000))}; {sync}{idle}"
            f"SELECT pg_advisory_xact_lock({key})"
        )

    async def apply(self, conn: Any, writes: Writes) -> None:
        puts = [(k, v) for k, v in writes.items() if v is not None]
        if puts:
            await conn.execute(self.upsert, [k for k, _ in puts], [v for _, v in puts])
        if len(puts) < len(writes):
            await conn.execute(self.delete, [k for k, v in writes.items() if v is None])

    async def scan(
        self, conn: Any, prefix: bytes, start: bytes | None, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        low = prefix if start is None or start < prefix else start
        end = prefix_end(prefix)
        if end is None:
            rows = await conn.fetch(self.scan_all, low, limit)
        else:
            rows = await conn.fetch(self.scan_to, low, end, limit)
        return [(bytes(r[0]), bytes(r[1])) for r in rows]


class _PostgresTransaction(BufferedTransaction):
    """Writes are kept here and sent with the next read or with the commit, so a transaction
    that only writes costs three round trips: begin and lock, the writes, the commit."""

    _store: PostgresKV

    def __init__(self, store: PostgresKV, durable: bool = True) -> None:
        super().__init__(store, durable)
        self._begun = False  # BEGIN (and the lock) reached the server
        self._conn: Any = None  # the connection it began on
        self._interrupted = False  # a call was cancelled or failed mid-flight

    @property
    def _started(self) -> bool:
        return self._begun

    async def _commit(self, writes: Writes) -> None:
        await settled(self._send_commit(writes))

    async def _abandon(self) -> None:
        if self._interrupted:
            await self._store._drop_connection()  # mid-call: the server rolls it back
        else:
            await settled(self._rollback())

    async def _begin(self) -> Any:
        store = self._store
        if self._begun:
            # The connection it began on, or nothing: the server ended the session (the
            # lease ran out, a reset), rolled the transaction back and freed the lock, and
            # another connection would run the rest in autocommit, half a transaction.
            conn = store._conn
            if conn is None or conn is not self._conn or conn.is_closed():
                raise self._session_ended()
            return conn
        conn = await store._connection()
        sql = store._sql.begin(store.busy_timeout, store._key, asynchronous=True, lease=store.lease)
        self._begun = True
        self._conn = conn
        await conn.execute(sql)
        return conn

    def _session_ended(self) -> OSError:
        return OSError(
            errno.ECONNRESET,
            "metadata store: this transaction's session ended before it committed (the server "
            f"ends one idle past its {self._store.lease:g} s lease, or it was restarted or "
            "reset); nothing of it committed",
            self._store._where,
        )

    def _mapped(self, exc: Exception) -> OSError | None:
        """``exc`` as an OSError: a begun transaction whose connection failed under it (the
        server ended the session) says so; else the store's mapping."""
        import asyncpg

        if self._begun and isinstance(
            exc,
            asyncpg.InterfaceError
            | asyncpg.exceptions.InternalClientError
            | asyncpg.exceptions.IdleInTransactionSessionTimeoutError
            | asyncpg.exceptions.ConnectionDoesNotExistError,
        ):
            return self._session_ended()
        return self._store._os_error(exc)

    async def _send_commit(self, writes: Writes) -> None:
        store = self._store
        try:
            conn = await self._begin()
            if writes:
                await store._sql.apply(conn, writes)
            await conn.execute("COMMIT")
        except BaseException as exc:
            await store._drop_connection()  # whatever was open is rolled back by the server
            if isinstance(exc, Exception) and (mapped := self._mapped(exc)) is not None:
                raise mapped from exc
            raise

    async def _rollback(self) -> None:
        try:
            await self._store._conn.execute("ROLLBACK")
        except BaseException:
            await self._store._drop_connection()
            raise

    async def _read(self, job: Callable[[Any], Awaitable[_T]]) -> _T:
        store = self._store
        writes = self._take_writes()

        async def work() -> _T:
            conn = await self._begin()
            try:
                if writes:
                    await store._sql.apply(conn, writes)
                return await job(conn)
            except Exception as exc:
                if isinstance(exc, OSError) or (mapped := self._mapped(exc)) is None:
                    raise
                raise mapped from exc

        try:
            return await store._call(work)
        except BaseException:
            # Its writes may be half applied: nothing more of this transaction may commit.
            self._state = "broken"
            self._interrupted = True
            raise

    async def _fetch(self, key: bytes) -> bytes | None:
        value = await self._read(lambda c: c.fetchval(self._store._sql.get, key))
        return None if value is None else bytes(value)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        self._check_open()
        check_limit(limit)
        return await self._read(lambda c: self._store._sql.scan(c, prefix, start, limit))


async def _close_quietly(conn: Any) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5)
    except (TimeoutError, Exception):
        conn.terminate()


__all__ = ["PostgresKV"]
