"""Read replies in page-aligned memory: libfuse's ``read_buf`` callback.

For a plain ``read`` callback, libfuse ``malloc``s the reply buffer, and a large ``malloc``
starts 16 bytes past a page boundary: copies into such a buffer can run 5x slower on this kind
of machine (2.1-2.4 GB/s against 12-14, ../shared/MACHINE.md). With ``read_buf`` the file
system hands libfuse a ``struct fuse_bufvec`` of its own: here one buffer from
``posix_memalign``, which libfuse ``free``s after sending the reply (``fuse_free_buf``).
Together with page-aligned segment buffers, this took ``bench fuse`` reads from 0.41 to 0.45
of the native client (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
from collections.abc import Callable
from typing import Any

PAGE = 4096


class _FuseBuf(ctypes.Structure):  # struct fuse_buf (fuse_common.h)
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("flags", ctypes.c_int),  # enum fuse_buf_flags; 0: memory
        ("mem", ctypes.c_void_p),
        ("fd", ctypes.c_int),
        ("pos", ctypes.c_int64),  # off_t
    ]


class _FuseBufvec(ctypes.Structure):  # struct fuse_bufvec with its one inline buffer
    _fields_ = [
        ("count", ctypes.c_size_t),
        ("idx", ctypes.c_size_t),
        ("off", ctypes.c_size_t),
        ("buf", _FuseBuf),
    ]


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.malloc.restype = ctypes.c_void_p
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
_libc.posix_memalign.restype = ctypes.c_int


def reply(bufpp: Any, size: int, fill: Callable[[int], int]) -> int:
    """Point ``*bufpp`` at a new bufvec whose buffer ``fill(address)`` fills with at most
    ``size`` bytes (returning how many); 0, or ``-ENOMEM``. An exception from ``fill``
    propagates, and nothing is left allocated."""
    mem = ctypes.c_void_p()
    if _libc.posix_memalign(ctypes.byref(mem), PAGE, max(size, 1)) != 0:
        return -errno.ENOMEM
    try:
        n = fill(mem.value or 0)
        vec_address = _libc.malloc(ctypes.sizeof(_FuseBufvec))
        if not vec_address:
            raise MemoryError
    except MemoryError:
        _libc.free(mem)
        return -errno.ENOMEM
    except BaseException:
        _libc.free(mem)
        raise
    vec = _FuseBufvec.from_address(vec_address)
    vec.count, vec.idx, vec.off = 1, 0, 0
    vec.buf.size, vec.buf.flags, vec.buf.mem, vec.buf.fd, vec.buf.pos = n, 0, mem, -1, 0
    ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = vec_address
    return 0


def copy_bytes(data: bytes) -> Callable[[int], int]:
    """A ``fill`` for ``reply`` that copies ``data``."""

    def fill(address: int) -> int:
        ctypes.memmove(address, data, len(data))
        return len(data)

    return fill
