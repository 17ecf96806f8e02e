"""How fast one LocalNode writes and reads chunks, beside the raw disk on the same file system.

    python -m bench.node_speed [--dir DIR] [--mib 256] [--runs 3]

Write: ``LocalNode(sync=True)`` (a file per chunk: O_EXCL create, pwritev, fdatasync, directory
fsync) with 1, 4 and 8 writes in flight, against a plain loop of ``os.pwrite`` + ``fdatasync``
of the same chunk size into one big file. Read: ``read_chunk`` from the page cache, against
``os.preadv`` of the big file into a reused buffer. Figures are medians of ``--runs`` runs after a
warm-up run; compare ratios within one run (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import google_crc32c

from tectonic_emu.chunkstore import LocalNode

MiB = 1 << 20


def median_rate(fn: Callable[[], float], nbytes: int, runs: int) -> float:
    """GB/s of ``fn`` (which returns its own elapsed seconds): warm-up, then median of runs."""
    fn()
    return statistics.median(nbytes / fn() / 1e9 for _ in range(runs))


def raw_write(path: str, chunk: bytes, count: int) -> float:
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        t = time.perf_counter()
        for i in range(count):
            os.pwrite(fd, chunk, i * len(chunk))
            os.fdatasync(fd)
        return time.perf_counter() - t
    finally:
        os.close(fd)


def raw_read(path: str, size: int, count: int, buf: mmap.mmap) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        view = memoryview(buf)[:size]
        t = time.perf_counter()
        for i in range(count):
            os.preadv(fd, [view], i * size)
        return time.perf_counter() - t
    finally:
        view.release()
        os.close(fd)


async def node_write(node: LocalNode, chunk: bytes, crc: int, count: int, depth: int) -> float:
    ids = iter(range(count))

    async def lane() -> None:
        for i in ids:
            await node.write_chunk(0, f"{i:08x}.0.00", chunk, crc32c=crc)

    t = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(depth):
            tg.create_task(lane())
    elapsed = time.perf_counter() - t
    await asyncio.gather(*(node.delete_chunk(0, f"{i:08x}.0.00") for i in range(count)))
    return elapsed


async def node_read(node: LocalNode, count: int, depth: int) -> float:
    ids = iter(range(count))

    async def lane() -> None:
        for i in ids:
            await node.read_chunk(0, f"{i:08x}.0.00")

    t = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(depth):
            tg.create_task(lane())
    return time.perf_counter() - t


def read_buffers(path: str, size: int, count: int) -> dict[str, float]:
    """One read (pread + CRC) into three kinds of buffer: why read_chunk returns bytes."""
    fd = os.open(path, os.O_RDONLY)
    pool = mmap.mmap(-1, size)
    pool.write(b"\1" * size)

    def fresh_bytes() -> None:
        for i in range(count):
            google_crc32c.value(os.pread(fd, size, i * size))

    def fresh_mmap() -> None:
        for i in range(count):
            m = mmap.mmap(-1, size)
            os.preadv(fd, [m], i * size)
            google_crc32c.value(m[:])  # google_crc32c takes bytes only: one copy
            m.close()

    def pooled_mmap() -> None:
        for i in range(count):
            os.preadv(fd, [pool], i * size)
            google_crc32c.value(pool[:])

    def timed(fn: Callable[[], None]) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    try:
        return {
            name: median_rate(partial(timed, fn), size * count, 3)
            for name, fn in [
                ("fresh bytes (os.pread)", fresh_bytes),
                ("fresh mmap + preadv", fresh_mmap),
                ("pooled mmap + preadv", pooled_mmap),
            ]
        }
    finally:
        pool.close()
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to write (a tmp dir)")
    ap.add_argument("--mib", type=int, default=256, help="MiB written per measured run")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="node-speed-", dir=args.dir)
    print(f"# {work}  ({args.mib} MiB per run, median of {args.runs})")
    executor = ThreadPoolExecutor(max_workers=16)  # as Cluster's io pool
    node = LocalNode(os.path.join(work, "node"), 0, 1, sync=True, executor=executor)
    fast = LocalNode(os.path.join(work, "fast"), 0, 1, sync=False, executor=executor)
    big = os.path.join(work, "big")
    try:
        print("\n## write (GB/s)")
        print(
            f"{'chunk':>6} {'raw pwrite+fdatasync':>21} {'sync d=1':>9} {'d=4':>6} {'d=8':>6}"
            f" {'nosync d=4':>11}"
        )
        for size in (1 * MiB, 4 * MiB, 8 * MiB):
            chunk = os.urandom(size)
            crc = google_crc32c.value(chunk)
            count = args.mib * MiB // size
            total = count * size
            row = [median_rate(partial(raw_write, big, chunk, count), total, args.runs)]
            for n, depth in [(node, 1), (node, 4), (node, 8), (fast, 4)]:
                row.append(
                    median_rate(partial(_write_run, n, chunk, crc, count, depth), total, args.runs)
                )
            print(
                f"{size // MiB:>4}Mi {row[0]:>21.2f} {row[1]:>9.2f} {row[2]:>6.2f} "
                f"{row[3]:>6.2f} {row[4]:>11.2f}"
            )

        print("\n## read from page cache, with CRC check (GB/s)")
        print(f"{'chunk':>6} {'raw preadv, no CRC':>24} {'d=1':>6} {'d=4':>6} {'d=8':>6}")
        buf = mmap.mmap(-1, 8 * MiB)
        buf.write(b"\1" * 8 * MiB)
        for size in (1 * MiB, 4 * MiB, 8 * MiB):
            chunk = os.urandom(size)
            crc = google_crc32c.value(chunk)
            count = args.mib * MiB // size
            total = count * size
            raw_write(big, chunk, count)
            asyncio.run(_fill(fast, chunk, crc, count))
            row = [median_rate(partial(raw_read, big, size, count, buf), total, args.runs)]
            for depth in (1, 4, 8):
                row.append(median_rate(partial(_read_run, fast, count, depth), total, args.runs))
            asyncio.run(_empty(fast, count))
            print(
                f"{size // MiB:>4}Mi {row[0]:>24.2f} {row[1]:>6.2f} {row[2]:>6.2f} {row[3]:>6.2f}"
            )
        buf.close()

        print("\n## read buffer choice, 4 MiB, one thread, pread + CRC (GB/s)")
        chunk = os.urandom(4 * MiB)
        raw_write(big, chunk, 32)
        for name, rate in read_buffers(big, 4 * MiB, 32).items():
            print(f"{name:>24} {rate:6.2f}")
    finally:
        asyncio.run(node.close())
        asyncio.run(fast.close())
        executor.shutdown()
        shutil.rmtree(work)


def _write_run(node: LocalNode, chunk: bytes, crc: int, count: int, depth: int) -> float:
    return asyncio.run(node_write(node, chunk, crc, count, depth))


def _read_run(node: LocalNode, count: int, depth: int) -> float:
    return asyncio.run(node_read(node, count, depth))


async def _fill(node: LocalNode, chunk: bytes, crc: int, count: int) -> None:
    await asyncio.gather(
        *(node.write_chunk(0, f"{i:08x}.0.00", chunk, crc32c=crc) for i in range(count))
    )


async def _empty(node: LocalNode, count: int) -> None:
    await asyncio.gather(*(node.delete_chunk(0, f"{i:08x}.0.00") for i in range(count)))


if __name__ == "__main__":
    main()
