"""Holes: File-layer entries with no block behind them (a sparse ``truncate``), at the client.

A hole is committed in one metadata transaction and sends nothing to the nodes; reads of it
return zeros without asking any node (here: with every node stopped). The Block layer, scrub,
repair, garbage collection, deletion, ``status`` and ``layout`` see no block for it. The mount's
side is in ``test_fuse_holes.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tectonic_emu import Cluster
from tectonic_emu.config import MAX_SIZE
from tectonic_emu.errors import (
    ArgumentTypeError,
    FencedWriterError,
    FileTooLargeError,
    InvalidArgumentError,
)
from tectonic_emu.metadata.records import HOLE_BLOCK_ID, BlockEntry, FileRecord
from tectonic_emu.services import garbage_pass, repair, scrub

from .conftest import SMALL_BLOCK, make_cluster, run_with

TIB = 1 << 40


def node_bytes(cluster: Path) -> int:
    """Bytes the nodes' disks hold (allocated, so a sparse file would not hide any)."""
    total = 0
    for dirpath, _, files in os.walk(cluster / "nodes"):
        for f in files:
            total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


async def chunk_count(c: Cluster) -> int:
    return sum([len(rec.chunks) async for rec in c.meta.iter_blocks()])


def test_a_hole_between_data_reads_as_zeros_and_stores_nothing(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c")
    head, tail = os.urandom(100_000), os.urandom(70_000)

    async def go(c: Cluster) -> None:
        client = c.client()
        async with client.open_writer("/f") as w:
            await w.append(head)
            await w.flush()
            chunks = await chunk_count(c)
            await w.append_hole(TIB)
            # Nothing went to the nodes, and the hole is visible (committed) at once.
            assert await chunk_count(c) == chunks
            assert (await client.stat("/f")).size == len(head) + TIB
            await w.append(tail)
        size = len(head) + TIB + len(tail)
        st = await client.stat("/f")
        assert (st.size, st.holes, st.sealed) == (size, TIB, True)
        assert await client.read("/f", 0, len(head)) == head
        assert await client.read("/f", size - len(tail), len(tail)) == tail
        # Across both edges of the hole, and in its middle.
        assert await client.read("/f", len(head) - 3, 6) == head[-3:] + bytes(3)
        assert await client.read("/f", size - len(tail) - 3, 6) == bytes(3) + tail[:3]
        buf = bytearray(b"x" * (3 << 20))
        assert await client.read_into("/f", TIB // 2, buf) == len(buf)
        assert buf == bytes(len(buf))
        reader = await client.reader("/f")
        assert reader.data_ranges() == [(0, len(head)), (size - len(tail), size)]
        buf = bytearray(b"x" * 4096)
        assert await reader.read_into(TIB - 1000, buf) == 4096
        assert buf == bytes(4096)
        layout = await client.layout("/f")
        holes = [b for b in layout if b.hole]
        assert [(b.offset, b.length, b.chunks, b.block_id) for b in holes] == [
            (len(head), TIB, (), HOLE_BLOCK_ID)
        ]
        status = await c.status()
        assert status.logical_bytes == size  # a hole counts in the file's size
        assert status.blocks == len(layout) - 1  # and is no block

    run_with(root, go)


def test_reads_of_a_hole_ask_no_node(tmp_path: Path) -> None:
    """With every node stopped, a read that touches only the hole still succeeds."""
    root = make_cluster(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        async with client.open_writer("/f") as w:
            await w.append(b"head")
            await w.append_hole(10 * SMALL_BLOCK)
        for node in range(c.config.nodes):
            c.stop_node(node)
        assert await client.read("/f", 4, 5 * SMALL_BLOCK) == bytes(5 * SMALL_BLOCK)
        reader = await client.reader("/f")
        buf = bytearray(b"x" * 100)
        assert await reader.read_into(1000, buf) == 100
        assert buf == bytes(100)

    run_with(root, go)


def test_holes_alone_and_holes_in_a_row(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        before = node_bytes(root)
        async with client.open_writer("/empty-but-holes") as w:
            await w.append_hole(5)
            await w.append_hole(TIB)
            assert w.holes == TIB + 5 and w.offset == TIB + 5
        assert node_bytes(root) == before
        st = await client.stat("/empty-but-holes")
        assert (st.size, st.holes, st.nblocks) == (TIB + 5, TIB + 5, 2)
        assert await client.read("/empty-but-holes", TIB, 100) == bytes(5)
        assert await client.read("/empty-but-holes", TIB + 5, 100) == b""
        # A version writer (an overwrite) takes holes too.
        v = await client.new_version("/v")
        await v.append(b"abc")
        await v.append_hole(SMALL_BLOCK)
        await v.close()
        assert await client.read_file("/v") == b"abc" + bytes(SMALL_BLOCK)

    run_with(root, go)


def test_bad_holes_are_refused_and_the_writer_goes_on(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        async with client.open_writer("/f") as w:
            await w.append(b"12345")
            with pytest.raises(FileTooLargeError, match="largest file size") as e:
                await w.append_hole(MAX_SIZE)
            assert e.value.errno == 27  # EFBIG
            with pytest.raises(InvalidArgumentError, match="at least 1"):
                await w.append_hole(0)
            with pytest.raises(ArgumentTypeError, match="length must be an int"):
                await w.append_hole(1.5)  # type: ignore[arg-type]
            await w.append_hole(MAX_SIZE - 10)  # up to the bound is fine
            assert w.offset == MAX_SIZE - 5
        st = await client.stat("/f")
        assert st.size == MAX_SIZE - 5
        assert await client.read("/f", MAX_SIZE - 20, 100) == bytes(15)
        assert await client.read("/f", 0, 5) == b"12345"

    run_with(root, go)


def test_a_fenced_writer_commits_no_hole(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c")

    async def go(c: Cluster) -> None:
        client = c.client()
        old = await client.open_writer("/f")
        await old.append(b"old")
        await old.flush()
        new = await client.open_writer("/f")  # takes the token
        with pytest.raises(FencedWriterError):
            await old.append_hole(TIB)
        await new.close()
        st = await client.stat("/f")
        assert (st.size, st.holes) == (3, 0)

    run_with(root, go)


def test_services_and_deletion_leave_holes_alone(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c")
    data = os.urandom(3 * SMALL_BLOCK * 6)

    async def go(c: Cluster) -> None:
        client = c.client()
        async with client.open_writer("/f") as w:
            await w.append(data)
            await w.append_hole(TIB)
            await w.append(data)
        chunks = await chunk_count(c)
        report = await scrub(c)
        assert report.clean and report.chunks == chunks
        # Lose a chunk of each block: repair rebuilds them, and has nothing to do for the hole.
        lost = [b.chunk_paths[0] for b in await client.layout("/f") if not b.hole]
        for p in lost:
            assert p is not None
            os.unlink(p)
        rep = await repair(c, gc_grace=0)
        assert rep.chunks_rebuilt == len(lost) == 6 and not rep.unrecoverable
        assert rep.blocks_checked == 6
        gc = await garbage_pass(c, grace=0)
        assert gc.deleted == gc.nameless_files_dropped == 0
        assert await client.read("/f", 0, len(data)) == data
        assert await client.read("/f", len(data) + TIB, len(data)) == data
        assert await client.read("/f", len(data), 1000) == bytes(1000)
        await client.delete("/f")
        assert await chunk_count(c) == 0
        assert (await garbage_pass(c, grace=0)).block_chunks == 0  # every chunk deleted

    run_with(root, go)


def test_records_keep_holes_and_read_records_without_them() -> None:
    entry = BlockEntry(3, HOLE_BLOCK_ID, 10, TIB)
    assert entry.is_hole and BlockEntry.decode(3, entry.encode()) == entry
    assert not BlockEntry(3, 99, 10, 5).is_hole
    rec = FileRecord(7, "r3", TIB, 1, True, None, 1, "f", 1.0, 2.0, holes=TIB)
    assert FileRecord.decode(7, rec.encode()) == rec
    # A record written before holes existed has no "h": it reads as holeless.
    old = FileRecord(7, "r3", 5, 1, True, None, 1, "f", 1.0, 2.0)
    assert b'"h"' not in old.encode() and FileRecord.decode(7, old.encode()).holes == 0
