"""The records the metadata layers store, and their compact JSON form.

Records are frozen dataclasses; ``encode``/``decode`` turn them into the bytes the key-value
store keeps. JSON keeps the database readable with the ``sqlite3`` shell, which matters more
here than the few microseconds a binary form would save (one record per multi-MiB block).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

EntryKind = Literal["file", "dir"]
# What a File-layer record is: a regular file (its blocks), or one of the kinds that have
# no bytes, only a name and attributes (a symlink keeps its target in the record).
FileKind = Literal["file", "symlink", "fifo", "chardev", "blockdev", "socket"]
SPECIAL_KINDS: tuple[FileKind, ...] = ("fifo", "chardev", "blockdev", "socket")
ROOT_DIR_ID = 1
# The block id of a hole: a File-layer entry with no block behind it, whose bytes read as
# zeros (a sparse ``truncate``). ``layers.new_id`` never returns it, so no Block-layer record,
# chunk or intent ever has it.
HOLE_BLOCK_ID = 0


# A new file's and a new directory's permission bits where none were given; every record
# written before modes were kept decodes with them, owned by root (uid and gid 0).
FILE_MODE = 0o644
DIR_MODE = 0o755


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


_DECODER = json.JSONDecoder()


def _load(raw: bytes) -> Any:
    """A record's JSON, as ``_dump`` wrote it: half the time of ``json.loads``, which looks
    for byte-order marks and whitespace a record never has (stat decodes three)."""
    return _DECODER.raw_decode(raw.decode())[0]


def _put_attrs(
    d: dict[str, Any], mode: int, default: int, uid: int, gid: int, atime: float | None
) -> None:
    """The POSIX attributes into a record's JSON, each left out at its default, so that
    records written before they were kept, and records that never changed them, read alike."""
    if mode != default:
        d["mo"] = mode
    if uid:
        d["u"] = uid
    if gid:
        d["g"] = gid
    if atime is not None:
        d["a"] = atime


def _attrs(d: dict[str, Any], default: int) -> tuple[int, int, int, float | None]:
    """(mode, uid, gid, atime) from a record's JSON, the defaults where left out
    (``_put_attrs``)."""
    return d.get("mo", default), d.get("u", 0), d.get("g", 0), d.get("a")


@dataclass(frozen=True, slots=True)
class Entry:
    """A Name-layer entry: ``name`` in some directory points at a file or a directory."""

    name: str
    kind: EntryKind
    id: int

    def encode(self) -> bytes:
        return _dump({"k": self.kind[0], "id": self.id})

    @classmethod
    def decode(cls, name: str, raw: bytes) -> Entry:
        # What ``encode`` writes, ``{"k":"d","id":N}``, read without the JSON decoder (a
        # third of its 3 us; a stat decodes an entry per path part); anything else, by it.
        if raw[:6] == b'{"k":"' and raw[7:14] == b'","id":' and raw[-1:] == b"}":
            kind = raw[6:7]
            digits = raw[14:-1]
            if kind in (b"d", b"f") and digits.isdigit():
                return cls(name, "dir" if kind == b"d" else "file", int(digits))
        d = _load(raw)
        return cls(name=name, kind="dir" if d["k"] == "d" else "file", id=d["id"])


@dataclass(frozen=True, slots=True)
class DirRecord:
    """A directory's own attributes (kept in the Name layer, beside its entries)."""

    dir_id: int
    parent: int  # the root is its own parent
    name: str
    encoding: str | None  # what new files below inherit; None: ask the parent
    ctime: float
    mtime: float
    mode: int = DIR_MODE  # permission bits (and setgid, sticky): ``stat.S_IMODE``
    uid: int = 0
    gid: int = 0
    atime: float | None = None  # None: as ``mtime`` (never set apart from it)
    # Its subdirectories (its nlink is 2 more); None: not counted yet (a record written
    # before they were counted: ``attrs.subdirs`` counts them the first time they matter).
    subdirs: int | None = None
    tenant: int = 0  # the tenant whose namespace holds it (``tenants.py``); 0: none

    def encode(self) -> bytes:
        d: dict[str, Any] = {
            "p": self.parent, "n": self.name, "e": self.encoding, "c": self.ctime, "m": self.mtime
        }  # fmt: skip
        _put_attrs(d, self.mode, DIR_MODE, self.uid, self.gid, self.atime)
        if self.subdirs is not None:
            d["sd"] = self.subdirs
        if self.tenant:
            d["tn"] = self.tenant
        return _dump(d)

    @classmethod
    def decode(cls, dir_id: int, raw: bytes) -> DirRecord:
        d = _load(raw)
        return cls(
            dir_id,
            d["p"],
            d["n"],
            d["e"],
            d["c"],
            d["m"],
            *_attrs(d, DIR_MODE),
            d.get("sd"),
            d.get("tn", 0),
        )


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A file's attributes (File layer). ``size`` counts only committed, durable bytes."""

    file_id: int
    encoding: str
    size: int
    nblocks: int
    sealed: bool
    token: str | None  # the current writer's token; None once sealed
    parent: int | None  # None while the file has no name yet (write_file before the swap)
    name: str | None
    ctime: float
    mtime: float
    holes: int = 0  # bytes of ``size`` in holes (no block, read as zeros; not stored)
    mode: int = FILE_MODE  # permission bits (and setuid, setgid, sticky): ``stat.S_IMODE``
    uid: int = 0
    gid: int = 0
    atime: float | None = None  # None: as ``mtime`` (never set apart from it)
    # Names it has: hard links; its ``parent`` and ``name`` are one of them (the last given).
    nlink: int = 1
    kind: FileKind = "file"
    target: str | None = None  # a symlink's
    rdev: int = 0  # a device node's number
    tenant: int = 0  # the tenant it is charged to (``tenants.py``), for its life; 0: none

    @property
    def stored(self) -> int:
        """Bytes of it that are stored (its size less its holes): what a quota counts."""
        return self.size - self.holes

    @property
    def named(self) -> bool:
        """Whether it has a name: what a quota of files counts (a new version being
        written, or an unlinked file still open, has none)."""
        return self.parent is not None

    def encode(self) -> bytes:
        d: dict[str, Any] = {
            "e": self.encoding,
            "s": self.size,
            "b": self.nblocks,
            "sealed": self.sealed,
            "t": self.token,
            "p": self.parent,
            "n": self.name,
            "c": self.ctime,
            "m": self.mtime,
        }
        if self.holes:  # absent when 0: records written before holes existed decode alike
            d["h"] = self.holes
        _put_attrs(d, self.mode, FILE_MODE, self.uid, self.gid, self.atime)
        if self.nlink != 1:
            d["l"] = self.nlink
        if self.kind != "file":  # each left out at its default, as the attributes are
            d["k"] = self.kind
        if self.target is not None:
            d["tg"] = self.target
        if self.rdev:
            d["rd"] = self.rdev
        if self.tenant:
            d["tn"] = self.tenant
        return _dump(d)

    @classmethod
    def decode(cls, file_id: int, raw: bytes) -> FileRecord:
        d = _load(raw)
        return cls(
            file_id,
            d["e"],
            d["s"],
            d["b"],
            d["sealed"],
            d["t"],
            d["p"],
            d["n"],
            d["c"],
            d["m"],
            d.get("h", 0),
            *_attrs(d, FILE_MODE),
            d.get("l", 1),
            d.get("k", "file"),
            d.get("tg"),
            d.get("rd", 0),
            d.get("tn", 0),
        )


@dataclass(frozen=True, slots=True)
class BlockEntry:
    """File layer: block ``block_no`` of a file holds bytes [offset, offset + length).

    A hole (``block_id == HOLE_BLOCK_ID``) has no Block-layer record and no chunks: its
    bytes are zeros, read without asking any node."""

    block_no: int
    block_id: int
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def is_hole(self) -> bool:
        return self.block_id == HOLE_BLOCK_ID

    def encode(self) -> bytes:
        return _dump([self.block_id, self.offset, self.length])

    @classmethod
    def decode(cls, block_no: int, raw: bytes) -> BlockEntry:
        block_id, offset, length = _load(raw)
        return cls(block_no, block_id, offset, length)


@dataclass(frozen=True, slots=True)
class ChunkPlacement:
    """Block layer: where chunk ``index`` of a block lives and what it must hash to."""

    index: int
    node: int
    disk: int
    chunk_id: str
    crc32c: int  # of the stored (possibly compressed) bytes
    stored_len: int
    flags: int  # bit 0: zstd
    raw_len: int  # length before compression


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """Block layer: a block is a set of chunks on distinct nodes."""

    block_id: int
    file_id: int
    length: int  # logical bytes in the block
    encoding: str
    chunks: tuple[ChunkPlacement, ...]

    def encode(self) -> bytes:
        return _dump(
            {
                "f": self.file_id,
                "l": self.length,
                "e": self.encoding,
                "c": [
                    [
                        c.index,
                        c.node,
                        c.disk,
                        c.chunk_id,
                        c.crc32c,
                        c.stored_len,
                        c.flags,
                        c.raw_len,
                    ]
                    for c in self.chunks
                ],
            }
        )

    @classmethod
    def decode(cls, block_id: int, raw: bytes) -> BlockRecord:
        d = _load(raw)
        chunks = tuple(ChunkPlacement(*c) for c in d["c"])
        return cls(block_id, d["f"], d["l"], d["e"], chunks)

    def chunk(self, index: int) -> ChunkPlacement | None:
        return next((c for c in self.chunks if c.index == index), None)


@dataclass(frozen=True, slots=True)
class IntentRecord:
    """An announced chunk write, not committed yet: ``owner`` (a writer's token, or a repair's
    own ``repair-`` name) is about to store chunks of block ``block_id`` (their ids start with
    the block id, see ``blockwrite.new_chunk_id``) for file ``file_id``, and holds that claim
    until ``expires`` (``time.time()``), renewing it while it works. Garbage collection leaves
    those chunks alone while the claim is live; the commit removes it in the transaction that
    adds the block, and fails if it is gone."""

    block_id: int
    owner: str
    file_id: int
    expires: float

    @property
    def by_repair(self) -> bool:
        """Repair's claim: live until it expires (a writer's also needs the file's token)."""
        return self.owner.startswith(REPAIR_OWNER)

    def encode(self) -> bytes:
        return _dump({"f": self.file_id, "x": self.expires})

    @classmethod
    def decode(cls, block_id: int, owner: str, raw: bytes) -> IntentRecord:
        d = _load(raw)
        return cls(block_id, owner, d["f"], d["x"])


REPAIR_OWNER = "repair-"  # the prefix of repair's intents' owners (writer tokens are hex)


@dataclass(frozen=True, slots=True)
class TenantRecord:
    """A tenant (``tenants.py``): its name, the directory ids of its namespaces, its quotas
    (None: no limit) and what it uses."""

    tenant_id: int
    name: str
    namespaces: tuple[int, ...]
    quota_files: int | None
    quota_bytes: int | None
    files_used: int = 0
    bytes_used: int = 0

    def encode(self) -> bytes:
        d: dict[str, Any] = {
            "n": self.name, "ns": list(self.namespaces), "qf": self.quota_files,
            "qb": self.quota_bytes, "f": self.files_used, "b": self.bytes_used,
        }  # fmt: skip
        return _dump(d)

    @classmethod
    def decode(cls, tenant_id: int, raw: bytes) -> TenantRecord:
        d = _load(raw)
        return cls(tenant_id, d["n"], tuple(d["ns"]), d["qf"], d["qb"], d["f"], d["b"])


__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "HOLE_BLOCK_ID",
    "REPAIR_OWNER",
    "ROOT_DIR_ID",
    "BlockEntry",
    "BlockRecord",
    "ChunkPlacement",
    "DirRecord",
    "Entry",
    "EntryKind",
    "FileKind",
    "FileRecord",
    "SPECIAL_KINDS",
    "TenantRecord",
    "IntentRecord",
]
