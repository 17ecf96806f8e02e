"""Append-only writers: blocks stream out as they fill, and commit in order.

A writer holds the file's write token. Full blocks are written to storage nodes concurrently
(``depth`` at a time) but committed to metadata strictly in order, each commit checking the
token, so the size that metadata reports always covers a gap-free, durable prefix. A newer
writer takes the token and thereby fences this one: its next append or commit raises
``FencedWriterError`` and nothing the fenced writer made durable is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Sequence
from types import TracebackType
from typing import Any

from tectonic_emu.argcheck import bytes_arg, int_arg
from tectonic_emu.bufpool import copy_into, recycled_noting, stand_in, uninitialised
from tectonic_emu.coding import Encoding, work
from tectonic_emu.coding.synthetic import Payload, Synthetic, nbytes
from tectonic_emu.config import MAX_SIZE
from tectonic_emu.errors import (
    FileTooLargeError,
    InvalidArgumentError,
    TectonicError,
    WriterClosedError,
)
from tectonic_emu.pipeline import BlockPipeline, Committer, Replaced


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
    "FileWriter",
    "Replaced",
    "VersionWriter",
    "WriterOpener",
]
