"""Throughput of the coding layer: RS encode/decode, CRC32C, zstd.

    python -m bench.coding_speed [--block-mib 8] [--repeat 7]

Figures are GB/s of logical (block) bytes, the median of ``--repeat`` back-to-back runs after a
warm-up run, on page-aligned, already-touched buffers (this machine's first-touch and
misalignment quirks would otherwise dominate; see /work/shared/MACHINE.md). Rows marked
"fresh" allocate their outputs per call, as a caller without a buffer pool would.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from importlib.metadata import version

import google_crc32c
import zstandard

from tectonic_emu.coding import codec_for, crc32c, maybe_compress
from tectonic_emu.coding.reed_solomon import ReedSolomonCodec

ENCODINGS = ("rs-6-3", "rs-9-6", "rs-10-4")


def aligned(data: bytes) -> memoryview:
    """``data`` copied into a page-aligned, touched buffer."""
    buf = mmap.mmap(-1, max(len(data), 1))
    buf[: len(data)] = data
    return memoryview(buf)[: len(data)]


def gbps(nbytes: int, fn: Callable[[], object], repeat: int, inner: int = 1) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append(time.perf_counter() - start)
    return nbytes * inner / statistics.median(times) / 1e9


def threaded_gbps(nbytes: int, fns: list[Callable[[], object]], repeat: int, inner: int) -> float:
    """Aggregate GB/s with each fn run ``inner`` times in its own thread, all at once."""
    for fn in fns:
        fn()

    def loop(fn: Callable[[], object], barrier: threading.Barrier) -> None:
        barrier.wait()
        for _ in range(inner):
            fn()

    times = []
    for _ in range(repeat):
        barrier = threading.Barrier(len(fns) + 1)
        threads = [threading.Thread(target=loop, args=(fn, barrier)) for fn in fns]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        times.append(time.perf_counter() - start)
    return nbytes * inner * len(fns) / statistics.median(times) / 1e9


def gil_probe(fn: Callable[[], object], seconds: float = 1.0) -> tuple[float, float]:
    """(progress of a busy pure-Python thread while this thread loops on ``fn``, as a fraction
    of its progress alone; ``fn`` calls per second). Near 1.0 means ``fn`` releases the GIL."""
    counts = [0]
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            for _ in range(1000):
                n += 1
            counts[0] = n

    def run(work: Callable[[], object] | None) -> tuple[int, int]:
        counts[0] = 0
        stop.clear()
        spinner = threading.Thread(target=spin)
        spinner.start()
        calls = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            if work is None:
                time.sleep(0.001)
            else:
                work()
                calls += 1
        stop.set()
        spinner.join()
        return counts[0], calls

    alone, _ = run(None)
    beside, calls = run(fn)
    return beside / max(alone, 1), calls / seconds


def row(label: str, value: float) -> None:
    print(f"  {label:<56} {value:6.2f} GB/s", flush=True)


def gil_row(fn: Callable[[], object], nbytes: int) -> None:
    progress, rate = gil_probe(fn)
    print(
        f"  {'encode beside a busy Python thread':<56} {rate * nbytes / 1e9:6.2f} GB/s"
        f" (that thread keeps {progress:.0%} of its speed)",
        flush=True,
    )


def bench_rs(name: str, block_len: int, repeat: int) -> None:
    codec = codec_for(name)
    assert isinstance(codec, ReedSolomonCodec)
    d, p = codec.encoding.data, codec.encoding.parity
    s = codec.chunk_len(block_len)
    blocks = [aligned(os.urandom(block_len)) for _ in range(2)]
    pools = [[memoryview(mmap.mmap(-1, s)) for _ in range(p)] for _ in range(2)]
    chunks = [bytes(c) for c in codec.encode(blocks[0])]
    out = memoryview(mmap.mmap(-1, block_len))
    data_only = {i: aligned(chunks[i]) for i in range(d)}
    degraded = {i: aligned(chunks[i]) for i in range(p, d + p)}  # the first P data chunks lost

    def encode(i: int = 0) -> object:
        return codec.encode(blocks[i], parity_out=pools[i])

    print(f" {name}")
    row("encode, parity into pooled buffers", gbps(block_len, encode, repeat, 4))
    row("encode, fresh parity buffers", gbps(block_len, lambda: codec.encode(blocks[0]), repeat, 4))
    row("encode, 2 threads (aggregate)", threaded_gbps(
        block_len, [encode, lambda: encode(1)], repeat, 4))  # fmt: skip
    row("decode from the data chunks, into a pooled buffer", gbps(
        block_len, lambda: codec.decode(data_only, block_len, out=out), repeat, 4))  # fmt: skip
    row("decode from the data chunks, fresh bytes", gbps(
        block_len, lambda: codec.decode(data_only, block_len), repeat, 4))  # fmt: skip
    row(f"decode with {p} data chunks lost, into a pooled buffer", gbps(
        block_len, lambda: codec.decode(degraded, block_len, out=out), repeat, 4))  # fmt: skip
    row(f"decode with {p} data chunks lost, fresh bytearray", gbps(
        block_len, lambda: codec.decode(degraded, block_len), repeat, 4))  # fmt: skip
    gil_row(encode, block_len)


def bench_pyeclib(name: str, ec_type: str, block_len: int, repeat: int) -> None:
    from pyeclib.ec_iface import ECDriver

    enc = codec_for(name).encoding
    d, p = enc.data, enc.parity
    driver = ECDriver(k=d, m=p, ec_type=ec_type)
    data = os.urandom(block_len)
    frags = driver.encode(data)
    print(f" {name} ({ec_type})")
    row("encode", gbps(block_len, lambda: driver.encode(data), repeat, 4))
    row("encode, 2 threads (aggregate)", threaded_gbps(
        block_len, [lambda: driver.encode(data)] * 2, repeat, 4))  # fmt: skip
    row("decode from the data fragments", gbps(
        block_len, lambda: driver.decode(frags[:d]), repeat, 4))  # fmt: skip
    row(f"decode with {p} data fragments lost", gbps(
        block_len, lambda: driver.decode(frags[p:]), repeat, 4))  # fmt: skip
    gil_row(lambda: driver.encode(data), block_len)


def bench_crc(size: int, repeat: int) -> None:
    print(f"CRC32C, {size >> 20} MiB of random bytes")
    data = os.urandom(size)
    view = aligned(data)
    row("crc32c(bytes)", gbps(size, lambda: crc32c(data), repeat, 8))
    row("crc32c(memoryview of mmap), zero-copy", gbps(size, lambda: crc32c(view), repeat, 8))
    row("google_crc32c.value(bytes(view)) (the copy it needs)", gbps(
        size, lambda: google_crc32c.value(bytes(view)), repeat, 8))  # fmt: skip
    view2 = aligned(data)
    row("crc32c, 2 threads (aggregate)", threaded_gbps(
        size, [lambda: crc32c(view), lambda: crc32c(view2)], repeat, 8))  # fmt: skip


def bench_zstd(size: int, repeat: int) -> None:
    print(f"zstd level 1, {size >> 20} MiB")
    noise = os.urandom(size)
    rng = random.Random(0)
    words = [rng.randbytes(rng.randint(2, 9)).hex().encode() for _ in range(5000)]
    text = b" ".join(rng.choices(words, k=size // 8))[:size]
    row("maybe_compress(random, 'auto')  (sample only, stays raw)", gbps(
        size, lambda: maybe_compress(noise, "auto"), repeat, 8))  # fmt: skip
    row("maybe_compress(random, 'zstd')  (whole, stays raw)", gbps(
        size, lambda: maybe_compress(noise, "zstd"), repeat, 2))  # fmt: skip
    stored, _ = maybe_compress(text, "zstd")
    row(f"maybe_compress(text, 'auto')  (ratio {size / len(stored):.1f})", gbps(
        size, lambda: maybe_compress(text, "auto"), repeat, 2))  # fmt: skip
    dctx = zstandard.ZstdDecompressor()
    row("decompress(text)", gbps(size, lambda: dctx.decompress(stored), repeat, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-mib", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-pyeclib", action="store_true", help="skip the pyeclib comparison")
    args = parser.parse_args()
    block_len = args.block_mib << 20
    print(f"Reed-Solomon, {args.block_mib} MiB block (ISA-L through ctypes, Cauchy matrix)")
    for name in ENCODINGS:
        bench_rs(name, block_len, args.repeat)
    if not args.no_pyeclib:
        print(f"For comparison: pyeclib {version('pyeclib')} ECDriver, {args.block_mib} MiB block")
        for name, ec_type in (("rs-6-3", "isa_l_rs_vand"), ("rs-9-6", "isa_l_rs_cauchy")):
            bench_pyeclib(name, ec_type, block_len, args.repeat)
    bench_crc(block_len, args.repeat)
    bench_zstd(block_len, args.repeat)


if __name__ == "__main__":
    main()
