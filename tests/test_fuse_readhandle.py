"""The mount's read cache, without a mount: a segment buffer is never recycled while a
read still copies out of it (a race that real threads hit too rarely to test through FUSE)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import threading
from pathlib import Path

import pytest

pytest.importorskip("mfusepy")

import fuse_mount.readhandle as readhandle_module
import tectonic_emu.bufpool as bufpool_module
from fuse_mount.fs import TectonicFS
from fuse_mount.readhandle import RANDOM_AFTER, READAHEAD_SEGMENTS, STREAM_AFTER
from tectonic_emu import Cluster
from tectonic_emu.bridge import Bridge

SEG = 64 << 10
LEAD = STREAM_AFTER // SEG  # segments read straight from the store before segments serve


def _stream_in(handle: object, data: bytes) -> None:
    """Read the first ``STREAM_AFTER`` bytes in order, as a sequential reader starts: read
    straight from the store, after which the handle serves reads from segments."""
    for off in range(0, STREAM_AFTER, SEG):
        assert _read(handle, SEG, off) == data[off : off + SEG]


def _cluster_with(root: Path, data: bytes) -> None:
    """An r3 cluster of ``SEG``-byte blocks at ``root`` holding ``data`` as ``/f``."""
    Cluster.create(root, nodes=4, encoding="r3", block_size=SEG)

    async def put() -> None:
        async with Cluster.open(root) as cluster:
            await cluster.client().write_file("/f", data)

    asyncio.run(put())


def _read(handle: object, size: int, offset: int) -> bytes:
    out = bytearray(size)
    address = ctypes.addressof(ctypes.c_char.from_buffer(out))
    n = handle.read_into(address, size, offset)  # type: ignore[attr-defined]
    return bytes(out[:n])


def test_a_segment_being_copied_out_is_not_recycled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(SEG * (LEAD + READAHEAD_SEGMENTS + 8))
    _cluster_with(tmp_path / "c", data)
    bridge = Bridge(tmp_path / "c")
    try:
        fs = TectonicFS(bridge)
        handle = fs._handles[fs.open("/f", os.O_RDONLY)]
        _stream_in(handle, data)
        copying, go_on = threading.Event(), threading.Event()
        real_copy = readhandle_module._copy_out

        def slow_first_copy(dest: int, src: object, n: int) -> None:
            if threading.current_thread().name == "slow-reader" and not copying.is_set():
                copying.set()
                assert go_on.wait(30)
            real_copy(dest, src, n)

        monkeypatch.setattr("fuse_mount.readhandle._copy_out", slow_first_copy)
        got: list[bytes] = []
        slow = threading.Thread(
            target=lambda: got.append(_read(handle, SEG, LEAD * SEG)), name="slow-reader"
        )
        slow.start()
        assert copying.wait(30)
        # Meanwhile another reader moves far ahead: the segments behind it are let go, and
        # their buffers would be refilled with later bytes at once.
        for index in range(LEAD + 2, LEAD + READAHEAD_SEGMENTS + 8):
            assert _read(handle, SEG, index * SEG) == data[index * SEG : (index + 1) * SEG]
        go_on.set()
        slow.join(30)
        assert got == [data[LEAD * SEG : (LEAD + 1) * SEG]]
    finally:
        bridge.close()


def test_segment_buffers_go_back_to_the_pool_and_are_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a file twice maps its segment buffers once: every buffer a closed handle
    held comes back to the mount's pool, each once, and the second read takes them again."""
    data = os.urandom(SEG * (READAHEAD_SEGMENTS + 8) + 123)
    _cluster_with(tmp_path / "c", data)
    mapped: list[object] = []
    real_mmap = bufpool_module.mmap.mmap

    def counting_mmap(*args: object) -> object:
        mapped.append(real_mmap(*args))  # type: ignore[arg-type]
        return mapped[-1]

    monkeypatch.setattr(bufpool_module.mmap, "mmap", counting_mmap)
    bridge = Bridge(tmp_path / "c")
    try:
        fs = TectonicFS(bridge)
        counts = []
        for attempt in range(2):
            fh = fs.open("/f", os.O_RDONLY)
            handle = fs._handles[fh]
            got = b"".join(_read(handle, 100_000, off) for off in range(0, len(data), 100_000))
            assert got == data
            fs.release("/f", fh)
            free = fs.pool._free
            assert len({id(b) for b in free}) == len(free) == len(mapped), attempt
            counts.append(len(mapped))
        assert counts[0] == counts[1] < 2 * (READAHEAD_SEGMENTS + 2)
    finally:
        bridge.close()


def test_random_reads_go_straight_to_the_store_and_sequential_ones_come_back(
    tmp_path: Path,
) -> None:
    """A handle reads straight from the store (each read asks for its bytes alone) until
    reads that continue each other cover ``STREAM_AFTER``; then segments and readahead
    serve it until ``RANDOM_AFTER`` reads in a row jump about (the segments fetched go
    back). A pair of reads that continue each other among random ones (the kernel splits a
    request around pages it has) brings no segments. Every read is right."""
    data = os.urandom(SEG * 40 + 77)
    _cluster_with(tmp_path / "c", data)
    bridge = Bridge(tmp_path / "c")
    try:
        fs = TectonicFS(bridge)
        fh = fs.open("/f", os.O_RDONLY)
        handle = fs._handles[fh]
        assert _read(handle, 4096, 0) == data[:4096]  # a first read: straight from the store
        assert _read(handle, 4096, 4096) == data[4096:8192]  # a pair: still straight
        assert not handle._segments
        _stream_in(handle, data)
        assert _read(handle, SEG, STREAM_AFTER) == data[STREAM_AFTER : STREAM_AFTER + SEG]
        assert handle._segments  # streaming: segments and readahead
        rng = random.Random(5)
        offsets = [rng.randrange(20 * SEG, len(data)) for _ in range(20)]
        for k, off in enumerate(offsets):
            assert _read(handle, 4096, off) == data[off : off + 4096]
            if k + 1 >= RANDOM_AFTER:
                assert not handle._segments, k  # straight from the store
            else:
                assert handle._segments, k  # a stray read: straight, the segments kept
            nxt = off + 4096  # a read continuing it, as a split request makes
            assert _read(handle, 4096, nxt) == data[nxt : nxt + 4096]
            assert not handle._segments or k + 1 < RANDOM_AFTER, k
        for off in range(20 * SEG, 20 * SEG + STREAM_AFTER, SEG):  # a stream again
            assert _read(handle, SEG, off) == data[off : off + SEG]
        assert handle._segments
        fs.release("/f", fh)
        assert len(fs.pool._free) == len({id(b) for b in fs.pool._free})
    finally:
        bridge.close()
