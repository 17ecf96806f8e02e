"""``GroupCommit`` (tectonic_emu/groupsync.py): shared flushes, and a lone committer's
flush run on its own thread (``flush_here``).

The promise checked throughout: ``durable(seq)`` returns only once a flush that began after
commit ``seq`` was counted has ended without error, whichever way it ran.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectonic_emu import groupsync
from tectonic_emu.groupsync import GroupCommit
from tectonic_emu.metadata import SQLiteKV
from tests.walsyncs import WalSyncs


class Log:
    """Commits and the flushes that cover them, both kinds, as a disk's log would see them."""

    def __init__(self, *, alone: bool = True, fail: set[int] | None = None) -> None:
        self.lone = alone
        self.fail = fail or set()  # numbers of the flushes (from 1) that fail
        self.flushes = 0
        self.here = 0
        self.durable_upto = 0  # commits a finished, successful flush covered
        self.group = GroupCommit(self._flush, flush_here=self._flush_here, alone=lambda: self.lone)

    def _covering(self) -> tuple[int, bool]:
        self.flushes += 1
        return self.group.commits, self.flushes in self.fail

    def _flush_here(self) -> None:
        covers, fails = self._covering()
        self.here += 1
        if fails:
            raise OSError(errno.EIO, "flush failed")
        self.durable_upto = max(self.durable_upto, covers)

    async def _flush(self) -> None:
        covers, fails = self._covering()
        await asyncio.sleep(0.001)
        if fails:
            raise OSError(errno.EIO, "flush failed")
        self.durable_upto = max(self.durable_upto, covers)

    async def commit(self) -> None:
        seq = self.group.count()
        await self.group.durable(seq)
        assert self.durable_upto >= seq, "durable() returned before a flush covered it"


def test_a_lone_committer_flushes_on_its_own_thread() -> None:
    async def main() -> Log:
        log = Log()
        for _ in range(5):
            await log.commit()
        return log

    log = asyncio.run(main())
    assert (log.flushes, log.here, log.group.flushed_here) == (5, 5, 5)


def test_committers_at_once_share_a_flush_on_the_thread() -> None:
    """Ten committers ready together: the first yields once, the others commit meanwhile,
    and one flush off the thread covers them all (none runs here: the first saw others
    commit, the rest found a flush in flight)."""

    async def main() -> Log:
        log = Log()
        await asyncio.gather(*(log.commit() for _ in range(10)))
        return log

    log = asyncio.run(main())
    assert log.here == 0
    assert log.flushes == 1


def test_not_alone_means_the_thread() -> None:
    """``alone()`` false (another task waits for the store): the flush goes to the thread."""

    async def main() -> Log:
        log = Log(alone=False)
        await log.commit()
        return log

    log = asyncio.run(main())
    assert (log.flushes, log.here) == (1, 0)


def test_a_slow_flush_sends_the_next_to_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush here that took longer than ``HERE_BELOW`` would hold the loop that long again:
    the next runs off it, and once one is quick again, the one after comes back."""
    monkeypatch.setattr(groupsync, "HERE_BELOW", 0.0005)

    async def main() -> tuple[int, int, int]:
        log = Log()
        slow = log._flush_here

        def slower() -> None:
            import time

            time.sleep(0.002)
            slow()

        log.group._flush_here = slower
        await log.commit()  # here, slow
        here_after_slow = log.here
        await log.commit()  # on the thread: 1 ms, still slow
        log.group.last_flush = 0.0  # as a quick one would leave it
        log.group._flush_here = slow
        await log.commit()
        return here_after_slow, log.here, log.flushes

    assert asyncio.run(main()) == (1, 2, 3)


def test_a_failed_flush_here_raises_and_the_next_call_flushes_again() -> None:
    async def main() -> Log:
        log = Log(fail={1})
        seq = log.group.count()
        with pytest.raises(OSError, match="flush failed"):
            await log.group.durable(seq)
        assert log.group.synced < seq
        await log.group.durable(seq)  # the next flush covers it
        assert log.durable_upto >= seq
        return log

    log = asyncio.run(main())
    assert log.flushes == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=12
    ),  # (yields before committing, alone), per committer
    st.sets(st.integers(1, 12), max_size=3),
)
def test_durable_never_returns_before_a_covering_flush(
    committers: list[tuple[int, bool]], fail: set[int]
) -> None:
    """Committers arriving at different turns of the loop, alone or not, some flushes
    failing: each ``durable`` either raises the flush's error or returns after a successful
    flush that began after its commit (``Log.commit`` checks it)."""

    async def one(log: Log, delay: int, alone: bool) -> None:
        for _ in range(delay):
            await asyncio.sleep(0)
        log.lone = alone
        try:
            await log.commit()
        except OSError as e:
            assert e.errno == errno.EIO

    async def main() -> None:
        log = Log(fail=fail)
        await asyncio.gather(*(one(log, d, a) for d, a in committers))
        for _ in range(len(fail) + 1):  # failed ones left commits behind: flush again
            try:
                await log.group.sync()
                break
            except OSError:
                pass
        assert log.durable_upto == log.group.commits

    asyncio.run(main())


def test_sqlite_lone_commits_flush_here_and_concurrent_ones_share(tmp_path: Path) -> None:
    """On the real store: one task committing durable transactions one after another
    fsyncs the WAL on the loop's thread each time; twenty tasks committing at once share
    a few fsyncs on the syncer thread instead of twenty."""

    async def main() -> tuple[int, int, int]:
        kv = await SQLiteKV.open(tmp_path / "m.db")
        syncs = WalSyncs(kv)
        try:
            for i in range(5):
                async with kv.transaction() as t:
                    await t.put(b"lone%d" % i, b"v")
            lone_here = kv._log.flushed_here

            async def put(i: int) -> None:
                async with kv.transaction() as t:
                    await t.put(b"many%d" % i, b"v")

            syncs.n = 0
            await asyncio.gather(*(put(i) for i in range(20)))
            return lone_here, syncs.n, len(await kv.scan(b""))
        finally:
            await kv.close()

    lone_here, shared_calls, keys = asyncio.run(main())
    assert lone_here == 5
    assert shared_calls < 10
    assert keys == 25
