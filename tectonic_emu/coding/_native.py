"""Direct ctypes access to the native libraries our dependencies ship: ISA-L (bundled in the
pyeclib wheel) and crc32c (bundled in the google-crc32c wheel).

Why not their Python faces: pyeclib copies every block twice, holds the GIL and aborts the process
on memoryview fragments; google-crc32c accepts only ``bytes``. Through ctypes we pass pointers
into the caller's buffers (no copies) and ctypes releases the GIL for the duration of each call,
so encoding and checksumming scale across worker threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache

from tectonic_emu.buffers import BytesLike

_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer, unchanged since 3.3.
    _fields_ = (
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    )


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = (ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int)
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = (ctypes.POINTER(_PyBuffer),)
_release_buffer.restype = None


@contextmanager
def pinned(buffers: Sequence[BytesLike], writable: bool = False) -> Iterator[list[tuple[int, int]]]:
    """Yield ``(address, nbytes)`` of each contiguous buffer, holding a buffer export on each
    until the block ends so that no bytearray can be resized or mmap closed under a native call.
    Raises ``BufferError`` for non-contiguous (or, if ``writable``, read-only) buffers.

    A writable buffer is pinned by a ctypes object made on it (``from_buffer`` holds the
    export while the object lives): 0.3 µs, where ``PyObject_GetBuffer`` through ctypes
    costs about 1.5 µs a buffer, a tenth of a 4 KiB read's CPU. Read-only ones (``bytes``)
    take that way."""
    views: list[_PyBuffer] = []
    held: list[ctypes.c_char] = []
    spans: list[tuple[int, int]] = []
    flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
    try:
        for buf in buffers:
            try:
                anchor = ctypes.c_char.from_buffer(buf)
            except (TypeError, ValueError):  # read-only, empty or not contiguous
                anchor = None
            if anchor is not None:
                held.append(anchor)
                spans.append((ctypes.addressof(anchor), memoryview(buf).nbytes))
                continue
            view = _PyBuffer()
            _get_buffer(buf, ctypes.byref(view), flags)
            views.append(view)
            spans.append((view.buf or 0, view.len))
        yield spans
    finally:
        held.clear()
        for view in views:
            _release_buffer(ctypes.byref(view))


def _site_libs(package: str, pattern: str) -> list[str]:
    """Library files a manylinux wheel vendors next to ``package`` (``<package>.libs/``)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    parent = os.path.dirname(next(iter(spec.submodule_search_locations)))
    return sorted(glob.glob(os.path.join(parent, f"{package}.libs", pattern)))


class IsaL:
    """The few ISA-L erasure-code functions we use (see isa-l/include/erasure_code.h).

    ``ec_encode_data`` releases the GIL (use it for bulk data); the other functions, and
    ``ec_encode_data_small``, keep it: re-taking the GIL can cost a whole switch interval
    (5 ms) when another thread is busy running Python, far more than a small call."""

    def __init__(self, path: str) -> None:
        self.path = path
        released, held = ctypes.CDLL(path), ctypes.PyDLL(path)
        u8p = ctypes.POINTER(ctypes.c_ubyte)
        encode_args = (
            ctypes.c_int,  # len
            ctypes.c_int,  # k sources
            ctypes.c_int,  # rows (outputs)
            u8p,  # tables from ec_init_tables
            ctypes.POINTER(ctypes.c_void_p),  # k source pointers
            ctypes.POINTER(ctypes.c_void_p),  # rows output pointers
        )
        self.ec_encode_data = released.ec_encode_data
        self.ec_encode_data_small = held.ec_encode_data
        for fn in (self.ec_encode_data, self.ec_encode_data_small):
            fn.argtypes = encode_args
            fn.restype = None
        self.ec_init_tables = held.ec_init_tables
        self.ec_init_tables.argtypes = (ctypes.c_int, ctypes.c_int, u8p, u8p)
        self.ec_init_tables.restype = None
        self.gf_invert_matrix = held.gf_invert_matrix
        self.gf_invert_matrix.argtypes = (u8p, u8p, ctypes.c_int)
        self.gf_invert_matrix.restype = ctypes.c_int
        self.gf_gen_cauchy1_matrix = held.gf_gen_cauchy1_matrix
        self.gf_gen_cauchy1_matrix.argtypes = (u8p, ctypes.c_int, ctypes.c_int)
        self.gf_gen_cauchy1_matrix.restype = None


@cache
def isal() -> IsaL:
    """Load ISA-L: the copy bundled in the pyeclib wheel, else the system's libisal."""
    candidates = _site_libs("pyeclib", "libisal*.so*")
    system = ctypes.util.find_library("isal")
    if system:
        candidates.append(system)
    for path in candidates:
        try:
            return IsaL(path)
        except (OSError, AttributeError):
            continue
    raise ImportError(
        "ISA-L not found: Reed-Solomon encodings need the pyeclib wheel (which bundles it) "
        "or the system library (Debian: apt-get install libisal2)"
    )


@cache
def crc32c_extend() -> tuple[Callable[[int, int, int], int], Callable[[int, int, int], int]] | None:
    """``uint32_t crc32c_extend(uint32_t crc, const uint8_t* data, size_t n)`` from the library
    google-crc32c's extension links against (dlsym on the extension also searches its
    dependencies), as (GIL-releasing, GIL-holding) functions; None if it cannot be reached
    (pure-Python build of google-crc32c)."""
    try:
        from google_crc32c import _crc32c

        path = _crc32c.__file__
        fns = ctypes.CDLL(path).crc32c_extend, ctypes.PyDLL(path).crc32c_extend
    except (ImportError, OSError, AttributeError):
        return None
    for fn in fns:
        fn.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
        fn.restype = ctypes.c_uint32
    return fns
