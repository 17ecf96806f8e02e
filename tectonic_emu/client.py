"""The client library: files -> blocks -> chunks. It alone talks to both metadata and nodes.
Its namespace half (paths, stat and attributes, rename, delete) is ``namespace.py``.

Every public method is a coroutine that raises only ``TectonicError`` subclasses (all
``OSError``s with an errno, see ``errors.py``). Namespace changes (mkdir, rename, delete, the
final swap of ``write_file``) are single metadata transactions: after cancellation or an error
they either happened whole or not at all. Payload is written before the metadata that points
at it, and deleted after the metadata that pointed at it is gone, so a crash leaves at worst
unreferenced chunks, which repair's garbage collection removes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tectonic_emu import attrs, clock, entropy
from tectonic_emu.argcheck import bool_arg, buffer_arg, bytes_arg, int_arg
from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding import Encoding
from tectonic_emu.coding.synthetic import Payload, Synthetic, joined, put_into
from tectonic_emu.config import MAX_SIZE
from tectonic_emu.errors import (
    AlreadyExistsError,
    FencedWriterError,
    FileTooLargeError,
    InvalidArgumentError,
    IsADirectoryError_,
    NotFoundError,
    SealedFileError,
)
from tectonic_emu.intents import WRITE_LEASE, ChunkIntent
from tectonic_emu.metadata.layers import MetaTxn, new_id
from tectonic_emu.metadata.records import (
    HOLE_BLOCK_ID,
    BlockEntry,
    BlockRecord,
    ChunkPlacement,
    Entry,
    FileRecord,
)
from tectonic_emu.namespace import Namespace, Stat
from tectonic_emu.paths import join_path, split_path
from tectonic_emu.reader import FileReader, blocks_in, read_blocks, regular
from tectonic_emu.store import StoreView
from tectonic_emu.tenancy import Tenants
from tectonic_emu.writer import FileWriter, Replaced, VersionWriter, WriterOpener


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """One block of a file and where its chunks live (``stat --json``). A hole has block
    id ``HOLE_BLOCK_ID`` (0) and no chunks."""

    block_no: int
    block_id: int
    offset: int
    length: int
    chunks: tuple[ChunkPlacement, ...]
    chunk_paths: tuple[str | None, ...]

    @property
    def hole(self) -> bool:
        return self.block_id == HOLE_BLOCK_ID


class Client(Namespace):
    """Async client of one cluster. Create it with ``Cluster.client()``."""

    # Blocks in flight per writer and per read. Two cores: more only adds memory.
    write_depth = 4
    read_depth = 4
    read_ahead_bytes = 192 << 20  # 4 rs-6-3 blocks of 48 MiB
    # How long a block write's claim holds unrenewed before garbage collection may fence it.
    write_lease = WRITE_LEASE

    def __init__(self, cluster: StoreView) -> None:
        """``cluster``: an open ``Cluster``, or anything with its config, metadata, data path
        and nodes (``StoreView``)."""
        self.cluster = cluster
        self.config = cluster.config
        self.meta = cluster.meta
        self.datapath = cluster.datapath
        self.tenants = Tenants(self)  # (tectonic_emu/tenancy.py)

    async def layout(self, path: str) -> list[BlockLayout]:
        """A file's blocks with their chunk placements and chunk file paths."""
        _, blocks, recs = await self._file_blocks(path)
        out = []
        for b, rec in zip(blocks, recs, strict=True):
            if rec is None:  # a hole
                out.append(BlockLayout(b.block_no, b.block_id, b.offset, b.length, (), ()))
                continue
            paths = tuple(
                self.datapath.nodes[c.node].chunk_path(c.disk, c.chunk_id) for c in rec.chunks
            )
            out.append(BlockLayout(b.block_no, b.block_id, b.offset, b.length, rec.chunks, paths))
        return out

    # -- whole-file write --------------------------------------------------------------------
    async def write_file(self, path: str, data: Payload, *, encoding: str | None = None) -> None:
        """Store ``data`` as a sealed file at ``path``, replacing a file there atomically.

        Readers see the old file or the new one, never a mix. On error or cancellation nothing
        at ``path`` changes. Raises NotFoundError (missing parent), IsADirectoryError_,
        UnknownEncodingError, NotEnoughNodesError and data-path errors. ``data`` may be a
        ``Synthetic`` payload (a projection's, on model nodes: docs/simulate.md).
        """
        if not isinstance(data, Synthetic):
            bytes_arg("write_file", "data", data)
        writer = await self.new_version(path, encoding=encoding)
        try:
            await writer.append(data)
            await writer.close()
        except BaseException:
            await asyncio.shield(writer.abort())
            raise

    async def new_version(
        self, path: str, *, encoding: str | None = None, perms: attrs.Perms | None = None
    ) -> VersionWriter:
        """A writer of a new version of ``path``: a nameless file until ``close`` swaps it in
        atomically (replacing the file there, if any, whose mode and owners it keeps; readers
        that opened the old one keep reading it). ``perms``: its mode and owners when no file
        is there at ``close``. ``abort`` (or an error) deletes it and leaves ``path`` as it
        was. This is how POSIX overwrites (the FUSE mount's O_TRUNC, patched headers) meet
        Tectonic's append-only, sealed files. Raises NotFoundError (missing parent),
        IsADirectoryError_, UnknownEncodingError.
        """
        parts = split_path(path)
        if not parts:
            raise IsADirectoryError_("is a directory", "/")
        token = entropy.token_hex(8)
        now = clock.wall()
        # Not durable: a nameless file, made durable by the publish (as in _open_writer).
        async with self.meta.transaction(durable=False) as m:
            parent, inherited = await self._walk(m, parts[:-1], path=path, want_encoding=True)
            e = await m.names.lookup(parent, parts[-1])
            if e is not None and e.kind == "dir":
                raise IsADirectoryError_("is a directory", join_path(parts))
            enc = self._encoding(encoding or inherited)
            file_id = new_id()
            pd = await self._dir(m, parent)
            mode, uid, gid = attrs.born(pd, perms, is_dir=False)
            # Nameless until close: a crash before it leaves only garbage (collected later).
            # Charged to the tenant of where it will be named, from now on.
            await m.files.put(
                FileRecord(
                    file_id, enc.name, 0, 0, False, token, None, None, now, now, 0, mode, uid,
                    gid, tenant=pd.tenant,
                )
            )  # fmt: skip
        return VersionWriter(self, join_path(parts), file_id, token, enc, 0)

    async def publish(
        self, file_id: int, token: str, path: str, *, keep_replaced: bool = False
    ) -> None:
        """Seal the nameless file ``file_id`` and link it at ``path``, replacing what is there
        (``VersionWriter.close``), whose mode, owner and group it takes. ``keep_replaced``:
        the replaced file stays readable by id (``read_id_into``), nameless, until ``purge``
        or garbage collection."""
        parts = split_path(path)
        async with self.meta.transaction() as m:
            parent, _ = await self._walk(m, parts[:-1], path=path)
            e = await m.names.lookup(parent, parts[-1])
            if e is not None and e.kind == "dir":
                raise IsADirectoryError_("is a directory", join_path(parts))
            f = await m.files.get(file_id)
            if f is None or f.token != token:
                raise FencedWriterError("file vanished while being written", join_path(parts))
            await self._check_same_tenant(m, f.tenant, parent, join_path(parts))
            old = None if e is None or e.id == file_id else await m.files.get(e.id)
            if old is not None:  # a new version of the file: its mode and owners stay
                f = replace(f, mode=old.mode, uid=old.uid, gid=old.gid)
            now = clock.wall()
            await m.files.put(
                replace(f, sealed=True, token=None, parent=parent, name=parts[-1], mtime=now)
            )
            await m.names.link(parent, Entry(parts[-1], "file", file_id))
            if e is None:  # a new name in the directory
                await attrs.touch_dir(m, parent, now)
            garbage: list[ChunkPlacement] = []
            if e is not None and e.id != file_id:
                garbage = await self._let_go(m, e.id, keep_replaced)
        await self.datapath.delete_chunks(garbage)

    async def new_contents(
        self, file_id: int, *, path: str, encoding: str | None = None
    ) -> VersionWriter:
        """A writer of new contents for the file ``file_id``, wherever it is named then (or
        nameless, kept for an open descriptor): a nameless file until ``close`` moves its
        blocks into ``file_id`` in one transaction, so that the file keeps its id, its
        names, mode and owners, as a POSIX file does through ``O_TRUNC`` and rewrites (the
        FUSE mount's). ``path`` names it in errors; ``encoding``: the file's own when None.
        ``abort`` drops it. Raises NotFoundError (no such file), UnknownEncodingError."""
        int_arg("new_contents", "file_id", file_id)
        token = entropy.token_hex(8)
        now = clock.wall()
        async with self.meta.transaction(durable=False) as m:  # as new_version
            f = await m.files.get(file_id)
            if f is None:
                raise NotFoundError(f"no file {file_id:016x}", path)
            enc = self._encoding(encoding or f.encoding)
            new = new_id()
            await m.files.put(
                FileRecord(new, enc.name, 0, 0, False, token, None, None, now, now, tenant=f.tenant)
            )
        return VersionWriter(self, path, new, token, enc, 0, into=file_id)

    async def publish_into(
        self, file_id: int, token: str, into: int, path: str, *, keep_replaced: bool = False
    ) -> Replaced | None:
        """Move the blocks of the nameless file ``file_id`` into the file ``into``
        (``VersionWriter.close`` of ``new_contents``), sealed, its mtime and ctime now;
        ``file_id`` is gone after. ``keep_replaced``: ``into``'s old blocks move to
        ``file_id`` instead, a nameless, sealed file returned for whoever still reads them
        (``purge`` it when they are done); else they are deleted. Raises FencedWriterError
        (``file_id`` lost its token), NotFoundError (``into`` was deleted)."""
        now = clock.wall()
        async with self.meta.transaction() as m:
            f = await m.files.get(file_id)
            if f is None or f.token != token:
                raise FencedWriterError("file vanished while being written", path)
            old = await m.files.get(into)
            if old is None:
                raise NotFoundError("the file was deleted while being rewritten", path)
            new_blocks = await m.files.set_blocks(file_id, [])
            old_blocks = await m.files.set_blocks(into, new_blocks)
            await m.own_blocks(new_blocks, into)
            await m.files.put(
                replace(
                    old, encoding=f.encoding, size=f.size, nblocks=f.nblocks, holes=f.holes,
                    sealed=True, token=None, mtime=now, ctime=now,
                )
            )  # fmt: skip
            if keep_replaced:
                await m.files.set_blocks(file_id, old_blocks)
                await m.own_blocks(old_blocks, file_id)
                kept = replace(
                    f, encoding=old.encoding, size=old.size, nblocks=old.nblocks,
                    holes=old.holes, sealed=True, token=None, mtime=now,
                )  # fmt: skip
                await m.files.put(kept)
                return Replaced(file_id, tuple(b.block_id for b in old_blocks))
            await m.files.set_blocks(file_id, old_blocks)
            garbage = await m.drop_file(file_id)
        await self.datapath.delete_chunks(garbage)
        return None

    # -- append-only writers -----------------------------------------------------------------
    def open_writer(
        self,
        path: str,
        *,
        encoding: str | None = None,
        perms: attrs.Perms | None = None,
        exclusive: bool = False,
        commit_at_flush: bool = False,
    ) -> WriterOpener:
        """The single writer of ``path``: ``w = await client.open_writer(p)`` or
        ``async with client.open_writer(p) as w``.

        Creates the file if missing. If the file exists unsealed (a writer crashed or is still
        running), this writer takes its token over and appends after its durable bytes: the
        old writer is fenced. Raises SealedFileError on a sealed file, IsADirectoryError_,
        NotFoundError (missing parent), InvalidArgumentError (``encoding`` differs from the
        existing file's). ``perms``: the mode and owners of a file it creates.
        ``exclusive``: create the file or raise AlreadyExistsError, taking no writer over
        (``O_CREAT | O_EXCL``). ``commit_at_flush``: blocks are not committed as they are
        written but at each ``flush`` and at ``close``, all together, after one sync of
        each node disk they are on (``BlockPipeline``): for a file read once written (a
        checkpoint's data), where syncs per chunk cost; readers see nothing of it, and a
        crash keeps nothing of it, beyond the last flush.
        """
        bool_arg("open_writer", "exclusive", exclusive)
        bool_arg("open_writer", "commit_at_flush", commit_at_flush)
        return WriterOpener(
            lambda: self._open_writer(path, encoding, perms, exclusive, commit_at_flush)
        )

    async def _open_writer(
        self,
        path: str,
        encoding: str | None,
        perms: attrs.Perms | None,
        exclusive: bool,
        unsynced: bool,
    ) -> FileWriter:
        parts = split_path(path)
        if not parts:
            raise IsADirectoryError_("is a directory", "/")
        token = entropy.token_hex(8)
        now = clock.wall()
        # Not durable: the writer's first durable point (a flush, the seal) makes this
        # durable with it, commits being durable in order, so a create costs one flush, not
        # two. A crash before that point loses an empty file (or a fence) that nothing was
        # promised of (docs/design.md, "What is durable when").
        async with self.meta.transaction(durable=False) as m:
            parent, inherited = await self._walk(m, parts[:-1], path=path, want_encoding=True)
            e = await m.names.lookup(parent, parts[-1])
            if e is None:
                enc = self._encoding(encoding or inherited)
                file_id = new_id()
                pd = await self._dir(m, parent)
                mode, uid, gid = attrs.born(pd, perms, is_dir=False)
                await m.files.put(
                    FileRecord(
                        file_id, enc.name, 0, 0, False, token, parent, parts[-1], now, now,
                        0, mode, uid, gid, tenant=pd.tenant,
                    )
                )  # fmt: skip
                await m.names.link(parent, Entry(parts[-1], "file", file_id))
                await attrs.touch_dir(m, parent, now)
                return FileWriter(self, join_path(parts), file_id, token, enc, 0, unsynced=unsynced)
            if exclusive:
                raise AlreadyExistsError("file exists", join_path(parts))
            if e.kind == "dir":
                raise IsADirectoryError_("is a directory", join_path(parts))
            f = await m.files.get(e.id)
            assert f is not None
            if f.kind != "file":
                raise InvalidArgumentError(f"not a regular file (a {f.kind})", join_path(parts))
            if f.sealed:
                raise SealedFileError("file is sealed (immutable)", join_path(parts))
            if encoding is not None and Encoding.parse(encoding).name != f.encoding:
                raise InvalidArgumentError(
                    f"file has encoding {f.encoding}, not {encoding}", join_path(parts)
                )
            await m.files.put(replace(f, token=token))  # fences the previous writer
            enc = Encoding.parse(f.encoding)
            return FileWriter(
                self, join_path(parts), f.file_id, token, enc, f.size, unsynced=unsynced
            )

    async def check_token(self, file_id: int, token: str, path: str) -> None:
        """Raise FencedWriterError unless ``token`` still holds the file, as last committed:
        an early answer for appends, read outside a transaction (the commit of each block
        checks again, inside its own)."""
        _token_holds(await self.meta.file(file_id), token, path)

    async def _check_token(self, m: MetaTxn, file_id: int, token: str, path: str) -> FileRecord:
        return _token_holds(await m.files.get(file_id), token, path)

    async def commit_blocks(
        self,
        file_id: int,
        token: str,
        blocks: Sequence[tuple[BlockRecord, ChunkIntent]],
        *,
        durable: bool = True,
    ) -> None:
        """Make blocks whose chunks are durable part of the file, in order (the commit
        point), and remove each one's intent, the claim its chunk writes were announced
        under, in the same transaction. ``durable=False``: return once the commit is
        visible; ``meta.sync()`` makes it durable (a writer chains its blocks' commits on
        that, see ``BlockPipeline``). Raises FencedWriterError, committing nothing, when the
        token is lost or garbage collection took an intent (its lease expired)."""
        async with self.meta.transaction(durable=durable) as m:
            # The claims first: when garbage collection fenced us, say so (it took the token).
            for _, intent in blocks:
                await intent.settle(m, f"file {file_id:016x}")
            f = await self._check_token(m, file_id, token, f"file {file_id:016x}")
            size, nblocks = f.size, f.nblocks
            for rec, _ in blocks:
                await m.files.add_block(
                    file_id, BlockEntry(nblocks, rec.block_id, size, rec.length)
                )
                await m.blocks.put(rec)
                size, nblocks = size + rec.length, nblocks + 1
            await m.files.put(replace(f, size=size, nblocks=nblocks, mtime=clock.wall()))

    async def commit_hole(self, file_id: int, token: str, length: int, path: str) -> None:
        """Append a hole of ``length`` bytes (read as zeros, nothing stored) to the file as
        one File-layer entry, in one durable transaction: no node is asked anything. Raises
        FencedWriterError when the token is lost, FileTooLargeError past ``MAX_SIZE``,
        InvalidArgumentError for a length below 1; nothing is committed then."""
        if length < 1:
            raise InvalidArgumentError(f"a hole of {length} bytes (it takes at least 1)", path)
        async with self.meta.transaction() as m:
            f = await self._check_token(m, file_id, token, path)
            if length > MAX_SIZE - f.size:
                raise FileTooLargeError(
                    f"a hole of {length} bytes after {f.size} would pass the largest file "
                    f"size, {MAX_SIZE} bytes",
                    path,
                )
            await m.files.add_block(file_id, BlockEntry(f.nblocks, HOLE_BLOCK_ID, f.size, length))
            await m.files.put(
                replace(
                    f,
                    size=f.size + length,
                    nblocks=f.nblocks + 1,
                    holes=f.holes + length,
                    mtime=clock.wall(),
                )
            )

    async def seal(self, file_id: int, token: str, path: str) -> None:
        async with self.meta.transaction() as m:
            f = await self._check_token(m, file_id, token, path)
            await m.files.put(replace(f, sealed=True, token=None))  # no byte changed

    # -- reads -------------------------------------------------------------------------------
    async def _file_blocks(
        self, path: str, start: int = 0, size: int = -1
    ) -> tuple[FileRecord, list[BlockEntry], list[BlockRecord | None]]:
        """The file at ``path``, and its blocks holding bytes [start, start + size) (with
        their records, None for a hole)."""
        async with self.meta.view() as m:
            return await blocks_in(m, await self._file_id(m, path), start, size)

    async def _file_id(self, m: MetaTxn, path: str) -> int:
        """The id of the file at ``path``; IsADirectoryError_ for a directory."""
        if not split_path(path):
            raise IsADirectoryError_("is a directory", "/")
        _, e = await self._lookup(m, path)
        if e.kind == "dir":
            raise IsADirectoryError_("is a directory", path)
        return e.id

    async def read_id_into(self, file_id: int, offset: int, buf: BytesLike) -> int:
        """``read_into`` by file id: also reaches a nameless file (a new version being
        written) and the committed bytes of an unsealed one."""
        int_arg("read_id_into", "file_id", file_id)
        int_arg("read_id_into", "offset", offset, at_least=0)
        out = buffer_arg("read_id_into", "buf", buf).cast("B")
        async with self.meta.view() as m:
            f, blocks, recs = await blocks_in(m, file_id, offset, len(out))
        end = min(f.size, offset + len(out))
        if end <= offset:
            return 0

        def place(at: int, piece: Payload) -> None:
            put_into(out[at - offset : at - offset + len(piece)], piece)

        await self.read_blocks(blocks, recs, offset, end, place, into=out[: end - offset])
        return end - offset

    async def reader(self, path: str) -> FileReader:
        """A ``FileReader`` of the file now at ``path``: its bytes as of now, read with the
        block map looked up once (for many reads of one file)."""
        async with self.meta.view() as m:
            return await self._reader(m, await self._file_id(m, path), path)

    async def reader_id(self, file_id: int) -> FileReader:
        """``reader`` by file id (a nameless or unsealed version too)."""
        int_arg("reader_id", "file_id", file_id)
        async with self.meta.view() as m:
            return await self._reader(m, file_id)

    async def _reader(self, m: MetaTxn, file_id: int, path: str | None = None) -> FileReader:
        f = regular(await m.files.get(file_id), file_id)
        return FileReader(self, file_id, f.size, await m.files.blocks(file_id), path)

    async def read_file(self, path: str) -> bytes | Synthetic:
        """The whole file (its committed bytes, for a file still being written)."""
        return await self.read(path)

    async def read(self, path: str, offset: int = 0, size: int = -1) -> bytes | Synthetic:
        """Up to ``size`` bytes from ``offset`` (all to the end when ``size`` < 0); short or
        empty at the end of the file. Raises DataUnavailableError rather than return wrong
        bytes. Raises ArgumentTypeError for an offset or size that is not an int. Bytes
        written as ``Synthetic`` payloads (a projection, docs/simulate.md) read back as the
        ``Synthetic`` that describes them."""
        int_arg("read", "offset", offset)
        int_arg("read", "size", size)
        if offset < 0:
            raise InvalidArgumentError("negative offset", path)
        f, blocks, recs = await self._file_blocks(path, offset, size)
        end = f.size if size < 0 else min(f.size, offset + size)
        if end <= offset:
            return b""
        parts: dict[int, Payload] = {}
        await self.read_blocks(blocks, recs, offset, end, parts.__setitem__)
        return joined(parts[k] for k in sorted(parts))

    async def read_into(self, path: str, offset: int, buf: BytesLike) -> int:
        """Read into ``buf`` (writable) from ``offset``; returns the byte count (0 at EOF).
        The fast path for big reads: no allocation per call."""
        int_arg("read_into", "offset", offset, at_least=0)
        out = buffer_arg("read_into", "buf", buf).cast("B")
        f, blocks, recs = await self._file_blocks(path, offset, len(out))
        end = min(f.size, offset + len(out))
        if end <= offset:
            return 0

        def place(at: int, piece: Payload) -> None:
            put_into(out[at - offset : at - offset + len(piece)], piece)

        await self.read_blocks(blocks, recs, offset, end, place, into=out)
        return end - offset

    async def read_blocks(
        self,
        blocks: list[BlockEntry],
        recs: list[BlockRecord | None],
        start: int,
        end: int,
        sink: Callable[[int, Payload], None],
        *,
        into: memoryview | None = None,
    ) -> None:
        """Read file bytes [start, end) of the given blocks (entries and their records, None
        for a hole: zeros, no node asked), handing ``sink(file offset, piece)`` each piece,
        or with ``into`` (the destination of [start, end)) receiving them straight there.
        Raises DataUnavailableError rather than hand over wrong bytes. At most ``read_depth``
        blocks are in flight, or more small ones up to ``read_ahead_bytes`` (never more than
        ``reader.MAX_BLOCKS_IN_FLIGHT``)."""
        await read_blocks(
            self.datapath,
            blocks,
            recs,
            start,
            end,
            sink,
            into=into,
            depth=self.read_depth,
            ahead_bytes=self.read_ahead_bytes,
        )

    async def purge(self, file_id: int) -> None:
        """Best-effort removal of a nameless file (a new version that failed, or a file kept
        after replacement or deletion whose last reader is done)."""
        int_arg("purge", "file_id", file_id)
        try:
            async with self.meta.transaction() as m:
                f = await m.files.get(file_id)
                if f is None or f.parent is not None:
                    return
                garbage = await m.drop_file(file_id)
            await self.datapath.delete_chunks(garbage)
        except OSError:
            pass  # left for garbage collection


def _token_holds(f: FileRecord | None, token: str, path: str) -> FileRecord:
    """``f`` if ``token`` is its write token; else FencedWriterError."""
    if f is None:
        raise FencedWriterError("file was deleted or replaced while being written", path)
    if f.token != token:
        raise FencedWriterError("another writer took this file over", path)
    return f


__all__ = ["BlockLayout", "Client", "Stat"]
