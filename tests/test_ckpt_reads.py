"""MergedReader: reads asked for together are merged into runs of adjacent ranges, each
caller gets exactly its bytes, and a failed read reaches every caller it served."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients import ckpt_reads
from clients.ckpt_reads import MergedReader
from tectonic_emu import Cluster
from tectonic_emu.errors import NotFoundError

DATA = os.urandom(3 << 20)


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reads") / "c"
    Cluster.create(path, nodes=4, encoding="r1", block_size=256 << 10)

    async def put() -> None:
        async with Cluster.open(path) as cluster:
            await cluster.client().write_file("/f", DATA)
            await cluster.client().write_file("/g", DATA[::-1])

    asyncio.run(put())
    return path


ranges = st.lists(
    st.tuples(
        st.sampled_from(["/f", "/g"]), st.integers(0, len(DATA) - 1), st.integers(1, 300_000)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=25, deadline=None)
@given(wants=ranges)
def test_every_caller_gets_its_own_bytes(
    cluster_dir: Path, wants: list[tuple[str, int, int]]
) -> None:
    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            reader = MergedReader(cluster.client())
            bufs = [memoryview(bytearray(n)) for _, _, n in wants]
            got = await asyncio.gather(
                *(reader.read(p, pos, b) for (p, pos, _), b in zip(wants, bufs, strict=True))
            )
            for (path, pos, n), b, k in zip(wants, bufs, got, strict=True):
                src = DATA if path == "/f" else DATA[::-1]
                assert k == min(n, len(src) - pos)
                assert bytes(b[:k]) == src[pos : pos + k]
            assert reader.reads <= len(wants)

    asyncio.run(main())


def test_adjacent_reads_are_one_store_read_and_big_runs_are_split(cluster_dir: Path) -> None:
    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            reader = MergedReader(cluster.client())
            piece = 4096
            bufs = [memoryview(bytearray(piece)) for _ in range(512)]
            await asyncio.gather(*(reader.read("/f", i * piece, b) for i, b in enumerate(bufs)))
            assert reader.reads == 1
            assert b"".join(bytes(b) for b in bufs) == DATA[: 512 * piece]
            # three runs of 1 MiB with the merge limit at 1 MiB
            old, ckpt_reads.MERGE_BYTES = ckpt_reads.MERGE_BYTES, 1 << 20
            reader.reads = 0
            await reader.read("/g", 0, memoryview(bytearray(ckpt_reads.SMALL)))  # not merged
            assert reader.reads == 1
            try:
                reader.reads = 0
                bufs = [memoryview(bytearray(1 << 16)) for _ in range(48)]
                await asyncio.gather(*(reader.read("/g", i << 16, b) for i, b in enumerate(bufs)))
                assert reader.reads == 3
            finally:
                ckpt_reads.MERGE_BYTES = old

    asyncio.run(main())


def test_a_failed_read_fails_every_caller_it_served(cluster_dir: Path) -> None:
    async def main() -> None:
        async with Cluster.open(cluster_dir) as cluster:
            reader = MergedReader(cluster.client())
            bufs = [memoryview(bytearray(100)) for _ in range(3)]
            results = await asyncio.gather(
                *(reader.read("/missing", i * 100, b) for i, b in enumerate(bufs)),
                reader.read("/f", 0, memoryview(bytearray(10))),
                return_exceptions=True,
            )
            assert all(isinstance(r, NotFoundError) for r in results[:3])
            assert results[3] == 10

    asyncio.run(main())
