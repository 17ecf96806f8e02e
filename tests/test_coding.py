"""Encodings, codecs, checksums and compression (tectonic_emu.coding)."""

from __future__ import annotations

import array
import ctypes
import errno
import itertools
import mmap
import os
import random
import re
import threading
from collections.abc import Callable, Container, Sequence
from typing import Any

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu.chunkstore.base import BytesLike
from tectonic_emu.coding import (
    FLAG_ZSTD,
    KNOWN_ENCODINGS,
    POLICIES,
    Codec,
    CompressionPolicy,
    Encoding,
    codec_for,
    crc32c,
    crc32c_combine,
    crc32c_each,
    crc32c_many,
    crc32c_pieces,
    decompress,
    maybe_compress,
)
from tectonic_emu.coding._gf256 import cauchy_matrix, gf_inv, gf_mul
from tectonic_emu.coding._native import isal
from tectonic_emu.coding.reed_solomon import ReedSolomonCodec
from tectonic_emu.errors import (
    ChunkCorruptError,
    DataUnavailableError,
    InvalidArgumentError,
    UnknownEncodingError,
)

RS_KNOWN = [n for n in KNOWN_ENCODINGS if n.startswith("rs-")]


def rand(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def chunk_map(chunks: Sequence[BytesLike], keep: Container[int]) -> dict[int, bytes]:
    return {i: bytes(c) for i, c in enumerate(chunks) if i in keep}


# -- Encoding --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind", "width", "min_chunks", "tolerance", "overhead"),
    [
        ("r1", "replication", 1, 1, 0, 1.0),
        ("r3", "replication", 3, 1, 2, 3.0),
        ("rs-3-3", "rs", 6, 3, 3, 2.0),
        ("rs-6-3", "rs", 9, 6, 3, 1.5),
        ("rs-9-6", "rs", 15, 9, 6, 15 / 9),
        ("rs-10-4", "rs", 14, 10, 4, 1.4),
    ],
)
def test_known_encodings(
    name: str, kind: str, width: int, min_chunks: int, tolerance: int, overhead: float
) -> None:
    enc = Encoding.parse(name)
    assert (enc.name, str(enc), enc.kind) == (name, name, kind)
    assert (enc.width, enc.min_chunks, enc.tolerance) == (width, min_chunks, tolerance)
    assert enc.overhead == pytest.approx(overhead)
    assert name in KNOWN_ENCODINGS


def test_parse_round_trips_every_valid_name() -> None:
    names = [f"r{n}" for n in range(1, 9)]
    names += [f"rs-{d}-{p}" for d in range(1, 33) for p in range(1, 17)]
    for name in names:
        enc = Encoding.parse(name)
        assert enc.name == name
        assert Encoding.parse(str(enc)) == enc
        assert enc.width == enc.data + enc.parity


@pytest.mark.parametrize(
    "text",
    ["", "rs-6", "x3", "r0", "r9", "r10", "rs-0-3", "rs-6-0", "rs-33-1", "rs-6-17", "R3",
     "r3 ", " r3", "r3\n", "r03", "rs-06-3", "rs-6-3-1", "rs_6_3", "rs-6-3x", "r\u0663", "rs--6-3"],
)  # fmt: skip
def test_parse_rejects_bad_names(text: str) -> None:
    with pytest.raises(UnknownEncodingError, match=r"rN .* rs-D-P") as info:
        Encoding.parse(text)
    assert isinstance(info.value, ValueError)
    assert info.value.errno == errno.EINVAL


_VALID = re.compile(r"r[1-8]|rs-([1-9]|[12][0-9]|3[0-2])-([1-9]|1[0-6])")


@given(st.text(max_size=12) | st.from_regex(r"rs?-?[0-9]{1,3}(-[0-9]{1,3})?", fullmatch=True))
def test_parse_accepts_exactly_the_valid_forms(text: str) -> None:
    if _VALID.fullmatch(text):
        assert Encoding.parse(text).name == text
    else:
        with pytest.raises(UnknownEncodingError):
            Encoding.parse(text)


# -- codecs: erasure patterns ----------------------------------------------------------------
def check_patterns(name: str, patterns: list[tuple[int, ...]], block: bytes) -> None:
    """Each pattern of lost chunks: decode gives the block, reconstruct gives the lost chunks."""
    codec = codec_for(name)
    chunks = [bytes(c) for c in codec.encode(block)]
    for lost in patterns:
        keep = {i: c for i, c in enumerate(chunks) if i not in lost}
        assert bytes(codec.decode(keep, len(block))) == block, lost
        rebuilt = codec.reconstruct(keep, lost, len(block))
        assert sorted(rebuilt) == sorted(lost)
        for i in lost:
            assert bytes(rebuilt[i]) == chunks[i], (lost, i)


def all_patterns(width: int, up_to: int) -> list[tuple[int, ...]]:
    return [p for n in range(up_to + 1) for p in itertools.combinations(range(width), n)]


@pytest.mark.parametrize("name", ["r1", "r3", "rs-3-3", "rs-6-3", "rs-10-4", "rs-9-6"])
def test_every_tolerated_erasure_pattern_decodes(name: str) -> None:
    # Exhaustive, rs-9-6 included (all 5,005 ways to lose 6 of 15, ~3 s): ISA-L's Vandermonde
    # matrix fails on 32 of those, which is why the codec uses a Cauchy matrix.
    enc = Encoding.parse(name)
    block = rand(4096 + 5, seed=enc.width)  # not a multiple of D or of 64
    check_patterns(name, all_patterns(enc.width, enc.tolerance), block)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["rs-3-3", "rs-6-3", "rs-10-4"]),
    length=st.integers(1, 20_000),
    data=st.data(),
)
def test_a_range_of_lost_chunks_decodes_from_the_same_range_of_others(
    name: str, length: int, data: Any
) -> None:
    """``reconstruct_range``: bytes [a, b) of lost chunks (the last data chunk short, or
    empty) from bytes [a, b) of D others, each clipped to its chunk."""
    codec = codec_for(name)
    assert isinstance(codec, ReedSolomonCodec)
    enc = codec.encoding
    block = rand(length, seed=length)
    chunks = [bytes(c) for c in codec.encode(block)]
    s = codec.chunk_len(length)
    a = data.draw(st.integers(0, s))
    b = data.draw(st.integers(a, s))
    lost = data.draw(
        st.lists(st.integers(0, enc.width - 1), unique=True, min_size=1, max_size=enc.parity)
    )
    others = [i for i in range(enc.width) if i not in lost]
    keep = data.draw(st.permutations(others))[: enc.data]
    fragments = {i: chunks[i][a:b] for i in keep}
    rebuilt = codec.reconstruct_range(fragments, lost, a, b, length)
    assert {i: bytes(v) for i, v in rebuilt.items()} == {i: chunks[i][a:b] for i in lost}
    with pytest.raises(DataUnavailableError):
        codec.reconstruct_range(dict(list(fragments.items())[:-1]), lost, a, b, length)


@pytest.mark.parametrize("name", KNOWN_ENCODINGS)
def test_one_loss_too_many_is_unavailable(name: str) -> None:
    codec = codec_for(name)
    enc = codec.encoding
    block = rand(1000)
    chunks = codec.encode(block)
    for lost in itertools.combinations(range(enc.width), enc.tolerance + 1):
        keep = {i: c for i, c in enumerate(chunks) if i not in lost}
        with pytest.raises(DataUnavailableError):
            codec.decode(keep, len(block))
        with pytest.raises(DataUnavailableError):
            codec.reconstruct(keep, lost, len(block))


def test_vandermonde_would_fail_where_cauchy_does_not() -> None:
    # The claim behind the matrix choice: ISA-L's Vandermonde matrix (gf_gen_rs_matrix, what
    # pyeclib's isa_l_rs_vand uses) is singular for some erasure patterns once P > 4, for none
    # of the known encodings with P <= 4; the Cauchy matrix is singular for none.
    raw = ctypes.CDLL(isal().path)
    for name in RS_KNOWN:
        enc = Encoding.parse(name)
        d, n = enc.data, enc.width
        vand = (ctypes.c_ubyte * (n * d))()
        raw.gf_gen_rs_matrix(vand, n, d)
        cauchy = [v for row in cauchy_matrix(d, enc.parity) for v in row]
        matrices = {"vand": list(vand), "cauchy": cauchy}
        singular = dict.fromkeys(matrices, 0)
        for rows in itertools.combinations(range(n), d):
            for label, m in matrices.items():
                square = (ctypes.c_ubyte * (d * d))(*(m[r * d + c] for r in rows for c in range(d)))
                out = (ctypes.c_ubyte * (d * d))()
                singular[label] += raw.gf_invert_matrix(square, out, d) != 0
        assert singular["cauchy"] == 0, name
        assert (singular["vand"] > 0) == (enc.parity > 4), (name, singular)


# -- codecs: the chunk format ----------------------------------------------------------------
def test_cauchy_matrix_is_isal_cauchy1() -> None:
    lib = isal()
    for d, p in [(1, 1), (3, 3), (6, 3), (9, 6), (10, 4), (32, 16)]:
        out = (ctypes.c_ubyte * ((d + p) * d))()
        lib.gf_gen_cauchy1_matrix(out, d + p, d)
        assert [v for row in cauchy_matrix(d, p) for v in row] == list(out)


def reference_parity(block: bytes, data: int, parity: int, s: int) -> list[bytes]:
    """Parity chunks by the book, one byte at a time (slow; small blocks only)."""
    chunks = [block[i * s : (i + 1) * s].ljust(s, b"\0") for i in range(data)]
    matrix = cauchy_matrix(data, parity)
    out = []
    for p in range(parity):
        row = matrix[data + p]
        acc = bytearray(s)
        for coef, chunk in zip(row, chunks, strict=True):
            for j, byte in enumerate(chunk):
                acc[j] ^= gf_mul(coef, byte)
        out.append(bytes(acc))
    return out


@pytest.mark.parametrize("name", RS_KNOWN)
@pytest.mark.parametrize("length", [0, 1, 63, 64 * 3 + 1, 1000, 2048])
def test_chunk_format_matches_reference(name: str, length: int) -> None:
    codec = codec_for(name)
    assert isinstance(codec, ReedSolomonCodec)
    d, p = codec.encoding.data, codec.encoding.parity
    block = rand(length, seed=length)
    chunks = [bytes(c) for c in codec.encode(block)]
    s = codec.chunk_len(length)
    assert s % 64 == 0 and s * d >= length and (s - 64) * d < max(length, 1)
    assert [len(c) for c in chunks] == codec.chunk_sizes(length)
    assert b"".join(chunks[:d]) == block  # systematic, no stored padding
    assert chunks[d:] == reference_parity(block, d, p, s)


def test_gf_arithmetic() -> None:
    assert gf_mul(0x80, 2) == 0x1D  # reduction by 0x11d
    assert all(gf_mul(a, gf_inv(a)) == 1 for a in range(1, 256))
    with pytest.raises(ZeroDivisionError):
        gf_inv(0)


@pytest.mark.parametrize("name", KNOWN_ENCODINGS)
def test_block_lengths(name: str) -> None:
    codec = codec_for(name)
    enc = codec.encoding
    d = enc.data
    lengths = {0, 1, 2, d - 1, d, d + 1, 63, 64, 65, 64 * d - 1, 64 * d, 64 * d + 1}
    lengths |= {64 * d * max(d - 1, 1) + 1, 10_000, 65_536}
    for length in sorted(lengths):
        block = rand(length, seed=length)
        chunks = codec.encode(block)
        assert len(chunks) == enc.width
        assert [len(c) for c in chunks] == codec.chunk_sizes(length)
        first = chunk_map(chunks, range(enc.min_chunks))
        last = chunk_map(chunks, range(enc.width - enc.min_chunks, enc.width))
        assert bytes(codec.decode(first, length)) == block
        assert bytes(codec.decode(last, length)) == block
        lost = list(range(enc.tolerance))
        rebuilt = codec.reconstruct(last, lost, length)
        assert {i: bytes(c) for i, c in rebuilt.items()} == {i: bytes(chunks[i]) for i in lost}


@pytest.mark.parametrize("name", KNOWN_ENCODINGS)
def test_empty_block(name: str) -> None:
    codec = codec_for(name)
    chunks = codec.encode(b"")
    assert len(chunks) == codec.encoding.width and all(len(c) == 0 for c in chunks)
    keep = chunk_map(chunks, range(codec.encoding.tolerance, codec.encoding.width))
    assert bytes(codec.decode(keep, 0)) == b""
    with pytest.raises(DataUnavailableError):
        codec.decode({}, 0)


@given(
    name=st.sampled_from(KNOWN_ENCODINGS),
    block=st.binary(max_size=3000),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=150, deadline=None)
def test_round_trip_from_random_subsets(name: str, block: bytes, seed: int) -> None:
    codec = codec_for(name)
    enc = codec.encoding
    rng = random.Random(seed)
    chunks = codec.encode(block)
    keep = set(rng.sample(range(enc.width), rng.randint(enc.min_chunks, enc.width)))
    assert bytes(codec.decode(chunk_map(chunks, keep), len(block))) == block
    lost = [i for i in range(enc.width) if i not in keep]
    rebuilt = codec.reconstruct(chunk_map(chunks, keep), lost, len(block))
    assert all(bytes(rebuilt[i]) == bytes(chunks[i]) for i in lost)


# -- codecs: buffers, copies, bad input ------------------------------------------------------
def test_replication_returns_one_view_n_times() -> None:
    block = bytearray(rand(100))
    chunks = codec_for("r3").encode(block)
    assert len(chunks) == 3 and chunks[0] is chunks[1] is chunks[2]
    block[0] ^= 0xFF
    assert bytes(chunks[2]) == bytes(block)  # a view, not a copy


def test_rs_data_chunks_are_views_of_the_block() -> None:
    block = bytearray(rand(6 * 640))
    chunks = codec_for("rs-6-3").encode(block)
    block[640] ^= 0xFF
    assert bytes(chunks[1])[0] == block[640]


def test_decode_fast_path_joins_data_chunks() -> None:
    codec = codec_for("rs-6-3")
    block = rand(100_000)
    chunks = codec.encode(block)
    parity = {i: b"\0" * len(chunks[i]) for i in range(6, 9)}  # wrong parity: must be unused
    data = chunk_map(chunks, range(6))
    assert codec.decode({**data, **parity}, len(block)) == block


@pytest.mark.parametrize("name", ["r3", "rs-6-3"])
@pytest.mark.parametrize("degraded", [False, True])
def test_decode_into_out_buffer(name: str, degraded: bool) -> None:
    codec = codec_for(name)
    block = rand(50_001)
    chunks = codec.encode(block)
    keep = range(codec.encoding.tolerance, codec.encoding.width) if degraded else range(9)
    out = mmap.mmap(-1, 65_536)
    result = codec.decode(chunk_map(chunks, keep), len(block), out=memoryview(out))
    assert bytes(result) == block and out[: len(block)] == block
    with pytest.raises(InvalidArgumentError):
        codec.decode(chunk_map(chunks, keep), len(block), out=bytearray(10))
    with pytest.raises(InvalidArgumentError):
        codec.decode(chunk_map(chunks, keep), len(block), out=bytes(65_536))


def test_encode_into_parity_buffers() -> None:
    codec = codec_for("rs-6-3")
    assert isinstance(codec, ReedSolomonCodec)
    block = rand(100_000)
    s = codec.chunk_len(len(block))
    pool = [mmap.mmap(-1, s + 4096) for _ in range(3)]
    chunks = codec.encode(block, parity_out=[memoryview(m) for m in pool])
    assert [bytes(c) for c in chunks] == [bytes(c) for c in codec.encode(block)]
    assert all(pool[j][:s] == bytes(chunks[6 + j]) for j in range(3))
    with pytest.raises(InvalidArgumentError):
        codec.encode(block, parity_out=[memoryview(m) for m in pool[:2]])
    with pytest.raises(InvalidArgumentError):
        codec.encode(block, parity_out=[bytearray(s - 1)] * 3)


def test_any_contiguous_buffer_type() -> None:
    codec = codec_for("rs-3-3")
    words = array.array("I", range(1000))
    block = words.tobytes()
    chunks = codec.encode(memoryview(words))
    assert b"".join(bytes(c) for c in chunks[:3]) == block
    keep = {i: memoryview(bytearray(chunks[i])) for i in range(3, 6)}
    assert bytes(codec.decode(keep, len(block))) == block
    with pytest.raises(InvalidArgumentError):
        codec.encode(memoryview(block)[::2])


def test_wrong_length_chunks_are_not_used() -> None:
    codec = codec_for("rs-6-3")
    block = rand(10_000)
    chunks = chunk_map(codec.encode(block), range(9))
    chunks[0] = chunks[0][:-1]
    assert codec.decode(chunks, len(block)) == block  # 8 good chunks remain
    chunks[1] = chunks[1] + b"x"
    chunks[2] = b""
    chunks[7] = chunks[7][1:]
    with pytest.raises(DataUnavailableError, match="chunk 0 has"):
        codec.decode(chunks, len(block))


def test_bad_indexes() -> None:
    codec = codec_for("rs-6-3")
    chunks = chunk_map(codec.encode(rand(600)), range(9))
    with pytest.raises(InvalidArgumentError):
        codec.decode({**chunks, 9: b""}, 600)
    with pytest.raises(InvalidArgumentError):
        codec.reconstruct(chunks, [9], 600)
    with pytest.raises(InvalidArgumentError):
        codec.reconstruct(chunks, [1, 1], 600)
    with pytest.raises(InvalidArgumentError):
        codec.decode(chunks, -1)


def test_reconstruct_does_not_trust_the_chunks_it_rebuilds() -> None:
    codec = codec_for("rs-6-3")
    block = rand(5000)
    good = chunk_map(codec.encode(block), range(9))
    corrupt = {**good, 2: bytes(len(good[2])), 7: bytes(len(good[7]))}
    rebuilt = codec.reconstruct(corrupt, [2, 7], len(block))
    assert bytes(rebuilt[2]) == good[2] and bytes(rebuilt[7]) == good[7]


def test_codec_for() -> None:
    assert codec_for("rs-6-3") is codec_for(Encoding.parse("rs-6-3"))
    assert isinstance(codec_for("r3"), Codec)
    assert codec_for("rs-32-16").encoding.width == 48
    with pytest.raises(UnknownEncodingError):
        codec_for("rs-6")
    with pytest.raises(UnknownEncodingError):
        codec_for(Encoding("rs-6-3", "rs", 6, 4))


def test_widest_encoding_round_trip() -> None:
    codec = codec_for("rs-32-16")
    block = rand(300_001)
    chunks = codec.encode(block)
    keep = chunk_map(chunks, range(16, 48))
    assert codec.decode(keep, len(block)) == block
    rebuilt = codec.reconstruct(keep, list(range(16)), len(block))
    assert all(bytes(rebuilt[i]) == bytes(chunks[i]) for i in range(16))


def run_threads(n: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_codecs_shared_across_threads() -> None:
    def work(i: int) -> None:
        for j in range(20):
            name = RS_KNOWN[(i + j) % len(RS_KNOWN)]
            codec = codec_for(name)
            enc = codec.encoding
            block = rand(200_000 + j, seed=i * 100 + j)
            chunks = codec.encode(block)
            lost = random.Random(j).sample(range(enc.width), enc.tolerance)
            keep = {k: c for k, c in enumerate(chunks) if k not in lost}
            assert codec.decode(keep, len(block)) == block
            rebuilt = codec.reconstruct(keep, lost, len(block))
            assert all(bytes(rebuilt[k]) == bytes(chunks[k]) for k in lost)

    run_threads(4, work)


# -- crc32c ----------------------------------------------------------------------------------
def test_crc32c_known_vector() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0


@pytest.mark.parametrize("size", [0, 1, 4095, 65_536, 1 << 20])
def test_crc32c_buffer_types_agree(size: int) -> None:
    data = rand(size)
    expected = google_crc32c.value(data)
    m = mmap.mmap(-1, max(size, 1))
    m[:size] = data
    views: list[BytesLike] = [data, bytearray(data), memoryview(data), memoryview(m)[:size]]
    assert [crc32c(v) for v in views] == [expected] * 4


@given(st.binary(), st.binary())
def test_crc32c_extends(a: bytes, b: bytes) -> None:
    assert crc32c(b, crc32c(a)) == crc32c(a + b) == google_crc32c.value(a + b)
    assert crc32c(memoryview(b), crc32c(bytearray(a))) == crc32c(a + b)


@given(
    st.binary(max_size=3000),
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3000)), max_size=20),
)
def test_crc32c_many_matches_crc32c_of_each_span(data: bytes, spans: list[tuple[int, int]]) -> None:
    inside = [(at, n) for at, n in spans if at + n <= len(data)]
    assert crc32c_many(bytearray(data), inside) == [crc32c(data[at : at + n]) for at, n in inside]
    if len(inside) < len(spans):
        with pytest.raises(InvalidArgumentError):
            crc32c_many(data, spans)


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(0, 2))
def test_crc32c_each_matches_crc32c_of_each_piece(pieces: list[bytes], big: int) -> None:
    bufs: list[Any] = [memoryview(bytearray(p)) for p in pieces] + [rand(300_000)] * big
    assert crc32c_each(bufs) == [crc32c(bytes(b)) for b in bufs]


@given(st.binary(max_size=5000), st.integers(1, 700))
def test_crc32c_combine_of_pieces_is_the_whole(data: bytes, size: int) -> None:
    """The checksum a node checks a write against, made from the piece table alone."""
    pieces = crc32c_pieces(data, size)
    assert crc32c_combine(pieces, size, len(data)) == crc32c(data)


def test_crc32c_combine_of_a_chunk_and_of_threads_at_once() -> None:
    """A whole 8 MiB chunk with a short last piece (1,024 rows of the fold), from threads
    growing the shared fold together; and a flipped bit anywhere changes the result."""
    data = bytearray(rand((8 << 20) - 3))
    size = 8 << 10
    pieces = crc32c_pieces(data, size)
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(crc32c_combine(pieces, size, len(data))))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [crc32c(data)] * 4
    for at in (0, 4096, len(data) // 2, len(data) - 1):
        data[at] ^= 0x10
        assert crc32c_combine(crc32c_pieces(data, size), size, len(data)) != results[0]
        data[at] ^= 0x10


@pytest.mark.parametrize(("count", "size", "total"), [(1, 10, 0), (2, 10, 10), (1, 0, 0)])
def test_crc32c_combine_refuses_counts_that_do_not_fit(count: int, size: int, total: int) -> None:
    with pytest.raises(InvalidArgumentError):
        crc32c_combine([0] * count, size, total)


def test_crc32c_each_refuses_a_non_contiguous_buffer() -> None:
    with pytest.raises(InvalidArgumentError):
        crc32c_each([b"ab", memoryview(bytes(10))[::2]])


def test_crc32c_many_releases_the_gil_for_big_spans() -> None:
    data = rand(3 << 20)
    spans = [(0, 1 << 20), (5, 300_000), (1 << 20, 2 << 20)]
    assert crc32c_many(memoryview(data), spans) == [crc32c(data[a : a + n]) for a, n in spans]


def test_crc32c_bad_input() -> None:
    with pytest.raises(InvalidArgumentError):
        crc32c(memoryview(b"abcdef")[::2])
    with pytest.raises(InvalidArgumentError):
        crc32c(b"abc", -1)
    with pytest.raises(InvalidArgumentError):
        crc32c(b"abc", 1 << 32)


def test_crc32c_shared_across_threads() -> None:
    data = rand(3 << 20)
    expected = google_crc32c.value(data)

    def work(i: int) -> None:
        view = memoryview(data)
        for _ in range(10):
            assert crc32c(view) == expected

    run_threads(4, work)


# -- compression -----------------------------------------------------------------------------
payloads = st.one_of(
    st.binary(max_size=4096),
    st.builds(lambda s, n: s * n, st.binary(min_size=1, max_size=40), st.integers(1, 4000)),
)


@given(payload=payloads, policy=st.sampled_from(POLICIES))
@settings(max_examples=200)
def test_compression_round_trip(payload: bytes, policy: CompressionPolicy) -> None:
    stored, flags = maybe_compress(payload, policy)
    assert flags in (0, FLAG_ZSTD)
    if flags == 0:
        assert stored is payload
    else:
        assert len(stored) < len(payload)
    assert bytes(decompress(stored, flags, len(payload))) == payload
    assert bytes(decompress(memoryview(bytes(stored)), flags, len(payload))) == payload


def test_auto_leaves_random_bytes_raw() -> None:
    payload = os.urandom(1 << 20)
    assert maybe_compress(payload, "auto") == (payload, 0)
    assert maybe_compress(payload, "zstd") == (payload, 0)
    assert maybe_compress(payload, "none") == (payload, 0)
    view = memoryview(payload)
    stored, flags = maybe_compress(view, "auto")
    assert flags == 0 and stored is view


def test_auto_compresses_text() -> None:
    text = b"".join(b"line %d: the quick brown fox jumps over the dog\n" % i for i in range(20_000))
    policies: list[CompressionPolicy] = ["auto", "zstd"]
    for policy in policies:
        stored, flags = maybe_compress(text, policy)
        assert flags == FLAG_ZSTD and len(stored) < len(text) // 3
        assert decompress(stored, flags, len(text)) == text
    assert maybe_compress(text, "none") == (text, 0)


def test_auto_samples_before_compressing() -> None:
    # Compressible only in the unsampled regions: auto gives up, zstd does not.
    noise = rand(1 << 20)
    payload = bytearray(noise)
    payload[20_000:500_000] = bytes(480_000)
    payload[540_000:1_000_000] = bytes(460_000)
    assert maybe_compress(bytes(payload), "auto")[1] == 0
    assert maybe_compress(bytes(payload), "zstd")[1] == FLAG_ZSTD


def test_unknown_policy() -> None:
    with pytest.raises(InvalidArgumentError):
        maybe_compress(b"abc", "lz4")  # type: ignore[arg-type]


def test_decompress_rejects_corrupt_input() -> None:
    text = b"tectonic " * 10_000
    stored, flags = maybe_compress(text, "zstd")
    stored = bytes(stored)
    assert flags == FLAG_ZSTD
    mid = bytearray(stored)
    mid[len(mid) // 2] ^= 0x01
    last = bytearray(stored)
    last[-1] ^= 0x01  # the frame checksum
    bad = [
        (bytes(mid), flags, len(text)),
        (bytes(last), flags, len(text)),
        (stored[:-5], flags, len(text)),
        (stored, flags, len(text) - 1),
        (stored, flags, len(text) + 1),
        (b"not zstd at all", flags, 15),
        (b"", flags, 0),
        (stored, flags | 2, len(text)),
        (text[:-1], 0, len(text)),
    ]
    for args in bad:
        with pytest.raises(ChunkCorruptError):
            decompress(*args)


def test_compression_shared_across_threads() -> None:
    texts = [(b"thread %d " % i) * 50_000 for i in range(4)]

    def work(i: int) -> None:
        for _ in range(20):
            stored, flags = maybe_compress(texts[i], "auto")
            assert flags == FLAG_ZSTD
            assert decompress(stored, flags, len(texts[i])) == texts[i]

    run_threads(4, work)
