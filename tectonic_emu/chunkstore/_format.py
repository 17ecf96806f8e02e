"""The chunk file format: a 32-byte header and a table of piece checksums, then the payload
at a 4 KiB boundary.

All fields little-endian (``docs/chunk-format.md`` has the full description)::

    offset size field
         0    4 magic            b"TECK"
         4    2 version          3 (2: no piece table; 1: the payload at offset 32)
         6    2 flags            bit 0: payload is zstd-compressed (stored, never interpreted)
         8    8 payload_len      bytes of payload
        16    4 payload_crc32c   CRC32C of the payload, as given by the writer
        20    4 id_crc32c        CRC32C of the chunk id (ASCII): catches a file under the wrong name
        24    4 piece_size       bytes per checksummed piece (version 3; 0 before)
        28    4 header_crc32c    CRC32C of bytes 0..27
        32   4n piece_crc32c     CRC32C of each piece of the payload, n = ceil(len / piece_size)
         .    - zero to the payload offset: 32 + 4n rounded up to 4096 (4096 up to 7.9 MiB)
         .    - payload

The payload starts on a page so that nodes can write it with ``O_DIRECT`` (``_local.py`` says
why). The piece checksums let a node read and check only the pieces a ranged read covers
(``StorageNode.read_chunk_range``): 8 KiB pieces, so a 64 KiB read at any offset reads at most
80 KiB. The node computes them as it writes; a whole read still checks ``payload_crc32c``, the
writer's own. A file is a valid chunk only if its header checks, its size is exactly the
payload offset plus ``payload_len`` and its payload matches ``payload_crc32c`` (and each piece
its own); anything else (a torn write, a flipped bit, a file renamed to another chunk id)
reads as ``ChunkCorruptError``. Version 1 and 2 files are still read (a range of them: the
whole payload, checked).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.coding.checksum import crc32c_combine, crc32c_pieces
from tectonic_emu.errors import ChunkCorruptError, InvalidArgumentError

MAGIC = b"TECK"
VERSION = 3  # written; 1 and 2 are still read
HEADER_SIZE = 32  # bytes of header fields
PAGE = 4096
PAYLOAD_OFFSET = PAGE  # where a version 2 payload starts, and a version 3 one up to 7.9 MiB
PIECE_SIZE = 8 << 10  # bytes per piece checksum written (version 3)
FLAG_ZSTD = 0x1

_HEADER = struct.Struct("<4sHHQIII")  # everything the header CRC covers: bytes 0..27
_HEADER_CRC = struct.Struct("<I")
assert _HEADER.size + _HEADER_CRC.size == HEADER_SIZE


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    flags: int
    payload_len: int
    payload_crc32c: int
    payload_offset: int = PAYLOAD_OFFSET  # where the payload starts in the file
    piece_size: int = 0  # bytes per piece checksum (0: none, versions 1 and 2)

    @property
    def file_size(self) -> int:
        return self.payload_offset + self.payload_len

    def pieces(self, start: int, end: int) -> range:
        """The pieces that hold payload bytes [start, end) (version 3)."""
        return range(start // self.piece_size, -(-end // self.piece_size))


def payload_offset(payload_len: int, piece_size: int) -> int:
    """Where a version 3 payload starts: past the header and its piece table, on a page."""
    pieces = -(-payload_len // piece_size)
    return -(-(HEADER_SIZE + 4 * pieces) // PAGE) * PAGE


def id_crc32c(chunk_id: str) -> int:
    return int(google_crc32c.value(chunk_id.encode("ascii")))


def pack_header(
    chunk_id: str, payload_len: int, payload_crc32c: int, flags: int, *, version: int = VERSION
) -> bytes:
    """The 32 header bytes of a chunk (``version`` 1 and 2 only to test that old files
    read; version 3 files need their piece table too: ``head_of``). Raises
    InvalidArgumentError for out-of-range fields."""
    if not 0 <= payload_crc32c < 1 << 32:
        raise InvalidArgumentError(f"crc32c out of range: {payload_crc32c}", chunk_id)
    if not 0 <= flags < 1 << 16:
        raise InvalidArgumentError(f"flags out of range: {flags}", chunk_id)
    piece = PIECE_SIZE if version >= 3 else 0
    body = _HEADER.pack(
        MAGIC, version, flags, payload_len, payload_crc32c, id_crc32c(chunk_id), piece
    )
    return body + _HEADER_CRC.pack(google_crc32c.value(body))


def piece_table(payload: memoryview, piece_size: int = PIECE_SIZE) -> bytes:
    """The CRC32C of each ``piece_size`` piece of ``payload``, packed (4 bytes each)."""
    return _packed(crc32c_pieces(payload, piece_size))


def _packed(crcs: list[int]) -> bytes:
    return struct.pack(f"<{len(crcs)}I", *crcs)


def head_of(
    chunk_id: str, payload: memoryview, payload_crc32c: int, flags: int, *, check: bool = False
) -> bytes:
    """Everything before a version 3 payload: its header, the piece table computed from
    ``payload`` (about 1 ms for 8 MiB here: run it off the event loop), zeros to the payload
    offset. ``check``: first find that the payload matches the writer's ``payload_crc32c``,
    in the same pass over its bytes (the whole checksum combined from the pieces',
    ``crc32c_combine``), so the piece checksums certify the writer's bytes end to end;
    ChunkCorruptError when it does not."""
    pieces = crc32c_pieces(payload, PIECE_SIZE)
    if check and crc32c_combine(pieces, PIECE_SIZE, payload.nbytes) != payload_crc32c:
        raise ChunkCorruptError("payload does not match its checksum", chunk_id)
    head = pack_header(chunk_id, payload.nbytes, payload_crc32c, flags) + _packed(pieces)
    return head.ljust(payload_offset(payload.nbytes, PIECE_SIZE), b"\0")


def check_pieces(
    data: memoryview, first: int, table: bytes | memoryview, header: ChunkHeader, chunk_id: str
) -> None:
    """Raise ChunkCorruptError unless ``data``, whole pieces from piece ``first`` on (the
    last may end with the payload), matches ``table``, the packed checksums of pieces
    ``first`` on."""
    size = header.piece_size
    got = crc32c_pieces(data, size)
    if _packed(got) == table[: 4 * len(got)]:
        return
    want = struct.unpack_from(f"<{len(got)}I", table)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            offset = (first + i) * size
            raise ChunkCorruptError(f"chunk piece at payload offset {offset} is corrupt", chunk_id)


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
    magic, version, flags, payload_len, payload_crc, id_crc, piece = _HEADER.unpack(body)
    if magic != MAGIC or version not in (1, 2, 3):
        raise ChunkCorruptError(f"not a chunk file (magic {magic!r}, v{version})", chunk_id)
    if id_crc != id_crc32c(chunk_id):
        raise ChunkCorruptError("chunk file belongs to another chunk id", chunk_id)
    if (version < 3) != (piece == 0) or (piece and piece % PAGE):
        raise ChunkCorruptError(f"chunk header: pieces of {piece} bytes, v{version}", chunk_id)
    if version == 3:
        offset = payload_offset(payload_len, piece)
    else:
        offset = HEADER_SIZE if version == 1 else PAYLOAD_OFFSET
    header = ChunkHeader(flags, payload_len, payload_crc, offset, piece)
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
    return head_of(chunk_id, memoryview(payload), payload_crc32c, flags) + payload


def decode_chunk(data: bytes, chunk_id: str) -> tuple[ChunkHeader, bytes]:
    """Check a whole chunk file and split it into header and payload."""
    header = unpack_header(data[:HEADER_SIZE], chunk_id, len(data))
    payload = data[header.payload_offset :]
    check_payload(payload, header, chunk_id)
    if header.piece_size:
        check_pieces(memoryview(payload), 0, data[HEADER_SIZE:], header, chunk_id)
    return header, payload


__all__ = [
    "FLAG_ZSTD",
    "HEADER_SIZE",
    "MAGIC",
    "PAGE",
    "PAYLOAD_OFFSET",
    "PIECE_SIZE",
    "VERSION",
    "ChunkHeader",
    "as_byte_view",
    "check_pieces",
    "check_payload",
    "head_of",
    "payload_offset",
    "piece_table",
    "decode_chunk",
    "encode_chunk",
    "id_crc32c",
    "pack_header",
    "unpack_header",
]
