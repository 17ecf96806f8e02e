"""Modelled metadata: the real layers on ``MemoryKV``, each transaction charged to its shards.

Tectonic keeps its Name, File and Block layers in ZippyDB, hash-partitioned into shards
(FAST'21, section 4). So do the layers here: every key starts with a layer tag and a 2-byte
hash of the id that owns it (``metadata/layers.py``), and that hash names the key's shard
(``shard_of``). ``ModelKV`` is a ``KVStore`` over a ``MemoryKV``. Each transaction runs on
the ``MemoryKV`` as it is, then, once the store is released, waits for its charges:

- an operation on each shard its keys touched: a ``get``, ``put`` or ``delete`` is one; a
  ``scan`` is one plus one for every ``SCAN_ROWS`` rows it returned;
- each shard serves ``qps`` operations a second, shared among the clients that use it;
- one round trip, ``rtt``, for the transaction;
- with ``serial_s``, that many seconds of the store's one connection, which serves one
  transaction at a time (SQLite, as an embedded cluster runs it);
- with ``log_bytes`` and a ``log`` device, each transaction that wrote appends that many
  bytes to the store's log, and flushes of the log make them durable as SQLite's do: by
  the real ``GroupCommit`` (``metadata/_common.py``). A durable transaction waits for a
  flush that began after its commit, ``sync`` for one that covers every commit so far,
  and one flush at a time writes what was appended since the last one on the device,
  after the writes the device holds when it begins (``Disk.flush``, an fsync's barrier).
  A writer syncs once a block (``writer.py``), so these flushes are what a block's slot
  waits for beside its chunk writes: a real 16-rank r1 save's ``sync`` took 14-21 ms
  (median) where the model had charged it nothing (2026-12-06);
- with ``hops``, the client's event loop for each hop to the store's thread: a read that
  misses the transaction's own writes, its commit, a flush of the log (as ``SQLiteKV``
  makes them). Each costs the loop what a node call does, sent and taken up
  (``work.calls``): a reply waits for the loop. A read outside any transaction (``get``,
  ``scan``) is one hop, to ``SQLiteKV``'s reader connection, and holds nothing. Traced
  real 16-rank r1 saves spent 3.6-4.3 ms in a block's chunk intent (one write-only
  transaction) and 3.5-4.2 in its commit, where the model charged 0.3 and 1.0; such a
  transaction alone takes 0.12-0.17 ms here, and as much beside 32 chunk writes
  (2026-12-06), so the rest is waiting: for the store, held by others, and for the loop.
  Holding the store through the hops, one after another (as ``SQLiteKV`` does), brought
  the intents to 3.2-3.8 ms but left the saves' totals where they were and slowed the
  loads' transactions of 32 reads to 1.15-1.24 of real, so the hops are charged together,
  after the store is released, like the rest.

Charging after the store is released keeps one client's wait from holding every other
client. ``MemoryKV`` runs transactions one at a time, and holding it through the charge
would make one shard of the whole cluster. The price: another client may see a commit
slightly before its writer is done waiting.
"""

from __future__ import annotations

import asyncio
import errno
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from tectonic_emu.coding import work
from tectonic_emu.metadata import GroupCommit, MemoryKV
from tectonic_emu.metadata.kv import KVStore, Transaction
from tectonic_emu.sim.devices import Disk
from tectonic_emu.sim.resources import QueueResource, Resource, SharedResource, use_all

SCAN_ROWS = 64  # rows a scan returns for the price of one operation


@dataclass(frozen=True, slots=True)
class MetadataModel:
    """``shards`` shards of ``qps`` operations per second each, ``rtt`` seconds a
    transaction."""

    shards: int
    qps: float
    rtt: float = 0.0
    source: str = ""
    # Bytes each transaction that wrote appends to the store's log on a device of the
    # cluster (``ModelKV(log=)``), which flushes make durable: SQLite's WAL beside the chunks
    # of an embedded cluster. 0: the log is not modelled.
    log_bytes: int = 0
    # Seconds each transaction holds a store that serves one at a time (SQLite's one
    # connection); 0: transactions overlap, as on sharded servers.
    serial_s: float = 0.0
    # The store runs on a thread of the client's process (SQLiteKV, embedded): each read
    # that misses the transaction's own writes, each commit and each flush of the log is a
    # hop there and back, which the client's loop pays as it pays a node call.
    hops: bool = False

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"metadata needs at least one shard, not {self.shards}")
        if not (math.isfinite(self.qps) and self.qps > 0):
            raise ValueError(f"a shard's rate must be positive, not {self.qps}")
        if not (math.isfinite(self.rtt) and self.rtt >= 0):
            raise ValueError(f"a round trip cannot be negative: {self.rtt}")
        if not (math.isfinite(self.serial_s) and self.serial_s >= 0):
            raise ValueError(f"a transaction's hold cannot be negative: {self.serial_s}")


def shard_of(key: bytes, shards: int) -> int:
    """The shard of a layer key: its 2-byte hash after the layer tag (shard 0 for what is
    not bytes, which the store then refuses)."""
    if not isinstance(key, bytes):
        return 0
    return int.from_bytes(key[1:3], "big") % shards


class ModelKV(KVStore):
    """A ``MemoryKV`` whose transactions are charged to its shards (module docstring)."""

    def __init__(
        self,
        model: MetadataModel,
        *,
        inner: MemoryKV | None = None,
        discipline: Callable[..., Resource] = SharedResource,
        log: Disk | None = None,
    ) -> None:
        self.model = model
        self.inner = inner if inner is not None else MemoryKV()
        self.shards = [discipline(model.qps, name=f"meta{k}") for k in range(model.shards)]
        self.log = log if model.log_bytes else None  # where commits are flushed
        self.connection = QueueResource(1.0, name="metadata connection")  # (``serial_s``)
        self.commits = GroupCommit(self._flush)
        self._flushed = 0  # commits whose log bytes a flush has written
        # Faults (simulation testing, docs/dst.md), as a model server's ``available`` and
        # ``delay``: while ``down`` every transaction fails as PostgresKV's do when the
        # connection resets (OSError(ECONNRESET), nothing of it committed); ``stall``
        # seconds are added before each transaction's commit.
        self.down = False
        self.stall = 0.0

    async def _flush(self) -> None:
        """Write what was appended to the log since the last flush (module docstring)."""
        assert self.log is not None, "only a store with a log counts its commits"
        upto = self.commits.commits
        await self._hops(1, replies=False)
        await self.log.flush(self.model.log_bytes * (upto - self._flushed))
        self._flushed = upto
        await self._hops(1, replies=True)

    async def _hops(self, n: int, *, replies: bool) -> None:
        """``n`` hops to the store's thread sent, or their replies taken up, on the loop
        (``MetadataModel.hops``)."""
        if self.model.hops and n:
            work.calls(n, replies=replies)
            await work.settle()

    def transaction(self, *, durable: bool = True) -> _ChargedTransaction:
        return _ChargedTransaction(self, durable)

    def check_up(self) -> None:
        """Raise what a transaction meets while the store is ``down``."""
        if self.down:
            raise OSError(errno.ECONNRESET, "metadata store: connection reset (a fault)")

    async def get(self, key: bytes) -> bytes | None:
        async with _ChargedTransaction(self, durable=True, outside=True) as txn:
            return await txn.get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        async with _ChargedTransaction(self, durable=True, outside=True) as txn:
            return await txn.scan(prefix, start=start, limit=limit)

    async def sync(self) -> None:
        await self.inner.sync()
        if self.log is not None:
            await self.commits.sync()

    async def close(self) -> None:
        await self.inner.close()


class _ChargedTransaction(Transaction):
    """``outside``: a read outside any transaction (``KVStore.get``, ``scan``), which
    ``SQLiteKV`` makes on a connection of its own: no hold of the store, no commit."""

    def __init__(self, store: ModelKV, durable: bool, *, outside: bool = False) -> None:
        self._store = store
        self._outside = outside
        self._inner = store.inner.transaction(durable=durable)
        self._txn: Transaction | None = None
        self._ops: Counter[int] = Counter()
        self._durable = durable
        self._wrote = False
        self._written: set[bytes] = set()  # keys this transaction put or deleted
        self._hops = 0  # reads that missed them (``MetadataModel.hops``)

    async def __aenter__(self) -> _ChargedTransaction:
        self._store.check_up()
        self._txn = await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        store = self._store
        if exc_type is None and (store.stall or store.down):
            try:
                if store.stall:
                    await asyncio.sleep(store.stall)
                store.check_up()
            except BaseException as lost:  # down, or cancelled while stalled: rolled back
                await self._inner.__aexit__(type(lost), lost, lost.__traceback__)
                raise
        await self._inner.__aexit__(exc_type, exc, tb)
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            return
        outside = self._outside
        hops = self._hops + (1 if not outside and (self._hops or self._wrote) else 0)  # commit
        jobs = [store.shards[k].begin(n) for k, n in sorted(self._ops.items())]
        if store.model.serial_s and not outside:
            jobs.append(store.connection.begin(store.model.serial_s))
        await store._hops(hops, replies=False)
        await use_all(jobs)
        await store._hops(hops, replies=True)
        if store.model.rtt:
            await asyncio.sleep(store.model.rtt)
        if store.log is not None and self._wrote and exc_type is None:
            seq = store.commits.count()
            if self._durable:
                await store.commits.durable(seq)

    def _open(self, key: bytes, ops: int = 1) -> Transaction:
        assert self._txn is not None, "use the transaction inside its async with block"
        self._ops[shard_of(key, len(self._store.shards))] += ops
        return self._txn

    async def get(self, key: bytes) -> bytes | None:
        self._hops += key not in self._written
        return await self._open(key).get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        self._hops += 1
        rows = await self._open(prefix).scan(prefix, start=start, limit=limit)
        self._ops[shard_of(prefix, len(self._store.shards))] += len(rows) // SCAN_ROWS
        return rows

    async def put(self, key: bytes, value: bytes) -> None:
        self._wrote = True
        self._written.add(key)
        await self._open(key).put(key, value)

    async def delete(self, key: bytes) -> None:
        self._wrote = True
        self._written.add(key)
        await self._open(key).delete(key)


__all__ = ["SCAN_ROWS", "MetadataModel", "ModelKV", "shard_of"]
