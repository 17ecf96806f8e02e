"""Keep freed memory in the process so the data path reuses warm pages.

On this kind of VM, memory the process gives back to the kernel (and the kernel to the host)
is slow to touch again: 0.4-1.9 GB/s against 6-20 GB/s for pages already in use
(../shared/MACHINE.md). glibc gives back every freed block above its mmap threshold at once,
and trims the top of the heap beyond its trim threshold, so 8 MiB chunk buffers allocated per
request were mostly fresh memory. Raising both thresholds keeps chunk-sized blocks on the heap,
where the next request reuses them: a served node's chunk reads went from 0.70 to 1.10 GB/s and
its chunk writes from 0.22 to 0.78 GB/s (measured in docs/performance.md).

Called once per process by ``Cluster.open`` and by node processes. Set
``TECTONIC_EMU_MALLOC_TUNING=0`` to leave malloc alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for this setting on 64-bit
TRIM_THRESHOLD = 512 << 20

_done = False


def keep_freed_memory() -> bool:
    """Apply the tuning (glibc only; idempotent). True when it is in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("TECTONIC_EMU_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok: bool = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    _done = ok
    return ok


__all__ = ["keep_freed_memory"]
