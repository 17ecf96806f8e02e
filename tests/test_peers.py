"""The benchmark's peers: each mounts, keeps 16 MiB of random bytes with the copies it promises,
and leaves no mount, process or file behind. Skipped where a peer is not installed."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import peers
from bench.peers import PEERS, PeerError, is_mounted, missing, mounted, version
from bench.store import drop_caches, write_durably

SIZE = 16 << 20
IO = 1 << 20


def _peer_pids() -> set[int]:
    """Live processes of the peers' programs (whoever started them)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            comm = (entry / "comm").read_text().strip() if entry.name.isdigit() else ""
        except OSError:
            continue
        if comm in peers.PEER_PROGRAMS and peers._alive(int(entry.name)):
            pids.add(int(entry.name))
    return pids


def _gluster_state() -> set[Path] | None:
    """glusterd's state paths when no glusterd runs (so a peer must restore them), else None."""
    return None if peers._running("glusterd") else peers._gluster_state()


def _sizes(root: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in root.rglob(pattern) if p.is_file())


def _check_copies(name: str, workdir: Path, data: bytes) -> None:
    """The bytes are stored as many times as the peer promises, in its own storage."""
    copies = PEERS[name].copies
    if name == "juicefs":
        stored = _sizes(workdir / "objects", "chunks/**/*")
        assert SIZE <= stored < SIZE * 1.05
        assert _sizes(workdir / "cache", "*") == 0  # the read came from the objects
    elif name.startswith("seaweedfs"):
        per_server = [_sizes(d, "*.dat") for d in sorted(workdir.glob("volume*"))]
        assert len(per_server) == copies
        assert all(SIZE <= s < SIZE * 1.1 for s in per_server), per_server
    else:
        digest = hashlib.sha256(data).digest()
        held = [b / "ckpt.bin" for b in sorted(workdir.glob("brick*"))]
        assert len(held) == copies
        assert all(hashlib.sha256(p.read_bytes()).digest() == digest for p in held)


def _round_trip(mnt: Path, data: bytes) -> tuple[float, float]:
    """Write in 1 MiB writes, fsync, drop the page cache, read back; (write, read) MB/s."""
    path = mnt / "ckpt.bin"
    t0 = time.perf_counter()
    write_durably(path, memoryview(data))
    wrote = time.perf_counter() - t0
    drop_caches()
    t0 = time.perf_counter()
    back = bytearray()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(IO):
            back += chunk
    read = time.perf_counter() - t0
    assert back == data
    return len(data) / wrote / 1e6, len(data) / read / 1e6


@pytest.fixture
def leaves_nothing(tmp_path: Path) -> Iterator[Path]:
    """A workdir; afterwards: empty, nothing mounted, no new peer process, glusterd state back."""
    workdir = tmp_path / "peer"
    before, state = _peer_pids(), _gluster_state()
    yield workdir
    assert not [p for p, _ in peers._mounts() if p.startswith(str(tmp_path))]
    assert _peer_pids() <= before
    assert list(workdir.iterdir()) == []
    if state is not None:
        assert peers._gluster_state() == state


@pytest.mark.parametrize("name", list(PEERS))
def test_round_trip_keeps_the_promised_copies(name: str, leaves_nothing: Path) -> None:
    if reason := missing(name):
        pytest.skip(reason)
    data = os.urandom(SIZE)  # random: SeaweedFS would compress zeros
    before = _peer_pids()
    with mounted(name, leaves_nothing) as mnt:
        assert is_mounted(mnt)
        assert [p.name for p in mnt.iterdir()] == []
        assert _peer_pids() - before, "no peer process runs"
        write_mb_s, read_mb_s = _round_trip(mnt, data)
        _check_copies(name, leaves_nothing, data)
    assert not is_mounted(mnt)
    print(f"{name} {version(name)}: write {write_mb_s:.0f} MB/s, cold read {read_mb_s:.0f} MB/s")


def test_failed_setup_raises_with_logs_and_leaves_nothing(
    leaves_nothing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if reason := missing("seaweedfs"):
        pytest.skip(reason)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ports, free_port = iter([busy.getsockname()[1]]), peers.free_port  # the master's: taken
        monkeypatch.setattr(peers, "free_port", lambda: next(ports, None) or free_port())
        expected = pytest.raises(PeerError, match=r"(?s)master exited.*--- master\.log")
        with expected, mounted("seaweedfs", leaves_nothing):
            pytest.fail("mounted although the master's port is taken")


def test_unknown_peer_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown peer"):
        missing("ceph")
    with pytest.raises(ValueError, match="unknown peer"), mounted("ceph", tmp_path):
        pass


def test_installed_peers_report_a_version() -> None:
    for name in PEERS:
        if missing(name) is None:
            found = version(name)
            assert found is not None and found[0].isdigit(), (name, found)


def test_refused_glusterfs_volume_restores_glusterd_state(
    leaves_nothing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if reason := missing("glusterfs"):
        pytest.skip(reason)
    monkeypatch.setattr(peers, "GLUSTER_HOST", "127.0.0.1")  # glusterd refuses it for bricks
    expected = pytest.raises(PeerError, match=r"(?s)volume create.*--- gluster\.log")
    with expected, mounted("glusterfs", leaves_nothing):
        pytest.fail("mounted with a brick on 127.0.0.1")
