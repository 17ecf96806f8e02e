"""A process that holds a metadata transaction until told to go on, for the lease tests
(``test_sqlite_lease.py``, ``test_metadata_postgres.py``): it reads ``k`` (taking the lock or
lease), writes it, prints ``holding`` and waits for a line on stdin (the tests SIGSTOP it
there). Then it commits and prints ``committed``, or prints ``refused: ERRNO LINE`` and exits 3.

    python -m tests.kv_holder sqlite PATH LEASE
    python -m tests.kv_holder postgres URL LEASE TABLE
"""

from __future__ import annotations

import asyncio
import sys

from tectonic_emu.metadata import KVStore, PostgresKV, SQLiteKV


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
