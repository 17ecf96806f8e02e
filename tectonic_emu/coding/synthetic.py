"""Synthetic payloads: bytes described, never made (projections, docs/simulate.md).

A ``Synthetic`` is an immutable sequence of bytes given as segments, each a run of one
source:

- ``rand``: the pseudo-random stream of a seed, from an offset (tensors, shards);
- ``zero``: zeros (holes, padding);
- ``lit``: literal bytes, kept as they are (small headers and indexes);
- ``parity``: Reed-Solomon parity chunk ``j`` of a block, itself a ``Synthetic``;
- ``junk``: what decoding chunks of different blocks would give, named by their digest.

It has a length, slices (``s[a:b]``) and joins (``join``) into other ``Synthetic`` values
without touching bytes, and a digest of its structure, from which its checksum derives
(``crc32c``). Segments are kept canonical: empty ones dropped, neighbours that continue one
another merged, and literal zero runs turned into ``zero``. Two values then compare equal when
their segments do, which happens when they were made the same way from the same sources.
That is what a projection checks when it reads back what it wrote.

The codecs (``replication.py``, ``reed_solomon.py``), checksums and compression take a
``Synthetic`` where they take bytes, and return the ``Synthetic`` that describes their
result: parity is a ``parity`` segment, a decode from parity the block it was made from.
``materialize`` makes the bytes, for tests at small sizes: the contract
(``tests/test_synthetic.py``) is that making the bytes commutes with every operation. A
sliced, joined, encoded or decoded value materializes to the slice, join, encoding or
decoding of the materialized bytes, parity included.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tectonic_emu.buffers import BytesLike
from tectonic_emu.errors import InvalidArgumentError

Kind = Literal["rand", "zero", "lit", "parity", "junk"]


@dataclass(frozen=True, slots=True)
class Segment:
    """``length`` bytes of a source, from ``start``. ``key``: the seed (``rand``, ``junk``),
    the bytes (``lit``), ``(encoding name, index, block)`` (``parity``), None (``zero``)."""

    kind: Kind
    key: Any
    start: int
    length: int

    def cut(self, lo: int, hi: int) -> Segment:
        """Bytes ``lo:hi`` of this segment (0 <= lo <= hi <= length)."""
        if self.kind == "lit":
            return Segment("lit", self.key[lo:hi], 0, hi - lo)
        return Segment(self.kind, self.key, self.start + lo, hi - lo)

    def follows(self, prev: Segment) -> bool:
        """Whether this segment continues ``prev`` (so the two are one)."""
        if self.kind != prev.kind:
            return False
        if self.kind == "zero":
            return True
        if self.kind == "lit":
            return True
        return self.key == prev.key and self.start == prev.start + prev.length


def _merge(prev: Segment, seg: Segment) -> Segment:
    if seg.kind == "lit":
        return Segment("lit", prev.key + seg.key, 0, prev.length + seg.length)
    if seg.kind == "zero":
        return Segment("zero", None, 0, prev.length + seg.length)
    return Segment(seg.kind, seg.key, prev.start, prev.length + seg.length)


def _literal(data: BytesLike) -> Segment:
    raw = bytes(data)
    if raw.count(0) == len(raw):
        return Segment("zero", None, 0, len(raw))
    return Segment("lit", raw, 0, len(raw))


class Synthetic:
    """A payload described by its segments (module docstring)."""

    __slots__ = ("_digest", "_ends", "segments")

    def __init__(self, segments: Iterable[Segment] = ()) -> None:
        out: list[Segment] = []
        for seg in segments:
            if seg.length < 0:
                raise InvalidArgumentError(f"a segment cannot have a negative length: {seg}")
            if seg.length == 0:
                continue
            if out and seg.follows(out[-1]):
                out[-1] = _merge(out[-1], seg)
            else:
                out.append(seg)
        self.segments: tuple[Segment, ...] = tuple(out)
        ends, total = [], 0
        for seg in self.segments:
            total += seg.length
            ends.append(total)
        self._ends = ends  # each segment's end offset, for slicing by bisection
        self._digest: bytes | None = None

    # -- making them -------------------------------------------------------------------------
    @classmethod
    def random(cls, seed: int, length: int, *, start: int = 0) -> Synthetic:
        """``length`` bytes of seed ``seed``'s stream, from ``start``."""
        if not 0 <= seed < 2**64:
            raise InvalidArgumentError(f"a seed is a 64-bit unsigned integer, not {seed}")
        return cls([Segment("rand", seed, start, length)])

    @classmethod
    def zeros(cls, length: int) -> Synthetic:
        return cls([Segment("zero", None, 0, length)])

    @classmethod
    def parity(cls, encoding: str, index: int, block: Synthetic, length: int) -> Synthetic:
        """Parity chunk ``index`` (0 = the first parity chunk) of ``block`` under
        ``encoding``, ``length`` bytes."""
        return cls([Segment("parity", (encoding, index, block), 0, length)])

    @classmethod
    def junk(cls, digest: bytes, length: int) -> Synthetic:
        return cls([Segment("junk", int.from_bytes(digest[:8], "little"), 0, length)])

    @classmethod
    def join(cls, parts: Iterable[Synthetic | BytesLike]) -> Synthetic:
        """The concatenation of ``parts``, synthetic or real bytes (kept as literals)."""
        segs: list[Segment] = []
        for part in parts:
            if isinstance(part, Synthetic):
                segs.extend(part.segments)
            else:
                segs.append(_literal(part))
        return cls(segs)

    # -- sequence behaviour ------------------------------------------------------------------
    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def nbytes(self) -> int:
        return len(self)

    def __getitem__(self, key: slice) -> Synthetic:
        if not isinstance(key, slice):
            raise TypeError("a synthetic payload is sliced, not indexed")
        lo, hi, step = key.indices(len(self))
        if step != 1:
            raise InvalidArgumentError("a synthetic payload is sliced with step 1 only")
        if hi <= lo:
            return Synthetic()
        first = bisect.bisect_right(self._ends, lo)
        out: list[Segment] = []
        for k in range(first, len(self.segments)):
            begin = self._ends[k] - self.segments[k].length
            if begin >= hi:
                break
            seg = self.segments[k]
            out.append(seg.cut(max(lo, begin) - begin, min(hi, self._ends[k]) - begin))
        return Synthetic(out)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Synthetic):
            return self.segments == other.segments
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.segments)

    def __repr__(self) -> str:
        shown = ", ".join(f"{s.kind}:{s.length}" for s in self.segments[:4])
        more = ", ..." if len(self.segments) > 4 else ""
        return f"Synthetic({len(self)} bytes: {shown}{more})"

    # -- checksums ---------------------------------------------------------------------------
    def digest(self) -> bytes:
        """16 bytes naming this value's structure (cached): equal values, equal digests."""
        if self._digest is None:
            h = hashlib.blake2b(digest_size=16)
            for s in self.segments:
                h.update(f"{s.kind}:{s.start}:{s.length}:".encode())
                if s.kind == "lit":
                    h.update(s.key)
                elif s.kind == "parity":
                    encoding, index, block = s.key
                    h.update(f"{encoding}:{index}:".encode() + block.digest())
                elif s.kind != "zero":
                    h.update(str(s.key).encode())
                h.update(b";")
            self._digest = h.digest()
        return self._digest

    def crc32c(self) -> int:
        """The checksum a synthetic chunk is stored and checked with: derived from the
        digest, not the CRC32C of the bytes it describes (which are never made)."""
        return int.from_bytes(self.digest()[:4], "little")

    # -- bytes, for tests --------------------------------------------------------------------
    def materialize(self, parity: Callable[[str, int, bytes], bytes] | None = None) -> bytes:
        """The bytes this value describes. ``parity(encoding, index, block_bytes)``: parity
        chunk ``index`` of a block (``reed_solomon.py`` supplies the real codec's)."""
        out = bytearray()
        for s in self.segments:
            if s.kind == "zero":
                out += bytes(s.length)
            elif s.kind == "lit":
                out += s.key
            elif s.kind in ("rand", "junk"):
                out += _stream(s.key, s.start, s.length)
            else:
                if parity is None:
                    raise InvalidArgumentError("materializing parity needs its codec")
                encoding, index, block = s.key
                whole = parity(encoding, index, block.materialize(parity))
                out += whole[s.start : s.start + s.length]
        return bytes(out)


def _stream(seed: int, start: int, length: int) -> bytes:
    """Bytes ``start:start+length`` of seed ``seed``'s stream: PCG64 words, little-endian,
    reached by jumping ahead, so any slice is made without the bytes before it."""
    if length == 0:
        return b""
    first = start // 8
    words = (start + length + 7) // 8 - first
    gen = np.random.PCG64(seed)
    gen.advance(first)
    raw = gen.random_raw(words).astype("<u8").tobytes()
    skip = start - first * 8
    return raw[skip : skip + length]


Payload = BytesLike | Synthetic


def nbytes(payload: Payload) -> int:
    """The bytes ``payload`` holds or describes."""
    return len(payload) if isinstance(payload, Synthetic) else memoryview(payload).nbytes


def sliced(payload: Payload, lo: int, hi: int) -> Payload:
    """``payload[lo:hi]`` without copying: a memoryview of bytes, a ``Synthetic``'s slice."""
    if isinstance(payload, Synthetic):
        return payload[lo:hi]
    return memoryview(payload)[lo:hi]


def joined(parts: Iterable[Payload]) -> bytes | Synthetic:
    """The concatenation of ``parts``: bytes, or a ``Synthetic`` when any part is one."""
    parts = list(parts)
    real = [p for p in parts if not isinstance(p, Synthetic)]
    if len(real) < len(parts):
        return Synthetic.join(parts)
    return b"".join(real)


def real_bytes(payload: bytes | Synthetic) -> bytes:
    """``payload``, which must be bytes: InvalidArgumentError for a ``Synthetic``, whose
    bytes are never made (code that hashes or parses what it read needs the bytes)."""
    if isinstance(payload, Synthetic):
        raise InvalidArgumentError("a synthetic payload has no bytes to read")
    return payload


def put_into(dest: memoryview, payload: Payload) -> None:
    """Copy ``payload`` into ``dest`` (the same length). Raises InvalidArgumentError for a
    ``Synthetic`` one, which has no bytes to copy: read it without a buffer."""
    if isinstance(payload, Synthetic):
        raise InvalidArgumentError("a synthetic payload is not read into a buffer")
    dest[:] = payload


__all__ = [
    "Payload",
    "Segment",
    "Synthetic",
    "joined",
    "nbytes",
    "put_into",
    "real_bytes",
    "sliced",
]
