"""The chunk seam: what a storage node offers the client library.

A storage node holds chunks on its disks and knows nothing of blocks or files. A chunk is an
opaque, immutable byte string named by a ``chunk_id`` (``[0-9a-z.-]``, at most 64 characters)
on one of the node's disks. Every node implementation (in-process ``LocalNode`` on flash
directories, ``MemoryNode`` for tests, the TCP client of a served node later) runs the same
contract tests (``tests/test_chunkstore_contract.py``).
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass

from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding.synthetic import Payload, Synthetic
from tectonic_emu.errors import ChunkCorruptError, InvalidArgumentError, NodeUnavailableError

MAX_NODE_DELAY = 3600.0  # seconds: the most a slowed node (served or embedded) adds a call
_CHUNK_ID = re.compile(r"[0-9a-z][0-9a-z.\-]{0,63}")


def check_range(offset: int, length: int, payload_len: int, chunk_id: str) -> None:
    """Raise InvalidArgumentError unless ``[offset, offset + length)`` lies in a payload of
    ``payload_len`` bytes."""
    if offset < 0 or length < 0 or offset + length > payload_len:
        raise InvalidArgumentError(
            f"range of {length} bytes at {offset} is outside the {payload_len}-byte chunk",
            chunk_id,
        )


def check_chunk_id(chunk_id: str) -> str:
    if not is_chunk_id(chunk_id):
        raise InvalidArgumentError("not a valid chunk id", chunk_id)
    return chunk_id


def is_chunk_id(name: str) -> bool:
    """Whether ``name`` is a valid chunk id (``check_chunk_id`` raises where it is not)."""
    return _CHUNK_ID.fullmatch(name) is not None


#: What a node returns for a chunk: bytes, or the ``Synthetic`` payload a node that keeps
#: descriptions (``MemoryNode``, the projection's model nodes) was given.
ChunkData = memoryview | Synthetic


def stored_bytes(payload: Payload, node_id: int) -> BytesLike:
    """``payload``, refused when synthetic: nodes that store bytes cannot store a description
    (a projection's payloads go to model nodes, ``tectonic_emu/sim``)."""
    if isinstance(payload, Synthetic):
        raise InvalidArgumentError(
            f"node {node_id} stores bytes, not a synthetic payload (a projection's model nodes "
            "keep those)"
        )
    return payload


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """What a node can say about one chunk it holds without reading it whole."""

    chunk_id: str
    disk: int
    stored_len: int  # payload bytes as stored (after compression), header excluded
    crc32c: int  # CRC32C of the stored payload, as recorded when written
    flags: int  # bit 0: payload is zstd-compressed
    mtime: float  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class DiskUsage:
    disk: int
    chunks: int
    bytes_used: int  # bytes of chunk files on this disk
    bytes_free: int  # free bytes of the file system under this disk


class StorageNode(abc.ABC):
    """One storage node. Every method raises ``NodeUnavailableError`` while the node is down.

    Errors: ``ChunkNotFoundError`` (no such chunk), ``ChunkCorruptError`` (stored bytes no longer
    match the checksum written with them, or a chunk half-written when its writer died),
    ``AlreadyExistsError`` (a chunk id is written once), ``InvalidArgumentError`` (bad disk
    number or chunk id). A write that raises or is cancelled leaves no chunk that reads as valid.
    """

    node_id: int
    disks: int
    #: Whether the node is in service. A node taken out of service (``Cluster.stop_node``)
    #: answers nothing: every method raises ``NodeUnavailableError``.
    available: bool = True

    @abc.abstractmethod
    async def write_chunk(
        self,
        disk: int,
        chunk_id: str,
        payload: Payload,
        *,
        crc32c: int,
        flags: int = 0,
        sync: bool = True,
    ) -> None:
        """Store ``payload`` as a new chunk. Durable when it returns, unless the node was set
        to page-cache mode (``LocalNode(sync=False)``) or the call says ``sync=False``: then
        the chunk reads back at once but may be lost in a crash of the node's host until a
        ``sync_disk`` of its disk returns (a writer that commits at flush syncs each disk
        it wrote once, not each chunk). ``crc32c`` is the caller's checksum of ``payload``;
        the node stores it beside the bytes and checks it on every read (``LocalNode`` and
        served nodes also refuse a payload that does not match it: ChunkCorruptError).
        Nodes that store bytes refuse a ``Synthetic`` payload (InvalidArgumentError,
        ``stored_bytes``)."""

    @abc.abstractmethod
    async def sync_disk(self, disk: int) -> None:
        """Make every chunk written to ``disk`` before this call durable, those written with
        ``sync=False`` included; concurrent calls share one flush. Raises the flush's
        OSError (the chunks may then be lost in a crash), NodeUnavailableError,
        InvalidArgumentError for a disk the node does not have."""

    @abc.abstractmethod
    async def read_chunk(self, disk: int, chunk_id: str) -> tuple[ChunkData, ChunkInfo]:
        """The chunk's stored payload, checked against its checksum."""

    async def read_chunk_into(self, disk: int, chunk_id: str, dest: memoryview) -> ChunkInfo:
        """Read a chunk into ``dest``, which must be exactly its stored length (else
        ChunkCorruptError and ``dest`` untouched). Checked as ``read_chunk``. If the call is
        cancelled, ``dest`` may hold part of the chunk but nothing more lands in it after.
        Served nodes receive straight into ``dest``; this default copies."""
        data, info = await self.read_chunk(disk, chunk_id)
        if isinstance(data, Synthetic):
            raise InvalidArgumentError("a synthetic chunk is not read into a buffer", chunk_id)
        if len(data) != dest.nbytes:
            raise ChunkCorruptError(
                f"chunk is {len(data)} bytes where {dest.nbytes} were expected", chunk_id
            )
        dest[:] = data
        return info

    async def read_chunk_range(
        self, disk: int, chunk_id: str, offset: int, length: int
    ) -> tuple[ChunkData, ChunkInfo]:
        """Stored payload bytes ``[offset, offset + length)``, checked, and the chunk's
        header information: a node whose chunks carry piece checksums (``_format.py``) reads
        and checks only the pieces the range covers; this default reads the whole chunk,
        checked, and returns the range of it. Raises InvalidArgumentError for a range past
        the payload, and as ``read_chunk``."""
        data, info = await self.read_chunk(disk, chunk_id)
        check_range(offset, length, len(data), chunk_id)
        return data[offset : offset + length], info

    @abc.abstractmethod
    async def delete_chunk(self, disk: int, chunk_id: str) -> None:
        """Remove a chunk; no error if it is absent."""

    @abc.abstractmethod
    async def stat_chunk(self, disk: int, chunk_id: str) -> ChunkInfo:
        """Header information of a chunk, without reading or checking the payload."""

    @abc.abstractmethod
    async def list_chunks(self, disk: int) -> list[ChunkInfo]:
        """Every chunk on one disk, in no particular order."""

    @abc.abstractmethod
    async def usage(self) -> list[DiskUsage]:
        """Per disk: chunk count, bytes used and bytes free."""

    async def reserve(self, nbytes: int) -> None:
        """Ask whether the node takes a chunk of ``nbytes`` now: hedged writes reserve on more
        nodes than they need and write to the first that accept. Raises NodeUnavailableError
        while down, OSError(ENOSPC) when full. In-process nodes accept at once."""
        if not self.available:
            raise NodeUnavailableError(f"node {self.node_id} is down")

    def chunk_path(self, disk: int, chunk_id: str) -> str | None:
        """Where the chunk lives on the local file system, when it does (for ``stat --json``
        and fault-injection tests); None for nodes that have no files."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (executors, sockets)."""


__all__ = [
    "MAX_NODE_DELAY",
    "BytesLike",
    "ChunkData",
    "ChunkInfo",
    "DiskUsage",
    "Payload",
    "StorageNode",
    "check_chunk_id",
    "check_range",
    "is_chunk_id",
    "stored_bytes",
]
