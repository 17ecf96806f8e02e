"""``MemoryNode``: a storage node that keeps its chunks in dicts, for tests and projections.

It behaves like ``LocalNode`` seen from outside: same errors, checksums checked on every read,
torn writes that read as corrupt, the ``available`` switch. It also offers ``corrupt()`` to
flip a stored byte. It keeps a ``Synthetic`` payload as the description it is (so a
projection's nodes hold no payload bytes), checked by its derived checksum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tectonic_emu import clock
from tectonic_emu.chunkstore._format import PAYLOAD_OFFSET, as_byte_view
from tectonic_emu.chunkstore.base import (
    ChunkData,
    ChunkInfo,
    DiskUsage,
    Payload,
    StorageNode,
    check_chunk_id,
)
from tectonic_emu.coding import crc32c as checksum
from tectonic_emu.coding.synthetic import Synthetic
from tectonic_emu.errors import (
    AlreadyExistsError,
    ChunkCorruptError,
    ChunkNotFoundError,
    InvalidArgumentError,
    NodeUnavailableError,
    NoSpaceError,
)


@dataclass(frozen=True, slots=True)
class _Stored:
    payload: bytes | Synthetic
    stored_len: int  # what the "header" says; differs from len(payload) after a torn write
    crc32c: int
    flags: int
    mtime: float


class MemoryNode(StorageNode):
    """A storage node in memory. ``capacity`` (bytes per disk) only feeds ``usage().bytes_free``;
    bytes used count a 32-byte header per chunk, as on disk."""

    def __init__(self, node_id: int, disks: int, *, capacity: int = 1 << 40) -> None:
        if disks < 1:
            raise InvalidArgumentError(f"a node needs at least one disk, not {disks}")
        self.node_id = node_id
        self.disks = disks
        self.capacity = capacity
        self.available = True
        self._closed = False
        self._disks: list[dict[str, _Stored]] = [{} for _ in range(disks)]
        self.full: set[int] = set()  # disks that refuse writes as a full one does (a fault)
        # Chunks written with sync=False since their disk's last sync: what a crash loses.
        self._unsynced: list[set[str]] = [set() for _ in range(disks)]

    def _check_up(self) -> None:
        if self._closed:
            raise NodeUnavailableError(f"node {self.node_id} is closed")
        if not self.available:
            raise NodeUnavailableError(f"node {self.node_id} is down")

    def _disk(self, disk: int) -> dict[str, _Stored]:
        if not 0 <= disk < self.disks:
            raise InvalidArgumentError(f"node {self.node_id} has no disk {disk}")
        return self._disks[disk]

    def _get(self, disk: int, chunk_id: str) -> _Stored:
        chunks = self._disk(disk)
        check_chunk_id(chunk_id)
        try:
            return chunks[chunk_id]
        except KeyError:
            raise ChunkNotFoundError("no such chunk", chunk_id) from None

    def _put(self, disk: int, chunk_id: str, stored: _Stored) -> None:
        chunks = self._disk(disk)
        check_chunk_id(chunk_id)
        if not 0 <= stored.crc32c < 1 << 32:
            raise InvalidArgumentError(f"crc32c out of range: {stored.crc32c}", chunk_id)
        if not 0 <= stored.flags < 1 << 16:
            raise InvalidArgumentError(f"flags out of range: {stored.flags}", chunk_id)
        if chunk_id in chunks:
            raise AlreadyExistsError("chunk already exists", chunk_id)
        chunks[chunk_id] = stored

    @staticmethod
    def _info(disk: int, chunk_id: str, s: _Stored) -> ChunkInfo:
        return ChunkInfo(chunk_id, disk, s.stored_len, s.crc32c, s.flags, s.mtime)

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
        """With ``sync=False`` the chunk is lost by a ``crash`` until its disk is synced."""
        self._check_up()
        if disk in self.full:
            raise NoSpaceError(f"node {self.node_id} disk {disk} is full", chunk_id)
        data = payload if isinstance(payload, Synthetic) else bytes(as_byte_view(payload))
        self._put(disk, chunk_id, _Stored(data, len(data), crc32c, flags, clock.wall()))
        if sync:
            self._unsynced[disk].discard(chunk_id)
        else:
            self._unsynced[disk].add(chunk_id)

    async def sync_disk(self, disk: int) -> None:
        self._check_up()
        self._disk(disk)  # InvalidArgumentError for a disk it does not have
        self._unsynced[disk].clear()

    def durable(self, disk: int, chunk_id: str) -> bool:
        """Test helper: whether the chunk is stored and would survive a ``crash``."""
        return chunk_id in self._disk(disk) and chunk_id not in self._unsynced[disk]

    def crash(self) -> list[tuple[int, str]]:
        """Test helper: lose what a power cut would, every chunk written unsynced since its
        disk's last sync; returns them as (disk, chunk id)."""
        lost = [(d, c) for d, ids in enumerate(self._unsynced) for c in sorted(ids)]
        for d, c in lost:
            self._disks[d].pop(c, None)
        for ids in self._unsynced:
            ids.clear()
        return lost

    async def read_chunk(self, disk: int, chunk_id: str) -> tuple[ChunkData, ChunkInfo]:
        self._check_up()
        s = self._get(disk, chunk_id)
        if len(s.payload) != s.stored_len:
            raise ChunkCorruptError("chunk is shorter than its header says (torn write)", chunk_id)
        if checksum(s.payload) != s.crc32c:
            raise ChunkCorruptError("chunk payload checksum mismatch", chunk_id)
        payload = s.payload
        return (payload if isinstance(payload, Synthetic) else memoryview(payload)), self._info(
            disk, chunk_id, s
        )

    async def delete_chunk(self, disk: int, chunk_id: str) -> None:
        self._check_up()
        chunks = self._disk(disk)
        check_chunk_id(chunk_id)
        chunks.pop(chunk_id, None)
        self._unsynced[disk].discard(chunk_id)

    async def stat_chunk(self, disk: int, chunk_id: str) -> ChunkInfo:
        self._check_up()
        s = self._get(disk, chunk_id)
        if len(s.payload) != s.stored_len:
            raise ChunkCorruptError("chunk is shorter than its header says (torn write)", chunk_id)
        return self._info(disk, chunk_id, s)

    async def list_chunks(self, disk: int) -> list[ChunkInfo]:
        self._check_up()
        return [self._info(disk, cid, s) for cid, s in self._disk(disk).items()]

    async def usage(self) -> list[DiskUsage]:
        self._check_up()
        result = []
        for disk, chunks in enumerate(self._disks):
            used = sum(PAYLOAD_OFFSET + len(s.payload) for s in chunks.values())
            free = 0 if disk in self.full else max(self.capacity - used, 0)
            result.append(DiskUsage(disk, len(chunks), used, free))
        return result

    async def write_torn_chunk(
        self,
        disk: int,
        chunk_id: str,
        payload: Payload,
        *,
        crc32c: int,
        flags: int = 0,
        keep: int,
    ) -> None:
        """Test hook: store what a writer killed mid-write leaves (the first ``keep`` bytes of a
        chunk whose header announces all of them)."""
        self._check_up()
        if isinstance(payload, Synthetic):
            kept: bytes | Synthetic = payload[:keep]
            whole = len(payload)
        else:
            view = as_byte_view(payload)
            kept, whole = bytes(view[:keep]), view.nbytes
        self._put(disk, chunk_id, _Stored(kept, whole, crc32c, flags, clock.wall()))

    def corrupt(self, disk: int, chunk_id: str) -> None:
        """Test helper: flip one stored bit (of the payload, or of the checksum when the payload
        is empty), as a failing disk would."""
        s = self._get(disk, chunk_id)
        if isinstance(s.payload, Synthetic):  # other bytes of the same length
            junk = Synthetic.junk(s.payload.digest(), len(s.payload))
            self._disks[disk][chunk_id] = replace(s, payload=junk)
        elif s.payload:
            i = len(s.payload) // 2
            flipped = s.payload[:i] + bytes([s.payload[i] ^ 0x01]) + s.payload[i + 1 :]
            self._disks[disk][chunk_id] = replace(s, payload=flipped)
        else:
            self._disks[disk][chunk_id] = replace(s, crc32c=s.crc32c ^ 0x01)

    async def close(self) -> None:
        self._closed = True


__all__ = ["MemoryNode"]
