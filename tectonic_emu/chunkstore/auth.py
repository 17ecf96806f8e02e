"""Authenticated links: the handshake over the cluster secret, frame MACs, refusal logs.

Every connection to a node (``server.py``) or to the supervisor's control socket starts with
a mutual challenge-response over the cluster's 32-byte secret (``docs/wire-protocol.md``,
*Authentication*)::

    client -> server  HELLO      b"TA", version 1, flags, node id (u32), client nonce (32)
    server -> client  CHALLENGE  b"TA", version 1, mode, node id (u32), server nonce (32),
                                 server proof (32 bytes)
    client -> server  PROOF      client proof (32 bytes)

A proof is HMAC-SHA256(secret, label || node id || mode || client nonce || server nonce),
with a different label each way, so neither side's proof can be reflected as the other's.
Each direction then has a key of its own, HMAC-SHA256(secret, its label || the same fields):
fresh nonces make fresh keys, so nothing captured on one connection is valid on another.

After the handshake every frame is followed by a 16-byte tag: AES-256-GCM's tag with no
plaintext (GMAC) under the direction's key, with the frame's sequence number in that
direction (0, 1, 2...) as the nonce. The sequence number is not sent: a replayed, dropped,
reordered or inserted frame fails its tag. The tag covers the header and meta, which carry
the payload's CRC32C, and, in mode ``PAYLOAD_TAGS``, the payload too. Mode is
``PAYLOAD_TAGS`` unless both ends of the connection are loopback addresses, or whenever the
client asks for it (HELLO flags): on one host nobody but root can change bytes in flight
between two processes, so the CRC32C the receiver checks anyway, bound to an authenticated
header, covers the payload there; off the host an on-path attacker could forge a payload
with the same CRC32C, and the payload tag stops that (docs/performance.md, *Authentication*,
gives the cost of each). A side that finds itself off-host refuses a mode without payload
tags, so a man in the middle cannot downgrade it (the mode is in the proofs).

GMAC runs at about 10 GB/s on one core here from the cache, 4 GB/s from memory (AES-NI with
VPCLMULQDQ), four to eight times HMAC-SHA256; it comes from the libcrypto that Python's
``ssl`` module links.
"""

from __future__ import annotations

import asyncio
import ctypes
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from tectonic_emu.coding._native import pinned
from tectonic_emu.errors import InvalidArgumentError

SECRET_BYTES = 32
NONCE_BYTES = 32
PROOF_BYTES = 32
TAG_BYTES = 16
MAGIC = b"TA"
VERSION = 1
# The node id the supervisor's control socket proves (no storage node has it).
CONTROL_ID = 0xFFFFFFFF
HELLO = struct.Struct("<2sBBI32s")  # 40 bytes
CHALLENGE = struct.Struct("<2sBBI32s32s")  # 72 bytes
# Seconds a peer has to complete the handshake before the connection is dropped.
HANDSHAKE_TIMEOUT = 10.0

PAYLOAD_TAGS = 1  # HELLO flag and CHALLENGE mode: tags cover payloads too

_U32 = struct.Struct("<I")
_NONCE_SUFFIX = bytes(4)  # a GCM nonce is 12 bytes: the u64 sequence number, then zeros


class AuthError(Exception):
    """A handshake or a frame that fails authentication: its connection must be closed."""


# -- GMAC through libcrypto ------------------------------------------------------------------
def _load_libcrypto(dll: type[ctypes.CDLL]) -> ctypes.CDLL:
    import _ssl  # noqa: F401  (loads the libcrypto that Python's ssl module uses)

    for name in ("libcrypto.so.3", "libcrypto.so"):
        try:
            lib = dll(name)
            break
        except OSError:
            continue
    else:  # pragma: no cover - every supported Python links OpenSSL 3
        raise ImportError("libcrypto (OpenSSL 3) is needed for authenticated links")
    vp, ip = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)
    lib.EVP_CIPHER_CTX_new.restype = vp
    lib.EVP_CIPHER_CTX_new.argtypes = []
    lib.EVP_CIPHER_CTX_free.argtypes = [vp]
    lib.EVP_aes_256_gcm.restype = vp
    lib.EVP_aes_256_gcm.argtypes = []
    lib.EVP_EncryptInit_ex.argtypes = [vp, vp, vp, ctypes.c_char_p, ctypes.c_char_p]
    lib.EVP_EncryptUpdate.argtypes = [vp, vp, ip, vp, ctypes.c_int]
    lib.EVP_EncryptFinal_ex.argtypes = [vp, ctypes.c_char_p, ip]
    lib.EVP_CIPHER_CTX_ctrl.argtypes = [vp, ctypes.c_int, ctypes.c_int, ctypes.c_char_p]
    return lib


# Big inputs go through a handle that releases the GIL while it hashes; small ones keep it,
# since taking the GIL back can cost a switch interval when another thread runs Python
# (as in coding/_native.py).
_released = _load_libcrypto(ctypes.CDLL)
_held = _load_libcrypto(ctypes.PyDLL)
_RELEASE_BYTES = 64 << 10
_GCM_GET_TAG = 0x10
_UPDATE_MAX = 1 << 30  # EVP_EncryptUpdate takes an int length
_AES = _held.EVP_aes_256_gcm()

Part = bytes | bytearray | memoryview


def gmac(key: bytes, nonce: bytes, parts: Sequence[Part]) -> bytes:
    """The 16-byte AES-256-GCM tag of ``parts`` (all authenticated, none encrypted) under
    ``key`` (32 bytes) and ``nonce`` (12 bytes). Raises InvalidArgumentError for other sizes
    and BufferError for a non-contiguous part."""
    if len(key) != SECRET_BYTES or len(nonce) != 12:
        raise InvalidArgumentError("GMAC takes a 32-byte key and a 12-byte nonce")
    lib = _held
    ctx = lib.EVP_CIPHER_CTX_new()
    if not ctx:
        raise MemoryError("EVP_CIPHER_CTX_new")
    try:
        if lib.EVP_EncryptInit_ex(ctx, _AES, None, key, nonce) != 1:
            raise AuthError("AES-256-GCM init failed")
        out_len = ctypes.c_int()
        with pinned(parts) as pointers:
            for addr, nbytes in pointers:
                update = (_released if nbytes >= _RELEASE_BYTES else lib).EVP_EncryptUpdate
                for start in range(0, nbytes, _UPDATE_MAX):
                    n = min(_UPDATE_MAX, nbytes - start)
                    if update(ctx, None, ctypes.byref(out_len), addr + start, n) != 1:
                        raise AuthError("AES-256-GCM update failed")
        scratch = ctypes.create_string_buffer(16)
        if lib.EVP_EncryptFinal_ex(ctx, scratch, ctypes.byref(out_len)) != 1:
            raise AuthError("AES-256-GCM final failed")
        tag = ctypes.create_string_buffer(TAG_BYTES)
        if lib.EVP_CIPHER_CTX_ctrl(ctx, _GCM_GET_TAG, TAG_BYTES, tag) != 1:
            raise AuthError("AES-256-GCM tag failed")
        return tag.raw
    finally:
        lib.EVP_CIPHER_CTX_free(ctx)


class FrameMac:
    """The tags of one direction of one connection: frame ``seq`` is tagged under ``key`` with
    ``seq`` as its nonce. ``next_seq`` hands out sequence numbers in frame order; the tag of a
    numbered frame may then be computed on any thread.

    Frames under 64 KiB (every frame on loopback, where tags cover header and meta only) are
    joined and tagged on a context keyed once, which takes a fifth of the time of ``gmac``'s
    fresh context (3 against 12 us: the per-frame cost is Python's calls into libcrypto)."""

    def __init__(self, key: bytes, *, payloads: bool = True) -> None:
        if len(key) != SECRET_BYTES:
            raise InvalidArgumentError("a frame MAC takes a 32-byte key")
        self._key = key
        self.payloads = payloads  # tags cover payloads (else header and meta only)
        self._seq = 0
        self._lock = threading.Lock()  # guards _seq and the small-frame context
        ctx = _held.EVP_CIPHER_CTX_new()
        if not ctx:
            raise MemoryError("EVP_CIPHER_CTX_new")
        weakref.finalize(self, _held.EVP_CIPHER_CTX_free, ctx)
        if _held.EVP_EncryptInit_ex(ctx, _AES, None, key, None) != 1:
            raise AuthError("AES-256-GCM init failed")
        self._ctx = ctx
        self._out_len = ctypes.c_int()
        self._scratch = ctypes.create_string_buffer(16)
        self._tag = ctypes.create_string_buffer(TAG_BYTES)

    def next_seq(self) -> int:
        with self._lock:
            seq = self._seq
            self._seq += 1
            return seq

    def tag(self, seq: int, parts: Sequence[Part]) -> bytes:
        nonce = seq.to_bytes(8, "little") + _NONCE_SUFFIX
        if sum(memoryview(p).nbytes for p in parts) >= _RELEASE_BYTES:
            return gmac(self._key, nonce, parts)
        data = b"".join(parts)
        lib, ctx, out_len = _held, self._ctx, ctypes.byref(self._out_len)
        with self._lock:
            if (
                lib.EVP_EncryptInit_ex(ctx, None, None, None, nonce) != 1
                or lib.EVP_EncryptUpdate(ctx, None, out_len, data, len(data)) != 1
                or lib.EVP_EncryptFinal_ex(ctx, self._scratch, out_len) != 1
                or lib.EVP_CIPHER_CTX_ctrl(ctx, _GCM_GET_TAG, TAG_BYTES, self._tag) != 1
            ):
                raise AuthError("AES-256-GCM failed")
            return self._tag.raw

    def check(self, seq: int, parts: Sequence[Part], tag: Part) -> bool:
        return hmac.compare_digest(self.tag(seq, parts), bytes(tag))


def _hmac(secret: bytes, label: bytes, node_id: int, mode: int, cn: bytes, sn: bytes) -> bytes:
    return hmac.digest(secret, label + _U32.pack(node_id) + bytes([mode]) + cn + sn, "sha256")


@dataclass(frozen=True, slots=True)
class Session:
    """What a finished handshake gives one side: the MAC of what it sends and of what it
    receives."""

    send: FrameMac
    receive: FrameMac


def _session(
    secret: bytes, node_id: int, mode: int, cn: bytes, sn: bytes, *, client: bool
) -> Session:
    payloads = bool(mode & PAYLOAD_TAGS)
    c2s = FrameMac(_hmac(secret, b"tectonic c2s key", node_id, mode, cn, sn), payloads=payloads)
    s2c = FrameMac(_hmac(secret, b"tectonic s2c key", node_id, mode, cn, sn), payloads=payloads)
    return Session(c2s, s2c) if client else Session(s2c, c2s)


def is_local(sockname: object, peername: object) -> bool:
    """Whether both ends of a connection are loopback addresses (one host, no wire)."""
    try:
        return all(
            isinstance(end, tuple) and ipaddress.ip_address(end[0]).is_loopback
            for end in (sockname, peername)
        )
    except ValueError:
        return False


def check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise InvalidArgumentError(f"a cluster secret is {SECRET_BYTES} bytes")
    return secret


class ClientHandshake:
    """The client's side: ``hello`` to send first, then ``answer`` the server's CHALLENGE
    (raises AuthError when the server does not prove the secret, is another node, or offers
    no payload tags where they are needed). ``payload_tags``: ask for them even on one host;
    they are required off it (``answer``'s ``local`` False)."""

    def __init__(self, secret: bytes, node_id: int, *, payload_tags: bool = False) -> None:
        self._secret = check_secret(secret)
        self.node_id = node_id
        self._want = PAYLOAD_TAGS if payload_tags else 0
        self._nonce = secrets.token_bytes(NONCE_BYTES)
        self.hello = HELLO.pack(MAGIC, VERSION, self._want, node_id, self._nonce)

    def answer(
        self, challenge: bytes | bytearray | memoryview, *, local: bool = False
    ) -> tuple[bytes, Session]:
        """(the PROOF to send, this side's session). ``local``: both ends are loopback."""
        magic, version, mode, node_id, sn, proof = CHALLENGE.unpack(bytes(challenge))
        if magic != MAGIC or version != VERSION:
            raise AuthError("the peer does not speak the authenticated protocol")
        if node_id != self.node_id:
            raise AuthError(f"the peer is node {node_id}, not node {self.node_id}")
        want = _hmac(self._secret, b"tectonic server proof", node_id, mode, self._nonce, sn)
        if not hmac.compare_digest(want, proof):
            raise AuthError("the peer does not prove it knows the cluster secret")
        if not mode & PAYLOAD_TAGS and (self._want or not local):
            raise AuthError("the peer offers no payload tags on a link that needs them")
        mine = _hmac(self._secret, b"tectonic client proof", node_id, mode, self._nonce, sn)
        return mine, _session(self._secret, node_id, mode, self._nonce, sn, client=True)


class ServerHandshake:
    """The server's side: ``challenge`` a client's HELLO, then ``verify`` its PROOF. Both
    raise AuthError for a client that is refused."""

    def __init__(self, secret: bytes, node_id: int, *, local: bool = False) -> None:
        self._secret = check_secret(secret)
        self.node_id = node_id
        self._local = local  # both ends loopback: payload tags only when the client asks
        self._mode = 0
        self._nonce = secrets.token_bytes(NONCE_BYTES)
        self._client_nonce = b""

    def challenge(self, hello: bytes | bytearray | memoryview) -> bytes:
        magic, version, flags, node_id, cn = HELLO.unpack(bytes(hello))
        if magic != MAGIC or version != VERSION:
            raise AuthError("not an authenticated hello (a client of an older protocol?)")
        if node_id != self.node_id:
            raise AuthError(f"hello for node {node_id}, this is node {self.node_id}")
        self._client_nonce = cn
        self._mode = PAYLOAD_TAGS if flags & PAYLOAD_TAGS or not self._local else 0
        proof = _hmac(self._secret, b"tectonic server proof", node_id, self._mode, cn, self._nonce)
        return CHALLENGE.pack(MAGIC, VERSION, self._mode, node_id, self._nonce, proof)

    def verify(self, proof: bytes | bytearray | memoryview) -> Session:
        if not self._client_nonce:
            raise AuthError("proof before hello")
        want = _hmac(self._secret, b"tectonic client proof", self.node_id, self._mode,
                     self._client_nonce, self._nonce)  # fmt: skip
        if not hmac.compare_digest(want, bytes(proof)):
            raise AuthError("wrong proof: the client does not know the cluster secret")
        return _session(self._secret, self.node_id, self._mode, self._client_nonce, self._nonce,
                        client=False)  # fmt: skip


# -- messages of the control socket ---------------------------------------------------------
# The supervisor's control socket (served.py) carries one request and one reply, each a
# message: length (u32), body, tag over both, after the same handshake as a node's.
MAX_MESSAGE = 1 << 20
_LEN = struct.Struct("<I")


def pack_message(body: bytes, mac: FrameMac) -> bytes:
    if len(body) > MAX_MESSAGE:
        raise InvalidArgumentError(f"a control message of {len(body)} bytes (limit {MAX_MESSAGE})")
    framed = _LEN.pack(len(body)) + body
    return framed + mac.tag(mac.next_seq(), [framed])


def _open_message(length: bytes, body: bytes, tag: bytes, mac: FrameMac) -> bytes:
    if not mac.check(mac.next_seq(), [length + body], tag):
        raise AuthError("a control message fails its tag (forged, replayed or cut)")
    return body


def _message_length(raw: bytes) -> int:
    (n,) = _LEN.unpack(raw)
    if n > MAX_MESSAGE:
        raise AuthError(f"a control message of {n} bytes (limit {MAX_MESSAGE})")
    return int(n)


async def accept_control(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes
) -> Session:
    """The server's handshake on a stream (the control socket); raises AuthError."""
    handshake = ServerHandshake(secret, CONTROL_ID)  # messages are tagged whole, always
    writer.write(handshake.challenge(await reader.readexactly(HELLO.size)))
    return handshake.verify(await reader.readexactly(PROOF_BYTES))


async def read_message(reader: asyncio.StreamReader, mac: FrameMac) -> bytes:
    """The next message's body; raises AuthError when it fails its tag."""
    length = await reader.readexactly(_LEN.size)
    body = await reader.readexactly(_message_length(length))
    return _open_message(length, body, await reader.readexactly(TAG_BYTES), mac)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise AuthError(f"the peer closed after {len(buf)} of {n} bytes")
        buf += got
    return bytes(buf)


def connect_control(sock: socket.socket, secret: bytes) -> Session:
    """The client's handshake on a blocking socket to the control socket; raises AuthError
    (the peer closed or does not prove the secret) or OSError."""
    handshake = ClientHandshake(secret, CONTROL_ID)
    sock.sendall(handshake.hello)
    proof, session = handshake.answer(_recv_exact(sock, CHALLENGE.size))
    sock.sendall(proof)
    return session


def recv_message(sock: socket.socket, mac: FrameMac) -> bytes:
    """The next message's body from a blocking socket; raises AuthError or OSError."""
    length = _recv_exact(sock, _LEN.size)
    body = _recv_exact(sock, _message_length(length))
    return _open_message(length, body, _recv_exact(sock, TAG_BYTES), mac)


# -- refusals, logged without flooding -------------------------------------------------------
class RefusalLog:
    """Logs a refused connection or frame at most once per ``interval`` seconds; the next line
    says how many were refused meanwhile without a line of their own."""

    def __init__(self, logger: logging.Logger, what: str, interval: float = 10.0) -> None:
        self._log = logger
        self._what = what
        self._interval = interval
        self._last = -interval
        self._quiet = 0
        self.count = 0  # refusals since start

    def refused(self, peer: object, reason: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last < self._interval:
            self._quiet += 1
            return
        more = f" ({self._quiet} more refused since the last line)" if self._quiet else ""
        self._log.warning("%s: refused %s: %s%s", self._what, peer, reason, more)
        self._last, self._quiet = now, 0


def random_secret() -> bytes:
    return os.urandom(SECRET_BYTES)


__all__ = [
    "CHALLENGE",
    "CONTROL_ID",
    "HANDSHAKE_TIMEOUT",
    "HELLO",
    "PAYLOAD_TAGS",
    "PROOF_BYTES",
    "SECRET_BYTES",
    "TAG_BYTES",
    "AuthError",
    "ClientHandshake",
    "FrameMac",
    "RefusalLog",
    "ServerHandshake",
    "Session",
    "accept_control",
    "check_secret",
    "connect_control",
    "gmac",
    "is_local",
    "pack_message",
    "random_secret",
    "read_message",
    "recv_message",
]
