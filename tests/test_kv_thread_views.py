"""Reads off the event loop's thread (``metadata.offloop``): the thread views of each
backend, ``run_here``, and ``Bridge.read`` with its fallback to the loop."""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu.bridge import Bridge
from tectonic_emu.cluster import Cluster
from tectonic_emu.errors import NotFoundError
from tectonic_emu.metadata import KVStore, MemoryKV, SQLiteKV
from tectonic_emu.metadata._sqlite_conns import THREAD_CONNECTIONS
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.metadata.offloop import WouldWait, here, run_here
from tests.test_kv_contract import run, store  # noqa: F401

T = TypeVar("T")


def in_thread(make: Callable[[], Coroutine[Any, Any, T]]) -> T | WouldWait:
    """``run_here(make)`` on a thread of its own (no event loop there): its answer, or the
    WouldWait it raised."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(run_here(make))
        except BaseException as e:  # handed to the test
            out.append(e)

    t = threading.Thread(target=go)
    t.start()
    t.join()
    if isinstance(out[0], BaseException) and not isinstance(out[0], WouldWait):
        raise out[0]
    return out[0]  # type: ignore[no-any-return]


async def read_keys(kv: KVStore, keys: list[bytes], pause: float = 0) -> list[bytes | None]:
    """``keys`` read in one thread view; ``pause``: seconds this thread sleeps between two
    reads (the loop commits meanwhile)."""
    view = kv.thread_view()
    assert view is not None
    out = []
    async with view as v:
        for k in keys:
            if out and pause:
                time.sleep(pause)  # noqa: ASYNC251 - on a thread of its own, no loop
            out.append(await v.get(k))
    return out


# -- run_here ----------------------------------------------------------------------------------
def test_run_here_answers_what_never_suspends_and_raises_what_it_raises() -> None:
    async def answer() -> tuple[int, bool]:
        return 42, here()

    async def fails() -> None:
        raise NotFoundError("gone", "/x")

    assert run_here(answer) == (42, True)
    assert not here()
    with pytest.raises(NotFoundError):
        run_here(fails)
    assert not here()


def test_run_here_unwinds_what_would_suspend_and_says_so() -> None:
    unwound = []

    async def suspends() -> int:
        try:
            await asyncio.sleep(0)
            return 1
        finally:
            unwound.append(True)

    with pytest.raises(WouldWait):
        run_here(suspends)
    assert unwound == [True]
    assert not here()


# -- thread views, per backend -----------------------------------------------------------------
def test_a_thread_view_reads_the_last_commit_and_refuses_writes(store: KVStore) -> None:  # noqa: F811
    async def body() -> None:
        async with store.transaction() as txn:
            await txn.put(b"a", b"1")
            await txn.put(b"b", b"2")
        if store.thread_view() is None:  # it has none: every read goes to the loop
            meta = Metadata(store)

            async def stat() -> None:
                async with meta.view():
                    pass

            assert isinstance(in_thread(stat), WouldWait)
            return
        assert in_thread(lambda: read_keys(store, [b"a", b"b", b"c"])) == [b"1", b"2", None]

        async def write() -> None:
            view = store.thread_view()
            assert view is not None
            async with view as v:
                await v.put(b"a", b"3")

        with pytest.raises(OSError) as e:
            in_thread(write)
        assert e.value.errno == errno.EROFS

    run(body())


def test_a_thread_view_never_sees_an_open_transaction(store: KVStore) -> None:  # noqa: F811
    async def body() -> None:
        if store.thread_view() is None:
            pytest.skip("no thread views: every read goes to the loop")
        async with store.transaction() as txn:
            await txn.put(b"k", b"old")
        async with store.transaction() as txn:
            await txn.get(b"k")
            await txn.put(b"k", b"new")
            seen = await asyncio.to_thread(in_thread, lambda: read_keys(store, [b"k"]))
            assert isinstance(seen, WouldWait) or seen == [b"old"]
        assert in_thread(lambda: read_keys(store, [b"k"])) == [b"new"]

    run(body())


def test_a_thread_view_sees_one_state_while_the_loop_commits(store: KVStore) -> None:  # noqa: F811
    """The loop commits a == b == i over and over, yielding between its two writes; a
    thread reading both in one view never sees them differ."""

    async def body() -> None:
        if store.thread_view() is None:
            pytest.skip("no thread views: every read goes to the loop")
        stop = threading.Event()
        answers: list[list[bytes | None]] = []
        refused = 0

        def reader() -> None:
            nonlocal refused
            while not stop.is_set():
                seen = in_thread(lambda: read_keys(store, [b"a", b"b"], pause=0.0003))
                if isinstance(seen, WouldWait):
                    refused += 1
                else:
                    answers.append(seen)

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(300):
                async with store.transaction() as txn:
                    await txn.put(b"a", b"%d" % i)
                    await asyncio.sleep(0)
                    await txn.put(b"b", b"%d" % i)
                await asyncio.sleep(0.0002 if i % 3 else 0)
        finally:
            stop.set()
            await asyncio.to_thread(t.join)
        assert answers, f"every one of {refused} reads was refused"
        assert all(a == b for a, b in answers)

    run(body())


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.dictionaries(st.binary(min_size=1, max_size=3), st.binary(max_size=4), max_size=20),
    prefix=st.binary(max_size=2),
    start=st.none() | st.binary(max_size=3),
    limit=st.none() | st.integers(0, 6),
    backend=st.sampled_from(["memory", "sqlite"]),
)
def test_thread_view_scans_answer_as_the_loops_views_do(
    tmp_path_factory: pytest.TempPathFactory,
    pairs: dict[bytes, bytes],
    prefix: bytes,
    start: bytes | None,
    limit: int | None,
    backend: str,
) -> None:
    kv: KVStore = (
        MemoryKV() if backend == "memory" else SQLiteKV(tmp_path_factory.mktemp("kv") / "m.db")
    )

    async def scan_thread() -> list[tuple[bytes, bytes]]:
        view = kv.thread_view()
        assert view is not None
        async with view as v:
            return await v.scan(prefix, start=start, limit=limit)

    async def body() -> None:
        try:
            async with kv.transaction() as txn:
                for k, v in pairs.items():
                    await txn.put(k, v)
            async with kv.view() as v:
                expected = await v.scan(prefix, start=start, limit=limit)
            assert in_thread(scan_thread) == expected
        finally:
            await kv.close()

    run(body())


def test_sqlite_thread_connections_are_capped_and_reused(tmp_path: Path) -> None:
    kv = SQLiteKV(tmp_path / "m.db")

    async def body() -> None:
        async with kv.transaction() as txn:
            await txn.put(b"k", b"v")
        taken = [kv._thread_db() for _ in range(THREAD_CONNECTIONS)]
        with pytest.raises(WouldWait):
            kv._thread_db()
        for db in taken:
            kv._thread_db_back(db, good=True)
        again = kv._thread_db()
        assert again in taken  # kept, not opened anew
        kv._thread_db_back(again, good=False)  # a failed one is closed
        assert kv._thread_count == THREAD_CONNECTIONS - 1
        await kv.close()
        with pytest.raises(WouldWait):  # closed: the loop's way says EBADF
            kv._thread_db()

    run(body())


# -- Bridge.read -------------------------------------------------------------------------------
def test_bridge_read_answers_here_or_on_the_loop_alike(tmp_path: Path) -> None:
    Cluster.create(tmp_path / "c", nodes=3, encoding="r1")
    bridge = Bridge(tmp_path / "c")
    try:
        client = bridge.client
        bridge.call(client.mkdir("/d"))
        bridge.call(client.write_file("/d/f", b"12345"))
        here_stat = bridge.read(lambda: client.stat("/d/f"))
        assert here_stat == bridge.call(client.stat("/d/f"))
        assert here_stat.size == 5
        assert [e.name for e in bridge.read(lambda: client.scandir("/d"))] == ["f"]
        with pytest.raises(NotFoundError):
            bridge.read(lambda: client.stat("/d/missing"))

        async def needs_the_loop() -> str:
            await asyncio.sleep(0)  # suspends: run_here hands it back, the loop runs it
            return asyncio.get_running_loop().__class__.__name__

        assert bridge.read(needs_the_loop).endswith("EventLoop")
    finally:
        bridge.close()
