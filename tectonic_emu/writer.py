"""Append-only writers: blocks stream out as they fill, and commit in order.

A writer holds the file's write token. Full blocks are written to storage nodes concurrently
(``depth`` at a time) but committed to metadata strictly in order, each commit checking the
token, so the size that metadata reports always covers a gap-free, durable prefix. A newer
writer takes the token and thereby fences this one: its next append or commit raises
``FencedWriterError`` and nothing the fenced writer made durable is lost.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from tectonic_emu.argcheck import bytes_arg, int_arg
from tectonic_emu.bufpool import copy_into, recycled_noting, stand_in, uninitialised
from tectonic_emu.coding import Encoding, work
from tectonic_emu.coding.synthetic import Payload, Synthetic, nbytes
from tectonic_emu.config import MAX_SIZE, ClusterConfig
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import (
    FileTooLargeError,
    InvalidArgumentError,
    TectonicError,
    WriterClosedError,
    retrieved,
)
from tectonic_emu.intents import ChunkIntent
from tectonic_emu.metadata.layers import Metadata, new_id
from tectonic_emu.metadata.records import BlockRecord


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


def _copied(n: int, block_size: int, in_place: bool) -> int:
    """Bytes of an ``n``-byte append that the writer copies into block buffers (counted as
    work on the loop, where ``_add`` copies): all of them, or, for immutable input that
    starts a block (``in_place``), only the tail short of a whole block. The regrowth copies
    of a file smaller than a block are not counted (together at most its size)."""
    return n % block_size if in_place else n


class FileWriter:
    """The single writer of one file: ``append``, ``flush`` (durable), ``close`` (seal).

    Errors: ``FencedWriterError`` once another writer took the file (or it was deleted or
    replaced), ``WriterClosedError`` after close/abort, ``NotEnoughNodesError`` and other
    ``OSError`` from the data path. After any error the file keeps every byte committed
    before it; the writer is then aborted. On cancellation of an ``append``/``flush`` the
    in-flight blocks are cancelled and the writer is aborted too.
    """

    def __init__(
        self,
        client: Committer,
        path: str,
        file_id: int,
        token: str,
        enc: Encoding,
        size: int,
        *,
        unsynced: bool = False,
    ) -> None:
        self._client = client
        self.path = path
        self.file_id = file_id
        self.encoding = enc
        self._token = token
        self._block_size = client.config.block_size_for(enc)
        self._pipeline = BlockPipeline(
            client, file_id, token, enc, client.write_depth, unsynced=unsynced
        )
        # The block being filled: page-aligned (a node writes a replica straight from it with
        # O_DIRECT) and not zeroed; ``_fill`` bytes of it hold data.
        self._buf: memoryview | None = None
        self._fill = 0
        # Appends since a Synthetic one (a projection's payloads): the pending bytes as one
        # Synthetic, real bytes in it as literals, instead of the block buffer; and what
        # stands for that buffer (``bufpool.stand_in``), once the real one would be taken.
        self._described: Synthetic | None = None
        self._room = 0  # the size of that buffer
        self._stand_in: memoryview | None = None
        self._streaming = False  # a whole block was filled: take whole blocks from now on
        self._closed = False
        self.offset = size  # bytes accepted so far (durable up to the last flush)
        self.holes = 0  # bytes of them this writer appended as holes

    async def _guard(self, op: Awaitable[None]) -> None:
        try:
            await op
        except BaseException as e:
            await asyncio.shield(self.abort())
            if isinstance(e, TectonicError) and e.path is None:
                e.path = self.path  # say which file, e.g. for NotEnoughNodesError
            raise

    async def append(self, data: Payload, *, owned: bool = False) -> None:
        """Append bytes. Full blocks go out as they fill; the rest waits for ``flush``.

        ``owned``: the caller hands ``data`` over and never changes it again, so whole
        blocks of it are encoded in place, as for ``bytes``, instead of being copied. A
        ``Synthetic`` payload (a projection's) is cut into blocks without making bytes."""
        if not isinstance(data, Synthetic):
            bytes_arg("append", "data", data)  # a str is refused before the writer breaks
        if self._closed:
            raise WriterClosedError("writer is closed", self.path)
        await self._guard(self._append(data, owned))

    async def append_many(self, pieces: Sequence[Payload]) -> None:
        """``append`` each of ``pieces`` in order, as one operation: the token is checked once,
        not per piece (thousands of small pieces cost one metadata read, not thousands)."""
        if self._closed:
            raise WriterClosedError("writer is closed", self.path)
        await self._guard(self._append_many(pieces))

    async def _append_many(self, pieces: Sequence[Payload]) -> None:
        await self._client.check_token(self.file_id, self._token, self.path)
        if sum(nbytes(p) for p in pieces) >= self._block_size // 8:
            self._streaming = True  # as for one big piece: whole blocks, not grown by doubling
        for piece in pieces:
            await self._add(piece)

    async def _append(self, data: Payload, owned: bool = False) -> None:
        await self._client.check_token(self.file_id, self._token, self.path)
        await self._add(data, owned)

    async def _add(self, data: Payload, owned: bool = False) -> None:
        if isinstance(data, Synthetic) or self._described is not None:
            await self._add_described(data, owned)
            return
        mv = memoryview(data).cast("B")
        self.offset += len(mv)
        bs = self._block_size
        in_place = not self._fill and (owned or isinstance(data, bytes))
        work.count("copy-warm", _copied(len(mv), bs, in_place))
        if in_place:
            # Immutable input: hand whole blocks to the pipeline without copying.
            while len(mv) >= bs:
                await self._pipeline.submit(mv[:bs])
                mv = mv[bs:]
        while mv:
            self._reserve(len(mv))
            assert self._buf is not None
            take = min(len(self._buf) - self._fill, len(mv))
            copy_into(self._buf, self._fill, mv[:take])
            self._fill += take
            mv = mv[take:]
            if self._fill == bs:
                block, self._buf, self._fill = self._buf, None, 0
                self._streaming = True
                await self._pipeline.submit(block)

    async def _add_described(self, data: Payload, owned: bool) -> None:
        """``_add`` once a ``Synthetic`` piece came: whole blocks are cut from the pending
        description (real bytes joined in as literals), nothing is copied; the copies the
        bytes would get are counted, a ``Synthetic`` standing for a mutable buffer (a
        tensor's) unless ``owned``, and the block buffers they would go into are stood for
        (``_reserve_room``)."""
        if self._described is None:
            held = [] if self._buf is None else [bytes(self._buf[: self._fill])]
            self._described = Synthetic.join(held)
            self._room = 0 if self._buf is None else len(self._buf)
            if self._room == self._block_size:
                self._stand_in = self._buf  # the real buffer, held as long as it would be
            self._buf, self._fill = None, 0
        in_place = not len(self._described) and (owned or isinstance(data, bytes))
        work.count("copy-warm", _copied(nbytes(data), self._block_size, in_place))
        bs = self._block_size
        fill = len(self._described)  # 0 when in place
        pending = Synthetic.join([self._described, data])
        self.offset += nbytes(data)
        if in_place:  # whole blocks handed to the pipeline without a buffer, as in ``_add``
            while len(pending) >= bs:
                await self._pipeline.submit(pending[:bs])
                pending = pending[bs:]
        rest = len(pending) - fill
        while rest:  # the rest as ``_add`` copies it into buffers
            self._reserve_room(fill, rest)
            take = min(self._room - fill, rest)
            fill, rest = fill + take, rest - take
            if fill == bs:
                block, pending = pending[:bs], pending[bs:]
                holds, self._stand_in, self._room, fill = self._stand_in, None, 0, 0
                self._streaming = True
                await self._pipeline.submit(block, holds)
        self._described = pending

    def _reserve(self, more: int) -> None:
        """Room in the block buffer for ``more`` bytes (``_grown``); a new recycled buffer's
        pages counted as they will be faulted in, by the copies into it."""
        bs = self._block_size
        have = 0 if self._buf is None else len(self._buf)
        size = self._grown(have, self._fill, more)
        if size is None:
            return
        if size == bs:
            grown, new = recycled_noting(bs)
            if new:
                work.count("new-pages", bs)
        else:
            grown = uninitialised(size)
        if self._fill:
            assert self._buf is not None
            copy_into(grown, 0, self._buf[: self._fill])
        self._buf = grown

    def _reserve_room(self, fill: int, more: int) -> None:
        """``_reserve`` for described bytes: the size of the buffer the real writer would
        hold (``_room``), and a stand-in for a whole block's (``bufpool.stand_in``), whose
        new pages are counted as ``_reserve`` counts a new buffer's."""
        size = self._grown(self._room, fill, more)
        if size is None:
            return
        if size == self._block_size:
            host = work.Tally.current()
            processes = 1 if host is None else host.processes
            self._stand_in, new = stand_in(size, host, processes)
            if new:
                work.count("new-pages", size)
        self._room = size

    def _grown(self, have: int, fill: int, more: int) -> int | None:
        """The size of block buffer to hold ``more`` bytes after ``fill`` in one of ``have``
        (up to the block size), None if it has room: a whole block once streaming, else
        room grown by doubling, so a small file does not hold 8 MiB. A whole block's comes
        from the process's recycler, a smaller one from the heap."""
        bs = self._block_size
        if have == bs or have - fill >= more:
            return None
        if self._streaming or more >= bs // 8:
            return bs
        return min(bs, max(64 << 10, 2 * have, fill + more))

    async def append_hole(self, length: int) -> None:
        """Append ``length`` bytes of zeros as a hole: after flushing the bytes appended so
        far, one File-layer entry with no block behind it, committed (durable) in one
        metadata transaction; nothing goes to the nodes, and reads of it return zeros
        without asking any. A sparse ``truncate`` is this.

        Raises ArgumentTypeError (not an int), InvalidArgumentError (below 1),
        FileTooLargeError (the file would pass ``config.MAX_SIZE``; the writer stays
        usable), and what ``flush`` raises."""
        int_arg("append_hole", "length", length)
        if self._closed:
            raise WriterClosedError("writer is closed", self.path)
        if length < 1:
            raise InvalidArgumentError(f"a hole of {length} bytes (it takes at least 1)", self.path)
        if length > MAX_SIZE - self.offset:
            # Refused before anything is flushed or committed: the writer goes on as it was.
            raise FileTooLargeError(
                f"a hole of {length} bytes after {self.offset} would pass the largest file "
                f"size, {MAX_SIZE} bytes",
                self.path,
            )
        await self._guard(self._append_hole(length))

    async def _append_hole(self, length: int) -> None:
        await self._flush(sync=False)  # the hole comes after every byte appended before it
        await self._client.commit_hole(self.file_id, self._token, length, self.path)
        self.offset += length
        self.holes += length

    async def flush(self) -> None:
        """Return once every byte appended so far is durable and visible to readers."""
        if self._closed:
            raise WriterClosedError("writer is closed", self.path)
        await self._guard(self._flush())

    async def _flush(self, *, sync: bool = True) -> None:
        if self._described is not None:
            described, self._described = self._described, None
            holds, self._stand_in, self._room = self._stand_in, None, 0
            if len(described):
                await self._pipeline.submit(described, holds, tail=True)
        if self._fill:
            assert self._buf is not None
            block, self._buf, self._fill = self._buf[: self._fill], None, 0
            await self._pipeline.submit(block, tail=True)
        await self._pipeline.drain()
        await self._pipeline.commit()  # an unsynced pipeline's blocks: their disks synced
        if sync:
            # The file's creation, visible but not durable since open_writer, is durable from
            # here even with nothing appended (a no-op when a block's commit made it so).
            await self._client.meta.sync()

    async def close(self) -> None:
        """Flush, then seal the file: it is immutable from now on."""
        if self._closed:
            return
        await self._guard(self._close())

    async def _close(self) -> None:
        await self._flush(sync=False)  # the seal is durable, and everything before it
        await self._client.seal(self.file_id, self._token, self.path)
        self._closed = True

    async def abort(self) -> None:
        """Drop unflushed bytes and stop. The file stays unsealed with its durable prefix,
        so a new writer can take over."""
        self._closed = True
        self._buf, self._fill, self._described, self._stand_in = None, 0, None, None
        self._room = 0
        await self._pipeline.abort()

    async def __aenter__(self) -> FileWriter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()


@dataclass(frozen=True, slots=True)
class Replaced:
    """The contents a ``publish_into`` replaced, kept: a nameless, sealed file, and the
    ids of its blocks (what a reader opened before the swap holds: ``FileReader.block_ids``)."""

    file_id: int
    block_ids: tuple[int, ...]


class VersionWriter(FileWriter):
    """A ``FileWriter`` of a new, nameless version of a file: ``close`` seals it and swaps
    it in at its path atomically (``Client.new_version``), or moves its blocks into the
    file ``into`` (``Client.new_contents``); ``abort`` deletes it. Its blocks commit at
    ``flush`` and ``close`` (unsynced, ``BlockPipeline``)."""

    def __init__(
        self,
        client: Committer,
        path: str,
        file_id: int,
        token: str,
        enc: Encoding,
        size: int,
        *,
        into: int | None = None,
    ) -> None:
        # Unsynced: nothing of a version is seen before it is published, so its blocks
        # commit at flush and close, with one sync per node disk (``BlockPipeline``).
        super().__init__(client, path, file_id, token, enc, size, unsynced=True)
        self.into = into
        self.published = False
        self.keep_replaced = False  # see Client.publish and Client.publish_into
        self.replaced: Replaced | None = None  # the contents replaced, when kept

    async def _close(self) -> None:
        await self._flush(sync=False)  # publishing is durable, and all before it
        if self.into is None:
            await self._client.publish(
                self.file_id, self._token, self.path, keep_replaced=self.keep_replaced
            )
        else:
            self.replaced = await self._client.publish_into(
                self.file_id, self._token, self.into, self.path, keep_replaced=self.keep_replaced
            )
        self.published = True
        self._closed = True

    async def abort(self) -> None:
        """Drop the new version; the path keeps what it had. No-op once published."""
        if self.published:
            return
        await super().abort()
        await self._client.purge(self.file_id)


class WriterOpener:
    """What ``Client.open_writer`` returns: ``await`` it, or use it with ``async with``."""

    def __init__(self, open_fn: Callable[[], Awaitable[FileWriter]]) -> None:
        self._open = open_fn
        self._writer: FileWriter | None = None

    def __await__(self) -> Generator[Any, None, FileWriter]:
        return self._open().__await__()

    async def __aenter__(self) -> FileWriter:
        self._writer = await self._open()
        return self._writer

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._writer is not None
        await self._writer.__aexit__(exc_type, exc, tb)


__all__ = [
    "BlockPipeline",
    "Committer",
    "FileWriter",
    "Replaced",
    "VersionWriter",
    "WriterOpener",
]
