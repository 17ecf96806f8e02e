"""The client API, case by case: namespace, encodings, writers, fencing, crashes."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from tectonic_emu import (
    AlreadyExistsError,
    Client,
    Cluster,
    ClusterConfig,
    DirectoryNotEmptyError,
    Encoding,
    FencedWriterError,
    InvalidArgumentError,
    InvalidPathError,
    IsADirectoryError_,
    NameTooLongError,
    NotADirectoryError_,
    NotEnoughNodesError,
    NotFoundError,
    SealedFileError,
    UnknownEncodingError,
    WriterClosedError,
)
from tectonic_emu.coding import KNOWN_ENCODINGS

from .conftest import SMALL_BLOCK, run_with


@pytest.mark.parametrize("encoding", KNOWN_ENCODINGS)
def test_round_trip_every_encoding(cluster_dir: Path, encoding: str) -> None:
    enc = Encoding.parse(encoding)

    async def go(c: Cluster) -> list[str]:
        # Every chunk is block_size bytes: a replicated block is one chunk, an RS block D.
        bs = c.config.block_size_for(enc)
        assert bs == SMALL_BLOCK * (enc.data if enc.kind == "rs" else 1)
        data = os.urandom(3 * bs + 12345)  # four blocks, the last one short
        client = c.client()
        await client.write_file("/f", data, encoding=encoding)
        assert await client.read_file("/f") == data
        assert await client.read("/f", bs - 10, 20) == data[bs - 10 : bs + 10]
        assert await client.read("/f", len(data) - 5, 100) == data[-5:]
        assert await client.read("/f", len(data) + 5, 100) == b""
        st = await client.stat("/f")
        assert (st.size, st.encoding, st.sealed, st.nblocks) == (len(data), encoding, True, 4)
        layout = await client.layout("/f")
        assert [(b.offset, b.length) for b in layout] == [
            (0, bs),
            (bs, bs),
            (2 * bs, bs),
            (3 * bs, 12345),
        ]
        paths: list[str] = []
        for block in layout:
            assert len(block.chunks) == enc.width
            nodes = [ch.node for ch in block.chunks]
            assert len(nodes) == len(set(nodes))  # distinct nodes
            assert all(p is not None for p in block.chunk_paths)
            paths.extend(p for p in block.chunk_paths if p is not None)
        for block in layout[:-1]:  # a full block's chunks are each exactly one chunk size
            assert {ch.raw_len for ch in block.chunks} == {SMALL_BLOCK}

        return paths

    paths = run_with(cluster_dir, go)
    assert paths and all(os.path.exists(p) for p in paths)


def test_rs_parity_goes_to_the_nodes_from_page_aligned_memory(
    cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole RS blocks copied into the writer's block buffers reach the nodes page-aligned,
    parity included, so each is written with O_DIRECT straight from it: no node takes its
    bounce buffer (parity used to come from a bytearray, zeroed and not aligned)."""
    from tectonic_emu.chunkstore import _chunkfile

    takes: list[int] = []
    take = _chunkfile._BOUNCE.take
    monkeypatch.setattr(_chunkfile._BOUNCE, "take", lambda: takes.append(1) or take())

    async def go(c: Cluster) -> None:
        bs = c.config.block_size_for(Encoding.parse("rs-6-3"))
        data = os.urandom(2 * bs)
        client = c.client()
        await client.write_file("/f", memoryview(bytearray(data)), encoding="rs-6-3")
        assert await client.read_file("/f") == data
        assert len(await client.layout("/f")) == 2

    run_with(cluster_dir, go)
    assert takes == []


def test_compressible_data_is_compressed_and_reads_back(cluster_dir: Path) -> None:
    data = b"the quick brown fox jumps over the lazy dog\n" * 5000

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/text", data, encoding="r3")
        assert await client.read_file("/text") == data
        chunks = [ch for b in await client.layout("/text") for ch in b.chunks]
        assert all(ch.flags & 1 for ch in chunks)
        assert sum(ch.stored_len for ch in chunks) < len(data)

    run_with(cluster_dir, go)


def test_empty_file(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/empty", b"")
        assert await client.read_file("/empty") == b""
        assert (await client.stat("/empty")).size == 0

    run_with(cluster_dir, go)


def test_namespace_operations(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        client = c.client()
        await client.mkdir("/a/b/c", parents=True)
        await client.mkdir("/a/b/c", parents=True)  # -p: no error
        with pytest.raises(AlreadyExistsError):
            await client.mkdir("/a/b")
        with pytest.raises(NotFoundError):
            await client.mkdir("/x/y")
        await client.write_file("/a/b/f1", b"one")
        await client.write_file("/a/f2", b"two")
        assert await client.listdir("/a") == ["b", "f2"]
        assert await client.listdir("/") == ["a"]
        with pytest.raises(NotADirectoryError_):
            await client.listdir("/a/f2")
        with pytest.raises(NotADirectoryError_):
            await client.write_file("/a/f2/x", b"")
        with pytest.raises(IsADirectoryError_):
            await client.write_file("/a/b", b"")
        with pytest.raises(IsADirectoryError_):
            await client.read_file("/a")
        with pytest.raises(DirectoryNotEmptyError):
            await client.delete("/a")
        # rename replaces a file atomically
        await client.rename("/a/f2", "/a/b/f1")
        assert await client.read_file("/a/b/f1") == b"two"
        assert not await client.exists("/a/f2")
        # a directory moves with its contents; not into itself
        await client.rename("/a/b", "/moved")
        assert await client.read_file("/moved/f1") == b"two"
        with pytest.raises(InvalidArgumentError):
            await client.rename("/a", "/a/inside")
        await client.mkdir("/moved/sub")
        with pytest.raises(InvalidArgumentError):
            await client.rename("/moved", "/moved/sub/deeper")
        with pytest.raises(NotFoundError):
            await client.rename("/nope", "/x")
        await client.delete("/moved", recursive=True)
        assert await client.listdir("/") == ["a"]
        with pytest.raises(InvalidPathError):
            await client.delete("/")
        for bad in ("/a/../b", "/a/./b", "/a\0b"):
            with pytest.raises(InvalidPathError):
                await client.write_file(bad, b"")
        with pytest.raises(NameTooLongError):
            await client.write_file("/" + "x" * 256, b"")
        with pytest.raises(UnknownEncodingError):
            await client.write_file("/bad-enc", b"", encoding="rs-7")

    run_with(cluster_dir, go)


def test_directory_encoding_is_inherited(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        client = c.client()
        await client.mkdir("/ckpt", encoding="rs-9-6")
        await client.mkdir("/ckpt/step1")
        await client.write_file("/ckpt/step1/rank0", b"x" * 1000)
        assert (await client.stat("/ckpt/step1/rank0")).encoding == "rs-9-6"
        await client.write_file("/plain", b"y")
        assert (await client.stat("/plain")).encoding == "rs-6-3"

    run_with(cluster_dir, go)


def test_encoding_wider_than_cluster_is_refused(tmp_path: Path) -> None:
    Cluster.create(tmp_path / "c", nodes=5, encoding="r3", block_size=SMALL_BLOCK)

    async def go(c: Cluster) -> None:
        with pytest.raises(NotEnoughNodesError):
            await c.client().write_file("/f", b"data", encoding="rs-6-3")
        assert await c.client().listdir("/") == []

    run_with(tmp_path / "c", go)


def test_writer_appends_flushes_and_seals(cluster_dir: Path) -> None:
    pieces = [os.urandom(n) for n in (1, 1000, SMALL_BLOCK, 3 * SMALL_BLOCK + 7, 5)]

    async def go(c: Cluster) -> None:
        client = c.client()
        async with client.open_writer("/log", encoding="r3") as w:
            for p in pieces[:3]:
                await w.append(p)
            await w.flush()
            assert await client.read_file("/log") == b"".join(pieces[:3])
            assert not (await client.stat("/log")).sealed
            for p in pieces[3:]:
                await w.append(p)
        assert await client.read_file("/log") == b"".join(pieces)
        assert (await client.stat("/log")).sealed
        with pytest.raises(SealedFileError):
            await client.open_writer("/log")
        with pytest.raises(WriterClosedError):
            await w.append(b"more")

    run_with(cluster_dir, go)


def test_second_writer_fences_the_first(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        client = c.client()
        first = await client.open_writer("/f")
        await first.append(b"a" * 100)
        await first.flush()
        await first.append(b"lost: never flushed")
        second = await client.open_writer("/f")
        with pytest.raises(FencedWriterError, match="another writer"):
            await first.append(b"b")
        with pytest.raises(WriterClosedError):
            await first.flush()
        # the durable prefix of the first writer survives; the second appends after it
        await second.append(b"c" * 10)
        await second.close()
        assert await client.read_file("/f") == b"a" * 100 + b"c" * 10

    run_with(cluster_dir, go)


def test_an_exclusive_writer_creates_or_fails_and_fences_nobody(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        client = c.client()
        first = await client.open_writer("/f", exclusive=True)  # O_CREAT | O_EXCL
        await first.append(b"a")
        for path in ("/f", "/"):
            with pytest.raises((AlreadyExistsError, IsADirectoryError_)):
                await client.open_writer(path, exclusive=True)
        await client.mkdir("/d")
        with pytest.raises(AlreadyExistsError):
            await client.open_writer("/d", exclusive=True)
        with pytest.raises(InvalidArgumentError):
            client.open_writer("/g", exclusive="yes")  # type: ignore[arg-type]
        await first.close()  # not fenced by the attempts
        assert await client.read_file("/f") == b"a"

    run_with(cluster_dir, go)


def test_writer_of_deleted_file_is_fenced(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        client = c.client()
        w = await client.open_writer("/f")
        await w.append(b"x")
        await client.delete("/f")
        with pytest.raises(FencedWriterError):
            await w.flush()

    run_with(cluster_dir, go)


def test_a_block_committed_as_its_writer_is_cancelled_keeps_its_chunks(
    cluster_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancellation that arrives while a block's commit settles is raised once the commit
    has gone through: the block is then part of the file, so its chunks must stay (they
    were deleted, and the file read EIO below the size it reported)."""
    block = os.urandom(SMALL_BLOCK)

    async def go(c: Cluster) -> None:
        client = c.client()
        real = Client.commit_blocks

        async def commit_then_cancelled(
            self: Client, file_id: int, token: str, blocks: Any, **kw: Any
        ) -> None:
            await real(self, file_id, token, blocks, **kw)
            raise asyncio.CancelledError  # as if cancelled while the commit settled

        w = await client.open_writer("/f", encoding="r3")
        monkeypatch.setattr(Client, "commit_blocks", commit_then_cancelled)
        with pytest.raises(asyncio.CancelledError):
            await w.append(block + b"tail")  # one whole block goes out
            await w.flush()
        monkeypatch.setattr(Client, "commit_blocks", real)
        assert (await client.stat("/f")).size == len(block)
        assert await client.read_file("/f") == block

    run_with(cluster_dir, go)
    from tectonic_emu.services import scrub

    assert run_with(cluster_dir, scrub).clean


def test_cancelled_write_leaves_sealed_files_intact(cluster_dir: Path) -> None:
    big = os.urandom(40 * SMALL_BLOCK)

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/keep", b"precious" * 1000)
        await client.write_file("/replaced", b"old contents")
        for delay in (0.0, 0.005, 0.02):
            task = asyncio.create_task(client.write_file("/replaced", big))
            await asyncio.sleep(delay)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            got = await client.read_file("/replaced")
            assert got in (b"old contents", big)
        assert await client.read_file("/keep") == b"precious" * 1000
        # a writer task cancelled mid-append: its durable prefix stays, the file is takeable
        w = await client.open_writer("/stream")
        await w.append(b"durable")
        await w.flush()
        task = asyncio.create_task(w.append(big))
        await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        w2 = await client.open_writer("/stream")
        data = await client.read_file("/stream")
        assert data.startswith(b"durable") and big.startswith(data[7:])
        await w2.close()

    run_with(cluster_dir, go)
    # nothing half-written is referenced: scrub is clean
    from tectonic_emu.services import scrub

    report = run_with(cluster_dir, scrub)
    assert report.clean, report


def test_degraded_write_and_read_with_nodes_down(tmp_path: Path) -> None:
    root = tmp_path / "c"
    Cluster.create(root, nodes=9, encoding="rs-6-3", block_size=SMALL_BLOCK)
    rs_block = ClusterConfig.load(root).block_size_for(Encoding.parse("rs-6-3"))
    data = os.urandom(2 * rs_block)  # two blocks

    async def go(c: Cluster) -> None:
        client = c.client()
        c.stop_node(0)
        c.stop_node(1)
        await client.write_file("/f", data)  # 7 live nodes: degraded but allowed
        assert await client.read_file("/f") == data
        c.stop_node(2)
        with pytest.raises(NotEnoughNodesError):
            await client.write_file("/g", data)
        assert await client.read_file("/f") == data
        st = await c.status()
        assert st.blocks_below_redundancy == 2
        for n in (0, 1, 2):
            c.start_node(n)
        from tectonic_emu.services import repair

        await repair(c, gc_grace=0)
        st = await c.status()
        assert st.blocks_below_redundancy == 0
        assert await client.read_file("/f") == data

    run_with(root, go)


def test_new_version_swaps_in_at_close_and_abort_leaves_the_old(cluster_dir: Path) -> None:
    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/v", b"old bytes")
        w = await client.new_version("/v")
        await w.append(b"new ")
        await w.flush()
        assert await client.read_file("/v") == b"old bytes"  # not visible before close
        await w.append(b"bytes, longer")
        await w.close()
        assert await client.read_file("/v") == b"new bytes, longer"
        assert (await client.stat("/v")).sealed
        w = await client.new_version("/v")
        await w.append(b"never")
        await w.abort()
        assert await client.read_file("/v") == b"new bytes, longer"
        assert sorted(await client.listdir("/")) == ["v"]
        assert [f async for f in c.meta.iter_files() if f.parent is None] == []  # no leftovers

    run_with(cluster_dir, go)


def test_new_contents_land_in_the_file_wherever_it_is_named_and_keep_its_id(
    cluster_dir: Path,
) -> None:
    """``new_contents`` (the mount's O_TRUNC and rewrites): the file keeps its id, mode and
    owners, and is found by id even after a rename; the replaced blocks go, or with
    ``keep_replaced`` stay readable by whoever opened them, under the id returned."""

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/a", b"old bytes" * 10_000)
        await client.chmod("/a", 0o600)
        before = await client.stat("/a")
        old_reader = await client.reader("/a")
        w = await client.new_contents(before.id, path="/a")
        await w.append(b"new")
        await client.rename("/a", "/b")  # while being rewritten
        w.keep_replaced = True
        await w.close()
        after = await client.stat("/b")
        assert (after.id, after.mode, after.size) == (before.id, 0o600, 3)
        assert after.ctime >= before.ctime and after.sealed
        assert await client.read_file("/b") == b"new"
        kept = w.replaced
        assert kept is not None and kept.block_ids == old_reader.block_ids
        assert await old_reader.read(0, 9) == b"old bytes"  # its blocks kept for it
        layout = await client.layout("/b")
        for b in layout:  # the Block layer names the file its blocks moved to
            rec = await c.meta.block(b.block_id)
            assert rec is not None and rec.file_id == before.id
        await client.purge(kept.file_id)
        assert [f async for f in c.meta.iter_files() if f.parent is None] == []
        # without keep_replaced the old blocks are deleted at once; abort leaves all as it was
        w = await client.new_contents(before.id, path="/b")
        await w.append(b"newer")
        await w.close()
        assert w.replaced is None and await client.read_file("/b") == b"newer"
        w = await client.new_contents(before.id, path="/b")
        await w.append(b"never")
        await w.abort()
        assert await client.read_file("/b") == b"newer"
        assert [f async for f in c.meta.iter_files() if f.parent is None] == []
        # the file deleted meanwhile: nothing lands anywhere
        w = await client.new_contents(before.id, path="/b")
        await client.delete("/b")
        with pytest.raises(NotFoundError):
            await w.close()
        await w.abort()
        assert await client.listdir("/") == []

    run_with(cluster_dir, go)
