"""Safe local output files: ``atomic_output`` writes a file the way ``get`` must.

A command that writes a local file a user named (``get``, fsspec's ``get_file``) may run as
root in a directory others can write to. So it never opens the target itself and never
writes through a name someone else could have planted:

- the bytes go to a fresh temporary file in the target's directory, created with
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a symlink or file already at that name is never opened: the
  next name is tried), private (0600) while it is written;
- on success it is fsync'd, given the mode the target would get (an existing regular
  target's mode, else 0666 less the umask), and renamed over the target; the directory is
  fsync'd. A rename replaces a directory entry and never follows a symlink at the target;
- a target that is a symlink, a device, a FIFO, a socket or a directory is refused before
  anything is written, unless ``force``, which replaces the entry itself (the link, the
  device node) with the regular file and still never writes through it (a directory is
  always refused);
- on any error, the temporary file is removed and the target is left as it was.

All names are resolved against one descriptor of the directory, so the directory cannot be
swapped for another between the checks and the rename.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from tectonic_emu.errors import IsADirectoryError_, NotFoundError, UnsafeTargetError

_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Temporary names tried before giving up (each taken name is someone else's file or link).
_TEMP_TRIES = 16


def atomic_output(
    path: Path, *, force: bool = False
) -> contextlib.AbstractContextManager[BinaryIO]:
    """A binary file object whose bytes replace ``path`` atomically when the block exits
    without error (on error: nothing at ``path`` changes, the temporary file is removed).

    Raises NotFoundError when the directory does not exist, IsADirectoryError_ when ``path``
    is a directory, UnsafeTargetError when it is a symlink or not a regular file and
    ``force`` is False, and OSError from the file system (EACCES, ENOSPC...).
    """
    return _atomic_output(Path(path), force)


@contextlib.contextmanager
def _atomic_output(path: Path, force: bool) -> Iterator[BinaryIO]:
    target = Path(os.path.abspath(path))
    name = target.name
    try:
        dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise NotFoundError("no such local directory", str(target.parent)) from None
    try:
        mode = _target_mode(dfd, name, str(target), force)
        fd, temp = open_temp(dfd, _temp_names(name))
        try:
            with os.fdopen(fd, "wb") as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
                os.fchmod(out.fileno(), mode)
            # Checked again just before the rename: the entry may have changed meanwhile.
            _target_mode(dfd, name, str(target), force)
            os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _target_mode(dfd: int, name: str, shown: str, force: bool) -> int:
    """The permission bits the output gets; refuses a target that is not a regular file."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return 0o666 & ~_umask()
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError_("is a directory", shown)
    if stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode)
    if not force:
        kind = file_kind(st.st_mode)
        raise UnsafeTargetError(
            f"local target is {kind}: not followed, not replaced (--force replaces it "
            "with a regular file)",
            shown,
        )
    return 0o666 & ~_umask()


def open_temp(dfd: int, names: Iterable[str]) -> tuple[int, str]:
    """Create the first of ``names`` that does not exist yet in directory ``dfd``, 0600,
    never through a symlink; returns its descriptor and name. A name that is taken (a file,
    a planted symlink) is skipped, never opened. Raises FileExistsError when all are taken."""
    for temp in names:
        try:
            return os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=dfd), temp
        except FileExistsError:
            continue
    raise FileExistsError("every temporary name for the output is taken")


def _temp_names(name: str) -> Iterator[str]:
    # Random, so nobody can plant a link at the name ahead of time; short, so a 255-byte
    # target name still leaves room.
    for _ in range(_TEMP_TRIES):
        yield f".{name[:200]}.{secrets.token_hex(6)}.part"


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for an error line ("a FIFO")."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "of an unknown kind"


def make_private(path: str | os.PathLike[str], mode: int) -> None:
    """Take access away from ``path`` down to ``mode`` (0600 for files, 0700 for
    directories) when group or others have any: for files and directories made before they
    were private, or by ``mkdir -p`` with the umask. A path that is missing or not ours to
    chmod is left as it is (its opener reports what it cannot do)."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        if os.stat(path).st_mode & 0o077:
            os.chmod(path, mode)


def _umask() -> int:
    """This process's umask, read without changing it (Linux 4.7+ reports it in
    /proc/self/status; elsewhere it is set and restored)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o077)
    os.umask(old)
    return old


__all__ = ["atomic_output", "file_kind", "make_private", "open_temp"]
