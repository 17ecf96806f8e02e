"""What the metadata backends share: transactions one at a time on the event loop, writes
kept in the transaction until they must go, and group commit.

- ``SerialStore``: one transaction at a time per store object (an ``asyncio.Lock`` held for
  the whole block). A task that holds a transaction and starts another one, or calls ``get``
  or ``scan``, gets ``OSError(EDEADLK)`` at once instead of waiting for itself. A closed
  store answers ``OSError(EBADF)``.
- ``BufferedTransaction``: puts and deletes stay in the transaction object until its next
  read or its commit, so a block that only writes costs the backend one round trip. Gets see
  the transaction's own writes. A transaction is entered once, and once a backend call fails
  it is "broken": nothing more of it may commit.
- ``DurableStore`` and ``GroupCommit``: commits counted in order, and one flush at a time
  that makes durable every commit counted before it began. A durable commit waits for a
  flush that began after it, starting one if none runs, so concurrent commits share
  flushes.
"""

from __future__ import annotations

import abc
import asyncio
import errno
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, Self, TypeVar

from tectonic_emu.errors import InvalidArgumentError, retrieved
from tectonic_emu.groupsync import GroupCommit
from tectonic_emu.metadata import offloop
from tectonic_emu.metadata.kv import KVStore, Transaction

_T = TypeVar("_T")

Writes = dict[bytes, bytes | None]  # key -> new value, None for a delete


class SerialStore(KVStore):
    """A store whose transactions run one at a time on the event loop (module docstring).
    ``_where`` names the store in its errors (a path, a redacted URL)."""

    _where: str | None = None

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[Any] | None = None
        self._closed = False
        self._waiting = 0  # tasks waiting for the lock

    def _closed_error(self) -> OSError:
        return OSError(errno.EBADF, "metadata store is closed", self._where)

    def _check_not_owner(self) -> asyncio.Task[Any] | None:
        offloop.refuse_here()  # a lock, a transaction: the loop's, never a thread's
        task = asyncio.current_task()
        if task is not None and task is self._owner:
            raise OSError(errno.EDEADLK, "this task already holds a transaction on this store")
        return task

    async def _acquire(self) -> None:
        task = self._check_not_owner()
        if self._closed:
            raise self._closed_error()
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        if self._closed:
            self._lock.release()
            raise self._closed_error()
        self._owner = task

    def _release(self) -> None:
        self._owner = None
        self._lock.release()


class DurableStore(SerialStore):
    """A ``SerialStore`` whose commits may wait for a flush: ``_log`` counts them and shares
    flushes (``GroupCommit``) when ``_group`` is set."""

    _log: GroupCommit
    _group: bool

    async def sync(self) -> None:
        if self._group:
            await self._log.sync()


class OnceTransaction(Transaction):
    """A transaction object entered at most once, that holds its store's lock while open."""

    def __init__(self, store: SerialStore) -> None:
        self._store = store
        self._state = "new"  # -> "open" -> "done" (backends may add states)

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise OSError(errno.EBADF, "a transaction object can be entered only once")
        await self._store._acquire()
        self._state = "open"
        return self

    def _check_open(self) -> None:
        if self._state != "open":
            raise OSError(errno.EBADF, f"transaction is {self._state}, not open")


class BufferedTransaction(OnceTransaction):
    """Writes kept until the next read or the commit (module docstring). A backend
    implements ``_fetch`` (a get that misses the kept writes), ``scan``, ``_started`` (the
    backend holds part of this transaction), ``_commit(writes)`` and ``_abandon()`` (roll
    back what the backend holds), taking the kept writes with ``_take_writes`` whenever it
    sends them with a read. The exit commits, or rolls back, then releases the store, then
    (a durable transaction that wrote) waits for its commit to be flushed: the store is free
    meanwhile, so that others commit into the same flush."""

    _store: DurableStore

    def __init__(self, store: DurableStore, durable: bool = True) -> None:
        super().__init__(store)
        self._durable = durable  # wait for the commit to be durable (else: KVStore.sync)
        self._writes: Writes = {}  # not yet sent to the backend
        # States as OnceTransaction's, and "broken" once a backend call failed.
        self._wrote = False  # writes were sent with a read (so the commit has some)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store = self._store
        broken = self._state == "broken"
        writes, self._writes = self._writes, {}
        self._state = "done"
        seq = 0  # this commit's number, when it wrote and must be made durable
        try:
            if exc_type is None and not broken:
                if writes or self._started:
                    await self._commit(writes)
                    if writes or self._wrote:
                        seq = store._log.count()
            elif self._started:
                await self._abandon()
        finally:
            store._release()
        if broken and exc_type is None:
            raise OSError(errno.EIO, "transaction rolled back: an operation in it failed")
        if seq and store._group and self._durable:
            await store._log.durable(seq)

    @property
    @abc.abstractmethod
    def _started(self) -> bool:
        """Whether the backend holds part of this transaction (a read went out)."""

    @abc.abstractmethod
    async def _commit(self, writes: Writes) -> None:
        """Send ``writes`` and commit; settled even if the caller is cancelled."""

    @abc.abstractmethod
    async def _abandon(self) -> None:
        """Roll back what the backend holds; settled even if the caller is cancelled."""

    def _take_writes(self) -> Writes:
        """The kept writes, now on their way to the backend with a read."""
        writes, self._writes = self._writes, {}
        self._wrote = self._wrote or bool(writes)
        return writes

    async def get(self, key: bytes) -> bytes | None:
        self._check_open()
        if key in self._writes:
            return self._writes[key]
        return await self._fetch(key)

    @abc.abstractmethod
    async def _fetch(self, key: bytes) -> bytes | None:
        """The value at ``key`` in the backend, after sending the kept writes."""

    async def put(self, key: bytes, value: bytes) -> None:
        self._check_open()
        if not isinstance(key, bytes) or not isinstance(value, bytes):
            raise InvalidArgumentError(
                f"keys and values are bytes, got {type(key).__name__} and {type(value).__name__}"
            )
        self._writes[key] = value

    async def delete(self, key: bytes) -> None:
        self._check_open()
        self._writes[key] = None


async def settled(work: Awaitable[_T]) -> _T:
    """Await ``work`` (a commit or a rollback) to its end even if the caller is cancelled
    meanwhile: the cancellation goes on once the outcome is settled."""
    fut = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        retrieved(fut)  # reported by the failed transaction's caller, not the loop
        raise


def pending_in_range(
    writes: Writes, prefix: bytes, start: bytes | None
) -> list[tuple[bytes, bytes | None]]:
    """The kept writes a scan of ``prefix`` from ``start`` covers, in key order."""
    low = prefix if start is None or start < prefix else start
    return sorted((k, v) for k, v in writes.items() if k.startswith(prefix) and k >= low)


def overlay(
    rows: list[tuple[bytes, bytes]],
    pending: list[tuple[bytes, bytes | None]],
    limit: int | None,
    cut: bool,
) -> list[tuple[bytes, bytes]]:
    """A scan's answer with a transaction's kept writes laid over the backend's ``rows``.
    ``pending`` is ``pending_in_range`` of the same scan. The backend was asked for ``limit``
    plus as many rows as ``pending`` deletes; ``cut`` says it returned that many, so keys past
    its last row are unknown and kept puts beyond it are left out (at least ``limit`` rows
    remain before it)."""
    if not pending:
        return rows if limit is None else rows[:limit]
    merged = dict(rows)
    for k, v in pending:
        if cut and rows and k > rows[-1][0]:
            break
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = v
    out = sorted(merged.items())
    return out if limit is None else out[:limit]


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise InvalidArgumentError("scan limit must not be negative", str(limit))


__all__ = [
    "BufferedTransaction",
    "DurableStore",
    "GroupCommit",
    "OnceTransaction",
    "SerialStore",
    "Writes",
    "check_limit",
    "overlay",
    "pending_in_range",
    "settled",
]
