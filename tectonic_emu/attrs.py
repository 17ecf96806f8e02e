"""POSIX attributes of files and directories: mode, owner, group and times (issue 21).

They live in the records that already hold a file's or a directory's other attributes
(``FileRecord`` in the File layer, ``DirRecord`` beside a directory's entries), each left
out of the stored JSON at its default, so that records written before they were kept read
as 0644 for a file, 0755 for a directory, owned by root, their atime their mtime.

``change`` applies what ``chmod``, ``chown`` and ``utimensat`` ask of one record in a
transaction; every change moves the ctime, as POSIX has it. ``born`` gives a new file or
directory its mode and owners; ``touch_dir`` moves a directory's mtime and ctime when a name
in it comes or goes, and keeps its count of subdirectories (its nlink is 2 more).

Who may ask is not decided here: the mount leaves that to the kernel
(``default_permissions``), which checks each call against these attributes; the native
client is its cluster's owner.
"""

from __future__ import annotations

import math
import stat
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from tectonic_emu.argcheck import int_arg
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.metadata.layers import MetaTxn
from tectonic_emu.metadata.records import DIR_MODE, FILE_MODE, DirRecord, Entry, FileRecord

# A directory's mtime and ctime are not rewritten for a change within this many seconds of
# the last: a thousand ranks creating files in one directory read its record, and write
# it about ten times a second, not a thousand (JuiceFS's --skip-dir-mtime, 100 ms there too).
DIR_TIME_GRAIN = 0.1
MAX_ID = 2**32 - 2  # the largest uid or gid; 2**32 - 1 is (uid_t)-1, "leave it"
_R = TypeVar("_R", DirRecord, FileRecord)
#: A time ``utime`` is asked to set: seconds since the epoch, ``"now"`` (UTIME_NOW) or
#: ``"omit"`` (UTIME_OMIT: leave it).
Time = float | Literal["now", "omit"]


@dataclass(frozen=True, slots=True)
class Perms:
    """What the creator of a file or directory asks for: its permission bits (the umask
    already applied, as the kernel passes them) and the creator's uid and gid."""

    mode: int
    uid: int = 0
    gid: int = 0

    def __post_init__(self) -> None:
        check_mode("perms", self.mode)
        for name in ("uid", "gid"):
            if check_id("perms", name, getattr(self, name)) is None:
                raise InvalidArgumentError(f"perms: {name} -1 means no owner to create with")


def born(parent: DirRecord, perms: Perms | None, *, is_dir: bool) -> tuple[int, int, int]:
    """(mode, uid, gid) of a new entry in ``parent``: ``perms`` (0644 or 0755 by root when
    None), the group the parent's when the parent has setgid, and then a new directory
    keeps setgid too (as Linux does)."""
    default = DIR_MODE if is_dir else FILE_MODE
    mode, uid, gid = (default, 0, 0) if perms is None else (perms.mode, perms.uid, perms.gid)
    if parent.mode & stat.S_ISGID:
        gid = parent.gid
        if is_dir:
            mode |= stat.S_ISGID
    return mode, uid, gid


async def subdirs(m: MetaTxn, d: DirRecord) -> int:
    """How many subdirectories ``d`` has: kept in its record, counted where the record
    was written before they were kept."""
    if d.subdirs is not None:
        return d.subdirs
    return sum(e.kind == "dir" for e in await m.names.entries(d.dir_id))


async def touch_dir(m: MetaTxn, dir_id: int, now: float, *, subdirs_added: int = 0) -> None:
    """A name in ``dir_id`` came or went (called after the change, in its transaction):
    its mtime and ctime become ``now`` (unless both moved less than ``DIR_TIME_GRAIN`` ago
    and no subdirectory came or went), its subdirectories ``subdirs_added`` more."""
    d = await m.names.get_dir(dir_id)
    assert d is not None, f"directory {dir_id} has entries and no record"
    recent = 0 <= now - d.mtime < DIR_TIME_GRAIN and 0 <= now - d.ctime < DIR_TIME_GRAIN
    if recent and not subdirs_added and d.subdirs is not None:
        return
    # A count kept is moved; one never kept is counted now, the change already made.
    count = await subdirs(m, d) if d.subdirs is None else d.subdirs + subdirs_added
    await m.names.put_dir(replace(d, mtime=now, ctime=now, subdirs=count))


def check_mode(where: str, mode: object) -> int:
    """``mode``'s permission bits (with setuid, setgid and sticky), refused beyond them."""
    n = int_arg(where, "mode", mode, at_least=0)
    if n > 0o7777:
        raise InvalidArgumentError(f"{where}: mode {n:#o} has bits beyond 0o7777")
    return n


def check_id(where: str, name: str, value: object) -> int | None:
    """A uid or gid to set, or None for -1 (leave it, as chown(2) takes it)."""
    n = int_arg(where, name, value, at_least=-1)
    if n > MAX_ID:
        raise InvalidArgumentError(f"{where}: {name} {n} is beyond {MAX_ID}")
    return None if n == -1 else n


#: The file-type bits (``stat.S_IFMT``) of each kind of entry.
TYPE_BITS: dict[str, int] = {
    "dir": stat.S_IFDIR,
    "file": stat.S_IFREG,
    "symlink": stat.S_IFLNK,
    "fifo": stat.S_IFIFO,
    "chardev": stat.S_IFCHR,
    "blockdev": stat.S_IFBLK,
    "socket": stat.S_IFSOCK,
}


def st_mode(kind: str, mode: int) -> int:
    """What lstat(2) gives as st_mode for an entry of ``kind`` with permission bits
    ``mode``: the two together (``stat.filemode`` of it reads as ``ls -l`` shows it)."""
    return TYPE_BITS[kind] | mode


def check_time(where: str, name: str, value: object) -> Time:
    if value in ("now", "omit"):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{where}: {name} is seconds, 'now' or 'omit', not {value!r}")
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{where}: {name} must be finite, not {value}")
    return float(value)


async def change(
    m: MetaTxn,
    e: Entry,
    now: float,
    *,
    mode: int | None = None,
    uid: int | None = None,
    gid: int | None = None,
    atime: Time = "omit",
    mtime: Time = "omit",
) -> None:
    """Set what is given of ``e``'s attributes (None and ``"omit"``: leave it), in ``m``;
    the ctime becomes ``now``."""

    def changed(rec: _R) -> _R:
        def when(t: Time, old: float) -> float:
            return old if t == "omit" else now if t == "now" else float(t)

        return replace(
            rec,
            mode=rec.mode if mode is None else mode,
            uid=rec.uid if uid is None else uid,
            gid=rec.gid if gid is None else gid,
            atime=rec.atime if atime == "omit" else when(atime, rec.mtime),
            mtime=when(mtime, rec.mtime),
            ctime=now,
        )

    if e.kind == "dir":
        d = await m.names.get_dir(e.id)
        assert d is not None, f"directory {e.id} has an entry and no record"
        await m.names.put_dir(changed(d))
        return
    f = await m.files.get(e.id)
    assert f is not None, f"file {e.id} has an entry and no record"
    await m.files.put(changed(f))


__all__ = [
    "DIR_TIME_GRAIN",
    "MAX_ID",
    "TYPE_BITS",
    "Perms",
    "Time",
    "born",
    "change",
    "check_id",
    "check_mode",
    "check_time",
    "st_mode",
    "subdirs",
    "touch_dir",
]
