"""``tectonic-emu bench net``: does an emulated link deliver what it is set to?

A one-node cluster with the network model ``--nic-gbps X --rtt-ms Y --loss P``
(``tectonic_emu/chunkstore/netem.py``) and no fsync (so that the disk is not what is measured),
its node served by ``tectonic-emu node serve`` in a process of its own, and this process as the
client, each with its own paced NIC. Per round:

- **rtt**: ``pings`` pings on the heartbeat connection, one at a time: the median round trip;
- **write**: chunks of ``chunk`` random bytes written to the node with ``depth`` in flight for
  ``seconds``: bytes over wall time (the chunk payloads only, as a user counts them). The
  default depth is twice the link's bandwidth-delay product in chunks (at least 8), so that
  the window does not bound the rate;
- **read**: the chunks just written read back the same way.

Each figure is set beside its setting: the link's payload rate is the NIC rate less the frame
headers (32 bytes and a little meta a chunk), and the round trip is the setting plus what the
same pings take on an unpaced link here (measured first, ``base_rtt_ms``). ``within_10pct``
says whether each is within 10% of its setting. Delays are kept to the nearest millisecond
(``netem.hold``), and the two processes' timers add about a millisecond more to a round trip
here: a round trip of 20 ms (the default) measures within 10%, one of 2 ms does not. Loss is
a model, not a measurement: the
figures with ``--loss`` show what it costs (see netem.py for what a lost segment costs).

JSON (``NetBench.to_dict()``, schema ``docs/schemas/bench-net.schema.json``): the settings
(``nic_gbps``, ``rtt_ms``, ``loss``), ``chunk``, ``depth``, ``seconds``, ``runs``;
``base_rtt_ms`` (unpaced median ping); per figure the median over runs and every run
(``rtt_ms``/``rtt_runs_ms``, ``write_gbps``/``write_runs_gbps``, ``read_gbps``/
``read_runs_gbps``), the expected values (``expected_rtt_ms``, ``expected_gbps``: the NIC
rate less the framing; 0 when unlimited), the ratios measured/expected (``rtt_ratio``,
``write_ratio``, ``read_ratio``; null when unlimited) and ``within_10pct`` (figure -> bool).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.schema import schema_of
from bench.tables import with_legend
from tectonic_emu import Cluster
from tectonic_emu.chunkstore.remote import RemoteNode
from tectonic_emu.chunkstore.wire import HEADER_SIZE
from tectonic_emu.coding import crc32c
from tectonic_emu.errors import InvalidArgumentError
from tectonic_emu.served import read_address

META_BYTES = 24  # a chunk write's meta: disk, flags and the chunk id (wire.py)
MAX_CHUNKS = 100_000  # written per round at most, whatever the rate
NODE_SERVE = [sys.executable, "-m", "tectonic_emu", "node", "serve"]


@dataclass(slots=True)
class NetBench:
    nic_gbps: float
    rtt_ms: float
    loss: float
    chunk: int
    depth: int
    seconds: float
    runs: int
    base_rtt_ms: float
    rtt_ms_measured: float
    write_gbps: float
    read_gbps: float
    expected_rtt_ms: float
    expected_gbps: float
    rtt_ratio: float | None
    write_ratio: float | None
    read_ratio: float | None
    within_10pct: dict[str, bool]
    rtt_runs_ms: list[float] = field(default_factory=list)
    write_runs_gbps: list[float] = field(default_factory=list)
    read_runs_gbps: list[float] = field(default_factory=list)
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _median_ping(node: RemoteNode, pings: int) -> float:
    rtts = []
    for _ in range(pings):
        t0 = time.perf_counter()
        await node.ping()
        rtts.append(time.perf_counter() - t0)
    return statistics.median(rtts) * 1000


async def _stream(
    jobs: int, depth: int, seconds: float, one: Callable[[int], Any]
) -> tuple[int, float]:
    """Run ``one(k)`` for k = 0, 1, ... with ``depth`` in flight, for about ``seconds`` (and
    at most ``jobs`` calls); (calls done, wall seconds)."""
    done = 0
    nxt = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def worker() -> None:
        nonlocal done, nxt
        while nxt < jobs and time.perf_counter() < deadline:
            k = nxt
            nxt += 1
            await one(k)
            done += 1

    await asyncio.gather(*(worker() for _ in range(depth)))
    return done, time.perf_counter() - t0


async def _round(
    root: Path, chunk: int, depth: int, seconds: float, pings: int, payload: memoryview
) -> tuple[float, float, float]:
    """(median ping ms, write Gb/s, read Gb/s) of one round on the cluster at ``root``."""
    async with Cluster.open(root) as cluster:
        node = cluster.nodes[0]
        assert isinstance(node, RemoteNode)
        rtt = await _median_ping(node, pings)
        stamp = f"{os.getpid():x}{time.monotonic_ns():x}"
        written: list[tuple[int, str]] = []  # (disk, chunk id)
        crc = crc32c(payload)

        async def write(k: int) -> None:
            chunk_id = f"{stamp}{k:08x}"
            await node.write_chunk(k % node.disks, chunk_id, payload, crc32c=crc)
            written.append((k % node.disks, chunk_id))

        n, secs = await _stream(MAX_CHUNKS, depth, seconds, write)
        write_gbps = n * chunk * 8 / secs / 1e9
        bufs = [memoryview(bytearray(chunk)) for _ in range(depth)]
        spare = list(bufs)

        async def read(k: int) -> None:
            buf = spare.pop()
            try:
                disk, chunk_id = written[k % len(written)]
                await node.read_chunk_into(disk, chunk_id, buf)
            finally:
                spare.append(buf)

        n, secs = await _stream(len(written) * 4, depth, seconds, read)
        read_gbps = n * chunk * 8 / secs / 1e9
        for disk, chunk_id in written:
            await node.delete_chunk(disk, chunk_id)
        return rtt, write_gbps, read_gbps


def _serve(root: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*NODE_SERVE, "--cluster", str(root), "--node", "0"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    deadline = time.monotonic() + 30
    while read_address(root, 0) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the node did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def run_net_bench(
    *,
    directory: Path,
    nic_gbps: float = 1.0,
    rtt_ms: float = 20.0,
    loss: float = 0.0,
    chunk: int = 1 << 20,
    depth: int = 0,
    seconds: float = 3.0,
    runs: int = 3,
    pings: int = 50,
    step: Callable[..., None] = lambda *_: None,
) -> NetBench:
    """Measure a paced link against its settings (module docstring). Raises
    InvalidArgumentError for bad settings."""
    if chunk < 4096 or depth < 0 or seconds <= 0 or runs < 1 or pings < 1:
        raise InvalidArgumentError("chunk >= 4096, runs and pings >= 1, depth >= 0, seconds > 0")
    if depth == 0:
        # Twice the bandwidth-delay product in flight, so that the window is not the limit
        # (Little's law: depth x chunk / round trip bounds the rate).
        in_flight = nic_gbps * 1e9 / 8 * (rtt_ms + 1) / 1000
        depth = max(8, 2 * math.ceil(in_flight / chunk))
    work = Path(tempfile.mkdtemp(prefix="tectonic-net-bench-", dir=directory))
    try:
        payload = memoryview(os.urandom(chunk))
        base = work / "unpaced"
        Cluster.create(base, nodes=1, disks_per_node=1, encoding="r1", sync=False)
        step("an unpaced link: its round trip")
        proc = await asyncio.to_thread(_serve, base, work / "unpaced.log")
        try:
            base_rtt, _, _ = await _round(base, chunk, 1, 0.0, pings, payload)
        finally:
            await asyncio.to_thread(_stop, proc)
        root = work / "paced"
        Cluster.create(
            root,
            nodes=1,
            disks_per_node=2,
            encoding="r1",
            sync=False,
            block_size=max(chunk, 4096),
            nic_gbps=nic_gbps,
            rtt_ms=rtt_ms,
            loss=loss,
        )
        proc = await asyncio.to_thread(_serve, root, work / "paced.log")
        rtts, writes, reads = [], [], []
        try:
            for r in range(runs):
                step(f"run {r + 1}/{runs}: pings, writes, reads", r / runs)
                rtt, w, rd = await _round(root, chunk, depth, seconds, pings, payload)
                rtts.append(round(rtt, 4))
                writes.append(round(w, 4))
                reads.append(round(rd, 4))
        finally:
            await asyncio.to_thread(_stop, proc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    expected_rtt = rtt_ms + base_rtt
    framing = chunk / (chunk + HEADER_SIZE + META_BYTES)
    expected_gbps = nic_gbps * framing
    rtt_m, w_m, r_m = (statistics.median(v) for v in (rtts, writes, reads))

    def ratio(measured: float, expected: float) -> float | None:
        return round(measured / expected, 3) if expected else None

    ratios = {
        "rtt": ratio(rtt_m, expected_rtt),
        "write": ratio(w_m, expected_gbps),
        "read": ratio(r_m, expected_gbps),
    }
    return NetBench(
        nic_gbps=nic_gbps,
        rtt_ms=rtt_ms,
        loss=loss,
        chunk=chunk,
        depth=depth,
        seconds=seconds,
        runs=runs,
        base_rtt_ms=round(base_rtt, 4),
        rtt_ms_measured=round(rtt_m, 4),
        write_gbps=round(w_m, 4),
        read_gbps=round(r_m, 4),
        expected_rtt_ms=round(expected_rtt, 4),
        expected_gbps=round(expected_gbps, 4),
        rtt_ratio=ratios["rtt"],
        write_ratio=ratios["write"],
        read_ratio=ratios["read"],
        within_10pct={k: v is not None and abs(v - 1) <= 0.1 for k, v in ratios.items()},
        rtt_runs_ms=rtts,
        write_runs_gbps=writes,
        read_runs_gbps=reads,
    )


def table(res: NetBench) -> Table:
    t = Table(
        title=f"bench net: a link set to {res.nic_gbps:g} Gb/s, {res.rtt_ms:g} ms round trip, "
        f"loss {res.loss:g}; {res.chunk >> 10} KiB chunks, {res.depth} in flight, "
        f"{res.runs} runs (median)"
    )
    for col in ("figure", "measured", "expected", "ratio", "within 10%"):
        t.add_column(col, justify="right")
    rows = (
        ("round trip, ms", res.rtt_ms_measured, res.expected_rtt_ms, res.rtt_ratio, "rtt"),
        ("write, Gb/s", res.write_gbps, res.expected_gbps, res.write_ratio, "write"),
        ("read, Gb/s", res.read_gbps, res.expected_gbps, res.read_ratio, "read"),
    )
    for name, measured, expected, ratio, key in rows:
        t.add_row(
            name,
            f"{measured:.3f}",
            f"{expected:.3f}" if expected else "unlimited",
            "-" if ratio is None else f"{ratio:.2f}",
            "yes" if res.within_10pct[key] else "no",
        )
    return with_legend(
        t,
        "ratio = measured / expected. Expected: for the round trip, the setting plus the "
        f"unpaced round trip measured first ({res.base_rtt_ms:.3f} ms here); for a rate, the "
        "NIC rate less the frame headers.",
    )


def plot(res: NetBench, directory: Path) -> list[Path]:
    """``net.png``: each figure's measured / expected ratio."""
    from clients.plotting import bars

    labels = ["round trip", "write", "read"]
    values = [res.rtt_ratio or 0.0, res.write_ratio or 0.0, res.read_ratio or 0.0]
    return [
        bars(
            directory / "net.png",
            title=f"bench net: measured / set ({res.nic_gbps:g} Gb/s, {res.rtt_ms:g} ms)",
            labels=labels,
            series={"measured / expected": values},
            ylabel="ratio",
        )
    ]


SCHEMA = schema_of(NetBench, "tectonic-emu/bench-net/1", "tectonic-emu bench net --json")

__all__ = ["SCHEMA", "NetBench", "plot", "run_net_bench", "table"]
