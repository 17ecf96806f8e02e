"""Holes: File-layer entries with no block behind them (a sparse ``truncate``), at the client.

A hole is committed in one metadata transaction and sends nothing to the nodes; reads of it
return zeros without asking any node (here: with every node stopped). The Block layer, scrub,
repair, garbage collection, deletion, ``status`` and ``layout`` see no block for it. Then the
mount, for real: ``truncate -s 1T`` (a new file, an existing one, with and without an open
handle, ``ftruncate`` through a handle, a staged file) finishes at once and leaves the nodes'
disks as they were.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fuse_mount.sparse import MIN_HOLE, staged_regions
from tectonic_emu import Cluster
from tectonic_emu.config import MAX_SIZE
from tectonic_emu.errors import (
    ArgumentTypeError,
    FencedWriterError,
    FileTooLargeError,
    InvalidArgumentError,
)
from tectonic_emu.metadata.records import HOLE_BLOCK_ID, BlockEntry, FileRecord
from tectonic_emu.reader import ZERO_PIECE
from tectonic_emu.services import garbage_pass, repair, scrub

from .conftest import SMALL_BLOCK, make_cluster, run_with
from .test_fuse import _mounted, watchdog  # noqa: F401 (watchdog: autouse, for the mounts)

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
        # Longer than one piece of zeros (reader.ZERO_PIECE): several pieces, joined in order.
        n = 2 * ZERO_PIECE + 12345
        assert await client.read("/empty-but-holes", 1000, n) == bytes(n)
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


def test_staged_regions_finds_a_sparse_files_holes(tmp_path: Path) -> None:
    """On a real sparse local file: holes of at least MIN_HOLE are holes, shorter ones go with
    the data around them, and the regions cover [0, size) exactly."""
    mib = 1 << 20
    c_at = 3 * mib + (64 << 10)
    with open(tmp_path / "s", "wb") as f:
        fd = f.fileno()
        os.pwrite(fd, b"a" * 4096, 0)
        os.pwrite(fd, b"b" * 4096, 3 * mib)  # after a 3 MiB hole
        os.pwrite(fd, b"c" * 4096, c_at)  # after a short one
        os.ftruncate(fd, 10 * mib)  # a hole at the end
        regions = staged_regions(fd, 10 * mib)
        assert regions == [
            (0, 4096, True),
            (4096, 3 * mib, False),
            (3 * mib, c_at + 4096, True),
            (c_at + 4096, 10 * mib, False),
        ]
        assert staged_regions(fd, 2 * mib) == [(0, 4096, True), (4096, 2 * mib, False)]
        assert staged_regions(fd, 0) == []
        # A hole shorter than the bound at the end is data too.
        assert staged_regions(fd, 4096 + MIN_HOLE - 1) == [(0, 4096 + MIN_HOLE - 1, True)]


# -- the mount -------------------------------------------------------------------------------

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    with _mounted(tmp_path_factory, "holes") as both:
        yield both


@pytest.fixture
def m(mounted: tuple[Path, Path], request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """(the cluster, a directory of this test's own on the mount)."""
    cluster, mnt = mounted
    d = mnt / request.node.name
    d.mkdir()
    return cluster, d


def truncate(path: Path, size: str) -> None:
    """coreutils ``truncate``: opens the file (creating it) and ``ftruncate``s the handle.
    The timeout is a safety net: the bug this covers wrote zeros for minutes."""
    subprocess.run(["truncate", "-s", size, str(path)], check=True, timeout=60)


def read_at(path: Path, offset: int, n: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


def assert_zeros_at(path: Path, *offsets: int) -> None:
    for off in offsets:
        assert read_at(path, off, 1 << 20) == bytes(1 << 20), off


@needs_fuse
def test_truncate_makes_a_1tib_file_that_stores_nothing(m: tuple[Path, Path]) -> None:
    cluster, d = m
    before = node_bytes(cluster)
    truncate(d / "big", "1T")
    st = os.stat(d / "big")
    assert (st.st_size, st.st_blocks) == (TIB, 0)
    assert_zeros_at(d / "big", 0, TIB // 2 + 12345, TIB - (1 << 20))
    assert read_at(d / "big", TIB - 10, 100) == bytes(10)
    assert node_bytes(cluster) == before  # nothing went to the nodes
    # Shrinking works as before (a new version of the first bytes).
    truncate(d / "big", "100K")
    assert (d / "big").read_bytes() == bytes(100 << 10)


@needs_fuse
def test_truncate_extends_an_existing_file_with_a_hole(m: tuple[Path, Path]) -> None:
    cluster, d = m
    data = os.urandom(300_000)
    for name in ("by-truncate", "by-path"):
        (d / name).write_bytes(data)
    before = node_bytes(cluster)
    truncate(d / "by-truncate", "1T")  # through a handle that wrote nothing
    os.truncate(d / "by-path", TIB)  # no handle at all
    for name in ("by-truncate", "by-path"):
        f = d / name
        st = os.stat(f)
        assert st.st_size == TIB
        assert st.st_blocks * 512 < 2 * len(data)  # the data, not the hole
        assert read_at(f, 0, len(data) + 5) == data + bytes(5)
        assert_zeros_at(f, len(data), TIB - (1 << 20))
    # The data was copied into new versions and the old ones deleted: no more than before,
    # within a block's worth of chunks per file.
    assert node_bytes(cluster) <= before + 2 * (2 << 20)
    # Extending a holey file again keeps its hole a hole (nothing of it read or written).
    os.truncate(d / "by-path", 2 * TIB)
    assert os.stat(d / "by-path").st_size == 2 * TIB
    assert read_at(d / "by-path", 0, len(data)) == data
    assert node_bytes(cluster) <= before + 4 * (2 << 20)


@needs_fuse
def test_ftruncate_through_a_streaming_handle(m: tuple[Path, Path]) -> None:
    cluster, d = m
    head, tail = os.urandom(200_000), os.urandom(150_000)
    before = node_bytes(cluster)
    fd = os.open(d / "f", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, head)
        os.ftruncate(fd, TIB)
        assert os.fstat(fd).st_size == TIB
        os.pwrite(fd, tail, TIB)  # at the new end: still streaming
    finally:
        os.close(fd)
    f = d / "f"
    st = os.stat(f)
    assert st.st_size == TIB + len(tail)
    assert st.st_blocks == (len(head) + len(tail) + 511) // 512  # stored bytes, no hole
    assert read_at(f, 0, len(head) + 3) == head + bytes(3)
    assert read_at(f, TIB - 3, len(tail) + 3) == bytes(3) + tail
    assert_zeros_at(f, TIB // 3)
    assert node_bytes(cluster) - before < 4 * (len(head) + len(tail))  # rs-6-3: 1.5x + slack


@needs_fuse
def test_a_staged_file_publishes_its_holes_as_holes(m: tuple[Path, Path]) -> None:
    """A write inside the file stages it locally; the staging file's holes (SEEK_HOLE) are
    published as holes, its data as bytes."""
    cluster, d = m
    data = os.urandom(400_000)
    (d / "f").write_bytes(data)
    before = node_bytes(cluster)
    fd = os.open(d / "f", os.O_RDWR)
    try:
        os.pwrite(fd, b"PATCH", 1000)  # inside: the handle stages the file
        os.ftruncate(fd, TIB)
        os.pwrite(fd, b"end", TIB - 3)
        assert os.pread(fd, 5, 1000) == b"PATCH"
    finally:
        os.close(fd)
    f = d / "f"
    want = data[:1000] + b"PATCH" + data[1005:]
    assert read_at(f, 0, len(data) + 7) == want + bytes(7)
    assert read_at(f, TIB - 10, 10) == bytes(7) + b"end"
    assert_zeros_at(f, TIB // 2)
    assert os.stat(f).st_blocks * 512 < 4 * len(data)
    assert node_bytes(cluster) - before < 8 * len(data)


@needs_fuse
def test_truncate_to_the_largest_size(m: tuple[Path, Path]) -> None:
    """Up to what an off_t holds (MAX_SIZE) is a hole like any other; the kernel refuses more
    (EINVAL) before the mount hears of it, and the client refuses it with EFBIG (above)."""
    _, d = m
    fd = os.open(d / "f", os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, b"x")
        os.ftruncate(fd, MAX_SIZE)
    finally:
        os.close(fd)
    assert os.stat(d / "f").st_size == MAX_SIZE
    assert read_at(d / "f", MAX_SIZE - 100, 100) == bytes(100)  # (pos + count <= off_t)
    assert read_at(d / "f", 0, 2) == b"x\0"


@needs_fuse
def test_patching_a_holey_file_stages_without_filling_its_hole(m: tuple[Path, Path]) -> None:
    """Staging a stored file skips its holes (they stay holes of the local file), so a write
    inside a 1 TiB hole costs its data, not a terabyte of copies."""
    cluster, d = m
    data = os.urandom(100_000)
    (d / "f").write_bytes(data)
    os.truncate(d / "f", TIB)
    before = node_bytes(cluster)
    fd = os.open(d / "f", os.O_WRONLY)
    try:
        os.pwrite(fd, b"middle", TIB // 2)
    finally:
        os.close(fd)
    f = d / "f"
    assert os.stat(f).st_size == TIB
    assert read_at(f, 0, len(data)) == data
    assert read_at(f, TIB // 2 - 2, 10) == bytes(2) + b"middle" + bytes(2)
    assert_zeros_at(f, TIB // 4, TIB - (1 << 20))
    assert node_bytes(cluster) - before < 8 * (len(data) + (1 << 20))
