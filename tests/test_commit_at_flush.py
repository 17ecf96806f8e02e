"""Writers that commit at flush (issue 22): ``open_writer(commit_at_flush=True)`` and every
``VersionWriter``. Their chunks go out unsynced; a flush syncs each node disk they are on
once, then commits every block in one transaction. The power-cut tests
(``test_powercut.py``) check what survives a crash; these check the rest of the contract:
what readers see, how many syncs, and what an abort, a fence or a full pipeline leaves."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tectonic_emu import Cluster
from tectonic_emu.chunkstore import FaultyNode
from tectonic_emu.errors import FencedWriterError
from tectonic_emu.pipeline import MAX_UNCOMMITTED
from tectonic_emu.services.garbage import garbage_pass

from .conftest import SMALL_BLOCK, make_cluster, run_with


def counted(c: Cluster) -> list[FaultyNode]:
    """Wrap the cluster's nodes so that their calls are counted (``FaultyNode.calls``)."""
    wrapped = [FaultyNode(n) for n in c.nodes]
    c.datapath._writer.nodes = wrapped
    return wrapped


def calls(nodes: list[FaultyNode], method: str) -> int:
    return sum(n.calls[method] for n in nodes)


@pytest.mark.parametrize("encoding", ["r3", "rs-3-2"])
def test_blocks_are_seen_at_the_flush_with_one_sync_per_node_disk(
    tmp_path: Path, encoding: str
) -> None:
    root = make_cluster(tmp_path / "c", nodes=6, encoding=encoding)
    data = os.urandom(10 * SMALL_BLOCK + 77)

    async def go(c: Cluster) -> None:
        nodes = counted(c)
        client = c.client()
        w = await client.open_writer("/f", commit_at_flush=True)
        await w.append(data)
        await asyncio.sleep(0.05)  # whole blocks have gone out meanwhile
        assert (await client.stat("/f")).size == 0  # written, not committed
        writes = calls(nodes, "write_chunk")
        assert writes > 0
        await w.flush()
        assert (await client.stat("/f")).size == len(data)
        assert await client.read_file("/f") == data
        # One sync per node disk, not per chunk; the last block, written by the flush
        # itself, went out synced (its disks would have been synced at once anyway).
        layout = await client.layout("/f")
        disks = {(ch.node, ch.disk) for b in layout[:-1] for ch in b.chunks}
        assert calls(nodes, "sync_disk") == len(disks)
        assert sum(len(b.chunks) for b in layout[:-1]) > len(disks)
        await w.close()
        assert (await client.stat("/f")).sealed
        assert [i async for i in c.meta.iter_intents()] == []

    run_with(root, go)


def test_an_abort_leaves_no_chunk_and_no_claim(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r2")

    async def go(c: Cluster) -> None:
        client = c.client()
        w = await client.open_writer("/f", commit_at_flush=True)
        await w.append(os.urandom(SMALL_BLOCK))
        await w.flush()
        await w.append(os.urandom(5 * SMALL_BLOCK))
        await w.abort()
        assert (await client.stat("/f")).size == SMALL_BLOCK  # the flushed block stays
        assert [i async for i in c.meta.iter_intents()] == []
        report = await garbage_pass(c, grace=0)
        assert report.deleted == 0 and report.block_chunks == report.referenced == 2

    run_with(root, go)


def test_a_writer_fenced_before_its_flush_commits_nothing(tmp_path: Path) -> None:
    root = make_cluster(tmp_path / "c", nodes=4, encoding="r2")
    first = os.urandom(2 * SMALL_BLOCK)

    async def go(c: Cluster) -> None:
        client = c.client()
        w = await client.open_writer("/f", commit_at_flush=True)
        await w.append(first)
        newer = await client.open_writer("/f")  # takes the file over
        with pytest.raises(FencedWriterError):
            await w.flush()
        await newer.append(b"tail")
        await newer.close()
        assert await client.read_file("/f") == b"tail"
        report = await garbage_pass(c, grace=0)
        assert report.deleted == 0, "the fenced writer's chunks were left behind"
        assert report.block_chunks == report.referenced

    run_with(root, go)


def test_a_long_write_without_flushes_commits_as_it_goes(tmp_path: Path) -> None:
    """Past ``MAX_UNCOMMITTED`` blocks written, ``submit`` commits them (their disks synced
    first) without waiting for a flush: the claims held, and what a crash loses, stay
    bounded."""
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r1")
    blocks = MAX_UNCOMMITTED + 8

    async def go(c: Cluster) -> None:
        client = c.client()
        w = await client.open_writer("/f", commit_at_flush=True)
        most = 0
        for _ in range(blocks):
            await w.append(os.urandom(SMALL_BLOCK))
            most = max(most, len([i async for i in c.meta.iter_intents()]))
        seen = (await client.stat("/f")).size
        assert MAX_UNCOMMITTED * SMALL_BLOCK <= seen < blocks * SMALL_BLOCK
        assert most <= MAX_UNCOMMITTED + c.client().write_depth + 1
        await w.close()
        assert (await client.stat("/f")).size == blocks * SMALL_BLOCK

    run_with(root, go)


def test_versions_and_checkpoints_write_unsynced_but_for_a_flush_s_tail(
    tmp_path: Path,
) -> None:
    """``write_file`` (a ``VersionWriter``) and a checkpoint's data files go the same way:
    whole blocks unsynced, only a last partial block, written by the flush, synced."""
    import numpy as np

    from clients.checkpoint import Checkpointer

    root = make_cluster(tmp_path / "c", nodes=6, encoding="r3")

    async def go(c: Cluster) -> None:
        nodes = counted(c)
        client = c.client()
        seen: Counter[bool] = Counter()
        for n in nodes:
            real = n.inner.write_chunk

            async def write(*a: Any, _real: Any = real, **kw: Any) -> None:
                seen[bool(kw.get("sync", True))] += 1
                await _real(*a, **kw)

            n.inner.write_chunk = write  # type: ignore[method-assign]
        await client.write_file("/whole", os.urandom(3 * SMALL_BLOCK))
        assert seen == {False: 9}  # three blocks of r3
        await client.write_file("/tail", os.urandom(2 * SMALL_BLOCK + 5))
        assert seen == {False: 15, True: 3}
        assert calls(nodes, "sync_disk") <= 6 * 2 * 2  # nodes x disks, per file at most
        ck = Checkpointer(client, "/ck", world_size=2, encoding="r3")
        state = {"w": np.frombuffer(os.urandom(5 * SMALL_BLOCK), dtype=np.uint8)}
        await asyncio.gather(ck.save(1, 0, state), ck.save(1, 1, state))
        assert seen[False] > 15
        got = await ck.load(0, step=1)
        assert bytes(got["w"]) == bytes(state["w"])

    run_with(root, go)


def test_nodes_down_before_the_flush_have_their_chunks_made_again_elsewhere(
    tmp_path: Path,
) -> None:
    """Two of a block's three replicas were written unsynced to nodes that went down
    before the flush: their syncs fail, so the block is short of its minimum on synced
    disks; the flush makes those chunks again from the synced one, on live nodes, and the
    file commits whole (as a chunk write to a failed node is placed again)."""
    root = make_cluster(tmp_path / "c", nodes=6, encoding="r3")
    data = os.urandom(2 * SMALL_BLOCK)

    async def go(c: Cluster) -> None:
        nodes = counted(c)
        client = c.client()
        w = await client.open_writer("/f", commit_at_flush=True)
        await w.append(data)  # two whole blocks, written unsynced
        for _ in range(100):
            if calls(nodes, "write_chunk") == 6:
                break
            await asyncio.sleep(0.01)
        holders: dict[str, list[int]] = {}  # block id -> nodes holding its chunks
        for n in c.nodes:
            for d in range(n.disks):
                for info in await n.list_chunks(d):
                    holders.setdefault(info.chunk_id.split(".")[0], []).append(n.node_id)
        block, on = sorted(holders.items())[0]
        for n in on[:2]:
            c.stop_node(n)
        await w.close()
        assert await client.read_file("/f") == data
        for b in await client.layout("/f"):
            live = {ch.node for ch in b.chunks} - set(on[:2])
            if f"{b.block_id:016x}" == block:
                assert len(live) == 3 and len(b.chunks) == 3  # made again, elsewhere
            else:
                assert len(live) >= 2  # at worst one replica to repair, as a degraded write

    run_with(root, go)
