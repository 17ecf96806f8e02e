"""The names of hard-linked files, so that a change through one name reaches the others.

libfuse's high-level API gives every name its own kernel inode, and the kernel caches each
inode's attributes for ``attr_timeout`` (1 s): a hard link, a chmod, an unlink or a write
through one name of a file with several left the others showing its old link count, mode
or size for up to a second (pjdfstest ``link/00.t``). The mount remembers the names it has
seen of each file with more than one (``LinkNames.seen``, from getattr), and after a change
through one of them tells the kernel to drop the cached attributes of the others
(``fuse_invalidate_path``), before it replies. A file with one name has one kernel inode,
which the kernel keeps up to date itself, and costs nothing here.
"""

from __future__ import annotations

import ctypes
import os
import threading

import mfusepy

# The library mfusepy loaded (libfuse3), for the one call mfusepy does not wrap.
_libfuse = mfusepy._libfuse
_libfuse.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_libfuse.fuse_invalidate_path.restype = ctypes.c_int


class LinkNames:
    """Names seen of each file with several, by file id and by path."""

    def __init__(self) -> None:
        self._names: dict[int, set[str]] = {}
        self._ids: dict[str, int] = {}
        self._lock = threading.Lock()

    def seen(self, file_id: int, path: str, nlink: int | None) -> None:
        """getattr saw ``path`` name ``file_id``, which has ``nlink`` names (or it is
        libfuse's hidden name for it: ``nlink`` None, kept whatever its count)."""
        if nlink is not None and nlink < 2 and file_id not in self._names:
            return
        with self._lock:
            old = self._ids.get(path)
            if old is not None and old != file_id:
                self._names[old].discard(path)
            self._ids[path] = file_id
            self._names.setdefault(file_id, set()).add(path)

    def id_of(self, path: str) -> int | None:
        """The file ``path`` names, if it is one of a hard-linked file's names seen here."""
        return self._ids.get(path)

    def gone(self, path: str) -> int | None:
        """``path`` names nothing any more (unlinked, renamed away); the file it named."""
        with self._lock:
            file_id = self._ids.pop(path, None)
            if file_id is not None:
                names = self._names[file_id]
                names.discard(path)
                if not names:
                    del self._names[file_id]
            return file_id

    def moved(self, old: str, new: str) -> int | None:
        """``old`` was renamed to ``new``: the names seen at or under it follow it. Returns
        the file ``old`` named, if it is one seen here."""
        with self._lock:
            for file_id, names in self._names.items():
                for path in [p for p in names if under(p, old)]:
                    to = new + path[len(old) :]
                    names.discard(path)
                    names.add(to)
                    del self._ids[path]
                    self._ids[to] = file_id
            return self._ids.get(new)

    def changed(self, file_id: int | None, *, but: str | None = None) -> None:
        """The file changed through ``but`` (whose attributes the kernel has from the
        reply): drop what the kernel caches of its other names. Runs in a FUSE request's
        thread (``fuse_get_context`` names the mount)."""
        if file_id is None or file_id not in self._names:  # (every write asks: no lock)
            return
        with self._lock:
            paths = [p for p in self._names.get(file_id, ()) if p != but]
        if not paths:
            return
        fuse = mfusepy._libfuse.fuse_get_context().contents.fuse
        for path in paths:
            _libfuse.fuse_invalidate_path(fuse, os.fsencode(path))  # -ENOENT: not cached


def under(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or inside it."""
    return path == top or path.startswith(top + "/")


def move_paths(paths: dict[str, int], old: str, new: str) -> None:
    """Re-key ``paths`` (path -> file id) at or under ``old`` as a rename of ``old`` to
    ``new`` moved them."""
    for path in [p for p in paths if under(p, old)]:
        paths[new + path[len(old) :]] = paths.pop(path)


__all__ = ["LinkNames", "move_paths", "under"]
