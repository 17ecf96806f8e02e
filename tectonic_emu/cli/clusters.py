"""``tectonic-emu cluster create`` and ``cluster status``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.table import Table

from tectonic_emu.cli.common import (
    cluster_option,
    json_option,
    out_console,
    print_json,
    run,
    with_cluster,
)
from tectonic_emu.cluster import Cluster
from tectonic_emu.config import (
    DEFAULT_BLOCK_SIZE,
    QOS_MODES,
    parse_duration,
    parse_node_addresses,
    parse_size,
    redact,
)
from tectonic_emu.resources import human_bytes


# -- cluster ---------------------------------------------------------------------------------
@click.group("cluster")
def cluster_group() -> None:
    """Create a cluster and see its state.

    \b
    Example:
      tectonic-emu cluster create --cluster /tmp/c1 --nodes 9 --encoding rs-6-3
    """


@cluster_group.command("create")
@cluster_option
@click.option(
    "--nodes",
    default=None,
    type=int,
    help="Storage nodes [default: one per address in --node-addresses, else 9].",
)
@click.option(
    "--disks-per-node", default=2, show_default=True, help="Disks (directories) per node."
)
@click.option("--encoding", default="rs-6-3", show_default=True, help="Default: r1, r3, rs-D-P.")
@click.option(
    "--block-size",
    default=f"{DEFAULT_BLOCK_SIZE >> 20}MiB",
    show_default=True,
    help="Size of every chunk file: a replicated block is 1 chunk, an rs-D-P block D chunks.",
)
@click.option(
    "--no-sync",
    is_flag=True,
    help="Page-cache mode: do NOT fsync chunks before committing (fast, loses data on power loss).",
)
@click.option(
    "--compression", type=click.Choice(["auto", "zstd", "none"]), default="auto", show_default=True
)
@click.option(
    "--metadata",
    default="",
    metavar="URL",
    help="Keep the metadata in PostgreSQL (postgresql://user@host:port/db; password from "
    "PGPASSWORD or ~/.pgpass), reachable from every host [default: a SQLite file in DIR].",
)
@click.option(
    "--node-addresses",
    default="",
    metavar="LIST",
    help="Nodes on several hosts: where each node listens, node 0 first, host:port or "
    "host:port-port for a run of ports (e.g. 10.0.0.1:7100-7102,10.0.0.2:7100-7102); "
    "run `node serve --node N` on each host [default: nodes local to DIR].",
)
@click.option(
    "--nic-gbps",
    default=0.0,
    show_default=True,
    help="Emulated network: each host's NIC in Gb/s each way (0: unlimited). Paced by the "
    "transport of served and multi-host clusters.",
)
@click.option(
    "--rtt-ms", default=0.0, show_default=True, help="Emulated network: added round trip, ms."
)
@click.option(
    "--loss",
    default=0.0,
    show_default=True,
    help="Emulated network: probability that a 1,448-byte TCP segment is lost (TCP resends it).",
)
@click.option(
    "--qos",
    type=click.Choice(QOS_MODES),
    default="fair",
    show_default=True,
    help="How served nodes share each disk between traffic groups: weighted fair queueing, "
    "first come first served, or no scheduler (docs/qos.md).",
)
@click.option(
    "--qos-depth",
    type=click.IntRange(1, 1024),
    default=4,
    show_default=True,
    help="Requests each disk serves at once; the rest wait in its fair queue.",
)
@click.option(
    "--disk-model",
    type=click.Choice(["", "hdd", "flash"]),
    default="",
    help="Served nodes' disks take this modelled device's time as well (docs/qos.md; "
    "docs/simulate.md has the figures) [default: the disks as they are].",
)
@click.option(
    "--metadata-table",
    default="tectonic_kv",
    show_default=True,
    help="The table in that database (one per cluster; it must be empty or missing).",
)
@click.option(
    "--backup-interval",
    default="1h",
    show_default=True,
    help="Back the metadata up onto the nodes this often (0: never; see `meta --help`).",
)
@click.option(
    "--backup-keep", default=24, show_default=True, help="Metadata backups kept (newest)."
)
@click.option(
    "--tls",
    is_flag=True,
    help="Encrypt served links with TLS: makes a CA and a node certificate in DIR/tls "
    "(openssl); copy DIR/tls to every host.",
)
@json_option
def cluster_create(
    cluster_dir: Path,
    nodes: int | None,
    disks_per_node: int,
    encoding: str,
    block_size: str,
    no_sync: bool,
    compression: str,
    metadata: str,
    node_addresses: str,
    nic_gbps: float,
    rtt_ms: float,
    loss: float,
    qos: str,
    qos_depth: int,
    disk_model: str,
    metadata_table: str,
    backup_interval: str,
    backup_keep: int,
    tls: bool,
    as_json: bool,
) -> None:
    """Create a new cluster in DIR (made mode 0700), with its secret in DIR/secret (0600):
    served nodes and clients prove they know it on every connection (docs/deploy.md).

    \b
    Example:
      tectonic-emu cluster create --cluster /tmp/c1 --nodes 12 --disks-per-node 2 --encoding r3
      tectonic-emu cluster create --cluster /tmp/c2 --metadata postgresql://tectonic@db1/tectonic
      tectonic-emu cluster create --cluster /tmp/c3 --nic-gbps 10 --rtt-ms 0.5 --loss 0.0001
      tectonic-emu cluster create --cluster /srv/c4 --tls --node-addresses 10.0.0.2:7100-7102
    """
    addresses = parse_node_addresses(node_addresses)
    config = Cluster.create(
        cluster_dir,
        nodes=nodes if nodes is not None else len(addresses) or 9,
        disks_per_node=disks_per_node,
        encoding=encoding,
        block_size=parse_size(block_size),
        sync=not no_sync,
        compression=compression,  # type: ignore[arg-type]
        metadata=metadata,
        metadata_table=metadata_table,
        node_addresses=addresses,
        nic_gbps=nic_gbps,
        rtt_ms=rtt_ms,
        loss=loss,
        qos=qos,
        qos_depth=qos_depth,
        disk_model=disk_model,
        backup_interval=parse_duration(backup_interval),
        backup_keep=backup_keep,
        tls=tls,
    )
    where = (
        f"PostgreSQL {redact(config.metadata)} table {config.metadata_table}"
        if config.metadata
        else "SQLite"
    )
    if as_json:
        print_json({"path": str(cluster_dir), **asdict(config), "metadata": redact(metadata)})
    else:
        click.echo(
            f"created {cluster_dir}: {config.nodes} nodes x {disks_per_node} disks, "
            f"encoding {config.encoding}, {config.block_size >> 10} KiB chunks, "
            f"{'fsync' if config.sync else 'PAGE-CACHE (no fsync)'}, metadata in {where}"
        )


@cluster_group.command("status")
@cluster_option
@json_option
def cluster_status(cluster_dir: Path, as_json: bool) -> None:
    """Nodes, bytes stored, and blocks below full redundancy.

    \b
    Example:
      tectonic-emu cluster status --cluster /tmp/c1 --json
    
    A served cluster's status also shows each traffic group's requests on the nodes'
    disks: bytes, disk time charged, queueing delay and latency (docs/qos.md).
    """
    st = run(with_cluster(cluster_dir, lambda c: c.status()))
    if as_json:
        print_json(st.to_dict())
        return
    # Served rows carry an address and a pid too: a light box keeps them in 80 columns.
    table = Table(
        title=f"cluster {st.path}" + (" (served)" if st.served else ""),
        box=box.SIMPLE_HEAD if st.served else box.HEAVY_HEAD,
        pad_edge=not st.served,
        show_edge=not st.served,
    )
    columns = ["node", "state", "chunks", "used", "free"]
    if st.served:
        columns += ["address", "pid", "beat ms"]
    for col in columns:
        # An address cut to "127.0.0.1:385…" is no use: it folds onto a second line instead.
        table.add_column(col, justify="right", overflow="fold", min_width=len(col))
    for n in st.nodes:
        row = [
            str(n.node),
            "up" if n.up else f"[red]{n.state}[/red]",
            "-" if n.chunks is None else str(n.chunks),
            "-" if n.bytes_used is None else human_bytes(n.bytes_used),
            "-" if n.bytes_free is None else human_bytes(n.bytes_free),
        ]
        if st.served:
            row += [
                n.address or "-",
                "-" if n.pid is None else str(n.pid),
                "-" if n.heartbeat_ms is None else f"{n.heartbeat_ms:.1f}",
            ]
        table.add_row(*row)
    out_console.print(table)
    out_console.print(
        f"files {st.files}  blocks {st.blocks}  below redundancy {st.blocks_below_redundancy}\n"
        f"logical {human_bytes(st.logical_bytes)}  physical {human_bytes(st.physical_bytes)}"
    )
    for t in st.tenants:  # (`tenant ls` has their namespaces and quotas)
        out_console.print(
            f"tenant {t['name']}: {t['files_used']:,} files, {human_bytes(t['bytes_used'])}"
        )
    groups = st.qos["groups"]
    if groups:
        out_console.print(_qos_table(groups))


def _qos_table(groups: dict[str, dict[str, Any]]) -> Table:
    """Each traffic group's requests over every served node (80 columns)."""
    table = Table(title="traffic groups (served nodes' disks)", box=box.SIMPLE_HEAD)
    for col in ("group", "class", "requests", "bytes", "disk s", "wait p99", "p99 ms"):
        table.add_column(col, justify="left" if col in ("group", "class") else "right")
    for name, g in sorted(groups.items()):
        table.add_row(
            name,
            g["class"],
            f"{g['ops']:,}",
            human_bytes(g["bytes"]),
            f"{g['charged_s']:.2f}",
            f"{g['wait_p99_ms']:.1f}",
            f"{g['latency_p99_ms']:.1f}",
        )
    return table


__all__ = ["cluster_group"]
