"""The chunk file format: a 32-byte header, then the payload at a 4 KiB boundary.

All fields little-endian (``docs/chunk-format.md`` has the full description)::

    offset size field
         0    4 magic            b"TECK"
         4    2 version          2 (1: the payload follows the header at offset 32)
         6    2 flags            bit 0: payload is zstd-compressed (stored, never interpreted)
         8    8 payload_len      bytes of payload
        16    4 payload_crc32c   CRC32C of the payload, as given by the writer
        20    4 id_crc32c        CRC32C of the chunk id (ASCII): catches a file under the wrong name
        24    4 reserved         zero
        28    4 header_crc32c    CRC32C of bytes 0..27
        32    - zero to offset 4096 (version 2)
      4096    - payload (version 2)

The payload starts on a page so that nodes can write it with ``O_DIRECT`` (``_local.py`` says
why). A file is a valid chunk only if its header checks, its size is exactly the payload
offset plus ``payload_len`` and its payload matches ``payload_crc32c``; anything else (a torn
write, a flipped bit, a file renamed to another chunk id) reads as ``ChunkCorruptError``.
Version 1 files (payload at offset 32) are still read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.errors import ChunkCorruptError, InvalidArgumentError

MAGIC = b"TECK"
VERSION = 2  # written; 1 is still read
HEADER_SIZE = 32  # bytes of header fields
PAYLOAD_OFFSET = 4096  # where a version 2 payload starts: a page, for O_DIRECT
_PAYLOAD_OFFSETS = {1: HEADER_SIZE, 2: PAYLOAD_OFFSET}
FLAG_ZSTD = 0x1

_HEADER = struct.Struct("<4sHHQII4x")  # everything the header CRC covers: bytes 0..27
_HEADER_CRC = struct.Struct("<I")
assert _HEADER.size + _HEADER_CRC.size == HEADER_SIZE


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    flags: int
    payload_len: int
    payload_crc32c: int
    payload_offset: int = PAYLOAD_OFFSET  # where the payload starts in the file

    @property
    def file_size(self) -> int:
        return self.payload_offset + self.payload_len


def id_crc32c(chunk_id: str) -> int:
    return int(google_crc32c.value(chunk_id.encode("ascii")))


def pack_header(
    chunk_id: str, payload_len: int, payload_crc32c: int, flags: int, *, version: int = VERSION
) -> bytes:
    """The 32 header bytes of a chunk (``version`` 1 only to test that old files read).
    Raises InvalidArgumentError for out-of-range fields."""
    if not 0 <= payload_crc32c < 1 << 32:
        raise InvalidArgumentError(f"crc32c out of range: {payload_crc32c}", chunk_id)
    if not 0 <= flags < 1 << 16:
        raise InvalidArgumentError(f"flags out of range: {flags}", chunk_id)
    body = _HEADER.pack(MAGIC, version, flags, payload_len, payload_crc32c, id_crc32c(chunk_id))
    return body + _HEADER_CRC.pack(google_crc32c.value(body))


def unpack_header(raw: bytes, chunk_id: str, file_size: int | None = None) -> ChunkHeader:
    """Parse and check a header read from the file of ``chunk_id``.

    With ``file_size``, also check that the file holds exactly the payload the header announces.
    Raises ChunkCorruptError on any mismatch.
    """
    if len(raw) < HEADER_SIZE:
        raise ChunkCorruptError(f"chunk header truncated ({len(raw)} bytes)", chunk_id)
    body = raw[: _HEADER.size]
    (header_crc,) = _HEADER_CRC.unpack_from(raw, _HEADER.size)
    if google_crc32c.value(body) != header_crc:
        raise ChunkCorruptError("chunk header checksum mismatch", chunk_id)
    magic, version, flags, payload_len, payload_crc, id_crc = _HEADER.unpack(body)
    if magic != MAGIC or version not in _PAYLOAD_OFFSETS:
        raise ChunkCorruptError(f"not a chunk file (magic {magic!r}, v{version})", chunk_id)
    if id_crc != id_crc32c(chunk_id):
        raise ChunkCorruptError("chunk file belongs to another chunk id", chunk_id)
    header = ChunkHeader(flags, payload_len, payload_crc, _PAYLOAD_OFFSETS[version])
    if file_size is not None and file_size != header.file_size:
        raise ChunkCorruptError(
            f"chunk file is {file_size} bytes, header says {header.file_size}", chunk_id
        )
    return header


def check_payload(payload: bytes, header: ChunkHeader, chunk_id: str) -> None:
    """Raise ChunkCorruptError unless ``payload`` is what ``header`` describes."""
    if len(payload) != header.payload_len:
        raise ChunkCorruptError(
            f"chunk payload is {len(payload)} bytes, header says {header.payload_len}", chunk_id
        )
    if google_crc32c.value(payload) != header.payload_crc32c:
        raise ChunkCorruptError("chunk payload checksum mismatch", chunk_id)


def as_byte_view(payload: BytesLike) -> memoryview:
    """``payload`` as a flat memoryview of bytes (no copy). Raises InvalidArgumentError for
    non-contiguous views."""
    view = memoryview(payload)
    if not view.c_contiguous:
        raise InvalidArgumentError("chunk payload must be a contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def encode_chunk(chunk_id: str, payload: bytes, payload_crc32c: int, flags: int = 0) -> bytes:
    """A whole chunk file as bytes (for tools and tests; the node writes header and payload
    without joining them)."""
    header = pack_header(chunk_id, len(payload), payload_crc32c, flags)
    return header.ljust(PAYLOAD_OFFSET, b"\0") + payload


def decode_chunk(data: bytes, chunk_id: str) -> tuple[ChunkHeader, bytes]:
    """Check a whole chunk file and split it into header and payload."""
    header = unpack_header(data[:HEADER_SIZE], chunk_id, len(data))
    payload = data[header.payload_offset :]
    check_payload(payload, header, chunk_id)
    return header, payload


__all__ = [
    "FLAG_ZSTD",
    "HEADER_SIZE",
    "MAGIC",
    "PAYLOAD_OFFSET",
    "VERSION",
    "ChunkHeader",
    "as_byte_view",
    "check_payload",
    "decode_chunk",
    "encode_chunk",
    "id_crc32c",
    "pack_header",
    "unpack_header",
]
