"""The one seam under all metadata: an ordered, transactional key-value store.

Keys and values are ``bytes``; keys sort bytewise. The Name, File and Block layers
(``layers.py``) are written against this interface only, so every backend (in-memory, SQLite,
PostgreSQL) runs the same contract tests (``tests/test_kv_contract.py``).

Transactions are serializable: everything read and written inside one ``async with
store.transaction() as txn`` block is applied atomically at the end of the block, or not at all
if the block raises (or is cancelled). Outside a transaction, ``store.get`` and ``store.scan``
see only committed data.

A *view* (``async with store.view() as v``) reads without writing: every read in it sees one
committed state, the caller's own open transaction excepted. It is what stat, listings and
readers use: a backend may serve it far more cheaply than a transaction (``SQLiteKV`` reads on
the event loop's thread, PostgreSQL at REPEATABLE READ on a reader connection, neither taking
the transactions' lock). The default is a transaction that refuses writes. A *thread view*
(``store.thread_view()``, where a backend has one) is a view for another thread than the event
loop's, whose reads never wait (``offloop``).
"""

from __future__ import annotations

import abc
import errno
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from types import TracebackType


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    p = bytearray(prefix)
    while p:
        if p[-1] != 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None


class Transaction(abc.ABC):
    """Reads and writes inside one atomic unit. Reads see this transaction's own writes."""

    @abc.abstractmethod
    async def get(self, key: bytes) -> bytes | None:
        """The value at ``key`` or None."""

    @abc.abstractmethod
    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        """Pairs whose key starts with ``prefix``, in key order.

        ``start`` (inclusive) skips keys below it; ``limit`` caps how many pairs come back.
        """

    @abc.abstractmethod
    async def put(self, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` (insert or replace)."""

    @abc.abstractmethod
    async def delete(self, key: bytes) -> None:
        """Remove ``key``; no error if it is absent."""


class KVStore(abc.ABC):
    """An ordered, transactional key-value store.

    Raises only ``OSError`` subclasses for backend failures; after a failed or cancelled
    transaction nothing it wrote is visible.
    """

    @abc.abstractmethod
    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Transaction]:
        """Begin a serializable transaction; it commits when the ``async with`` block exits
        normally and rolls back when it raises or is cancelled.

        ``durable=False``: the block may exit once the commit is visible, before it is
        durable; ``sync`` waits for that. A transaction that commits after it is durable
        with it (commits are durable in commit order)."""

    def view(self) -> AbstractAsyncContextManager[Transaction]:
        """A read-only view of the committed state (module docstring): its reads see one
        state, and ``put``/``delete`` raise ``OSError(EROFS)``. Like a transaction, it
        fails with ``OSError(EDEADLK)`` in a task that holds a transaction on this store."""
        return ReadOnly(self.transaction(durable=False))

    def thread_view(self) -> AbstractAsyncContextManager[Transaction] | None:
        """A view for a thread other than the event loop's, inside ``offloop.run_here``:
        its reads answer at once or raise ``offloop.WouldWait``, never suspend, and see the
        last commit, as ``view``'s do. None: this store has none (every read goes to the
        loop). It is what lets the FUSE mount stat without a hop into the loop."""
        return None

    async def sync(self) -> None:
        """Return once every transaction committed so far is durable (a no-op for a store
        whose every commit is durable when it returns)."""
        return None

    async def get(self, key: bytes) -> bytes | None:
        async with self.transaction() as txn:
            return await txn.get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        async with self.transaction() as txn:
            return await txn.scan(prefix, start=start, limit=limit)

    async def iter_prefix(
        self, prefix: bytes, *, batch: int = 1000
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every pair under ``prefix`` in key order, read in batches of separate transactions
        (so a long walk does not hold the store; concurrent writes may or may not be seen)."""
        start: bytes | None = None
        while True:
            rows = await self.scan(prefix, start=start, limit=batch)
            for row in rows:
                yield row
            if len(rows) < batch:
                return
            start = rows[-1][0] + b"\x00"

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the backend; the store must not be used afterwards."""


class View(Transaction):
    """A transaction that only reads: ``put`` and ``delete`` raise ``OSError(EROFS)``. Every
    backend's views and thread views are one."""

    async def put(self, key: bytes, value: bytes) -> None:
        raise read_only()

    async def delete(self, key: bytes) -> None:
        raise read_only()


class ReadOnly(View):
    """A transaction (or any context giving one) whose writes are refused: the default
    ``KVStore.view``."""

    def __init__(self, inner: AbstractAsyncContextManager[Transaction]) -> None:
        self._inner = inner
        self._txn: Transaction | None = None

    async def __aenter__(self) -> ReadOnly:
        self._txn = await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._txn = None
        await self._inner.__aexit__(exc_type, exc, tb)

    def _open(self) -> Transaction:
        if self._txn is None:
            raise OSError(errno.EBADF, "the view is not open")
        return self._txn

    async def get(self, key: bytes) -> bytes | None:
        return await self._open().get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        return await self._open().scan(prefix, start=start, limit=limit)


def read_only() -> OSError:
    """What a write into a view raises."""
    return OSError(errno.EROFS, "a metadata view is read-only")


__all__ = ["KVStore", "ReadOnly", "Transaction", "View", "prefix_end", "read_only"]
