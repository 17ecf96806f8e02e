"""The error vocabulary of tectonic-emu, in one table.

Every error a caller can see is an ``OSError`` subclass carrying an errno, so that pandas,
pyarrow, fsspec and the FUSE layer (``FuseOSError(err.errno)``) behave as users expect, and the
command line can print one clear line. Python's own subclasses (``FileNotFoundError``...) are
mixed in where one fits, so ``except FileNotFoundError`` works on our errors too.
"""

from __future__ import annotations

import errno as _errno
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio


class TectonicError(OSError):
    """Base of every error raised on purpose by tectonic-emu."""

    default_errno: int = _errno.EIO

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(self.default_errno, message)
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.message}: {self.path}" if self.path is not None else self.message

    def __reduce__(self) -> tuple[type[TectonicError], tuple[str, str | None]]:
        # OSError pickles its (errno, strerror) args; ours take (message, path).
        return (type(self), (self.message, self.path))


# -- names and paths -------------------------------------------------------------------------
class NotFoundError(TectonicError, FileNotFoundError):
    default_errno = _errno.ENOENT


class AlreadyExistsError(TectonicError, FileExistsError):
    default_errno = _errno.EEXIST


class IsADirectoryError_(TectonicError, IsADirectoryError):
    default_errno = _errno.EISDIR


class NotADirectoryError_(TectonicError, NotADirectoryError):
    default_errno = _errno.ENOTDIR


class DirectoryNotEmptyError(TectonicError):
    default_errno = _errno.ENOTEMPTY


class InvalidPathError(TectonicError):
    """A path or name that cannot be stored (empty component, '.', '..', NUL, too long...)."""

    default_errno = _errno.EINVAL


class NameTooLongError(InvalidPathError):
    default_errno = _errno.ENAMETOOLONG


# -- files and writers -----------------------------------------------------------------------
class SealedFileError(TectonicError, PermissionError):
    """A write to a sealed (immutable) file."""

    default_errno = _errno.EPERM


class NotPermittedError(TectonicError, PermissionError):
    """What POSIX refuses with EPERM whoever asks: a hard link to a directory."""

    default_errno = _errno.EPERM


class NoAttributeError(TectonicError):
    """An extended attribute that is not there (getxattr, removexattr, XATTR_REPLACE)."""

    default_errno = _errno.ENODATA


class NotSupportedError(TectonicError):
    """An extended attribute outside ``user.*`` (the namespace the store keeps)."""

    default_errno = _errno.EOPNOTSUPP


class FencedWriterError(TectonicError):
    """This writer lost its write token to a newer writer of the same file."""

    default_errno = _errno.ESTALE


class WriterClosedError(TectonicError):
    """An operation on a writer that was already closed or aborted."""

    default_errno = _errno.EBADF


# -- configuration ---------------------------------------------------------------------------
class UnknownEncodingError(TectonicError, ValueError):
    default_errno = _errno.EINVAL


class InvalidArgumentError(TectonicError, ValueError):
    default_errno = _errno.EINVAL


class FileTooLargeError(TectonicError):
    """A file would grow past ``config.MAX_SIZE`` (what an ``off_t`` holds), e.g. by a hole."""

    default_errno = _errno.EFBIG


class ClusterNotFoundError(TectonicError, FileNotFoundError):
    default_errno = _errno.ENOENT


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type at the public Python API (``read("/f", 0.5)``); also a
    ``TypeError``, as Python's own would be."""


class UnsafeTargetError(InvalidArgumentError):
    """A local output path that is a symlink, device, FIFO or socket: never followed or
    replaced unless asked (``get --force``)."""


class ClusterBusyError(TectonicError):
    """Another process owns the cluster (``owner.py``): a second owner is refused."""

    default_errno = _errno.EBUSY


class MetadataLostError(TectonicError):
    """The cluster's metadata is missing, empty or another cluster's: the message names the
    fix (``meta restore --latest``, ``meta load``). Never an empty namespace instead."""

    default_errno = _errno.EIO


# -- availability and integrity --------------------------------------------------------------
class NotEnoughNodesError(TectonicError):
    """Fewer live nodes (or disks) than the encoding needs to place a block."""

    default_errno = _errno.EHOSTDOWN


class NodeUnavailableError(TectonicError):
    """A storage node did not answer (stopped, killed, unreachable)."""

    default_errno = _errno.EHOSTDOWN


class ChunkNotFoundError(TectonicError):
    """A storage node does not hold the chunk asked for."""

    default_errno = _errno.ENOENT


class ChunkCorruptError(TectonicError):
    """A chunk's bytes do not match its checksum."""

    default_errno = _errno.EIO


class NoSpaceError(TectonicError):
    """No room for the bytes: a node's disk is full, or every node a block could use is."""

    default_errno = _errno.ENOSPC


class QuotaExceededError(TectonicError):
    """A create or a write would take a tenant past its quota of files or bytes
    (``tectonic_emu/metadata/tenants.py``); nothing of it is committed."""

    default_errno = _errno.EDQUOT


class CrossTenantError(TectonicError):
    """A rename or a hard link would move a file or a directory into another tenant's
    namespace, or out of its own (EXDEV, as across XFS project quotas: ``mv`` copies)."""

    default_errno = _errno.EXDEV


class DataUnavailableError(TectonicError):
    """Too few good chunks of a block survive to return its bytes. Never wrong bytes instead."""

    default_errno = _errno.EIO


class MetadataMismatchError(TectonicError):
    """Garbage collection or repair refused to delete: the metadata references almost none of
    the chunks on the nodes (it looks empty or foreign), or ``--i-know`` gave another count."""

    default_errno = _errno.EUCLEAN


def reason(exc: BaseException) -> str:
    """What went wrong, for an error line: ``str(exc)``, or its type's name when that is empty
    (``TimeoutError()`` and ``ConnectionResetError()`` from asyncio say nothing)."""
    return str(exc) or type(exc).__name__


class AuthenticationError(TectonicError, PermissionError):
    """The cluster secret is missing, unreadable or open to others, or a peer does not prove
    it knows it."""

    default_errno = _errno.EACCES


def retrieved(fut: asyncio.Future[Any]) -> None:
    """Mark a future's outcome seen (as a done callback): its error is reported elsewhere,
    or by nobody once its owner is abandoned. Left unseen, the loop logs it when the future
    is collected, with a traceback that Python 3.11 formats by parsing source, and a
    collection inside another ``ast.parse`` (hypothesis's, in a later test) then failed
    with "AST constructor recursion depth mismatch" (CPython gh-106905)."""
    if not fut.cancelled():
        fut.exception()


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of an exception group: ``TaskGroup`` wraps errors, our callers want the
    plain typed error."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


__all__ = [
    "AlreadyExistsError",
    "CrossTenantError",
    "QuotaExceededError",
    "ArgumentTypeError",
    "AuthenticationError",
    "ChunkCorruptError",
    "ChunkNotFoundError",
    "ClusterBusyError",
    "ClusterNotFoundError",
    "DataUnavailableError",
    "DirectoryNotEmptyError",
    "FencedWriterError",
    "FileTooLargeError",
    "InvalidArgumentError",
    "InvalidPathError",
    "IsADirectoryError_",
    "MetadataMismatchError",
    "MetadataLostError",
    "NameTooLongError",
    "NoSpaceError",
    "NodeUnavailableError",
    "NotADirectoryError_",
    "NotEnoughNodesError",
    "NotFoundError",
    "SealedFileError",
    "TectonicError",
    "UnknownEncodingError",
    "UnsafeTargetError",
    "WriterClosedError",
    "first_error",
    "reason",
    "retrieved",
]
