"""One connection from a client to a served node (``RemoteNode``'s): the handshake of
``auth.py``, then pipelined requests whose replies are matched by request id and received
straight into their destination buffers, page aligned (copies into a buffer 16 bytes past a
page boundary are 5x slower on this machine, see ../shared/MACHINE.md), every frame checked
against its tag. A malformed reply, a failed tag or a lost socket closes the connection and
fails every call on it; ``RemoteNode`` then marks its node down.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes

from tectonic_emu.chunkstore import auth, wire
from tectonic_emu.chunkstore.netem import Pacer, ReadGate
from tectonic_emu.chunkstore.wire import HEADER_SIZE, FrameError, Header
from tectonic_emu.errors import ChunkCorruptError, NodeUnavailableError, reason

# Replies may be bigger than a chunk (a LIST of a full disk); this bounds what a bad peer can
# make us allocate.
MAX_REPLY_PAYLOAD = 1 << 30
_DISCARD = memoryview(bytearray(1 << 16))


def aligned_buffer(n: int) -> memoryview:
    """A writable, page-aligned view of ``n`` bytes on the heap (recycled by malloc, unlike a
    fresh ``mmap``, whose first touch is slow here)."""
    if n == 0:
        return memoryview(bytearray(0))
    raw = bytearray(n + 4096)
    address = ctypes.addressof(ctypes.c_char.from_buffer(raw))
    start = -address % 4096
    return memoryview(raw)[start : start + n]


class Call:
    __slots__ = ("dest", "future", "op")

    def __init__(
        self,
        op: int,
        future: asyncio.Future[tuple[Header, bytes, memoryview]],
        dest: memoryview | None = None,
    ) -> None:
        self.op = op
        self.future = future
        self.dest = dest  # receive the reply payload here (it must be exactly this size)


_CHALLENGE, _HEAD, _META, _PAYLOAD, _TAG = range(5)


class ClientConnection(asyncio.BufferedProtocol):
    """One connection to a node: ``ready`` is done once the handshake is (or has failed)."""

    def __init__(self, name: str, handshake: auth.ClientHandshake, pacer: Pacer | None = None):
        self.name = name
        self._handshake = handshake
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rx: auth.FrameMac | None = None
        self._local = False  # both ends loopback (set once connected)
        self._hs_buf = bytearray(auth.CHALLENGE.size)
        self._tag_buf = bytearray(auth.TAG_BYTES)
        self.pacer = pacer  # this host's emulated NIC (netem.py), shared by its connections
        self._gate = ReadGate(pacer, lambda: not self.closed)
        self.pending: dict[int, Call] = {}
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self._header_buf = bytearray(HEADER_SIZE)
        self._meta_buf = bytearray(wire.MAX_META)
        self._state = _CHALLENGE
        self._got = 0
        self._h: Header | None = None
        self._meta = b""
        self._dest: memoryview | None = None  # None: discarding a cancelled call's payload
        self._call: Call | None = None  # the call whose reply is being received
        self.writer = wire.FrameWriter()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._local = auth.is_local(
            transport.get_extra_info("sockname"), transport.get_extra_info("peername")
        )
        transport.write(self._handshake.hello)

    def connection_lost(self, exc: Exception | None) -> None:
        why = reason(exc) if exc is not None else "closed"
        self._fail(NodeUnavailableError(f"{self.name}: connection lost ({why})"))

    def pause_writing(self) -> None:
        self.writer.pause()

    def resume_writing(self) -> None:
        self.writer.resume()

    def _fail(self, error: Exception) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(error)
            self.ready.exception()  # retrieved: ``_open`` re-raises it when it waits
        self.writer.resume()
        calls, self.pending = self.pending, {}
        for call in calls.values():
            if not call.future.done():
                call.future.set_exception(error)

    def abort(self, reason: str) -> None:
        self._fail(NodeUnavailableError(f"{self.name}: {reason}"))
        if self.transport is not None:
            self.transport.abort()

    async def send(self, head: bytes, payload: memoryview | None) -> None:
        if self.pacer is not None:
            await self.pacer.before_send(len(head) + (payload.nbytes if payload else 0))
        if self.closed or self.transport is None:
            raise NodeUnavailableError(f"{self.name}: connection closed")
        try:
            await self.writer.write(self.transport, head, payload)
        except ConnectionResetError:
            raise NodeUnavailableError(f"{self.name}: connection closed") from None

    # -- receiving replies -------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == _HEAD:
            return memoryview(self._header_buf)[self._got :]
        if self._state == _CHALLENGE:
            return memoryview(self._hs_buf)[self._got :]
        if self._state == _TAG:
            return memoryview(self._tag_buf)[self._got :]
        assert self._h is not None
        if self._state == _META:
            return memoryview(self._meta_buf)[self._got : self._h.meta_len]
        remaining = self._h.payload_len - self._got
        if self._dest is not None and self._call is not None and self._call.future.done():
            # Cancelled mid-reply (a hedged read lost the race): from now on not one byte
            # more may land in the caller's buffer, which it may already be reusing.
            self._dest = None
        if self._dest is None:
            return _DISCARD[: min(remaining, _DISCARD.nbytes)]
        return self._dest[self._got :]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        self._gate.received(nbytes, self.transport)
        try:
            self._advance()
        except FrameError as e:
            self.abort(f"bad reply frame: {e}")
        except auth.AuthError as e:
            self.abort(f"cannot authenticate: {e}")

    def _advance(self) -> None:
        if self._state == _CHALLENGE and self._got == auth.CHALLENGE.size:
            assert self.transport is not None
            proof, session = self._handshake.answer(self._hs_buf, local=self._local)
            self.transport.write(proof)
            self._rx, self.writer.mac = session.receive, session.send
            self._state, self._got = _HEAD, 0
            self.ready.set_result(None)
            return
        if self._state == _HEAD and self._got == HEADER_SIZE:
            self._h = wire.unpack_header(self._header_buf, MAX_REPLY_PAYLOAD)
            self._state, self._got = _META, 0
        if self._state == _META and self._h is not None and self._got == self._h.meta_len:
            meta_view = memoryview(self._meta_buf)[: self._h.meta_len]
            wire.check_meta(self._header_buf, meta_view)
            self._meta = bytes(meta_view)
            call = self.pending.get(self._h.request_id)
            if call is not None and call.op != self._h.op:
                raise FrameError(f"reply op {self._h.op} to a request of op {call.op}")
            wanted = call is not None and not call.future.done()
            self._call = call
            if not wanted or call is None:
                self._dest = None
            elif call.dest is None or self._h.status:  # (an error reply has no payload)
                self._dest = aligned_buffer(self._h.payload_len)
            elif call.dest.nbytes == self._h.payload_len:
                self._dest = call.dest
            else:  # not the size the caller expects: do not write it, fail the call
                self._dest = None
                call.future.set_exception(
                    ChunkCorruptError(
                        f"{self._h.payload_len} bytes where {call.dest.nbytes} were expected",
                        self.name,
                    )
                )
            self._state, self._got = _PAYLOAD, 0
        if self._state == _PAYLOAD and self._h is not None and self._got == self._h.payload_len:
            self._state, self._got = _TAG, 0
        if self._state == _TAG and self._h is not None and self._got == auth.TAG_BYTES:
            h, meta, dest = self._h, self._meta, self._dest
            self._state, self._got, self._h, self._dest = _HEAD, 0, None, None
            self._call = None
            self._check_tag(h, meta, dest, bytes(self._tag_buf))

    def _check_tag(self, h: Header, meta: bytes, dest: memoryview | None, tag: bytes) -> None:
        """Deliver a reply once its tag holds: here, or for a big payload from a worker
        thread. A reply whose payload was discarded (nobody waits for it) cannot be checked
        and is dropped unread; a frame forged in its place shifts the sequence numbers, so
        the next reply fails its tag and closes the connection."""
        assert self._rx is not None
        seq = self._rx.next_seq()
        head = bytes(self._header_buf) + meta
        if not self._rx.payloads:  # the payload is bound by its CRC32C, checked by the caller
            if not self._rx.check(seq, [head], tag):
                raise auth.AuthError("a reply fails its tag (forged, replayed or cut)")
            self._deliver(h, meta, dest)
            return
        if dest is None and h.payload_len:
            self.pending.pop(h.request_id, None)
            return
        parts: list[bytes | memoryview] = [head] if dest is None else [head, dest]
        if h.payload_len < wire.THREAD_TAG_BYTES:
            if not self._rx.check(seq, parts, tag):
                raise auth.AuthError("a reply fails its tag (forged, replayed or cut)")
            self._deliver(h, meta, dest)
            return
        checked = asyncio.get_running_loop().run_in_executor(None, self._rx.check, seq, parts, tag)

        def done(f: asyncio.Future[bool]) -> None:
            if self.closed:
                return
            if f.exception() is not None or not f.result():
                self.abort("cannot authenticate: a reply fails its tag (forged, replayed or cut)")
            else:
                self._deliver(h, meta, dest)

        checked.add_done_callback(done)

    def _deliver(self, h: Header, meta: bytes, dest: memoryview | None) -> None:
        call = self.pending.pop(h.request_id, None)
        if call is not None and not call.future.done():
            call.future.set_result((h, meta, dest if dest is not None else memoryview(b"")))


def drop(conn: ClientConnection) -> None:
    """Close a connection, even one whose event loop is closed (its socket then goes with
    the garbage collector)."""
    if conn.transport is not None:
        with contextlib.suppress(RuntimeError):
            conn.transport.abort()


__all__ = ["MAX_REPLY_PAYLOAD", "Call", "ClientConnection", "aligned_buffer", "drop"]
