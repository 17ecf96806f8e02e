"""Create and open a cluster: a directory holding its config, metadata and nodes.

Layout::

    DIR/cluster.json          ClusterConfig
    DIR/metadata.db           SQLite (WAL): the Name, File and Block layers
    DIR/nodes/n000/d0/...     node 0, disk 0: chunk files
    DIR/nodes/n000/STOPPED    present while node 0 is out of service
    DIR/nodes/n000/address.json, DIR/serve.json   while served (``nodectl.py``)

Embedded mode (no daemon): the opening process reads and writes the node directories itself.
Served mode (``tectonic-emu serve``): every node is its own process on TCP, and any number of
client processes open the cluster at once; ``open`` detects it and uses ``RemoteNode``s, with a
heartbeat task marking nodes down and up. The metadata stays in SQLite (WAL), which many
processes on one host share safely.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import secrets
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from tectonic_emu import clock
from tectonic_emu._malloc import keep_freed_memory
from tectonic_emu.argcheck import bool_arg, int_arg, number_arg, path_arg, str_arg
from tectonic_emu.chunkstore import LocalNode, StorageNode
from tectonic_emu.chunkstore.base import MAX_NODE_DELAY
from tectonic_emu.chunkstore.health import HealthMonitor
from tectonic_emu.chunkstore.netem import Pacer
from tectonic_emu.chunkstore.remote import RemoteNode
from tectonic_emu.client import Client
from tectonic_emu.coding import Encoding
from tectonic_emu.config import (
    CONFIG_FILE,
    DEFAULT_BLOCK_SIZE,
    METADATA_FILE,
    ClusterConfig,
    Compression,
    redact,
    split_address,
)
from tectonic_emu.datapath import DataPath
from tectonic_emu.errors import (
    AlreadyExistsError,
    ArgumentTypeError,
    InvalidArgumentError,
    NodeUnavailableError,
)
from tectonic_emu.identity import adopt_if_empty, check_metadata, check_missing_file, init_metadata
from tectonic_emu.metadata import KVStore, PostgresKV, SQLiteKV
from tectonic_emu.metadata.layers import Metadata
from tectonic_emu.nodectl import (
    STOP_MARKER,
    control,
    node_dir,
    read_address,
    signal_node,
)
from tectonic_emu.offload import run_apart
from tectonic_emu.owner import take_ownership
from tectonic_emu.qos.groups import TrafficGroup
from tectonic_emu.secret import create_secret, load_secret, secret_path
from tectonic_emu.services.backup import backup_due, prune, take_backup
from tectonic_emu.status import (
    ClusterStatus,
    NodeStatus,
    cluster_status,
)
from tectonic_emu.tls import client_context, make_certificates

log = logging.getLogger(__name__)

# Threads for blocking chunk I/O, shared by all nodes of the cluster. Chunk writes block in
# fdatasync most of their time, so more threads than cores keep the disk queue full.
IO_THREADS = 32
# Served mode: seconds between heartbeats, and how long a heartbeat may take before the node
# counts as down.
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_TIMEOUT = 2.0


def _same_cluster(found: ClusterConfig, asked: ClusterConfig, root: Path) -> ClusterConfig:
    """``found`` if it was made with ``asked``'s settings, else AlreadyExistsError naming
    the first one that differs."""
    mine, theirs = asdict(asked), asdict(found)
    for key in mine:
        if key not in ("created", "cluster_id") and mine[key] != theirs.get(key):
            raise AlreadyExistsError(
                f"a cluster with {key} {theirs.get(key)!r}, not {mine[key]!r}, is already here",
                str(root),
            )
    return found


def metadata_store(root: Path, config: ClusterConfig) -> KVStore:
    """The cluster's metadata store: its SQLite file, or its PostgreSQL table."""
    synchronous: Literal["full", "normal"] = "full" if config.sync else "normal"
    if config.metadata:
        return PostgresKV(config.metadata, table=config.metadata_table, synchronous=synchronous)
    return SQLiteKV(root / METADATA_FILE, synchronous=synchronous)


def _check_create_args(args: dict[str, Any]) -> None:
    """Types of ``Cluster.create``'s arguments: one line naming the one that is wrong."""
    where = "Cluster.create"
    path_arg(where, "path", args["path"])
    for name in ("nodes", "disks_per_node", "block_size", "backup_keep", "qos_depth"):
        int_arg(where, name, args[name])
    for name in ("sync", "exist_ok"):
        bool_arg(where, name, args[name])
    for name in ("encoding", "compression", "metadata", "metadata_table", "qos", "disk_model"):
        str_arg(where, name, args[name])
    for name in ("nic_gbps", "rtt_ms", "loss", "backup_interval"):
        number_arg(where, name, args[name])
    addresses = args["node_addresses"]
    if not isinstance(addresses, (list, tuple)) or not all(isinstance(a, str) for a in addresses):
        raise ArgumentTypeError(
            f"{where}: node_addresses must be a sequence of 'host:port' strs, "
            f"not {type(addresses).__name__} {addresses!r:.40}"
        )


def _check_metadata_free(config: ClusterConfig) -> None:
    """Raise AlreadyExistsError unless the PostgreSQL table for ``config`` is empty or missing
    (another cluster's metadata must not be taken over); OSError if it cannot be reached. Runs
    on a thread of its own, so it works inside or outside an event loop."""

    async def count() -> int:
        kv = await PostgresKV.open(config.metadata, table=config.metadata_table)
        try:
            return await kv.count()
        finally:
            await kv.close()

    found = run_apart(count, name="tectonic-metadata-probe")
    if found:
        raise AlreadyExistsError(
            f"table {config.metadata_table} already holds {found} metadata keys (another "
            "cluster's?): name another with metadata_table",
            redact(config.metadata),
        )


class Cluster:
    """An open cluster. Use ``Cluster.create`` once, then ``async with Cluster.open(dir)``."""

    #: Whether this process owns the cluster (embedded); False for a served client.
    owned: bool = False

    def __init__(
        self,
        path: Path,
        config: ClusterConfig,
        meta: Metadata,
        nodes: Sequence[StorageNode],
        io_pool: ThreadPoolExecutor,
        cpu_pool: ThreadPoolExecutor,
        *,
        served: bool = False,
        write_ack: str = "all",
    ) -> None:
        self.path = path
        self.served = served
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
            write_ack=write_ack,
            domains=[split_address(a)[0] for a in config.node_addresses]
            if config.node_addresses
            else None,
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
        metadata: str = "",
        metadata_table: str = "tectonic_kv",
        node_addresses: tuple[str, ...] = (),
        nic_gbps: float = 0.0,
        rtt_ms: float = 0.0,
        loss: float = 0.0,
        qos: str = "fair",
        qos_depth: int = 4,
        disk_model: str = "",
        backup_interval: float = 3600.0,
        backup_keep: int = 24,
        exist_ok: bool = False,
        tls: bool = False,
    ) -> ClusterConfig:
        """Make a new cluster in ``path`` (created if missing; must not hold a cluster).

        ``exist_ok``: a cluster already at ``path`` made with these same settings is left as
        it is and its config returned (so a script can run twice); one made otherwise is
        still an ``AlreadyExistsError``.

        ``metadata``: a ``postgresql://`` URL to keep the metadata in that database's table
        ``metadata_table`` (which must be empty or missing), reachable from every host of the
        cluster; empty (the default) for a SQLite file in ``path``. ``node_addresses``: one
        ``host:port`` per node, where ``tectonic-emu node serve --node N`` runs node N on its
        own host, for a cluster that spans hosts (``docs/deploy.md``). ``nic_gbps``,
        ``rtt_ms``, ``loss``: the emulated network between the hosts of a served or
        multi-host cluster (``chunkstore/netem.py``). ``qos``, ``qos_depth``: how served
        nodes share each disk between TrafficGroups (``ClusterConfig.qos``,
        docs/qos.md); ``disk_model``: served nodes' disks take a modelled device's time
        (``ClusterConfig.disk_model``). ``backup_interval``: seconds between
        metadata backups onto the nodes (0: none), of which the newest ``backup_keep`` are
        kept (``services/backup.py``).

        ``path`` is made mode 0700 and gets the cluster secret, ``path/secret`` (0600), which
        served nodes and clients prove they know (``secret.py``, docs/deploy.md). ``tls``:
        also a CA and a node certificate in ``path/tls``, so that served links speak TLS
        (``tls.py``; needs the ``openssl`` command).

        Raises AlreadyExistsError (also for a metadata table in use), UnknownEncodingError,
        InvalidArgumentError (ArgumentTypeError for an argument of the wrong type), and
        OSError when the database cannot be reached.
        """
        _check_create_args(locals())
        root = Path(path)
        Encoding.parse(encoding)
        config = ClusterConfig(
            nodes=nodes,
            disks_per_node=disks_per_node,
            encoding=Encoding.parse(encoding).name,
            block_size=block_size,
            sync=sync,
            compression=compression,
            metadata=metadata,
            metadata_table=metadata_table,
            node_addresses=tuple(node_addresses),
            nic_gbps=nic_gbps,
            rtt_ms=rtt_ms,
            loss=loss,
            qos=qos,
            qos_depth=qos_depth,
            disk_model=disk_model,
            backup_interval=backup_interval,
            backup_keep=backup_keep,
            cluster_id=secrets.token_hex(8),
            created=clock.wall(),
        )
        if (root / CONFIG_FILE).exists():
            if exist_ok:
                return _same_cluster(ClusterConfig.load(root), config, root)
            raise AlreadyExistsError("a cluster already exists here", str(root))
        if root.exists() and not root.is_dir():
            raise InvalidArgumentError("not a directory", str(root))
        if metadata:
            _check_metadata_free(config)
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)  # the secret, metadata and chunks are the owner's alone
        if not secret_path(root).exists():
            create_secret(secret_path(root))
        if tls:
            hosts = [a.rsplit(":", 1)[0].strip("[]") for a in config.node_addresses]
            make_certificates(root, hosts)
        for n in range(nodes):
            for d in range(disks_per_node):
                (node_dir(root, n) / f"d{d}").mkdir(parents=True, exist_ok=True)
        init_metadata(lambda: metadata_store(root, config), config)
        config.save(root)  # last: a cluster.json means the cluster is complete
        return config

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        write_ack: str | None = None,
        kv: KVStore | None = None,
        recover: bool = False,
        exclusive: bool = False,
    ) -> AsyncIterator[Cluster]:
        """Open an existing cluster for the duration of the ``async with`` block.

        ``write_ack``: ``"all"`` acknowledges a block once every chunk is durable (the
        embedded default), ``"quorum"`` once all but one are (the served default: a slow or
        dying node does not hold writers back; repair rebuilds a chunk that never lands).
        ``kv``: the metadata store to use instead of the cluster's SQLite file (``MemoryKV``
        for benches of the layers alone); it is closed with the cluster. ``recover``: open
        even when the metadata is missing, empty or another cluster's, and create nothing in
        it (for ``meta backups``, ``meta restore`` and ``meta load``). ``exclusive``: with the
        cluster to this process alone (``meta restore`` and ``meta load`` replace the metadata
        under everyone).

        Embedded, the process holds the cluster until the block exits, shared with other
        embedded processes of this host but never with a ``serve`` (``owner.py``), and on a
        normal exit takes a metadata backup when one is due (``backup_interval``). Served
        (a ``serve`` holds it), the process is one of its clients.

        Raises ClusterNotFoundError when ``path`` holds no cluster, ArgumentTypeError when
        ``path`` is not a path, ClusterBusyError when another process owns it (the line names
        it), MetadataLostError when its metadata is missing, empty, damaged or another
        cluster's (the line names the fix).
        """
        root = Path(path_arg("Cluster.open", "path", path))
        config = ClusterConfig.load(root)
        given = kv is not None
        try:
            ownership, served = take_ownership(root, config, exclusive=exclusive)
        except BaseException:
            if kv is not None:
                await kv.close()  # it is ours to close, as on every other way out
            raise
        try:
            if not given and not recover:
                check_missing_file(root, config)
            async with cls._open(root, config, write_ack, kv, served, recover) as cluster:
                cluster.owned = ownership is not None
                yield cluster
                if cluster.owned and not given and not recover:
                    await cluster._backup_if_due()
        finally:
            if ownership is not None:
                ownership.release()

    @classmethod
    @asynccontextmanager
    async def _open(
        cls,
        root: Path,
        config: ClusterConfig,
        write_ack: str | None,
        kv: KVStore | None,
        served: bool,
        recover: bool,
    ) -> AsyncIterator[Cluster]:
        given = kv is not None
        keep_freed_memory()
        io_pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="tectonic-io")
        cpu_pool = ThreadPoolExecutor(
            max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="tectonic-cpu"
        )
        if kv is None:
            kv = metadata_store(root, config)
        nodes: list[StorageNode] = []
        monitor: HealthMonitor | None = None
        cluster: Cluster | None = None
        try:
            meta = Metadata(kv)
            if given:
                await adopt_if_empty(kv, config)
            if not recover:
                await check_metadata(root, config, kv)
                await meta.ensure_root(clock.wall())
            if served:
                # This process's NIC, shared by its connections to every node.
                pacer = Pacer.of(config.link, chunk=config.block_size)
                secret = load_secret(secret_path(root))
                tls = client_context(root)
                remote = [
                    RemoteNode(
                        n,
                        config.disks_per_node,
                        _resolver(root, config, n),
                        secret=secret,
                        tls=tls,
                        pacer=pacer,
                    )
                    for n in range(config.nodes)
                ]
                nodes.extend(remote)
                monitor = HealthMonitor(
                    remote, interval=HEARTBEAT_INTERVAL, timeout=HEARTBEAT_TIMEOUT
                )
                await monitor.check_all()
                monitor.start()
            else:
                for n in range(config.nodes):
                    node = LocalNode(
                        node_dir(root, n),
                        n,
                        config.disks_per_node,
                        sync=config.sync,
                        executor=io_pool,
                    )
                    node.available = not (node_dir(root, n) / STOP_MARKER).exists()
                    nodes.append(node)
            ack = write_ack or ("quorum" if served else "all")
            cluster = cls(
                root, config, meta, nodes, io_pool, cpu_pool, served=served, write_ack=ack
            )
            yield cluster
        finally:
            if cluster is not None:
                await cluster.datapath.drain()
            if monitor is not None:
                await monitor.stop()
            for opened in nodes:
                await opened.close()
            await kv.close()
            io_pool.shutdown(wait=True)
            cpu_pool.shutdown(wait=True)

    async def _backup_if_due(self) -> None:
        """An embedded owner's periodic metadata backup, on close: a failure is logged, never
        the caller's error (the next close tries again)."""
        cfg = self.config
        try:
            if await backup_due(
                self.meta.kv, interval=cfg.backup_interval, since=cfg.created, now=clock.wall()
            ):
                info = await take_backup(self.nodes, self.meta.kv, part_size=cfg.block_size)
                await prune(self.nodes, keep=cfg.backup_keep)
                log.info("metadata backup %s taken (%d keys)", info.id, info.keys)
        except (OSError, ValueError) as e:
            log.warning("metadata backup failed (the next close tries again): %s", e)

    def client(self) -> Client:
        return Client(self)

    # -- fault injection ---------------------------------------------------------------------
    def _node(self, n: int) -> StorageNode:
        if not 0 <= n < len(self.nodes):
            raise InvalidArgumentError(f"no node {n}; nodes are 0..{len(self.nodes) - 1}")
        return self.nodes[n]

    def use_group(self, group: TrafficGroup | None) -> None:
        """Tag this process's requests to served nodes with ``group`` wherever no
        ``qos.using`` names another (None: back to the process's group). The fsspec
        filesystem's ``group`` option sets it."""
        for node in self.nodes:
            if isinstance(node, RemoteNode):
                node.group = group

    def stop_node(self, n: int) -> None:
        """Take node ``n`` out of service: it answers nothing until ``start_node``.
        Persists across opens of the cluster. Served: its process is stopped (SIGTERM)."""
        node = self._node(n)
        (node_dir(self.path, n) / STOP_MARKER).touch()
        if isinstance(node, RemoteNode):
            with contextlib.suppress(NodeUnavailableError):
                signal_node(self.path, n, signal.SIGTERM)
            node.mark_down("stopped")
        else:
            node.available = False

    def start_node(self, n: int) -> None:
        """Put node ``n`` back in service. Served: asks ``tectonic-emu serve`` to start its
        process and waits until it listens."""
        node = self._node(n)
        (node_dir(self.path, n) / STOP_MARKER).unlink(missing_ok=True)
        if isinstance(node, RemoteNode):
            control(self.path, {"cmd": "start", "node": n})
        else:
            node.available = True

    def kill_node(self, n: int) -> int:
        """SIGKILL the process of node ``n`` (served mode only); returns its pid. The node
        stays down until ``start_node``; chunk writes it had in flight are torn."""
        node = self._node(n)
        if not isinstance(node, RemoteNode):
            raise InvalidArgumentError(
                "only a served node has a process to kill (run `tectonic-emu serve` first)"
            )
        pid = signal_node(self.path, n, signal.SIGKILL)
        node.mark_down("killed")
        return pid

    async def set_node_delay(self, n: int, seconds: float) -> None:
        """Make node ``n`` add ``seconds`` to every call (0 to undo): a served node before
        every reply but heartbeats, for every client; an embedded one (a ``LocalNode``)
        before every call, for this process only."""
        node = self._node(n)
        if isinstance(node, RemoteNode):
            await node.set_delay(seconds)
            return
        if not isinstance(node, LocalNode):
            raise InvalidArgumentError(f"node {n} ({type(node).__name__}) cannot be slowed")
        if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_NODE_DELAY):
            raise InvalidArgumentError(f"delay must be 0..{MAX_NODE_DELAY:g} s, not {seconds}")
        node.delay = seconds

    async def check_health(self) -> None:
        """Served: ping every node now (the heartbeat task does it every half second)."""
        remote = [n for n in self.nodes if isinstance(n, RemoteNode)]
        if remote:
            await HealthMonitor(remote, timeout=HEARTBEAT_TIMEOUT).check_all()

    def down_since(self, n: int) -> float:
        """When node ``n`` went down (``clock.wall()``), or 0.0 when unknown or up."""
        node = self._node(n)
        if node.available:
            return 0.0
        if isinstance(node, RemoteNode):
            return node.down_since
        try:
            return (node_dir(self.path, n) / STOP_MARKER).stat().st_mtime
        except FileNotFoundError:
            return 0.0

    # -- status ------------------------------------------------------------------------------
    async def status(self) -> ClusterStatus:
        """Nodes, logical and physical bytes, and how many blocks lack full redundancy:
        a chunk missing, on a node that is down, or sharing a node with another chunk."""
        return await cluster_status(
            self.path,
            self.config,
            self.nodes,
            self.meta,
            domains=self.datapath.domains,
            served=self.served,
        )


def _resolver(root: Path, config: ClusterConfig, n: int) -> Callable[[], tuple[str, int] | None]:
    """Where node ``n`` is: the configured address, or the one its process published."""
    fixed = config.address_of(n)
    if fixed is not None:
        return lambda: fixed

    def resolve() -> tuple[str, int] | None:
        addr = read_address(root, n)
        return (addr.host, addr.port) if addr is not None else None

    return resolve


__all__ = ["Cluster", "ClusterStatus", "NodeStatus", "node_dir"]
