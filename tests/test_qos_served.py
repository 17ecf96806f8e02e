"""TrafficGroups on served nodes: the group travels in each frame, the node's fair queue
serves gold ahead of queued bronze work (and does not without fairness), each group is
counted, and the counts reach ``cluster status --json`` and Prometheus."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tectonic_emu import Cluster, qos
from tectonic_emu.chunkstore import wire
from tectonic_emu.chunkstore.netem import LinkModel, Pacer
from tectonic_emu.chunkstore.remote import RemoteNode, fixed_address
from tectonic_emu.chunkstore.wire import FrameError
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.served import Serving

from .conftest import SMALL_BLOCK
from .node_thread import SECRET, ThreadedNodeServer
from .test_cli import fails, ok, ok_json

GOLD = qos.TrafficGroup("loader", "gold")
BRONZE = qos.TrafficGroup("ckpt", "bronze")
CHUNK = b"x" * (64 << 10)


def test_the_group_travels_at_the_end_of_the_meta() -> None:
    meta, n = wire.with_group(b"\x01\x00chunk", BRONZE)
    assert n == len(b"ckpt:bronze:1") and meta.endswith(b"ckpt:bronze:1")
    assert wire.split_group(n, meta) == (BRONZE, b"\x01\x00chunk")
    assert wire.with_group(b"m", qos.DEFAULT) == (b"m", 0)
    assert wire.split_group(0, b"m") == (qos.DEFAULT, b"m")
    for status, meta in ((20, b"short"), (13, b"\x01\x00ckpt:bronzy:1"), (200, b"x" * 300)):
        with pytest.raises(FrameError):
            wire.split_group(status, meta)


@pytest.fixture
def slow_node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ThreadedNodeServer]:
    """A served node of one disk, one request in service at a time, each taking 30 ms."""
    srv = ThreadedNodeServer(tmp_path / "node", disks=1, max_payload=1 << 20)
    fair = getattr(request, "param", True)
    assert srv.server.qos is not None
    srv.server.qos.queues[0] = qos.FairQueue(1, fair=fair)
    srv.server.qos.fair = fair
    asyncio.run_coroutine_threadsafe(
        srv.local.write_chunk(0, "c0", CHUNK, crc32c=google_crc32c.value(CHUNK)), srv.loop
    ).result()
    srv.local.delay = 0.03
    yield srv
    srv.stop()


async def _reads_in_order(srv: ThreadedNodeServer) -> list[str]:
    """Bronze sends 20 reads; once half of them wait for the disk, gold sends 4 on its own
    connection. Returns the groups in the order their replies came."""
    done: list[str] = []
    nodes = [RemoteNode(7, 1, fixed_address(*srv.address), secret=SECRET) for _ in range(2)]

    async def read(node: RemoteNode, group: qos.TrafficGroup) -> None:
        with qos.using(group):
            await node.read_chunk(0, "c0")
        done.append(group.name)

    try:
        bronze = [asyncio.ensure_future(read(nodes[0], BRONZE)) for _ in range(20)]
        for _ in range(2000):  # until half of them wait in the node's queue (10 s at most)
            if srv.server.qos is None or srv.server.qos.queues[0].waiting >= 10:
                break
            await asyncio.sleep(0.005)
        await asyncio.gather(*(read(nodes[1], GOLD) for _ in range(4)), *bronze)
    finally:
        for n in nodes:
            await n.close()
    return done


def test_gold_overtakes_queued_bronze(slow_node: ThreadedNodeServer) -> None:
    done = asyncio.run(_reads_in_order(slow_node))
    # Each gold read goes in at the next free slot: all four are done before half of the
    # bronze reads (at most one bronze read in service when each came).
    assert max(i for i, g in enumerate(done) if g == "loader") < 14, done
    stats = _settled(slow_node, 24)
    assert (stats["loader"].ops, stats["loader"].klass) == (4, "gold")
    assert (stats["ckpt"].ops, stats["ckpt"].bytes) == (20, 20 * len(CHUNK))
    assert stats["loader"].wait.quantile(0.99) < stats["ckpt"].wait.quantile(0.99)


def _settled(srv: ThreadedNodeServer, ops: int) -> dict[str, qos.GroupStats]:
    """The node's figures once it has counted ``ops`` requests (a request is counted just
    after its reply has gone)."""
    assert srv.server.qos is not None
    for _ in range(1000):
        stats = srv.server.qos.by_group()
        if sum(s.ops for s in stats.values()) >= ops:
            return stats
        time.sleep(0.01)
    raise AssertionError(f"the node counted {stats}")


@pytest.mark.parametrize("slow_node", [False], indirect=True)
def test_without_fairness_gold_waits_its_turn(slow_node: ThreadedNodeServer) -> None:
    done = asyncio.run(_reads_in_order(slow_node))
    assert min(i for i, g in enumerate(done) if g == "loader") >= 10, done


@pytest.mark.parametrize("fair", [True, False])
def test_an_emulated_nic_sends_gold_replies_first(tmp_path: Path, fair: bool) -> None:
    """On a node whose NIC is emulated (12.5 MB/s), the line is what reads wait for: each
    holds its disk slot until its reply has gone, so bronze's queue up at the disk and the
    NIC's queue holds a few replies more. Gold's replies go ahead of bronze's queued ones,
    through both queues, and do not without fairness."""
    srv = ThreadedNodeServer(tmp_path / "node", disks=1, max_payload=1 << 20)
    srv.server.pacer = Pacer.of(LinkModel(gbps=0.1), chunk=1 << 20)
    srv.server.qos = qos.NodeQos(1, fair=fair, nic_rate=0.1e9 / 8)
    asyncio.run_coroutine_threadsafe(
        srv.local.write_chunk(0, "c0", CHUNK, crc32c=google_crc32c.value(CHUNK)), srv.loop
    ).result()
    try:
        done = asyncio.run(_reads_in_order(srv))
        stats = srv.server.qos.nic.stats if srv.server.qos.nic is not None else {}
    finally:
        srv.stop()
    gold = [i for i, g in enumerate(done) if g == "loader"]
    if fair:
        assert max(gold) < 14, done
        assert stats["loader"].klass == "gold" and stats["loader"].ops == 4
    else:
        assert min(gold) >= 10, done


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports (node N's metrics go to the first + N)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = int(s.getsockname()[1])
        if first + n > 65535:
            continue
        try:
            for p in range(first, first + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {n} consecutive free ports")


def test_served_cluster_counts_groups_in_status_and_prometheus(tmp_path: Path) -> None:
    root = tmp_path / "c"
    Cluster.create(root, nodes=3, disks_per_node=1, encoding="r3", block_size=SMALL_BLOCK)
    port = _free_ports(3)
    data = os.urandom(3 * SMALL_BLOCK)

    async def work() -> None:
        async with Cluster.open(root) as c:
            with qos.using(GOLD):
                await c.client().write_file("/f", data)
            with qos.using(BRONZE):
                assert await c.client().read_file("/f") == data

    with Serving(root, repair_interval=0, metrics_port=port):
        asyncio.run(work())
        status = ok_json("cluster", "status", "--cluster", str(root))
        texts = [
            urllib.request.urlopen(f"http://127.0.0.1:{port + n}/metrics", timeout=10).read()
            for n in range(3)
        ]
    groups = status["qos"]["groups"]
    assert groups["loader"]["class"] == "gold" and groups["ckpt"]["class"] == "bronze"
    assert groups["loader"]["bytes"] >= 3 * len(data)  # three replicas written
    assert groups["ckpt"]["bytes"] >= len(data)
    assert [n["fair"] for n in status["qos"]["nodes"]] == [True, True, True]
    # Each node's own endpoint (a read of r3 goes to one replica: any node may have none).
    samples = []
    for n, text in enumerate(texts):
        families = {f.name: f for f in text_string_to_metric_families(text.decode())}
        assert "tectonic_qos_wait_seconds" in families
        samples += families["tectonic_qos_requests"].samples
        assert {s.labels["node"] for s in families["tectonic_qos_requests"].samples} == {str(n)}
    assert {(s.labels["group"], s.labels["class"]) for s in samples} == {
        ("loader", "gold"),
        ("ckpt", "bronze"),
    }


def test_qos_modes_from_config_and_serve(tmp_path: Path) -> None:
    root = tmp_path / "c"
    Cluster.create(root, nodes=1, disks_per_node=1, encoding="r1", qos="fifo", qos_depth=2)
    with Serving(root, repair_interval=0):
        status = ok_json("cluster", "status", "--cluster", str(root))
        assert [(n["fair"], n["depth"]) for n in status["qos"]["nodes"]] == [(False, 2)]
    with Serving(root, repair_interval=0, qos="off"):
        status = ok_json("cluster", "status", "--cluster", str(root))
        assert [n["fair"] for n in status["qos"]["nodes"]] == [None]


def test_bad_groups_and_modes_get_one_line(tmp_path: Path) -> None:
    fails("--group", "Loader:gold", "ls", "--cluster", str(tmp_path), mentions="group's name")
    fails("--group", "a:platinum", "ls", "--cluster", str(tmp_path), mentions="traffic class")
    fails("cluster", "create", "--cluster", str(tmp_path / "c"), "--qos", "wfq", mentions="wfq")
    with pytest.raises(InvalidArgumentError, match="qos is one of"):
        Cluster.create(tmp_path / "d", nodes=1, encoding="r1", qos="lottery")


def test_status_json_is_plain(tmp_path: Path) -> None:
    """An embedded cluster has no node schedulers: status says so, in JSON that loads."""
    root = tmp_path / "c"
    Cluster.create(root, nodes=1, disks_per_node=1, encoding="r1")
    status = ok_json("cluster", "status", "--cluster", str(root))
    assert status["qos"] == {"nodes": [], "groups": {}}
    json.dumps(status)


def test_every_client_names_its_group(tmp_path: Path) -> None:
    """A Checkpointer, a ShardStream, an fsspec filesystem and a command each tag their
    requests with the group they were given."""
    import fsspec
    import numpy as np

    from clients.checkpoint import Checkpointer
    from clients.dataset import generate
    from clients.shardstream import ShardStream

    root = tmp_path / "c"
    Cluster.create(root, nodes=3, disks_per_node=1, encoding="r3", block_size=SMALL_BLOCK)

    async def work() -> None:
        async with Cluster.open(root) as c:
            client = c.client()
            await generate(client, "resnet50", 0.0005, "/data")
            async with Checkpointer(client, "/ckpt", world_size=1, group=BRONZE) as ck:
                await ck.save(1, 0, {"w": np.arange(50_000, dtype=np.float32)})
            stream = ShardStream(
                client, "/data", rank=0, world_size=1, batch_size=4, seed=1, epoch=0, group=GOLD
            )
            async with stream:
                assert sum([b.num_rows async for b in stream]) > 0

    with Serving(root, repair_interval=0):
        asyncio.run(work())
        fs = fsspec.filesystem("tectonic", cluster=str(root), group="notebook:silver:2")
        fs.pipe("/nb/x", os.urandom(3 * SMALL_BLOCK))
        fs.close()
        (tmp_path / "f").write_bytes(b"y" * SMALL_BLOCK)
        ok("--group", "cli:bronze", "put", "--cluster", str(root), str(tmp_path / "f"), "/f")
        groups = ok_json("cluster", "status", "--cluster", str(root))["qos"]["groups"]
    classes = {name: g["class"] for name, g in groups.items()}
    assert classes["ckpt"] == "bronze" and classes["loader"] == "gold"
    assert classes["notebook"] == "silver" and classes["cli"] == "bronze"
    assert groups["loader"]["ops"] > 0 and groups["ckpt"]["ops"] >= 3  # (chunks compress)


def test_an_emulated_disk_takes_each_request(tmp_path: Path) -> None:
    """With a modelled device per disk (``--disk-model``), every disk request of a served
    node is also charged to the device: its counters see the writes and the reads."""
    from tectonic_emu.sim.devices import HDD, Disk

    srv = ThreadedNodeServer(tmp_path / "node", disks=1, max_payload=1 << 20)
    device = Disk(HDD)
    srv.server.devices = [device]

    async def work() -> None:
        node = RemoteNode(7, 1, fixed_address(*srv.address), secret=SECRET)
        try:
            with qos.using(BRONZE):
                await node.write_chunk(0, "c1", CHUNK, crc32c=google_crc32c.value(CHUNK))
            with qos.using(GOLD):
                data, _ = await node.read_chunk(0, "c1")
                assert bytes(data) == CHUNK
                await node.read_chunk_range(0, "c1", 0, 4096)
        finally:
            await node.close()

    try:
        asyncio.run(work())
        stats = _settled(srv, 3)
    finally:
        srv.stop()
    assert device.bytes_written == len(CHUNK) and device.bytes_read >= len(CHUNK) + 4096
    assert device.ops == 3 and stats["ckpt"].ops == 1 and stats["loader"].ops == 2
