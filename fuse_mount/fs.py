"""``TectonicFS``: the store as a POSIX file system, through mfusepy on libfuse3.

Tectonic files are append-only and sealed on close; POSIX programs seek and patch. The mount
meets them as follows (``docs/fuse.md`` has the full table):

- A **new file** is created at its path at once, unsealed, and written as an append-only
  file while the program writes sequentially: blocks stream into the store as they fill, and
  ``flush`` (every ``close``) makes the bytes so far durable and visible. ``release`` seals it.
- **O_TRUNC over an existing file** writes new contents as a nameless file
  (``Client.new_contents``), whose blocks move into the file at ``flush``: it keeps its id,
  names, mode and owners. Until then other clients see the old contents.
- A write **anywhere but the end** (a header patched at close, a random write, a write to an
  existing file without O_TRUNC) moves the handle to a *staging file*: a sparse local file
  holding the whole new content (filled from the store once), published as the file's new
  contents at every ``flush``/``fsync``. Sequential writers never pay for it.
- A **sparse truncate** (``truncate -s 1T``, ``ftruncate`` past the end) writes nothing: the
  extension is a hole in metadata (``FileWriter.append_hole``), read back as zeros without
  asking a node. A streaming handle appends the hole; an existing file without one is
  re-streamed as new contents (its data copied, its holes kept as holes) ending in the hole;
  a staging file is published region by region (``SEEK_DATA``/``SEEK_HOLE``), its holes as
  holes. ``st_blocks`` counts stored bytes, not holes.
- Streaming reads go through a per-handle cache of chunk-sized segments with readahead, so
  1 MiB kernel reads of an 8 MiB chunk fetch it once; others read just their bytes.
- **Open files follow the file, not the name**: every handle reads and writes by file id. A
  file renamed while open is written at its new name; one unlinked while open stays,
  nameless, until its last handle here closes. Within the mount a reader sees what the
  writers here wrote (``ReadHandle._catch_up``, ``TectonicFS.unpublished``).
- **Attributes** (mode, owners, times) are the store's (``tectonic_emu/attrs.py``); who may
  do what is the kernel's to check (``default_permissions``, ``fuse_mount/mount.py``).

Every error is an ``OSError`` with an errno (the store's ``TectonicError``s carry theirs), which
mfusepy returns to the kernel; nothing stored changes on an error.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat as stat_mod
import threading
from collections.abc import Callable
from typing import Any

from mfusepy import FuseOSError, Operations, fuse_get_context

from fuse_mount import replybuf
from fuse_mount.linknames import LinkNames, move_paths
from fuse_mount.metaops import INO_MASK, MetaOps, caller
from fuse_mount.readhandle import READAHEAD_SEGMENTS, ReadHandle
from fuse_mount.writehandle import WriteHandle
from tectonic_emu import attrs, clock
from tectonic_emu.bridge import Bridge
from tectonic_emu.bufpool import BufferPool
from tectonic_emu.errors import AlreadyExistsError, NotFoundError, TectonicError
from tectonic_emu.writer import FileWriter, Replaced

log = logging.getLogger(__name__)

# Free segment buffers the mount keeps for reuse: enough for this many handles reading at once.
POOLED_READERS = 8
MAX_IO = 1 << 20  # reads, writes and readahead negotiated with the kernel
FALLOC_FL_KEEP_SIZE = 0x01  # <linux/falloc.h>
HIDDEN = re.compile(r"\.fuse_hidden[0-9a-f]{16}")


class TectonicFS(MetaOps, Operations):  # type: ignore[misc]
    """mfusepy operations over one cluster (see the module docstring)."""

    use_ns = True

    def __init__(self, bridge: Bridge, *, encoding: str | None = None) -> None:
        self.bridge = bridge
        self.encoding = encoding
        config = bridge.client.config
        self.segment = config.block_size
        self.pool = BufferPool(self.segment, keep=POOLED_READERS * (READAHEAD_SEGMENTS + 2))
        # Staging files are anonymous (unlinked at creation) in this directory (None: the
        # temp dir): nothing is left behind, even by a mount that is killed. A directory of
        # our own was, when the mount died before ``destroy``.
        self.staging_dir: str | None = None
        self._handles: dict[int, ReadHandle | WriteHandle] = {}
        # Open files follow the file, not the name, as POSIX has it. Per file id: the
        # handles open on it here, and the one writing it (its size and times are the
        # file's until published). Files unlinked while open here stay, nameless, until
        # their last handle closes, then go (``_orphans``).
        self._open: dict[int, int] = {}
        self._writing: dict[int, WriteHandle] = {}
        self._orphans: set[int] = set()
        # libfuse's names for files unlinked while open (``HIDDEN``) -> their file ids.
        self._hidden: dict[str, int] = {}
        self.links = LinkNames()  # hard-linked files' names, kept coherent in the kernel
        # The threads (ids) where libfuse's setattr is about to reply: it ends in a getattr,
        # in the same thread, once the chmod, chown, utimens or truncate it called succeeded
        # (``getattr`` says why). Not ``threading.local``: each call from libfuse's threads
        # into Python gets a thread state of its own, and with it a new local.
        self._setattr_reply: set[int] = set()
        # Contents read here (the file id holding their blocks -> read handles), and those
        # new contents replaced meanwhile, kept under a nameless id until their last reader
        # closes (``replaced``). ``_swaps`` counts replacements, so that a reader whose block
        # map was looked up across one looks again (``_open_reader``).
        self._holding: dict[int, int] = {}
        self._retired: set[int] = set()
        self._swaps = 0
        self._next = 1
        self._lock = threading.Lock()

    def init_with_config(self, conn: Any, config: Any) -> None:
        """Negotiate 1 MiB reads, writes and readahead (libfuse3 needs max_read here and as
        a mount option alike)."""
        if conn is not None:
            conn.max_write = MAX_IO
            if hasattr(conn, "max_read"):
                conn.max_read = MAX_IO
            conn.max_readahead = MAX_IO
            conn.max_background = 64

    # -- helpers -----------------------------------------------------------------------------
    def _call(self, coro: Any) -> Any:
        return self.bridge.call(coro)

    def _read(self, make: Callable[[], Any]) -> Any:
        """``_call(make())`` for a metadata read: here, on libfuse's thread, where the store
        answers at once, without a hop into the loop (``Bridge.read``)."""
        return self.bridge.read(make)

    def _add(self, handle: ReadHandle | WriteHandle) -> int:
        with self._lock:
            return self._add_locked(handle)

    def _add_locked(self, handle: ReadHandle | WriteHandle) -> int:
        fh = self._next
        self._next += 1
        self._handles[fh] = handle
        self._open[handle.file_id] = self._open.get(handle.file_id, 0) + 1
        if isinstance(handle, WriteHandle):
            self._writing[handle.file_id] = handle
        else:
            self._holding[handle.holds] = self._holding.get(handle.holds, 0) + 1
        return fh

    def _open_reader(self, path: str) -> int:
        """A read handle of the file at ``path``, registered under a block map that no
        replacement (``replaced``) overtook: one that did is looked up again. A file this
        mount streams is flushed first, so that the reader sees what was written."""
        while True:
            with self._lock:
                swaps = self._swaps
            reader = self._call(self.bridge.client.reader(path))
            with self._lock:
                writing = self._writing.get(reader.file_id)
                if writing is None and self._swaps == swaps:
                    return self._add_locked(ReadHandle(self, reader))
            if writing is not None and not writing.share():
                with self._lock:
                    if self._swaps == swaps:
                        return self._add_locked(ReadHandle(self, reader))

    def unpublished(self, file_id: int) -> WriteHandle | None:
        """The handle here rewriting ``file_id`` with changes not yet published (staged,
        or new contents after O_TRUNC), whose view readers here read meanwhile."""
        writing = self._writing.get(file_id)  # no lock: one dict read, on every read
        return writing if writing is not None and writing.unpublished else None

    def streamed_more(self, file_id: int) -> bool:
        """Whether a writer here streamed bytes of ``file_id`` that readers have not seen:
        they are made visible now (``WriteHandle.share``)."""
        with self._lock:
            writing = self._writing.get(file_id)
        return writing is not None and writing.share()

    def moved_on(self, handle: ReadHandle) -> None:
        """``handle`` reads the file's current contents now: replaced ones it held go
        when no reader here holds them any more."""
        with self._lock:
            old, handle.holds = handle.holds, handle.file_id
            if old == handle.file_id:
                return
            self._holding[handle.file_id] = self._holding.get(handle.file_id, 0) + 1
            left = self._holding[old] = self._holding[old] - 1
            if left or old not in self._retired:
                return
            del self._holding[old]
            self._retired.discard(old)
        self._call(self.bridge.client.purge(old))

    def _is_open(self, file_id: int) -> bool:
        """Whether a handle here has ``file_id`` open: a name it loses (unlink, or a
        rename over it) keeps it, nameless if that was its last (``_lost_name``)."""
        with self._lock:
            return bool(self._open.get(file_id))

    def _lost_name(self, file_id: int) -> None:
        """``file_id``, open here, lost a name, kept (``_is_open``): if it has none left it
        stays for its handles here, going at their last close (or now, if they are gone);
        its other names show one link fewer."""
        self.links.changed(file_id)
        if self._read(lambda: self.bridge.client.stat_id(file_id)).nlink:
            return
        with self._lock:
            if self._open.get(file_id):
                self._orphans.add(file_id)
                return
        self._call(self.bridge.client.purge(file_id))

    def replaced(self, file_id: int, old: Replaced | None) -> None:
        """New contents moved into ``file_id``; ``old``, its contents before, kept under a
        nameless id: now held by the readers that had opened them, or purged if none had."""
        if old is None:
            return
        with self._lock:
            self._swaps += 1
            holders = [
                h
                for h in self._handles.values()
                if isinstance(h, ReadHandle)
                and h.holds == file_id
                and h.reader.block_ids == old.block_ids
            ]
            for h in holders:
                h.holds, h.stale = old.file_id, True
            if holders:
                self._holding[file_id] -= len(holders)
                self._holding[old.file_id] = len(holders)
                self._retired.add(old.file_id)
                return
        self._call(self.bridge.client.purge(old.file_id))

    def _handle(self, fh: int) -> ReadHandle | WriteHandle:
        try:
            return self._handles[fh]
        except KeyError:
            raise FuseOSError(errno.EBADF) from None

    def _stat(self, path: str) -> Any:
        hidden = self._hidden.get(path)  # the store has no such name
        if hidden is not None:
            return self._read(lambda: self.bridge.client.stat_id(hidden))
        return self._read(lambda: self.bridge.client.stat(path))

    def _stat_open(self, path: str | None, fh: int | None) -> Any:
        """What ``path`` names, or with ``fh`` the file open there (renamed or unlinked
        since, perhaps: libfuse passes no path for an unlinked file's handle)."""
        handle = self._handles.get(fh) if fh is not None else None
        if isinstance(handle, WriteHandle) and handle.created is not None:
            st, handle.created = handle.created, None  # once: later asks see the store
            return st
        if handle is not None:
            return self._read(lambda: self.bridge.client.stat_id(handle.file_id))
        if path is None:
            raise FuseOSError(errno.EBADF)
        return self._stat(path)

    # -- attributes and directories ----------------------------------------------------------
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        st = self._stat_open(path, fh)
        if path is not None and st.kind != "dir":
            self.links.seen(st.id, path, st.nlink)
        times = {"st_atime": st.atime, "st_mtime": st.mtime, "st_ctime": st.ctime}
        # libfuse takes one off a hidden name's count in its reply to getattr, as if the
        # name were a link still (not in its reply to setattr, which calls this last).
        hidden = path is not None and path in self._hidden and st.nlink > 0
        if self._setattr_reply and threading.get_ident() in self._setattr_reply:
            self._setattr_reply.discard(threading.get_ident())
            hidden = False
        base = {
            "st_uid": st.uid,
            "st_gid": st.gid,
            "st_nlink": st.nlink + hidden,
            "st_ino": st.id & INO_MASK,
        }
        if st.kind != "file":  # a directory, symlink, fifo, device node or socket
            mode = attrs.st_mode(st.kind, st.mode)
            return {**base, **_ns(times), "st_mode": mode, "st_size": st.size, "st_rdev": st.rdev}
        size, stored = st.size, st.size - st.holes
        with self._lock:
            writing = self._writing.get(st.id)
        if writing is not None:  # its writer's view: streamed, new version or staged
            size, stored = writing.size, writing.stored
            if writing.changed is not None:  # written or truncated, not yet published
                ctime = max(writing.changed, st.ctime)  # a chmod after the write, say
                times |= {"st_mtime": writing.changed, "st_ctime": ctime}
        return {
            **base,
            **_ns(times),
            "st_mode": stat_mod.S_IFREG | st.mode,
            "st_size": size,
            "st_blocks": (stored + 511) // 512,  # holes take no room
            "st_blksize": 1 << 20,
        }

    def unlink(self, path: str) -> int:
        with self._lock:
            hidden = self._hidden.pop(path, None)
        if hidden is not None:
            self.links.gone(path)
            return 0  # libfuse lets go of a hidden file: it goes at its last close (_let_go)
        st = self._stat(path)
        if st.kind == "dir":
            raise FuseOSError(errno.EISDIR)
        kept = self._is_open(st.id)
        self._call(self.bridge.client.delete(path, keep=kept))
        self.links.gone(path)
        if kept:
            self._lost_name(st.id)
        else:
            self.links.changed(st.id)  # its other names' link count
        return 0

    def rename(self, old: str, new: str) -> int:
        if _is_hidden(new):
            st = self._stat(old)
            with self._lock:
                is_open = bool(self._open.get(st.id))
            if is_open and st.kind == "file" and new not in self._hidden:
                # libfuse hides a file unlinked (or renamed over) while open under such a
                # name, and unlinks that at its last close. For the store it is unlinked
                # now (kept while open here); the hidden name lives here only (``_stat``).
                self._call(self.bridge.client.delete(old, keep=True))
                with self._lock:
                    self._hidden[new] = st.id
                self.links.gone(old)
                self.links.seen(st.id, new, None)  # told of its link count from now on
                self._lost_name(st.id)
                return 0
        try:
            replaced = self._stat(new)
        except NotFoundError:
            replaced = None
        keep = replaced is not None and replaced.kind != "dir" and self._is_open(replaced.id)
        self._call(self.bridge.client.rename(old, new, keep_replaced=keep))
        if replaced is not None and replaced.kind != "dir":  # a file renamed over
            self.links.gone(new)
            if keep:
                self._lost_name(replaced.id)
            else:
                self.links.changed(replaced.id)
        with self._lock:
            move_paths(self._hidden, old, new)  # hidden names in a directory moved
        moved = self.links.moved(old, new)
        if moved is not None:
            self.links.changed(moved, but=new)  # its ctime moved
        return 0

    # -- files -------------------------------------------------------------------------------
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        # The kernel calls create for a name it believes absent; if the store has a file
        # there after all (created meanwhile elsewhere), honour the flags as open would.
        flags = fi if isinstance(fi, int) else os.O_WRONLY
        return self._open_for_write(path, flags | os.O_CREAT, mode=mode)

    def open(self, path: str, flags: int) -> int:
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return self._open_reader(path)  # IsADirectoryError_ (EISDIR) for a directory
        return self._open_for_write(path, flags)

    def _open_for_write(self, path: str, flags: int, *, mode: int | None = None) -> int:
        """``mode``: a file to create (``create``: the kernel found no such name, so the
        file is made first, and looked for only if it exists after all)."""
        if mode is not None:
            with contextlib.suppress(AlreadyExistsError):
                return self._new_file(path, mode)
        try:
            st = self._stat(path)
        except NotFoundError:
            st = None
        if st is not None and st.kind == "dir":
            raise FuseOSError(errno.EISDIR)
        if st is None:
            return self._new_file(path, 0o644 if mode is None else mode)
        while True:  # one handle writes a file here, whoever opens it (``_share``)
            fh = self._share(st.id, flags)
            if fh is not None:
                break
            handle = self._new_writer(st, path, flags)
            with self._lock:
                if st.id not in self._writing:
                    fh = self._add_locked(handle)
                    break
            if handle.writer is not None:  # another open of the file came first
                self._call(handle.writer.abort())
        if flags & os.O_TRUNC:
            self.links.changed(st.id, but=path)  # other names' size and times
        return fh

    def _new_file(self, path: str, mode: int) -> int:
        """A handle writing a new file at ``path``; AlreadyExistsError if a name is there.
        The file's attributes come back in the same call into the event loop, for the
        getattr that follows inside the create: a hop (about 110 us) less a create."""
        client = self.bridge.client
        perms = caller(mode)

        async def create() -> tuple[FileWriter, Any]:
            # Committed at each flush (close, fsync, a reader here past the end): syncs per
            # flush and node disk, not per chunk; other mounts see close-to-open either way.
            opener = client.open_writer(
                path, encoding=self.encoding, perms=perms, exclusive=True, commit_at_flush=True
            )
            writer = await opener.__aenter__()
            try:
                return writer, await client.stat_id(writer.file_id)
            except BaseException:
                await writer.abort()
                raise

        writer, st = self._call(create())
        new = WriteHandle(self, writer.file_id, path, writer=writer, size=0, base_exists=False)
        new.created = st
        return self._add(new)

    def _new_writer(self, st: Any, path: str, flags: int) -> WriteHandle:
        """A handle writing the existing file ``st``: new contents after O_TRUNC, else
        the file as it is, staged at its first write (copy-on-write)."""
        if flags & os.O_TRUNC:
            handle = WriteHandle(self, st.id, path, writer=None, size=0, base_exists=False)
            handle.writer = self._call(handle.new_contents())
            handle.changed = clock.wall()  # truncated: its mtime and ctime move
        else:
            handle = WriteHandle(self, st.id, path, writer=None, size=st.size, base_exists=True)
        handle.privileged = _privileged(st.mode)
        return handle

    def _share(self, file_id: int, flags: int) -> int | None:
        """A descriptor of the handle writing ``file_id`` here, if there is one: all the
        file's writers here write one view of it, published at each close (two handles of
        their own would each publish theirs, the last one's replacing the other's)."""
        with self._lock:
            shared = self._writing.get(file_id)
            if shared is None:
                return None
            shared.opens += 1
            fh = self._add_locked(shared)
        if flags & os.O_TRUNC:
            shared.truncate(0)
        return fh

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return self._handle(fh).read(size, offset)

    def read_buf(self, path: str | None, bufpp: Any, size: int, offset: int, fh: int) -> int:
        """What libfuse calls instead of ``read`` when it is there: the reply goes in a
        page-aligned buffer of ours (``fuse_mount.replybuf`` says why)."""
        handle = self._handle(fh)
        if isinstance(handle, ReadHandle):
            return replybuf.reply(bufpp, size, lambda dest: handle.read_into(dest, size, offset))
        return replybuf.reply(bufpp, size, replybuf.copy_bytes(handle.read(size, offset)))

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        handle = self._handle(fh)
        if not isinstance(handle, WriteHandle):
            raise FuseOSError(errno.EBADF)
        if handle.privileged and fuse_get_context()[0] != 0:
            self._drop_privileges(handle)
        wrote = handle.write(data, offset)
        self.links.changed(handle.file_id, but=path)  # other names' size and times
        return wrote

    def _drop_privileges(self, handle: WriteHandle) -> None:
        """A write by a user (not root) clears setuid, and setgid where group-executable,
        as Linux does (the kernel leaves it to the file system for direct I/O)."""
        st = self._call(self.bridge.client.stat_id(handle.file_id))
        mode = st.mode & ~stat_mod.S_ISUID
        if mode & stat_mod.S_IXGRP:
            mode &= ~stat_mod.S_ISGID
        if mode != st.mode:
            self._call(self.bridge.client.change_id(handle.file_id, mode=mode))
        handle.privileged = False

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self._setattr_reply.discard(threading.get_ident())
        file_id = self._truncate(path, length, fh)
        self.links.changed(file_id, but=path)  # other names' size and times
        self._setattr_reply.add(threading.get_ident())
        return 0

    def _truncate(self, path: str | None, length: int, fh: int | None) -> int:
        """(``truncate``) Returns the file's id."""
        handle = self._handles.get(fh) if fh is not None else None
        if isinstance(handle, WriteHandle):
            handle.truncate(length)
            return handle.file_id
        st = self._stat_open(path, fh)
        if st.kind == "dir":
            raise FuseOSError(errno.EISDIR)
        with self._lock:
            writing = self._writing.get(st.id)
        if writing is not None:
            writing.truncate(length)
            return int(st.id)
        # No handle: new contents of the first ``length`` bytes (zeros past the end).
        handle = WriteHandle(self, st.id, st.path, writer=None, size=st.size, base_exists=True)
        try:
            handle.truncate(length)
            handle.flush()
        finally:
            if handle.writer is not None:  # flush failed: drop the new version
                self._call(handle.writer.abort())
            if handle.staging is not None:
                handle.staging.close()
        return int(st.id)

    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        """Mode 0 grows the file to ``offset + size`` if shorter, as a hole (nothing is
        written, and no room is reserved: the store allocates as blocks are written);
        ``FALLOC_FL_KEEP_SIZE`` alone is a hint, taken. Punching holes, zeroing or
        collapsing ranges: EOPNOTSUPP."""
        if mode & ~FALLOC_FL_KEEP_SIZE:
            raise FuseOSError(errno.EOPNOTSUPP)
        if mode & FALLOC_FL_KEEP_SIZE:
            return 0
        handle = self._handles.get(fh)
        size_now = (
            handle.size if isinstance(handle, WriteHandle) else self._stat_open(path, fh).size
        )
        if offset + size > size_now:
            self.links.changed(self._truncate(path, offset + size, fh), but=path)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        handle = self._handle(fh)
        if isinstance(handle, WriteHandle):
            handle.flush()
            self.links.changed(handle.file_id, but=path)  # its size and times, elsewhere
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self.flush(path, fh)
        # A file created here and not written yet: its creation is durable from here (a
        # flush with nothing new syncs nothing; docs/design.md, "What is durable when").
        self._call(self.bridge.client.meta.sync())
        return 0

    def release(self, path: str | None, fh: int) -> int:
        with self._lock:
            handle = self._handles.pop(fh, None)
            if handle is None:
                return 0
            last = True
            if isinstance(handle, WriteHandle):
                handle.opens -= 1
                last = not handle.opens
                if last and self._writing.get(handle.file_id) is handle:
                    del self._writing[handle.file_id]  # its view goes with it: stored now
        try:
            if isinstance(handle, WriteHandle):
                if last:
                    handle.release()  # its bytes published, a new file sealed
            else:
                handle.close()
        finally:
            for gone in self._let_go(handle):
                self._call(self.bridge.client.purge(gone))
        return 0

    def _let_go(self, handle: ReadHandle | WriteHandle) -> list[int]:
        """Forget a closed handle; returns the nameless files no handle here needs now (an
        orphan's last handle, replaced contents' last reader)."""
        gone = []
        with self._lock:
            count = self._open[handle.file_id] = self._open[handle.file_id] - 1
            if not count:
                del self._open[handle.file_id]
                if handle.file_id in self._orphans:
                    self._orphans.discard(handle.file_id)
                    gone.append(handle.file_id)
            if isinstance(handle, WriteHandle):
                return gone
            left = self._holding[handle.holds] = self._holding[handle.holds] - 1
            if not left:
                del self._holding[handle.holds]
                if handle.holds in self._retired:
                    self._retired.discard(handle.holds)
                    gone.append(handle.holds)
        return gone

    def destroy(self, path: str) -> None:
        for fh in list(self._handles):
            try:
                self.release("", fh)
            except (OSError, TectonicError) as e:
                log.warning("a file open at unmount could not be completed: %s", e)
        self.pool.close()


def _privileged(mode: int) -> bool:
    """Whether a write by a user clears bits of ``mode`` (``_drop_privileges``)."""
    return bool(mode & stat_mod.S_ISUID) or (
        mode & (stat_mod.S_ISGID | stat_mod.S_IXGRP) == stat_mod.S_ISGID | stat_mod.S_IXGRP
    )


def _is_hidden(path: str) -> bool:
    """Whether ``path`` is a name libfuse gives a file unlinked while open
    (``.fuse_hidden`` and 16 hex digits, in ``hide_node``)."""
    name = path.rsplit("/", 1)[-1]
    return bool(HIDDEN.fullmatch(name))


def _ns(times: dict[str, float]) -> dict[str, int]:
    """Seconds to the nanoseconds mfusepy passes on (``use_ns``)."""
    return {k: round(v * 1e9) for k, v in times.items()}


__all__ = ["ReadHandle", "TectonicFS", "WriteHandle"]
