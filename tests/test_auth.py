"""Authenticated links (issue 19): the cluster secret file, the handshake and frame tags of
``chunkstore/auth.py``, and a served cluster attacked by another local user.

The attacker is a real process running as uid ``nobody``, with only the standard library
(as the issue's attacker had a 100-line client written from docs/wire-protocol.md): it gets
the node and control ports, well-formed frames, and a captured session of a real client, and
tries to list, read, write, delete, delay and start nodes. Every attempt must fail and change
nothing: the chunk files, the delays and the stopped node are checked afterwards.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import Cluster
from tectonic_emu.chunkstore import auth, wire
from tectonic_emu.chunkstore.remote import RemoteNode, fixed_address
from tectonic_emu.errors import AuthenticationError, NodeUnavailableError
from tectonic_emu.nodectl import control, read_address, read_serve_file, signal_node
from tectonic_emu.secret import create_secret, ensure_secret, load_secret, secret_path
from tectonic_emu.served import Serving

from .conftest import SMALL_BLOCK, run_with

NOBODY = 65534
ATTACKER_PYTHON = "/usr/bin/python3"  # one that uid nobody may run (the venv's lives in /root)


# -- GMAC, the handshake ---------------------------------------------------------------------
def test_gmac_matches_the_gcm_test_vector() -> None:
    """AES-256-GCM, key and nonce all zero, nothing at all: the published tag (McGrew and
    Viega's GCM spec, test case 13)."""
    assert auth.gmac(bytes(32), bytes(12), []).hex() == "530f8afbc74536b9a963b4f1c4cb738b"
    data = os.urandom(300_000)
    one = auth.gmac(bytes(range(32)), bytes(12), [data])
    assert auth.gmac(bytes(range(32)), bytes(12), [data[:7], memoryview(data)[7:]]) == one
    assert auth.gmac(bytes(range(32)), bytes(11) + b"\1", [data]) != one


_AS_PART: list[Callable[[bytes], auth.Part]] = [bytes, bytearray, memoryview]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 2**64 - 1),
            st.lists(st.binary(max_size=300), max_size=4),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_frame_mac_tags_match_gmac(steps: list[tuple[int, list[bytes], int]]) -> None:
    """FrameMac's context keyed once gives ``gmac``'s tags frame after frame, for any nonce
    and any split into parts (bytes, bytearray, memoryview), and so do its big frames, which
    go through ``gmac`` itself; a wrong tag is refused."""
    key = os.urandom(32)
    mac = auth.FrameMac(key)
    big = os.urandom(70_000)
    for seq, parts, kind in steps:
        mixed = [_AS_PART[kind](p) for p in parts]
        for frame in (mixed, [*mixed, big]):
            want = auth.gmac(key, seq.to_bytes(8, "little") + bytes(4), frame)
            assert mac.tag(seq, frame) == want
            assert mac.check(seq, frame, want)
            assert not mac.check(seq, frame, bytes(a ^ 1 for a in want))


def test_handshake_proofs_and_keys() -> None:
    secret = os.urandom(32)
    client = auth.ClientHandshake(secret, 3)
    server = auth.ServerHandshake(secret, 3)
    challenge = server.challenge(client.hello)
    proof, mine = client.answer(challenge)
    theirs = server.verify(proof)
    frame = b"any frame"
    assert theirs.receive.check(0, [frame], mine.send.tag(0, [frame]))
    assert mine.receive.check(0, [frame], theirs.send.tag(0, [frame]))
    assert not theirs.receive.check(1, [frame], mine.send.tag(0, [frame]))  # sequence
    assert not mine.receive.check(0, [frame], mine.send.tag(0, [frame]))  # direction
    # The server's proof is not a client proof (no reflection), nor valid for another node.
    with pytest.raises(auth.AuthError):
        auth.ServerHandshake(secret, 3).verify(challenge[-32:])
    with pytest.raises(auth.AuthError, match="not node"):
        auth.ClientHandshake(secret, 4).answer(challenge)
    with pytest.raises(auth.AuthError, match="does not prove"):
        auth.ClientHandshake(os.urandom(32), 3).answer(
            auth.ServerHandshake(secret, 3).challenge(auth.ClientHandshake(os.urandom(32), 3).hello)
        )


def test_payload_tags_cannot_be_dropped_off_the_host() -> None:
    """A server that sees a loopback link offers header-only tags; a client that is not on
    loopback (or asked for payload tags) refuses that, and a changed mode fails the proof."""
    secret = os.urandom(32)
    client = auth.ClientHandshake(secret, 1)
    challenge = auth.ServerHandshake(secret, 1, local=True).challenge(client.hello)
    _, session = client.answer(challenge, local=True)
    assert not session.send.payloads
    with pytest.raises(auth.AuthError, match="no payload tags"):
        client.answer(challenge, local=False)
    asking = auth.ClientHandshake(secret, 1, payload_tags=True)
    offered = auth.ServerHandshake(secret, 1, local=True).challenge(asking.hello)
    assert asking.answer(offered, local=True)[1].send.payloads
    downgraded = bytearray(offered)
    downgraded[3] = 0  # a man in the middle clears the mode
    with pytest.raises(auth.AuthError, match="does not prove"):
        asking.answer(bytes(downgraded), local=True)


def test_refusals_are_logged_without_flooding(caplog: pytest.LogCaptureFixture) -> None:
    refusals = auth.RefusalLog(logging.getLogger("test.refusals"), "node 1", interval=3600)
    with caplog.at_level(logging.WARNING, "test.refusals"):
        for i in range(1000):
            refusals.refused(("10.0.0.1", i), "wrong proof")
    assert refusals.count == 1000
    assert len(caplog.records) == 1 and "refused" in caplog.records[0].getMessage()


# -- the secret file -------------------------------------------------------------------------
def test_cluster_create_makes_a_secret_only_its_owner_reads(tmp_path: Path) -> None:
    root = tmp_path / "c"
    Cluster.create(root, nodes=3, encoding="r3", block_size=SMALL_BLOCK)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(secret_path(root).stat().st_mode) == 0o600
    secret = load_secret(secret_path(root))
    assert len(secret) == 32 and secret_path(root).read_text().strip() == secret.hex()


def test_a_bad_secret_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    with pytest.raises(AuthenticationError, match="cluster create"):
        load_secret(path)
    create_secret(path)
    with pytest.raises(FileExistsError):
        create_secret(path)
    path.chmod(0o644)
    with pytest.raises(AuthenticationError, match="chmod 600"):
        load_secret(path)
    path.chmod(0o600)
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(AuthenticationError, match="symlink"):
        load_secret(tmp_path / "link")
    path.write_text("not hex\n")
    with pytest.raises(AuthenticationError, match="hex digits"):
        load_secret(path)


def test_an_older_cluster_gets_its_secret_from_its_first_serve(tmp_path: Path) -> None:
    root = tmp_path / "c"
    Cluster.create(root, nodes=3, encoding="r3", block_size=SMALL_BLOCK)
    secret_path(root).unlink()  # as made before secrets existed
    with Serving(root, repair_interval=0):
        secret = load_secret(secret_path(root))

        async def write_read(c: Cluster) -> bytes:
            await c.client().write_file("/f", b"after the upgrade")
            return await c.client().read_file("/f")

        assert run_with(root, write_read) == b"after the upgrade"
    assert ensure_secret(root) == secret  # kept, not made again


# -- an attacker as another uid --------------------------------------------------------------
ATTACKER = r"""
import hashlib, hmac, json, os, socket, struct, sys

def recv_all(sock, limit=1 << 20):
    got = b""
    try:
        while len(got) < limit:
            more = sock.recv(65536)
            if not more:
                return got, "closed"
            got += more
    except socket.timeout:
        return got, "open"
    except ConnectionError:
        return got, "reset"
    return got, "open"

def attempt(addr, data, proof_secret=None, node_id=0, then=b""):
    sock = socket.create_connection(tuple(addr), timeout=5)
    try:
        if proof_secret is None:
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)  # all said: a node waiting for more bytes ends too
            except OSError:
                pass  # closed by the node already
            return recv_all(sock)
        cn = os.urandom(32)
        sock.sendall(struct.pack("<2sBBI32s", b"TA", 1, 0, node_id, cn))
        challenge = b""
        while len(challenge) < 72:
            more = sock.recv(72 - len(challenge))
            if not more:
                break
            challenge += more
        sn = challenge[8:40]
        msg = b"tectonic client proof" + struct.pack("<I", node_id) + cn + sn
        try:
            sock.sendall(hmac.digest(proof_secret, msg, "sha256") + data + then)
        except ConnectionError:
            pass
        got, how = recv_all(sock)
        return challenge + got, how
    finally:
        sock.close()

job = json.loads(sys.argv[1])
out = {"uid": os.getuid()}
try:
    open(job["secret"], "rb").read()
    out["secret"] = "read"
except OSError as e:
    out["secret"] = type(e).__name__
results = []
for a in job["attempts"]:
    secret = bytes.fromhex(a["secret"]) if a.get("secret") else None
    got, how = attempt(a["addr"], bytes.fromhex(a["data"]), secret, a.get("node", 0))
    results.append({"what": a["what"], "got": len(got), "how": how})
out["results"] = results
print(json.dumps(out))
"""


def _frame(op: wire.Op, rid: int, meta: bytes = b"", payload: bytes = b"") -> bytes:
    crc = int(google_crc32c.value(payload)) if payload else 0
    return wire.pack_header(op, rid, meta, payload_len=len(payload), payload_crc32c=crc) + payload


def _chunk_files(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted((root / "nodes").rglob("*")):
        if path.is_file() and path.relative_to(root).parts[2].startswith("d"):
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


class Relay:
    """A TCP relay to ``target`` that records what the client sends: a captured session."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sent = bytearray()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = self._listener.getsockname()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        client, _ = self._listener.accept()
        upstream = socket.create_connection(self.target)

        def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
            while data := src.recv(1 << 16):
                if record:
                    self.sent.extend(data)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pump, args=(upstream, client, False), daemon=True)
        back.start()
        pump(client, upstream, True)
        back.join(10)
        client.close()
        upstream.close()
        self._listener.close()


def _as_nobody(job: dict[str, object]) -> dict[str, object]:
    proc = subprocess.run(
        [ATTACKER_PYTHON, "-c", ATTACKER, json.dumps(job)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(ATTACKER_PYTHON, os.X_OK),
    reason="needs root (to run a process as nobody) and /usr/bin/python3",
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "c"
    Cluster.create(root, nodes=4, encoding="r3", block_size=SMALL_BLOCK)
    with Serving(root, repair_interval=0, log=tmp_path / "serve.log"):
        yield root


@needs_root
def test_another_uid_can_do_nothing_to_a_served_cluster(served: Path) -> None:
    root = served
    data = os.urandom(3 * SMALL_BLOCK + 123)

    async def write(c: Cluster) -> list[tuple[int, int, str]]:
        await c.client().write_file("/victim", data)
        return [
            (ch.node, ch.disk, ch.chunk_id)
            async for rec in c.meta.iter_blocks()
            for ch in rec.chunks
        ]

    chunks = run_with(root, write)
    assert {n for n, _, _ in chunks} - {2}, "a node the attacker targets holds a chunk"
    # A real client's session with node 0, captured on the way: a DELETE of a chunk of ours.
    addr0 = read_address(root, 0)
    assert addr0 is not None
    relay = Relay((addr0.host, addr0.port))

    async def captured_session() -> None:
        secret = load_secret(secret_path(root))
        remote = RemoteNode(0, 2, fixed_address(*relay.address), secret=secret)
        try:
            await remote.write_chunk(1, "decoy.0", b"decoy", crc32c=google_crc32c.value(b"decoy"))
            await remote.delete_chunk(1, "decoy.0")
        finally:
            await remote.close()

    asyncio.run(captured_session())
    # Node 2 stopped: a control `start` from the attacker would bring it back.
    signal_node(root, 2, signal.SIGTERM)
    attempts: list[dict[str, object]] = []
    for n in (0, 1, 3):
        a = read_address(root, n)
        assert a is not None
        disk, cid = next(((d, c) for node, d, c in chunks if node == n), (0, "x.0"))
        frames = {
            "LIST": _frame(wire.Op.LIST, 1, wire.DISK.pack(0)),
            "READ": _frame(wire.Op.READ, 2, wire.pack_chunk_ref(disk, cid)),
            "WRITE": _frame(
                wire.Op.WRITE, 3, wire.DISK_FLAGS.pack(0, 0) + b"pwned.0", b"PWNED-BY-NOBODY!"
            ),
            "DELETE": _frame(wire.Op.DELETE, 4, wire.pack_chunk_ref(disk, cid)),
            "SET_DELAY": _frame(wire.Op.SET_DELAY, 5, wire.DELAY.pack(3600.0)),
        }
        for what, raw in frames.items():
            attempts.append(
                {"what": f"{what} to node {n}", "addr": [a.host, a.port], "data": raw.hex()}
            )
            # the same after a handshake with a guessed secret, the frame tagged with a guess
            tagged = raw + os.urandom(auth.TAG_BYTES)
            attempts.append({
                "what": f"{what} to node {n}, guessed secret", "addr": [a.host, a.port],
                "data": tagged.hex(), "secret": os.urandom(32).hex(), "node": n,
            })  # fmt: skip
    attempts.append({
        "what": "replayed session to node 0", "addr": [addr0.host, addr0.port],
        "data": bytes(relay.sent).hex(),
    })  # fmt: skip
    info = read_serve_file(root)
    assert info is not None
    start = json.dumps({"cmd": "start", "node": 2}).encode() + b"\n"
    attempts.append({"what": "control start", "addr": info["control"], "data": start.hex()})
    attempts.append({
        "what": "control start, guessed secret", "addr": info["control"],
        "data": (len(start).to_bytes(4, "little") + start + bytes(16)).hex(),
        "secret": os.urandom(32).hex(), "node": auth.CONTROL_ID,
    })  # fmt: skip
    # the decoy chunk back, so that a replayed DELETE would have something to delete
    asyncio.run(_rewrite_decoy(root))
    before = _chunk_files(root)
    assert any(name.endswith("decoy.0") for name in before)

    result = _as_nobody({"secret": str(secret_path(root)), "attempts": attempts})

    assert result["uid"] == NOBODY
    assert result["secret"] == "PermissionError"
    results = result["results"]
    assert isinstance(results, list) and len(results) == len(attempts)
    for r, a in zip(results, attempts, strict=True):
        # Nothing but the node's challenge ever comes back, and the node closes.
        challenge = auth.CHALLENGE.size if ("secret" in a or "replayed" in r["what"]) else 0
        assert (r["got"], r["how"]) in ((challenge, "closed"), (challenge, "reset")), r
    assert _chunk_files(root) == before  # nothing read... written, deleted or overwritten
    assert read_address(root, 2) is None  # not started
    assert control(root, {"cmd": "status"})["nodes"]["2"]["running"] is False

    async def check(c: Cluster) -> None:
        assert await c.client().read_file("/victim") == data
        secret = load_secret(secret_path(root))
        for n in (0, 1, 3):  # no delay: each answers well within its timeout
            a = read_address(root, n)
            assert a is not None
            remote = RemoteNode(n, 2, fixed_address(a.host, a.port), secret=secret,
                                request_timeout=30)  # fmt: skip
            try:
                await remote.list_chunks(0)
            finally:
                await remote.close()

    run_with(root, check)
    log = (root.parent / "serve.log").read_text()
    assert "refused" in log


async def _rewrite_decoy(root: Path) -> None:
    secret = load_secret(secret_path(root))
    a = read_address(root, 0)
    assert a is not None
    remote = RemoteNode(0, 2, fixed_address(a.host, a.port), secret=secret)
    try:
        await remote.write_chunk(1, "decoy.0", b"decoy", crc32c=google_crc32c.value(b"decoy"))
    finally:
        await remote.close()


def test_a_client_with_another_secret_is_refused(served: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    shutil.copy(served / "cluster.json", other / "cluster.json")
    for name in ("serve.json", "nodes"):
        src = served / name
        if src.is_dir():
            shutil.copytree(src, other / name, ignore=shutil.ignore_patterns("d*"))
        else:
            shutil.copy(src, other / name)
    for db in served.glob("metadata.db*"):  # the same cluster's metadata, opened as its own
        shutil.copy(db, other / db.name)
    create_secret(secret_path(other))

    async def ping(c: Cluster) -> None:
        node = c.nodes[0]
        assert isinstance(node, RemoteNode)
        with pytest.raises(NodeUnavailableError, match="cannot authenticate"):
            await node.ping()

    run_with(other, ping)
    with pytest.raises(AuthenticationError, match="does not prove"):
        control(other, {"cmd": "status"})


# -- PostgreSQL ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("postgresql://t@db1:5432/x", "postgresql://t@db1:5432/x?sslmode=require"),
        ("postgresql://t:pw@10.0.0.1/x?a=b", "postgresql://t:pw@10.0.0.1/x?a=b&sslmode=require"),
        ("postgresql://h1:1,h2:2/x", "postgresql://h1:1,h2:2/x?sslmode=require"),
        ("postgresql://t@127.0.0.1:5/x", None),
        ("postgresql://t@localhost/x", None),
        ("postgresql://t@[::1]:5432/x", None),
        ("postgresql:///x?host=/var/run/postgresql", None),
        ("postgresql://t@db1/x?sslmode=verify-full&sslrootcert=/ca.pem", None),
        ("postgresql://t@db1/x?sslmode=disable", None),
    ],
)
def test_postgres_urls_to_other_hosts_require_tls(
    url: str, want: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tectonic_emu.metadata._postgres import with_ssl_default

    monkeypatch.delenv("PGSSLMODE", raising=False)
    assert with_ssl_default(url) == (want or url)
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    assert with_ssl_default(url) == url


# -- TLS -------------------------------------------------------------------------------------
def test_tls_links_carry_no_plaintext(tmp_path: Path) -> None:
    """A cluster made with ``tls``: served nodes speak TLS only. A chunk written through a
    relay that records the client's bytes is not in them; a client without the CA cannot
    connect; the file reads back through the cluster."""
    from tectonic_emu.tls import client_context, tls_dir

    root = tmp_path / "c"
    Cluster.create(root, nodes=3, encoding="r3", block_size=SMALL_BLOCK, tls=True)
    assert stat.S_IMODE(tls_dir(root).stat().st_mode) == 0o700
    assert stat.S_IMODE((tls_dir(root) / "node.key").stat().st_mode) == 0o600
    data = os.urandom(SMALL_BLOCK)
    with Serving(root, repair_interval=0, log=tmp_path / "serve.log"):
        addr = read_address(root, 0)
        assert addr is not None
        relay = Relay((addr.host, addr.port))
        secret = load_secret(secret_path(root))

        async def through_relay() -> None:
            ctx = client_context(root)
            remote = RemoteNode(0, 2, fixed_address(*relay.address), secret=secret, tls=ctx)
            try:
                await remote.write_chunk(0, "tls.0", data, crc32c=google_crc32c.value(data))
                got, _ = await remote.read_chunk(0, "tls.0")
                assert bytes(got) == data
                conn = remote._conns["data"]
                assert conn.transport is not None
                assert conn.transport.get_extra_info("ssl_object") is not None
            finally:
                await remote.close()

        asyncio.run(through_relay())
        assert len(relay.sent) > len(data) and data[:64] not in bytes(relay.sent)

        async def without_tls() -> None:
            remote = RemoteNode(0, 2, fixed_address(addr.host, addr.port), secret=secret)
            try:
                with pytest.raises(NodeUnavailableError):
                    await remote.ping()
            finally:
                await remote.close()

        asyncio.run(without_tls())

        async def read_back(c: Cluster) -> bytes:
            await c.client().write_file("/f", data)
            return await c.client().read_file("/f")

        assert run_with(root, read_back) == data
