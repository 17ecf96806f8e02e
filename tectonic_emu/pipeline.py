"""``BlockPipeline``: the blocks of one file in flight, written to the nodes concurrently and
committed to metadata in order (``writer.py``'s ``FileWriter`` feeds it).

Two ways to commit (docs/design.md, "What is durable when"): a block at a time, each
written durably and committed as its turn comes; or, for writers that commit at a flush
(``unsynced``), whole blocks written without a sync, their chunks claimed by an intent until
a flush syncs each node disk once and commits them all in one transaction.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tectonic_emu.coding import Encoding, work
from tectonic_emu.coding.synthetic import Payload
from tectonic_emu.config import ClusterConfig
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import retrieved
from tectonic_emu.intents import ChunkIntent
from tectonic_emu.metadata.layers import Metadata, new_id
from tectonic_emu.metadata.records import BlockRecord


@dataclass(frozen=True, slots=True)
class Replaced:
    """The contents a ``publish_into`` replaced, kept: a nameless, sealed file, and the
    ids of its blocks (what a reader opened before the swap holds: ``FileReader.block_ids``)."""

    file_id: int
    block_ids: tuple[int, ...]


class Committer(Protocol):
    """What a writer needs of the client that opened it (``Client`` is the one there is):
    where blocks go, and the metadata transactions that commit, seal and publish them."""

    write_depth: int  # blocks in flight per writer
    write_lease: float  # seconds an unrenewed claim on a block in flight holds (ChunkIntent)

    @property
    def config(self) -> ClusterConfig: ...

    @property
    def meta(self) -> Metadata: ...

    @property
    def datapath(self) -> DataPath: ...

    async def check_token(self, file_id: int, token: str, path: str) -> None: ...

    async def commit_blocks(
        self,
        file_id: int,
        token: str,
        blocks: Sequence[tuple[BlockRecord, ChunkIntent]],
        *,
        durable: bool = True,
    ) -> None: ...

    async def commit_hole(self, file_id: int, token: str, length: int, path: str) -> None: ...

    async def seal(self, file_id: int, token: str, path: str) -> None: ...

    async def publish(
        self, file_id: int, token: str, path: str, *, keep_replaced: bool = False
    ) -> None: ...

    async def publish_into(
        self, file_id: int, token: str, into: int, path: str, *, keep_replaced: bool = False
    ) -> Replaced | None: ...

    async def purge(self, file_id: int) -> None: ...


# Blocks an unsynced pipeline keeps written but not committed before ``submit`` commits
# them without waiting for a flush: bounds the claims held (a renewal task each) and what a
# crash can lose of a file written without flushes (512 MiB of 8 MiB blocks).
MAX_UNCOMMITTED = 64

# A block written unsynced: its record, and the claim on its chunks until it commits.
Written = tuple[BlockRecord, ChunkIntent]


class BlockPipeline:
    """Writes blocks of one file concurrently and commits them in order.

    ``submit`` waits while ``depth`` blocks are in flight. A block commits as soon as the one
    before it has committed (visible, not yet durable: the metadata store makes commits
    durable in commit order), then waits until its own commit is durable, with one fsync
    shared by the commits of every writer (``SQLiteKV``'s group commit). Chained on durable
    commits, a file committed at most one block per fsync of the metadata log. The first
    failure stops every later block from committing (their chunks are deleted) and is raised
    by the next ``submit`` or by ``drain``.

    ``unsynced``: blocks commit at ``commit`` instead (a flush), all together: their chunks
    are written unsynced, each node disk they are on is synced once (``sync_disk``, a
    ``syncfs``), then one metadata transaction commits them in order. A file's syncs are
    then per flush, not per chunk (a checkpoint's: about DCP's count); a crash loses what
    was written since the last flush, as POSIX allows, and readers see none of it before.
    """

    def __init__(
        self,
        client: Committer,
        file_id: int,
        token: str,
        enc: Encoding,
        depth: int,
        *,
        unsynced: bool = False,
    ) -> None:
        self._client = client
        self._file_id = file_id
        self._token = token
        self._enc = enc
        self._depth = max(1, depth)
        self.unsynced = unsynced
        # Each block's task, and a future resolved once its commit is visible (or failed);
        # an unsynced block's task returns its ``Written``.
        self._tasks: deque[tuple[asyncio.Task[Written | None], asyncio.Future[None]]] = deque()
        self._written: list[Written] = []  # unsynced blocks retired, in order, to commit
        self._synced: set[int] = set()  # ids of those whose chunks were written synced

    async def submit(self, block: Payload, holds: object = None, *, tail: bool = False) -> None:
        """``holds``: kept until the block is done, as a block's buffer is kept by the views
        of it (a projection's stand-in for the buffer of a block it describes). ``tail``:
        the last block before a flush, which an unsynced pipeline writes synced, for its
        disks would be synced at once anyway: a file of one block (an index, a manifest)
        then costs no sync call, one round trip less to each of its nodes."""
        while len(self._tasks) >= self._depth:
            await self._retire_oldest()
        if len(self._written) >= MAX_UNCOMMITTED:
            await self.commit()
        prev = self._tasks[-1][1] if self._tasks else None
        committed = asyncio.get_running_loop().create_future()
        job: Coroutine[Any, Any, Written | None]
        if self.unsynced:
            committed.set_result(None)  # nothing chains on it
            job = self._write_unsynced(block, holds, sync=tail)
        else:
            job = self._run(block, prev, committed, holds)
        task = asyncio.create_task(job)
        task.add_done_callback(retrieved)  # raised by submit or drain; by none if abandoned
        self._tasks.append((task, committed))

    async def _retire_oldest(self) -> None:
        task, _ = self._tasks[0]
        await asyncio.wait([task])
        self._tasks.popleft()
        written = task.result()  # raises the block's error, if any
        if written is not None:
            self._written.append(written)

    async def _run(
        self,
        block: Payload,
        prev: asyncio.Future[None] | None,
        committed: asyncio.Future[None],
        holds: object,
    ) -> Written | None:
        try:
            await self._write_and_commit(block, prev, holds)
        except BaseException as exc:
            if not committed.done():  # the next block stops at this
                if isinstance(exc, asyncio.CancelledError):
                    committed.cancel()
                else:
                    committed.set_exception(exc)
                    committed.exception()  # retrieved: the task itself reports it
            raise
        committed.set_result(None)
        await self._client.meta.sync()  # durable, and so is every commit before it
        return None

    def _claim(self) -> ChunkIntent:
        """The claim on a new block's chunks: announced before any chunk is written,
        renewed until committed, garbage collection leaves them alone while it is live (see
        intents.py)."""
        client = self._client
        return ChunkIntent(
            client.meta, new_id(), self._file_id, self._token, lease=client.write_lease
        )

    async def _write_unsynced(self, block: Payload, holds: object, *, sync: bool) -> Written:
        """An unsynced pipeline's block: its chunks written (unsynced, unless ``sync``)
        under a claim that stays until ``commit`` (or ``abort``) ends it."""
        work.python("block")
        await work.settle()
        claim = self._claim()
        await claim.start()
        try:
            rec = await self._client.datapath.write_block(
                self._enc,
                block,
                block_id=claim.block_id,
                file_id=self._file_id,
                holds=holds,
                sync=sync,
            )
        except BaseException:
            await asyncio.shield(claim.end())
            raise
        if sync:
            self._synced.add(rec.block_id)
        return rec, claim

    async def commit(self) -> None:
        """An unsynced pipeline's blocks retired so far: each node disk their chunks are on
        synced once, then one transaction commits them in order (visible; durable with the
        next ``meta.sync``, commits being durable in order). On failure their chunks are
        deleted, unless the commit went through after all."""
        written, self._written = self._written, []
        if not written:
            return
        recs = [rec for rec, _ in written]
        unsynced = [i for i, rec in enumerate(recs) if rec.block_id not in self._synced]
        self._synced.difference_update(rec.block_id for rec in recs)
        try:
            # Chunks durable before any commit naming them can reach the metadata log: the
            # OS may write the log back at any time. (A block rebuilt on other nodes, its
            # own having gone down, comes back with its new placements.)
            if unsynced:
                done = await self._client.datapath.sync_chunks([recs[i] for i in unsynced])
                for i, rec in zip(unsynced, done, strict=True):
                    recs[i] = rec
            synced = [(rec, claim) for rec, (_, claim) in zip(recs, written, strict=True)]
            await self._client.commit_blocks(self._file_id, self._token, synced, durable=False)
        except BaseException:
            await asyncio.shield(self._delete_unless_committed(recs))
            raise
        finally:
            await asyncio.shield(_end_claims(written))

    async def _write_and_commit(
        self, block: Payload, prev: asyncio.Future[None] | None, holds: object
    ) -> None:
        client = self._client
        dp = client.datapath
        work.python("block")  # its Python on the loop, for a projection to charge
        await work.settle()
        claim = self._claim()
        async with claim:
            rec = await dp.write_block(
                self._enc, block, block_id=claim.block_id, file_id=self._file_id, holds=holds
            )
            try:
                if prev is not None:
                    await asyncio.wait([prev])  # not ``await prev``: that would cancel it with us
                    if prev.cancelled():
                        raise asyncio.CancelledError
                    if (err := prev.exception()) is not None:
                        raise err
                await client.commit_blocks(
                    self._file_id, self._token, [(rec, claim)], durable=False
                )
            except BaseException:
                await asyncio.shield(self._delete_unless_committed([rec]))
                raise

    async def _delete_unless_committed(self, recs: Sequence[BlockRecord]) -> None:
        """Delete failed blocks' chunks, unless their commit (one transaction) went through
        after all: a cancellation that arrives while the commit's transaction settles is
        raised once it has settled, and the blocks are then part of the file, below the
        size readers see."""
        try:
            if await self._client.meta.block(recs[0].block_id) is not None:
                return
        except OSError:
            return  # unknown: leave the chunks to repair's garbage collection
        await self._client.datapath.delete_chunks(c for rec in recs for c in rec.chunks)

    async def drain(self) -> None:
        """Wait for every submitted block; raises the first failure."""
        while self._tasks:
            await self._retire_oldest()

    async def abort(self) -> None:
        """Cancel blocks in flight; blocks already committed stay, blocks written unsynced
        and not committed are deleted."""
        for t, _ in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait([t for t, _ in self._tasks])
        left = self._written + [
            w
            for t, _ in self._tasks
            if not t.cancelled() and t.exception() is None and (w := t.result()) is not None
        ]
        self._tasks.clear()
        self._written = []
        self._synced.clear()
        if left:
            dp = self._client.datapath
            await asyncio.shield(dp.delete_chunks(c for rec, _ in left for c in rec.chunks))
            await asyncio.shield(_end_claims(left))


async def _end_claims(written: Sequence[Written]) -> None:
    """End the claims of unsynced blocks (committed or given up)."""
    await asyncio.gather(*(claim.end() for _, claim in written))


__all__ = ["MAX_UNCOMMITTED", "BlockPipeline", "Committer", "Replaced", "Written"]
