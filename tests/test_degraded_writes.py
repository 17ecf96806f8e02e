"""Degraded writes at quorum (issue 19): with fewer live nodes than a block has chunks, a block
is written with the chunks distinct nodes can take, down to data chunks + 1 (RS), 2 (r3), 1
(r1); it is acknowledged there, counted below redundancy, and repair completes it once nodes
come back. Below the minimum the error names both numbers. Served, for real: a 9-node rs-6-3
cluster (one disk a node) keeps taking puts and streaming writers with 2 node processes
SIGKILLed, and repair returns it to full redundancy once they are started again.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tectonic_emu import Cluster, ClusterConfig, Encoding
from tectonic_emu.chunkstore.base import StorageNode
from tectonic_emu.chunkstore.faults import FaultyNode
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import InvalidArgumentError, NotEnoughNodesError
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.placement import spread_is_short
from tectonic_emu.served import Serving
from tectonic_emu.services import repair, scrub

from .conftest import SMALL_BLOCK, make_cluster, run_with
from .served_writer import acknowledged, stream
from .test_cli import ok, ok_json
from .test_served import RS_BLOCK, below_redundancy, kill_nodes, read, start_nodes, until, writers


def one_disk(root: Path, *, nodes: int, encoding: str) -> Path:
    return make_cluster(root, nodes=nodes, encoding=encoding, disks_per_node=1)


@pytest.mark.parametrize(
    ("encoding", "nodes", "down", "chunks"),
    [("rs-6-3", 9, 2, 7), ("rs-6-3", 9, 1, 8), ("r3", 3, 1, 2)],
)
def test_a_degraded_write_is_acknowledged_counted_and_completed_by_repair(
    tmp_path: Path, encoding: str, nodes: int, down: int, chunks: int
) -> None:
    root = one_disk(tmp_path / "c", nodes=nodes, encoding=encoding)
    data = os.urandom(3 * SMALL_BLOCK * 6 + 999)

    async def go(c: Cluster) -> None:
        client = c.client()
        for n in range(down):
            c.stop_node(n)
        await client.write_file("/f", data)
        layout = await client.layout("/f")
        assert all(len(b.chunks) == chunks for b in layout)
        assert all(len({ch.node for ch in b.chunks}) == chunks for b in layout)
        assert await client.read_file("/f") == data
        assert (await c.status()).blocks_below_redundancy == len(layout)
        for n in range(down):
            c.start_node(n)
        fixed = await repair(c, gc_grace=0)
        assert fixed.blocks_repaired == len(layout) and not fixed.not_enough_nodes
        assert (await c.status()).blocks_below_redundancy == 0
        assert (await scrub(c)).clean
        assert await client.read_file("/f") == data

    run_with(root, go)


@pytest.mark.parametrize(
    ("encoding", "nodes", "down", "have", "need"),
    [("rs-6-3", 9, 3, 6, 7), ("r3", 3, 2, 1, 2), ("r1", 2, 2, 0, 1)],
)
def test_below_the_minimum_the_error_names_both_numbers(
    tmp_path: Path, encoding: str, nodes: int, down: int, have: int, need: int
) -> None:
    root = one_disk(tmp_path / "c", nodes=nodes, encoding=encoding)

    async def go(c: Cluster) -> None:
        for n in range(down):
            c.stop_node(n)
        with pytest.raises(NotEnoughNodesError) as e:
            await c.client().write_file("/f", b"x" * 1000)
        assert f"needs {need} live nodes" in str(e.value) and f"{have} of {nodes}" in str(e.value)
        assert not await c.client().exists("/f")

    run_with(root, go)


def test_a_chunk_whose_node_dies_mid_write_is_given_up_not_the_block(tmp_path: Path) -> None:
    """Issue 19's failure: on 9 one-disk nodes, one node failing during a put failed it
    (``8 usable live nodes cannot take 9 more chunks``). Now the block goes through on 8."""
    root = one_disk(tmp_path / "c", nodes=9, encoding="rs-6-3")
    data = os.urandom(RS_BLOCK)

    async def go(c: Cluster) -> None:
        faulty = FaultyNode(c.nodes[4])
        faulty.fail_writes = 1
        c.nodes[4] = faulty
        client = c.client()
        await client.write_file("/f", data)
        (block,) = await client.layout("/f")
        assert len(block.chunks) == 8 and 4 not in {ch.node for ch in block.chunks}
        assert await client.read_file("/f") == data
        assert (await repair(c, gc_grace=0)).blocks_repaired == 1
        assert (await c.status()).blocks_below_redundancy == 0

    run_with(root, go)


def test_the_minimum_is_configurable(tmp_path: Path) -> None:
    root = one_disk(tmp_path / "c", nodes=9, encoding="rs-6-3")

    async def go(c: Cluster) -> None:
        c.stop_node(0)
        c.stop_node(1)
        c.datapath.write_margin = 3  # the parity count: no degraded writes at all
        assert c.datapath.min_live_nodes(Encoding.parse("rs-6-3")) == 9
        with pytest.raises(
            NotEnoughNodesError, match="needs 9 live nodes to write a block; 7 of 9 are up"
        ):
            await c.client().write_file("/f", b"y" * 1000)
        c.datapath.write_margin = 1  # the default: 7 chunks will do
        await c.client().write_file("/f", b"y" * 1000)
        for bad in (0, -1, 1.5, True):
            with pytest.raises(InvalidArgumentError, match="write_margin"):
                c.datapath.write_margin = bad  # type: ignore[assignment]

    run_with(root, go)


def test_served_rs_6_3_on_9_nodes_takes_writes_with_2_nodes_killed(tmp_path: Path) -> None:
    """The target: two node processes SIGKILLed while writer processes stream and puts run;
    every put succeeds and every acknowledged byte reads back; status counts the blocks
    written meanwhile as below redundancy; once the nodes are started again, repair brings
    every block back to full redundancy."""
    root = one_disk(tmp_path / "c", nodes=9, encoding="rs-6-3")
    stop = tmp_path / "stop"
    put_data = {i: random.Random(i).randbytes(RS_BLOCK + 1000 * i) for i in range(3)}
    with Serving(root, repair_interval=0):
        with writers(root, tmp_path, 2, stop=stop) as (procs, progress):
            until(lambda: all(acknowledged(p)[0] >= 4 for p in progress), "writers flushed")
            kill_nodes(root, [2, 6])
            at_kill = [acknowledged(p)[0] for p in progress]
            for i, data in put_data.items():
                local = tmp_path / f"put{i}"
                local.write_bytes(data)
                ok("put", str(local), f"/put{i}", cluster=root)
            until(
                lambda: all(
                    acknowledged(p)[0] >= k + 6 for p, k in zip(progress, at_kill, strict=True)
                ),
                "writers flushed with two nodes down",
            )
            stop.touch()
            for proc in procs:
                assert proc.wait(120) == 0
            done = [acknowledged(p) for p in progress]
        for i, data in put_data.items():
            assert read(root, f"/put{i}") == data
        for i, (records, _, closed) in enumerate(done):
            assert closed and read(root, f"/w{i}") == stream(i, records)
        status = ok_json("cluster", "status", cluster=root)
        assert status["blocks_below_redundancy"] >= len(put_data)

        start_nodes(root, [2, 6])
        fixed = ok_json("repair", "--gc-grace", "0", cluster=root)
        assert fixed["unrecoverable"] == [] and fixed["not_enough_nodes"] == []
        assert below_redundancy(root) == 0
        assert ok_json("scrub", cluster=root)["clean"]
        for i, data in put_data.items():
            assert read(root, f"/put{i}") == data


@dataclass(frozen=True)
class Hosts:
    """The cluster as a StoreView whose data path knows each node's host (as a cluster
    across hosts does, from its node addresses): the same nodes and metadata."""

    config: ClusterConfig
    meta: Metadata
    datapath: DataPath
    nodes: Sequence[StorageNode]


def test_chunks_crowding_one_host_count_below_redundancy_and_repair_spreads_them(
    tmp_path: Path,
) -> None:
    """Issue 8's note: two chunks of a block on one host are below redundancy when the hosts
    allow better. Written while host c was down, a block crowds hosts a and b (4 + 4 chunks);
    once c is back, repair completes it and then moves chunks until each host holds 3."""
    root = one_disk(tmp_path / "c", nodes=12, encoding="rs-6-3")
    hosts = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    data = os.urandom(2 * RS_BLOCK)

    async def go(c: Cluster) -> None:
        for n in range(8, 12):
            c.stop_node(n)
        client = c.client()
        await client.write_file("/f", data)
        with ThreadPoolExecutor(2) as cpu:
            dp = DataPath(
                c.nodes,
                disks_per_node=1,
                compression=c.datapath.compression,
                cpu=cpu,
                domains=hosts,
            )
            view = Hosts(c.config, c.meta, dp, c.nodes)
            for n in range(8, 12):
                c.start_node(n)
            for b in await client.layout("/f"):
                assert spread_is_short([ch.node for ch in b.chunks], hosts)
            for _ in range(2):  # complete the block, then spread it
                await repair(view, gc_grace=0)
            for b in await client.layout("/f"):
                per = Counter(hosts[ch.node] for ch in b.chunks)
                assert per == {"a": 3, "b": 3, "c": 3}, per
                assert len({ch.node for ch in b.chunks}) == 9
                assert not spread_is_short([ch.node for ch in b.chunks], hosts)
            assert (await repair(view, gc_grace=0)).blocks_repaired == 0  # settled
        assert await client.read_file("/f") == data
        assert (await scrub(c)).clean
        assert (await c.status()).blocks_below_redundancy == 0

    run_with(root, go)


@pytest.mark.parametrize("encoding", ["rs-3-3", "rs-6-3"])
def test_repair_copies_a_chunk_sharing_a_node_when_only_enough_chunks_are_left(
    tmp_path: Path, encoding: str
) -> None:
    """A block left with exactly its data chunks, two of them on one node, is rebuilt: the
    chunk to move is good and is a source for the lost ones (CI of 9a6190b: after every node
    of a served rs-3-3 cluster was killed mid-stream, repair excluded it and found 2 of 3)."""
    root = one_disk(tmp_path / "c", nodes=10, encoding=encoding)
    data = os.urandom(SMALL_BLOCK - 5)
    enc = Encoding.parse(encoding)

    async def go(c: Cluster) -> None:
        client = c.client()
        await client.write_file("/f", data)
        (layout,) = await client.layout("/f")
        async with c.meta.transaction() as m:
            rec = await m.blocks.get(layout.block_id)
        assert rec is not None
        last, first = rec.chunks[-1], rec.chunks[0]  # move the last chunk onto the first's node
        payload, info = await c.nodes[last.node].read_chunk(last.disk, last.chunk_id)
        await c.nodes[first.node].write_chunk(
            first.disk, last.chunk_id, payload, crc32c=info.crc32c, flags=info.flags
        )
        await c.nodes[last.node].delete_chunk(last.disk, last.chunk_id)
        crowded = replace(last, node=first.node, disk=first.disk)
        keep = {first.index, last.index} | set(range(1, enc.min_chunks - 1))
        for ch in rec.chunks:  # leave min_chunks distinct chunks, two on one node
            if ch.index not in keep:
                await c.nodes[ch.node].delete_chunk(ch.disk, ch.chunk_id)
        assert len(keep) == enc.min_chunks
        chunks = tuple(crowded if ch is last else ch for ch in rec.chunks)
        async with c.meta.transaction() as m:
            await m.blocks.put(replace(rec, chunks=chunks), old=rec)
        fixed = await repair(c, gc_grace=0)
        assert (fixed.blocks_repaired, fixed.unrecoverable) == (1, [])
        (after,) = await client.layout("/f")
        assert len({ch.node for ch in after.chunks}) == enc.width
        assert await client.read_file("/f") == data
        assert (await scrub(c)).clean

    run_with(root, go)


def test_a_spread_is_short_only_when_a_move_would_help() -> None:
    two = ["a"] * 5 + ["b"] * 5
    assert not spread_is_short([0, 1, 2, 3, 4, 5, 6, 7, 8], two)  # 5 + 4: the best there is
    assert spread_is_short([0, 1, 2, 3, 4, 5, 6], two)  # 5 + 2: one more on b helps
    assert not spread_is_short([0, 1, 2, 3, 4, 5, 6], two, usable=range(7))  # b's rest down
    uneven = ["a"] * 4 + ["b"] * 4 + ["c"]  # host c has one node: 4 + 4 + 1 is the best
    assert not spread_is_short(list(range(9)), uneven)
    assert not spread_is_short([0, 1, 2], None)
    assert not spread_is_short([0, 1, 2], ["a", "a", "a", "a"])  # one host: nothing better
