"""Power cuts, emulated: what a host keeps when its power goes, the rest dropped.

- ``PowerCutKV``: a ``KVStore`` over ``MemoryKV`` that keeps what the seam promises and no
  more. A commit is kept once a flush that began after it has ended (a durable commit, a
  ``sync``: the real ``GroupCommit`` runs them, as for SQLite). Each committed
  transaction's writes are logged, so ``restored`` rebuilds the store from the kept ones
  alone. After the cut it answers nothing (``OSError``), so no writer is told afterwards
  that something is durable.
- ``PowerCutNode``: a real ``LocalNode`` (chunk files on disk) behind a ``FaultyNode`` that
  remembers the chunks written with ``sync=False`` that no ``sync_disk`` has covered yet,
  from the moment each write starts. ``cut`` turns the node off; ``drop`` then deletes
  those files, as a host losing its page cache would lose them (a worst case: with
  ``O_DIRECT`` the bytes may be there, but not the file's size or name).

A cut is taken at one instant (``Mains``: at the n-th commit, flush, chunk write or disk
sync, inside the call): what the KV had made durable and which chunks were unsynced are
fixed then, so nothing the workload's cancellation does afterwards (aborts, deletions,
cleanup commits) is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tectonic_emu.chunkstore import FaultyNode, LocalNode
from tectonic_emu.errors import retrieved
from tectonic_emu.groupsync import GroupCommit
from tectonic_emu.metadata import MemoryKV
from tectonic_emu.metadata.kv import KVStore, Transaction

Writes = dict[bytes, bytes | None]


class PowerCutKV(KVStore):
    """A ``MemoryKV`` whose durable part survives ``cut`` (module docstring)."""

    def __init__(self) -> None:
        self.inner = MemoryKV()
        self.log: list[Writes] = []  # each committed transaction's writes, in commit order
        self.group = GroupCommit(self._flush)
        self.kept: int | None = None  # set by ``cut``: how many logged commits survive
        self.flushed = 0  # logged commits a finished flush covered
        self.mains: Mains | None = None

    def _check_on(self) -> None:
        if self.kept is not None:
            raise OSError(errno.EIO, "the power is off")

    async def _flush(self) -> None:
        # What a flush makes durable: every commit made before it began (as an fsync of a
        # log does), counted here, in its first step. ``GroupCommit`` counts at most that.
        covers = len(self.log)
        task = asyncio.current_task()
        if task is not None:  # its waiters may all be gone (cancelled by the cut)
            task.add_done_callback(retrieved)
        await asyncio.sleep(0.001)  # commits come in while a flush runs, as with a real one
        if self.mains is not None:
            self.mains.tick()  # the flush is about to end
        self._check_on()  # a flush the cut interrupted made nothing durable
        self.flushed = max(self.flushed, covers)

    @classmethod
    async def restored(cls, log: Sequence[Writes]) -> PowerCutKV:
        """A store holding ``log`` applied in order, all of it durable (after a restart)."""
        store = cls()
        state: Writes = {}
        for writes in log:
            state.update(writes)
        async with store.transaction() as t:
            for key, value in sorted(state.items()):
                if value is not None:
                    await t.put(key, value)
        return store

    def cut(self) -> list[Writes]:
        """The power goes: the commits a finished flush covered are kept, the rest lost."""
        self.kept = self.flushed
        return self.log[: self.kept]

    def transaction(self, *, durable: bool = True) -> _Txn:
        return _Txn(self, durable)

    async def get(self, key: bytes) -> bytes | None:
        self._check_on()
        return await self.inner.get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        self._check_on()
        return await self.inner.scan(prefix, start=start, limit=limit)

    async def sync(self) -> None:
        self._check_on()
        await self.group.sync()

    async def close(self) -> None:
        await self.inner.close()


class _Txn(Transaction):
    """A ``MemoryKV`` transaction whose writes are logged when it commits."""

    def __init__(self, store: PowerCutKV, durable: bool) -> None:
        self._store = store
        self._durable = durable
        self._cm = store.inner.transaction()
        self._txn: Transaction | None = None
        self._writes: Writes = {}

    async def __aenter__(self) -> _Txn:
        self._store._check_on()  # after the cut, the store answers nothing
        self._txn = await self._cm.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None and self._store.kept is not None:
            # The power went while the transaction was open: it rolls back.
            await self._cm.__aexit__(OSError, None, None)
            self._store._check_on()
        await self._cm.__aexit__(exc_type, exc, tb)  # commits, or rolls back
        if exc_type is not None or not self._writes:
            return
        # Counted in the same step as the commit (MemoryKV's exit does not suspend), so a
        # flush that begins after this line covers it and one that began before does not.
        self._store.log.append(self._writes)
        seq = self._store.group.count()
        if self._store.mains is not None:
            self._store.mains.tick()
        if self._durable:
            await self._store.group.durable(seq)

    def _open(self) -> Transaction:
        assert self._txn is not None
        return self._txn

    async def get(self, key: bytes) -> bytes | None:
        return await self._open().get(key)

    async def scan(
        self, prefix: bytes, *, start: bytes | None = None, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        return await self._open().scan(prefix, start=start, limit=limit)

    async def put(self, key: bytes, value: bytes) -> None:
        await self._open().put(key, value)
        self._writes[key] = value

    async def delete(self, key: bytes) -> None:
        await self._open().delete(key)
        self._writes[key] = None


class PowerCutNode(FaultyNode):
    """A ``LocalNode`` whose unsynced chunks a power cut drops (module docstring)."""

    def __init__(self, inner: LocalNode) -> None:
        super().__init__(inner)
        self.local = inner
        self.writing: list[set[str]] = [set() for _ in range(inner.disks)]  # unsynced, running
        self.unsynced: list[set[str]] = [set() for _ in range(inner.disks)]  # written
        self.lost: list[set[str]] | None = None  # set by ``cut``
        self.mains: Mains | None = None

    async def write_chunk(
        self, disk: int, chunk_id: str, payload: Any, *, sync: bool = True, **kw: Any
    ) -> None:
        self._tick()
        tracked = not sync and 0 <= disk < self.disks
        if tracked:
            self.writing[disk].add(chunk_id)  # from the start: a torn write is lost too
        try:
            await super().write_chunk(disk, chunk_id, payload, sync=sync, **kw)
        finally:
            if tracked and self.lost is None:
                self.writing[disk].discard(chunk_id)
        if tracked and self.lost is None:
            self.unsynced[disk].add(chunk_id)
        self._tick()

    def _tick(self) -> None:
        if self.mains is not None:
            self.mains.tick()

    async def sync_disk(self, disk: int) -> None:
        # Only what was written before the sync began is covered by it.
        covered = set(self.unsynced[disk]) if 0 <= disk < self.disks else set()
        self._tick()
        await super().sync_disk(disk)
        if self.lost is None:
            self.unsynced[disk] -= covered
        self._tick()

    def cut(self) -> None:
        """The power goes: the node answers nothing more, its unsynced chunks are lost."""
        self.available = False
        self.lost = [w | u for w, u in zip(self.writing, self.unsynced, strict=True)]

    def drop(self) -> int:
        """After the cut has settled: delete the lost chunks' files. How many there were."""
        assert self.lost is not None
        n = 0
        for disk, ids in enumerate(self.lost):
            for chunk_id in ids:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.local.chunk_path(disk, chunk_id))
                    n += 1
        return n


def power_nodes(root: Path, count: int, disks: int) -> list[PowerCutNode]:
    """``count`` nodes on real directories under ``root`` (the same ones after a restart)."""
    return [PowerCutNode(LocalNode(root / f"n{i}", node_id=i, disks=disks)) for i in range(count)]


class Mains:
    """The power of one store and its nodes: it goes at the ``cut_at``-th event (a commit,
    a finished flush, the start or end of a chunk write or of a disk sync), at that very
    instant (the KV's and nodes' state fixed there, inside the call that ticked), or by
    ``cut``."""

    def __init__(self, kv: PowerCutKV, nodes: Sequence[PowerCutNode], cut_at: int) -> None:
        self.kv, self.nodes, self.cut_at = kv, list(nodes), cut_at
        self.events = 0
        self.off = asyncio.Event()
        self.log: list[Writes] = []
        kv.mains = self
        for n in nodes:
            n.mains = self

    def tick(self) -> None:
        self.events += 1
        if self.events >= self.cut_at and not self.off.is_set():
            self.cut()

    def cut(self) -> None:
        self.log = self.kv.cut()
        for n in self.nodes:
            n.cut()
        self.off.set()

    async def settle(self, work: asyncio.Task[Any]) -> int:
        """After the cut (or with ``work`` done, cut now): cancel ``work`` and let it settle,
        then drop what was lost. How many chunk files were dropped."""
        if not self.off.is_set():
            self.cut()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        dropped = sum(n.drop() for n in self.nodes)
        for n in self.nodes:
            await n.local.close()
        return dropped


__all__ = ["Mains", "PowerCutKV", "PowerCutNode", "Writes", "power_nodes"]
