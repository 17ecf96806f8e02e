"""The floor under the mount's metadata rates: Python FUSE daemons that do nothing else.

``bench metadata`` measures the mount beside two daemons that keep a directory tree in a
dict and store nothing (backends ``fuse-floor`` and ``fuse-raw-floor``), each in a child
process (``python -m bench.fuse_floor KIND MOUNTPOINT``), with the same kernel caching as
the mount (entries and attributes for 1 s):

- ``mfusepy``: libfuse3's high-level API through mfusepy, multithreaded, as the mount is
  built: the fastest any daemon built that way can answer here;
- ``raw``: the kernel's FUSE protocol read from and written to ``/dev/fuse`` on one asyncio
  event loop, no libfuse and no threads: what a daemon whose requests never cross from
  libfuse's threads into Python and then into the loop could reach (the mount's next
  design, docs/performance.md). Mounted with ``mount(2)``: root only.

Both answer what ``bench metadata`` asks (lookups, attributes, mkdir, create, flush,
release, readdir, unlink, rmdir) and ENOSYS to the rest. They are measurement tools, not
file systems: no permissions, no data, nothing kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import shutil
import stat as stat_mod
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KINDS = ("mfusepy", "raw")
TIMEOUT = 1.0  # seconds the kernel keeps entries and attributes, as the mount's
_ROOT = Path(__file__).resolve().parents[1]  # the checkout, for the child's imports


class _Node:
    __slots__ = ("children", "ino", "mode")

    def __init__(self, ino: int, mode: int) -> None:
        self.ino, self.mode = ino, mode
        self.children: dict[str, _Node] | None = {} if stat_mod.S_ISDIR(mode) else None

    def attrs(self) -> dict[str, Any]:
        nlink = 2 if self.children is not None else 1
        return {"st_mode": self.mode, "st_nlink": nlink, "st_size": 0, "st_ino": self.ino}

    def add(self, name: str, ino: int, mode: int) -> _Node:
        """A new entry in this directory; OSError ENOTDIR or EEXIST."""
        if self.children is None:
            raise OSError(errno.ENOTDIR, "not a directory", name)
        if name in self.children:
            raise OSError(errno.EEXIST, "exists", name)
        node = self.children[name] = _Node(ino, mode)
        return node

    def remove(self, name: str, *, directory: bool) -> _Node:
        """The entry taken out of this directory; OSError ENOENT, or ENOTEMPTY for a
        ``directory`` that has entries."""
        gone = (self.children or {}).get(name)
        if gone is None or self.children is None:
            raise OSError(errno.ENOENT, "no such name", name)
        if directory and gone.children:
            raise OSError(errno.ENOTEMPTY, "not empty", name)
        del self.children[name]
        return gone


class _Tree:
    """Paths to nodes, for the mfusepy daemon (its high-level API names files by path)."""

    def __init__(self) -> None:
        self.root = _Node(1, stat_mod.S_IFDIR | 0o755)
        self.next = 2

    def find(self, path: str) -> _Node | None:
        node: _Node | None = self.root
        for part in path.strip("/").split("/") if path != "/" else ():
            if node is None or node.children is None:
                return None
            node = node.children.get(part)
        return node

    def parent(self, path: str) -> tuple[_Node, str]:
        """The directory holding ``path`` and its last name; OSError ENOENT."""
        parent, _, name = path.rpartition("/")
        where = self.find(parent or "/")
        if where is None:
            raise OSError(errno.ENOENT, "no such directory", parent)
        return where, name

    def add(self, path: str, mode: int) -> None:
        where, name = self.parent(path)
        where.add(name, self.next, mode)
        self.next += 1

    def remove(self, path: str, *, directory: bool) -> None:
        where, name = self.parent(path)
        where.remove(name, directory=directory)


def serve_mfusepy(mountpoint: str) -> None:
    import mfusepy

    tree = _Tree()

    # mfusepy answers an OSError raised here with its errno (EEXIST, ENOENT, ENOTEMPTY).
    class Floor(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            node = tree.find(path)
            if node is None:
                raise mfusepy.FuseOSError(errno.ENOENT)
            return node.attrs()

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            tree.add(path, stat_mod.S_IFREG | (mode & 0o7777))
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            tree.add(path, stat_mod.S_IFDIR | (mode & 0o7777))
            return 0

        def unlink(self, path: str) -> int:
            tree.remove(path, directory=False)
            return 0

        def rmdir(self, path: str) -> int:
            tree.remove(path, directory=True)
            return 0

        def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
            node = tree.find(path)
            if node is None or node.children is None:
                raise mfusepy.FuseOSError(errno.ENOTDIR)
            here = {"st_ino": node.ino, "st_mode": stat_mod.S_IFDIR}
            return [(".", here, 0), ("..", here, 0)] + [  # use_ino: an inode 0 is hidden
                (name, {"st_ino": c.ino, "st_mode": c.mode}, 0) for name, c in node.children.items()
            ]

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            return 0

    mfusepy.FUSE(
        Floor(),
        mountpoint,
        foreground=True,
        nothreads=False,
        attr_timeout=TIMEOUT,
        entry_timeout=TIMEOUT,
        use_ino=True,
        allow_other=True,
    )


# -- the kernel's protocol (<linux/fuse.h>, 7.x) ---------------------------------------------
_IN = struct.Struct("<IIQQIIIHH")  # fuse_in_header: len, opcode, unique, nodeid, ...
_OUT = struct.Struct("<IiQ")  # fuse_out_header: len, error, unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_ENTRY = struct.Struct("<QQQQII")  # fuse_entry_out, before its fuse_attr
_ATTR_OUT = struct.Struct("<QII")  # fuse_attr_out, before its fuse_attr
_OPEN_OUT = struct.Struct("<QII")  # fuse_open_out
_INIT_OUT = struct.Struct("<IIIIHHIIHHI28x")  # fuse_init_out (64 bytes)
_DIRENT = struct.Struct("<QQII")  # fuse_dirent, before its name
_READ_IN = struct.Struct("<QQI")  # fuse_read_in: fh, offset, size
(LOOKUP, FORGET, GETATTR, MKDIR, UNLINK, RMDIR, RELEASE, FLUSH, INIT) = (
    1,
    2,
    3,
    9,
    10,
    11,
    18,
    25,
    26,
)
(OPENDIR, READDIR, RELEASEDIR, ACCESS, CREATE, INTERRUPT, BATCH_FORGET) = (
    27, 28, 29, 34, 35, 36, 42,
)  # fmt: skip
_NO_REPLY = frozenset({FORGET, BATCH_FORGET, INTERRUPT})
_TTL = int(TIMEOUT)


class RawServer:
    """The ``raw`` daemon: requests read on the event loop as ``/dev/fuse`` becomes readable,
    each answered at once, in order."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.nodes = {1: _Node(1, stat_mod.S_IFDIR | 0o755)}
        self.next = 2
        self.buf = bytearray((1 << 20) + 4096)
        self.done = asyncio.get_running_loop().create_future()

    def _attr(self, n: _Node) -> bytes:
        now = int(time.time())
        nlink = 2 if n.children is not None else 1
        return _ATTR.pack(n.ino, 0, 0, now, now, now, 0, 0, 0, n.mode, nlink, 0, 0, 0, 4096, 0)

    def _entry(self, n: _Node) -> bytes:
        return _ENTRY.pack(n.ino, 0, _TTL, _TTL, 0, 0) + self._attr(n)

    def _reply(self, unique: int, payload: bytes = b"", err: int = 0) -> None:
        with contextlib.suppress(FileNotFoundError):  # interrupted: the kernel forgot it
            os.write(self.fd, _OUT.pack(_OUT.size + len(payload), -err, unique) + payload)

    def readable(self) -> None:
        while True:
            try:
                n = os.readv(self.fd, [self.buf])
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.ENOENT:  # a request interrupted before it was read
                    continue
                if not self.done.done():  # ENODEV: unmounted
                    self.done.set_result(None)
                return
            head = _IN.unpack_from(self.buf)
            body = bytes(self.buf[_IN.size : min(n, head[0])])
            try:
                self._answer(head[1], head[2], head[3], body)
            except OSError as e:
                self._reply(head[2], err=e.errno or errno.EIO)

    def _answer(self, op: int, unique: int, nodeid: int, body: bytes) -> None:
        if op in _NO_REPLY:
            return
        if op == INIT:  # of no node
            _major, minor, readahead = struct.unpack_from("<III", body)
            out = _INIT_OUT.pack(7, min(minor, 38), readahead, 0, 16, 12, 1 << 20, 1, 256, 0, 0)
            self._reply(unique, out)
            return
        node = self.nodes.get(nodeid)
        if node is None:
            raise OSError(errno.ENOENT, "no such node")
        if op == LOOKUP:
            child = (node.children or {}).get(body[:-1].decode())
            if child is None:
                raise OSError(errno.ENOENT, "no such name")
            self._reply(unique, self._entry(child))
        elif op == GETATTR:
            self._reply(unique, _ATTR_OUT.pack(_TTL, 0, 0) + self._attr(node))
        elif op in (MKDIR, CREATE):
            if op == MKDIR:
                mode, name = struct.unpack_from("<I", body)[0] | stat_mod.S_IFDIR, body[8:-1]
            else:
                mode, name = struct.unpack_from("<4xI", body)[0] | stat_mod.S_IFREG, body[16:-1]
            new = self.nodes[self.next] = node.add(name.decode(), self.next, mode)
            self.next += 1
            opened = _OPEN_OUT.pack(new.ino, 0, 0) if op == CREATE else b""
            self._reply(unique, self._entry(new) + opened)
        elif op in (UNLINK, RMDIR):
            gone = node.remove(body[:-1].decode(), directory=op == RMDIR)
            self.nodes.pop(gone.ino, None)
            self._reply(unique)
        elif op == OPENDIR:
            self._reply(unique, _OPEN_OUT.pack(0, 0, 0))
        elif op == READDIR:
            _fh, offset, size = _READ_IN.unpack_from(body)
            self._reply(unique, self._dirents(node, offset, size))
        elif op in (FLUSH, RELEASE, RELEASEDIR, ACCESS):
            self._reply(unique)
        else:
            raise OSError(errno.ENOSYS, "not answered by the floor")

    @staticmethod
    def _dirents(node: _Node, offset: int, size: int) -> bytes:
        out = bytearray()
        names = [(".", node), ("..", node), *(node.children or {}).items()]
        for i, (name, child) in enumerate(names[offset:], start=offset + 1):
            raw = name.encode()
            entry = _DIRENT.pack(child.ino, i, len(raw), child.mode >> 12) + raw
            entry += bytes(-len(entry) % 8)
            if len(out) + len(entry) > size:
                break
            out += entry
        return bytes(out)


def _mount_raw(mountpoint: str) -> int:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"floor", mountpoint.encode(), b"fuse.floor", 0, options) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"mount(2) of the raw floor: {os.strerror(err)}", mountpoint)
    return fd


async def serve_raw(mountpoint: str) -> None:
    fd = _mount_raw(mountpoint)
    server = RawServer(fd)
    asyncio.get_running_loop().add_reader(fd, server.readable)
    await server.done


# -- running one beside the bench ------------------------------------------------------------
#: What each daemon is, in ``bench metadata``'s durability column.
DESCRIPTION = {
    "mfusepy": "an in-memory Python daemon on mfusepy (libfuse3, threads), nothing else: the "
    "floor of the mount's design (kernel attribute cache 1 s)",
    "raw": "an in-memory Python daemon speaking the kernel's FUSE protocol on one event loop, "
    "nothing else (kernel attribute cache 1 s)",
}


def why_not(kind: str) -> str | None:
    """Why the ``kind`` daemon cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if kind == "raw" and os.geteuid() != 0:
        return "the raw floor mounts with mount(2): root only"
    return None


def start(kind: str, mountpoint: Path, log: Path, wait: float = 15.0) -> subprocess.Popen[bytes]:
    """The ``kind`` daemon serving ``mountpoint`` (a child process); returns once mounted.
    OSError if it cannot run here or dies first (its output is in ``log``)."""
    reason = why_not(kind)
    if reason is not None:
        raise OSError(errno.EOPNOTSUPP, f"fuse floor {kind}: {reason}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fuse_floor", kind, str(mountpoint)],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + wait
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            said = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise OSError(errno.EIO, f"fuse floor {kind} did not mount: {said[0]}")
        time.sleep(0.02)
    return proc


def stop(proc: subprocess.Popen[bytes], mountpoint: Path) -> None:
    """Unmount and let the daemon end (killed if it does not within 10 s)."""
    tool = shutil.which("fusermount3") if os.geteuid() != 0 else None
    cmd = [tool, "-u", str(mountpoint)] if tool else ["umount", str(mountpoint)]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in KINDS:
        sys.exit(f"usage: python -m bench.fuse_floor {{{'|'.join(KINDS)}}} MOUNTPOINT")
    if argv[0] == "mfusepy":
        serve_mfusepy(argv[1])
    else:
        asyncio.run(serve_raw(argv[1]))


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = [
    "DESCRIPTION",
    "KINDS",
    "RawServer",
    "main",
    "serve_mfusepy",
    "serve_raw",
    "start",
    "stop",
    "why_not",
]
