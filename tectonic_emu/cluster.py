"""Create and open a cluster: a directory holding its config, metadata and nodes.

Layout::

    DIR/cluster.json          ClusterConfig
    DIR/metadata.db           SQLite (WAL): the Name, File and Block layers
    DIR/nodes/n000/d0/...     node 0, disk 0: chunk files
    DIR/nodes/n000/STOPPED    present while node 0 is out of service

In embedded mode one process owns the cluster at a time (the CLI opens it per command).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tectonic_emu.chunkstore import LocalNode, StorageNode
from tectonic_emu.client import Client
from tectonic_emu.coding import Encoding
from tectonic_emu.config import (
    CONFIG_FILE,
    DEFAULT_BLOCK_SIZE,
    METADATA_FILE,
    ClusterConfig,
    Compression,
)
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import AlreadyExistsError, InvalidArgumentError
from tectonic_emu.metadata import SQLiteKV
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.metadata.records import BlockRecord

STOP_MARKER = "STOPPED"
# Threads for blocking chunk I/O, shared by all nodes of the cluster. Chunk writes block in
# fdatasync most of their time, so more threads than cores keep the disk queue full.
IO_THREADS = 32


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node: int
    up: bool
    # None while the node is down: a stopped node answers nothing, not even its usage.
    chunks: int | None
    bytes_used: int | None
    bytes_free: int | None


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Cluster:
    """An open cluster. Use ``Cluster.create`` once, then ``async with Cluster.open(dir)``."""

    def __init__(
        self,
        path: Path,
        config: ClusterConfig,
        meta: Metadata,
        nodes: list[StorageNode],
        io_pool: ThreadPoolExecutor,
        cpu_pool: ThreadPoolExecutor,
    ) -> None:
        self.path = path
        self.config = config
        self.meta = meta
        self.nodes = nodes
        self._io_pool = io_pool
        self._cpu_pool = cpu_pool
        self.datapath = DataPath(
            nodes,
            disks_per_node=config.disks_per_node,
            compression=config.compression,
            cpu=cpu_pool,
        )

    # -- lifecycle ---------------------------------------------------------------------------
    @staticmethod
    def create(
        path: str | os.PathLike[str],
        *,
        nodes: int = 9,
        disks_per_node: int = 2,
        encoding: str = "rs-6-3",
        block_size: int = DEFAULT_BLOCK_SIZE,
        sync: bool = True,
        compression: Compression = "auto",
    ) -> ClusterConfig:
        """Make a new cluster in ``path`` (created if missing; must not hold a cluster).

        Raises AlreadyExistsError, UnknownEncodingError, InvalidArgumentError.
        """
        root = Path(path)
        Encoding.parse(encoding)
        config = ClusterConfig(
            nodes=nodes,
            disks_per_node=disks_per_node,
            encoding=Encoding.parse(encoding).name,
            block_size=block_size,
            sync=sync,
            compression=compression,
            created=time.time(),
        )
        if (root / CONFIG_FILE).exists():
            raise AlreadyExistsError("a cluster already exists here", str(root))
        if root.exists() and not root.is_dir():
            raise InvalidArgumentError("not a directory", str(root))
        root.mkdir(parents=True, exist_ok=True)
        for n in range(nodes):
            for d in range(disks_per_node):
                (node_dir(root, n) / f"d{d}").mkdir(parents=True, exist_ok=True)
        config.save(root)  # last: a cluster.json means the cluster is complete
        return config

    @classmethod
    @asynccontextmanager
    async def open(cls, path: str | os.PathLike[str]) -> AsyncIterator[Cluster]:
        """Open an existing cluster for the duration of the ``async with`` block.

        Raises ClusterNotFoundError when ``path`` holds no cluster.
        """
        root = Path(path)
        config = ClusterConfig.load(root)
        io_pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="tectonic-io")
        cpu_pool = ThreadPoolExecutor(
            max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="tectonic-cpu"
        )
        kv = SQLiteKV(root / METADATA_FILE, synchronous="full" if config.sync else "normal")
        nodes: list[StorageNode] = []
        try:
            meta = Metadata(kv)
            await meta.ensure_root(time.time())
            for n in range(config.nodes):
                node = LocalNode(
                    node_dir(root, n), n, config.disks_per_node, sync=config.sync, executor=io_pool
                )
                node.available = not (node_dir(root, n) / STOP_MARKER).exists()
                nodes.append(node)
            yield cls(root, config, meta, nodes, io_pool, cpu_pool)
        finally:
            for opened in nodes:
                await opened.close()
            await kv.close()
            io_pool.shutdown(wait=True)
            cpu_pool.shutdown(wait=True)

    def client(self) -> Client:
        return Client(self)

    # -- fault injection ---------------------------------------------------------------------
    def _node(self, n: int) -> StorageNode:
        if not 0 <= n < len(self.nodes):
            raise InvalidArgumentError(f"no node {n}; nodes are 0..{len(self.nodes) - 1}")
        return self.nodes[n]

    def stop_node(self, n: int) -> None:
        """Take node ``n`` out of service: it answers nothing until ``start_node``.
        Persists across opens of the cluster."""
        self._node(n).available = False
        (node_dir(self.path, n) / STOP_MARKER).touch()

    def start_node(self, n: int) -> None:
        self._node(n).available = True
        (node_dir(self.path, n) / STOP_MARKER).unlink(missing_ok=True)

    # -- status ------------------------------------------------------------------------------
    async def status(self) -> ClusterStatus:
        """Nodes, logical and physical bytes, and how many blocks lack full redundancy:
        a chunk missing, on a node that is down, or sharing a node with another chunk."""
        present: dict[tuple[int, int], set[str]] = {}
        node_status = []
        for node in self.nodes:
            if not node.available:
                node_status.append(NodeStatus(node.node_id, False, None, None, None))
                continue
            usage = await node.usage()
            node_status.append(
                NodeStatus(
                    node.node_id,
                    True,
                    sum(u.chunks for u in usage),
                    sum(u.bytes_used for u in usage),
                    sum(u.bytes_free for u in usage),
                )
            )
            for d in range(node.disks):
                present[(node.node_id, d)] = {c.chunk_id for c in await node.list_chunks(d)}
        blocks = below = physical = 0
        async for rec in self.meta.iter_blocks():
            blocks += 1
            physical += sum(c.stored_len for c in rec.chunks)
            if not block_fully_redundant(rec, present):
                below += 1
        files = logical = 0
        async for f in self.meta.iter_files():
            if f.parent is not None:
                files += 1
                logical += f.size
        return ClusterStatus(
            str(self.path),
            node_status,
            files,
            blocks,
            logical,
            physical,
            below,
            self.config.encoding,
            self.config.block_size,
            self.config.sync,
        )


def block_fully_redundant(rec: BlockRecord, present: dict[tuple[int, int], set[str]]) -> bool:
    """All ``width`` chunks present, on distinct nodes that are up."""
    width = Encoding.parse(rec.encoding).width
    if rec.length > 0 and len(rec.chunks) < width:
        return False
    nodes = [c.node for c in rec.chunks]
    if len(set(nodes)) != len(nodes):
        return False
    return all(c.chunk_id in present.get((c.node, c.disk), ()) for c in rec.chunks)


def node_dir(root: Path, n: int) -> Path:
    return root / "nodes" / f"n{n:03d}"


__all__ = ["Cluster", "ClusterStatus", "NodeStatus", "node_dir"]
