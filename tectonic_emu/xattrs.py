"""Extended attributes: ``user.*`` names with byte values, kept in metadata beside a file's
or a directory's other attributes (``metadata.layers.XattrLayer``), as Linux keeps them:
names up to 255 bytes, values up to 64 KiB, ``XATTR_CREATE`` and ``XATTR_REPLACE``. Setting
or removing one moves the ctime. ``user.tectonic.*`` is the FUSE mount's (computed: the
layout, the encoding) and cannot be set.
"""

from __future__ import annotations

from tectonic_emu import attrs
from tectonic_emu.errors import (
    AlreadyExistsError,
    ArgumentTypeError,
    InvalidArgumentError,
    NoAttributeError,
    NotPermittedError,
    NotSupportedError,
)
from tectonic_emu.metadata.layers import MetaTxn
from tectonic_emu.metadata.records import Entry

NAME_MAX = 255  # bytes of a name, "user." included (XATTR_NAME_MAX)
SIZE_MAX = 64 << 10  # bytes of a value (XATTR_SIZE_MAX)
CREATE, REPLACE = 1, 2  # <sys/xattr.h>
RESERVED = "user.tectonic."  # the mount's, computed


def check_name(where: str, name: object) -> str:
    """A ``user.*`` attribute name: NotSupportedError for other namespaces (EOPNOTSUPP, as
    a file system without them answers), InvalidArgumentError beyond 255 bytes."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{where}: name must be a str, not {type(name).__name__}")
    if not name.startswith("user.") or name == "user.":
        raise NotSupportedError(f"{where}: only user.* attributes are kept", name)
    if len(name.encode()) > NAME_MAX or "\0" in name:
        raise InvalidArgumentError(f"{where}: a name is at most {NAME_MAX} bytes, no NUL", name)
    return name


async def set_(m: MetaTxn, e: Entry, name: str, value: bytes, flags: int, now: float) -> None:
    """Set ``name`` of ``e`` in ``m`` (``flags``: CREATE, REPLACE or 0)."""
    if name.startswith(RESERVED):
        raise NotPermittedError("the store's own attribute: it cannot be set", name)
    if len(value) > SIZE_MAX:
        raise InvalidArgumentError(f"setxattr: a value is at most {SIZE_MAX} bytes", name)
    old = await m.xattrs.get(e.id, name)
    if old is not None and flags & CREATE:
        raise AlreadyExistsError("the attribute exists (XATTR_CREATE)", name)
    if old is None and flags & REPLACE:
        raise NoAttributeError("no such attribute (XATTR_REPLACE)", name)
    await m.xattrs.put(e.id, name, bytes(value))
    await attrs.change(m, e, now)


async def remove(m: MetaTxn, e: Entry, name: str, now: float) -> None:
    if await m.xattrs.get(e.id, name) is None:
        raise NoAttributeError("no such attribute", name)
    await m.xattrs.delete(e.id, name)
    await attrs.change(m, e, now)


__all__ = ["CREATE", "NAME_MAX", "REPLACE", "RESERVED", "SIZE_MAX", "check_name", "remove", "set_"]
