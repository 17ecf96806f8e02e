"""Path and name rules of the namespace.

Paths are ``/``-separated and always relative to the cluster's root; leading, trailing and
repeated slashes are ignored as POSIX does. A name is at most 255 UTF-8 bytes, not ``.`` or
``..``, and holds neither ``/`` nor NUL. A whole path has no cap: one a program passes the
kernel is at most 4,096 bytes, but relative to a working directory of any depth (the FUSE
mount hands on the path from its root).
"""

from __future__ import annotations

from tectonic_emu.errors import InvalidPathError, NameTooLongError

MAX_NAME_BYTES = 255


def check_name(name: str, path: str | None = None) -> str:
    if name in ("", ".", ".."):
        raise InvalidPathError(f"{name!r} is not a valid name", path or name)
    if "/" in name or "\0" in name:
        raise InvalidPathError("a name may not contain '/' or NUL", path or name)
    try:
        raw = name.encode()
    except UnicodeEncodeError:
        raise InvalidPathError("a name must be valid UTF-8", path or repr(name)) from None
    if len(raw) > MAX_NAME_BYTES:
        raise NameTooLongError(f"name longer than {MAX_NAME_BYTES} bytes", path or name)
    return name


def split_path(path: str) -> list[str]:
    """The components of ``path`` (``[]`` for the root), each checked with ``check_name``."""
    if not isinstance(path, str):
        raise InvalidPathError(f"a path must be a string, not {type(path).__name__}")
    parts = [p for p in path.split("/") if p]
    for p in parts:
        check_name(p, path)
    return parts


def join_path(parts: list[str]) -> str:
    return "/" + "/".join(parts)


__all__ = ["MAX_NAME_BYTES", "check_name", "join_path", "split_path"]
