"""Buffers on the data path: page-aligned, reused, copied into without holding the GIL."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tectonic_emu.bufpool import PAGE, BufferPool, Recycler, copy_into, uninitialised


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


@pytest.mark.parametrize("n", [1, PAGE - 1, PAGE, (8 << 20) + 3])
def test_uninitialised_buffers_are_page_aligned_and_writable(n: int) -> None:
    buf = uninitialised(n)
    assert len(buf) == n and not buf.readonly and address(buf) % PAGE == 0
    buf[-1] = 7
    assert buf[-1] == 7


@given(st.integers(0, 1 << 20), st.integers(0, 4096), st.sampled_from([0, 100, 300 << 10]))
def test_copy_into_is_a_slice_assignment(at: int, pad: int, n: int) -> None:
    src = memoryview(os.urandom(n))
    dest = memoryview(bytearray(at + n + pad))
    copy_into(dest, at, src)
    assert bytes(dest[at : at + n]) == bytes(src) and bytes(dest[:at]) == bytes(at)


def test_copy_into_a_read_only_buffer_fails() -> None:
    with pytest.raises(BufferError):
        copy_into(memoryview(bytes(1 << 20)), 0, memoryview(bytes(1 << 20)))


def test_pool_reuses_up_to_keep_buffers() -> None:
    pool = BufferPool(PAGE * 2, keep=2)
    a, b, c = pool.take(), pool.take(), pool.take()
    assert ctypes.addressof(ctypes.c_char.from_buffer(a)) % PAGE == 0
    for buf in (a, b, c):
        pool.give(buf)
    assert pool.kept == 2  # the third was dropped
    assert {id(pool.take()), id(pool.take())} == {id(a), id(b)}
    pool.close()
    assert pool.kept == 0
    pool.give(a)
    assert pool.kept == 0  # keeps none once closed


def test_a_recycled_buffer_is_handed_out_again_only_once_nothing_refers_to_it() -> None:
    r = Recycler(PAGE * 4, keep=2)
    a = r.take()
    first = address(a)
    assert first % PAGE == 0 and len(a) == PAGE * 4 and not a.readonly
    a[:3] = b"abc"
    view = a[PAGE:]  # a slice outlives the view it was cut from
    arr = np.frombuffer(a, dtype=np.uint8)
    del a
    b = r.take()
    assert address(b) != first  # still referred to: a new buffer
    del arr
    c = r.take()
    assert address(c) != first  # the slice still refers to it
    del view
    d = r.take()
    assert address(d) == first and bytes(d[:3]) == b"abc"  # reused, not zeroed
    assert r.reused == 1
    assert r.tracked == 2  # keep=2: the third one taken (c) is not tracked
    tracked = {first, address(b)}
    del b, c, d
    x, y = r.take(), r.take()
    assert {address(x), address(y)} == tracked and r.reused == 3
