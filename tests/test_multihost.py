"""A cluster across hosts (issue 8), with hosts made as network namespaces (``bench/netns.py``):
storage nodes on four hosts, writers on a fifth, metadata in PostgreSQL in the root namespace,
and no directory shared between hosts (each has its own copy of ``cluster.json``). The links
between them are paced by the emulated network (1 Gb/s, 4 ms round trips, a segment in 5,000
lost). One node host is cut off the network mid-write: nothing acknowledged is lost, the
writers finish, and repair restores full redundancy once the host is back."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import pytest

from bench import netns
from bench.postgres import PostgresServer, bin_dir
from tectonic_emu import Cluster
from tectonic_emu.chunkstore import auth, wire
from tectonic_emu.chunkstore.remote import RemoteNode, fixed_address
from tectonic_emu.errors import NodeUnavailableError
from tectonic_emu.secret import load_secret, secret_path
from tectonic_emu.services.repair import repair
from tectonic_emu.tls import client_context
from tests.conftest import SMALL_BLOCK, fresh_table, run_with
from tests.served_writer import acknowledged, stream
from tests.test_auth import ATTACKER, ATTACKER_PYTHON, Relay, _chunk_files, _frame
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


def served_cluster(
    tmp_path: Path, hosts: netns.Hosts, database: str, port: int, **options: Any
) -> Path:
    """An r3 cluster of one node on each of NODE_HOSTS at ``port``, metadata in
    ``database``, created in ``tmp_path/template`` with ``options`` and served on every
    host; returns the template, once every node listens."""
    template = tmp_path / "template"
    Cluster.create(
        template,
        nodes=len(NODE_HOSTS),
        encoding="r3",
        block_size=SMALL_BLOCK,
        metadata=database,
        metadata_table=fresh_table(),
        node_addresses=tuple(f"{hosts.ip[h]}:{port}" for h in NODE_HOSTS),
        **options,
    )
    netns.serve_nodes(hosts, template, tmp_path, NODE_HOSTS)
    for h in NODE_HOSTS:
        until(lambda h=h: netns.listening(hosts.ip[h], port), f"node on {h} listens", 30)
    return template


def test_a_host_cut_off_mid_write_loses_nothing_acknowledged(
    tmp_path: Path, hosts: netns.Hosts, database: str
) -> None:
    template = served_cluster(
        tmp_path, hosts, database, PORT, nic_gbps=1.0, rtt_ms=RTT_MS, loss=0.0002
    )
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


def test_another_uid_on_another_host_can_do_nothing(
    tmp_path: Path, hosts: netns.Hosts, database: str
) -> None:
    """Issue 19 across hosts: a process as uid nobody on the client host sends LIST, READ,
    WRITE, DELETE and SET_DELAY to every node host, without a handshake and with a guessed
    secret. Each connection closes with nothing but a challenge; the chunk files on every
    host are unchanged and the file reads back. (Links across namespaces are not loopback:
    their tags cover payloads.)"""
    port = PORT + 50  # the other test's nodes may still listen on PORT
    template = served_cluster(tmp_path, hosts, database, port)
    here = netns.host_copy(template, tmp_path / "reader")
    data = bytes(range(256)) * (3 * SMALL_BLOCK // 256 + 7)

    async def write(c: Cluster) -> list[tuple[int, int, str]]:
        await c.client().write_file("/victim", data)
        return [
            (ch.node, ch.disk, ch.chunk_id) async for r in c.meta.iter_blocks() for ch in r.chunks
        ]

    chunks = run_with(here, write)
    attempts: list[dict[str, object]] = []
    for n, h in enumerate(NODE_HOSTS):
        disk, cid = next(((d, c) for node, d, c in chunks if node == n), (0, "x.0"))
        for what, raw in {
            "LIST": _frame(wire.Op.LIST, 1, wire.DISK.pack(0)),
            "READ": _frame(wire.Op.READ, 2, wire.pack_chunk_ref(disk, cid)),
            "WRITE": _frame(wire.Op.WRITE, 3, wire.DISK_FLAGS.pack(0, 0) + b"p.0", b"PWNED!"),
            "DELETE": _frame(wire.Op.DELETE, 4, wire.pack_chunk_ref(disk, cid)),
            "SET_DELAY": _frame(wire.Op.SET_DELAY, 5, wire.DELAY.pack(3600.0)),
        }.items():
            addr = [hosts.ip[h], port]
            attempts.append({"what": f"{what} to {h}", "addr": addr, "data": raw.hex()})
            attempts.append({
                "what": f"{what} to {h}, guessed secret", "addr": addr, "node": n,
                "data": (raw + os.urandom(auth.TAG_BYTES)).hex(), "secret": os.urandom(32).hex(),
            })  # fmt: skip
    before = {h: _chunk_files(tmp_path / h) for h in NODE_HOSTS}
    assert any(before.values())
    job = json.dumps({"secret": str(template / "secret"), "attempts": attempts})
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    proc = hosts.popen(
        "client",
        [*nobody, ATTACKER_PYTHON, "-c", ATTACKER, job],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd="/",
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    result = json.loads(out)
    assert result["uid"] == 65534 and result["secret"] == "PermissionError"
    for r, a in zip(result["results"], attempts, strict=True):
        challenge = auth.CHALLENGE.size if "secret" in a else 0
        assert r["got"] == challenge and r["how"] in ("closed", "reset"), r
    assert {h: _chunk_files(tmp_path / h) for h in NODE_HOSTS} == before

    async def read_back(c: Cluster) -> bytes:
        return await c.client().read_file("/victim")

    assert run_with(here, read_back) == data


def test_tls_links_across_hosts(tmp_path: Path, hosts: netns.Hosts, database: str) -> None:
    """``cluster create --tls`` across hosts, set up as docs/deploy.md says (each host gets
    the CA, the node certificate and its key, ``netns.host_copy``): the certificate names the
    node hosts' addresses, a client on another host writes and reads over TLS links, the bytes
    it sends hold none of the file (a relay records them), and a client without TLS is
    refused."""
    port = PORT + 100  # the other tests' nodes may still listen on theirs
    template = served_cluster(tmp_path, hosts, database, port, tls=True)
    here = netns.host_copy(template, tmp_path / "reader")
    data = os.urandom(3 * SMALL_BLOCK + 7)

    async def write_read(c: Cluster) -> bytes:
        await c.client().write_file("/f", data)
        got = await c.client().read_file("/f")
        for node in c.nodes:
            assert isinstance(node, RemoteNode) and node.tls is not None
            conn = node._conns["data"]
            assert conn.transport is not None
            assert conn.transport.get_extra_info("ssl_object") is not None
        return got

    assert run_with(here, write_read) == data
    secret = load_secret(secret_path(here))
    chunk = data[:SMALL_BLOCK]
    relay = Relay((hosts.ip[NODE_HOSTS[0]], port))

    async def through_relay() -> None:
        ctx = client_context(here)
        remote = RemoteNode(0, 1, fixed_address(*relay.address), secret=secret, tls=ctx)
        try:
            await remote.write_chunk(0, "tls.0", chunk, crc32c=google_crc32c.value(chunk))
            got, _ = await remote.read_chunk(0, "tls.0")
            assert bytes(got) == chunk
        finally:
            await remote.close()

    asyncio.run(through_relay())
    assert len(relay.sent) > SMALL_BLOCK and data[:64] not in bytes(relay.sent)

    async def without_tls() -> None:
        remote = RemoteNode(0, 1, fixed_address(hosts.ip[NODE_HOSTS[0]], port), secret=secret)
        try:
            with pytest.raises(NodeUnavailableError):
                await remote.ping()
        finally:
            await remote.close()

    asyncio.run(without_tls())
