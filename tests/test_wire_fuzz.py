"""Frames thrown at a real node server over TCP (docs/wire-protocol.md).

Frames are built here with a packer of their own, from the layout in the doc, and sent raw on
blocking sockets after the handshake of ``chunkstore/auth.py`` (a ``Link``), each followed by
its tag; replies are checked against theirs. The hypothesis tests mangle well-formed frames
(flipped bytes, cut frames, garbage, fields the server must refuse, metas it must answer
with EINVAL). After every example the node must still be serving (its loop running, nothing
logged as a bug, every pool buffer back), must hold only chunks that intact, valid WRITE
frames carried, each with exactly its payload, and must answer a fresh ``RemoteNode``. Plain
tests cover error replies, pipelining, limits and backpressure, and replies stuck behind an
unread socket when the connection ends. Unauthenticated, forged, replayed and spliced frames
must close their connection having done nothing.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import itertools
import logging
import math
import os
import random
import socket
import struct
import termios
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import google_crc32c
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tectonic_emu.chunkstore import auth, wire
from tectonic_emu.chunkstore.base import is_chunk_id
from tectonic_emu.chunkstore.remote import RemoteNode, fixed_address
from tectonic_emu.chunkstore.server import MAX_INFLIGHT, SWEEPER
from tectonic_emu.chunkstore.wire import MAX_META, Op
from tectonic_emu.errors import (
    AlreadyExistsError,
    ChunkCorruptError,
    ChunkNotFoundError,
    InvalidArgumentError,
    NodeUnavailableError,
    TectonicError,
)
from tests.node_thread import SECRET, ThreadedNodeServer

T = TypeVar("T")

NODE_ID = 7
DISKS = 3
MAX_PAYLOAD = 1 << 20
BUFFERS = 4
KNOWN = "known.0"  # on disk 0, written at start: the liveness check reads it
KNOWN_DATA = bytes(range(256)) * 40
SENTINEL = (1 << 64) - 1  # request id of the PING sent after a frame that gets a reply
TIMEOUT = 10.0  # seconds a socket waits: a server that hangs fails the test, slowly

# Bytes 0..27 of a frame header, as docs/wire-protocol.md spells them (not wire._HEADER).
_HEAD = struct.Struct("<2sBBHHQQI")
_U32 = struct.Struct("<I")


def crc(data: bytes) -> int:
    return int(google_crc32c.value(bytes(data)))


def frame(
    op: int,
    request_id: int = 1,
    meta: bytes = b"",
    payload: bytes = b"",
    *,
    magic: bytes = b"TW",
    version: int = 1,
    status: int = 0,
    meta_len: int | None = None,
    payload_len: int | None = None,
    payload_crc: int | None = None,
) -> bytes:
    """A whole frame with a correct header checksum over whatever fields it is given."""
    head = _HEAD.pack(
        magic,
        version,
        op,
        status,
        len(meta) if meta_len is None else meta_len,
        request_id,
        len(payload) if payload_len is None else payload_len,
        crc(payload) if payload_crc is None else payload_crc,
    )
    return head + _U32.pack(google_crc32c.extend(google_crc32c.value(head), meta)) + meta + payload


class Link:
    """A blocking socket to the node after the handshake: frames sent with ``sendall`` get
    their tags (``seal``), replies read with ``read_reply`` have theirs checked."""

    def __init__(
        self,
        sock: socket.socket,
        secret: bytes = SECRET,
        node_id: int = NODE_ID,
        *,
        payload_tags: bool = True,
    ):
        self.sock = sock
        handshake = auth.ClientHandshake(secret, node_id, payload_tags=payload_tags)
        sock.sendall(handshake.hello)
        challenge = _recv_exact(sock, auth.CHALLENGE.size)
        proof, self.session = handshake.answer(challenge, local=True)
        sock.sendall(proof)

    def seal(self, one_frame: bytes) -> bytes:
        """The frame and its tag, as the next frame this side sends (a tag over the header
        and meta alone when the session has no payload tags)."""
        mac = self.session.send
        covered = one_frame if mac.payloads else one_frame[: 32 + _meta_len(one_frame)]
        return one_frame + mac.tag(mac.next_seq(), [covered])

    def sendall(self, frames: bytes) -> None:
        """Send whole frames, back to back, each sealed in turn."""
        out, pos = bytearray(), 0
        while pos < len(frames):
            meta_len = _meta_len(frames[pos:])
            payload_len = int.from_bytes(frames[pos + 16 : pos + 24], "little")
            end = pos + 32 + meta_len + payload_len
            assert end <= len(frames), "sendall takes whole frames"
            out += self.seal(frames[pos:end])
            pos = end
        self.sock.sendall(out)

    def send_raw(self, data: bytes) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(data)

    def recv(self, n: int) -> bytes:
        return self.sock.recv(n)

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def getsockname(self) -> Any:
        return self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _meta_len(frame_bytes: bytes) -> int:
    return int.from_bytes(frame_bytes[6:8], "little")


@dataclass(frozen=True)
class Reply:
    op: int
    status: int
    request_id: int
    meta: bytes
    payload: bytes


class _Cut(Exception):
    """The peer closed in the middle of a frame."""


def _recv_exact(sock: socket.socket | Link, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(min(n - len(buf), 1 << 20))
        if not got:
            raise _Cut(f"closed after {len(buf)} of {n} bytes")
        buf += got
    return bytes(buf)


def read_reply(sock: Link) -> Reply | None:
    """The next reply frame, checked (its tag too); None when the server closed between
    frames."""
    first = sock.recv(1)
    if not first:
        return None
    head = first + _recv_exact(sock, 31)
    magic, version, op, status, meta_len, request_id, payload_len, payload_crc = _HEAD.unpack_from(
        head
    )
    assert (magic, version) == (b"TW", 1)
    assert meta_len <= MAX_META
    meta = _recv_exact(sock, meta_len)
    (header_crc,) = _U32.unpack_from(head, 28)
    assert header_crc == google_crc32c.extend(google_crc32c.value(head[:28]), meta)
    payload = _recv_exact(sock, payload_len)
    assert payload_crc == crc(payload)
    tag = _recv_exact(sock, auth.TAG_BYTES)
    mac = sock.session.receive
    covered = head + meta + payload if mac.payloads else head + meta
    assert mac.check(mac.next_seq(), [covered], tag), "a reply fails its tag"
    return Reply(op, status, request_id, meta, payload)


def read_replies(sock: Link, n: int) -> dict[int, Reply]:
    """``n`` replies on a connection that must stay open, by request id."""
    replies: dict[int, Reply] = {}
    for _ in range(n):
        reply = read_reply(sock)
        assert reply is not None, "the server closed a connection that should stay open"
        assert reply.request_id not in replies
        replies[reply.request_id] = reply
    return replies


def drain(sock: Link) -> list[Reply]:
    """Whole replies until the server closes (a reset or a cut frame counts as closed)."""
    replies: list[Reply] = []
    try:
        while (reply := read_reply(sock)) is not None:
            replies.append(reply)
    except (ConnectionError, _Cut):
        pass
    return replies


def send(sock: Link | socket.socket, data: bytes) -> None:
    """Send what the server takes, as it is (tags included, if any); it may close early on a
    bad frame."""
    raw = sock.sock if isinstance(sock, Link) else sock
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        raw.sendall(data)


# -- the node under test ---------------------------------------------------------------------
class _Collector(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(self.format(record))


@dataclass(repr=False)
class Node:
    srv: ThreadedNodeServer
    # Chunks sent in intact, valid WRITE frames: the only ones the node may hold.
    valid: dict[tuple[int, str], bytes] = field(default_factory=dict)
    verified: set[tuple[int, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)  # logged errors, loop exceptions

    def __repr__(self) -> str:
        return f"Node({self.srv.address}, {len(self.valid)} chunks sent)"

    def on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.srv.loop).result(30)

    def expect_written(self, req: Request) -> None:
        """Note a WRITE about to be sent intact: its chunk may (and then must) be stored."""
        if req.chunk is not None:
            self.valid[req.chunk] = req.payload

    def connect_raw(self) -> socket.socket:
        """A connection with no handshake."""
        sock = socket.create_connection(self.srv.address, timeout=TIMEOUT)
        sock.settimeout(TIMEOUT)
        return sock

    def connect(self) -> Link:
        return Link(self.connect_raw())


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    srv = ThreadedNodeServer(
        tmp_path_factory.mktemp("node"),
        node_id=NODE_ID,
        disks=DISKS,
        max_payload=MAX_PAYLOAD,
        buffers=BUFFERS,
        sync=False,
    )
    n = Node(srv)
    handler = _Collector(n.problems)
    server_log = logging.getLogger("tectonic_emu.chunkstore.server")
    server_log.addHandler(handler)

    def on_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        n.problems.append(f"{context.get('message')}: {context.get('exception')!r}")

    srv.loop.call_soon_threadsafe(srv.loop.set_exception_handler, on_exception)
    n.on_loop(srv.local.write_chunk(0, KNOWN, KNOWN_DATA, crc32c=crc(KNOWN_DATA)))
    n.valid[(0, KNOWN)] = KNOWN_DATA
    try:
        yield n
    finally:
        server_log.removeHandler(handler)
        srv.stop()


_ids = itertools.count()


def fresh_id(tag: str = "c") -> str:
    return f"{tag}{next(_ids):06d}"


async def _quiesce() -> None:
    """Wait until no task but this one runs on the loop (every dispatched request is done)."""
    me = asyncio.current_task()
    while others := [t for t in asyncio.all_tasks() if t is not me and t.get_name() != SWEEPER]:
        await asyncio.wait(others)


async def _free_buffers(n: Node) -> int:
    return len(n.srv.server.pool._free)


def wait_until(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


async def _liveness(address: tuple[str, int]) -> None:
    remote = RemoteNode(
        NODE_ID, DISKS, fixed_address(*address), secret=SECRET, request_timeout=TIMEOUT
    )
    try:
        ping = await remote.ping(wait=TIMEOUT)
        assert (ping.node_id, ping.disks, ping.max_payload) == (NODE_ID, DISKS, MAX_PAYLOAD)
        data, info = await remote.read_chunk(0, KNOWN)
        assert bytes(data) == KNOWN_DATA
        assert (info.stored_len, info.crc32c) == (len(KNOWN_DATA), crc(KNOWN_DATA))
    finally:
        await remote.close()


def check_node(n: Node) -> None:
    """(a) still serving, (b) holds only chunks of valid frames, whole, (c) answers a client."""
    assert n.srv.loop.is_running()
    problems = n.problems[:]
    n.problems.clear()  # reported once, by the example that caused them
    assert problems == []
    n.on_loop(_quiesce())
    wait_until(lambda: n.on_loop(_free_buffers(n)) == BUFFERS, "pool buffers to come back")
    assert n.srv.server.delay == 0.0
    local = n.srv.local
    listed = set()
    for disk in range(DISKS):
        for info in n.on_loop(local.list_chunks(disk)):
            key = (disk, info.chunk_id)
            listed.add(key)
            assert key in n.valid, f"chunk {key} was never sent in a valid WRITE frame"
            want = n.valid[key]
            assert (info.stored_len, info.crc32c, info.flags) == (len(want), crc(want), 0)
            if key not in n.verified:
                data, _ = n.on_loop(local.read_chunk(disk, info.chunk_id))
                assert bytes(data) == want
                n.verified.add(key)
    # nothing was stored under any other name either
    for dirpath, _, files in os.walk(local.root):
        for name in files:
            rel = Path(dirpath, name).relative_to(local.root).parts
            assert len(rel) == 3 and rel[0].startswith("d"), f"stray file {rel}"
            assert (int(rel[0][1:]), name) in listed, f"stray file {rel}"
    asyncio.run(_liveness(n.srv.address))


# -- well-formed requests, and ways to break them -------------------------------------------
@dataclass(frozen=True)
class Request:
    op: Op
    meta: bytes = b""
    payload: bytes = b""
    chunk: tuple[int, str] | None = None  # what a WRITE stores
    status: int = 0  # of its reply

    def encode(self, request_id: int) -> bytes:
        return frame(self.op, request_id, self.meta, self.payload)


def write_request(disk: int, chunk_id: str, payload: bytes, flags: int = 0) -> Request:
    meta = wire.DISK_FLAGS.pack(disk, flags) + chunk_id.encode()
    return Request(Op.WRITE, meta, payload, (disk, chunk_id))


def ref(disk: int, chunk_id: str) -> bytes:
    return wire.DISK.pack(disk) + chunk_id.encode()


payload_sizes = st.one_of(
    st.integers(0, 2000),
    st.sampled_from([(256 << 10) - 1, 256 << 10, 300_000, MAX_PAYLOAD]),
)


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    size = draw(payload_sizes)
    return random.Random(draw(st.integers(0, 2**32 - 1))).randbytes(size)


@st.composite
def requests(draw: st.DrawFn, writes: bool = True) -> Request:
    """One well-formed request that changes nothing but, for a WRITE, adds a fresh chunk."""
    kinds = ["read", "stat", "delete", "list", "usage", "ping", "reserve", "set_delay"]
    kind = draw(st.sampled_from((["write"] * 4 if writes else []) + kinds))
    disk = draw(st.integers(0, DISKS - 1))
    if kind == "write":
        return write_request(disk, fresh_id(), draw(payloads()))
    if kind in ("read", "stat"):
        op = Op.READ if kind == "read" else Op.STAT
        if draw(st.booleans()):
            return Request(op, ref(0, KNOWN))
        return Request(op, ref(disk, fresh_id("missing")), status=errno.ENOENT)
    if kind == "delete":
        return Request(Op.DELETE, ref(disk, fresh_id("missing")))
    if kind == "list":
        return Request(Op.LIST, wire.DISK.pack(disk))
    if kind == "reserve":
        return Request(Op.RESERVE, wire.RESERVE.pack(draw(st.integers(0, 1 << 20))))
    if kind == "set_delay":
        return Request(Op.SET_DELAY, wire.DELAY.pack(0.0))
    return Request(Op.USAGE if kind == "usage" else Op.PING)


Expect = Literal["closes", "closes_at_eof", "error"]


@dataclass(frozen=True)
class Case:
    """Bytes to send after ``prefix`` and what the server must do with them: close the
    connection by itself, close it once the client closes its side, or send an error reply
    with ``status`` and go on. ``bad`` is one frame, sealed with its tag before it is sent
    and then changed by ``mangle``, or garbage sent as it is (``sealed`` False)."""

    bad: bytes
    expect: Expect
    sealed: bool = True
    mangle: Callable[[bytes], bytes] | None = None
    prefix: Request | None = None
    request_id: int = 2
    op: int = 0
    status: int = 0
    label: str = ""  # for hypothesis statistics


prefixes = st.none() | requests()
request_ids = st.integers(2, SENTINEL - 1)


@st.composite
def mangled(draw: st.DrawFn) -> Case:
    """Flipped bytes anywhere, a frame cut short, or garbage."""
    how = draw(st.sampled_from(["flip", "truncate", "garbage"]))
    prefix = draw(prefixes)
    if how == "garbage":
        garbage = draw(st.binary(min_size=1, max_size=300))
        return Case(garbage, "closes_at_eof", False, None, prefix, label="garbage")
    req, rid = draw(requests()), draw(request_ids)
    raw = req.encode(rid)
    sealed_len = len(raw) + auth.TAG_BYTES
    if how == "truncate":
        keep = draw(st.integers(0, sealed_len - 1))
        return Case(
            raw, "closes_at_eof", True, lambda b: b[:keep], prefix, label=f"truncated {req.op.name}"
        )
    end_meta = 32 + len(req.meta)
    regions = {
        "header": (0, 32),
        "meta": (32, end_meta),
        "payload": (end_meta, len(raw)),
        "tag": (len(raw), sealed_len),
    }
    region = draw(st.sampled_from([r for r, (lo, hi) in regions.items() if hi > lo]))
    lo, hi = regions[region]
    spots = draw(
        st.lists(st.integers(lo, hi - 1), min_size=1, max_size=min(3, hi - lo), unique=True)
    )
    flips = [(spot, draw(st.integers(1, 255))) for spot in spots]

    def flip(sealed: bytes) -> bytes:
        out = bytearray(sealed)
        for spot, mask in flips:
            out[spot] ^= mask
        return bytes(out)

    # A flipped payload or tag fails the tag; a flipped header may also claim more bytes
    # than come, so the node closes at the latest when the client closes its side.
    label = f"flipped {region} of {req.op.name}"
    return Case(raw, "closes_at_eof", True, flip, prefix, label=label)


unknown_ops = st.integers(0, 255).filter(lambda op: op not in Op._value2member_map_)


@st.composite
def bad_fields(draw: st.DrawFn) -> Case:
    """A frame with a correct header checksum and one field the server must refuse: it closes
    the connection as soon as it has read the header (or header and meta)."""
    req, rid = draw(requests()), draw(request_ids)
    fields: dict[str, Any] = {}
    what = draw(
        st.sampled_from(["magic", "version", "op", "meta_len", "payload_len", "status", "payload"])
    )
    op: int = req.op
    payload = req.payload
    if what == "magic":
        fields["magic"] = draw(st.binary(min_size=2, max_size=2).filter(lambda m: m != b"TW"))
    elif what == "version":
        fields["version"] = draw(st.integers(0, 255).filter(lambda v: v != 1))
    elif what == "op":
        op = draw(unknown_ops)
    elif what == "meta_len":
        fields["meta_len"] = draw(st.integers(MAX_META + 1, 0xFFFF))
    elif what == "payload_len":
        fields["payload_len"] = draw(st.integers(MAX_PAYLOAD + 1, 2**64 - 1))
    elif what == "status":
        fields["status"] = draw(st.integers(1, 0xFFFF))
    else:  # a payload on an op that takes none
        req = draw(requests(writes=False))
        op, payload = req.op, draw(st.binary(min_size=1, max_size=64))
        fields["payload_len"] = draw(st.integers(len(payload), MAX_PAYLOAD))
    raw = frame(op, rid, req.meta, payload, **fields)
    return Case(raw, "closes", prefix=draw(prefixes), label=f"bad {what}")


bad_chunk_ids = st.one_of(
    st.just(b""),
    st.tuples(st.binary(max_size=40), st.integers(0x80, 0xFF), st.binary(max_size=40)).map(
        lambda t: t[0] + bytes([t[1]]) + t[2]
    ),
    st.text(st.characters(min_codepoint=0, max_codepoint=127), min_size=1, max_size=80)
    .filter(lambda s: not is_chunk_id(s))
    .map(str.encode),
    st.just(b"a" * 65),
)
bad_disks = st.integers(DISKS, 0xFFFF)
bad_delays = st.sampled_from([-1.0, -0.0001, 3600.5, 1e300, math.inf, -math.inf, math.nan])


@st.composite
def bad_refs(draw: st.DrawFn) -> Case:
    """A well-framed request whose meta is wrong (short, bad chunk id, bad disk, bad value):
    an EINVAL reply, and the connection goes on."""
    op = draw(
        st.sampled_from([Op.WRITE, Op.READ, Op.STAT, Op.DELETE, Op.LIST, Op.RESERVE, Op.SET_DELAY])
    )
    payload = b""
    if op == Op.WRITE:
        payload = draw(st.binary(max_size=100))
        fixed = wire.DISK_FLAGS.pack(draw(st.integers(0, DISKS - 1)), 0)
        meta = draw(
            st.one_of(
                st.binary(max_size=wire.DISK_FLAGS.size - 1),
                bad_chunk_ids.map(lambda cid: fixed + cid),
                bad_disks.map(lambda d: wire.DISK_FLAGS.pack(d, 0) + fresh_id("bad").encode()),
            )
        )
    elif op == Op.LIST:
        meta = draw(
            st.one_of(
                st.binary(max_size=1),
                bad_disks.map(wire.DISK.pack),
                st.just(wire.DISK.pack(0) + b"\xff"),
            )
        )
    elif op == Op.RESERVE:
        meta = draw(st.binary(max_size=16).filter(lambda m: len(m) != wire.RESERVE.size))
    elif op == Op.SET_DELAY:
        meta = draw(
            st.one_of(
                st.binary(max_size=16).filter(lambda m: len(m) != wire.DELAY.size),
                bad_delays.map(wire.DELAY.pack),
            )
        )
    else:
        meta = draw(
            st.one_of(
                st.binary(max_size=1),
                bad_chunk_ids.map(lambda cid: wire.DISK.pack(0) + cid),
                bad_disks.map(lambda d: ref(d, KNOWN)),
            )
        )
    rid = draw(request_ids)
    raw = frame(op, rid, meta, payload)
    return Case(
        raw, "error", prefix=draw(prefixes), request_id=rid, op=op, status=errno.EINVAL,
        label=f"bad meta of {op.name}",
    )  # fmt: skip


def run_case(n: Node, case: Case) -> None:
    """Send the prefix and the bad bytes on a fresh connection; check what comes back."""
    event(case.label)
    event(f"after a valid {case.prefix.op.name}" if case.prefix else "alone")
    prefix_id = 1
    sock = n.connect()
    data = sock.seal(case.prefix.encode(prefix_id)) if case.prefix is not None else b""
    if case.prefix is not None:
        n.expect_written(case.prefix)
    bad = sock.seal(case.bad) if case.sealed else case.bad
    data += case.mangle(bad) if case.mangle is not None else bad
    try:
        if case.expect == "error":
            send(sock, data + sock.seal(frame(Op.PING, SENTINEL)))
            replies = read_replies(sock, 2 + (case.prefix is not None))
            bad = replies.pop(case.request_id)
            assert (bad.op, bad.status, bad.payload) == (case.op, case.status, b"")
            assert bad.meta.decode("utf-8")  # a message
            ping = replies.pop(SENTINEL)
            assert (ping.op, ping.status) == (Op.PING, 0)
            replies_left = list(replies.values())
        else:
            send(sock, data)
            if case.expect == "closes_at_eof":
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
            replies_left = drain(sock)  # "closes": the server must close with our side open
        for reply in replies_left:  # only the intact prefix may be answered, and well
            assert case.prefix is not None and reply.request_id == prefix_id
            assert (reply.op, reply.status) == (case.prefix.op, case.prefix.status)
            if case.prefix.op == Op.READ and case.prefix.meta == ref(0, KNOWN):
                assert reply.payload == KNOWN_DATA
    finally:
        sock.close()
    check_node(n)


_fuzz = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@settings(_fuzz, max_examples=160)
@given(case=mangled())
def test_mangled_frames(node: Node, case: Case) -> None:
    run_case(node, case)


@settings(_fuzz, max_examples=70)
@given(case=bad_fields())
def test_frames_breaking_framing_rules_close_the_connection(node: Node, case: Case) -> None:
    run_case(node, case)


@settings(_fuzz, max_examples=70)
@given(case=bad_refs())
def test_bad_meta_gets_an_error_reply(node: Node, case: Case) -> None:
    run_case(node, case)


# -- frames that are not authenticated, replayed or spliced ----------------------------------
# Requests that would change the node if they ran: a WRITE, a DELETE of the known chunk, a
# delay. Their absence afterwards (check_node) shows they did not.
def harmful(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["write", "delete", "delay"]))
    if kind == "write":
        return write_request(draw(st.integers(0, DISKS - 1)), fresh_id("evil"), draw(payloads()))
    if kind == "delete":
        return Request(Op.DELETE, ref(0, KNOWN))
    return Request(Op.SET_DELAY, wire.DELAY.pack(draw(st.sampled_from([1.0, 3600.0]))))


@settings(_fuzz, max_examples=40)
@given(data=st.data())
def test_frames_without_a_handshake_do_nothing(node: Node, data: st.DataObject) -> None:
    """Well-formed frames, with or without tags, on a connection that skipped the handshake
    (or sent a HELLO and then a wrong proof): closed, nothing run, nothing answered."""
    reqs = [data.draw(st.composite(harmful)()) for _ in range(data.draw(st.integers(1, 3)))]
    how = data.draw(st.sampled_from(["none", "wrong proof", "wrong key"]))
    with node.connect_raw() as sock:
        if how != "none":
            handshake = auth.ClientHandshake(SECRET, NODE_ID)
            sock.sendall(handshake.hello)
            _recv_exact(sock, auth.CHALLENGE.size)
            sock.sendall(bytes(auth.PROOF_BYTES) if how == "wrong proof" else os.urandom(32))
        mac = auth.FrameMac(os.urandom(32))  # a key the node never derived
        frames = [r.encode(i) for i, r in enumerate(reqs)]
        if data.draw(st.booleans()):
            frames = [f + mac.tag(i, [f]) for i, f in enumerate(frames)]
        send(sock, b"".join(frames))
        with contextlib.suppress(OSError):
            assert sock.recv(1) == b""  # closed, no reply
    check_node(node)


def test_a_wrong_secret_cannot_connect(node: Node) -> None:
    """A client with another secret finds the node does not prove it; the node refuses it."""
    with pytest.raises(auth.AuthError, match="does not prove"):
        Link(node.connect_raw(), secret=os.urandom(32))
    with pytest.raises(_Cut):
        Link(node.connect_raw(), node_id=NODE_ID + 1)  # the node closes: no challenge

    async def go() -> None:
        remote = RemoteNode(NODE_ID, DISKS, fixed_address(*node.srv.address), secret=bytes(32))
        try:
            with pytest.raises(NodeUnavailableError, match="cannot authenticate"):
                await remote.ping()
        finally:
            await remote.close()

    asyncio.run(go())
    check_node(node)


@settings(_fuzz, max_examples=40)
@given(data=st.data())
def test_replayed_frames_do_nothing(node: Node, data: st.DataObject) -> None:
    """A sealed frame captured on one connection and sent again, on a new connection or later
    on its own: refused, the connection closed, nothing run twice or at all."""
    req = data.draw(st.composite(harmful)())
    where = data.draw(st.sampled_from(["another connection", "same connection"]))
    with node.connect() as first:
        captured = first.seal(req.encode(1))
        if where == "same connection":
            node.expect_written(req)
            first.send_raw(captured)
            reply = read_reply(first)
            assert reply is not None and reply.status == 0
            if req.op == Op.DELETE:  # it ran once: put the known chunk back
                node.on_loop(
                    node.srv.local.write_chunk(0, KNOWN, KNOWN_DATA, crc32c=crc(KNOWN_DATA))
                )
                node.verified.discard((0, KNOWN))
            if req.op == Op.SET_DELAY:
                first.sendall(frame(Op.SET_DELAY, 2, wire.DELAY.pack(0.0)))
                assert read_reply(first) is not None
            node.on_loop(_quiesce())
            before = snapshot(node)
            first.send_raw(captured)
            assert drain(first) == []
        else:
            before = snapshot(node)
            with node.connect() as second:
                second.send_raw(captured)
                assert drain(second) == []
    node.on_loop(_quiesce())
    assert snapshot(node) == before
    check_node(node)


def snapshot(n: Node) -> tuple[float, set[tuple[int, str]]]:
    """The node's delay and chunks."""
    chunks = {
        (disk, info.chunk_id)
        for disk in range(DISKS)
        for info in n.on_loop(n.srv.local.list_chunks(disk))
    }
    return n.srv.server.delay, chunks


@settings(_fuzz, max_examples=40)
@given(data=st.data())
def test_spliced_frames_stop_at_the_splice(node: Node, data: st.DataObject) -> None:
    """Sealed frames sent out of order, with one dropped, or with a frame sealed for another
    connection cut in: the frames before the splice run, the connection closes there, and
    nothing after it runs."""
    sizes = data.draw(st.lists(st.integers(0, 3000), min_size=2, max_size=5))
    reqs = [write_request(i % DISKS, fresh_id("seq"), os.urandom(n)) for i, n in enumerate(sizes)]
    how = data.draw(st.sampled_from(["swap", "drop", "cut in"]))
    at = data.draw(st.integers(0, len(reqs) - 2))
    with node.connect() as link, node.connect() as other:
        sealed = [link.seal(r.encode(i)) for i, r in enumerate(reqs)]
        if how == "swap":
            sealed[at], sealed[at + 1] = sealed[at + 1], sealed[at]
        elif how == "drop":
            del sealed[at]
        else:
            sealed.insert(at, other.seal(write_request(1, fresh_id("cut"), b"cut in").encode(99)))
        for req in reqs[:at]:  # these run; nothing from the splice on may
            node.expect_written(req)
        link.send_raw(b"".join(sealed))
        answered = drain(link)
    # (replies of requests still running when the connection closes are dropped)
    assert {r.request_id for r in answered} <= set(range(at))
    node.on_loop(_quiesce())
    stored = snapshot(node)[1]
    assert all(r.chunk in stored for r in reqs[:at])
    assert not any(r.chunk in stored for r in reqs[at:])
    check_node(node)


def test_without_payload_tags_the_crc_binds_the_payload(node: Node) -> None:
    """On loopback a client may skip payload tags (the default of RemoteNode there): the tag
    covers header and meta, whose CRC32C the node checks the payload against. A changed
    payload is refused (EBADMSG) and not stored; a changed header still closes."""
    payload = b"loopback payload"
    cid = fresh_id("lo")
    req = write_request(1, cid, payload)
    with node.connect_raw() as raw:
        link = Link(raw, payload_tags=False)
        assert not link.session.send.payloads
        sealed = bytearray(link.seal(req.encode(1)))
        sealed[-auth.TAG_BYTES - 1] ^= 1  # the payload's last byte
        link.send_raw(bytes(sealed))
        reply = read_reply(link)
        assert reply is not None and (reply.request_id, reply.status) == (1, errno.EBADMSG)
        good = write_request(1, cid, payload)
        node.expect_written(good)
        link.sendall(good.encode(2))
        reply = read_reply(link)
        assert reply is not None and (reply.request_id, reply.status) == (2, 0)
        sealed = bytearray(link.seal(frame(Op.PING, 3)))
        sealed[9] ^= 1  # the request id
        link.send_raw(bytes(sealed))
        assert drain(link) == []
    check_node(node)


# -- plain cases -----------------------------------------------------------------------------
def test_doc_example_bytes() -> None:
    """The worked example of docs/wire-protocol.md, from both packers."""
    ping = bytes.fromhex(
        "54 57 01 01 00 00 00 00 01 00 00 00 00 00 00 00"
        "00 00 00 00 00 00 00 00 00 00 00 00 95 78 f5 f4"
    )
    write = bytes.fromhex(
        "54 57 01 02 00 00 07 00 02 00 00 00 00 00 00 00"
        "05 00 00 00 00 00 00 00 4c bb 71 9a 18 66 b2 51"
        "00 00 00 00 61 62 63 68 65 6c 6c 6f"
    )
    assert wire.pack_header(Op.PING, 1) == ping == frame(Op.PING, 1)
    meta = wire.DISK_FLAGS.pack(0, 0) + b"abc"
    got = wire.pack_header(Op.WRITE, 2, meta, payload_len=5, payload_crc32c=crc(b"hello"))
    assert got + b"hello" == write == frame(Op.WRITE, 2, meta, b"hello")
    reply = bytes.fromhex(
        "54 57 01 02 00 00 00 00 02 00 00 00 00 00 00 00"
        "00 00 00 00 00 00 00 00 00 00 00 00 f5 3c 6c df"
    )
    assert wire.pack_header(Op.WRITE, 2) == reply


def test_error_reply_keeps_the_connection(node: Node) -> None:
    with node.connect() as sock:
        sock.sendall(frame(Op.READ, 5, ref(0, "Not-An-Id")) + frame(Op.PING, 6))
        replies = read_replies(sock, 2)
        assert (replies[5].op, replies[5].status) == (Op.READ, errno.EINVAL)
        assert b"not a valid chunk id" in replies[5].meta
        assert (replies[6].op, replies[6].status) == (Op.PING, 0)
        # and again, one at a time
        sock.sendall(frame(Op.STAT, 7, ref(1, "absent")))
        reply = read_reply(sock)
        assert reply is not None and (reply.request_id, reply.status) == (7, errno.ENOENT)
        sock.sendall(frame(Op.PING, 8))
        reply = read_reply(sock)
        assert reply is not None and (reply.request_id, reply.status) == (8, 0)
    check_node(node)


def test_pipelined_replies_are_matched_by_request_id(node: Node) -> None:
    rng = random.Random(1)
    sent: dict[int, tuple[Request, int]] = {}  # request id: (request, expected status)
    for i in range(40):
        rid = rng.getrandbits(64)
        kind = i % 8
        if kind == 0:
            req = write_request(i % DISKS, fresh_id("pipe"), rng.randbytes(rng.randrange(5000)))
            node.expect_written(req)
            sent[rid] = (req, 0)
        elif kind == 1:
            sent[rid] = (Request(Op.READ, ref(0, KNOWN)), 0)
        elif kind == 2:
            sent[rid] = (Request(Op.STAT, ref(2, "absent")), errno.ENOENT)
        elif kind == 3:
            sent[rid] = (Request(Op.READ, ref(0, "BAD")), errno.EINVAL)
        elif kind == 4:
            sent[rid] = (Request(Op.USAGE), 0)
        elif kind == 5:
            sent[rid] = (Request(Op.LIST, wire.DISK.pack(1)), 0)
        elif kind == 6:
            sent[rid] = (Request(Op.RESERVE, wire.RESERVE.pack(2**64 - 1)), errno.ENOSPC)
        else:
            sent[rid] = (Request(Op.PING), 0)
    with node.connect() as sock:
        sock.sendall(b"".join(req.encode(rid) for rid, (req, _) in sent.items()))
        replies = read_replies(sock, len(sent))
    assert replies.keys() == sent.keys()
    for rid, (req, status) in sent.items():
        reply = replies[rid]
        assert (reply.op, reply.status) == (req.op, status)
        if req.op == Op.READ and status == 0:
            assert reply.payload == KNOWN_DATA
            info = wire.unpack_info(KNOWN, reply.meta)
            assert (info.disk, info.stored_len) == (0, len(KNOWN_DATA))
            assert info.crc32c == crc(KNOWN_DATA)
        if req.op == Op.USAGE:
            assert [u.disk for u in wire.unpack_usage(reply.payload)] == list(range(DISKS))
        if req.op == Op.PING:
            fields = wire.PING_REPLY.unpack(reply.meta)
            assert (fields[0], fields[2], fields[5]) == (NODE_ID, DISKS, MAX_PAYLOAD)
    check_node(node)


def test_payload_failing_its_checksum_is_refused(node: Node) -> None:
    payload = b"some chunk bytes"
    cid = fresh_id("badcrc")
    meta = wire.DISK_FLAGS.pack(1, 0) + cid.encode()
    with node.connect() as sock:
        sock.sendall(frame(Op.WRITE, 3, meta, payload, payload_crc=crc(payload) ^ 1))
        reply = read_reply(sock)
        assert reply is not None
        assert (reply.op, reply.request_id, reply.status) == (Op.WRITE, 3, errno.EBADMSG)
        # an empty payload must carry checksum 0
        sock.sendall(frame(Op.WRITE, 4, meta, b"", payload_crc=1))
        reply = read_reply(sock)
        assert reply is not None and (reply.request_id, reply.status) == (4, errno.EBADMSG)
    with pytest.raises(ChunkNotFoundError):
        node.on_loop(node.srv.local.stat_chunk(1, cid))
    check_node(node)


def test_error_replies_raise_typed_errors(node: Node) -> None:
    async def go() -> None:
        remote = RemoteNode(NODE_ID, DISKS, fixed_address(*node.srv.address), secret=SECRET)
        try:
            with pytest.raises(ChunkNotFoundError):
                await remote.read_chunk(1, "absent")
            with pytest.raises(AlreadyExistsError):
                await remote.write_chunk(0, KNOWN, b"x", crc32c=crc(b"x"))
            with pytest.raises(ChunkCorruptError):
                await remote.write_chunk(0, fresh_id("bad"), b"x", crc32c=crc(b"y"))
            with pytest.raises(OSError) as info:
                await remote.reserve(2**64 - 1)
            assert info.value.errno == errno.ENOSPC
            assert not isinstance(info.value, TectonicError)
            with pytest.raises(InvalidArgumentError):  # checked on the server, not the client
                await remote.set_delay(-1.0)
            await remote.reserve(1)
        finally:
            await remote.close()

    asyncio.run(go())
    check_node(node)


def test_limits(node: Node) -> None:
    """meta of MAX_META bytes and a payload of max_payload bytes are taken; one more is not."""
    big = random.Random(2).randbytes(MAX_PAYLOAD)
    cid = fresh_id("max")
    node.expect_written(write_request(2, cid, big))
    with node.connect() as sock:
        long_id = wire.DISK.pack(0) + b"a" * (MAX_META - 2)
        sock.sendall(frame(Op.READ, 1, long_id) + write_request(2, cid, big).encode(2))
        replies = read_replies(sock, 2)
        assert replies[1].status == errno.EINVAL and replies[2].status == 0
    for raw in (
        frame(Op.READ, 1, long_id + b"a"),
        frame(Op.WRITE, 2, wire.DISK_FLAGS.pack(2, 0) + b"x", payload_len=MAX_PAYLOAD + 1),
    ):
        with node.connect() as sock:
            send(sock, raw)
            assert drain(sock) == []  # closed by the server, our side still open
    check_node(node)


def test_a_bad_frame_closes_only_its_connection(node: Node) -> None:
    with node.connect() as other, node.connect() as bad:
        other.sendall(frame(Op.PING, 1))
        assert read_reply(other) is not None
        send(bad, b"GARBAGE!" * 8)
        assert drain(bad) == []
        other.sendall(frame(Op.PING, 2))
        reply = read_reply(other)
        assert reply is not None and (reply.request_id, reply.status) == (2, 0)
    check_node(node)


def test_more_than_max_inflight_pipelined(node: Node) -> None:
    count = 3 * MAX_INFLIGHT + 1
    with node.connect() as sock:
        sock.sendall(b"".join(frame(Op.READ, i, ref(0, KNOWN)) for i in range(count)))
        replies = read_replies(sock, count)
    assert sorted(replies) == list(range(count))
    assert all(r.status == 0 and r.payload == KNOWN_DATA for r in replies.values())
    check_node(node)


async def _waiters(n: Node) -> int:
    return len(n.srv.server.pool._waiters)


def test_write_waits_for_a_pool_buffer_while_others_are_served(node: Node) -> None:
    """With every payload buffer held by a half-sent WRITE, a new WRITE waits (its connection
    stops reading) while other connections, such as a heartbeat, are still answered."""
    holders = [node.connect() for _ in range(BUFFERS)]
    try:
        for sock in holders:
            head = frame(
                Op.WRITE, 1, wire.DISK_FLAGS.pack(0, 0) + fresh_id("held").encode(), b"\0" * 1000
            )
            sock.send_raw(sock.seal(head)[: -990 - auth.TAG_BYTES])  # all but 990 + the tag
        wait_until(lambda: node.on_loop(_free_buffers(node)) == 0, "the pool to be empty")
        req = write_request(1, fresh_id("waited"), b"waited for a buffer")
        node.expect_written(req)
        with node.connect() as writer, node.connect() as heartbeat:
            writer.sendall(req.encode(1) + frame(Op.PING, 2))
            wait_until(lambda: node.on_loop(_waiters(node)) == 1, "the WRITE to wait")
            heartbeat.sendall(frame(Op.PING, 9))
            reply = read_reply(heartbeat)
            assert reply is not None and reply.status == 0
            holders.pop().close()  # its buffer goes to the waiting WRITE
            replies = read_replies(writer, 2)
            assert replies[1].status == 0 and replies[2].status == 0
    finally:
        for sock in holders:
            sock.close()
    check_node(node)


async def _new_event() -> asyncio.Event:
    return asyncio.Event()


def test_replies_come_back_in_any_order(node: Node) -> None:
    """A READ held on the node does not hold back the replies of requests sent after it."""
    local = node.srv.local
    gate = node.on_loop(_new_event())
    real_open = local.open_chunk  # what the node's READ uses

    async def held_open(disk: int, chunk_id: str) -> Any:
        if chunk_id == "held":
            await gate.wait()
        return await real_open(disk, chunk_id)

    local.open_chunk = held_open  # type: ignore[method-assign]
    try:
        with node.connect() as sock:
            sock.sendall(
                frame(Op.READ, 1, ref(0, "held"))
                + frame(Op.STAT, 2, ref(0, KNOWN))
                + frame(Op.PING, 3)
            )
            assert read_replies(sock, 2).keys() == {2, 3}
            node.srv.loop.call_soon_threadsafe(gate.set)
            reply = read_reply(sock)
            assert reply is not None and (reply.request_id, reply.status) == (1, errno.ENOENT)
    finally:
        node.srv.loop.call_soon_threadsafe(gate.set)
        del local.open_chunk
    check_node(node)


def test_set_delay(node: Node) -> None:
    """SET_DELAY changes the node's delay, takes 0..3600 s only, and leaves replies whole."""
    try:
        with node.connect() as sock:
            sock.sendall(frame(Op.SET_DELAY, 1, wire.DELAY.pack(0.1)))
            reply = read_reply(sock)
            assert reply is not None and (reply.request_id, reply.status) == (1, 0)
            assert node.srv.server.delay == 0.1
            sock.sendall(frame(Op.READ, 2, ref(0, KNOWN)) + frame(Op.PING, 3))
            replies = read_replies(sock, 2)
            assert replies[2].payload == KNOWN_DATA and replies[3].status == 0
            sock.sendall(frame(Op.SET_DELAY, 4, wire.DELAY.pack(3600.5)))
            reply = read_reply(sock)
            assert reply is not None and reply.status == errno.EINVAL
            assert node.srv.server.delay == 0.1
    finally:
        with node.connect() as sock:
            sock.sendall(frame(Op.SET_DELAY, 5, wire.DELAY.pack(0.0)))
            reply = read_reply(sock)
            assert reply is not None and reply.status == 0
    check_node(node)


@dataclass(frozen=True)
class ConnState:
    """The server's end of one connection."""

    tasks: int  # requests running
    unread: int  # bytes in the socket the server has not read
    reading: bool
    buffered: int  # reply bytes waiting in the transport
    high_water: int
    frames: int  # frames received whole (tags checked or being checked)


async def _connection_state(n: Node, peer: tuple[str, int]) -> ConnState | None:
    for conn in n.srv.server.connections:
        transport = conn._transport
        if transport is None or transport.get_extra_info("peername") != peer:
            continue
        unread = array.array("i", [0])
        fcntl.ioctl(transport.get_extra_info("socket").fileno(), termios.FIONREAD, unread)
        return ConnState(
            len(conn.tasks),
            unread[0],
            transport.is_reading(),
            transport.get_write_buffer_size(),
            transport.get_write_buffer_limits()[1],
            conn._rx._seq if conn._rx is not None else 0,
        )
    return None


def pipeline_unread(n: Node, request: bytes, count: int) -> tuple[Link, list[ConnState]]:
    """Send ``count`` copies of a request and read nothing, until the server has answered
    them all or stopped reading; returns the socket and the states seen meanwhile."""
    sock = n.connect()
    sock.sendall(request * count)
    peer = sock.getsockname()
    seen: list[ConnState] = []

    def settled() -> bool:
        state = n.on_loop(_connection_state(n, peer))
        if state is None:  # not accepted yet
            return False
        seen.append(state)
        done = state.frames == count and state.tasks == 0 and state.unread == 0
        # Stopped reading with requests left unread: its replies fill the transport's buffer,
        # or (chunk replies go out with sendfile, which buffers nothing) the socket, and a
        # reply waiting for the socket holds the connection's reading.
        blocked = not state.reading and state.unread > 0 and state.tasks > 0
        return done or blocked

    wait_until(settled, "the node to answer everything or stop reading")
    return sock, seen


def test_replies_nobody_reads_are_bounded(node: Node) -> None:
    """A client that pipelines READs and reads no reply makes the node stop reading from it
    rather than buffer replies without bound; once it reads, every reply arrives whole."""
    chunk = random.Random(3).randbytes(256 << 10)
    cid = fresh_id("pile")
    node.valid[(1, cid)] = chunk
    node.on_loop(node.srv.local.write_chunk(1, cid, chunk, crc32c=crc(chunk)))
    count = 4 * MAX_INFLIGHT
    sock, seen = pipeline_unread(node, frame(Op.READ, 1, ref(1, cid)), count)
    with sock:
        assert max(state.buffered for state in seen) <= MAX_PAYLOAD
        for _ in range(count):
            reply = read_reply(sock)
            assert reply is not None and (reply.status, reply.payload) == (0, chunk)
    check_node(node)


async def _cancel_all() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def blocked_replies(root: Path) -> Iterator[tuple[Node, Link]]:
    """A node of its own (these tests may leave it stuck) with one connection whose replies
    are blocked: READs waiting to write to a client that reads nothing."""
    srv = ThreadedNodeServer(
        root, node_id=NODE_ID, disks=DISKS, max_payload=MAX_PAYLOAD, buffers=1, sync=False
    )
    n = Node(srv)
    sock = None
    try:
        chunk = random.Random(4).randbytes(256 << 10)
        n.on_loop(srv.local.write_chunk(0, "blocked", chunk, crc32c=crc(chunk)))
        sock, seen = pipeline_unread(n, frame(Op.READ, 1, ref(0, "blocked")), 2 * MAX_INFLIGHT)
        assert seen[-1].tasks >= 1 and not seen[-1].reading
        yield n, sock
    finally:
        if sock is not None:
            sock.close()
        n.on_loop(_cancel_all())  # whatever is stuck
        srv.stop()


async def _tasks_left() -> int:
    return len([t for t in asyncio.all_tasks() if t.get_name() != SWEEPER]) - 1


def test_client_leaving_with_replies_blocked_leaves_no_task(tmp_path: Path) -> None:
    with blocked_replies(tmp_path) as (n, sock):
        sock.close()  # with replies unread: a reset
        wait_until(lambda: not n.on_loop(_connections(n)), "the node to drop the connection")
        wait_until(lambda: n.on_loop(_tasks_left()) == 0, "the requests to finish", timeout=4)


async def _connections(n: Node) -> int:
    return len(n.srv.server.connections)


def test_server_closes_with_replies_blocked(tmp_path: Path) -> None:
    with blocked_replies(tmp_path) as (n, _):
        asyncio.run_coroutine_threadsafe(n.srv.server.close(), n.srv.loop).result(4)
