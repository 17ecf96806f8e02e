"""Small reads fetch only their bytes of the chunks they touch (``BlockReader.fetch_range``:
the node reads and checks the 8 KiB pieces that hold them), fall back to the next replica,
and decode a lost Reed-Solomon chunk's bytes from the same bytes of D others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.chunkstore import FaultyNode
from tectonic_emu.chunkstore._format import HEADER_SIZE, PAYLOAD_OFFSET, PIECE_SIZE
from tectonic_emu.services.repair import repair
from tectonic_emu.services.scrub import scrub

from .conftest import flip, make_cluster, run_with

BLOCK = 512 << 10  # chunks of 512 KiB (an rs-6-3 block is 6 of them): 128 KiB is a small share
WHOLE = 12 * BLOCK  # two rs-6-3 blocks, twelve r3 ones; then a short one
DATA = os.urandom(WHOLE + 12_345)


def faulty(c: Cluster) -> list[FaultyNode]:
    """Every node of ``c`` behind a FaultyNode (to count and fail its calls)."""
    nodes = [FaultyNode(n) for n in c.nodes]
    for i, n in enumerate(nodes):
        c.nodes[i] = n
    return nodes


def reads(nodes: list[FaultyNode]) -> tuple[int, int]:
    """(whole chunk reads, ranged reads) the nodes served."""
    whole = sum(n.calls["read_chunk"] for n in nodes)
    return whole, sum(n.calls["read_chunk_range"] for n in nodes)


@pytest.fixture(scope="module", params=["r3", "rs-6-3"])
def cluster_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_cluster(
        tmp_path_factory.mktemp("ranged") / "c", encoding=request.param, block_size=BLOCK
    )

    async def put(c: Cluster) -> None:
        await c.client().write_file("/f", DATA)

    run_with(root, put)
    return root


@settings(max_examples=25, deadline=None)
@given(offset=st.integers(0, WHOLE - (128 << 10)), size=st.sampled_from([1, 4096, 65_536, 131_072]))
def test_a_small_read_asks_for_its_bytes_only(cluster_dir: Path, offset: int, size: int) -> None:
    """(Of the whole blocks: more than half of the short last one is read whole.)"""

    async def go(c: Cluster) -> None:
        nodes = faulty(c)
        reader = await c.client().reader("/f")
        buf = bytearray(size)
        n = await reader.read_into(offset, buf)
        assert bytes(buf[:n]) == DATA[offset : offset + size]
        whole, ranged = reads(nodes)
        assert whole == 0 and 1 <= ranged <= 4  # two chunks, in two blocks at most

    run_with(cluster_dir, go)


def test_a_large_read_fetches_whole_chunks(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        nodes = faulty(c)
        reader = await c.client().reader("/f")
        buf = bytearray(BLOCK)
        assert await reader.read_into(0, buf) == BLOCK
        assert bytes(buf) == DATA[:BLOCK]
        assert reads(nodes)[1] == 0

    run_with(cluster_dir, go)


def test_a_small_read_survives_bad_chunks(cluster_dir: Path) -> None:
    """Every node but enough to answer fails its reads (corrupt, or down): a replicated
    read goes from replica to replica, a Reed-Solomon one decodes the bytes it lost from
    the same bytes of D others, and never fetches a whole chunk."""

    async def go(c: Cluster) -> None:
        nodes = faulty(c)
        client = c.client()
        (first, *_) = await client.layout("/f")
        tolerance = 2 if c.config.encoding == "r3" else 3
        data_chunks = sorted(first.chunks, key=lambda ch: ch.index)[:tolerance]
        for ch in data_chunks:
            nodes[ch.node].corrupt_reads = True
        reader = await client.reader("/f")
        for offset in (0, 5000, first.length // 3, first.length // 2 - 10, first.length - 4096):
            buf = bytearray(4096 + 20)
            n = await reader.read_into(offset, buf)
            assert bytes(buf[:n]) == DATA[offset : offset + len(buf)]
        assert reads(nodes)[0] == 0

    run_with(cluster_dir, go)


def test_a_flipped_byte_fails_only_the_reads_of_its_piece(tmp_path: Path) -> None:
    """r1: the one chunk, a byte flipped in one piece. Reads elsewhere go on; a read of
    that piece fails (EIO: there is no other copy), as does a read of the whole."""
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r1", block_size=BLOCK)

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", DATA[:BLOCK])
        (block,) = await client.layout("/f")
        (ch,) = block.chunks
        path = c.nodes[ch.node].chunk_path(ch.disk, ch.chunk_id)
        assert path is not None
        flip(path, PAYLOAD_OFFSET + 40_000)  # in piece 4 (32768..40959)
        reader = await client.reader("/f")
        buf = bytearray(4096)
        assert await reader.read_into(0, buf) == 4096 and bytes(buf) == DATA[:4096]
        assert await reader.read_into(50_000, buf) == 4096
        with pytest.raises(OSError):
            await reader.read_into(38_000, buf)
        with pytest.raises(OSError):
            await client.read_file("/f")

    run_with(root, go)


def test_scrub_finds_a_bad_piece_checksum_and_repair_rewrites_the_chunk(tmp_path: Path) -> None:
    """A flipped bit in a chunk's piece table (its bytes intact) fails small reads of that
    piece on that node; scrub checks every piece as well as the whole, reports the chunk
    corrupt, and repair rewrites it."""
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3", block_size=BLOCK)

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", DATA[:BLOCK])
        (block,) = await client.layout("/f")
        victim = block.chunks[0]
        path = c.nodes[victim.node].chunk_path(victim.disk, victim.chunk_id)
        assert path is not None
        flip(path, HEADER_SIZE + 4 * 3)  # piece 3's checksum
        report = await scrub(c)
        assert [p.chunk_id for p in report.corrupt] == [victim.chunk_id]
        fixed = await repair(c, gc_grace=0)
        assert (fixed.blocks_repaired, fixed.chunks_rebuilt) == (1, 1)
        assert (await scrub(c)).clean
        reader = await client.reader("/f")
        buf = bytearray(100)
        assert await reader.read_into(3 * PIECE_SIZE + 5, buf) == 100
        assert bytes(buf) == DATA[3 * PIECE_SIZE + 5 : 3 * PIECE_SIZE + 105]

    run_with(root, go)
