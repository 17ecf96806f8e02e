"""A cluster's configuration, kept as ``cluster.json`` in the cluster directory."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from tectonic_emu.chunkstore.netem import LinkModel
from tectonic_emu.coding import Encoding
from tectonic_emu.errors import ClusterNotFoundError, InvalidArgumentError
from tectonic_emu.qos.fairqueue import LOCAL_DISK
from tectonic_emu.qos.node import NodeQos
from tectonic_emu.resources import human_bytes
from tectonic_emu.sim.devices import PRESETS as DISK_PRESETS
from tectonic_emu.sim.devices import Disk

CONFIG_FILE = "cluster.json"
QOS_MODES = ("fair", "fifo", "off")
METADATA_FILE = "metadata.db"
FORMAT_VERSION = 1

# 8 MiB: the size of every chunk file. A replicated block is one chunk long; a Reed-Solomon
# block holds D chunks (D x block_size), as Tectonic's RS(9,6) blocks hold 9 chunks of 8 MB.
# The sweep in docs/performance.md: each chunk costs a file create, an fdatasync and a directory
# fsync, so rs-6-3 with 8 MiB *blocks* (1.3 MiB chunks) reached 0.42 of the disk's rate and
# with 8 MiB *chunks* 0.69-0.75; r3 was at 0.95-1.2 from 8 MiB up.
DEFAULT_BLOCK_SIZE = 8 << 20
MIN_BLOCK_SIZE = 4 << 10
MAX_BLOCK_SIZE = 256 << 20

Compression = Literal["auto", "zstd", "none"]


# Nodes a cluster may have: room for a projection of Meta's 7,500 storage servers
# (docs/simulate.md), with a bound that still catches a typo.
MAX_NODES = 16384


def check_qos(mode: str, depth: int) -> str:
    if mode not in QOS_MODES:
        raise InvalidArgumentError(f"qos is one of {', '.join(QOS_MODES)}, not {mode!r}")
    if not 1 <= depth <= 1024:
        raise InvalidArgumentError(f"a fair queue's depth is 1..1024, not {depth}")
    return mode


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """What ``Cluster.create`` was asked for. Immutable once the cluster exists."""

    nodes: int = 9
    disks_per_node: int = 2
    encoding: str = "rs-6-3"
    block_size: int = DEFAULT_BLOCK_SIZE
    # False is page-cache mode: chunk writes are not fsync'd before the metadata commit, so
    # a machine crash (not a process crash) can lose acknowledged data. For experiments only.
    sync: bool = True
    compression: Compression = "auto"
    # Where the metadata lives: "" for the SQLite file in the cluster directory (one host),
    # or a postgresql:// URL that every host of the cluster reaches (issue 8), in the table
    # metadata_table of that database.
    metadata: str = ""
    metadata_table: str = "tectonic_kv"
    # Nodes on several hosts (issue 8): node n listens at node_addresses[n], "host:port", on
    # its own host (``tectonic-emu node serve --node n`` there), and every client reaches it
    # there. Empty: nodes are this host's directories, or processes that ``serve`` started
    # and that publish their addresses in the cluster directory (``served.py``).
    node_addresses: tuple[str, ...] = ()
    # The emulated network of a served or multi-host cluster (chunkstore/netem.py): every
    # host's NIC in Gb/s each way (0: unlimited), round-trip time added to every exchange,
    # probability that a TCP segment is lost. An embedded cluster has no network to pace.
    nic_gbps: float = 0.0
    rtt_ms: float = 0.0
    loss: float = 0.0
    # How served nodes share each disk between TrafficGroups (tectonic_emu/qos): "fair"
    # (weighted fair queueing in disk time), "fifo" (first come first served, still counted
    # per group) or "off" (no scheduler); qos_depth requests in service per disk at once.
    qos: str = "fair"
    qos_depth: int = 4
    # Served nodes' disks as a modelled device in real time (sim/devices.py PRESETS: "hdd",
    # "flash"): every disk request also takes the device's time, so a cluster on this
    # machine's one disk behaves as nodes of such devices would. "": the disks as they are.
    disk_model: str = ""
    # Metadata backups (services/backup.py) onto the cluster's own nodes: every
    # backup_interval seconds (0: off), the newest backup_keep kept. cluster_id names the
    # cluster in its metadata too, so that a lost or foreign metadata store is refused.
    backup_interval: float = 3600.0
    backup_keep: int = 24
    cluster_id: str = ""
    version: int = FORMAT_VERSION
    created: float = field(default=0.0)

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise InvalidArgumentError(f"nodes must be 1..{MAX_NODES}, not {self.nodes}")
        if not 1 <= self.disks_per_node <= 64:
            raise InvalidArgumentError(f"disks per node must be 1..64, not {self.disks_per_node}")
        if not MIN_BLOCK_SIZE <= self.block_size <= MAX_BLOCK_SIZE:
            raise InvalidArgumentError(
                f"block size must be {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE} bytes, "
                f"not {self.block_size}"
            )
        if self.compression not in ("auto", "zstd", "none"):
            raise InvalidArgumentError(
                f"compression must be auto, zstd or none, not {self.compression!r}"
            )
        object.__setattr__(self, "node_addresses", tuple(self.node_addresses))  # from JSON
        check_qos(self.qos, self.qos_depth)
        if self.disk_model and self.disk_model not in DISK_PRESETS:
            raise InvalidArgumentError(
                f"a disk model is one of {', '.join(DISK_PRESETS)}, not {self.disk_model!r}"
            )
        if not 0 <= self.backup_interval <= MAX_DURATION:
            raise InvalidArgumentError(
                f"backup interval must be 0 (off) to a year, not {self.backup_interval}"
            )
        if not 1 <= self.backup_keep <= 10000:
            raise InvalidArgumentError(f"backups kept must be 1..10000, not {self.backup_keep}")
        try:
            LinkModel(self.nic_gbps, self.rtt_ms, self.loss)  # checks the network settings
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None
        if self.node_addresses:
            if len(self.node_addresses) != self.nodes:
                raise InvalidArgumentError(
                    f"{len(self.node_addresses)} node addresses for {self.nodes} nodes"
                )
            for a in self.node_addresses:
                split_address(a)
            if len(set(self.node_addresses)) != len(self.node_addresses):
                raise InvalidArgumentError(
                    "two nodes share an address", ",".join(self.node_addresses)
                )
        if self.metadata and not self.metadata.startswith(("postgresql://", "postgres://")):
            raise InvalidArgumentError(
                "metadata is a postgresql://user@host:port/db URL (or empty for SQLite)",
                redact(self.metadata),
            )
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", self.metadata_table):
            raise InvalidArgumentError(
                "a metadata table name is lower-case letters, digits and _, at most 63",
                self.metadata_table,
            )
        enc = Encoding.parse(self.encoding)
        if enc.width > self.nodes:
            raise InvalidArgumentError(
                f"default encoding {enc} needs {enc.width} nodes, the cluster has {self.nodes}"
            )

    def node_qos(self, mode: str | None = None) -> NodeQos | None:
        """A served node's schedulers, as configured (``mode``: "fair", "fifo" or "off" in
        place of the configuration's)."""
        mode = check_qos(mode or self.qos, self.qos_depth)
        if mode == "off":
            return None
        costs = DISK_PRESETS[self.disk_model].costs() if self.disk_model else LOCAL_DISK
        return NodeQos(
            self.disks_per_node,
            depth=self.qos_depth,
            costs=costs,
            fair=mode == "fair",
            nic_rate=self.nic_gbps * 1e9 / 8,
        )

    def node_devices(self, node: int) -> list[Disk]:
        """A served node's emulated devices, one per disk (none without ``disk_model``)."""
        if not self.disk_model:
            return []
        model = DISK_PRESETS[self.disk_model]
        return [Disk(model, name=f"n{node}d{d}") for d in range(self.disks_per_node)]

    @property
    def link(self) -> LinkModel:
        """The emulated network's model of one host's NIC."""
        return LinkModel(self.nic_gbps, self.rtt_ms, self.loss)

    def address_of(self, node: int) -> tuple[str, int] | None:
        """Where node ``node`` listens, when the configuration names it."""
        return split_address(self.node_addresses[node]) if self.node_addresses else None

    def block_size_for(self, enc: Encoding) -> int:
        """Bytes per block of a file with encoding ``enc``: every chunk is ``block_size``."""
        return self.block_size * (enc.data if enc.kind == "rs" else 1)

    def save(self, root: Path) -> None:
        tmp = root / (CONFIG_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, root / CONFIG_FILE)

    @classmethod
    def load(cls, root: Path) -> ClusterConfig:
        try:
            raw = json.loads((root / CONFIG_FILE).read_text())
        except FileNotFoundError:
            raise ClusterNotFoundError(
                "no cluster here (cluster.json missing)", str(root)
            ) from None
        except (OSError, ValueError) as e:
            raise ClusterNotFoundError(f"cannot read cluster.json ({e})", str(root)) from None
        if raw.get("version") != FORMAT_VERSION:
            raise ClusterNotFoundError(
                f"unsupported cluster format {raw.get('version')}", str(root)
            )
        return cls(**raw)


def split_address(text: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:7000"`` for IPv6) -> ``(host, port)``."""
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidArgumentError(f"not a host:port address: {text!r} (try 10.0.0.5:7100)")
    return host, int(port)


def parse_node_addresses(text: str) -> tuple[str, ...]:
    """``"h1:7100-7102,h2:7100"`` -> one ``host:port`` per node, port ranges expanded, in
    order: node 0 is the first."""
    out: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        host, sep, ports = item.rpartition(":")
        first, dash, last = ports.partition("-")
        if not sep or not first.isdigit() or (dash and not last.isdigit()):
            raise InvalidArgumentError(f"not host:port or host:port-port: {item!r}")
        for port in range(int(first), int(last if dash else first) + 1):
            out.append(f"{host}:{port}")
    for a in out:
        split_address(a)
    return tuple(out)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for printing)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGTPE]?)(?:I?B)?", re.IGNORECASE)
_SIZE_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40, "P": 50, "E": 60}
MAX_SIZE = (1 << 63) - 1  # what an off_t holds: no file, disk or buffer is bigger
SIZE_HINT = "try 512MiB, 8M, 1.5GiB, 4096"


def parse_size(text: str, *, minimum: int = 0) -> int:
    """``'512MiB'``, ``'8M'``, ``'1.5GiB'``, ``'2PiB'``, ``'4096'`` -> bytes (binary units).

    Raises ``InvalidArgumentError`` for anything else, for a size below ``minimum`` and for
    one past 8 EiB (``MAX_SIZE``), each with a line that says what to give instead."""
    m = _SIZE.fullmatch(text.strip())
    if m is None and _SIZE.fullmatch(text.strip().removeprefix("-")):
        raise InvalidArgumentError(f"a size cannot be negative: {text!r}")
    if m is None:
        raise InvalidArgumentError(f"not a size: {text!r} ({SIZE_HINT})")
    number, unit = m.groups()
    whole, _, frac = number.partition(".")
    shift = _SIZE_SHIFT[unit.upper()]
    # Exact integer arithmetic: float would round 99999999999999999999 and let inf through.
    value = (int(whole or "0") << shift) + ((int(frac) << shift) // 10 ** len(frac) if frac else 0)
    if value > MAX_SIZE:
        raise InvalidArgumentError(f"size too large: {text!r} (at most 8 EiB)")
    if value < minimum:
        raise InvalidArgumentError(f"size too small: {text!r} (at least {human_bytes(minimum)})")
    return value


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(us|ms|s|min|h)?", re.IGNORECASE)
_DURATION_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
MAX_DURATION = 365 * 86400.0  # a year: past it asyncio's timers overflow, and nobody waits


def parse_duration(text: str) -> float:
    """``'50ms'``, ``'2s'``, ``'5min'``, ``'0.5'`` (seconds) -> seconds.

    Raises ``InvalidArgumentError`` for anything else: a negative, ``inf`` or ``nan`` value,
    or one longer than a year."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        if _DURATION.fullmatch(text.strip().removeprefix("-")):
            raise InvalidArgumentError(f"a duration cannot be negative: {text!r}")
        raise InvalidArgumentError(f"not a duration: {text!r} (try 50ms, 2s, 5min, 0.5)")
    number, unit = m.groups()
    value = float(number) * _DURATION_SCALE[(unit or "s").lower()]
    if value > MAX_DURATION:
        raise InvalidArgumentError(f"duration too long: {text!r} (at most a year)")
    return value


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "MAX_DURATION",
    "MAX_SIZE",
    "ClusterConfig",
    "Compression",
    "parse_duration",
    "parse_node_addresses",
    "parse_size",
    "redact",
    "split_address",
]
