"""The main job, end to end: every encoding stored and read back, a node lost and repaired.

``tectonic-emu demo`` runs it on a fresh embedded cluster and prints a summary.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tectonic_emu.client import Client
from tectonic_emu.cluster import Cluster
from tectonic_emu.coding import KNOWN_ENCODINGS, Encoding
from tectonic_emu.coding.synthetic import real_bytes
from tectonic_emu.services import repair


@dataclass(slots=True)
class EncodingResult:
    encoding: str
    bytes: int
    overhead: float
    write_mb_s: float
    read_mb_s: float
    verified: bool
    verified_after_node_loss: bool = False


@dataclass(slots=True)
class DemoReport:
    cluster: str
    nodes: int
    results: list[EncodingResult] = field(default_factory=list)
    stopped_node: int = -1
    # The encodings the stopped node held chunks of; r1 never (one copy survives no loss).
    stopped_node_encodings: list[str] = field(default_factory=list)
    below_redundancy_after_loss: int = 0
    repaired_blocks: int = 0
    below_redundancy_after_repair: int = 0  # still down: encodings as wide as the cluster wait
    below_redundancy_after_restart: int = 0  # node back, repaired again: must be 0
    all_verified: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def run_demo(
    path: str | os.PathLike[str] | None = None,
    *,
    size: int = 48 << 20,
    step: Callable[[str], None] = lambda _: None,
) -> DemoReport:
    """Create a cluster (in a temporary directory unless ``path`` is given), write and read
    ``size`` random bytes with each of the paper's encodings, stop the node holding the most
    chunks, read everything back, repair, and report."""
    with tempfile.TemporaryDirectory(prefix="tectonic-demo-") as tmp:
        root = Path(path) if path is not None else Path(tmp) / "cluster"
        widest = max(Encoding.parse(e).width for e in KNOWN_ENCODINGS)
        Cluster.create(root, nodes=widest, disks_per_node=2, encoding="rs-6-3")
        data = os.urandom(size)
        digest = hashlib.sha256(data).hexdigest()
        report = DemoReport(str(root), widest)
        async with Cluster.open(root) as cluster:
            client = cluster.client()
            await client.mkdir("/demo", exist_ok=True)
            for name in KNOWN_ENCODINGS:
                step(f"write and read {name}")
                t0 = time.perf_counter()
                await client.write_file(f"/demo/{name}.bin", data, encoding=name)
                t1 = time.perf_counter()
                back = await client.read_file(f"/demo/{name}.bin")
                t2 = time.perf_counter()
                report.results.append(
                    EncodingResult(
                        name,
                        size,
                        Encoding.parse(name).overhead,
                        size / (t1 - t0) / 1e6,
                        size / (t2 - t1) / 1e6,
                        hashlib.sha256(real_bytes(back)).hexdigest() == digest,
                    )
                )
            victim, held = await _victim(cluster, client)
            report.stopped_node_encodings = held
            step(f"stop node {victim} and read everything back")
            cluster.stop_node(victim)
            report.stopped_node = victim
            for r in report.results:
                back = await client.read_file(f"/demo/{r.encoding}.bin")
                r.verified_after_node_loss = hashlib.sha256(real_bytes(back)).hexdigest() == digest
            report.below_redundancy_after_loss = (await cluster.status()).blocks_below_redundancy
            step("repair")
            rep = await repair(cluster, gc_grace=0)
            report.repaired_blocks = rep.blocks_repaired
            report.below_redundancy_after_repair = (await cluster.status()).blocks_below_redundancy
            step(f"start node {victim} again and repair")
            cluster.start_node(victim)
            await repair(cluster, gc_grace=0)  # the returning node's stale chunks are garbage
            report.below_redundancy_after_restart = (await cluster.status()).blocks_below_redundancy
        report.all_verified = all(r.verified and r.verified_after_node_loss for r in report.results)
        return report


async def _victim(cluster: Cluster, client: Client) -> tuple[int, list[str]]:
    """The node to lose, and the encodings it holds chunks of: r1 keeps one copy and
    survives no loss, so a node holding none of r1 that holds chunks of as many other
    encodings as any does (then the most chunks)."""
    holds: dict[int, set[str]] = {}
    for name in KNOWN_ENCODINGS:
        for b in await client.layout(f"/demo/{name}.bin"):
            for ch in b.chunks:
                holds.setdefault(ch.node, set()).add(name)
    chunks = {n.node: n.chunks or 0 for n in (await cluster.status()).nodes}
    candidates = [n for n in chunks if "r1" not in holds.get(n, set())]
    victim = max(candidates, key=lambda n: (len(holds.get(n, ())), chunks[n]))
    return victim, [e for e in KNOWN_ENCODINGS if e in holds.get(victim, set())]


__all__ = ["DemoReport", "EncodingResult", "run_demo"]
