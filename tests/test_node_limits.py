"""What one peer can take from a node (``chunkstore/limits.py``, issue 19): stalled WRITE
frames, a thousand idle connections, a pipeline of writes on one connection and a flood of
accept errors each leave the node serving everyone else within a few seconds."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tectonic_emu.chunkstore import auth, limits, wire
from tectonic_emu.chunkstore.remote import RemoteNode, fixed_address
from tectonic_emu.chunkstore.wire import Op
from tests.node_thread import SECRET, ThreadedNodeServer
from tests.test_wire_fuzz import Link, crc, frame

NODE_ID = 7
DISKS = 2
MAX_PAYLOAD = 1 << 20
BUFFERS = 4
SAFETY = 60.0  # seconds: a node that never recovers fails the test, slowly


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ThreadedNodeServer]:
    s = ThreadedNodeServer(
        tmp_path, node_id=NODE_ID, disks=DISKS, max_payload=MAX_PAYLOAD, buffers=BUFFERS
    )
    try:
        yield s
    finally:
        s.stop()


def on_loop(s: ThreadedNodeServer, coro: object) -> object:
    return asyncio.run_coroutine_threadsafe(coro, s.loop).result(SAFETY)  # type: ignore[arg-type]


async def _connections(s: ThreadedNodeServer) -> int:
    return len(s.server.connections)


def connections(s: ThreadedNodeServer) -> int:
    return int(on_loop(s, _connections(s)))  # type: ignore[call-overload]


def wait_until(check: object, what: str) -> float:
    start = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - start < SAFETY, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - start


async def write_and_read(address: tuple[str, int], chunk_id: str, data: bytes) -> bytes:
    remote = RemoteNode(NODE_ID, DISKS, fixed_address(*address), secret=SECRET)
    try:
        await remote.write_chunk(0, chunk_id, data, crc32c=crc(data))
        got, _ = await remote.read_chunk(0, chunk_id)
        return bytes(got)
    finally:
        await remote.close()


def stalled_write(s: ThreadedNodeServer, n: int) -> Link:
    """An authenticated connection that sends a WRITE's header and meta, and a little of its
    payload, then nothing more: it holds a payload buffer."""
    link = Link(socket.create_connection(s.address, timeout=SAFETY))
    payload = os.urandom(MAX_PAYLOAD)
    whole = link.seal(frame(Op.WRITE, n, wire.DISK_FLAGS.pack(0, 0) + f"s{n}".encode(), payload))
    link.send_raw(whole[: wire.HEADER_SIZE + 6 + 100])
    return link


def test_stalled_write_headers_free_the_buffers_they_hold(srv: ThreadedNodeServer) -> None:
    stalled = [stalled_write(srv, n) for n in range(2 * BUFFERS)]  # more than there are
    try:
        wait_until(lambda: len(srv.server.pool._free) == 0, "the stalled frames to take buffers")
        # Another client still writes: the stalled ones are closed after the stall timeout,
        # their buffers go back, and its write gets one.
        data = os.urandom(1000)
        assert asyncio.run(write_and_read(srv.address, "ok.0", data)) == data
        for link in stalled:  # each was closed by the node, none was answered
            link.sock.settimeout(SAFETY)
            assert link.recv(1 << 16) == b""
        assert srv.server.closings.count >= len(stalled) - BUFFERS
        assert not any((srv.local.root / "d0").rglob("s*"))
    finally:
        for link in stalled:
            link.close()


def test_a_thousand_idle_connections_do_not_stop_others(srv: ThreadedNodeServer) -> None:
    idle = [socket.create_connection(srv.address, timeout=SAFETY) for _ in range(1000)]
    try:
        data = os.urandom(4000)
        assert asyncio.run(write_and_read(srv.address, "idle.0", data)) == data
        # Connections that never authenticate are dropped after the handshake timeout.
        wait_until(lambda: connections(srv) == 0, "the idle connections to be dropped")
        for sock in idle[:10]:
            assert sock.recv(1 << 16) == b""  # closed by the node (a challenge never came)
    finally:
        for sock in idle:
            sock.close()


def test_connections_past_the_limit_are_closed_at_once(srv: ThreadedNodeServer) -> None:
    async def cap() -> None:
        srv.server.max_connections = 3

    on_loop(srv, cap())
    socks = [socket.create_connection(srv.address, timeout=SAFETY) for _ in range(3)]
    try:
        wait_until(lambda: connections(srv) == 3, "three connections")
        extra = socket.create_connection(srv.address, timeout=SAFETY)
        assert extra.recv(1 << 16) == b""  # accepted, and closed before a challenge
        extra.close()
        assert connections(srv) == 3
    finally:
        for sock in socks:
            sock.close()
    wait_until(lambda: connections(srv) == 0, "the connections to close")
    data = os.urandom(100)
    assert asyncio.run(write_and_read(srv.address, "cap.0", data)) == data


def test_one_connection_holds_at_most_its_share_of_buffers(srv: ThreadedNodeServer) -> None:
    """A pipeline of writes on one connection takes its share of the buffers, then waits for
    its own: never all of them, and every write lands."""
    seen: list[int] = []

    async def pipeline() -> None:
        remote = RemoteNode(NODE_ID, DISKS, fixed_address(*srv.address), secret=SECRET)
        try:
            chunks = {f"p.{i}": os.urandom(MAX_PAYLOAD // 2) for i in range(4 * BUFFERS)}
            await asyncio.gather(
                *(remote.write_chunk(0, c, d, crc32c=crc(d)) for c, d in chunks.items())
            )
            for c, d in chunks.items():
                got, _ = await remote.read_chunk(0, c)
                assert bytes(got) == d
        finally:
            await remote.close()

    async def watch(stop: asyncio.Event) -> None:
        while not stop.is_set():
            seen.extend(conn.held for conn in srv.server.connections)
            await asyncio.sleep(0)

    stop = asyncio.Event()
    watcher = asyncio.run_coroutine_threadsafe(watch(stop), srv.loop)
    try:
        asyncio.run(pipeline())
    finally:
        srv.loop.call_soon_threadsafe(stop.set)
        watcher.result(SAFETY)
    assert srv.server.per_connection_buffers == BUFFERS // 2
    assert max(seen) == srv.server.per_connection_buffers


def test_accept_errors_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio logs "socket.accept() out of system resource" on every failed accept (the
    issue saw 237,704 lines in 40 s at the descriptor limit): through the node's handler it
    is one line per interval, with a count."""
    loop = asyncio.new_event_loop()
    try:
        refusals = auth.RefusalLog(logging.getLogger("test.limits"), "node 0")
        limits.quiet_accept_errors(loop, refusals)
        with caplog.at_level(logging.WARNING, logger="test.limits"):
            for _ in range(10_000):
                loop.call_exception_handler(
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(errno.EMFILE, "Too many open files"),
                    }
                )
        lines = [r for r in caplog.records if r.name == "test.limits"]
        assert len(lines) == 1 and "Too many open files" in lines[0].getMessage()
        assert refusals.count == 10_000
    finally:
        loop.close()
