"""``MetaOps``: the mount's calls on what is not a file's bytes: directories (``readdir``,
``mkdir``, ``rmdir``), modes, owners and times (``chmod``, ``chown``, ``utimens``),
symlinks, hard links, special files, ``statfs`` and extended attributes. Part of
``TectonicFS`` (``fuse_mount/fs.py``), which holds the state they use; the kernel has
checked who may (``default_permissions``) before any of them."""

from __future__ import annotations

import errno
import json
import os
import stat as stat_mod
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, cast

from mfusepy import FuseOSError, fuse_get_context

from fuse_mount.linknames import LinkNames
from fuse_mount.writehandle import WriteHandle
from tectonic_emu import attrs
from tectonic_emu.attrs import Perms, Time
from tectonic_emu.bridge import Bridge
from tectonic_emu.metadata.records import FileKind

XATTR_LAYOUT = "user.tectonic.layout"
XATTR_ENCODING = "user.tectonic.encoding"
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2  # <sys/stat.h>
INO_MASK = 0x7FFF_FFFF_FFFF_FFFF  # file ids as inode numbers (``use_ino``)


class MetaOps:
    """(See the module docstring.) What ``TectonicFS`` gives these calls:"""

    bridge: Bridge
    encoding: str | None
    links: LinkNames
    _writing: dict[int, WriteHandle]
    _hidden: dict[str, int]
    _lock: threading.Lock
    _setattr_reply: set[int]
    _call: Callable[[Any], Any]
    _read: Callable[[Callable[[], Any]], Any]
    _stat: Callable[[str], Any]

    # -- directories -------------------------------------------------------------------------
    def readdir(self, path: str, fh: int) -> Iterator[tuple[str, dict[str, int], int]]:
        """Each name with its inode number (``use_ino``: a 0 would hide it) and, for a
        directory, its type (other kinds are not in the entry: DT_UNKNOWN)."""
        here = self._stat(path).id & INO_MASK
        entries = self._read(lambda: self.bridge.client.scandir(path))
        yield ".", {"st_ino": here, "st_mode": stat_mod.S_IFDIR}, 0
        yield "..", {"st_ino": here, "st_mode": stat_mod.S_IFDIR}, 0  # not looked up
        for e in entries:
            kind = stat_mod.S_IFDIR if e.kind == "dir" else 0
            yield e.name, {"st_ino": e.id & INO_MASK, "st_mode": kind}, 0

    def mkdir(self, path: str, mode: int) -> int:
        self._call(self.bridge.client.mkdir(path, perms=caller(mode)))
        return 0

    def rmdir(self, path: str) -> int:
        if self._stat(path).kind != "dir":
            raise FuseOSError(errno.ENOTDIR)
        self._call(self.bridge.client.delete(path))
        return 0

    # -- modes, owners, times ----------------------------------------------------------------

    def chmod(self, path: str, mode: int) -> int:
        mode = stat_mod.S_IMODE(mode)
        self._change(path, lambda: self.bridge.client.chmod(path, mode), mode=mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        # chown(2)'s -1 (leave it) arrives as (uid_t)-1.
        keep = (1 << 32) - 1
        got_uid, got_gid = (-1 if v in (-1, keep) else v for v in (uid, gid))
        self._change(
            path, lambda: self.bridge.client.chown(path, got_uid, got_gid), uid=got_uid, gid=got_gid
        )
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        atime: Time = "now" if times is None else _time(times[0])
        mtime: Time = "now" if times is None else _time(times[1])
        if self._writing:
            # A handle here writing the file: its bytes land first, so that its close does
            # not move the times set now (``cp -p``: write, futimens, close).
            file_id = self._stat(path).id
            with self._lock:
                writing = self._writing.get(file_id)
            if writing is not None:
                writing.flush()
        self._change(
            path, lambda: self.bridge.client.utime(path, atime, mtime), atime=atime, mtime=mtime
        )
        return 0

    def _change(
        self, path: str, by_path: Callable[[], Coroutine[Any, Any, None]], **how: Any
    ) -> None:
        """Set attributes of what ``path`` names (``by_path``); of a file libfuse hid, the
        store's ``change_id(**how)`` (fchmod or futimens of an unlinked open file)."""
        self._setattr_reply.discard(threading.get_ident())
        file_id = self._hidden.get(path)
        if file_id is None:
            self._call(by_path())
            file_id = self.links.id_of(path)
        else:
            self._call(self.bridge.client.change_id(file_id, **how))
        self.links.changed(file_id, but=path)
        self._setattr_reply.add(threading.get_ident())

    # mfusepy's names, as fusepy's: ``target`` is the new name, ``source`` what it is of.
    def symlink(self, target: str, source: str) -> int:
        self._call(self.bridge.client.symlink(source, target, perms=caller(0o777)))
        return 0

    def readlink(self, path: str) -> str:
        return str(self._read(lambda: self.bridge.client.readlink(path)))

    def link(self, target: str, source: str) -> int:
        self._call(self.bridge.client.link(source, target))
        file_id = self._stat(target).id
        self.links.seen(file_id, source, 2)
        self.links.seen(file_id, target, 2)
        self.links.changed(file_id, but=target)  # the kernel has the new name's from the reply
        return 0

    def mknod(self, path: str, mode: int, dev: int) -> int:
        kind = _KINDS.get(stat_mod.S_IFMT(mode))
        if kind is None:
            raise FuseOSError(errno.EINVAL)
        if kind == "file":  # mknod(2) may make an empty regular file too
            opener = self.bridge.client.open_writer(
                path, encoding=self.encoding, perms=caller(mode)
            )
            self._call(_made(opener))
            return 0
        self._call(self.bridge.client.mknod(path, kind, perms=caller(mode), rdev=dev))
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        vfs = os.statvfs(self.bridge.cluster_dir)
        return {
            "f_bsize": vfs.f_bsize,
            "f_frsize": vfs.f_frsize,
            "f_blocks": vfs.f_blocks,
            "f_bfree": vfs.f_bfree,
            "f_bavail": vfs.f_bavail,
            "f_files": vfs.f_files,
            "f_ffree": vfs.f_ffree,
            "f_namemax": 255,
        }

    # -- extended attributes -----------------------------------------------------------------
    # ``user.*`` attributes are the store's (``tectonic_emu/xattrs.py``); ``user.tectonic.*``
    # are computed here and cannot be set; other namespaces are not kept.
    def listxattr(self, path: str) -> list[str]:
        st = self._stat(path)
        ours = [XATTR_LAYOUT, XATTR_ENCODING] if st.kind == "file" else [XATTR_ENCODING]
        return ours + list(self._read(lambda: self.bridge.client.listxattr(path)))

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if not name.startswith("user."):
            # The kernel asks for security.capability before every write: answer at once,
            # without a metadata lookup (it was a round trip per 1 MiB write).
            raise FuseOSError(errno.ENODATA)
        if name not in (XATTR_LAYOUT, XATTR_ENCODING):
            return bytes(self._read(lambda: self.bridge.client.getxattr(path, name)))
        st = self._stat(path)
        if name == XATTR_ENCODING:
            return (st.encoding or "").encode()
        if st.kind == "file":
            layout = self._call(self.bridge.client.layout(path))
            return json.dumps([_layout_dict(b) for b in layout]).encode()
        raise FuseOSError(errno.ENODATA)

    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        if name in (XATTR_LAYOUT, XATTR_ENCODING):
            self._stat(path)
            raise FuseOSError(errno.EPERM)  # the layout is the store's; encodings: mkdir
        self._call(self.bridge.client.setxattr(path, name, value, options))
        self.links.changed(self.links.id_of(path), but=path)
        return 0

    def removexattr(self, path: str, name: str) -> int:
        self._call(self.bridge.client.removexattr(path, name))
        self.links.changed(self.links.id_of(path), but=path)
        return 0


async def _made(opener: Any) -> None:
    """An empty regular file created and sealed (``mknod`` of S_IFREG)."""
    async with opener:
        pass


# What mknod is asked to make, by its type bits.
_KINDS = {bits: cast(FileKind, kind) for kind, bits in attrs.TYPE_BITS.items() if kind != "dir"}


def caller(mode: int) -> Perms:
    """The permission bits asked for (the kernel applied the caller's umask), and the
    caller's uid and gid: what a file or directory it creates is given."""
    uid, gid, _ = fuse_get_context()
    return Perms(stat_mod.S_IMODE(mode), uid, gid)


def _time(ns: int) -> Time:
    """A time utimensat passed (nanoseconds; libfuse hands UTIME_NOW and UTIME_OMIT over
    as they are, in the nanoseconds of second 0)."""
    if ns == UTIME_NOW:
        return "now"
    if ns == UTIME_OMIT:
        return "omit"
    return ns / 1e9


def _layout_dict(block: Any) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(block)
    d["block_id"] = f"{block.block_id:016x}"
    return d


__all__ = ["UTIME_NOW", "UTIME_OMIT", "XATTR_ENCODING", "XATTR_LAYOUT", "MetaOps", "caller"]
