"""``rs-D-P``: systematic Reed-Solomon over GF(2^8) with a Cauchy matrix, computed by ISA-L.

Chunk format (the stored bytes, no header). With ``s = chunk_len(L)`` (``L/D`` rounded up to a
multiple of 64 bytes):
- data chunk ``i`` is ``block[i*s : (i+1)*s]`` clipped to the block, so the last data chunks
  may be short, or empty for blocks under ``64*D*(D-1)`` bytes: no padding is stored;
- parity chunk ``p`` is ``s`` bytes: row ``D+p`` of ``cauchy_matrix(D, P)`` applied to the data
  chunks, each zero-padded to ``s``.
Any ``D`` chunks decode, for every erasure pattern (a Cauchy matrix is MDS; ISA-L's Vandermonde
matrix is not once ``P > 4``). Data chunks are views of the block, so encoding copies nothing
but the parity it computes.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Mapping, Sequence
from functools import lru_cache

from tectonic_emu.buffers import BytesLike
from tectonic_emu.coding import work
from tectonic_emu.coding._gf256 import cauchy_matrix, gf_matmul
from tectonic_emu.coding._native import isal, pinned
from tectonic_emu.coding.base import Codec, byte_view, real_views, writable_view
from tectonic_emu.coding.encoding import Encoding
from tectonic_emu.coding.synthetic import Payload, Synthetic, nbytes
from tectonic_emu.errors import DataUnavailableError, InvalidArgumentError

ALIGN = 64  # chunk length granule: keeps every data chunk of an aligned block cache-line aligned
_MAX_CHUNK = 2**31 - 1  # ISA-L takes lengths as int
# Below this many bytes touched, keep the GIL during the call: re-taking it can cost a switch
# interval (5 ms) when another thread is busy in Python.
_RELEASE_GIL_FROM = 256 * 1024

_Tables = ctypes.Array[ctypes.c_ubyte]


class ReedSolomonCodec(Codec):
    """Reed-Solomon with ``encoding.data`` data and ``encoding.parity`` parity chunks."""

    def __init__(self, encoding: Encoding) -> None:
        super().__init__(encoding)
        self._isal = isal()  # fail here, not on the first write, if ISA-L is missing
        self._data = encoding.data
        self._encode_tables = _coding_tables(
            encoding.data,
            encoding.parity,
            tuple(range(encoding.data)),
            tuple(range(encoding.data, encoding.width)),
        )

    def chunk_len(self, block_len: int) -> int:
        """Length of a parity chunk (and of every full data chunk)."""
        per_chunk = -(-block_len // self._data)
        return -(-per_chunk // ALIGN) * ALIGN

    def chunk_sizes(self, block_len: int) -> list[int]:
        s = self.chunk_len(block_len)
        data = [max(0, min(s, block_len - i * s)) for i in range(self._data)]
        return data + [s] * self.encoding.parity

    def encode(
        self, block: Payload, *, parity_out: Sequence[BytesLike] | None = None
    ) -> list[Payload]:
        work.count("rs-encode", nbytes(block))
        if isinstance(block, Synthetic):
            return self._encode_synthetic(block)
        view = byte_view(block)
        size = len(view)
        s = self._checked_chunk_len(size)
        data = [view[min(size, i * s) : min(size, (i + 1) * s)] for i in range(self._data)]
        if parity_out is None:
            # One allocation for all parity; a pool's warm buffers (parity_out) are faster.
            whole = memoryview(bytearray(s * self.encoding.parity))
            parity = [whole[j * s : (j + 1) * s] for j in range(self.encoding.parity)]
        else:
            if len(parity_out) != self.encoding.parity:
                raise InvalidArgumentError(
                    f"{self.encoding.name} needs {self.encoding.parity} parity buffers, "
                    f"got {len(parity_out)}"
                )
            parity = [writable_view(buf, s) for buf in parity_out]
        self._run(self._encode_tables, data, parity, s)
        return [*data, *parity]

    def decode(
        self,
        chunks: Mapping[int, Payload],
        block_len: int,
        *,
        out: BytesLike | None = None,
    ) -> Payload:
        sizes, mixed = self._good_chunks(chunks, block_len)
        work.count("rs-decode", block_len)
        good = real_views(mixed)
        if good is None:
            self._no_out(out)
            return self._decode_synthetic(mixed, block_len)
        data = range(self._data)
        if all(i in good for i in data):
            # Systematic code: the data chunks are the block.
            if out is None:
                return b"".join(good[i] for i in data)
            dst = writable_view(out, block_len)
            pos = 0
            for i in data:
                dst[pos : pos + sizes[i]] = good[i]
                pos += sizes[i]
            return dst
        result: BytesLike
        if out is None:
            result = bytearray(block_len)
            dst = memoryview(result)
        else:
            dst = result = writable_view(out, block_len)
        s = self.chunk_len(block_len)
        for i in data:
            if i in good:
                dst[i * s : i * s + sizes[i]] = good[i]
        lost = tuple(i for i in data if i not in good and sizes[i] > 0)
        if lost:
            sources = tuple(sorted(good)[: self._data])
            self._run(
                self._tables(sources, lost),
                [good[i] for i in sources],
                [dst[i * s : i * s + sizes[i]] for i in lost],
                s,
            )
        return result

    def reconstruct(
        self, chunks: Mapping[int, Payload], missing: Sequence[int], block_len: int
    ) -> dict[int, Payload]:
        missing = self._check_missing(missing)
        sizes, mixed = self._good_chunks(chunks, block_len, exclude=missing)
        work.count("rs-decode", block_len)
        good = real_views(mixed)
        if good is None:
            again = self._encode_synthetic(self._decode_synthetic(mixed, block_len))
            return {i: again[i] for i in missing}
        whole = memoryview(bytearray(sum(sizes[i] for i in missing)))
        rebuilt: dict[int, memoryview] = {}
        pos = 0
        for i in missing:
            rebuilt[i] = whole[pos : pos + sizes[i]]
            pos += sizes[i]
        self._rebuild(good, rebuilt, self.chunk_len(block_len))
        return dict[int, Payload](rebuilt)

    def reconstruct_range(
        self,
        fragments: Mapping[int, Payload],
        missing: Sequence[int],
        start: int,
        stop: int,
        block_len: int,
    ) -> dict[int, memoryview]:
        """Bytes ``[start, stop)`` of each ``missing`` chunk (clipped to its size), from the
        same bytes of at least D other chunks (``fragments``: each chunk's ``[start,
        min(stop, its size))``). The code works column by column, so a small read that lost
        a chunk decodes the bytes it asked for, not the block. Raises InvalidArgumentError
        for fragments of the wrong length or synthetic ones (decode the block instead),
        DataUnavailableError for fewer than D."""
        missing = self._check_missing(missing)
        sizes = self.chunk_sizes(block_len)
        if not 0 <= start <= stop <= self.chunk_len(block_len):
            raise InvalidArgumentError(f"chunk range [{start}, {stop}) of a {block_len}-byte block")
        want = {i: max(0, min(stop, sizes[i]) - start) for i in range(len(sizes))}
        good: dict[int, memoryview] = {}
        for index, fragment in fragments.items():
            self._check_index(index)
            if index in missing:
                continue
            if isinstance(fragment, Synthetic):
                raise InvalidArgumentError("a synthetic chunk range is not decoded")
            view = byte_view(fragment)
            if len(view) != want[index]:
                raise InvalidArgumentError(
                    f"chunk {index}'s range has {len(view)} bytes, expected {want[index]}"
                )
            good[index] = view
        if len(good) < self._data:
            raise DataUnavailableError(
                f"{self.encoding.name}: {len(good)} chunk ranges, {self._data} needed"
            )
        work.count("rs-decode", (stop - start) * self._data)
        rebuilt = {i: memoryview(bytearray(want[i])) for i in missing}
        self._rebuild(good, rebuilt, stop - start)
        return rebuilt

    def _rebuild(self, good: Mapping[int, memoryview], out: dict[int, memoryview], s: int) -> None:
        """Fill each non-empty buffer of ``out`` (by chunk index) from D of the ``good``
        chunks (or their same columns), all seen as ``s`` bytes (``_run``)."""
        targets = tuple(i for i in out if out[i].nbytes > 0)
        if targets:
            sources = tuple(sorted(good)[: self._data])
            self._run(
                self._tables(sources, targets),
                [good[i] for i in sources],
                [out[i] for i in targets],
                s,
            )

    # -- synthetic blocks (coding/synthetic.py) ----------------------------------------------
    def _encode_synthetic(self, block: Synthetic) -> list[Payload]:
        """Data chunks are slices of the block, as for bytes; parity chunk ``p`` is a
        ``parity`` segment naming the block."""
        size = len(block)
        s = self._checked_chunk_len(size)
        data = [block[min(size, i * s) : min(size, (i + 1) * s)] for i in range(self._data)]
        name = self.encoding.name
        return [*data, *(Synthetic.parity(name, p, block, s) for p in range(self.encoding.parity))]

    def _decode_synthetic(
        self, good: Mapping[int, memoryview | Synthetic], block_len: int
    ) -> Synthetic:
        """The block the good chunks were encoded from: their join when every data chunk is
        there, else the block a parity chunk names, if it re-encodes to every good chunk.
        Chunks of different blocks decode to junk, as bytes would (a checksum catches it)."""
        if all(i in good for i in range(self._data)):
            return Synthetic.join(good[i] for i in range(self._data))
        for index in sorted(good):
            chunk = good[index]
            if index < self._data or not isinstance(chunk, Synthetic):
                continue
            (seg,) = chunk.segments or (None,)
            if seg is None or seg.kind != "parity" or seg.start != 0:
                continue
            block: Synthetic = seg.key[2]
            if len(block) == block_len and seg.key[0] == self.encoding.name:
                chunks = self._encode_synthetic(block)
                if all(chunks[i] == c for i, c in good.items()):
                    return block
            break
        names = b"".join(
            c.digest() if isinstance(c, Synthetic) else bytes(c) for _, c in sorted(good.items())
        )
        return Synthetic.junk(hashlib.blake2b(names, digest_size=16).digest(), block_len)

    # -- internals ---------------------------------------------------------------------------
    def _checked_chunk_len(self, block_len: int) -> int:
        s = self.chunk_len(block_len)
        if s > _MAX_CHUNK:
            raise InvalidArgumentError(f"block of {block_len} bytes too large to encode")
        return s

    def _tables(self, sources: tuple[int, ...], targets: tuple[int, ...]) -> _Tables:
        try:
            return _coding_tables(self._data, self.encoding.parity, sources, targets)
        except ValueError as exc:  # singular matrix: cannot happen with a Cauchy matrix
            raise DataUnavailableError(f"{self.encoding.name}: {exc}") from exc

    def _run(
        self,
        tables: _Tables,
        sources: Sequence[memoryview],
        targets: Sequence[memoryview],
        s: int,
    ) -> None:
        """targets[j] = row j of ``tables`` applied to ``sources``, all seen as ``s`` bytes:
        shorter sources are zero-padded, shorter targets get their first bytes only."""
        k, m = len(sources), len(targets)
        r = min([s, *(len(x) for x in sources), *(len(x) for x in targets)])
        if r > 0:
            # The bulk, straight from and into the callers' buffers, without the GIL if large.
            release = r * (k + m) >= _RELEASE_GIL_FROM
            encode = self._isal.ec_encode_data if release else self._isal.ec_encode_data_small
            with pinned(sources) as src, pinned(targets, writable=True) as dst:
                src_ptrs = (ctypes.c_void_p * k)(*(a for a, _ in src))
                dst_ptrs = (ctypes.c_void_p * m)(*(a for a, _ in dst))
                encode(r, k, m, tables, src_ptrs, dst_ptrs)
        if r < s:
            # The ragged end (at most 64*D bytes a chunk): padded copies.
            tail = s - r
            scratch = bytearray(tail * (k + m))
            for i, x in enumerate(sources):
                piece = x[r:s]
                scratch[i * tail : i * tail + len(piece)] = piece
            with pinned([scratch], writable=True) as [(base, _)]:
                src_ptrs = (ctypes.c_void_p * k)(*(base + i * tail for i in range(k)))
                dst_ptrs = (ctypes.c_void_p * m)(*(base + (k + j) * tail for j in range(m)))
                self._isal.ec_encode_data_small(tail, k, m, tables, src_ptrs, dst_ptrs)
            for j, x in enumerate(targets):
                if len(x) > r:
                    start = (k + j) * tail
                    x[r:] = scratch[start : start + len(x) - r]


@lru_cache(maxsize=1024)
def _coding_tables(
    data: int, parity: int, sources: tuple[int, ...], targets: tuple[int, ...]
) -> _Tables:
    """ISA-L tables computing chunks ``targets`` from the ``data`` chunks ``sources``.

    With ``M`` the coding matrix, chunk t is ``M[t] @ x`` for the data vector x; the sources
    are ``M[sources] @ x``, so chunk t is ``M[t] @ inv(M[sources]) @ sources``.
    """
    lib = isal()
    matrix = cauchy_matrix(data, parity)
    wanted = [matrix[t] for t in targets]
    if sources == tuple(range(data)):
        rows = [list(row) for row in wanted]
    else:
        square = (ctypes.c_ubyte * (data * data))(*(v for i in sources for v in matrix[i]))
        inverse = (ctypes.c_ubyte * (data * data))()
        if lib.gf_invert_matrix(square, inverse, data) != 0:
            raise ValueError(f"chunks {sources} do not determine the block")
        inv = [list(inverse[r * data : (r + 1) * data]) for r in range(data)]
        rows = gf_matmul(wanted, inv)
    flat = (ctypes.c_ubyte * (data * len(targets)))(*(v for row in rows for v in row))
    tables = (ctypes.c_ubyte * (32 * data * len(targets)))()
    lib.ec_init_tables(data, len(targets), flat, tables)
    return tables


def parity_bytes(encoding: str, index: int, block: bytes) -> bytes:
    """Parity chunk ``index`` of ``block`` under ``encoding``, as the real codec makes it:
    what ``Synthetic.materialize`` needs to make a ``parity`` segment's bytes."""
    codec = ReedSolomonCodec(Encoding.parse(encoding))
    chunk = codec.encode(block)[codec.encoding.data + index]
    assert not isinstance(chunk, Synthetic)
    return bytes(chunk)


__all__ = ["ALIGN", "ReedSolomonCodec", "parity_bytes"]
