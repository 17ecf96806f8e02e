"""Safe local output files: never through a symlink, never over anything but a regular file.

``atomic_output`` writes into a temporary file made in the target's directory with
``O_CREAT|O_EXCL|O_NOFOLLOW`` (so a name planted there beforehand is refused, not followed),
fsyncs it, and renames it over the target only when the block exits normally. A target that
is a symlink or not a regular file (a device, a FIFO, a directory) is refused unless
``force``; then it is replaced by the new regular file (the link itself, never its target).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from tectonic_emu.errors import InvalidArgumentError


def _check_target(path: Path, force: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) or force:
        if stat.S_ISDIR(st.st_mode):
            raise InvalidArgumentError("is a directory: cannot replace it with a file", str(path))
        return
    what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
    raise InvalidArgumentError(f"refusing to write over {what} (--force replaces it)", str(path))


@contextlib.contextmanager
def atomic_output(path: Path, *, force: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write that becomes ``path`` when the block exits normally.

    On an exception nothing at ``path`` changes and the temporary file is removed.
    Raises InvalidArgumentError for a target that is a symlink or not a regular file (unless
    ``force``; a directory always), and OSError when the directory cannot be written."""
    path = Path(path)
    _check_target(path, force)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        _check_target(path, force)  # it may have changed while we wrote
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


__all__ = ["atomic_output"]
