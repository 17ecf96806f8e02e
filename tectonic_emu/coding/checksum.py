"""CRC32C (Castagnoli), the checksum stored with every chunk."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import cache
from typing import Any

import google_crc32c
import numpy as np

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


# CRC32C's polynomial, bit-reversed: bit 31 of a value is the coefficient of x^0.
_POLY = 0x82F63B78
_X0 = 1 << 31  # the polynomial 1


def _mul(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial, both bit-reversed (as CRC values are)."""
    product = 0
    for _ in range(32):
        if a & _X0:
            product ^= b
        a = (a << 1) & 0xFFFFFFFF
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


@cache
def _shift(nbytes: int) -> int:
    """x^(8 * nbytes) modulo the polynomial: what appending ``nbytes`` bytes multiplies a
    CRC by (square and multiply, cached: a chunk has few distinct lengths)."""
    result, square, n = _X0, _X0 >> 8, nbytes  # 1, and x^8 (one byte)
    while n:
        if n & 1:
            result = _mul(result, square)
        square = _mul(square, square)
        n >>= 1
    return result


class _Fold:
    """For pieces of one size: row ``d`` holds, for each bit ``j``, the value bit ``j`` of a
    piece's CRC contributes to the whole when ``d`` pieces follow it. Grown as needed (under
    a lock: node threads share it)."""

    def __init__(self, size: int) -> None:
        step = _shift(size)
        self._step = np.array([_mul(1 << j, step) for j in range(32)], dtype=np.uint32)
        self._rows = np.array([[1 << j for j in range(32)]], dtype=np.uint32)
        self._lock = threading.Lock()

    def upto(self, n: int) -> np.ndarray:
        rows = self._rows
        if len(rows) < n:
            with self._lock:
                grown = [self._rows]
                have, last = len(self._rows), self._rows[-1]
                while have < n:
                    # Each row is the one before it times x^(8 * size): the step's linear map.
                    bits = ((last[:, None] >> _BITS) & 1).astype(bool)
                    last = np.bitwise_xor.reduce(np.where(bits, self._step, np.uint32(0)), axis=1)
                    grown.append(last[None, :])
                    have += 1
                rows = self._rows = np.concatenate(grown)
        return rows[:n]


_BITS = np.arange(32, dtype=np.uint32)
_folds: dict[int, _Fold] = {}


def crc32c_combine(pieces: Sequence[int], size: int, total: int) -> int:
    """The CRC32C of ``total`` bytes from the CRC32Cs of their ``size``-byte pieces in turn
    (the last may be short), as ``crc32c_pieces`` gives them, without reading the bytes
    again: a CRC is linear, so the whole is the XOR of each piece's CRC times x^(8 * the
    bytes after it), modulo the polynomial (zlib's ``crc32_combine``, done for all pieces
    at once). About 0.1 ms for 1,024 pieces. Raises InvalidArgumentError when the counts
    do not fit together."""
    if size < 1 or total < 0 or len(pieces) != -(-total // size):
        raise InvalidArgumentError(f"{len(pieces)} pieces of {size} bytes cannot hold {total}")
    if not pieces:
        return 0
    last = total - (len(pieces) - 1) * size
    full = len(pieces) - 1
    whole = 0
    if full:
        fold = _folds.get(size)
        if fold is None:
            fold = _folds[size] = _Fold(size)
        # Row d for the piece d pieces from the end; a CRC's bits in order, lowest first.
        crcs = np.ascontiguousarray(np.asarray(pieces[:full], dtype="<u4")[::-1])
        bits = np.unpackbits(crcs.view(np.uint8), bitorder="little").view(bool)
        whole = int(np.bitwise_xor.reduce(fold.upto(full).reshape(-1)[bits]))
        whole = _mul(whole, _shift(last))
    return whole ^ pieces[-1]


def _checksum_spans(native: Any, spans: Sequence[tuple[int, int]]) -> list[int]:
    """CRC32C of each ``(address, length)`` of pinned memory, releasing the GIL for the big."""
    gil_free, gil_held = native
    return [(gil_free if n >= _RELEASE_GIL_FROM else gil_held)(0, a, n) for a, n in spans]


__all__ = ["crc32c", "crc32c_combine", "crc32c_each", "crc32c_many", "crc32c_pieces"]
