"""Counting a ``SQLiteKV``'s fsyncs of its write-ahead log, on whichever thread they run
(the syncer's, or the loop's for a lone committer: ``tectonic_emu/groupsync.py``)."""

from __future__ import annotations

from tectonic_emu.metadata import SQLiteKV


class WalSyncs:
    """Replaces ``kv._sync_wal`` with a counting wrapper of it; ``n`` is the count."""

    def __init__(self, kv: SQLiteKV) -> None:
        self.n = 0
        real = kv._sync_wal

        def counted() -> None:
            self.n += 1
            real()

        kv._sync_wal = counted  # type: ignore[method-assign]
