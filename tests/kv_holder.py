"""A process that holds a metadata transaction until told to go on, for the lease tests
(``test_sqlite_lease.py``, ``test_metadata_postgres.py``): it reads ``k`` (taking the lock or
lease), writes it, prints ``holding`` and waits for a line on stdin (the tests SIGSTOP it
there). Then it commits and prints ``committed``, or prints ``refused: ERRNO LINE`` and exits 3.

    python -m tests.kv_holder sqlite PATH LEASE
    python -m tests.kv_holder postgres URL LEASE TABLE
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tectonic_emu.metadata import KVStore, PostgresKV, SQLiteKV

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def stopped_holder(*args: str, stop: bool = True) -> Iterator[subprocess.Popen[str]]:
    """A holder process (``args`` as on its command line), SIGSTOPped (with ``stop``) once it
    holds its transaction; killed at the end if it still runs."""
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.kv_holder", *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        if stop:
            os.kill(holder.pid, signal.SIGSTOP)
        yield holder
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait()


def resume_refused(holder: subprocess.Popen[str]) -> str:
    """SIGCONT the holder and check that its commit was refused for its lease, nothing of it
    committed; its output."""
    os.kill(holder.pid, signal.SIGCONT)
    out, _ = holder.communicate("go on\n", timeout=60)
    assert holder.returncode == 3, out
    assert "lease" in out and "nothing of it committed" in out, out
    return out


async def hold(store: KVStore) -> None:
    try:
        async with store.transaction() as t:
            await t.get(b"k")  # takes the lock (the lease)
            await t.put(b"k", b"from the stopped holder")
            print("holding", flush=True)
            await asyncio.to_thread(sys.stdin.readline)  # SIGSTOPped in here
    except OSError as exc:
        print("refused:", exc.errno, exc, flush=True)
        raise SystemExit(3) from None
    finally:
        await store.close()
    print("committed", flush=True)


def main() -> None:
    kind, where, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if kind == "sqlite":
        store: KVStore = SQLiteKV(where, lease=lease)
    else:
        store = PostgresKV(where, table=sys.argv[4], lease=lease)
    asyncio.run(hold(store))


if __name__ == "__main__":
    main()
