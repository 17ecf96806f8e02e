"""The namespace half of the client: paths resolved to directories and files, directories
made and listed, stat and the POSIX attributes, renames and deletes. Each change is one
metadata transaction. ``Client`` (``client.py``) adds the data half: writers, readers,
block commits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal

from tectonic_emu import attrs, clock, xattrs
from tectonic_emu.argcheck import bool_arg, bytes_arg, int_arg
from tectonic_emu.coding import Encoding
from tectonic_emu.config import ClusterConfig
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import (
    AlreadyExistsError,
    CrossTenantError,
    DirectoryNotEmptyError,
    InvalidArgumentError,
    InvalidPathError,
    IsADirectoryError_,
    NameTooLongError,
    NoAttributeError,
    NotADirectoryError_,
    NotEnoughNodesError,
    NotFoundError,
    NotPermittedError,
)
from tectonic_emu.metadata.layers import Metadata, MetaTxn, new_id
from tectonic_emu.metadata.records import (
    DIR_MODE,
    FILE_MODE,
    ROOT_DIR_ID,
    SPECIAL_KINDS,
    ChunkPlacement,
    DirRecord,
    Entry,
    FileKind,
    FileRecord,
)
from tectonic_emu.paths import join_path, split_path

MAX_TARGET = 4095  # bytes of a symlink's target: PATH_MAX less its NUL


@dataclass(frozen=True, slots=True)
class Stat:
    """What ``Client.stat`` reports of a file or directory."""

    path: str
    kind: Literal["dir"] | FileKind  # "file": a regular file
    id: int
    size: int  # files: committed bytes; directories: 0
    encoding: str | None  # files: their encoding; directories: what new files inherit
    sealed: bool  # directories: False
    nblocks: int
    ctime: float
    mtime: float
    holes: int = 0  # files: bytes of ``size`` in holes (zeros, nothing stored)
    mode: int = FILE_MODE  # permission bits (``tectonic_emu/attrs.py``)
    uid: int = 0
    gid: int = 0
    atime: float = 0.0
    nlink: int = 1  # directories: 2 and their subdirectories
    target: str | None = None  # a symlink's
    rdev: int = 0  # a device node's


class Namespace:
    """Path operations over a cluster's metadata (module docstring); ``Client`` is one."""

    config: ClusterConfig
    meta: Metadata
    datapath: DataPath

    # -- resolution --------------------------------------------------------------------------
    async def _walk(
        self, m: MetaTxn, parts: list[str], *, path: str, want_encoding: bool = False
    ) -> tuple[int, str]:
        """(dir id, inherited encoding) of the directory named by ``parts``."""
        dir_id = ROOT_DIR_ID
        enc = self.config.encoding
        if want_encoding:
            root = await m.names.get_dir(ROOT_DIR_ID)
            if root is not None and root.encoding:
                enc = root.encoding
        for i, name in enumerate(parts):
            e = await m.names.lookup(dir_id, name)
            if e is None:
                raise NotFoundError("no such directory", join_path(parts[: i + 1]))
            if e.kind != "dir":
                raise NotADirectoryError_("not a directory", join_path(parts[: i + 1]))
            dir_id = e.id
            if want_encoding:
                rec = await m.names.get_dir(dir_id)
                if rec is not None and rec.encoding:
                    enc = rec.encoding
        return dir_id, enc

    async def _lookup(
        self, m: MetaTxn, path: str, parts: list[str] | None = None
    ) -> tuple[int, Entry]:
        """(parent dir id, entry) of an existing path other than the root (``parts``: its
        ``split_path``, if the caller has it)."""
        if parts is None:
            parts = split_path(path)
        if not parts:
            raise InvalidPathError("the root has no parent", "/")
        parent, _ = await self._walk(m, parts[:-1], path=path)
        e = await m.names.lookup(parent, parts[-1])
        if e is None:
            raise NotFoundError("no such file or directory", join_path(parts))
        return parent, e

    @staticmethod
    async def _dir(m: MetaTxn, dir_id: int) -> DirRecord:
        """The record of a directory that has an entry (or is the root)."""
        d = await m.names.get_dir(dir_id)
        assert d is not None, f"directory {dir_id} has an entry and no record"
        return d

    def _encoding(self, name: str) -> Encoding:
        enc = Encoding.parse(name)
        if enc.width > self.config.nodes:
            raise NotEnoughNodesError(
                f"encoding {enc} needs {enc.width} nodes; the cluster has {self.config.nodes}"
            )
        return enc

    # -- directories -------------------------------------------------------------------------
    async def mkdir(
        self,
        path: str,
        *,
        parents: bool = False,
        exist_ok: bool = False,
        encoding: str | None = None,
        perms: attrs.Perms | None = None,
    ) -> None:
        """Create a directory (and, with ``parents``, its missing ancestors, like ``mkdir -p``).

        ``encoding`` sets what files created below it inherit; ``perms``, its mode and owners
        (ancestors made with ``parents``: 0755, its owners). Raises AlreadyExistsError
        (unless ``parents`` or ``exist_ok`` and it is a directory), NotFoundError (a missing
        parent without ``parents``), NotADirectoryError_.
        """
        bool_arg("mkdir", "parents", parents)
        bool_arg("mkdir", "exist_ok", exist_ok)
        parts = split_path(path)
        if encoding is not None:
            self._encoding(encoding)
        if not parts and not (parents or exist_ok):
            raise AlreadyExistsError("directory exists", "/")
        now = clock.wall()
        async with self.meta.transaction() as m:
            dir_id = ROOT_DIR_ID
            for i, name in enumerate(parts):
                last = i == len(parts) - 1
                e = await m.names.lookup(dir_id, name)
                sub = join_path(parts[: i + 1])
                if e is not None:
                    if e.kind != "dir":
                        raise (AlreadyExistsError if last else NotADirectoryError_)(
                            "a file is in the way", sub
                        )
                    if last and not (parents or exist_ok):
                        raise AlreadyExistsError("directory exists", sub)
                    dir_id = e.id
                    continue
                if not (last or parents):
                    raise NotFoundError("no such directory", sub)
                asked = perms if last or perms is None else replace(perms, mode=DIR_MODE)
                dir_id = await self._new_dir(
                    m, dir_id, name, asked, encoding if last else None, now
                )

    async def _new_dir(
        self,
        m: MetaTxn,
        parent_id: int,
        name: str,
        perms: attrs.Perms | None,
        encoding: str | None,
        now: float,
        *,
        tenant: int | None = None,
    ) -> int:
        """Make directory ``name`` in ``parent_id`` (free there); its id. Its tenant is its
        parent's, or ``tenant`` for a tenant's namespace (``tenancy.py``)."""
        new = new_id()
        parent = await self._dir(m, parent_id)
        mode, uid, gid = attrs.born(parent, perms, is_dir=True)
        t = parent.tenant if tenant is None else tenant
        await m.names.put_dir(
            DirRecord(new, parent_id, name, encoding, now, now, mode, uid, gid, None, 0, t)
        )
        await m.names.link(parent_id, Entry(name, "dir", new))
        await attrs.touch_dir(m, parent_id, now, subdirs_added=1)
        return new

    async def listdir(self, path: str = "/", *, prefix: str = "") -> list[str]:
        """Names in a directory, sorted; with ``prefix``, those that start with it (read as
        one range: a poll for a few names in a directory of thousands reads a few)."""
        return [e.name for e in await self.scandir(path, prefix=prefix)]

    async def scandir(self, path: str = "/", *, prefix: str = "") -> list[Entry]:
        parts = split_path(path)
        async with self.meta.view() as m:
            if parts:
                _, e = await self._lookup(m, path, parts)
                if e.kind != "dir":
                    raise NotADirectoryError_("not a directory", join_path(parts))
                dir_id = e.id
            else:
                dir_id = ROOT_DIR_ID
            return sorted(await m.names.entries(dir_id, prefix=prefix), key=lambda e: e.name)

    # -- stat --------------------------------------------------------------------------------
    async def stat(self, path: str) -> Stat:
        parts = split_path(path)
        async with self.meta.view() as m:
            e = await self._entry(m, path, parts)
            if e.kind == "dir":
                d = await self._dir(m, e.id)
                return Stat(
                    join_path(parts) if parts else "/", "dir", e.id, 0, d.encoding, False, 0,
                    d.ctime, d.mtime, 0, *_posix(d), 2 + await attrs.subdirs(m, d),
                )  # fmt: skip
            f = await m.files.get(e.id)
            assert f is not None
            return _file_stat(join_path(parts), f)

    async def stat_id(self, file_id: int) -> Stat:
        """``stat`` of a file by id (the FUSE mount's open files, wherever they are named
        now, or nameless); its ``path`` is its name, or "" and its nlink 0 when it has
        none."""
        async with self.meta.view() as m:
            f = await m.files.get(file_id)
            if f is None:
                raise NotFoundError(f"no file {file_id:016x}")
            return _file_stat(f.name or "", f)

    async def _entry(self, m: MetaTxn, path: str, parts: list[str] | None = None) -> Entry:
        """The entry of an existing path; the root's is a directory's of no name."""
        if parts is None:
            parts = split_path(path)
        if not parts:
            return Entry("", "dir", ROOT_DIR_ID)
        return (await self._lookup(m, path, parts))[1]

    # -- POSIX attributes (tectonic_emu/attrs.py) ----------------------------------------------
    async def chmod(self, path: str, mode: int) -> None:
        """Set the permission bits (with setuid, setgid, sticky: 0 to 0o7777) of a file or
        directory; its ctime moves. Raises NotFoundError, InvalidArgumentError."""
        mode = attrs.check_mode("chmod", mode)
        async with self.meta.transaction() as m:
            await attrs.change(m, await self._entry(m, path), clock.wall(), mode=mode)

    async def change_id(
        self,
        file_id: int,
        *,
        mode: int | None = None,
        uid: int = -1,
        gid: int = -1,
        atime: attrs.Time = "omit",
        mtime: attrs.Time = "omit",
    ) -> None:
        """``chmod``, ``chown`` and ``utime`` of a file by id, all in one (the mount's open
        files, wherever they are named now or nameless: a write by a user clears setuid
        as Linux does; fchmod, futimens). Raises NotFoundError, InvalidArgumentError."""
        w = "change_id"
        new_mode = None if mode is None else attrs.check_mode(w, mode)
        new_uid, new_gid = attrs.check_id(w, "uid", uid), attrs.check_id(w, "gid", gid)
        new_at, new_mt = attrs.check_time(w, "atime", atime), attrs.check_time(w, "mtime", mtime)
        async with self.meta.transaction() as m:
            if await m.files.get(file_id) is None:
                raise NotFoundError(f"no file {file_id:016x}")
            e, now = Entry("", "file", file_id), clock.wall()
            await attrs.change(
                m, e, now, mode=new_mode, uid=new_uid, gid=new_gid, atime=new_at, mtime=new_mt
            )

    async def chown(self, path: str, uid: int = -1, gid: int = -1) -> None:
        """Set the owner and group of a file or directory (-1: leave it, as chown(2)); its
        ctime moves. Raises NotFoundError, InvalidArgumentError."""
        got_uid = attrs.check_id("chown", "uid", uid)
        got_gid = attrs.check_id("chown", "gid", gid)
        async with self.meta.transaction() as m:
            e = await self._entry(m, path)
            await attrs.change(m, e, clock.wall(), uid=got_uid, gid=got_gid)

    async def utime(self, path: str, atime: attrs.Time = "now", mtime: attrs.Time = "now") -> None:
        """Set the access and modification times of a file or directory: seconds since
        the epoch, ``"now"``, or ``"omit"`` to leave one (utimensat's UTIME_NOW and
        UTIME_OMIT); its ctime moves. Raises NotFoundError, InvalidArgumentError."""
        a = attrs.check_time("utime", "atime", atime)
        mt = attrs.check_time("utime", "mtime", mtime)
        async with self.meta.transaction() as m:
            await attrs.change(m, await self._entry(m, path), clock.wall(), atime=a, mtime=mt)

    # -- extended attributes (tectonic_emu/xattrs.py) -------------------------------------------
    async def setxattr(self, path: str, name: str, value: bytes, flags: int = 0) -> None:
        """Set the ``user.*`` attribute ``name`` of a file or directory (``flags``:
        ``xattrs.CREATE`` fails on one there, ``xattrs.REPLACE`` on one missing); its ctime
        moves. Raises NotFoundError, NotSupportedError (not ``user.*``), AlreadyExistsError,
        NoAttributeError, InvalidArgumentError (a name over 255 bytes, a value over 64 KiB)."""
        name = xattrs.check_name("setxattr", name)
        value = bytes(bytes_arg("setxattr", "value", value))
        flags = int_arg("setxattr", "flags", flags, at_least=0)
        async with self.meta.transaction() as m:
            e = await self._entry(m, path)
            await xattrs.set_(m, e, name, value, flags, clock.wall())

    async def getxattr(self, path: str, name: str) -> bytes:
        """The value of a ``user.*`` attribute. Raises NotFoundError, NoAttributeError."""
        name = xattrs.check_name("getxattr", name)
        async with self.meta.view() as m:
            value = await m.xattrs.get((await self._entry(m, path)).id, name)
        if value is None:
            raise NoAttributeError("no such attribute", name)
        return value

    async def listxattr(self, path: str) -> list[str]:
        """The names of a file's or directory's ``user.*`` attributes, sorted."""
        async with self.meta.view() as m:
            return sorted(await m.xattrs.names((await self._entry(m, path)).id))

    async def removexattr(self, path: str, name: str) -> None:
        """Remove a ``user.*`` attribute; the ctime moves. Raises NoAttributeError."""
        name = xattrs.check_name("removexattr", name)
        async with self.meta.transaction() as m:
            await xattrs.remove(m, await self._entry(m, path), name, clock.wall())

    # -- links and special files ---------------------------------------------------------------
    async def symlink(self, target: str, path: str, *, perms: attrs.Perms | None = None) -> None:
        """Make ``path`` a symbolic link holding ``target`` (kept as given, up to 4,095
        bytes: the native client never follows links; the FUSE mount's kernel does). Its
        mode is 0777; ``perms`` gives its owners. Raises AlreadyExistsError, NotFoundError
        (a missing parent), InvalidArgumentError."""
        if not isinstance(target, str) or not target or "\0" in target:
            raise InvalidArgumentError(
                f"symlink: target must be a non-empty string, not {target!r}"
            )
        if len(os.fsencode(target)) > MAX_TARGET:
            raise NameTooLongError(f"symlink target longer than {MAX_TARGET} bytes", path)
        await self._make(path, "symlink", perms, target=target)

    async def readlink(self, path: str) -> str:
        """A symbolic link's target. Raises NotFoundError, InvalidArgumentError (not a
        symlink, as readlink(2))."""
        st = await self.stat(path)
        if st.target is None:
            raise InvalidArgumentError("not a symbolic link", path)
        return st.target

    async def mknod(
        self, path: str, kind: FileKind, *, perms: attrs.Perms | None = None, rdev: int = 0
    ) -> None:
        """Make ``path`` a fifo, a character or block device node (``rdev`` its number)
        or a socket: a name with attributes and no bytes. Raises AlreadyExistsError,
        NotFoundError, InvalidArgumentError."""
        if kind not in SPECIAL_KINDS:
            raise InvalidArgumentError(f"mknod: kind is one of {', '.join(SPECIAL_KINDS)}")
        rdev = int_arg("mknod", "rdev", rdev, at_least=0)
        await self._make(path, kind, perms, rdev=rdev if kind in ("chardev", "blockdev") else 0)

    async def _make(
        self,
        path: str,
        kind: FileKind,
        perms: attrs.Perms | None,
        *,
        target: str | None = None,
        rdev: int = 0,
    ) -> None:
        """A new name of a kind with no bytes, in one transaction."""
        now = clock.wall()
        async with self.meta.transaction() as m:
            parent, name = await self._free_name(m, path)
            pd = await self._dir(m, parent)
            mode, uid, gid = attrs.born(pd, perms, is_dir=False)
            rec = FileRecord(
                new_id(), self.config.encoding, 0, 0, True, None, parent, name, now, now, 0,
                0o777 if kind == "symlink" else mode, uid, gid, None, 1, kind, target, rdev,
                pd.tenant,
            )  # fmt: skip
            await m.files.put(rec)
            await m.names.link(parent, Entry(name, "file", rec.file_id))
            await attrs.touch_dir(m, parent, now)

    async def link(self, src: str, dst: str) -> None:
        """Give the file at ``src`` (of any kind but a directory) a second name ``dst``: a
        hard link, one file with two names (its nlink counts them; it goes with its last).
        Raises NotFoundError, AlreadyExistsError, NotPermittedError (a directory)."""
        now = clock.wall()
        async with self.meta.transaction() as m:
            _, e = await self._lookup(m, src)
            if e.kind == "dir":
                raise NotPermittedError("a directory cannot have a hard link", src)
            parent, name = await self._free_name(m, dst)
            f = await m.files.get(e.id)
            assert f is not None
            await self._check_same_tenant(m, f.tenant, parent, dst)
            await m.files.put(replace(f, nlink=f.nlink + 1, ctime=now))
            await m.names.link(parent, Entry(name, "file", e.id))
            await attrs.touch_dir(m, parent, now)

    async def _free_name(self, m: MetaTxn, path: str) -> tuple[int, str]:
        """(parent directory id, name) of ``path``, where nothing is yet."""
        parts = split_path(path)
        if not parts:
            raise AlreadyExistsError("the root exists", "/")
        parent, _ = await self._walk(m, parts[:-1], path=path)
        if await m.names.lookup(parent, parts[-1]) is not None:
            raise AlreadyExistsError("file exists", join_path(parts))
        return parent, parts[-1]

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except (NotFoundError, NotADirectoryError_):
            return False
        return True

    async def _let_go(self, m: MetaTxn, file_id: int, keep: bool) -> list[ChunkPlacement]:
        """A file lost one of its names. Its last: dropped (its chunks returned for
        deletion), or with ``keep`` made nameless, so that whoever still reads it by id can
        go on. Another: its link count drops, its ctime moves."""
        f = await m.files.get(file_id)
        if f is not None and f.nlink > 1:
            await m.files.put(replace(f, nlink=f.nlink - 1, ctime=clock.wall()))
            return []
        if not keep:
            return await m.drop_file(file_id)
        if f is not None:
            # Its token stays: a writer of it goes on writing (an unlinked file still open).
            await m.files.put(replace(f, parent=None, name=None, ctime=clock.wall()))
        return []

    # -- rename and delete -------------------------------------------------------------------
    async def rename(self, src: str, dst: str, *, keep_replaced: bool = False) -> None:
        """Move ``src`` to ``dst`` atomically, replacing a file (or an empty directory, when
        ``src`` is a directory) at ``dst``. Raises NotFoundError, IsADirectoryError_,
        NotADirectoryError_, DirectoryNotEmptyError, InvalidArgumentError (a directory into
        itself)."""
        bool_arg("rename", "keep_replaced", keep_replaced)
        sp, dp = split_path(src), split_path(dst)
        if not sp or not dp:
            raise InvalidPathError("cannot rename the root", "/")
        garbage: list[ChunkPlacement] = []
        async with self.meta.transaction() as m:
            s_parent, se = await self._lookup(m, src)
            d_parent, _ = await self._walk(m, dp[:-1], path=dst)
            de = await m.names.lookup(d_parent, dp[-1])
            dirs_lost = 0  # subdirectories of the destination's parent replaced
            if se.kind == "dir":
                await self._check_not_inside(m, d_parent, se.id, dst)
            moved_tenant = await self._tenant_of(m, se)
            if de is not None and de.id == se.id:
                return
            await self._check_same_tenant(m, moved_tenant, d_parent, dst)
            if moved_tenant != (await self._dir(m, s_parent)).tenant:
                raise CrossTenantError("a tenant's namespace stays where it was made", src)
            if de is not None:
                if de.kind == "dir":
                    if se.kind != "dir":
                        raise IsADirectoryError_("is a directory", join_path(dp))
                    if await m.names.entries(de.id, limit=1):
                        raise DirectoryNotEmptyError("directory not empty", join_path(dp))
                    await self._check_not_namespace(m, de.id, join_path(dp))
                    await m.drop_dir(de.id)
                    dirs_lost = 1
                else:
                    if se.kind == "dir":
                        raise NotADirectoryError_("not a directory", join_path(dp))
                    garbage = await self._let_go(m, de.id, keep_replaced)
            await m.names.unlink(s_parent, sp[-1])
            await m.names.link(d_parent, Entry(dp[-1], se.kind, se.id))
            now = clock.wall()
            moved = int(se.kind == "dir")
            if s_parent == d_parent:
                await attrs.touch_dir(m, s_parent, now, subdirs_added=-dirs_lost)
            else:
                await attrs.touch_dir(m, s_parent, now, subdirs_added=-moved)
                await attrs.touch_dir(m, d_parent, now, subdirs_added=moved - dirs_lost)
            # The moved entry's ctime moves too (its name, and a directory's "..", changed).
            if se.kind == "dir":
                d = await self._dir(m, se.id)
                rec = replace(d, parent=d_parent, name=dp[-1], ctime=now)
                await m.names.put_dir(rec)
            else:
                f = await m.files.get(se.id)
                assert f is not None
                await m.files.put(replace(f, parent=d_parent, name=dp[-1], ctime=now))
        await self.datapath.delete_chunks(garbage)

    async def _check_not_inside(self, m: MetaTxn, dir_id: int, moved: int, path: str) -> None:
        while True:
            if dir_id == moved:
                raise InvalidArgumentError("cannot move a directory inside itself", path)
            if dir_id == ROOT_DIR_ID:
                return
            dir_id = (await self._dir(m, dir_id)).parent

    async def _tenant_of(self, m: MetaTxn, e: Entry) -> int:
        """The tenant a file or directory is charged to (0: none; ``tenants.py``)."""
        if e.kind == "dir":
            return (await self._dir(m, e.id)).tenant
        f = await m.files.get(e.id)
        assert f is not None, f"entry {e.name} has no file record"
        return f.tenant

    async def _check_same_tenant(self, m: MetaTxn, tenant: int, parent: int, path: str) -> None:
        """CrossTenantError unless a name in ``parent`` keeps ``tenant``'s namespace."""
        if (await self._dir(m, parent)).tenant != tenant:
            raise CrossTenantError("a rename or a link across tenants' namespaces", path)

    async def _check_not_namespace(self, m: MetaTxn, dir_id: int, path: str) -> None:
        """NotPermittedError for a tenant's namespace directory: ``tenant rm`` removes it."""
        d = await self._dir(m, dir_id)
        if d.tenant and (await self._dir(m, d.parent)).tenant != d.tenant:
            raise NotPermittedError("a tenant's namespace (tenant rm removes it)", path)

    async def delete(self, path: str, *, recursive: bool = False, keep: bool = False) -> None:
        """Remove a file, or a directory (empty unless ``recursive``). A writer of a deleted
        file is fenced. ``keep`` (files): its bytes stay readable by id until ``purge`` or
        garbage collection (an unlinked file still open, in POSIX terms). Raises
        NotFoundError, DirectoryNotEmptyError, InvalidPathError (root)."""
        bool_arg("delete", "recursive", recursive)
        bool_arg("delete", "keep", keep)
        garbage: list[ChunkPlacement] = []
        async with self.meta.transaction() as m:
            parent, e = await self._lookup(m, path)
            if e.kind == "dir":
                await self._check_not_namespace(m, e.id, path)
                if not recursive and await m.names.entries(e.id, limit=1):
                    raise DirectoryNotEmptyError("directory not empty", path)
                garbage = await self._drop_tree(m, e.id)
            else:
                garbage = await self._let_go(m, e.id, keep)
            await m.names.unlink(parent, e.name)
            await attrs.touch_dir(m, parent, clock.wall(), subdirs_added=-(e.kind == "dir"))
        await self.datapath.delete_chunks(garbage)

    async def _drop_tree(self, m: MetaTxn, dir_id: int) -> list[ChunkPlacement]:
        garbage: list[ChunkPlacement] = []
        for e in await m.names.entries(dir_id):
            if e.kind == "dir":
                garbage += await self._drop_tree(m, e.id)
            else:  # a file with other names outside the tree stays
                garbage += await self._let_go(m, e.id, False)
            await m.names.unlink(dir_id, e.name)
        await m.drop_dir(dir_id)
        return garbage


def _file_stat(path: str, f: FileRecord) -> Stat:
    """``Stat`` of a File-layer record (nameless: nlink 0); a symlink's size is its
    target's length, as lstat has it."""
    size = len(os.fsencode(f.target)) if f.target is not None else f.size
    nlink = 0 if f.parent is None else f.nlink
    return Stat(
        path, f.kind, f.file_id, size, f.encoding, f.sealed, f.nblocks, f.ctime, f.mtime,
        f.holes, *_posix(f), nlink, f.target, f.rdev,
    )  # fmt: skip


def _posix(rec: DirRecord | FileRecord) -> tuple[int, int, int, float]:
    """(mode, uid, gid, atime) of a record, for ``Stat``: an atime never set is the mtime."""
    return rec.mode, rec.uid, rec.gid, rec.mtime if rec.atime is None else rec.atime


__all__ = ["Namespace", "Stat"]
