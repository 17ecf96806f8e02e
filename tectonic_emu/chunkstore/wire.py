"""The node wire protocol: framed binary messages over TCP (``docs/wire-protocol.md``).

Every message, request or reply, is one frame: a 32-byte header, a *meta* section of at most
``MAX_META`` bytes, then a *payload* of ``payload_len`` bytes. All integers little-endian::

    offset size field
         0    2 magic          b"TW"
         2    1 version        1
         3    1 op             Op (a reply carries the op of its request)
         4    2 status         in requests, the bytes of TrafficGroup at the meta's end (0:
                              none); 0 in successful replies; an errno in error replies
         6    2 meta_len       bytes of meta after the header (<= 4096)
         8    8 request_id     chosen by the client, echoed in the reply
        16    8 payload_len    bytes of payload after the meta (<= the node's max_payload)
        24    4 payload_crc32c CRC32C of the payload (the chunk's own checksum; 0 when empty)
        28    4 header_crc32c  CRC32C of bytes 0..27 followed by the meta section

A frame whose magic, version, op, lengths or header checksum is wrong cannot be trusted to say
where the next frame starts, so the receiver closes that connection and nothing else. A payload
that fails its checksum is answered with an error reply (EBADMSG) and never stored.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import mmap
import struct
from dataclasses import dataclass

import google_crc32c

from tectonic_emu.chunkstore.auth import FrameMac
from tectonic_emu.chunkstore.base import ChunkInfo, DiskUsage
from tectonic_emu.errors import (
    AlreadyExistsError,
    ChunkCorruptError,
    ChunkNotFoundError,
    InvalidArgumentError,
    NodeUnavailableError,
    TectonicError,
)
from tectonic_emu.qos.groups import DEFAULT, TrafficGroup

MAGIC = b"TW"
VERSION = 1
HEADER_SIZE = 32
MAX_META = 4096
MAX_GROUP = 128  # bytes of a request's TrafficGroup (``with_group``)

_HEADER = struct.Struct("<2sBBHHQQI")  # bytes 0..27, covered by the header CRC
_CRC = struct.Struct("<I")
assert _HEADER.size + _CRC.size == HEADER_SIZE


class Op(enum.IntEnum):
    PING = 1  # reply meta: PING_REPLY
    WRITE = 2  # meta: DISK_FLAGS + chunk id; payload: the chunk; payload_crc32c: its checksum
    READ = 3  # meta: DISK + chunk id; reply meta: CHUNK_INFO; reply payload: the chunk
    STAT = 4  # meta: DISK + chunk id; reply meta: CHUNK_INFO
    DELETE = 5  # meta: DISK + chunk id
    LIST = 6  # meta: DISK; reply payload: LIST_ENTRY records
    USAGE = 7  # reply payload: USAGE_ENTRY records
    RESERVE = 8  # meta: RESERVE (bytes about to be written); ENOSPC when they would not fit
    SET_DELAY = 9  # meta: DELAY (seconds added before every reply but PING's; fault injection)
    # meta: DISK_RANGE + chunk id; reply meta: CHUNK_INFO; reply payload: the range's stored
    # bytes, checked on the node against its piece checksums (payload_crc32c: for the wire)
    READ_RANGE = 10
    WRITE_UNSYNCED = 11  # as WRITE, but durable only once a SYNC of its disk returns
    SYNC = 12  # meta: DISK; every chunk written to the disk before it made durable
    QOS_STATS = 13  # reply payload: JSON of the node's fair queues' figures (qos/node.py)


# Meta and payload layouts, by name as docs/wire-protocol.md uses them.
DISK = struct.Struct("<H")
DISK_FLAGS = struct.Struct("<HH")
DISK_RANGE = struct.Struct("<HQQ")  # disk, offset, length
CHUNK_INFO = struct.Struct("<HHIQd")  # disk, flags, crc32c, stored_len, mtime
LIST_ENTRY_ID_LEN = struct.Struct("<B")  # after CHUNK_INFO, then the chunk id
USAGE_ENTRY = struct.Struct("<HQQQ")  # disk, chunks, bytes_used, bytes_free
PING_REPLY = struct.Struct("<IIHHdQ")  # node_id, pid, disks, reserved, started, max_payload
RESERVE = struct.Struct("<Q")
DELAY = struct.Struct("<d")


class FrameError(Exception):
    """A frame that cannot be parsed: the connection it came on must be closed."""


@dataclass(frozen=True, slots=True)
class Header:
    op: int
    status: int
    meta_len: int
    request_id: int
    payload_len: int
    payload_crc32c: int


def pack_header(
    op: int,
    request_id: int,
    meta: bytes = b"",
    *,
    payload_len: int = 0,
    payload_crc32c: int = 0,
    status: int = 0,
) -> bytes:
    """Header and meta of one frame, ready to send (the payload follows separately)."""
    if len(meta) > MAX_META:
        raise InvalidArgumentError(f"frame meta of {len(meta)} bytes (limit {MAX_META})")
    body = _HEADER.pack(
        MAGIC, VERSION, op, status, len(meta), request_id, payload_len, payload_crc32c
    )
    crc = google_crc32c.extend(google_crc32c.value(body), meta)
    return body + _CRC.pack(crc) + meta


def unpack_header(raw: bytes | bytearray | memoryview, max_payload: int) -> Header:
    """Parse and bound-check a header (its CRC is checked with the meta: ``check_meta``)."""
    magic, version, op, status, meta_len, request_id, payload_len, payload_crc = (
        _HEADER.unpack_from(raw)
    )
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"unsupported protocol version {version}")
    if op not in Op._value2member_map_:
        raise FrameError(f"unknown op {op}")
    if meta_len > MAX_META:
        raise FrameError(f"meta of {meta_len} bytes (limit {MAX_META})")
    if payload_len > max_payload:
        raise FrameError(f"payload of {payload_len} bytes (limit {max_payload})")
    return Header(op, status, meta_len, request_id, payload_len, payload_crc)


def check_meta(raw_header: bytes | bytearray | memoryview, meta: bytes | memoryview) -> None:
    """Raise FrameError unless the header CRC covers this header and meta."""
    body = bytes(raw_header[: _HEADER.size])
    (want,) = _CRC.unpack_from(raw_header, _HEADER.size)
    if google_crc32c.extend(google_crc32c.value(body), bytes(meta)) != want:
        raise FrameError("header checksum mismatch")


# -- meta helpers ----------------------------------------------------------------------------
def pack_chunk_ref(disk: int, chunk_id: str) -> bytes:
    return DISK.pack(disk) + chunk_id.encode("ascii")


def unpack_chunk_ref(meta: bytes, fixed: struct.Struct = DISK) -> tuple[tuple[int, ...], str]:
    """(fixed fields, chunk id); FrameError when the meta is too short or the id not ASCII."""
    if len(meta) < fixed.size:
        raise FrameError(f"meta of {len(meta)} bytes, op needs at least {fixed.size}")
    try:
        chunk_id = meta[fixed.size :].decode("ascii")
    except UnicodeDecodeError:
        raise FrameError("chunk id is not ASCII") from None
    return fixed.unpack_from(meta), chunk_id


def with_group(meta: bytes, group: TrafficGroup) -> tuple[bytes, int]:
    """A request's meta with its TrafficGroup at the end, and the ``status`` that says how
    long that is (the default group is not sent: status 0)."""
    if group is DEFAULT:
        return meta, 0
    raw = group.encode()
    return meta + raw, len(raw)


def split_group(status: int, meta: bytes) -> tuple[TrafficGroup, bytes]:
    """A request's TrafficGroup and its op's meta (``with_group``). FrameError when the
    group does not parse: the frame is not one this protocol writes."""
    if status == 0:
        return DEFAULT, meta
    if status > min(len(meta), MAX_GROUP):
        raise FrameError(f"a traffic group of {status} bytes in a meta of {len(meta)}")
    try:
        return TrafficGroup.decode(meta[-status:]), meta[:-status]
    except InvalidArgumentError as e:
        raise FrameError(str(e)) from None


def pack_info(info: ChunkInfo) -> bytes:
    return CHUNK_INFO.pack(info.disk, info.flags, info.crc32c, info.stored_len, info.mtime)


def unpack_info(chunk_id: str, meta: bytes | memoryview, offset: int = 0) -> ChunkInfo:
    disk, flags, crc, stored_len, mtime = CHUNK_INFO.unpack_from(meta, offset)
    return ChunkInfo(chunk_id, disk, stored_len, crc, flags, mtime)


def pack_list(infos: list[ChunkInfo]) -> bytes:
    out = bytearray()
    for info in infos:
        raw_id = info.chunk_id.encode("ascii")
        out += pack_info(info) + LIST_ENTRY_ID_LEN.pack(len(raw_id)) + raw_id
    return bytes(out)


def unpack_list(payload: bytes | memoryview) -> list[ChunkInfo]:
    infos: list[ChunkInfo] = []
    pos, view = 0, memoryview(payload)
    while pos < len(view):
        (id_len,) = LIST_ENTRY_ID_LEN.unpack_from(view, pos + CHUNK_INFO.size)
        start = pos + CHUNK_INFO.size + LIST_ENTRY_ID_LEN.size
        chunk_id = bytes(view[start : start + id_len]).decode("ascii")
        infos.append(unpack_info(chunk_id, view, pos))
        pos = start + id_len
    return infos


def pack_usage(usage: list[DiskUsage]) -> bytes:
    return b"".join(USAGE_ENTRY.pack(u.disk, u.chunks, u.bytes_used, u.bytes_free) for u in usage)


def unpack_usage(payload: bytes | memoryview) -> list[DiskUsage]:
    return [DiskUsage(*fields) for fields in USAGE_ENTRY.iter_unpack(payload)]


# -- sending -----------------------------------------------------------------------------------
# Payloads go out in slices of this size: asyncio copies whatever the socket does not take at
# once into its own buffer, so whole 8 MiB chunks would be copied half; slices keep that small.
SEND_SLICE = 512 << 10


# Payloads of at least this many bytes are tagged in a worker thread, off the event loop.
THREAD_TAG_BYTES = 256 << 10


class FrameWriter:
    """Writes whole frames to one transport, one frame at a time (replies and pipelined
    requests never interleave), each followed by its tag under ``mac`` (``auth.py``; set once
    the handshake is done), payloads in ``SEND_SLICE`` pieces, waiting between pieces while the
    transport is above its high-water mark. The protocol forwards its
    ``pause_writing``/``resume_writing`` callbacks to ``pause``/``resume``."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._writable = asyncio.Event()
        self._writable.set()
        self.mac: FrameMac | None = None

    def pause(self) -> None:
        self._writable.clear()

    def resume(self) -> None:
        self._writable.set()

    async def _tag(self, parts: list[bytes | memoryview], size: int) -> bytes:
        """The next frame's tag; called under the lock, so sequence numbers follow the
        order frames go out in."""
        if self.mac is None:
            raise ConnectionResetError("no authenticated session on this connection")
        seq = self.mac.next_seq()
        if size < THREAD_TAG_BYTES:
            return self.mac.tag(seq, parts)
        return await asyncio.to_thread(self.mac.tag, seq, parts)

    async def write(
        self, transport: asyncio.WriteTransport, head: bytes, payload: memoryview | None
    ) -> None:
        """Raises ConnectionResetError when the transport closes before the frame is out."""
        async with self._lock:
            await self._writable.wait()
            if transport.is_closing():
                raise ConnectionResetError("connection closed")
            if payload is None or not self.mac or not self.mac.payloads:
                tag = await self._tag([head], 0)
            else:
                tag = await self._tag([head, payload], payload.nbytes)
            transport.write(head)
            if payload is not None:
                for start in range(0, payload.nbytes, SEND_SLICE):
                    await self._writable.wait()
                    if transport.is_closing():
                        raise ConnectionResetError("connection closed")
                    transport.write(payload[start : start + SEND_SLICE])
            transport.write(tag)

    async def write_file(
        self, transport: asyncio.WriteTransport, head: bytes, fd: int, offset: int, count: int
    ) -> None:
        """A frame whose payload is ``count`` bytes of the open file ``fd`` from ``offset``,
        sent with ``sendfile`` (from the page cache to the socket, with no copy through
        user space; the tag reads the same pages through a mapping first). asyncio pauses
        reading on the connection meanwhile and resumes it after: a protocol that paused
        reading itself must pause it again."""
        async with self._lock:
            await self._writable.wait()
            if transport.is_closing():
                raise ConnectionResetError("connection closed")
            if count and self.mac is not None and self.mac.payloads:
                mapped = mmap.mmap(fd, offset + count, access=mmap.ACCESS_READ)
                mapped.madvise(mmap.MADV_WILLNEED)  # read ahead all of it, not page by page
                try:
                    view = memoryview(mapped)[offset:]
                    try:
                        tag = await self._tag([head, view], count)
                    finally:
                        view.release()
                finally:
                    mapped.close()
            else:
                tag = await self._tag([head], 0)
            transport.write(head)
            if count:
                # A file object around the open descriptor (no path is opened: nothing blocks).
                with open(fd, "rb", buffering=0, closefd=False) as f:  # noqa: ASYNC230
                    await asyncio.get_running_loop().sendfile(transport, f, offset, count)
            transport.write(tag)


# -- errors ----------------------------------------------------------------------------------
_ERROR_TYPES: dict[int, type[TectonicError]] = {
    errno.ENOENT: ChunkNotFoundError,
    errno.EEXIST: AlreadyExistsError,
    errno.EIO: ChunkCorruptError,
    errno.EBADMSG: ChunkCorruptError,
    errno.EINVAL: InvalidArgumentError,
    errno.EHOSTDOWN: NodeUnavailableError,
}


def error_status(exc: BaseException) -> int:
    """The errno an error reply carries for ``exc`` (EIO when it has none)."""
    code = getattr(exc, "errno", None)
    return code if isinstance(code, int) and 0 < code < 1 << 16 else errno.EIO


def error_from_reply(status: int, message: str, where: str) -> OSError:
    """The exception a client raises for an error reply: the typed error for the errnos of
    the chunk seam, a plain OSError with that errno for the rest (ENOSPC, EROFS...)."""
    kind = _ERROR_TYPES.get(status)
    if kind is not None:
        return kind(message, where)
    return OSError(status, f"{message} ({where})")


__all__ = [
    "HEADER_SIZE",
    "MAX_META",
    "FrameError",
    "Header",
    "Op",
    "check_meta",
    "error_from_reply",
    "error_status",
    "pack_header",
    "split_group",
    "unpack_header",
    "with_group",
]
