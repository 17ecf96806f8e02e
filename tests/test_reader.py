"""``FileReader``: reads of one file version with its block map held."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu import Cluster, InvalidArgumentError, IsADirectoryError_, NotFoundError
from tectonic_emu.reader import RECORD_BATCH
from tectonic_emu.services.repair import repair

from .conftest import SMALL_BLOCK, make_cluster, run_with

BLOCKS = RECORD_BATCH + 8  # more blocks than one batch of records
DATA = os.urandom(BLOCKS * SMALL_BLOCK + 777)


@pytest.fixture(scope="module")
def r3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_cluster(tmp_path_factory.mktemp("reader") / "c", nodes=6, encoding="r3")

    async def put(c: Cluster) -> None:
        await c.client().write_file("/f", DATA)

    run_with(root, put)
    return root


@given(
    reads=st.lists(
        st.tuples(st.integers(0, len(DATA) + 10), st.integers(0, 5 * SMALL_BLOCK)),
        min_size=1,
        max_size=12,
    )
)
def test_reads_at_any_offset_and_size_match_the_file(
    r3_dir: Path, reads: list[tuple[int, int]]
) -> None:
    async def go(c: Cluster) -> None:
        reader = await c.client().reader("/f")
        assert reader.size == len(DATA)

        async def one(offset: int, size: int) -> None:
            buf = bytearray(size)
            n = await reader.read_into(offset, buf)
            assert bytes(buf[:n]) == DATA[offset : offset + size]

        await asyncio.gather(*(one(o, s) for o, s in reads))  # concurrently, like the mount

    run_with(r3_dir, go)


def test_records_are_fetched_in_batches_once(r3_dir: Path) -> None:
    async def go(c: Cluster) -> int:
        client = c.client()
        reader = await client.reader("/f")
        views = 0
        real = client.meta.view

        def counting():  # type: ignore[no-untyped-def]
            nonlocal views
            views += 1
            return real()

        client.meta.view = counting  # type: ignore[method-assign]
        buf = bytearray(SMALL_BLOCK)
        for offset in range(0, len(DATA), SMALL_BLOCK):
            await reader.read_into(offset, buf)
        await reader.read_into(0, buf)  # held: no lookup
        return views

    # BLOCKS + 1 blocks: one batch of RECORD_BATCH, then the rest.
    assert run_with(r3_dir, go) == 2


def test_a_reader_keeps_the_version_it_opened(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3")

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", b"old bytes")
        reader = await client.reader("/f")
        await client.write_file("/g", b"new")
        await client.rename("/g", "/f", keep_replaced=True)  # the old version stays readable
        buf = bytearray(100)
        assert bytes(buf[: await reader.read_into(0, buf)]) == b"old bytes"
        assert await reader.read_into(9, buf) == 0
        with pytest.raises(InvalidArgumentError):
            await reader.read_into(-1, buf)
        with pytest.raises(IsADirectoryError_):
            await client.reader("/")
        with pytest.raises(NotFoundError):
            await client.reader("/missing")

    run_with(root, go)


def test_a_read_after_repair_moved_every_replica_looks_the_record_up_again(
    tmp_path: Path,
) -> None:
    """The reader holds a block record whose three chunks are all gone (each lost and rebuilt
    elsewhere by repair, one at a time): the read fails on them, looks the record up afresh
    and returns the right bytes."""
    root = make_cluster(tmp_path / "c", nodes=6, encoding="r3")
    data = os.urandom(SMALL_BLOCK)

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", data)
        reader = await client.reader("/f")
        buf = bytearray(len(data))
        assert await reader.read_into(0, buf) == len(data)  # the record is held now
        held = (await client.layout("/f"))[0]
        for chunk in held.chunks:  # one replica lost at a time, rebuilt by repair
            node = c.nodes[chunk.node]
            os.unlink(node.chunk_path(chunk.disk, chunk.chunk_id))  # type: ignore[attr-defined]
            await repair(c, gc_grace=0)
        now = (await client.layout("/f"))[0]
        assert not {x.chunk_id for x in now.chunks} & {x.chunk_id for x in held.chunks}
        buf[:] = bytes(len(data))
        assert await reader.read_into(0, buf) == len(data)
        assert bytes(buf) == data

    run_with(root, go)


def test_a_deleted_file_is_not_found(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r3")

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", os.urandom(3 * SMALL_BLOCK))
        reader = await client.reader("/f")
        await client.delete("/f")
        with pytest.raises(NotFoundError):
            await reader.read_into(0, bytearray(10))

    run_with(root, go)
