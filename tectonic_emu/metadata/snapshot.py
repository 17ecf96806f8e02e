"""A consistent snapshot of a whole metadata store, in a versioned, checksummed stream.

``dump`` reads every key of a ``KVStore`` inside one transaction (so the snapshot is one
committed state, never half of a concurrent commit) a batch at a time, and writes it to a
binary stream as it goes: memory holds one batch, whatever the store's size. ``load`` checks a
stream end to end first (format, every frame, the key count and the SHA-256 over everything
before it), and only then writes it into a store, a batch per transaction. The cluster's
identity key (``CLUSTER_KEY``) is written last, so a load cut short leaves a store that
``Cluster.open`` refuses as incomplete, never a silently partial namespace.

The format (all integers big-endian)::

    b"TECTONIC-META\\n"                  magic, 14 bytes
    u32 n, n bytes of JSON              header: {"format": 1, "cluster_id", "created"}
    repeated: b"K" u32 klen u32 vlen key value
    b"E" u64 count, 32 bytes SHA-256    of every byte before the digest

A dump of SQLite holds the store's lease while it reads (the seam's transactions are
serializable): about a second per few hundred thousand keys. It writes to a local stream only;
callers that ship a dump elsewhere (``services/backup.py``) do it after the transaction.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import BinaryIO

from tectonic_emu.errors import AlreadyExistsError, InvalidArgumentError
from tectonic_emu.metadata.kv import KVStore, Transaction

MAGIC = b"TECTONIC-META\n"
FORMAT = 1
# The cluster's identity in its own metadata: Cluster.create writes it beside the root
# directory, Cluster.open checks it against cluster.json. No layer's keys start with "M".
CLUSTER_KEY = b"M\x00cluster"
BATCH = 1000

_U32 = struct.Struct(">I")
_KV_HEAD = struct.Struct(">cII")
_END = struct.Struct(">cQ")
_MAX_FIELD = 64 << 20  # no key or value is near this: a length past it is damage, not data


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """What a dump holds: its format, the cluster it came from, when it was taken, how many
    keys and bytes, and its SHA-256 (hex)."""

    format: int
    cluster_id: str
    created: float
    keys: int
    nbytes: int
    sha256: str


async def read_cluster_id(kv: KVStore | Transaction) -> str | None:
    """The cluster id recorded in a metadata store, or None when it holds none."""
    raw = await kv.get(CLUSTER_KEY)
    if raw is None:
        return None
    try:
        return str(json.loads(raw)["cluster_id"])
    except (ValueError, KeyError, TypeError):
        return None


def cluster_value(cluster_id: str) -> bytes:
    """The value stored at ``CLUSTER_KEY`` for ``cluster_id``."""
    return json.dumps({"cluster_id": cluster_id}).encode()


class _Hashing:
    """A binary stream that counts and hashes what goes through it."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.sha = hashlib.sha256()
        self.nbytes = 0

    def write(self, data: bytes) -> None:
        self.stream.write(data)
        self.sha.update(data)
        self.nbytes += len(data)

    def read_some(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer at the end of the stream)."""
        data = self.stream.read(n)
        self.sha.update(data)
        self.nbytes += len(data)
        return data

    def read(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise InvalidArgumentError(
                f"metadata dump is cut short at byte {self.nbytes + len(data)}"
            )
        self.sha.update(data)
        self.nbytes += n
        return data


async def dump(kv: KVStore, out: BinaryIO, *, created: float, batch: int = BATCH) -> SnapshotInfo:
    """Write a consistent snapshot of every key of ``kv`` to ``out``; returns what it wrote.

    ``created`` is the time recorded in the header. Raises OSError from the store or ``out``;
    on an error ``out`` holds a stream that ``load`` refuses (it has no valid end)."""
    w = _Hashing(out)
    keys = 0
    async with kv.transaction(durable=False) as txn:
        cluster_id = await read_cluster_id(txn) or ""
        header = json.dumps({"format": FORMAT, "cluster_id": cluster_id, "created": created})
        w.write(MAGIC + _U32.pack(len(header)) + header.encode())
        start: bytes | None = None
        while True:
            rows = await txn.scan(b"", start=start, limit=batch)
            for k, v in rows:
                w.write(_KV_HEAD.pack(b"K", len(k), len(v)) + k + v)
            keys += len(rows)
            if len(rows) < batch:
                break
            start = rows[-1][0] + b"\x00"
    w.write(_END.pack(b"E", keys))
    digest = w.sha.digest()
    out.write(digest)
    return SnapshotInfo(FORMAT, cluster_id, created, keys, w.nbytes + len(digest), digest.hex())


def _read_header(r: _Hashing) -> tuple[str, float]:
    if r.read_some(len(MAGIC)) != MAGIC:
        raise InvalidArgumentError("not a tectonic-emu metadata dump (bad magic)")
    (n,) = _U32.unpack(r.read(_U32.size))
    if n > _MAX_FIELD:
        raise InvalidArgumentError("metadata dump header is damaged")
    try:
        header = json.loads(r.read(n))
        fmt, cluster_id, created = header["format"], header["cluster_id"], header["created"]
    except (ValueError, KeyError, TypeError):
        raise InvalidArgumentError("metadata dump header is damaged") from None
    if fmt != FORMAT:
        raise InvalidArgumentError(
            f"metadata dump format {fmt} is not one this version reads ({FORMAT})"
        )
    return str(cluster_id), float(created)


def _frames(r: _Hashing) -> tuple[int, list[tuple[bytes, bytes]] | None]:
    """The next frame: (0, [pair]) for a key, (count, None) for the end."""
    tag = r.read(1)
    if tag == b"K":
        klen, vlen = struct.unpack(">II", r.read(8))
        if klen > _MAX_FIELD or vlen > _MAX_FIELD:
            raise InvalidArgumentError("metadata dump is damaged (a length past any key's)")
        return 0, [(r.read(klen), r.read(vlen))]
    if tag == b"E":
        (count,) = struct.unpack(">Q", r.read(8))
        return count, None
    raise InvalidArgumentError(f"metadata dump is damaged (frame tag {tag!r})")


def verify(src: BinaryIO) -> SnapshotInfo:
    """Read a dump from the current position to its end and check it whole: format, frames,
    key count and checksum. Raises InvalidArgumentError naming what is wrong."""
    r = _Hashing(src)
    cluster_id, created = _read_header(r)
    keys = 0
    while True:
        count, pairs = _frames(r)
        if pairs is None:
            break
        keys += 1
    expected = r.sha.digest()
    digest = src.read(32)
    if count != keys:
        raise InvalidArgumentError(f"metadata dump is damaged ({keys} keys, its end says {count})")
    if digest != expected:
        raise InvalidArgumentError("metadata dump is damaged (checksum mismatch)")
    if src.read(1):
        raise InvalidArgumentError("metadata dump has bytes past its end")
    return SnapshotInfo(FORMAT, cluster_id, created, keys, r.nbytes + 32, digest.hex())


async def clear(kv: KVStore, *, batch: int = BATCH) -> int:
    """Delete every key of ``kv``, the cluster's identity first; returns how many."""
    removed = 0
    async with kv.transaction() as txn:
        if await txn.get(CLUSTER_KEY) is not None:
            await txn.delete(CLUSTER_KEY)
            removed += 1
    while True:
        async with kv.transaction(durable=False) as txn:
            rows = await txn.scan(b"", limit=batch)
            for k, _ in rows:
                await txn.delete(k)
        removed += len(rows)
        if len(rows) < batch:
            break
    await kv.sync()
    return removed


async def load(
    kv: KVStore,
    src: BinaryIO,
    *,
    replace: bool = False,
    cluster_id: str | None = None,
    batch: int = BATCH,
) -> SnapshotInfo:
    """Load the dump in ``src`` (seekable, at its start) into ``kv``; returns what it held.

    The whole dump is checked before anything is written. ``cluster_id``: refuse a dump of
    another cluster. ``replace``: delete what ``kv`` holds first; without it, a store that
    holds any key is refused (AlreadyExistsError). Raises InvalidArgumentError for a damaged,
    foreign or unknown-format dump, OSError from the store."""
    start = src.tell()
    info = verify(src)
    if cluster_id is not None and info.cluster_id != cluster_id:
        raise InvalidArgumentError(
            f"the dump is of cluster {info.cluster_id or '(unnamed)'}, this is {cluster_id}"
        )
    if replace:
        await clear(kv, batch=batch)
    elif await kv.scan(b"", limit=1):
        raise AlreadyExistsError(
            "the metadata store already holds keys (load --replace empties it first)"
        )
    src.seek(start)
    r = _Hashing(src)
    _read_header(r)
    identity: bytes | None = None
    done = False
    while not done:
        async with kv.transaction(durable=False) as txn:
            for _ in range(batch):
                _, pairs = _frames(r)
                if pairs is None:
                    done = True
                    break
                for k, v in pairs:
                    if k == CLUSTER_KEY:
                        identity = v  # last, below: it marks the load complete
                    else:
                        await txn.put(k, v)
    async with kv.transaction() as txn:
        if identity is not None:
            await txn.put(CLUSTER_KEY, identity)
    await kv.sync()
    return info


__all__ = [
    "CLUSTER_KEY",
    "FORMAT",
    "SnapshotInfo",
    "clear",
    "cluster_value",
    "dump",
    "load",
    "read_cluster_id",
    "verify",
]
