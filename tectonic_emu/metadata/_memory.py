"""``MemoryKV``: the in-memory backend of the metadata seam, for tests and one-process runs."""

from __future__ import annotations

import bisect
from types import TracebackType

from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.metadata import offloop
from tectonic_emu.metadata._common import OnceTransaction, SerialStore, check_limit
from tectonic_emu.metadata.kv import View, prefix_end


class MemoryKV(SerialStore):
    """An ordered key-value store in this process's memory, used from one event loop.

    Keys live in a sorted list beside a dict, so a scan costs O(log n + k). Transactions run
    one at a time (an ``asyncio.Lock`` held for the whole block) and write in place with an undo
    log, so a block that raises or is cancelled is rolled back when it exits.

    Errors: ``OSError(EDEADLK)`` for a transaction (or ``get``/``scan``) started by a task that
    already holds one on this store, ``OSError(EBADF)`` after ``close``.

    Thread views (``thread_view``, for other threads than the loop's) read the same memory
    without the lock, as a seqlock's readers do: ``_seq`` is odd while a transaction is open
    (its writes are in place, uncommitted), and a view that finds it odd, or changed by its
    end, answers ``WouldWait`` (the caller asks the loop instead).
    """

    def __init__(self) -> None:
        super().__init__()
        self._keys: list[bytes] = []  # sorted, always the keys of _data
        self._data: dict[bytes, bytes] = {}
        self._seq = 0  # odd while a transaction is open; moves at each start and end

    def transaction(self, *, durable: bool = True) -> _MemoryTransaction:
        return _MemoryTransaction(self)  # nothing here is durable: nothing to wait for

    def thread_view(self) -> _MemoryThreadView:
        return _MemoryThreadView(self)

    async def get(self, key: bytes) -> bytes | None:
        await self._acquire()
        try:
            return self._data.get(key)
        finally:
            self._release()

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        await self._acquire()
        try:
            return self._scan(prefix, start, limit)
        finally:
            self._release()

    async def close(self) -> None:
        if self._closed:
            return
        self._check_not_owner()
        async with self._lock:
            self._closed = True

    # -- internals shared with _MemoryTransaction --------------------------------------------
    def _scan(
        self, prefix: bytes, start: bytes | None, limit: int | None
    ) -> list[tuple[bytes, bytes]]:
        check_limit(limit)
        keys = self._keys
        lo = bisect.bisect_left(keys, prefix if start is None or start < prefix else start)
        end = prefix_end(prefix)
        hi = len(keys) if end is None else bisect.bisect_left(keys, end, lo)
        if limit is not None:
            hi = min(hi, lo + limit)
        data = self._data
        return [(k, data[k]) for k in keys[lo:hi]]

    def _write(self, key: bytes, value: bytes | None) -> bytes | None:
        """Set (or with None, remove) ``key``; return the value it had."""
        old = self._data.get(key)
        if value is not None:
            if old is None:
                bisect.insort(self._keys, key)
            self._data[key] = value
        elif old is not None:
            del self._data[key]
            del self._keys[bisect.bisect_left(self._keys, key)]
        return old


class _MemoryTransaction(OnceTransaction):
    _store: MemoryKV

    def __init__(self, store: MemoryKV) -> None:
        super().__init__(store)
        self._undo: dict[bytes, bytes | None] = {}  # each written key's value before this txn

    async def __aenter__(self) -> _MemoryTransaction:
        await super().__aenter__()
        self._store._seq += 1  # odd: thread views stay away (MemoryKV)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = "done"
        try:
            if exc_type is not None:
                for key, old in self._undo.items():
                    self._store._write(key, old)
        finally:
            self._undo = {}
            self._store._seq += 1  # even: what is in place is committed (or undone)
            self._store._release()

    async def get(self, key: bytes) -> bytes | None:
        self._check_open()
        return self._store._data.get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        self._check_open()
        return self._store._scan(prefix, start, limit)

    async def put(self, key: bytes, value: bytes) -> None:
        self._check_open()
        if not isinstance(key, bytes) or not isinstance(value, bytes):
            raise InvalidArgumentError(
                f"keys and values are bytes, got {type(key).__name__} and {type(value).__name__}"
            )
        old = self._store._write(key, value)
        self._undo.setdefault(key, old)

    async def delete(self, key: bytes) -> None:
        self._check_open()
        old = self._store._write(key, None)
        self._undo.setdefault(key, old)


class _MemoryThreadView(View):
    """A thread view of a MemoryKV (its class docstring): reads of the memory as it is,
    believed only if no transaction was open or began meanwhile, checked on entry and exit
    (an answer made of torn reads raises ``WouldWait`` in place of whatever it raised)."""

    def __init__(self, store: MemoryKV) -> None:
        self._store = store
        self._seq: int | None = None

    async def __aenter__(self) -> _MemoryThreadView:
        seq = self._store._seq
        if seq & 1 or self._store._closed or self._seq is not None:
            raise offloop.WouldWait
        self._seq = seq
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._check()

    def _check(self) -> None:
        if self._store._seq != self._seq:
            raise offloop.WouldWait

    async def get(self, key: bytes) -> bytes | None:
        return self._store._data.get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        try:
            return self._store._scan(prefix, start, limit)
        except (KeyError, IndexError):  # a key went while the list was walked
            self._check()
            raise


__all__ = ["MemoryKV"]
