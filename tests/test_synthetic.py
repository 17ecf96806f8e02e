"""Synthetic payloads (``tectonic_emu/coding/synthetic.py``): their contract is that making
the bytes commutes with every operation. A value sliced, joined, checksummed, encoded,
decoded or rebuilt describes the slice, join, encoding or decoding of the bytes it
describes, parity included (the real ISA-L codec makes the parity bytes to compare with)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import clock
from tectonic_emu.chunkstore import FaultyNode, LocalNode, MemoryNode
from tectonic_emu.cluster import Cluster
from tectonic_emu.coding import codec_for, crc32c, crc32c_each, crc32c_many, maybe_compress, work
from tectonic_emu.coding.compression import decompress
from tectonic_emu.coding.reed_solomon import parity_bytes
from tectonic_emu.coding.synthetic import Payload, Segment, Synthetic
from tectonic_emu.config import ClusterConfig
from tectonic_emu.errors import ChunkCorruptError, DataUnavailableError, InvalidArgumentError
from tectonic_emu.metadata import MemoryKV
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.offload import InlineExecutor


def made(p: Payload) -> bytes:
    return p.materialize(parity_bytes) if isinstance(p, Synthetic) else bytes(p)


pieces = st.one_of(
    st.builds(Synthetic.random, st.integers(0, 3), st.integers(0, 3000), start=st.integers(0, 99)),
    st.builds(Synthetic.zeros, st.integers(0, 500)),
    st.binary(max_size=40),
    st.just(b"\0" * 17),  # literal zeros become a zero run
)
values = st.lists(pieces, max_size=6).map(Synthetic.join)


# -- slices, joins, equality -----------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(value=values, data=st.data())
def test_slices_and_joins_describe_the_slices_and_joins_of_the_bytes(
    value: Synthetic, data: st.DataObject
) -> None:
    raw = made(value)
    assert len(value) == len(raw) == value.nbytes
    lo = data.draw(st.integers(-len(raw) - 5, len(raw) + 5))
    hi = data.draw(st.integers(-len(raw) - 5, len(raw) + 5))
    assert made(value[lo:hi]) == raw[lo:hi]
    cut = data.draw(st.integers(0, len(raw)))
    # Reads join the pieces of what was written: the join of a value's slices is the value.
    assert Synthetic.join([value[:cut], value[cut:]]) == value
    other = data.draw(values)
    assert made(Synthetic.join([value, b"xy", other])) == raw + b"xy" + made(other)


@settings(max_examples=100, deadline=None)
@given(a=values, b=values)
def test_equal_values_describe_equal_bytes_and_share_a_checksum(a: Synthetic, b: Synthetic) -> None:
    if a == b:
        assert made(a) == made(b) and crc32c(a) == crc32c(b) and hash(a) == hash(b)
    joined = Synthetic.join([a, b])
    assert joined == Synthetic.join([*(a[i : i + 7] for i in range(0, len(a), 7)), b])


def test_a_stream_slice_is_made_without_the_bytes_before_it() -> None:
    whole = Synthetic.random(5, 10_000).materialize()
    for start, n in [(0, 1), (1, 8), (7, 9), (8, 8), (9_990, 10), (4_097, 1_003)]:
        assert Synthetic.random(5, n, start=start).materialize() == whole[start : start + n]
    assert Synthetic.random(5, 64).materialize() != Synthetic.random(6, 64).materialize()


def test_bad_values_are_refused() -> None:
    s = Synthetic.random(1, 100)
    with pytest.raises(TypeError):
        s[3]  # type: ignore[index]
    with pytest.raises(InvalidArgumentError):
        s[::2]
    with pytest.raises(InvalidArgumentError):
        Synthetic.random(-1, 10)
    with pytest.raises(InvalidArgumentError):
        Synthetic([Segment("zero", None, 0, -1)])
    with pytest.raises(InvalidArgumentError):
        Synthetic.parity("rs-3-2", 0, s, 64).materialize()  # parity needs its codec


# -- checksums and compression ---------------------------------------------------------------
def test_checksums_derive_from_the_structure() -> None:
    s = Synthetic.join([b"head", Synthetic.random(3, 5000)])
    assert crc32c(s) == s.crc32c() != crc32c(Synthetic.random(3, 5004))
    assert crc32c_each([s, b"abc"]) == [s.crc32c(), crc32c(b"abc")]
    assert crc32c_many(s, [(0, 4), (4, 100)]) == [s[0:4].crc32c(), s[4:104].crc32c()]
    with pytest.raises(InvalidArgumentError):
        crc32c(s, 5)
    with pytest.raises(InvalidArgumentError):
        crc32c_many(s, [(5000, 10)])


@pytest.mark.parametrize("policy", ["none", "zstd", "auto"])
def test_a_synthetic_chunk_is_stored_raw(policy: str) -> None:
    s = Synthetic.zeros(1 << 20)  # would shrink to nothing as bytes
    stored, flags = maybe_compress(s, policy)  # type: ignore[arg-type]
    assert stored is s and flags == 0
    assert decompress(stored, 0, len(s)) is s
    with pytest.raises(ChunkCorruptError):
        decompress(stored, 0, len(s) + 1)
    with pytest.raises(ChunkCorruptError):
        decompress(stored, 1, len(s))


# -- codecs ----------------------------------------------------------------------------------
ENCODINGS = ["r1", "r3", "rs-3-2", "rs-6-3"]


@settings(max_examples=40, deadline=None)
@given(value=values, enc=st.sampled_from(ENCODINGS))
def test_encoding_describes_the_real_codecs_chunks(value: Synthetic, enc: str) -> None:
    codec = codec_for(enc)
    chunks = codec.encode(value)
    real = codec.encode(made(value))
    assert [len(c) for c in chunks] == codec.chunk_sizes(len(value))
    assert [made(c) for c in chunks] == [bytes(c) for c in real]


@settings(max_examples=40, deadline=None)
@given(value=values, enc=st.sampled_from(ENCODINGS), data=st.data())
def test_any_enough_chunks_decode_to_the_block_and_rebuild_the_rest(
    value: Synthetic, enc: str, data: st.DataObject
) -> None:
    codec = codec_for(enc)
    chunks = codec.encode(value)
    width, need = codec.encoding.width, codec.encoding.min_chunks
    keep = data.draw(st.sets(st.integers(0, width - 1), min_size=need, max_size=width))
    have = {i: chunks[i] for i in keep}
    assert codec.decode(have, len(value)) == value
    missing = [i for i in range(width) if i not in keep]
    rebuilt = codec.reconstruct(have, missing, len(value))
    assert all(rebuilt[i] == chunks[i] for i in missing)
    with pytest.raises(InvalidArgumentError):
        codec.decode(have, len(value), out=bytearray(len(value)))


def test_chunks_of_different_blocks_decode_to_junk_not_to_either() -> None:
    codec = codec_for("rs-3-2")
    a, b = Synthetic.random(1, 900), Synthetic.random(2, 900)
    ca, cb = codec.encode(a), codec.encode(b)
    mixed = {0: ca[0], 3: cb[3], 4: ca[4]}
    got = codec.decode(mixed, 900)
    assert isinstance(got, Synthetic) and got not in (a, b) and len(got) == 900
    assert got.segments[0].kind == "junk"
    assert codec.decode(mixed, 900) == got  # the same chunks, the same junk
    with pytest.raises(DataUnavailableError):
        codec.decode({0: ca[0], 1: ca[1][:10]}, 900)  # a short chunk is not good


def test_every_erasure_pattern_of_rs_6_3() -> None:
    codec = codec_for("rs-6-3")
    value = Synthetic.join([b"header", Synthetic.random(9, 6 * 4096 + 100)])
    chunks = codec.encode(value)
    for keep in itertools.combinations(range(9), 6):
        assert codec.decode({i: chunks[i] for i in keep}, len(value)) == value


# -- through the real client and data path ---------------------------------------------------
def memory_cluster(enc: str, nodes: int = 9) -> tuple[Cluster, list[FaultyNode]]:
    """A cluster of in-memory nodes and metadata, with inline pools: no directory at all."""
    cfg = ClusterConfig(nodes=nodes, disks_per_node=1, encoding=enc, block_size=1 << 20)
    faulty = [FaultyNode(MemoryNode(n, 1), latency=0.001) for n in range(nodes)]
    meta = Metadata(MemoryKV())
    cluster = Cluster(Path("/nowhere"), cfg, meta, list(faulty), InlineExecutor(), InlineExecutor())
    return cluster, faulty


@pytest.mark.parametrize("enc", ["r3", "rs-6-3"])
def test_the_client_writes_and_reads_synthetic_files_without_making_bytes(enc: str) -> None:
    """64 MiB of synthetic payload, with literal bytes around it, written through the real
    client in pieces that straddle blocks, read back whole and in ranges equal to what was
    written, then again with two of nine nodes down (rebuilt from parity or replicas), in
    virtual time. The nodes hold descriptions, not bytes."""
    body = Synthetic.random(42, 64 << 20)
    data = Synthetic.join([b"header", body, b"tail"])

    async def main() -> None:
        cluster, nodes = memory_cluster(enc)
        await cluster.meta.ensure_root(clock.wall())
        client = cluster.client()
        async with client.open_writer("/f") as w:
            for at in range(0, len(data), 3 << 20):
                await w.append(data[at : at + (3 << 20)])
        assert await client.read_file("/f") == data
        assert await client.read("/f", 5, 10 << 20) == data[5 : 5 + (10 << 20)]
        assert (await client.stat("/f")).size == len(data)
        nodes[0].available = nodes[4].available = False
        assert await client.read_file("/f") == data
        await client.write_file("/g", b"plain bytes")  # bytes still work beside them
        assert await client.read_file("/g") == b"plain bytes"

    clock.run_virtual(main())


def test_nodes_that_store_bytes_refuse_a_synthetic_payload(tmp_path: Path) -> None:
    async def main() -> None:
        node = LocalNode(tmp_path, node_id=3, disks=1)
        s = Synthetic.random(1, 100)
        with pytest.raises(InvalidArgumentError, match="node 3 stores bytes"):
            await node.write_chunk(0, "x.0", s, crc32c=s.crc32c())
        await node.close()

    asyncio.run(main())


def test_a_memory_node_keeps_the_description_and_checks_it() -> None:
    async def main() -> None:
        node = MemoryNode(0, 1)
        s = Synthetic.join([b"h", Synthetic.random(2, 5000)])
        await node.write_chunk(0, "c.0", s, crc32c=s.crc32c())
        got, info = await node.read_chunk(0, "c.0")
        assert got == s and info.stored_len == len(s) and info.crc32c == s.crc32c()
        with pytest.raises(InvalidArgumentError):
            await node.read_chunk_into(0, "c.0", memoryview(bytearray(len(s))))
        node.corrupt(0, "c.0")
        with pytest.raises(ChunkCorruptError):
            await node.read_chunk(0, "c.0")

    asyncio.run(main())


@settings(max_examples=20, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(
            st.integers(0, 3).map(lambda k: k << 20) | st.integers(0, 3 << 20),  # block: 1 MiB
            st.sampled_from(["view", "bytes", "owned"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_writer_counts_the_same_block_buffer_copies_for_synthetic_pieces(
    pieces: list[tuple[int, str]],
) -> None:
    """Appending Synthetic pieces counts the copies into block buffers that the bytes they
    describe get: a buffer's (a memoryview's) copied whole, an immutable or owned piece's
    whole blocks handed over in place when it starts a block (coding/work.py)."""
    values = [Synthetic.random(k, n) for k, (n, _) in enumerate(pieces)]

    async def counted(synthetic: bool) -> dict[str, int]:
        cluster, _ = memory_cluster("r1")
        await cluster.meta.ensure_root(clock.wall())
        tally = work.Tally()
        with tally.active():
            async with cluster.client().open_writer("/f") as w:
                for value, (_, kind) in zip(values, pieces, strict=True):
                    real = value.materialize()
                    if kind == "bytes":
                        await w.append(real)  # a literal in a synthetic run too
                    elif synthetic:
                        await w.append(value, owned=kind == "owned")
                    else:
                        await w.append(memoryview(real), owned=kind == "owned")
        return tally.total

    real = clock.run_virtual(counted(False))
    assert clock.run_virtual(counted(True)).get("copy-warm", 0) == real.get("copy-warm", 0)
    held = sum(n for n, kind in pieces if kind == "view")
    assert real.get("copy-warm", 0) >= held  # a buffer's bytes are copied, every one
