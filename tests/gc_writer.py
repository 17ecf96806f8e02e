"""A writer process for ``test_gc_fencing.py``: appends ``served_writer.record(SEED, k)`` to one
file, flushing after every record, with a chosen write lease.

    python -m tests.gc_writer ROOT PATH SEED PROGRESS --lease SECONDS --stop FILE

Every flush that returns appends ``"<records> <bytes>"`` to PROGRESS (``served_writer``'s
format: those bytes are committed and durable). Once FILE exists it closes (seals) the file and
appends ``"closed <records> <bytes>"``. A writer fenced by garbage collection exits 1 with the
error on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from tectonic_emu import Cluster
from tectonic_emu.errors import TectonicError

from .served_writer import record


async def write(root: Path, path: str, seed: int, progress: Path, stop: Path, lease: float) -> None:
    async with Cluster.open(root) as cluster:
        client = cluster.client()
        client.write_lease = lease
        with progress.open("a") as out:
            k = 0
            async with client.open_writer(path) as w:
                while not stop.exists():  # noqa: ASYNC240 (a stat between flushes)
                    await w.append(record(seed, k))
                    k += 1
                    await w.flush()
                    out.write(f"{k} {w.offset}\n")
                    out.flush()
            out.write(f"closed {k} {w.offset}\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root", type=Path)
    p.add_argument("path")
    p.add_argument("seed", type=int)
    p.add_argument("progress", type=Path)
    p.add_argument("--lease", type=float, required=True)
    p.add_argument("--stop", type=Path, required=True)
    a = p.parse_args()
    try:
        asyncio.run(write(a.root, a.path, a.seed, a.progress, a.stop, a.lease))
    except TectonicError as e:
        sys.exit(f"gc_writer: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
