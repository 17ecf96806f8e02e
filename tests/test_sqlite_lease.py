"""The lease on a SQLite metadata file (issue 19): a process stopped or killed inside a
transaction holds the others up for at most its lease, never until it resumes; resumed
after another took the lease, it commits nothing. A holder that stays alive keeps the lease
however long its transaction, and one whose lease ran out with nobody else asking commits.
Processes are stopped and killed for real (SIGSTOP, SIGKILL)."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import time
from pathlib import Path

import pytest

from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.metadata import SQLiteKV
from tectonic_emu.metadata._sqlite_lease import MAX_LEASE
from tests.kv_holder import resume_refused, stopped_holder

LEASE = 1.0


async def other_client(path: Path, *, blind: bool) -> bytes | None:
    """A transaction from another process's point of view: a blind write, or a read first."""
    kv = SQLiteKV(path, busy_timeout=LEASE * 20)
    try:
        async with kv.transaction() as t:
            if not blind:
                assert await t.get(b"k") is None  # the holder's write never committed
            await t.put(b"k", b"from the other client")
        return await kv.get(b"k")
    finally:
        await kv.close()


@pytest.mark.parametrize("blind", [False, True], ids=["reads", "only-writes"])
def test_a_stopped_holder_blocks_others_for_its_lease_and_commits_nothing_resumed(
    tmp_path: Path, blind: bool
) -> None:
    """Without the lease the other client waits until busy_timeout and fails EBUSY; with it,
    it goes on once the stopped holder's lease ran out. The holder, resumed, finds the lease
    taken and commits nothing, with a line that says so."""
    path = tmp_path / "m.db"
    with stopped_holder("sqlite", str(path), str(LEASE)) as holder:
        began = time.monotonic()
        assert asyncio.run(other_client(path, blind=blind)) == b"from the other client"
        waited = time.monotonic() - began
        assert f"refused: {errno.ETIMEDOUT}" in resume_refused(holder)
    assert waited < LEASE * 20  # it did not wait for busy_timeout (the lease is the bound)

    async def value() -> bytes | None:
        kv = SQLiteKV(path)
        try:
            return await kv.get(b"k")
        finally:
            await kv.close()

    assert asyncio.run(value()) == b"from the other client"


def test_a_killed_holder_frees_the_lease_when_it_runs_out(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    with stopped_holder("sqlite", str(path), str(LEASE), stop=False) as holder:
        holder.kill()
        holder.wait()
    assert asyncio.run(other_client(path, blind=False)) == b"from the other client"


def test_a_live_holder_keeps_the_lease_past_its_length_by_renewing_it(tmp_path: Path) -> None:
    """A transaction open for four leases (its event loop running) keeps the others out:
    a read-modify-write that starts meanwhile sees the holder's commit."""
    path = tmp_path / "m.db"

    async def body() -> None:
        a = SQLiteKV(path, lease=0.3)
        b = SQLiteKV(path, busy_timeout=10)
        try:
            inside = asyncio.Event()

            async def holder() -> None:
                async with a.transaction() as t:
                    await t.get(b"k")
                    inside.set()
                    await asyncio.sleep(1.2)
                    await t.put(b"k", b"1")

            async def increment() -> bytes:
                await inside.wait()
                async with b.transaction() as t:
                    seen = await t.get(b"k")
                    await t.put(b"k", b"%d" % (int(seen or b"0") + 1))
                return seen or b""

            _, seen = await asyncio.gather(holder(), increment())
            assert seen == b"1"
            assert await b.get(b"k") == b"2"
        finally:
            await a.close()
            await b.close()

    asyncio.run(body())


def test_a_holder_whose_lease_ran_out_unasked_still_commits(tmp_path: Path) -> None:
    """A stall past the lease (here the event loop blocked) costs nothing when nobody else
    asked for the lease meanwhile: nothing changed, so the commit is still serializable."""
    path = tmp_path / "m.db"

    async def body() -> None:
        kv = SQLiteKV(path, lease=0.2)
        try:
            async with kv.transaction() as t:
                assert await t.get(b"k") is None
                time.sleep(0.5)  # noqa: ASYNC251 - the stall under test
                await t.put(b"k", b"v")
            assert await kv.get(b"k") == b"v"
        finally:
            await kv.close()

    asyncio.run(body())


def test_a_lease_ending_beyond_the_longest_one_counts_as_ended(tmp_path: Path) -> None:
    """A lease record that ends further ahead than any lease may run (the clock was stepped
    back since it was taken) does not hold the file up."""
    path = tmp_path / "m.db"

    async def put(value: bytes, *, seen: bytes | None) -> None:
        kv = SQLiteKV(path, busy_timeout=0.5)
        try:
            async with kv.transaction() as t:
                assert await t.get(b"k") == seen
                await t.put(b"k", value)
            assert await kv.get(b"k") == value
        finally:
            await kv.close()

    asyncio.run(put(b"v", seen=None))
    far = time.time() + 2 * MAX_LEASE
    Path(f"{path}-lease").write_bytes(struct.pack("<16sQd", b"x" * 16, 1, far))
    asyncio.run(put(b"w", seen=b"v"))


def test_a_busy_lease_names_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "m.db"

    async def body() -> None:
        a, b = SQLiteKV(path), SQLiteKV(path, busy_timeout=0.2)
        try:
            async with a.transaction() as t:
                await t.get(b"k")
                with pytest.raises(OSError, match=f"pid {os.getpid()} holds the lock") as info:
                    async with b.transaction() as other:
                        await other.get(b"k")
                assert info.value.errno == errno.EBUSY
        finally:
            await a.close()
            await b.close()

    asyncio.run(body())


def test_bad_leases_are_refused(tmp_path: Path) -> None:
    for bad in (0, -1, MAX_LEASE + 1):
        with pytest.raises(InvalidArgumentError, match="lease"):
            SQLiteKV(tmp_path / "m.db", lease=bad)
