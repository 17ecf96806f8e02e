"""Views of the metadata seam (``KVStore.view``) on every backend, and what SQLite does on
the event loop's thread: where it must not wait, it goes to a thread, and the loop runs on."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import sqlite3
import threading
from pathlib import Path

import pytest

from tectonic_emu.metadata import KVStore, SQLiteKV
from tectonic_emu.metadata._sqlite_conns import CHECKPOINT_EVERY
from tests.test_kv_contract import Durable, durable, put_all, run, store  # noqa: F401
from tests.walsyncs import WalSyncs

HOLD = 0.3  # seconds another connection holds a lock in the fallback tests


def test_a_view_reads_the_committed_state_and_refuses_writes(store: KVStore) -> None:  # noqa: F811
    async def body() -> None:
        await put_all(store, {b"a/1": b"x", b"a/2": b"y", b"b": b"z"})
        async with store.view() as v:
            assert await v.get(b"a/1") == b"x"
            assert await v.get(b"nope") is None
            assert await v.scan(b"a/") == [(b"a/1", b"x"), (b"a/2", b"y")]
            assert await v.scan(b"a/", start=b"a/2", limit=5) == [(b"a/2", b"y")]
            for write in (v.put(b"c", b"1"), v.delete(b"a/1")):
                with pytest.raises(OSError) as info:
                    await write
                assert info.value.errno == errno.EROFS
        assert await store.get(b"c") is None and await store.get(b"a/1") == b"x"

    run(body())


def test_a_view_in_a_task_holding_a_transaction_fails_fast(store: KVStore) -> None:  # noqa: F811
    async def body() -> None:
        async with store.transaction() as txn:
            await txn.put(b"k", b"v")
            with pytest.raises(OSError) as info:
                async with store.view():
                    pass
            assert info.value.errno == errno.EDEADLK
        async with store.view() as v:
            assert await v.get(b"k") == b"v"
        await store.close()
        with pytest.raises(OSError) as closed:
            async with store.view():
                pass
        assert closed.value.errno == errno.EBADF

    run(body())


def test_a_view_sees_one_state_while_another_store_commits(durable: Durable) -> None:  # noqa: F811
    """Two stores on one file or table: a commit by the other between a view's reads is not
    seen by the view, and is by the next one."""

    async def body() -> None:
        a, b = durable.make(), durable.make()
        try:
            await put_all(a, {b"k": b"old", b"j": b"old"})
            async with a.view() as v:
                assert await v.get(b"k") == b"old"
                await put_all(b, {b"k": b"new", b"j": b"new"})
                assert await v.get(b"j") == b"old"
                assert await v.scan(b"") == [(b"j", b"old"), (b"k", b"old")]
            async with a.view() as v:
                assert await v.get(b"j") == b"new"
        finally:
            await a.close()
            await b.close()

    run(body())


# -- SQLite: the loop's thread, and its fallbacks ----------------------------------------------
async def _ticks_while(work: asyncio.Future[object] | asyncio.Task[object]) -> int:
    """How often a 10 ms ticker ran on the loop while ``work`` ran."""
    ticks = 0
    while not work.done():
        await asyncio.sleep(0.01)
        ticks += 1
    return ticks


def _hold(path: str, statements: list[str], released: threading.Event) -> threading.Thread:
    """Another connection takes a lock with ``statements`` and keeps it for ``HOLD`` s."""
    took = threading.Event()

    def holder() -> None:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            for sql in statements:
                db.execute(sql).fetchall()
            took.set()
            released.wait(HOLD)
            db.execute("ROLLBACK")
        finally:
            db.close()

    t = threading.Thread(target=holder)
    t.start()
    assert took.wait(10)
    return t


class _BusyFirst:
    """A loop connection whose first ``busy`` statements fail as SQLite does when a
    process is recovering the WAL (SQLITE_BUSY): the one way SQLite keeps a WAL reader out,
    and one a test cannot bring about on cue."""

    def __init__(self, db: sqlite3.Connection, busy: int) -> None:
        self.db, self.busy = db, busy

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if self.busy:
            self.busy -= 1
            exc = sqlite3.OperationalError("database is locked")
            exc.sqlite_errorcode = 5  # type: ignore[attr-defined]
            raise exc
        return self.db.execute(sql, *args)

    @property
    def in_transaction(self) -> bool:
        return self.db.in_transaction

    def close(self) -> None:
        self.db.close()


def test_sqlite_a_busy_read_goes_to_the_reader_thread(tmp_path: Path) -> None:
    """A view whose first read finds SQLite busy on the loop's connection reads on the
    reader thread instead, and gets the right answer; the next view is on the loop again."""

    async def body() -> None:
        kv = await SQLiteKV.open(tmp_path / "m.db")
        try:
            await put_all(kv, {b"k": b"v", b"k2": b"w"})
            assert await kv.get(b"k") == b"v"
            assert kv._read_db is None and len(kv._views) == 1  # all on the loop so far
            flaky = _BusyFirst(kv._views[0], busy=1)
            kv._views[0] = flaky  # type: ignore[call-overload]
            async with kv.view() as v:
                assert await v.get(b"k") == b"v" and await v.get(b"k2") == b"w"
            assert kv._read_db is not None and flaky.busy == 0
            async with kv.view() as v:  # the loop's connection again
                assert await v.scan(b"k") == [(b"k", b"v"), (b"k2", b"w")]
            assert kv._views == [flaky]
        finally:
            await kv.close()

    run(body())


def test_sqlite_a_loop_connection_that_cannot_roll_back_is_dropped(tmp_path: Path) -> None:
    """A busy read whose rollback fails as well: the connection is closed, not pooled
    again, the view fails with the error (EBUSY), and the next view reads on."""

    class Stuck(_BusyFirst):
        @property
        def in_transaction(self) -> bool:
            return True  # so that the rollback is tried, and fails too

    async def body() -> None:
        kv = await SQLiteKV.open(tmp_path / "m.db")
        try:
            await put_all(kv, {b"k": b"v"})
            stuck = Stuck(kv._views[0], busy=2)  # BEGIN, then ROLLBACK
            kv._views[0] = stuck  # type: ignore[call-overload]
            with pytest.raises(OSError) as info:
                await kv.get(b"k")
            assert info.value.errno == errno.EBUSY
            assert stuck not in kv._views
            assert await kv.get(b"k") == b"v"  # on the reader thread, or a new connection
        finally:
            await kv.close()

    run(body())


def test_sqlite_a_busy_commit_goes_to_the_worker_and_the_loop_runs_on(tmp_path: Path) -> None:
    """Another connection holding SQLite's write lock: the loop's commit finds it busy, and
    the commit waits on the worker thread instead; it lands once the lock is free."""
    path = str(tmp_path / "m.db")

    async def body() -> None:
        kv = await SQLiteKV.open(path)
        try:
            await put_all(kv, {b"k": b"1"})
            released = threading.Event()
            t = _hold(path, ["BEGIN IMMEDIATE"], released)
            try:

                async def bump() -> None:
                    async with kv.transaction() as txn:
                        await txn.put(b"k", b"%d" % (int(await txn.get(b"k") or b"0") + 1))

                commit = asyncio.ensure_future(bump())
                assert await _ticks_while(commit) >= 5
                await commit
            finally:
                released.set()
                t.join()
            assert await kv.get(b"k") == b"2"
        finally:
            await kv.close()

    run(body())


def test_sqlite_a_held_lease_lock_is_waited_for_off_the_loop(tmp_path: Path) -> None:
    """The lease record's flock held by another open file (another process, or one stopped
    inside a commit): the transaction waits for it on the worker, not on the loop."""
    path = str(tmp_path / "m.db")

    async def body() -> None:
        kv = await SQLiteKV.open(path)
        fd = os.open(path + "-lease", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            loop = asyncio.get_running_loop()
            loop.call_later(HOLD, fcntl.flock, fd, fcntl.LOCK_UN)
            txn_done = asyncio.ensure_future(put_all(kv, {b"k": b"v"}))
            assert await _ticks_while(txn_done) >= 5
            await txn_done
            assert await kv.get(b"k") == b"v"
        finally:
            os.close(fd)
            await kv.close()

    run(body())


def test_sqlite_checkpoints_keep_the_log_from_growing(tmp_path: Path) -> None:
    """Commits on the loop's connection never checkpoint; the worker's restart checkpoints
    do, so the WAL is written from its start again instead of growing with every commit."""
    path = str(tmp_path / "m.db")
    value = os.urandom(100)
    commits = CHECKPOINT_EVERY * 40

    async def body() -> int:
        kv = await SQLiteKV.open(path, synchronous="normal")
        try:
            for i in range(commits):
                await put_all(kv, {b"k%05d" % i: value})
            await kv._settle_jobs()
            return Path(path + "-wal").stat().st_size  # noqa: ASYNC240 (one stat, in a test)
        finally:
            await kv.close()

    wal = run(body())
    # Every commit writes at least a page (4 KiB) of log: without checkpoints, all of them.
    assert wal < commits * 4096 / 3


# -- what a create costs in flushes (docs/design.md, "What is durable when") -----------------
def test_a_create_is_made_durable_by_the_writers_first_durable_point(tmp_path: Path) -> None:
    """open_writer's create commits without a flush of its own: the flush or the seal that
    the file needs anyway makes it durable, so an empty file costs one fsync of the log, not
    two; so does a new version (by its publish). A flush with nothing appended still makes
    the create durable."""
    from tectonic_emu import Cluster

    root = tmp_path / "cluster"
    Cluster.create(root, nodes=3, encoding="r1")

    async def body() -> None:
        async with Cluster.open(root) as cluster:
            kv = cluster.meta.kv
            assert isinstance(kv, SQLiteKV)
            syncs = WalSyncs(kv)
            client = cluster.client()
            w = await client.open_writer("/a")
            assert syncs.n == 0 and kv._log.synced < kv._log.commits  # visible, not durable
            await w.flush()
            assert syncs.n == 1 and kv._log.synced == kv._log.commits
            await w.close()
            assert syncs.n == 2
            w = await client.open_writer("/b")
            await w.close()
            assert syncs.n == 3 and kv._log.synced == kv._log.commits
            v = await client.new_version("/b")
            assert syncs.n == 3
            await v.close()
            assert syncs.n == 4 and kv._log.synced == kv._log.commits
            assert (await client.stat("/a")).sealed and (await client.stat("/b")).sealed

    asyncio.run(body())


def test_sqlite_a_view_open_across_close_ends_cleanly(tmp_path: Path) -> None:
    """A view still reading when its store is closed finishes its reads, and its
    connection is closed, not returned to a pool nobody will drain."""

    async def body() -> None:
        kv = await SQLiteKV.open(tmp_path / "m.db")
        await put_all(kv, {b"k": b"v"})
        async with kv.view() as v:
            await kv.close()
            assert await v.get(b"k") == b"v"
        assert kv._views == []
        with pytest.raises(OSError) as info:
            await kv.get(b"k")
        assert info.value.errno == errno.EBADF

    run(body())
