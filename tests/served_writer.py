"""A writer process for ``test_served.py``: appends records to one file of a cluster, flushing
after every second record, and reports each acknowledged size.

    python -m tests.served_writer ROOT PATH SEED PROGRESS [--stop FILE] [--records N]

Every flush that returns appends ``"<records> <bytes>"`` to PROGRESS: those bytes are durable
and committed. The writer stops after N records, or (with ``--stop``) once FILE exists, then
closes (seals) the file and appends ``"closed <records> <bytes>"``. Record ``k`` of seed ``s`` is
``record(s, k)``, so the test can recompute every byte.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

from tectonic_emu import Cluster
from tectonic_emu.errors import TectonicError

MAX_RECORD = 100 << 10  # more than a 64 KiB block: some records span blocks


def record(seed: int, k: int) -> bytes:
    rnd = random.Random(seed * 1_000_003 + k)
    return rnd.randbytes(rnd.randrange(1, MAX_RECORD))


def stream(seed: int, records: int) -> bytes:
    return b"".join(record(seed, k) for k in range(records))


def acknowledged(progress: Path) -> tuple[int, int, bool]:
    """(records, bytes) of the last flush or close PROGRESS reports, and whether it closed."""
    records = size = 0
    closed = False
    text = progress.read_text() if progress.exists() else ""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):  # being written
            break
        words = line.split()
        closed = words[0] == "closed"
        records, size = int(words[-2]), int(words[-1])
    return records, size, closed


def told_to_stop(stop: Path | None) -> bool:
    return stop is not None and stop.exists()


async def write(
    root: Path, path: str, seed: int, progress: Path, stop: Path | None, records: int
) -> None:
    async with Cluster.open(root) as cluster:
        client = cluster.client()
        with progress.open("a") as out:
            written = 0
            async with client.open_writer(path) as w:
                for k in range(records):
                    if k % 2 == 0 and told_to_stop(stop):
                        break
                    await w.append(record(seed, k))
                    written = k + 1
                    if k % 2 == 1:
                        await w.flush()
                        out.write(f"{written} {w.offset}\n")
                        out.flush()
            out.write(f"closed {written} {w.offset}\n")


def main() -> None:
    """Exits 1 with one line on stderr when the writer fails (e.g. every node is down)."""
    p = argparse.ArgumentParser()
    p.add_argument("root", type=Path)
    p.add_argument("path")
    p.add_argument("seed", type=int)
    p.add_argument("progress", type=Path)
    p.add_argument("--stop", type=Path, default=None)
    p.add_argument("--records", type=int, default=100_000)
    a = p.parse_args()
    try:
        asyncio.run(write(a.root, a.path, a.seed, a.progress, a.stop, a.records))
    except TectonicError as e:
        sys.exit(f"served_writer: {e!r}")


if __name__ == "__main__":
    main()
