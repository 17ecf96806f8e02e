"""``tectonic-emu cluster status``: what every node holds and how many blocks lack full
redundancy, read from the nodes and the Block layer."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tectonic_emu.chunkstore import StorageNode
from tectonic_emu.chunkstore.remote import RemoteNode
from tectonic_emu.coding import Encoding
from tectonic_emu.config import ClusterConfig
from tectonic_emu.errors import NodeUnavailableError
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.metadata.records import BlockRecord
from tectonic_emu.nodectl import STOP_MARKER, node_dir, read_address
from tectonic_emu.placement import spread_is_short
from tectonic_emu.qos.node import merged
from tectonic_emu.qos.stats import GroupStats


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node: int
    up: bool
    # None while the node is down: a stopped node answers nothing, not even its usage.
    chunks: int | None
    bytes_used: int | None
    bytes_free: int | None
    state: str = "up"  # up, down (not answering), stopped (taken out of service)
    # Served mode only: where the node listens, its process, and the last heartbeat.
    address: str | None = None
    pid: int | None = None
    heartbeat_ms: float | None = None
    down_reason: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    path: str
    nodes: list[NodeStatus]
    files: int
    blocks: int
    logical_bytes: int  # sum of file sizes
    physical_bytes: int  # sum of stored chunk bytes the Block layer references
    blocks_below_redundancy: int
    encoding: str
    block_size: int
    sync: bool
    served: bool = False
    # Each tenant's usage and quotas (docs/tenants.md): name, files_used, bytes_used,
    # quota_files, quota_bytes (None: no limit).
    tenants: list[dict[str, Any]] = field(default_factory=list)
    # What the served nodes' fair queues counted (docs/qos.md): per node, its mode ("fair":
    # None without a scheduler), each group's figures on its disks and, with an emulated
    # NIC, on its replies ("nic"); "groups", the disks' merged over nodes.
    qos: dict[str, Any] = field(default_factory=lambda: {"nodes": [], "groups": {}})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def qos_status(nodes: Sequence[StorageNode]) -> dict[str, Any]:
    """Each served node's scheduler figures, and every group's over all of them."""
    per_node: list[dict[str, Any]] = []
    snapshots: list[dict[str, Any]] = []
    for node in nodes:
        if not isinstance(node, RemoteNode) or not node.available:
            continue
        try:
            snap = await node.qos_stats()
        except NodeUnavailableError:
            continue
        if snap is None:
            per_node.append({"node": node.node_id, "fair": None, "depth": None, "groups": {}})
            continue
        snapshots.append(snap)
        groups = {g: s.summary() for g, s in merged([snap]).items()}
        nic = {g: GroupStats.from_dict(raw).summary() for g, raw in snap.get("nic", {}).items()}
        per_node.append(
            {"node": node.node_id, "fair": snap["fair"], "depth": snap["depth"], "groups": groups}
            | ({"nic": nic} if nic else {})
        )
    return {"nodes": per_node, "groups": {g: s.summary() for g, s in merged(snapshots).items()}}


async def cluster_status(
    path: Path,
    config: ClusterConfig,
    nodes: Sequence[StorageNode],
    meta: Metadata,
    *,
    domains: Sequence[str] | None,
    served: bool,
) -> ClusterStatus:
    """Nodes, logical and physical bytes, and how many blocks lack full redundancy:
    a chunk missing, on a node that is down, or sharing a node with another chunk."""
    present: dict[tuple[int, int], set[str]] = {}
    node_status = []
    for node in nodes:
        where: dict[str, Any] = {}
        if isinstance(node, RemoteNode):
            addr = read_address(path, node.node_id)
            fixed = config.address_of(node.node_id)
            ping = node.last_ping
            where = {
                "address": config.node_addresses[node.node_id]
                if fixed
                else (f"{addr.host}:{addr.port}" if addr else None),
                "pid": addr.pid if addr else None,
                "heartbeat_ms": round(ping.rtt * 1000, 3) if ping and node.available else None,
                "down_reason": node.down_reason or None,
            }
        usage = None
        if node.available:
            with contextlib.suppress(NodeUnavailableError):
                usage = await node.usage()
        if usage is None:
            stopped = (node_dir(path, node.node_id) / STOP_MARKER).exists()
            state = "stopped" if stopped else "down"
            node_status.append(NodeStatus(node.node_id, False, None, None, None, state, **where))
            continue
        node_status.append(
            NodeStatus(
                node.node_id,
                True,
                sum(u.chunks for u in usage),
                sum(u.bytes_used for u in usage),
                sum(u.bytes_free for u in usage),
                "up",
                **where,
            )
        )
        for d in range(node.disks):
            with contextlib.suppress(NodeUnavailableError):
                present[(node.node_id, d)] = {c.chunk_id for c in await node.list_chunks(d)}
    blocks = below = physical = 0
    async for rec in meta.iter_blocks():
        blocks += 1
        physical += sum(c.stored_len for c in rec.chunks)
        if not block_fully_redundant(rec, present, domains):
            below += 1
    files = logical = 0
    async for f in meta.iter_files():
        if f.parent is not None:
            files += 1
            logical += f.size
    async with meta.view() as m:
        tenants = [
            {"name": t.name, "files_used": t.files_used, "bytes_used": t.bytes_used,
             "quota_files": t.quota_files, "quota_bytes": t.quota_bytes}
            for t in sorted(await m.tenants.all(), key=lambda t: t.name)
        ]  # fmt: skip
    return ClusterStatus(
        str(path),
        node_status,
        files,
        blocks,
        logical,
        physical,
        below,
        config.encoding,
        config.block_size,
        config.sync,
        served,
        tenants,
        await qos_status(nodes),
    )


def block_fully_redundant(
    rec: BlockRecord,
    present: dict[tuple[int, int], set[str]],
    domains: Sequence[str] | None = None,
) -> bool:
    """All ``width`` chunks present, on distinct nodes that are up, spread over the failure
    ``domains`` (hosts) as evenly as their nodes allow (``placement.spread_is_short``)."""
    width = Encoding.parse(rec.encoding).width
    if rec.length > 0 and len(rec.chunks) < width:
        return False
    nodes = [c.node for c in rec.chunks]
    if len(set(nodes)) != len(nodes):
        return False
    if spread_is_short(nodes, domains):
        return False
    return all(c.chunk_id in present.get((c.node, c.disk), ()) for c in rec.chunks)


__all__ = ["ClusterStatus", "NodeStatus", "block_fully_redundant", "cluster_status"]
