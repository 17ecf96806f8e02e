"""CRC32C (Castagnoli), the checksum stored with every chunk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import google_crc32c

from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding import work
from tectonic_emu.coding._native import crc32c_extend, pinned
from tectonic_emu.coding.synthetic import Payload, Synthetic
from tectonic_emu.errors import InvalidArgumentError

# Below this, keep the GIL: re-taking it after a native call can cost a switch interval (5 ms)
# when another thread is busy in Python. Above, release it so checksums run in parallel
# (google-crc32c itself only releases it for bytes of 1 MiB or more).
_RELEASE_GIL_FROM = 256 * 1024
_SMALL_BYTES = 64 * 1024  # below this, google-crc32c's C call is cheaper than ctypes


def crc32c(data: Payload, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (the CRC of the bytes before it).

    Any contiguous buffer works (bytes, bytearray, memoryview, mmap) and is not copied.
    ``crc32c(b, crc32c(a)) == crc32c(a + b)``. A ``Synthetic`` payload has the checksum its
    structure derives (``Synthetic.crc32c``), which does not continue from a start value.
    """
    if not 0 <= value <= 0xFFFFFFFF:
        raise InvalidArgumentError(f"CRC32C start value out of range: {value}")
    if isinstance(data, Synthetic):
        if value:
            raise InvalidArgumentError("a synthetic payload's checksum has no start value")
        work.count("crc32c", len(data))
        return data.crc32c()
    native = crc32c_extend()
    if native is None or (isinstance(data, bytes) and len(data) < _SMALL_BYTES):
        if not isinstance(data, bytes):
            data = bytes(data)  # only without the native library: google-crc32c takes bytes
        work.count("crc32c", len(data))
        return int(google_crc32c.extend(value, data))
    try:
        with pinned([data]) as [(address, nbytes)]:
            work.count("crc32c", nbytes)
            fn = native[0] if nbytes >= _RELEASE_GIL_FROM else native[1]
            return fn(value, address, nbytes)
    except BufferError as exc:
        raise InvalidArgumentError(f"cannot checksum a non-contiguous buffer: {exc}") from exc


def crc32c_many(data: Payload, spans: Sequence[tuple[int, int]]) -> list[int]:
    """CRC32C of each ``(offset, length)`` span of ``data``, with the buffer pinned once: for
    thousands of small pieces of one buffer, where a ``crc32c`` call each costs more in
    Python than the checksum. Raises InvalidArgumentError for a span outside ``data``."""
    if isinstance(data, Synthetic):
        for at, n in spans:
            if at < 0 or n < 0 or at + n > len(data):
                raise InvalidArgumentError(f"span ({at}, {n}) outside {len(data)} bytes")
        work.count("crc32c", sum(n for _, n in spans))
        return [data[at : at + n].crc32c() for at, n in spans]
    native = crc32c_extend()
    view = memoryview(data).cast("B")
    for at, n in spans:
        if at < 0 or n < 0 or at + n > view.nbytes:
            raise InvalidArgumentError(f"span ({at}, {n}) outside {view.nbytes} bytes")
    if native is None:
        return [crc32c(view[at : at + n]) for at, n in spans]
    if work.Tally.current() is not None:  # (a sum over thousands of spans, else not paid)
        work.count("crc32c", sum(n for _, n in spans))
    try:
        with pinned([view]) as [(address, _)]:
            return _checksum_spans(native, [(address + at, n) for at, n in spans])
    except BufferError as exc:
        raise InvalidArgumentError(f"cannot checksum a non-contiguous buffer: {exc}") from exc


def crc32c_each(pieces: Sequence[Payload]) -> list[int]:
    """CRC32C of each of ``pieces``, pinned together: ``[crc32c(p) for p in pieces]`` for
    thousands of small buffers (a checkpoint's parts at 4,096 ranks), at one call's Python
    cost instead of one per piece. Raises InvalidArgumentError for a non-contiguous one."""
    native = crc32c_extend()
    real = [p for p in pieces if not isinstance(p, Synthetic)]
    if native is None or len(real) < len(pieces):
        return [crc32c(p) for p in pieces]
    try:
        with pinned(real) as spans:
            if work.Tally.current() is not None:
                work.count("crc32c", sum(n for _, n in spans))
            return _checksum_spans(native, spans)
    except BufferError as exc:
        raise InvalidArgumentError(f"cannot checksum a non-contiguous buffer: {exc}") from exc


def crc32c_pieces(data: BytesLike, size: int) -> list[int]:
    """CRC32C of each ``size``-byte piece of ``data`` in turn (the last may be short): a
    chunk's piece table (``chunkstore/_format.py``). As ``crc32c_many``, but with as few
    Python steps around each native call as can be, which is the cost: 1,024 of them per
    8 MiB. Counted as work ``crc32c-pieces``."""
    if size < 1:
        raise InvalidArgumentError(f"pieces of {size} bytes")
    view = memoryview(data).cast("B")
    n = view.nbytes
    native = crc32c_extend()
    if native is None:
        return [crc32c(view[at : at + size]) for at in range(0, n, size)]
    fn = native[1]  # GIL held: the pieces are small
    work.count("crc32c-pieces", n)
    with pinned([view]) as [(address, _)]:
        return [fn(0, address + at, min(size, n - at)) for at in range(0, n, size)]


def _checksum_spans(native: Any, spans: Sequence[tuple[int, int]]) -> list[int]:
    """CRC32C of each ``(address, length)`` of pinned memory, releasing the GIL for the big."""
    gil_free, gil_held = native
    return [(gil_free if n >= _RELEASE_GIL_FROM else gil_held)(0, a, n) for a, n in spans]


__all__ = ["crc32c", "crc32c_each", "crc32c_many", "crc32c_pieces"]
