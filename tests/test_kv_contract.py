"""The contract every metadata ``KVStore`` backend meets, run against each of them."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tectonic_emu.metadata import KVStore, MemoryKV, PostgresKV, SQLiteKV, prefix_end
from tectonic_emu.metadata._common import overlay, pending_in_range
from tectonic_emu.sim.metadata import MetadataModel, ModelKV
from tests.conftest import fresh_table

T = TypeVar("T")
StoreFactory = Callable[[], KVStore]


class Boom(Exception):
    pass


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


@pytest.fixture(params=["memory", "sqlite", "postgres", "model"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    s: KVStore
    if request.param == "memory":
        s = MemoryKV()
    elif request.param == "model":  # a projection's metadata, on a real loop: tiny sleeps
        s = ModelKV(MetadataModel(shards=4, qps=1e6, rtt=1e-5))
    elif request.param == "sqlite":
        s = SQLiteKV(tmp_path / "m.db")
    else:
        s = PostgresKV(request.getfixturevalue("postgres_url"), table=fresh_table())
    yield s
    run(s.close())


async def put_all(store: KVStore, pairs: dict[bytes, bytes]) -> None:
    async with store.transaction() as txn:
        for k, v in pairs.items():
            await txn.put(k, v)


async def everything(store: KVStore) -> dict[bytes, bytes]:
    return dict(await store.scan(b""))


# -- basic operations ------------------------------------------------------------------------
def test_get_put_delete(store: KVStore) -> None:
    async def body() -> None:
        assert await store.get(b"a") is None
        await put_all(store, {b"a": b"1", b"b": b""})
        assert await store.get(b"a") == b"1"
        assert await store.get(b"b") == b""  # empty value is a value, not absence
        await put_all(store, {b"a": b"2"})
        assert await store.get(b"a") == b"2"
        async with store.transaction() as txn:
            await txn.delete(b"a")
            await txn.delete(b"never-there")
        assert await store.get(b"a") is None
        assert await everything(store) == {b"b": b""}

    run(body())


def test_binary_keys_and_values(store: KVStore) -> None:
    pairs = {b"": b"empty key", b"\x00": b"\x00\x00", b"\xff\xff": bytes(range(256))}

    async def body() -> None:
        await put_all(store, pairs)
        for k, v in pairs.items():
            assert await store.get(k) == v
        assert await everything(store) == pairs

    run(body())


def test_scan_orders_bytewise(store: KVStore) -> None:
    keys = [b"\xff", b"a", b"\x00", b"", b"a\x00", b"a\xff", b"ab", b"\x00\xff", b"\xff\x00", b"b"]

    async def body() -> None:
        await put_all(store, {k: k + b"!" for k in keys})
        assert await store.scan(b"") == [(k, k + b"!") for k in sorted(keys)]

    run(body())


def test_scan_prefix_start_limit(store: KVStore) -> None:
    keys = [b"a", b"a/1", b"a/2", b"a/3", b"a0", b"b", b"b/1", b"\xff", b"\xff\xff"]

    async def body() -> None:
        await put_all(store, {k: b"v" for k in keys})

        async def ks(prefix: bytes, **kw: Any) -> list[bytes]:
            return [k for k, _ in await store.scan(prefix, **kw)]

        assert await ks(b"a/") == [b"a/1", b"a/2", b"a/3"]
        assert await ks(b"a") == [b"a", b"a/1", b"a/2", b"a/3", b"a0"]
        assert await ks(b"a/", start=b"a/2") == [b"a/2", b"a/3"]
        assert await ks(b"a/", start=b"a/15") == [b"a/2", b"a/3"]
        assert await ks(b"a/", start=b"") == [b"a/1", b"a/2", b"a/3"]  # start below prefix
        assert await ks(b"a/", start=b"z") == []  # start above the prefix's range
        assert await ks(b"a/", limit=2) == [b"a/1", b"a/2"]
        assert await ks(b"a/", start=b"a/2", limit=1) == [b"a/2"]
        assert await ks(b"a/", limit=0) == []
        assert await ks(b"c") == []
        assert await ks(b"\xff") == [b"\xff", b"\xff\xff"]
        assert await ks(b"", start=b"b/") == [b"b/1", b"\xff", b"\xff\xff"]
        with pytest.raises(ValueError):
            await store.scan(b"", limit=-1)

    run(body())


def test_prefix_end_edges() -> None:
    assert prefix_end(b"") is None
    assert prefix_end(b"\xff") is None
    assert prefix_end(b"\xff\xff") is None
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"a") == b"b"
    assert prefix_end(b"\x00") == b"\x01"
    assert prefix_end(b"ab\x00") == b"ab\x01"


def test_scan_at_prefix_end_edges(store: KVStore) -> None:
    keys = [b"a", b"a\xfe", b"a\xff", b"a\xff\x00", b"a\xff\xff", b"b"]
    keys += [b"\xfe", b"\xff", b"\xff\xff"]

    async def body() -> None:
        await put_all(store, {k: b"" for k in keys})
        assert [k for k, _ in await store.scan(b"a\xff")] == [b"a\xff", b"a\xff\x00", b"a\xff\xff"]
        assert [k for k, _ in await store.scan(b"\xff")] == [b"\xff", b"\xff\xff"]
        assert [k for k, _ in await store.scan(b"")] == sorted(keys)

    run(body())


def test_put_rejects_non_bytes(store: KVStore) -> None:
    async def body() -> None:
        async with store.transaction() as txn:
            with pytest.raises(ValueError):
                await txn.put("a", b"1")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await txn.put(b"a", "1")  # type: ignore[arg-type]
        assert await everything(store) == {}

    run(body())


# -- transactions ----------------------------------------------------------------------------
def test_read_your_writes(store: KVStore) -> None:
    async def body() -> None:
        await put_all(store, {b"k/1": b"old", b"k/2": b"old"})
        async with store.transaction() as txn:
            await txn.put(b"k/1", b"new")
            await txn.put(b"k/3", b"new")
            await txn.delete(b"k/2")
            assert await txn.get(b"k/1") == b"new"
            assert await txn.get(b"k/2") is None
            assert await txn.scan(b"k/") == [(b"k/1", b"new"), (b"k/3", b"new")]
            await txn.put(b"k/2", b"again")
            assert await txn.scan(b"k/", start=b"k/2") == [(b"k/2", b"again"), (b"k/3", b"new")]
        assert await everything(store) == {b"k/1": b"new", b"k/2": b"again", b"k/3": b"new"}

    run(body())


def test_rollback_on_exception(store: KVStore) -> None:
    async def body() -> None:
        await put_all(store, {b"a": b"1", b"b": b"1"})
        with pytest.raises(Boom):
            async with store.transaction() as txn:
                await txn.put(b"a", b"2")
                await txn.delete(b"b")
                await txn.put(b"c", b"2")
                assert await txn.get(b"a") == b"2"
                assert await txn.scan(b"") == [(b"a", b"2"), (b"c", b"2")]  # sent, then undone
                await txn.put(b"d", b"2")
                raise Boom
        assert await everything(store) == {b"a": b"1", b"b": b"1"}

    run(body())


def test_rollback_on_cancellation(store: KVStore) -> None:
    async def body() -> None:
        await put_all(store, {b"a": b"1"})
        inside = asyncio.Event()

        async def writer() -> None:
            async with store.transaction() as txn:
                await txn.put(b"a", b"2")
                await txn.put(b"b", b"2")
                await txn.scan(b"")
                await txn.put(b"c", b"2")
                inside.set()
                await asyncio.Event().wait()  # forever

        task = asyncio.create_task(writer())
        await inside.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await everything(store) == {b"a": b"1"}
        await put_all(store, {b"z": b"ok"})  # the store is still usable
        assert await everything(store) == {b"a": b"1", b"z": b"ok"}

    run(body())


@pytest.mark.parametrize("delay", [0.0, 0.0002, 0.0005, 0.001, 0.002, 0.005])
def test_cancellation_at_any_point_is_all_or_nothing(store: KVStore, delay: float) -> None:
    wanted = {b"k/%d" % i: b"v" for i in range(5)}

    async def body() -> None:
        async def writer() -> None:
            async with store.transaction() as txn:
                for i, (k, v) in enumerate(wanted.items()):
                    await txn.put(k, v)
                    if i % 2:
                        await txn.get(k + b"x")

        for _ in range(3):
            task = asyncio.create_task(writer())
            await asyncio.sleep(delay)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert await everything(store) in ({}, wanted)
            async with store.transaction() as txn:
                for k in wanted:
                    await txn.delete(k)

    run(body())


def test_outside_reads_see_only_committed_data(store: KVStore) -> None:
    async def body() -> None:
        inside = asyncio.Event()
        release = asyncio.Event()

        async def writer() -> None:
            async with store.transaction() as txn:
                await txn.put(b"a", b"uncommitted")
                inside.set()
                await release.wait()
                raise Boom

        task = asyncio.create_task(writer())
        await inside.wait()
        reader = asyncio.create_task(store.get(b"a"))
        await asyncio.sleep(0.01)
        release.set()
        with pytest.raises(Boom):
            await task
        assert await reader is None

    run(body())


def test_transaction_object_is_single_use(store: KVStore) -> None:
    async def body() -> None:
        cm = store.transaction()
        async with cm as txn:
            await txn.put(b"a", b"1")
        with pytest.raises(OSError) as info:
            await txn.put(b"b", b"1")
        assert info.value.errno == errno.EBADF
        with pytest.raises(OSError):
            await txn.get(b"a")
        with pytest.raises(OSError):
            async with cm:
                pass
        assert await everything(store) == {b"a": b"1"}

    run(body())


def test_nested_transaction_in_one_task_fails_fast(store: KVStore) -> None:
    async def body() -> None:
        async with store.transaction() as txn:
            await txn.put(b"a", b"1")
            with pytest.raises(OSError) as info:
                async with store.transaction():
                    pass
            assert info.value.errno == errno.EDEADLK
            with pytest.raises(OSError):
                await store.get(b"a")
        assert await store.get(b"a") == b"1"

    run(body())


def test_closed_store_refuses_use(store: KVStore) -> None:
    async def body() -> None:
        await put_all(store, {b"a": b"1"})
        await store.close()
        await store.close()  # twice is fine
        with pytest.raises(OSError) as info:
            await store.get(b"a")
        assert info.value.errno == errno.EBADF
        with pytest.raises(OSError):
            async with store.transaction():
                pass

    run(body())


def test_iter_prefix_batches(store: KVStore) -> None:
    inside = {b"p/%03d" % i: b"%d" % i for i in range(25)}
    outside = {b"o": b"", b"p": b"", b"q/1": b""}

    async def body() -> None:
        await put_all(store, {**inside, **outside})
        for batch in (1, 5, 7, 25, 26, 1000):
            got = [pair async for pair in store.iter_prefix(b"p/", batch=batch)]
            assert got == sorted(inside.items())
        got = [pair async for pair in store.iter_prefix(b"", batch=4)]
        assert got == sorted({**inside, **outside}.items())
        assert [pair async for pair in store.iter_prefix(b"zz", batch=3)] == []

    run(body())


async def increment(store: KVStore, key: bytes, times: int) -> None:
    for _ in range(times):
        async with store.transaction() as txn:
            value = int(await txn.get(key) or b"0")
            await asyncio.sleep(0)  # let the other tasks try to interleave
            await txn.put(key, b"%d" % (value + 1))


def test_concurrent_increments_lose_no_update(store: KVStore) -> None:
    async def body() -> None:
        async with asyncio.TaskGroup() as tg:
            for _ in range(20):
                tg.create_task(increment(store, b"counter", 10))
        assert await store.get(b"counter") == b"200"

    run(body())


# -- durable backends: SQLite and PostgreSQL ----------------------------------------------
class Durable:
    """One durable store's place, opened as often as a test likes: a SQLite file, or a
    PostgreSQL table."""

    def __init__(self, kind: str, where: str, table: str = "") -> None:
        self.kind, self.where, self.table = kind, where, table

    def make(self, **kwargs: Any) -> KVStore:
        if self.kind == "sqlite":
            return SQLiteKV(self.where, **kwargs)
        return PostgresKV(self.where, table=self.table, **kwargs)


@pytest.fixture(params=["sqlite", "postgres"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Durable:
    if request.param == "sqlite":
        return Durable("sqlite", str(tmp_path / "m.db"))
    return Durable("postgres", request.getfixturevalue("postgres_url"), fresh_table())


def test_two_stores_on_one_place_lose_no_update(durable: Durable) -> None:
    """Two stores on one file or table (as two processes, or two hosts, would have)."""

    async def body() -> None:
        stores = [durable.make(synchronous="normal") for _ in range(2)]
        try:
            async with asyncio.TaskGroup() as tg:
                for s in stores:
                    for _ in range(3):
                        tg.create_task(increment(s, b"counter", 10))
            for s in stores:
                assert await s.get(b"counter") == b"60"
        finally:
            for s in stores:
                await s.close()

    run(body())


_INCREMENTER = textwrap.dedent(
    """
    import asyncio, sys
    from tectonic_emu.metadata import PostgresKV, SQLiteKV

    async def main(kind: str, where: str, table: str, times: int) -> None:
        store = SQLiteKV(where) if kind == "sqlite" else PostgresKV(where, table=table)
        try:
            for _ in range(times):
                async with store.transaction() as txn:
                    value = int(await txn.get(b"counter") or b"0")
                    await txn.put(b"counter", b"%d" % (value + 1))
        finally:
            await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


def test_processes_share_a_store_without_lost_updates(durable: Durable) -> None:
    argv = [sys.executable, "-c", _INCREMENTER, durable.kind, durable.where, durable.table]
    procs = [subprocess.Popen([*argv, "50"]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    store = durable.make()
    assert run(store.get(b"counter")) == b"200"
    run(store.close())


def test_group_commit_shares_flushes(durable: Durable) -> None:
    """Concurrent durable commits share flushes (an fsync of SQLite's WAL, a synchronous
    commit in PostgreSQL), each returning once a flush that began after its commit is done.
    A transaction with durable=False returns without one; ``sync`` then makes it durable; a
    read-only transaction needs none; every commit is there after a reopen. Each flush is
    made 20 ms slower, so that sharing does not hang on how fast this disk's fsync is."""
    kv = durable.make()
    log = kv._log  # type: ignore[attr-defined]
    began: list[int] = []  # commits made when each flush began
    real = log._flush

    async def counting() -> None:
        began.append(log.commits)
        await asyncio.sleep(0.02)  # a slow disk: commits pile up behind each flush
        await real()

    log._flush = counting

    async def one(k: int) -> None:
        async with kv.transaction() as txn:
            await txn.put(b"k%03d" % k, b"v")
        assert began and max(began) >= 1 and log.synced >= 1

    async def body() -> None:
        await asyncio.gather(*(one(k) for k in range(40)))
        assert 1 <= len(began) < 40 and log.synced == log.commits == 40
        before = len(began)
        async with kv.transaction(durable=False) as txn:
            await txn.put(b"later", b"1")
        assert len(began) == before and log.synced == 40
        await kv.sync()
        assert len(began) == before + 1 and log.synced == 41
        await kv.sync()  # nothing new: no flush
        assert len(began) == before + 1
        async with kv.transaction() as txn:  # reads only: nothing to make durable
            await txn.get(b"later")
        assert len(began) == before + 1
        await kv.close()

    run(body())
    again = durable.make()
    assert len(run(again.scan(b""))) == 41
    run(again.close())


def test_a_busy_store_fails_with_ebusy_after_timeout(durable: Durable) -> None:
    async def body() -> None:
        holder = durable.make()
        waiter = durable.make(busy_timeout=0.2)
        try:
            async with holder.transaction() as txn:
                await txn.get(b"x")  # holds the write lock from here
                with pytest.raises(OSError) as info:
                    async with waiter.transaction() as other:
                        await other.put(b"x", b"1")
                assert info.value.errno == errno.EBUSY
                await txn.put(b"x", b"holder")
            assert await waiter.get(b"x") == b"holder"
            async with waiter.transaction() as other:  # usable again
                await other.put(b"y", b"1")
            assert await holder.get(b"y") == b"1"
        finally:
            await holder.close()
            await waiter.close()

    run(body())


# -- SQLite only -----------------------------------------------------------------------------
def test_sqlite_persists_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        store = SQLiteKV(path)
        await put_all(store, {b"a": b"1", b"b": b"2"})
        with pytest.raises(Boom):
            async with store.transaction() as txn:
                await txn.put(b"c", b"3")
                raise Boom
        await store.close()
        store = await SQLiteKV.open(path, synchronous="normal")
        assert await everything(store) == {b"a": b"1", b"b": b"2"}
        await store.close()

    run(body())


def test_sqlite_reads_outside_transactions_do_not_wait_for_them(tmp_path: Path) -> None:
    """``get`` and ``scan`` answer from the last commit while a transaction that has written
    (and so holds the file's write lock) is still open, and see its writes once committed."""

    async def body() -> None:
        store = SQLiteKV(tmp_path / "m.db")
        await put_all(store, {b"a": b"1"})
        inside, release = asyncio.Event(), asyncio.Event()

        async def writer() -> None:
            async with store.transaction() as txn:
                await txn.put(b"a", b"2")
                assert await txn.get(b"b") is None  # sends the write: the lock is held now
                inside.set()
                await release.wait()

        task = asyncio.create_task(writer())
        await inside.wait()
        assert await asyncio.wait_for(store.get(b"a"), 5) == b"1"
        assert await asyncio.wait_for(store.scan(b""), 5) == [(b"a", b"1")]
        release.set()
        await task
        assert await store.get(b"a") == b"2"
        await store.close()
        with pytest.raises(OSError):
            await store.get(b"a")

    run(body())


def test_sqlite_stores_start_together_on_a_new_file(tmp_path: Path) -> None:
    async def body(path: Path) -> None:
        stores = [SQLiteKV(path) for _ in range(2)]
        try:
            async with asyncio.TaskGroup() as tg:
                for s in stores:
                    for _ in range(3):
                        tg.create_task(increment(s, b"counter", 3))
            assert await stores[0].get(b"counter") == b"18"
        finally:
            for s in stores:
                await s.close()

    for i in range(20):  # the race this guards against is hit in about 1 round in 7
        run(body(tmp_path / f"{i}.db"))


def test_sqlite_a_failed_fsync_of_the_log_is_an_os_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = SQLiteKV(tmp_path / "f.db")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def body() -> None:
        await put_all(kv, {b"a": b"1"})
        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(OSError, match="may not be durable") as err:
            await put_all(kv, {b"b": b"2"})
        assert err.value.errno == errno.EIO
        monkeypatch.undo()
        await put_all(kv, {b"c": b"3"})  # the next fsync covers b and c
        assert await everything(kv) == {b"a": b"1", b"b": b"2", b"c": b"3"}
        await kv.close()

    run(body())


def test_sqlite_bad_path_and_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        run(SQLiteKV.open(tmp_path / "no" / "such" / "dir" / "m.db"))
    with pytest.raises(ValueError):
        SQLiteKV(tmp_path / "m.db", synchronous="fast")  # type: ignore[arg-type]


def test_sqlite_not_a_database_is_an_os_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database" * 300)
    with pytest.raises(OSError) as info:
        run(SQLiteKV.open(path))
    assert info.value.errno == errno.EIO
    assert str(path) in str(info.value)


def test_sqlite_failed_operation_poisons_transaction(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        holder = SQLiteKV(path)
        store = SQLiteKV(path, busy_timeout=0.1)
        try:
            async with holder.transaction() as txn:
                await txn.get(b"x")  # holds the write lock from here
                with pytest.raises(OSError) as info:
                    async with store.transaction() as other:
                        await other.put(b"a", b"1")
                        with pytest.raises(OSError):  # busy: cannot begin
                            await other.get(b"b")
                        with pytest.raises(OSError):  # the transaction is broken now
                            await other.put(b"c", b"1")
                assert info.value.errno == errno.EIO  # and does not commit at the end
            assert await store.get(b"a") is None
        finally:
            await holder.close()
            await store.close()

    run(body())


# -- model-based: random operations against a dict ------------------------------------------
keys = st.lists(st.sampled_from(b"\x00\x01ab\xfe\xff"), max_size=3).map(bytes)
values = st.binary(max_size=4)
ops = st.lists(st.tuples(keys, st.none() | values), max_size=6)  # None: delete


def model_scan(
    model: dict[bytes, bytes], prefix: bytes, start: bytes | None, limit: int | None
) -> list[tuple[bytes, bytes]]:
    rows = sorted(
        (k, v) for k, v in model.items() if k.startswith(prefix) and (start is None or k >= start)
    )
    return rows if limit is None else rows[:limit]


@given(
    stored=st.dictionaries(keys, values),
    writes=st.dictionaries(keys, st.none() | values),
    prefix=keys,
    start=st.none() | keys,
    limit=st.none() | st.integers(0, 5),
)
def test_kept_writes_laid_over_a_cut_scan_are_the_scan_of_the_result(
    stored: dict[bytes, bytes],
    writes: dict[bytes, bytes | None],
    prefix: bytes,
    start: bytes | None,
    limit: int | None,
) -> None:
    """``overlay``: what a transaction that keeps its writes (SQLite's) answers to a scan,
    asking the file for ``limit`` rows plus one per kept delete in range."""
    pending = pending_in_range(writes, prefix, start)
    ask = None if limit is None else limit + sum(v is None for _, v in pending)
    rows = model_scan(stored, prefix, start, ask)
    after = dict(stored)
    for k, v in writes.items():
        if v is None:
            after.pop(k, None)
        else:
            after[k] = v
    cut = ask is not None and len(rows) == ask
    assert overlay(rows, pending, limit, cut) == model_scan(after, prefix, start, limit)


class KVMachine(RuleBasedStateMachine):
    """Random operations on a store, checked against a plain dict."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.model: dict[bytes, bytes] = {}
        self.store = self.make_store()

    def make_store(self) -> KVStore:
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            self.loop.close()

    def run(self, coro: Awaitable[T]) -> T:
        async def main() -> T:
            return await coro

        return self.loop.run_until_complete(main())

    @rule(key=keys, value=values)
    def put(self, key: bytes, value: bytes) -> None:
        async def body() -> None:
            async with self.store.transaction() as txn:
                await txn.put(key, value)

        self.run(body())
        self.model[key] = value

    @rule(key=keys)
    def delete(self, key: bytes) -> None:
        async def body() -> None:
            async with self.store.transaction() as txn:
                await txn.delete(key)

        self.run(body())
        self.model.pop(key, None)

    @rule(key=keys)
    def get(self, key: bytes) -> None:
        assert self.run(self.store.get(key)) == self.model.get(key)

    @rule(prefix=keys, start=st.none() | keys, limit=st.none() | st.integers(0, 5))
    def scan(self, prefix: bytes, start: bytes | None, limit: int | None) -> None:
        got = self.run(self.store.scan(prefix, start=start, limit=limit))
        assert got == model_scan(self.model, prefix, start, limit)

    @rule(
        ops=ops,
        prefix=keys,
        start=st.none() | keys,
        limit=st.none() | st.integers(0, 5),
        fail=st.booleans(),
    )
    def transaction(
        self,
        ops: list[tuple[bytes, bytes | None]],
        prefix: bytes,
        start: bytes | None,
        limit: int | None,
        fail: bool,
    ) -> None:
        """Reads inside see the transaction's own writes, scans with a start and a limit
        too (SQLite lays writes it keeps over what the file holds)."""
        shadow = dict(self.model)

        async def body() -> None:
            async with self.store.transaction() as txn:
                for key, value in ops:
                    if value is None:
                        await txn.delete(key)
                        shadow.pop(key, None)
                    else:
                        await txn.put(key, value)
                        shadow[key] = value
                    assert await txn.get(key) == shadow.get(key)
                    got = await txn.scan(prefix, start=start, limit=limit)
                    assert got == model_scan(shadow, prefix, start, limit)
                assert await txn.scan(prefix) == model_scan(shadow, prefix, None, None)
                if fail:
                    raise Boom

        if fail:
            with pytest.raises(Boom):
                self.run(body())
        else:
            self.run(body())
            self.model = shadow

    @rule(ops=ops)
    def cancelled_transaction(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        async def body() -> None:
            inside = asyncio.Event()

            async def writer() -> None:
                async with self.store.transaction() as txn:
                    for key, value in ops:
                        if value is None:
                            await txn.delete(key)
                        else:
                            await txn.put(key, value)
                    await txn.scan(b"")
                    inside.set()
                    await asyncio.Event().wait()

            task = asyncio.create_task(writer())
            await inside.wait()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        self.run(body())

    @invariant()
    def store_matches_model(self) -> None:
        assert self.run(self.store.scan(b"")) == sorted(self.model.items())


class MemoryKVMachine(KVMachine):
    def make_store(self) -> KVStore:
        return MemoryKV()


class SQLiteKVMachine(KVMachine):
    def make_store(self) -> KVStore:
        self.tmpdir = tempfile.mkdtemp(prefix="kvmachine-")
        return SQLiteKV(os.path.join(self.tmpdir, "m.db"))

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


_machine_settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
TestMemoryKVMachine = MemoryKVMachine.TestCase


class ModelKVMachine(KVMachine):
    """A projection's metadata (``sim/metadata.py``) against the same model."""

    def make_store(self) -> KVStore:
        return ModelKV(MetadataModel(shards=3, qps=1e7))


TestModelKVMachine = ModelKVMachine.TestCase
TestModelKVMachine.settings = _machine_settings
TestMemoryKVMachine.settings = _machine_settings
TestSQLiteKVMachine = SQLiteKVMachine.TestCase
TestSQLiteKVMachine.settings = _machine_settings


class PostgresKVMachine(KVMachine):
    url = ""  # set by the test below from the session's server

    def make_store(self) -> KVStore:
        return PostgresKV(self.url, table=fresh_table())


def test_postgres_kv_machine(postgres_url: str) -> None:
    PostgresKVMachine.url = postgres_url
    run_state_machine_as_test(
        PostgresKVMachine, settings=settings(max_examples=25, stateful_step_count=20)
    )


# -- PostgreSQL only -------------------------------------------------------------------------


def test_postgres_bad_urls_and_arguments(postgres_url: str) -> None:
    missing_db = postgres_url.rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(OSError) as info:
        run(PostgresKV.open(missing_db))
    assert info.value.errno == errno.ENOENT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(OSError) as info:
        run(PostgresKV.open(f"postgresql://tectonic@127.0.0.1:{port}/postgres"))
    assert info.value.errno == errno.ECONNREFUSED
    with pytest.raises(ValueError):
        PostgresKV("sqlite:///m.db")
    with pytest.raises(ValueError):
        PostgresKV(postgres_url, table="kv; DROP TABLE x")
    with pytest.raises(ValueError):
        PostgresKV(postgres_url, synchronous="off")  # type: ignore[arg-type]


def test_postgres_server_restart_loses_nothing_committed(postgres_server: Any) -> None:
    """The server stops under a store: calls fail with an OSError (connection refused or
    reset), a transaction open then commits nothing, and once the server is back the store
    reconnects and holds every commit it acknowledged."""
    table = fresh_table()

    async def body() -> None:
        kv = PostgresKV(postgres_server.url, table=table)
        try:
            await put_all(kv, {b"a": b"1"})
            with pytest.raises(OSError) as info:
                async with kv.transaction() as txn:
                    await txn.put(b"b", b"2")
                    await txn.get(b"a")  # begun: the server holds the open transaction
                    await asyncio.to_thread(postgres_server.pg_ctl, "stop")
                    await txn.put(b"c", b"3")
            assert info.value.errno in (errno.EIO, errno.ECONNRESET, errno.ECONNREFUSED)
            with pytest.raises(OSError) as info:
                await kv.get(b"a")
            assert info.value.errno in (errno.ECONNREFUSED, errno.ECONNRESET)
            await asyncio.to_thread(postgres_server.pg_ctl, "start")
            await put_all(kv, {b"d": b"4"})
            assert await everything(kv) == {b"a": b"1", b"d": b"4"}
        finally:
            await kv.close()

    run(body())
