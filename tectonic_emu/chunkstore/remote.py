"""``RemoteNode``: the client side of a served storage node (``server.py``).

One TCP connection per node for data and a second one for heartbeats (so a ping is never
queued behind megabytes of chunk replies), both opened lazily and reopened after a failure.
Requests are pipelined on the connection and matched to replies by request id; replies are
received straight into their destination buffer, which is page aligned (copies into a buffer
16 bytes past a page boundary are 5x slower on this machine, see ../shared/MACHINE.md).

Every connection starts with the handshake of ``auth.py`` (the node and this client each
prove they know the cluster secret), and every frame each way carries its tag; a reply that
fails its tag is treated as a malformed one.

A connection that fails (refused, reset, timed out, malformed reply) marks the node down at
once, fails every request on it with ``NodeUnavailableError``, and is dropped; the cluster's
health monitor pings down nodes and marks them up when they answer again.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tectonic_emu.chunkstore import auth, wire
from tectonic_emu.chunkstore._connection import (
    Call,
    ClientConnection,
    aligned_buffer,
    drop,
)
from tectonic_emu.chunkstore._format import as_byte_view
from tectonic_emu.chunkstore.base import (
    ChunkInfo,
    DiskUsage,
    Payload,
    StorageNode,
    check_chunk_id,
    stored_bytes,
)
from tectonic_emu.chunkstore.netem import Pacer, hold
from tectonic_emu.chunkstore.wire import Header, Op
from tectonic_emu.coding import crc32c
from tectonic_emu.errors import (
    ChunkCorruptError,
    InvalidArgumentError,
    NodeUnavailableError,
    reason,
    retrieved,
)
from tectonic_emu.qos import groups as qos

log = logging.getLogger(__name__)

Address = tuple[str, int]
Resolver = Callable[[], Address | None]

# Below this many bytes a checksum runs on the event loop rather than in a worker thread.
_INLINE_CRC_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class PingReply:
    node_id: int
    pid: int
    disks: int
    started: float
    max_payload: int
    rtt: float  # seconds, measured by the client


class RemoteNode(StorageNode):
    """A storage node served by another process. ``resolve`` returns its current address
    (re-read on every connect, so a node restarted on a new port is found), or None while it
    has none. ``secret``: the cluster's 32-byte secret, proved on every connection.
    ``payload_tags``: tag payloads even where both ends are loopback (off the host they
    always are; ``auth.py``). ``tls``: a client context, to speak TLS to the node (its
    certificate checked against the host connected to).
    ``request_timeout`` bounds every request; a node that misses it is marked down."""

    def __init__(
        self,
        node_id: int,
        disks: int,
        resolve: Resolver,
        *,
        secret: bytes,
        payload_tags: bool = False,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = 2.0,
        request_timeout: float = 120.0,
        pacer: Pacer | None = None,
    ) -> None:
        self.node_id = node_id
        # The TrafficGroup of this client's requests where no ``qos.using`` names one
        # (``Cluster.use_group``); None: the process's.
        self.group: qos.TrafficGroup | None = None
        self._secret = auth.check_secret(secret)
        self.payload_tags = payload_tags
        self.tls = tls
        self.pacer = pacer
        self.disks = disks
        self.available = True
        self.resolve = resolve
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.address: Address | None = None
        self.last_ping: PingReply | None = None
        self.down_reason = ""
        self.down_since = 0.0  # time.time() when last marked down
        self._conns: dict[str, ClientConnection] = {}
        self._connecting: dict[str, asyncio.Task[ClientConnection]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)
        self._closed = False

    def __repr__(self) -> str:
        return f"RemoteNode({self.node_id}, {self.address}, up={self.available})"

    # -- connections -------------------------------------------------------------------------
    def mark_down(self, reason: str) -> None:
        if self.available:
            log.info("node %d marked down: %s", self.node_id, reason)
            self.down_since = time.time()
        self.available = False
        self.down_reason = reason
        for conn in list(self._conns.values()):
            conn.abort(reason)
        self._conns.clear()

    async def _connection(self, kind: str) -> ClientConnection:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # used from a new event loop: the old sockets are dead
            for conn in self._conns.values():
                drop(conn)
            self._conns.clear()
            self._connecting.clear()
            self._loop = loop
        current = self._conns.get(kind)
        if current is not None and not current.closed:
            return current
        pending = self._connecting.get(kind)
        if pending is None:
            # A task of its own, not the caller's: a caller cancelled mid-handshake (a hedged
            # request that lost its race) must not cancel the open under the others waiting
            # for the same connection, who would then get its CancelledError.
            pending = loop.create_task(self._open_kept(kind))
            self._connecting[kind] = pending
            pending.add_done_callback(lambda t: self._opened(kind, t))
        return await asyncio.shield(pending)

    async def _open_kept(self, kind: str) -> ClientConnection:
        conn = await self._open(kind)
        if self._closed:  # closed while it opened: nobody would close this one
            drop(conn)
            raise NodeUnavailableError(f"node {self.node_id} is closed")
        self._conns[kind] = conn
        return conn

    def _opened(self, kind: str, task: asyncio.Task[ClientConnection]) -> None:
        if self._connecting.get(kind) is task:
            del self._connecting[kind]
        retrieved(task)  # its waiters (if any are left) re-raise it

    async def _open(self, kind: str) -> ClientConnection:
        address = self.resolve()
        if address is None:
            raise NodeUnavailableError(f"node {self.node_id} is not served (no address)")
        self.address = address
        host, port = address
        name = f"node {self.node_id} at {host}:{port}"
        loop = asyncio.get_running_loop()
        handshake = auth.ClientHandshake(self._secret, self.node_id, payload_tags=self.payload_tags)
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: ClientConnection(name, handshake, self.pacer),
                    host,
                    port,
                    ssl=self.tls,
                    server_hostname=host if self.tls is not None else None,
                ),
                self.connect_timeout,
            )
        except (OSError, TimeoutError) as e:
            # TimeoutError() says nothing (and an exception is always truthy): name the type.
            why = "timed out" if isinstance(e, TimeoutError) else reason(e)
            raise NodeUnavailableError(f"{name}: cannot connect ({why})") from None
        if self.pacer is not None and self.pacer.one_way:
            await hold(2 * self.pacer.one_way)  # TCP's handshake: one round trip
        try:
            # The node's process must answer the handshake, not only its kernel the connect:
            # a loaded host may take longer than ``connect_timeout``, and is not down for that.
            await asyncio.wait_for(asyncio.shield(conn.ready), auth.HANDSHAKE_TIMEOUT)
        except TimeoutError:
            conn.abort("no handshake in time")
            raise NodeUnavailableError(f"{name}: no authentication handshake in time") from None
        except NodeUnavailableError as e:
            drop(conn)
            raise NodeUnavailableError(str(e)) from None
        return conn

    async def call(
        self,
        op: Op,
        meta: bytes = b"",
        payload: memoryview | None = None,
        payload_crc32c: int = 0,
        *,
        kind: str = "data",
        wait: float | None = None,
        into: memoryview | None = None,
    ) -> tuple[Header, bytes, memoryview]:
        """Send one request and wait for its reply; raises the reply's typed error.
        ``into``: receive the reply's payload there (it must be exactly that long)."""
        if self._closed:
            raise NodeUnavailableError(f"node {self.node_id} is closed")
        if not self.available:
            why = f" ({self.down_reason})" if self.down_reason else ""
            raise NodeUnavailableError(f"node {self.node_id} is down{why}")
        return await self._exchange(
            op,
            meta,
            payload,
            payload_crc32c,
            kind=kind,
            wait=wait or self.request_timeout,
            into=into,
        )

    async def _exchange(
        self,
        op: Op,
        meta: bytes = b"",
        payload: memoryview | None = None,
        payload_crc32c: int = 0,
        *,
        kind: str,
        wait: float,
        into: memoryview | None = None,
    ) -> tuple[Header, bytes, memoryview]:
        """One request on the ``kind`` connection; any failure of the connection or a reply
        later than ``wait`` marks the node down (which drops its connections)."""
        try:
            conn = await self._connection(kind)
        except NodeUnavailableError as e:
            self.mark_down(str(e))
            raise
        request_id = next(self._ids)
        future: asyncio.Future[tuple[Header, bytes, memoryview]] = (
            asyncio.get_running_loop().create_future()
        )
        conn.pending[request_id] = Call(op, future, into)
        size = payload.nbytes if payload is not None else 0
        group = qos.explicit() or self.group or qos.current()
        meta, group_len = wire.with_group(meta, group)
        try:
            await conn.send(
                wire.pack_header(
                    op,
                    request_id,
                    meta,
                    payload_len=size,
                    payload_crc32c=payload_crc32c,
                    status=group_len,
                ),
                payload,
            )
            h, reply_meta, reply_payload = await asyncio.wait_for(future, wait)
        except TimeoutError:
            reason = f"no reply to {op.name} in {wait:.1f} s"
            self.mark_down(reason)
            raise NodeUnavailableError(f"node {self.node_id}: {reason}") from None
        except NodeUnavailableError as e:
            self.mark_down(str(e))
            raise
        finally:
            conn.pending.pop(request_id, None)
        if h.status:
            raise wire.error_from_reply(
                h.status, reply_meta.decode("utf-8", "replace"), f"node {self.node_id}"
            )
        return h, reply_meta, reply_payload

    # -- health ------------------------------------------------------------------------------
    async def ping(self, wait: float = 2.0) -> PingReply:
        """Heartbeat on its own connection, even while the node is marked down; marks the node
        up when it answers as the node it should be."""
        t0 = time.monotonic()
        _, meta, _ = await self._exchange(Op.PING, kind="ping", wait=wait)
        node_id, pid, disks, _, started, max_payload = wire.PING_REPLY.unpack(meta)
        if node_id != self.node_id:
            reason = f"the address of node {self.node_id} answers as node {node_id}"
            self.mark_down(reason)
            raise NodeUnavailableError(reason)
        reply = PingReply(node_id, pid, disks, started, max_payload, time.monotonic() - t0)
        self.last_ping = reply
        if not self.available:
            log.info("node %d is up again", self.node_id)
        self.available = True
        self.down_reason = ""
        return reply

    async def set_delay(self, seconds: float) -> None:
        """Make the node add ``seconds`` before every reply but heartbeats (fault injection)."""
        await self.call(Op.SET_DELAY, wire.DELAY.pack(seconds))

    async def reserve(self, nbytes: int) -> None:
        await self.call(Op.RESERVE, wire.RESERVE.pack(nbytes))

    # -- the seam ----------------------------------------------------------------------------
    def _check(self, disk: int, chunk_id: str | None = None) -> None:
        if not 0 <= disk < self.disks:
            raise InvalidArgumentError(f"node {self.node_id} has no disk {disk}")
        if chunk_id is not None:
            check_chunk_id(chunk_id)

    async def write_chunk(
        self,
        disk: int,
        chunk_id: str,
        payload: Payload,
        *,
        crc32c: int,
        flags: int = 0,
        sync: bool = True,
    ) -> None:
        self._check(disk, chunk_id)
        if not 0 <= crc32c < 1 << 32:
            raise InvalidArgumentError(f"crc32c out of range: {crc32c}", chunk_id)
        if not 0 <= flags < 1 << 16:
            raise InvalidArgumentError(f"flags out of range: {flags}", chunk_id)
        view = as_byte_view(stored_bytes(payload, self.node_id))
        meta = wire.DISK_FLAGS.pack(disk, flags) + chunk_id.encode("ascii")
        await self.call(Op.WRITE if sync else Op.WRITE_UNSYNCED, meta, view, crc32c)

    async def sync_disk(self, disk: int) -> None:
        self._check(disk)
        await self.call(Op.SYNC, wire.DISK.pack(disk))

    async def read_chunk(self, disk: int, chunk_id: str) -> tuple[memoryview, ChunkInfo]:
        """The chunk, checked here against the checksum stored with it: the node sends it
        unchecked, so one pass covers the disk and the wire."""
        self._check(disk, chunk_id)
        h, meta, payload = await self.call(Op.READ, wire.pack_chunk_ref(disk, chunk_id))
        info = wire.unpack_info(chunk_id, meta)
        await self._check_payload(h, info, payload)
        return payload.toreadonly(), info

    async def read_chunk_into(self, disk: int, chunk_id: str, dest: memoryview) -> ChunkInfo:
        """Receive the chunk straight into ``dest`` (no buffer of our own, no copy), then
        check it as ``read_chunk`` does. If cancelled, nothing more lands in ``dest``."""
        self._check(disk, chunk_id)
        h, meta, _ = await self.call(Op.READ, wire.pack_chunk_ref(disk, chunk_id), into=dest)
        info = wire.unpack_info(chunk_id, meta)
        await self._check_payload(h, info, dest)
        return info

    async def read_chunk_range(
        self, disk: int, chunk_id: str, offset: int, length: int
    ) -> tuple[memoryview, ChunkInfo]:
        """The node reads and checks only the pieces the range covers; this checks what came
        over the wire."""
        self._check(disk, chunk_id)
        if offset < 0 or length < 0:
            raise InvalidArgumentError(f"range of {length} bytes at {offset}", chunk_id)
        meta = wire.DISK_RANGE.pack(disk, offset, length) + chunk_id.encode("ascii")
        h, reply, payload = await self.call(Op.READ_RANGE, meta)
        info = wire.unpack_info(chunk_id, reply)
        if payload.nbytes < _INLINE_CRC_BYTES:
            got = crc32c(payload)
        else:
            got = await asyncio.to_thread(crc32c, payload)
        if got != h.payload_crc32c or payload.nbytes != length:
            raise ChunkCorruptError(
                "a chunk range fails its checksum in transit", f"node {self.node_id}: {chunk_id}"
            )
        return payload.toreadonly(), info

    async def _check_payload(self, h: Header, info: ChunkInfo, payload: memoryview) -> None:
        if payload.nbytes < _INLINE_CRC_BYTES:
            got = crc32c(payload)
        else:
            got = await asyncio.to_thread(crc32c, payload)
        if payload.nbytes != info.stored_len or got != info.crc32c or got != h.payload_crc32c:
            raise ChunkCorruptError(
                "chunk fails its checksum (on the node's disk or in transit)",
                f"node {self.node_id}: {info.chunk_id}",
            )

    async def delete_chunk(self, disk: int, chunk_id: str) -> None:
        self._check(disk, chunk_id)
        await self.call(Op.DELETE, wire.pack_chunk_ref(disk, chunk_id))

    async def stat_chunk(self, disk: int, chunk_id: str) -> ChunkInfo:
        self._check(disk, chunk_id)
        _, meta, _ = await self.call(Op.STAT, wire.pack_chunk_ref(disk, chunk_id))
        return wire.unpack_info(chunk_id, meta)

    async def list_chunks(self, disk: int) -> list[ChunkInfo]:
        self._check(disk)
        h, _, payload = await self.call(Op.LIST, wire.DISK.pack(disk))
        self._check_listing(h, payload)
        return wire.unpack_list(payload)

    async def usage(self) -> list[DiskUsage]:
        h, _, payload = await self.call(Op.USAGE)
        self._check_listing(h, payload)
        return wire.unpack_usage(payload)

    async def qos_stats(self) -> dict[str, Any] | None:
        """What the node's fair queues counted (``NodeQos.to_dict``; None: it has none)."""
        h, _, payload = await self.call(Op.QOS_STATS)
        self._check_listing(h, payload)
        got: dict[str, Any] | None = json.loads(bytes(payload))
        return got

    def _check_listing(self, h: Header, payload: memoryview) -> None:
        # The header's CRC32C is authenticated: it covers the payload where tags do not.
        if crc32c(payload) != h.payload_crc32c:
            raise ChunkCorruptError(
                "a listing fails its checksum in transit", f"node {self.node_id}"
            )

    async def close(self) -> None:
        self._closed = True
        for opening in self._connecting.values():
            opening.cancel()
        for conn in self._conns.values():
            drop(conn)
        self._conns.clear()


def fixed_address(host: str, port: int) -> Resolver:
    return lambda: (host, port)


__all__ = ["PingReply", "RemoteNode", "aligned_buffer", "fixed_address"]
