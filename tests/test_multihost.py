"""A cluster across hosts (issue 8), with hosts made as network namespaces (``bench/netns.py``):
storage nodes on four hosts, writers on a fifth, metadata in PostgreSQL in the root namespace,
and no directory shared between hosts (each has its own copy of ``cluster.json``). The links
between them are paced by the emulated network (1 Gb/s, 4 ms round trips, a segment in 5,000
lost). One node host is cut off the network mid-write: nothing acknowledged is lost, the
writers finish, and repair restores full redundancy once the host is back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import netns
from bench.postgres import PostgresServer, bin_dir
from tectonic_emu import Cluster
from tectonic_emu.chunkstore.remote import RemoteNode
from tectonic_emu.services.repair import repair
from tests.conftest import SMALL_BLOCK, fresh_table, run_with
from tests.served_writer import acknowledged, stream
from tests.test_served import until

REPO = Path(__file__).resolve().parent.parent
NODE_HOSTS = ["n1", "n2", "n3", "n4"]
PORT = 7100
RTT_MS = 4.0

why_not = netns.unavailable()
pytestmark = pytest.mark.skipif(why_not is not None, reason=why_not or "")


@pytest.fixture(scope="module")
def hosts() -> Iterator[netns.Hosts]:
    with netns.Hosts([*NODE_HOSTS, "client"]) as h:
        yield h


@pytest.fixture(scope="module")
def database(hosts: netns.Hosts) -> Iterator[str]:
    """PostgreSQL in the root namespace, on the bridge: every host reaches it."""
    found = bin_dir()
    if found is None:
        pytest.skip("no PostgreSQL server here (apt-get install postgresql)")
    server = PostgresServer(found, listen=(hosts.gateway,), trust=(hosts.network,)).start()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_host_cut_off_mid_write_loses_nothing_acknowledged(
    tmp_path: Path, hosts: netns.Hosts, database: str
) -> None:
    template = tmp_path / "template"
    Cluster.create(
        template,
        nodes=len(NODE_HOSTS),
        encoding="r3",
        block_size=SMALL_BLOCK,
        metadata=database,
        metadata_table=fresh_table(),
        node_addresses=tuple(f"{hosts.ip[h]}:{PORT}" for h in NODE_HOSTS),
        nic_gbps=1.0,
        rtt_ms=RTT_MS,
        loss=0.0002,
    )
    netns.serve_nodes(hosts, template, tmp_path, NODE_HOSTS)
    for h in NODE_HOSTS:
        until(lambda h=h: netns.listening(hosts.ip[h], PORT), f"node on {h} listens", 30)
    client_root = netns.host_copy(template, tmp_path / "client")
    stop = tmp_path / "stop"
    progress = [tmp_path / f"progress-{i}" for i in range(2)]
    writer = [sys.executable, "-m", "tests.served_writer", str(client_root)]
    procs = [
        hosts.popen(
            "client",
            [*writer, f"/w{i}", str(i), str(progress[i]), "--stop", str(stop)],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    until(lambda: all(acknowledged(p)[0] >= 6 for p in progress), "writers flushed", 60)
    at_cut = [acknowledged(p) for p in progress]
    hosts.cut("n4")
    cut_at = time.monotonic()
    wanted = [records + 6 for records, _, _ in at_cut]
    until(
        lambda: all(acknowledged(p)[0] >= k for p, k in zip(progress, wanted, strict=True)),
        "writers flushed after the cut",
        90,
    )
    stop.touch()
    assert [p.wait(90) for p in procs] == [0, 0]
    done = [acknowledged(p) for p in progress]
    assert all(closed for _, _, closed in done)
    assert time.monotonic() - cut_at < 90

    # Read from the root namespace, with n4 still cut off: every acknowledged byte is there.
    here = netns.host_copy(template, tmp_path / "reader")

    async def check(c: Cluster) -> int:
        await c.check_health()
        pings = [n.last_ping.rtt for n in c.nodes if isinstance(n, RemoteNode) and n.available]
        assert len(pings) == 3 and min(pings) >= (RTT_MS - 1) / 1000  # the links are paced
        client = c.client()
        for i, (records, size, _) in enumerate(done):
            st = await client.stat(f"/w{i}")
            assert st.sealed and st.size == size
            assert await client.read_file(f"/w{i}") == stream(i, records)
        return (await c.status()).blocks_below_redundancy

    assert run_with(here, check) > 0  # blocks written while n4 was away lack a copy

    hosts.mend("n4")

    async def mended(c: Cluster) -> int:
        await c.check_health()
        assert all(n.available for n in c.nodes)
        await repair(c)
        st = await c.status()
        for i, (records, _, _) in enumerate(done):
            assert await c.client().read_file(f"/w{i}") == stream(i, records)
        return st.blocks_below_redundancy

    until(lambda: netns.listening(hosts.ip["n4"], PORT), "n4 is reachable again", 30)
    assert run_with(here, mended) == 0
    assert asyncio.run(_names(here)) == ["w0", "w1"]


async def _names(root: Path) -> list[str]:
    async with Cluster.open(root) as c:
        return sorted(await c.client().listdir("/"))
