"""Mount and unmount: ``tectonic-emu mount`` / ``tectonic-emu umount``.

``mount(..., foreground=True)`` serves the file system in this process until it is unmounted
(``umount``, ``fusermount3 -u``) or gets SIGINT/SIGTERM, which unmount it: a clean exit never
leaves a stale mount behind. ``start_mount`` runs that in a child process and returns once the
mount is live (the command line's default). A SIGKILLed mount process leaves a dead mount
point ("Transport endpoint is not connected"); ``umount`` clears it (lazily if it must).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tectonic_emu.errors import InvalidArgumentError, TectonicError


def is_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def _fuse_class(*, direct_io: bool = False) -> type:
    """mfusepy's FUSE with a write callback that hands the kernel's buffer over as a
    memoryview instead of copying it into ``bytes`` first (the mount copies it once, into
    its pending block), and files opened in FUSE's direct-I/O mode: write-only opens always
    (see ``_direct``), every open with ``direct_io``."""
    import ctypes

    from mfusepy import FUSE

    def _direct(fip: Any) -> None:
        # A write-only descriptor loses nothing in direct-I/O mode: it cannot be mmapped,
        # and without a writeback cache the kernel sends every write() to the mount anyway.
        # It gains the copy into the page cache: 1 GiB streamed through the page cache
        # wrote at 0.57-0.87 of the native client (single runs), in direct-I/O mode at
        # 0.96-1.07 (5-run medians; docs/performance.md).
        fi = fip.contents
        if direct_io or fi.flags & os.O_ACCMODE == os.O_WRONLY:
            fi.direct_io = 1

    class TectonicFUSE(FUSE):  # type: ignore[misc]
        def open(self, path: bytes, fip: Any) -> int:
            result = int(super().open(path, fip))
            _direct(fip)
            return result

        def create(self, path: bytes, mode: int, fip: Any) -> int:
            result = int(super().create(path, mode, fip))
            _direct(fip)
            return result

        def write(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
            view = memoryview((ctypes.c_char * size).from_address(ctypes.addressof(buf.contents)))
            fh = fip.contents if self.raw_fi else fip.contents.fh
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            try:
                return int(self.operations.write(decoded, view, offset, fh))
            finally:
                view.release()

    return TectonicFUSE


def mount(
    cluster_dir: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    *,
    encoding: str | None = None,
    direct_io: bool = False,
    debug: bool = False,
) -> None:
    """Serve the cluster at ``mountpoint`` in this process until unmounted.

    Write-only opens always use FUSE's direct-I/O mode; ``direct_io`` opens every file so:
    reads and writes skip the kernel page cache and go straight to the mount (the mount's
    own readahead still applies). Streaming runs faster, as the kernel neither copies
    through its cache nor fills it; small reads each cost a round trip to this process,
    nothing is cached between opens, and ``mmap`` with ``MAP_SHARED`` fails with ENODEV
    (``MAP_PRIVATE`` works). ``docs/fuse.md`` has the figures."""
    from fuse_mount.fs import MAX_IO, TectonicFS
    from tectonic_emu.bridge import Bridge

    mp = Path(mountpoint)
    if not mp.is_dir():
        raise InvalidArgumentError("mount point is not a directory", str(mp))
    bridge = Bridge(cluster_dir, name="tectonic-fuse-loop")
    fs = TectonicFS(bridge, encoding=encoding)
    threading.Thread(target=set_readahead, args=(mp, MAX_IO), daemon=True).start()
    fuse = _fuse_class(direct_io=direct_io)
    try:
        fuse(
            fs,
            str(mp),
            foreground=True,
            nothreads=False,
            debug=debug,
            fsname="tectonic",
            subtype="tectonic",
            max_read=MAX_IO,
            max_threads=16,
            attr_timeout=1.0,
            entry_timeout=1.0,
        )
    finally:
        bridge.close()


def set_readahead(mountpoint: Path, nbytes: int, wait: float = 30.0) -> bool:
    """Once ``mountpoint`` is mounted, raise its kernel readahead to ``nbytes`` (root only).

    FUSE splits buffered reads into readahead windows, 128 KiB by default, whatever
    ``max_read`` says: 1 MiB windows took a FUSE passthrough from 0.57 to 1.45 GB/s on this
    machine (../shared/MACHINE.md). The knob is the mount's backing-device entry in sysfs."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not is_mounted(mountpoint):
        time.sleep(0.02)
    try:
        dev = os.stat(mountpoint).st_dev
        knob = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        knob.write_text(f"{nbytes // 1024}\n")
    except OSError:
        return False
    return True


def start_mount(
    cluster_dir: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    *,
    encoding: str | None = None,
    direct_io: bool = False,
    log: str | os.PathLike[str] | None = None,
    wait: float = 30.0,
) -> subprocess.Popen[bytes]:
    """Run ``tectonic-emu mount --foreground`` in a child process; return once mounted."""
    cmd = [sys.executable, "-m", "tectonic_emu", "mount", "--cluster", str(cluster_dir)]
    cmd += ["--foreground", str(mountpoint)]
    if encoding:
        cmd += ["--encoding", encoding]
    if direct_io:
        cmd += ["--direct-io"]
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if is_mounted(mountpoint):
            return proc
        if proc.poll() is not None:
            raise TectonicError(f"mount exited with status {proc.returncode}", str(mountpoint))
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    raise TectonicError(f"not mounted after {wait:.0f} s", str(mountpoint))


def unmount(mountpoint: str | os.PathLike[str], *, lazy: bool = False) -> None:
    """Unmount (``fusermount3 -u``, or ``umount`` as root); ``lazy`` detaches a dead or
    busy mount at once."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is not None:
        cmd = [tool, "-u"] + (["-z"] if lazy else []) + [str(mountpoint)]
    else:
        cmd = ["umount"] + (["-l"] if lazy else []) + [str(mountpoint)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        if not lazy and "not connected" in (r.stderr or "") + str(_probe(mountpoint)):
            unmount(mountpoint, lazy=True)  # the mount process died: detach
            return
        raise TectonicError(f"cannot unmount: {(r.stderr or '').strip()}", str(mountpoint))


def _probe(mountpoint: str | os.PathLike[str]) -> str:
    try:
        os.stat(mountpoint)
    except OSError as e:
        return str(e)
    return ""


__all__ = ["is_mounted", "mount", "start_mount", "unmount"]
