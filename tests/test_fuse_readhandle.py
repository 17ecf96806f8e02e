"""The mount's read cache, without a mount: a segment buffer is never recycled while a
read still copies out of it (a race that real threads hit too rarely to test through FUSE)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
from pathlib import Path

import pytest

pytest.importorskip("mfusepy")

import fuse_mount.fs as fs_module
from fuse_mount.fs import READAHEAD_SEGMENTS, TectonicFS
from tectonic_emu import Cluster
from tectonic_emu.bridge import Bridge

SEG = 64 << 10


def _read(handle: object, size: int, offset: int) -> bytes:
    out = bytearray(size)
    address = ctypes.addressof(ctypes.c_char.from_buffer(out))
    n = handle.read_into(address, size, offset)  # type: ignore[attr-defined]
    return bytes(out[:n])


def test_a_segment_being_copied_out_is_not_recycled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Cluster.create(tmp_path / "c", nodes=4, encoding="r3", block_size=SEG)
    data = os.urandom(SEG * (READAHEAD_SEGMENTS + 8))

    async def put() -> None:
        async with Cluster.open(tmp_path / "c") as cluster:
            await cluster.client().write_file("/f", data)

    asyncio.run(put())
    bridge = Bridge(tmp_path / "c")
    try:
        fs = TectonicFS(bridge)
        handle = fs._handles[fs.open("/f", os.O_RDONLY)]
        copying, go_on = threading.Event(), threading.Event()
        real_copy = fs_module._copy_out

        def slow_first_copy(dest: int, src: object, n: int) -> None:
            if threading.current_thread().name == "slow-reader" and not copying.is_set():
                copying.set()
                assert go_on.wait(30)
            real_copy(dest, src, n)

        monkeypatch.setattr("fuse_mount.fs._copy_out", slow_first_copy)
        got: list[bytes] = []
        slow = threading.Thread(
            target=lambda: got.append(_read(handle, SEG, 0)), name="slow-reader"
        )
        slow.start()
        assert copying.wait(30)
        # Meanwhile another reader moves far ahead: the segments behind it are let go, and
        # their buffers would be refilled with later bytes at once.
        for index in range(2, READAHEAD_SEGMENTS + 8):
            assert _read(handle, SEG, index * SEG) == data[index * SEG : (index + 1) * SEG]
        go_on.set()
        slow.join(30)
        assert got == [data[:SEG]]
    finally:
        bridge.close()
