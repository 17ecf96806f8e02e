"""``NodeServer``: one storage node behind a TCP port, speaking ``wire.py``'s protocol.

Each connection is an ``asyncio.BufferedProtocol`` that receives straight into buffers it
already owns: a 32-byte header buffer, a meta buffer, and for a chunk write one payload buffer
from the server's pool, allocated and touched once at start (fresh memory is slow to touch on
this machine, see ../shared/MACHINE.md). Requests are pipelined: each frame becomes a task and
replies go out as they finish, in any order, matched by request id.

Backpressure: when the pool has no free buffer, or a connection has ``MAX_INFLIGHT`` requests
running, the connection stops reading until that changes, so a node never holds more than
``buffers`` chunk payloads in memory whatever its clients send.

Authentication (``auth.py``): a connection is served only after the client proves it knows
the cluster secret, and every frame after that must carry its tag. A failed handshake or tag
closes the connection and is logged, at most once per ten seconds per node.

A frame that breaks the framing rules (``wire.FrameError``) closes its connection only; every
other error becomes a typed error reply and the connection goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import json
import logging
import mmap
import os
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from tectonic_emu.chunkstore import auth, limits, wire
from tectonic_emu.chunkstore._local import LocalNode
from tectonic_emu.chunkstore.base import MAX_NODE_DELAY, BytesLike
from tectonic_emu.chunkstore.netem import LinkModel, Pacer, ReadGate
from tectonic_emu.chunkstore.wire import HEADER_SIZE, MAX_META, FrameError, Header, Op
from tectonic_emu.coding import crc32c
from tectonic_emu.errors import ChunkCorruptError, InvalidArgumentError, NoSpaceError
from tectonic_emu.qos import groups as traffic
from tectonic_emu.qos.fairqueue import Ticket
from tectonic_emu.qos.node import NodeQos
from tectonic_emu.sim.devices import Disk

log = logging.getLogger(__name__)

# The name of the task that closes stalled and idle connections (``limits.sweep``).
SWEEPER = "tectonic-node-sweeper"
# Requests one connection may have running before the node stops reading from it.
MAX_INFLIGHT = 64
# Below this many bytes a checksum runs on the event loop rather than in a worker thread.
_INLINE_CRC_BYTES = 256 << 10


class BufferPool:
    """``count`` page-aligned buffers of ``size`` bytes, touched once up front."""

    def __init__(self, size: int, count: int) -> None:
        self.size = size
        self._free: list[mmap.mmap] = []
        for _ in range(count):
            buf = mmap.mmap(-1, max(size, 1))
            for off in range(0, len(buf), mmap.PAGESIZE):
                buf[off] = 0  # first touch now, not on the data path
            self._free.append(buf)
        self._waiters: collections.deque[_Connection] = collections.deque()

    def acquire(self, conn: _Connection) -> mmap.mmap | None:
        """A free buffer, or None: ``conn`` is then handed one through ``got_buffer``."""
        if self._free:
            return self._free.pop()
        self._waiters.append(conn)
        return None

    def release(self, buf: mmap.mmap) -> None:
        while self._waiters:
            conn = self._waiters.popleft()
            if not conn.closed:
                conn.got_buffer(buf)
                return
        self._free.append(buf)

    def close(self) -> None:
        # Views of a buffer may outlive the request (a worker's job object): let the garbage
        # collector unmap them rather than ``mmap.close()``, which refuses while views exist.
        self._free.clear()


class NodeServer:
    """Serve ``node`` on TCP. ``max_payload`` bounds a chunk (the cluster's block size);
    ``delay`` seconds are added before every reply but PING's (a slow node, for studying tail
    latency; ``SET_DELAY`` changes it at run time). ``secret``: the cluster's 32-byte secret,
    which every client must prove it knows (``auth.py``). ``tls``: a server context, to speak
    TLS on every connection. ``qos``: the fair queues of the node's disks (``tectonic_emu/qos``),
    through which every disk request goes in the TrafficGroup its frame names. ``devices``:
    a modelled device per disk, whose time every disk request also takes."""

    def __init__(
        self,
        node: LocalNode,
        *,
        secret: bytes,
        max_payload: int,
        buffers: int = 8,
        per_connection_buffers: int | None = None,
        delay: float = 0.0,
        link: LinkModel | None = None,
        tls: ssl.SSLContext | None = None,
        qos: NodeQos | None = None,
        devices: Sequence[Disk] = (),
    ) -> None:
        self.node = node
        # Each disk's fair queue between TrafficGroups (``tectonic_emu/qos``; None: none).
        self.qos = qos
        # Each disk's emulated device (``sim/devices.py`` in real time), or none: a request
        # then takes at least the modelled device's time (``cluster create --disk-model``).
        self.devices = list(devices)
        self.tls = tls  # encrypt every connection (``tectonic_emu/tls.py``)
        self.secret = auth.check_secret(secret)
        self.refusals = auth.RefusalLog(log, f"node {node.node_id}")
        # The node host's emulated NIC (``netem.py``), when the cluster models a network.
        self.pacer = Pacer.of(link, chunk=max_payload)
        self.max_payload = max_payload
        self.delay = delay
        self.pool = BufferPool(max_payload, buffers)
        # No connection takes every buffer (``limits.py``).
        self.per_connection_buffers = per_connection_buffers or max(1, buffers // 2)
        self.closings = auth.RefusalLog(log, f"node {node.node_id}: closing a connection")
        self.max_connections = limits.max_connections(limits.raise_fd_limit())
        self._sweeper: asyncio.Task[None] | None = None
        self.started = time.time()
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._free_cache: tuple[float, int] = (0.0, 0)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen; returns the (host, port) bound (port 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, ssl=self.tls
        )
        limits.quiet_accept_errors(loop, self.refusals)
        self._sweeper = loop.create_task(limits.sweep(lambda: self.connections), name=SWEEPER)
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self, grace: float = 2.0) -> None:
        """Stop listening, give running requests ``grace`` seconds to finish and reply (with
        no injected delay), then drop every connection, cancel what is left (a cancelled
        chunk write leaves no chunk) and close the node."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.delay = 0.0
        running = [t for conn in self.connections for t in conn.tasks]
        if running:
            await asyncio.wait(running, timeout=grace)
        tasks: list[asyncio.Task[None]] = []
        for conn in list(self.connections):
            conn.abort()
            tasks.extend(conn.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        await self.node.close()
        self.pool.close()

    # -- requests ----------------------------------------------------------------------------
    def scheduled(self, h: Header, meta: bytes) -> contextlib.AbstractAsyncContextManager[Any]:
        """A slot on the request's disk, in the request's group, held until its reply has
        gone (a whole-chunk read is read from the disk as it is sent), and the emulated
        device's time for it; for an op that uses no disk, or a disk the node lacks (the
        op's own check answers it), nothing."""
        kind = _DISK_OPS.get(h.op)
        if kind is None or len(meta) < wire.DISK.size or (self.qos is None and not self.devices):
            return contextlib.nullcontext()
        (disk,) = wire.DISK.unpack_from(meta)
        if disk >= self.node.disks:
            return contextlib.nullcontext()
        write, nbytes = kind
        if h.op in (Op.WRITE, Op.WRITE_UNSYNCED):
            nbytes = h.payload_len
        elif h.op == Op.READ_RANGE and len(meta) >= wire.DISK_RANGE.size:
            nbytes = wire.DISK_RANGE.unpack_from(meta)[2]
        return self._held(disk, nbytes, write=write, sync=h.op == Op.SYNC)

    @contextlib.asynccontextmanager
    async def _held(
        self, disk: int, nbytes: int | None, *, write: bool, sync: bool
    ) -> AsyncIterator[Ticket]:
        """The disk's slot (when scheduled), then the request; an emulated device's time runs
        beside it, and the request is done when both are (a size known only once read, a
        whole chunk's, is charged after)."""
        if self.qos is not None:
            slot = self.qos.serving(disk, nbytes, write=write)
        else:
            slot = contextlib.nullcontext(Ticket(traffic.current(), write, nbytes or 0, 0.0, 0.0))
        async with slot as ticket:
            device = self.devices[disk] if self.devices else None
            charge: asyncio.Future[None] | None = None
            if device is not None and nbytes is not None:
                use = (
                    device.flush(0)
                    if sync
                    else device.write(nbytes)
                    if write
                    else device.read(nbytes)
                )
                charge = asyncio.ensure_future(use)
            try:
                yield ticket
            except BaseException:
                if charge is not None:
                    charge.cancel()
                raise
            if charge is not None:
                await charge
            elif device is not None:
                await device.read(ticket.nbytes)

    def sending(self, nbytes: int) -> contextlib.AbstractAsyncContextManager[Any]:
        """A turn on the node's emulated NIC for a reply frame of ``nbytes``, in the
        request's group, when the node has one and schedules it (``NodeQos.nic``)."""
        if self.qos is None or self.qos.nic is None:
            return contextlib.nullcontext()
        return self.qos.nic.serving(traffic.current(), nbytes, write=False)

    def _free_bytes(self) -> int:
        now = time.monotonic()
        if now - self._free_cache[0] > 1.0:
            vfs = os.statvfs(self.node.root)
            self._free_cache = (now, vfs.f_bavail * vfs.f_frsize)
        return self._free_cache[1]

    async def handle(
        self, h: Header, meta: bytes, payload: memoryview | None
    ) -> tuple[bytes, BytesLike | FilePayload, int]:
        """Run one request: (reply meta, reply payload, reply payload CRC)."""
        node = self.node
        if h.op == Op.PING:
            ping = wire.PING_REPLY.pack(
                node.node_id, os.getpid(), node.disks, 0, self.started, self.max_payload
            )
            return ping, b"", 0
        if h.op in (Op.WRITE, Op.WRITE_UNSYNCED):
            (disk, flags), chunk_id = wire.unpack_chunk_ref(meta, wire.DISK_FLAGS)
            sync = h.op == Op.WRITE
            view = payload if payload is not None else memoryview(b"")
            # Not checked here: the node checks the payload against the writer's checksum
            # (the seam's contract) in the pass that makes its piece checksums, which
            # covers the wire too (a pass here as well cost one more over every chunk).
            try:
                await node.write_chunk(
                    disk, chunk_id, view, crc32c=h.payload_crc32c, flags=flags, sync=sync
                )
            except ChunkCorruptError as exc:
                raise _BadPayload("payload fails its checksum in transit", chunk_id) from exc
            return b"", b"", 0
        if h.op in (Op.READ, Op.STAT, Op.DELETE):
            (disk,), chunk_id = wire.unpack_chunk_ref(meta)
            if h.op == Op.READ:
                # The payload goes from the page cache to the socket (sendfile), unchecked
                # here: the client checks it against this checksum, which covers the disk and
                # the wire in one pass.
                fd, info, offset = await node.open_chunk(disk, chunk_id)
                return (wire.pack_info(info), FilePayload(fd, offset, info.stored_len), info.crc32c)
            if h.op == Op.STAT:
                return wire.pack_info(await node.stat_chunk(disk, chunk_id)), b"", 0
            await node.delete_chunk(disk, chunk_id)
            return b"", b"", 0
        if h.op == Op.READ_RANGE:
            (disk, offset, length), chunk_id = wire.unpack_chunk_ref(meta, wire.DISK_RANGE)
            if length > self.max_payload:
                raise InvalidArgumentError(
                    f"a range of {length} bytes (at most {self.max_payload})"
                )
            # Checked here, piece by piece (the client has no piece checksums), then sent with
            # its CRC32C for the wire: a small read, so a copy costs less than a sendfile.
            data, info = await node.read_chunk_range(disk, chunk_id, offset, length)
            if length < _INLINE_CRC_BYTES:
                got = crc32c(data)
            else:
                got = await asyncio.get_running_loop().run_in_executor(None, crc32c, data)
            return wire.pack_info(info), data, got
        if h.op == Op.SYNC:
            (disk,) = _unpack_exact(wire.DISK, meta)
            await node.sync_disk(disk)
            return b"", b"", 0
        if h.op == Op.LIST:
            (disk,), _ = wire.unpack_chunk_ref(meta)
            listing = wire.pack_list(await node.list_chunks(disk))
            return b"", listing, crc32c(listing)
        if h.op == Op.QOS_STATS:
            snapshot = self.qos.to_dict() if self.qos is not None else None
            body = json.dumps(snapshot).encode()
            return b"", body, crc32c(body)
        if h.op == Op.USAGE:
            usage = wire.pack_usage(await node.usage())
            return b"", usage, crc32c(usage)
        if h.op == Op.RESERVE:
            (nbytes,) = _unpack_exact(wire.RESERVE, meta)
            if nbytes > self._free_bytes():
                raise NoSpaceError(f"node {node.node_id} cannot take {nbytes} more bytes")
            return b"", b"", 0
        if h.op == Op.SET_DELAY:
            (delay,) = _unpack_exact(wire.DELAY, meta)
            if not 0.0 <= delay <= MAX_NODE_DELAY:
                raise InvalidArgumentError(f"delay must be 0..{MAX_NODE_DELAY:g} s, not {delay}")
            self.delay = delay
            return b"", b"", 0
        raise InvalidArgumentError(f"op {h.op} not served")  # unreachable: checked in header


# Ops that hold a disk slot: (a write?, bytes; None: known once read). Writes' bytes are
# their payload's, a range read's its length; a sync or a delete costs one operation.
_DISK_OPS: dict[int, tuple[bool, int | None]] = {
    Op.WRITE: (True, 0),
    Op.WRITE_UNSYNCED: (True, 0),
    Op.READ: (False, None),
    Op.READ_RANGE: (False, 0),
    Op.SYNC: (True, 0),
    Op.DELETE: (True, 0),
}


class _BadPayload(ChunkCorruptError):
    default_errno = errno.EBADMSG


@dataclass(frozen=True, slots=True)
class FilePayload:
    """A reply payload still in a file: ``count`` bytes of ``fd`` from ``offset``. The
    connection sends it with ``sendfile`` and closes ``fd``."""

    fd: int
    offset: int
    count: int


def _unpack_exact(fmt: Any, meta: bytes) -> tuple[Any, ...]:
    if len(meta) != fmt.size:
        raise InvalidArgumentError(f"meta of {len(meta)} bytes, op needs {fmt.size}")
    return tuple(fmt.unpack(meta))


_HELLO, _PROOF, _HEADER, _META, _PAYLOAD, _WAIT_BUFFER, _TAG = range(7)


@dataclass(frozen=True, slots=True)
class _Unchecked:
    """A frame whose tag is checked in a worker thread (a big payload), before it runs."""

    seq: int
    head: bytes
    tag: bytes


class _Connection(asyncio.BufferedProtocol):
    """One client connection: parse frames into owned buffers, run them as tasks."""

    def __init__(self, server: NodeServer) -> None:
        self.server = server
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()
        self._transport: asyncio.Transport | None = None
        self._header_buf = bytearray(HEADER_SIZE)
        self._meta_buf = bytearray(MAX_META)
        self._hs_buf = bytearray(auth.HELLO.size)
        self._tag_buf = bytearray(auth.TAG_BYTES)
        self._handshake: auth.ServerHandshake | None = None  # made once connected
        self._rx: auth.FrameMac | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._peer: object = "a client"
        self._state = _HELLO
        self._got = 0
        self._h: Header | None = None
        self._meta = b""  # as received (the tag covers it)
        self._op_meta = b""  # without the TrafficGroup (``wire.split_group``)
        self._group = traffic.DEFAULT
        self._payload: mmap.mmap | None = None
        self._paused = False  # backpressure: no buffer, or too many requests running
        self._last_rx = time.monotonic()  # a byte arrived, or reading resumed
        self.held = 0  # payload buffers this connection holds (``per_connection_buffers``)
        self._over_cap = False  # waiting for one of its own buffers to come back
        # Reading held while the emulated NIC's ingress is dry (netem.py).
        self._gate = ReadGate(server.pacer, lambda: not self._paused and not self.closed)
        self.writer = wire.FrameWriter()

    # -- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._peer = transport.get_extra_info("peername") or "a client"
        if len(self.server.connections) >= self.server.max_connections:
            # Accept no more than the descriptors allow, so accept itself never hits EMFILE.
            self.server.refusals.refused(self._peer, "too many connections")
            self.abort()
            return
        local = auth.is_local(transport.get_extra_info("sockname"), self._peer)
        self._handshake = auth.ServerHandshake(
            self.server.secret, self.server.node.node_id, local=local
        )
        self.server.connections.add(self)
        self._deadline = asyncio.get_running_loop().call_later(
            auth.HANDSHAKE_TIMEOUT, self._handshake_timed_out
        )

    def _handshake_timed_out(self) -> None:
        if self._rx is None and not self.closed:
            self._refuse(f"no handshake in {auth.HANDSHAKE_TIMEOUT:.0f} s")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._deadline is not None:
            self._deadline.cancel()
        self.writer.resume()  # replies waiting for the socket to drain now fail and end
        self.server.connections.discard(self)
        if self._payload is not None:
            self.server.pool.release(self._payload)
            self._payload = None

    def pause_writing(self) -> None:
        self.writer.pause()

    def resume_writing(self) -> None:
        self.writer.resume()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == _HEADER:
            return memoryview(self._header_buf)[self._got :]
        if self._state == _HELLO:
            return memoryview(self._hs_buf)[self._got :]
        if self._state == _PROOF:
            return memoryview(self._hs_buf)[self._got : auth.PROOF_BYTES]
        if self._state == _TAG:
            return memoryview(self._tag_buf)[self._got :]
        assert self._h is not None
        if self._state == _META:
            return memoryview(self._meta_buf)[self._got : self._h.meta_len]
        assert self._state == _PAYLOAD and self._payload is not None
        return memoryview(self._payload)[self._got : self._h.payload_len]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        self._last_rx = time.monotonic()
        self._gate.received(nbytes, self._transport)
        try:
            self._advance()
        except FrameError as e:
            if self._rx is None:  # not authenticated: a refusal, logged as one
                self._refuse(str(e))
            else:
                log.warning("node %d: closing a connection: %s", self.server.node.node_id, e)
                self.abort()
        except auth.AuthError as e:
            self._refuse(str(e))

    def _refuse(self, reason: str) -> None:
        self.server.refusals.refused(self._peer, reason)
        self.abort()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    # -- limits (``limits.py``) ------------------------------------------------------------------
    def quiet_for(self, now: float) -> tuple[float, bool, bool]:
        begun = self._state in (_META, _PAYLOAD, _TAG) or (self._state == _HEADER and self._got)
        being_read = not self._paused and not self._gate.held
        return now - self._last_rx, bool(begun) and being_read, bool(self.tasks)

    def close_for(self, reason: str) -> None:
        self.server.closings.refused(self._peer, reason)
        self.abort()

    def _take_buffer(self) -> bool:
        """A payload buffer for the frame being read, or False: reading waits (paused) for
        the pool, or for one of this connection's own when it holds its share."""
        if self.held >= self.server.per_connection_buffers:
            self._over_cap = True
        else:
            buf = self.server.pool.acquire(self)
            if buf is not None:
                self.held += 1
                self._payload = buf
                self._state = _PAYLOAD
                return True
        self._state = _WAIT_BUFFER
        self._pause()
        return False

    def _gave_back(self) -> None:
        """One of this connection's buffers went back to the pool."""
        self.held -= 1
        if self._over_cap and not self.closed:
            self._over_cap = False
            if self._take_buffer():
                self._resume()

    # -- framing -----------------------------------------------------------------------------
    def _advance(self) -> None:
        if self._state == _HELLO and self._got == auth.HELLO.size:
            assert self._handshake is not None and self._transport is not None
            challenge = self._handshake.challenge(self._hs_buf)
            self._transport.write(challenge)
            self._state, self._got = _PROOF, 0
            return
        if self._state == _PROOF and self._got == auth.PROOF_BYTES:
            assert self._handshake is not None
            session = self._handshake.verify(memoryview(self._hs_buf)[: auth.PROOF_BYTES])
            self._handshake = None
            self._rx, self.writer.mac = session.receive, session.send
            if self._deadline is not None:
                self._deadline.cancel()
            self._state, self._got = _HEADER, 0
            return
        if self._state == _HEADER and self._got == HEADER_SIZE:
            self._h = wire.unpack_header(self._header_buf, self.server.max_payload)
            self._got = 0
            self._state = _META
        if self._state == _META and self._h is not None and self._got == self._h.meta_len:
            meta = memoryview(self._meta_buf)[: self._h.meta_len]
            wire.check_meta(self._header_buf, meta)
            self._group, self._op_meta = wire.split_group(self._h.status, bytes(meta))
            if self._h.payload_len and self._h.op not in (Op.WRITE, Op.WRITE_UNSYNCED):
                raise FrameError(f"op {Op(self._h.op).name} takes no payload")
            self._meta = bytes(meta)
            self._got = 0
            if self._h.payload_len == 0:
                self._state = _TAG
                return
            if not self._take_buffer():
                return
        if self._state == _PAYLOAD and self._h is not None and self._got == self._h.payload_len:
            self._state, self._got = _TAG, 0
        if self._state == _TAG and self._h is not None and self._got == auth.TAG_BYTES:
            self._check_tag()

    def _check_tag(self) -> None:
        """Check the frame's tag here, or for a big payload hand it to the request's task to
        check in a worker thread; a frame that fails it closes the connection (AuthError)."""
        assert self._rx is not None and self._h is not None
        seq = self._rx.next_seq()
        head = bytes(self._header_buf) + self._meta
        payload = self._payload
        if self._h.payload_len < wire.THREAD_TAG_BYTES or not self._rx.payloads:
            parts: list[bytes | memoryview] = [head]
            if payload is not None and self._rx.payloads:
                parts.append(memoryview(payload)[: self._h.payload_len])
            ok = self._rx.check(seq, parts, self._tag_buf)
            for part in parts[1:]:
                assert isinstance(part, memoryview)
                part.release()
            if not ok:
                raise auth.AuthError("a frame fails its tag (forged, replayed or cut)")
            self._dispatch(payload)
        else:
            self._dispatch(payload, _Unchecked(seq, head, bytes(self._tag_buf)))

    def got_buffer(self, buf: mmap.mmap) -> None:
        """The pool hands us the buffer we waited for."""
        self.held += 1
        self._payload = buf
        self._state = _PAYLOAD
        self._resume()

    def _dispatch(self, payload: mmap.mmap | None, unchecked: _Unchecked | None = None) -> None:
        assert self._h is not None
        h, meta, group = self._h, self._op_meta, self._group
        self._payload = None
        self._state, self._got, self._h = _HEADER, 0, None
        with traffic.using(group):  # the task's context: its disk requests are the group's
            task = asyncio.get_running_loop().create_task(self._run(h, meta, payload, unchecked))
        self.tasks.add(task)
        task.add_done_callback(self._done)
        if len(self.tasks) >= MAX_INFLIGHT:
            self._pause()

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if len(self.tasks) < MAX_INFLIGHT and self._state != _WAIT_BUFFER:
            self._resume()

    def _pause(self) -> None:
        if not self._paused and self._transport is not None and not self.closed:
            self._paused = True
            self._transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and self._transport is not None and not self.closed:
            self._paused = False
            self._last_rx = time.monotonic()  # the time it was not read is not the peer's
            if not self._gate.held:
                self._transport.resume_reading()

    def abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    # -- one request -------------------------------------------------------------------------
    async def _run(
        self, h: Header, meta: bytes, payload: mmap.mmap | None, unchecked: _Unchecked | None
    ) -> None:
        async with self.server.scheduled(h, meta) as ticket:
            await self._serve(h, meta, payload, unchecked, ticket)

    async def _serve(
        self,
        h: Header,
        meta: bytes,
        payload: mmap.mmap | None,
        unchecked: _Unchecked | None,
        ticket: Ticket | None,
    ) -> None:
        server = self.server
        status, reply_meta, reply_crc = 0, b"", 0
        reply_payload: BytesLike | FilePayload = b""
        try:
            view = memoryview(payload)[: h.payload_len] if payload is not None else None
            try:
                if unchecked is not None and not await self._tag_holds(unchecked, view):
                    return
                reply_meta, reply_payload, reply_crc = await server.handle(h, meta, view)
                if ticket is not None and isinstance(reply_payload, FilePayload):
                    ticket.nbytes = reply_payload.count  # a whole chunk, read as it is sent
            finally:
                if view is not None:
                    view.release()
                if payload is not None:
                    server.pool.release(payload)
                    self._gave_back()
        except (FrameError, ValueError, OSError) as e:
            bad_request = isinstance(e, (FrameError, ValueError))
            status = errno.EINVAL if bad_request else wire.error_status(e)
            reply_meta = str(e).encode("utf-8", "replace")[:MAX_META]
            reply_payload, reply_crc = b"", 0
        except Exception as e:  # a bug: answer it, keep serving, leave a trace
            log.exception("node %d: %s failed", server.node.node_id, Op(h.op).name)
            status, reply_meta = errno.EIO, f"internal error: {e!r}".encode()[:MAX_META]
            reply_payload, reply_crc = b"", 0
        try:
            if server.delay and h.op not in (Op.PING, Op.SET_DELAY):
                await asyncio.sleep(server.delay)
            size = (
                reply_payload.count
                if isinstance(reply_payload, FilePayload)
                else memoryview(reply_payload).nbytes
            )
            frame = HEADER_SIZE + len(reply_meta) + size
            async with server.sending(frame):
                if server.pacer is not None:
                    await server.pacer.before_send(frame)
                if self.closed or self._transport is None:
                    return
                await self._reply(h, status, reply_meta, reply_payload, reply_crc)
        finally:
            if isinstance(reply_payload, FilePayload):
                server.node.close_read(reply_payload.fd)  # its pages dropped, as in the node

    async def _tag_holds(self, frame: _Unchecked, payload: memoryview | None) -> bool:
        """Whether a frame's tag holds, checked in a worker thread; one that fails closes the
        connection (requests running on it finish, their replies are dropped)."""
        assert self._rx is not None
        parts: list[bytes | memoryview] = [frame.head]
        if payload is not None:
            parts.append(payload)
        loop = asyncio.get_running_loop()
        if await loop.run_in_executor(None, self._rx.check, frame.seq, parts, frame.tag):
            return True
        if not self.closed:
            self._refuse("a frame fails its tag (forged, replayed or cut)")
        return False

    async def _reply(
        self,
        h: Header,
        status: int,
        meta: bytes,
        payload: BytesLike | FilePayload,
        crc: int,
    ) -> None:
        assert self._transport is not None
        size = payload.count if isinstance(payload, FilePayload) else memoryview(payload).nbytes
        head = wire.pack_header(
            h.op, h.request_id, meta, payload_len=size, payload_crc32c=crc, status=status
        )
        # The client went away (reset, broken pipe): nothing to answer.
        with contextlib.suppress(ConnectionError):
            if isinstance(payload, FilePayload):
                try:
                    await self.writer.write_file(
                        self._transport, head, payload.fd, payload.offset, payload.count
                    )
                finally:
                    if (self._paused or self._gate.held) and not self.closed:  # sendfile resumed it
                        self._transport.pause_reading()
            else:
                body = memoryview(payload)
                await self.writer.write(self._transport, head, body if body.nbytes else None)


__all__ = ["SWEEPER", "BufferPool", "FilePayload", "NodeServer"]
