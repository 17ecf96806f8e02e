"""Tectonic's three metadata layers over one ordered key-value store.

Keys are hash-partitioned the way Tectonic shards them on ZippyDB: every key starts with a
layer tag and a 2-byte hash of the id that owns it, so one directory's entries, one file's
block list or one block's chunk list sit together (one prefix scan) while different ids
spread evenly over the key space (and, on a sharded backend, over shards)::

    Name   N | h(dir)  | dir_id             -> DirRecord      (the directory itself)
    Name   N | h(dir)  | dir_id | name      -> Entry          (name -> file or directory)
    File   F | h(file) | file_id | 00       -> FileRecord
    File   F | h(file) | file_id | 01 | no  -> BlockEntry     (block ``no`` of the file, or a
                                                                hole: block id 0, no Block record)
    Block  B | h(blk)  | block_id           -> BlockRecord    (its chunks and checksums)
    Index  D | node | disk | block_id       -> ''             (reverse index walked by repair)
    Intent I | h(blk)  | block_id | owner   -> IntentRecord   (chunks being written, uncommitted)

Ids are unsigned 64-bit integers, big-endian in keys so that they sort numerically.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from types import TracebackType

from tectonic_emu import entropy
from tectonic_emu.metadata import offloop
from tectonic_emu.metadata.kv import KVStore, Transaction
from tectonic_emu.metadata.records import (
    HOLE_BLOCK_ID,
    ROOT_DIR_ID,
    BlockEntry,
    BlockRecord,
    ChunkPlacement,
    DirRecord,
    Entry,
    FileRecord,
    IntentRecord,
)
from tectonic_emu.metadata.tenants import TenantLayer

_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_FILE_ATTR = b"\x00"
_FILE_BLOCK = b"\x01"


def new_id() -> int:
    """A random 63-bit id (never 0, ``HOLE_BLOCK_ID``, or the root's id)."""
    while (i := entropy.randbits(63)) <= max(ROOT_DIR_ID, HOLE_BLOCK_ID):
        pass
    return i


@functools.lru_cache(maxsize=4096)
def _part(tag: bytes, ident: int) -> bytes:
    """``tag``, a 2-byte hash of ``ident`` (spreading ids over the key space) and ``ident``.
    The same few directories' are made over and over (every path walk): kept, as the hash
    is most of a lookup's key-making."""
    raw = _U64.pack(ident)
    return tag + hashlib.blake2b(raw, digest_size=2).digest() + raw


def dir_key(dir_id: int) -> bytes:
    return _part(b"N", dir_id)


def entry_key(dir_id: int, name: str) -> bytes:
    return _part(b"N", dir_id) + name.encode()


def file_key(file_id: int) -> bytes:
    return _part(b"F", file_id) + _FILE_ATTR


def block_entry_prefix(file_id: int) -> bytes:
    return _part(b"F", file_id) + _FILE_BLOCK


def block_key(block_id: int) -> bytes:
    return _part(b"B", block_id)


def intent_key(block_id: int, owner: str) -> bytes:
    return _part(b"I", block_id) + owner.encode()


def xattr_prefix(obj_id: int) -> bytes:
    """Extended attributes of the file or directory ``obj_id`` (ids are unique across
    both): the attribute's name follows."""
    return _part(b"X", obj_id)


def disk_prefix(node: int, disk: int) -> bytes:
    return b"D" + _U16.pack(node) + _U16.pack(disk)


class NameLayer:
    """Directories and the names in them. A directory's record is read once per
    transaction and kept decoded (a create reads its parent's three times: the walk, the
    new file's mode, the parent's times); nothing else changes it while the transaction
    is open."""

    def __init__(self, txn: Transaction, tenants: TenantLayer) -> None:
        self._txn = txn
        self._tenants = tenants
        self._dirs: dict[int, DirRecord | None] = {}

    async def get_dir(self, dir_id: int) -> DirRecord | None:
        if dir_id in self._dirs:
            return self._dirs[dir_id]
        raw = await self._txn.get(dir_key(dir_id))
        rec = self._dirs[dir_id] = None if raw is None else DirRecord.decode(dir_id, raw)
        return rec

    async def put_dir(self, rec: DirRecord) -> None:
        """Write a directory's record; a new one is charged to its tenant (``tenants.py``)."""
        if rec.tenant and await self.get_dir(rec.dir_id) is None:
            await self._tenants.charge(rec.tenant, 1, 0)
        self._dirs.pop(rec.dir_id, None)  # kept once the put went through
        await self._txn.put(dir_key(rec.dir_id), rec.encode())
        self._dirs[rec.dir_id] = rec

    async def delete_dir(self, dir_id: int) -> None:
        old = await self.get_dir(dir_id)
        if old is not None and old.tenant:
            await self._tenants.charge(old.tenant, -1, 0)
        self._dirs.pop(dir_id, None)
        await self._txn.delete(dir_key(dir_id))
        self._dirs[dir_id] = None

    async def lookup(self, dir_id: int, name: str) -> Entry | None:
        raw = await self._txn.get(entry_key(dir_id, name))
        return None if raw is None else Entry.decode(name, raw)

    async def link(self, dir_id: int, entry: Entry) -> None:
        await self._txn.put(entry_key(dir_id, entry.name), entry.encode())

    async def unlink(self, dir_id: int, name: str) -> None:
        await self._txn.delete(entry_key(dir_id, name))

    async def entries(
        self, dir_id: int, *, limit: int | None = None, prefix: str = ""
    ) -> list[Entry]:
        """The directory's entries in name order; with ``prefix``, only names that start
        with it (one range of keys: a few names of a big directory cost a few rows)."""
        key = dir_key(dir_id)
        if prefix:
            rows = await self._txn.scan(key + prefix.encode(), limit=limit)
        else:
            # Names are never empty, so the directory's own record (the bare key) sorts first.
            rows = await self._txn.scan(key, start=key + b"\x01", limit=limit)
        return [Entry.decode(k[len(key) :].decode(), v) for k, v in rows]


class FileLayer:
    """File attributes and each file's ordered list of blocks. Records are read once per
    transaction and kept decoded (a rename or a commit reads one more than once); a
    tenant's file is charged to it as it is made, grows, shrinks and goes (``tenants.py``)."""

    def __init__(self, txn: Transaction, tenants: TenantLayer) -> None:
        self._txn = txn
        self._tenants = tenants
        self._kept: dict[int, FileRecord | None] = {}

    async def get(self, file_id: int) -> FileRecord | None:
        if file_id not in self._kept:
            raw = await self._txn.get(file_key(file_id))
            self._kept[file_id] = None if raw is None else FileRecord.decode(file_id, raw)
        return self._kept[file_id]

    async def put(self, rec: FileRecord) -> None:
        if rec.tenant:  # (a file's tenant never changes: one without has none before)
            old = await self.get(rec.file_id)
            files = rec.named - (old is not None and old.named)
            nbytes = rec.stored - (0 if old is None else old.stored)
            await self._tenants.charge(rec.tenant, files, nbytes)
        self._kept.pop(rec.file_id, None)  # kept once the put went through
        await self._txn.put(file_key(rec.file_id), rec.encode())
        self._kept[rec.file_id] = rec

    async def delete(self, file_id: int) -> list[BlockEntry]:
        """Remove the file and its block list; returns the blocks it had."""
        old = await self.get(file_id)
        if old is not None and old.tenant:
            await self._tenants.charge(old.tenant, -old.named, -old.stored)
        blocks = await self.blocks(file_id)
        prefix = block_entry_prefix(file_id)
        for b in blocks:
            await self._txn.delete(prefix + _U64.pack(b.block_no))
        self._kept.pop(file_id, None)
        await self._txn.delete(file_key(file_id))
        self._kept[file_id] = None
        return blocks

    async def set_blocks(self, file_id: int, entries: list[BlockEntry]) -> list[BlockEntry]:
        """Make ``entries`` the file's block list (a rewrite's contents moved in); returns
        the list it had."""
        old = await self.blocks(file_id)
        prefix = block_entry_prefix(file_id)
        for b in old[len(entries) :]:
            await self._txn.delete(prefix + _U64.pack(b.block_no))
        for b in entries:
            await self.add_block(file_id, b)
        return old

    async def add_block(self, file_id: int, entry: BlockEntry) -> None:
        await self._txn.put(block_entry_prefix(file_id) + _U64.pack(entry.block_no), entry.encode())

    async def blocks(self, file_id: int) -> list[BlockEntry]:
        prefix = block_entry_prefix(file_id)
        rows = await self._txn.scan(prefix)
        return [BlockEntry.decode(_U64.unpack(k[len(prefix) :])[0], v) for k, v in rows]


class BlockLayer:
    """Blocks, their chunk placements, and the disk -> block reverse index."""

    def __init__(self, txn: Transaction) -> None:
        self._txn = txn

    async def get(self, block_id: int) -> BlockRecord | None:
        raw = await self._txn.get(block_key(block_id))
        return None if raw is None else BlockRecord.decode(block_id, raw)

    async def put(self, rec: BlockRecord, *, old: BlockRecord | None = None) -> None:
        """Insert or replace a block record, keeping the reverse index in step."""
        await self._txn.put(block_key(rec.block_id), rec.encode())
        new_disks = {(c.node, c.disk) for c in rec.chunks}
        old_disks = set() if old is None else {(c.node, c.disk) for c in old.chunks}
        suffix = _U64.pack(rec.block_id)
        for node, disk in old_disks - new_disks:
            await self._txn.delete(disk_prefix(node, disk) + suffix)
        for node, disk in new_disks - old_disks:
            await self._txn.put(disk_prefix(node, disk) + suffix, b"")

    async def delete(self, rec: BlockRecord) -> None:
        await self._txn.delete(block_key(rec.block_id))
        suffix = _U64.pack(rec.block_id)
        for node, disk in {(c.node, c.disk) for c in rec.chunks}:
            await self._txn.delete(disk_prefix(node, disk) + suffix)


class IntentLayer:
    """Announced chunk writes (``IntentRecord``): what garbage collection must not take."""

    def __init__(self, txn: Transaction) -> None:
        self._txn = txn

    async def get(self, block_id: int, owner: str) -> IntentRecord | None:
        raw = await self._txn.get(intent_key(block_id, owner))
        return None if raw is None else IntentRecord.decode(block_id, owner, raw)

    async def put(self, rec: IntentRecord) -> None:
        await self._txn.put(intent_key(rec.block_id, rec.owner), rec.encode())

    async def delete(self, block_id: int, owner: str) -> None:
        await self._txn.delete(intent_key(block_id, owner))


class XattrLayer:
    """Extended attributes (``user.*``) of files and directories, one key each, so that a
    file's record (rewritten at every block commit) does not carry them."""

    def __init__(self, txn: Transaction) -> None:
        self._txn = txn

    async def get(self, obj_id: int, name: str) -> bytes | None:
        return await self._txn.get(xattr_prefix(obj_id) + name.encode())

    async def put(self, obj_id: int, name: str, value: bytes) -> None:
        await self._txn.put(xattr_prefix(obj_id) + name.encode(), value)

    async def delete(self, obj_id: int, name: str) -> None:
        await self._txn.delete(xattr_prefix(obj_id) + name.encode())

    async def names(self, obj_id: int) -> list[str]:
        prefix = xattr_prefix(obj_id)
        return [k[len(prefix) :].decode() for k, _ in await self._txn.scan(prefix)]

    async def clear(self, obj_id: int) -> None:
        """Remove them all (the file or directory goes)."""
        for name in await self.names(obj_id):
            await self.delete(obj_id, name)


class MetaTxn:
    """The layers seen through one transaction (each made when first used: a stat, the
    commonest, uses two of five)."""

    def __init__(self, txn: Transaction) -> None:
        self.txn = txn
        self.tenants = TenantLayer(txn)
        self.names = NameLayer(txn, self.tenants)

    @functools.cached_property
    def files(self) -> FileLayer:
        return FileLayer(self.txn, self.tenants)

    @functools.cached_property
    def blocks(self) -> BlockLayer:
        return BlockLayer(self.txn)

    @functools.cached_property
    def intents(self) -> IntentLayer:
        return IntentLayer(self.txn)

    @functools.cached_property
    def xattrs(self) -> XattrLayer:
        return XattrLayer(self.txn)

    async def drop_dir(self, dir_id: int) -> None:
        """Remove an (empty) directory's record and its extended attributes."""
        await self.names.delete_dir(dir_id)
        await self.xattrs.clear(dir_id)

    async def own_blocks(self, entries: list[BlockEntry], file_id: int) -> None:
        """The Block-layer records of ``entries`` now name ``file_id`` as their file (their
        entries moved there: ``FileLayer.set_blocks``)."""
        for b in entries:
            rec = None if b.is_hole else await self.blocks.get(b.block_id)
            if rec is not None and rec.file_id != file_id:
                await self.blocks.put(replace(rec, file_id=file_id), old=rec)

    async def drop_file(self, file_id: int) -> list[ChunkPlacement]:
        """Remove a file's File- and Block-layer records; returns its chunks, which the
        caller deletes from the nodes after this transaction commits."""
        garbage: list[ChunkPlacement] = []
        await self.xattrs.clear(file_id)
        for b in await self.files.delete(file_id):
            if b.is_hole:
                continue  # no record, no chunks
            rec = await self.blocks.get(b.block_id)
            if rec is not None:
                await self.blocks.delete(rec)
                garbage.extend(rec.chunks)
        return garbage


class _View:
    """``Metadata.view``: a ``MetaTxn`` over a view of the store."""

    def __init__(self, view: AbstractAsyncContextManager[Transaction]) -> None:
        self._view = view

    async def __aenter__(self) -> MetaTxn:
        return MetaTxn(await self._view.__aenter__())

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._view.__aexit__(exc_type, exc, tb)


class Metadata:
    """Name, File and Block layers over one ``KVStore``."""

    def __init__(self, kv: KVStore) -> None:
        self.kv = kv

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[MetaTxn]:
        """A transaction over the layers (``durable``: see ``KVStore.transaction``)."""
        async with self.kv.transaction(durable=durable) as txn:
            m = MetaTxn(txn)
            yield m
            m.tenants.check()  # quotas, on what the transaction changed (``tenants.py``)

    def view(self) -> _View:
        """The layers in a read-only view of the last commit (``KVStore.view``): for stat,
        listings and readers, far cheaper than a transaction on SQLite; writes raise
        ``OSError(EROFS)``. (A class, not a generator: a stat is a few tens of us, and a
        generator-based context manager costs several of them.) Inside
        ``offloop.run_here``, on a thread off the loop: the store's thread view, or
        ``WouldWait`` if it has none."""
        if offloop.here():
            view = self.kv.thread_view()
            if view is None:
                raise offloop.WouldWait
            return _View(view)
        return _View(self.kv.view())

    async def sync(self) -> None:
        """Every transaction committed so far durable (``KVStore.sync``)."""
        await self.kv.sync()

    async def file(self, file_id: int) -> FileRecord | None:
        """A file's record as last committed, read outside any transaction (with SQLite, on
        its own connection: it does not wait for the transactions in progress)."""
        raw = await self.kv.get(file_key(file_id))
        return None if raw is None else FileRecord.decode(file_id, raw)

    async def block(self, block_id: int) -> BlockRecord | None:
        """A block's record as last committed, read outside any transaction."""
        raw = await self.kv.get(block_key(block_id))
        return None if raw is None else BlockRecord.decode(block_id, raw)

    async def ensure_root(self, now: float) -> None:
        async with self.transaction() as m:
            if await m.names.get_dir(ROOT_DIR_ID) is None:
                await m.names.put_dir(
                    DirRecord(ROOT_DIR_ID, ROOT_DIR_ID, "", None, now, now, subdirs=0)
                )

    async def iter_blocks(self) -> AsyncIterator[BlockRecord]:
        """Every block record (in batches of separate transactions)."""
        async for key, raw in self.kv.iter_prefix(b"B"):
            yield BlockRecord.decode(_U64.unpack(key[3:])[0], raw)

    async def iter_files(self) -> AsyncIterator[FileRecord]:
        async for key, raw in self.kv.iter_prefix(b"F"):
            if key.endswith(_FILE_ATTR) and len(key) == 12:
                yield FileRecord.decode(_U64.unpack(key[3:11])[0], raw)

    async def iter_dirs(self) -> AsyncIterator[DirRecord]:
        """Every directory's record (in batches of separate transactions)."""
        async for key, raw in self.kv.iter_prefix(b"N"):
            if len(key) == 11:  # the bare key; longer ones are its entries
                yield DirRecord.decode(_U64.unpack(key[3:])[0], raw)

    async def iter_intents(self) -> AsyncIterator[IntentRecord]:
        """Every announced, uncommitted chunk write (in batches of separate transactions)."""
        async for key, raw in self.kv.iter_prefix(b"I"):
            owner = key[11:].decode()
            yield IntentRecord.decode(_U64.unpack(key[3:11])[0], owner, raw)

    async def blocks_on_disk(self, node: int, disk: int) -> list[int]:
        """Ids of blocks with a chunk on ``(node, disk)`` (the reverse index)."""
        prefix = disk_prefix(node, disk)
        return [_U64.unpack(k[len(prefix) :])[0] async for k, _ in self.kv.iter_prefix(prefix)]


__all__ = [
    "BlockLayer",
    "FileLayer",
    "IntentLayer",
    "MetaTxn",
    "Metadata",
    "NameLayer",
    "new_id",
]
