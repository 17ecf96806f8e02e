"""The chunk store: storage nodes that hold opaque, checksummed chunks on their disks.

``StorageNode`` is the seam; ``LocalNode`` keeps chunks as files on local directories,
``MemoryNode`` in dicts (tests), and ``FaultyNode`` wraps either to inject faults.
"""

from tectonic_emu.chunkstore._format import (
    FLAG_ZSTD,
    HEADER_SIZE,
    PAYLOAD_OFFSET,
    ChunkHeader,
    decode_chunk,
    encode_chunk,
)
from tectonic_emu.chunkstore._local import LocalNode
from tectonic_emu.chunkstore._memory import MemoryNode
from tectonic_emu.chunkstore.base import (
    BytesLike,
    ChunkInfo,
    DiskUsage,
    StorageNode,
    check_chunk_id,
)
from tectonic_emu.chunkstore.faults import FaultyNode

__all__ = [
    "FLAG_ZSTD",
    "HEADER_SIZE",
    "PAYLOAD_OFFSET",
    "BytesLike",
    "ChunkHeader",
    "ChunkInfo",
    "DiskUsage",
    "FaultyNode",
    "LocalNode",
    "MemoryNode",
    "StorageNode",
    "check_chunk_id",
    "decode_chunk",
    "encode_chunk",
]
