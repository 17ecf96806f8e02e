"""Per-chunk zstd compression, applied only where it pays.

Float weights and already-compressed data barely shrink (ratio ~1.08) and compress at ~0.4 GB/s,
so ``auto`` first compresses a small sample and gives up cheaply on such data.
"""

from __future__ import annotations

import threading
from typing import Literal, get_args

import zstandard

from tectonic_emu.coding.base import byte_view
from tectonic_emu.coding.synthetic import Payload, Synthetic
from tectonic_emu.errors import ChunkCorruptError, InvalidArgumentError

FLAG_ZSTD: int = 1  # bit 0 of a chunk's flags: the stored payload is one zstd frame

CompressionPolicy = Literal["auto", "zstd", "none"]
POLICIES: tuple[str, ...] = get_args(CompressionPolicy)

LEVEL = 1
SAMPLE_BYTES = 16 * 1024  # per sample; three samples: start, middle, end
MIN_SAVING = 0.9  # auto keeps the compressed form only if at most this fraction of the size

# zstandard's (de)compressor objects are not thread-safe: one of each per thread.
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    cctx: zstandard.ZstdCompressor | None = getattr(_local, "cctx", None)
    if cctx is None:
        cctx = _local.cctx = zstandard.ZstdCompressor(
            level=LEVEL, write_content_size=True, write_checksum=True
        )
    return cctx


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def _sample_shrinks(payload: memoryview) -> bool:
    """Whether three samples spread over ``payload`` compress below MIN_SAVING."""
    last = len(payload) - SAMPLE_BYTES
    starts = (0, last // 2, last)
    sample = b"".join(payload[i : i + SAMPLE_BYTES] for i in starts)
    return len(_compressor().compress(sample)) <= MIN_SAVING * len(sample)


def maybe_compress(payload: Payload, policy: CompressionPolicy) -> tuple[Payload, int]:
    """``(stored_bytes, flags)`` for ``payload`` under ``policy``.

    ``none``: the payload as is. ``zstd``: a zstd frame (level 1) unless that is not smaller.
    ``auto``: a zstd frame only if a sample (3 x 16 KiB) and then the whole shrink to at most
    90%; incompressible data costs one small sample. Raw results are ``payload`` itself. A
    ``Synthetic`` payload is stored raw (its random runs would not shrink).
    """
    if policy == "none" or isinstance(payload, Synthetic):
        if policy not in POLICIES:
            raise InvalidArgumentError(f"unknown compression policy {policy!r} (one of {POLICIES})")
        return payload, 0
    if policy not in POLICIES:
        raise InvalidArgumentError(f"unknown compression policy {policy!r} (one of {POLICIES})")
    view = byte_view(payload)
    size = len(view)
    if policy == "auto":
        if size > 3 * SAMPLE_BYTES and not _sample_shrinks(view):
            return payload, 0
        limit = MIN_SAVING * size
    else:
        limit = size - 1
    stored = _compressor().compress(view)
    if len(stored) > limit:
        return payload, 0
    return stored, FLAG_ZSTD


def decompress(stored: Payload, flags: int, raw_len: int) -> Payload:
    """The inverse of ``maybe_compress``: the ``raw_len`` original bytes.

    Raises ``ChunkCorruptError`` if the frame does not decode to exactly ``raw_len`` bytes
    (frames carry a checksum of their content, so a flipped bit is caught here too) or ``flags``
    has bits this version does not know. Bytes after the frame are ignored: the chunk's stored
    length and CRC32C catch those.
    """
    if flags & ~FLAG_ZSTD:
        raise ChunkCorruptError(f"unknown chunk flags {flags:#x}")
    if not flags & FLAG_ZSTD:
        got = len(stored) if isinstance(stored, Synthetic) else memoryview(stored).nbytes
        if got != raw_len:
            raise ChunkCorruptError(f"raw chunk payload of {got} bytes, expected {raw_len}")
        return stored
    if isinstance(stored, Synthetic):
        raise ChunkCorruptError("a synthetic chunk is never compressed")
    try:
        # Check the size the frame claims before decoding, so a corrupt header cannot make us
        # allocate an arbitrary amount.
        claimed = zstandard.frame_content_size(stored)
        if claimed != raw_len:
            raise ChunkCorruptError(f"zstd frame of {claimed} bytes, expected {raw_len}")
        raw = _decompressor().decompress(stored, max_output_size=raw_len)
    except zstandard.ZstdError as exc:
        raise ChunkCorruptError(f"zstd payload does not decode: {exc}") from exc
    if len(raw) != raw_len:
        raise ChunkCorruptError(f"zstd payload decoded to {len(raw)} bytes, expected {raw_len}")
    return raw


__all__ = ["FLAG_ZSTD", "POLICIES", "CompressionPolicy", "decompress", "maybe_compress"]
