"""Mount and unmount: ``tectonic-emu mount`` / ``tectonic-emu umount``.

``mount(..., foreground=True)`` serves the file system in this process until it is unmounted
(``umount``, ``fusermount3 -u``) or gets SIGINT/SIGTERM, which unmount it: a clean exit never
leaves a stale mount behind. ``start_mount`` runs that in a child process and returns once the
mount is live (the command line's default); an error of the child's is raised in the parent.
Neither mounts over a mount point that has a mount already, live or dead: a SIGKILLed mount
process leaves a dead one ("Transport endpoint is not connected"), which ``umount`` clears
(lazily if it must).
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tectonic_emu.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotADirectoryError_,
    NotFoundError,
    TectonicError,
)

FSTYPE = "fuse.tectonic"  # the type /proc/self/mounts gives our mounts (subtype "tectonic")


def mounts_at(mountpoint: str | os.PathLike[str]) -> list[str]:
    """The types of the file systems mounted at ``mountpoint``, bottom first: empty when
    nothing is, more than one when mounts are stacked there."""
    target = os.path.realpath(mountpoint)
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 2 and _unescape(fields[1]) == target:
                found.append(fields[2])
    return found


def _unescape(field: str) -> str:
    # /proc/self/mounts writes a space, tab, newline or backslash in a path as \ooo (octal).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def is_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    return bool(mounts_at(mountpoint))


def check_mountpoint(mountpoint: str | os.PathLike[str]) -> None:
    """Raise what mounting at ``mountpoint`` would meet: AlreadyExistsError when something is
    mounted there, live or dead (a second mount would stack on it), NotFoundError when it
    does not exist, NotADirectoryError_ when it is not a directory, PermissionError when
    this (non-root) user may not mount on it."""
    mp = str(mountpoint)
    found = mounts_at(mountpoint)
    if found:
        try:
            os.stat(mountpoint)
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                raise AlreadyExistsError(
                    f"dead mount: {mp} (its mount process was killed;"
                    f" tectonic-emu umount {mp} clears it)"
                ) from None
        if found[-1] == FSTYPE:
            raise AlreadyExistsError(f"already mounted: {mp} (tectonic-emu umount {mp} first)")
        raise AlreadyExistsError(f"already mounted ({found[-1]}): {mp} (unmount it first)")
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        raise NotFoundError("mount point does not exist", mp) from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError_("mount point is not a directory", mp)
    if os.geteuid() != 0 and not os.access(mountpoint, os.W_OK):
        # fusermount3 refuses a mount point its user cannot write to.
        raise PermissionError(errno.EACCES, "no write access to the mount point", mp)


def check_fuse() -> None:
    """Raise NotFoundError, saying what to install, unless FUSE can be used here."""
    if not os.path.exists("/dev/fuse"):
        raise NotFoundError(
            "FUSE is not available: no /dev/fuse (modprobe fuse; in a container,"
            " --device /dev/fuse --cap-add SYS_ADMIN)"
        )
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        raise NotFoundError("FUSE is not available: no fusermount3 (apt-get install fuse3)")
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        raise NotFoundError(
            "FUSE is not available: mfusepy is not installed (pip install 'tectonic-emu[fuse]')"
        ) from None
    except OSError as e:  # mfusepy found no libfuse
        raise NotFoundError(f"FUSE is not available: {e} (apt-get install fuse3)") from None


def _fuse_class(*, direct_io: bool = False, on_init: Callable[[], None] | None = None) -> type:
    """mfusepy's FUSE with a write callback that hands the kernel's buffer over as a
    memoryview instead of copying it into ``bytes`` first (the mount copies it once, into
    its pending block), and files opened in FUSE's direct-I/O mode: write-only opens always
    (see ``_direct``), every open with ``direct_io``. ``on_init`` runs once the kernel has
    the mount (its FUSE_INIT)."""
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
        def _init(self, conn: Any, config: Any) -> None:
            super()._init(conn, config)
            if on_init is not None:
                on_init()

        def open(self, path: bytes, fip: Any) -> int:
            result = int(super().open(path, fip))
            _direct(fip)
            return result

        def create(self, path: bytes, mode: int, fip: Any) -> int:
            result = int(super().create(path, mode, fip))
            _direct(fip)
            return result

        def read_buf(self, path: bytes | None, bufpp: Any, size: int, offset: int, fip: Any) -> int:
            # mfusepy's decodes the path, which libfuse may leave NULL for a handle (with
            # ``nullpath_ok``, or an unlinked file's under ``hard_remove``): reads go by handle.
            fh = fip.contents if self.raw_fi else fip.contents.fh
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            return int(self.operations.read_buf(decoded, bufpp, size, offset, fh))

        def write(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
            view = memoryview((ctypes.c_char * size).from_address(ctypes.addressof(buf.contents)))
            fh = fip.contents if self.raw_fi else fip.contents.fh
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            try:
                return int(self.operations.write(decoded, view, offset, fh))
            finally:
                view.release()

        def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
            # mfusepy's drops the handle libfuse passes for ftruncate (and open's O_TRUNC):
            # a file unlinked while open, its directory removed too, has no path left.
            fh = (fip.contents if self.raw_fi else fip.contents.fh) if fip else None
            decoded = None if path is None else path.decode(self.encoding, self.errors)
            return int(self.operations.truncate(decoded, length, fh))

    return TectonicFUSE


def mount(
    cluster_dir: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    *,
    encoding: str | None = None,
    direct_io: bool = False,
    allow_other: bool = True,
    debug: bool = False,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve the cluster at ``mountpoint`` in this process until unmounted; ``on_ready``
    runs (on a FUSE thread) once the mount is live.

    Raises what ``check_mountpoint`` and ``check_fuse`` raise, what opening the cluster
    raises, and TectonicError with libfuse's own words when libfuse cannot mount.

    Write-only opens always use FUSE's direct-I/O mode; ``direct_io`` opens every file so:
    reads and writes skip the kernel page cache and go straight to the mount (the mount's
    own readahead still applies). Streaming runs faster, as the kernel neither copies
    through its cache nor fills it; small reads each cost a round trip to this process,
    nothing is cached between opens, and ``mmap`` with ``MAP_SHARED`` fails with ENODEV
    (``MAP_PRIVATE`` works). ``docs/fuse.md`` has the figures.

    Mounted by root, the mount is shared with every local user (``allow_other``) and the
    kernel checks each access against the stored modes, owners and groups
    (``default_permissions``), as for any file system root mounts; ``allow_other=False``
    keeps it to root. Another user's mount is private to them and checks nothing (FUSE lets
    no one else in unless /etc/fuse.conf says ``user_allow_other``)."""
    from fuse_mount.fs import MAX_IO, TectonicFS
    from tectonic_emu.bridge import Bridge

    mp = Path(mountpoint)
    check_mountpoint(mp)
    check_fuse()
    bridge = Bridge(cluster_dir, name="tectonic-fuse-loop")
    try:
        fs = TectonicFS(bridge, encoding=encoding)
        threading.Thread(target=set_readahead, args=(mp, MAX_IO), daemon=True).start()
        held = _HeldStderr()

        def live() -> None:
            held.release(echo=True)
            if on_ready is not None:
                on_ready()

        fuse = _fuse_class(direct_io=direct_io, on_init=live)
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
                use_ino=True,  # st_ino is the file id: one number for a file's hard links
                **_sharing(allow_other),
            )
        except RuntimeError as e:  # mfusepy: libfuse returned an error status
            if not held.holding:
                raise TectonicError(f"the mount ended with libfuse error {e}", str(mp)) from None
            said = _libfuse_said(held.release(echo=False))
            raise TectonicError(f"libfuse cannot mount ({said or e})", str(mp)) from None
        finally:
            held.release(echo=True)
    finally:
        bridge.close()


def _sharing(allow_other: bool) -> dict[str, bool]:
    """The FUSE options that share a mount with other users (``mount``)."""
    if allow_other and os.geteuid() == 0:
        return {"allow_other": True, "default_permissions": True}
    return {}


class _HeldStderr:
    """File descriptor 2 sent to an in-memory file until ``release``: libfuse prints why a
    mount failed there, and the mount raises it as its error's message instead of leaving it
    as a stray line above a traceback. Released once the mount is live, fd 2 is put back and
    what was held is written to it (``echo``)."""

    def __init__(self) -> None:
        sys.stderr.flush()
        self._held = os.memfd_create("tectonic-mount-stderr")
        self._saved = os.dup(2)
        os.dup2(self._held, 2)
        self._lock = threading.Lock()
        self.holding = True

    def release(self, *, echo: bool) -> str:
        """Put fd 2 back and return what was written to it meanwhile ("" after the first)."""
        with self._lock:
            if not self.holding:
                return ""
            self.holding = False
            sys.stderr.flush()
            os.dup2(self._saved, 2)
            os.close(self._saved)
            chunks: list[bytes] = []
            os.lseek(self._held, 0, os.SEEK_SET)
            while chunk := os.read(self._held, 1 << 16):
                chunks.append(chunk)
            os.close(self._held)
        text = b"".join(chunks).decode(errors="replace")
        if echo and text:
            sys.stderr.write(text)
            sys.stderr.flush()
        return text


def _libfuse_said(text: str) -> str:
    """libfuse's and fusermount3's lines ("fuse: mount failed: Invalid argument"), joined,
    without their prefixes; else the last line written."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line.split(": ", 1)[-1] for line in lines if line.startswith(("fuse:", "fusermount"))]
    return "; ".join(said) or (lines[-1] if lines else "")


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
    allow_other: bool = True,
    log: str | os.PathLike[str] | None = None,
    wait: float = 30.0,
) -> subprocess.Popen[bytes]:
    """Run ``tectonic-emu mount --foreground`` in a child process; return once mounted.

    Raises what ``mount`` would: the cheap checks (the mount point, ``cluster.json``, FUSE)
    run here, before the child starts, and an error of the child's (opening the cluster's
    metadata, libfuse) comes back over a pipe and is raised here as it was raised there.
    TectonicError if the child dies without saying why, or is not mounted after ``wait``
    seconds (it is sent SIGTERM)."""
    from tectonic_emu.config import ClusterConfig

    check_mountpoint(mountpoint)
    ClusterConfig.load(Path(cluster_dir))
    check_fuse()
    status_r, status_w = os.pipe()
    cmd = [sys.executable, "-m", "tectonic_emu", "mount", "--cluster", str(cluster_dir)]
    cmd += ["--foreground", "--status-fd", str(status_w), str(mountpoint)]
    if encoding:
        cmd += ["--encoding", encoding]
    if direct_io:
        cmd += ["--direct-io"]
    if not allow_other:
        cmd += ["--no-allow-other"]
    try:
        proc = _spawn(cmd, log, status_w)
        try:
            report = _read_to_end(status_r, wait)
        except TimeoutError:
            proc.send_signal(signal.SIGTERM)  # a mount it made meanwhile goes with it
            _reap(proc)
            raise TectonicError(f"not mounted after {wait:g} s", str(mountpoint)) from None
    finally:
        os.close(status_r)
    if report:
        _reap(proc)
        raise _unpickle_error(report)
    if proc.poll() is None and is_mounted(mountpoint):
        return proc
    status = _reap(proc)
    how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited ({status})"
    see = f"; see {log}" if log is not None else ""
    raise TectonicError(f"the mount process {how} before mounting{see}", str(mountpoint))


def _spawn(
    cmd: list[str], log: str | os.PathLike[str] | None, status_w: int
) -> subprocess.Popen[bytes]:
    """Start the child, its output into ``log``, ``status_w`` its one inherited pipe end (and
    closed here, so the pipe ends when the child closes it)."""
    try:
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                pass_fds=(status_w,),
            )
        finally:
            if log is not None:
                out.close()  # type: ignore[union-attr]
    finally:
        os.close(status_w)


def mount_for_parent(
    status_fd: int,
    cluster_dir: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    *,
    encoding: str | None = None,
    direct_io: bool = False,
    allow_other: bool = True,
    debug: bool = False,
) -> None:
    """The child's side of ``start_mount``: ``mount``, telling the parent over the pipe
    ``status_fd`` how it went. The pipe is closed once the mount is live; an error that
    stops it first is written to it (pickled) and raised."""
    status = os.fdopen(status_fd, "wb")
    try:
        mount(
            cluster_dir,
            mountpoint,
            encoding=encoding,
            direct_io=direct_io,
            allow_other=allow_other,
            debug=debug,
            on_ready=status.close,
        )
    except Exception as e:
        if not status.closed:
            status.write(_pickle_error(e))
        raise
    finally:
        status.close()


def _pickle_error(e: Exception) -> bytes:
    # An OSError keeps its class and errno (TectonicError pickles by message and path); any
    # other error becomes a TectonicError with its text, so the parent never shows a traceback.
    if isinstance(e, OSError):
        try:
            return pickle.dumps(e)
        except Exception:  # an OSError subclass that does not pickle: keep its words
            pass
    return pickle.dumps(TectonicError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__))


def _unpickle_error(report: bytes) -> BaseException:
    try:
        err = pickle.loads(report)  # our own child's report, over a private pipe
    except Exception:
        return TectonicError("the mount process failed (its report was unreadable)")
    return err if isinstance(err, BaseException) else TectonicError(str(err))


def _read_to_end(fd: int, wait: float) -> bytes:
    """Everything written to the pipe ``fd`` until its writers close it; TimeoutError after
    ``wait`` seconds."""
    deadline = time.monotonic() + wait
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        readable, _, _ = select.select([fd], [], [], left)
        if readable:
            data = os.read(fd, 1 << 16)
            if not data:
                return b"".join(chunks)
            chunks.append(data)


def _reap(proc: subprocess.Popen[bytes]) -> int:
    """Its exit status, once it has exited (a child that failed exits at once; killed after
    10 s if it does not)."""
    try:
        return proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def unmount(mountpoint: str | os.PathLike[str], *, lazy: bool = False) -> None:
    """Unmount the tectonic-emu mount at ``mountpoint`` (``fusermount3 -u``, or ``umount``
    as root); ``lazy`` detaches a dead or busy mount at once, and a dead one is detached
    lazily anyway.

    Raises NotFoundError when ``mountpoint`` does not exist, InvalidArgumentError when no
    tectonic-emu mount is there (nothing, or another file system), TectonicError when it is
    busy (files open on it) or cannot be unmounted."""
    mp = str(mountpoint)
    found = mounts_at(mountpoint)
    if not found:
        if not os.path.lexists(mountpoint):
            raise NotFoundError("not mounted (no such directory)", mp)
        raise InvalidArgumentError("not mounted", mp)
    if found[-1] != FSTYPE:
        raise InvalidArgumentError(f"not a tectonic-emu mount ({found[-1]})", mp)
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is not None:
        cmd = [tool, "-u"] + (["-z"] if lazy else []) + [mp]
    else:
        cmd = ["umount"] + (["-l"] if lazy else []) + [mp]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == 0:
        return
    said = (r.stderr or "").strip()
    if not lazy and "not connected" in said + _probe(mountpoint):
        unmount(mountpoint, lazy=True)  # the mount process died: detach
        return
    if "busy" in said:
        raise TectonicError(
            f"busy: {mp} (files are open on it: close them, or tectonic-emu umount --lazy {mp})"
        )
    # fusermount3: "/usr/bin/fusermount3: failed to unmount /x: <strerror>"
    raise TectonicError(f"cannot unmount ({said.rsplit(': ', 1)[-1] or r.returncode})", mp)


def _probe(mountpoint: str | os.PathLike[str]) -> str:
    try:
        os.stat(mountpoint)
    except OSError as e:
        return str(e)
    return ""


__all__ = [
    "FSTYPE",
    "check_fuse",
    "check_mountpoint",
    "is_mounted",
    "mount",
    "mount_for_parent",
    "mounts_at",
    "start_mount",
    "unmount",
]
