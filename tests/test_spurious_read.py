"""The spurious read failure of issue 19: a served read of a file of 29,496 small blocks
failed 2 of 3 times with ``0 of 1 needed chunks readable (node 1 is down (cannot connect
()))`` while every byte was intact.

What happened: ``read_blocks`` put every block of the range in flight at once when the
blocks were small (192 MiB of read-ahead over 4 KiB blocks is 49,152 "blocks in flight"):
29,496 tasks, and as many requests queued on three nodes. That stalled the client's event
loop for 8-19 s here (measured with a 50 ms ticker); a heartbeat or a reconnect whose 2 s
timer ran out during such a stall marked a live node down, and every r1 block on it then
failed at once. The reason was empty because ``TimeoutError()`` formats as "", and raced
reads dropped their errors altogether ("readable ()").

Fixed: a read keeps at most ``MAX_BLOCKS_IN_FLIGHT`` blocks in flight, taken in order by that
many workers; a connect that times out says so; a DataUnavailableError names the errors of
every attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tectonic_emu import Cluster
from tectonic_emu.chunkstore.remote import RemoteNode, fixed_address
from tectonic_emu.errors import NodeUnavailableError, reason
from tectonic_emu.reader import MAX_BLOCKS_IN_FLIGHT
from tectonic_emu.served import Serving

from .conftest import make_cluster, run_with
from .node_thread import SECRET

BLOCK = 4096
BLOCKS = 3000


@pytest.fixture(scope="module")
def many_small_blocks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """An r1 cluster of 3 nodes holding /f: 3,000 blocks of 4 KiB (written embedded)."""
    root = make_cluster(
        tmp_path_factory.mktemp("spurious") / "c",
        nodes=3,
        encoding="r1",
        block_size=BLOCK,
        disks_per_node=1,
        sync=False,
    )
    data = random.Random(9).randbytes(BLOCKS * BLOCK - 100)

    async def fill(c: Cluster) -> None:
        await c.client().write_file("/f", data)

    run_with(root, fill)
    return root, data


def test_a_served_read_of_many_small_blocks_queues_a_bounded_number_of_requests(
    many_small_blocks: tuple[Path, bytes],
) -> None:
    """Before the fix, this read had every one of its 3,000 blocks in flight at once (about
    1,000 requests queued per node); now at most MAX_BLOCKS_IN_FLIGHT, and it reads back
    exactly, with no node marked down, three times over."""
    root, data = many_small_blocks
    with Serving(root, repair_interval=0):

        async def go(c: Cluster) -> list[int]:
            nodes = [n for n in c.nodes if isinstance(n, RemoteNode)]
            assert len(nodes) == 3
            most = [0]
            done = asyncio.Event()

            async def watch() -> None:
                # Requests queued on each node's data connection, seen at every loop turn.
                while not done.is_set():
                    conns = [n._conns.get("data") for n in nodes]  # (not the heartbeats')
                    queued = sum(len(conn.pending) for conn in conns if conn is not None)
                    most[0] = max(most[0], queued)
                    await asyncio.sleep(0)

            counts = []
            for _ in range(3):
                most[0] = 0
                done.clear()
                watcher = asyncio.create_task(watch())
                got = await asyncio.wait_for(c.client().read("/f"), 300)
                done.set()
                await watcher
                assert got == data
                assert all(n.available for n in nodes), [n.down_reason for n in nodes]
                counts.append(most[0])
            return counts

        counts = run_with(root, go)
    assert 0 < max(counts) <= MAX_BLOCKS_IN_FLIGHT, counts


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A port whose listener never accepts and whose backlog is full: a connect to it hangs
    (the kernel drops the SYN), as it does to a host that is gone."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fill.append(s)
    try:
        yield port
    finally:
        for s in fill:
            s.close()
        srv.close()


def test_a_connect_that_times_out_gives_a_reason(unanswered_port: int) -> None:
    async def go() -> tuple[str, str, str]:
        node = RemoteNode(
            0,
            1,
            fixed_address("127.0.0.1", unanswered_port),
            secret=SECRET,
            connect_timeout=0.3,
        )
        with pytest.raises(NodeUnavailableError) as first:
            await node.stat_chunk(0, "0" * 32)
        with pytest.raises(NodeUnavailableError) as later:  # marked down: refused at once
            await node.stat_chunk(0, "0" * 32)
        await node.close()
        return str(first.value), node.down_reason, str(later.value)

    first, down, later = asyncio.run(go())
    for line in (first, down, later):
        assert "cannot connect (timed out)" in line and "()" not in line, line


def test_a_reason_is_never_empty() -> None:
    assert reason(TimeoutError()) == "TimeoutError"
    assert reason(ConnectionResetError()) == "ConnectionResetError"
    assert reason(OSError(5, "boom")) == "[Errno 5] boom"
    assert reason(NodeUnavailableError("node 3 is down")) == "node 3 is down"


def test_a_block_unreadable_everywhere_names_why(tmp_path: Path) -> None:
    """The raced first attempt's errors reach the message (they were dropped: "readable ()")."""
    root = make_cluster(tmp_path / "c", nodes=3, encoding="r1")  # one chunk: no second try
    data = os.urandom(5000)

    async def go(c: Cluster) -> str:
        await c.client().write_file("/f", data)
        [b] = await c.client().layout("/f")
        for p in b.chunk_paths:
            os.truncate(p, 100)  # shorter than its header says
        with pytest.raises(OSError) as e:
            await c.client().read_file("/f")
        return str(e.value)

    line = run_with(root, go)
    assert "0 of 1 needed chunks readable (" in line and "readable ()" not in line, line
